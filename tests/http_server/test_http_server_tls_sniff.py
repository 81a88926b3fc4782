"""``HttpServer(sniff_tls=...)``: HTTPS and plain HTTP on one port, told apart by each
connection's first byte; a TLS connection's session relayed both ways at once."""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import os
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from piship_remote._http_server.messages import Upstream
from piship_remote._http_server.server import (
    Head,
    HttpServer,
    Limits,
    Reply,
    Request,
    ResetConnection,
)

pytest.importorskip("cryptography", reason="the test CA")

from tests.support.k8s_tls import Pki

pytestmark = pytest.mark.timeout(60)

TIMEOUT = 10.0
PREFIX = "piship-test-sniff-"
DUPLEX_BYTES = 8 * 1024 * 1024


def ok(_: Request) -> Reply:
    return Reply(200, b"ok", "text/plain")


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki.create(tmp_path)


@pytest.fixture
def server(pki: Pki) -> Iterator[HttpServer]:
    with HttpServer(
        ok, sniff_tls=pki.server_context(), tunnel=echo_tunnel, thread_prefix=PREFIX
    ) as running:
        yield running


def echo_tunnel(head: Head) -> Upstream | None:
    """``/echo`` is handed to an upstream that sends back every byte it gets."""
    if head.path != "/echo":
        return None
    ours, theirs = socket.socketpair()
    threading.Thread(target=_echo, args=(theirs,), name=f"{PREFIX}echo", daemon=True).start()
    return Upstream(ours, lambda fields: fields)


def _echo(upstream: socket.socket) -> None:
    with upstream:
        head = b""
        while b"\r\n\r\n" not in head:
            head += upstream.recv(4096)
        upstream.sendall(
            b"HTTP/1.1 101 Switching Protocols\r\n\r\n" + head.partition(b"\r\n\r\n")[2]
        )
        while piece := upstream.recv(65536):
            upstream.sendall(piece)


def client_context(pki: Pki) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(pki.ca))


def tls_connection(server: HttpServer, pki: Pki) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT)
    return client_context(pki).wrap_socket(raw, server_hostname="localhost")


def test_one_port_answers_https_and_plain_http(server: HttpServer, pki: Pki) -> None:
    secure = http.client.HTTPSConnection(
        "localhost", server.port, context=client_context(pki), timeout=TIMEOUT
    )
    plain = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT)
    answers = []
    for connection in (secure, plain, secure):
        connection.request("GET", "/")
        response = connection.getresponse()
        answers.append((response.status, response.read()))
    secure.close()
    plain.close()
    assert answers == [(200, b"ok")] * 3


def test_a_failed_handshake_closes_only_that_connection(server: HttpServer, pki: Pki) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as broken:
        broken.sendall(b"\x16\x03\x01\x00\x05hello")  # a handshake record that is not one
        assert broken.recv(4096)[:1] in (b"\x15", b"")  # an alert, or the connection ends
    with tls_connection(server, pki) as tls:
        tls.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        assert tls.recv(4096).startswith(b"HTTP/1.1 200")


def test_a_handshake_that_stalls_is_closed_at_the_head_deadline(pki: Pki) -> None:
    limits = Limits(head_seconds=0.3, idle_timeout=TIMEOUT)
    with (
        HttpServer(ok, sniff_tls=pki.server_context(), limits=limits) as server,
        socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as stalled,
    ):
        stalled.sendall(b"\x16")  # a TLS record begins, and nothing more comes
        assert stalled.recv(4096) == b""  # closed by the server, long before TIMEOUT


def test_a_tunnelled_tls_connection_carries_bytes_both_ways_at_once(
    server: HttpServer, pki: Pki
) -> None:
    sent = os.urandom(DUPLEX_BYTES)
    received = asyncio.run(asyncio.wait_for(echoed(server, pki, sent), TIMEOUT))
    assert hashlib.sha256(received).digest() == hashlib.sha256(sent).digest()


async def echoed(server: HttpServer, pki: Pki, data: bytes) -> bytes:
    """What ``/echo`` sends back of ``data``, written while the echo is read (an asyncio
    client: one TLS connection used by two threads at once is not safe in Python)."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", server.port, ssl=client_context(pki), server_hostname="localhost"
    )
    writer.write(b"GET /echo HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert (await reader.readline()).startswith(b"HTTP/1.1 101")
    assert await reader.readline() == b"\r\n"

    async def send() -> None:
        for start in range(0, len(data), 65536):
            writer.write(data[start : start + 65536])
            await writer.drain()

    sending = asyncio.create_task(send())
    received = await reader.readexactly(len(data))
    await sending
    writer.close()
    return received


def test_relay_threads_are_named_daemons_gone_after_close(pki: Pki) -> None:
    server = HttpServer(ok, sniff_tls=pki.server_context(), thread_prefix=PREFIX)
    server.start()
    tls = tls_connection(server, pki)
    tls.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert tls.recv(4096).startswith(b"HTTP/1.1 200")  # the connection stays open
    relays = [t for t in threading.enumerate() if t.name.startswith(f"{PREFIX}tls-")]
    server.close()
    tls.close()
    assert sorted(t.name.rsplit("-", 1)[1] for t in relays) == ["in", "out"]
    assert all(t.daemon for t in relays)
    assert [t.name for t in relays if t.is_alive()] == []


def test_a_stream_reset_reaches_a_tls_client_as_a_tcp_reset(pki: Pki) -> None:
    first_chunk_read = threading.Event()

    def chunks() -> Iterator[bytes]:
        yield b"one"
        first_chunk_read.wait(TIMEOUT)
        raise ResetConnection

    with (
        HttpServer(
            lambda _: Reply(200, stream=chunks()),
            sniff_tls=pki.server_context(),
            thread_prefix=PREFIX,
        ) as server,
        tls_connection(server, pki) as sock,
    ):
        sock.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        received = b""
        while not received.endswith(b"3\r\none\r\n"):
            piece = sock.recv(65536)
            assert piece, "the connection ended before the first chunk"
            received += piece
        first_chunk_read.set()
        # Read the TCP socket beneath TLS: Python's ssl reports a reset as a ragged EOF.
        with pytest.raises(ConnectionResetError):
            while socket.socket.recv(sock, 65536):
                pass
