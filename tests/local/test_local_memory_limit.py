"""A memory-limit hit kills a command, never the sandbox.

Files a sandbox writes to its tmpfs places count toward its memory and belong to no
process, so the OOM killer would pick the sandbox's largest process: its agent. The
agent stays outside the limit (its own v1 memory group, or an ``oom_score_adj`` of
-1000 where root may set one), so the command is killed, the client is told which
limit it hit, and the sandbox answers the next request.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from piship_remote.local import LocalE2bService
from piship_remote.local.isolation.limits import Enforcement
from tests.support.local_service import HTTP_TIMEOUT, Client, gone, marked, marker, needs_bwrap

MEMORY_MIB = 64
CAP_SYS_RESOURCE = 24
ENFORCEMENT = Enforcement.probe()


def agent_protectable() -> str | None:
    """Why this host cannot keep the agent out of a memory-limit kill, or ``None``."""
    if ENFORCEMENT.memory is None:
        return "no memory cgroup here: the memory limit is not enforced"
    if ENFORCEMENT.cgroup == "v1":
        return None
    with open("/proc/self/status", encoding="ascii") as status:
        effective = next(line for line in status if line.startswith("CapEff:")).split()[1]
    if not int(effective, 16) >> CAP_SYS_RESOURCE & 1:
        return "cgroup v2 without CAP_SYS_RESOURCE: the agent's oom_score_adj cannot be set"
    return None


pytestmark = [needs_bwrap, pytest.mark.timeout(60)]
needs_protection = pytest.mark.skipif(
    agent_protectable() is not None, reason=str(agent_protectable())
)


@pytest.fixture(scope="module")
def service() -> Iterator[LocalE2bService]:
    with LocalE2bService(max_memory_mib=MEMORY_MIB) as running:
        yield running


def remove(client: Client, sandbox: dict[str, Any], path: str) -> int:
    response = client.session.post(
        f"{client.service.envd_url}/filesystem.Filesystem/Remove",
        json={"path": path},
        headers=client.envd_headers(sandbox),
        timeout=HTTP_TIMEOUT,
    )
    return response.status_code


def agent_of(pid: int) -> int:
    """The host pid of the sandbox agent that ``pid`` descends from."""
    while b"agent.py" not in Path(f"/proc/{pid}/cmdline").read_bytes():
        pid = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    return pid


@needs_protection
def test_filling_memory_with_files_kills_the_command_and_says_memory_limit(
    client: Client, sandbox: dict[str, Any]
) -> None:
    filled = client.run(sandbox, f"head -c {3 * MEMORY_MIB}M /dev/zero > /tmp/fill")
    assert filled.trailer == {}  # an end event, not the sandbox's failure
    assert filled.end is not None and filled.end["exitCode"] != 0
    assert f"memory limit ({MEMORY_MIB} MiB) was reached" in filled.stderr


@needs_protection
def test_the_sandbox_answers_after_a_memory_limit_kill(
    client: Client, sandbox: dict[str, Any]
) -> None:
    client.run(sandbox, f"head -c {3 * MEMORY_MIB}M /dev/zero > /tmp/fill")
    assert remove(client, sandbox, "/tmp/fill") == 200
    assert client.run(sandbox, "echo alive").stdout == "alive\n"


def test_a_lost_agent_is_the_sandboxs_failure_not_the_services(
    client: Client, sandbox: dict[str, Any]
) -> None:
    mark = marker()
    stream = client.start(sandbox, f"sleep {mark}")
    assert gone(lambda: bool(marked(mark)))
    os.kill(agent_of(marked(mark)[0]), signal.SIGKILL)
    trailer = stream.finish().trailer
    assert trailer is not None
    message = trailer["error"]["message"]
    assert message.startswith("the sandbox failed")
    assert "service stopped" not in message


def test_a_command_after_the_agent_is_lost_is_told_the_sandbox_failed(
    client: Client, sandbox: dict[str, Any]
) -> None:
    mark = marker()
    client.start(sandbox, f"sleep {mark}")
    assert gone(lambda: bool(marked(mark)))
    os.kill(agent_of(marked(mark)[0]), signal.SIGKILL)
    trailer = client.run(sandbox, "echo after").trailer
    assert trailer is not None
    assert trailer["error"]["message"].startswith("the sandbox failed")
