"""Snapshots and forks are made by the sandboxes' own agents, never by the host as root.

The attacks: the host copied a running sandbox's home (``copytree``, then a walk with
``lchown``) as host root, so a sandbox swapping a file and a symlink in a loop
(``renameat2(RENAME_EXCHANGE)``) got a root-only host file copied into a fork and a host
file chowned to its uid; a 3 GiB sparse file, free against the sandbox's disk cap, was
written out in full on the host; a tree 1,000+ levels deep broke fork and snapshot with
``RecursionError``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from piship_remote.local import LocalE2bService
from tests.support.attacks import python_in
from tests.support.local_service import PROBLEM, Client

pytestmark = [
    pytest.mark.skipif(PROBLEM is not None, reason=f"bubblewrap cannot run: {PROBLEM}"),
    pytest.mark.timeout(600),
]
DELETE_TIMEOUT = (5, 150)
FORKS = 15
GIB = 1024**3
SECRET = "root-only host secret"

# Swaps a regular file and a symlink to the host file, as fast as it can.
RACER = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
os.chdir(os.path.expanduser("~"))
with open("swap", "w") as plain:
    plain.write("plain")
os.symlink({target!r}, "link")
while True:
    libc.renameat2(-100, b"swap", -100, b"link", 2)  # RENAME_EXCHANGE
"""
READ_BACK = r"""
import os
os.chdir(os.path.expanduser("~"))
for name in ("swap", "link"):
    try:
        with open(name) as handle:
            print(handle.read())
    except OSError:
        pass
"""


@pytest.fixture
def host_secret() -> Iterator[str]:
    """A root-only (0600) host file, in a directory anyone may search."""
    directory = tempfile.mkdtemp(prefix="piship-attack-", dir="/tmp")
    os.chmod(directory, 0o755)
    secret = os.path.join(directory, "secret")
    with open(secret, "w", encoding="ascii") as handle:
        handle.write(SECRET)
    os.chmod(secret, 0o600)
    yield secret
    shutil.rmtree(directory)


def _fork(client: Client, sandbox: dict[str, Any]) -> dict[str, Any]:
    answer = client.control("POST", f"/sandboxes/{sandbox['sandboxID']}/fork", json={"count": 1})
    assert answer.status_code == 201, answer.text
    [result] = answer.json()
    assert "sandbox" in result, result
    fork: dict[str, Any] = result["sandbox"]
    return fork


def _snapshot(client: Client, sandbox: dict[str, Any]) -> str:
    answer = client.control("POST", f"/sandboxes/{sandbox['sandboxID']}/snapshots", json={})
    assert answer.status_code == 201, answer.text
    snapshot_id: str = answer.json()["snapshotID"]
    return snapshot_id


def _delete(client: Client, sandbox: dict[str, Any]) -> None:
    """Delete ``sandbox``; a deep tree on the host's disk (a service not run as root) takes
    its agent a while to empty."""
    deleted = client.session.delete(
        f"{client.service.url}/sandboxes/{sandbox['sandboxID']}",
        headers={"X-API-Key": client.service.api_key},
        timeout=DELETE_TIMEOUT,
    )
    assert deleted.status_code == 204, deleted.text


def test_swapping_a_file_and_a_symlink_never_copies_or_chowns_a_host_file(
    client: Client, sandbox: dict[str, Any], host_secret: str
) -> None:
    before = os.stat(host_secret)
    racer = client.start(sandbox, "python3 -c " + _quoted(RACER.format(target=host_secret)))
    try:
        copies = [_fork(client, sandbox) for _ in range(FORKS)]
        copies += [client.create(templateID=_snapshot(client, sandbox)) for _ in range(3)]
        for copy in copies:
            assert SECRET not in python_in(client, copy, READ_BACK)
            _delete(client, copy)
    finally:
        racer.response.close()
    after = os.stat(host_secret)
    assert (after.st_uid, after.st_gid, after.st_mode) == (
        before.st_uid,
        before.st_gid,
        before.st_mode,
    )


SPARSE = r"""
import os
os.chdir(os.path.expanduser("~"))
with open("big", "wb") as big:
    big.truncate(3 * 1024**3)
    big.seek(2 * 1024**3)
    big.write(b"middle")
"""
SPARSE_SEEN = r"""
import os
info = os.stat(os.path.expanduser("~/big"))
with open(os.path.expanduser("~/big"), "rb") as big:
    big.seek(2 * 1024**3)
    print(info.st_size, info.st_blocks * 512, big.read(6).decode())
"""


def _host_bytes(top: str) -> int:
    """The disk the host files under ``top`` take (allocated blocks, not sizes)."""
    total = 0
    for directory, _, files in os.walk(top):
        for name in files:
            total += os.lstat(os.path.join(directory, name)).st_blocks * 512
    return total


def test_a_3_gib_sparse_file_is_forked_and_snapshotted_without_writing_it_out(
    service: LocalE2bService, client: Client, sandbox: dict[str, Any]
) -> None:
    python_in(client, sandbox, SPARSE)
    fork = _fork(client, sandbox)
    snapshot_id = _snapshot(client, sandbox)
    assert _host_bytes(os.path.join(service.root, "snapshots")) < 16 * 1024**2
    restored = client.create(templateID=snapshot_id)
    for copy in (fork, restored):
        size, allocated, middle = python_in(client, copy, SPARSE_SEEN).split()
        assert (int(size), middle) == (3 * GIB, "middle")
        assert int(allocated) < 16 * 1024**2
        _delete(client, copy)


DEEP = 10_000
DEEP_TREE = rf"""
import os
os.chdir(os.path.expanduser("~"))
for _ in range({DEEP}):
    os.mkdir("d")
    os.chdir("d")
with open("leaf", "w") as leaf:
    leaf.write("deepest")
"""
DEEP_SEEN = r"""
import os
os.chdir(os.path.expanduser("~"))
depth = 0
while os.path.isdir("d"):
    os.chdir("d")
    depth += 1
with open("leaf") as leaf:
    print(depth, leaf.read())
"""


def test_a_10000_deep_tree_is_forked_snapshotted_and_deleted_cleanly(
    service: LocalE2bService, client: Client
) -> None:
    sandbox = client.create()
    python_in(client, sandbox, DEEP_TREE)
    fork = _fork(client, sandbox)
    snapshot_id = _snapshot(client, sandbox)
    restored = client.create(templateID=snapshot_id)
    for copy in (fork, restored):
        assert python_in(client, copy, DEEP_SEEN).split() == [str(DEEP), "deepest"]
    ids = [s["sandboxID"] for s in (sandbox, fork, restored)]
    for each in (sandbox, fork, restored):
        _delete(client, each)
    assert not set(ids) & set(service.sandboxes())
    assert not set(ids) & set(os.listdir(service.root))


def _quoted(script: str) -> str:
    return "'" + script.replace("'", "'\"'\"'") + "'"


def test_a_snapshot_past_the_services_disk_budget_is_refused_and_leaves_nothing() -> None:
    with LocalE2bService(max_snapshot_disk_mib=1) as small:
        client = Client(small)
        sandbox = client.create()
        python_in(client, sandbox, "open('/home/user/two', 'wb').write(b'x' * 2 * 1024**2)")
        answer = client.control("POST", f"/sandboxes/{sandbox['sandboxID']}/snapshots", json={})
        assert answer.status_code == 507
        assert "max_snapshot_disk_mib" in answer.json()["message"]
        assert os.listdir(os.path.join(small.root, "snapshots")) == []
        client.session.close()
