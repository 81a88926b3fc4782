"""The local service's own mounts: where they live, how a sandbox's writable root is made,
and how they are taken down.

Where the service runs as host root it mounts (a size-capped tmpfs per sandbox, an image
template's layers) in a mount namespace of its own, entered by the thread that starts
sandboxes (see :class:`~piship_remote.local.sandbox.vm.Spawner`) and inherited by every
thread and process it starts. Its propagation from the host is one-way (``MS_SLAVE``): the
host sees none of these mounts, so a killed service leaves none (the kernel tears the
namespace down with its last process) and its tmpfs data goes with them.

An image template's files belong to
:data:`~piship_remote.local.isolation.uid_block.TEMPLATE_OWNER`, which no sandbox maps. A
sandbox sees them through an *idmapped* mount of the template that shows them as its own
root's, under an overlay whose upper layer lies on the sandbox's capped tmpfs: its writes
stay its own and count against its disk cap, and the template never changes::

    enter_private_namespace()                       # on the spawner thread, root only
    maps = OwnerMaps()                              # the service's, closed at its end
    mount_image_root(template, layer_dir, owner, maps)  # <layer_dir>/root: the writable root
    unmount_under("/tmp/piship-local-123-x/ab12")   # every mount there, deepest first
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import subprocess
import sys
import threading
from collections.abc import Sequence

from piship_remote.local.isolation.host_python import find_python
from piship_remote.local.isolation.limits import detach
from piship_remote.local.isolation.trees import mounts_below
from piship_remote.local.isolation.uid_block import TEMPLATE_OWNER

__all__ = [
    "LayerSpace",
    "OwnerMaps",
    "enter_private_namespace",
    "mount_image_root",
    "unmount_under",
]

CLONE_NEWNS = 0x00020000
MS_REC = 0x4000
MS_SLAVE = 1 << 19
MS_NOSUID = 2
MS_NODEV = 4
AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_IDMAP = 0x100000
# The generic syscall numbers (the same on x86_64 and aarch64) of the new mount API.
SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
SYS_MOUNT_SETATTR = 442
USERNS_TIMEOUT = 10.0
# A process in a new user namespace of its own: says so, then waits to be killed.
_HOLD_USERNS = (
    "import ctypes,sys\n"
    "if ctypes.CDLL(None,use_errno=True).unshare(0x10000000)!=0: sys.exit(1)\n"
    "sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.read()\n"
)


# Becomes the user's own root in a user and mount namespace of its own, mounts a tmpfs of
# argv[2] bytes at argv[1] holding "upper" and "work", says so, then holds them until its
# input ends (the service closed it, or died).
_HOLD_LAYER = (
    "import ctypes,os,sys\n"
    "libc=ctypes.CDLL(None,use_errno=True)\n"
    "def fail(what): sys.exit(f'{what}: {os.strerror(ctypes.get_errno())}')\n"
    "uid,gid=os.geteuid(),os.getegid()\n"
    "if libc.unshare(0x10000000|0x20000)!=0: fail('no namespace for the sandbox layer')\n"
    "for n,t in (('setgroups','deny'),('uid_map',f'{uid} {uid} 1'),('gid_map',f'{gid} {gid} 1')):\n"
    "  with open('/proc/self/'+n,'w') as f: f.write(t)\n"
    "d,size=sys.argv[1],sys.argv[2]\n"
    "if libc.mount(b'tmpfs',os.fsencode(d),b'tmpfs',6,f'size={size},mode=0700'.encode())!=0:\n"
    "  fail('the sandbox layer could not be mounted')\n"
    "os.mkdir(d+'/upper',0o755); os.mkdir(d+'/work',0o700)\n"
    "sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.read()\n"
)
# Joins the namespaces process argv[1] holds, then runs argv[2:].
_ENTER_LAYER = (
    "import ctypes,os,sys\n"
    "libc=ctypes.CDLL(None,use_errno=True)\n"
    "for ns,flag in (('user',0x10000000),('mnt',0x20000)):\n"
    "  fd=os.open(f'/proc/{sys.argv[1]}/ns/{ns}',os.O_RDONLY)\n"
    "  if libc.setns(fd,flag)!=0:\n"
    "    sys.exit(f'the sandbox layer could not be reached: {os.strerror(ctypes.get_errno())}')\n"
    "  os.close(fd)\n"
    "os.execv(sys.argv[2],sys.argv[2:])\n"
)


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _checked(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def enter_private_namespace() -> None:
    """Move the calling thread (and what it starts from now on) into a new mount namespace
    whose mounts never reach the host's; ``OSError`` if it cannot."""
    libc = _libc()
    _checked(libc.unshare(CLONE_NEWNS), "unsharing the mount namespace")
    _checked(libc.mount(None, b"/", None, MS_REC | MS_SLAVE, None), "making mounts one-way")


class OwnerMaps:
    """The user namespaces that show :data:`TEMPLATE_OWNER`'s files as another host uid's
    (an idmapped mount's map), one per uid, each made once (by a helper process) and kept
    until :meth:`close`."""

    def __init__(self) -> None:
        self._namespaces: dict[int, int] = {}  # host uid -> its namespace's descriptor
        self._lock = threading.Lock()

    def showing_as(self, owner: int) -> int:
        """The descriptor of the namespace mapping :data:`TEMPLATE_OWNER` onto ``owner``."""
        with self._lock:
            if owner not in self._namespaces:
                self._namespaces[owner] = _mapping_namespace(f"{TEMPLATE_OWNER} {owner} 1\n")
            return self._namespaces[owner]

    def close(self) -> None:
        with self._lock:
            namespaces, self._namespaces = list(self._namespaces.values()), {}
        for fd in namespaces:
            os.close(fd)


def mount_image_root(template: str, directory: str, owner: int, maps: OwnerMaps) -> str:
    """Mount the sandbox's writable root over image ``template`` in ``directory`` (on its
    capped tmpfs), the template's files shown as host uid ``owner``'s (the sandbox's root,
    through ``maps``); return the mount's path (``<directory>/root``).
    ``<directory>/upper``, the sandbox's layer, is the caller's to make first."""
    paths = {name: os.path.join(directory, name) for name in ("lower", "upper", "work", "root")}
    for name in ("lower", "work", "root"):
        os.mkdir(paths[name], 0o700 if name == "work" else 0o755)
    _idmapped_clone(template, paths["lower"], maps.showing_as(owner))
    options = ",".join(
        (f"lowerdir={paths['lower']}", f"upperdir={paths['upper']}", f"workdir={paths['work']}")
    )
    result = _libc().mount(
        b"overlay", os.fsencode(paths["root"]), b"overlay", MS_NOSUID | MS_NODEV, options.encode()
    )
    _checked(result, f"mounting the sandbox's root filesystem over {os.path.basename(template)}")
    return paths["root"]


class LayerSpace:
    """A tmpfs of ``size`` bytes at ``directory`` holding ``upper`` and ``work``: the overlay
    layer of an image sandbox whose service cannot mount, capped as the service's own mounts
    cap it elsewhere, and kept across the sandbox's reboots.

    It lives in a user and mount namespace of its own (the service user is its own there,
    nothing more), held by a helper process until :meth:`close` (or the service's end): only
    the bubblewraps :meth:`command` runs there see it; the host's directory stays empty::

        space = LayerSpace.open(directory, size=16 * 2**20)
        argv = space.command(["/proc/self/fd/5", "--args", "6", "--", ...])
        space.close()
    """

    def __init__(self, holder: subprocess.Popen[bytes]) -> None:
        self._holder = holder

    @classmethod
    def open(cls, directory: str, *, size: int) -> LayerSpace:
        """Make the space; ``OSError`` saying why when it cannot be made."""
        argv = [find_python(), "-I", "-S", "-c", _HOLD_LAYER, directory, str(size)]
        holder = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={},
            start_new_session=True,
        )
        space = cls(holder)
        assert holder.stdout is not None
        ready, _, _ = select.select([holder.stdout], [], [], USERNS_TIMEOUT)
        if not ready or holder.stdout.readline() != b"ready\n":
            reason = space._failure()
            space.close()
            raise OSError(f"the sandbox's layer could not be made: {reason}")
        return space

    def command(self, command: Sequence[str]) -> list[str]:
        """The argv running ``command`` in the space's namespaces."""
        pid = str(self._holder.pid)
        return [find_python(), "-I", "-S", "-c", _ENTER_LAYER, pid, *command]

    def close(self) -> None:
        """End the helper, and with it the space and what it holds; idempotent."""
        self._holder.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._holder.communicate(timeout=USERNS_TIMEOUT)

    def _failure(self) -> str:
        self._holder.kill()
        try:
            _, error = self._holder.communicate(timeout=USERNS_TIMEOUT)
        except subprocess.TimeoutExpired:
            return "no answer in time"
        lines = error.decode(errors="replace").strip().splitlines()
        return lines[-1][:300] if lines else "no reason given"


def _idmapped_clone(source: str, target: str, userns: int) -> None:
    """Mount ``source`` read-only at ``target``, its owners mapped through user namespace
    ``userns`` (a descriptor)."""
    libc = _libc()
    flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE
    tree = libc.syscall(SYS_OPEN_TREE, AT_FDCWD, os.fsencode(source), flags)
    _checked(tree, "cloning a template")
    try:
        flags = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
        attr = _MountAttr(flags)
        attr.userns_fd = userns
        size = ctypes.sizeof(attr)
        where = AT_EMPTY_PATH | AT_RECURSIVE
        result = libc.syscall(SYS_MOUNT_SETATTR, tree, b"", where, ctypes.byref(attr), size)
        _checked(result, "mapping a template's owner (idmapped mounts need Linux 5.12)")
        target_path = os.fsencode(target)
        result = libc.syscall(
            SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, target_path, MOVE_MOUNT_F_EMPTY_PATH
        )
        _checked(result, "mounting a template")
    finally:
        os.close(tree)


def _mapping_namespace(uid_map: str) -> int:
    """A descriptor of a new user namespace whose uid and gid maps are ``uid_map``."""
    holder = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _HOLD_USERNS],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={},
    )
    try:
        assert holder.stdout is not None
        if holder.stdout.readline() != b"ready\n":
            raise OSError("a user namespace for a template's mount could not be made")
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{holder.pid}/{name}", "w", encoding="ascii") as handle:
                handle.write(uid_map)
        return os.open(f"/proc/{holder.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        holder.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            holder.communicate(timeout=USERNS_TIMEOUT)


def unmount_under(path: str) -> None:
    """Detach every mount at or below ``path`` in the calling thread's mount namespace,
    deepest first (nothing when there is none)."""
    for point in mounts_below(path):
        detach(point)
