"""The governed run of one command in an active sandbox: deadline, cancel, Ctrl-C, retire.

:class:`ExecEngine` makes a backend instance's ``exec`` call on behalf of
``Sandbox.exec``/``Sandbox.run`` and the activation's readiness check, and owns
the threads that needs. There are four paths:

- **The main thread, with a backend that cancels promptly** (its instance has
  ``cancels_promptly = True``: a cancelled call returns within milliseconds)
  makes the call itself (:class:`~piship_remote.sandbox._exec_workers.DirectCall`), output
  going straight to the sink, under an
  :class:`~piship_remote.sandbox._interrupts.InterruptGuard`: a SIGINT aborts the call
  through the guard's ``piship-interrupt`` thread, and ``KeyboardInterrupt`` is
  raised once the call has returned. The ``piship-exec-timer`` thread fires the
  deadline.
- **The main thread otherwise** (another backend, or a program with its own
  SIGINT handler or wakeup fd) hands the backend call to a reusable
  ``piship-exec-N`` worker (:class:`~piship_remote.sandbox._exec_workers.WorkerCall`) and
  drains its bounded channel, forwarding output to the sink on the main thread.
  It wakes every ``INTERRUPT_POLL`` seconds, because a signal delivered while
  another thread runs does not wake a blocked wait, and that is when Python
  raises ``KeyboardInterrupt``. It watches the deadline itself.
- **Any other thread** makes the call itself (a ``DirectCall`` again); the
  ``piship-exec-timer`` thread fires its deadline. The call is marked
  :func:`~piship_remote.sandbox.lifecycle.running_off_main_thread`, so that Ctrl-C
  while the main thread waits for a pool's workers disposes the sandbox.
- **A started command** (``Sandbox.start``, :meth:`ExecEngine.begin`) is a
  ``DirectCall`` made on a ``piship-exec-N`` worker
  (:class:`~piship_remote.sandbox._exec_workers.BackgroundCall`); its handle's
  ``kill`` is an abort for ``cancel``, and the timer fires its deadline.

An abort (timeout, cancel, dispose, Ctrl-C, a failing sink) sets the call's
token, which cancels the backend call, and the caller then waits up to
``settle_timeout`` for that call to return. A backend call that does not return
in time *retires* the sandbox: its instance is disposed in the background and
every later command is refused, so a command the library lost control of cannot
keep running beside new ones. Dispose aborts every call at once and never waits.

How a cancel travels, on the main thread's worker path, from ``Sandbox.exec(..., cancel=event)``
to the socket (an E2B-compatible backend):

1. ``Sandbox.exec`` turned the caller's event into a
   :class:`~piship_remote.transport._cancel.CancelToken` once (:meth:`ExecEngine.cancel_token`:
   a plain ``threading.Event`` is polled every 2 ms by this engine's
   ``piship-cancel-watch`` thread); the engine registers ``call.abort("cancel")`` on it.
2. ``WorkerCall.abort`` marks the channel aborted, which wakes the main thread (it
   raises :class:`CommandCancelled` after settling) and a worker blocked writing
   output, then runs the call's ``stop``: it sets the token the engine bound into
   the backend call (:meth:`ExecEngine._bound`; the worker never sees it).
3. The E2B instance's per-command token follows that one and sends SendSignal SIGKILL
   on a ``piship-e2b-signal`` thread; the transport's call scope, registered on it when
   the Start request was sent, shuts down the sockets the request uses, so the
   worker's blocked stream read ends and ``instance.exec`` raises ``CommandCancelled``.

Ctrl-C (raised in the drain loop) and a timeout (seen by the drain loop) skip step 1: the
main thread calls ``call.stop()`` (step 3), and waits for the worker. On any other thread
step 2 is ``DirectCall.abort``, called by the watcher or the timer thread, and the wait for
the call to return is a retire check scheduled on the timer thread.
"""

from __future__ import annotations

import itertools
import os
import shlex
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext

from piship_remote.backends.base import (
    BackendResult,
    Detachable,
    ExecRequest,
    Instance,
    ServesPorts,
)
from piship_remote.model.errors import (
    ConfigInvalid,
    PiShipError,
    SandboxUnavailable,
)
from piship_remote.model.redact import Redactor
from piship_remote.sandbox import lifecycle
from piship_remote.sandbox._exec_errors import ExecErrors
from piship_remote.sandbox._exec_workers import (
    KILLED,
    STOPPED,
    Aborted,
    AbortKind,
    BackendCall,
    BackgroundCall,
    DirectCall,
    Outcome,
    Output,
    Raised,
    Sink,
    WorkerCall,
)
from piship_remote.sandbox._interrupts import Disarm, InterruptGuard
from piship_remote.transport._cancel import (
    CancelToken,
    DeadlineTimer,
    EventWatcher,
    bridge,
    when_cancelled,
)
from piship_remote.transport.deadline import Deadline
from piship_remote.workspace._worker import WorkerPool

__all__ = [
    "CHANNEL_BYTES",
    "COMMAND_KILLED",
    "INTERRUPT_POLL",
    "Command",
    "ExecEngine",
    "command_line",
]

Command = str | Sequence[str | os.PathLike[str]]
"""A shell command line, or its arguments one by one (``["pytest", "-k", "a b"]``)."""

INTERRUPT_POLL = 0.05
COMMAND_KILLED = "interrupted: the remote command was killed"
CHANNEL_BYTES = 1024 * 1024  # output a main-thread command may buffer ahead of its sink
KILLED_RESULT = BackendResult(None, "SIGKILL")  # exit status 137, as a shell reports it
_EXEC_NUMBERS = itertools.count(1)  # piship-exec-N, numbered across sandboxes


def command_line(command: object) -> str:
    """The shell command line for ``command``: a ``str`` as is, a sequence of arguments
    quoted one by one as :func:`shlex.join` does (path-like arguments included).

    >>> command_line(["echo", "a b"])
    "echo 'a b'"

    Anything else is a ``TypeError``; an empty sequence is ``CONFIG_INVALID``.
    """
    if isinstance(command, str):
        return command
    if isinstance(command, (bytes, bytearray, memoryview)) or not isinstance(command, Sequence):
        raise TypeError(
            "command must be a str (a shell command line) or a list of str arguments,"
            f" not {type(command).__name__}"
        )
    arguments: list[str] = []
    for index, argument in enumerate(command):
        if isinstance(argument, os.PathLike):
            argument = os.fspath(argument)
        if not isinstance(argument, str):
            raise TypeError(
                f"command argument {index} must be a str, not {type(argument).__name__}"
            )
        arguments.append(argument)
    if not arguments:
        raise ConfigInvalid("the command is an empty list of arguments")
    return shlex.join(arguments)


class _Aborted(Exception):
    """Why the calling thread stopped waiting for a command."""

    def __init__(self, kind: AbortKind) -> None:
        super().__init__(kind)
        self.kind = kind


class ExecEngine:
    """Runs commands on one backend instance under a deadline, a cancel event and Ctrl-C.

    ``adapter`` names the backend in messages; ``redactor`` hides secrets in the
    errors a backend raises.
    """

    def __init__(
        self, instance: Instance, *, adapter: str, redactor: Redactor, settle_timeout: float
    ) -> None:
        self._instance = instance
        self._adapter = adapter
        self._errors = ExecErrors(adapter=adapter, redactor=redactor)
        self._settle_timeout = settle_timeout
        self._lock = threading.Lock()
        self._calls: set[WorkerCall | DirectCall] = set()
        self._watcher = EventWatcher()
        self._workers = WorkerPool("piship-exec", _EXEC_NUMBERS)
        self._timer = DeadlineTimer()
        self._interrupts = InterruptGuard()
        self._prompt = instance.cancels_promptly
        self._controls = instance.controls_commands
        self._disposed = False
        self._retired = False

    def ensure_usable(self) -> None:
        """Raise ``SANDBOX_UNAVAILABLE`` once the sandbox is retired or disposed."""
        with self._lock:
            if self._retired or self._disposed:
                raise self._refusal()

    def cancel_token(self, cancel: threading.Event | None) -> AbstractContextManager[CancelToken]:
        """The token for a caller's ``cancel`` during the block: itself if it is one, else
        a mirror this engine's ``piship-cancel-watch`` thread sets (the one bridge)."""
        return bridge(cancel, self._watcher)

    def run(
        self,
        request: ExecRequest,
        sink: Sink | None,
        deadline: Deadline,
        cancel: threading.Event | None,
        *,
        retire: bool,
    ) -> BackendResult:
        """Run ``request``, its output to ``sink`` on this thread, until ``deadline``.

        ``retire``: a backend call that ignores an abort retires the sandbox.
        """
        call: WorkerCall | DirectCall
        disarm: Disarm | None = None
        off_main = threading.current_thread() is not threading.main_thread()
        if off_main:
            call = self._direct(request, deadline, sink, retire)
        elif not self._prompt:
            call = self._worker_call(request, deadline)
        else:
            direct = self._direct(request, deadline, sink, retire)
            disarm = self._interrupts.arm(lambda: direct.abort(STOPPED))
            call = direct if disarm is not None else self._worker_call(request, deadline)
        try:
            with lifecycle.running_off_main_thread() if off_main else nullcontext():
                outcome = self._registered(call, sink, deadline, cancel, retire=retire)
        finally:
            if disarm is not None and disarm():
                raise KeyboardInterrupt(COMMAND_KILLED) from None
        if isinstance(outcome, Raised):
            raise self._errors.from_backend(outcome.error)
        return outcome.result

    @property
    def controls_commands(self) -> bool:
        """Whether the instance gives a running command's pid, stdin and terminal."""
        return self._controls

    def begin(
        self,
        request: ExecRequest,
        sink: Sink,
        deadline: Deadline,
        on_done: Callable[[], None],
        cancel: threading.Event | None = None,
    ) -> BackgroundCall:
        """Start ``request`` on a worker and return at once; ``sink`` gets its output on
        that worker. Its ``deadline``, a kill (``call.abort``) and dispose abort it as they
        abort a waited-for command, and one that ignores the abort retires the sandbox."""
        call = self._direct(request, deadline, sink, retire=True)
        unschedule: Callable[[], None] = _nothing
        forget: Callable[[], None] = _nothing

        def done() -> None:
            unschedule()
            forget()
            with self._lock:
                self._calls.discard(call)
            on_done()

        started = BackgroundCall(call, request, done)
        with self._lock:
            if self._disposed:
                raise self._refusal()
            self._calls.add(call)
        remaining = deadline.remaining()
        if remaining is not None:
            unschedule = self._timer.schedule(remaining, lambda: call.abort("timeout"))
        forget = when_cancelled(cancel, self._watcher, lambda: call.abort("cancel"))
        if self._workers.submit(started) is None:
            call.abort("disposed")
            done()
            raise self._errors.aborted("disposed", deadline)
        return started

    def result_of(self, started: BackgroundCall, deadline: Deadline) -> BackendResult:
        """How a :meth:`begin` call ended, once ``started.done`` is set: its result, or
        the error a waited-for command raises (``CommandTimeout``, ``CommandCancelled``, ...).

        A command its handle killed ended by ``SIGKILL`` (the signal the kill sends or, on
        a retired claim, the end of its process): whatever the stream said after the kill
        was cut off, so that is its result on every service."""
        call, outcome = started.call, started.outcome
        if call.failure is not None:
            raise call.failure
        if call.aborted == KILLED:
            return KILLED_RESULT
        if call.aborted is not None:
            raise self._errors.aborted(call.aborted, deadline)
        assert outcome is not None
        if isinstance(outcome, Raised):
            raise self._errors.from_backend(outcome.error)
        return outcome.result

    def _bound(self, request: ExecRequest, deadline: Deadline) -> tuple[BackendCall, CancelToken]:
        """The instance's ``exec`` bound to ``request``, ``deadline`` and a new token."""
        token, instance = CancelToken(), self._instance
        return lambda out, err: instance.exec(
            request, on_stdout=out, on_stderr=err, cancel=token, deadline=deadline
        ), token

    def _worker_call(self, request: ExecRequest, deadline: Deadline) -> WorkerCall:
        backend_call, token = self._bound(request, deadline)
        return WorkerCall(backend_call, token.set, CHANNEL_BYTES)

    def _direct(
        self, request: ExecRequest, deadline: Deadline, sink: Sink | None, retire: bool
    ) -> DirectCall:
        backend_call, token = self._bound(request, deadline)

        def stop(call: DirectCall, kind: AbortKind) -> None:
            token.set()
            self._watch_settle(call, kind, retire)

        return DirectCall(backend_call, sink, stop)

    def _registered(
        self,
        call: WorkerCall | DirectCall,
        sink: Sink | None,
        deadline: Deadline,
        cancel: threading.Event | None,
        *,
        retire: bool,
    ) -> Outcome:
        with self._lock:
            if self._disposed:
                raise self._refusal()
            self._calls.add(call)
        try:
            forget = when_cancelled(cancel, self._watcher, lambda: call.abort("cancel"))
            try:
                if isinstance(call, WorkerCall):
                    return self._on_worker(call, sink, deadline, retire=retire)
                return self._on_caller(call, deadline)
            finally:
                forget()
        finally:
            with self._lock:
                self._calls.discard(call)

    def epoch(self) -> str | None:
        """The instance's current sandbox or claim id."""
        return self._instance.epoch()

    @property
    def state(self) -> str:
        """``"active"``, ``"retired"`` (it runs no more commands) or ``"disposed"``."""
        with self._lock:
            return "disposed" if self._disposed else "retired" if self._retired else "active"

    def dispose(self) -> None:
        """Abort every running call, dispose the instance, stop the threads. Idempotent."""
        self._shut(self._instance.dispose)

    def url(self, port: int) -> str:
        """The address of ``port`` inside the sandbox, where its service routes ports."""
        instance = self._instance
        if not isinstance(instance, ServesPorts):
            raise ConfigInvalid(
                f"The {self._adapter} sandbox backend does not reach a sandbox's ports from this"
                " host",
                component="sandbox",
                user_action="Use an E2B-compatible service (or the local service) to reach a"
                " server in the sandbox",
            )
        try:
            return instance.url(port)
        except ValueError as e:
            raise ConfigInvalid(str(e), component="sandbox") from None

    def detach(self) -> str:
        """Like :meth:`dispose`, but the remote sandbox is left running; its id."""
        instance = self._instance
        if not isinstance(instance, Detachable):
            raise SandboxUnavailable(
                f"The {self._adapter} sandbox backend cannot detach from a sandbox",
                component="sandbox",
            )
        with self._lock:
            unusable = self._retired or self._disposed
        if unusable:
            raise self._refusal()
        kept: list[str] = []
        error: list[Exception] = []

        def let_go() -> None:
            try:
                kept.append(instance.detach())
            except Exception as e:
                error.append(e)

        self._shut(let_go)
        if error:
            raise self._errors.from_backend(error[0])
        if not kept:
            raise self._refusal()
        return kept[0]

    def _shut(self, release: Callable[[], object]) -> None:
        with self._lock:
            if self._disposed:
                return
            self._disposed = True
            retired = self._retired
            calls = list(self._calls)
        for call in calls:
            call.abort("disposed")
        if not retired:
            _quietly(release)
        self._watcher.close()
        self._workers.close()
        self._timer.close()
        self._interrupts.close()

    # The main thread: a worker makes the call, the main thread drains its channel.

    def _on_worker(
        self, call: WorkerCall, sink: Sink | None, deadline: Deadline, *, retire: bool
    ) -> Outcome:
        worker = self._workers.submit(call)
        if worker is None:  # disposed since the call was registered
            raise self._errors.aborted("disposed", deadline)
        try:
            return self._drain(call, sink, deadline)
        except _Aborted as aborted:
            self._settle(call, retire=retire and aborted.kind != "disposed")
            raise self._errors.aborted(aborted.kind, deadline) from None
        except KeyboardInterrupt:
            self._settle(call, retire=retire)
            raise KeyboardInterrupt(COMMAND_KILLED) from None  # no worker-channel frames
        except BaseException:  # the sink failed
            self._settle(call, retire=retire)
            raise
        finally:
            if call.finished.is_set():
                self._workers.reap(worker, self._settle_timeout)

    def _drain(self, call: WorkerCall, sink: Sink | None, deadline: Deadline) -> Outcome:
        channel = call.channel
        while True:
            taken = channel.take(_wait_slice(deadline, INTERRUPT_POLL))
            if isinstance(taken, Aborted):
                raise _Aborted(taken.kind)
            for item in taken:
                if not isinstance(item, Output):
                    return item
                if channel.aborted is not None:  # nothing is forwarded after an abort
                    raise _Aborted(channel.aborted)
                if sink is not None:
                    sink(item.stream, item.chunk)
            if deadline.expired:
                raise _Aborted("timeout")

    def _settle(self, call: WorkerCall, *, retire: bool) -> None:
        call.stop()
        if call.finished.wait(self._settle_timeout) or not retire:
            return
        self._retire()

    # Any other thread: it makes the call itself; the timer thread fires its deadline.

    def _on_caller(self, call: DirectCall, deadline: Deadline) -> Outcome:
        unschedule = None
        remaining = deadline.remaining()
        if remaining is not None:
            unschedule = self._timer.schedule(remaining, lambda: call.abort("timeout"))
        try:
            outcome = call.run()
        finally:
            if unschedule is not None:
                unschedule()
        if call.failure is not None:
            raise call.failure
        if call.aborted is not None:
            raise self._errors.aborted(call.aborted, deadline)
        return outcome

    def _watch_settle(self, call: DirectCall, kind: AbortKind, retire: bool) -> None:
        """Retire the sandbox if the aborted ``call`` has not returned in settle_timeout."""
        if not retire or kind == "disposed":
            return

        def check() -> None:
            if not call.finished.is_set():
                self._retire()

        self._timer.schedule(self._settle_timeout, check)

    def _refusal(self) -> PiShipError:
        return self._errors.retired(disposed=self._disposed, retired=self._retired)

    def _retire(self) -> None:
        with self._lock:
            if self._retired or self._disposed:
                return
            self._retired = True
        threading.Thread(
            target=_quietly, args=(self._instance.dispose,), name="piship-retire", daemon=True
        ).start()


def _wait_slice(deadline: Deadline, poll: float | None) -> float | None:
    remaining = deadline.remaining()
    if remaining is None:
        return poll
    return remaining if poll is None else min(remaining, poll)


def _quietly(action: Callable[[], object]) -> None:
    try:
        action()
    except Exception:
        pass


def _nothing() -> None:
    return None
