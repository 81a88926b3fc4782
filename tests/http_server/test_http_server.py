"""The one HTTP server base under the local service and the doubles: recording, release, limits."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import requests

from piship_remote._http_server import connection
from piship_remote._http_server.server import (
    DropConnection,
    Head,
    HttpServer,
    Limits,
    Reply,
    Request,
    ResetConnection,
)

TIMEOUT = 5.0


def ok(_: Request) -> Reply:
    return Reply(200, b"ok", "text/plain")


@pytest.fixture
def serve() -> Iterator[Callable[..., HttpServer]]:
    servers: list[HttpServer] = []

    def make(router: Callable[[Request], Reply] = ok, **options: object) -> HttpServer:
        server = HttpServer(router, **options)  # type: ignore[arg-type]
        server.start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


def connect(server: HttpServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT)
    return sock


def answer(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_records_requests_in_arrival_order_with_the_query(
    serve: Callable[..., HttpServer],
) -> None:
    server = serve(record=True)
    for path in ("/a?x=1", "/b"):
        requests.post(server.url + path, data=b"body", timeout=TIMEOUT)
    assert [(r.method, r.path, r.body) for r in server.requests] == [
        ("POST", "/a?x=1", b"body"),
        ("POST", "/b", b"body"),
    ]


def test_close_releases_a_held_request_and_cuts_its_connection(
    serve: Callable[..., HttpServer],
) -> None:
    holder: list[HttpServer] = []

    def hold(_: Request) -> Reply:
        holder[0].wait()
        raise DropConnection

    server = serve(hold, record=True)
    holder.append(server)
    failed = threading.Event()

    def call() -> None:
        try:
            requests.get(server.url + "/hang", timeout=TIMEOUT)
        except requests.ConnectionError:
            failed.set()

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    server.wait_for("GET", "/hang")
    started = time.monotonic()
    server.close()
    caller.join(TIMEOUT)
    assert failed.is_set()
    assert time.monotonic() - started < 1.0


def test_the_screen_refuses_on_headers_without_reading_the_body(
    serve: Callable[..., HttpServer],
) -> None:
    screened: list[Head] = []

    def screen(head: Head) -> Reply | None:
        screened.append(head)
        return Reply(401, b"no key")

    server = serve(screen=screen, record=True)
    with connect(server) as sock:
        sock.sendall(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 1000000\r\n\r\npartial")
        reply = answer(sock)
    assert reply.startswith(b"HTTP/1.1 401")
    assert [h.path for h in screened] == ["/x"]
    assert server.requests == []


def test_a_head_over_its_limit_is_431(serve: Callable[..., HttpServer]) -> None:
    server = serve(limits=Limits(header_bytes=1024))
    with connect(server) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 2000 + b"\r\n\r\n")
        assert answer(sock).startswith(b"HTTP/1.1 431")


def test_a_body_over_its_limit_is_413(serve: Callable[..., HttpServer]) -> None:
    server = serve(limits=Limits(body_bytes=10))
    response = requests.post(server.url, data=b"x" * 11, timeout=TIMEOUT)
    assert response.status_code == 413


def test_a_half_sent_body_is_dropped_after_the_read_timeout(
    serve: Callable[..., HttpServer],
) -> None:
    server = serve(limits=Limits(read_timeout=0.3))
    with connect(server) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nContent-Length: 100\r\n\r\nhalf")
        started = time.monotonic()
        assert answer(sock) == b""
    assert time.monotonic() - started < 2.0


def test_a_kept_alive_connection_idle_past_the_read_timeout_still_serves(
    serve: Callable[..., HttpServer],
) -> None:
    server = serve(limits=Limits(read_timeout=0.2, idle_timeout=TIMEOUT))
    client = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT)
    try:
        client.request("GET", "/")
        assert client.getresponse().read() == b"ok"
        first = client.sock
        time.sleep(0.5)  # idle longer than a read may stall
        client.request("GET", "/")  # on the same connection: a closed one would raise
        assert client.getresponse().read() == b"ok"
        assert client.sock is first
    finally:
        client.close()


def test_with_a_long_idle_timeout_a_stalled_head_is_still_dropped_at_the_read_timeout(
    serve: Callable[..., HttpServer],
) -> None:
    server = serve(limits=Limits(read_timeout=0.3, idle_timeout=TIMEOUT))
    with connect(server) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        assert answer(sock) == b""
    assert time.monotonic() - started < 2.0


def test_a_trickled_body_is_dropped_at_its_deadline(serve: Callable[..., HttpServer]) -> None:
    server = serve(limits=Limits(read_timeout=1.0, body_seconds=0.5))
    with connect(server) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nContent-Length: 100\r\n\r\n")
        started = time.monotonic()
        with pytest.raises(OSError):
            while time.monotonic() - started < 3.0:
                sock.sendall(b"x")
                time.sleep(0.1)
    assert time.monotonic() - started < 2.0


def test_a_full_server_closes_its_longest_idle_connection_for_a_new_one(
    serve: Callable[..., HttpServer],
) -> None:
    server = serve(limits=Limits(connections=4))
    idle = [connect(server) for _ in range(4)]
    try:
        response = requests.get(server.url, timeout=TIMEOUT)
        assert response.content == b"ok"
        assert idle[0].recv(1) == b""  # the oldest idle one was closed to make room
    finally:
        for sock in idle:
            sock.close()


def test_a_server_full_of_busy_connections_refuses_a_new_one_at_once(
    serve: Callable[..., HttpServer],
) -> None:
    holder: list[HttpServer] = []

    def hold(_: Request) -> Reply:
        holder[0].wait()
        raise DropConnection

    server = serve(hold, record=True, limits=Limits(connections=1))
    holder.append(server)
    with connect(server) as busy:
        busy.sendall(b"GET / HTTP/1.1\r\n\r\n")
        server.wait_for("GET", "/")  # recorded: it is in the router now
        started = time.monotonic()
        with connect(server) as extra:
            assert answer(extra).startswith(b"HTTP/1.1 503")
        assert time.monotonic() - started < 1.0


def test_a_stream_is_sent_in_chunks_and_a_drop_cuts_it(serve: Callable[..., HttpServer]) -> None:
    def chunks() -> Iterator[bytes]:
        yield b"one"
        raise DropConnection

    server = serve(lambda _: Reply(200, stream=chunks()))
    with connect(server) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
        reply = answer(sock)
    assert b"Transfer-Encoding: chunked" in reply
    assert reply.endswith(b"3\r\none\r\n")  # no terminating 0-chunk: the stream was cut


def test_a_stream_reset_ends_the_connection_with_a_tcp_reset(
    serve: Callable[..., HttpServer],
) -> None:
    first_chunk_read = threading.Event()

    def chunks() -> Iterator[bytes]:
        yield b"one"
        first_chunk_read.wait(TIMEOUT)
        raise ResetConnection

    server = serve(lambda _: Reply(200, stream=chunks()))
    with connect(server) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
        received = b""
        while not received.endswith(b"3\r\none\r\n"):
            piece = sock.recv(65536)
            assert piece, "the connection ended before the first chunk"
            received += piece
        first_chunk_read.set()
        with pytest.raises(ConnectionResetError):
            answer(sock)


def test_threads_are_named_daemons_and_gone_after_close(serve: Callable[..., HttpServer]) -> None:
    server = serve(thread_prefix="piship-test-")
    requests.get(server.url, timeout=TIMEOUT)
    ours = [t for t in threading.enumerate() if t.name.startswith("piship-test-")]
    assert ours and all(t.daemon for t in ours)
    server.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("piship-test-")]


def test_answers_are_sent_without_waiting_for_the_clients_ack(
    serve: Callable[..., HttpServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nagle's algorithm would hold an answer's body until the client acknowledged its
    # head, which a client delays (40 ms on Linux): every connection turns it off.
    set_on: list[int] = []
    real = connection._no_delay

    def recording(sock: socket.socket) -> None:
        real(sock)
        set_on.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    monkeypatch.setattr(connection, "_no_delay", recording)
    server = serve()
    assert requests.get(server.url + "/", timeout=TIMEOUT).status_code == 200
    assert set_on and all(set_on)


def test_the_head_deadline_counts_from_a_requests_first_byte_not_the_idle_wait(
    serve: Callable[..., HttpServer],
) -> None:
    server = serve(limits=Limits(read_timeout=TIMEOUT, idle_timeout=TIMEOUT, head_seconds=0.3))
    client = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT)
    try:
        client.request("GET", "/")
        assert client.getresponse().read() == b"ok"
        first = client.sock
        time.sleep(0.6)  # idle past the head deadline, between two requests
        client.request("GET", "/")
        assert client.getresponse().read() == b"ok"
        assert client.sock is first
    finally:
        client.close()
