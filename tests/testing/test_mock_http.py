"""MockHttpClient: an in-process HTTP client that keeps the client protocol's promises."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from piship_remote.model.errors import CommandCancelled
from piship_remote.model.redact import Redactor
from piship_remote.testing import MockHttpClient, MockRequest, MockResponse
from piship_remote.transport import HttpClient, TransportError, when_sent

pytestmark = pytest.mark.timeout(10)

URL = "https://api.example.com:8443"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def ok(request: MockRequest) -> MockResponse:
    return MockResponse.of_json(200, {"ok": True})


def test_it_is_an_http_client() -> None:
    client: HttpClient = MockHttpClient(ok)
    with client.request("GET", f"{URL}/health") as response:
        assert response.status == 200


def test_records_each_request_as_the_backend_made_it() -> None:
    client = MockHttpClient(ok)
    client.request("POST", f"{URL}/sandboxes?x=1", headers={"X-Api-Key": "k"}, json={"a": "é"})
    client.request("PUT", f"{URL}/files", data=iter([b"ab", b"cd"]), timeout=None)
    create, upload = client.requests
    assert (create.method, create.path, create.url) == (
        "POST",
        "/sandboxes?x=1",
        f"{URL}/sandboxes?x=1",
    )
    assert create.headers == {"x-api-key": "k", "content-type": "application/json"}
    assert create.body == '{"a":"é"}'.encode()
    assert create.json() == {"a": "é"}
    assert (upload.body, upload.timeout) == (b"abcd", None)
    assert client.find("POST", "/sandboxes?x=1") == [create]
    assert client.count("PUT") == 1


def test_answers_with_the_handlers_response() -> None:
    client = MockHttpClient(
        lambda request: MockResponse.of_json(201, {"id": "sbx1"}, {"Retry-After": "3"})
    )
    response = client.request("POST", f"{URL}/sandboxes")
    assert response.status == 201
    assert response.headers["retry-after"] == "3"
    assert response.headers["content-type"] == "application/json"
    assert response.json_object() == {"id": "sbx1"}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"<html>", "the response is not JSON"),
        (b"[1]", "the response is not a JSON object"),
        (b'"' + b"x" * 20 + b'"', "the response is too large"),
    ],
)
def test_a_body_that_is_not_the_json_asked_for_is_a_value_error(body: bytes, expected: str) -> None:
    client = MockHttpClient(lambda request: MockResponse(200, body))
    with pytest.raises(ValueError, match=expected):
        client.request("GET", f"{URL}/x").json_object(max_bytes=10)


def test_failure_is_one_redacted_line() -> None:
    redactor = Redactor()
    redactor.register("secret-key-0001")
    client = MockHttpClient(
        lambda request: MockResponse(401, b"bad\n  key secret-key-0001"), redactor=redactor
    )
    assert client.request("GET", f"{URL}/x").failure() == "HTTP 401: bad key [REDACTED]"


def test_a_stream_is_read_chunk_by_chunk_as_the_caller_iterates() -> None:
    produced: list[bytes] = []

    def chunks() -> Iterator[bytes]:
        for chunk in (b"one", b"two"):
            produced.append(chunk)
            yield chunk

    client = MockHttpClient(lambda request: MockResponse(200, chunks()))
    response = client.request("POST", f"{URL}/stream", stream=True)
    assert produced == []
    body = response.iter_raw()
    assert next(body) == b"one"
    assert produced == [b"one"]
    assert list(body) == [b"two"]


def test_a_body_of_chunks_is_read_whole_unless_streamed() -> None:
    produced: list[bytes] = []

    def chunks() -> Iterator[bytes]:
        for chunk in (b"one", b"two"):
            produced.append(chunk)
            yield chunk

    response = MockHttpClient(lambda request: MockResponse(200, chunks())).request("GET", URL)
    assert produced == [b"one", b"two"]
    assert list(response.iter_raw()) == [b"onetwo"]


def test_a_cancelled_call_reaches_no_handler() -> None:
    cancel = threading.Event()
    cancel.set()
    client = MockHttpClient(ok)
    with pytest.raises(CommandCancelled):
        client.request("GET", URL, cancel=cancel)
    assert client.requests == []


def test_a_cancel_while_the_handler_waits_ends_the_call() -> None:
    cancel = threading.Event()

    def never_answers(request: MockRequest) -> MockResponse:
        assert request.cancel is not None
        request.cancel.set()  # as another thread would, while the server is silent
        request.cancel.wait(5)
        return MockResponse(200)

    with pytest.raises(CommandCancelled):
        MockHttpClient(never_answers).request("GET", URL, cancel=cancel)


def test_a_cancel_between_a_streams_chunks_ends_the_stream() -> None:
    cancel = threading.Event()

    def chunks() -> Iterator[bytes]:
        yield b"one"
        cancel.set()
        yield b"two"

    client = MockHttpClient(lambda request: MockResponse(200, chunks()))
    body = client.request("POST", URL, stream=True, cancel=cancel).iter_raw()
    assert next(body) == b"one"
    with pytest.raises(CommandCancelled):
        next(body)


def test_a_handler_past_the_deadline_is_a_timeout_on_the_clock_given() -> None:
    clock = FakeClock()

    def slow(request: MockRequest) -> MockResponse:
        clock.advance(31)
        return MockResponse(200)

    with pytest.raises(TransportError) as caught:
        MockHttpClient(slow, clock=clock).request("GET", f"{URL}/health", timeout=30)
    assert str(caught.value) == "sandbox request to api.example.com:8443 timed out"
    assert caught.value.request_sent is True


def test_a_stream_silent_past_its_idle_timeout_fails_but_not_its_deadline() -> None:
    clock = FakeClock()

    def chunks() -> Iterator[bytes]:
        clock.advance(4)  # past the call's timeout: a stream's body is not bound by it
        yield b"one"
        clock.advance(6)
        yield b"two"

    client = MockHttpClient(lambda request: MockResponse(200, chunks()), clock=clock)
    body = client.request("POST", URL, stream=True, timeout=3, idle_timeout=5).iter_raw()
    assert next(body) == b"one"
    with pytest.raises(TransportError, match="timed out"):
        next(body)


@pytest.mark.parametrize(
    ("failure", "message", "sent"),
    [
        (ConnectionResetError(104, "reset"), "failed: ECONNRESET", True),
        (ConnectionRefusedError(111, "refused"), "failed: ECONNREFUSED", False),
    ],
)
def test_a_handler_raising_an_os_error_is_a_transport_failure(
    failure: OSError, message: str, sent: bool
) -> None:
    def broken(request: MockRequest) -> MockResponse:
        raise failure

    with pytest.raises(TransportError) as caught:
        MockHttpClient(broken, component="control").request("GET", URL)
    assert str(caught.value) == f"control request to api.example.com:8443 {message}"
    assert caught.value.request_sent is sent
    assert caught.value.__context__ is None


def test_when_sent_callbacks_run_before_the_handler() -> None:
    order: list[str] = []

    def handler(request: MockRequest) -> MockResponse:
        order.append("handler")
        return MockResponse(204)

    with when_sent(lambda: order.append("sent")):
        MockHttpClient(handler).request("POST", URL)
    assert order == ["sent", "handler"]


def test_close_marks_the_client_closed() -> None:
    client = MockHttpClient(ok)
    client.close()
    assert client.closed is True
