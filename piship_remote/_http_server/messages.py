"""The HTTP server's values: a request's head, the whole request, the reply, the limits.

Routers get a :class:`Request` and answer a :class:`Reply`; a reply's ``stream`` is
sent as it is produced. A request whose route streams its body (the server's
``streamed`` predicate said so on its :class:`Head`) carries a :class:`BodyReader`
instead of ``body`` bytes::

    def route(request: Request) -> Reply:
        if request.stream is not None:
            while piece := request.stream.read(65536):
                sink.write(piece)
        return Reply(200, b"{}", "application/json")
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import attrs

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_HEADER_BYTES",
    "BodyReader",
    "DropConnection",
    "Head",
    "Limits",
    "Recorded",
    "Reply",
    "Request",
    "ResetConnection",
    "Router",
    "Screen",
    "Tunnel",
    "Upstream",
]

MAX_BODY_BYTES = 16 * 1024 * 1024 + 5
MAX_HEADER_BYTES = 64 * 1024


class BodyReader(Protocol):
    """A request body read as it arrives (``Content-Length`` or chunked)."""

    def read(self, size: int) -> bytes:
        """Up to ``size`` bytes; ``b""`` once the body has ended."""
        ...

    @property
    def exhausted(self) -> bool:
        """Whether the whole body has been read."""
        ...


@attrs.frozen
class Head:
    """A request before its body: ``target`` as sent (query included), ``path`` without it."""

    method: str
    target: str
    path: str
    headers: Mapping[str, str]
    """Header names lower-cased."""
    client_subject: str | None = None
    """Over TLS: the common name of the client certificate the server verified, if any."""


@attrs.frozen
class Request:
    """A whole request: ``path`` without the query, ``headers`` with lower-case names."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes
    target: str = ""
    """The request target as sent, query included."""
    stream: BodyReader | None = None
    """For a route the server was told streams its body: the body, unread (``body`` is empty)."""
    client_subject: str | None = None
    """Over TLS: the common name of the client certificate the server verified, if any."""


@attrs.frozen
class Reply:
    """An answer: a whole ``body``, or a ``stream`` of chunks sent as they come."""

    status: int
    body: bytes = b""
    content_type: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    stream: Iterator[bytes] | None = None
    send_buffer: int | None = None
    """For a stream: the bytes the kernel may hold unsent (``SO_SNDBUF``), so that
    little is in flight, and lost, when the connection drops."""


@attrs.frozen
class Recorded:
    """One request as it arrived: ``path`` includes the query string, header names are lower-case.

    >>> Recorded("GET", "/a?b=1", {"accept": "*/*"}, b"").path
    '/a?b=1'
    """

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON (``ValueError`` when it is not JSON)."""
        return json.loads(self.body)


@attrs.frozen
class Limits:
    """What one client may hold; ``None`` means unbounded."""

    header_bytes: int = MAX_HEADER_BYTES
    """The request line and headers together."""
    body_bytes: int = MAX_BODY_BYTES
    read_timeout: float | None = None
    """A read that stalls this long is dropped (and, without ``idle_timeout``, an idle
    connection)."""
    idle_timeout: float | None = None
    """A connection waiting this long for its next request is closed (``None``: ``read_timeout``).

    Longer than the clients' own pool expiry (reqwest keeps one 90 s), so that a client
    never sends on a connection the server is closing at that moment."""
    head_seconds: float | None = None
    """The whole request head (request line and headers) must arrive within this, counted
    from its first byte (a client trickling a header byte at a time is dropped)."""
    body_seconds: float | None = None
    """The whole body must arrive within this (a trickling client is dropped)."""
    connections: int | None = None
    """Open connections at most (one thread each)."""
    client_share: int | None = None
    """The connections one peer address may count on when the server is full (``None``:
    all of them). A newcomer from an address holding fewer displaces the connection of
    the address holding most that waits longest on its client (idle, or owing its head or
    body); one from an address holding its share or more displaces only its own."""


class DropConnection(Exception):
    """Raise in a router (or a reply's stream) to cut the connection without answering."""


class ResetConnection(DropConnection):
    """Raise to cut the connection with a TCP reset rather than an orderly close: what the
    client of a proxy sees when the upstream behind it vanishes mid-answer (the client
    reads "connection reset", never an end of the body)."""


Router = Callable[[Request], Reply]
Screen = Callable[[Head], "Reply | None"]
HeaderLines = Callable[[list[tuple[str, str]]], list[tuple[str, str]]]


@attrs.frozen
class Upstream:
    """A connected upstream socket, and what the request's header lines become on the way."""

    socket: socket.socket
    headers: HeaderLines


Tunnel = Callable[[Head], "socket.socket | Upstream | Reply | None"]
"""For a request to hand over whole: a connected upstream socket (or :class:`Upstream`),
or the refusal; else ``None``."""
