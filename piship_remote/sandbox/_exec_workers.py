"""How a backend call runs relative to the thread that asked for it.

The main thread hands each call (a :class:`WorkerCall`) to a reusable ``piship-exec-N``
worker (:class:`~piship_remote.workspace._worker.WorkerPool`), so that it stays free to
raise ``KeyboardInterrupt``, and reads the output through a :class:`Channel` bounded to a
byte budget: a slow reader holds the backend call back instead of buffering without limit. Any other
thread makes a :class:`DirectCall` itself, and a :class:`DeadlineTimer` thread
(``piship-exec-timer``) fires its timeouts.

A call is handed its backend call already bound (a :data:`BackendCall`: the instance's
``exec`` over its request, deadline and cancel token, made by the engine) and a
``stop`` action; this module never sees the deadline or the token. An abort (timeout,
cancel, dispose) runs ``stop`` once; on a worker call it also wakes a blocked writer,
which then drops its data, and overtakes any output the reader has not taken yet.

What moves between the threads is typed: a backend call ends :class:`Returned`
or :class:`Raised` (together an :data:`Outcome`), output travels as
:class:`Output`, and a reader told to stop gets :class:`Aborted`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Literal, TypeAlias

import attrs

from piship_remote.backends.base import BackendResult, ExecRequest

__all__ = [
    "KILLED",
    "STOPPED",
    "AbortKind",
    "Aborted",
    "BackendCall",
    "BackgroundCall",
    "Channel",
    "DirectCall",
    "Outcome",
    "Output",
    "Raised",
    "Returned",
    "Stream",
    "WorkerCall",
]

Stream = Literal["stdout", "stderr"]
AbortKind = Literal["timeout", "cancel", "killed", "disposed", "stopped"]
"""Why a call was aborted; ``stopped``: its reader gave up (Ctrl-C, ``on_data`` failed);
``killed``: a handle's ``kill()`` (its ``wait`` then returns the signal's result)."""
Sink = Callable[[Stream, bytes], None]
Action = Callable[[], None]
BackendCall = Callable[[Callable[[bytes], None], Callable[[bytes], None]], BackendResult]
"""A backend call bound to its request, deadline and token: given ``on_stdout`` and
``on_stderr``, it runs the command."""
BATCH = 256 * 1024  # output that wakes the reader at once
LINGER = 0.001  # how long the reader waits for a batch to build (seconds)
STOPPED: AbortKind = "stopped"
KILLED: AbortKind = "killed"


@attrs.frozen
class Returned:
    """The backend call returned ``result``."""

    result: BackendResult


@attrs.frozen
class Raised:
    """The backend call raised ``error`` (any exception, ``KeyboardInterrupt`` included)."""

    error: BaseException


Outcome: TypeAlias = Returned | Raised
"""How a backend call ended."""


@attrs.frozen
class Output:
    """A chunk of the command's output on one of its streams."""

    stream: Stream
    chunk: bytes


@attrs.frozen
class Aborted:
    """What :meth:`Channel.take` returns once the call was aborted, for ``kind``."""

    kind: AbortKind


def _call_backend(
    backend_call: BackendCall,
    on_stdout: Callable[[bytes], None],
    on_stderr: Callable[[bytes], None],
) -> Outcome:
    try:
        return Returned(backend_call(on_stdout, on_stderr))
    except BaseException as e:
        return Raised(e)


# -- the main thread's path ---------------------------------------------------------


class Channel:
    """Output from a worker to its reader, holding at most about ``limit`` bytes.

    ``put`` blocks while ``limit`` bytes wait; the final outcome never blocks.
    Once aborted, ``put`` drops its data and ``take`` returns :class:`Aborted`.
    The reader takes everything waiting at once, and lingers up to ``LINGER`` for a
    batch to build: handing the GIL between the two threads for every chunk would
    cost more than moving the data.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._batch = min(BATCH, limit)
        self._lock = threading.Lock()
        self._readable = threading.Condition(self._lock)
        self._writable = threading.Condition(self._lock)
        self._items: list[Output | Outcome] = []
        self._held = 0  # bytes put and not yet forwarded (taken ones count until the next take)
        self._taken = 0
        self._done = False
        self.aborted: AbortKind | None = None

    def put(self, stream: Stream, chunk: bytes) -> None:
        with self._lock:
            while self._held >= self._limit and self.aborted is None:
                self._writable.wait()
            if self.aborted is not None:
                return
            before = self._held
            self._items.append(Output(stream, chunk))
            self._held += len(chunk)
            if not before or before < self._batch <= self._held:
                self._readable.notify()

    def finish(self, outcome: Outcome) -> None:
        with self._lock:
            self._items.append(outcome)
            self._done = True
            self._readable.notify()

    def abort(self, kind: AbortKind) -> bool:
        """Abort for ``kind``; ``False`` when it already was aborted."""
        with self._lock:
            if self.aborted is not None:
                return False
            self.aborted = kind
            self._items.clear()
            self._held = self._taken = 0
            self._readable.notify_all()
            self._writable.notify_all()
        return True

    def take(self, timeout: float | None) -> list[Output | Outcome] | Aborted:
        """Every waiting item, :class:`Aborted` once aborted, ``[]`` after ``timeout``."""
        with self._lock:
            self._release_taken()
            if self.aborted is None and not self._items:
                self._readable.wait(timeout)
            building = self.aborted is None and self._items and not self._done
            if building and self._held < self._batch:
                self._readable.wait(LINGER)
            if self.aborted is not None:
                return Aborted(self.aborted)
            items, self._items = self._items, []
            self._taken = self._held
            return items

    def _release_taken(self) -> None:
        """The reader is back for more: what it took last time has been forwarded."""
        if self._taken:
            self._held -= self._taken
            self._taken = 0
            self._writable.notify()


class WorkerCall:
    """One backend call made on a worker; its output goes through a :class:`Channel`."""

    def __init__(self, backend_call: BackendCall, stop: Action, limit: int) -> None:
        self.finished = threading.Event()
        self.channel = Channel(limit)
        self._backend_call = backend_call
        self._stop = stop

    def abort(self, kind: AbortKind) -> None:
        if self.channel.abort(kind):
            self._stop()

    def stop(self) -> None:
        """The reader gives up: drop further output and cancel the call."""
        self.channel.abort(STOPPED)
        self._stop()

    def execute(self) -> Outcome:
        put = self.channel.put
        return _call_backend(
            self._backend_call,
            lambda chunk: put("stdout", chunk),
            lambda chunk: put("stderr", chunk),
        )

    def finish(self, outcome: Outcome) -> None:
        self.finished.set()
        self.channel.finish(outcome)


# -- every other thread's path ------------------------------------------------------


class DirectCall:
    """One backend call made on the calling thread, ``sink`` called on it directly.

    The first abort (or a failing ``sink``) calls ``on_stop`` with the call and the
    abort's kind (which cancels the backend call); output after that is dropped. (The call is
    passed, not captured, so that nothing here forms a reference cycle: a cycle
    per command would leave its locks and events to the garbage collector, whose
    pauses stall every thread.)
    """

    def __init__(
        self,
        backend_call: BackendCall,
        sink: Sink | None,
        on_stop: Callable[[DirectCall, AbortKind], None],
    ) -> None:
        self.finished = threading.Event()
        self.aborted: AbortKind | None = None
        self.failure: BaseException | None = None
        self._backend_call = backend_call
        self._sink = sink
        self._on_stop = on_stop
        self._lock = threading.Lock()

    @property
    def stopped(self) -> bool:
        """Aborted, or its sink failed: the backend call is being cancelled."""
        return self.aborted is not None or self.failure is not None

    def abort(self, kind: AbortKind) -> None:
        with self._lock:
            if self.stopped or self.finished.is_set():
                return
            self.aborted = kind
        self._on_stop(self, kind)

    def run(self) -> Outcome:
        try:
            return _call_backend(
                self._backend_call, self._forward("stdout"), self._forward("stderr")
            )
        finally:
            self.finished.set()

    def _forward(self, stream: Stream) -> Callable[[bytes], None]:
        sink = self._sink
        if sink is None:
            return _drop

        def forward(chunk: bytes) -> None:
            if self.stopped:
                return
            try:
                sink(stream, chunk)
            except BaseException as e:
                self._fail(e)

        return forward

    def _fail(self, error: BaseException) -> None:
        with self._lock:
            if self.stopped:
                return
            self.failure = error
        self._on_stop(self, STOPPED)


def _drop(chunk: bytes) -> None:
    return None


class BackgroundCall:
    """A :class:`DirectCall` made on a worker, for a command nobody waits for yet.

    ``done`` is set, and ``on_done`` called, once the backend call returned and
    ``outcome`` says how; the request's ``control`` then refuses further input.
    """

    def __init__(self, call: DirectCall, request: ExecRequest, on_done: Action) -> None:
        self.call = call
        self.done = threading.Event()
        self.outcome: Outcome | None = None
        self._request = request
        self._on_done = on_done

    def execute(self) -> Outcome:
        return self.call.run()

    def finish(self, outcome: Outcome) -> None:
        self.outcome = outcome
        if self._request.control is not None:
            self._request.control.end()
        self.done.set()
        self._on_done()


def _nothing() -> None:
    return None
