"""The activation layer and the governed exec, against an in-test fake backend."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from piship_remote.backends.base import Availability, BackendResult, ExecRequest
from piship_remote.model.errors import CommandCancelled, CommandTimeout, PiShipError
from piship_remote.model.policy import SandboxProfile
from piship_remote.model.redact import Redactor
from piship_remote.model.report import Capabilities, describe_containment
from piship_remote.sandbox.activation import Sandbox, activate_sandbox
from piship_remote.transport.deadline import Deadline

ENV = {
    "PATH": "/opt/host/bin",
    "HOME": "/home/alice",
    "LANG": "C.UTF-8",
    "DOCS_MODE": "demo",
    "UNLISTED_VARIABLE": "unlisted-host-value",
    "ACME_API_TOKEN": "sk-live-never-in-remote-backends",
    "AWS_SECRET_ACCESS_KEY": "aws-never-in-remote-backends",
    "GITHUB_TOKEN": "ghp_never_in_remote_backends_0000000000",
}
POLICY = {
    "required": True,
    "filesystem": {"read": {"deny": ["~/.ssh"]}, "write": {"allow": ["workspace"]}},
    "network": {"mode": "deny"},
    "environment": {"allow": ["PATH", "HOME", "LANG", "DOCS_MODE", "ACME_API_TOKEN"]},
}
AVAILABLE = Availability(True)
Behaviour = Callable[[ExecRequest, Callable[[bytes], None], threading.Event], BackendResult]


def answers_check(request: ExecRequest, out: Callable[[bytes], None]) -> BackendResult | None:
    if "piship-sandbox-ready" not in request.command:
        return None
    out(f"piship-sandbox-ready {request.env.get('PISHIP_PROBE_UNLISTED', 'unset')}\n".encode())
    return BackendResult(0)


class FakeInstance:
    cancels_promptly = False
    controls_commands = False

    def __init__(self, backend: FakeBackend) -> None:
        self.backend = backend
        self.disposed = 0

    def exec(
        self,
        request: ExecRequest,
        *,
        on_stdout: Callable[[bytes], None] | None = None,
        on_stderr: Callable[[bytes], None] | None = None,
        cancel: threading.Event | None = None,
        deadline: Deadline | None = None,
    ) -> BackendResult:
        assert on_stdout is not None and cancel is not None
        self.backend.log.append("exec")
        self.backend.requests.append(request)
        checked = answers_check(request, on_stdout) if self.backend.answers_check else None
        if checked is not None:
            return checked
        return self.backend.behaviour(request, on_stdout, cancel)

    def epoch(self) -> str | None:
        return None

    def dispose(self) -> None:
        self.disposed += 1
        self.backend.log.append("dispose")


class FakeBackend:
    id = "fake-remote"
    provider = "custom"

    def __init__(
        self,
        behaviour: Behaviour | None = None,
        *,
        available: Availability | Exception = AVAILABLE,
        planes: tuple[str, ...] = (
            "host-filesystem-isolation",
            "network-deny",
            "environment-filter",
        ),
        prepare_error: Exception | None = None,
        answers_check: bool = True,
    ) -> None:
        self.redactor = Redactor()
        self.answers_check = answers_check
        self.behaviour: Behaviour = behaviour or (lambda request, out, cancel: BackendResult(0))
        self._available = available
        self._planes = planes
        self._prepare_error = prepare_error
        self.log: list[str] = []
        self.requests: list[ExecRequest] = []
        self.instance: FakeInstance | None = None

    def available(self) -> Availability:
        self.log.append("available")
        if isinstance(self._available, Exception):
            raise self._available
        return self._available

    def capabilities(self) -> Capabilities:
        self.log.append("capabilities")
        return Capabilities(
            isolation="remote",
            planes=self._planes,
            network=("deny", "allow"),
            local_processes=False,
        )

    def prepare(self, profile: SandboxProfile) -> FakeInstance:
        self.log.append("prepare")
        if self._prepare_error is not None:
            raise self._prepare_error
        self.instance = FakeInstance(self)
        return self.instance


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = Path(os.path.realpath(tmp_path))
    (root / "ws" / "sub").mkdir(parents=True)
    return root / "ws"


def activate(backend: FakeBackend, ws: Path, **options: Any) -> Sandbox:
    options.setdefault("settle_timeout", 2.0)
    policy = options.pop("policy", POLICY)
    return activate_sandbox(
        policy, backend=backend, workspace=ws, home_dir=ws.parent / "home", env=ENV, **options
    )


def hangs_until_cancelled(
    request: ExecRequest, out: Callable[[bytes], None], cancel: threading.Event
) -> BackendResult:
    if request.command == "true":
        return BackendResult(0)
    out(b"started\n")
    cancel.wait(10)
    out(b"after abort\n")
    return BackendResult(0)


def library_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("piship-")]


# -- activation ------------------------------------------------------------------


def test_activation_runs_its_steps_in_order(ws: Path) -> None:
    backend = FakeBackend()
    with activate(backend, ws) as sandbox:
        sandbox.exec("true")
    assert backend.log == ["available", "capabilities", "prepare", "exec", "exec", "dispose"]


def test_activation_reports_what_the_backend_enforces(ws: Path) -> None:
    with activate(FakeBackend(), ws) as sandbox:
        report = sandbox.report.to_dict()
    assert report["level"] == "enforced"
    assert report["planes"] == ["network-deny", "environment-filter", "host-filesystem-isolation"]
    assert report["networkDenial"] == {
        "evidence": "attested",
        "probe": False,
        "reason": "the backend declares no network probe to check it with",
    }
    assert report["verification"] == "backend-attested"
    assert report["isolation"] == "remote"


def test_an_unavailable_backend_fails_a_required_activation(ws: Path) -> None:
    backend = FakeBackend(
        available=Availability(False, "the endpoint health check returned HTTP 503")
    )
    with pytest.raises(PiShipError) as caught:
        activate(backend, ws)
    assert caught.value.code == "SANDBOX_UNAVAILABLE"
    assert str(caught.value) == (
        "The distribution requires a sandbox, but it cannot be enforced: "
        "the endpoint health check returned HTTP 503"
    )
    assert caught.value.user_action == (
        "Fix the sandbox backend reported above;"
        " piship_remote never runs a command outside a sandbox"
    )
    assert "prepare" not in backend.log


def test_an_availability_error_is_redacted(ws: Path) -> None:
    backend = FakeBackend(available=RuntimeError("denied for Bearer abcdefgh12345678"))
    with pytest.raises(PiShipError) as caught:
        activate(backend, ws)
    assert "abcdefgh12345678" not in str(caught.value)


def test_a_missing_plane_fails_before_anything_is_prepared(ws: Path) -> None:
    backend = FakeBackend(planes=("host-filesystem-isolation", "environment-filter"))
    with pytest.raises(PiShipError, match="does not provide network-deny"):
        activate(backend, ws)
    assert "prepare" not in backend.log


def test_a_prepare_failure_is_reported(ws: Path) -> None:
    backend = FakeBackend(prepare_error=RuntimeError("quota exceeded"))
    with pytest.raises(PiShipError, match="could not prepare a sandbox: quota exceeded"):
        activate(backend, ws)


def test_a_failing_check_disposes_the_instance(ws: Path) -> None:
    def broken(
        request: ExecRequest, out: Callable[[bytes], None], cancel: threading.Event
    ) -> BackendResult:
        return BackendResult(7)

    backend = FakeBackend(broken, answers_check=False)
    with pytest.raises(PiShipError, match=r"did not report back \(exit 7\)"):
        activate(backend, ws)
    assert backend.instance is not None and backend.instance.disposed == 1


def test_a_leaked_probe_variable_fails_the_check(ws: Path) -> None:
    backend = FakeBackend()
    policy = {**POLICY, "environment": {"allow": ["LANG", "PISHIP_PROBE_UNLISTED"]}}
    with pytest.raises(PiShipError, match="an unapproved environment variable reached"):
        activate(backend, ws, policy=policy)


def test_an_optional_sandbox_that_cannot_be_enforced_runs_nothing(ws: Path) -> None:
    backend = FakeBackend(available=Availability(False, "down"))
    sandbox = activate(backend, ws, policy={**POLICY, "required": False})
    assert sandbox.report.level == "unavailable"
    assert sandbox.report.planes == ()
    assert describe_containment(sandbox.report).startswith(
        "unavailable on fake-remote (optional): down"
    )
    with pytest.raises(PiShipError) as caught:
        sandbox.exec("echo hi")
    assert caught.value.code == "SANDBOX_UNAVAILABLE"
    assert backend.log == ["available"]


def test_an_optional_sandbox_refuses_commands_with_the_real_reason(ws: Path) -> None:
    backend = FakeBackend(available=ConnectionRefusedError("refused for Bearer abcdefgh12345678"))
    sandbox = activate(backend, ws, policy={**POLICY, "required": False})
    assert sandbox.report.reason == "refused for [REDACTED]"
    with pytest.raises(PiShipError) as caught:
        sandbox.run("echo hi")
    assert str(caught.value) == (
        "No fake-remote sandbox is active (unavailable): refused for [REDACTED]; "
        "piship_remote never runs commands unsandboxed"
    )
    assert backend.log == ["available"]


def test_an_optional_sandbox_that_failed_its_check_gives_that_reason(ws: Path) -> None:
    backend = FakeBackend(lambda request, out, cancel: BackendResult(7), answers_check=False)
    sandbox = activate(backend, ws, policy={**POLICY, "required": False})
    with pytest.raises(PiShipError, match=r"failed its check: .*did not report back \(exit 7\)"):
        sandbox.exec("echo hi")
    assert backend.instance is not None and backend.instance.disposed == 1


def test_a_bad_path_rule_is_a_config_error(ws: Path) -> None:
    policy = {**POLICY, "filesystem": {"read": {"deny": ["relative/path"]}}}
    with pytest.raises(PiShipError) as caught:
        activate(FakeBackend(), ws, policy=policy)
    assert caught.value.code == "CONFIG_INVALID"


# -- the governed exec -------------------------------------------------------------


def test_exec_sends_only_approved_non_host_variables(ws: Path) -> None:
    backend = FakeBackend()
    with activate(backend, ws) as sandbox:
        sandbox.exec("env")
        sandbox.exec("env", env={**ENV, "DOCS_MODE": "strict", "EXTRA": "x"})
    assert [dict(r.env) for r in backend.requests[1:]] == [
        {"LANG": "C.UTF-8", "DOCS_MODE": "demo"},
        {"LANG": "C.UTF-8", "DOCS_MODE": "strict"},
    ]
    assert list(backend.requests[1].env) == ["LANG", "DOCS_MODE"]


def test_exec_maps_cwd_relative_to_the_workspace(ws: Path) -> None:
    backend = FakeBackend()
    with activate(backend, ws) as sandbox:
        sandbox.exec("pwd", ws / "sub")
        sandbox.exec("pwd", ws / "not" / "there")
        sandbox.exec("pwd")
    assert [r.workspace_path for r in backend.requests[1:]] == ["sub", "not/there", "."]


def test_exec_refuses_a_cwd_outside_the_workspace_before_any_request(ws: Path) -> None:
    backend = FakeBackend()
    with activate(backend, ws) as sandbox:
        with pytest.raises(PiShipError, match="Working directory is outside the workspace"):
            sandbox.exec("pwd", ws.parent)
    assert len(backend.requests) == 1


def test_on_data_is_called_on_the_calling_thread(ws: Path) -> None:
    def chatty(
        request: ExecRequest, out: Callable[[bytes], None], cancel: threading.Event
    ) -> BackendResult:
        out(b"one ")
        out(b"two")
        return BackendResult(0)

    seen: list[tuple[bytes, str]] = []
    with activate(FakeBackend(chatty), ws) as sandbox:
        sandbox.exec("x", on_data=lambda c: seen.append((c, threading.current_thread().name)))
    me = threading.current_thread().name
    assert seen == [(b"one ", me), (b"two", me)]


@pytest.mark.parametrize(
    ("result", "code"),
    [
        (BackendResult(3), 3),
        (BackendResult(None), 1),
        (BackendResult(None, "SIGTERM"), 143),
        (BackendResult(None, "SIGKILL"), 137),
    ],
)
def test_exit_codes_are_normalised(ws: Path, result: BackendResult, code: int) -> None:
    with activate(FakeBackend(lambda r, o, c: result), ws) as sandbox:
        assert sandbox.exec("x").exit_code == code


@pytest.mark.timeout(10)
def test_a_timeout_kills_and_reports_timeout(ws: Path) -> None:
    seen: list[bytes] = []
    backend = FakeBackend(hangs_until_cancelled)
    with activate(backend, ws) as sandbox:
        with pytest.raises(CommandTimeout) as caught:
            sandbox.exec("sleep", timeout=0.3, on_data=seen.append)
        assert str(caught.value) == "timeout:0.3"
        assert seen == [b"started\n"]
        assert sandbox.exec("true").exit_code == 0


@pytest.mark.parametrize(
    ("timeout", "text"), [(5, "timeout:5"), (5.0, "timeout:5"), (0.25, "timeout:0.25")]
)
def test_timeout_text_prints_numbers_like_javascript(timeout: float, text: str) -> None:
    assert str(CommandTimeout(timeout)) == text


@pytest.mark.timeout(10)
def test_a_cancel_event_kills_and_reports_aborted(ws: Path) -> None:
    cancel = threading.Event()
    threading.Timer(0.1, cancel.set).start()
    with activate(FakeBackend(hangs_until_cancelled), ws) as sandbox:
        with pytest.raises(CommandCancelled, match=r"^aborted$"):
            sandbox.exec("sleep", cancel=cancel)


def test_a_pre_set_cancel_event_raises_before_any_request(ws: Path) -> None:
    cancel = threading.Event()
    cancel.set()
    backend = FakeBackend()
    with activate(backend, ws) as sandbox, pytest.raises(CommandCancelled):
        sandbox.exec("true", cancel=cancel)
    assert len(backend.requests) == 1


def test_a_negative_timeout_is_refused(ws: Path) -> None:
    with activate(FakeBackend(), ws) as sandbox, pytest.raises(PiShipError) as caught:
        sandbox.exec("true", timeout=-1)
    assert caught.value.code == "CONFIG_INVALID"


@pytest.mark.timeout(10)
def test_a_backend_that_ignores_the_abort_is_retired_once(ws: Path) -> None:
    release = threading.Event()

    def stubborn(
        request: ExecRequest, out: Callable[[bytes], None], cancel: threading.Event
    ) -> BackendResult:
        release.wait(10)
        return BackendResult(0)

    backend = FakeBackend(stubborn)
    sandbox = activate(backend, ws, settle_timeout=0.05)
    try:
        with pytest.raises(CommandTimeout):
            sandbox.exec("sleep", timeout=0.05)
        with pytest.raises(PiShipError, match="retired"):
            sandbox.exec("true")
        sandbox.dispose()
    finally:
        release.set()
    for thread in threading.enumerate():
        if thread.name == "piship-retire":
            thread.join(5)
    assert backend.instance is not None and backend.instance.disposed == 1


def test_a_backend_error_is_redacted_and_typed(ws: Path) -> None:
    def leaky(
        request: ExecRequest, out: Callable[[bytes], None], cancel: threading.Event
    ) -> BackendResult:
        raise RuntimeError("boom with Bearer abcdefgh12345678")

    with activate(FakeBackend(leaky), ws) as sandbox, pytest.raises(PiShipError) as caught:
        sandbox.exec("x")
    assert caught.value.code == "SANDBOX_UNAVAILABLE"
    assert "abcdefgh12345678" not in str(caught.value)
    assert "boom" in str(caught.value)


def test_a_backend_pishiperror_keeps_its_code(ws: Path) -> None:
    def unknown(
        request: ExecRequest, out: Callable[[bytes], None], cancel: threading.Event
    ) -> BackendResult:
        raise PiShipError("SANDBOX_UNAVAILABLE", "the outcome is unknown", retryable=False)

    with activate(FakeBackend(unknown), ws) as sandbox:
        with pytest.raises(PiShipError, match="outcome is unknown") as caught:
            sandbox.exec("x")
    assert caught.value.retryable is False


@pytest.mark.timeout(20)
def test_concurrent_exec_from_sixteen_threads(ws: Path) -> None:
    def echo(
        request: ExecRequest, out: Callable[[bytes], None], cancel: threading.Event
    ) -> BackendResult:
        out(request.command.encode())
        return BackendResult(int(request.command) % 7)

    errors: list[BaseException] = []
    with activate(FakeBackend(echo), ws) as sandbox:

        def worker(n: int) -> None:
            for i in range(20):
                command = str(n * 100 + i)
                seen: list[bytes] = []
                try:
                    result = sandbox.exec(command, on_data=seen.append)
                    assert result.exit_code == int(command) % 7
                    assert seen == [command.encode()]
                except BaseException as e:
                    errors.append(e)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []


@pytest.mark.timeout(10)
@pytest.mark.usefixtures("ctrl_c")
def test_ctrl_c_kills_the_command_then_reraises(ws: Path) -> None:
    cancelled = threading.Event()

    def hang(
        request: ExecRequest, out: Callable[[bytes], None], cancel: threading.Event
    ) -> BackendResult:
        if request.command == "true":
            return BackendResult(0)
        cancel.wait(10)
        cancelled.set()
        return BackendResult(0)

    with activate(FakeBackend(hang), ws) as sandbox:
        threading.Timer(0.1, signal.raise_signal, args=(signal.SIGINT,)).start()
        with pytest.raises(KeyboardInterrupt):
            sandbox.exec("sleep 600")
        assert cancelled.is_set()
        assert sandbox.exec("true").exit_code == 0


def test_dispose_is_idempotent_and_thread_safe(ws: Path) -> None:
    backend = FakeBackend()
    sandbox = activate(backend, ws)
    threads = [threading.Thread(target=sandbox.dispose) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sandbox.dispose()
    assert backend.instance is not None and backend.instance.disposed == 1
    with pytest.raises(PiShipError) as caught:
        sandbox.exec("true")
    assert caught.value.code == "SANDBOX_UNAVAILABLE"


@pytest.mark.timeout(10)
def test_dispose_ends_a_running_command_with_disposed(ws: Path) -> None:
    started = threading.Event()

    def hang(
        request: ExecRequest, out: Callable[[bytes], None], cancel: threading.Event
    ) -> BackendResult:
        started.set()
        cancel.wait(10)
        return BackendResult(0)

    sandbox = activate(FakeBackend(hang), ws)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            sandbox.exec("sleep 600")
        except BaseException as e:
            errors.append(e)

    runner = threading.Thread(target=run)
    runner.start()
    assert started.wait(5)
    sandbox.dispose()
    runner.join(5)
    assert len(errors) == 1 and "disposed" in str(errors[0])


@pytest.mark.timeout(10)
def test_no_library_thread_outlives_dispose(ws: Path) -> None:
    cancel = threading.Event()
    with activate(FakeBackend(hangs_until_cancelled), ws) as sandbox:
        sandbox.exec("true")
        threading.Timer(0.05, cancel.set).start()
        with pytest.raises(CommandCancelled):
            sandbox.exec("sleep", cancel=cancel)
    for thread in threading.enumerate():
        if thread.name.startswith("piship-exec"):
            thread.join(2)
    assert library_threads() == []
