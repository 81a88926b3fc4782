"""Acting as a local sandbox's host uid, as an escape from the sandbox would find itself.

``nsenter`` joins the service's mount namespace (where a root service's sandbox files
are mounted) and ``setpriv`` takes the uid, with no groups::

    uid = host_uid_of(client, sandbox, "root")
    ids = host_ids_of(service, sandbox)         # the range of host uids its slot holds
    ran = as_host_uid(service, uid, f"cat {sandbox_directory(service, other)}/home/x")
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

import pytest

from piship_remote.local import LocalE2bService
from piship_remote.local.isolation.uid_block import SandboxIds
from tests.support.local_service import Client, gone, marked, marker, start_as

needs_util_linux = pytest.mark.skipif(
    shutil.which("nsenter") is None or shutil.which("setpriv") is None,
    reason="acting as a sandbox's host uid needs nsenter and setpriv (util-linux)",
)


def host_uid_of(client: Client, sandbox: dict[str, Any], user: str) -> int:
    """The host uid ``user``'s processes of ``sandbox`` run as."""
    mark = marker()
    start_as(client, sandbox, user, f"sleep {mark}")
    assert gone(lambda: bool(marked(mark)))
    with open(f"/proc/{marked(mark)[0]}/status", encoding="ascii") as status:
        line = next(line for line in status if line.startswith("Uid:"))
    return int(line.split()[1])


def host_ids_of(service: LocalE2bService, sandbox: dict[str, Any]) -> SandboxIds:
    """The range of host uids ``sandbox`` really got (its slot, whichever was free)."""
    found = service._registry.lookup(sandbox["sandboxID"])
    assert found is not None and found.ids is not None, "a root service maps its sandboxes' uids"
    return found.ids


def as_host_uid(
    service: LocalE2bService, uid: int, command: str
) -> subprocess.CompletedProcess[str]:
    """``sh -c command`` as host uid (and gid) ``uid`` in the service's mount namespace."""
    joined = ["nsenter", f"--mount={mount_namespace(service)}"]
    dropped = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    return subprocess.run(
        [*joined, *dropped, "sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def sandbox_directory(service: LocalE2bService, sandbox: dict[str, Any]) -> str:
    """The sandbox's host directory as its service's mount namespace names it."""
    home = service.sandbox_home(sandbox["sandboxID"])
    if home.startswith("/proc/"):
        home = home[home.index("/root/") + len("/root") :]
    return os.path.dirname(home)


def mount_namespace(service: LocalE2bService) -> str:
    """The service's mount namespace: its spawner thread's, or this process's."""
    home = service.sandbox_home("any")
    if not home.startswith("/proc/"):
        return "/proc/self/ns/mnt"
    return home[: home.index("/root/")] + "/ns/mnt"
