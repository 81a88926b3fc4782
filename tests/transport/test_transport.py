"""The HTTP transport: endpoint rules, errors, cancellation, deadlines, bodies, 401s, pooling."""

from __future__ import annotations

import http.server
import json
import logging
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import urllib3.exceptions
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from piship_remote.model.errors import CommandCancelled, PiShipError
from piship_remote.model.redact import Redactor
from piship_remote.transport import (
    Transport,
    TransportError,
    _Dechunker,
    window_text,
)
from piship_remote.transport._cancel import CancelToken
from tests.support.loopback_http import LoopbackHttp
from tests.support.quick_http import quick_http_server, route

FAST = 0.1  # how soon a cancelled call must return (seconds)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def server() -> Iterator[HTTPServer]:
    with quick_http_server() as srv:
        yield srv


@pytest.fixture
def gate(server: HTTPServer) -> Iterator[threading.Event]:
    """An event handlers wait on; set at teardown (before the server stops)."""
    event = threading.Event()
    try:
        yield event
    finally:
        event.set()


@pytest.fixture
def redactor() -> Redactor:
    return Redactor()


@pytest.fixture
def transport(redactor: Redactor) -> Iterator[Transport]:
    instance = Transport(redactor=redactor)
    try:
        yield instance
    finally:
        instance.close()


def drop(request: Request) -> None:
    """Close the client's connection without answering (the client sees FIN)."""
    try:
        request.environ["werkzeug.socket"].shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def hang_before_headers(server: HTTPServer, gate: threading.Event) -> tuple[str, threading.Event]:
    """A route that waits on ``gate`` before answering; the event tells it has arrived."""
    arrived = threading.Event()

    def handler(request: Request) -> Response:
        arrived.set()
        gate.wait()
        return Response("late")

    return route(server, "/hang", handler), arrived


def hang_mid_stream(server: HTTPServer, gate: threading.Event, *, chunked: bool = True) -> str:
    """A route that sends ``first`` at once, then waits on ``gate`` before the rest."""

    def handler(request: Request) -> Response:
        def body() -> Iterator[bytes]:
            yield b"first"
            gate.wait()
            yield b"rest"

        headers = {} if chunked else {"Content-Length": "9"}
        return Response(body(), headers=headers)

    return route(server, "/stream", handler)


def set_later(event: threading.Event, delay: float) -> list[float]:
    """Set ``event`` from another thread after ``delay``; returns [time it was set]."""
    when: list[float] = []

    def fire() -> None:
        when.append(time.monotonic())
        event.set()

    timer = threading.Timer(delay, fire)
    timer.daemon = True
    timer.start()
    return when


def set_when(trigger: threading.Event, event: threading.Event) -> list[float]:
    """Set ``event`` from another thread as soon as ``trigger`` is set."""
    when: list[float] = []

    def fire() -> None:
        trigger.wait(10)
        when.append(time.monotonic())
        event.set()

    threading.Thread(target=fire, daemon=True).start()
    return when


def free_port() -> int:
    """A loopback port nobody listens on (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture
def unanswered_connect() -> Iterator[str]:
    """A loopback address whose connects hang: the listener's accept queue is full."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        try:
            filler.connect(listener.getsockname())
        except BlockingIOError:
            pass
        fillers.append(filler)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/x"
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


@pytest.fixture
def silent_tls() -> Iterator[str]:
    """An HTTPS address that accepts TCP connections but never answers the TLS hello."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    try:
        yield f"https://127.0.0.1:{listener.getsockname()[1]}/x"
    finally:
        listener.close()


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1 (made with openssl)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    d = tmp_path_factory.mktemp("tls")
    ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
    (d / "leaf.ext").write_text(
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
    )
    commands = [
        f"req -x509 {ec} -keyout ca.key -out ca.pem -days 2 -subj /CN=piship-test-CA"
        " -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign",
        f"req {ec} -keyout leaf.key -out leaf.csr -subj /CN=127.0.0.1",
        "x509 -req -in leaf.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out leaf.pem"
        " -days 2 -extfile leaf.ext",
    ]
    for command in commands:
        subprocess.run(["openssl", *command.split()], cwd=d, check=True, capture_output=True)
    return {"ca": d / "ca.pem", "cert": d / "leaf.pem", "key": d / "leaf.key"}


@pytest.fixture
def tls_server(tls_files: dict[str, Path]) -> Iterator[HTTPServer]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls_files["cert"], tls_files["key"])
    with quick_http_server(context) as srv:
        yield srv


class KeepAliveServer:
    """A stdlib HTTP/1.1 server that keeps connections open (werkzeug always closes them).

    Records the client port of every request; ``routes`` maps a path to a handler.
    """

    def __init__(self) -> None:
        self.ports: list[int] = []
        self.routes: dict[str, Callable[[http.server.BaseHTTPRequestHandler], None]] = {}
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                owner.ports.append(self.client_address[1])
                answer = owner.routes.get(self.path)
                if answer is not None:
                    answer(self)
                    return
                body = b'{"ok":true}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._http = LoopbackHttp(Handler)
        self.url = self._http.url

    def close(self) -> None:
        self._http.close()


@pytest.fixture
def keepalive() -> Iterator[KeepAliveServer]:
    srv = KeepAliveServer()
    try:
        yield srv
    finally:
        srv.close()


# --------------------------------------------------------------------------- endpoint rules


def test_endpoint_strips_trailing_slashes(transport: Transport) -> None:
    assert transport.endpoint("https://api.example.com/v1/") == "https://api.example.com/v1"


@pytest.mark.parametrize(
    "url", ["https://user:pw@api.example.com", "https://token@api.example.com/x"]
)
def test_endpoint_with_credentials_is_config_invalid(transport: Transport, url: str) -> None:
    with pytest.raises(PiShipError) as caught:
        transport.endpoint(url)
    assert caught.value.code == "CONFIG_INVALID"
    assert str(caught.value) == "Endpoint URLs must not embed credentials"


def test_plain_http_to_remote_host_is_network_denied(transport: Transport) -> None:
    with pytest.raises(PiShipError) as caught:
        transport.endpoint("http://example.com")
    assert caught.value.code == "NETWORK_DENIED"
    assert str(caught.value) == (
        "Refusing non-HTTPS endpoint http://example.com; "
        "plain HTTP is only allowed for loopback test fixtures"
    )


@pytest.mark.parametrize("url", ["ftp://example.com/x", "ws://127.0.0.1:80", "file:///etc"])
def test_other_schemes_are_network_denied(transport: Transport, url: str) -> None:
    with pytest.raises(PiShipError) as caught:
        transport.endpoint(url)
    assert caught.value.code == "NETWORK_DENIED"


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080",
        "http://127.9.8.7",
        "http://localhost:3000",
        "http://LOCALHOST",
        "http://[::1]:49983",
        "https://api.example.com",
    ],
)
def test_loopback_http_and_any_https_are_accepted(transport: Transport, url: str) -> None:
    assert transport.endpoint(url) == url


def test_request_applies_the_endpoint_rules(transport: Transport) -> None:
    with pytest.raises(PiShipError) as caught:
        transport.request("GET", "http://example.com/health")
    assert caught.value.code == "NETWORK_DENIED"


# --------------------------------------------------------------------------- plain requests


def test_request_returns_status_headers_and_json(transport: Transport, server: HTTPServer) -> None:
    server.expect_request("/info").respond_with_json({"id": "sbx1"}, status=201)
    response = transport.request("GET", server.url_for("/info"))
    assert response.status == 201
    assert response.headers["CONTENT-TYPE"] == "application/json"
    assert response.json_object() == {"id": "sbx1"}


def test_json_body_is_sent_compact_with_a_content_type(
    transport: Transport, server: HTTPServer
) -> None:
    server.expect_request("/create", method="POST").respond_with_data("{}")
    transport.request("POST", server.url_for("/create"), json={"a": [1, 2], "b": "é"}).close()
    request, _ = server.log[0]
    assert request.get_data() == '{"a":[1,2],"b":"é"}'.encode()
    assert request.headers["content-type"] == "application/json"


def test_redirects_are_not_followed(transport: Transport, server: HTTPServer) -> None:
    server.expect_request("/from").respond_with_data(
        "", status=302, headers={"Location": server.url_for("/to")}
    )
    response = transport.request("GET", server.url_for("/from"))
    assert response.status == 302
    response.close()
    assert [request.path for request, _ in server.log] == ["/from"]


# --------------------------------------------------------------------------- transport failures


def test_refused_connection_is_gateway_unreachable_and_not_sent(transport: Transport) -> None:
    port = free_port()
    with pytest.raises(TransportError) as caught:
        transport.request("POST", f"http://127.0.0.1:{port}/sandboxes", json={})
    error = caught.value
    assert error.code == "GATEWAY_UNREACHABLE"
    assert error.retryable is True
    assert error.request_sent is False
    assert str(error) == f"sandbox request to 127.0.0.1:{port} failed: ECONNREFUSED"


def test_message_names_the_component(redactor: Redactor) -> None:
    port = free_port()
    kubernetes = Transport(redactor=redactor, component="kubernetes")
    try:
        with pytest.raises(TransportError) as caught:
            kubernetes.request("GET", f"http://127.0.0.1:{port}/apis")
    finally:
        kubernetes.close()
    assert str(caught.value).startswith(f"kubernetes request to 127.0.0.1:{port} failed")
    assert caught.value.component == "kubernetes"


def test_dropped_connection_after_the_request_counts_as_sent(
    transport: Transport, server: HTTPServer
) -> None:
    def handler(request: Request) -> Response:
        drop(request)
        return Response(b"")

    url = route(server, "/drop", handler)
    with pytest.raises(TransportError) as caught:
        transport.request("POST", url, json={"cmd": "x"})
    error = caught.value
    assert error.request_sent is True
    host = url.split("/")[2]
    assert str(error) in (
        f"sandbox request to {host} failed: network error",
        f"sandbox request to {host} failed: ECONNRESET",
    )


def test_drop_mid_stream_raises_transport_error(transport: Transport, server: HTTPServer) -> None:
    def handler(request: Request) -> Response:
        def body() -> Iterator[bytes]:
            yield b"partial"
            drop(request)

        return Response(body())

    response = transport.request("GET", route(server, "/s", handler), stream=True)
    chunks = []
    with pytest.raises(TransportError) as caught:
        for chunk in response.iter_raw():
            chunks.append(chunk)
    assert b"".join(chunks) == b"partial"
    assert caught.value.request_sent is True


# --------------------------------------------------------------------------- cancellation


@pytest.mark.parametrize("make_cancel", [threading.Event, CancelToken])
def test_cancel_set_before_the_call_sends_nothing(
    transport: Transport, server: HTTPServer, make_cancel: Callable[[], threading.Event]
) -> None:
    server.expect_request("/x").respond_with_data("ok")
    cancel = make_cancel()
    cancel.set()
    with pytest.raises(CommandCancelled):
        transport.request("POST", server.url_for("/x"), cancel=cancel)
    assert server.log == []


@pytest.mark.timeout(10)
@pytest.mark.parametrize("make_cancel", [threading.Event, CancelToken])
def test_cancel_while_waiting_for_headers_unblocks_at_once(
    transport: Transport,
    server: HTTPServer,
    gate: threading.Event,
    make_cancel: Callable[[], threading.Event],
) -> None:
    url, arrived = hang_before_headers(server, gate)
    cancel = make_cancel()
    when = set_when(arrived, cancel)
    with pytest.raises(CommandCancelled):
        transport.request("POST", url, timeout=None, cancel=cancel)
    assert time.monotonic() - when[0] < FAST


@pytest.mark.timeout(10)
@pytest.mark.parametrize("chunked", [True, False])
def test_cancel_mid_stream_unblocks_the_reader(
    transport: Transport, server: HTTPServer, gate: threading.Event, chunked: bool
) -> None:
    cancel = CancelToken()
    response = transport.request(
        "GET", hang_mid_stream(server, gate, chunked=chunked), stream=True, cancel=cancel
    )
    chunks = response.iter_raw()
    assert next(chunks) == b"first"
    when = set_later(cancel, 0.05)
    with pytest.raises(CommandCancelled):
        next(chunks)
    assert time.monotonic() - when[0] < FAST


@pytest.mark.timeout(10)
def test_cancel_interrupts_a_connect_in_progress(
    transport: Transport, unanswered_connect: str
) -> None:
    cancel = threading.Event()
    when = set_later(cancel, 0.05)
    with pytest.raises(CommandCancelled):
        transport.request("GET", unanswered_connect, timeout=None, cancel=cancel)
    assert time.monotonic() - when[0] < FAST


@pytest.mark.timeout(10)
def test_cancel_interrupts_a_tls_handshake(transport: Transport, silent_tls: str) -> None:
    cancel = CancelToken()
    when = set_later(cancel, 0.1)
    with pytest.raises(CommandCancelled):
        transport.request("GET", silent_tls, timeout=None, cancel=cancel)
    assert time.monotonic() - when[0] < FAST


@pytest.mark.timeout(20)
def test_cancelling_one_call_leaves_parallel_calls_alone(
    transport: Transport, server: HTTPServer, gate: threading.Event
) -> None:
    parallel = 20
    arrived = threading.Semaphore(0)

    def slow(request: Request) -> Response:
        arrived.release()
        gate.wait()
        return Response(json.dumps({"n": request.args["n"]}), content_type="application/json")

    slow_url = route(server, "/slow", slow)
    hang_url, hang_arrived = hang_before_headers(server, threading.Event())
    results: dict[int, Any] = {}

    def call(n: int) -> None:
        try:
            results[n] = transport.request("GET", f"{slow_url}?n={n}", timeout=10).json_object()
        except BaseException as e:  # recorded for the assertion below
            results[n] = e

    workers = [threading.Thread(target=call, args=(n,), daemon=True) for n in range(parallel)]
    for worker in workers:
        worker.start()
    for _ in range(parallel):
        assert arrived.acquire(timeout=10)

    cancel = CancelToken()
    when = set_when(hang_arrived, cancel)
    with pytest.raises(CommandCancelled):
        transport.request("GET", hang_url, timeout=None, cancel=cancel)
    assert time.monotonic() - when[0] < FAST

    gate.set()
    for worker in workers:
        worker.join(10)
    assert results == {n: {"n": str(n)} for n in range(parallel)}


@pytest.mark.timeout(10)
def test_a_cancelled_connection_is_not_reused(
    transport: Transport, keepalive: KeepAliveServer
) -> None:
    release = threading.Event()

    def stream(handler: http.server.BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        handler.wfile.write(b"5\r\nfirst\r\n")
        handler.wfile.flush()
        release.wait(10)

    keepalive.routes["/stream"] = stream
    try:
        cancel = CancelToken()
        response = transport.request("GET", f"{keepalive.url}/stream", stream=True, cancel=cancel)
        chunks = response.iter_raw()
        assert next(chunks) == b"first"
        cancel.set()
        with pytest.raises(CommandCancelled):
            next(chunks)
        assert transport.request("GET", f"{keepalive.url}/x").json_object() == {"ok": True}
        assert keepalive.ports[0] != keepalive.ports[1]
    finally:
        release.set()


@pytest.mark.timeout(10)
def test_cancel_mid_stream_over_tls(
    redactor: Redactor, tls_server: HTTPServer, tls_files: dict[str, Path]
) -> None:
    gate = threading.Event()
    session = requests.Session()
    session.verify = str(tls_files["ca"])
    tls = Transport(redactor=redactor, session=session)
    try:
        url = hang_mid_stream(tls_server, gate)
        assert url.startswith("https://")
        cancel = CancelToken()
        chunks = tls.request("GET", url, stream=True, cancel=cancel).iter_raw()
        assert next(chunks) == b"first"
        when = set_later(cancel, 0.05)
        with pytest.raises(CommandCancelled):
            next(chunks)
        assert time.monotonic() - when[0] < FAST
        gate.set()
        assert b"".join(tls.request("GET", url).iter_raw()) == b"firstrest"
    finally:
        gate.set()
        tls.close()
        session.close()


def test_tls_certificates_are_verified(transport: Transport, tls_server: HTTPServer) -> None:
    tls_server.expect_request("/x").respond_with_data("ok")
    with pytest.raises(TransportError) as caught:
        transport.request("GET", tls_server.url_for("/x"))
    host = tls_server.url_for("/x").split("/")[2]
    assert str(caught.value) == f"sandbox request to {host} failed: CERTIFICATE_VERIFY_FAILED"
    assert caught.value.request_sent is False
    assert tls_server.log == []


# --------------------------------------------------------------------------- deadlines


@pytest.mark.timeout(10)
def test_deadline_while_waiting_for_headers(
    transport: Transport, server: HTTPServer, gate: threading.Event
) -> None:
    url, _ = hang_before_headers(server, gate)
    started = time.monotonic()
    with pytest.raises(TransportError) as caught:
        transport.request("GET", url, timeout=0.2)
    assert 0.15 < time.monotonic() - started < 1.0
    host = url.split("/")[2]
    assert str(caught.value) == f"sandbox request to {host} timed out"
    assert caught.value.request_sent is True


@pytest.mark.timeout(10)
def test_deadline_while_connecting_means_not_sent(
    transport: Transport, unanswered_connect: str
) -> None:
    with pytest.raises(TransportError) as caught:
        transport.request("GET", unanswered_connect, timeout=0.2)
    assert str(caught.value).endswith(" timed out")
    assert caught.value.request_sent is False


@pytest.mark.timeout(10)
def test_deadline_covers_the_body_of_a_plain_request(
    transport: Transport, server: HTTPServer, gate: threading.Event
) -> None:
    url = hang_mid_stream(server, gate)
    started = time.monotonic()
    with pytest.raises(TransportError) as caught:
        transport.request("GET", url, timeout=0.2)
    assert time.monotonic() - started < 1.0
    assert str(caught.value).endswith(" timed out")


@pytest.mark.timeout(10)
def test_deadline_holds_against_a_trickling_body(
    transport: Transport, server: HTTPServer, gate: threading.Event
) -> None:
    def trickle(request: Request) -> Response:
        def body() -> Iterator[bytes]:
            for _ in range(30):
                yield b"x"
                gate.wait(0.1)  # a byte every 0.1 s: no single read waits long

        return Response(body())

    started = time.monotonic()
    with pytest.raises(TransportError) as caught:
        transport.request("GET", route(server, "/trickle", trickle), timeout=0.35)
    assert time.monotonic() - started < 1.0
    assert str(caught.value).endswith(" timed out")


@pytest.mark.timeout(10)
def test_deadline_does_not_cover_the_body_of_a_stream(
    transport: Transport, server: HTTPServer, gate: threading.Event
) -> None:
    response = transport.request("GET", hang_mid_stream(server, gate), timeout=0.1, stream=True)
    chunks = response.iter_raw()
    assert next(chunks) == b"first"
    set_later(gate, 0.3)  # well past the deadline
    assert b"".join(chunks) == b"rest"


@pytest.mark.timeout(10)
def test_idle_timeout_ends_a_silent_stream(
    transport: Transport, server: HTTPServer, gate: threading.Event
) -> None:
    response = transport.request(
        "GET", hang_mid_stream(server, gate), timeout=None, stream=True, idle_timeout=0.2
    )
    chunks = response.iter_raw()
    assert next(chunks) == b"first"
    started = time.monotonic()
    with pytest.raises(TransportError) as caught:
        next(chunks)
    assert 0.15 < time.monotonic() - started < 1.0
    assert str(caught.value).endswith(" timed out")
    assert caught.value.request_sent is True


# --------------------------------------------------------------------------- bodies


@pytest.mark.timeout(10)
@pytest.mark.parametrize("chunked", [True, False])
def test_iter_raw_yields_bytes_as_they_arrive(
    transport: Transport, server: HTTPServer, gate: threading.Event, chunked: bool
) -> None:
    response = transport.request("GET", hang_mid_stream(server, gate, chunked=chunked), stream=True)
    chunks = response.iter_raw()
    assert next(chunks) == b"first"  # while the server still holds the rest back
    gate.set()
    assert b"".join(chunks) == b"rest"


def test_iter_raw_delivers_a_large_body_intact(transport: Transport, server: HTTPServer) -> None:
    body = bytes(range(256)) * 16384  # 4 MiB
    server.expect_request("/big").respond_with_data(body)
    response = transport.request("GET", server.url_for("/big"), stream=True)
    chunks = list(response.iter_raw())
    assert b"".join(chunks) == body
    assert max(len(chunk) for chunk in chunks) <= 1024 * 1024


@pytest.mark.parametrize("size", [999, 1000])
def test_json_object_accepts_bodies_up_to_the_limit(
    transport: Transport, server: HTTPServer, size: int
) -> None:
    text = json.dumps({"pad": ""})
    server.expect_request("/j").respond_with_data(json.dumps({"pad": "x" * (size - len(text))}))
    assert transport.request("GET", server.url_for("/j")).json_object(max_bytes=1000)["pad"]


def test_json_object_refuses_a_larger_body(transport: Transport, server: HTTPServer) -> None:
    server.expect_request("/j").respond_with_data(json.dumps({"pad": "x" * 1000}))
    with pytest.raises(ValueError, match=r"^the response is too large$"):
        transport.request("GET", server.url_for("/j")).json_object(max_bytes=1000)


@pytest.mark.timeout(10)
def test_json_object_stops_reading_an_endless_body(
    transport: Transport, server: HTTPServer, gate: threading.Event
) -> None:
    def endless(request: Request) -> Response:
        def body() -> Iterator[bytes]:
            while not gate.is_set():
                yield b" " * 65536

        return Response(body())

    response = transport.request("GET", route(server, "/endless", endless), stream=True)
    with pytest.raises(ValueError, match="too large"):
        response.json_object(max_bytes=100_000)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("not json", "the response is not JSON"),
        ("", "the response is not JSON"),
        ("[1, 2]", "the response is not a JSON object"),
        ("null", "the response is not a JSON object"),
    ],
)
def test_json_object_errors(
    transport: Transport, server: HTTPServer, body: str, message: str
) -> None:
    server.expect_request("/j").respond_with_data(body)
    with pytest.raises(ValueError, match=rf"^{message}$"):
        transport.request("GET", server.url_for("/j")).json_object()


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (503, "", "HTTP 503"),
        (500, "  \n\t ", "HTTP 500"),
        (
            500,
            '  {"code":500,\n\n  "message":"no capacity"}  ',
            'HTTP 500: {"code":500, "message":"no capacity"}',
        ),
        (404, "x" * 1000, "HTTP 404: " + "x" * 300),
    ],
)
def test_failure_describes_status_and_body(
    transport: Transport, server: HTTPServer, status: int, body: str, expected: str
) -> None:
    server.expect_request("/f").respond_with_data(body, status=status)
    assert transport.request("GET", server.url_for("/f")).failure() == expected


def test_failure_redacts_registered_secrets(
    transport: Transport, server: HTTPServer, redactor: Redactor
) -> None:
    redactor.register("fake-key-SENTINEL-0001")
    server.expect_request("/f").respond_with_data(
        '{"code":401,"message":"invalid key fake-key-SENTINEL-0001"}', status=401
    )
    assert transport.request("GET", server.url_for("/f")).failure() == (
        'HTTP 401: {"code":401,"message":"invalid key [REDACTED]"}'
    )


# --------------------------------------------------------------------------- pooling and close


def test_sequential_requests_reuse_one_connection(
    transport: Transport, keepalive: KeepAliveServer
) -> None:
    for _ in range(5):
        assert transport.request("GET", f"{keepalive.url}/x").json_object() == {"ok": True}
    assert len(keepalive.ports) == 5
    assert len(set(keepalive.ports)) == 1


def test_a_fully_read_stream_returns_its_connection(
    transport: Transport, keepalive: KeepAliveServer
) -> None:
    response = transport.request("GET", f"{keepalive.url}/x", stream=True)
    assert b"".join(response.iter_raw()) == b'{"ok":true}'
    transport.request("GET", f"{keepalive.url}/x").close()
    assert len(set(keepalive.ports)) == 1


def test_a_late_cancel_does_not_touch_the_pooled_connection(
    transport: Transport, keepalive: KeepAliveServer
) -> None:
    cancel = CancelToken()
    assert transport.request("GET", f"{keepalive.url}/x", cancel=cancel).json_object()
    cancel.set()
    assert transport.request("GET", f"{keepalive.url}/x").json_object() == {"ok": True}
    assert len(set(keepalive.ports)) == 1


def test_close_leaves_no_library_thread(redactor: Redactor, server: HTTPServer) -> None:
    server.expect_request("/x").respond_with_data("ok")
    before = set(threading.enumerate())
    instance = Transport(redactor=redactor)
    instance.request("GET", server.url_for("/x"), cancel=threading.Event()).close()
    started = [t for t in threading.enumerate() if t not in before]
    assert [t.name for t in started if t.name.startswith("piship-")] == ["piship-cancel-watch"]
    instance.close()
    assert [t.name for t in started if t.is_alive() and t.name.startswith("piship-")] == []


def test_proxies_from_the_environment_are_used(
    transport: Transport, keepalive: KeepAliveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", keepalive.url)
    monkeypatch.setenv("http_proxy", keepalive.url)
    port = free_port()  # nothing listens there: only the proxy can answer
    response = transport.request("GET", f"http://127.0.0.1:{port}/x")
    assert response.json_object() == {"ok": True}
    assert len(keepalive.ports) == 1


def test_a_header_value_with_a_line_break_is_refused_without_echoing_it(
    transport: Transport, server: HTTPServer
) -> None:
    with pytest.raises(PiShipError) as caught:
        transport.request("GET", server.url_for("/x"), headers={"X-API-Key": "leak-me\r\nX: y"})
    assert caught.value.code == "CONFIG_INVALID"
    assert "leak-me" not in str(caught.value)
    assert server.log == []


def test_a_session_without_tls_verification_is_refused(redactor: Redactor) -> None:
    session = requests.Session()
    session.verify = False
    with pytest.raises(PiShipError) as caught:
        Transport(redactor=redactor, session=session)
    assert caught.value.code == "TLS_POLICY_VIOLATION"


def test_each_request_logs_one_redacted_debug_line(
    httpserver: HTTPServer, caplog: pytest.LogCaptureFixture
) -> None:
    redactor = Redactor()
    redactor.register("secret-path-token-0001")
    transport = Transport(redactor=redactor)
    httpserver.expect_request("/sandboxes/secret-path-token-0001").respond_with_data("ok")
    with caplog.at_level(logging.DEBUG, logger="piship_remote"):
        transport.request("GET", httpserver.url_for("/sandboxes/secret-path-token-0001")).close()
    transport.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "piship_remote"]
    assert len(lines) == 1
    assert lines[0].startswith("sandbox GET /sandboxes/[REDACTED] -> 200 in ")


# -- the failure window ----------------------------------------------------------------------


def test_a_body_shorter_than_the_window_is_kept_whole() -> None:
    assert window_text(b"no capacity", 4096) == "no capacity"


def test_a_full_window_drops_the_word_it_cuts() -> None:
    assert window_text(b"invalid key ZQ7XK2", 18) == "invalid key"


def test_a_full_window_ending_in_whitespace_keeps_every_word() -> None:
    assert window_text(b"invalid key ", 12) == "invalid key "


def test_a_full_window_of_one_word_gives_nothing() -> None:
    assert window_text(b"ZQ7XK2M9PL4WRT8B", 16) == ""


def test_a_pooled_connection_is_not_touched_by_the_call_that_released_it(
    transport: Transport, server: HTTPServer
) -> None:
    server.expect_request("/a").respond_with_data("first")
    server.expect_request("/b").respond_with_data("second")
    first = transport.request("GET", server.url_for("/a"), timeout=5)
    body = b"".join(first.iter_raw())
    assert body == b"first"
    second = transport.request("GET", server.url_for("/b"), stream=True, timeout=None)
    assert b"".join(second.iter_raw()) == b"second"
    # Released to the pool, the socket is no longer the first call's to set timeouts on.
    assert first._call.scope.socket is None


# --------------------------------------------------------------------------- chunked streams


def chunked_route(
    chunks: list[bytes], *, gap: threading.Event | None = None
) -> Callable[..., None]:
    """A handler answering with ``chunks`` as HTTP chunks; waits for ``gap`` before the last."""

    def answer(handler: http.server.BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        try:
            for index, chunk in enumerate(chunks):
                if gap is not None and index == len(chunks) - 1:
                    gap.wait(5)
                handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                handler.wfile.flush()
            handler.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            handler.close_connection = True  # the client gave up on the body

    return answer


def test_a_chunked_stream_arrives_whole_and_returns_its_connection(
    transport: Transport, keepalive: KeepAliveServer
) -> None:
    chunks = [bytes([65 + i]) * (1000 * i + 1) for i in range(10)]
    keepalive.routes["/s"] = chunked_route(chunks)
    response = transport.request("GET", f"{keepalive.url}/s", stream=True)
    assert b"".join(bytes(piece) for piece in response.iter_raw()) == b"".join(chunks)
    transport.request("GET", f"{keepalive.url}/x").close()
    assert len(set(keepalive.ports)) == 1


def test_finish_reads_the_terminator_so_the_connection_is_reused(
    transport: Transport, keepalive: KeepAliveServer
) -> None:
    release = threading.Event()
    keepalive.routes["/s"] = chunked_route([b"first", b"last"], gap=release)
    response = transport.request("GET", f"{keepalive.url}/s", stream=True)
    assert bytes(next(iter(response.iter_raw()))) == b"first"
    release.set()
    response.finish()
    transport.request("GET", f"{keepalive.url}/x").close()
    assert len(set(keepalive.ports)) == 1


def test_finish_gives_up_on_a_body_that_does_not_end(
    transport: Transport, keepalive: KeepAliveServer
) -> None:
    never = threading.Event()
    keepalive.routes["/s"] = chunked_route([b"first", b"last"], gap=never)
    response = transport.request("GET", f"{keepalive.url}/s", stream=True)
    assert bytes(next(iter(response.iter_raw()))) == b"first"
    started = time.monotonic()
    response.finish(wait=0.05)
    assert time.monotonic() - started < 1.0
    never.set()
    assert transport.request("GET", f"{keepalive.url}/x").json_object() == {"ok": True}
    assert len(set(keepalive.ports)) == 2


@pytest.mark.parametrize("step", [1, 2, 3, 7, 64])
def test_the_dechunker_decodes_any_split(step: int) -> None:
    wire = b"5;ext=1\r\nhello\r\n1A\r\n" + b"x" * 26 + b"\r\n0\r\nTrailer: v\r\n\r\n"
    body = _Dechunker(None, None)  # type: ignore[arg-type]
    pieces = [bytes(p) for i in range(0, len(wire), step) for p in body.feed(wire[i : i + step])]
    assert b"".join(pieces) == b"hello" + b"x" * 26
    assert body.done


@pytest.mark.parametrize(
    "wire", [b"zz\r\nhello\r\n", b"5\r\nhelloXX\r\n", b"-1\r\n", b"5\r\nhe" + b"", b"9" * 5000]
)
def test_the_dechunker_refuses_bad_framing_or_an_early_end(wire: bytes) -> None:
    body = _Dechunker(None, None)  # type: ignore[arg-type]
    with pytest.raises(urllib3.exceptions.ProtocolError):
        body.feed(wire)
        body.feed(b"")


# --------------------------------------------------------------------------- what the session adds


@pytest.fixture
def session() -> Iterator[requests.Session]:
    with requests.Session() as instance:
        yield instance


@pytest.fixture
def on_session(redactor: Redactor, session: requests.Session) -> Iterator[Transport]:
    """A transport on the caller's ``session`` (its headers are read for every request)."""
    instance = Transport(redactor=redactor, session=session)
    try:
        yield instance
    finally:
        instance.close()


def test_session_headers_are_sent(
    on_session: Transport, session: requests.Session, server: HTTPServer
) -> None:
    server.expect_request("/x").respond_with_data("ok")
    session.headers["X-Team"] = "blue"
    on_session.request("GET", server.url_for("/x")).close()
    request, _ = server.log[0]
    assert request.headers["X-Team"] == "blue"


def test_a_request_header_replaces_the_session_header_whatever_its_case(
    on_session: Transport, session: requests.Session, server: HTTPServer
) -> None:
    server.expect_request("/x").respond_with_data("ok")
    session.headers["accept-encoding"] = "br"
    on_session.request("GET", server.url_for("/x"), headers={"Accept-Encoding": "identity"}).close()
    request, _ = server.log[0]
    assert request.headers.getlist("Accept-Encoding") == ["identity"]


def test_a_request_header_set_to_none_removes_the_session_header(
    on_session: Transport, session: requests.Session, server: HTTPServer
) -> None:
    server.expect_request("/x").respond_with_data("ok")
    session.headers["X-Team"] = "blue"
    removed: dict[str, Any] = {"x-team": None}
    on_session.request("GET", server.url_for("/x"), headers=removed).close()
    request, _ = server.log[0]
    assert "X-Team" not in request.headers


def test_a_cookie_the_server_set_is_sent_back(transport: Transport, server: HTTPServer) -> None:
    server.expect_request("/login").respond_with_data("ok", headers={"Set-Cookie": "lb=node-3"})
    server.expect_request("/next").respond_with_data("ok")
    transport.request("GET", server.url_for("/login")).close()
    transport.request("GET", server.url_for("/next")).close()
    request, _ = server.log[1]
    assert request.headers["Cookie"] == "lb=node-3"


def test_a_plain_http_proxy_gets_the_whole_url(
    transport: Transport, keepalive: KeepAliveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", keepalive.url)
    monkeypatch.setenv("http_proxy", keepalive.url)
    url = f"http://127.0.0.1:{free_port()}/x?q=1"
    keepalive.routes[url] = chunked_route([b'{"proxied":true}'])
    assert transport.request("GET", url).json_object() == {"proxied": True}


def test_a_pool_the_pool_manager_let_go_of_is_replaced(
    transport: Transport, keepalive: KeepAliveServer
) -> None:
    transport.request("GET", f"{keepalive.url}/x").close()
    transport._adapter.poolmanager.clear()  # as when more than _HOSTS hosts evict it
    assert transport.request("GET", f"{keepalive.url}/x").json_object() == {"ok": True}
    assert len(set(keepalive.ports)) == 2
