"""A local sandbox's environment on the host: its directory, jail and running VM.

:func:`boot` makes one sandbox's files (a private home, ``/tmp``, ``/dev/shm`` and
``/etc`` on a size-capped tmpfs where the host allows it, and root's home where
the service maps root), its cgroups holding its limits, and starts its
:class:`SandboxVm`; nothing is left behind when that fails. :func:`reboot` starts a
fresh environment in an existing sandbox's jail (a filesystem-only resume); each
boot gives the sandbox a new ``/proc/sys/kernel/random/boot_id``.
:func:`remove_tree` (see :mod:`~piship_remote.local.isolation.trees`) removes such a
directory again, at any depth::

    layout = SandboxLayout(bwrap=bwrap, user="user", workdir="/home/user",
                           with_root=False, limits=Limits(), enforcement=enforcement)
    jail, vm = boot("ab12", "/tmp/piship-local-x/ab12", layout, network=False,
                    spawner=Spawner())
    remove_tree("/tmp/piship-local-x/ab12")
"""

from __future__ import annotations

import os
import uuid

import attrs

from piship_remote.local.isolation.bubblewrap import Jail, uid_for, write_etc
from piship_remote.local.isolation.limits import (
    CgroupSet,
    Enforcement,
    Limits,
    group_name,
    mount_tmpfs,
    unmount,
)
from piship_remote.local.isolation.python_env import PythonEnv
from piship_remote.local.isolation.trees import remove_tree
from piship_remote.local.isolation.user_map import give_to, make_root_home, root_mappable
from piship_remote.local.sandbox.vm import SandboxVm, Spawner

__all__ = ["BootFailed", "SandboxLayout", "boot", "reboot", "remove_tree"]


class BootFailed(Exception):
    """The sandbox's environment could not be made (the message says why)."""


@attrs.frozen
class SandboxLayout:
    """What every sandbox of one service is made with: the bwrap binary, its user and
    home, whether root is mapped beside that user, its limits and how they are enforced."""

    bwrap: str
    user: str
    workdir: str
    with_root: bool
    limits: Limits
    enforcement: Enforcement
    python_env: PythonEnv | None = None


def boot(
    sandbox_id: str,
    directory: str,
    layout: SandboxLayout,
    *,
    network: bool,
    spawner: Spawner,
    rootfs: str | None = None,
) -> tuple[Jail, SandboxVm]:
    """The sandbox's files, cgroups and running environment (from the image root filesystem
    ``rootfs``, else the host's ``/usr``); :class:`BootFailed` if not."""
    try:
        jail = _jail(directory, layout, network, rootfs)
        vm = _start(sandbox_id, jail, layout, spawner)
    except BaseException as e:  # whatever broke, nothing of the sandbox stays mounted
        unmount(directory)
        remove_tree(directory)
        if isinstance(e, OSError):
            raise BootFailed(f"the sandbox could not be started: {e}") from None
        raise
    return jail, vm


def reboot(sandbox_id: str, jail: Jail, layout: SandboxLayout, *, spawner: Spawner) -> SandboxVm:
    """A fresh environment in an existing sandbox's jail: its files kept, nothing of what ran,
    a new boot id. The old environment must be closed first; :class:`BootFailed` if not."""
    try:
        return _start(sandbox_id, jail, layout, spawner)
    except OSError as e:
        raise BootFailed(f"the sandbox could not be restarted: {e}") from None


def _start(sandbox_id: str, jail: Jail, layout: SandboxLayout, spawner: Spawner) -> SandboxVm:
    if jail.boot_id is not None:
        with open(jail.boot_id, "w", encoding="ascii") as handle:
            handle.write(f"{uuid.uuid4()}\n")
    cgroups = CgroupSet.create(layout.enforcement, group_name(), layout.limits)
    try:
        return SandboxVm.boot(jail, cgroups=cgroups, network=jail.network, spawner=spawner)
    except BaseException:
        cgroups.remove()
        raise


def _jail(directory: str, layout: SandboxLayout, network: bool, rootfs: str | None) -> Jail:
    paths = [os.path.join(directory, name) for name in ("home", "tmp", "shm", "etc")]
    own_map = layout.with_root or root_mappable()
    # bubblewrap, run as the sandbox's host uid, looks its places up: 0711 lets it.
    mode = 0o711 if own_map else 0o700
    os.mkdir(directory, mode)
    os.chmod(directory, mode)
    if layout.enforcement.disk:
        mount_tmpfs(directory, layout.limits.disk, mode=mode)
    for path in paths:
        os.mkdir(path, 0o700)
    if own_map:
        for path in paths[:3]:  # the sandbox's user owns its places, on the host too
            give_to(path, uid_for(layout.user))
    write_etc(paths[3], user=layout.user, workdir=layout.workdir, network=network)
    return Jail(
        bwrap=layout.bwrap,
        home=paths[0],
        tmp=paths[1],
        shm=paths[2],
        etc=paths[3],
        workdir=layout.workdir,
        user=layout.user,
        network=network,
        scratch_size=None if layout.enforcement.disk else layout.limits.disk,
        root_home=make_root_home(directory) if layout.with_root else None,
        own_map=own_map,
        rootfs=rootfs,
        boot_id=os.path.join(directory, "boot_id"),
        python_env=layout.python_env,
    )
