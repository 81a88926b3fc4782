"""Watching directories of a local sandbox: envd's WatchDir stream and polled watchers.

Events come from inotify on the sandbox's own directories and carry envd's
types and names (relative to the watched directory). Polls wait for the events
they expect, with a deadline; nothing here sleeps for a fixed time.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from piship_remote.local.envd.watch_rpc import MAX_WATCHERS
from piship_remote.wire.connect import connect_envelope
from tests.support.local_service import BASIC_USER, Client, Stream, gone, needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.timeout(60)]

FS = "/filesystem.Filesystem/"
CREATE, WRITE, REMOVE, RENAME, CHMOD = (
    f"EVENT_TYPE_{n}" for n in ("CREATE", "WRITE", "REMOVE", "RENAME", "CHMOD")
)


def rpc(client: Client, sandbox: dict[str, Any], method: str, **body: Any) -> Any:
    return client.session.post(
        client.service.envd_url + FS + method,
        json=body,
        headers=client.envd_headers(sandbox, Authorization=BASIC_USER),
        timeout=10,
    )


def watcher(client: Client, sandbox: dict[str, Any], path: str, recursive: bool = False) -> str:
    response = rpc(client, sandbox, "CreateWatcher", path=path, recursive=recursive)
    assert response.status_code == 200, response.text
    return str(response.json()["watcherId"])


def events_until(
    client: Client, sandbox: dict[str, Any], watcher_id: str, wanted: set[tuple[str, str]]
) -> list[tuple[str, str]]:
    """Poll GetWatcherEvents until every ``wanted`` (name, type) came, or 10 s passed."""
    seen: list[tuple[str, str]] = []
    deadline = time.monotonic() + 10
    while not wanted <= set(seen) and time.monotonic() < deadline:
        response = rpc(client, sandbox, "GetWatcherEvents", watcherId=watcher_id)
        assert response.status_code == 200, response.text
        seen += [(e["name"], e["type"]) for e in response.json().get("events", [])]
    return seen


def test_a_watcher_reports_create_write_chmod_rename_and_remove(
    client: Client, sandbox: dict[str, Any]
) -> None:
    client.run(sandbox, "mkdir ~/w")
    watcher_id = watcher(client, sandbox, "w")
    client.run(sandbox, "cd ~/w && echo a > f && chmod 600 f && mv f g && rm g")
    wanted = {("f", CREATE), ("f", WRITE), ("f", CHMOD), ("f", RENAME), ("g", CREATE)}
    seen = events_until(client, sandbox, watcher_id, wanted | {("g", REMOVE)})
    assert wanted | {("g", REMOVE)} <= set(seen)
    assert seen.index(("f", CREATE)) < seen.index(("f", RENAME)) < seen.index(("g", REMOVE))


def test_only_a_recursive_watcher_sees_below_and_a_new_directory_contents(
    client: Client, sandbox: dict[str, Any]
) -> None:
    flat = watcher(client, sandbox, "")
    deep = watcher(client, sandbox, "", recursive=True)
    client.run(sandbox, "mkdir -p ~/d/e && echo x > ~/d/e/f && echo top > ~/top")
    wanted = {("d", CREATE), ("d/e", CREATE), ("d/e/f", CREATE), ("top", CREATE)}
    assert wanted <= set(events_until(client, sandbox, deep, wanted))
    shallow = events_until(client, sandbox, flat, {("top", CREATE)})
    assert ("top", CREATE) in shallow
    assert not [name for name, _ in shallow if name.startswith("d/")]


def test_a_symlinked_directory_is_watched_as_the_sandbox_sees_it(
    client: Client, sandbox: dict[str, Any]
) -> None:
    client.run(sandbox, "mkdir /tmp/real && ln -s /tmp/real ~/link")
    watcher_id = watcher(client, sandbox, "link")
    client.run(sandbox, "echo a > /tmp/real/a")
    assert ("a", CREATE) in events_until(client, sandbox, watcher_id, {("a", CREATE)})


def test_a_missing_path_is_not_found_and_a_file_is_not_a_directory(
    client: Client, sandbox: dict[str, Any]
) -> None:
    missing = rpc(client, sandbox, "CreateWatcher", path="nope")
    assert missing.status_code == 404
    assert missing.json()["code"] == "not_found"
    assert missing.json()["message"].startswith("path /home/user/nope not found")
    client.run(sandbox, "echo > ~/plain")
    plain = rpc(client, sandbox, "CreateWatcher", path="plain")
    assert (plain.status_code, plain.json()["code"]) == (400, "invalid_argument")
    assert plain.json()["message"].startswith("path /home/user/plain not a directory")


def test_a_path_outside_the_sandbox_writable_places_is_refused(
    client: Client, sandbox: dict[str, Any]
) -> None:
    refused = rpc(client, sandbox, "CreateWatcher", path="/usr")
    assert (refused.status_code, refused.json()["code"]) == (400, "invalid_argument")
    assert "watches directories under /home/user, /tmp, /dev/shm" in refused.json()["message"]


def test_a_removed_or_unknown_watcher_is_not_found(client: Client, sandbox: dict[str, Any]) -> None:
    watcher_id = watcher(client, sandbox, "")
    assert rpc(client, sandbox, "RemoveWatcher", watcherId=watcher_id).json() == {}
    after = rpc(client, sandbox, "GetWatcherEvents", watcherId=watcher_id)
    assert after.status_code == 404
    assert after.json() == {
        "code": "not_found",
        "message": f"watcher with id {watcher_id} not found",
    }
    assert rpc(client, sandbox, "RemoveWatcher", watcherId="nope").status_code == 404


def test_a_sandbox_holds_a_bounded_number_of_watchers(
    client: Client, sandbox: dict[str, Any]
) -> None:
    for _ in range(MAX_WATCHERS):
        watcher(client, sandbox, "")
    refused = rpc(client, sandbox, "CreateWatcher", path="")
    assert (refused.status_code, refused.json()["code"]) == (429, "resource_exhausted")


def watch_dir(client: Client, sandbox: dict[str, Any], path: str) -> Stream:
    headers = {"Content-Type": "application/connect+json", "Keepalive-Ping-Interval": "50"}
    response = client.session.post(
        client.service.envd_url + FS + "WatchDir",
        data=connect_envelope({"path": path, "recursive": False}),
        headers=client.envd_headers(sandbox, **headers),
        timeout=(5, 15),
        stream=True,
    )
    assert response.status_code == 200, response.text
    return Stream(response)


def filesystem_events(stream: Stream) -> list[dict[str, Any]]:
    return [f.message["filesystem"] for f in stream.frames if "filesystem" in f.message]


def test_watch_dir_streams_start_then_events_and_ends_when_the_sandbox_ends(
    client: Client, sandbox: dict[str, Any]
) -> None:
    stream = watch_dir(client, sandbox, "")
    stream.until(lambda s: bool(s.frames))
    assert stream.frames[0].message == {"start": {}}
    client.run(sandbox, "echo x > ~/streamed")
    stream.until(lambda s: {"name": "streamed", "type": CREATE} in filesystem_events(s))
    assert {"name": "streamed", "type": CREATE} in filesystem_events(stream)
    client.control("DELETE", f"/sandboxes/{sandbox['sandboxID']}")
    stream.finish()
    assert stream.trailer == {
        "error": {"code": "unavailable", "message": "the sandbox was deleted"}
    }


def test_watch_dir_of_a_missing_path_is_an_end_of_stream_error(
    client: Client, sandbox: dict[str, Any]
) -> None:
    stream = watch_dir(client, sandbox, "nope").finish()
    trailer = stream.trailer
    assert trailer is not None and trailer["error"]["code"] == "not_found"


def test_no_watch_thread_is_left_once_the_sandbox_is_deleted(
    client: Client, sandbox: dict[str, Any]
) -> None:
    watcher(client, sandbox, "", recursive=True)
    assert [t for t in threading.enumerate() if t.name == "piship-local-watch"]
    client.control("DELETE", f"/sandboxes/{sandbox['sandboxID']}")
    assert gone(lambda: not [t for t in threading.enumerate() if t.name == "piship-local-watch"])


def test_a_directory_moved_within_a_recursive_watch_is_named_by_its_new_path(
    client: Client, sandbox: dict[str, Any]
) -> None:
    client.run(sandbox, "mkdir -p ~/old")
    watcher_id = watcher(client, sandbox, "", recursive=True)
    client.run(sandbox, "mv ~/old ~/new && echo x > ~/new/f")
    wanted = {("old", RENAME), ("new", CREATE), ("new/f", CREATE)}
    seen = events_until(client, sandbox, watcher_id, wanted)
    assert wanted <= set(seen)
    assert not [name for name, _ in seen if name.startswith("old/")]
