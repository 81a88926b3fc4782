"""The clients the file scenarios compare, each moving a host file to or from one sandbox.

``upload(local, remote)`` sends the host file ``local`` to the sandbox path
``remote``; ``download(remote, local)`` writes the sandbox file into the host file
``local``. Every client has a sandbox of its own on the same service::

    with contextlib.ExitStack() as stack:
        clients, skipped = file_clients(url, api_key, workspace, stack)
        for client in clients:
            client.upload("/tmp/in.bin", "/home/user/in.bin")

Ours: ``ours-sandbox`` (``Sandbox.files.upload``/``download``, streamed through a
host file). Reference: ``e2b-sdk`` (``files.write`` with the open file, ``files.read``
with ``format="stream"`` written to the host file). Floor: ``socket-raw``, one
``POST /files`` (``application/octet-stream``, the body sent with ``sendfile``) or
``GET /files`` on a plain socket, read with ``recv_into`` and written to the file.
"""

from __future__ import annotations

import contextlib
import os
import socket
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import requests

from benchmarks.clients import SDK_MISSING, load_sdk, quietly
from benchmarks.local_service import USER, service_backend
from benchmarks.report import Role
from piship_remote.sandbox.activation import Sandbox, activate_sandbox

__all__ = ["FileClient", "RawFileSocket", "file_clients", "ours_sandbox", "raw_sandbox"]

_DENY = {"required": True, "network": {"mode": "deny"}}
_READ = 1024 * 1024
_HEAD_LIMIT = 64 * 1024


class FileClient(Protocol):
    """One way of moving a file in and out of a sandbox."""

    name: str
    role: Role

    def upload(self, local: str, remote: str) -> None: ...

    def download(self, remote: str, local: str) -> None: ...


class OursFiles:
    """``Sandbox.files.upload``/``download`` of an activated sandbox."""

    name = "ours-sandbox"
    role: Role = "ours"

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    def upload(self, local: str, remote: str) -> None:
        self.sandbox.files.upload(local, remote)

    def download(self, remote: str, local: str) -> None:
        self.sandbox.files.download(remote, local)


class SdkFiles:
    """The official SDK's ``files.write`` (the open file) and ``files.read`` (a stream)."""

    name = "e2b-sdk"
    role: Role = "reference"

    def __init__(self, sdk_sandbox: Any) -> None:
        self.sdk = sdk_sandbox

    def upload(self, local: str, remote: str) -> None:
        with open(local, "rb") as source:
            self.sdk.files.write(remote, source)

    def download(self, remote: str, local: str) -> None:
        with open(local, "wb") as out:
            for chunk in self.sdk.files.read(remote, format="stream"):
                out.write(chunk)


class RawFileSocket:
    """The floor: one request on a plain socket, the body sent or received at once."""

    name = "socket-raw"
    role: Role = "floor"

    def __init__(self, url: str, sandbox_id: str, token: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.address = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.headers = {
            "Host": f"{self.address[0]}:{self.address[1]}",
            "E2b-Sandbox-Id": sandbox_id,
            "X-Access-Token": token,
            "Connection": "close",
        }
        self.buffer = bytearray(_READ)

    def head(self, method: str, remote: str, extra: dict[str, str]) -> bytes:
        query = urllib.parse.urlencode({"path": remote, "username": USER})
        lines = [f"{method} /files?{query} HTTP/1.1"]
        lines += [f"{name}: {value}" for name, value in {**self.headers, **extra}.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    def upload(self, local: str, remote: str) -> None:
        size = os.path.getsize(local)
        extra = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        with socket.create_connection(self.address) as sock, open(local, "rb") as source:
            sock.sendall(self.head("POST", remote, extra))
            sock.sendfile(source)
            self._answer(sock, None)

    def upload_stream(self, remote: str, pieces: Iterator[bytes]) -> None:
        """``POST`` a body of unknown length (chunked), piece by piece as it is made."""
        extra = {"Content-Type": "application/octet-stream", "Transfer-Encoding": "chunked"}
        with socket.create_connection(self.address) as sock:
            sock.sendall(self.head("POST", remote, extra))
            for piece in pieces:
                sock.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
            sock.sendall(b"0\r\n\r\n")
            self._answer(sock, None)

    def download(self, remote: str, local: str) -> None:
        with socket.create_connection(self.address) as sock, open(local, "wb") as out:
            sock.sendall(self.head("GET", remote, {"Accept-Encoding": "identity"}))
            self._answer(sock, out.fileno())

    def _answer(self, sock: socket.socket, out: int | None) -> None:
        """Read the answer to EOF (``Connection: close``); its body goes to ``out``."""
        view = memoryview(self.buffer)
        head = bytearray()
        while (end := head.find(b"\r\n\r\n")) < 0:
            received = sock.recv_into(view)
            if not received or len(head) > _HEAD_LIMIT:
                raise RuntimeError("socket-raw: the answer ended before its head")
            head += view[:received]
        status = bytes(head[: head.find(b"\r\n")])
        if b" 200 " not in status:
            raise RuntimeError(f"socket-raw: {status.decode(errors='replace')}")
        if out is None:
            return
        body = bytes(head[end + 4 :])
        if b"transfer-encoding: chunked" in head[:end].lower():
            _dechunk(sock, body, view, out)
            return
        os.write(out, body)
        while received := sock.recv_into(view):
            os.write(out, view[:received])


def _dechunk(sock: socket.socket, pending: bytes, view: memoryview, out: int) -> None:
    """Write a chunked body's data to ``out`` as it arrives (the least work that decodes it)."""
    buffer = bytearray(pending)
    while True:
        while (line_end := buffer.find(b"\r\n")) < 0:
            buffer += _received(sock, view)
        size = int(bytes(buffer[:line_end]).split(b";", 1)[0], 16)
        del buffer[: line_end + 2]
        if size == 0:
            return
        while size > 0:
            if not buffer:
                buffer += _received(sock, view)
            take = min(size, len(buffer))
            os.write(out, memoryview(buffer)[:take])
            del buffer[:take]
            size -= take
        while len(buffer) < 2:
            buffer += _received(sock, view)
        del buffer[:2]


def _received(sock: socket.socket, view: memoryview) -> memoryview:
    received = sock.recv_into(view)
    if not received:
        raise RuntimeError("socket-raw: the chunked answer ended early")
    return view[:received]


def ours_sandbox(url: str, api_key: str, workspace: str, stack: contextlib.ExitStack) -> Sandbox:
    """An activated sandbox of ours on the service at ``url``, disposed by ``stack``."""
    backend = service_backend(url, api_key, stack)
    sandbox = activate_sandbox(_DENY, backend=backend, workspace=workspace, env={})
    stack.callback(sandbox.dispose)
    return sandbox


def raw_sandbox(url: str, api_key: str, stack: contextlib.ExitStack) -> RawFileSocket:
    """A sandbox made with one raw ``POST /sandboxes``, deleted by ``stack``."""
    headers = {"X-API-Key": api_key}
    session = requests.Session()
    stack.callback(session.close)
    created = session.post(
        f"{url}/sandboxes", json={"templateID": "base", "timeout": 600}, headers=headers, timeout=60
    )
    created.raise_for_status()
    answer = created.json()
    sandbox_id = answer["sandboxID"]
    stack.callback(
        quietly, lambda: session.delete(f"{url}/sandboxes/{sandbox_id}", headers=headers)
    )
    return RawFileSocket(url, sandbox_id, answer.get("envdAccessToken") or "")


def _sdk(url: str, api_key: str, stack: contextlib.ExitStack) -> SdkFiles:
    sdk = load_sdk()
    if sdk is None:
        raise LookupError(SDK_MISSING)
    sandbox = sdk.Sandbox.create(
        api_key=api_key, api_url=url, sandbox_url=url, request_timeout=60
    )
    stack.callback(quietly, sandbox.kill)
    return SdkFiles(sandbox)


def file_clients(
    url: str, api_key: str, workspace: str, stack: contextlib.ExitStack
) -> tuple[list[FileClient], list[str]]:
    """Ours, the SDK and the raw socket on the service at ``url``; who could not be set up."""
    makers: dict[str, Callable[[], FileClient]] = {
        "ours-sandbox": lambda: OursFiles(ours_sandbox(url, api_key, workspace, stack)),
        "e2b-sdk": lambda: _sdk(url, api_key, stack),
        "socket-raw": lambda: raw_sandbox(url, api_key, stack),
    }
    clients: list[FileClient] = []
    skipped: list[str] = []
    for name, make in makers.items():
        try:
            clients.append(make())
        except LookupError as missing:
            skipped.append(f"{name}: {missing}")
        except Exception as error:
            skipped.append(f"{name}: setup failed: {type(error).__name__}: {error}")
    return clients, skipped
