"""The call scope and the pooled connections that register their sockets with it.

A request's :class:`Call` (made by the transport) holds a :class:`CallScope`: the
sockets the request uses, its deadline, whether it was cancelled. The call's cancel
shuts those sockets down (:meth:`CallScope.cancel`), so a blocked connect, header wait
or body read ends within milliseconds with ``CommandCancelled``; every read of the
answer gets only what is left of the deadline (:class:`DeadlineReader`), so a server
sending one byte per second cannot stretch it, as it would a per-read socket timeout.

A request sent directly goes out on a connection the transport armed with its scope
(:func:`arm`, until :func:`disarm`); on the proxy path, where urllib3's ``urlopen``
takes the connection, the scope comes through the context variable
:data:`~piship_remote.transport._connection.CURRENT`. A connection registers its socket when
it connects (before ``connect()``, so a cancel interrupts a hanging connect) and again
just before it waits for the response headers. Taken from the pool by another call,
it first leaves the previous call's scope (under that scope's lock); if that call was
cancelled meanwhile (its cancel may have shut the socket down) the connection is
closed and reopened.

A stream's answer is looked at before urllib3 wraps it (``getresponse_streamed``): a
plain head over a bare chunked body becomes a
:class:`~piship_remote.transport._streamed_response.StreamedResponse`.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import io
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import urllib3
import urllib3.connection
import urllib3.connectionpool
import urllib3.exceptions
import urllib3.response
from urllib3.util.connection import allowed_gai_family
from urllib3.util.timeout import Timeout

from piship_remote.model.errors import CommandCancelled
from piship_remote.model.redact import Redactor
from piship_remote.transport._cancel import EventWatcher, when_cancelled
from piship_remote.transport._response_head import PlainHead, peek_plain_head
from piship_remote.transport._steady_socket import SteadyTimeoutSocket
from piship_remote.transport._streamed_response import StreamedResponse
from piship_remote.transport._urllib3_internals import (
    PlainHeadResponse,
    SingleWriteRequest,
    SocketFactoryHook,
    http_client_response,
)
from piship_remote.transport.deadline import Deadline
from piship_remote.transport.endpoint import is_localhost_name, loopback_addresses
from piship_remote.transport.failures import (
    NETWORK_ERRORS,
    TransportError,
    failure_code,
    timed_out,
)

__all__ = [
    "CURRENT",
    "HOSTS",
    "ON_SENT",
    "POOL_CLASSES",
    "Call",
    "CallScope",
    "DeadlineReader",
    "arm",
    "disarm",
    "when_sent",
]

# The scope of the call the current thread is making (set only while it makes it).
CURRENT: contextvars.ContextVar[CallScope | None] = contextvars.ContextVar(
    "piship_transport_call", default=None
)

# Called by the connection once a request's headers and body are written (see when_sent).
ON_SENT: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "piship_on_sent", default=None
)


@contextlib.contextmanager
def when_sent(callback: Callable[[], None]) -> Iterator[None]:
    """Call ``callback`` as soon as the requests sent in this block are on the wire.

    It fires after the connection wrote the request, before the answer is read,
    so another request can follow without waiting for it.
    """
    token = ON_SENT.set(callback)
    try:
        yield
    finally:
        ON_SENT.reset(token)


class CallScope:
    """The sockets one call uses (:meth:`cancel` shuts them all down) and its deadline."""

    __slots__ = (
        "_lock",
        "_over",
        "_owned",
        "_sockets",
        "cancelled",
        "deadline",
        "sent",
        "socket",
    )

    def __init__(self, deadline: Deadline) -> None:
        self.deadline = deadline
        self.cancelled = False
        self.sent = False  # the request may have reached the server
        self.socket: socket.socket | None = None  # the one the response arrives on
        self._over = False  # the deadline no longer applies (finished, or a stream's body)
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._owned: list[socket.socket] = []

    def remaining(self) -> float | None:
        return self.deadline.remaining()

    def read_timeout(self) -> float | None:
        """The socket timeout the next read gets: what is left of the deadline.

        Raises ``TimeoutError`` (a socket timeout) once the deadline has passed.
        """
        if self._over:
            return None
        remaining = self.deadline.remaining()
        if remaining is None:
            return None
        if remaining <= 0:
            raise TimeoutError("the deadline passed")
        return remaining

    def attach(self, sock: socket.socket, *, owned: bool = False) -> None:
        """Track ``sock``; shut it down at once if the call is already cancelled."""
        with self._lock:
            if owned:
                self._owned.append(sock)
            if not any(s is sock for s in self._sockets):
                self._sockets.append(sock)
            if self.cancelled:
                shut(sock)

    def detach(self, sock: socket.socket | None) -> bool:
        """Stop tracking ``sock``; ``False`` when the call was cancelled (do not reuse it)."""
        with self._lock:
            self._sockets = [s for s in self._sockets if s is not sock]
            if self.socket is sock:
                # Back in the pool, another thread may own it: never touch it again.
                self.socket = None
            return not self.cancelled

    def drop_owned(self) -> None:
        """Close the duplicates made to cover a TLS handshake (the handshake is over)."""
        if not self._owned:  # only the calling thread adds to it
            return
        with self._lock:
            owned, self._owned = self._owned, []
            self._sockets = [s for s in self._sockets if not any(s is o for o in owned)]
        for sock in owned:
            sock.close()

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            for sock in self._sockets:
                shut(sock)

    def end_deadline(self) -> None:
        """From now on the deadline does not apply (a stream's body has its own rules)."""
        with self._lock:
            self._over = True

    def release(self) -> None:
        """Forget every socket and the deadline: a later cancel touches nothing."""
        self.drop_owned()
        with self._lock:
            self._over = True
            self._sockets = []
            self.socket = None


def shut(sock: socket.socket) -> None:
    # socket.socket.shutdown, not SSLSocket.shutdown: the latter also drops the TLS
    # object under a reader that may still be using it. OSError: already closed.
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class Call:
    """One request's cancellation scope, deadline and the cleanup that ends it."""

    __slots__ = (
        "_cleanup",
        "component",
        "idle_timeout",
        "label",
        "redactor",
        "scope",
        "stream",
    )

    def __init__(
        self,
        component: str,
        redactor: Redactor,
        label: str,
        deadline: Deadline,
        *,
        stream: bool,
        idle_timeout: float | None,
    ) -> None:
        self.component = component
        self.redactor = redactor
        self.label = label  # host[:port], for messages
        self.scope = CallScope(deadline)
        self.stream = stream
        self.idle_timeout = idle_timeout
        self._cleanup: Callable[[], object] | None = None

    def watch(self, cancel: threading.Event, watcher: EventWatcher) -> None:
        """Cancel the scope once ``cancel`` is set (a token calls back; ``watcher`` polls
        a plain event)."""
        self._cleanup = when_cancelled(cancel, watcher, self.scope.cancel)

    def finish(self) -> None:
        """Stop listening for cancellation and forget the sockets (idempotent)."""
        self.scope.release()
        cleanup, self._cleanup = self._cleanup, None
        if cleanup is not None:
            cleanup()

    def error(self, exc: BaseException) -> BaseException:
        """The exception to raise for ``exc``: cancelled, timed out, failed, or ``exc``."""
        if self.scope.cancelled and isinstance(exc, NETWORK_ERRORS):
            return CommandCancelled()
        if isinstance(exc, ValueError) or not isinstance(exc, NETWORK_ERRORS):
            return exc  # a bad argument or a bug, not a network failure
        return self.failed("timed out" if timed_out(exc) else f"failed: {failure_code(exc)}")

    def failed(self, outcome: str) -> TransportError:
        return TransportError(
            f"{self.component} request to {self.label} {outcome}",
            request_sent=self.scope.sent,
            component=self.component,
        )


class DeadlineReader(io.RawIOBase):
    """A socket's reader that gives every read only what is left of the call's deadline.

    Wraps the raw reader ``socket.makefile("rb", buffering=0)`` returns (so the socket
    stays open while the response reads, as http.client expects); once the deadline no
    longer applies, reads go straight through.
    """

    def __init__(self, sock: socket.socket, scope: CallScope) -> None:
        super().__init__()
        self._raw = sock.makefile("rb", buffering=0)
        self._sock = sock
        self._scope = scope

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        timeout = self._scope.read_timeout()
        if timeout is not None:
            self._sock.settimeout(timeout)
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()


HOSTS = 32  # hosts whose idle connections are kept (E2B: one envd host per sandbox)


class _DeadlineResponse(PlainHeadResponse):
    """http.client's response, reading from ``reader`` when the connection gives one
    (a deadline-bound reader, or the one a stream's head was peeked from)."""

    def __init__(
        self, sock: Any, *args: Any, reader: io.BufferedReader | None = None, **kwargs: Any
    ) -> None:
        super().__init__(sock if reader is None else _GivenReader(reader), *args, **kwargs)


def _response_reader(sock: socket.socket, scope: CallScope | None) -> io.BufferedReader:
    """The buffered reader a response reads from: deadline-bound while the call has one."""
    if scope is not None and scope.deadline.bounded:
        return io.BufferedReader(DeadlineReader(sock, scope))
    return sock.makefile("rb")


class _GivenReader:
    """What http.client's response needs of a socket: ``makefile``, returning ``reader``."""

    __slots__ = ("_reader",)

    def __init__(self, reader: io.BufferedReader) -> None:
        self._reader = reader

    def makefile(self, mode: str) -> io.BufferedReader:
        return self._reader


class _Connection(SocketFactoryHook, SingleWriteRequest):
    """An HTTP connection that registers its socket with the calling thread's scope."""

    response_class = _DeadlineResponse

    _piship_scope: CallScope | None = None
    _piship_socket: socket.socket | None = None
    _armed: CallScope | None = None  # the scope of the call sending on it directly

    def _call(self) -> CallScope | None:
        """The scope of the call holding this connection: armed with, else the context's."""
        armed = self._armed
        return armed if armed is not None else CURRENT.get()

    def open_socket(self) -> socket.socket:
        scope = self._call()
        if scope is None:
            if is_localhost_name(self.host):
                return _open_socket(self, None)  # never resolved: see loopback_addresses
            return super().open_socket()
        self._leave_scope(scope, close_if_cancelled=False)  # its old socket is closed
        sock = _open_socket(self, scope)
        if isinstance(self, urllib3.connection.HTTPSConnection):
            # The TLS wrapper detaches `sock`; a duplicate descriptor keeps the
            # handshake interruptible until getresponse() registers the TLS socket.
            scope.attach(sock.dup(), owned=True)
        self._piship_scope, self._piship_socket = scope, sock
        return sock

    _piship_method: str | None = None

    def request(self, *args: Any, **kwargs: Any) -> None:
        method = args[0] if args else kwargs.get("method")
        self._piship_method = method if isinstance(method, str) else None
        scope = self._call()
        if scope is not None:
            self._leave_scope(scope, close_if_cancelled=True)
            if self.sock is None:
                self.connect()  # connect first, so `sent` means "past the connect"
            scope.sent = True
        if self.sock is not None:
            self.sock.settimeout(self.timeout)  # as urllib3's request does
        super().request(*args, **kwargs)
        on_sent = ON_SENT.get()
        if on_sent is not None:
            on_sent()

    def getresponse(self) -> urllib3.response.HTTPResponse:  # type: ignore[override]
        scope = self._enter_response_scope()
        sock = self.sock
        if scope is None or not scope.deadline.bounded or not isinstance(sock, socket.socket):
            return super().getresponse()
        return self._answer(_response_reader(sock, scope), None)

    def _answer(
        self, reader: io.BufferedReader, head: PlainHead | None
    ) -> urllib3.response.HTTPResponse:
        """urllib3's response, its http.client response reading from ``reader``."""
        self.response_class = functools.partial(  # type: ignore[assignment]
            _DeadlineResponse, reader=reader, head=head
        )
        try:
            return super().getresponse()
        finally:
            del self.response_class

    def getresponse_streamed(self) -> urllib3.response.HTTPResponse | StreamedResponse:
        """The answer to a stream's request; a :class:`StreamedResponse` when its head
        is plain and its body bare chunks (nothing urllib3's response adds is needed)."""
        scope = self._enter_response_scope()
        sock = self.sock
        if not isinstance(sock, socket.socket):
            return super().getresponse()
        sock.settimeout(self.timeout)  # as urllib3's getresponse does
        reader = _response_reader(sock, scope)
        try:
            head = peek_plain_head(reader, self._piship_method)
        except BaseException:
            reader.close()
            raise
        if head is not None and head.bare_stream:
            self.response_class = functools.partial(  # type: ignore[assignment]
                _DeadlineResponse, reader=reader, head=head
            )
            try:
                return StreamedResponse(http_client_response(self), head, self)
            finally:
                del self.response_class
        return self._answer(reader, head)

    def _enter_response_scope(self) -> CallScope | None:
        """Register the socket the response arrives on with the holding call's scope."""
        scope = self._call()
        sock = self.sock
        if scope is not None and sock is not None:
            remaining = scope.remaining()
            if remaining is not None:
                if remaining <= 0:
                    raise TimeoutError("the deadline passed before the response")
                self.timeout = remaining  # getresponse() applies it to the socket
            if isinstance(sock, socket.socket):
                scope.attach(sock)
                scope.drop_owned()
                scope.socket = sock
                self._piship_scope, self._piship_socket = scope, sock
            # else TLS inside TLS (an HTTPS proxy): the duplicate of the TCP socket
            # registered at connect time stays the one a cancel shuts down.
        return scope

    def _leave_scope(self, current: CallScope, *, close_if_cancelled: bool) -> None:
        """Detach from the scope of the call that used this connection before ``current``."""
        previous = self._piship_scope
        if previous is None or previous is current:
            return
        sock, self._piship_scope, self._piship_socket = self._piship_socket, None, None
        if not previous.detach(sock) and close_if_cancelled:
            self.close()  # a late cancel may have shut the socket down: reconnect


def arm(conn: urllib3.connection.HTTPConnection, scope: CallScope) -> None:
    """Make ``conn`` (taken from its pool) the call's: its sockets registered with ``scope``."""
    if isinstance(conn, _Connection):
        conn._armed = scope


def disarm(conn: urllib3.connection.HTTPConnection, scope: CallScope) -> None:
    """The call's exchange on ``conn`` is over: it no longer takes ``scope``'s sockets."""
    if isinstance(conn, _Connection) and conn._armed is scope:
        conn._armed = None


class _TlsConnection(_Connection, urllib3.connection.HTTPSConnection):
    """The HTTPS variant of :class:`_Connection`."""


def _open_socket(conn: _Connection, scope: CallScope | None) -> socket.socket:
    """Connect like urllib3 does, but with the socket registered before ``connect()``;
    a ``localhost`` name goes to the loopback addresses without a lookup."""
    host = conn.host.strip("[]")
    addresses: list[Any] | None = loopback_addresses(host, conn.port)
    if addresses is None:
        try:
            addresses = socket.getaddrinfo(
                host, conn.port, allowed_gai_family(), socket.SOCK_STREAM
            )
        except socket.gaierror as e:
            raise urllib3.exceptions.NameResolutionError(conn.host, conn, e) from e
    failure: OSError | None = None
    for family, kind, proto, _, address in addresses:
        if scope is not None and scope.cancelled:
            break
        sock = SteadyTimeoutSocket(family, kind, proto)
        try:
            for option in conn.socket_options or ():
                sock.setsockopt(*option)
            sock.settimeout(Timeout.resolve_default_timeout(conn.timeout))
            if conn.source_address:
                sock.bind(conn.source_address)
            if scope is not None:
                scope.attach(sock)
            sock.connect(address)
        except OSError as e:
            if scope is not None:
                scope.detach(sock)
            sock.close()
            failure = e
            continue
        sys.audit("http.client.connect", conn, conn.host, conn.port)
        return sock
    if isinstance(failure, TimeoutError) and failure.errno is None:
        raise urllib3.exceptions.ConnectTimeoutError(conn, "connect timed out") from failure
    raise urllib3.exceptions.NewConnectionError(conn, "connect failed") from failure


class _Pool(urllib3.connectionpool.HTTPConnectionPool):
    ConnectionCls = _Connection


class _TlsPool(urllib3.connectionpool.HTTPSConnectionPool):
    ConnectionCls = _TlsConnection


POOL_CLASSES: dict[str, type[urllib3.connectionpool.HTTPConnectionPool]] = {
    "http": _Pool,
    "https": _TlsPool,
}
