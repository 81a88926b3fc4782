"""How ``Sandbox.exec`` runs backend calls: workers, backpressure, aborts, threads.

The main thread hands each backend call to a reusable ``piship-exec-N`` worker
and forwards its output through a bounded channel; every other thread makes the
backend call itself. These tests drive both paths with a scripted backend.
"""

from __future__ import annotations

import gc
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from piship_remote.backends.base import Availability, BackendResult, ExecRequest
from piship_remote.model.errors import CommandCancelled, CommandTimeout, PiShipError
from piship_remote.model.policy import SandboxProfile
from piship_remote.model.redact import Redactor
from piship_remote.model.report import Capabilities
from piship_remote.sandbox._exec_workers import Aborted, Channel, Output, Raised, Returned
from piship_remote.sandbox.activation import CHANNEL_BYTES, Sandbox, activate_sandbox
from piship_remote.transport.deadline import Deadline

POLICY = {"required": True, "network": {"mode": "deny"}, "environment": {"allow": ["LANG"]}}
CHUNK = 64 * 1024
Emit = Callable[[str, bytes], None]
Script = Callable[[Emit, threading.Event], BackendResult]
Caller = Callable[[Callable[[], Any]], Any]


def succeed(emit: Emit, cancel: threading.Event) -> BackendResult:
    return BackendResult(0)


class ScriptedInstance:
    cancels_promptly = False
    controls_commands = False

    """Runs ``backend.script`` for every command but ``true`` and the readiness check."""

    def __init__(self, backend: ScriptedBackend) -> None:
        self.backend = backend
        self.disposed = threading.Event()

    def exec(
        self,
        request: ExecRequest,
        *,
        on_stdout: Callable[[bytes], None] | None = None,
        on_stderr: Callable[[bytes], None] | None = None,
        cancel: threading.Event | None = None,
        deadline: Deadline | None = None,
    ) -> BackendResult:
        assert on_stdout is not None and on_stderr is not None and cancel is not None
        if "piship-sandbox-ready" in request.command:
            probe = request.env.get("PISHIP_PROBE_UNLISTED", "unset")
            on_stdout(f"piship-sandbox-ready {probe}\n".encode())
            return BackendResult(0)
        self.backend.threads.append(threading.current_thread().name)
        self.backend.tokens.append(cancel)
        if request.command == "true":
            return BackendResult(0)
        streams = {"stdout": on_stdout, "stderr": on_stderr}
        return self.backend.script(lambda stream, chunk: streams[stream](chunk), cancel)

    def epoch(self) -> str | None:
        return None

    def dispose(self) -> None:
        self.disposed.set()


class ScriptedBackend:
    id = "scripted"
    provider = "custom"

    def __init__(self, script: Script = succeed) -> None:
        self.redactor = Redactor()
        self.script = script
        self.threads: list[str] = []  # the thread each command's backend call ran on
        self.tokens: list[threading.Event] = []  # each command's cancel token
        self.instance: ScriptedInstance | None = None

    def available(self) -> Availability:
        return Availability(True)

    def capabilities(self) -> Capabilities:
        return Capabilities(
            isolation="remote",
            planes=("host-filesystem-isolation", "network-deny", "environment-filter"),
            network=("deny",),
            local_processes=False,
        )

    def prepare(self, profile: SandboxProfile) -> ScriptedInstance:
        self.instance = ScriptedInstance(self)
        return self.instance


@pytest.fixture
def sandbox_for(workspace: Path) -> Iterator[Callable[..., Sandbox]]:
    sandboxes: list[Sandbox] = []

    def make(backend: ScriptedBackend, settle_timeout: float = 5.0) -> Sandbox:
        sandbox = activate_sandbox(
            POLICY, backend=backend, workspace=workspace, env={}, settle_timeout=settle_timeout
        )
        sandboxes.append(sandbox)
        return sandbox

    yield make
    for sandbox in sandboxes:
        sandbox.dispose()


def on_main_thread(action: Callable[[], Any]) -> Any:
    return action()


def on_other_thread(action: Callable[[], Any]) -> Any:
    """Run ``action`` on a new thread; its result, or raise what it raised."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(("ok", action()))
        except BaseException as error:
            outcome.append(("error", error))

    thread = threading.Thread(target=run, name="test-caller")
    thread.start()
    thread.join(10)
    assert outcome, "the call did not return"
    kind, value = outcome[0]
    if kind == "error":
        raise value
    return value


CALLERS = pytest.mark.parametrize(
    "call_from", [on_main_thread, on_other_thread], ids=["main-thread", "other-thread"]
)


def library_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("piship-")]


class Stream:
    """A backend script streaming ``total`` bytes, and how far ahead of its reader it got."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.emitted = 0
        self.consumed = 0
        self.most_ahead = 0
        self.filled = threading.Event()  # set once a full channel's worth was emitted
        self.ran_ahead = threading.Event()  # set only if nothing holds the script back

    def script(self, emit: Emit, cancel: threading.Event) -> BackendResult:
        while self.emitted < self.total and not cancel.is_set():
            emit("stdout", b"x" * CHUNK)
            self.emitted += CHUNK
            if self.emitted >= CHANNEL_BYTES:
                self.filled.set()
            if self.emitted - self.consumed > 2 * CHANNEL_BYTES:
                self.ran_ahead.set()
        return BackendResult(0)

    def read(self, chunk: bytes) -> None:
        if self.consumed == 0:
            # The first chunk takes the reader a while: long enough for an unbounded
            # buffer to let the script run far ahead.
            self.ran_ahead.wait(0.3)
        self.most_ahead = max(self.most_ahead, self.emitted - self.consumed)
        self.consumed += len(chunk)


# -- backpressure ------------------------------------------------------------------


@CALLERS
@pytest.mark.timeout(20)
def test_a_slow_on_data_holds_the_backend_call_back(
    sandbox_for: Callable[..., Sandbox], call_from: Caller
) -> None:
    stream = Stream(total=4 * CHANNEL_BYTES)
    sandbox = sandbox_for(ScriptedBackend(stream.script))
    result = call_from(lambda: sandbox.exec("stream", on_data=stream.read))
    assert result.exit_code == 0
    assert stream.consumed == stream.total
    assert not stream.ran_ahead.is_set()
    assert stream.most_ahead <= CHANNEL_BYTES + 2 * CHUNK


@pytest.mark.timeout(10)
def test_an_abort_wakes_a_worker_blocked_on_a_full_channel(
    sandbox_for: Callable[..., Sandbox],
) -> None:
    stream = Stream(total=64 * CHANNEL_BYTES)
    returned = threading.Event()

    def script(emit: Emit, cancel: threading.Event) -> BackendResult:
        try:
            return stream.script(emit, cancel)
        finally:
            returned.set()

    cancel = threading.Event()

    def stuck_reader(chunk: bytes) -> None:
        if stream.consumed == 0:
            # Past CHANNEL_BYTES the script is blocked on the full channel.
            assert stream.filled.wait(5)
            cancel.set()
            assert returned.wait(5), "the blocked backend call did not wake up"
        stream.consumed += len(chunk)

    sandbox = sandbox_for(ScriptedBackend(script))
    with pytest.raises(CommandCancelled):
        sandbox.exec("stream", on_data=stuck_reader, cancel=cancel)
    assert stream.consumed == CHUNK  # nothing is forwarded after the abort
    assert sandbox.exec("true").exit_code == 0


@pytest.mark.timeout(10)
def test_dispose_ends_a_command_whose_worker_is_blocked_on_a_full_channel(
    sandbox_for: Callable[..., Sandbox],
) -> None:
    stream = Stream(total=64 * CHANNEL_BYTES)
    sandbox = sandbox_for(ScriptedBackend(stream.script))

    def reader(chunk: bytes) -> None:
        assert stream.filled.wait(5)
        sandbox.dispose()

    with pytest.raises(PiShipError, match="disposed while the command ran"):
        sandbox.exec("stream", on_data=reader)
    assert library_threads() == []


# -- where backend calls run -------------------------------------------------------


def test_the_main_thread_reuses_one_worker(sandbox_for: Callable[..., Sandbox]) -> None:
    backend = ScriptedBackend()
    sandbox = sandbox_for(backend)
    for _ in range(20):
        sandbox.exec("true")
    assert len(set(backend.threads)) == 1
    assert backend.threads[0].startswith("piship-exec-")


def test_other_threads_make_the_backend_call_themselves(
    sandbox_for: Callable[..., Sandbox],
) -> None:
    backend = ScriptedBackend()
    sandbox = sandbox_for(backend)
    before = library_threads()
    on_other_thread(lambda: sandbox.exec("true"))
    assert backend.threads == ["test-caller"]
    assert library_threads() == before


@pytest.mark.timeout(10)
def test_on_data_may_run_a_command_of_its_own(sandbox_for: Callable[..., Sandbox]) -> None:
    def chatty(emit: Emit, cancel: threading.Event) -> BackendResult:
        emit("stdout", b"outer")
        return BackendResult(3)

    sandbox = sandbox_for(ScriptedBackend(chatty))
    inner: list[int] = []

    def nested(chunk: bytes) -> None:
        if not inner:
            inner.append(sandbox.exec("inner").exit_code)

    assert sandbox.exec("outer", on_data=nested).exit_code == 3
    assert inner == [3]


@pytest.mark.timeout(10)
def test_no_library_thread_is_left_after_dispose(sandbox_for: Callable[..., Sandbox]) -> None:
    sandbox = sandbox_for(ScriptedBackend())
    sandbox.exec("true", timeout=30)
    on_other_thread(lambda: sandbox.exec("true", timeout=30))
    assert "piship-exec-timer" in library_threads()
    sandbox.dispose()
    assert library_threads() == []


def test_a_failed_activation_leaves_no_thread(workspace: Path) -> None:
    backend = ScriptedBackend()
    policy = {**POLICY, "environment": {"allow": ["PISHIP_PROBE_UNLISTED"]}}
    with pytest.raises(PiShipError, match="failed its check"):
        activate_sandbox(policy, backend=backend, workspace=workspace, env={})
    assert library_threads() == []


# -- output and aborts, from either thread ------------------------------------------


@CALLERS
def test_stdout_and_stderr_arrive_in_order_on_the_calling_thread(
    sandbox_for: Callable[..., Sandbox], call_from: Caller
) -> None:
    def interleaved(emit: Emit, cancel: threading.Event) -> BackendResult:
        for n in range(50):
            emit("stdout" if n % 3 else "stderr", str(n).encode())
        return BackendResult(0)

    sandbox = sandbox_for(ScriptedBackend(interleaved))
    seen: list[tuple[bytes, str]] = []

    def record(chunk: bytes) -> None:
        seen.append((chunk, threading.current_thread().name))

    def run() -> str:
        sandbox.exec("x", on_data=record)
        return threading.current_thread().name

    caller = call_from(run)
    assert seen == [(str(n).encode(), caller) for n in range(50)]


@CALLERS
@pytest.mark.timeout(10)
def test_a_timeout_kills_the_command(
    sandbox_for: Callable[..., Sandbox], call_from: Caller
) -> None:
    def hang(emit: Emit, cancel: threading.Event) -> BackendResult:
        cancel.wait(10)
        raise CommandCancelled()

    backend = ScriptedBackend(hang)
    sandbox = sandbox_for(backend)
    with pytest.raises(CommandTimeout, match=r"^timeout:0\.05$"):
        call_from(lambda: sandbox.exec("sleep", timeout=0.05))
    assert backend.tokens[0].is_set()
    assert sandbox.exec("true").exit_code == 0


@CALLERS
@pytest.mark.timeout(10)
def test_a_failing_on_data_kills_the_command_and_raises(
    sandbox_for: Callable[..., Sandbox], call_from: Caller
) -> None:
    def chatty(emit: Emit, cancel: threading.Event) -> BackendResult:
        emit("stdout", b"first")
        emit("stdout", b"second")
        cancel.wait(10)
        return BackendResult(0)

    def fail(chunk: bytes) -> None:
        raise ValueError(f"cannot handle {chunk!r}")

    backend = ScriptedBackend(chatty)
    sandbox = sandbox_for(backend)
    with pytest.raises(ValueError, match="cannot handle b'first'"):
        call_from(lambda: sandbox.exec("x", on_data=fail))
    assert backend.tokens[0].is_set()
    assert sandbox.exec("true").exit_code == 0


@pytest.mark.timeout(10)
@pytest.mark.usefixtures("ctrl_c")
def test_ctrl_c_in_on_data_kills_the_command_and_reraises(
    sandbox_for: Callable[..., Sandbox],
) -> None:
    def chatty(emit: Emit, cancel: threading.Event) -> BackendResult:
        emit("stdout", b"output")
        cancel.wait(10)
        return BackendResult(0)

    backend = ScriptedBackend(chatty)
    sandbox = sandbox_for(backend)
    with pytest.raises(KeyboardInterrupt):
        sandbox.exec("x", on_data=lambda chunk: signal.raise_signal(signal.SIGINT))
    assert backend.tokens[0].is_set()
    assert sandbox.exec("true").exit_code == 0


@pytest.mark.timeout(10)
def test_a_backend_ignoring_an_abort_on_another_thread_retires_the_sandbox(
    sandbox_for: Callable[..., Sandbox],
) -> None:
    release = threading.Event()

    def stubborn(emit: Emit, cancel: threading.Event) -> BackendResult:
        release.wait(10)
        return BackendResult(0)

    backend = ScriptedBackend(stubborn)
    sandbox = sandbox_for(backend, settle_timeout=0.05)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            sandbox.exec("sleep", timeout=0.05)
        except BaseException as error:
            errors.append(error)

    caller = threading.Thread(target=run)
    caller.start()
    assert backend.instance is not None
    try:
        # The calling thread is still inside the backend call when the sandbox retires.
        assert backend.instance.disposed.wait(5)
        assert caller.is_alive()
        with pytest.raises(PiShipError, match="retired"):
            sandbox.exec("true")
    finally:
        release.set()
    caller.join(5)
    assert [type(error) for error in errors] == [CommandTimeout]


# -- the channel's typed items ---------------------------------------------------------


def test_the_channel_hands_over_output_then_the_outcome() -> None:
    channel = Channel(CHUNK)
    channel.put("stdout", b"out")
    channel.put("stderr", b"err")
    channel.finish(Returned(BackendResult(3)))
    assert channel.take(1) == [
        Output("stdout", b"out"),
        Output("stderr", b"err"),
        Returned(BackendResult(3)),
    ]


def test_a_raising_backend_call_ends_in_raised() -> None:
    channel = Channel(CHUNK)
    error = RuntimeError("boom")
    channel.finish(Raised(error))
    assert channel.take(1) == [Raised(error)]


def test_an_aborted_channel_drops_its_output_and_says_why() -> None:
    channel = Channel(CHUNK)
    channel.put("stdout", b"lost")
    assert channel.abort("timeout")
    assert not channel.abort("cancel")
    channel.put("stdout", b"dropped")
    assert channel.take(1) == Aborted("timeout")


def test_an_idle_channel_gives_nothing_after_the_wait() -> None:
    assert Channel(CHUNK).take(0.01) == []


@CALLERS
def test_a_command_leaves_no_reference_cycle_behind(
    sandbox_for: Callable[..., Sandbox], call_from: Caller
) -> None:
    # A cycle per command leaves its locks and events to the garbage collector,
    # whose pauses stall every thread of a busy program.
    sandbox = sandbox_for(ScriptedBackend())
    call_from(lambda: sandbox.exec("true"))
    gc.collect()
    gc.disable()
    try:
        for _ in range(10):
            call_from(lambda: sandbox.exec("true"))
        assert gc.collect() == 0
    finally:
        gc.enable()
