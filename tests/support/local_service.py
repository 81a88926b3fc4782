"""Talking to the local E2B-compatible service in tests: its two planes over one session.

``Client`` creates sandboxes and starts commands with plain ``requests`` and the
Connect codec; ``Stream`` reads a Start response frame by frame::

    client = Client(service)
    sandbox = client.create()
    assert client.run(sandbox, "echo hi").stdout == "hi\n"

The ``service``, ``client`` and ``sandbox`` fixtures built on these are in ``conftest.py``.
"""

from __future__ import annotations

import base64
import os
import secrets
import time
from collections.abc import Callable
from typing import Any

import pytest
import requests

from piship_remote.local import LocalE2bService
from piship_remote.wire.connect import END_STREAM, EnvelopeReader, Frame, connect_envelope

PROBLEM = LocalE2bService.check()
needs_bwrap = pytest.mark.skipif(PROBLEM is not None, reason=f"bubblewrap cannot run: {PROBLEM}")
HTTP_TIMEOUT = (5, 15)
BASIC_USER = "Basic " + base64.b64encode(b"user:").decode()


class Stream:
    """A Start response read frame by frame."""

    def __init__(self, response: requests.Response) -> None:
        self.response = response
        self.frames: list[Frame] = []
        self._reader = EnvelopeReader()
        self._chunks = response.iter_content(None)

    def _more(self) -> bool:
        chunk = next(self._chunks, None)
        if chunk is None:
            return False
        self.frames += self._reader.push(chunk)
        return True

    def until(self, done: Callable[[Stream], bool]) -> Stream:
        while not done(self) and self._more():
            pass
        return self

    def finish(self) -> Stream:
        return self.until(lambda _: False)

    def _output(self, name: str) -> str:
        parts = [f.message.get("event", {}).get("data", {}).get(name) for f in self.frames]
        return b"".join(base64.b64decode(p) for p in parts if p).decode()

    @property
    def stdout(self) -> str:
        return self._output("stdout")

    @property
    def stderr(self) -> str:
        return self._output("stderr")

    def events(self, name: str) -> list[dict[str, Any]]:
        return [f.message["event"][name] for f in self.frames if name in f.message.get("event", {})]

    @property
    def end(self) -> dict[str, Any] | None:
        ends = self.events("end")
        return ends[0] if ends else None

    @property
    def trailer(self) -> dict[str, Any] | None:
        last = [f.message for f in self.frames if f.flags & END_STREAM]
        return last[0] if last else None


class Client:
    """The service's two planes over one ``requests`` session."""

    def __init__(self, service: LocalE2bService) -> None:
        self.service = service
        self.session = requests.Session()

    def create(self, **body: Any) -> dict[str, Any]:
        body.setdefault("templateID", "base")
        body.setdefault("timeout", 300)
        body.setdefault("allow_internet_access", False)  # as our own client sends it
        response = self.control("POST", "/sandboxes", json=body)
        assert response.status_code == 201, response.text
        answer: dict[str, Any] = response.json()
        return answer

    def control(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        headers = {"X-API-Key": self.service.api_key, **kwargs.pop("headers", {})}
        return self.session.request(
            method, self.service.url + path, headers=headers, timeout=HTTP_TIMEOUT, **kwargs
        )

    def envd_headers(self, sandbox: dict[str, Any], **extra: str) -> dict[str, str]:
        return {
            "E2b-Sandbox-Id": sandbox["sandboxID"],
            "X-Access-Token": sandbox["envdAccessToken"],
            "Connect-Protocol-Version": "1",
            **extra,
        }

    def start(
        self,
        sandbox: dict[str, Any],
        command: str,
        *,
        envs: dict[str, str] | None = None,
        cwd: str | None = None,
        tag: str = "",
        headers: dict[str, str] | None = None,
    ) -> Stream:
        process: dict[str, Any] = {"cmd": "/bin/bash", "args": ["-l", "-c", command]}
        if envs is not None:
            process["envs"] = envs
        if cwd is not None:
            process["cwd"] = cwd
        base = {"Content-Type": "application/connect+json", "Authorization": BASIC_USER}
        response = self.session.post(
            self.service.envd_url + "/process.Process/Start",
            data=connect_envelope({"process": process, "stdin": False, "tag": tag}),
            headers=self.envd_headers(sandbox, **base, **(headers or {})),
            timeout=HTTP_TIMEOUT,
            stream=True,
        )
        assert response.status_code == 200, response.text
        return Stream(response)

    def run(self, sandbox: dict[str, Any], command: str, **kwargs: Any) -> Stream:
        return self.start(sandbox, command, **kwargs).finish()

    def signal(self, sandbox: dict[str, Any], tag: str) -> requests.Response:
        return self.session.post(
            self.service.envd_url + "/process.Process/SendSignal",
            json={"process": {"tag": tag}, "signal": "SIGNAL_SIGKILL"},
            headers=self.envd_headers(sandbox),
            timeout=HTTP_TIMEOUT,
        )


def basic(user: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:".encode()).decode()


def start_as(
    client: Client, sandbox: dict[str, Any], user: str, command: str, **fields: Any
) -> Stream:
    """Start ``bash -c command`` as ``user`` (Basic auth, as the SDKs send ``user=``)."""
    process = {"cmd": "/bin/bash", "args": ["-c", command], **fields.pop("process", {})}
    response = client.session.post(
        f"{client.service.envd_url}/process.Process/Start",
        data=connect_envelope({"process": process, "stdin": False, **fields}),
        headers=client.envd_headers(
            sandbox, **{"Content-Type": "application/connect+json", "Authorization": basic(user)}
        ),
        timeout=HTTP_TIMEOUT,
        stream=True,
    )
    assert response.status_code == 200, response.text
    return Stream(response)


def run_as(client: Client, sandbox: dict[str, Any], user: str, command: str) -> Stream:
    stream = start_as(client, sandbox, user, command).finish()
    assert stream.trailer == {}, stream.trailer
    return stream


def marker() -> str:
    """A sleep duration no other process on this host has in its command line."""
    return f"30.{secrets.randbelow(10**9):09d}"


def marked(mark: str) -> list[int]:
    """The host processes whose command line holds ``mark`` (other than this test's)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if mark.encode() in handle.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def gone(check: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Poll ``check`` (no event exists for a process leaving the host) until true or timeout.

    The same poll serves a process appearing: ``gone(lambda: len(marked(mark)) >= 2)``.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def has_stdout(text: str) -> Callable[[Stream], bool]:
    return lambda stream: text in stream.stdout
