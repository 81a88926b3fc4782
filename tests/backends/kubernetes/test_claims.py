"""The refcounted claim manager, driven by an in-memory cluster and settable clocks."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from piship_remote.backends.kubernetes.claims import Claim, ClaimManager
from piship_remote.backends.lifetime import micros
from piship_remote.model.errors import CommandCancelled, PiShipError
from piship_remote.transport._cancel import CancelToken
from tests.support.claims import FakeCluster, MakeManager, managers_on, piship_threads
from tests.support.seed import Clocks, T

pytestmark = pytest.mark.timeout(10)


def keepalive_threads() -> list[threading.Thread]:
    return [t for t in piship_threads() if t.name.startswith("piship-keepalive-")]


@pytest.fixture
def make_manager(cluster: FakeCluster, clocks: Clocks) -> Iterator[MakeManager]:
    with managers_on(cluster, clocks) as make:

        def made(lifetime: float = 60, keepalive_every: float = 3600) -> ClaimManager:
            return make(lifetime=lifetime, keepalive_every=keepalive_every)

        yield made


@pytest.fixture
def manager(make_manager: MakeManager) -> ClaimManager:
    """A manager with a 60 s lifetime and no keepalive timer to speak of (an hour)."""
    return make_manager()


def run(manager: ClaimManager, cancel: CancelToken | None = None) -> str:
    with manager.command(cancel or CancelToken()) as use:
        return use.claim.name


# -- sharing ------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_32_concurrent_commands_share_exactly_one_claim(
    manager: ClaimManager, cluster: FakeCluster
) -> None:
    barrier = threading.Barrier(32)

    def command(_: int) -> str:
        barrier.wait()
        return run(manager)

    with ThreadPoolExecutor(32) as pool:
        names = list(pool.map(command, range(32)))
    assert set(names) == {cluster.created[0]}
    assert len(cluster.created) == 1
    manager.dispose()
    assert cluster.deleted == cluster.created
    assert piship_threads() == []


@pytest.mark.timeout(20)
def test_32_commands_retiring_one_claim_delete_it_once_after_the_last_leaves(
    manager: ClaimManager, cluster: FakeCluster
) -> None:
    manager.prepare()
    inside = threading.Barrier(32)
    deleted_while_inside: list[int] = []

    def command(_: int) -> None:
        with manager.command(CancelToken()) as use:
            inside.wait()
            use.retire()
            deleted_while_inside.append(len(cluster.deleted))
            inside.wait()

    with ThreadPoolExecutor(32) as pool:
        list(pool.map(command, range(32)))
    assert set(deleted_while_inside) == {0}
    assert cluster.deleted == [cluster.created[0]]
    manager.dispose()
    assert cluster.deleted == [cluster.created[0]]


@pytest.mark.timeout(20)
def test_32_threads_under_dispose_lose_no_delete_and_send_none_twice(
    manager: ClaimManager, cluster: FakeCluster
) -> None:
    start = threading.Barrier(33)
    outcomes: list[str] = []

    def command(i: int) -> None:
        start.wait()
        try:
            with manager.command(CancelToken()) as use:
                if i % 3 == 0:
                    use.retire()
            outcomes.append("ok")
        except (PiShipError, CommandCancelled) as e:
            outcomes.append(str(e))

    with ThreadPoolExecutor(32) as pool:
        futures = [pool.submit(command, i) for i in range(32)]
        start.wait()
        manager.dispose()
        for future in futures:
            future.result()
    assert all(outcome in ("ok", "the sandbox was disposed") for outcome in outcomes)
    assert sorted(cluster.deleted) == sorted(set(cluster.deleted))
    assert set(cluster.deleted) == set(cluster.created)
    assert piship_threads() == []


def test_a_cancelled_waiter_does_not_cancel_the_creation_others_wait_for(
    manager: ClaimManager, cluster: FakeCluster
) -> None:
    cluster.create_gate = threading.Event()
    cancel = CancelToken()
    with ThreadPoolExecutor(2) as pool:
        cancelled = pool.submit(run, manager, cancel)
        assert cluster.creating.wait(5)
        waiting = pool.submit(run, manager)
        cancel.set()
        with pytest.raises(CommandCancelled):
            cancelled.result(5)
        cluster.create_gate.set()
        assert waiting.result(5) == cluster.created[0]
    assert len(cluster.created) == 1
    assert cluster.deleted == []


def test_dispose_aborts_a_creation_in_progress_and_its_waiters(
    manager: ClaimManager, cluster: FakeCluster
) -> None:
    cluster.create_gate = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(run, manager)
        assert cluster.creating.wait(5)
        manager.dispose()
        with pytest.raises(PiShipError, match="disposed"):
            waiting.result(5)
    assert manager.disposed
    assert piship_threads() == []


def test_no_claim_is_created_after_dispose(manager: ClaimManager, cluster: FakeCluster) -> None:
    manager.dispose()
    with pytest.raises(PiShipError, match="disposed"):
        run(manager)
    assert cluster.created == []


def test_a_failed_creation_reaches_the_command_and_the_next_one_tries_again(
    manager: ClaimManager, cluster: FakeCluster
) -> None:
    cluster.create_error = PiShipError("SANDBOX_UNAVAILABLE", "the SandboxClaim failed: X")
    with pytest.raises(PiShipError, match="failed: X"):
        run(manager)
    cluster.create_error = None
    assert run(manager) == cluster.created[1]


def test_a_failed_prepare_leaves_no_thread(manager: ClaimManager, cluster: FakeCluster) -> None:
    cluster.create_error = PiShipError("SANDBOX_UNAVAILABLE", "nope")
    with pytest.raises(PiShipError, match="nope"):
        manager.prepare()
    assert manager.disposed
    assert piship_threads() == []


# -- epoch ----------------------------------------------------------------------


def test_epoch_is_the_claim_of_the_latest_command(
    manager: ClaimManager, cluster: FakeCluster, clocks: Clocks
) -> None:
    manager.prepare()
    assert manager.epoch() is None
    run(manager)
    assert manager.epoch() == cluster.created[0]
    clocks.advance(61)
    run(manager)
    assert manager.epoch() == cluster.created[1]


# -- renewal before a command -------------------------------------------------------


def test_a_fresh_claim_is_not_renewed(manager: ClaimManager, cluster: FakeCluster) -> None:
    run(manager)
    assert cluster.renewed == []
    assert cluster.checked == cluster.created


def test_past_half_the_lifetime_a_command_renews_first(
    manager: ClaimManager, cluster: FakeCluster, clocks: Clocks
) -> None:
    manager.prepare()
    clocks.advance(40)
    run(manager)
    assert cluster.renewed == [(cluster.created[0], micros(T + 100))]


def test_a_locally_expired_claim_is_replaced_without_renewal_and_deleted(
    manager: ClaimManager, cluster: FakeCluster, clocks: Clocks
) -> None:
    manager.prepare()
    clocks.advance(61)
    assert run(manager) == cluster.created[1]
    assert cluster.renewed == []
    assert cluster.deleted == [cluster.created[0]]


def test_a_claim_the_cluster_lost_is_replaced_once(
    manager: ClaimManager, cluster: FakeCluster
) -> None:
    manager.prepare()
    cluster.gone.add(cluster.created[0])
    assert run(manager) == cluster.created[1]
    assert cluster.deleted == [cluster.created[0]]


def test_a_claim_lost_twice_in_a_row_fails_the_command(
    manager: ClaimManager, cluster: FakeCluster
) -> None:
    manager.prepare()
    cluster.gone.update({"piship-000000000000", "piship-000000000001"})
    with pytest.raises(PiShipError, match="no longer exists") as caught:
        run(manager)
    assert caught.value.code == "SANDBOX_UNAVAILABLE"
    assert len(cluster.created) == 2


def test_a_renewal_never_moves_the_shutdown_time_earlier(
    manager: ClaimManager, cluster: FakeCluster, clocks: Clocks
) -> None:
    manager.prepare()
    clocks.advance(40)
    run(manager)
    clocks.wall -= 3600  # the wall clock set back; monotonic time hardly moves
    clocks.mono += 1
    manager_renewals = cluster.renewals_of(cluster.created[0])
    run(manager)
    assert cluster.renewals_of(cluster.created[0]) == manager_renewals  # still fresh


# -- the keepalive --------------------------------------------------------------------


def test_the_keepalive_renews_while_a_command_runs_and_idles_after(
    make_manager: MakeManager, cluster: FakeCluster, clocks: Clocks
) -> None:
    manager = make_manager(lifetime=1, keepalive_every=0.25)
    with manager.command(CancelToken()) as use:
        clocks.advance(0.1)
        manager.keepalive_now()
        manager.keepalive_now()
        keepalives = keepalive_threads()
        assert [t.name for t in keepalives] == [f"piship-keepalive-{use.claim.name}"]
        assert all(t.daemon for t in keepalives)
    name = cluster.created[0]
    assert cluster.renewals_of(name) == [micros(T + 2), micros(T + 2)]
    # Idle with more than half its lifetime left: the keepalive ticks, renews nothing.
    manager.keepalive_now()
    assert len(cluster.renewals_of(name)) == 2
    manager.dispose()
    assert not keepalive_threads()


def test_an_idle_claim_is_renewed_once_half_its_lifetime_has_passed(
    make_manager: MakeManager, cluster: FakeCluster, clocks: Clocks
) -> None:
    manager = make_manager(lifetime=1)  # ticks driven by keepalive_now()
    manager.prepare()
    [name] = cluster.created
    assert [t.name for t in keepalive_threads()] == [f"piship-keepalive-{name}"]
    clocks.advance(0.6)
    manager.keepalive_now()
    assert cluster.renewals_of(name) == [micros(T + 2)]
    manager.dispose()
    assert not keepalive_threads()


def test_an_idle_claim_past_its_committed_end_is_never_renewed(
    make_manager: MakeManager, cluster: FakeCluster, clocks: Clocks
) -> None:
    manager = make_manager(lifetime=1)  # ticks driven by keepalive_now()
    manager.prepare()
    [name] = cluster.created
    clocks.advance(1.5)
    manager.keepalive_now()
    manager.keepalive_now()
    assert cluster.renewals_of(name) == []
    manager.dispose()
    assert not keepalive_threads()


def test_the_keepalive_timer_really_fires(make_manager: MakeManager, cluster: FakeCluster) -> None:
    manager = make_manager(lifetime=60, keepalive_every=0.02)
    renewed = threading.Event()
    original = cluster.renew

    def renew(claim: Claim, shutdown: int, cancel: CancelToken) -> None:
        original(claim, shutdown, cancel)
        renewed.set()

    cluster.renew = renew  # type: ignore[method-assign]
    with manager.command(CancelToken()):
        assert renewed.wait(5)


def test_a_retired_claim_is_still_renewed_while_another_command_runs_in_it(
    make_manager: MakeManager, cluster: FakeCluster, clocks: Clocks
) -> None:
    manager = make_manager(lifetime=1, keepalive_every=3600)
    release = threading.Event()
    inside = threading.Event()

    def long() -> None:
        with manager.command(CancelToken()):
            inside.set()
            release.wait(5)

    thread = threading.Thread(target=long)
    thread.start()
    assert inside.wait(5)
    with manager.command(CancelToken()) as use:
        use.retire()
    name = cluster.created[0]
    assert cluster.deleted == []
    manager.keepalive_now()
    assert len(cluster.renewals_of(name)) == 1
    release.set()
    thread.join(5)
    assert cluster.deleted == [name]
    manager.keepalive_now()
    assert len(cluster.renewals_of(name)) == 1


def test_a_keepalive_that_finds_the_claim_expired_never_renews_it(
    make_manager: MakeManager, cluster: FakeCluster, clocks: Clocks
) -> None:
    manager = make_manager(lifetime=1)
    with manager.command(CancelToken()):
        clocks.wall += 5  # slept past the shutdownTime; monotonic time frozen
        manager.keepalive_now()
        manager.keepalive_now()
    assert cluster.renewed == []
    assert cluster.deleted == [cluster.created[0]]
    assert run(manager) == cluster.created[1]


def test_a_keepalive_404_retires_the_claim_after_its_command(
    manager: ClaimManager, cluster: FakeCluster
) -> None:
    with manager.command(CancelToken()) as use:
        cluster.gone.add(use.claim.name)
        manager.keepalive_now()
        manager.keepalive_now()
        assert cluster.deleted == []
    first = cluster.created[0]
    assert cluster.renewals_of(first) == [cluster.renewals_of(first)[0]]
    assert cluster.deleted == [first]
    assert run(manager) == cluster.created[1]


def test_a_claim_whose_delete_failed_is_never_renewed_again(
    manager: ClaimManager, cluster: FakeCluster
) -> None:
    cluster.delete_error = RuntimeError("etcd unavailable")
    with manager.command(CancelToken()) as use:
        use.retire()
    first = cluster.created[0]
    assert cluster.deleted == [first]
    manager.keepalive_now()
    assert cluster.renewed == []
    assert run(manager) == cluster.created[1]
    manager.dispose()
    assert cluster.deleted == [first, cluster.created[1]]


@contextlib.contextmanager
def held_renewal(
    make_manager: MakeManager, cluster: FakeCluster
) -> Iterator[tuple[ClaimManager, threading.Event]]:
    """A command of a manager renewing every 10 ms, once a keepalive renewal is held at
    the gate it yields (the cluster's ``renew_gate``); the block runs inside the command."""
    manager = make_manager(lifetime=60, keepalive_every=0.01)
    gate = cluster.renew_gate = threading.Event()
    with manager.command(CancelToken()):
        cluster.wait_for_a_renewal()
        yield manager, gate


def test_dispose_aborts_a_keepalive_renewal_still_in_flight(
    make_manager: MakeManager, cluster: FakeCluster
) -> None:
    with held_renewal(make_manager, cluster) as (manager, _):
        pass
    manager.dispose()
    assert not keepalive_threads()


def test_a_claim_a_renewal_finds_gone_as_a_command_ends_is_deleted_before_it_reports(
    make_manager: MakeManager, cluster: FakeCluster
) -> None:
    with held_renewal(make_manager, cluster) as (manager, gate):
        cluster.gone.add(cluster.created[0])
        gate.set()  # answered "gone" while the command ends
    assert cluster.deleted == cluster.created[:1]
    manager.dispose()


@pytest.mark.timeout(10)
def test_a_command_ends_without_the_answer_of_a_renewal_that_hangs(
    make_manager: MakeManager, cluster: FakeCluster
) -> None:
    with held_renewal(make_manager, cluster) as (manager, gate):
        pass
    assert not gate.is_set()  # still unanswered: the command did not wait for it
    assert cluster.deleted == []
    manager.dispose()


# -- dispose ----------------------------------------------------------------------


def test_concurrent_dispose_deletes_once(manager: ClaimManager, cluster: FakeCluster) -> None:
    manager.prepare()
    barrier = threading.Barrier(8)

    def dispose(_: int) -> None:
        barrier.wait()
        manager.dispose()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(dispose, range(8)))
    manager.dispose()
    assert cluster.deleted == cluster.created


def test_dispose_mid_renewal_makes_the_command_fail_and_creates_nothing(
    manager: ClaimManager, cluster: FakeCluster, clocks: Clocks
) -> None:
    manager.prepare()
    clocks.advance(40)
    cluster.gone.add(cluster.created[0])
    cluster.renew_gate = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(run, manager)
        cluster.wait_for_a_renewal()
        manager.dispose()
        with pytest.raises(PiShipError, match="disposed"):
            pending.result(5)
    assert len(cluster.created) == 1
    assert cluster.deleted == cluster.created


def test_dispose_stops_the_keepalive_of_running_commands(
    make_manager: MakeManager, cluster: FakeCluster
) -> None:
    manager = make_manager(lifetime=60, keepalive_every=0.01)
    with manager.command(CancelToken()):
        manager.dispose()
        assert not keepalive_threads()
        assert cluster.deleted == cluster.created
    assert cluster.deleted == cluster.created


def test_a_creation_that_failed_while_nobody_waited_is_tried_again(
    manager: ClaimManager, cluster: FakeCluster
) -> None:
    cluster.create_gate = threading.Event()
    cluster.create_error = PiShipError("SANDBOX_UNAVAILABLE", "the SandboxClaim failed: X")
    cancel = CancelToken()
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(run, manager, cancel)
        assert cluster.creating.wait(5)
        cancel.set()
        with pytest.raises(CommandCancelled):
            waiting.result(5)
    cluster.create_gate.set()
    for thread in threading.enumerate():
        if thread.name == "piship-claim-create":
            thread.join(5)
    cluster.create_error = None
    assert run(manager) == cluster.created[1]
    assert len(cluster.created) == 2


# -- the check before a command ------------------------------------------------------


def test_commands_that_start_during_a_check_share_it(
    manager: ClaimManager, cluster: FakeCluster
) -> None:
    manager.prepare()
    cluster.check_gate = threading.Event()
    entered = threading.Barrier(3)

    def command(_: int) -> str:
        with manager.command(CancelToken()) as use:
            entered.wait(5)
            return use.claim.name

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(command, 0)
        assert cluster.checking.wait(5)
        second = pool.submit(command, 1)
        # No event says the second command waits for the shared check: give it the time.
        threading.Event().wait(0.1)
        cluster.check_gate.set()
        entered.wait(5)
        assert first.result(5) == second.result(5)
    assert len(cluster.checked) == 1
    # Sequential commands still check once each.
    with manager.command(CancelToken()):
        pass
    assert len(cluster.checked) == 2


def test_a_command_sharing_a_cancelled_check_checks_again(
    manager: ClaimManager, cluster: FakeCluster
) -> None:
    manager.prepare()
    cluster.check_gate = threading.Event()
    cancel = CancelToken()

    def command(token: CancelToken) -> str:
        with manager.command(token) as use:
            return use.claim.name

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(command, cancel)
        assert cluster.checking.wait(5)
        second = pool.submit(command, CancelToken())
        threading.Event().wait(0.1)  # as above: the second command waits for the first's check
        cancel.set()
        with pytest.raises(CommandCancelled):
            first.result(5)
        cluster.check_gate.set()
        assert second.result(5) == cluster.created[0]
    assert len(cluster.checked) == 2
