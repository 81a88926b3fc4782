"""Pooled connections that register their sockets with the scope of the call holding them.

The scope is given explicitly by
:func:`~piship_remote.transport._urllib3_internals.send_direct`; on the proxy path,
where urllib3's ``urlopen`` takes the connection, it comes through the context
variable :data:`~piship_remote.transport._scope.CURRENT`. A connection registers its
socket when it connects (before ``connect()``, so a cancel interrupts a hanging
connect) and again just before it waits for the response headers. Taken from the pool
by another call, it first leaves the previous call's scope; if that call was cancelled
meanwhile (its cancel may have shut the socket down) the connection is closed and
reopened.

A stream's answer is looked at before urllib3 wraps it (``getresponse_streamed``): a
plain head over a bare chunked body becomes a
:class:`~piship_remote.transport._streamed_response.StreamedResponse`.
"""

from __future__ import annotations

import functools
import io
import socket
import sys
from typing import Any

import urllib3
import urllib3.connection
import urllib3.connectionpool
import urllib3.exceptions
import urllib3.response
from urllib3.util.connection import allowed_gai_family
from urllib3.util.timeout import Timeout

from piship_remote.transport._response_head import PlainHead, peek_plain_head
from piship_remote.transport._scope import CURRENT, ON_SENT, CallScope, DeadlineReader
from piship_remote.transport._steady_socket import SteadyTimeoutSocket
from piship_remote.transport._streamed_response import StreamedResponse
from piship_remote.transport._urllib3_internals import (
    PlainHeadResponse,
    SingleWriteRequest,
    SocketFactoryHook,
    http_client_response,
)
from piship_remote.transport.endpoint import is_localhost_name, loopback_addresses

__all__ = ["HOSTS", "POOL_CLASSES"]

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

    def _call(self) -> CallScope | None:
        """The scope of the call holding this connection: given, else the context's."""
        given: CallScope | None = self.call_scope
        return given if given is not None else CURRENT.get()

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
