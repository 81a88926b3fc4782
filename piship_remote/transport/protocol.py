"""The client protocol: what a backend needs from an HTTP client.

:class:`~piship_remote.transport.Transport` is the default implementation. Anything
with the same ``request`` and ``close`` can stand in for it, the way an httpx transport
or a requests adapter can: a recording double in a test, or a client that routes
through a user's own connection pool::

    class Recording:
        def __init__(self, inner: HttpClient) -> None:
            self.inner, self.calls = inner, []

        def request(self, method: str, url: str, **kwargs: Any) -> HttpReply:
            self.calls.append((method, url))
            return self.inner.request(method, url, **kwargs)

        def close(self) -> None:
            self.inner.close()

    client: HttpClient = Recording(Transport(redactor=Redactor()))

A client must keep the transport's promises: never follow redirects, never resend a
request by itself, raise ``CommandCancelled`` when ``cancel`` is set, and raise
:class:`~piship_remote.transport.TransportError` (never the underlying exception's
text) when the request fails below HTTP or passes ``timeout``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from piship_remote.transport.deadline import Deadline

__all__ = ["HttpClient", "HttpReply"]


class HttpReply(Protocol):
    """A response whose body is read on demand (see ``HttpResponse``)."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    def json_object(self, max_bytes: int = ...) -> dict[str, Any]:
        """The body as a JSON object of at most ``max_bytes`` bytes (``ValueError`` if not)."""
        ...

    def json_value(self, max_bytes: int = ...) -> Any:
        """The body as any JSON value of at most ``max_bytes`` bytes (``ValueError`` if not)."""
        ...

    def failure(self) -> str:
        """``HTTP <status>``, plus ``: <start of the body>`` (one line, redacted)."""
        ...

    def iter_raw(self) -> Iterator[bytes | memoryview]:
        """The body's bytes as they arrive."""
        ...

    def finish(self, limit: int = ..., wait: float = ...) -> None:
        """Read what is left of the body (briefly) so the connection can be reused, close."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> HttpReply: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class HttpClient(Protocol):
    """What the backends call on their HTTP client: one request method, and close."""

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
    ) -> HttpReply:
        """Send one request; never retried, never redirected.

        ``timeout`` bounds the whole exchange (connect, headers and, unless ``stream``,
        the body); ``None``: no deadline. ``deadline``, when given, is that bound
        instead (the caller's own, handed down as it is). ``data`` given as an
        iterable of chunks is streamed with chunked transfer encoding, never held
        whole. ``idle_timeout`` bounds the silence between a stream's body bytes.
        ``cancel`` set before or during the call raises ``CommandCancelled``.
        """
        ...

    def close(self) -> None:
        """Release the client's connections."""
        ...
