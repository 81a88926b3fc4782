"""Pausing a local sandbox: every process of it held still, its files kept, until resumed.

A :class:`PauseState` belongs to one sandbox. :meth:`~PauseState.pause` freezes
the sandbox's cgroup (v2 ``cgroup.freeze`` or the v1 freezer) where the host
has one; elsewhere it stops every process of the sandbox with ``SIGSTOP``
(walking the tree from the sandbox's first process) and :meth:`~PauseState.resume`
continues them with ``SIGCONT``. Either way a process running before the pause
(a background server included) carries on after it where it stopped. A paused
sandbox must be released before it is destroyed, since a frozen process cannot
take its ``SIGKILL``::

    state = PauseState(vm.cgroups, lambda: vm.init_pid)
    state.pause()          # True; False when it was already paused
    state.paused_at        # time.time() of the pause, or None
    state.resume()         # True; False when it was not paused
    state.release()        # before the sandbox's processes are killed: thaw, refuse more
    with state.running():  # a command being started: a pause waits; Paused if paused
        ...
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

from piship_remote.local.isolation.limits import CgroupSet

__all__ = ["PauseState", "Paused", "tree_pids"]

STOP_ROUNDS = 8
STOP_TIMEOUT = 5.0
STOP_POLL = 0.005
HELD_STATES = frozenset(b"TtZX")  # stopped, traced, or no longer running at all


class Paused(Exception):
    """The sandbox is paused: nothing can be started in it (envd answers it as missing)."""


class PauseState:
    """Whether one sandbox is paused, and the means by which its processes are held."""

    def __init__(self, cgroups: CgroupSet, init_pid: Callable[[], int]) -> None:
        self._cgroups = cgroups
        self._init_pid = init_pid
        self._lock = threading.Lock()
        self._stopped: list[int] = []
        self._released = False
        self.paused_at: float | None = None
        """When the sandbox was paused (``time.time()``), or ``None`` while it runs."""

    @property
    def paused(self) -> bool:
        """Whether the sandbox is paused now."""
        return self.paused_at is not None

    def pause(self) -> bool:
        """Hold every process of the sandbox still; ``False`` if paused already or released."""
        with self._lock:
            if self.paused_at is not None or self._released:
                return False
            if not self._cgroups.freeze():
                self._stop_tree()
            self.paused_at = time.time()
            return True

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Keep the sandbox running while the block runs (a command being started).

        A pause asked for meanwhile waits for the block, so the agent is never
        frozen while a start waits on its answer; :class:`Paused` if paused already.
        """
        with self._lock:
            if self.paused_at is not None:
                raise Paused("the sandbox is paused")
            yield

    def resume(self) -> bool:
        """Let the sandbox's processes run again; ``False`` if it was not paused."""
        with self._lock:
            if self.paused_at is None:
                return False
            self._let_go()
            return True

    def release(self) -> None:
        """Let the processes go for good (the sandbox is ending); later pauses are refused."""
        with self._lock:
            self._released = True
            if self.paused_at is not None:
                self._let_go()

    def _let_go(self) -> None:
        if not self._cgroups.thaw():
            for pid in self._stopped:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGCONT)
            self._stopped = []
        self.paused_at = None

    def _stop_tree(self) -> None:
        """``SIGSTOP`` every process, and wait until each one has stopped.

        A signal takes effect when its process is next scheduled, which on a busy host
        is later than ``kill`` returns. Processes that do not stop in time are
        continued with the rest, and the pause fails.
        """
        self._stopped = self._signal_tree(signal.SIGSTOP)
        deadline = time.monotonic() + STOP_TIMEOUT
        while not all(_held(pid) for pid in self._stopped):
            if time.monotonic() >= deadline:
                self._let_go()
                raise OSError("the sandbox's processes did not stop in time")
            time.sleep(STOP_POLL)

    def _signal_tree(self, sig: int) -> list[int]:
        """Send ``sig`` to every process of the sandbox (parents first); the pids reached.

        The walk is repeated until it finds no new process, so a child forked while
        its parent was being reached is stopped too.
        """
        reached: list[int] = []
        for _ in range(STOP_ROUNDS):
            pids = self._cgroups.members() or tree_pids(self._init_pid())
            new = [pid for pid in pids if pid not in reached]
            if not new:
                break
            for pid in new:
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
                    reached.append(pid)
        return reached


def _held(pid: int) -> bool:
    """Whether process ``pid`` is stopped, or gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rpartition(b")")[2].split()[0][0] in HELD_STATES
    except (OSError, IndexError):
        return True


def tree_pids(root: int) -> list[int]:
    """``root`` and all its descendants (host pids), parents before children."""
    if root <= 0:
        return []
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{name}/stat", "rb") as handle:
                fields = handle.read().rpartition(b")")[2].split()
            children.setdefault(int(fields[1]), []).append(int(name))
    order, index = [root], 0
    while index < len(order):
        order.extend(children.get(order[index], ()))
        index += 1
    return order
