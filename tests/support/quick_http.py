"""pytest-httpserver's server on 127.0.0.1, stopping in milliseconds, and a route helper.

``with quick_http_server() as server: url = route(server, "/path", handler)``
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

__all__ = ["quick_http_server", "route"]


class _QuickHTTPServer(HTTPServer):
    """A threaded werkzeug server that polls for shutdown every 10 ms."""

    def thread_target(self) -> None:
        assert self.server is not None
        self.server.serve_forever(poll_interval=0.01)


@contextmanager
def quick_http_server(ssl_context: ssl.SSLContext | None = None) -> Iterator[HTTPServer]:
    """A started server (HTTPS with ``ssl_context``), cleared and stopped on exit."""
    srv = _QuickHTTPServer(host="127.0.0.1", threaded=True, ssl_context=ssl_context)
    srv.start()
    try:
        yield srv
    finally:
        srv.clear()
        if srv.is_running():
            srv.stop()


def route(server: HTTPServer, path: str, handler: Callable[[Request], Response]) -> str:
    """``handler`` answers every request to ``path``; returns its URL."""
    server.expect_request(path).respond_with_handler(handler)
    return server.url_for(path)
