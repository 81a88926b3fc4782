"""A stdlib HTTP/1.1 server on 127.0.0.1 for tests that need kept-alive connections.

werkzeug (under the recording doubles) closes every connection, so tests of
connection reuse serve their own handler class with this instead::

    server = LoopbackHttp(Handler)
    ...  # requests to server.url
    server.close()
"""

from __future__ import annotations

import http.server
import threading

__all__ = ["LoopbackHttp"]


class LoopbackHttp:
    """``handler`` served on a free loopback port by a daemon thread until :meth:`close`."""

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
