"""No credential header in any frame or chained exception of a transport failure."""

from __future__ import annotations

import base64
import socket
import traceback
import urllib.parse
from collections.abc import Callable, Iterator

import pytest

from piship_remote.backends._credential import Credential, send_credentialed
from piship_remote.model.errors import PiShipError
from piship_remote.model.redact import Redactor
from piship_remote.transport import Transport, TransportError
from tests.support.drip_server import DripServer

SECRET = "s3cr3t/ZQ7XK2+M9PL4=WRT8B"
FORMS = {
    "plain": SECRET,
    "base64": base64.b64encode(SECRET.encode()).decode(),
    "percent-encoded": urllib.parse.quote(SECRET, safe=""),
}


@pytest.fixture
def transport() -> Iterator[Transport]:
    instance = Transport(redactor=Redactor())
    try:
        yield instance
    finally:
        instance.close()


def refused_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/envd"


@pytest.fixture
def dropping_url() -> Iterator[str]:
    """Headers and the start of a 100-byte body, then the connection is closed."""
    server = DripServer(prefix=b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nfirst", drip=b"")
    try:
        yield f"{server.url}/envd"
    finally:
        server.close()


def caught(call: Callable[[], object]) -> PiShipError:
    try:
        call()
    except PiShipError as error:
        return error
    raise AssertionError("the request did not fail")


def rendered(error: BaseException) -> str:
    """The error, every chained exception (suppressed ones too), each with frame locals."""
    parts: list[str] = []
    pending: list[BaseException] = [error]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        parts.append(repr(current))
        parts.extend(
            traceback.TracebackException.from_exception(current, capture_locals=True).format()
        )
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return "".join(parts)


def assert_no_secret(error: PiShipError) -> None:
    assert isinstance(error, TransportError)
    text = rendered(error)
    assert "headers" in text  # the frames' locals were rendered
    for form, value in FORMS.items():
        assert value not in text, f"the secret appears {form}"


@pytest.mark.timeout(10)
def test_a_refused_connection_keeps_the_access_token_out_of_the_traceback(
    transport: Transport,
) -> None:
    url = refused_url()
    assert_no_secret(
        caught(lambda: transport.request("POST", url, headers={"X-Access-Token": SECRET}))
    )


@pytest.mark.timeout(10)
def test_a_connection_dropped_mid_body_keeps_the_access_token_out_of_the_traceback(
    transport: Transport, dropping_url: str
) -> None:
    error = caught(
        lambda: transport.request("GET", dropping_url, headers={"X-Access-Token": SECRET})
    )
    assert_no_secret(error)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("where", ["refused", "dropped"])
def test_a_credentialed_failure_keeps_the_bearer_out_of_the_traceback(
    transport: Transport, dropping_url: str, where: str
) -> None:
    url = refused_url() if where == "refused" else dropping_url
    credential = Credential(lambda: SECRET, None, transport.redactor)
    error = caught(
        lambda: send_credentialed(
            transport,
            "GET",
            url,
            credential=credential,
            auth_header=lambda value: {"Authorization": f"Bearer {value}"},
            repeatable=True,
        )
    )
    assert_no_secret(error)
