"""The library's errors read well where a notebook user meets them: one message with its
code and fix, no internal chained frames (the cause kept as ``e.cause``), and an interrupt
that says the remote command was killed."""

from __future__ import annotations

import signal
import socket
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from piship_remote import E2bCompatibleBackend, PiShipError, activate_sandbox
from piship_remote.testing import E2bServer
from tests.support.interrupts import interrupt_main_inside
from tests.support.pool import POLICY

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def refused_url() -> str:
    """A loopback address nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def refused(refused_url: str, workspace: Path) -> PiShipError:
    backend = E2bCompatibleBackend(endpoint=refused_url, credential=lambda: "key")
    with pytest.raises(PiShipError) as raised:
        activate_sandbox(POLICY, backend=backend, workspace=workspace, env={})
    return raised.value


def test_a_refused_connection_chains_no_internal_error(refused: PiShipError) -> None:
    shown = "".join(traceback.format_exception(refused))
    assert "During handling" not in shown and "direct cause" not in shown
    assert "_Failure" not in shown
    assert refused.__suppress_context__ and refused.__cause__ is None


def test_a_refused_connection_keeps_its_cause_for_debugging(refused: PiShipError) -> None:
    assert refused.cause is not None
    assert "ECONNREFUSED" in str(refused.cause) or "refused" in str(refused.cause).lower()


def test_ipython_shows_the_code_the_message_and_the_fix_without_library_frames(
    refused: PiShipError,
) -> None:
    lines = refused._render_traceback_()
    assert lines[0] == "Traceback (most recent call last):"
    assert not any("piship_remote" in line for line in lines[1:-2])
    assert any(line.startswith("PiShipError: GATEWAY_UNREACHABLE: ") for line in lines)
    assert lines[-1].startswith("Action: ")
    assert any("test_error_display.py" in line for line in lines)  # the caller's own frame


@pytest.fixture
def python_sigint() -> Iterator[None]:
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.usefixtures("python_sigint")
def test_an_interrupted_command_says_the_remote_command_was_killed(
    e2b_server: Callable[..., E2bServer], workspace: Path
) -> None:
    arrived = threading.Event()

    def hang(start: Any) -> dict[str, Any]:
        arrived.set()
        return {"hang": True}

    server = e2b_server(command=hang)
    interrupter = threading.Thread(
        target=lambda: arrived.wait(10) and signal.raise_signal(signal.SIGINT), daemon=True
    )
    with E2bCompatibleBackend(endpoint=server.url, envd_url=server.url) as backend:
        with activate_sandbox(POLICY, backend=backend, workspace=workspace, env={}) as sandbox:
            interrupter.start()
            with pytest.raises(KeyboardInterrupt) as raised:
                sandbox.exec("sleep 600")
    assert str(raised.value) == "interrupted: the remote command was killed"
    assert raised.value.__suppress_context__
    assert server.wait_for("POST", "/process.Process/SendSignal", timeout=5)


@pytest.mark.usefixtures("python_sigint")
def test_an_interrupted_activation_says_so_without_internal_frames(
    e2b_server: Callable[..., E2bServer], workspace: Path
) -> None:
    server = e2b_server()
    server.faults.stall("/sandboxes")
    interrupter = threading.Thread(
        target=lambda: (
            server.wait_for("POST", "/sandboxes", timeout=10)
            and signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
        ),
        daemon=True,
    )
    try:
        with E2bCompatibleBackend(endpoint=server.url, envd_url=server.url) as backend:
            interrupter.start()
            with pytest.raises(KeyboardInterrupt) as raised:
                activate_sandbox(POLICY, backend=backend, workspace=workspace, env={})
    finally:
        server.faults.release()
    assert "interrupted" in str(raised.value)
    shown = "".join(traceback.format_exception(raised.value))
    assert "threading.py" not in shown and "During handling" not in shown


@pytest.mark.usefixtures("python_sigint")
def test_an_interrupted_wait_on_a_handle_says_the_remote_command_was_killed(
    e2b_server: Callable[..., E2bServer], workspace: Path
) -> None:
    arrived = threading.Event()

    def hang(start: Any) -> dict[str, Any]:
        arrived.set()
        return {"hang": True}

    server = e2b_server(command=hang)
    # The start has arrived before start() returns: the SIGINT waits for wait() itself.
    interrupter = threading.Thread(
        target=lambda: arrived.wait(10) and interrupt_main_inside("wait"), daemon=True
    )
    with E2bCompatibleBackend(endpoint=server.url, envd_url=server.url) as backend:
        with activate_sandbox(POLICY, backend=backend, workspace=workspace, env={}) as sandbox:
            handle = sandbox.start("sleep 600")
            interrupter.start()
            with pytest.raises(KeyboardInterrupt) as raised:
                handle.wait()
    assert str(raised.value) == "interrupted: the remote command was killed"
    assert server.wait_for("POST", "/process.Process/SendSignal", timeout=5)
