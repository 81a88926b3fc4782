"""What a hostile sandbox can send back: bounded while it is read, applied whole or not at all."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from piship_remote.model.errors import CONFIG_INVALID, FILE_WRITE_FAILED, PiShipError
from piship_remote.model.transfer import SkippedPath, TransferLimits
from piship_remote.workspace._chunk_pipe import ChunkSink
from piship_remote.workspace._unpack import (
    HEADER_ALLOWANCE,
    TRAILING_ALLOWANCE,
    unpack_streamed,
    unpack_tar,
)
from tests.support.files import small_filesystem

MIB = 1024 * 1024
HUGE = 100 * 1024**3  # the sparse "archive": 100 GB, nearly all of it zeros


def archive(*members: tuple[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class Feed:
    """``head``, then zeros up to ``total`` bytes, one MiB per chunk, counting what the
    unpacker accepted before it stopped the feed."""

    def __init__(self, head: bytes, total: int) -> None:
        self.head = head
        self.total = total
        self.sent = 0

    def __call__(self, sink: ChunkSink) -> None:
        for chunk in self._chunks():
            sink(chunk)
            self.sent += len(chunk)

    def _chunks(self) -> Iterator[bytes]:
        yield self.head
        zeros = bytes(MIB)
        left = self.total - len(self.head)
        while left > 0:
            yield zeros[: min(MIB, left)]
            left -= MIB


def test_a_sparse_100_gb_archive_stops_after_about_a_mib(tmp_path: Path) -> None:
    feed = Feed(b"", HUGE)
    with pytest.raises(PiShipError, match="after its end") as raised:
        unpack_streamed(feed, str(tmp_path / "out"))
    assert raised.value.code == CONFIG_INVALID
    assert feed.sent <= TRAILING_ALLOWANCE + 16 * MIB, feed.sent
    assert not (tmp_path / "out").exists()


def test_an_entry_declaring_more_than_max_bytes_is_refused_before_its_data(
    tmp_path: Path,
) -> None:
    header = tarfile.TarInfo("big.bin")
    header.size = HUGE
    feed = Feed(header.tobuf(tarfile.PAX_FORMAT), HUGE)
    limits = TransferLimits(max_bytes=8 * MIB)
    with pytest.raises(PiShipError, match="the max_bytes limit") as raised:
        unpack_streamed(feed, str(tmp_path), limits=limits)
    assert f"more than {8 * MIB} bytes" in str(raised.value)
    assert feed.sent <= 16 * MIB, feed.sent
    assert os.listdir(tmp_path) == []


def test_a_huge_pax_header_is_refused_before_it_is_held(tmp_path: Path) -> None:
    pax = tarfile.TarInfo("././@PaxHeader")
    pax.type = tarfile.XHDTYPE
    pax.size = HUGE
    feed = Feed(pax.tobuf(tarfile.GNU_FORMAT), HUGE)
    with pytest.raises(PiShipError, match="header larger than") as raised:
        unpack_streamed(feed, str(tmp_path))
    assert raised.value.code == CONFIG_INVALID
    assert feed.sent <= HEADER_ALLOWANCE + 16 * MIB, feed.sent


def test_the_entry_limit_is_named(tmp_path: Path) -> None:
    body = archive(*((f"f{n}", b"x") for n in range(5)))
    with pytest.raises(PiShipError, match=r"more than 3 entries \(the max_entries limit\)"):
        unpack_streamed(
            lambda sink: sink(body), str(tmp_path), limits=TransferLimits(max_entries=3)
        )
    assert os.listdir(tmp_path) == []


def test_nothing_is_put_in_place_before_the_whole_archive_arrived(tmp_path: Path) -> None:
    body = archive(("first.txt", b"complete"), ("second.txt", b"y" * 100_000))
    with pytest.raises(PiShipError, match="malformed"):
        unpack_tar(io.BytesIO(body[:60_000]), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()  # not even the directory made for it


def test_a_feed_that_fails_midway_leaves_nothing(tmp_path: Path) -> None:
    body = archive(("a/first.txt", b"complete"), ("a/second.txt", b"y" * 100_000))
    (tmp_path / "kept.txt").write_text("host")

    def cut(sink: ChunkSink) -> None:
        sink(body[:40_000])
        raise PiShipError("SANDBOX_UNAVAILABLE", "reading the archive failed: connection reset")

    with pytest.raises(PiShipError, match="connection reset"):
        unpack_streamed(cut, str(tmp_path))
    assert os.listdir(tmp_path) == ["kept.txt"]


def test_a_name_clash_is_listed_and_the_rest_applied(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("a host file where the sandbox has a folder")
    (tmp_path / "results").mkdir()
    body = archive(
        ("out/a.txt", b"a"), ("results", b"a file where the host has a folder"), ("ok.txt", b"ok")
    )
    summary = unpack_tar(io.BytesIO(body), str(tmp_path))
    assert summary.skipped == (
        SkippedPath("out/a.txt", "name clash"),
        SkippedPath("results", "name clash"),
    )
    assert (summary.files, (tmp_path / "ok.txt").read_text()) == (1, "ok")
    assert (tmp_path / "out").read_text().startswith("a host file")
    assert sorted(os.listdir(tmp_path)) == ["ok.txt", "out", "results"]


def test_a_full_host_disk_names_the_path_and_leaves_nothing(tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "disk", "1m") as disk:
        (disk / "kept.txt").write_text("host")
        body = archive(("deep/a.bin", b"a" * 600_000), ("deep/b.bin", b"b" * 600_000))
        with pytest.raises(PiShipError) as raised:
            unpack_tar(io.BytesIO(body), str(disk), min_free_bytes=0)  # the disk refuses
        assert raised.value.code == FILE_WRITE_FAILED
        assert str(disk / "deep" / "b.bin") in str(raised.value)
        assert "the disk is full" in str(raised.value)
        assert os.listdir(disk) == ["kept.txt"]


def test_a_name_this_host_cannot_hold_is_listed_and_the_rest_applied(tmp_path: Path) -> None:
    long = "a/" + "x" * 300 + "/b.txt"
    summary = unpack_tar(io.BytesIO(archive((long, b"x"), ("ok.txt", b"ok"))), str(tmp_path))
    assert summary.skipped == (SkippedPath(long, "name not exact"),)
    assert summary.files == 1 and os.listdir(tmp_path) == ["ok.txt"]
