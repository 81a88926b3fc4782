"""Request framing on the wire: one of Content-Length or chunked, never both."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
import requests

from piship_remote.model.redact import Redactor
from piship_remote.transport import Transport

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


class RecordingServer:
    """Accepts one connection, keeps the raw request until the client stops sending."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/files"
        self.raw = b""
        self.received = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def head(self) -> list[str]:
        """The request's header lines, lower-cased."""
        return self.raw.partition(b"\r\n\r\n")[0].decode().lower().split("\r\n")[1:]

    def body(self) -> bytes:
        return self.raw.partition(b"\r\n\r\n")[2]

    def close(self) -> None:
        self._listener.close()
        self._thread.join(5)

    def _serve(self) -> None:
        connection, _ = self._listener.accept()
        with connection:
            connection.settimeout(5)
            while not self._complete():
                piece = connection.recv(65536)
                if not piece:
                    break
                self.raw += piece
            self.received.set()
            connection.sendall(ANSWER)

    def _complete(self) -> bool:
        head, found, body = self.raw.partition(b"\r\n\r\n")
        if not found:
            return False
        for line in head.decode().lower().split("\r\n"):
            if line.startswith("content-length:"):
                return len(body) >= int(line.partition(":")[2])
        return body.endswith(b"0\r\n\r\n")


@pytest.fixture
def recorder() -> Iterator[RecordingServer]:
    server = RecordingServer()
    yield server
    server.close()


@pytest.fixture
def transport() -> Iterator[Transport]:
    client = Transport(redactor=Redactor())
    yield client
    client.close()


def _post(transport: Transport, url: str, headers: dict[str, str]) -> None:
    response = transport.request(
        "POST", url, headers=headers, data=iter([b"abc", b"def"]), timeout=10
    )
    response.close()


@pytest.mark.timeout(20)
def test_a_streamed_body_with_its_length_goes_out_unchunked(
    transport: Transport, recorder: RecordingServer
) -> None:
    _post(transport, recorder.url, {"Content-Length": "6"})
    assert recorder.received.wait(5)
    assert "content-length: 6" in recorder.head()
    assert not any(line.startswith("transfer-encoding") for line in recorder.head())
    assert recorder.body() == b"abcdef"


@pytest.mark.timeout(20)
def test_a_streamed_body_without_a_length_goes_out_chunked_only(
    transport: Transport, recorder: RecordingServer
) -> None:
    _post(transport, recorder.url, {})
    assert recorder.received.wait(5)
    assert "transfer-encoding: chunked" in recorder.head()
    assert not any(line.startswith("content-length") for line in recorder.head())
    assert recorder.body() == b"3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n"


@pytest.mark.timeout(20)
def test_a_session_that_prepares_requests_itself_sends_one_framing(
    recorder: RecordingServer,
) -> None:
    session = requests.Session()
    session.cookies.set("kept", "1")  # the session prepares the request itself
    client = Transport(redactor=Redactor(), session=session)
    try:
        _post(client, recorder.url, {"Content-Length": "6"})
    finally:
        client.close()
    assert recorder.received.wait(5)
    assert "content-length: 6" in recorder.head()
    assert not any(line.startswith("transfer-encoding") for line in recorder.head())
    assert recorder.body() == b"abcdef"
