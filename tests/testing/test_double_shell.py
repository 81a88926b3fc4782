"""The doubles' in-memory shell: what it runs, what it leaves to a test's answers, and the
archive rules it shares with the library."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from piship_remote import activate_sandbox
from piship_remote.backends import _sandbox_commands as commands
from piship_remote.backends.e2b.backend import E2bCompatibleBackend
from piship_remote.testing import E2bServer, KubernetesServer
from piship_remote.testing.e2b_files import MemoryTree
from piship_remote.testing.sandbox_shell import Shell
from tests.support.seed import kubernetes

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


HOME = "/home/user"
# Each helper of the library's one module of sandbox commands, with sample arguments
# (quoting-worthy names on purpose); a helper added there without a sample fails below.
HELPERS: dict[str, Callable[[], str]] = {
    "unpack_command": lambda: commands.unpack_command(
        "/tmp/.piship-1.tar", f"{HOME}/in dir", then=commands.stamp_command("/tmp/.piship-sync-1")
    ),
    "stamp_command": lambda: commands.stamp_command("/tmp/.piship-sync-1"),
    "pack_changed_command": lambda: commands.pack_changed_command(
        HOME, [".", "it's"], "/tmp/.piship-2.tar", newer_than="/tmp/.piship-sync-1"
    ),
    "pack_tree_command": lambda: commands.pack_tree_command(HOME, "/tmp/.piship-3.tar"),
    "list_files_command": lambda: commands.list_files_command(HOME),
    "working_directory_command": commands.working_directory_command,
    "make_dir_command": lambda: commands.make_dir_command(f"{HOME}/new dir"),
    "remove_command": lambda: commands.remove_command(f"{HOME}/it's"),
    "move_in_command": lambda: commands.move_in_command(
        f"{HOME}/.piship-1.part", f"{HOME}/d/moved", f"{HOME}/d"
    ),
    "copy_out_command": lambda: commands.copy_out_command(f"{HOME}/f", f"{HOME}/.piship-2.part"),
    "stat_command": lambda: commands.stat_command(f"{HOME}/f"),
    "list_dir_command": lambda: commands.list_dir_command(HOME),
}
LIBRARY_HELPERS = sorted(name for name in commands.__all__ if name.endswith("_command"))


def sandbox_tree() -> MemoryTree:
    """What the samples act on: a file, a file with a quote, a staged part, a stamp, an archive."""
    tree = MemoryTree()
    tree.write_file(f"{HOME}/f", b"data")
    tree.make_dir(f"{HOME}/it's")
    tree.write_file(f"{HOME}/it's/q.txt", b"q")
    tree.write_file(f"{HOME}/.piship-1.part", b"part")
    tree.write_file("/tmp/.piship-sync-1", b"", mtime=1.0)
    tree.write_file("/tmp/.piship-1.tar", tar_of({"a.txt": b"a"}))
    return tree


def tar_of(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_every_helper_of_the_library_has_a_sample_here() -> None:
    assert sorted(HELPERS) == LIBRARY_HELPERS


@pytest.mark.parametrize("name", LIBRARY_HELPERS)
def test_the_shell_takes_each_helper_as_the_library_sends_it(name: str) -> None:
    script = HELPERS[name]()
    shell = Shell(sandbox_tree(), HOME)
    assert shell.takes(script, everything=True)  # E2B: {"cmd": "/bin/sh", "args": ["-c", …]}
    assert shell.takes_argv(["env", *commands.HELPER_SHELL, script], everything=True)  # runtime


@pytest.mark.parametrize("name", LIBRARY_HELPERS)
def test_each_helper_runs_in_the_tree(name: str) -> None:
    result = Shell(sandbox_tree(), HOME).run(HELPERS[name]())
    assert (result.exit_code, result.stderr) == (0, b"")


def test_the_librarys_pack_and_unpack_carry_files_through_the_tree() -> None:
    tree = sandbox_tree()
    shell = Shell(tree, HOME)
    pack = commands.pack_changed_command(HOME, ["."], "/tmp/.piship-2.tar", newer_than=None)
    assert shell.run(pack).exit_code == 0
    unpack = commands.unpack_command("/tmp/.piship-2.tar", "/copy", then="touch /copy/done")
    assert shell.run(unpack).exit_code == 0
    listed = shell.run(commands.list_files_command("/copy")).stdout
    assert listed.split(b"\0") == [
        b"./.piship-1.part",
        b"./done",
        b"./f",
        b"./it's/q.txt",
        commands.LISTING_END.encode(),
    ]
    assert tree.kind("/tmp/.piship-2.tar") is None  # the unpack removes its archive


def test_a_refused_unpack_keeps_tars_status_and_still_removes_the_archive() -> None:
    tree = MemoryTree()
    tree.write_file("/tmp/.piship-1.tar", hostile_tar())
    unpack = commands.unpack_command("/tmp/.piship-1.tar", "/out", then="touch /out/done")
    result = Shell(tree, HOME).run(unpack)
    assert result.exit_code == 2 and b"escape.txt" in result.stderr
    assert tree.snapshot() == {"/out/ok.txt": b"no"}  # no stamp, no archive left


def test_the_listing_is_cut_short_when_its_directory_is_missing() -> None:
    result = Shell(MemoryTree(), HOME).run(commands.list_files_command("/nowhere"))
    assert result.exit_code != 0 and commands.LISTING_END.encode() not in result.stdout


def test_printf_reuses_its_format_and_knows_the_escapes() -> None:
    result = Shell(MemoryTree(), HOME).run("printf '%s=%d\\n' a 1 b 2; printf 'x\\0y%%'")
    assert result.stdout == b"a=1\nb=2\nx\0y%"


def test_an_exported_assignment_reaches_a_nested_shell() -> None:
    result = Shell(MemoryTree(), HOME).run("A=1; export A; export B=2; sh -c 'echo $A$B'")
    assert result.stdout == b"12\n"


def test_the_kubernetes_double_finds_its_directory_beside_a_tests_execute(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("a")
    with KubernetesServer(execute=lambda command: {"stdout": "from the test\n"}) as server:
        sandbox = activate_sandbox(POLICY, backend=kubernetes(server.url), workspace=tmp_path)
        try:
            assert sandbox.files.upload(tmp_path / "src").files == 1
            assert server.files(sandbox.id) == {"src/a.txt": b"a"}
        finally:
            sandbox.dispose()
