"""A plain response head is read without the email parser, exactly as http.client reads it;
anything unusual is left to http.client."""

from __future__ import annotations

import http.client
import io
from typing import Any

import pytest

from piship_remote.transport._connection import _DeadlineResponse
from piship_remote.transport._response_head import peek_plain_head, read_plain_head

PLAIN = [
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
    b"HTTP/1.1 204 No Content\r\nDate: Fri, 04 Dec 2026 18:00:00 GMT\r\n\r\n",
    b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n",
    b"HTTP/1.1 201 \r\nContent-Length: 0\r\nConnection: keep-alive, Close\r\n\r\n",
    b"HTTP/1.1 500\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200  Fine  \r\nX-A:  spaced value \t \r\nx-a:\tsecond\r\nEmpty:\r\n\r\nrest",
    b"HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 1_0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: nope\r\n\r\n",
    b"HTTP/1.1 404 Not Found\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX-Quote: \"a\" 'b' (c) {d}\r\nRetry-After: 3\r\n\r\nbody",
]

UNUSUAL = [
    b"HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\nContent-Length: 0\r\n\r\n",  # obsolete folding
    b"HTTP/1.1 200 OK\r\nX-Latin: caf\xe9\r\nContent-Length: 0\r\n\r\n",  # a byte past ASCII
    b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\nContent-Length: 0\n\n",  # bare line feeds
    b"HTTP/1.1 200 OK\r\nBad Name: x\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX: a\rb\r\nContent-Length: 0\r\n\r\n",  # a lone carriage return
    b"HTTP/1.1 0200 OK\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 9000 + b"\r\nContent-Length: 0\r\n\r\n",  # > buffer
]


class _Socket:
    """What http.client's response needs of a socket: ``makefile`` over fixed bytes."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(io.BytesIO(self.data))


def _state(response: http.client.HTTPResponse) -> dict[str, Any]:
    """Everything begin() sets, the header object whole, and the bytes left after the head."""
    return {
        "status": response.status,
        "code": response.code,
        "reason": response.reason,
        "version": response.version,
        "chunked": response.chunked,
        "chunk_left": response.chunk_left,
        "length": response.length,
        "will_close": response.will_close,
        "headers": {**vars(response.headers), "defects": _kinds(response.headers.defects)},
        "items": response.headers.items(),
        "rest": response.fp.read() if response.fp is not None else None,
    }


def _kinds(defects: list[Exception]) -> list[str]:
    return [type(defect).__name__ for defect in defects]


def _stdlib(data: bytes, method: str = "POST") -> dict[str, Any]:
    response = http.client.HTTPResponse(_Socket(data), method=method)  # type: ignore[arg-type]
    response.begin()
    return _state(response)


def _ours(data: bytes, method: str = "POST") -> dict[str, Any]:
    response = _DeadlineResponse(_Socket(data), method=method)
    response.begin()
    return _state(response)


@pytest.mark.parametrize("data", PLAIN)
def test_a_plain_head_is_read_without_the_parser(data: bytes) -> None:
    fp = io.BufferedReader(io.BytesIO(data))
    assert read_plain_head(fp, "POST") is not None


@pytest.mark.parametrize("data", PLAIN)
def test_a_plain_head_reads_as_http_client_reads_it(data: bytes) -> None:
    assert _ours(data) == _stdlib(data)


@pytest.mark.parametrize("data", UNUSUAL)
def test_an_unusual_head_is_left_whole_to_http_client(data: bytes) -> None:
    fp = io.BufferedReader(io.BytesIO(data))
    assert read_plain_head(fp, "POST") is None
    assert fp.read() == data


@pytest.mark.parametrize("data", UNUSUAL)
def test_an_unusual_head_reads_as_http_client_reads_it(data: bytes) -> None:
    assert _ours(data) == _stdlib(data)


def test_the_answer_to_a_head_request_is_left_to_http_client() -> None:
    data = PLAIN[0]
    assert read_plain_head(io.BufferedReader(io.BytesIO(data)), "HEAD") is None
    assert _ours(data, "HEAD") == _stdlib(data, "HEAD")


def test_a_head_without_its_end_in_the_buffer_is_left_to_http_client() -> None:
    data = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n"  # the blank line has not arrived
    fp = io.BufferedReader(io.BytesIO(data))
    assert read_plain_head(fp, "POST") is None
    assert fp.read() == data


def test_a_reader_that_is_not_buffered_is_left_to_http_client() -> None:
    assert read_plain_head(io.BytesIO(PLAIN[0]), "POST") is None


def test_a_closed_connection_is_reported_by_http_client() -> None:
    with pytest.raises(http.client.RemoteDisconnected):
        _ours(b"")


def test_too_many_headers_are_refused_by_http_client() -> None:
    data = b"HTTP/1.1 200 OK\r\n" + b"X: 1\r\n" * 101 + b"\r\n"
    with pytest.raises(http.client.HTTPException, match="more than 100 headers"):
        _ours(data)


@pytest.mark.parametrize("data", PLAIN)
def test_a_peeked_head_stays_on_the_reader_and_gives_its_size(data: bytes) -> None:
    fp = io.BufferedReader(io.BytesIO(data))
    head = peek_plain_head(fp, "POST")
    assert head is not None
    assert fp.read() == data
    assert data[head.size - 4 : head.size] == b"\r\n\r\n"
    assert data.count(b"\r\n\r\n", 0, head.size) == 1


def test_the_fields_keep_their_order_case_and_repeats() -> None:
    head = peek_plain_head(io.BufferedReader(io.BytesIO(PLAIN[7])), "POST")
    assert head is not None
    assert head.fields == (("X-A", "spaced value \t "), ("x-a", "second"), ("Empty", ""))


@pytest.mark.parametrize(
    ("fields", "bare"),
    [
        (b"Transfer-Encoding: chunked\r\n", True),
        (b"Transfer-Encoding: chunked\r\nContent-Encoding: identity\r\n", True),
        (b"Transfer-Encoding: chunked\r\nContent-Encoding: gzip\r\n", False),
        (b"Transfer-Encoding: chunked\r\nSet-Cookie: a=1\r\n", False),
        (b"Content-Length: 0\r\n", False),
    ],
)
def test_a_bare_stream_is_chunked_without_a_coding_or_a_cookie(fields: bytes, bare: bool) -> None:
    data = b"HTTP/1.1 200 OK\r\n" + fields + b"\r\n"
    head = peek_plain_head(io.BufferedReader(io.BytesIO(data)), "POST")
    assert head is not None and head.bare_stream is bare
