"""The benchmarks' delay proxy: bytes intact both ways, the delay applied per direction as a
delay line (not stop-and-wait), half-closes passed on, and nothing left running after close."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from benchmarks.proxy import DelayProxy, ProxyProcess

Handler = Callable[[socket.socket], None]


class Upstream:
    """A loopback TCP server running ``handler`` on each connection, on its own thread."""

    def __init__(self, handler: Handler) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address: tuple[str, int] = self.listener.getsockname()
        self.handler = handler
        self.thread = threading.Thread(target=self._serve, name="test-upstream", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            with sock:
                self.handler(sock)

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.thread.join(5)


def _echo(sock: socket.socket) -> None:
    while data := sock.recv(65536):
        sock.sendall(data)


def _count_then_reply(sock: socket.socket) -> None:
    """Read to the client's end of stream, then answer with the byte count and close."""
    total = 0
    while data := sock.recv(65536):
        total += len(data)
    sock.sendall(f"got {total}".encode())


def _burst(sock: socket.socket) -> None:
    """Fifty small writes, 2 ms apart."""
    for index in range(50):
        sock.sendall(b"%02d" % index)
        time.sleep(0.002)


@pytest.fixture
def upstream(request: pytest.FixtureRequest) -> Iterator[Upstream]:
    server = Upstream(request.param)
    yield server
    server.close()


def _read_all(sock: socket.socket) -> bytes:
    parts: list[bytes] = []
    while data := sock.recv(65536):
        parts.append(data)
    return b"".join(parts)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("upstream", [_echo], indirect=True)
def test_bytes_pass_intact_both_ways(upstream: Upstream) -> None:
    payload = os.urandom(4 * 1024 * 1024)
    with (
        DelayProxy(upstream.address, delay=0.002) as proxy,
        socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock,
    ):
        writer = threading.Thread(target=lambda: (sock.sendall(payload), sock.shutdown(1)))
        writer.start()
        echoed = _read_all(sock)
        writer.join(10)
    assert echoed == payload


def _ping(sock: socket.socket) -> float:
    start = time.monotonic()
    sock.sendall(b"ping")
    assert sock.recv(16) == b"ping"
    return time.monotonic() - start


@pytest.mark.timeout(20)
@pytest.mark.parametrize("upstream", [_echo], indirect=True)
def test_a_round_trip_takes_twice_the_delay(upstream: Upstream) -> None:
    with (
        DelayProxy(upstream.address, delay=0.025) as proxy,
        socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock,
    ):
        _ping(sock)
        elapsed = _ping(sock)
    assert 0.050 <= elapsed < 0.5


@pytest.mark.timeout(20)
@pytest.mark.parametrize("upstream", [_echo], indirect=True)
def test_a_new_connection_pays_one_more_round_trip_for_its_handshake(upstream: Upstream) -> None:
    with DelayProxy(upstream.address, delay=0.025) as proxy:
        start = time.monotonic()
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
            _ping(sock)
        elapsed = time.monotonic() - start
    assert 0.100 <= elapsed < 0.6


@pytest.mark.timeout(20)
@pytest.mark.parametrize("upstream", [_burst], indirect=True)
def test_chunks_in_flight_overlap_instead_of_waiting_for_each_other(upstream: Upstream) -> None:
    with (
        DelayProxy(upstream.address, delay=0.05) as proxy,
        socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock,
    ):
        start = time.monotonic()
        received = _read_all(sock)
        elapsed = time.monotonic() - start
    assert received == b"".join(b"%02d" % index for index in range(50))
    # a delay line: one delay plus the 100 ms the writes take; stop-and-wait would be >= 2.5 s
    assert 0.05 <= elapsed < 1.0


@pytest.mark.timeout(20)
@pytest.mark.parametrize("upstream", [_count_then_reply], indirect=True)
def test_a_half_close_reaches_upstream_and_its_answer_still_comes_back(
    upstream: Upstream,
) -> None:
    with (
        DelayProxy(upstream.address, delay=0.005) as proxy,
        socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock,
    ):
        sock.sendall(b"x" * 100_000)
        sock.shutdown(socket.SHUT_WR)
        assert _read_all(sock) == b"got 100000"


def _reset(sock: socket.socket) -> None:
    """Read one chunk, then close with a reset (SO_LINGER 0) instead of a clean end."""
    sock.recv(16)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


@pytest.mark.timeout(20)
@pytest.mark.parametrize("upstream", [_reset], indirect=True)
def test_a_reset_upstream_ends_the_client_side_too(upstream: Upstream) -> None:
    with (
        DelayProxy(upstream.address, delay=0.005) as proxy,
        socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock,
    ):
        sock.sendall(b"hello")
        try:
            ended = sock.recv(16)
        except ConnectionResetError:
            ended = b""
        assert ended == b""


def _proxy_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("piship-bench-proxy")]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("upstream", [_echo], indirect=True)
def test_close_ends_open_connections_and_every_thread(upstream: Upstream) -> None:
    proxy = DelayProxy(upstream.address, delay=0.005)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(b"hello")
        assert sock.recv(16) == b"hello"
        proxy.close()
        assert sock.recv(16) == b""  # the idle connection was ended
    assert _proxy_threads() == []
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=2).close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("upstream", [_echo], indirect=True)
def test_the_child_process_proxies_and_stops_when_its_parent_lets_go(
    upstream: Upstream,
) -> None:
    host, port = upstream.address
    process = ProxyProcess(f"http://{host}:{port}", delay_ms=5)
    port_of_proxy = int(process.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port_of_proxy), timeout=10) as sock:
        sock.sendall(b"ping")
        assert sock.recv(16) == b"ping"
    process.close()
    assert process.returncode == 0
