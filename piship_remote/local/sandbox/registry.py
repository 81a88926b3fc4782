"""The local service's sandboxes: their environments, files, processes and lifetimes.

A :class:`Registry` creates sandboxes (a :class:`SandboxVm` each, with a private
home, ``/tmp``, ``/dev/shm`` and writable root layer on a size-capped tmpfs under one
service directory, cgroups holding its limits, and, where the service maps them, a
range of host uids of its own), finds them, renews and deletes them. A
``piship-local-reaper`` thread deletes each sandbox when its lifetime ends (or pauses
one created with ``auto_pause``). Deleting ends every process of the sandbox, removes
its files, then frees its host uids::

    registry = Registry(root, bwrap=find_bwrap(), workdir="/home/user", user="user",
                        limits=Limits(), enforcement=Enforcement.probe())
    sandbox = registry.create(template="base", lifetime=300, network=NetworkOptions(), env_vars={})
    process = sandbox.start(ProcessConfig(cmd="/bin/bash", args=["-c", "id"]), tag="t1")
    registry.pause(sandbox.id); registry.resume(sandbox.id, 300)
    fork = registry.fork(sandbox.id, 300)           # a new sandbox with a copy of its files
    snapshot = registry.snapshot(sandbox.id, "app")  # a copy kept; its ID is a template
    # (both made by the sandboxes' agents: see snapshots.py)
    registry.delete(sandbox.id)
    registry.close()

A paused sandbox (its processes frozen, see :mod:`piship_remote.local.sandbox.pause`) is
found by :meth:`Registry.lookup` but not by :meth:`Registry.get`, so envd does not
serve it (unless it was created with ``auto_resume``: ``get`` then resumes it); its
lifetime stops until it is resumed with a new one. A filesystem-only pause
(``memory=False``) is resumed by rebooting the sandbox: its files kept, a fresh
environment. One sandbox itself (its processes,
ports and end) is a :class:`~piship_remote.local.sandbox.instance.Sandbox`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping

import attrs

from piship_remote.local.isolation.bubblewrap import Jail
from piship_remote.local.isolation.egress import rules_problem
from piship_remote.local.isolation.limits import Enforcement, Limits
from piship_remote.local.isolation.mounts import unmount_under
from piship_remote.local.isolation.network import egress_problem
from piship_remote.local.isolation.process import REAP_TIMEOUT
from piship_remote.local.isolation.python_env import PythonEnv
from piship_remote.local.isolation.uid_block import SandboxIds, UidBlock
from piship_remote.local.isolation.user_map import SandboxUsers, root_mappable
from piship_remote.local.sandbox.env import BootFailed, SandboxLayout, boot, reboot, remove_tree
from piship_remote.local.sandbox.instance import Sandbox, SandboxGone, StartRefused, Wanted
from piship_remote.local.sandbox.network_options import NetworkOptions
from piship_remote.local.sandbox.snapshots import (
    DEFAULT_SNAPSHOT_BUDGET,
    CopyFailed,
    Snapshot,
    SnapshotBudgetExceeded,
    SnapshotStore,
    TooManySnapshots,
    copied_places,
    exporter,
    fork_files,
    unpack,
)
from piship_remote.local.sandbox.templates import DEFAULT_TEMPLATE
from piship_remote.local.sandbox.vm import SandboxVm, Spawner

__all__ = [
    "CopyFailed",
    "Registry",
    "Sandbox",
    "SandboxGone",
    "SandboxUnavailable",
    "Snapshot",
    "SnapshotBudgetExceeded",
    "StartRefused",
    "TooManySandboxes",
    "TooManySnapshots",
    "UnknownTemplate",
    "Wanted",
    "remove_tree",
]


class SandboxUnavailable(SandboxGone):
    """A sandbox cannot be created as asked here (the message says what to install or fix)."""


class TooManySandboxes(Exception):
    """The service already runs its maximum number of sandboxes."""


class UnknownTemplate(LookupError):
    """The service offers no template of that name."""


class Registry:
    """All sandboxes of one service, and the reaper thread that ends their lifetimes."""

    def __init__(
        self,
        root: str,
        *,
        bwrap: str,
        workdir: str,
        user: str,
        max_sandboxes: int = 20,
        limits: Limits | None = None,
        enforcement: Enforcement | None = None,
        clock: Callable[[], float] = time.monotonic,
        with_root: bool | None = None,
        templates: Mapping[str, str | None] | None = None,
        snapshot_budget: int = DEFAULT_SNAPSHOT_BUDGET,
        python_env: PythonEnv | None = None,
        spawner: Spawner | None = None,
    ) -> None:
        self.templates = dict(templates or {DEFAULT_TEMPLATE: None})
        """Each template's root filesystem (``None``: the host's ``/usr``)."""
        self.snapshots = SnapshotStore(os.path.join(root, "snapshots"), budget=snapshot_budget)
        """The snapshots taken, each a template too (by its ID)."""
        mapped = root_mappable() if with_root is None else with_root
        self.users = SandboxUsers.of(user=user, workdir=workdir, root=mapped)  # who may run
        self.root = root
        self.limits = limits or Limits()
        self.enforcement = enforcement or Enforcement.probe()
        self.max_lifetime = self.limits.lifetime
        self._layout = SandboxLayout(
            bwrap=bwrap,
            user=user,
            workdir=workdir,
            with_root=self.users.root is not None,
            limits=self.limits,
            enforcement=self.enforcement,
            python_env=python_env,
        )
        self._max = max_sandboxes
        self.clock = clock
        self._sandboxes: dict[str, Sandbox] = {}
        self._booting = 0
        self._changed = threading.Condition()
        self._resuming = threading.Lock()  # one resume at a time: a reboot is not repeated
        self._closed = False
        self._spawner = spawner or Spawner()
        self._uids = UidBlock()  # a range of host uids per sandbox, where the service maps them
        self._ids: dict[str, SandboxIds] = {}
        self._reaper = threading.Thread(target=self._reap, name="piship-local-reaper", daemon=True)
        self._reaper.start()

    def create(
        self,
        *,
        template: str,
        lifetime: int,
        network: NetworkOptions,
        env_vars: Mapping[str, str],
        metadata: Mapping[str, str] | None = None,
        auto_pause: bool = False,
        auto_resume: bool = False,
        auto_pause_memory: bool = True,
    ) -> Sandbox:
        """A new sandbox living ``lifetime`` seconds, then paused (``auto_pause``) or deleted.

        ``template`` is one of :attr:`templates` or a snapshot's ID (the sandbox then
        starts with the snapshot's files). :class:`UnknownTemplate` if it is neither;
        :class:`TooManySandboxes` at the limit; :class:`SandboxUnavailable` when
        its environment cannot be made here (network asked for and no user-mode
        stack installed, egress rules that cannot be held, or the sandbox would not start).
        """
        snapshot = None if template in self.templates else self.snapshots.get(template)
        if template not in self.templates and snapshot is None:
            raise UnknownTemplate(template)
        wanted = Wanted(
            template=template,
            image=template if snapshot is None else snapshot.template,
            network=network.egress.reaches_out,
            env_vars=dict(env_vars),
            metadata=dict(metadata or {}),
            auto_pause=auto_pause,
            auto_resume=auto_resume,
            auto_pause_memory=auto_pause_memory,
            options=network,
        )
        if snapshot is None:
            return self._create(wanted, lifetime, None)
        return self._create(wanted, lifetime, lambda sandbox: unpack(snapshot, sandbox))

    def fork(self, sandbox_id: str, lifetime: int) -> Sandbox | None:
        """A new sandbox made as ``sandbox_id`` was, with a copy of its files now
        (``None`` if it is unknown); what :meth:`create` raises."""
        source = self.lookup(sandbox_id)
        if source is None:
            return None
        wanted = attrs.evolve(source.wanted, options=source.options)
        return self._create(wanted, lifetime, lambda sandbox: fork_files(source, sandbox))

    def snapshot(self, sandbox_id: str, name: str | None) -> Snapshot | None:
        """A snapshot of the sandbox's files now (``None`` if it is unknown).

        :class:`CopyFailed` when they cannot be copied, :class:`TooManySnapshots` at the
        limit, :class:`SnapshotBudgetExceeded` past the service's snapshot disk budget.
        """
        source = self.lookup(sandbox_id)
        if source is None:
            return None
        return self.snapshots.take(
            exporter(source),
            places=copied_places(source),
            template=source.wanted.image,
            source=source.id,
            name=name,
        )

    def _create(
        self, wanted: Wanted, lifetime: int, seed: Callable[[Sandbox], None] | None
    ) -> Sandbox:
        """Boot a sandbox as ``wanted``, its places filled by ``seed`` (a copy's import)."""
        problem = egress_problem() if wanted.network else None
        if problem is None and wanted.network and wanted.options.egress.filtered:
            problem = rules_problem()
        if problem is not None:
            raise SandboxUnavailable(problem)
        sandbox_id = secrets.token_hex(10)
        # Not named after the ID: its path is in the mount table and bubblewrap's command
        # line, which every user of the host can read.
        directory = os.path.join(self.root, secrets.token_hex(8))
        with self._changed:
            if self._closed:
                raise SandboxGone("the local sandbox service stopped")
            if len(self._sandboxes) + self._booting >= self._max:
                raise TooManySandboxes(f"the local service runs at most {self._max} sandboxes")
            self._booting += 1
        try:
            jail, vm = self._boot(sandbox_id, directory, wanted)
        finally:
            with self._changed:
                self._booting -= 1
        sandbox = Sandbox(
            sandbox_id,
            jail=jail,
            vm=vm,
            limits=self.limits,
            root=directory,
            wanted=wanted,
            expires_at=self._expiry(lifetime),
            ends_at=time.time() + self._bounded(lifetime),
            lifetime=lifetime,
        )
        try:
            if wanted.network and wanted.options.egress.filtered:
                sandbox.hold_egress()
        except OSError as e:
            sandbox.destroy("the sandbox's egress rules could not be held")
            raise SandboxUnavailable(str(e)) from None
        try:
            if seed is not None:
                seed(sandbox)
        except BaseException as e:  # a copy that broke in any way leaves no sandbox running
            self._end(sandbox, "the sandbox's files could not be copied")
            if not isinstance(e, (CopyFailed, OSError)):
                raise
            unreached = "the sandbox's files could not be copied: its agent could not be reached"
            reason = str(e) if isinstance(e, CopyFailed) else unreached
            raise SandboxUnavailable(self._without_host_paths(reason)) from None
        with self._changed:
            if self._closed:
                closed = True
            else:
                closed = False
                self._sandboxes[sandbox_id] = sandbox
                self._changed.notify_all()
        if closed:
            self._end(sandbox, "stopped")
            raise SandboxGone("the local sandbox service stopped")
        return sandbox

    def _boot(self, sandbox_id: str, directory: str, wanted: Wanted) -> tuple[Jail, SandboxVm]:
        """Boot the sandbox as its own range of host uids (where the service maps them)."""
        try:
            ids = self._uids.take() if self._layout.maps_users else None
        except OSError as e:
            raise SandboxUnavailable(str(e)) from None
        try:
            jail, vm = boot(
                sandbox_id,
                directory,
                self._layout,
                network=wanted.network,
                spawner=self._spawner,
                rootfs=self.templates[wanted.image],
                ids=ids,
            )
        except BaseException as e:
            if ids is not None:
                self._uids.give_back(ids)
            if isinstance(e, BootFailed):
                raise SandboxUnavailable(self._without_host_paths(str(e))) from None
            raise
        if ids is not None:
            with self._changed:
                self._ids[sandbox_id] = ids
        return jail, vm

    def _end(self, sandbox: Sandbox, reason: str) -> None:
        """Destroy ``sandbox``, then free its host uids once nothing of it can use them."""
        try:
            sandbox.destroy(reason)
        finally:
            with self._changed:
                ids = self._ids.pop(sandbox.id, None)
            if ids is not None:
                self._uids.give_back(ids)

    def _without_host_paths(self, message: str) -> str:
        """``message`` with the service's directory (and so any sandbox's) left out: the
        client is told what failed, never where on the host."""
        return message.replace(self.root, "<service directory>")

    def get(self, sandbox_id: str) -> Sandbox | None:
        """The running sandbox ``sandbox_id``, if any (a paused one is not served).

        A paused sandbox created with ``auto_resume`` is resumed to live its create
        lifetime again, and served.
        """
        sandbox = self.lookup(sandbox_id)
        if sandbox is not None and sandbox.pause_state.paused and sandbox.auto_resume:
            with contextlib.suppress(OSError):
                self.resume(sandbox_id, sandbox.lifetime)
        return None if sandbox is None or sandbox.pause_state.paused else sandbox

    def lookup(self, sandbox_id: str) -> Sandbox | None:
        """The sandbox ``sandbox_id``, running or paused, if any."""
        with self._changed:
            return self._sandboxes.get(sandbox_id)

    def pause(self, sandbox_id: str, *, memory: bool = True) -> bool | None:
        """Freeze the sandbox; ``False`` if it is paused already, ``None`` if unknown.

        A paused sandbox's lifetime stops: it is kept (up to the service's maximum
        lifetime) until it is resumed with a new one, or deleted. Without ``memory``
        (a filesystem-only pause) only its files are kept: resuming reboots it.
        """
        sandbox = self.lookup(sandbox_id)
        if sandbox is None:
            return None
        if not sandbox.pause_state.pause():
            return False if self.lookup(sandbox_id) is sandbox else None
        sandbox.reboots_on_resume = not memory
        self.set_lifetime(sandbox_id, self.max_lifetime)
        return True

    def resume(self, sandbox_id: str, seconds: int, *, memory: bool = True) -> bool | None:
        """Thaw the sandbox to live ``seconds`` more; without ``memory``, or after a
        filesystem-only pause, reboot it instead (its files kept, nothing of what ran).

        ``False`` if it was running, ``None`` if unknown; ``OSError`` when it could not be
        resumed (a sandbox that could not be rebooted is deleted).
        """
        sandbox = self.lookup(sandbox_id)
        if sandbox is None:
            return None
        with self._resuming:
            if not sandbox.pause_state.paused:
                return False
            if memory and not sandbox.reboots_on_resume:
                sandbox.pause_state.resume()
            else:
                self._reboot(sandbox)
        self.set_lifetime(sandbox_id, seconds)
        return True

    def _reboot(self, sandbox: Sandbox) -> None:
        try:
            spawner, layout = self._spawner, self._layout
            holding = sandbox.held_egress()
            sandbox.reboot(lambda jail: holding(reboot(sandbox.id, jail, layout, spawner=spawner)))
        except BootFailed as e:
            self.delete(sandbox.id, "the sandbox could not be rebooted")
            raise OSError(str(e)) from None

    def ids(self) -> list[str]:
        """The live sandboxes' IDs."""
        with self._changed:
            return list(self._sandboxes)

    def set_lifetime(self, sandbox_id: str, seconds: int, *, extend_only: bool = False) -> bool:
        """Let the sandbox live ``seconds`` from now (never shorter with ``extend_only``)."""
        with self._changed:
            sandbox = self._sandboxes.get(sandbox_id)
            if sandbox is None:
                return False
            expiry = self._expiry(seconds)
            if extend_only and expiry <= sandbox.expires_at:
                return True
            sandbox.expires_at = expiry
            sandbox.ends_at = time.time() + self._bounded(seconds)
            self._changed.notify_all()
            return True

    def delete(self, sandbox_id: str, reason: str = "deleted") -> bool:
        """Kill the sandbox's processes and remove its files; ``False`` if it is unknown."""
        with self._changed:
            sandbox = self._sandboxes.pop(sandbox_id, None)
        if sandbox is None:
            return False
        self._end(sandbox, reason)
        return True

    def close(self) -> None:
        """Delete every sandbox, stop the reaper, and remove the service directory."""
        with self._changed:
            self._closed = True
            sandboxes = list(self._sandboxes.values())
            self._sandboxes.clear()
            self._changed.notify_all()
        for sandbox in sandboxes:
            with contextlib.suppress(Exception):  # one sandbox's failure spares the rest
                self._end(sandbox, "stopped")
        if self._reaper is not threading.current_thread():
            self._reaper.join(REAP_TIMEOUT)
        self._spawner.close()
        unmount_under(self.root)  # a destroy that failed midway; a lent Python
        remove_tree(self.root)
        self._uids.close()
        self._layout.owner_maps.close()

    def _expiry(self, seconds: int) -> float:
        return self.clock() + self._bounded(seconds)

    def _bounded(self, seconds: int) -> int:
        return min(max(seconds, 0), self.max_lifetime)

    def _reap(self) -> None:
        while True:
            with self._changed:
                if self._closed:
                    return
                expired = self._expired()
                if not expired:
                    self._changed.wait(self._next_wait())
                    continue
            for sandbox_id in expired:
                self._expire(sandbox_id)

    def _expire(self, sandbox_id: str) -> None:
        """End an expired sandbox's lifetime: pause it if it asked for that, else delete it."""
        with self._changed:
            sandbox = self._sandboxes.get(sandbox_id)
            if sandbox is None or sandbox.expires_at > self.clock():
                return  # deleted or renewed meanwhile
        if sandbox.auto_pause and not sandbox.pause_state.paused:
            with contextlib.suppress(OSError):
                if self.pause(sandbox_id, memory=sandbox.wanted.auto_pause_memory):
                    return
        self.delete(sandbox_id, "expired")

    def _expired(self) -> list[str]:
        now = self.clock()
        return [s.id for s in self._sandboxes.values() if s.expires_at <= now]

    def _next_wait(self) -> float | None:
        if not self._sandboxes:
            return None
        earliest = min(s.expires_at for s in self._sandboxes.values())
        return max(earliest - self.clock(), 0.0)
