"""The doubles' in-memory shell: what it runs, what it leaves to a test's answers, and the
archive rules it shares with the library."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from piship_remote import activate_sandbox
from piship_remote.backends.e2b import E2bCompatibleBackend
from piship_remote.testing import E2bServer
from piship_remote.testing.e2b_files import MemoryTree
from piship_remote.testing.sandbox_shell import Shell

pytestmark = pytest.mark.timeout(60)
POLICY = {"required": True, "network": {"mode": "allow"}}


def backend(server: E2bServer) -> E2bCompatibleBackend:
    return E2bCompatibleBackend(
        endpoint=server.url, envd_url=server.url, credential=lambda: "e2b-key-000001"
    )


def hostile_tar() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for name in ("../escape.txt", "/etc/owned", "ok.txt"):
            info = tarfile.TarInfo(name)
            info.size = 2
            archive.addfile(info, io.BytesIO(b"no"))
        link = tarfile.TarInfo("link")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc"
        archive.addfile(link)
    return out.getvalue()


def test_tar_unpacks_only_what_lands_inside_the_target() -> None:
    tree = MemoryTree()
    tree.write_file("/tmp/in.tar", hostile_tar())
    result = Shell(tree, "/home/user").run("mkdir -p out && tar -xf /tmp/in.tar -C out")
    assert result.exit_code != 0 and b"escape.txt" in result.stderr
    assert {p: d for p, d in tree.snapshot().items() if p != "/tmp/in.tar"} == {
        "/home/user/out/ok.txt": b"no"
    }


def test_the_shell_reports_failures_as_sh_does() -> None:
    shell = Shell(MemoryTree(), "/home/user")
    missing = shell.run("cat nope.txt; echo after $?")
    assert missing.stdout == b"after 1\n" and b"nope.txt" in missing.stderr
    assert shell.run("{ false || exit 3; }; echo never").exit_code == 3
    assert shell.run("if [ -d /tmp ]; then echo dir; else echo no; fi").stdout == b"dir\n"


def test_a_command_it_does_not_know_keeps_the_default_answer(tmp_path: Path) -> None:
    with E2bServer() as server:
        sandbox = activate_sandbox(POLICY, backend=backend(server), workspace=tmp_path)
        try:
            seen = bytearray()
            assert sandbox.exec("make test", on_data=seen.extend).exit_code == 0
            assert bytes(seen) == b""
            assert sandbox.exec("echo hi > note.txt").exit_code == 0
            assert server.files(sandbox.id) == {"/home/user/note.txt": b"hi\n"}
        finally:
            sandbox.dispose()


def test_file_moves_run_in_the_tree_beside_a_tests_command(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("a")
    with E2bServer(command=lambda start: {"stdout": "from the test\n"}) as server:
        sandbox = activate_sandbox(POLICY, backend=backend(server), workspace=tmp_path)
        try:
            assert sandbox.files.upload(tmp_path / "src").files == 1
            assert server.files(sandbox.id) == {"/home/user/src/a.txt": b"a"}
            seen = bytearray()
            sandbox.exec("echo hi", on_data=seen.extend)
            assert bytes(seen) == b"from the test\n"  # not a file move: the test answers
        finally:
            sandbox.dispose()


def test_each_live_sandbox_has_its_own_id(tmp_path: Path) -> None:
    with E2bServer() as server:
        first = activate_sandbox(POLICY, backend=backend(server), workspace=tmp_path)
        second = activate_sandbox(POLICY, backend=backend(server), workspace=tmp_path)
        assert (first.id, second.id) == ("sbx1", "sbx2")
        first.files.write("mine.txt", b"1")
        assert not second.files.exists("mine.txt")
        first.dispose()
        third = activate_sandbox(POLICY, backend=backend(server), workspace=tmp_path)
        assert third.id == "sbx1" and not third.files.exists("mine.txt")  # a fresh tree
        second.dispose()
        third.dispose()


def test_distinct_ids_never_reuses_one(tmp_path: Path) -> None:
    with E2bServer(distinct_ids=True) as server:
        ids = []
        for _ in range(2):
            sandbox = activate_sandbox(POLICY, backend=backend(server), workspace=tmp_path)
            ids.append(sandbox.id)
            sandbox.dispose()
        assert ids == ["sbx1", "sbx2"]
