"""``SandboxFiles`` and workspace sync over a directory stand-in for the sandbox."""

from __future__ import annotations

import io
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from piship_remote.model.errors import PiShipError
from piship_remote.model.transfer import SkippedPath
from piship_remote.sandbox.files import SandboxFiles
from piship_remote.workspace import _archive
from piship_remote.workspace._sync import WorkspaceSync
from tests.support.files import DirectoryFiles, bash_runner, sandbox_files, small_filesystem


@pytest.fixture
def remote(tmp_path: Path) -> Path:
    path = tmp_path / "remote"
    path.mkdir()
    return path


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return path


@pytest.fixture
def files(remote: Path, workspace: Path) -> SandboxFiles:
    return sandbox_files(
        DirectoryFiles(str(remote)),
        bash_runner,
        workspace=workspace,
        write_allow=[str(workspace)],
    )


def test_write_then_read_a_relative_path(files: SandboxFiles, remote: Path) -> None:
    info = files.write("data/in.txt", "héllo")
    assert info.path == str(remote / "data" / "in.txt")
    assert files.read("data/in.txt") == "héllo".encode()
    assert files.read_text("data/in.txt") == "héllo"


def test_write_streams_a_file_object(files: SandboxFiles) -> None:
    files.write("big", io.BytesIO(b"z" * 3_000_000))
    assert files.read("big") == b"z" * 3_000_000


def test_write_refuses_a_text_mode_file(files: SandboxFiles) -> None:
    with pytest.raises(TypeError, match="binary mode"):
        files.write("x", io.StringIO("text"))


def test_list_is_sorted_and_one_level(files: SandboxFiles) -> None:
    files.write("d/b", b"")
    files.write("d/a", b"")
    files.write("d/sub/c", b"")
    assert [(i.name, i.type) for i in files.list("d")] == [
        ("a", "file"),
        ("b", "file"),
        ("sub", "dir"),
    ]


def test_exists_remove_and_make_dir(files: SandboxFiles) -> None:
    assert files.make_dir("new/dir") is True
    assert files.make_dir("new/dir") is False
    files.write("new/dir/f", b"1")
    files.remove("new")
    assert not files.exists("new")
    files.remove("new")  # already gone: fine


def test_reading_a_missing_file_is_file_not_found(files: SandboxFiles) -> None:
    with pytest.raises(PiShipError) as raised:
        files.read("nope")
    assert raised.value.code == "FILE_NOT_FOUND"


def test_an_empty_remote_path_is_a_value_error(files: SandboxFiles) -> None:
    with pytest.raises(ValueError, match="non-empty string"):
        files.read("")


def test_upload_a_directory_as_cp_r(files: SandboxFiles, workspace: Path, remote: Path) -> None:
    (workspace / "src" / "pkg").mkdir(parents=True)
    (workspace / "src" / "pkg" / "m.py").write_text("x = 1")
    summary = files.upload(workspace / "src", "copy/src")
    assert (summary.files, summary.bytes) == (1, 5)
    assert (remote / "copy" / "src" / "pkg" / "m.py").read_text() == "x = 1"


def test_upload_defaults_to_the_same_relative_path(
    files: SandboxFiles, workspace: Path, remote: Path
) -> None:
    (workspace / "data").mkdir()
    (workspace / "data" / "in.csv").write_text("a,b")
    files.upload(workspace / "data" / "in.csv")
    assert (remote / "data" / "in.csv").read_text() == "a,b"


def test_upload_sends_one_archive_for_a_directory(remote: Path, workspace: Path) -> None:
    stand_in = DirectoryFiles(str(remote))
    files = sandbox_files(stand_in, bash_runner, workspace=workspace)
    for n in range(50):
        (workspace / f"f{n}").write_text(str(n))
    files.upload(workspace, "all")
    assert len(stand_in.writes) == 1


def test_upload_of_a_read_denied_path_sends_nothing(remote: Path, workspace: Path) -> None:
    (workspace / ".env").write_text("SECRET=1")
    files = sandbox_files(
        DirectoryFiles(str(remote)), bash_runner, read_deny=[str(workspace / ".env")]
    )
    summary = files.upload(workspace / ".env", "env")
    assert summary.skipped == (SkippedPath(str(workspace / ".env"), "read-deny"),)
    assert not (remote / "env").exists()


def test_download_a_directory_into_a_new_place(
    files: SandboxFiles, workspace: Path, remote: Path
) -> None:
    (remote / "build" / "out").mkdir(parents=True)
    (remote / "build" / "out" / "report.txt").write_text("ok")
    summary = files.download("build/out", workspace / "here")
    assert summary.files == 1
    assert (workspace / "here" / "report.txt").read_text() == "ok"
    assert not list(remote.glob(".piship-*"))
    assert not list((remote / "build").glob(".piship-*"))


def test_download_a_file_is_renamed_into_place(
    files: SandboxFiles, workspace: Path, remote: Path
) -> None:
    (remote / "r.bin").write_bytes(b"\x00\x01" * 100_000)
    files.download("r.bin", workspace / "r.bin")
    assert (workspace / "r.bin").read_bytes() == b"\x00\x01" * 100_000
    assert [p.name for p in workspace.iterdir()] == ["r.bin"]


def test_download_outside_the_allowed_places_is_refused(
    files: SandboxFiles, tmp_path: Path, remote: Path
) -> None:
    (remote / "r").write_text("r")
    with pytest.raises(PiShipError, match="does not allow writing") as raised:
        files.download("r", tmp_path / "elsewhere")
    assert raised.value.code == "CONFIG_INVALID"


def test_download_of_a_missing_path_is_file_not_found(files: SandboxFiles, workspace: Path) -> None:
    with pytest.raises(PiShipError) as raised:
        files.download("missing", workspace / "m")
    assert raised.value.code == "FILE_NOT_FOUND"


# -- sync -------------------------------------------------------------------------


def later(path: Path) -> None:
    """Move ``path``'s modification time past the push stamp (find -newer compares them)."""
    future = time.time() + 5
    os.utime(path, (future, future), follow_symlinks=False)


@pytest.fixture
def sync(files: SandboxFiles, workspace: Path) -> WorkspaceSync:
    return WorkspaceSync(files._archives, workspace=workspace, write_allow=[str(workspace)])


def test_push_sends_the_workspace_less_what_is_ignored(
    sync: WorkspaceSync, workspace: Path, remote: Path
) -> None:
    (workspace / "Makefile").write_text("test:\n\techo ok > result.txt\n")
    (workspace / ".gitignore").write_text("*.tmp\n")
    (workspace / "junk.tmp").write_text("")
    summary = sync.push()
    assert (remote / "Makefile").exists()
    assert not (remote / "junk.tmp").exists()
    assert summary.skipped == (SkippedPath("junk.tmp", "ignored"),)


def test_pull_brings_back_only_what_changed_after_the_push(
    sync: WorkspaceSync, workspace: Path, remote: Path
) -> None:
    (workspace / "kept.txt").write_text("host")
    sync.push()
    (remote / "result.txt").write_text("made in the sandbox")
    later(remote / "result.txt")
    summary = sync.pull()
    assert (summary.files, summary.skipped) == (1, ())
    assert (workspace / "result.txt").read_text() == "made in the sandbox"


def test_pull_never_writes_a_link_from_the_sandbox(
    sync: WorkspaceSync, workspace: Path, remote: Path
) -> None:
    sync.push()
    os.symlink("/etc/passwd", remote / "evil")
    later(remote / "evil")
    summary = sync.pull()
    assert summary.skipped == (SkippedPath("./evil", "symlink"),)
    assert not (workspace / "evil").exists()


def test_pull_with_delete_removes_what_the_sandbox_deleted(
    sync: WorkspaceSync, workspace: Path, remote: Path
) -> None:
    (workspace / "gone.txt").write_text("x")
    sync.push()
    (remote / "gone.txt").unlink()
    sync.pull(delete=True)
    assert not (workspace / "gone.txt").exists()


def test_pull_without_delete_keeps_host_files(
    sync: WorkspaceSync, workspace: Path, remote: Path
) -> None:
    (workspace / "stays.txt").write_text("x")
    sync.push()
    (remote / "stays.txt").unlink()
    sync.pull()
    assert (workspace / "stays.txt").exists()


def test_a_push_path_outside_the_workspace_is_config_invalid(
    sync: WorkspaceSync, tmp_path: Path
) -> None:
    with pytest.raises(PiShipError, match="outside the workspace") as raised:
        sync.push([tmp_path])
    assert raised.value.code == "CONFIG_INVALID"


# -- archives in parts ------------------------------------------------------------


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_archive, "PART_MEMBERS", 10)


def _tree(workspace: Path, count: int) -> None:
    for n in range(count):
        (workspace / f"f{n:02d}").write_text(str(n))


@pytest.mark.usefixtures("small_parts")
def test_a_tree_larger_than_a_part_goes_in_several_archives_and_arrives_whole(
    remote: Path, workspace: Path
) -> None:
    stand_in = DirectoryFiles(str(remote))
    files = sandbox_files(stand_in, bash_runner, workspace=workspace)
    _tree(workspace, 35)
    files.upload(workspace, "all")
    assert len(stand_in.writes) == 4
    assert sorted(p.name for p in (remote / "all").iterdir()) == [f"f{n:02d}" for n in range(35)]
    assert not any(os.path.exists(path) for path in stand_in.writes)  # staged ones removed


@pytest.mark.usefixtures("small_parts")
def test_an_archive_unpacks_while_the_next_one_is_sent(remote: Path, workspace: Path) -> None:
    second_sent = threading.Event()
    overlapped: list[bool] = []

    class Recording(DirectoryFiles):
        def write(self, path: str, chunks: Any, **kwargs: Any) -> Any:
            if len(self.writes) == 1:
                second_sent.set()
            return super().write(path, chunks, **kwargs)

    def runner(command: str, call: object = None) -> tuple[int, str]:
        if not overlapped:
            overlapped.append(second_sent.wait(10))
        return bash_runner(command, call)

    _tree(workspace, 15)
    sandbox_files(Recording(str(remote)), runner, workspace=workspace).upload(workspace, "all")
    assert overlapped == [True]


@pytest.mark.usefixtures("small_parts")
def test_a_failed_unpack_stops_the_sending_and_is_raised(remote: Path, workspace: Path) -> None:
    stand_in = DirectoryFiles(str(remote))

    def runner(command: str, call: object = None) -> tuple[int, str]:
        full = "tar_x() { echo 'tar: no space left on device'; return 2; }; " + command
        return bash_runner(full.replace("tar -xf", "tar_x"))

    _tree(workspace, 35)
    with pytest.raises(PiShipError, match="no space left") as raised:
        sandbox_files(stand_in, runner, workspace=workspace).upload(workspace, "all")
    assert raised.value.code == "FILE_WRITE_FAILED"  # a full sandbox disk: a file error
    assert len(stand_in.writes) == 2  # the first unpack's failure is seen after the second send
    assert not any(os.path.exists(path) for path in stand_in.writes)
    assert not [t for t in threading.enumerate() if t.name.startswith("piship-files-")]


@pytest.mark.usefixtures("small_parts")
def test_a_push_in_parts_marks_the_push_after_the_last_part(
    sync: WorkspaceSync, workspace: Path, remote: Path
) -> None:
    _tree(workspace, 25)
    sync.push()
    later(remote / "f24")
    (remote / "f24").write_text("changed")
    later(remote / "f24")
    summary = sync.pull()
    assert (workspace / "f24").read_text() == "changed"
    assert summary.files == 1


@pytest.mark.usefixtures("small_parts")
def test_the_first_archive_goes_out_while_the_walk_goes_on(remote: Path, workspace: Path) -> None:
    class MakingALateFile(DirectoryFiles):
        def write(self, path: str, chunks: Any, **kwargs: Any) -> Any:
            if not self.writes:  # the walk has not reached the end of the tree yet
                (workspace / "zz-made-during-the-first-send").write_text("late")
            return super().write(path, chunks, **kwargs)

    _tree(workspace, 15)
    files = sandbox_files(MakingALateFile(str(remote)), bash_runner, workspace=workspace)
    sync = WorkspaceSync(files._archives, workspace=workspace)
    summary = sync.push()
    assert (remote / "zz-made-during-the-first-send").read_text() == "late"
    assert summary.files == 16


def _bad_gitignore_after_the_first_part(workspace: Path) -> None:
    _tree(workspace, 15)  # f00..f09 fill the first part (of 10); f10..f14 go in the second
    (workspace / "zz").mkdir()
    (workspace / "zz" / ".gitignore").write_text("!\n")  # not a valid pattern: the walk raises
    (workspace / "zz" / "inner").write_text("i")


@pytest.mark.usefixtures("small_parts")
def test_a_walk_failure_after_the_first_archive_is_raised_as_the_walk_raises_it(
    sync: WorkspaceSync, workspace: Path
) -> None:
    _bad_gitignore_after_the_first_part(workspace)
    with pytest.raises(ValueError, match="Invalid git pattern"):
        sync.push()
    assert sync.record.pushed is None
    assert not [t for t in threading.enumerate() if t.name.startswith("piship-files-")]


@pytest.mark.usefixtures("small_parts")
def test_a_walk_failure_unpacks_nothing_past_the_archives_already_unpacked(
    remote: Path, workspace: Path
) -> None:
    stand_in = DirectoryFiles(str(remote))
    commands: list[str] = []

    def runner(command: str, call: object = None) -> tuple[int, str]:
        commands.append(command)
        return bash_runner(command, call)

    _bad_gitignore_after_the_first_part(workspace)
    files = sandbox_files(stand_in, runner, workspace=workspace)
    sync = WorkspaceSync(files._archives, workspace=workspace)
    with pytest.raises(ValueError):
        sync.push()
    # As when a later archive's send fails: the first stays unpacked, the one the failure
    # cut is removed unopened, and the push is not marked (no stamp for a pull to trust).
    assert sorted(p.name for p in remote.iterdir()) == [f"f{n:02d}" for n in range(10)]
    assert len(stand_in.writes) == 2
    assert not any(os.path.exists(path) for path in stand_in.writes)
    assert len(commands) == 1 and "touch" not in commands[0]


@pytest.mark.usefixtures("small_parts")
def test_a_symlink_leaving_the_workspace_in_a_later_archive_is_skipped_and_listed(
    sync: WorkspaceSync, workspace: Path, remote: Path, tmp_path: Path
) -> None:
    _tree(workspace, 15)
    (tmp_path / "secret").write_text("s")
    (workspace / "zz-escape").symlink_to(tmp_path / "secret")
    summary = sync.push()
    assert summary.skipped == (SkippedPath("zz-escape", "symlink leaves the workspace"),)
    assert summary.files == 15
    assert not os.path.lexists(remote / "zz-escape")


# -- pull mirrors push ------------------------------------------------------------------


def test_pull_leaves_out_what_the_gitignore_files_ignore(
    sync: WorkspaceSync, workspace: Path, remote: Path
) -> None:
    (workspace / ".gitignore").write_text("build/\n*.pyc\n.coverage\n")
    sync.push()
    (remote / "build").mkdir()
    for made in ("build/out.o", "m.pyc", ".coverage", "result.txt"):
        (remote / made).write_text("made in the sandbox")
        later(remote / made)
    summary = sync.pull()
    assert summary.files == 1 and (workspace / "result.txt").exists()
    assert sorted(summary.skipped, key=lambda s: s.path) == [
        SkippedPath("./.coverage", "ignored"),
        SkippedPath("./build/out.o", "ignored"),
        SkippedPath("./m.pyc", "ignored"),
    ]
    assert sorted(os.listdir(workspace)) == [".gitignore", "result.txt"]


def test_pull_without_gitignore_brings_everything(
    files: SandboxFiles, workspace: Path, remote: Path
) -> None:
    (workspace / ".gitignore").write_text("*.pyc\n")
    sync = WorkspaceSync(files._archives, workspace=workspace, use_gitignore=False)
    sync.push()
    (remote / "m.pyc").write_text("bytecode")
    later(remote / "m.pyc")
    assert sync.pull().files == 1 and (workspace / "m.pyc").exists()


def test_push_leaves_secret_files_at_home_unless_named(
    files: SandboxFiles, workspace: Path, remote: Path
) -> None:
    (workspace / ".env").write_text("TOKEN=abc")
    (workspace / "deploy.pem").write_text("-----BEGIN PRIVATE KEY-----")
    (workspace / "main.py").write_text("print(1)")
    summary = WorkspaceSync(files._archives, workspace=workspace).push()
    assert sorted(summary.skipped, key=lambda s: s.path) == [
        SkippedPath(".env", "secret file"),
        SkippedPath("deploy.pem", "secret file"),
    ]
    assert sorted(os.listdir(remote)) == ["main.py"]
    named = WorkspaceSync(
        files._archives, workspace=workspace, send_secrets=[str(workspace / ".env")]
    )
    named.push()
    assert (remote / ".env").read_text() == "TOKEN=abc"


def _replacing_runner(command: str, _call: object = None) -> tuple[int, str]:
    """A helper runner that decodes as the real one does: undecodable bytes replaced."""
    done = subprocess.run(["bash", "-c", command], capture_output=True, timeout=60, check=False)
    return done.returncode, (done.stdout + done.stderr).decode("utf-8", "replace")


def test_pull_delete_keeps_a_file_whose_name_the_listing_cannot_show_exactly(
    remote: Path, workspace: Path
) -> None:
    files = sandbox_files(DirectoryFiles(str(remote)), _replacing_runner, workspace=workspace)
    sync = WorkspaceSync(files._archives, workspace=workspace)
    odd = os.fsdecode(b"caf\xe9.txt")  # Latin-1, not UTF-8: the listing shows it as caf\ufffd
    (workspace / odd).write_text("kept")
    (workspace / "line\nbreak.txt").write_text("kept")
    (workspace / "gone.txt").write_text("x")
    sync.push()
    assert (remote / odd).exists() and (remote / "line\nbreak.txt").exists()
    (remote / "gone.txt").unlink()
    summary = sync.pull(delete=True)
    assert not (workspace / "gone.txt").exists()
    assert (workspace / odd).read_text() == "kept"
    assert (workspace / "line\nbreak.txt").read_text() == "kept"
    assert summary.skipped == (SkippedPath(odd, "name not exact"),)


def test_pull_delete_refuses_a_cut_listing(
    sync: WorkspaceSync, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (workspace / "kept.txt").write_text("x")
    sync.push()
    def cut_listing(command: str, call: object = None) -> tuple[int, str]:
        if "find . -type f" in command:
            return 0, "./other.txt\0"  # the output limit cut it: no end mark
        return bash_runner(command, call)

    monkeypatch.setattr(sync._files, "_run", cut_listing)
    with pytest.raises(PiShipError, match="cut answer; nothing was deleted"):
        sync.pull(delete=True)
    assert (workspace / "kept.txt").exists()


def test_pull_delete_on_a_read_only_host_names_the_file(remote: Path, tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "ws", "1m") as workspace:
        files = sandbox_files(DirectoryFiles(str(remote)), bash_runner, workspace=workspace)
        sync = WorkspaceSync(files._archives, workspace=workspace)
        (workspace / "gone.txt").write_text("x")
        sync.push()
        (remote / "gone.txt").unlink()
        subprocess.run(["mount", "-o", "remount,ro", str(workspace)], check=True)
        with pytest.raises(PiShipError) as raised:
            sync.pull(delete=True)
        assert raised.value.code == "FILE_WRITE_FAILED"
        assert f"deleting {workspace / 'gone.txt'}" in str(raised.value)
        assert "read-only" in str(raised.value)
