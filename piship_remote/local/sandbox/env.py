"""A local sandbox's environment on the host: its directory, jail and running VM.

:func:`boot` makes one sandbox's files (a private home, ``/tmp``, ``/dev/shm``,
``/etc`` and its writable root layer on a size-capped tmpfs where the host allows it,
and root's home where the service maps root), its cgroups holding its limits, and starts its
:class:`SandboxVm`; nothing is left behind when that fails. :func:`reboot` starts a
fresh environment in an existing sandbox's jail (a filesystem-only resume); each
boot gives the sandbox a new ``/proc/sys/kernel/random/boot_id``.
:func:`remove_tree` removes such a directory again::

    layout = SandboxLayout(bwrap=bwrap, user="user", workdir="/home/user",
                           with_root=False, limits=Limits(), enforcement=enforcement)
    jail, vm = boot("ab12", "/tmp/piship-local-x/ab12", layout, network=False,
                    spawner=Spawner())
    remove_tree("/tmp/piship-local-x/ab12")
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import uuid
from collections.abc import Callable

import attrs

from piship_remote.local.isolation.bubblewrap import Jail, uid_for, write_etc
from piship_remote.local.isolation.limits import CgroupSet, Enforcement, Limits, mount_tmpfs
from piship_remote.local.isolation.mounts import mount_image_root, unmount_under
from piship_remote.local.isolation.uid_block import SandboxIds
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

    @property
    def maps_users(self) -> bool:
        """Whether the service maps its sandboxes' uids (a range of host uids each)."""
        return self.with_root or root_mappable()


def boot(
    sandbox_id: str,
    directory: str,
    layout: SandboxLayout,
    *,
    network: bool,
    spawner: Spawner,
    rootfs: str | None = None,
    ids: SandboxIds | None = None,
) -> tuple[Jail, SandboxVm]:
    """The sandbox's files, cgroups and running environment (from the image root filesystem
    ``rootfs``, else the host's ``/usr``), as the host uids ``ids`` where the service maps
    them; :class:`BootFailed` if not. Its mounts are made where its processes run (the
    spawner's mount namespace)."""
    try:
        jail = spawner.call(lambda: _jail(directory, layout, network, rootfs, ids))
        vm = _start(sandbox_id, jail, layout, spawner)
    except OSError as e:
        spawner.call(lambda: _remove(directory))
        raise BootFailed(f"the sandbox could not be started: {e}") from None
    return jail, vm


def _remove(directory: str) -> None:
    unmount_under(directory)
    remove_tree(directory)


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
    cgroups = CgroupSet.create(layout.enforcement, f"piship-{sandbox_id}", layout.limits)
    try:
        return SandboxVm.boot(jail, cgroups=cgroups, network=jail.network, spawner=spawner)
    except BaseException:
        cgroups.remove()
        raise


def _jail(
    directory: str,
    layout: SandboxLayout,
    network: bool,
    rootfs: str | None,
    ids: SandboxIds | None,
) -> Jail:
    paths = [os.path.join(directory, name) for name in ("home", "tmp", "shm", "etc")]
    own_map = layout.maps_users
    if own_map and ids is None:
        raise OSError("a sandbox whose uids the service maps needs a range of host uids")
    # bubblewrap, run as the sandbox's host uid, looks its places up: 0711 lets it.
    mode = 0o711 if own_map else 0o700
    os.mkdir(directory, mode)
    os.chmod(directory, mode)
    if layout.enforcement.disk:
        mount_tmpfs(directory, layout.limits.disk, mode=mode)
    for path in paths:
        os.mkdir(path, 0o700)
    if own_map:
        assert ids is not None
        for path in paths[:3]:  # the sandbox's user owns its places, on the host too
            give_to(path, uid_for(layout.user), ids)
    write_etc(paths[3], user=layout.user, workdir=layout.workdir, network=network)
    root_layer, overlay = _root_layer(os.path.join(directory, "layer"), rootfs, ids)
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
        root_home=make_root_home(directory, ids) if layout.with_root and ids else None,
        own_map=own_map,
        rootfs=rootfs,
        boot_id=os.path.join(directory, "boot_id"),
        ids=ids if own_map else None,
        root_layer=root_layer,
        overlay=overlay,
    )


def _root_layer(
    directory: str, rootfs: str | None, ids: SandboxIds | None
) -> tuple[str | None, tuple[str, str] | None]:
    """The sandbox's writable root in ``directory`` (on its disk): a directory of its own
    (the base template), an overlay of ``rootfs`` the service mounts (a root service), or
    the upper and work directories of the one bubblewrap mounts (a normal user's); nothing
    where the root is a capped tmpfs of bubblewrap's (the base template, a normal user's)."""
    if rootfs is None and ids is None:
        return None, None
    os.mkdir(directory, 0o711)
    if rootfs is not None and ids is not None:
        return mount_image_root(rootfs, directory, ids), None
    if rootfs is not None:
        upper, work = os.path.join(directory, "upper"), os.path.join(directory, "work")
        os.mkdir(upper, 0o755)
        os.mkdir(work, 0o700)
        return None, (upper, work)
    root = os.path.join(directory, "root")
    os.mkdir(root, 0o755)
    os.mkdir(os.path.join(root, "etc"), 0o755)  # where bubblewrap puts the /etc files
    if ids is not None:
        for path in (root, os.path.join(root, "etc")):
            give_to(path, 0, ids)  # the sandbox's root owns its /, as on E2B
    return root, None


def remove_tree(path: str) -> None:
    """Remove ``path`` even where a sandbox left read-only directories; ignore what is gone."""

    def unlock(function: Callable[..., object], failed: str, _: object) -> None:
        parent = os.path.dirname(failed)
        try:
            os.chmod(parent, os.stat(parent).st_mode | stat.S_IRWXU)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, os.stat(failed).st_mode | stat.S_IRWXU)
                if function is not os.rmdir:  # it could not be opened (mode 000): again
                    remove_tree(failed)
                    return
            function(failed)
        except OSError:
            pass

    if not os.path.lexists(path):
        return
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=unlock)
    else:
        shutil.rmtree(path, onerror=unlock)
