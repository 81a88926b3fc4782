"""Every private urllib3 / http.client member the transport relies on, and why.

Nothing else in the package touches a private member; if urllib3 renames or drops one
of these, ``tests/test_urllib3_internals.py`` fails before anything here misbehaves.

- ``HTTPConnection._new_conn``: the only place a socket exists before ``connect()``
  is called on it. Cancellation registers it there, so a cancel interrupts a hanging
  connect; urllib3 has no public hook for the socket of a connect in progress.
- ``RecentlyUsedContainer.dispose_func`` / ``._maxsize``: urllib3 2 does not close a
  pool its pool manager evicts. The transport remembers a pool per origin (looking it
  up costs more than the rest of a kept-alive request) and must know when the manager
  let it go.
- ``urllib3.response.HTTPResponse._fp`` and ``http.client.HTTPResponse.chunk_left``:
  a chunked stream is de-chunked straight from the connection's buffered reader,
  which takes every frame that has arrived in one read (http.client reads one chunk
  per call); this roughly doubles stream throughput.
- ``urllib3.connection._ResponseOptions``, ``HTTPConnection._response_options`` and
  ``http.client.HTTPConnection._buffer``: a request whose body is bytes goes out in one
  write (request line, headers and body), as http.client itself sends a bytes body
  with the headers; urllib3 writes the headers and the body separately and checks every
  header again, which costs a system call and more CPU than the rest of a short request.
- ``HTTPConnectionPool._get_conn`` / ``._put_conn``: a connection is opened ahead of
  the request that will use it (while another request is in flight), and a direct
  request's connection is taken by the transport, which arms it with its call before
  :func:`send_direct` sends on it; urllib3 only takes one inside ``urlopen``.
- ``HTTPConnection._response_options``, again: a stream whose answer is plain and
  chunked skips urllib3's response object (see ``_streamed_response``); the answer
  is read by http.client's own ``getresponse`` after what urllib3's does before it.
- ``http.client.HTTPResponse.chunk_left`` (set) and ``.begin()`` (re-implemented):
  a plain head (see ``_response_head``) is read without the email parser, and a
  head already parsed while peeking at a stream's answer is taken as it is
  (:class:`PlainHeadResponse`).
- ``HTTPConnectionPool._validate_conn`` and ``urllib3.response.HTTPResponse._pool`` /
  ``._connection``: a request that urllib3 would neither retry, redirect nor send
  through a proxy is sent by :func:`send_direct`, what ``urlopen`` and
  ``_make_request`` do for it, without their per-call costs (a retry policy, two
  timeout objects, a copy of the headers, URL parsing).
"""

from __future__ import annotations

import errno
import http.client
import io
import socket
import ssl
import weakref
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, Protocol

import urllib3
import urllib3.connection
import urllib3.connectionpool
import urllib3.exceptions
import urllib3.response
import urllib3.util.retry

from piship_remote.transport._headers import HeaderSet
from piship_remote.transport._response_head import PlainHead, read_plain_head

__all__ = [
    "RETIRED",
    "PlainHeadResponse",
    "PooledAnswer",
    "SingleWriteRequest",
    "SocketFactoryHook",
    "chunked_source",
    "connect_taken",
    "http_client_response",
    "record_retired",
    "return_to_pool",
    "send_direct",
    "taken_from_pool",
]


class PooledAnswer(Protocol):
    """A connection's own answer to a streamed request (``_connection``'s
    ``StreamedResponse``): it gives the connection back to its ``pool`` when released."""

    pool: urllib3.connectionpool.HTTPConnectionPool | None


class SocketFactoryHook(urllib3.connection.HTTPConnection):
    """Routes urllib3's socket factory (``_new_conn``) to :meth:`open_socket`."""

    def _new_conn(self) -> socket.socket:
        return self.open_socket()

    def open_socket(self) -> socket.socket:
        """A connected socket; by default exactly what urllib3 does."""
        return super()._new_conn()


class PlainHeadResponse(http.client.HTTPResponse):
    """http.client's response, reading a plain head without the email parser.

    ``head`` is a head parsed already (its bytes are still in the reader, and are
    skipped); without one the head is read by :func:`read_plain_head`, and one that
    is not plain goes through http.client's own ``begin``.
    """

    def __init__(self, sock: Any, *args: Any, head: PlainHead | None = None, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        self._piship_head = head
        method = kwargs.get("method")
        self._piship_method = method if isinstance(method, str) and not args else None

    def begin(self) -> None:
        if self.headers is not None or self.debuglevel > 0:
            super().begin()
            return
        head = self._piship_head
        if head is not None:
            self.fp.read(head.size)  # parsed already; served from the buffer
        else:
            head = read_plain_head(self.fp, self._piship_method)
        if head is None:
            super().begin()
            return
        self.code = self.status = head.status
        self.reason = head.reason
        self.version = 11
        self.headers = self.msg = head.headers
        self.chunked = head.chunked
        if head.chunked:
            self.chunk_left = None
        self.length = head.length
        self.will_close = head.will_close


class SingleWriteRequest(urllib3.connection.HTTPConnection):
    """Sends a request with a bytes body and a ``Content-Length`` (or a GET or HEAD
    without a body) in one write.

    Anything else (chunked, a streamed body, no length, no ``User-Agent``, a header
    that is not plain text on one line) goes through urllib3's own ``request``. The
    socket's timeout is the subclass's to set before (urllib3's ``request`` sets it too).
    """

    def request(  # type: ignore[override]
        self,
        method: str,
        url: str,
        body: Any = None,
        headers: Mapping[str, str | bytes] | None = None,
        *,
        chunked: bool = False,
        preload_content: bool = True,
        decode_content: bool = True,
        enforce_content_length: bool = True,
    ) -> None:
        encoded = None if chunked or headers is None else _header_lines(headers, body, method)
        if encoded is None:
            super().request(
                method,
                url,
                body,
                headers,  # type: ignore[arg-type]
                chunked=chunked,
                preload_content=preload_content,
                decode_content=decode_content,
                enforce_content_length=enforce_content_length,
            )
            return
        lines, names = encoded
        self._response_options = urllib3.connection._ResponseOptions(
            request_method=method,
            request_url=url,
            preload_content=preload_content,
            decode_content=decode_content,
            enforce_content_length=enforce_content_length,
        )
        self.putrequest(
            method,
            url,
            skip_host="host" in names,
            skip_accept_encoding="accept-encoding" in names,
        )
        self._buffer.extend(lines)  # type: ignore[attr-defined]
        if not body or len(body) > _JOINED_BODY_LIMIT:
            self.endheaders(message_body=body or None)
            return
        self._piship_held = b""
        try:
            self.endheaders()  # `send` below keeps the request line and headers
            head = self._piship_held
        finally:
            self._piship_held = None
        self.send(head + body)

    _piship_held: bytes | None = None

    def send(self, data: Any) -> None:
        if self._piship_held is not None:
            self._piship_held += data
            return
        super().send(data)


_JOINED_BODY_LIMIT = 64 * 1024  # a larger body is not copied behind its headers


def _header_lines(
    headers: Mapping[str, str | bytes], body: object, method: str
) -> tuple[Sequence[bytes], frozenset[str]] | None:
    """The encoded header lines and lower-case names, or ``None`` for urllib3's own path."""
    if body is not None and not isinstance(body, bytes):
        return None
    if isinstance(headers, HeaderSet):  # checked and encoded already
        encoded, lower = headers.lines, headers.names
        if encoded is None or not _one_framing(lower, body, method):
            return None
        return encoded, lower
    lines: list[bytes] = []
    names: set[str] = set()
    for name, value in headers.items():
        if not isinstance(name, str):
            return None
        text = value if isinstance(value, str) else None
        if text is None or "\r" in text or "\n" in text or "\r" in name or "\n" in name:
            return None
        try:
            lines.append(name.encode("ascii") + b": " + text.encode("latin-1"))
        except UnicodeEncodeError:
            return None
        names.add(name.lower())
    if not _one_framing(names, body, method):
        return None
    return lines, frozenset(names)


def _one_framing(names: AbstractSet[str], body: object, method: str) -> bool:
    """The caller's ``User-Agent``, no ``Transfer-Encoding``, and a ``Content-Length``
    unless the request is a GET or HEAD without a body (urllib3 adds none then either)."""
    if "transfer-encoding" in names or "user-agent" not in names:
        return False
    return "content-length" in names or (body is None and method in _NO_BODY_METHODS)


_NO_BODY_METHODS = ("GET", "HEAD")


# Pools their pool manager has let go of (more than its size of hosts, or cleared).
RETIRED: weakref.WeakSet[urllib3.connectionpool.ConnectionPool] = weakref.WeakSet()


def record_retired(manager: urllib3.PoolManager, default_size: int) -> None:
    """Make a new, still empty ``manager`` add the pools it evicts to :data:`RETIRED`."""
    pools = manager.pools
    if getattr(pools, "dispose_func", False) is None and not len(pools):
        size: int = getattr(pools, "_maxsize", default_size)
        dispose: Callable[[Any], None] = RETIRED.add
        manager.pools = type(pools)(size, dispose)


def chunked_source(
    raw: urllib3.response.HTTPResponse | http.client.HTTPResponse,
) -> tuple[http.client.HTTPResponse, io.BufferedReader] | None:
    """The http.client response and buffered reader under a chunked body not yet read.

    ``raw`` is urllib3's response or http.client's under it. ``None`` when the body
    is not chunked, is already being read through http.client, or the objects are
    not the expected kinds.
    """
    inner = raw if isinstance(raw, http.client.HTTPResponse) else getattr(raw, "_fp", None)
    if not isinstance(inner, http.client.HTTPResponse) or not inner.chunked:
        return None
    fp = inner.fp
    if inner.chunk_left is not None or not isinstance(fp, io.BufferedReader):
        return None
    return inner, fp


def http_client_response(conn: urllib3.connection.HTTPConnection) -> http.client.HTTPResponse:
    """http.client's response to the request ``conn`` sent, without urllib3's around it.

    Does what urllib3's ``getresponse`` does before it asks http.client (the request's
    options forgotten); the caller set the socket timeout, and releases the connection.
    """
    conn._response_options = None
    return http.client.HTTPConnection.getresponse(conn)


def taken_from_pool(
    pool: urllib3.connectionpool.HTTPConnectionPool,
) -> urllib3.connection.HTTPConnection:
    """A connection taken out of ``pool`` at once: an idle one, else a new one not yet
    connected (see :func:`connect_taken`).

    It stays out of the pool until :func:`return_to_pool`, so no request can take it.
    """
    conn = pool._get_conn(timeout=0)
    assert isinstance(conn, urllib3.connection.HTTPConnection)
    return conn


def connect_taken(
    pool: urllib3.connectionpool.HTTPConnectionPool,
    conn: urllib3.connection.HTTPConnection,
    timeout: float,
) -> None:
    """Connect ``conn`` (taken from ``pool``) within ``timeout`` seconds, if it is not.

    A connect failure closes it, puts its slot back and raises.
    """
    try:
        if conn.sock is None:
            conn.timeout = timeout
            conn.connect()
    except BaseException:
        conn.close()
        pool._put_conn(None)
        raise


def return_to_pool(
    pool: urllib3.connectionpool.HTTPConnectionPool, conn: urllib3.connection.HTTPConnection
) -> None:
    """Put ``conn`` back as an idle connection (closed if the pool was closed meanwhile)."""
    pool._put_conn(conn)


def send_direct(
    pool: urllib3.connectionpool.HTTPConnectionPool,
    method: str,
    path: str,
    body: Any,
    headers: Mapping[str, str | bytes],
    *,
    timeout: float | None,
    chunked: bool,
    retries: urllib3.util.retry.Retry,
    stream: bool = False,
    conn: urllib3.connection.HTTPConnection | None = None,
) -> urllib3.response.HTTPResponse | PooledAnswer:
    """What ``pool.urlopen`` does for a request without retries, redirects or a proxy.

    ``timeout`` is the socket timeout of the connect and of the wait for the response
    (``None``: none); ``retries`` only goes on the response, as ``urlopen`` puts it
    there. The body is not read (``preload_content=False``) and the connection goes
    back to the pool when the response is released. A failure closes the connection
    and is raised wrapped as ``urlopen`` wraps it, in a ``MaxRetryError``. With
    ``stream``, a connection that can (see ``_connection``) may answer with its own
    :class:`PooledAnswer`. ``conn``, when given, is a connection the caller took
    from ``pool`` (:func:`taken_from_pool`) and set up.
    """
    if conn is None:
        taken = pool._get_conn()
        assert isinstance(taken, urllib3.connection.HTTPConnection)
        conn = taken
    try:
        conn.timeout = timeout
        pool.num_requests += 1
        pool._validate_conn(conn)  # HTTPS: connects, and checks the certificate
        _write(conn, method, path, body, headers, chunked)
        if not conn.is_closed:
            conn.timeout = timeout
        answer = getattr(conn, "getresponse_streamed", None) if stream else None
        response: urllib3.response.HTTPResponse | PooledAnswer = (
            conn.getresponse() if answer is None else answer()
        )
    except _URLOPEN_FAILURES as error:
        conn.close()
        pool._put_conn(None)
        raise urllib3.exceptions.MaxRetryError(pool, path, _wrapped(error)) from error
    except BaseException:
        conn.close()
        pool._put_conn(None)
        raise
    if not isinstance(response, urllib3.response.HTTPResponse):
        response.pool = pool
        return response
    response.retries = retries
    response._connection = conn
    response._pool = pool
    return response


def _write(
    conn: urllib3.connection.HTTPConnection,
    method: str,
    path: str,
    body: Any,
    headers: Mapping[str, str | bytes],
    chunked: bool,
) -> None:
    """Send the request; a peer that closed early may still have answered (as urllib3)."""
    try:
        conn.request(
            method,
            path,
            body=body,
            headers=headers,  # type: ignore[arg-type]
            chunked=chunked,
            preload_content=False,
            decode_content=False,
            enforce_content_length=True,
        )
    except BrokenPipeError:
        pass
    except OSError as error:
        if error.errno not in (errno.EPROTOTYPE, errno.ECONNRESET):
            raise


_URLOPEN_FAILURES = (
    TimeoutError,
    http.client.HTTPException,
    OSError,
    urllib3.exceptions.ProtocolError,
    ssl.SSLError,
    ssl.CertificateError,
    urllib3.exceptions.SSLError,
)


def _wrapped(error: BaseException) -> Exception:
    """The reason ``urlopen`` gives a failure (its ``MaxRetryError`` wraps it)."""
    if isinstance(error, (ssl.SSLError, ssl.CertificateError)):
        return urllib3.exceptions.SSLError(error)
    if isinstance(error, urllib3.exceptions.HTTPError):
        return error
    if isinstance(error, (OSError, http.client.HTTPException)):
        return urllib3.exceptions.ProtocolError("Connection aborted.", error)
    return error  # type: ignore[return-value]
