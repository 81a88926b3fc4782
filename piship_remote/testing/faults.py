"""Faults on demand for the doubles: the next creates refused, a create's answer lost, a
command's stream dropped, a request stalled. Both doubles carry one as ``server.faults``::

    def test_my_retry(e2b_server):
        server = e2b_server()
        server.faults.fail_creates(2, status=429, retry_after=1)   # then creates succeed
        server.faults.lose_create_answer()      # the next create happens, its answer is cut
        server.faults.drop_stream_after_output()  # the next command's output, then a reset
        server.faults.stall("/execute", seconds=5)  # the next such request waits 5 s first
        server.faults.lose_processes()          # sandboxd: the next call naming a pid: NOT_FOUND
        server.kill(sandbox.id)                  # the sandbox (or claim) is gone now

Each fault is used up by the requests it hits, in arrival order; :meth:`Faults.clear`
forgets those not used yet. A stall without ``seconds`` holds its request until
:meth:`Faults.release` or the server closes (then the connection drops).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import attrs

from piship_remote.testing.recorder import DropConnection

__all__ = ["CreateFailure", "Faults", "Stall", "hold_if_stalled"]


@attrs.frozen
class CreateFailure:
    """How one create is refused: its HTTP status and ``Retry-After`` (seconds, or none)."""

    status: int
    retry_after: int | None


@attrs.frozen
class Stall:
    """One stalled request: how long it waits (``None``: until released) and on what."""

    seconds: float | None
    gate: threading.Event


class Faults:
    """The faults a double has been asked for and has not used yet; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._create_failures: list[CreateFailure] = []
        self._lost_answers = 0
        self._dropped_streams = 0
        self._lost_processes = 0
        self._stalls: list[tuple[str | None, Stall]] = []
        self._released = threading.Event()

    # ---- what a test asks for ----------------------------------------------------------

    def fail_creates(
        self, count: int = 1, *, status: int = 429, retry_after: int | None = 1
    ) -> None:
        """Answer the next ``count`` creates with ``status`` (and ``Retry-After``); nothing
        is created by them."""
        with self._lock:
            self._create_failures += [CreateFailure(status, retry_after)] * count

    def lose_create_answer(self, count: int = 1) -> None:
        """The next ``count`` creates take effect, then their connection is cut before the
        answer: the client cannot know the sandbox (or claim) exists."""
        with self._lock:
            self._lost_answers += count

    def drop_stream_after_output(self, count: int = 1) -> None:
        """The next ``count`` commands send their output, then the connection is reset
        before the command's end (on Kubernetes: the answer is never sent)."""
        with self._lock:
            self._dropped_streams += count

    def lose_processes(self, count: int = 1) -> None:
        """sandboxd: the next ``count`` calls naming a running process (``WriteStdin``,
        ``SendSignal``, ``ResizeTTY``) find none and answer ``NOT_FOUND``."""
        with self._lock:
            self._lost_processes += count

    def stall(
        self, path: str | None = None, *, count: int = 1, seconds: float | None = None
    ) -> None:
        """Hold the next ``count`` requests whose path starts with ``path`` (any request when
        ``None``) for ``seconds``, or until :meth:`release` when ``seconds`` is ``None``."""
        with self._lock:
            gate = self._released if seconds is None else threading.Event()
            self._stalls += [(path, Stall(seconds, gate))] * count

    def release(self) -> None:
        """Let every held request go on (and every later stall without ``seconds``)."""
        self._released.set()

    def clear(self) -> None:
        """Forget every fault not used yet."""
        with self._lock:
            self._create_failures.clear()
            self._lost_answers = self._dropped_streams = self._lost_processes = 0
            self._stalls.clear()

    # ---- what a double takes ---------------------------------------------------------

    def take_create_failure(self) -> CreateFailure | None:
        with self._lock:
            return self._create_failures.pop(0) if self._create_failures else None

    def take_lost_answer(self) -> bool:
        with self._lock:
            if self._lost_answers <= 0:
                return False
            self._lost_answers -= 1
            return True

    def take_dropped_stream(self) -> bool:
        with self._lock:
            if self._dropped_streams <= 0:
                return False
            self._dropped_streams -= 1
            return True

    def take_lost_process(self) -> bool:
        with self._lock:
            if self._lost_processes <= 0:
                return False
            self._lost_processes -= 1
            return True

    def take_stall(self, path: str) -> Stall | None:
        with self._lock:
            for index, (prefix, stall) in enumerate(self._stalls):
                if prefix is None or path.startswith(prefix):
                    del self._stalls[index]
                    return stall
        return None


def hold_if_stalled(
    faults: Faults,
    path: str,
    wait: Callable[[threading.Event | None, float | None], bool],
    closing: Callable[[], bool],
) -> None:
    """Hold the request to ``path`` when a stall is due for it; a held request whose
    server closes is dropped."""
    stall = faults.take_stall(path)
    if stall is None:
        return
    if not wait(stall.gate, stall.seconds) and (stall.seconds is None or closing()):
        raise DropConnection
