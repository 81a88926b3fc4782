"""A loopback HTTP server that answers with a fixed script: some bytes at once, then a drip.

Each accepted connection reads the request head, sends ``prefix`` in one write, then
``drip`` one byte every ``interval`` seconds, until it is done or :meth:`close` is
called::

    server = DripServer(prefix=b"HTTP/1.1 200 OK\\r\\n", drip=b"X-Slow: 1\\r\\n" * 100)
    ...  # requests to server.url
    server.close()
"""

from __future__ import annotations

import socket
import threading

__all__ = ["DripServer"]


class DripServer:
    def __init__(self, *, prefix: bytes, drip: bytes, interval: float = 0.05) -> None:
        self._prefix, self._drip, self._interval = prefix, drip, interval
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def close(self) -> None:
        self._stop.set()
        self._accepting.join(5)
        for thread in self._threads:
            thread.join(5)
        self._listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=self._answer, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                data = conn.recv(65536)
                if not data:
                    return
                head += data
            try:
                conn.sendall(self._prefix)
                for index in range(len(self._drip)):
                    if self._stop.wait(self._interval):
                        return
                    conn.sendall(self._drip[index : index + 1])
            except OSError:
                return  # the client gave up
