"""The private urllib3 / http.client members the transport relies on still exist and behave.

If one of these fails after a urllib3 or Python upgrade, the module
piship_remote/transport/_urllib3_internals.py must be adapted before anything else.
"""

from __future__ import annotations

import http.client
import http.server
import inspect
import io
import socket
import threading
from collections.abc import Iterator

import pytest
import urllib3
import urllib3._collections
import urllib3.connection
import urllib3.connectionpool
import urllib3.exceptions
import urllib3.response
import urllib3.util.retry

from piship_remote.transport._urllib3_internals import (
    RETIRED,
    PlainHeadResponse,
    SingleWriteRequest,
    SocketFactoryHook,
    chunked_source,
    connect_taken,
    http_client_response,
    record_retired,
    return_to_pool,
    send_direct,
    taken_from_pool,
)
from tests.support.loopback_http import LoopbackHttp


def test_urllib3_is_major_version_2() -> None:
    assert urllib3.__version__.split(".")[0] == "2"


def test_connect_creates_its_socket_through_new_conn() -> None:
    assert "self._new_conn()" in inspect.getsource(urllib3.connection.HTTPConnection.connect)


def test_the_socket_factory_hook_is_called_on_connect() -> None:
    opened: list[socket.socket] = []

    class Recording(SocketFactoryHook):
        def open_socket(self) -> socket.socket:
            sock = super().open_socket()
            opened.append(sock)
            return sock

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        conn = Recording("127.0.0.1", listener.getsockname()[1], timeout=5)
        conn.connect()
        try:
            assert opened and conn.sock is opened[0]
        finally:
            conn.close()


def test_pool_containers_take_a_dispose_func_and_a_size() -> None:
    disposed: list[str] = []
    container = urllib3._collections.RecentlyUsedContainer(1, disposed.append)
    assert container.dispose_func is not None
    assert container._maxsize == 1
    container["a"] = "first"
    container["b"] = "second"  # evicts "first"
    assert disposed == ["first"]


def test_a_pool_manager_records_the_pools_it_evicts() -> None:
    manager = urllib3.PoolManager(num_pools=1)
    record_retired(manager, 32)
    first = manager.connection_from_host("127.0.0.1", 1, scheme="http")
    manager.connection_from_host("127.0.0.1", 2, scheme="http")
    assert first in RETIRED
    manager.clear()


@pytest.fixture
def chunked_url() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"5\r\nhello\r\n0\r\n\r\n")

    server = LoopbackHttp(Handler)
    try:
        yield server.url
    finally:
        server.close()


@pytest.mark.timeout(10)
def test_a_response_exposes_its_http_client_response_and_chunk_state(chunked_url: str) -> None:
    with urllib3.PoolManager() as manager:
        raw = manager.request("GET", f"{chunked_url}/", preload_content=False)
        inner = raw._fp
        assert isinstance(inner, http.client.HTTPResponse)
        assert inner.chunked and inner.chunk_left is None
        assert isinstance(inner.fp, io.BufferedReader)
        source = chunked_source(raw)
        assert source is not None and source[0] is inner
        raw.read()
        assert chunked_source(raw) is None
        raw.release_conn()


class _RecordingSocket:
    """What a connection writes, one entry per ``sendall``."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def settimeout(self, timeout: float | None) -> None:
        pass


def _recording_connection() -> tuple[SingleWriteRequest, _RecordingSocket]:
    conn = SingleWriteRequest("127.0.0.1", 8080, timeout=5)
    sock = _RecordingSocket()
    conn.sock = sock  # type: ignore[assignment]
    return conn, sock


def test_a_request_with_a_bytes_body_goes_out_in_one_write() -> None:
    conn, sock = _recording_connection()
    conn.request("POST", "/run", body=b"{}", headers={"Content-Length": "2", "User-Agent": "t"})
    assert sock.writes == [
        b"POST /run HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nAccept-Encoding: identity\r\n"
        b"Content-Length: 2\r\nUser-Agent: t\r\n\r\n{}"
    ]


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_a_bodyless_get_goes_out_in_one_write_as_urllib3_writes_it(method: str) -> None:
    conn, sock = _recording_connection()
    plain = urllib3.connection.HTTPConnection("127.0.0.1", 8080, timeout=5)
    plain_sock = _RecordingSocket()
    plain.sock = plain_sock  # type: ignore[assignment]
    headers = {"User-Agent": "t", "Accept": "*/*"}
    conn.request(method, "/x", headers=headers)
    plain.request(method, "/x", headers=headers)
    assert len(sock.writes) == 1
    assert sock.writes == [b"".join(plain_sock.writes)]


def test_a_chunked_request_goes_through_urllib3s_own_writes() -> None:
    conn, sock = _recording_connection()
    conn.request("POST", "/run", body=[b"ab"], headers={"User-Agent": "t"}, chunked=True)
    assert sock.writes[1:] == [b"2\r\nab\r\n", b"0\r\n\r\n"]
    assert b"Transfer-Encoding: chunked" in sock.writes[0]


def test_a_header_with_a_line_break_is_refused_as_urllib3_refuses_it() -> None:
    conn, sock = _recording_connection()
    with pytest.raises(ValueError):
        conn.request("POST", "/run", body=b"", headers={"Content-Length": "0", "X": "a\r\nB: c"})
    assert sock.writes == []


def test_a_pool_lends_and_takes_back_connections_outside_urlopen() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(2)
        pool = urllib3.HTTPConnectionPool("127.0.0.1", listener.getsockname()[1], maxsize=2)
        try:
            conn = taken_from_pool(pool)
            assert conn.sock is None
            connect_taken(pool, conn, 5)
            assert conn.sock is not None
            return_to_pool(pool, conn)
            assert pool._get_conn(timeout=0) is conn
        finally:
            pool.close()


def test_urlopen_reaches_the_connection_through_make_request_and_validate_conn() -> None:
    source = inspect.getsource(urllib3.connectionpool.HTTPConnectionPool._make_request)
    assert "self._validate_conn(conn)" in source
    assert "response._connection = response_conn" in source
    assert "response._pool = self" in source


def test_a_released_response_puts_its_connection_back_through_pool_and_connection() -> None:
    source = inspect.getsource(urllib3.response.HTTPResponse.release_conn)
    assert "self._pool._put_conn(self._connection)" in source


def test_urllib3s_getresponse_forgets_the_options_and_sets_the_timeout_before_http_client() -> None:
    source = inspect.getsource(urllib3.connection.HTTPConnection.getresponse)
    forget = source.index("self._response_options = None")
    timeout = source.index("self.sock.settimeout(self.timeout)")
    assert forget < source.index("super().getresponse()") and timeout < source.index(
        "super().getresponse()"
    )


@pytest.mark.timeout(10)
def test_http_client_response_answers_and_the_connection_sends_again(
    answering_pool: urllib3.HTTPConnectionPool,
) -> None:
    conn = answering_pool._get_conn()
    try:
        for body in (b"one", b"two"):
            conn.request("POST", "/", body=body, headers={"Content-Length": str(len(body))})
            response = http_client_response(conn)
            assert isinstance(response, http.client.HTTPResponse)
            assert response.status == 200 and response.read() == body
            assert conn._response_options is None
    finally:
        conn.close()


@pytest.fixture
def answering_pool() -> Iterator[urllib3.HTTPConnectionPool]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = LoopbackHttp(Handler)
    port = int(server.url.rsplit(":", 1)[1])
    pool = urllib3.HTTPConnectionPool("127.0.0.1", port, maxsize=2)
    try:
        yield pool
    finally:
        pool.close()
        server.close()


_NO_RETRIES = urllib3.util.retry.Retry(0, read=False)


@pytest.mark.timeout(10)
def test_a_direct_request_answers_and_its_connection_goes_back_to_the_pool(
    answering_pool: urllib3.HTTPConnectionPool,
) -> None:
    headers = {"Content-Length": "2", "User-Agent": "t"}
    response = send_direct(
        answering_pool, "POST", "/", b"hi", headers, timeout=5, chunked=False, retries=_NO_RETRIES
    )
    assert response.status == 200 and response.read() == b"hi"
    assert response.retries is _NO_RETRIES
    response.release_conn()
    assert answering_pool.pool is not None and answering_pool.pool.qsize() == 2
    assert answering_pool._get_conn(timeout=0).sock is not None  # kept alive, reusable


@pytest.mark.timeout(10)
def test_a_direct_request_that_fails_closes_its_connection_and_raises_as_urlopen() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        pool = urllib3.HTTPConnectionPool("127.0.0.1", listener.getsockname()[1], maxsize=1)
        closer = threading.Thread(target=lambda: listener.accept()[0].close(), daemon=True)
        closer.start()
        try:
            headers = {"Content-Length": "0", "User-Agent": "t"}
            with pytest.raises(urllib3.exceptions.MaxRetryError) as raised:
                send_direct(
                    pool, "POST", "/", b"", headers, timeout=5, chunked=False, retries=_NO_RETRIES
                )
            assert isinstance(raised.value.reason, urllib3.exceptions.ProtocolError)
            assert pool.pool is not None and pool.pool.qsize() == 1  # its slot is back, empty
            assert pool._get_conn(timeout=0).sock is None
        finally:
            closer.join(5)
            pool.close()


class _FixedSocket:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(io.BytesIO(self.data))


_CHUNKED_ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5\r\nhello\r\n0\r\n\r\n"
)


def test_http_client_begin_sets_what_the_plain_head_response_sets() -> None:
    stdlib = http.client.HTTPResponse(_FixedSocket(_CHUNKED_ANSWER), method="GET")  # type: ignore[arg-type]
    stdlib.begin()
    ours = PlainHeadResponse(_FixedSocket(_CHUNKED_ANSWER), method="GET")
    ours.begin()
    fields = (
        "code",
        "status",
        "reason",
        "version",
        "chunked",
        "chunk_left",
        "length",
        "will_close",
    )
    assert {f: getattr(ours, f) for f in fields} == {f: getattr(stdlib, f) for f in fields}
    assert ours.read() == stdlib.read() == b"hello"
