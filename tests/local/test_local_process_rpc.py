"""The local service's Process RPCs beyond Start: stdin, Connect, CloseStdin, StreamInput,
Update and List, pinned on the wire as envd answers them."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest

from piship_remote.local import LocalE2bService
from piship_remote.wire.connect import END_STREAM, EnvelopeReader, connect_envelope
from tests.support.local_service import Client, has_stdout, needs_bwrap
from tests.support.process_rpc import open_stream, pid_of, send_input, start, unary

pytestmark = [needs_bwrap, pytest.mark.timeout(30)]


@pytest.fixture(scope="module")
def service() -> Iterator[LocalE2bService]:
    with LocalE2bService() as running:
        yield running


def test_a_start_without_a_stdin_field_gets_a_pipe_as_envd_defaults(
    client: Client, sandbox: dict[str, Any]
) -> None:
    stream = start(client, sandbox, "read line; echo got:$line")
    response = send_input(client, sandbox, {"pid": pid_of(stream)}, b"hi\n")
    assert (response.status_code, response.json()) == (200, {})
    assert stream.finish().stdout == "got:hi\n"


def test_send_input_by_tag_reaches_the_tagged_command(
    client: Client, sandbox: dict[str, Any]
) -> None:
    stream = start(client, sandbox, "read line; echo got:$line", stdin=True, tag="reader")
    pid_of(stream)
    assert send_input(client, sandbox, {"tag": "reader"}, b"tagged\n").status_code == 200
    assert stream.finish().stdout == "got:tagged\n"


def test_send_input_to_a_command_started_without_stdin_is_an_internal_error(
    client: Client, sandbox: dict[str, Any]
) -> None:
    stream = start(client, sandbox, "sleep 30", stdin=False, tag="deaf")
    response = send_input(client, sandbox, {"pid": pid_of(stream)}, b"x")
    client.signal(sandbox, "deaf")
    stream.finish()
    assert response.status_code == 500
    assert response.json()["code"] == "internal"
    assert response.json()["message"].startswith("error writing to stdin:")


def test_send_input_to_an_unknown_pid_is_envds_not_found(
    client: Client, sandbox: dict[str, Any]
) -> None:
    response = send_input(client, sandbox, {"pid": 999999}, b"x")
    assert response.status_code == 404
    assert response.json() == {"code": "not_found", "message": "process with pid 999999 not found"}


def test_close_stdin_gives_the_command_end_of_file(client: Client, sandbox: dict[str, Any]) -> None:
    stream = start(client, sandbox, "wc -c", stdin=True)
    pid = pid_of(stream)
    send_input(client, sandbox, {"pid": pid}, b"four")
    response = unary(client, sandbox, "CloseStdin", {"process": {"pid": pid}})
    assert (response.status_code, response.json()) == (200, {})
    assert stream.finish().stdout.strip() == "4"


def test_connect_sends_a_start_event_then_what_happens_from_then_on(
    client: Client, sandbox: dict[str, Any]
) -> None:
    stream = start(client, sandbox, "echo early; read x; echo late:$x", stdin=True)
    pid = pid_of(stream)
    stream.until(has_stdout("early"))
    attached = open_stream(client, sandbox, "Connect", {"process": {"pid": pid}})
    assert pid_of(attached) == pid
    send_input(client, sandbox, {"pid": pid}, b"now\n")
    attached.finish()
    assert attached.stdout == "late:now\n"
    assert attached.end == {"exited": True, "status": "exit status 0"}
    assert attached.trailer == {}
    assert stream.finish().stdout == "early\nlate:now\n"


def test_connect_to_an_unknown_tag_is_an_end_stream_not_found(
    client: Client, sandbox: dict[str, Any]
) -> None:
    attached = open_stream(client, sandbox, "Connect", {"process": {"tag": "nobody"}})
    assert attached.finish().trailer == {
        "error": {"code": "not_found", "message": "process with tag 'nobody' not found"}
    }


def test_a_connect_deadline_ends_that_stream_and_leaves_the_command_running(
    client: Client, sandbox: dict[str, Any]
) -> None:
    stream = start(client, sandbox, "read x; echo still:$x", stdin=True)
    pid = pid_of(stream)
    attached = open_stream(
        client, sandbox, "Connect", {"process": {"pid": pid}}, **{"Connect-Timeout-Ms": "300"}
    )
    assert attached.finish().trailer == {
        "error": {"code": "deadline_exceeded", "message": "context deadline exceeded"}
    }
    send_input(client, sandbox, {"pid": pid}, b"here\n")
    assert stream.finish().stdout == "still:here\n"


def test_closing_a_start_stream_leaves_its_command_running(
    client: Client, sandbox: dict[str, Any]
) -> None:
    stream = start(client, sandbox, "read x; echo kept:$x", stdin=True)
    pid = pid_of(stream)
    stream.response.close()
    attached = open_stream(client, sandbox, "Connect", {"process": {"pid": pid}})
    pid_of(attached)
    send_input(client, sandbox, {"pid": pid}, b"on\n")
    assert attached.finish().stdout == "kept:on\n"


def test_an_unknown_user_on_connect_is_an_end_stream_unauthenticated(
    client: Client, sandbox: dict[str, Any]
) -> None:
    mallory = "Basic " + base64.b64encode(b"mallory:").decode()
    refused = open_stream(
        client, sandbox, "Connect", {"process": {"pid": 1}}, Authorization=mallory
    )
    assert refused.finish().trailer == {
        "error": {"code": "unauthenticated", "message": "invalid username: 'mallory'"}
    }


def test_stream_input_delivers_its_messages_in_order(
    client: Client, sandbox: dict[str, Any]
) -> None:
    stream = start(client, sandbox, "head -n 2", stdin=True)
    pid = pid_of(stream)
    body = connect_envelope({"start": {"process": {"pid": pid}}})
    body += connect_envelope({"keepalive": {}})
    for line in (b"b25lCg==", b"dHdvCg=="):  # "one\n", "two\n"
        body += connect_envelope({"data": {"input": {"stdin": line.decode()}}})
    response = client.session.post(
        f"{client.service.envd_url}/process.Process/StreamInput",
        data=body + connect_envelope({}, END_STREAM),
        headers=client.envd_headers(sandbox, **{"Content-Type": "application/connect+json"}),
        timeout=10,
    )
    assert response.status_code == 200
    frames = EnvelopeReader().push(response.content)
    assert [(f.flags, f.message) for f in frames] == [(0, {}), (END_STREAM, {})]
    assert stream.finish().stdout == "one\ntwo\n"


def test_update_of_a_command_without_a_pty_is_an_internal_error(
    client: Client, sandbox: dict[str, Any]
) -> None:
    stream = start(client, sandbox, "sleep 30", stdin=False, tag="plain")
    pid = pid_of(stream)
    size = {"size": {"cols": 100, "rows": 30}}
    response = unary(client, sandbox, "Update", {"process": {"pid": pid}, "pty": size})
    client.signal(sandbox, "plain")
    stream.finish()
    assert response.status_code == 500
    assert response.json()["code"] == "internal"


def test_list_gives_config_pid_and_tag_and_drops_ended_commands(
    client: Client, sandbox: dict[str, Any]
) -> None:
    stream = start(client, sandbox, "read x", stdin=True, tag="lister")
    pid = pid_of(stream)
    listed = unary(client, sandbox, "List", {}).json()
    send_input(client, sandbox, {"pid": pid}, b"\n")
    stream.finish()
    assert listed == {
        "processes": [
            {
                "config": {"cmd": "/bin/bash", "args": ["-l", "-c", "read x"]},
                "pid": pid,
                "tag": "lister",
            }
        ]
    }
    assert unary(client, sandbox, "List", {}).json() == {}
