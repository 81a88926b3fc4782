"""The seed's Kubernetes cases (``remote.test.ts``), one for one, against the fake cluster.

Sections ported: the Kubernetes half of "remote capability reporting" and all of
"kubernetes-agent-sandbox backend against a mock cluster". Each test names its
seed case in a ``# seed:`` comment and keeps the seed's assertions. Clocks are
seconds (the seed's milliseconds / 1000); the seed's real-time waits for the
250 ms keepalive stay real (a second at most), everything else waits on events.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import pytest

from piship_remote.backends.base import ExecRequest
from piship_remote.backends.kubernetes.backend import KubernetesInstance, runtime_command
from piship_remote.backends.lifetime import micros, rfc3339
from piship_remote.model.errors import CommandCancelled, CommandTimeout, PiShipError
from piship_remote.sandbox.activation import Sandbox
from piship_remote.testing import CLAIMS, Cluster, KubernetesServer, Recorded, leaks
from tests.support.seed import (
    Clocks,
    Rejections,
    Run,
    Seed,
    T,
    assert_no_library_thread_left,
    failure_of,
    host_values_in,
    kubernetes,
    seed_policy,
    wire,
)

KubernetesFactory = Callable[..., KubernetesServer]

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def no_thread_left() -> Iterator[None]:
    """After each test (every sandbox disposed): no library thread or Timer is alive."""
    yield
    assert_no_library_thread_left()


@pytest.fixture
def seed(workspace: Path, home: Path) -> Seed:
    return Seed(workspace, home, network="allow")


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(8) as executor:
        yield executor


@attrs.frozen
class Running:
    """A command running on the pool until the test cancels it (the seed's AbortController)."""

    future: Future[Run]
    abort: threading.Event

    def cancel(self, match: str | None = None) -> None:
        """Cancel it: it must end in CommandCancelled (with a message matching ``match``)."""
        self.abort.set()
        with pytest.raises(CommandCancelled, match=match):
            self.future.result(10)


Start = Callable[[Sandbox, str], Running]


@pytest.fixture
def start(seed: Seed, pool: ThreadPoolExecutor) -> Start:
    """``start(sandbox, command)``: run ``command`` in the background, cancellable."""

    def run_in_background(sandbox: Sandbox, command: str) -> Running:
        abort = threading.Event()
        return Running(pool.submit(seed.run, sandbox, command, cancel=abort), abort)

    return run_in_background


def claim_names(requests: list[Recorded]) -> list[str]:
    return [
        r.json()["metadata"]["name"] for r in requests if r.method == "POST" and r.path == CLAIMS
    ]


def lifecycle_of(request: Recorded | None) -> Any:
    body = request.json() if request is not None else {}
    return body.get("spec", {}).get("lifecycle")


def shutdowns(requests: list[Recorded]) -> list[str]:
    return [
        lifecycle_of(r)["shutdownTime"]
        for r in requests
        if (r.method == "POST" and r.path == CLAIMS) or r.method == "PATCH"
    ]


def at(seconds: float) -> str:
    return rfc3339(micros(T + seconds))


def renewals(mock: KubernetesServer, name: str) -> int:
    return mock.count("PATCH", f"{CLAIMS}/{name}")


def times_sent(mock: KubernetesServer, text: str) -> int:
    """How many commands holding ``text`` went to the router."""
    return len([r for r in mock.find(path="/execute") if text in r.body.decode("latin-1")])


def sent(mock: KubernetesServer, text: str) -> bool:
    return times_sent(mock, text) > 0


def assert_the_last_command_ran_in_a_second_claim(mock: KubernetesServer) -> None:
    names = claim_names(mock.requests)
    assert len(names) == 2
    assert mock.find(path="/execute")[-1].headers["x-sandbox-id"] == f"pool-{names[1]}"


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll a condition on the fake's recorded requests (it has no event for each)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the condition never held")
        time.sleep(0.005)


def hang_sleep(command: str) -> Mapping[str, Any]:
    return {"hang": True} if "sleep" in command else {"stdout": "ok\n"}


def keepalive_ticks(sandbox: Sandbox, count: int = 2) -> None:
    """``count`` keepalive intervals, without waiting for them: the claim manager's
    keepalive ticks (its test seam ``keepalive_now``), run now on this thread, so what
    they renew (or do not) is on the fake's record when this returns."""
    instance = sandbox._engine._instance
    assert isinstance(instance, KubernetesInstance)
    for _ in range(count):
        instance._manager.keepalive_now()


def keepalive_armed(claim: str) -> bool:
    """Whether ``claim`` still has a keepalive timer that could renew it later."""
    return any(t.name == f"piship-keepalive-{claim}" for t in threading.enumerate())


# ---------------------------------------------------------------- capability reporting


# seed: "never declares PiShip's filesystem path planes for a remote backend"
def test_never_declares_filesystem_path_planes() -> None:
    capabilities = kubernetes("http://127.0.0.1:1").capabilities()
    assert capabilities.isolation == "remote"
    assert capabilities.planes == ("host-filesystem-isolation", "environment-filter")
    assert "filesystem-read-deny" not in capabilities.planes
    assert "filesystem-write-allowlist" not in capabilities.planes
    assert capabilities.local_processes is False
    assert capabilities.to_dict()["workspace"] == {"mode": "snapshot"}


# seed: "refuses Kubernetes network deny without authoritative NetworkPolicy evidence"
def test_refuses_network_deny(kubernetes_server: KubernetesFactory, seed: Seed) -> None:
    mock = kubernetes_server()
    error = failure_of(lambda: seed.activate(kubernetes(mock.url), seed_policy("deny")))
    assert isinstance(error, PiShipError)
    assert error.code == "SANDBOX_UNAVAILABLE"
    assert mock.count("POST", CLAIMS) == 0


# ---------------------------------------------------------------- against a mock cluster


# seed: "claims a sandbox, runs through the router, and deletes the claim"
def test_claims_runs_through_the_router_and_deletes(
    kubernetes_server: KubernetesFactory, seed: Seed
) -> None:
    mock = kubernetes_server(lambda command: {"stdout": "hello\n", "exit_code": 4})
    sandbox = seed.activate(kubernetes(mock.url))
    assert sandbox.report.level == "enforced"
    assert sandbox.report.provider == "kubernetes-agent-sandbox"
    assert sandbox.report.verification == "backend-attested"
    assert seed.run(sandbox, "make test", cwd=seed.workspace / "sub") == Run(4, "hello\n")
    sandbox.dispose()
    claim = mock.find("POST", CLAIMS)[0].json()
    assert claim["apiVersion"] == "extensions.agents.x-k8s.io/v1beta1"
    assert claim["kind"] == "SandboxClaim"
    assert claim["spec"]["warmPoolRef"] == {"name": "python-pool"}
    name = claim["metadata"]["name"]
    assert re.fullmatch(r"piship-[0-9a-f]{12}", name)
    execute = mock.find(path="/execute")
    assert execute[-1].headers["x-sandbox-id"] == f"pool-{name}"
    assert execute[-1].headers["x-sandbox-namespace"] == "agents"
    assert execute[-1].headers["x-sandbox-port"] == "8888"
    assert execute[-1].json()["command"] == (
        "env 'LANG=C.UTF-8' 'DOCS_MODE=demo' /bin/sh -c 'cd -- '\"'\"'sub'\"'\"' && make test'"
    )
    last = mock.requests[-1]
    assert (last.method, last.path) == ("DELETE", f"{CLAIMS}/{name}")
    assert host_values_in(wire(mock.requests)) == []


# seed: "replaces the claim after a timed-out command"
def test_replaces_the_claim_after_a_timed_out_command(
    kubernetes_server: KubernetesFactory, seed: Seed
) -> None:
    mock = kubernetes_server(hang_sleep)
    sandbox = seed.activate(kubernetes(mock.url))
    with pytest.raises(CommandTimeout, match=r"^timeout:0\.3$"):
        seed.run(sandbox, "sleep 600", timeout=0.3)
    assert seed.run(sandbox, "echo ok").output == "ok\n"
    sandbox.dispose()
    assert mock.count("POST", CLAIMS) == 2
    assert mock.count("DELETE") == 2


# seed: "shares one claim between concurrent commands and keeps it for the others when one is cancelled"  # noqa: E501
def test_shares_one_claim_between_concurrent_commands(
    kubernetes_server: KubernetesFactory, seed: Seed, pool: ThreadPoolExecutor, start: Start
) -> None:
    mock = kubernetes_server(hang_sleep)
    sandbox = seed.activate(kubernetes(mock.url))
    slow = start(sandbox, "sleep 600")
    quick = [pool.submit(seed.run, sandbox, f"echo {x}") for x in "ab"]
    assert [f.result(10).output for f in quick] == ["ok\n", "ok\n"]
    wait_until(lambda: sent(mock, "sleep 600"))
    slow.cancel(match="aborted")
    assert mock.count("POST", CLAIMS) == 1
    # The cancelled command's claim is deleted once nothing uses it.
    assert mock.count("DELETE") == 1
    after = [pool.submit(seed.run, sandbox, f"echo {x}") for x in "cd"]
    assert [f.result(10).output for f in after] == ["ok\n", "ok\n"]
    assert mock.count("POST", CLAIMS) == 2
    sandbox.dispose()
    assert mock.count("DELETE") == 2


# seed: "does not fail a parallel command that waits for the claim a cancelled one started (#158)"
def test_a_parallel_waiter_survives_a_cancelled_one(
    kubernetes_server: KubernetesFactory, seed: Seed, pool: ThreadPoolExecutor, start: Start
) -> None:
    mock = kubernetes_server(hang_sleep)
    # Readiness takes one 300 ms poll, so both commands wait on the claim.
    sandbox = seed.activate(kubernetes(mock.url, poll_interval=0.3))
    # A cancelled command retires the first claim: the next ones share a new one.
    retired = start(sandbox, "sleep 600")
    wait_until(lambda: sent(mock, "sleep 600"))
    retired.cancel(match="aborted")
    cancelled = start(sandbox, "echo a")
    parallel = pool.submit(seed.run, sandbox, "echo b")
    time.sleep(0.05)
    cancelled.cancel(match="aborted")
    assert parallel.result(10).output == "ok\n"
    assert mock.count("POST", CLAIMS) == 2
    sandbox.dispose()


# seed: "keeps renewing a claim a parallel command still runs in after another is cancelled (#158)"
def test_keeps_renewing_a_claim_a_parallel_command_runs_in(
    kubernetes_server: KubernetesFactory, seed: Seed, pool: ThreadPoolExecutor, start: Start
) -> None:
    done = threading.Event()

    def execute(command: str) -> Mapping[str, Any]:
        if "sleep" in command:
            return {"hang": True}
        if "long" in command:
            return {"stdout": "long\n", "after": done}
        return {"stdout": "ok\n"}

    mock = kubernetes_server(execute)
    # A one-second lifetime renews a running command every 250 ms.
    sandbox = seed.activate(kubernetes(mock.url, lifetime_seconds=1))
    [first] = claim_names(mock.requests)
    cancelled = start(sandbox, "sleep 600")
    parallel = pool.submit(seed.run, sandbox, "long job")
    wait_until(lambda: sent(mock, "sleep 600") and sent(mock, "long job"))
    time.sleep(0.1)
    cancelled.cancel(match="aborted")
    at_cancel = renewals(mock, first)
    # The parallel command still runs in the claim: it must not expire under it.
    keepalive_ticks(sandbox)
    assert renewals(mock, first) > at_cancel
    done.set()
    assert parallel.result(10).output == "long\n"
    # Retired by the cancellation: deleted once the parallel command ends.
    assert mock.count("DELETE", f"{CLAIMS}/{first}") >= 1
    sandbox.dispose()


# seed: "creates every claim with a bounded, deterministic lifecycle"
def test_creates_every_claim_with_a_deterministic_lifecycle(
    kubernetes_server: KubernetesFactory, seed: Seed
) -> None:
    mock = kubernetes_server()
    sandbox = seed.activate(kubernetes(mock.url, lifetime_seconds=900, now=lambda: T + 0.25))
    sandbox.dispose()
    # Rounded up to the second: never shorter than the lifetime.
    assert lifecycle_of(mock.find("POST", CLAIMS)[0]) == {
        "shutdownTime": "2026-09-28T18:15:01Z",
        "shutdownPolicy": "Delete",
    }


# seed: "deletes the claim when a command is cancelled"
def test_deletes_the_claim_when_a_command_is_cancelled(
    kubernetes_server: KubernetesFactory, seed: Seed
) -> None:
    mock = kubernetes_server(hang_sleep)
    sandbox = seed.activate(kubernetes(mock.url))
    [first] = claim_names(mock.requests)
    cancel = threading.Event()
    threading.Timer(0.1, cancel.set).start()
    with pytest.raises(CommandCancelled, match="aborted"):
        seed.run(sandbox, "sleep 600", cancel=cancel)
    assert [r.path for r in mock.find("DELETE")] == [f"{CLAIMS}/{first}"]
    sandbox.dispose()


# seed: "stays fail closed when cleanup fails, and the claim still expires on its own"
def test_stays_fail_closed_when_cleanup_fails(
    kubernetes_server: KubernetesFactory, seed: Seed
) -> None:
    mock = kubernetes_server(hang_sleep, Cluster(delete_status=500))
    sandbox = seed.activate(kubernetes(mock.url, lifetime_seconds=600, now=lambda: T))
    with pytest.raises(CommandTimeout, match=r"^timeout:0\.2$"):
        seed.run(sandbox, "sleep 600", timeout=0.2)
    [retired] = claim_names(mock.requests)
    # The DELETE was attempted and failed; nothing about it leaked back.
    assert mock.count("DELETE", f"{CLAIMS}/{retired}") >= 1
    # The retired claim carries the safety net and is never renewed again.
    assert lifecycle_of(mock.find("POST", CLAIMS)[0]) == {
        "shutdownTime": "2026-09-28T18:10:00Z",
        "shutdownPolicy": "Delete",
    }
    # The next command runs in a fresh claim, never the retired one.
    assert seed.run(sandbox, "echo ok").output == "ok\n"
    assert_the_last_command_ran_in_a_second_claim(mock)
    assert renewals(mock, retired) == 0
    sandbox.dispose()


# seed: "renews the claim so a long session is not expired early"
def test_renews_the_claim_so_a_long_session_is_not_expired_early(
    kubernetes_server: KubernetesFactory, seed: Seed, start: Start
) -> None:
    clocks = Clocks()
    mock = kubernetes_server(lambda c: {"hang": True} if "slow" in c else {"stdout": "ok\n"})
    sandbox = seed.activate(kubernetes(mock.url, clocks=clocks, lifetime_seconds=1))
    # Fresh claim: nothing to renew yet.
    seed.run(sandbox, "echo a")
    assert mock.count("PATCH") == 0
    # Past half the lifetime, the next command renews first.
    clocks.advance(0.6)
    seed.run(sandbox, "echo b")
    patches = mock.find("PATCH")
    assert len(patches) == 1
    assert lifecycle_of(patches[0]) == {"shutdownTime": "2026-09-28T18:00:02Z"}
    assert patches[0].headers["content-type"] == "application/merge-patch+json"
    # A command that runs longer than the lifetime is kept alive while it runs:
    # renewed every 250 ms; wait for two renewals beyond the one above.
    slow = start(sandbox, "slow job")
    wait_until(lambda: mock.count("PATCH") >= 3)
    slow.cancel()
    sandbox.dispose()


# seed: "stops renewing a claim once its command is cancelled"
def test_stops_renewing_once_its_command_is_cancelled(
    kubernetes_server: KubernetesFactory, seed: Seed, start: Start
) -> None:
    mock = kubernetes_server(hang_sleep)
    # A one-second lifetime renews a running command every 250 ms.
    sandbox = seed.activate(kubernetes(mock.url, lifetime_seconds=1))
    [first] = claim_names(mock.requests)
    pending = start(sandbox, "sleep 600")
    # Renewal really runs while the command does...
    wait_until(lambda: renewals(mock, first) >= 1)
    pending.cancel()
    at_retire = renewals(mock, first)
    # ...and never again after retirement: its timer is gone, and two more intervals'
    # ticks leave it alone.
    assert not keepalive_armed(first)
    keepalive_ticks(sandbox)
    assert renewals(mock, first) == at_retire
    sandbox.dispose()


# seed: "replaces a locally expired claim without renewing it"
def test_replaces_a_locally_expired_claim_without_renewing_it(
    kubernetes_server: KubernetesFactory, seed: Seed
) -> None:
    clocks = Clocks()
    # The cluster has not removed the claim yet, so a PATCH would succeed.
    mock = kubernetes_server()
    sandbox = seed.activate(kubernetes(mock.url, clocks=clocks, lifetime_seconds=60))
    [first] = claim_names(mock.requests)
    clocks.advance(61)
    assert seed.run(sandbox, "echo ok").exit_code == 0
    assert len(claim_names(mock.requests)) == 2
    assert mock.count("PATCH") == 0
    assert mock.count("DELETE", f"{CLAIMS}/{first}") == 1
    sandbox.dispose()


# seed: "replaces a claim removed early by the cluster before a command"
def test_replaces_a_claim_removed_early_by_the_cluster(
    kubernetes_server: KubernetesFactory, seed: Seed
) -> None:
    cluster = Cluster()
    mock = kubernetes_server(None, cluster)
    sandbox = seed.activate(kubernetes(mock.url, lifetime_seconds=3600))
    [first] = claim_names(mock.requests)
    cluster.expired.add(first)
    assert seed.run(sandbox, "echo fresh").exit_code == 0
    assert len(claim_names(mock.requests)) == 2
    sandbox.dispose()


# seed: "retires a claim the router no longer knows and never replays the command"
def test_retires_a_claim_the_router_no_longer_knows(
    kubernetes_server: KubernetesFactory, seed: Seed
) -> None:
    cluster = Cluster()
    mock = kubernetes_server(lambda command: {"stdout": f"{command.split(chr(39))[-2]}\n"}, cluster)
    sandbox = seed.activate(kubernetes(mock.url, lifetime_seconds=3600))
    [first] = claim_names(mock.requests)
    # The API still lists the claim, far from renewal; only the router answers
    # that its sandbox is gone.
    cluster.router_gone.add(first)
    with pytest.raises(PiShipError, match="no longer knows this sandbox"):
        seed.run(sandbox, "echo one")
    assert mock.count("DELETE", f"{CLAIMS}/{first}") == 1
    assert seed.run(sandbox, "echo two").output == "echo two\n"
    names = claim_names(mock.requests)
    assert len(names) == 2
    commands = [
        (r.headers["x-sandbox-id"], "echo one" in r.body.decode(), "echo two" in r.body.decode())
        for r in mock.find(path="/execute")
    ]
    # Sent once to the stale sandbox, never again; the next one is fresh.
    assert [c for c in commands if c[1] or c[2]] == [
        (f"pool-{first}", True, False),
        (f"pool-{names[1]}", False, True),
    ]
    sandbox.dispose()


# seed: "is never retryable when %s, and its sandbox is deleted"
@pytest.mark.parametrize(
    "answer",
    [
        pytest.param({"drop": True}, id="the router connection drops"),
        pytest.param({"status": 502}, id="the router answers 502"),
        pytest.param({"status": 504}, id="the router answers 504"),
    ],
)
def test_an_unknown_outcome_is_never_retryable_and_its_sandbox_is_deleted(
    kubernetes_server: KubernetesFactory, seed: Seed, answer: Mapping[str, Any]
) -> None:
    mock = kubernetes_server(lambda command: answer if "deploy" in command else {"stdout": "ok\n"})
    instance = kubernetes(mock.url).prepare(seed.profile())
    error = failure_of(lambda: instance.exec(seed.request("deploy"), cancel=threading.Event()))
    assert isinstance(error, PiShipError)
    assert error.code == "SANDBOX_UNAVAILABLE"
    assert error.retryable is False
    assert "outcome is unknown" in str(error)
    # The claim is deleted before the failure is reported: a command still
    # running in its pod ends with it.
    [first] = claim_names(mock.requests)
    assert mock.count("DELETE", f"{CLAIMS}/{first}") == 1
    # Never sent again; the next command runs in a fresh claim.
    instance.exec(seed.request("echo next"), cancel=threading.Event())
    assert times_sent(mock, "deploy") == 1
    assert_the_last_command_ran_in_a_second_claim(mock)
    instance.dispose()


# seed: "tells the agent not to run it again blindly"
def test_tells_the_agent_not_to_run_it_again_blindly(
    kubernetes_server: KubernetesFactory, seed: Seed
) -> None:
    mock = kubernetes_server(
        lambda command: {"drop": True} if "deploy" in command else {"stdout": "ok\n"}
    )
    sandbox = seed.activate(kubernetes(mock.url))
    error = failure_of(lambda: seed.run(sandbox, "deploy"))
    assert "outcome is unknown" in str(error)
    assert "before running it again" in str(error)
    assert "GATEWAY_UNREACHABLE" not in str(error)
    assert seed.run(sandbox, "echo ok").output == "ok\n"
    sandbox.dispose()


# seed: "still reports a cancelled command as cancelled"
def test_still_reports_a_cancelled_command_as_cancelled(
    kubernetes_server: KubernetesFactory, seed: Seed, pool: ThreadPoolExecutor
) -> None:
    mock = kubernetes_server(
        lambda command: {"hang": True} if "deploy" in command else {"stdout": "ok\n"}
    )
    instance = kubernetes(mock.url).prepare(seed.profile())
    cancel = threading.Event()
    pending: Future[object] = pool.submit(instance.exec, seed.request("deploy"), cancel=cancel)
    wait_until(lambda: sent(mock, "deploy"))
    cancel.set()
    error = pending.exception(10)
    assert not isinstance(error, PiShipError)
    assert isinstance(error, CommandCancelled)
    instance.dispose()


# seed: "retires a claim that disappears while a command runs, without replaying it"
def test_retires_a_claim_that_disappears_while_a_command_runs(
    kubernetes_server: KubernetesFactory, seed: Seed, pool: ThreadPoolExecutor
) -> None:
    finished = threading.Event()
    cluster = Cluster()
    mock = kubernetes_server(
        lambda command: (
            {"stdout": "slow done\n", "after": finished}
            if "slow" in command
            else {"stdout": "ok\n"}
        ),
        cluster,
    )
    # A one-second lifetime renews a running command every 250 ms.
    sandbox = seed.activate(kubernetes(mock.url, lifetime_seconds=1))
    [first] = claim_names(mock.requests)
    slow = pool.submit(seed.run, sandbox, "slow job")
    wait_until(lambda: sent(mock, "slow job"))
    before = renewals(mock, first)
    cluster.expired.add(first)
    # The keepalive learns that the claim is gone.
    wait_until(lambda: renewals(mock, first) > before)
    finished.set()
    # The command's own outcome stands; it is not sent again.
    assert slow.result(10).output == "slow done\n"
    assert mock.count("DELETE", f"{CLAIMS}/{first}") == 1
    assert seed.run(sandbox, "echo ok").output == "ok\n"
    assert times_sent(mock, "slow job") == 1
    assert_the_last_command_ran_in_a_second_claim(mock)
    sandbox.dispose()


# seed: "reports a new epoch once an expired claim is replaced"
def test_reports_a_new_epoch_once_an_expired_claim_is_replaced(
    kubernetes_server: KubernetesFactory, seed: Seed
) -> None:
    clocks = Clocks()
    mock = kubernetes_server()
    instance = kubernetes(mock.url, clocks=clocks, lifetime_seconds=60).prepare(seed.profile())
    request = seed.request("true")
    assert instance.epoch() is None
    instance.exec(request, cancel=threading.Event())
    first = instance.epoch()
    assert first == claim_names(mock.requests)[0]
    instance.exec(request, cancel=threading.Event())
    assert instance.epoch() == first
    clocks.advance(61)
    instance.exec(request, cancel=threading.Event())
    assert instance.epoch() == claim_names(mock.requests)[1]
    assert instance.epoch() != first
    instance.dispose()


# seed: "creates no claim after dispose, even mid-renewal"
def test_creates_no_claim_after_dispose_even_mid_renewal(
    kubernetes_server: KubernetesFactory, seed: Seed, pool: ThreadPoolExecutor
) -> None:
    clocks = Clocks()
    gate = threading.Event()
    cluster = Cluster(patch_gate=gate)
    mock = kubernetes_server(None, cluster)
    sandbox = seed.activate(kubernetes(mock.url, clocks=clocks, lifetime_seconds=60))
    [first] = claim_names(mock.requests)
    # Due for renewal; the cluster answers that the claim is gone only after
    # the session has been disposed.
    clocks.advance(40)
    cluster.expired.add(first)
    pending = pool.submit(seed.run, sandbox, "echo ok")
    mock.wait_for("PATCH", timeout=10)
    sandbox.dispose()
    gate.set()
    with pytest.raises(PiShipError, match="disposed"):
        pending.result(10)
    assert claim_names(mock.requests) == [first]
    assert mock.count("POST", "/execute") == 1  # the activation check only


# seed: "replaces a claim the cluster already expired before running"
def test_replaces_a_claim_the_cluster_already_expired(
    kubernetes_server: KubernetesFactory, seed: Seed
) -> None:
    clocks = Clocks()
    cluster = Cluster()
    mock = kubernetes_server(None, cluster)
    sandbox = seed.activate(kubernetes(mock.url, clocks=clocks, lifetime_seconds=60))
    [first] = claim_names(mock.requests)
    cluster.expired.add(first)
    clocks.advance(120)
    assert seed.run(sandbox, "echo ok").exit_code == 0
    assert_the_last_command_ran_in_a_second_claim(mock)
    sandbox.dispose()


# ---------------------------------------------------------------- when the wall clock changes


# seed: "keeps a keepalive renewal at or after the committed shutdownTime when the clock moves backward"  # noqa: E501
def test_a_keepalive_renewal_stays_at_the_committed_time_when_the_clock_moves_back(
    kubernetes_server: KubernetesFactory, seed: Seed, start: Start
) -> None:
    clocks = Clocks()
    mock = kubernetes_server(hang_sleep)
    # Frozen monotonic clock: no monotonic time passes while the wall clock moves.
    sandbox = seed.activate(kubernetes(mock.url, clocks=clocks, lifetime_seconds=1))
    clocks.wall -= 3600
    pending = start(sandbox, "sleep 600")
    mock.wait_for("PATCH", timeout=10)
    pending.cancel()
    values = shutdowns(mock.requests)
    assert len(values) >= 2
    # No monotonic time passed: every renewal commits the creation value.
    assert set(values) == {at(1)}
    sandbox.dispose()


# seed: "renews from monotonic elapsed time when the clock moves %s"
@pytest.mark.parametrize(
    "jump",
    [
        pytest.param(-3600.0, id="backward by an hour"),
        pytest.param(-2.0, id="backward by two seconds (a small correction)"),
    ],
)
def test_renews_from_monotonic_elapsed_time_when_the_clock_moves_back(
    kubernetes_server: KubernetesFactory, seed: Seed, jump: float
) -> None:
    clocks = Clocks(mono=5.0)
    mock = kubernetes_server()
    sandbox = seed.activate(kubernetes(mock.url, clocks=clocks, lifetime_seconds=60))
    clocks.wall += jump
    clocks.mono += 40
    seed.run(sandbox, "echo a")
    # Several renewals, with the clock moving again between them.
    clocks.wall -= jump / 2
    clocks.mono += 40
    seed.run(sandbox, "echo b")
    assert shutdowns(mock.requests) == [at(60), at(100), at(140)]
    assert len(claim_names(mock.requests)) == 1
    # The local deadline is the committed one: just before it the claim is
    # renewed and kept, just after it replaced without renewal.
    clocks.mono += 59.999
    seed.run(sandbox, "echo c")
    assert len(claim_names(mock.requests)) == 1
    # 139.999 s elapsed plus the lifetime, rounded up to the second.
    assert shutdowns(mock.requests)[-1] == at(200)
    clocks.mono += 60.001
    seed.run(sandbox, "echo d")
    assert len(claim_names(mock.requests)) == 2
    sandbox.dispose()


# seed: "renews on wall elapsed time after a suspend stopped the monotonic clock"
def test_renews_on_wall_elapsed_time_after_a_suspend(
    kubernetes_server: KubernetesFactory, seed: Seed
) -> None:
    clocks = Clocks()
    mock = kubernetes_server()
    sandbox = seed.activate(kubernetes(mock.url, clocks=clocks, lifetime_seconds=3600))
    # Asleep for 45 minutes; the monotonic clock advanced 5.
    clocks.wall += 45 * 60
    clocks.mono += 5 * 60
    seed.run(sandbox, "echo a")
    assert shutdowns(mock.requests) == [at(3600), at(45 * 60 + 3600)]
    assert len(claim_names(mock.requests)) == 1
    sandbox.dispose()


# seed: "replaces a claim the wall clock says expired during a suspend, without reviving it"
def test_replaces_a_claim_that_expired_during_a_suspend(
    kubernetes_server: KubernetesFactory, seed: Seed
) -> None:
    clocks = Clocks()
    mock = kubernetes_server()
    sandbox = seed.activate(kubernetes(mock.url, clocks=clocks, lifetime_seconds=3600))
    clocks.wall += 61 * 60
    clocks.mono += 5 * 60
    seed.run(sandbox, "echo ok")
    assert len(claim_names(mock.requests)) == 2
    assert mock.count("PATCH") == 0
    sandbox.dispose()


# seed: "never lets a late keepalive revive a claim past its shutdownTime"
def test_a_late_keepalive_never_revives_a_claim(
    kubernetes_server: KubernetesFactory, seed: Seed, start: Start
) -> None:
    clocks = Clocks()
    mock = kubernetes_server(hang_sleep)
    # Frozen monotonic clock: the machine slept, only the wall clock moved.
    sandbox = seed.activate(kubernetes(mock.url, clocks=clocks, lifetime_seconds=1))
    pending = start(sandbox, "sleep 600")
    wait_until(lambda: sent(mock, "sleep 600"))
    # The command runs; the machine sleeps past the claim's shutdownTime.
    clocks.wall += 5
    # Two keepalive intervals pass with the claim already expired.
    keepalive_ticks(sandbox)
    assert mock.count("PATCH") == 0
    pending.cancel()
    sandbox.dispose()


# seed: "counts a forward jump as elapsed time: renewal comes earlier, and shutdownTime moves by at most the jump"  # noqa: E501
def test_counts_a_forward_jump_as_elapsed_time(
    kubernetes_server: KubernetesFactory, seed: Seed
) -> None:
    clocks = Clocks()
    mock = kubernetes_server()
    sandbox = seed.activate(kubernetes(mock.url, clocks=clocks, lifetime_seconds=60))
    # 10 s pass and the clock is also set 25 s ahead: 35 s count.
    clocks.wall += 35
    clocks.mono += 10
    seed.run(sandbox, "echo a")
    # Monotonic time alone would neither renew yet nor give T + 70 s; the jump
    # lengthens the lifetime by at most its own 25 s.
    assert shutdowns(mock.requests) == [at(60), at(95)]
    # A jump past the committed shutdownTime counts as expiry.
    clocks.wall += 86_400
    seed.run(sandbox, "echo b")
    assert len(claim_names(mock.requests)) == 2
    assert mock.count("PATCH") == 1
    sandbox.dispose()


# seed: "expires a claim locally at its committed shutdownTime after the clock moved backward"
def test_expires_a_claim_locally_after_the_clock_moved_back(
    kubernetes_server: KubernetesFactory, seed: Seed
) -> None:
    clocks = Clocks()
    mock = kubernetes_server()
    sandbox = seed.activate(kubernetes(mock.url, clocks=clocks, lifetime_seconds=60))
    clocks.wall -= 3600
    clocks.mono += 61
    seed.run(sandbox, "echo ok")
    # Past the committed shutdownTime: replaced, never revived by a PATCH.
    assert len(claim_names(mock.requests)) == 2
    assert mock.count("PATCH") == 0
    sandbox.dispose()


# seed: "times out waiting for Ready after the configured time when the clock jumps %s"
@pytest.mark.parametrize(
    "jump", [pytest.param(-3600.0, id="backward"), pytest.param(3600.0, id="forward")]
)
def test_times_out_waiting_for_ready_when_the_clock_jumps(
    kubernetes_server: KubernetesFactory,
    seed: Seed,
    monkeypatch: pytest.MonkeyPatch,
    jump: float,
) -> None:
    mock = kubernetes_server(None, Cluster(never_ready=True))
    wall = time.time
    started = time.monotonic()

    def jumping() -> float:
        return wall() + (jump if time.monotonic() - started > 0.1 else 0.0)

    monkeypatch.setattr(time, "time", jumping)
    backend = kubernetes(mock.url, ready_timeout=0.6, now=jumping)
    failure = failure_of(lambda: backend.prepare(seed.profile()))
    elapsed = time.monotonic() - started
    assert "did not become ready in time" in str(failure)
    # Not cut short by a forward jump, not stretched by a backward one.
    assert 0.55 <= elapsed < 15
    assert mock.live_claims == []


# ---------------------------------------------------------------- dispose and credentials


# seed: "disposes idempotently"
def test_disposes_idempotently(
    kubernetes_server: KubernetesFactory, seed: Seed, pool: ThreadPoolExecutor
) -> None:
    mock = kubernetes_server()
    sandbox = seed.activate(kubernetes(mock.url))
    both = [pool.submit(sandbox.dispose), pool.submit(sandbox.dispose)]
    for future in both:
        future.result(10)
    sandbox.dispose()
    assert mock.count("DELETE") == 1


# seed: "sends a bearer to the API and the router only when a credential is given"
def test_sends_a_bearer_only_when_a_credential_is_given(
    kubernetes_server: KubernetesFactory, seed: Seed
) -> None:
    mock = kubernetes_server()
    sandbox = seed.activate(kubernetes(mock.url, credential=lambda: "runtime-credential-2"))
    seed.run(sandbox, "true")
    sandbox.dispose()
    assert {r.headers.get("authorization") for r in mock.requests} == {
        "Bearer runtime-credential-2"
    }
    assert leaks(mock.requests, "runtime-credential-2", ["authorization"]) == []


def test_sends_no_authorization_without_a_credential(
    kubernetes_server: KubernetesFactory, seed: Seed
) -> None:
    # The other half of the seed case above: no credential, no header at all.
    mock = kubernetes_server()
    sandbox = seed.activate(kubernetes(mock.url))
    seed.run(sandbox, "true")
    sandbox.dispose()
    assert all("authorization" not in r.headers for r in mock.requests)


# seed: "reports an RBAC 403 on claim creation without rejecting the bearer"
def test_reports_an_rbac_403_on_claim_creation(
    kubernetes_server: KubernetesFactory, seed: Seed
) -> None:
    token = "fake-bearer-SENTINEL-0006"
    mock = kubernetes_server(None, Cluster(token=token, create_status=403))
    rejected = Rejections()
    backend = kubernetes(mock.url, credential=lambda: token, credential_rejected=rejected)
    error = failure_of(lambda: seed.activate(backend))
    assert isinstance(error, PiShipError)
    assert error.code == "SANDBOX_UNAVAILABLE"
    assert "creating the SandboxClaim failed: HTTP 403" in str(error)
    assert token not in str(error)
    assert rejected.count == 0
    assert mock.count("POST", CLAIMS) == 1


# seed: "reports an RBAC 403 from the router without rejecting the bearer"
def test_reports_an_rbac_403_from_the_router(
    kubernetes_server: KubernetesFactory, seed: Seed
) -> None:
    token = "fake-bearer-SENTINEL-0007"
    mock = kubernetes_server(
        lambda command: {"status": 403} if "forbidden" in command else {"stdout": "ok\n"},
        Cluster(token=token),
    )
    rejected = Rejections()
    sandbox = seed.activate(
        kubernetes(mock.url, credential=lambda: token, credential_rejected=rejected)
    )
    error = failure_of(lambda: seed.run(sandbox, "echo forbidden"))
    assert "running the command failed: HTTP 403" in str(error)
    assert token not in str(error)
    assert rejected.count == 0
    # The credential stays usable for the next command.
    assert seed.run(sandbox, "echo ok").output == "ok\n"
    assert rejected.count == 0
    assert len(claim_names(mock.requests)) == 1
    sandbox.dispose()


# seed: "rejects the bearer on a 401 and creates no claim"
def test_rejects_the_bearer_on_a_401_and_creates_no_claim(
    kubernetes_server: KubernetesFactory, seed: Seed
) -> None:
    mock = kubernetes_server(None, Cluster(token="fake-bearer-expected-0000"))
    rejected = Rejections()
    backend = kubernetes(
        mock.url, credential=lambda: "fake-bearer-SENTINEL-0008", credential_rejected=rejected
    )
    error = failure_of(lambda: seed.activate(backend))
    assert isinstance(error, PiShipError)
    assert error.code == "SANDBOX_UNAVAILABLE"
    assert "HTTP 401" in str(error)
    assert "fake-bearer-SENTINEL-0008" not in str(error)
    assert rejected.count >= 1
    # The API refused the bearer before any claim was requested.
    assert mock.count("POST", CLAIMS) == 0


# seed: "quotes commands and environment for the runtime's shell-like split"
def test_quotes_commands_and_environment() -> None:
    assert (
        runtime_command(
            ExecRequest('echo "it\'s" && ls', "/unused", ".", {"A": "x y", "BAD NAME": "z"}),
            None,
        )
        == "env 'A=x y' /bin/sh -c 'echo \"it'\"'\"'s\" && ls'"
    )
    assert (
        runtime_command(ExecRequest("ls", "/unused", "a/b", {}), "/workspace")
        == "env /bin/sh -c 'cd -- '\"'\"'/workspace/a/b'\"'\"' && ls'"
    )


# seed: "rejects names that are not Kubernetes resource names"
def test_rejects_names_that_are_not_kubernetes_resource_names() -> None:
    with pytest.raises(ValueError, match="Kubernetes resource names"):
        kubernetes("http://127.0.0.1:1", namespace="Agents")
