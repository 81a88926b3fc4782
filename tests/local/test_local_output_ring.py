"""The local service's output ring on the wire: a Connect with ``Piship-Output-Offset``
replays each stream from the offset asked for (or from the oldest byte kept, saying so
in the answer's header), and an ended command stays reachable for its end. A command
whose client went away waits for it within the grace, and runs on after it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from piship_remote.local import LocalE2bService
from piship_remote.local.envd import process_feed
from piship_remote.local.envd.output_ring import RING_BYTES
from tests.support.local_service import Client, needs_bwrap
from tests.support.process_rpc import open_stream, start, unary

pytestmark = [needs_bwrap, pytest.mark.timeout(60)]

OUTPUT = "".join(f"{n}\n" for n in range(1, 2001))  # 8893 bytes


@pytest.fixture(scope="module")
def service() -> Iterator[LocalE2bService]:
    with LocalE2bService() as running:
        yield running


def ended_command(client: Client, sandbox: dict[str, Any], tag: str) -> None:
    """Start ``seq`` tagged ``tag``, leave its stream at once, and let it end."""
    stream = start(client, sandbox, "seq 1 2000; echo oops >&2; exit 7", tag=tag)
    stream.until(lambda s: bool(s.events("start")))
    stream.response.close()
    time.sleep(0.5)


def connect(client: Client, sandbox: dict[str, Any], tag: str, **headers: str) -> Any:
    return open_stream(client, sandbox, "Connect", {"process": {"tag": tag}}, **headers)


def test_connect_with_an_offset_replays_from_it_and_ends_with_the_exit_code(
    client: Client, sandbox: dict[str, Any]
) -> None:
    ended_command(client, sandbox, "ring-a")
    stream = connect(client, sandbox, "ring-a", **{"Piship-Output-Offset": "stdout=100,stderr=0"})
    stream.finish()
    assert stream.response.headers["Piship-Output-Offset"] == "stdout=100,stderr=0"
    assert (stream.stdout, stream.stderr) == (OUTPUT[100:], "oops\n")
    assert stream.end is not None and stream.end["exitCode"] == 7


def test_a_ring_that_moved_past_the_offset_replays_from_its_oldest_byte_and_says_so(
    client: Client, sandbox: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(process_feed, "RING_BYTES", 1000)
    monkeypatch.setattr(process_feed, "GRACE", 0.0)  # nothing dropped within the grace
    ended_command(client, sandbox, "ring-b")
    stream = connect(client, sandbox, "ring-b", **{"Piship-Output-Offset": "stdout=0,stderr=0"})
    stream.finish()
    first = len(OUTPUT) - 1000
    assert stream.response.headers["Piship-Output-Offset"] == f"stdout={first},stderr=0"
    assert stream.stdout == OUTPUT[first:]


def test_connect_without_the_header_is_envds_from_now_on(
    client: Client, sandbox: dict[str, Any]
) -> None:
    ended_command(client, sandbox, "ring-c")
    stream = connect(client, sandbox, "ring-c")
    stream.finish()
    assert "Piship-Output-Offset" not in stream.response.headers
    assert stream.stdout == ""
    assert stream.end is not None and stream.end["exitCode"] == 7


BIG_LINES = 3_700_000  # ~30 MB of numbered lines: far more than the ring and its held part
BIG = "".join(f"{n}\n" for n in range(1, BIG_LINES + 1))


def test_a_writer_much_faster_than_the_reconnect_loses_nothing(
    client: Client, sandbox: dict[str, Any]
) -> None:
    stream = start(client, sandbox, f"seq 1 {BIG_LINES}; echo done >&2", tag="ring-big")
    stream.until(lambda s: len(s.events("data")) >= 10)
    stream.response.close()
    received = stream.stdout
    time.sleep(3.0)  # the command could write all of it ten times over meanwhile
    offsets = f"stdout={len(received)},stderr=0"
    rest = connect(client, sandbox, "ring-big", **{"Piship-Output-Offset": offsets})
    rest.finish()
    assert rest.response.headers["Piship-Output-Offset"] == offsets
    assert received + rest.stdout == BIG
    assert rest.stderr == "done\n"
    assert rest.end is not None and rest.end["status"] == "exit status 0"


def test_a_command_nobody_follows_runs_to_its_end_after_the_grace_keeping_its_last_bytes(
    client: Client, sandbox: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(process_feed, "GRACE", 0.5)
    stream = start(client, sandbox, f"seq 1 {BIG_LINES}", tag="ring-away")
    stream.until(lambda s: bool(s.events("start")))
    stream.response.close()  # as an SDK's disconnect() of a background command
    while "ring-away" in running_tags(client, sandbox):
        time.sleep(0.2)  # the service tells no one of an end nobody follows
    rest = connect(client, sandbox, "ring-away", **{"Piship-Output-Offset": "stdout=0,stderr=0"})
    rest.finish()
    first = len(BIG) - RING_BYTES
    assert rest.response.headers["Piship-Output-Offset"] == f"stdout={first},stderr=0"
    assert rest.stdout == BIG[first:]


def running_tags(client: Client, sandbox: dict[str, Any]) -> list[str]:
    answer = unary(client, sandbox, "List", {})
    return [p.get("tag") for p in answer.json().get("processes", [])]
