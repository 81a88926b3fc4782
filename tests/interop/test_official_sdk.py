"""The official E2B SDK (``e2b`` 2.63.0, sync API) against our services.

Two targets, the same tests: the test double ``E2bServer`` (scripted answers) and the
embedded ``LocalE2bService`` (real commands under bubblewrap). Passing here means
each speaks the control plane and envd's Connect protocol well enough for the
SDK's generated REST client and its ``connectrpc`` client (reference
``e2b-real-protocol.md`` §14). The SDK is pointed at loopback with ``api_url`` and
``sandbox_url``; nothing leaves the machine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pytest
from local_e2b import local_e2b_service

from tests.support.optional_peers import install_hint

pytest.importorskip("e2b", reason=install_hint("interop"))

from e2b import CommandExitException, Sandbox, TimeoutException

from piship_remote.testing import E2bServer, Recorded

pytestmark = [pytest.mark.interop, pytest.mark.timeout(30)]

DOUBLE_KEY = "e2b_0123456789abcdef"
START = "/process.Process/Start"
SEND_SIGNAL = "/process.Process/SendSignal"


@attrs.frozen
class Target:
    """A service the SDK talks to: its URLs and key, what is alive, what it received."""

    name: str
    url: str
    api_key: str
    live: Callable[[], list[str]]
    recorded: Callable[[], list[Recorded]] | None = None

    def create(self) -> Sandbox:
        return Sandbox.create(
            api_key=self.api_key, api_url=self.url, sandbox_url=self.url, request_timeout=10
        )

    def requests(self, path: str) -> list[Recorded]:
        """What the double received on ``path`` (only the double records requests)."""
        assert self.recorded is not None, f"{self.name} does not record requests"
        return [request for request in self.recorded() if request.path == path]


def scripted(start: dict[str, Any]) -> dict[str, Any]:
    """The double's answers for the commands these tests run, as bash would answer."""
    script = start["process"]["args"][2]
    answers: dict[str, dict[str, Any]] = {
        "echo hello; echo oops >&2": {"stdout": "hello\n", "stderr": "oops\n"},
        "echo bad >&2; exit 7": {"stderr": "bad\n", "exit_code": 7},
        "exec sleep 30": {"hang": True, "killed_end": True},
    }
    return answers.get(script, {})


def double_target() -> Iterator[Target]:
    with E2bServer(command=scripted) as server:
        yield Target(
            "E2bServer",
            server.url,
            DOUBLE_KEY,
            lambda: server.live_sandboxes,
            lambda: server.requests,
        )


def local_target() -> Iterator[Target]:
    with local_e2b_service() as service:
        yield Target("LocalE2bService", service.url, service.api_key, service.sandboxes)


@pytest.fixture(params=["double", "local"])
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from double_target() if request.param == "double" else local_target()


@pytest.fixture
def double() -> Iterator[Target]:
    """The double alone, for the tests that look at what it received."""
    yield from double_target()


@pytest.fixture
def sandbox(target: Target) -> Iterator[Sandbox]:
    sandbox = target.create()
    yield sandbox
    sandbox.kill()


@pytest.fixture
def double_sandbox(double: Target) -> Iterator[Sandbox]:
    sandbox = double.create()
    yield sandbox
    sandbox.kill()


def test_sdk_creates_a_sandbox_the_service_knows(target: Target, sandbox: Sandbox) -> None:
    assert target.live() == [sandbox.sandbox_id]
    assert sandbox.is_running() is True


def test_sdk_create_reaches_the_control_plane_with_its_key(
    double: Target, double_sandbox: Sandbox
) -> None:
    (create,) = double.requests("/v2/sandboxes")
    assert create.method == "POST"
    assert create.headers["x-api-key"] == DOUBLE_KEY
    assert create.json()["templateID"] == "base"


def test_sdk_runs_a_command_and_gets_stdout_stderr_and_exit_code(sandbox: Sandbox) -> None:
    result = sandbox.commands.run("echo hello; echo oops >&2", timeout=10)
    assert (result.stdout, result.stderr, result.exit_code) == ("hello\n", "oops\n", 0)


def test_sdk_streams_output_to_its_callbacks(sandbox: Sandbox) -> None:
    out: list[str] = []
    err: list[str] = []
    sandbox.commands.run(
        "echo hello; echo oops >&2", on_stdout=out.append, on_stderr=err.append, timeout=10
    )
    assert ("".join(out), "".join(err)) == ("hello\n", "oops\n")


def test_sdk_start_request_is_what_the_double_expects(
    double: Target, double_sandbox: Sandbox
) -> None:
    double_sandbox.commands.run("echo hello; echo oops >&2", timeout=10)
    (start,) = double.requests(START)
    assert "authorization" not in start.headers  # envd >= 0.4.0: the service's default user
    assert start.headers["x-access-token"] == "envd-token-1"
    assert start.headers["connect-timeout-ms"] == "10000"
    assert start.headers["e2b-sandbox-id"] == double_sandbox.sandbox_id


def test_sdk_raises_command_exit_exception_for_a_non_zero_exit(sandbox: Sandbox) -> None:
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("echo bad >&2; exit 7", timeout=10)
    assert failed.value.exit_code == 7
    assert failed.value.stderr == "bad\n"


def test_sdk_kills_a_background_command(target: Target, sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("exec sleep 30", background=True, timeout=10)
    assert handle.kill() is True
    with pytest.raises(CommandExitException) as killed:
        handle.wait()
    assert killed.value.exit_code == -1


def test_sdk_kills_a_command_by_pid(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("exec sleep 30", background=True, timeout=10)
    assert sandbox.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException):
        handle.wait()


def test_sdk_kill_by_pid_is_a_send_signal_by_pid(double: Target, double_sandbox: Sandbox) -> None:
    handle = double_sandbox.commands.run("exec sleep 30", background=True, timeout=10)
    assert double_sandbox.commands.kill(handle.pid) is True
    (signal,) = double.requests(SEND_SIGNAL)
    assert signal.json() == {"process": {"pid": handle.pid}, "signal": "SIGNAL_SIGKILL"}


def test_sdk_command_timeout_ends_the_command(sandbox: Sandbox) -> None:
    with pytest.raises(TimeoutException):
        sandbox.commands.run("exec sleep 30", timeout=0.3)


def test_sdk_sets_the_sandbox_timeout(sandbox: Sandbox) -> None:
    sandbox.set_timeout(120)
    assert sandbox.is_running()


def test_sdk_set_timeout_is_a_post_with_seconds(double: Target, double_sandbox: Sandbox) -> None:
    double_sandbox.set_timeout(120)
    renewals = double.requests(f"/sandboxes/{double_sandbox.sandbox_id}/timeout")
    assert [(r.method, r.json()) for r in renewals] == [("POST", {"timeout": 120})]


def test_sdk_kills_the_sandbox(target: Target) -> None:
    sandbox = target.create()
    assert sandbox.kill() is True
    assert target.live() == []


def test_sdk_health_probe_reaches_envd(double: Target, double_sandbox: Sandbox) -> None:
    assert double_sandbox.is_running() is True
    assert [request.method for request in double.requests("/health")] == ["GET"]


def test_double_serves_the_sdk_and_a_cube_style_user_rule_together() -> None:
    # The double refuses only an explicit wrong user (the seed's CubeSandbox case), so the
    # SDK, which sends no Authorization to envd >= 0.4.0, still runs commands.
    with E2bServer(user="root") as cube:
        sandbox = Sandbox.create(api_key=DOUBLE_KEY, api_url=cube.url, sandbox_url=cube.url)
        assert sandbox.commands.run("whoami", timeout=10).exit_code == 0
        assert sandbox.kill() is True
        (start,) = [request for request in cube.requests if request.path == START]
        assert "authorization" not in start.headers
