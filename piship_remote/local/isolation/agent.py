"""The agent inside a local sandbox: it starts, signals and reaps the sandbox's commands.

It is the long-lived process of the sandbox's bubblewrap (run as
``python3 -I -S agent.py`` inside, with only the standard library), so every
command it starts is born in the sandbox's namespaces and cgroups, and whatever
a command leaves running in the background outlives it, as on a VM.

The service talks to it over a ``SOCK_SEQPACKET`` socket (its fd number is the
agent's one argument), one JSON
message per packet, file descriptors passed alongside (``SCM_RIGHTS``)::

    {"op": "start", "id": 7}  + fds [stdout, stderr, status, spec, (stdin)]
    {"op": "start", "id": 8, "pty": true}  + fds [channel, status, spec]
    {"op": "kill", "id": 7, "signal": 9}
    {"op": "drain"}           + fds [stdout, stderr]   (read to EOF, then close)
    {"op": "protect"}         + fds [its own oom_score_adj, opened by a root service]
    {"op": "cgroup"}          + fds [the sandbox's memory cgroup.procs, opened by the service]
    {"op": "dial", "port": 8000}  + fds [channel]
    {"op": "files", "call": "read", "args": {"path": …}, "uid": 1000}  + fds [reply, (data)]

``spec`` is a memfd holding ``{"cmd", "args", "env", "cwd"}`` (and ``"size"``,
``{"cols", "rows"}``, for a pty), so command text and environment values never
appear in any host process's argv or environ. A pty command runs on a fresh
pseudo-terminal opened here, inside the sandbox; the agent sends its master end
back over ``channel`` (a socket) and keeps nothing of it. On the
``status`` pipe the agent writes one JSON line ``{"pid": n}`` (or ``{"error": …}``
when the program cannot be started, with ``"cwd": true`` when the working
directory is missing), then ``{"exit": code}`` or
``{"signal": n}`` when the command's main process ends. The agent exits when
the socket closes, and with it (bubblewrap's init being pid 1) the whole sandbox.

A sandbox with a root beside its user (see ``user_map.py``) starts the agent as
the user with a few ambient capabilities, which it keeps to itself (no ambient or
inheritable ones). A spec's ``"uid"`` then picks who runs it: ``0`` is root (with
exactly those capabilities, no supplementary groups), and ``1000`` (or none) is the
user, whose program starts with no capabilities at all: an exec by a non-root uid
keeps none but ambient ones and those of file capabilities, which the sandbox's
mounts (all ``nosuid``) ignore.

A root service makes the agent (and bubblewrap) no OOM victim (``oom_score_adj``
-1000, written from the host: a memory-limit kill hits a command, never the
sandbox) and sends the agent its own ``oom_score_adj``, open for writing (its
``/proc`` is read-only): it sets 0 there while it starts a command, which inherits
it, and -1000 again after.

Where the agent's memory cgroup is not the sandbox's (cgroup v1), the service sends
the sandbox's ``cgroup.procs``, open for writing: each command writes itself there
before its program starts, so the memory limit holds for commands and the agent
stays outside it.

A ``dial`` connects to a port on the sandbox's own loopback (``127.0.0.1``, else ``::1``),
from inside its network namespace, and sends the connected socket back over ``channel``
(or the packet ``error: …`` when nothing listens there): how the service reaches a
server in the sandbox whether or not the sandbox has a network.

Where it runs commands as root, the agent also listens on the abstract socket
``\0piship-sudo`` (private to the sandbox's network namespace): the sandbox's ``sudo``
(see ``sudo.py``) sends one spec there with its stdin, stdout and stderr, and reads the
status lines back on the same connection; the command runs as root.

A ``files`` request is the sandbox's content work (file operations, metadata, the export
and import of its files for snapshots and forks; see ``agent_files.py``, shipped beside
this file): the agent forks a helper that becomes the requesting user (a capable agent's
helper for the user gives up every capability on the way), answers one JSON line on
``reply`` and moves bytes through ``data``, then exits. Nothing of the image is used.

No host handle crosses into the sandbox: at start the agent closes every descriptor but
its standard ones and its socket (bubblewrap's own, and any the service handed it), and
makes itself not dumpable, so no process of the sandbox reads its ``/proc/2/fd``; every
command is started with ``close_fds``.

A ``bash``/``sh`` ``-c SCRIPT`` command gets its script through the environment
variable ``PISHIP_SCRIPT`` (unexported before it runs), so the script text is not
in the shell's argv either, where any host user could read it in ``/proc``.
"""

from __future__ import annotations

import errno
import fcntl
import importlib.util
import itertools
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
from collections.abc import Callable
from types import ModuleType
from typing import Any

MAX_FDS = 5
PACKET_BYTES = 65536
SHELLS = ("/bin/bash", "/usr/bin/bash", "/bin/sh", "/usr/bin/sh", "bash", "sh")
SCRIPT_VARIABLE = "PISHIP_SCRIPT"
ROOT_UID, USER_UID = 0, 1000
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
CAPABILITY_VERSION_3 = 0x20080522
OOM_KILLABLE, OOM_PROTECTED = b"0", b"-1000"
PR_SET_DUMPABLE = 4
DIAL_TIMEOUT = 2.0
SUDO_ADDRESS = "\0piship-sudo"
STDIO_FDS = 3
LOOPBACKS = ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1"))
# Portable sh (dash has no `export -n`): copy into an unexported variable, unset, eval.
HIDDEN_SCRIPT = '__piship_script=$PISHIP_SCRIPT; unset PISHIP_SCRIPT; eval "$__piship_script"'


def hide_script(cmd: str, args: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """``args`` with a shell's ``-c SCRIPT`` replaced by one reading the script from ``env``."""
    if cmd not in SHELLS or "-c" not in args:
        return args, env
    at = args.index("-c")
    if at + 1 >= len(args) or any(not a.startswith("-") for a in args[:at]):
        return args, env
    hidden = {**env, SCRIPT_VARIABLE: args[at + 1]}
    return [*args[: at + 1], HIDDEN_SCRIPT, *args[at + 2 :]], hidden


class Agent:
    """The sandbox's commands, keyed by the service's ids."""

    def __init__(self, control: socket.socket) -> None:
        self.control = control
        self.capable = _has_capabilities()
        if self.capable:
            _keep_capabilities_to_myself()
        self.children: dict[int, tuple[subprocess.Popen[bytes], int]] = {}
        self.helpers: set[int] = set()  # the forked helpers of files requests
        self.files: ModuleType | None = None
        self.draining: set[int] = set()
        self.oom_score: int | None = None  # its own oom_score_adj, where it is protected
        self.command_group: int | None = None  # the cgroup.procs commands join
        self.sudo = _sudo_listener() if self.capable else None
        self.sudo_ids = itertools.count(-1, -1)  # below the service's ids
        self.wakeup_read, wakeup_write = os.pipe()
        os.set_blocking(wakeup_write, False)
        signal.set_wakeup_fd(wakeup_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def run(self) -> None:
        while True:
            watched = [self.control.fileno(), self.wakeup_read, *self.draining]
            if self.sudo is not None:
                watched.append(self.sudo.fileno())
            readable, _, _ = select.select(watched, [], [])
            if self.wakeup_read in readable:
                os.read(self.wakeup_read, 4096)
            self.reap()
            if self.sudo is not None and self.sudo.fileno() in readable:
                self.start_sudo(self.sudo)
            for fd in readable:
                if fd in self.draining:
                    self.drain(fd)
            if self.control.fileno() in readable and not self.receive():
                return

    def receive(self) -> bool:
        try:
            data, fds, _, _ = socket.recv_fds(self.control, PACKET_BYTES, MAX_FDS)
        except InterruptedError:
            return True
        if not data:
            return False
        message = json.loads(data)
        op = message.get("op")
        if op == "start":
            self.start(int(message["id"]), fds, bool(message.get("pty")))
        elif op == "kill":
            self.kill(int(message["id"]), int(message["signal"]))
        elif op in ("protect", "cgroup") and fds:
            if op == "protect":
                self.oom_score = fds[0]
            else:
                self.command_group = fds[0]
            for fd in fds[1:]:
                os.close(fd)
        elif op == "dial" and fds:
            dial(int(message.get("port", 0)), fds[0])
            for fd in fds[1:]:
                os.close(fd)
        elif op == "files" and fds:
            self.start_files(message, fds)
        elif op == "drain":
            for fd in fds:
                os.set_blocking(fd, False)
                self.draining.add(fd)
        else:
            for fd in fds:
                os.close(fd)
        return True

    def start(self, ident: int, fds: list[int], pty: bool) -> None:
        if pty:
            self.start_pty(ident, fds)
            return
        stdout, stderr, status, spec_fd = fds[:4]
        stdin = fds[4] if len(fds) > 4 else subprocess.DEVNULL
        try:
            spec = _read_spec(spec_fd)
            self.spawn(ident, spec, status, (stdin, stdout, stderr))
        finally:
            os.close(stdout)
            os.close(stderr)
            if stdin != subprocess.DEVNULL:
                os.close(stdin)

    def start_files(self, message: dict[str, Any], fds: list[int]) -> None:
        """Fork a helper that answers one ``files`` request as its user; nothing waits here."""
        reply, data = fds[0], (fds[1] if len(fds) > 1 else None)
        uid = message.get("uid", USER_UID)
        if uid not in (ROOT_UID, USER_UID) or (uid == ROOT_UID and not self.capable):
            _write(reply, {"error": {"errno": "EPERM", "message": f"no such user (uid {uid!r})"}})
        else:
            self._set_oom_score(OOM_KILLABLE)  # what the helper inherits
            try:
                if self.files is None:
                    self.files = _load_files()
                pid = os.fork()
                if pid == 0:
                    self._helper(message, uid, reply, data)
                self.helpers.add(pid)
            except (OSError, ImportError) as e:  # no process left under the sandbox's limit
                _write(reply, {"error": {"errno": "EAGAIN", "message": str(e)[:200]}})
            finally:
                self._set_oom_score(OOM_PROTECTED)
        for fd in fds:
            os.close(fd)

    def _helper(self, message: dict[str, Any], uid: int, reply: int, data: int | None) -> None:
        """In the forked helper: become ``uid``, answer the request, exit."""
        code = 0
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _keep_only(reply, *([] if data is None else [data]))
            assert self.files is not None
            if self.capable:
                if uid != ROOT_UID and message.get("call") == "write":
                    self.files.hand_parents(str((message.get("args") or {}).get("path", "")), uid)
                _become(uid)
            self.files.serve(str(message.get("call")), dict(message.get("args") or {}), reply, data)
        except BaseException:
            code = 1
        finally:
            os._exit(code)

    def start_sudo(self, listener: socket.socket) -> None:
        """One ``sudo``: its spec and stdio on a new connection, which carries the status back."""
        try:
            connection, _ = listener.accept()
        except OSError:
            return
        with connection:
            connection.settimeout(DIAL_TIMEOUT)
            try:
                data, fds, _, _ = socket.recv_fds(connection, PACKET_BYTES, STDIO_FDS)
                spec = json.loads(data)
            except (OSError, ValueError):
                return
            try:
                if len(fds) == STDIO_FDS and _valid_spec(spec):
                    spec["uid"] = ROOT_UID
                    status = os.dup(connection.fileno())
                    self.spawn(next(self.sudo_ids), spec, status, (fds[0], fds[1], fds[2]))
            finally:
                for fd in fds:
                    os.close(fd)

    def start_pty(self, ident: int, fds: list[int]) -> None:
        channel, status, spec_fd = fds[:3]
        master, slave = os.openpty()
        try:
            spec = _read_spec(spec_fd)
            size = spec.get("size") or {}
            winsize = struct.pack("HHHH", int(size.get("rows", 0)), int(size.get("cols", 0)), 0, 0)
            fcntl.ioctl(slave, termios.TIOCSWINSZ, winsize)
            # The master goes first: the service reads it once it has the pid.
            with socket.socket(fileno=channel) as sender:
                channel = -1
                socket.send_fds(sender, [b"pty"], [master])
            self.spawn(ident, spec, status, (slave, slave, slave), terminal=True)
        finally:
            os.close(master)
            os.close(slave)
            if channel >= 0:
                os.close(channel)

    def spawn(
        self,
        ident: int,
        spec: dict[str, Any],
        status: int,
        stdio: tuple[int, int, int],
        *,
        terminal: bool = False,
    ) -> None:
        """Start ``spec`` with ``stdio``; report its pid (or why not) on ``status``."""
        cmd = str(spec.get("cmd", ""))
        cwd = str(spec.get("cwd", "/"))
        uid = spec.get("uid", USER_UID)
        if uid not in (ROOT_UID, USER_UID) or (uid == ROOT_UID and not self.capable):
            _write(status, {"error": f"fork/exec {cmd}: no such user (uid {uid!r})"})
            os.close(status)
            return
        root = uid == ROOT_UID
        # The agent's capabilities let it see and enter any directory; the user may not.
        if not os.path.isdir(cwd) or (self.capable and not root and not os.access(cwd, os.X_OK)):
            _write(status, {"error": f"cwd '{cwd}' does not exist", "cwd": True})
            os.close(status)
            return
        identity: dict[str, Any] = {}
        if root:
            identity = {"user": ROOT_UID, "group": ROOT_UID, "extra_groups": []}
        self._set_oom_score(OOM_KILLABLE)  # what the command inherits
        try:
            args, env = hide_script(cmd, list(spec["args"]), dict(spec["env"]))
            child = subprocess.Popen(
                [cmd, *args],
                executable=cmd,
                env=env,
                cwd=cwd,
                stdin=stdio[0],
                stdout=stdio[1],
                stderr=stdio[2],
                start_new_session=True,
                close_fds=True,
                preexec_fn=self._in_child(terminal),
                **identity,
            )
        except OSError as e:
            _write(status, {"error": _start_error(cmd, e)})
            os.close(status)
        else:
            self.children[ident] = (child, status)
            _write(status, {"pid": child.pid})
        finally:
            self._set_oom_score(OOM_PROTECTED)

    def _in_child(self, terminal: bool) -> Callable[[], None] | None:
        """What the child does before its program: join the commands' cgroup, take the pty."""
        group = self.command_group
        if group is None and not terminal:
            return None

        def prepare() -> None:
            if group is not None:
                os.write(group, b"0")  # "0" is the writer: this child
            if terminal:
                _take_terminal()

        return prepare

    def _set_oom_score(self, value: bytes) -> None:
        if self.oom_score is not None:
            try:
                os.pwrite(self.oom_score, value, 0)
            except OSError:
                pass

    def kill(self, ident: int, sig: int) -> None:
        """Signal the command's process group and every process of its session.

        An interactive shell (a pty's) puts each job in a group of its own, all in
        the command's session.
        """
        entry = self.children.get(ident)
        if entry is None:
            return
        leader = entry[0].pid
        try:
            os.killpg(leader, sig)
        except OSError:
            pass
        for pid in _session_members(leader):
            try:
                os.kill(pid, sig)
            except OSError:
                pass

    def reap(self) -> None:
        for pid in list(self.helpers):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self.helpers.discard(pid)
        for ident, (child, status) in list(self.children.items()):
            code = child.poll()
            if code is None:
                continue
            del self.children[ident]
            _write(status, {"signal": -code} if code < 0 else {"exit": code})
            os.close(status)

    def drain(self, fd: int) -> None:
        try:
            if os.read(fd, PACKET_BYTES):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        self.draining.discard(fd)
        os.close(fd)


def dial(port: int, channel: int) -> None:
    """Connect to ``port`` on the loopback; send the socket (or why not) on ``channel``."""
    with socket.socket(fileno=channel) as sender:
        problem = "no such port" if not 0 < port < 65536 else ""
        for family, address in LOOPBACKS if not problem else ():
            connection = socket.socket(family, socket.SOCK_STREAM)
            try:
                connection.settimeout(DIAL_TIMEOUT)
                connection.connect((address, port))
            except OSError as e:
                connection.close()
                problem = os.strerror(e.errno).lower() if e.errno else str(e)
                continue
            with connection:
                try:
                    socket.send_fds(sender, [b"ok"], [connection.fileno()])
                except OSError:
                    pass
            return
        try:
            sender.send(f"error: {problem}".encode())
        except OSError:
            pass


def _valid_spec(spec: object) -> bool:
    """Whether a ``sudo`` spec has a command, string arguments, environment and directory."""
    if not isinstance(spec, dict) or not isinstance(spec.get("cmd"), str):
        return False
    args, env, cwd = spec.get("args"), spec.get("env"), spec.get("cwd")
    return (
        isinstance(args, list)
        and all(isinstance(a, str) for a in args)
        and isinstance(env, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
        and isinstance(cwd, str)
    )


def _sudo_listener() -> socket.socket | None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        listener.bind(SUDO_ADDRESS)
        listener.listen(8)
    except OSError:
        listener.close()
        return None
    return listener


def _session_members(session: int) -> list[int]:
    """The sandbox's processes in session ``session`` (read from its own ``/proc``)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getsid(int(entry)) == session:
                members.append(int(entry))
        except OSError:
            continue
    return members


def _read_spec(fd: int) -> dict[str, Any]:
    with os.fdopen(fd, "rb") as spec_file:
        spec = json.loads(spec_file.read())
    return spec if isinstance(spec, dict) else {}


def _take_terminal() -> None:
    """In the child, after its new session: make the pty on stdin its controlling terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _load_files() -> ModuleType:
    """``agent_files.py``, beside this file (the sandbox has no package to import it from)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "agent_files.py")
    spec = importlib.util.spec_from_file_location("piship_agent_files", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _become(uid: int) -> None:
    """Be ``uid`` (and its group, no others). Going from root to the user clears every
    capability (permitted, effective, ambient): the user's helper has none."""
    try:
        os.setgroups([])
    except PermissionError:
        pass  # a user namespace that denies setgroups: there are none to drop
    os.setresgid(uid, uid, uid)
    os.setresuid(ROOT_UID, ROOT_UID, ROOT_UID)
    if uid != ROOT_UID:
        os.setresuid(uid, uid, uid)


def _keep_only(*kept: int) -> None:
    """Close every descriptor above the standard three but ``kept``."""
    low = STDIO_FDS
    for fd in sorted(kept):
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, _fd_ceiling())


def _fd_ceiling() -> int:
    try:
        return int(os.sysconf("SC_OPEN_MAX"))
    except (OSError, ValueError):
        return 65536


def _not_dumpable() -> None:
    """No process of the sandbox may read the agent's ``/proc/PID/fd``, ``mem`` or
    ``environ``, nor attach to it, whatever its uid."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "making the agent not dumpable failed")


def _has_capabilities() -> bool:
    """Whether the agent was given capabilities (a sandbox with a root beside its user)."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("CapPrm:"):
                return int(line.split()[1], 16) != 0
    return False


def _keep_capabilities_to_myself() -> None:
    """Clear the ambient and inheritable sets: what the agent starts gets no capability
    across its exec but a root's (permitted, effective) ones."""
    import ctypes  # only in a sandbox with a root

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "clearing the ambient capabilities failed")
    header = (ctypes.c_uint32 * 2)(CAPABILITY_VERSION_3, 0)
    sets = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable; twice (64 bits)
    if libc.capget(header, sets) != 0:
        raise OSError(ctypes.get_errno(), "reading the capabilities failed")
    sets[2] = sets[5] = 0
    if libc.capset(header, sets) != 0:
        raise OSError(ctypes.get_errno(), "clearing the inheritable capabilities failed")


def _start_error(cmd: str, error: OSError) -> str:
    reason = os.strerror(error.errno).lower() if error.errno else str(error)
    if error.errno == errno.ENOENT:
        reason = "no such file or directory"
    return f"fork/exec {cmd}: {reason}"


def _write(fd: int, message: dict[str, object]) -> None:
    try:
        os.write(fd, json.dumps(message).encode() + b"\n")
    except OSError:
        pass


def main() -> None:
    fd = int(sys.argv[1])
    _keep_only(fd)  # whatever bubblewrap or the service left open: host handles
    _not_dumpable()
    os.set_inheritable(fd, False)
    control = socket.socket(fileno=fd)
    control.sendall(b'{"ready": true}')
    Agent(control).run()
    sys.exit(0)


if __name__ == "__main__":
    main()
