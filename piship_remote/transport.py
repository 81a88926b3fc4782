"""HTTP for the remote backends: one pooled session, endpoint rules, cancellable calls.

A :class:`Transport` is shared by every thread of one backend::

    transport = Transport(redactor=Redactor(), component="sandbox")
    api = transport.endpoint("https://api.example.com/")          # validated, no trailing "/"
    with transport.request("GET", f"{api}/health", timeout=10, cancel=token) as response:
        if response.status != 200:
            raise RuntimeError(response.failure())                # "HTTP 503: <redacted body>"

What it guarantees:

- endpoint rules: no credentials in URLs, plain HTTP only to loopback, redirects never
  followed, TLS verification always on, proxies from the environment honoured;
- connections are pooled and kept alive (a short request costs one round trip), and a
  request is never re-sent automatically (a POST may have created something);
- ``cancel`` (a :class:`~piship_remote.cancel.CancelToken` or a plain ``threading.Event``)
  shuts down the socket of *that* call only, so a connect, a wait for headers or a body
  read ends within milliseconds with :class:`~piship_remote.errors.CommandCancelled`;
- a transport failure is a :class:`TransportError` whose message never carries the
  underlying exception's text (it can contain header values).

How cancellation reaches the socket: while a call runs, the calling thread's current
:class:`_CallScope` lives in a context variable. The pool's connection class registers
its socket with that scope when it connects and again just before it waits for the
response headers; cancelling the scope shuts those sockets down. A connection that
goes back to the pool is first detached from its scope, under the scope's lock, so a
late cancel can never hit a connection another call has since taken from the pool.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import http.client
import io
import ipaddress
import json as jsonlib
import logging
import re
import socket
import ssl
import sys
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack
from types import TracebackType
from typing import Any, TypeVar, cast

import attrs
import requests
import requests.adapters
import urllib3
import urllib3.connection
import urllib3.connectionpool
import urllib3.exceptions
import urllib3.response
from urllib3.util.connection import allowed_gai_family
from urllib3.util.timeout import Timeout

from piship_remote.cancel import CancelToken, EventWatcher, bridge
from piship_remote.errors import (
    CONFIG_INVALID,
    GATEWAY_UNREACHABLE,
    NETWORK_DENIED,
    TLS_POLICY_VIOLATION,
    CommandCancelled,
    PiShipError,
)
from piship_remote.redact import Redactor

__all__ = ["HttpResponse", "Transport", "TransportError"]

# The largest single read of a body: big enough that streaming hundreds of MiB costs
# few Python-level iterations, while read1() still returns whatever has arrived.
_CHUNK = 1024 * 1024
_LOG = logging.getLogger("piship_remote")
_Read = TypeVar("_Read")
# What a non-streamed request reads before returning; a small body (the usual control-
# plane answer) is then complete and its connection already back in the pool.
_EAGER_BYTES = 64 * 1024
# How long finish() waits for the rest of a body (a stream's chunked terminator).
_FINISH_WAIT = 0.25
# The longest chunk-size or trailer line of a chunked body.
_MAX_CHUNK_LINE = 4096
# How much of an error body failure() looks at before cutting it to 300 characters.
_FAILURE_WINDOW = 4096
_FAILURE_CHARS = 300
_WHITESPACE = re.compile(r"\s+")
# requests' header rules: no line breaks, no leading whitespace, no ":" in a name.
_HEADER_NAME = re.compile(r"[^:\s][^:\r\n]*\Z")
_HEADER_VALUE = re.compile(r"\S[^\r\n]*\Z|\Z")
_SYSTEM_CODE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
_GAI_NAMES = {
    value: name
    for name, value in vars(socket).items()
    if name.startswith("EAI_") and isinstance(value, int)
}
_DEFAULT_PORTS = {"http": 80, "https": 443}
_SETTINGS_CACHE = 256  # URLs and origins whose checks and settings are remembered
_HOSTS = 32  # hosts whose idle connections are kept (E2B: one envd host per sandbox)
_IPV6_LOOPBACK = ipaddress.IPv6Address("::1")

# Transport-level failures a call can end with; anything else (a bug, a bad argument)
# propagates unchanged. requests' exceptions all derive from OSError.
_NETWORK_ERRORS = (OSError, urllib3.exceptions.HTTPError, http.client.HTTPException)
_TIMEOUT_ERRORS = (
    requests.Timeout,
    urllib3.exceptions.ReadTimeoutError,
    urllib3.exceptions.ConnectTimeoutError,
)


class TransportError(PiShipError):
    """A request that failed below HTTP: refused, reset, dropped, or past its deadline.

    Code ``GATEWAY_UNREACHABLE``, retryable. ``request_sent`` is ``False`` only when the
    request certainly never reached the server (name resolution or connect failed), so
    a caller may safely resend even a POST::

        except TransportError as e:
            if not e.request_sent:
                ...  # nothing was created remotely
    """

    request_sent: bool

    def __init__(self, message: str, *, request_sent: bool, component: str) -> None:
        super().__init__(GATEWAY_UNREACHABLE, message, retryable=True, component=component)
        self.request_sent = request_sent


class _CallScope:
    """The sockets one call uses; :meth:`cancel` shuts them all down at once."""

    __slots__ = ("_lock", "_owned", "_sockets", "cancelled", "deadline", "sent", "socket")

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline
        self.cancelled = False
        self.sent = False  # the request may have reached the server
        self.socket: socket.socket | None = None  # the one the response arrives on
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._owned: list[socket.socket] = []

    def remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def attach(self, sock: socket.socket, *, owned: bool = False) -> None:
        """Track ``sock``; shut it down at once if the call is already cancelled."""
        with self._lock:
            if owned:
                self._owned.append(sock)
            if not any(s is sock for s in self._sockets):
                self._sockets.append(sock)
            if self.cancelled:
                _shut(sock)

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
                _shut(sock)

    def release(self) -> None:
        """Forget every socket: a later cancel touches nothing."""
        self.drop_owned()
        with self._lock:
            self._sockets = []


def _shut(sock: socket.socket) -> None:
    # socket.socket.shutdown, not SSLSocket.shutdown: the latter also drops the TLS
    # object under a reader that may still be using it. OSError: already closed.
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


# The scope of the call the current thread is making (set only while it makes it).
_CURRENT: contextvars.ContextVar[_CallScope | None] = contextvars.ContextVar(
    "piship_transport_call", default=None
)


class _Connection(urllib3.connection.HTTPConnection):
    """An HTTP connection that registers its socket with the calling thread's scope."""

    _piship_scope: _CallScope | None = None
    _piship_socket: socket.socket | None = None

    def _new_conn(self) -> socket.socket:
        scope = _CURRENT.get()
        if scope is None:
            return super()._new_conn()
        sock = _open_socket(self, scope)
        if isinstance(self, urllib3.connection.HTTPSConnection):
            # The TLS wrapper detaches `sock`; a duplicate descriptor keeps the
            # handshake interruptible until getresponse() registers the TLS socket.
            scope.attach(sock.dup(), owned=True)
        self._piship_scope, self._piship_socket = scope, sock
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        scope = _CURRENT.get()
        if scope is not None:
            if self.sock is None:
                self.connect()  # connect first, so `sent` means "past the connect"
            scope.sent = True
        super().request(*args, **kwargs)

    def getresponse(self) -> urllib3.response.HTTPResponse:  # type: ignore[override]
        scope = _CURRENT.get()
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
        return super().getresponse()

    def disown(self) -> None:
        """Detach from the call's scope before going back to the pool (closed if cancelled)."""
        scope, self._piship_scope = self._piship_scope, None
        sock, self._piship_socket = self._piship_socket, None
        if scope is not None and not scope.detach(sock):
            self.close()


class _TlsConnection(_Connection, urllib3.connection.HTTPSConnection):
    """The HTTPS variant of :class:`_Connection`."""


def _open_socket(conn: _Connection, scope: _CallScope) -> socket.socket:
    """Connect like urllib3 does, but with the socket registered before ``connect()``."""
    host = conn.host.strip("[]")
    try:
        addresses = socket.getaddrinfo(host, conn.port, allowed_gai_family(), socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise urllib3.exceptions.NameResolutionError(conn.host, conn, e) from e
    failure: OSError | None = None
    for family, kind, proto, _, address in addresses:
        if scope.cancelled:
            break
        sock = socket.socket(family, kind, proto)
        try:
            for option in conn.socket_options or ():
                sock.setsockopt(*option)
            sock.settimeout(Timeout.resolve_default_timeout(conn.timeout))
            if conn.source_address:
                sock.bind(conn.source_address)
            scope.attach(sock)
            sock.connect(address)
        except OSError as e:
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

    def _put_conn(self, conn: Any) -> None:
        if isinstance(conn, _Connection):
            conn.disown()
        super()._put_conn(conn)


class _TlsPool(urllib3.connectionpool.HTTPSConnectionPool):
    ConnectionCls = _TlsConnection

    def _put_conn(self, conn: Any) -> None:
        if isinstance(conn, _Connection):
            conn.disown()
        super()._put_conn(conn)


_POOL_CLASSES: dict[str, type[urllib3.connectionpool.HTTPConnectionPool]] = {
    "http": _Pool,
    "https": _TlsPool,
}


# Pools their pool manager has let go of (more than _HOSTS hosts, or cleared). urllib3 2
# no longer closes them (another thread may be using one), so a Transport that
# remembers a pool per origin asks here whether it must look the origin up again.
_RETIRED: weakref.WeakSet[urllib3.connectionpool.ConnectionPool] = weakref.WeakSet()


class _CancellableAdapter(requests.adapters.HTTPAdapter):
    """An adapter whose pools use the scope-aware connection classes.

    Its pool managers record the pools they drop in :data:`_RETIRED`.
    """

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(_POOL_CLASSES)
        _record_retired(self.poolmanager)

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> urllib3.PoolManager:
        manager: urllib3.PoolManager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if not proxy.lower().startswith("socks"):
            manager.pool_classes_by_scheme = dict(_POOL_CLASSES)
        _record_retired(manager)
        return manager


def _record_retired(manager: urllib3.PoolManager) -> None:
    """Make a new, still empty ``manager`` add the pools it evicts to :data:`_RETIRED`."""
    pools = manager.pools
    if getattr(pools, "dispose_func", False) is None and not len(pools):
        manager.pools = type(pools)(getattr(pools, "_maxsize", _HOSTS), _RETIRED.add)


def _no_auth(request: requests.PreparedRequest) -> requests.PreparedRequest:
    # Passed as `auth` so that requests neither reads ~/.netrc nor applies a session's
    # auth: the only credential sent is the one the caller put in the headers.
    return request


class _Call:
    """One request's cancellation scope, deadline and the cleanup that ends it."""

    __slots__ = ("_cleanup", "idle_timeout", "label", "origin", "scope", "stream", "transport")

    def __init__(
        self,
        transport: Transport,
        target: tuple[str, str],
        deadline: float | None,
        stream: bool,
        idle_timeout: float | None,
    ) -> None:
        self.transport = transport
        self.label, self.origin = target  # host[:port] for messages, scheme://netloc
        self.scope = _CallScope(deadline)
        self.stream = stream
        self.idle_timeout = idle_timeout
        self._cleanup: ExitStack | None = None

    def watch(self, cancel: threading.Event, watcher: EventWatcher) -> None:
        stack = self._cleanup = ExitStack()
        token = (
            cancel
            if isinstance(cancel, CancelToken)
            else stack.enter_context(bridge(cancel, watcher))
        )
        stack.callback(token.on_cancel(self.scope.cancel))

    def finish(self) -> None:
        """Stop listening for cancellation and forget the sockets (idempotent)."""
        self.scope.release()
        stack, self._cleanup = self._cleanup, None
        if stack is not None:
            stack.close()

    def error(self, exc: BaseException) -> BaseException:
        """The exception to raise for ``exc``: cancelled, timed out, failed, or ``exc``."""
        if self.scope.cancelled and isinstance(exc, _NETWORK_ERRORS):
            return CommandCancelled()
        if isinstance(exc, ValueError) or not isinstance(exc, _NETWORK_ERRORS):
            return exc  # a bad argument or a bug, not a network failure
        return self.failed("timed out" if _timed_out(exc) else f"failed: {_failure_code(exc)}")

    def failed(self, outcome: str) -> TransportError:
        component = self.transport.component
        return TransportError(
            f"{component} request to {self.label} {outcome}",
            request_sent=self.scope.sent,
            component=component,
        )


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception it wraps (causes, contexts, urllib3 reasons, args)."""
    seen: set[int] = set()
    pending = [exc]
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        linked = (current.__cause__, current.__context__, getattr(current, "reason", None))
        pending.extend(e for e in (*linked, *current.args) if isinstance(e, BaseException))


def _timed_out(exc: BaseException) -> bool:
    for e in _chain(exc):
        if isinstance(e, urllib3.exceptions.NewConnectionError):
            continue  # derives from ConnectTimeoutError, but is a refusal
        if isinstance(e, TimeoutError) and e.errno is None:
            return True  # a socket timeout, i.e. our deadline or idle limit
        if isinstance(e, _TIMEOUT_ERRORS):
            return True
    return False


def window_text(body: bytes, limit: int) -> str:
    """``body`` decoded; when it fills a ``limit``-byte read window, without its last word.

    The window may cut a secret in two, and a cut secret no longer matches the
    redactor: the word the cut runs through is dropped before redaction.
    """
    text = body.decode("utf-8", "replace")
    if len(body) < limit or text[-1:].isspace():
        return text
    words = text.rsplit(None, 1)
    return words[0] if len(words) == 2 else ""


def _failure_code(exc: BaseException) -> str:
    """The first system error name in the chain (``ECONNREFUSED``), else ``network error``.

    A TLS failure is named by OpenSSL's reason (``CERTIFICATE_VERIFY_FAILED``): its
    ``errno`` is an OpenSSL error class, not a system error.
    """
    for e in _chain(exc):
        name: str | None
        if isinstance(e, ssl.SSLError):
            name = e.reason if isinstance(e.reason, str) else None
        elif isinstance(e, socket.gaierror):
            name = _GAI_NAMES.get(e.errno) if isinstance(e.errno, int) else None
        elif isinstance(e, OSError) and isinstance(e.errno, int):
            name = errno.errorcode.get(e.errno)
        else:
            continue
        if name is not None and _SYSTEM_CODE.fullmatch(name):
            return name
    return "network error"


class HttpResponse:
    """A response whose body is read on demand, under the call's cancel and limits.

    Use it as a context manager, or call :meth:`close`; :meth:`json_object`,
    :meth:`failure` and a finished :meth:`iter_raw` close it themselves::

        response = transport.request("POST", url, json=body, stream=True, cancel=token)
        if response.status != 200:
            raise RuntimeError(response.failure())
        for chunk in response.iter_raw():
            reader.push(chunk)
    """

    status: int
    headers: Mapping[str, str]

    def __init__(self, raw: urllib3.response.HTTPResponse, call: _Call) -> None:
        self.status = raw.status
        self.headers = raw.headers
        self._raw = raw
        self._call = call
        self._buffer = bytearray()
        self._done = False
        self._body: _Dechunker | None = None
        encoding = self.headers.get("content-encoding", "").strip().lower()
        self._decode = encoding not in ("", "identity")
        if call.stream:
            self._set_socket_timeout(call.idle_timeout)

    def __enter__(self) -> HttpResponse:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def json_object(self, max_bytes: int = 1 << 20) -> dict[str, Any]:
        """Read and parse the body as a JSON object of at most ``max_bytes`` bytes.

        Raises ``ValueError`` (``the response is too large``, ``... is not JSON``,
        ``... is not a JSON object``), :class:`TransportError` or ``CommandCancelled``.
        """
        try:
            body = self._read_upto(max_bytes + 1)
        finally:
            self.close()
        if len(body) > max_bytes:
            raise ValueError("the response is too large")
        try:
            value = jsonlib.loads(body)
        except ValueError:
            raise ValueError("the response is not JSON") from None
        if not isinstance(value, dict):
            raise ValueError("the response is not a JSON object")
        return value

    def failure(self) -> str:
        """``HTTP <status>``, plus ``: <start of the body>`` (one line, redacted) if any."""
        try:
            body = self._read_upto(_FAILURE_WINDOW)
        except TransportError:
            body = bytes(self._buffer)
        finally:
            self.close()
        text = _WHITESPACE.sub(" ", window_text(body, _FAILURE_WINDOW)).strip()
        # Redacted before cutting, so a secret across the cut cannot leak its start.
        detail = self._call_redactor().redact(text)[:_FAILURE_CHARS].strip()
        return f"HTTP {self.status}: {detail}" if detail else f"HTTP {self.status}"

    def iter_raw(self) -> Iterator[bytes | memoryview]:
        """The body's bytes as they arrive (each chunk at most 1 MiB).

        Raises ``CommandCancelled`` when the call's cancel fires and
        :class:`TransportError` on a drop, a passed deadline or ``idle_timeout``.
        """
        if self._buffer:
            chunk = bytes(self._buffer)
            self._buffer.clear()
            yield chunk
        body = self._chunked_body()
        if body is not None:
            yield from self._iter_chunked(body)
            return
        while not self._done:
            chunk = self._read(_CHUNK)
            if chunk:
                yield chunk

    def finish(self, limit: int = _EAGER_BYTES, wait: float = _FINISH_WAIT) -> None:
        """Read what is left of the body (the chunked terminator after a stream's last
        frame) so the connection goes back to the pool, then close.

        Only up to ``limit`` bytes arriving within ``wait`` seconds are read; a body
        that does not end by then costs its connection, nothing more.
        """
        try:
            if not self._done and not self._call.scope.cancelled:
                self._set_socket_timeout(wait)
                read = 0
                for chunk in self.iter_raw():
                    read += len(chunk)
                    if read > limit:
                        break
        except (PiShipError, CommandCancelled):
            pass  # the connection is spent; close() below releases it
        finally:
            self.close()

    def _chunked_body(self) -> _Dechunker | None:
        """A de-chunker reading a stream's body directly, if the response allows it.

        http.client reads one chunk per call and at most one chunk's rest per read1;
        reading the connection's buffered reader directly takes everything that has
        arrived (many 32 KiB frames) in one read.
        """
        if self._body is not None:
            return self._body
        if not self._call.stream or self._decode or self._done:
            return None
        inner = getattr(self._raw, "_fp", None)
        if not isinstance(inner, http.client.HTTPResponse) or not inner.chunked:
            return None
        fp = inner.fp
        if inner.chunk_left is not None or not isinstance(fp, io.BufferedReader):
            return None  # reading already began through http.client
        self._body = _Dechunker(inner, fp)
        return self._body

    def _iter_chunked(self, body: _Dechunker) -> Iterator[bytes | memoryview]:
        call = self._call
        while not self._done:
            self._check_cancelled()
            pieces = self._guarded_read(lambda n: body.feed(body.fp.read1(n)), _CHUNK)
            if body.done:
                self._done = True
                if body.finish():
                    self._raw.close()  # bytes after the body: the connection is unusable
                self._raw.release_conn()
                call.finish()
            yield from pieces

    def close(self) -> None:
        """Release the connection (back to the pool only if the body was fully read)."""
        if not self._done:
            self._done = True
            self._raw.close()  # the body was not read to the end: the connection is spent
            self._raw.release_conn()
        self._call.finish()

    def _call_redactor(self) -> Redactor:
        return self._call.transport.redactor

    def _read_upto(self, size: int) -> bytes:
        while len(self._buffer) < size and not self._done:
            self._buffer += self._read(min(_CHUNK, size - len(self._buffer)))
        return bytes(self._buffer[:size])

    def _read(self, size: int) -> bytes:
        """One read of up to ``size`` bytes: whatever has arrived, ``b""`` at the end."""
        call = self._call
        self._check_cancelled()
        if not call.stream and call.scope.deadline is not None:
            remaining = call.scope.remaining()
            if remaining is None or remaining <= 0:
                self.close()
                raise call.failed("timed out")
            self._set_socket_timeout(remaining)
        data = self._guarded_read(lambda n: self._raw.read1(n, decode_content=self._decode), size)
        if not data:
            self._done = True
            self._raw.release_conn()
            call.finish()
        return data

    def _check_cancelled(self) -> None:
        if self._call.scope.cancelled:
            self.close()
            raise CommandCancelled()

    def _guarded_read(self, read: Callable[[int], _Read], size: int) -> _Read:
        """``read(size)``, its failure mapped to our errors, then the cancel checked."""
        try:
            data = read(size)
        except BaseException as exc:
            self.close()
            mapped = self._call.error(exc)
            if mapped is exc:
                raise
            raise mapped from None
        self._check_cancelled()  # a shut-down socket can look like a clean end
        return data

    def _set_socket_timeout(self, timeout: float | None) -> None:
        sock = self._call.scope.socket
        if sock is not None:
            with contextlib.suppress(OSError):  # already closed: the next read reports it
                sock.settimeout(timeout)


class _Dechunker:
    """A chunked HTTP body (RFC 9112 §7.1) decoded from reads of any size.

    :meth:`feed` returns views of the chunk data in what was read (no copy);
    ``done`` once the last chunk and its trailer section were read. Malformed
    framing or an early end raises ``urllib3.exceptions.ProtocolError``.
    """

    __slots__ = ("_extra", "_inner", "_left", "_line", "_state", "done", "fp")

    _SIZE, _DATA, _CRLF, _TRAILER = range(4)

    def __init__(self, inner: http.client.HTTPResponse, fp: io.BufferedReader) -> None:
        self.fp = fp
        self.done = False
        self._inner = inner
        self._state = self._SIZE
        self._left = 0
        self._line = bytearray()
        self._extra = False

    def feed(self, data: bytes) -> list[memoryview]:
        if not data:
            raise urllib3.exceptions.ProtocolError("the chunked body ended early")
        view = memoryview(data)
        pieces: list[memoryview] = []
        position, size = 0, len(data)
        while position < size and not self.done:
            if self._state == self._DATA:
                end = min(position + self._left, size)
                pieces.append(view[position:end])
                self._left -= end - position
                position = end
                if not self._left:
                    self._state = self._CRLF
                continue
            newline = data.find(b"\n", position)
            if newline < 0:
                self._line += view[position:]
                if len(self._line) > _MAX_CHUNK_LINE:
                    raise urllib3.exceptions.ProtocolError("a chunk line is too long")
                break
            line = bytes(self._line) + data[position : newline + 1]
            self._line.clear()
            position = newline + 1
            self._on_line(line)
        self._extra = self.done and position < size
        return pieces

    def finish(self) -> bool:
        """Mark http.client's response closed (its connection is free); ``True`` if
        the connection must not be reused (bytes followed the body, or the server
        said it closes the connection)."""
        self._inner.close()
        return self._extra or bool(self._inner.will_close)

    def _on_line(self, line: bytes) -> None:
        text = line.rstrip(b"\r\n")
        if self._state == self._CRLF:
            if text:
                raise urllib3.exceptions.ProtocolError("a chunk did not end with CRLF")
            self._state = self._SIZE
        elif self._state == self._TRAILER:
            self.done = not text
        else:
            try:
                size = int(text.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise urllib3.exceptions.ProtocolError("a chunk size is not valid") from None
            if size < 0:
                raise urllib3.exceptions.ProtocolError("a chunk size is not valid")
            self._left = size
            self._state = self._DATA if size else self._TRAILER


class Transport:
    """The HTTP client of one backend: a pooled session shared by all its threads."""

    def __init__(
        self,
        *,
        redactor: Redactor,
        component: str = "sandbox",
        session: requests.Session | None = None,
        pool_size: int = 64,
    ) -> None:
        self.redactor = redactor
        self.component = component
        self._owns_session = session is None
        self._session = session if session is not None else requests.Session()
        verify = self._session.verify
        if verify is False:
            raise PiShipError(
                TLS_POLICY_VIOLATION,
                "Refusing a requests.Session with TLS verification disabled",
                component=component,
            )
        # A CA bundle path configured on the given session is kept; never False.
        self._verify: bool | str = verify if isinstance(verify, str) else True
        self._adapter = _CancellableAdapter(
            pool_connections=_HOSTS, pool_maxsize=pool_size, pool_block=False, max_retries=0
        )
        self._session.mount("http://", self._adapter)
        self._session.mount("https://", self._adapter)
        self._watcher = EventWatcher()
        self._targets: dict[str, _Target] = {}
        self._routes: dict[str, _Route] = {}

    def endpoint(self, url: str) -> str:
        """``url`` checked against the endpoint rules, without trailing slashes.

        Raises ``PiShipError`` ``CONFIG_INVALID`` (credentials in the URL, no host) or
        ``NETWORK_DENIED`` (plain HTTP to a non-loopback host, another scheme).
        """
        _check_url(url)
        return url.rstrip("/")

    def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        json: Any = None,
        data: bytes | None = None,
        timeout: float | None = 30.0,
        cancel: threading.Event | None = None,
        stream: bool = False,
        idle_timeout: float | None = None,
    ) -> HttpResponse:
        """Send one request; never retried, never redirected.

        ``timeout`` bounds the whole call (headers, and the body unless ``stream``);
        ``None`` means no deadline. ``idle_timeout`` bounds the silence between body
        bytes of a stream. ``cancel`` set before or during the call raises
        ``CommandCancelled``. ``json`` is sent compact (``{"a":1}``).
        """
        target = self._target(url)
        if cancel is not None and cancel.is_set():
            raise CommandCancelled()
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        call = _Call(self, (target.label, target.origin), deadline, stream, idle_timeout)
        try:
            if cancel is not None:
                call.watch(cancel, self._watcher)
            response = self._send(method, target, headers, json, data, call)
        except BaseException as exc:
            call.finish()
            mapped = call.error(exc)
            self._log(method, url, type(mapped).__name__, started)
            if mapped is exc:
                raise
            raise mapped from None
        self._log(method, url, response.status, started)
        result = HttpResponse(response, call)
        if call.scope.cancelled:
            result.close()
            raise CommandCancelled()
        if not stream:
            try:
                result._read_upto(_EAGER_BYTES)
            except BaseException:
                result.close()
                raise
        return result

    def _log(self, method: str, url: str, outcome: object, started: float) -> None:
        """One DEBUG line per request: method, path (redacted), outcome, time taken."""
        if _LOG.isEnabledFor(logging.DEBUG):
            elapsed = (time.monotonic() - started) * 1000
            path = self.redactor.redact(urllib.parse.urlsplit(url).path)
            _LOG.debug("%s %s %s -> %s in %.1f ms", self.component, method, path, outcome, elapsed)

    def close(self) -> None:
        """Close the pooled connections (and the session if this transport made it)."""
        self._watcher.close()
        if self._owns_session:
            self._session.close()
        else:
            self._adapter.close()
        self._routes.clear()

    def _send(
        self,
        method: str,
        target: _Target,
        headers: Mapping[str, str] | None,
        json: Any,
        data: bytes | None,
        call: _Call,
    ) -> urllib3.response.HTTPResponse:
        all_headers = dict(headers) if headers else {}
        if json is not None:
            data = jsonlib.dumps(json, separators=(",", ":"), ensure_ascii=False).encode()
            if not any(name.lower() == "content-type" for name in all_headers):
                all_headers["Content-Type"] = "application/json"
        method = method.upper()
        try:
            outgoing = self._outgoing(method, target, all_headers, data)
        except requests.exceptions.InvalidHeader:
            # requests' message quotes the value, which may be a credential.
            raise PiShipError(
                CONFIG_INVALID,
                "A request header value is not valid (line breaks or surrounding whitespace)",
                component=self.component,
            ) from None
        remaining = call.scope.remaining()
        if remaining is not None and remaining <= 0:
            raise TimeoutError("the deadline passed before the request")
        token = _CURRENT.set(call.scope)
        try:
            return self._open(outgoing, self._route(target), remaining)
        finally:
            _CURRENT.reset(token)

    def _target(self, url: str) -> _Target:
        """``url`` checked against the endpoint rules and normalised, remembered per URL."""
        target = self._targets.get(url)
        if target is None:
            label, origin = _check_url(url)
            probe = requests.PreparedRequest()
            probe.prepare_url(url, None)  # requests' normal form: IDNA, quoting
            normal = probe.url or url
            target = _Target(label, origin, normal, _request_path(probe))
            if len(self._targets) >= _SETTINGS_CACHE:
                self._targets.clear()
            self._targets[url] = target
        return target

    def _outgoing(
        self, method: str, target: _Target, headers: dict[str, str], data: bytes | None
    ) -> _Outgoing:
        """The request as the session would prepare it, without its per-call costs.

        A session with cookies, default query parameters or response hooks prepares
        it itself (cookies are sent, parameters added).
        """
        session = self._session
        if session.cookies or session.params or any(session.hooks.values()):
            prepared = session.prepare_request(
                requests.Request(method, target.url, headers=headers, data=data, auth=_no_auth)
            )
            return _Outgoing(method, prepared.url or target.url, prepared.headers, data, prepared)
        merged: dict[str, str | bytes] = {}
        names: dict[str, str] = {}  # lower-case name -> the spelling in `merged`
        for source in (session.headers, headers):
            for name, value in source.items():
                key = name.lower()
                previous = names.pop(key, None)
                if previous is not None:
                    del merged[previous]  # replaced whatever its case
                if value is None:
                    continue  # requests' way of removing a header
                _check_header(name, value)
                merged[name] = value
                names[key] = name
        if data is not None:
            merged["Content-Length"] = str(len(data))
        elif method not in ("GET", "HEAD"):
            merged["Content-Length"] = "0"
        return _Outgoing(method, target.url, merged, data, None, target.path)

    def _route(self, target: _Target) -> _Route:
        """How requests to ``target``'s origin are sent, remembered per origin.

        requests derives proxies, CA bundle and client certificate from the environment,
        finds the pool and checks the CA bundle on every call, which costs more than the
        rest of a kept-alive request; here that happens once per origin (and again when
        the pool manager has closed the pool).
        """
        route = self._routes.get(target.origin)
        if route is not None and route.current():
            return route
        settings: dict[str, Any] = dict(
            self._session.merge_environment_settings(target.url, {}, True, self._verify, None)
        )
        pool: urllib3.connectionpool.HTTPConnectionPool | None = None
        absolute = False
        if self._session.get_adapter(target.url) is self._adapter:
            probe = requests.PreparedRequest()
            probe.url = target.url
            proxies, verify, cert = settings["proxies"], settings["verify"], settings["cert"]
            found = self._adapter.get_connection_with_tls_context(
                probe, verify, proxies=proxies, cert=cert
            )
            assert isinstance(found, urllib3.connectionpool.HTTPConnectionPool)
            pool = found
            self._adapter.cert_verify(pool, target.url, verify, cert)  # type: ignore[no-untyped-call]
            absolute = _via_http_proxy(target, proxies)
        route = _Route(settings, pool, absolute)
        if len(self._routes) >= _SETTINGS_CACHE:
            self._routes.clear()
        self._routes[target.origin] = route
        return route

    def _open(
        self, outgoing: _Outgoing, route: _Route, remaining: float | None
    ) -> urllib3.response.HTTPResponse:
        """What ``HTTPAdapter.send`` does, minus building a ``requests.Response``."""
        pool = route.pool
        if pool is None:  # an adapter the caller mounted on the session: it sends
            response = self._session.send(
                outgoing.prepared(),
                timeout=(remaining, remaining),
                allow_redirects=False,
                **route.settings,
            )
            raw: urllib3.response.HTTPResponse = response.raw
            return raw
        opened = pool.urlopen(
            method=outgoing.method,
            url=outgoing.url_for(absolute=route.absolute),
            body=outgoing.body,
            headers=outgoing.headers,  # type: ignore[arg-type]
            redirect=False,
            assert_same_host=False,
            preload_content=False,
            decode_content=False,
            retries=self._adapter.max_retries,
            timeout=Timeout(connect=remaining, read=remaining),
            chunked=False,
        )
        assert isinstance(opened, urllib3.response.HTTPResponse)
        if "set-cookie" in opened.headers:
            requests.cookies.extract_cookies_to_jar(  # type: ignore[no-untyped-call]
                self._session.cookies, outgoing.prepared(), opened
            )
        return opened


@attrs.frozen
class _Target:
    """One request URL as checked and normalised: what :class:`Transport` remembers."""

    label: str  # host[:port], for messages
    origin: str  # scheme://netloc, lower case
    url: str  # requests' normal form
    path: str  # what goes on the request line without a proxy


@attrs.frozen
class _Route:
    """How requests to one origin are sent: the session's settings for it, and its pool.

    ``pool`` is ``None`` when the session routes the origin to an adapter of its own.
    ``absolute``: the request line carries the whole URL (a plain-HTTP proxy).
    """

    settings: dict[str, Any]
    pool: urllib3.connectionpool.HTTPConnectionPool | None
    absolute: bool

    def current(self) -> bool:
        """Whether the pool is still open and its manager's (else: look the origin up again)."""
        pool = self.pool
        return pool is None or (pool.pool is not None and pool not in _RETIRED)


class _Outgoing:
    """A request ready to send: method, URL, merged and checked headers, body."""

    __slots__ = ("_path", "_prepared", "body", "headers", "method", "url")

    def __init__(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str | bytes],
        body: bytes | None,
        prepared: requests.PreparedRequest | None,
        path: str | None = None,
    ) -> None:
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
        self._prepared = prepared
        self._path = path

    def url_for(self, *, absolute: bool) -> str:
        """The request line's target: the whole URL for a plain-HTTP proxy, else the path."""
        if absolute:
            return str(requests.utils.urldefragauth(self.url))
        if self._path is None:
            self._path = _request_path(self.prepared())
        return self._path

    def prepared(self) -> requests.PreparedRequest:
        """A ``requests.PreparedRequest`` of this request (cookies, custom adapters)."""
        if self._prepared is None:
            prepared = requests.PreparedRequest()
            prepared.method = self.method
            prepared.url = self.url
            headers: requests.structures.CaseInsensitiveDict[str | bytes]
            headers = requests.structures.CaseInsensitiveDict(self.headers)
            prepared.headers = headers  # type: ignore[assignment]
            prepared.body = self.body
            prepared.hooks = requests.hooks.default_hooks()
            self._prepared = prepared
        return self._prepared


def _request_path(prepared: requests.PreparedRequest) -> str:
    """The request line's path; a leading ``//`` collapsed, as requests does, so urllib3
    does not read it as a host."""
    path = prepared.path_url
    return f"/{path.lstrip('/')}" if path.startswith("//") else path


def _via_http_proxy(target: _Target, proxies: Mapping[str, str] | None) -> bool:
    """Whether requests to ``target`` go through a plain-HTTP proxy (``request_url``'s rule)."""
    proxy = requests.utils.select_proxy(target.url, proxies)
    if not proxy or target.origin.startswith("https:"):
        return False
    return not urllib.parse.urlsplit(proxy).scheme.lower().startswith("socks")


def _check_header(name: object, value: object) -> None:
    """requests' header rules (no line breaks, no surrounding whitespace); ``InvalidHeader``."""
    if isinstance(name, str) and isinstance(value, str):
        if _HEADER_NAME.match(name) and _HEADER_VALUE.match(value):
            return
        raise requests.exceptions.InvalidHeader("invalid header")
    requests.utils.check_header_validity(cast("tuple[str, str]", (name, value)))


def _check_url(url: str) -> tuple[str, str]:
    """Apply the endpoint rules to ``url``; returns ``host[:port]`` and the origin."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        raise PiShipError(CONFIG_INVALID, "Endpoint URL is not a valid URL") from None
    if parts.username is not None or parts.password is not None:
        raise PiShipError(CONFIG_INVALID, "Endpoint URLs must not embed credentials")
    scheme = parts.scheme.lower()
    host = parts.hostname or ""
    shown = f"[{host}]" if ":" in host else host
    if port is not None and port != _DEFAULT_PORTS.get(scheme):
        shown = f"{shown}:{port}"
    if scheme != "https" and not (scheme == "http" and _is_loopback(host)):
        raise PiShipError(
            NETWORK_DENIED,
            f"Refusing non-HTTPS endpoint {scheme}://{shown}; "
            "plain HTTP is only allowed for loopback test fixtures",
        )
    if not host:
        raise PiShipError(CONFIG_INVALID, "Endpoint URL has no host")
    return shown, f"{scheme}://{parts.netloc.lower()}"


def _is_loopback(host: str) -> bool:
    """``localhost``, ``127.0.0.0/8`` or ``::1``."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv4Address):
        return address.is_loopback
    return address == _IPV6_LOOPBACK
