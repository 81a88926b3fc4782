"""E2bServer's files, lists, connect and lifetimes: what tests of file-moving code rely on."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from piship_remote.testing import E2bServer

TIMEOUT = 10
HOME = "/home/user"
TOKEN = {"X-Access-Token": "envd-token-1"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def server(clock: Clock) -> Iterator[E2bServer]:
    with E2bServer(clock=clock, distinct_ids=True) as running:
        yield running


def _create(server: E2bServer, **body: object) -> str:
    created = requests.post(
        server.url + "/v2/sandboxes", json={"templateID": "t", **body}, timeout=TIMEOUT
    )
    assert created.status_code == 201
    sandbox_id: str = created.json()["sandboxID"]
    return sandbox_id


def test_uploads_land_in_the_sandboxs_tree(server: E2bServer) -> None:
    sandbox = _create(server)
    headers = {**TOKEN, "E2b-Sandbox-Id": sandbox}
    raw = requests.post(
        server.url + "/files",
        params={"path": "a/raw.bin"},
        data=b"\x00raw",
        headers={**headers, "Content-Type": "application/octet-stream"},
        timeout=TIMEOUT,
    )
    assert raw.json() == [{"path": f"{HOME}/a/raw.bin", "name": "raw.bin", "type": "file"}]
    parts = [("file", ("b.txt", b"b")), ("file", ("/tmp/c.txt", b"c"))]
    multi = requests.post(server.url + "/files", files=parts, headers=headers, timeout=TIMEOUT)
    assert [e["path"] for e in multi.json()] == [f"{HOME}/b.txt", "/tmp/c.txt"]
    assert server.files(sandbox) == {
        f"{HOME}/a/raw.bin": b"\x00raw",
        f"{HOME}/b.txt": b"b",
        "/tmp/c.txt": b"c",
    }
    assert server.files("sbx-other") == {}


def test_downloads_and_their_errors(server: E2bServer) -> None:
    sandbox = _create(server)
    headers = {**TOKEN, "E2b-Sandbox-Id": sandbox}
    requests.post(
        server.url + "/files",
        params={"path": "r.txt"},
        data=b"read me",
        headers={**headers, "Content-Type": "application/octet-stream"},
        timeout=TIMEOUT,
    )
    assert (
        requests.get(
            server.url + "/files", params={"path": "r.txt"}, headers=headers, timeout=TIMEOUT
        ).content
        == b"read me"
    )
    missing = requests.get(
        server.url + "/files", params={"path": "no"}, headers=headers, timeout=TIMEOUT
    )
    assert (missing.status_code, missing.json()) == (
        404,
        {"code": 404, "message": f"path '{HOME}/no' does not exist"},
    )
    unsigned = requests.get(
        server.url + "/files",
        params={"path": "r.txt"},
        headers={"E2b-Sandbox-Id": sandbox},
        timeout=TIMEOUT,
    )
    assert (unsigned.status_code, unsigned.json()["message"]) == (
        401,
        "missing signature query parameter",
    )


def test_filesystem_rpcs_walk_the_tree(server: E2bServer) -> None:
    sandbox = _create(server)
    headers = {**TOKEN, "E2b-Sandbox-Id": sandbox}

    def rpc(method: str, body: object) -> requests.Response:
        return requests.post(
            f"{server.url}/filesystem.Filesystem/{method}",
            json=body,
            headers=headers,
            timeout=TIMEOUT,
        )

    assert rpc("MakeDir", {"path": "d/e"}).json()["entry"]["type"] == "FILE_TYPE_DIRECTORY"
    assert rpc("MakeDir", {"path": "d/e"}).status_code == 409
    requests.post(
        server.url + "/files",
        files=[("file", ("d/e/f.txt", b"f"))],
        headers=headers,
        timeout=TIMEOUT,
    )
    assert [e["name"] for e in rpc("ListDir", {"path": "d", "depth": 2}).json()["entries"]] == [
        "e",
        "f.txt",
    ]
    assert rpc("Stat", {"path": "d/e/f.txt"}).json()["entry"]["size"] == "1"
    assert rpc("Move", {"source": "d", "destination": "m"}).json()["entry"]["path"] == f"{HOME}/m"
    assert server.files(sandbox) == {f"{HOME}/m/e/f.txt": b"f"}
    assert rpc("Remove", {"path": "m"}).json() == {}
    assert rpc("Stat", {"path": "m"}).json()["code"] == "not_found"


def test_list_filters_by_metadata_and_connect_finds_the_live_one(server: E2bServer) -> None:
    mine = _create(server, metadata={"created-by": "piship"})
    _create(server, metadata={"created-by": "other"})
    listed = requests.get(
        server.url + "/v2/sandboxes", params={"metadata": "created-by=piship"}, timeout=TIMEOUT
    ).json()
    assert [(s["sandboxID"], s["metadata"]) for s in listed] == [(mine, {"created-by": "piship"})]
    assert (
        requests.post(f"{server.url}/v2/sandboxes/{mine}/connect", json={}, timeout=TIMEOUT).json()[
            "sandboxID"
        ]
        == mine
    )
    assert (
        requests.post(
            f"{server.url}/sandboxes/nosuch/connect", json={}, timeout=TIMEOUT
        ).status_code
        == 404
    )


def test_a_sandbox_whose_timeout_passed_is_gone(server: E2bServer, clock: Clock) -> None:
    sandbox = _create(server, timeout=60)
    clock.now += 59
    assert server.live_sandboxes == [sandbox]
    clock.now += 1
    assert server.live_sandboxes == []
    assert requests.get(f"{server.url}/sandboxes/{sandbox}", timeout=TIMEOUT).status_code == 404
    envd = requests.post(
        server.url + "/process.Process/Start",
        data=b"",
        headers={"E2b-Sandbox-Id": sandbox},
        timeout=TIMEOUT,
    )
    assert (envd.status_code, envd.json()["message"]) == (502, "The sandbox was not found")


def test_a_renewal_and_the_v2_default_keep_a_sandbox_alive(server: E2bServer, clock: Clock) -> None:
    sandbox = _create(server)
    clock.now += 299
    assert server.live_sandboxes == [sandbox]
    requests.post(
        f"{server.url}/sandboxes/{sandbox}/timeout", json={"timeout": 100}, timeout=TIMEOUT
    )
    clock.now += 99
    assert server.live_sandboxes == [sandbox]
    clock.now += 1
    assert server.live_sandboxes == []
