"""Attacks of one sandbox on another through the host: uids, homes, processes, the template.

Each sandbox of a root service runs as host uids of its own, so what one could reach by
any path on the host (an escaped descriptor, a guessed directory) belongs to uids it is
not. The tests act as a sandbox's host uids directly (see ``tests.support.sandbox_uid``), as an
escape from the sandbox would find itself.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from piship_remote.local import LocalE2bService
from tests.support.local_service import (
    Client,
    gone,
    has_stdout,
    marked,
    marker,
    needs_bwrap,
    run_as,
    start_as,
)
from tests.support.sandbox_uid import (
    as_host_uid,
    host_uid_of,
    needs_util_linux,
    sandbox_directory,
)

pytestmark = [
    needs_bwrap,
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        os.geteuid() != 0,
        reason="sandboxes have host uids of their own only under a root service (run as root)",
    ),
    needs_util_linux,
]


@pytest.fixture(scope="module")
def service() -> Iterator[LocalE2bService]:
    with LocalE2bService() as running:
        yield running


@pytest.fixture(scope="module")
def client(service: LocalE2bService) -> Client:
    return Client(service)


@pytest.fixture
def pair(client: Client) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    first, second = client.create(), client.create()
    yield first, second
    for created in (first, second):
        client.control("DELETE", f"/sandboxes/{created['sandboxID']}")


def test_two_sandboxes_run_as_different_host_uids(
    client: Client, pair: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    uids = [host_uid_of(client, sandbox, user) for sandbox in pair for user in ("user", "root")]
    assert len(set(uids)) == 4
    assert all(uid >= 2**31 - 2**20 for uid in uids)  # none of them a host account


@pytest.mark.parametrize("user", ["user", "root"])
@pytest.mark.parametrize("place", ["home", "root"])
def test_a_sandbox_cannot_read_or_write_another_sandboxs_home_or_root(
    service: LocalE2bService,
    client: Client,
    pair: tuple[dict[str, Any], dict[str, Any]],
    user: str,
    place: str,
) -> None:
    first, second = pair
    plant = "echo secret > /root/s; echo secret > /home/user/s; chmod 644 /root/s /home/user/s"
    run_as(client, second, "root", plant)
    target = os.path.join(sandbox_directory(service, second), place)
    attacker = host_uid_of(client, first, user)
    read = as_host_uid(service, attacker, f"cat {target}/s")
    assert "secret" not in read.stdout and "Permission denied" in read.stderr
    wrote = as_host_uid(service, attacker, f"echo planted > {target}/p")
    assert wrote.returncode != 0 and "Permission denied" in wrote.stderr


def test_a_sandbox_cannot_signal_another_sandboxs_processes(
    service: LocalE2bService, client: Client, pair: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    first, second = pair
    mark = marker()
    start_as(client, second, "user", f"sleep {mark}")
    assert gone(lambda: bool(marked(mark)))
    victim = marked(mark)[0]
    for user in ("user", "root"):
        killed = as_host_uid(service, host_uid_of(client, first, user), f"kill -9 {victim}")
        assert "Operation not permitted" in killed.stderr
    assert marked(mark) == [victim]


def test_a_sandbox_cannot_reach_another_sandboxs_port(
    client: Client, pair: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    first, second = pair
    listen = "s=socket.socket(); s.bind(('127.0.0.1', 8431)); s.listen(); print('up', flush=True)"
    serve = f'python3 -c "import socket, time; {listen}; time.sleep(60)"'
    start_as(client, second, "user", serve).until(has_stdout("up"))
    probe = "python3 -c \"import socket; socket.create_connection(('127.0.0.1', 8431), 2)\""
    assert "Connection refused" not in start_as(client, second, "user", probe).finish().stderr
    assert "Connection refused" in start_as(client, first, "user", probe).finish().stderr


def test_a_forks_files_belong_to_the_forks_own_uids(
    service: LocalE2bService, client: Client, pair: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    first, _ = pair
    run_as(client, first, "user", "echo mine > ~/own")
    run_as(client, first, "root", "echo roots > /home/user/roots")
    forked = client.control("POST", f"/sandboxes/{first['sandboxID']}/fork", json={"count": 1})
    assert forked.status_code == 201, forked.text
    fork = forked.json()[0]["sandbox"]
    try:
        home = service.sandbox_home(fork["sandboxID"])
        assert os.stat(os.path.join(home, "own")).st_uid == host_uid_of(client, fork, "user")
        assert os.stat(os.path.join(home, "roots")).st_uid == host_uid_of(client, fork, "root")
        assert host_uid_of(client, fork, "user") != host_uid_of(client, first, "user")
    finally:
        client.control("DELETE", f"/sandboxes/{fork['sandboxID']}")
