"""A threaded loopback HTTP server that records every request on arrival, with werkzeug handlers.

The base of the test doubles. One handler function answers every request; the
server records ``Recorded(method, path, headers, body)`` under a lock *before*
the handler runs, so a request that hangs, is gated or is dropped is already
visible::

    def handler(request: Request) -> Response:
        if request.path == "/hang":
            server.wait()                      # until close(); then the client sees a drop
        return json_response(200, {"ok": True})

    with RecordingServer(handler) as server:
        requests.get(server.url + "/ping?x=1", timeout=5)
        assert server.requests[0].path == "/ping?x=1"

Handlers may stream (:meth:`RecordingServer.stream`, one flushed HTTP chunk per
item), wait on events that :meth:`RecordingServer.close` releases
(:meth:`RecordingServer.wait`), and drop the connection without answering
(raise :class:`DropConnection`). ``close()`` releases every waiting handler,
force-closes every open connection and returns within a few tens of milliseconds.

The server is :class:`piship_remote._http_server.server.HttpServer` (the local service's
too); handlers see werkzeug ``Request`` objects and answer werkzeug ``Response``
objects. Each connection is closed after its answer. The server thread and every
connection thread are daemons named ``piship-double-…``.
"""

from __future__ import annotations

import io
import json
import logging
import ssl
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import unquote_to_bytes, urlsplit

from piship_remote._http_server.server import (
    DropConnection,
    HttpServer,
    Recorded,
    Reply,
    Tunnel,
)
from piship_remote._http_server.server import Request as RawRequest

try:
    from werkzeug import Request, Response
except ModuleNotFoundError as missing:  # pragma: no cover - exercised by a simulated import
    raise ImportError(
        "the piship_remote test doubles need werkzeug: pip install 'piship-remote[test]'",
        name=missing.name,
    ) from missing

__all__ = [
    "CLIENT_SUBJECT",
    "THREAD_PREFIX",
    "DropConnection",
    "Handler",
    "Recorded",
    "RecordingServer",
    "json_response",
]

CLIENT_SUBJECT = "piship.client_subject"
"""The WSGI key holding the verified client certificate's common name (or ``None``)."""

THREAD_PREFIX = "piship-double-"
"""Name prefix of every thread the doubles start (exclude it from leak checks)."""

Handler = Callable[[Request], Response]

_LOG = logging.getLogger("piship_remote.testing")
_CLOSE_JOIN_BUDGET = 0.05
_FRAMING = frozenset({"connection", "transfer-encoding"})


def json_response(status: int, body: Any, *, content_type: str = "application/json") -> Response:
    """A response with ``body`` as compact JSON (``bytes``/``str`` bodies are sent as they are)."""
    if isinstance(body, bytes | str):
        data = body.encode() if isinstance(body, str) else body
    else:
        data = json.dumps(body, separators=(",", ":")).encode()
    return Response(data, status=status, content_type=content_type)


class RecordingServer(HttpServer):
    """A started recording server on ``127.0.0.1``; a context manager that closes it on exit.

    ``handler`` answers every request. Requests are recorded before it runs; an
    exception it raises is logged, kept in :attr:`errors` and answered with an
    empty 500. ``tls``: serve HTTPS with that server context. ``tunnel``: the
    server's tunnel hook (a request it takes is recorded, then spliced).
    """

    def __init__(
        self,
        handler: Handler,
        *,
        host: str = "127.0.0.1",
        tls: ssl.SSLContext | None = None,
        tunnel: Tunnel | None = None,
    ) -> None:
        self._handler = handler
        self._errors: list[BaseException] = []
        super().__init__(
            self._route,
            host=host,
            record=True,
            keep_alive=False,
            thread_prefix=THREAD_PREFIX,
            join_timeout=_CLOSE_JOIN_BUDGET,
            tls=tls,
            tunnel=tunnel,
        )
        self.start()

    @property
    def errors(self) -> list[BaseException]:
        """Exceptions raised by handler code (each was answered with a 500 or a drop)."""
        with self._lock:
            return list(self._errors)

    def stream(
        self,
        request: Request,
        chunks: Iterable[bytes],
        *,
        status: int = 200,
        content_type: str = "application/octet-stream",
    ) -> Response:
        """A chunked response sending each item as it is produced (flushed per item).

        ``chunks`` may block (e.g. on :meth:`wait`) and may raise :class:`DropConnection`
        to cut the connection mid-body; other exceptions are recorded, then dropped.
        """
        return Response(self._guarded(iter(chunks)), status=status, content_type=content_type)

    def _route(self, raw: RawRequest) -> Reply:
        request = Request(_environ(raw, self.port))
        try:
            response = self._handler(request)
        except DropConnection:
            raise
        except Exception as error:
            self._record_error(error)
            return Reply(500)
        return _reply(response)

    def _guarded(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        try:
            yield from chunks
        except DropConnection:
            raise
        except Exception as error:
            self._record_error(error)
            raise DropConnection from error

    def _record_error(self, error: BaseException) -> None:
        _LOG.error("test double handler failed", exc_info=error)
        with self._lock:
            self._errors.append(error)


def _environ(request: RawRequest, port: int) -> dict[str, Any]:
    """The WSGI environment of ``request`` (what werkzeug's own server would build)."""
    target = urlsplit(request.target)
    environ: dict[str, Any] = {
        "REQUEST_METHOD": request.method,
        "SCRIPT_NAME": "",
        "PATH_INFO": unquote_to_bytes(target.path).decode("latin-1"),
        "QUERY_STRING": target.query,
        "RAW_URI": request.target,
        "REQUEST_URI": request.target,
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": str(port),
        "SERVER_PROTOCOL": "HTTP/1.1",
        "CONTENT_LENGTH": str(len(request.body)),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(request.body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
        CLIENT_SUBJECT: request.client_subject,
    }
    for name, value in request.headers.items():
        key = name.upper().replace("-", "_")
        if key == "CONTENT_TYPE":
            environ[key] = value
        elif key not in ("CONTENT_LENGTH", "TRANSFER_ENCODING"):
            environ[f"HTTP_{key}"] = value
    return environ


def _reply(response: Response) -> Reply:
    headers = tuple(
        (name, value)
        for name, value in response.headers.to_wsgi_list()
        if name.lower() not in _FRAMING
    )
    if response.is_streamed:
        return Reply(response.status_code, headers=headers, stream=_encoded(response))
    body = response.get_data()
    headers = tuple((n, v) for n, v in headers if n.lower() != "content-length")
    return Reply(response.status_code, body, headers=headers)


def _encoded(response: Response) -> Iterator[bytes]:
    try:
        yield from response.iter_encoded()
    finally:
        response.close()
