"""The official E2B Python SDK's file and sandbox-management calls against our services.

Two targets, the same tests: ``E2bServer`` (in-memory files, envd 0.4.0, so the SDK
writes multipart) and ``LocalE2bService`` (files inside a bubblewrap sandbox, envd
0.6.4, so the SDK writes octet-stream). The SDK is pointed at loopback with
``api_url`` and ``sandbox_url``; nothing leaves the machine.
"""

from __future__ import annotations

from collections.abc import Iterator

import attrs
import pytest
from local_e2b import local_e2b_service

from tests.support.optional_peers import install_hint

pytest.importorskip("e2b", reason=install_hint("interop"))
pytest.importorskip("httpx", reason=install_hint("interop"))

import httpx
from e2b import FileNotFoundException, FileType, InvalidArgumentException, Sandbox, SandboxQuery

from piship_remote.testing import E2bServer

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]

DOUBLE_KEY = "e2b_0123456789abcdef"
HOME = "/home/user"


@attrs.frozen
class Target:
    name: str
    url: str
    api_key: str

    def options(self) -> dict[str, object]:
        return {"api_key": self.api_key, "api_url": self.url, "request_timeout": 10}

    def create(self, **extra: object) -> Sandbox:
        return Sandbox.create(sandbox_url=self.url, **self.options(), **extra)  # type: ignore[arg-type]


def _local() -> Iterator[Target]:
    with local_e2b_service() as service:
        yield Target("local", service.url, service.api_key)


def _double() -> Iterator[Target]:
    with E2bServer(distinct_ids=True) as server:
        yield Target("double", server.url, DOUBLE_KEY)


@pytest.fixture(params=["double", "local"])
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from _double() if request.param == "double" else _local()


@pytest.fixture
def sandbox(target: Target) -> Iterator[Sandbox]:
    sandbox = target.create(metadata={"created-by": "piship", "case": "files"})
    yield sandbox
    sandbox.kill()


def test_write_then_read_round_trips_bytes_and_text(sandbox: Sandbox) -> None:
    info = sandbox.files.write("notes/a.txt", "hello\n")
    assert (info.path, info.name) == (f"{HOME}/notes/a.txt", "a.txt")
    assert sandbox.files.read("notes/a.txt") == "hello\n"
    assert bytes(sandbox.files.read("~/notes/a.txt", format="bytes")) == b"hello\n"


def test_write_files_writes_several_paths_in_one_call(sandbox: Sandbox) -> None:
    written = sandbox.files.write_files(
        [{"path": "one.txt", "data": "1"}, {"path": "/tmp/two.bin", "data": b"\x00\x02"}]
    )
    assert [w.path for w in written] == [f"{HOME}/one.txt", "/tmp/two.bin"]
    assert bytes(sandbox.files.read("/tmp/two.bin", format="bytes")) == b"\x00\x02"


def test_reading_a_missing_file_is_file_not_found(sandbox: Sandbox) -> None:
    with pytest.raises(FileNotFoundException, match=f"path '{HOME}/nope' does not exist"):
        sandbox.files.read("nope")


def test_list_exists_and_get_info_describe_the_tree(sandbox: Sandbox) -> None:
    sandbox.files.write("tree/sub/deep.txt", "x")
    sandbox.files.write("tree/top.txt", "abc")
    shallow = {(e.name, e.type) for e in sandbox.files.list("tree")}
    assert shallow == {("sub", FileType.DIR), ("top.txt", FileType.FILE)}
    deep = {e.path for e in sandbox.files.list("tree", depth=2)}
    assert f"{HOME}/tree/sub/deep.txt" in deep
    assert sandbox.files.exists("tree/top.txt") and not sandbox.files.exists("tree/none")
    info = sandbox.files.get_info("tree/top.txt")
    assert (info.type, info.size, info.path) == (FileType.FILE, 3, f"{HOME}/tree/top.txt")


def test_make_dir_is_true_then_false_and_rename_moves(sandbox: Sandbox) -> None:
    assert sandbox.files.make_dir("made/here") is True
    assert sandbox.files.make_dir("made/here") is False
    sandbox.files.write("made/file.txt", "m")
    moved = sandbox.files.rename("made/file.txt", "elsewhere/file.txt")
    assert moved.path == f"{HOME}/elsewhere/file.txt"
    assert not sandbox.files.exists("made/file.txt")
    assert sandbox.files.read("elsewhere/file.txt") == "m"


def test_remove_deletes_a_directory_and_a_missing_path_is_fine(sandbox: Sandbox) -> None:
    sandbox.files.write("gone/x.txt", "x")
    sandbox.files.remove("gone")
    assert not sandbox.files.exists("gone")
    sandbox.files.remove("never-was")


def test_listing_a_file_is_invalid_argument(sandbox: Sandbox) -> None:
    sandbox.files.write("plain.txt", "p")
    with pytest.raises(InvalidArgumentException, match="path is not a directory"):
        sandbox.files.list("plain.txt")


def test_signed_upload_and_download_urls_work_without_the_token(
    target: Target, sandbox: Sandbox
) -> None:
    upload = httpx.post(
        sandbox.upload_url("signed/up.txt"), files={"file": ("up.txt", b"up!")}, timeout=10
    )
    assert upload.status_code == 200, upload.text
    download = httpx.get(sandbox.download_url("signed/up.txt"), timeout=10)
    assert (download.status_code, download.content) == (200, b"up!")
    forged = httpx.get(sandbox.download_url("signed/up.txt") + "x", timeout=10)
    # One sandbox_url for all: the local service finds the sandbox by the signature, so a
    # forged one names no sandbox (the edge's 502); the double has one sandbox token.
    assert forged.status_code == (502 if target.name == "local" else 401)


def test_list_filters_by_metadata(target: Target, sandbox: Sandbox) -> None:
    other = target.create(metadata={"created-by": "someone-else"})
    try:
        query = SandboxQuery(metadata={"created-by": "piship"})
        found = Sandbox.list(query=query, **target.options()).next_items()  # type: ignore[arg-type]
        assert [s.sandbox_id for s in found] == [sandbox.sandbox_id]
        assert found[0].metadata == {"created-by": "piship", "case": "files"}
    finally:
        other.kill()


def test_connect_by_id_reaches_the_same_files(target: Target, sandbox: Sandbox) -> None:
    sandbox.files.write("kept.txt", "still here")
    again = Sandbox.connect(sandbox.sandbox_id, sandbox_url=target.url, **target.options())  # type: ignore[arg-type]
    assert again.sandbox_id == sandbox.sandbox_id
    assert again.files.read("kept.txt") == "still here"


def test_get_host_names_the_sandbox_port(target: Target, sandbox: Sandbox) -> None:
    host = sandbox.get_host(8000)
    assert host.startswith(f"8000-{sandbox.sandbox_id}.")
    if target.name == "local":  # the local service answers with its own loopback domain
        assert host.endswith(".localhost:" + target.url.rsplit(":", 1)[1])
