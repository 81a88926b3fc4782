"""Process measurements: thread counts sampled while work runs, and resident memory.

with ThreadSampler() as sampler:
    run_threads()
sampler.peak_python, sampler.peak_os     # most threads seen at once, this sampler excluded
"""

from __future__ import annotations

import re
import threading
from types import TracebackType

__all__ = ["ThreadSampler", "memory_kib", "reset_peak_rss"]

_STATUS = re.compile(r"^(\w+):\s+(\d+)", re.MULTILINE)


def _status() -> dict[str, int]:
    with open("/proc/self/status", encoding="ascii") as status:
        return {key: int(value) for key, value in _STATUS.findall(status.read())}


def memory_kib() -> tuple[int, int]:
    """``(VmRSS, VmHWM)`` of this process in KiB (Linux)."""
    status = _status()
    return status.get("VmRSS", 0), status.get("VmHWM", 0)


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (``/proc/self/clear_refs``); ``False`` if refused."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
            refs.write("5")
    except OSError:
        return False
    return True


def _os_threads() -> int:
    try:
        return _status().get("Threads", 0)
    except OSError:
        return 0


class ThreadSampler:
    """Samples Python and OS thread counts every ``interval`` seconds on its own thread."""

    def __init__(self, interval: float = 0.002) -> None:
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="piship-bench-sampler", daemon=True)
        self.peak_python = 0
        self.peak_os = 0

    def __enter__(self) -> ThreadSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def _sample(self) -> None:
        running = self._thread.is_alive()
        self.peak_python = max(self.peak_python, threading.active_count() - running)
        self.peak_os = max(self.peak_os, _os_threads() - running)
