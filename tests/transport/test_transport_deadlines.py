"""Total deadlines: a server dripping bytes cannot stretch a request past its timeout."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from piship_remote.model.errors import GATEWAY_UNREACHABLE
from piship_remote.model.redact import Redactor
from piship_remote.transport import Transport, TransportError
from tests.support.drip_server import DripServer

TIMEOUT = 1.0
SLACK = 1.0  # a request must fail within its timeout plus this
HEAD = b"HTTP/1.1 200 OK\r\n"


@pytest.fixture
def transport() -> Iterator[Transport]:
    instance = Transport(redactor=Redactor())
    try:
        yield instance
    finally:
        instance.close()


@pytest.fixture
def drip() -> Iterator[Callable[..., DripServer]]:
    servers: list[DripServer] = []

    def start(prefix: bytes, drip: bytes) -> DripServer:
        server = DripServer(prefix=prefix, drip=drip)
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.close()


def assert_timed_out(error: TransportError, server: DripServer, started: float) -> None:
    assert time.monotonic() - started < TIMEOUT + SLACK
    assert error.code == GATEWAY_UNREACHABLE and error.retryable
    assert error.request_sent is True
    assert str(error) == f"sandbox request to {server.url.split('/')[2]} timed out"


@pytest.mark.timeout(10)
def test_dripped_headers_fail_a_request_on_time(
    transport: Transport, drip: Callable[..., DripServer]
) -> None:
    server = drip(HEAD, b"X-Slow: 1\r\n" * 100)
    started = time.monotonic()
    with pytest.raises(TransportError) as caught:
        transport.request("GET", f"{server.url}/health", timeout=TIMEOUT)
    assert_timed_out(caught.value, server, started)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "framing",
    [b"Content-Length: 2000\r\n\r\n", b"Transfer-Encoding: chunked\r\n\r\n7d0\r\n"],
    ids=["content-length", "chunked"],
)
def test_a_dripped_body_fails_a_request_on_time(
    transport: Transport, drip: Callable[..., DripServer], framing: bytes
) -> None:
    server = drip(HEAD + framing, b"x" * 2000)
    started = time.monotonic()
    with pytest.raises(TransportError) as caught:
        transport.request("GET", f"{server.url}/sandboxes", timeout=TIMEOUT)
    assert_timed_out(caught.value, server, started)


@pytest.mark.timeout(10)
def test_a_dripped_body_fails_json_object_on_time(
    transport: Transport, drip: Callable[..., DripServer]
) -> None:
    # More than request() reads before returning arrives at once; the rest drips.
    fast = b'{"a":"' + b"x" * (128 * 1024)
    framing = b"Content-Length: %d\r\n\r\n" % (len(fast) + 1000)
    server = drip(HEAD + framing + fast, b"x" * 1000)
    started = time.monotonic()
    response = transport.request("GET", f"{server.url}/sandboxes/s1", timeout=TIMEOUT)
    with pytest.raises(TransportError) as caught:
        response.json_object(max_bytes=1 << 20)
    assert_timed_out(caught.value, server, started)


@pytest.mark.timeout(10)
def test_a_dripped_header_fails_a_credentialed_request_on_time(
    transport: Transport, drip: Callable[..., DripServer]
) -> None:
    from piship_remote.backends._credential import Credential, send_credentialed

    server = drip(HEAD, b"X-Slow: 1\r\n" * 100)
    started = time.monotonic()
    with pytest.raises(TransportError) as caught:
        send_credentialed(
            transport,
            "GET",
            f"{server.url}/apis",
            credential=Credential(lambda: "token", None, transport.redactor),
            auth_header=lambda value: {"Authorization": f"Bearer {value}"},
            repeatable=True,
            timeout=TIMEOUT,
        )
    assert_timed_out(caught.value, server, started)


@pytest.mark.timeout(10)
def test_a_stream_body_is_not_bound_by_the_request_timeout(
    transport: Transport, drip: Callable[..., DripServer]
) -> None:
    server = drip(HEAD + b"Transfer-Encoding: chunked\r\n\r\n", b"1\r\nx\r\n" * 4 + b"0\r\n\r\n")
    started = time.monotonic()
    response = transport.request("GET", f"{server.url}/stream", timeout=0.3, stream=True)
    assert b"".join(bytes(piece) for piece in response.iter_raw()) == b"xxxx"
    assert time.monotonic() - started > 0.3  # it outlived the timeout, and that is fine
