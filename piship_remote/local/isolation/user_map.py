"""Who a sandbox command runs as: its user (uid 1000) and, where it can be mapped, ``root``.

Where the service runs as host root, a sandbox is nobody on the host: its user
(uid 1000) and its ``root`` (uid 0) map onto two unprivileged host uids of a range
of its own (see :mod:`piship_remote.local.isolation.uid_block`; the first sandbox's
are :data:`USER_HOST_UID` and :data:`ROOT_HOST_UID`) that own nothing outside the
sandbox's own directory (which the service gives them), so neither can change a
host file, device node or process, nor another sandbox's. Writing that map needs the
service's own ``CAP_SETUID`` in the host namespace (``/proc/<pid>/uid_map`` written from
outside, while bubblewrap waits on ``--userns-block-fd``). Elsewhere the kernel
lets a namespace map only the service's own uid: the sandbox's user is that uid
(which can change nothing the service could not), and ``root`` is refused with
:data:`ROOT_REFUSAL`::

    users = SandboxUsers.of(user="user", workdir="/home/user", root=root_mappable())
    identity = users.named("root")      # Identity("root", 0, "/root"), or None
    options = capability_options() + bwrap_options(block_fd, info_fd)
    write_maps(child_pid, ids, user_uid=1000, with_root=True)

The agent keeps :data:`CAPABILITIES` (ambient), to switch to root and to signal
root's processes; a user command starts with none, a root command with exactly
these (see ``agent.py``).
"""

from __future__ import annotations

import os
import stat

import attrs

from piship_remote.local.isolation.uid_block import BLOCK_START, SandboxIds

__all__ = [
    "CAPABILITIES",
    "ROOT_HOME",
    "ROOT_HOST_UID",
    "ROOT_REFUSAL",
    "USER_HOST_UID",
    "Identity",
    "SandboxUsers",
    "bwrap_options",
    "capability_options",
    "give_to",
    "make_root_home",
    "root_mappable",
    "unsearchable",
    "write_maps",
]

SANDBOX_UID = 1000
ROOT_HOME = "/root"
# The host uids (and gids) the first sandbox's root and user map onto; each other sandbox
# has a range of its own above them.
ROOT_HOST_UID = BLOCK_START
USER_HOST_UID = ROOT_HOST_UID + SANDBOX_UID
# What root needs to act as root on the sandbox's own files, and what the agent needs to
# become it (SETUID, SETGID) and to signal its processes (KILL). Nothing more: no
# CAP_SYS_ADMIN (mounts), CAP_NET_* or CAP_SYS_PTRACE.
CAPABILITIES = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
)
ROOT_REFUSAL = "root needs the local service run as root (host uid 0): its sandboxes map one uid"


def root_mappable() -> bool:
    """Whether this service can map a sandbox root beside its user (it runs as host root)."""
    return os.geteuid() == 0


@attrs.frozen
class Identity:
    """A sandbox user: its name, uid inside the sandbox, and home directory."""

    name: str
    uid: int
    home: str


@attrs.frozen
class SandboxUsers:
    """The users a service's sandboxes have: the service's user, and root when mapped."""

    default: Identity
    root: Identity | None = None

    @classmethod
    def of(cls, *, user: str, workdir: str, root: bool) -> SandboxUsers:
        """The service's ``user`` (home ``workdir``); ``root`` beside it if ``root`` is true."""
        if user == "root":
            return cls(Identity("root", 0, workdir))  # the sandbox's only user
        second = Identity("root", 0, ROOT_HOME) if root else None
        return cls(Identity(user, SANDBOX_UID, workdir), second)

    def named(self, name: str) -> Identity | None:
        """The user called ``name``, if the sandboxes have it."""
        if name == self.default.name:
            return self.default
        if self.root is not None and name == self.root.name:
            return self.root
        return None

    def refusal(self, name: str) -> str:
        """Why ``name`` is not a user of the sandboxes (with envd's ``invalid username``)."""
        shown = f"invalid username: '{name[:64]}'"
        return f"{shown}: {ROOT_REFUSAL}" if name == "root" else shown


def make_root_home(directory: str, ids: SandboxIds) -> str:
    """Make the host directory of a sandbox root's home in ``directory``: 0700, root's."""
    home = os.path.join(directory, "root")
    os.mkdir(home, 0o700)
    give_to(home, 0, ids)  # uid 0 inside the sandbox, nobody here
    return home


def unsearchable(directory: str) -> str | None:
    """Why a root service's sandboxes could not look up their places under ``directory``
    (a directory on its path that not every user may search), or ``None``."""
    path = os.path.realpath(directory)
    while True:
        if os.path.isdir(path) and not os.stat(path).st_mode & stat.S_IXOTH:
            return (
                f"{path} is not searchable by every user, and a root service's sandboxes run"
                f" as unprivileged host uids that look up their directories under {directory}:"
                " choose a root= (or TMPDIR) every user may search, such as /tmp"
            )
        if path == os.path.dirname(path):
            return None
        path = os.path.dirname(path)


def give_to(path: str, uid: int, ids: SandboxIds) -> None:
    """Make host directory ``path`` belong to sandbox uid ``uid`` (of the range ``ids``)."""
    owner = ids.host(uid)
    os.chown(path, owner, owner)


def capability_options() -> list[str]:
    """The bwrap options (after ``--cap-drop ALL``) that leave the agent :data:`CAPABILITIES`."""
    return [option for capability in CAPABILITIES for option in ("--cap-add", capability)]


def bwrap_options(block_fd: int, info_fd: int) -> list[str]:
    """bubblewrap writes no map, its pid goes to ``info_fd``, and it waits on ``block_fd``."""
    return ["--userns-block-fd", str(block_fd), "--info-fd", str(info_fd)]


def write_maps(pid: int, ids: SandboxIds, *, user_uid: int, with_root: bool) -> None:
    """Map the sandbox's user ``user_uid`` (and 0, ``with_root``) onto their host uids of
    the range ``ids``, for process ``pid``."""
    uids = sorted({user_uid, 0} if with_root else {user_uid})
    lines = "".join(f"{uid} {ids.host(uid)} 1\n" for uid in uids)
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{pid}/{name}", "w", encoding="ascii") as handle:
            handle.write(lines)
