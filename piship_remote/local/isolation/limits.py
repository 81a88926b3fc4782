"""Per-sandbox limits of the local service: processes, memory, CPU, disk and lifetime; and
the freezer that pauses a sandbox.

Processes, memory and CPU are held by cgroups: v2 (``pids.max``, ``memory.max``,
``cpu.max``) where the host has a unified hierarchy with those controllers, else v1
(``pids``, ``memory`` and ``cpu`` hierarchies, where root can create groups; CPU as
``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``). The CPU limit is a bandwidth: a
sandbox limited to 1.5 CPUs runs at most 150 ms of every 100 ms period, over all its
processes; by default :func:`fair_share_cpus`, half the host's CPUs (at least one), so
one busy sandbox always leaves the service and the others CPU to run. A group's name
is random, never the sandbox's ID: ``/proc/<pid>/cgroup`` is readable by every user.
A paused sandbox's processes are frozen by its cgroup: v2's ``cgroup.freeze``, or the v1
``freezer`` hierarchy's ``freezer.state``. Disk is a size-capped tmpfs holding
the sandbox's home, ``/tmp`` and ``/dev/shm``, mounted by the service (root
only). What this host can enforce is found once, at start::

    limits = Limits(processes=256, memory=512 * MIB, disk=1024 * MIB, lifetime=3600)
    support = Enforcement.probe()         # what holds here, and why not
    group = CgroupSet.create(support, group_name(), limits)  # cpu.max too, where held
    group.procs_files()                   # where the sandbox's first process is written
    group.breach()                        # "memory" / "processes" after a command, or None
    check = limit_check(group, limits, [home, tmp])  # names the limit a command hit
    group.freeze(); group.thaw()          # False when this host has no freezer
    group.remove()
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import secrets
import time
from collections.abc import Callable, Sequence
from itertools import count

import attrs

__all__ = [
    "CPU_PERIOD_US",
    "DEFAULT_DISK_MIB",
    "DEFAULT_LIFETIME",
    "DEFAULT_MEMORY_MIB",
    "DEFAULT_PROCESSES",
    "MIB",
    "CgroupSet",
    "Enforcement",
    "GroupUsage",
    "Limits",
    "bind_readonly",
    "detach",
    "fair_share_cpus",
    "group_name",
    "limit_check",
    "mount_tmpfs",
]

MIB = 1024 * 1024
DEFAULT_PROCESSES = 512
DEFAULT_MEMORY_MIB = 2048
DEFAULT_DISK_MIB = 1024
DEFAULT_LIFETIME = 24 * 3600
V1_ROOT = "/sys/fs/cgroup"
REMOVE_TRIES = 50
MNT_DETACH = 2
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
FREEZE_TIMEOUT = 5.0
FREEZE_POLL = 0.005
AGENT_SUFFIX = "-agent"
V1_THAW_EVERY = 50  # freezing passes between two thaws of a v1 group that stays FREEZING
CPU_PERIOD_US = 100_000
"""The period a sandbox's CPU quota is counted over (the kernel's default)."""


def fair_share_cpus() -> float:
    """The default CPU limit of a sandbox: half this host's CPUs, at least one."""
    return max(1.0, (os.cpu_count() or 1) / 2)


def group_name() -> str:
    """A new sandbox's cgroup name: random, so ``/proc/*/cgroup`` shows no sandbox ID."""
    return f"piship-{secrets.token_hex(8)}"


@attrs.frozen
class Limits:
    """What one sandbox may use: processes, memory and disk (bytes), lifetime (seconds),
    CPUs (a bandwidth: 0.5 is half of one CPU's time)."""

    processes: int = DEFAULT_PROCESSES
    memory: int = DEFAULT_MEMORY_MIB * MIB
    disk: int = DEFAULT_DISK_MIB * MIB
    lifetime: int = DEFAULT_LIFETIME
    cpus: float = attrs.field(factory=fair_share_cpus)

    @property
    def cpu_quota_us(self) -> int:
        """The CPU time a sandbox may use per :data:`CPU_PERIOD_US`, in microseconds."""
        return max(1000, round(self.cpus * CPU_PERIOD_US))

    def __attrs_post_init__(self) -> None:
        for name in ("processes", "memory", "disk", "lifetime", "cpus"):
            if getattr(self, name) <= 0:
                raise ValueError(f"the sandbox {name} limit must be positive")


@attrs.frozen
class Enforcement:
    """Which limits this host enforces (``v1``/``v2`` cgroups, tmpfs), with reasons where not."""

    cgroup: str | None
    processes: str | None
    memory: str | None
    disk: bool
    problems: tuple[str, ...] = ()
    freezer: str | None = None
    """The v1 freezer hierarchy's group sandboxes are made under (v2 freezes in its own group)."""
    cpu: str | None = None
    """The group sandboxes' CPU groups are made under (v2: the one group; v1: in ``cpu``)."""

    @classmethod
    def probe(cls) -> Enforcement:
        """Look at this host's cgroup mounts and privileges."""
        problems: list[str] = []
        cgroup, processes, memory = _probe_v2()
        if cgroup is None:
            cgroup, processes, memory = _probe_v1()
        if processes is None:
            problems.append("the process limit is not enforced: no writable pids cgroup")
        if memory is None:
            problems.append("the memory limit is not enforced: no writable memory cgroup")
        freezer = _probe_v1_freezer() if cgroup == "v1" else None
        cpu = _probe_v2_cpu() if cgroup == "v2" else _probe_v1_cpu()
        if cpu is None:
            problems.append(
                "the CPU limit is not enforced: no writable cpu cgroup (a sandbox may use"
                " every CPU of the host)"
            )
        disk = os.geteuid() == 0 and _libc() is not None
        if not disk:
            problems.append(
                "the disk limit covers /tmp and /dev/shm only: the home is on the host's"
                " filesystem (a size-capped home needs the service to run as root)"
            )
        return cls(cgroup, processes, memory, disk, tuple(problems), freezer, cpu)

    @property
    def freezes(self) -> bool:
        """Whether a paused sandbox is frozen by its cgroup (else by stopping its processes)."""
        return self.freezer is not None or (
            self.cgroup == "v2" and (self.processes or self.memory) is not None
        )

    def held(self) -> tuple[str, ...]:
        """The limits that hold, in a fixed order."""
        names = [("processes", self.processes), ("memory", self.memory), ("cpu", self.cpu)]
        held = [name for name, base in names if base is not None]
        return (*held, "disk" if self.disk else "disk (/tmp, /dev/shm)", "lifetime")


@attrs.frozen
class GroupUsage:
    """What a sandbox uses: CPU seconds so far (``None`` where not counted), memory and page
    cache bytes."""

    cpu_seconds: float | None
    memory: int
    cache: int


@attrs.frozen
class CgroupSet:
    """One sandbox's cgroup directories (one per v1 hierarchy, or one v2 group)."""

    version: str | None
    pids: str | None
    memory: str | None
    freezer: str | None = None
    agent_memory: str | None = None
    """The v1 memory group of bubblewrap and the agent, outside the sandbox's limit: a
    command moves itself into ``memory`` as it starts (see :meth:`command_procs`), so a
    memory-limit kill hits a command, never the sandbox."""
    cpu: str | None = None
    """The group holding its CPU limit (v2: the one group)."""

    @classmethod
    def create(cls, support: Enforcement, name: str, limits: Limits) -> CgroupSet:
        """Make the groups for ``name`` and write ``limits`` into them."""
        if support.cgroup == "v2":
            return cls._create_v2(support, name, limits)
        pids = memory = None
        if support.processes is not None:
            pids = os.path.join(support.processes, name)
            os.mkdir(pids)
            _write(os.path.join(pids, "pids.max"), str(limits.processes))
        agent_memory = None
        if support.memory is not None:
            memory = os.path.join(support.memory, name)
            os.mkdir(memory)
            _write(os.path.join(memory, "memory.limit_in_bytes"), str(limits.memory))
            _write_try(os.path.join(memory, "memory.memsw.limit_in_bytes"), str(limits.memory))
            agent_memory = memory + AGENT_SUFFIX
            os.mkdir(agent_memory)
        freezer = None
        if support.freezer is not None:
            freezer = os.path.join(support.freezer, name)
            os.mkdir(freezer)
        cpu = None
        if support.cpu is not None:
            cpu = os.path.join(support.cpu, name)
            os.mkdir(cpu)
            _write_v1_cpu_quota(cpu, support.cpu, limits.cpu_quota_us)
        return cls(support.cgroup, pids, memory, freezer, agent_memory, cpu)

    @classmethod
    def _create_v2(cls, support: Enforcement, name: str, limits: Limits) -> CgroupSet:
        base = support.processes or support.memory or support.cpu
        assert base is not None
        path = os.path.join(base, name)
        os.mkdir(path)
        pids_path = path if support.processes else None
        cpu = path if support.cpu else None
        group = cls("v2", pids_path, path if support.memory else None, path, cpu=cpu)
        if group.pids:
            _write(os.path.join(path, "pids.max"), str(limits.processes))
        if group.memory:
            _write(os.path.join(path, "memory.max"), str(limits.memory))
            _write_try(os.path.join(path, "memory.swap.max"), "0")
        if cpu:
            _write(os.path.join(path, "cpu.max"), f"{limits.cpu_quota_us} {CPU_PERIOD_US}")
        return group

    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files the sandbox's first process must join."""
        first = [self.pids, self.agent_memory or self.memory, self.freezer, self.cpu]
        return [os.path.join(p, "cgroup.procs") for p in dict.fromkeys(first) if p]

    def command_procs(self) -> str | None:
        """The ``cgroup.procs`` file a command joins as it starts, where the agent's memory
        group is another (v1); ``None`` where commands are born in their group."""
        if self.agent_memory is None or self.memory is None:
            return None
        return os.path.join(self.memory, "cgroup.procs")

    def join(self, pid: int) -> None:
        """Move process ``pid`` into every group of the set."""
        for procs in self.procs_files():
            _write(procs, str(pid))

    def members(self) -> list[int]:
        """The host pids of every process in the group (empty without any group)."""
        found: dict[int, None] = {}
        for path in self._paths():
            with (
                contextlib.suppress(OSError, ValueError),
                open(os.path.join(path, "cgroup.procs"), encoding="ascii") as handle,
            ):
                found.update(dict.fromkeys(int(line) for line in handle if line.strip()))
        return list(found)

    def freeze(self) -> bool:
        """Freeze every process of the group, waiting until it is; ``False`` without a freezer."""
        return self._set_frozen(True)

    def thaw(self) -> bool:
        """Let the group's processes run again; ``False`` without a freezer."""
        return self._set_frozen(False)

    def _set_frozen(self, frozen: bool) -> bool:
        if self.version == "v2" and self.freezer is not None:
            _write(os.path.join(self.freezer, "cgroup.freeze"), "1" if frozen else "0")
            events = os.path.join(self.freezer, "cgroup.events")
            return _wait_for(lambda: _holds(events, "frozen 1" if frozen else "frozen 0"), frozen)
        if self.freezer is not None:
            return self._set_v1_frozen(self.freezer, frozen)
        return False

    @staticmethod
    def _set_v1_frozen(freezer: str, frozen: bool) -> bool:
        # A v1 cgroup whose processes fork while it freezes can stay FREEZING: the
        # new child escaped the one pass the kernel made. Writing FROZEN again makes
        # another pass, and a thaw now and then lets a stuck fork finish first.
        state_file = os.path.join(freezer, "freezer.state")
        state = "FROZEN" if frozen else "THAWED"
        passes = count()

        def settled() -> bool:
            attempt = next(passes)
            if frozen and attempt % V1_THAW_EVERY == V1_THAW_EVERY - 1:
                _write(state_file, "THAWED")
            _write(state_file, state)
            return _holds(state_file, state)

        return _wait_for(settled, frozen)

    def _paths(self) -> list[str]:
        groups = (self.pids, self.memory, self.freezer, self.agent_memory, self.cpu)
        return [p for p in dict.fromkeys(groups) if p]

    def counters(self) -> tuple[int, int]:
        """How often the process limit and the memory limit were hit so far."""
        return self._pids_hits(), self._memory_hits()

    def breach(self, before: tuple[int, int]) -> str | None:
        """``"processes"`` or ``"memory"`` when that limit was hit since ``before``."""
        pids, memory = self.counters()
        if memory > before[1]:
            return "memory"
        if pids > before[0]:
            return "processes"
        return None

    def usage(self) -> GroupUsage | None:
        """What the memory groups hold (v2: its one group, CPU time included; v1: the
        commands' group and the agent's); ``None`` without any. The memory excludes the
        page cache, given apart."""
        if self.memory is None:
            return None
        if self.version == "v2":
            memory = _number(os.path.join(self.memory, "memory.current"))
            cache = _field(os.path.join(self.memory, "memory.stat"), "file")
            usec = _field(os.path.join(self.memory, "cpu.stat"), "usage_usec")
            return GroupUsage(usec / 1e6, max(memory - cache, 0), cache)
        memory = cache = 0
        for group in filter(None, (self.memory, self.agent_memory)):
            memory += _number(os.path.join(group, "memory.usage_in_bytes"))
            cache += _field(os.path.join(group, "memory.stat"), "cache")
        return GroupUsage(None, max(memory - cache, 0), cache)

    def remove(self) -> None:
        """Remove the groups once their processes are gone (retrying briefly)."""
        for path in self._paths():
            for _ in range(REMOVE_TRIES):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)

    def _pids_hits(self) -> int:
        if self.pids is None:
            return 0
        return _field(os.path.join(self.pids, "pids.events"), "max")

    def _memory_hits(self) -> int:
        if self.memory is None:
            return 0
        if self.version == "v2":
            return _field(os.path.join(self.memory, "memory.events"), "oom_kill")
        oom = _field(os.path.join(self.memory, "memory.oom_control"), "oom_kill", missing=-1)
        return oom if oom >= 0 else _number(os.path.join(self.memory, "memory.failcnt"))


def limit_check(
    cgroups: CgroupSet, limits: Limits, places: Sequence[str]
) -> Callable[[int], str | None]:
    """What names the limit a command hit, judged by the counters' change since now.

    ``places`` are the sandbox's writable directories: one of them full means the
    disk limit was hit.
    """
    before = cgroups.counters()

    def check(exit_code: int) -> str | None:
        if exit_code == 0:
            return None
        breach = cgroups.breach(before)
        if breach == "memory":
            return (
                f"the sandbox's memory limit ({limits.memory // MIB} MiB) was reached;"
                " a process of the command was killed"
            )
        if breach == "processes":
            return (
                f"the sandbox's process limit ({limits.processes}) was reached;"
                " no more processes could be started"
            )
        if any(_full(place) for place in places):
            return f"the sandbox's disk limit ({limits.disk // MIB} MiB) is full"
        return None

    return check


def _full(path: str) -> bool:
    try:
        return os.statvfs(path).f_bavail == 0
    except OSError:
        return False


def mount_tmpfs(path: str, size: int, *, mode: int = 0o700) -> None:
    """Mount a tmpfs of ``size`` bytes at ``path`` (``nosuid``, ``nodev``: nothing a sandbox
    writes there is a set-uid program or a device on the host); ``OSError`` if refused."""
    libc = _libc()
    if libc is None:
        raise OSError("the C library cannot be loaded to mount a tmpfs")
    options = f"size={size},mode={mode:04o}".encode()
    if libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", MS_NOSUID | MS_NODEV, options) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mounting a tmpfs at {path}: {os.strerror(err)}")


def bind_readonly(source: str, target: str) -> None:
    """Bind the folder ``source`` at ``target``, read-only (checked: a bind the kernel left
    writable is detached again); ``OSError`` if refused."""
    libc = _libc()
    if libc is None:
        raise OSError("the C library cannot be loaded to bind a folder")
    flags = MS_BIND | MS_NOSUID | MS_NODEV
    if libc.mount(os.fsencode(source), os.fsencode(target), None, flags, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"binding {source} at {target}: {os.strerror(err)}")
    remount = flags | MS_REMOUNT | MS_RDONLY
    libc.mount(None, os.fsencode(target), None, remount, None)
    if not os.statvfs(target).f_flag & os.ST_RDONLY:
        libc.umount2(os.fsencode(target), MNT_DETACH)
        raise OSError(f"binding {source} at {target}: it could not be made read-only")


def detach(point: str) -> None:
    """Detach the mount at ``point``, a mount point read from the mount table (without
    asking ``os.path.ismount``, which misses a folder bound from the same filesystem)."""
    libc = _libc()
    if libc is not None:
        libc.umount2(os.fsencode(point), MNT_DETACH)


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None


def _probe_v2() -> tuple[str | None, str | None, str | None]:
    """A writable v2 group (ours) with pids/memory controllers, when the host is v2."""
    if not os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        return None, None, None
    own = _own_cgroup("")
    base = os.path.join("/sys/fs/cgroup", own.lstrip("/"))
    try:
        with open(os.path.join(base, "cgroup.subtree_control"), encoding="ascii") as handle:
            enabled = handle.read().split()
    except OSError:
        return None, None, None
    if not os.access(base, os.W_OK):
        return None, None, None
    return "v2", base if "pids" in enabled else None, base if "memory" in enabled else None


def _probe_v1() -> tuple[str | None, str | None, str | None]:
    found: dict[str, str | None] = {}
    for controller, limit in (("pids", "pids.max"), ("memory", "memory.limit_in_bytes")):
        base = os.path.join(V1_ROOT, controller, _own_cgroup(controller).lstrip("/"))
        found[controller] = None
        # The hierarchy's root has no limit file of its own; a child group will.
        root = base.rstrip("/") == os.path.join(V1_ROOT, controller)
        limited = root or os.path.exists(os.path.join(base, limit))
        if os.path.isdir(base) and os.access(base, os.W_OK) and limited:
            found[controller] = base
    if not any(found.values()):
        return None, None, None
    return "v1", found["pids"], found["memory"]


def _write_v1_cpu_quota(group: str, parent: str, quota_us: int) -> None:
    """Write the group's CPU quota; where v1 refuses one above the parent group's (the
    service's own, as in a container with a CPU limit), the parent's, which binds anyway."""
    _write(os.path.join(group, "cpu.cfs_period_us"), str(CPU_PERIOD_US))
    quota_file = os.path.join(group, "cpu.cfs_quota_us")
    try:
        _write(quota_file, str(quota_us))
    except OSError:
        parent_quota = _number(os.path.join(parent, "cpu.cfs_quota_us"))
        parent_period = _number(os.path.join(parent, "cpu.cfs_period_us")) or CPU_PERIOD_US
        if parent_quota <= 0:
            raise
        _write(quota_file, str(min(quota_us, parent_quota * CPU_PERIOD_US // parent_period)))


def _probe_v2_cpu() -> str | None:
    """This process's v2 group, when its children may have the cpu controller."""
    base = os.path.join("/sys/fs/cgroup", _own_cgroup("").lstrip("/"))
    try:
        with open(os.path.join(base, "cgroup.subtree_control"), encoding="ascii") as handle:
            enabled = handle.read().split()
    except OSError:
        return None
    return base if "cpu" in enabled and os.access(base, os.W_OK) else None


def _probe_v1_cpu() -> str | None:
    """This process's group in the v1 cpu hierarchy, when root may write it and it has CFS
    bandwidth control (``cpu.cfs_quota_us``)."""
    if not os.path.isdir(os.path.join(V1_ROOT, "cpu")):
        return None
    base = os.path.join(V1_ROOT, "cpu", _own_cgroup("cpu").lstrip("/"))
    has_quota = os.path.exists(os.path.join(base, "cpu.cfs_quota_us"))
    return base if has_quota and os.access(base, os.W_OK) else None


def _probe_v1_freezer() -> str | None:
    """This process's group in the v1 freezer hierarchy, when there is one root may write."""
    base = os.path.join(V1_ROOT, "freezer", _own_cgroup("freezer").lstrip("/"))
    if os.path.isdir(base) and os.access(base, os.W_OK):
        return base
    return None


def _own_cgroup(controller: str) -> str:
    """This process's group path in ``controller``'s hierarchy (``""`` for the v2 one)."""
    with contextlib.suppress(OSError), open("/proc/self/cgroup", encoding="utf-8") as handle:
        for line in handle:
            _, names, path = line.rstrip("\n").split(":", 2)
            if _names_controller(names, controller):
                return path
    return "/"


def _names_controller(names: str, controller: str) -> bool:
    """Whether a ``/proc/self/cgroup`` line's controller list is ``controller``'s hierarchy
    (``""``: the v2 one); ``cpu`` may share its hierarchy (``cpu,cpuacct``)."""
    if not controller:
        return names == ""
    listed = names.split(",")
    return listed == [controller] or (controller == "cpu" and controller in listed)


def _field(path: str, name: str, *, missing: int = 0) -> int:
    with contextlib.suppress(OSError, ValueError), open(path, encoding="ascii") as handle:
        for line in handle:
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    return missing


def _number(path: str) -> int:
    with contextlib.suppress(OSError, ValueError), open(path, encoding="ascii") as handle:
        return int(handle.read().strip())
    return 0


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="ascii") as handle:
        handle.write(value)


def _write_try(path: str, value: str) -> None:
    with contextlib.suppress(OSError):
        _write(path, value)


def _holds(path: str, text: str) -> bool:
    with contextlib.suppress(OSError), open(path, encoding="ascii") as handle:
        return text in handle.read()
    return False


def _wait_for(settled: Callable[[], bool], frozen: bool) -> bool:
    deadline = time.monotonic() + FREEZE_TIMEOUT
    while time.monotonic() < deadline:
        if settled():
            return True
        time.sleep(FREEZE_POLL)
    raise OSError(f"the sandbox's processes did not {'freeze' if frozen else 'thaw'} in time")
