"""A local sandbox's environment on the host: its directory, jail and running VM.

:func:`boot` makes one sandbox's files (a private home, ``/tmp``, ``/dev/shm``,
``/etc`` and its writable root layer on a size-capped tmpfs where the host allows it,
and root's home where the service maps root), its cgroups holding its limits, and starts its
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
import shutil
import uuid

import attrs

from piship_remote.local.isolation.bubblewrap import Jail, uid_for, write_etc
from piship_remote.local.isolation.limits import (
    CgroupSet,
    Enforcement,
    Limits,
    group_name,
    mount_tmpfs,
)
from piship_remote.local.isolation.mounts import (
    LayerSpace,
    OwnerMaps,
    mount_image_root,
    unmount_under,
)
from piship_remote.local.isolation.python_env import PythonEnv
from piship_remote.local.isolation.trees import remove_tree
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
    python_env: PythonEnv | None = None
    owner_maps: OwnerMaps = attrs.field(factory=OwnerMaps, eq=False)
    """How image templates are shown as each sandbox root's (closed with the service)."""

    @property
    def maps_users(self) -> bool:
        """Whether the service maps its sandboxes' uids (a range of host uids each)."""
        return self.with_root or root_mappable()

    @property
    def root_uid(self) -> int:
        """The sandbox uid that owns its root filesystem: root's, where it has one."""
        return 0 if self.with_root else uid_for(self.user)


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
    jail: Jail | None = None
    try:
        jail = spawner.call(lambda: _jail(directory, layout, network, rootfs, ids))
        vm = _start(sandbox_id, jail, layout, spawner)
    except BaseException as e:  # whatever broke, nothing of the sandbox stays mounted
        if jail is not None and jail.layer_space is not None:
            jail.layer_space.close()
        spawner.call(lambda: _remove(directory))
        if isinstance(e, OSError):
            raise BootFailed(f"the sandbox could not be started: {e}") from None
        raise
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
    cgroups = CgroupSet.create(layout.enforcement, group_name(), layout.limits)
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
    owner = None if ids is None else ids.host(layout.root_uid)
    layer = os.path.join(directory, "layer")
    root_layer, overlay, upper = _root_layer(layer, rootfs, owner, paths[3], layout)
    space = None
    if overlay is not None:
        space = LayerSpace.open(os.path.dirname(overlay[0]), size=layout.limits.disk)
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
        python_env=layout.python_env,
        ids=ids if own_map else None,
        root_layer=root_layer,
        overlay=overlay,
        etc_in_root=root_layer is not None,
        layer=upper,
        layer_space=space,
    )


def _root_layer(
    directory: str, rootfs: str | None, owner: int | None, etc: str, layout: SandboxLayout
) -> tuple[str | None, tuple[str, str] | None, str | None]:
    """The sandbox's writable root in ``directory`` (on its disk): a directory of its own
    (the base template) or an overlay of ``rootfs`` the service mounts, both the host uid
    ``owner``'s (its root, a root service's sandbox) with the ``/etc`` files of ``etc`` in
    place; or the upper and work directories of the overlay bubblewrap mounts (a normal
    user's, made on a capped tmpfs at ``directory`` as the sandbox starts, see
    :class:`~piship_remote.local.isolation.mounts.LayerSpace`); nothing where the
    root is a capped tmpfs of bubblewrap's (``base``, a normal user's). Then the overlay's
    upper layer, where there is one."""
    if rootfs is None and owner is None:
        return None, None, None
    os.mkdir(directory, 0o711)
    if owner is None:
        upper, work = os.path.join(directory, "upper"), os.path.join(directory, "work")
        return None, (upper, work), upper
    top = os.path.join(directory, "root" if rootfs is None else "upper")
    os.mkdir(top, 0o755)
    _place_etc(top, etc, owner)
    if rootfs is None:  # what bubblewrap would make (as the sandbox's user) root's
        for place in ("run", "run/piship", "etc/ssl", *_parents(layout.workdir)):
            os.mkdir(os.path.join(top, place), 0o755)
            os.chown(os.path.join(top, place), owner, owner)
        return top, None, None
    return mount_image_root(rootfs, directory, owner, layout.owner_maps), None, top


def _parents(path: str) -> list[str]:
    """The relative parents of absolute ``path``, outermost first (``a``, ``a/b`` of
    ``/a/b/c``)."""
    parts = path.strip("/").split("/")[:-1]
    return ["/".join(parts[: n + 1]) for n in range(len(parts))]


def _place_etc(top: str, etc: str, owner: int) -> None:
    """Copy the ``/etc`` files into layer ``top`` (fresh, the service's alone), all of them
    ``owner``'s: the sandbox's root owns its ``/`` and ``/etc``, as on E2B."""
    target = os.path.join(top, "etc")
    os.mkdir(target, 0o755)
    for name in os.listdir(etc):
        shutil.copyfile(os.path.join(etc, name), os.path.join(target, name))
        os.chmod(os.path.join(target, name), 0o644)
        os.chown(os.path.join(target, name), owner, owner)
    for path in (top, target):
        os.chown(path, owner, owner)
