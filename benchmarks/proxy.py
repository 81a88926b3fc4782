"""A latency-injecting TCP proxy: a delay line in front of a loopback service.

Every chunk read from one side is written to the other ``delay`` seconds after it
arrived, independently per direction, so a round trip costs ``2 * delay`` while
throughput is not capped by it (many chunks are in flight at once, as on a real
link). An end of stream (a half-close) travels the same way: the far side sees
``shutdown(SHUT_WR)`` one delay later and can still answer. A reset or error on
either side ends the whole connection. The kernel completes the client's connect at
once, so the handshake a real link would cost (a round trip before the client can
send) is charged instead to the first bytes upstream: none reach it before three
one-way delays after the connection opened, which makes a new connection's first
request take two round trips, as it does on a network::

    with DelayProxy(("127.0.0.1", 8080), delay=0.010) as proxy:   # 20 ms RTT
        requests.get(f"{proxy.url}/health")

    with ProxyProcess("http://127.0.0.1:8080", delay_ms=10) as proxy:   # in a child process
        ...

The child process (``python -m benchmarks.proxy --upstream URL --delay-ms N``)
keeps the proxy's threads off the measured clients' GIL; it stops when its stdin
closes, so it never outlives the harness.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import queue
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from types import TracebackType

from benchmarks.loopback import READY, ROOT, readline_within, stop_child

__all__ = ["DelayProxy", "ProxyProcess", "at_rtt"]

_READ = 256 * 1024
_ACCEPT_POLL = 0.05
_STARTUP_TIMEOUT = 20.0
_STOP_TIMEOUT = 5.0

_Line = queue.SimpleQueue[tuple[float, bytes | None]]
"""One direction's chunks with the time each is due at the far side."""

_EOF = b""
"""Queued after the last chunk of a direction that ended cleanly (half-close)."""


class _Link:
    """One proxied connection: two delay lines (client to upstream and back)."""

    def __init__(self, client: socket.socket, upstream: socket.socket, delay: float) -> None:
        self.sockets = (client, upstream)
        self.delay = delay
        self.handshake_done = time.monotonic() + 2 * delay
        self.finished = 0
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=target, name=f"piship-bench-proxy-{role}", daemon=True)
            for target, role in self._pumps()
        ]

    def _pumps(self) -> list[tuple[Callable[[], None], str]]:
        """A reader and a writer per direction, joined by that direction's queue."""
        pumps: list[tuple[Callable[[], None], str]] = []
        client, upstream = self.sockets
        ways = ((client, upstream, "up", self.handshake_done), (upstream, client, "down", 0.0))
        for source, target, way, not_before in ways:
            line: _Line = queue.SimpleQueue()
            read = functools.partial(self._read, source, line, not_before)
            pumps.append((read, f"read-{way}"))
            pumps.append((functools.partial(self._write, target, line), f"write-{way}"))
        return pumps

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def _read(self, source: socket.socket, line: _Line, sent_after: float) -> None:
        """Stamp each chunk with when it is due (as if sent no earlier than ``sent_after``).

        ``_EOF`` follows the last chunk at a clean end, ``None`` on an error.
        """

        def due() -> float:
            return max(time.monotonic(), sent_after) + self.delay

        try:
            while chunk := source.recv(_READ):
                line.put((due(), chunk))
        except OSError:
            line.put((time.monotonic(), None))
            return
        line.put((due(), _EOF))

    def _write(self, target: socket.socket, line: _Line) -> None:
        """Send each chunk once its time has come; pass the end on as a half-close."""
        try:
            while True:
                due, chunk = line.get()
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if chunk is None:
                    self.abort()
                    break
                if chunk == _EOF:
                    target.shutdown(socket.SHUT_WR)
                    break
                target.sendall(chunk)
        except OSError:
            self.abort()
        self._direction_done()

    def _direction_done(self) -> None:
        with self.lock:
            self.finished += 1
            both = self.finished == 2
        if both:
            self.close()

    def abort(self) -> None:
        """End both directions now: every blocked read and write of this link returns."""
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Release both sockets (both writers are done, so no thread still uses them)."""
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()


class DelayProxy:
    """Listens on 127.0.0.1; forwards each connection to ``upstream``, ``delay`` s each way."""

    def __init__(self, upstream: tuple[str, int], delay: float) -> None:
        self.upstream = upstream
        self.delay = delay
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=256)
        self._listener.settimeout(_ACCEPT_POLL)
        self.port: int = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._stopped = threading.Event()
        self._links: list[_Link] = []
        self._lock = threading.Lock()
        self._acceptor = threading.Thread(
            target=self._accept, name="piship-bench-proxy-accept", daemon=True
        )
        self._acceptor.start()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            for sock in (client, upstream):
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(client, upstream, self.delay)
            with self._lock:
                self._links = [
                    kept for kept in self._links if any(t.is_alive() for t in kept.threads)
                ]
                self._links.append(link)
            link.start()

    def close(self) -> None:
        """Stop accepting, end every connection and wait for every thread of the proxy."""
        self._stopped.set()
        self._acceptor.join()
        self._listener.close()
        with self._lock:
            links = list(self._links)
        for link in links:
            link.abort()
        for link in links:
            for thread in link.threads:
                thread.join()
            link.close()

    def __enter__(self) -> DelayProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _address(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


class ProxyProcess:
    """A :class:`DelayProxy` in a child process in front of ``upstream`` (an ``http://`` URL)."""

    def __init__(self, upstream: str, delay_ms: float) -> None:
        self.delay_ms = delay_ms
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.proxy",
                "--upstream",
                upstream,
                "--delay-ms",
                str(delay_ms),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert self._process.stdout is not None
        line = readline_within(self._process.stdout, _STARTUP_TIMEOUT)
        if not line.startswith(READY):
            self.close()
            raise RuntimeError(f"the delay proxy did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line[len(READY) :])}"

    @property
    def returncode(self) -> int | None:
        """The child's exit status once it stopped (``None`` while it runs)."""
        return self._process.poll()

    def close(self) -> None:
        """Close the child's stdin (it then stops), killing it if it lingers."""
        stop_child(self._process, _STOP_TIMEOUT)

    def __enter__(self) -> ProxyProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@contextlib.contextmanager
def at_rtt(url: str, rtt_ms: int) -> Iterator[str]:
    """The URL clients use at ``rtt_ms``: ``url`` itself, or a delay proxy in front of it."""
    if not rtt_ms:
        yield url
        return
    with ProxyProcess(url, delay_ms=rtt_ms / 2) as proxy:
        yield proxy.url


def _main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.proxy", description=__doc__)
    parser.add_argument("--upstream", required=True, help="http://127.0.0.1:PORT to forward to")
    parser.add_argument("--delay-ms", type=float, required=True, help="one-way delay")
    args = parser.parse_args()
    with DelayProxy(_address(args.upstream), args.delay_ms / 1000) as proxy:
        print(f"{READY}{proxy.port}", flush=True)
        sys.stdin.read()  # the parent closes our stdin to stop us


if __name__ == "__main__":
    _main()
