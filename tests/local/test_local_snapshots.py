"""The local service's copies of sandbox files (forks, snapshots) and its list time filter."""

from __future__ import annotations

import os
import stat
from datetime import datetime, timezone
from pathlib import Path

import pytest

from piship_remote.local.sandbox.list_filter import parse_time
from piship_remote.local.sandbox.snapshots import SnapshotStore, TooManySnapshots, copy_places
from piship_remote.wire.e2b_json import WireError


@pytest.fixture
def place(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / "app").mkdir(parents=True)
    (home / "app" / "data.txt").write_text("kept")
    os.chmod(home / "app" / "data.txt", 0o640)
    (home / "link").symlink_to("app/data.txt")
    os.mkfifo(home / "pipe")
    return home


def test_copy_places_keeps_files_modes_and_symlinks(place: Path, tmp_path: Path) -> None:
    target = tmp_path / "copy"
    target.mkdir()
    copy_places({"/home/user": str(place)}, {"/home/user": str(target)})
    assert (target / "app" / "data.txt").read_text() == "kept"
    assert stat.S_IMODE((target / "app" / "data.txt").stat().st_mode) == 0o640
    assert os.readlink(target / "link") == "app/data.txt"


def test_copy_places_leaves_out_pipes(place: Path, tmp_path: Path) -> None:
    target = tmp_path / "copy"
    target.mkdir()
    copy_places({"/home/user": str(place)}, {"/home/user": str(target)})
    assert not (target / "pipe").exists()


def test_a_snapshot_is_selected_by_source_and_by_name(place: Path, tmp_path: Path) -> None:
    store = SnapshotStore(str(tmp_path / "snapshots"))
    named = store.take({"/home/user": str(place)}, template="base", source="sb1", name="app")
    other = store.take({"/home/user": str(place)}, template="base", source="sb2", name=None)
    assert store.select(source="sb1") == [named]
    assert store.select(name="team/app:v1") == [named]
    assert store.select(name=other.id) == [other]
    assert store.select(name="nothing") == []


def test_a_name_moves_to_the_newest_snapshot(place: Path, tmp_path: Path) -> None:
    store = SnapshotStore(str(tmp_path / "snapshots"))
    first = store.take({"/home/user": str(place)}, template="base", source="sb1", name="app")
    second = store.take({"/home/user": str(place)}, template="base", source="sb1", name="app")
    assert [s.id for s in store.select(name="app")] == [second.id]
    kept = store.get(first.id)
    assert kept is not None and kept.names == ()


def test_a_deleted_snapshot_takes_its_files_with_it(place: Path, tmp_path: Path) -> None:
    store = SnapshotStore(str(tmp_path / "snapshots"))
    snapshot = store.take({"/home/user": str(place)}, template="base", source="sb1", name=None)
    copy_dir = snapshot.places["/home/user"]
    assert (Path(copy_dir) / "app" / "data.txt").read_text() == "kept"
    assert store.delete(snapshot.id) is True
    assert store.delete(snapshot.id) is False
    assert not os.path.exists(copy_dir)


def test_the_store_refuses_a_snapshot_past_its_limit(place: Path, tmp_path: Path) -> None:
    store = SnapshotStore(str(tmp_path / "snapshots"), limit=1)
    store.take({"/home/user": str(place)}, template="base", source="sb1", name=None)
    with pytest.raises(TooManySnapshots):
        store.take({"/home/user": str(place)}, template="base", source="sb1", name=None)


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
