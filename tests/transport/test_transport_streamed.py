"""A stream's answer: plain chunked heads skip urllib3's response; every other head does not."""

from __future__ import annotations

import gzip
import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from piship_remote.model.redact import Redactor
from piship_remote.transport import Transport
from piship_remote.transport._streamed_response import StreamedResponse
from tests.support.loopback_http import LoopbackHttp

pytestmark = pytest.mark.timeout(20)

BODY = b"0123456789" * 100


def chunked(body: bytes, size: int = 300) -> bytes:
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts) + b"0\r\n\r\n"


def answer(*fields: str, body: bytes = chunked(BODY), status: str = "200 OK") -> list[bytes]:
    head = f"HTTP/1.1 {status}\r\n" + "".join(f"{field}\r\n" for field in fields) + "\r\n"
    return [head.encode("latin-1") + body]


class RawServer:
    """Answers each GET with the byte strings of ``answers[path]``, each one flushed
    (before all but the first, it waits for ``gate``); records the client ports."""

    def __init__(self) -> None:
        self.ports: list[int] = []
        self.answers: dict[str, list[bytes]] = {}
        self.gate = threading.Event()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                owner.ports.append(self.client_address[1])
                for index, piece in enumerate(owner.answers[self.path]):
                    if index:
                        owner.gate.wait(5)
                    try:
                        self.wfile.write(piece)
                        self.wfile.flush()
                    except OSError:
                        self.close_connection = True
                        return

        self._http = LoopbackHttp(Handler)
        self.url = self._http.url

    def close(self) -> None:
        self.gate.set()
        self._http.close()


@pytest.fixture
def raw_server() -> Iterator[RawServer]:
    server = RawServer()
    server.answers["/plain"] = answer("Content-Type: text/plain", "Transfer-Encoding: chunked")
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def session() -> Iterator[requests.Session]:
    with requests.Session() as instance:
        yield instance


@pytest.fixture
def transport(session: requests.Session) -> Iterator[Transport]:
    instance = Transport(redactor=Redactor(), session=session)
    try:
        yield instance
    finally:
        instance.close()


def read_stream(transport: Transport, url: str) -> tuple[bytes, Any]:
    response = transport.request("GET", url, stream=True)
    body = b"".join(bytes(piece) for piece in response.iter_raw())
    return body, response


def test_a_plain_chunked_stream_skips_urllib3s_response(
    transport: Transport, raw_server: RawServer
) -> None:
    body, response = read_stream(transport, f"{raw_server.url}/plain")
    assert body == BODY
    assert isinstance(response._raw, StreamedResponse)
    assert response.headers["CONTENT-TYPE"] == "text/plain"


def test_a_read_stream_gives_its_connection_back(
    transport: Transport, raw_server: RawServer
) -> None:
    for _ in range(3):
        assert read_stream(transport, f"{raw_server.url}/plain")[0] == BODY
    assert len(raw_server.ports) == 3 and len(set(raw_server.ports)) == 1


def test_a_stream_closed_before_its_end_costs_its_connection(
    transport: Transport, raw_server: RawServer
) -> None:
    raw_server.answers["/slow"] = [*answer("Transfer-Encoding: chunked", body=b"5\r\nfirst\r\n")]
    raw_server.answers["/slow"].append(b"4\r\nlast\r\n0\r\n\r\n")
    response = transport.request("GET", f"{raw_server.url}/slow", stream=True)
    assert bytes(next(iter(response.iter_raw()))) == b"first"
    response.close()
    raw_server.gate.set()
    assert read_stream(transport, f"{raw_server.url}/plain")[0] == BODY
    assert raw_server.ports[0] != raw_server.ports[1]


def test_a_head_that_arrives_in_pieces_is_read_whole(
    transport: Transport, raw_server: RawServer
) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
    raw_server.answers["/split"] = [head[:20], head[20:] + chunked(BODY)]
    raw_server.gate.set()
    body, response = read_stream(transport, f"{raw_server.url}/split")
    assert body == BODY
    assert response.headers["content-type"] == "text/plain"


def test_a_gzip_coded_stream_is_decoded(transport: Transport, raw_server: RawServer) -> None:
    coded = chunked(gzip.compress(BODY))
    raw_server.answers["/gzip"] = answer(
        "Content-Encoding: gzip", "Transfer-Encoding: chunked", body=coded
    )
    body, response = read_stream(transport, f"{raw_server.url}/gzip")
    assert body == BODY
    assert not isinstance(response._raw, StreamedResponse)


def test_a_cookie_on_a_stream_is_stored(
    transport: Transport, raw_server: RawServer, session: requests.Session
) -> None:
    raw_server.answers["/cookie"] = answer(
        "Set-Cookie: seen=1; Path=/", "Transfer-Encoding: chunked"
    )
    assert read_stream(transport, f"{raw_server.url}/cookie")[0] == BODY
    assert session.cookies.get("seen") == "1"


def test_a_head_that_is_not_plain_reads_as_the_standard_library_reads_it(
    transport: Transport, raw_server: RawServer
) -> None:
    raw_server.answers["/folded"] = answer(
        "X-Folded: one", " two", "X-Latin: caf\u00e9", "Transfer-Encoding: chunked"
    )
    body, response = read_stream(transport, f"{raw_server.url}/folded")
    assert body == BODY
    assert not isinstance(response._raw, StreamedResponse)
    assert response.headers["x-folded"] == "one two"
    assert response.headers["x-latin"] == "caf\u00e9"


def test_a_stream_answered_with_a_length_is_read_to_its_end(
    transport: Transport, raw_server: RawServer
) -> None:
    raw_server.answers["/length"] = answer(f"Content-Length: {len(BODY)}", body=BODY)
    body, response = read_stream(transport, f"{raw_server.url}/length")
    assert body == BODY
    assert not isinstance(response._raw, StreamedResponse)
