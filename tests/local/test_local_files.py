"""The local service's envd file API (``/files``, Filesystem RPCs) and its newer control routes."""

from __future__ import annotations

import base64
import hashlib
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from piship_remote.local import LocalE2bService
from piship_remote.local.isolation import bubblewrap as isolation

PROBLEM = isolation.isolation_problem()
pytestmark = [
    pytest.mark.skipif(PROBLEM is not None, reason=f"bubblewrap cannot run: {PROBLEM}"),
    pytest.mark.timeout(60),
]
TIMEOUT = 20
HOME = "/home/user"
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def service() -> Iterator[LocalE2bService]:
    with LocalE2bService() as running:
        yield running


@pytest.fixture
def sandbox(service: LocalE2bService) -> Iterator[dict[str, Any]]:
    created = _control(service, "POST", "/v2/sandboxes", json={"templateID": "base"})
    assert created.status_code == 201, created.text
    answer: dict[str, Any] = created.json()
    yield answer
    _control(service, "DELETE", f"/sandboxes/{answer['sandboxID']}")


def _control(service: LocalE2bService, method: str, path: str, **kw: Any) -> requests.Response:
    headers = {"X-API-Key": service.api_key}
    return requests.request(method, service.url + path, headers=headers, timeout=TIMEOUT, **kw)


def _envd(sandbox: dict[str, Any]) -> dict[str, str]:
    return {"E2b-Sandbox-Id": sandbox["sandboxID"], "X-Access-Token": sandbox["envdAccessToken"]}


def _upload(
    service: LocalE2bService, sandbox: dict[str, Any], path: str, data: Any, **kw: Any
) -> requests.Response:
    headers = {
        **_envd(sandbox),
        "Content-Type": "application/octet-stream",
        **kw.pop("headers", {}),
    }
    return requests.post(
        service.url + "/files", params={"path": path}, data=data, headers=headers, timeout=TIMEOUT
    )


def _download(service: LocalE2bService, sandbox: dict[str, Any], path: str) -> requests.Response:
    return requests.get(
        service.url + "/files", params={"path": path}, headers=_envd(sandbox), timeout=TIMEOUT
    )


def _rpc(
    service: LocalE2bService, sandbox: dict[str, Any], method: str, body: Any
) -> requests.Response:
    return requests.post(
        f"{service.url}/filesystem.Filesystem/{method}",
        json=body,
        headers=_envd(sandbox),
        timeout=TIMEOUT,
    )


def test_a_body_larger_than_the_request_limit_streams_into_the_sandbox(
    service: LocalE2bService, sandbox: dict[str, Any]
) -> None:
    size = 40 * MIB  # over the 16 MiB whole-body limit: only a streamed body gets through
    block = os.urandom(MIB)
    digest = hashlib.sha256(block * 40).hexdigest()
    answer = _upload(service, sandbox, "big.bin", iter([block] * 40))  # chunked, too
    assert answer.status_code == 200, answer.text
    assert answer.json() == [{"path": f"{HOME}/big.bin", "name": "big.bin", "type": "file"}]
    received = hashlib.sha256()
    total = 0
    with requests.get(
        service.url + "/files",
        params={"path": "big.bin"},
        headers=_envd(sandbox),
        stream=True,
        timeout=TIMEOUT,
    ) as response:
        assert response.status_code == 200
        for piece in response.iter_content(MIB):
            received.update(piece)
            total += len(piece)
    assert (total, received.hexdigest()) == (size, digest)


def test_multipart_parts_are_written_to_their_filenames_as_paths(
    service: LocalE2bService, sandbox: dict[str, Any]
) -> None:
    files = [
        ("file", ("dir/one.txt", b"1")),
        ("other", ("x", b"skipped")),
        ("file", ("/tmp/two.txt", b"22")),
    ]
    answer = requests.post(
        service.url + "/files", files=files, headers=_envd(sandbox), timeout=TIMEOUT
    )
    assert answer.status_code == 200, answer.text
    assert [e["path"] for e in answer.json()] == [f"{HOME}/dir/one.txt", "/tmp/two.txt"]
    assert _download(service, sandbox, "/tmp/two.txt").content == b"22"


def test_two_parts_for_one_path_are_refused_after_the_first(
    service: LocalE2bService, sandbox: dict[str, Any]
) -> None:
    files = [("file", ("same.txt", b"first")), ("file", ("same.txt", b"second"))]
    answer = requests.post(
        service.url + "/files", files=files, headers=_envd(sandbox), timeout=TIMEOUT
    )
    assert answer.status_code == 400
    assert "cannot upload multiple files to the same path" in answer.json()["message"]
    assert _download(service, sandbox, "same.txt").content == b"first"


@pytest.mark.parametrize("data", [b"", b"hello\n", os.urandom(300 * 1024)])
def test_a_download_names_its_length_as_envd_does(
    service: LocalE2bService, sandbox: dict[str, Any], data: bytes
) -> None:
    assert _upload(service, sandbox, "sized.bin", data).status_code == 200
    answer = _download(service, sandbox, "sized.bin")
    assert answer.status_code == 200
    assert answer.headers["Content-Length"] == str(len(data))
    assert "Transfer-Encoding" not in answer.headers
    assert answer.content == data


def test_file_errors_have_envds_statuses_and_json_bodies(
    service: LocalE2bService, sandbox: dict[str, Any]
) -> None:
    missing = _download(service, sandbox, "nope.txt")
    assert (missing.status_code, missing.json()) == (
        404,
        {"code": 404, "message": f"path '{HOME}/nope.txt' does not exist"},
    )
    directory = _download(service, sandbox, "~")
    assert (directory.status_code, directory.json()["message"]) == (
        400,
        f"path '{HOME}' is a directory",
    )
    assert _upload(service, sandbox, "~", b"x").json() == {
        "code": 400,
        "message": f"path is a directory: {HOME}",
    }
    raw = requests.post(
        service.url + "/files",
        data=b"x",
        headers={**_envd(sandbox), "Content-Type": "application/octet-stream"},
        timeout=TIMEOUT,
    )
    assert raw.json()["message"] == "path query parameter is required for raw body upload"


def test_a_symlink_to_a_host_path_is_read_inside_the_sandbox_never_on_the_host(
    service: LocalE2bService, sandbox: dict[str, Any], tmp_path: Any
) -> None:
    secret = tmp_path / "host-secret.txt"
    secret.write_text("host only")
    os.symlink(secret, os.path.join(service.sandbox_home(sandbox["sandboxID"]), "link"))
    answer = _download(service, sandbox, "link")
    assert answer.status_code == 404  # the host path does not exist in the sandbox's view
    assert b"host only" not in answer.content


def test_a_wrong_token_or_a_missing_signature_answers_as_an_unknown_sandbox_and_a_user_401(
    service: LocalE2bService, sandbox: dict[str, Any]
) -> None:
    wrong = requests.get(
        service.url + "/files",
        params={"path": "a"},
        headers={**_envd(sandbox), "X-Access-Token": "bad"},
        timeout=TIMEOUT,
    )
    unknown = {
        "sandboxId": sandbox["sandboxID"],
        "message": "The sandbox was not found",
        "code": 502,
    }
    assert (wrong.status_code, wrong.json()) == (502, unknown)
    unsigned = requests.get(
        service.url + "/files",
        params={"path": "a"},
        headers={"E2b-Sandbox-Id": sandbox["sandboxID"]},
        timeout=TIMEOUT,
    )
    assert (unsigned.status_code, unsigned.json()) == (502, unknown)
    other = requests.get(
        service.url + "/files",
        params={"path": "a", "username": "mallory"},
        headers=_envd(sandbox),
        timeout=TIMEOUT,
    )
    assert other.status_code == 401
    assert other.json()["message"] == "error looking up user 'mallory': user: unknown user mallory"


def test_an_expired_signature_is_refused_with_envds_message(
    service: LocalE2bService, sandbox: dict[str, Any]
) -> None:
    expiration = int(time.time()) - 10
    text = f"a.txt:read::{sandbox['envdAccessToken']}:{expiration}"
    signature = "v1_" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode().rstrip(
        "="
    )
    params = {"path": "a.txt", "signature": signature, "signature_expiration": str(expiration)}
    answer = requests.get(service.url + "/files", params=params, timeout=TIMEOUT)
    assert (answer.status_code, answer.json()) == (
        401,
        {"code": 401, "message": "signature is already expired"},
    )


def test_filesystem_rpcs_answer_envds_entries_and_errors(
    service: LocalE2bService, sandbox: dict[str, Any]
) -> None:
    assert _upload(service, sandbox, "d/f.txt", b"abc").status_code == 200
    stat = _rpc(service, sandbox, "Stat", {"path": "d/f.txt"}).json()["entry"]
    assert (stat["type"], stat["size"], stat["permissions"], stat["owner"]) == (
        "FILE_TYPE_FILE",
        "3",
        "-rw-r--r--",
        "user",
    )
    listed = _rpc(service, sandbox, "ListDir", {"path": "d", "depth": 1}).json()["entries"]
    assert [(e["name"], e["path"]) for e in listed] == [("f.txt", f"{HOME}/d/f.txt")]
    assert _rpc(service, sandbox, "MakeDir", {"path": "d"}).json() == {
        "code": "already_exists",
        "message": f"directory already exists: {HOME}/d",
    }
    missing = _rpc(service, sandbox, "Stat", {"path": "none"})
    assert (missing.status_code, missing.json()["code"]) == (404, "not_found")
    not_dir = _rpc(service, sandbox, "ListDir", {"path": "d/f.txt"})
    assert (not_dir.status_code, not_dir.json()["message"]) == (
        400,
        f"path is not a directory: {HOME}/d/f.txt",
    )
    moved = _rpc(service, sandbox, "Move", {"source": "d/f.txt", "destination": "e/g.txt"}).json()
    assert moved["entry"]["path"] == f"{HOME}/e/g.txt"
    assert _rpc(service, sandbox, "Remove", {"path": "e"}).json() == {}
    assert _rpc(service, sandbox, "Remove", {"path": "e"}).status_code == 200  # missing is fine


def test_the_helper_processes_are_not_in_the_process_list(
    service: LocalE2bService, sandbox: dict[str, Any]
) -> None:
    _upload(service, sandbox, "x.txt", b"x")
    listed = requests.post(
        service.url + "/process.Process/List", json={}, headers=_envd(sandbox), timeout=TIMEOUT
    )
    assert listed.json() == {}


def test_v2_create_without_timeout_lives_e2bs_default_300_seconds(
    service: LocalE2bService, sandbox: dict[str, Any]
) -> None:
    detail = _control(service, "GET", f"/sandboxes/{sandbox['sandboxID']}").json()
    started = time.time()
    end = time.mktime(time.strptime(detail["endAt"][:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
    assert 290 <= end - started <= 301


def test_lists_filter_by_metadata_and_page_with_next_token(service: LocalE2bService) -> None:
    made = [
        _control(
            service,
            "POST",
            "/v2/sandboxes",
            json={"templateID": "base", "metadata": {"batch": "p"}},
        ).json()
        for _ in range(3)
    ]
    try:
        first = _control(
            service, "GET", "/v2/sandboxes", params={"metadata": "batch=p", "limit": 2}
        )
        assert len(first.json()) == 2 and "x-next-token" in first.headers
        second = _control(
            service,
            "GET",
            "/v2/sandboxes",
            params={"metadata": "batch=p", "limit": 2, "nextToken": first.headers["x-next-token"]},
        )
        assert "x-next-token" not in second.headers
        seen = {s["sandboxID"] for s in first.json() + second.json()}
        assert seen == {m["sandboxID"] for m in made}
        assert all(s["metadata"] == {"batch": "p"} for s in second.json())
        v1 = _control(service, "GET", "/sandboxes", params={"metadata": "batch=none"})
        assert v1.json() == []
        bad = _control(service, "GET", "/v2/sandboxes", params={"nextToken": "!!"})
        assert (bad.status_code, bad.json()["message"]) == (400, "Invalid next token")
    finally:
        for m in made:
            _control(service, "DELETE", f"/sandboxes/{m['sandboxID']}")


def test_connect_answers_the_sandbox_or_404(
    service: LocalE2bService, sandbox: dict[str, Any]
) -> None:
    connected = _control(service, "POST", f"/v2/sandboxes/{sandbox['sandboxID']}/connect", json={})
    assert connected.status_code == 200
    assert connected.json()["envdAccessToken"] == sandbox["envdAccessToken"]
    assert connected.json()["domain"] == sandbox["domain"]
    assert _control(service, "POST", "/v2/sandboxes/nosuch/connect", json={}).status_code == 404


def test_metrics_report_the_sandboxs_disk_use(
    service: LocalE2bService, sandbox: dict[str, Any]
) -> None:
    _upload(service, sandbox, "weight.bin", b"w" * MIB)
    [sample] = _control(service, "GET", f"/sandboxes/{sandbox['sandboxID']}/metrics").json()
    assert sample["diskUsed"] >= MIB
    assert sample["memTotal"] > 0 and sample["cpuCount"] >= 1


def test_envd_is_reached_by_the_host_name_get_host_gives(
    service: LocalE2bService, sandbox: dict[str, Any]
) -> None:
    host = f"49983-{sandbox['sandboxID']}.{sandbox['domain']}"
    answer = requests.get(
        service.url + "/files",
        params={"path": "nope"},
        headers={"Host": host, "X-Access-Token": sandbox["envdAccessToken"]},
        timeout=TIMEOUT,
    )
    assert answer.json()["message"] == f"path '{HOME}/nope' does not exist"


def test_a_write_where_the_sandbox_cannot_write_says_read_only(
    service: LocalE2bService, sandbox: dict[str, Any]
) -> None:
    written = _upload(service, sandbox, "/dev/piship/x.txt", b"x")
    assert (written.status_code, written.json()["message"]) == (
        500,
        "error ensuring directories: mkdir /dev/piship: read-only file system",
    )
