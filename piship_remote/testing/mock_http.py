"""An in-process HTTP client for backend tests: :class:`MockHttpClient`, no sockets, no threads.

A backend takes any :class:`~piship_remote.transport.HttpClient` as ``client=``. This one
answers every request by calling ``handler(request)`` on the calling thread, the way
httpx's ``MockTransport`` does; the handler gets a :class:`MockRequest` and returns a
:class:`MockResponse`::

    def handler(request: MockRequest) -> MockResponse:
        if (request.method, request.path) == ("POST", "/sandboxes"):
            return MockResponse.of_json(503, {"code": 503, "message": "busy"})
        return MockResponse(404)

    client = MockHttpClient(handler)
    backend = E2bCompatibleBackend(endpoint="https://api.example.com", client=client)
    ...  # call the backend
    (create,) = client.find("POST", "/sandboxes")
    assert create.json()["templateID"] == "base"

Every request is recorded (:attr:`MockHttpClient.requests`) before the handler runs. A
response body given as an iterable of byte chunks is a stream: a ``stream=True``
request reads it chunk by chunk as the backend iterates, any other request reads it
whole before ``request`` returns.

The client keeps the protocol's promises: ``cancel`` set before the call, while the
request body is read, after the handler or between a stream's chunks raises
``CommandCancelled``; ``timeout`` (connect, headers and, unless ``stream``, the body) and
``idle_timeout`` (between a stream's chunks) are measured on ``clock``, so a test can
pass a fake clock and let a deadline pass without waiting for it; a handler that raises
an ``OSError`` (``ConnectionResetError()``, ``TimeoutError()``) stands for a failure
below HTTP and becomes the :class:`~piship_remote.transport.TransportError` the real
client would raise. A handler that stands for a server that never answers can wait on
``request.cancel``. Callbacks registered with
:func:`~piship_remote.transport.when_sent` run before the handler, as the request
"reaches the wire".
"""

from __future__ import annotations

import json as jsonlib
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any

import attrs
from requests.structures import CaseInsensitiveDict

from piship_remote.model.errors import CommandCancelled
from piship_remote.model.redact import Redactor
from piship_remote.transport._connection import ON_SENT
from piship_remote.transport.deadline import Deadline
from piship_remote.transport.failures import TransportError, failure_code, timed_out
from piship_remote.transport.response import (
    FAILURE_WINDOW,
    failure_line,
    json_object_of,
    json_of,
)

__all__ = ["MockHttpClient", "MockRequest", "MockResponse"]

_NOT_SENT = (ConnectionRefusedError,)


@attrs.frozen
class MockRequest:
    """One request as the backend made it; header names are lower-case.

    ``path`` includes the query string (as :class:`~piship_remote.testing.Recorded`'s
    does); ``body`` is what would have been sent (``json=`` compact, a chunk iterable
    joined). ``cancel`` is the call's cancel event, for a handler that waits on it.
    """

    method: str
    url: str
    headers: Mapping[str, str]
    body: bytes
    timeout: float | None = None
    stream: bool = False
    cancel: threading.Event | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def path(self) -> str:
        parts = urllib.parse.urlsplit(self.url)
        return parts.path + (f"?{parts.query}" if parts.query else "")

    def json(self) -> Any:
        """The body parsed as JSON (``ValueError`` when it is not JSON)."""
        return jsonlib.loads(self.body)


@attrs.frozen
class MockResponse:
    """An answer: a status, headers and a body (bytes, or an iterable of byte chunks)."""

    status: int = 200
    body: bytes | Iterable[bytes] = b""
    headers: Mapping[str, str] = attrs.field(factory=dict)

    @classmethod
    def of_json(
        cls, status: int, value: Any, headers: Mapping[str, str] | None = None
    ) -> MockResponse:
        """``value`` as compact JSON, with ``Content-Type: application/json``."""
        data = jsonlib.dumps(value, separators=(",", ":")).encode()
        return cls(status, data, {"Content-Type": "application/json", **(headers or {})})


Handler = Callable[[MockRequest], MockResponse]


class MockHttpClient:
    """An :class:`~piship_remote.transport.HttpClient` that calls ``handler`` instead of a server.

    ``component`` names the caller in transport errors (as ``Transport``'s does),
    ``redactor`` cleans :meth:`failure` texts, ``clock`` measures deadlines.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        component: str = "sandbox",
        redactor: Redactor | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._handler = handler
        self._lock = threading.Lock()
        self._requests: list[MockRequest] = []
        self.component = component
        self.redactor = redactor or Redactor()
        self.clock = clock
        self.closed = False

    @property
    def requests(self) -> list[MockRequest]:
        """Every request so far, in the order they were made (a copy)."""
        with self._lock:
            return list(self._requests)

    def find(self, method: str, path: str | None = None) -> list[MockRequest]:
        """The requests with ``method`` (and ``path``, query included, if given)."""
        return [r for r in self.requests if r.method == method and path in (None, r.path)]

    def count(self, method: str, path: str | None = None) -> int:
        return len(self.find(method, path))

    def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        json: Any = None,
        data: bytes | Iterable[bytes] | None = None,
        timeout: float | None = 30.0,
        cancel: threading.Event | None = None,
        stream: bool = False,
        idle_timeout: float | None = None,
        deadline: Deadline | None = None,
    ) -> MockReply:
        """Record the request, call the handler, answer with its response.

        A ``deadline`` given instead of ``timeout`` counts as the time left of it (on its
        own clock), recorded as the request's ``timeout``.
        """
        if deadline is not None:
            timeout = deadline.remaining()
        call = _Call(self, url, timeout, cancel, stream, idle_timeout)
        call.check()
        sent = _Call.lowered(headers)
        if json is not None:
            data = jsonlib.dumps(json, separators=(",", ":"), ensure_ascii=False).encode()
            sent.setdefault("content-type", "application/json")
        body = data if isinstance(data, bytes) or data is None else b"".join(call.each(data))
        request = MockRequest(method, url, sent, body or b"", timeout, stream, cancel)
        with self._lock:
            self._requests.append(request)
        on_sent = ON_SENT.get()
        if on_sent is not None:
            on_sent()
        outcome = self._answer(request, call)
        if isinstance(outcome, TransportError):
            raise outcome  # outside the handler's frame, as the real client raises it
        call.check()
        return MockReply(outcome, call)

    def _answer(self, request: MockRequest, call: _Call) -> MockResponse | TransportError:
        try:
            return self._handler(request)
        except OSError as failure:
            return call.failed(failure)

    def close(self) -> None:
        self.closed = True


class _Call:
    """One request's cancel, deadline and idle limit, measured on the client's clock."""

    def __init__(
        self,
        client: MockHttpClient,
        url: str,
        timeout: float | None,
        cancel: threading.Event | None,
        stream: bool,
        idle_timeout: float | None,
    ) -> None:
        self.client = client
        self.label = urllib.parse.urlsplit(url).netloc.rpartition("@")[2]
        self.deadline = None if timeout is None else client.clock() + timeout
        self.cancel = cancel
        self.stream = stream
        self.idle_timeout = idle_timeout

    @staticmethod
    def lowered(headers: Mapping[str, str] | None) -> dict[str, str]:
        return {name.lower(): value for name, value in (headers or {}).items()}

    def check(self, *, body: bool = False) -> None:
        """Raise when the call is cancelled or (outside a stream's body) past its deadline."""
        if self.cancel is not None and self.cancel.is_set():
            raise CommandCancelled()
        deadline = None if body and self.stream else self.deadline
        if deadline is not None and self.client.clock() > deadline:
            raise self.failed(TimeoutError())

    def each(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        """``chunks`` one by one, the call checked before each and between them."""
        last = self.client.clock()
        for chunk in chunks:
            now = self.client.clock()
            if self.stream and self.idle_timeout is not None and now - last > self.idle_timeout:
                raise self.failed(TimeoutError())
            last = now
            self.check(body=True)
            yield chunk
        self.check(body=True)

    def failed(self, failure: OSError) -> TransportError:
        outcome = "timed out" if timed_out(failure) else f"failed: {failure_code(failure)}"
        return TransportError(
            f"{self.client.component} request to {self.label} {outcome}",
            request_sent=not isinstance(failure, _NOT_SENT),
            component=self.client.component,
        )


class MockReply:
    """A :class:`MockHttpClient`'s response (an :class:`~piship_remote.transport.HttpReply`)."""

    def __init__(self, response: MockResponse, call: _Call) -> None:
        self.status = response.status
        self.headers: Mapping[str, str] = CaseInsensitiveDict(response.headers)
        self._call = call
        body = response.body
        chunks: Iterable[bytes] = (body,) if isinstance(body, bytes) else body
        self._chunks: Iterator[bytes] = call.each(chunks)
        self._buffer = b""
        self.closed = False
        if not call.stream:
            self._buffer = b"".join(self._chunks)

    def __enter__(self) -> MockReply:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def json_object(self, max_bytes: int = 1 << 20) -> dict[str, Any]:
        return json_object_of(self.json_value(max_bytes))

    def json_value(self, max_bytes: int = 1 << 20) -> Any:
        try:
            return json_of(self._read_upto(max_bytes + 1), max_bytes)
        finally:
            self.close()

    def failure(self) -> str:
        try:
            body = self._read_upto(FAILURE_WINDOW)
        except TransportError:
            body = self._buffer
        finally:
            self.close()
        return failure_line(self.status, body, self._call.client.redactor)

    def iter_raw(self) -> Iterator[bytes | memoryview]:
        if self._buffer:
            chunk, self._buffer = self._buffer, b""
            yield chunk
        if self.closed:
            return
        for chunk in self._chunks:
            if chunk:
                yield chunk
        self.close()

    def finish(self, limit: int = 64 * 1024, wait: float = 0.25) -> None:
        self.close()

    def close(self) -> None:
        self.closed = True

    def _read_upto(self, size: int) -> bytes:
        if not self.closed:
            for chunk in self._chunks:
                self._buffer += chunk
                if len(self._buffer) >= size:
                    break
        return self._buffer[:size]
