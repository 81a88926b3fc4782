"""``Sandbox.exec`` on the main thread makes the backend call itself when the backend
cancels promptly, and still answers Ctrl-C: the remote command is killed (E2B) or its
claim retired (Kubernetes), then ``KeyboardInterrupt`` is raised.

Each test installs Python's own SIGINT handler first, so it does not depend on how
the test process was started (a runner may start it with SIGINT ignored).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from piship_remote.backends.e2b.backend import E2bCompatibleBackend
from piship_remote.backends.kubernetes.backend import KubernetesAgentSandboxBackend
from piship_remote.model.errors import CommandTimeout
from piship_remote.sandbox._interrupts import InterruptGuard
from piship_remote.sandbox.activation import Sandbox, activate_sandbox
from piship_remote.testing import CLAIMS, Cluster, E2bServer, KubernetesServer

E2B_POLICY = {"required": True, "network": {"mode": "deny"}}
K8S_POLICY = {"required": True, "network": {"mode": "allow"}}
Answer = Callable[[Any], dict[str, Any]]

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def python_sigint() -> Iterator[None]:
    """Python's default SIGINT handler and no wakeup fd, as in a plain script."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    wakeup = signal.set_wakeup_fd(-1)
    try:
        yield
    finally:
        signal.set_wakeup_fd(wakeup)
        signal.signal(signal.SIGINT, before)


def hanging_on(arrived: threading.Event) -> Answer:
    """Commands answer at once, but ``sleep 600`` hangs once it has set ``arrived``."""

    def answer(command: Any) -> dict[str, Any]:
        text = command["process"]["args"][2] if isinstance(command, dict) else command
        if "sleep 600" not in text:
            return {"stdout": "ok\n", "exit_code": 0}
        arrived.set()
        return {"hang": True}

    return answer


@pytest.fixture
def e2b(
    e2b_server: Callable[..., E2bServer], workspace: Path
) -> Callable[[Answer], tuple[E2bServer, Sandbox]]:
    def start(answer: Answer) -> tuple[E2bServer, Sandbox]:
        mock = e2b_server(command=answer)
        backend = E2bCompatibleBackend(endpoint=mock.url, envd_url=mock.url)
        return mock, activate_sandbox(E2B_POLICY, backend=backend, workspace=workspace)

    return start


def interrupt_when(arrived: threading.Event, send: Callable[[], None]) -> threading.Thread:
    """A thread that calls ``send`` once the double holds the hanging command."""

    def run() -> None:
        if arrived.wait(10):
            send()

    thread = threading.Thread(target=run, name="test-interrupter", daemon=True)
    thread.start()
    return thread


def interrupted(
    sandbox: Sandbox, arrived: threading.Event, send: Callable[[], None] | None = None
) -> threading.Thread:
    """Run a hanging command that ``send`` (default: SIGINT raised on this thread)
    interrupts once the double holds it; ``KeyboardInterrupt`` must end it."""
    interrupter = interrupt_when(arrived, send or (lambda: signal.raise_signal(signal.SIGINT)))
    with pytest.raises(KeyboardInterrupt):
        sandbox.exec("sleep 600")
    return interrupter


def exec_threads() -> list[str]:
    return [
        t.name
        for t in threading.enumerate()
        if t.name.startswith("piship-exec-") and t.name[12:].isdigit()
    ]


def test_the_main_thread_runs_the_call_itself(e2b: Any) -> None:
    _, sandbox = e2b(hanging_on(threading.Event()))
    callers: list[threading.Thread] = []
    with sandbox:
        result = sandbox.exec(
            "echo ok", on_data=lambda chunk: callers.append(threading.current_thread())
        )
    assert result.exit_code == 0
    assert callers == [threading.main_thread()]
    assert exec_threads() == []


def test_a_sigint_on_another_thread_kills_the_command_and_raises(e2b: Any) -> None:
    arrived = threading.Event()
    mock, sandbox = e2b(hanging_on(arrived))
    with sandbox:
        interrupter = interrupted(sandbox, arrived)
        interrupter.join()
        kill = mock.wait_for("POST", "/process.Process/SendSignal", timeout=5)
        assert kill.json()["signal"] == "SIGNAL_SIGKILL"


def test_the_sandbox_stays_usable_after_ctrl_c(e2b: Any) -> None:
    arrived = threading.Event()
    _, sandbox = e2b(hanging_on(arrived))
    with sandbox:
        interrupted(sandbox, arrived)
        assert sandbox.exec("echo ok").exit_code == 0


def test_a_sigint_sent_to_the_process_interrupts_the_call(e2b: Any) -> None:
    arrived = threading.Event()
    mock, sandbox = e2b(hanging_on(arrived))
    with sandbox:
        interrupted(sandbox, arrived, lambda: os.kill(os.getpid(), signal.SIGINT))
        assert mock.wait_for("POST", "/process.Process/SendSignal", timeout=5)


def test_ctrl_c_retires_the_kubernetes_claim(
    kubernetes_server: Callable[..., KubernetesServer], workspace: Path
) -> None:
    arrived = threading.Event()
    mock = kubernetes_server(hanging_on(arrived), Cluster())
    backend = KubernetesAgentSandboxBackend(
        endpoint=mock.url,
        router=mock.url,
        template="python-pool",
        namespace="agents",
        poll_interval=0.01,
    )
    with activate_sandbox(K8S_POLICY, backend=backend, workspace=workspace) as sandbox:
        interrupted(sandbox, arrived)
        (first,) = [r.json()["metadata"]["name"] for r in mock.find("POST", CLAIMS)]
        assert mock.wait_for("DELETE", f"{CLAIMS}/{first}", timeout=5)
        assert sandbox.exec("echo ok").exit_code == 0
    assert len(mock.find("POST", CLAIMS)) == 2
    assert mock.live_claims == []


def test_python_sigint_handling_is_back_after_a_command(e2b: Any) -> None:
    _, sandbox = e2b(hanging_on(threading.Event()))
    with sandbox:
        sandbox.exec("echo ok")
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.set_wakeup_fd(-1) == -1


def test_python_sigint_handling_is_back_after_an_interrupted_command(e2b: Any) -> None:
    arrived = threading.Event()
    _, sandbox = e2b(hanging_on(arrived))
    with sandbox:
        interrupted(sandbox, arrived)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.set_wakeup_fd(-1) == -1


def test_a_program_with_its_own_sigint_handler_keeps_it(e2b: Any) -> None:
    def own(signum: int, frame: object) -> None:
        return None

    signal.signal(signal.SIGINT, own)
    _, sandbox = e2b(hanging_on(threading.Event()))
    with sandbox:
        callers: list[str] = []
        sandbox.exec("echo ok", on_data=lambda chunk: callers.append("on_data"))
        assert exec_threads() != []  # the call went to a worker
        assert signal.getsignal(signal.SIGINT) is own
    assert callers == ["on_data"]


def test_a_program_with_its_own_wakeup_fd_keeps_it(e2b: Any) -> None:
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd)
    try:
        _, sandbox = e2b(hanging_on(threading.Event()))
        with sandbox:
            sandbox.exec("echo ok")
            assert exec_threads() != []
            assert signal.set_wakeup_fd(write_fd) == write_fd
    finally:
        signal.set_wakeup_fd(-1)
        os.close(read_fd)
        os.close(write_fd)


def test_with_sigint_ignored_the_call_runs_in_place(e2b: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _, sandbox = e2b(hanging_on(threading.Event()))
    with sandbox:
        sandbox.exec("echo ok")
        assert exec_threads() == []
        assert [t for t in threading.enumerate() if t.name == "piship-interrupt"] == []
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_a_timeout_ends_a_call_made_in_place(e2b: Any) -> None:
    arrived = threading.Event()
    mock, sandbox = e2b(hanging_on(arrived))
    with sandbox:
        with pytest.raises(CommandTimeout):
            sandbox.exec("sleep 600", timeout=0.2)
        assert arrived.is_set()
        assert mock.wait_for("POST", "/process.Process/SendSignal", timeout=5)


def test_a_failing_on_data_kills_the_command_and_raises_its_error(e2b: Any) -> None:
    def answer(command: Any) -> dict[str, Any]:
        return {"stdout": "first\n", "hang": True}

    def refuse(chunk: str) -> None:
        raise ValueError("the sink is full")

    mock, sandbox = e2b(answer)
    with sandbox:
        with pytest.raises(ValueError, match="the sink is full"):
            sandbox.exec("cat", on_data=refuse)
        assert mock.wait_for("POST", "/process.Process/SendSignal", timeout=5)


def test_the_interrupt_thread_is_gone_after_close(e2b: Any) -> None:
    _, sandbox = e2b(hanging_on(threading.Event()))
    with sandbox:
        sandbox.exec("echo ok")
        assert [t.daemon for t in threading.enumerate() if t.name == "piship-interrupt"] == [True]
    assert [t for t in threading.enumerate() if t.name == "piship-interrupt"] == []


def test_a_guard_closed_during_its_call_keeps_the_wakeup_fd_open_until_disarmed() -> None:
    guard = InterruptGuard()
    disarm = guard.arm(lambda: None)
    assert disarm is not None
    guard.close()
    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)
    os.fstat(wakeup)  # still open: a signal now would be written to it
    assert disarm() is False
    assert signal.set_wakeup_fd(-1) == -1
