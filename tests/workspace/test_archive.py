"""Tar both ways: streamed from a selection, unpacked without trusting the archive."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from piship_remote.model.errors import PiShipError
from piship_remote.model.transfer import SkippedPath
from piship_remote.workspace import _archive
from piship_remote.workspace._archive import (
    StreamedArchives,
    _header,
    archive_parts,
    cut_parts,
    tar_stream,
    unpack_tar,
)
from piship_remote.workspace._tree import TreeEntry, select_tree


def hostile(*members: tuple[tarfile.TarInfo, bytes]) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            archive.addfile(info, io.BytesIO(data) if info.isfile() else None)
    buffer.seek(0)
    return buffer


def file_member(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def special(name: str, kind: bytes, link: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info, b""


def test_a_streamed_tar_round_trips_the_tree(tmp_path: Path) -> None:
    source = tmp_path / "source"
    (source / "dir").mkdir(parents=True)
    (source / "dir" / "file").write_bytes(b"payload" * 1000)
    (source / "empty").write_bytes(b"")
    body = b"".join(tar_stream(select_tree(str(source)).entries))
    destination = tmp_path / "destination"
    destination.mkdir()
    summary = unpack_tar(io.BytesIO(body), str(destination))
    assert (summary.files, summary.bytes, summary.skipped) == (2, 7000, ())
    assert (destination / "dir" / "file").read_bytes() == b"payload" * 1000
    assert (destination / "empty").read_bytes() == b""


def test_the_stream_is_produced_in_bounded_chunks(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(os.urandom(3 * 1024 * 1024))
    chunks = list(tar_stream(select_tree(str(tmp_path)).entries, chunk=64 * 1024))
    assert max(len(chunk) for chunk in chunks) <= 64 * 1024
    assert sum(len(chunk) for chunk in chunks) % tarfile.BLOCKSIZE == 0


@pytest.mark.parametrize(
    ("name", "kind", "size", "link", "mtime", "mode"),
    [
        ("a.txt", tarfile.REGTYPE, 5, "", 1_700_000_000, 0o644),
        ("dir/sub", tarfile.DIRTYPE, 0, "", 0, 0o755),
        ("link", tarfile.SYMTYPE, 0, "dir/a.txt", 123, 0o777),
        ("n" * 100, tarfile.REGTYPE, 8**11 - 1, "", 8**11 - 1, 0o4755),
        ("d" * 100, tarfile.DIRTYPE, 0, "", 1, 0o700),  # 101 with its slash: pax
        ("é.txt", tarfile.REGTYPE, 9, "", 5, 0o600),
        ("long/" * 30, tarfile.REGTYPE, 8**11, "", 1, 0o644),
        ("old", tarfile.REGTYPE, 1, "", -5, 0o644),
        ("far", tarfile.SYMTYPE, 0, "t" * 101, 1, 0o777),
    ],
)
def test_member_headers_are_the_bytes_tarfile_writes(
    name: str, kind: bytes, size: int, link: str, mtime: int, mode: int
) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname, info.mtime, info.mode = kind, size, link, mtime, mode
    assert _header(name, mode, mtime, kind, size, link) == info.tobuf(tarfile.PAX_FORMAT)


def test_many_small_files_go_out_in_few_pieces(tmp_path: Path) -> None:
    for index in range(200):
        (tmp_path / f"f{index}").write_bytes(b"x" * 100)
    chunks = list(tar_stream(select_tree(str(tmp_path)).entries, chunk=64 * 1024))
    assert len(chunks) == 4  # 200 x (512 header + 512 data) + the end: 3.1 x 64 KiB
    assert max(len(chunk) for chunk in chunks) <= 64 * 1024


@pytest.mark.parametrize(
    ("member", "reason"),
    [
        (file_member("/etc/passwd"), "outside the workspace"),
        (file_member("../escape"), "outside the workspace"),
        (file_member("a/../../escape"), "outside the workspace"),
        (special("link", tarfile.SYMTYPE, "/etc/passwd"), "symlink"),
        (special("hard", tarfile.LNKTYPE, "/etc/passwd"), "symlink"),
        (special("dev", tarfile.CHRTYPE), "not a regular file"),
        (special("fifo", tarfile.FIFOTYPE), "not a regular file"),
        (file_member(".git/hooks/post-checkout"), "write not allowed"),
    ],
)
def test_a_hostile_member_is_refused_and_listed(
    member: tuple[tarfile.TarInfo, bytes], reason: str, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    summary = unpack_tar(hostile(member), str(root))
    assert summary.skipped == (SkippedPath(member[0].name, reason),)
    assert summary.files == 0
    assert not (tmp_path / "escape").exists()


def test_a_host_symlink_in_the_way_is_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    (root / "out").symlink_to(outside)
    (root / "file").symlink_to(outside / "target")
    summary = unpack_tar(hostile(file_member("out/x"), file_member("file")), str(root))
    assert [s.reason for s in summary.skipped] == ["outside the workspace"] * 2
    assert list(outside.iterdir()) == []


def test_only_allowed_places_are_written(tmp_path: Path) -> None:
    allowed = str(tmp_path / "ok")
    summary = unpack_tar(
        hostile(file_member("ok/a"), file_member("no/b")),
        str(tmp_path),
        may_write=lambda path: path.startswith(allowed),
    )
    assert summary.files == 1
    assert summary.skipped == (SkippedPath("no/b", "write not allowed"),)
    assert not (tmp_path / "no").exists()


def test_a_tar_bomb_stops_at_the_byte_limit(tmp_path: Path) -> None:
    archive = hostile(file_member("a", b"x" * 600), file_member("b", b"x" * 600))
    with pytest.raises(PiShipError, match="more than 1000 bytes") as raised:
        unpack_tar(archive, str(tmp_path), max_bytes=1000)
    assert raised.value.code == "CONFIG_INVALID"
    assert not (tmp_path / "b").exists()


def test_a_tar_bomb_stops_at_the_member_limit(tmp_path: Path) -> None:
    archive = hostile(*(file_member(f"f{n}") for n in range(5)))
    with pytest.raises(PiShipError, match="more than 3 entries"):
        unpack_tar(archive, str(tmp_path), max_members=3)


def test_a_cut_archive_leaves_no_half_file(tmp_path: Path) -> None:
    whole = hostile(file_member("big", b"y" * 100_000)).getvalue()
    (tmp_path / "big").write_bytes(b"old")
    with pytest.raises(PiShipError, match="malformed"):
        unpack_tar(io.BytesIO(whole[:50_000]), str(tmp_path))
    assert (tmp_path / "big").read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["big"]


def test_garbage_is_a_malformed_archive(tmp_path: Path) -> None:
    with pytest.raises(PiShipError, match="malformed"):
        unpack_tar(io.BytesIO(b"not a tar at all" * 100), str(tmp_path))


def _entries(*sizes: int) -> list[TreeEntry]:
    return [TreeEntry(f"f{n}", f"/nowhere/f{n}", "file", size) for n, size in enumerate(sizes)]


def test_a_small_tree_is_one_archive() -> None:
    entries = _entries(10, 20, 30)
    assert archive_parts(entries) == [entries]


def test_no_entries_is_one_empty_archive() -> None:
    assert archive_parts([]) == [[]]


def test_parts_are_cut_by_bytes_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_archive, "PART_BYTES", 100)
    entries = _entries(60, 30, 50, 120, 5)
    assert archive_parts(entries) == [entries[:2], entries[2:3], entries[3:4], entries[4:]]


def test_parts_are_cut_by_members(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_archive, "PART_MEMBERS", 2)
    entries = _entries(1, 1, 1, 1, 1)
    assert archive_parts(entries) == [entries[:2], entries[2:4], entries[4:]]


def test_parts_are_read_as_they_are_consumed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_archive, "PART_MEMBERS", 2)
    read: list[str] = []

    def source() -> Iterator[TreeEntry]:
        for entry in _entries(1, 1, 1, 1, 1):
            read.append(entry.relative)
            yield entry

    parts = cut_parts(source())
    first = next(parts)
    assert read == []
    assert [entry.relative for entry in first] == ["f0", "f1"]
    assert read == ["f0", "f1", "f2"]  # one entry past the full part, no more


def test_streamed_archives_are_cut_as_archive_parts_cuts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(_archive, "PART_MEMBERS", 2)
    for name in "abcde":
        (tmp_path / name).write_text(name)
    entries = select_tree(str(tmp_path)).entries
    archives = [b"".join(chunks) for chunks in StreamedArchives(entries)]
    assert archives == [b"".join(tar_stream(part)) for part in archive_parts(entries)]


def test_a_failing_walk_ends_the_archives_and_is_raised_by_check() -> None:
    def source() -> Iterator[TreeEntry]:
        yield from _entries(0)
        raise ValueError("Invalid git pattern")

    archives = StreamedArchives(source())
    archives.check()  # nothing raised yet
    assert len([b"".join(chunks) for chunks in archives]) == 1
    with pytest.raises(ValueError, match="Invalid git pattern"):
        archives.check()


def test_a_file_that_became_a_directory_since_the_walk_is_not_sent(tmp_path: Path) -> None:
    (tmp_path / "was-a-file").write_text("x")
    (tmp_path / "kept").write_text("k")
    entries = select_tree(str(tmp_path)).entries
    (tmp_path / "was-a-file").unlink()
    (tmp_path / "was-a-file").mkdir()
    with tarfile.open(fileobj=io.BytesIO(b"".join(tar_stream(entries)))) as archive:
        assert archive.getnames() == ["kept"]


def test_a_small_tail_goes_in_the_last_full_part(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_archive, "PART_MEMBERS", 64)  # a tail is at most 64 // 32 = 2
    entries = _entries(*[1] * 130)
    assert [len(part) for part in archive_parts(entries)] == [64, 66]


def test_a_tail_larger_than_the_fraction_is_a_part_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_archive, "PART_MEMBERS", 64)
    entries = _entries(*[1] * 131)
    assert [len(part) for part in archive_parts(entries)] == [64, 64, 3]
