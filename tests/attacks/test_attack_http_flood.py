"""Slow clients against the HTTP server under the local service and the doubles: a request
head trickled a byte at a time holds a connection a bounded time, and clients that do so
cannot starve a normal one (today's flood: 64 such connections made everyone get 503)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import attrs
import pytest
import requests

from piship_remote._http_server.server import HttpServer, Limits, Reply, Request
from piship_remote.local.service import DEFAULT_HTTP_LIMITS

TIMEOUT = 10.0
TRICKLE_EVERY = 0.5
ATTACKER = "127.0.0.2"


def ok(_: Request) -> Reply:
    return Reply(200, b"ok", "text/plain")


@pytest.fixture
def server() -> Iterator[HttpServer]:
    with HttpServer(ok, limits=DEFAULT_HTTP_LIMITS) as served:
        yield served


class Trickle:
    """Connections that each send a request header one byte every ``TRICKLE_EVERY`` seconds."""

    def __init__(self, server: HttpServer, count: int, *, source: str = "127.0.0.1") -> None:
        self.sockets = [_connect(server, source) for _ in range(count)]
        self._stop = threading.Event()
        self._rounds = threading.Semaphore(0)
        self._thread = threading.Thread(target=self._send, name="attack-trickle", daemon=True)
        self._thread.start()
        for _ in range(2):  # the server has read every request line and is into the headers
            assert self._rounds.acquire(timeout=TIMEOUT)

    def _send(self) -> None:
        while not self._stop.wait(TRICKLE_EVERY):
            for sock in self.sockets:
                try:
                    sock.send(b"X")
                except OSError:
                    pass  # cut by the server: what a full server may do
            self._rounds.release()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(TIMEOUT)
        for sock in self.sockets:
            sock.close()


def _connect(server: HttpServer, source: str) -> socket.socket:
    sock = socket.create_connection(
        ("127.0.0.1", server.port), timeout=TIMEOUT, source_address=(source, 0)
    )
    sock.sendall(b"GET / HTTP/1.1\r\nX-Slow: ")  # a head begun, its headers never finished
    return sock


def _closed_by_server(sock: socket.socket, wait: float) -> bool:
    sock.settimeout(wait)
    try:
        return sock.recv(1024) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


@pytest.mark.timeout(60)
def test_a_full_service_of_trickled_heads_still_serves_a_normal_client(
    server: HttpServer,
) -> None:
    connections = DEFAULT_HTTP_LIMITS.connections
    assert connections is not None
    trickle = Trickle(server, connections)
    try:
        for _ in range(3):
            response = requests.get(server.url, timeout=TIMEOUT)
            assert response.status_code == 200
    finally:
        trickle.close()


@pytest.mark.timeout(60)
def test_a_full_service_of_one_address_still_serves_another(server: HttpServer) -> None:
    connections = DEFAULT_HTTP_LIMITS.connections
    assert connections is not None
    trickle = Trickle(server, connections, source=ATTACKER)
    try:
        response = requests.get(server.url, timeout=TIMEOUT)
        assert response.status_code == 200
    finally:
        trickle.close()


@pytest.mark.timeout(30)
def test_a_trickled_head_is_cut_at_its_deadline() -> None:
    limits = attrs.evolve(DEFAULT_HTTP_LIMITS, head_seconds=1.0)
    with HttpServer(ok, limits=limits) as served:
        trickle = Trickle(served, 1)
        try:
            started = time.monotonic()
            assert _closed_by_server(trickle.sockets[0], wait=TIMEOUT)
            assert time.monotonic() - started < 1.0 + 2 * TRICKLE_EVERY + 1.0
        finally:
            trickle.close()


@pytest.mark.timeout(30)
def test_an_address_at_its_share_displaces_only_its_own_connections() -> None:
    limits = Limits(connections=4, client_share=2, read_timeout=TIMEOUT)
    with HttpServer(ok, limits=limits) as served:
        kept = [_idle_connection(served) for _ in range(2)]  # a normal client, idle between
        trickle = Trickle(served, 2, source=ATTACKER)  # the service is full now
        newcomer = _connect(served, ATTACKER)
        try:
            assert _closed_by_server(trickle.sockets[0], wait=TIMEOUT)
            assert not any(_closed_by_server(sock, wait=0.3) for sock in kept)
        finally:
            newcomer.close()
            trickle.close()
            for sock in kept:
                sock.close()


def _idle_connection(server: HttpServer) -> socket.socket:
    """A kept-alive connection that made one request and now waits for the next."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT)
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = b""
    while not answer.endswith(b"ok"):
        answer += sock.recv(1024)
    return sock
