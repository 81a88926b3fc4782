"""What the attack tests share: who runs them, a sandbox's Python program, its host processes.

The tests run as host root (the service then maps a root in each sandbox) and as an
unprivileged user, as CI runs them (see ``.ci/run``: ``setpriv --reuid 65534 --regid 65534
--clear-groups``); a test that needs one of the two says so in its skip::

    out = python_in(client, sandbox, SCRIPT, user="root")   # runs SCRIPT with the host Python
    pids = sandbox_pids(service, sandbox["sandboxID"])       # host pids of its processes
"""

from __future__ import annotations

import os
import shlex
from typing import Any

import pytest

from piship_remote.local import LocalE2bService
from tests.support.local_service import Client, run_as

AS_ROOT = os.geteuid() == 0
needs_host_root = pytest.mark.skipif(not AS_ROOT, reason="needs a service run as host root")


def python_in(client: Client, sandbox: dict[str, Any], script: str, *, user: str = "user") -> str:
    """What ``script`` prints, run by ``python3`` in the sandbox as ``user``."""
    command = f"python3 -c {shlex.quote(script)}"
    if user == "user":
        stream = client.run(sandbox, command)
        assert stream.end is not None and stream.end.get("exitCode", 0) == 0, stream.stderr
        return stream.stdout
    return run_as(client, sandbox, user, command).stdout


def sandbox_pids(service: LocalE2bService, sandbox_id: str) -> list[int]:
    """The host pids of every process of the sandbox: its bubblewrap init and what descends
    from it."""
    found = service._registry.lookup(sandbox_id)
    assert found is not None
    init = found._vm.init_pid
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as handle:
                    fields = handle.read().rpartition(b")")[2].split()
            except OSError:
                continue
            parents[int(entry)] = int(fields[1])
    members = {init}
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in members and pid not in members:
                members.add(pid)
                grew = True
    return sorted(members)
