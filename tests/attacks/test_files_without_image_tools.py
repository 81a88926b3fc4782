"""File operations need nothing from the image: a sandbox of a root filesystem with no shell
and no coreutils (only empty ``/bin``, ``/etc``, ``/lib``) still writes, reads, lists, stats,
moves and removes files, as envd does.

The finding: the file API ran ``/bin/sh`` scripts (``mkdir``, ``cat``, ``mv``, ``stat``,
``find``) inside the sandbox, so such an image could not even write a file ("internal
error").
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from piship_remote.local import LocalE2bService
from tests.support.image import minimal_rootfs
from tests.support.local_service import PROBLEM, Client

pytestmark = [
    pytest.mark.skipif(PROBLEM is not None, reason=f"bubblewrap cannot run: {PROBLEM}"),
    pytest.mark.timeout(120),
]
TIMEOUT = 20
HOME = "/home/user"


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rootfs = minimal_rootfs(tmp_path_factory.mktemp("bare") / "rootfs", programs=())
    assert not any((rootfs / "bin").iterdir())
    return rootfs


@pytest.fixture(scope="module")
def service(bare: Path) -> Iterator[LocalE2bService]:
    with LocalE2bService(templates={"bare": bare}) as running:
        yield running


@pytest.fixture
def sandbox(client: Client) -> Iterator[dict[str, Any]]:
    created = client.create(templateID="bare")
    yield created
    client.control("DELETE", f"/sandboxes/{created['sandboxID']}")


def _envd(sandbox: dict[str, Any]) -> dict[str, str]:
    return {"E2b-Sandbox-Id": sandbox["sandboxID"], "X-Access-Token": sandbox["envdAccessToken"]}


def _rpc(client: Client, sandbox: dict[str, Any], method: str, body: object) -> requests.Response:
    return client.session.post(
        f"{client.service.envd_url}/filesystem.Filesystem/{method}",
        json=body,
        headers={**_envd(sandbox), "Content-Type": "application/json"},
        timeout=TIMEOUT,
    )


def _write(client: Client, sandbox: dict[str, Any], path: str, data: bytes) -> requests.Response:
    return client.session.post(
        f"{client.service.envd_url}/files",
        params={"path": path},
        data=data,
        headers={**_envd(sandbox), "Content-Type": "application/octet-stream"},
        timeout=TIMEOUT,
    )


def _read(client: Client, sandbox: dict[str, Any], path: str) -> requests.Response:
    return client.session.get(
        f"{client.service.envd_url}/files",
        params={"path": path},
        headers=_envd(sandbox),
        timeout=TIMEOUT,
    )


def test_a_file_is_written_and_read_back(client: Client, sandbox: dict[str, Any]) -> None:
    assert _write(client, sandbox, f"{HOME}/dir/a.txt", b"no tools").status_code == 200
    read = _read(client, sandbox, f"{HOME}/dir/a.txt")
    assert (read.status_code, read.content) == (200, b"no tools")


def test_a_directory_is_listed_and_an_entry_statted(
    client: Client, sandbox: dict[str, Any]
) -> None:
    _write(client, sandbox, f"{HOME}/listed.txt", b"12345")
    listed = _rpc(client, sandbox, "ListDir", {"path": HOME, "depth": 1})
    assert listed.status_code == 200, listed.text
    assert [e["name"] for e in listed.json()["entries"]] == ["listed.txt"]
    stat = _rpc(client, sandbox, "Stat", {"path": f"{HOME}/listed.txt"})
    assert (stat.json()["entry"]["size"], stat.json()["entry"]["owner"]) == ("5", "user")


def test_a_directory_is_made_a_file_moved_and_removed(
    client: Client, sandbox: dict[str, Any]
) -> None:
    assert _rpc(client, sandbox, "MakeDir", {"path": f"{HOME}/made"}).status_code == 200
    _write(client, sandbox, f"{HOME}/moving.txt", b"m")
    moved = _rpc(
        client, sandbox, "Move", {"source": f"{HOME}/moving.txt", "destination": f"{HOME}/made/m"}
    )
    assert moved.json()["entry"]["path"] == f"{HOME}/made/m"
    assert _rpc(client, sandbox, "Remove", {"path": f"{HOME}/made"}).status_code == 200
    gone = _rpc(client, sandbox, "Stat", {"path": f"{HOME}/made"})
    assert gone.json()["code"] == "not_found"


def test_a_missing_file_is_not_found_with_envds_words(
    client: Client, sandbox: dict[str, Any]
) -> None:
    read = _read(client, sandbox, f"{HOME}/nothing")
    assert (read.status_code, read.json()["message"]) == (
        404,
        f"path '{HOME}/nothing' does not exist",
    )
