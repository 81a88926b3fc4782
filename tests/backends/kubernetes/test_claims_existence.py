"""The claim manager's existence window: when a direct command skips the check of its claim."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from piship_remote.backends.kubernetes.claims import ClaimManager
from piship_remote.model.errors import CONFIG_INVALID, PiShipError
from piship_remote.transport._cancel import CancelToken
from tests.support.claims import FakeCluster, MakeManager, managers_on
from tests.support.seed import Clocks

pytestmark = pytest.mark.timeout(10)

WINDOW = 1.0


@pytest.fixture
def make_manager(cluster: FakeCluster, clocks: Clocks) -> Iterator[MakeManager]:
    with managers_on(cluster, clocks) as make:

        def made(window: float = WINDOW, lifetime: float = 3600) -> ClaimManager:
            return make(
                lifetime=lifetime, keepalive_every=3600, existence_window=window, prepare=True
            )

        yield made


@pytest.fixture
def manager(make_manager: MakeManager) -> ClaimManager:
    """A prepared manager with a one-second window, created at the clocks' start."""
    return make_manager()


def run(manager: ClaimManager, *, direct: bool = True) -> str:
    with manager.command(CancelToken(), direct=direct) as use:
        return use.claim.name


def checkers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "piship-claim-check"]


def join_checkers() -> None:
    for checker in checkers():
        checker.join(5)


def test_a_direct_command_within_the_window_is_not_checked(
    manager: ClaimManager, cluster: FakeCluster, clocks: Clocks
) -> None:
    clocks.advance(WINDOW / 4)
    run(manager)
    assert cluster.checked == []


def test_a_direct_command_past_the_window_is_checked(
    manager: ClaimManager, cluster: FakeCluster, clocks: Clocks
) -> None:
    clocks.advance(WINDOW)
    assert run(manager) == cluster.created[0]
    assert cluster.checked == [cluster.created[0]]


def test_a_command_that_is_not_direct_is_always_checked(
    manager: ClaimManager, cluster: FakeCluster
) -> None:
    run(manager, direct=False)
    assert cluster.checked == [cluster.created[0]]


def test_a_window_of_zero_checks_before_every_direct_command(
    make_manager: MakeManager, cluster: FakeCluster
) -> None:
    manager = make_manager(window=0)
    run(manager)
    run(manager)
    assert len(cluster.checked) == 2


def test_the_window_runs_from_when_the_check_was_sent(
    manager: ClaimManager, cluster: FakeCluster, clocks: Clocks
) -> None:
    clocks.advance(WINDOW)
    cluster.in_flight = lambda: clocks.advance(0.6)  # the answer comes 0.6 s after sending
    run(manager)
    cluster.in_flight = lambda: None
    clocks.advance(0.4)  # 1.0 s since the check was sent, 0.4 s since its answer
    run(manager)
    assert len(cluster.checked) == 2


def test_the_window_runs_from_the_start_of_a_creation_that_reports_no_sighting(
    make_manager: MakeManager, cluster: FakeCluster, clocks: Clocks
) -> None:
    cluster.in_flight = lambda: clocks.advance(0.6)  # the claim is ready 0.6 s later
    manager = make_manager()
    cluster.in_flight = lambda: None
    clocks.advance(0.4)
    run(manager)
    assert cluster.checked == [cluster.created[0]]


def test_a_renewal_counts_as_seeing_the_claim_alive(
    make_manager: MakeManager, cluster: FakeCluster, clocks: Clocks
) -> None:
    manager = make_manager(lifetime=60)
    clocks.advance(40)  # due for renewal, and far past the window
    run(manager)
    assert cluster.renewals_of(cluster.created[0]) != []
    assert cluster.checked == []


def test_past_half_the_window_a_named_daemon_thread_checks_and_dispose_ends_it(
    manager: ClaimManager, cluster: FakeCluster, clocks: Clocks
) -> None:
    cluster.check_gate = threading.Event()  # the check stays in flight until dispose
    clocks.advance(WINDOW / 2)
    run(manager)  # not held up by the check
    assert cluster.checking.wait(5)
    [checker] = checkers()
    assert checker.daemon
    manager.dispose()
    assert checkers() == []


def test_a_background_check_renews_the_sighting(
    manager: ClaimManager, cluster: FakeCluster, clocks: Clocks
) -> None:
    clocks.advance(WINDOW * 0.6)
    run(manager)
    join_checkers()
    assert len(cluster.checked) == 1
    # Past the window since readiness, less than half of it since the background check:
    # trusted, so neither a check first nor another one in the background.
    clocks.advance(WINDOW * 0.45)
    run(manager)
    join_checkers()
    assert len(cluster.checked) == 1


def test_a_background_check_that_finds_the_claim_gone_replaces_it(
    manager: ClaimManager, cluster: FakeCluster, clocks: Clocks
) -> None:
    [first] = cluster.created
    cluster.gone.add(first)
    clocks.advance(WINDOW / 2)
    run(manager)
    join_checkers()
    assert cluster.deleted == [first]
    assert run(manager) == cluster.created[1]


def test_exists_is_false_for_a_gone_claim_and_retires_it(
    manager: ClaimManager, cluster: FakeCluster
) -> None:
    [first] = cluster.created
    cluster.gone.add(first)
    with manager.command(CancelToken(), direct=True) as use:
        assert use.exists() is False
        assert cluster.deleted == []  # still in use
    assert cluster.deleted == [first]
    assert run(manager) == cluster.created[1]


def test_exists_is_true_for_a_claim_the_api_still_has(
    manager: ClaimManager, cluster: FakeCluster
) -> None:
    with manager.command(CancelToken(), direct=True) as use:
        assert use.exists() is True
    assert cluster.deleted == []


def test_exists_is_none_when_the_api_cannot_say(
    manager: ClaimManager, cluster: FakeCluster
) -> None:
    cluster.check_error = PiShipError("SANDBOX_UNAVAILABLE", "HTTP 503: etcd unavailable")
    with manager.command(CancelToken(), direct=True) as use:
        assert use.exists() is None
    assert cluster.deleted == []


@pytest.mark.parametrize("window", [-0.5, float("nan"), float("inf"), "1", True])
def test_an_invalid_window_is_refused(cluster: FakeCluster, window: object) -> None:
    with pytest.raises(PiShipError, match="existence_window") as refused:
        ClaimManager(
            cluster,
            Clocks().clock(60),
            keepalive_every=3600,
            existence_window=window,  # type: ignore[arg-type]
        )
    assert refused.value.code == CONFIG_INVALID
