"""The official E2B SDK's envd 0.6 features against the local service, one behaviour each, as
the SDK's own sync suite checks them: file metadata, watch events (with their entries),
listing order, symlinks, metrics over a time range, a killed terminal.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator

import pytest
from local_e2b import local_e2b_service

from tests.support.optional_peers import install_hint

pytest.importorskip("e2b", reason=install_hint("interop"))
pytest.importorskip("httpx", reason=install_hint("interop"))

import httpx
from e2b import CommandExitException, FilesystemEventType, FileType, Sandbox
from e2b.sandbox.commands.command_handle import PtySize

from piship_remote.local import LocalE2bService

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]

HOME = "/home/user"
MEMORY_MIB = 512


@pytest.fixture(scope="module")
def service() -> Iterator[LocalE2bService]:
    with local_e2b_service(max_memory_mib=MEMORY_MIB) as running:
        yield running


@pytest.fixture
def sandbox(service: LocalE2bService) -> Iterator[Sandbox]:
    created = Sandbox.create(  # type: ignore[call-overload]
        api_key=service.api_key,
        api_url=service.url,
        sandbox_url=service.url,
        request_timeout=10,
    )
    yield created
    created.kill()


# -- file metadata ---------------------------------------------------------------------


@pytest.mark.parametrize("octet_stream", [False, True], ids=["multipart", "octet-stream"])
def test_metadata_written_with_a_file_is_returned_and_kept(
    sandbox: Sandbox, octet_stream: bool
) -> None:
    metadata = {"author": "mish", "purpose": "upload"}
    info = sandbox.files.write("meta.txt", "x", metadata=metadata, use_octet_stream=octet_stream)
    assert info.metadata == metadata
    assert sandbox.files.get_info("meta.txt").metadata == metadata


def test_write_files_gives_every_file_the_metadata(sandbox: Sandbox) -> None:
    written = sandbox.files.write_files(
        [{"path": "m1.txt", "data": "1"}, {"path": "m2.txt", "data": "2"}],
        metadata={"source": "suite"},
    )
    assert [w.metadata for w in written] == [{"source": "suite"}] * 2
    assert sandbox.files.get_info("m2.txt").metadata == {"source": "suite"}


def test_overwriting_without_metadata_clears_it(sandbox: Sandbox) -> None:
    sandbox.files.write("over.txt", "first", metadata={"author": "mish"})
    assert sandbox.files.write("over.txt", "second").metadata is None
    assert sandbox.files.get_info("over.txt").metadata is None


def test_metadata_shows_in_a_listing_and_after_a_rename(sandbox: Sandbox) -> None:
    sandbox.files.write("tagged/listed.txt", "c", metadata={"tag": "listed"})
    [entry] = sandbox.files.list("tagged")
    assert entry.metadata == {"tag": "listed"}
    moved = sandbox.files.rename("tagged/listed.txt", "renamed.txt")
    assert moved.metadata == {"tag": "listed"}


def test_an_xattr_set_by_a_command_is_metadata(sandbox: Sandbox) -> None:
    sandbox.files.write("attr.txt", "c")
    setter = f"import os; os.setxattr('{HOME}/attr.txt', 'user.e2b.author', b'mish')"
    sandbox.commands.run(f'python3 -c "{setter}"')
    assert sandbox.files.get_info("attr.txt").metadata == {"author": "mish"}


def test_metadata_envd_refuses_is_a_400(service: LocalE2bService, sandbox: Sandbox) -> None:
    answer = httpx.post(
        f"{service.url}/files",
        params={"path": "refused.txt"},
        content=b"x",
        headers={
            "Content-Type": "application/octet-stream",
            "X-Metadata-" + "k" * 247: "v",
            **sandbox.connection_config.sandbox_headers,
        },
    )
    assert answer.status_code == 400 and "invalid metadata" in answer.json()["message"]
    assert not sandbox.files.exists("refused.txt")


# -- watching --------------------------------------------------------------------------


def test_a_new_file_is_created_changed_then_written_as_envd_reports(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("watched")
    handle = sandbox.files.watch_dir("watched")
    sandbox.files.write("watched/new.txt", "content")
    events = [(e.type, e.name) for e in handle.get_new_events()]
    handle.stop()
    assert events == [
        (FilesystemEventType.CREATE, "new.txt"),
        (FilesystemEventType.CHMOD, "new.txt"),
        (FilesystemEventType.WRITE, "new.txt"),
    ]


def test_watch_events_carry_the_entry_when_asked(sandbox: Sandbox) -> None:
    sandbox.files.write("seen/file.txt", "first")
    handle = sandbox.files.watch_dir("seen", include_entry=True, allow_network_mounts=True)
    sandbox.files.write("seen/file.txt", "second")
    writes = [e for e in handle.get_new_events() if e.type == FilesystemEventType.WRITE]
    handle.stop()
    assert writes and writes[0].entry is not None
    entry = writes[0].entry
    assert (entry.name, entry.path, entry.type) == (
        "file.txt",
        f"{HOME}/seen/file.txt",
        FileType.FILE,
    )


# -- listing and symlinks --------------------------------------------------------------


def test_a_listing_is_depth_first_in_name_order(sandbox: Sandbox) -> None:
    for path in ("tree/b/b2", "tree/b/b1", "tree/a/a1"):
        sandbox.files.make_dir(path)
    sandbox.files.write("tree/c.txt", "c")
    names = [e.path.removeprefix(f"{HOME}/tree/") for e in sandbox.files.list("tree", depth=2)]
    assert names == ["a", "a/a1", "b", "b/b1", "b/b2", "c.txt"]


def test_a_symlink_is_described_by_its_target(sandbox: Sandbox) -> None:
    sandbox.files.write("linked/target.txt", "t")
    sandbox.commands.run("ln -s target.txt link", cwd=f"{HOME}/linked")
    info = sandbox.files.get_info("linked/link")
    assert info.type == FileType.FILE
    assert info.symlink_target == f"{HOME}/linked/target.txt"


# -- metrics ---------------------------------------------------------------------------


def test_metrics_are_the_sandboxs_own_memory(sandbox: Sandbox) -> None:
    [sample] = sandbox.get_metrics()
    assert sample.mem_total == MEMORY_MIB * 1024 * 1024
    assert 0 < sample.mem_used <= sample.mem_total


def test_metrics_over_a_time_range_hold_the_samples_taken_in_it(sandbox: Sandbox) -> None:
    now = datetime.datetime.now(datetime.timezone.utc)
    taken = sandbox.get_metrics()
    assert taken
    recent = sandbox.get_metrics(start=now - datetime.timedelta(minutes=1))
    assert [s.timestamp for s in taken] == [s.timestamp for s in recent[: len(taken)]]
    before = sandbox.get_metrics(
        start=now - datetime.timedelta(hours=1), end=now - datetime.timedelta(minutes=30)
    )
    assert before == []


# -- terminals -------------------------------------------------------------------------


def test_killing_a_terminal_ends_its_wait_with_the_exit_error(sandbox: Sandbox) -> None:
    terminal = sandbox.pty.create(PtySize(24, 80))
    assert sandbox.pty.kill(terminal.pid)
    with pytest.raises(CommandExitException) as ended:
        terminal.wait()
    assert (ended.value.exit_code, ended.value.error) == (-1, "signal: killed")


def test_a_killed_command_is_gone_for_the_next_one(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("sleep 30", background=True)
    assert sandbox.commands.kill(handle.pid)
    with pytest.raises(CommandExitException):
        sandbox.commands.run(f"kill -0 {handle.pid}")
