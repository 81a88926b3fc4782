"""The local service's HTTP server reads one body end only: ambiguous framing is a 400.

Two different ``Content-Length`` values, or a length beside ``Transfer-Encoding``,
let a proxy in front and this server split a connection's bytes into different
requests (request smuggling); such a request is refused before its body is read.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from piship_remote._http_server.server import HttpServer, Reply, Request

TIMEOUT = 5.0


def ok(_: Request) -> Reply:
    return Reply(200, b"ok", "text/plain")


@pytest.fixture
def server() -> Iterator[HttpServer]:
    with HttpServer(ok) as running:
        yield running


def exchange(server: HttpServer, head: bytes, body: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as sock:
        sock.sendall(head + b"\r\n" + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def test_two_different_content_lengths_are_a_400(server: HttpServer) -> None:
    head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 40\r\n"
    answer = exchange(server, head, b"abc")
    assert answer.startswith(b"HTTP/1.1 400")
    assert b"conflicting Content-Length headers" in answer


def test_content_length_beside_transfer_encoding_is_a_400(server: HttpServer) -> None:
    head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n"
    answer = exchange(server, head, b"3\r\nabc\r\n0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400")
    assert b"Content-Length and Transfer-Encoding together" in answer


def test_a_repeated_equal_content_length_is_one_length(server: HttpServer) -> None:
    head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 3\r\n"
    head += b"Connection: close\r\n"
    assert exchange(server, head, b"abc").startswith(b"HTTP/1.1 200")
