"""Helpers for driving the local service's Process RPCs on the wire: Start with stdin or a
pty, Connect, and the unary calls, each answer as the Connect peer sends it."""

from __future__ import annotations

import base64
from typing import Any

import requests

from piship_remote.wire.connect import connect_envelope
from tests.support.local_service import BASIC_USER, HTTP_TIMEOUT, Client, Stream

STREAM_TYPE = "application/connect+json"


def open_stream(
    client: Client, sandbox: dict[str, Any], method: str, message: dict[str, Any], **headers: str
) -> Stream:
    """A Start or Connect stream (``message`` is its request), read as it arrives."""
    response = client.session.post(
        f"{client.service.envd_url}/process.Process/{method}",
        data=connect_envelope(message),
        headers=client.envd_headers(
            sandbox, **{"Content-Type": STREAM_TYPE, "Authorization": BASIC_USER, **headers}
        ),
        timeout=HTTP_TIMEOUT,
        stream=True,
    )
    assert response.status_code == 200, response.text
    return Stream(response)


def start(client: Client, sandbox: dict[str, Any], command: str, **fields: Any) -> Stream:
    """Start ``bash -l -c command`` with the extra StartRequest ``fields`` (stdin, tag, pty)."""
    process = {"cmd": "/bin/bash", "args": ["-l", "-c", command]}
    return open_stream(client, sandbox, "Start", {"process": process, **fields})


def start_pty(
    client: Client, sandbox: dict[str, Any], cols: int, rows: int, **process: Any
) -> Stream:
    """An interactive login shell on a pty, as the SDKs' ``pty.create`` asks for one."""
    config = {"cmd": "/bin/bash", "args": ["-i", "-l"], "envs": {"TERM": "xterm"}, **process}
    message = {"process": config, "pty": {"size": {"cols": cols, "rows": rows}}}
    return open_stream(client, sandbox, "Start", message)


def unary(
    client: Client, sandbox: dict[str, Any], method: str, body: dict[str, Any]
) -> requests.Response:
    return client.session.post(
        f"{client.service.envd_url}/process.Process/{method}",
        json=body,
        headers=client.envd_headers(sandbox),
        timeout=HTTP_TIMEOUT,
    )


def send_input(
    client: Client,
    sandbox: dict[str, Any],
    selector: dict[str, Any],
    data: bytes,
    kind: str = "stdin",
) -> requests.Response:
    encoded = base64.b64encode(data).decode()
    return unary(client, sandbox, "SendInput", {"process": selector, "input": {kind: encoded}})


def pid_of(stream: Stream) -> int:
    stream.until(lambda s: bool(s.events("start")))
    pid: int = stream.events("start")[0]["pid"]
    return pid


def pty_text(stream: Stream) -> str:
    parts = [f.message.get("event", {}).get("data", {}).get("pty") for f in stream.frames]
    return b"".join(base64.b64decode(p) for p in parts if p).decode(errors="replace")


def pty_shows(text: str) -> Any:
    return lambda stream: text in pty_text(stream)
