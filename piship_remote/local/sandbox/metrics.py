"""A local sandbox's metrics, as E2B's ``GET /sandboxes/<id>/metrics`` reports them.

A sample is taken each time metrics are asked for, from the sandbox's own cgroups
where it has them (:meth:`CgroupSet.usage`; CPU time from its processes where they
count none), else from its processes; the memory total is the sandbox's memory
limit, not the host's. CPU use is over the time
since the previous sample (since the start for the first). Samples are kept (the
last :data:`MAX_SAMPLES`), newest last, so a time range gets those taken within it::

    metrics = SandboxMetrics()                     # one per service
    metrics.read(sandbox, start=1733450000, end=None)   # [SandboxMetric, ...] oldest first
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable

import attrs

from piship_remote.local.isolation.limits import MIB, GroupUsage
from piship_remote.local.sandbox.fs import FilesFailed, call
from piship_remote.local.sandbox.listing import query_of, rfc3339
from piship_remote.local.sandbox.registry import Sandbox
from piship_remote.wire.e2b_control import SandboxMetric
from piship_remote.wire.e2b_json import WireError

__all__ = [
    "MAX_SAMPLES",
    "MetricsHistory",
    "SandboxMetrics",
    "Sizes",
    "snapshot",
    "time_range",
]

MAX_SAMPLES = 720
_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICKS = os.sysconf("SC_CLK_TCK")


@attrs.frozen
class Sizes:
    """A sandbox's size as E2B reports it (``get_info``, ``get_metrics``): its limits."""

    cpus: int
    memory_mib: int
    disk_mib: int

    @classmethod
    def of(cls, sandbox: Sandbox) -> Sizes:
        """The CPUs (its CPU bandwidth, rounded up), memory and disk it may use."""
        limits = sandbox.limits
        cpus = max(1, min(math.ceil(limits.cpus), os.cpu_count() or 1))
        return cls(cpus, limits.memory // MIB, limits.disk // MIB)


class MetricsHistory:
    """One sandbox's samples, oldest first."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._samples: deque[SandboxMetric] = deque(maxlen=MAX_SAMPLES)
        self._last: tuple[float, float] | None = None  # (when, CPU seconds) of the last sample

    def sample(self, sandbox: Sandbox) -> None:
        """Take a sample of ``sandbox`` now."""
        with self._lock:
            now = self._clock()
            usage = _usage(sandbox)
            since, before = self._last or (sandbox.started_at, 0.0)
            size = Sizes.of(sandbox)
            cpus = size.cpus
            share = min(sandbox.limits.cpus, os.cpu_count() or 1)
            busy = max((usage.cpu_seconds or 0.0) - before, 0.0) / max(now - since, 1e-3) / share
            self._samples.append(
                SandboxMetric(
                    timestamp=rfc3339(now),
                    timestamp_unix=int(now),
                    cpu_count=cpus,
                    cpu_used_pct=round(min(100.0, 100.0 * busy), 2),
                    mem_used=usage.memory,
                    mem_total=sandbox.limits.memory,
                    mem_cache=usage.cache,
                    disk_used=_disk_used(sandbox),
                    disk_total=size.disk_mib * MIB,
                )
            )
            self._last = (now, usage.cpu_seconds or 0.0)

    def within(self, start: int | None, end: int | None) -> list[SandboxMetric]:
        """The samples taken from ``start`` to ``end`` (unix seconds, both optional, inclusive)."""
        low = start if start is not None else -1
        high = end if end is not None else 2**62
        with self._lock:
            return [s for s in self._samples if low <= s.timestamp_unix <= high]


class SandboxMetrics:
    """The metrics histories of a service's sandboxes; each is dropped when its sandbox ends."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._histories: dict[str, MetricsHistory] = {}

    def read(self, sandbox: Sandbox, start: int | None, end: int | None) -> list[SandboxMetric]:
        """A new sample of a running ``sandbox`` (a paused one has none), then its samples
        from ``start`` to ``end``."""
        with self._lock:
            history = self._histories.get(sandbox.id)
            new = history is None
            if history is None:
                history = self._histories[sandbox.id] = MetricsHistory(self._clock)
        if new:
            sandbox.on_end(lambda: self._forget(sandbox.id))
        if not sandbox.pause_state.paused:
            history.sample(sandbox)
        return history.within(start, end)

    def _forget(self, sandbox_id: str) -> None:
        with self._lock:
            self._histories.pop(sandbox_id, None)


def snapshot(sandbox: Sandbox) -> SandboxMetric:
    """One sample of ``sandbox`` now, its CPU use since it started (envd's ``GET /metrics``)."""
    history = MetricsHistory()
    history.sample(sandbox)
    return history.within(None, None)[-1]


def time_range(target: str) -> tuple[int | None, int | None]:
    """The ``start`` and ``end`` (unix seconds) of a metrics request's query, each optional."""
    query = query_of(target)
    bounds: list[int | None] = []
    for name in ("start", "end"):
        value = query.get(name, "").strip()
        if value and not value.lstrip("-").isdigit():
            raise WireError(f"{name} must be a unix time in seconds")
        bounds.append(int(value) if value else None)
    return bounds[0], bounds[1]


def _usage(sandbox: Sandbox) -> GroupUsage:
    """The cgroups' figures, with the CPU time of the sandbox's processes where they count none
    (the processes' figures where the sandbox has no memory group)."""
    grouped = sandbox.cgroups.usage()
    if grouped is not None and grouped.cpu_seconds is not None:
        return grouped
    processes = _process_usage(sandbox)
    if grouped is None:
        return processes
    return attrs.evolve(grouped, cpu_seconds=processes.cpu_seconds)


def _process_usage(sandbox: Sandbox) -> GroupUsage:
    """CPU seconds and resident bytes of the sandbox's processes and their descendants."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (fields := _stat_fields(int(name))) is not None:
            parents[int(name)] = int(fields[1])
    members = {p.pid for p in sandbox.processes()}
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in members and pid not in members:
                members.add(pid)
                grew = True
    cpu, rss = 0.0, 0
    for pid in members:
        fields = _stat_fields(pid)
        if fields is not None:
            cpu += (int(fields[11]) + int(fields[12])) / _TICKS
            rss += int(fields[21]) * _PAGE
    return GroupUsage(cpu, rss, 0)


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` after the command name: state, ppid, … (``None`` once gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            text = handle.read().decode(errors="replace")
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def _disk_used(sandbox: Sandbox) -> int:
    """Bytes in the sandbox's home, ``/tmp`` and root's home (counted as root, where it has one)."""
    places = [place for place in sandbox.host_dirs if place != "/dev/shm"]
    try:
        used = call(sandbox, "usage", {"places": places}, user=sandbox.root_user)
    except (FilesFailed, OSError):
        return 0
    return used if isinstance(used, int) else 0
