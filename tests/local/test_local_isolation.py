"""The local service's sandboxes as VMs: one lasting environment each, private networks, limits.

Each sandbox is one long-lived bubblewrap environment; these tests pin what that
gives: background servers that answer later commands, command text kept out of
host command lines, egress through the sandbox's own user-mode network stack
with the host's loopback and other sandboxes out of reach, and limits that fail
only the sandbox that hits them. Nothing here connects anywhere but loopback
(and the user-mode stack's gateway, which stands for the host's loopback).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from piship_remote.local import LocalE2bService
from piship_remote.local.isolation import network
from piship_remote.local.isolation.limits import Enforcement
from tests.support.local_service import Client, gone, marked, needs_bwrap

SLIRP = network.egress_problem()
needs_slirp = pytest.mark.skipif(SLIRP is not None, reason=f"no egress stack: {SLIRP}")
ENFORCED = Enforcement.probe()
MEMORY_MIB, DISK_MIB, PROCESSES = 64, 16, 40


def reach(host: str, port: int) -> str:
    return f"(exec 3<>/dev/tcp/{host}/{port}) 2>/dev/null && echo reachable || echo blocked"


def serve_http(port: int) -> str:
    """A command that leaves an HTTP server running in the background, then returns."""
    return (
        f"nohup python3 -m http.server {port} --bind 127.0.0.1 >/tmp/http.log 2>&1 & "
        f"for i in $(seq 100); do {{ {reach('127.0.0.1', port)}; }} | grep -q reachable && break;"
        " sleep 0.05; done; echo started"
    )


FETCH = (
    'python3 -c "import urllib.request as u;'
    " print(u.urlopen('http://127.0.0.1:{port}/', timeout=5).status)\""
)


@pytest.fixture
def limited() -> Iterator[Client]:
    """A client of a service whose sandboxes get small limits."""
    with LocalE2bService(
        max_processes=PROCESSES, max_memory_mib=MEMORY_MIB, max_disk_mib=DISK_MIB
    ) as svc:
        client = Client(svc)
        yield client
        client.session.close()


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.setblocking(False)
        yield server


def exit_code(stream: Any) -> int:
    code: int = stream.end.get("exitCode", 0)
    return code


# -- one environment per sandbox ----------------------------------------------------------


@needs_bwrap
@pytest.mark.timeout(30)
def test_a_background_server_started_by_one_command_answers_the_next(client: Client) -> None:
    sandbox = client.create()
    assert client.run(sandbox, serve_http(8000)).stdout == "started\n"
    assert client.run(sandbox, FETCH.format(port=8000)).stdout == "200\n"


@needs_bwrap
@pytest.mark.timeout(30)
def test_two_sandboxes_have_separate_loopbacks_and_may_use_the_same_port(client: Client) -> None:
    first, second = client.create(), client.create()
    assert client.run(first, serve_http(8001)).stdout == "started\n"
    assert client.run(second, reach("127.0.0.1", 8001)).stdout == "blocked\n"
    assert client.run(second, serve_http(8001)).stdout == "started\n"


@needs_bwrap
@pytest.mark.timeout(20)
def test_commands_share_one_pid_namespace_and_hostname(client: Client) -> None:
    sandbox = client.create()
    client.run(sandbox, "nohup sleep 30 >/dev/null 2>&1 &")
    listing = client.run(sandbox, "hostname; cat /proc/[0-9]*/comm").stdout.split()
    assert listing[0] == "sandbox"
    assert "sleep" in listing


@needs_bwrap
@pytest.mark.timeout(20)
def test_deleting_the_sandbox_ends_its_background_processes_and_removes_its_files(
    client: Client, service: LocalE2bService
) -> None:
    sandbox = client.create()
    client.run(sandbox, "nohup sleep 30.7654321 >/dev/null 2>&1 &")
    home = service.sandbox_home(sandbox["sandboxID"])
    # Polled: a command line read while its process is in execve can come back empty.
    assert gone(lambda: bool(marked("30.7654321")))
    assert client.control("DELETE", f"/sandboxes/{sandbox['sandboxID']}").status_code == 204
    deadline = time.monotonic() + 5
    while marked("30.7654321") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not marked("30.7654321")
    assert not os.path.exists(os.path.dirname(home))


@needs_bwrap
@pytest.mark.timeout(20)
def test_a_shell_script_is_not_in_any_host_command_line(client: Client) -> None:
    sandbox = client.create()
    secret = "piship-secret-7f3a9c"
    stream = client.start(sandbox, f"DBPASS={secret} sleep 5 & echo ready; wait")
    stream.until(lambda s: "ready" in s.stdout)
    assert marked(secret) == []
    client.control("DELETE", f"/sandboxes/{sandbox['sandboxID']}")


@needs_bwrap
@pytest.mark.timeout(20)
def test_an_environment_value_is_not_in_any_host_command_line(client: Client) -> None:
    sandbox = client.create()
    secret = "piship-secret-env-41c9d2"
    stream = client.start(sandbox, "sleep 5 & echo ready; wait", envs={"DBPASS": secret})
    stream.until(lambda s: "ready" in s.stdout)
    assert marked(secret) == []
    client.control("DELETE", f"/sandboxes/{sandbox['sandboxID']}")


# -- network ----------------------------------------------------------------------------


@needs_bwrap
@needs_slirp
@pytest.mark.timeout(20)
def test_network_allow_gives_a_tap_device_with_a_default_route(client: Client) -> None:
    sandbox = client.create(allow_internet_access=True)
    out = client.run(sandbox, "ip -o -4 addr show tap0; cat /proc/net/route").stdout
    assert "10.0.2.100/24" in out
    routes = [line.split() for line in out.splitlines() if line.startswith("tap0\t")]
    assert ["tap0", "00000000", "0202000A"] in [r[:3] for r in routes]


@needs_bwrap
@pytest.mark.timeout(20)
def test_network_deny_has_loopback_only(client: Client) -> None:
    sandbox = client.create(allow_internet_access=False)
    out = client.run(sandbox, "ip -o link; cat /proc/net/route").stdout
    assert "1: lo:" in out and "tap0" not in out


@needs_bwrap
@needs_slirp
@pytest.mark.timeout(20)
def test_network_allow_reaches_neither_the_host_loopback_nor_its_gateway_alias(
    client: Client, listener: socket.socket
) -> None:
    sandbox = client.create(allow_internet_access=True)
    port = listener.getsockname()[1]
    assert client.run(sandbox, reach("127.0.0.1", port)).stdout == "blocked\n"
    assert client.run(sandbox, reach("10.0.2.2", port)).stdout == "blocked\n"
    with pytest.raises(BlockingIOError):
        listener.accept()


@needs_bwrap
@needs_slirp
@pytest.mark.timeout(30)
def test_network_allow_does_not_reach_another_sandbox(client: Client) -> None:
    server, other = (
        client.create(allow_internet_access=True),
        client.create(allow_internet_access=True),
    )
    assert client.run(server, serve_http(8002)).stdout == "started\n"
    assert client.run(other, reach("127.0.0.1", 8002)).stdout == "blocked\n"
    assert client.run(other, reach("10.0.2.2", 8002)).stdout == "blocked\n"


@needs_bwrap
@pytest.mark.timeout(20)
def test_network_allow_without_slirp4netns_is_refused_naming_what_to_install(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(network, "find_slirp4netns", lambda: None)
    response = client.control(
        "POST", "/sandboxes", json={"templateID": "base", "allow_internet_access": True}
    )
    assert response.status_code == 503
    assert "slirp4netns" in response.json()["message"]


# -- limits -----------------------------------------------------------------------------


def needs(limit: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(limit not in ENFORCED.held(), reason=f"{limit} is not enforced here")


def assert_second_sandbox_answers(client: Client) -> None:
    other = client.create()
    assert client.run(other, "echo still here").stdout == "still here\n"


@needs_bwrap
@needs("processes")
@pytest.mark.timeout(60)
def test_a_fork_bomb_fails_inside_its_sandbox(limited: Client) -> None:
    sandbox = limited.create()
    bomb = (
        "python3 -c 'import os, time\n"
        "while True:\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(30); os._exit(0)'"
    )
    stream = limited.run(sandbox, bomb)
    assert exit_code(stream) != 0
    assert f"process limit ({PROCESSES}) was reached" in stream.stderr
    assert_second_sandbox_answers(limited)


@needs_bwrap
@needs("memory")
@pytest.mark.timeout(60)
def test_a_3_gib_allocation_fails_inside_its_sandbox(limited: Client) -> None:
    sandbox = limited.create()
    stream = limited.run(sandbox, "python3 -c 'b = b\"x\" * (3 * 1024 ** 3)'")
    assert exit_code(stream) != 0
    assert f"memory limit ({MEMORY_MIB} MiB) was reached" in stream.stderr
    assert limited.run(sandbox, "echo alive").stdout == "alive\n"
    assert_second_sandbox_answers(limited)


@needs_bwrap
@pytest.mark.timeout(60)
@pytest.mark.parametrize("place", ["~", "/tmp", "/dev/shm"])
def test_a_disk_fill_fails_inside_its_sandbox(limited: Client, place: str) -> None:
    if place == "~" and not ENFORCED.disk:
        pytest.skip("the home is size-capped only where the service runs as root")
    sandbox = limited.create()
    stream = limited.run(sandbox, f"head -c {4 * DISK_MIB}M /dev/zero > {place}/fill")
    assert exit_code(stream) != 0
    assert "No space left on device" in stream.stderr
    assert f"disk limit ({DISK_MIB} MiB) is full" in stream.stderr
    assert_second_sandbox_answers(limited)
