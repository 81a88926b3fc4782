"""The local service's snapshot store (names, limits, its disk budget) and its list time
filter; the copies themselves are made by the sandboxes' agents (see tests/attacks/)."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import pytest

from piship_remote.local.sandbox.list_filter import parse_time
from piship_remote.local.sandbox.snapshots import (
    CopyFailed,
    Snapshot,
    SnapshotBudgetExceeded,
    SnapshotStore,
    SnapshotWriter,
    TooManySnapshots,
)
from piship_remote.wire.e2b_json import WireError


def _export(content: bytes) -> Callable[[SnapshotWriter], None]:
    """What a sandbox's agent would stream out: here, ``content``."""
    return lambda writer: writer.write(content)


def _take(store: SnapshotStore, content: bytes = b"files", **where: str | None) -> Snapshot:
    source = where.get("source") or "sb1"
    return store.take(
        _export(content),
        places=["/home/user"],
        template="base",
        source=source,
        name=where.get("name"),
    )


def test_a_snapshot_is_selected_by_source_and_by_name(tmp_path: Path) -> None:
    store = SnapshotStore(str(tmp_path / "snapshots"))
    named = _take(store, source="sb1", name="app")
    other = _take(store, source="sb2", name=None)
    assert store.select(source="sb1") == [named]
    assert store.select(name="team/app:v1") == [named]
    assert store.select(name=other.id) == [other]
    assert store.select(name="nothing") == []


def test_a_name_moves_to_the_newest_snapshot(tmp_path: Path) -> None:
    store = SnapshotStore(str(tmp_path / "snapshots"))
    first = _take(store, name="app")
    second = _take(store, name="app")
    assert [s.id for s in store.select(name="app")] == [second.id]
    kept = store.get(first.id)
    assert kept is not None and kept.names == ()


def test_a_deleted_snapshot_takes_its_files_with_it(tmp_path: Path) -> None:
    store = SnapshotStore(str(tmp_path / "snapshots"))
    snapshot = _take(store, b"kept")
    assert Path(snapshot.archive).read_bytes() == b"kept"
    assert store.delete(snapshot.id) is True
    assert store.delete(snapshot.id) is False
    assert not os.path.exists(snapshot.archive)


def test_the_store_refuses_a_snapshot_past_its_limit(tmp_path: Path) -> None:
    store = SnapshotStore(str(tmp_path / "snapshots"), limit=1)
    _take(store)
    with pytest.raises(TooManySnapshots):
        _take(store)


def test_a_snapshot_past_the_disk_budget_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    store = SnapshotStore(str(tmp_path / "snapshots"), budget=10)
    _take(store, b"x" * 6)
    with pytest.raises(SnapshotBudgetExceeded, match="max_snapshot_disk_mib"):
        _take(store, b"y" * 6)
    assert len(os.listdir(tmp_path / "snapshots")) == 1
    assert store.used == 6


def test_deleting_a_snapshot_gives_its_bytes_back_to_the_budget(tmp_path: Path) -> None:
    store = SnapshotStore(str(tmp_path / "snapshots"), budget=10)
    first = _take(store, b"x" * 6)
    store.delete(first.id)
    assert _take(store, b"y" * 6).size == 6


def test_a_failed_export_leaves_nothing_behind(tmp_path: Path) -> None:
    store = SnapshotStore(str(tmp_path / "snapshots"))

    def broken(writer: SnapshotWriter) -> None:
        writer.write(b"half")
        raise CopyFailed("the sandbox's files could not be copied: its agent ended")

    with pytest.raises(CopyFailed):
        store.take(broken, places=["/home/user"], template="base", source="sb1", name=None)
    assert os.listdir(tmp_path / "snapshots") == []
    assert store.used == 0


@pytest.mark.parametrize(
    "text",
    [
        "2026-12-06T02:14:36.193563+00:00",
        "2026-12-06T02:14:36.193563Z",
        "2026-12-06T02:14:36.193563123Z",
    ],
)
def test_started_after_reads_rfc3339_forms(text: str) -> None:
    assert parse_time(text) == datetime(2026, 12, 6, 2, 14, 36, 193563, tzinfo=timezone.utc)


@pytest.mark.parametrize("text", ["yesterday", "2026-12-06T02:14:36"])
def test_started_after_without_a_time_zone_or_not_a_time_is_refused(text: str) -> None:
    with pytest.raises(WireError):
        parse_time(text)
