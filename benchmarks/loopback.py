"""A fast loopback E2B double for benchmarks, run in its own process.

The werkzeug-based :class:`~piship_remote.testing.E2bServer` costs about 4 ms per
request on a small machine and shares the client's GIL, which hides client-side
costs; it also cannot produce hundreds of MiB of output cheaply. This server speaks
just enough HTTP/1.1 (keep-alive, chunked request and response bodies) and envd
Connect to serve every client the harness compares, from pre-encoded frames::

    with LoopbackServer() as server:               # starts ``python -m benchmarks.loopback``
        backend = E2bCompatibleBackend(endpoint=server.url, envd_url=server.url)
        ...
        arrival = server.signal_arrival("run-7")   # CLOCK_MONOTONIC ns of its SendSignal

Routes: ``GET /health`` 204; ``POST /sandboxes`` or ``/v2/sandboxes`` 201 (the create
answer the official SDK needs); any other ``/sandboxes…`` 204;
``/process.Process/Start`` and ``/process.Process/SendSignal``; ``GET /_bench/signal``
(when a kill arrived) and ``GET /_bench/requests`` (requests answered, claims created,
connections accepted).

It also plays a Kubernetes API plus agent-sandbox router, for client-bound
Kubernetes runs: SandboxClaims of any namespace are created (201, echoed), always
Ready, patched and deleted (200); ``POST /execute`` answers the activation check,
and ``bench-sleep <ms>`` anywhere in the command after that many milliseconds.

Start scripts (``args[2]`` of the StartRequest):

- ``bench-stream <n>``: ``n`` bytes of ASCII stdout in 32 KiB frames, one HTTP chunk
  per frame (what envd behind Go's net/http sends), then exit 0;
- ``bench-sleep <ms>``: exit 0 after ``ms`` milliseconds;
- ``bench-hang <id>``: a start event, then nothing until a SendSignal names the
  process (tag or pid) or ``Connect-Timeout-Ms`` passes (then ``deadline_exceeded``,
  as envd does); the arrival time of either is kept under ``id``;
- the activation check (``piship-sandbox-ready``) is answered as envd would;
- anything else: exit 0 at once.

Both clocks are ``CLOCK_MONOTONIC`` (``time.monotonic_ns``), shared by every process
on the machine, so the harness compares arrival times with its own deadlines.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, Any, cast

import requests

__all__ = ["FRAME_BYTES", "READY", "ROOT", "LoopbackServer", "readline_within", "serve"]

ROOT = Path(__file__).resolve().parent.parent
"""The directory holding the ``benchmarks`` package; child processes start there."""

FRAME_BYTES = 32 * 1024
"""Raw stdout bytes per data frame (envd's ``stdChunkSize``)."""

SANDBOX_ID = "sbx1"
ACCESS_TOKEN = "envd-token-1"
CHECK_MARKER = "piship-sandbox-ready"
HANG_LIMIT = 60.0
_FRAMES_PER_WRITE = 8
READY = "READY "
_STARTUP_TIMEOUT = 20.0
_STOP_TIMEOUT = 5.0
_PATTERN = (b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ+/-_.,;:!?" * 4)[:255]
_LINE = _PATTERN + b"\n"
_CLAIMS = re.compile(
    r"^/apis/extensions\.agents\.x-k8s\.io/v1beta1/namespaces/[^/]+/sandboxclaims(?:/([^/]+))?$"
)
_SLEEP = re.compile(r"bench-sleep (\d+)")
_CREATED = {
    "sandboxID": SANDBOX_ID,
    "templateID": "bench",
    "clientID": "client1",
    "envdVersion": "0.4.0",
    "envdAccessToken": ACCESS_TOKEN,
    "domain": None,
}


# -- encoding --------------------------------------------------------------------------


def _envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    payload = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">BI", flags, len(payload)) + payload


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(event: dict[str, Any]) -> bytes:
    return _chunk(_envelope({"event": event}))


def _stdout_frame(data: bytes) -> bytes:
    return _event({"data": {"stdout": base64.b64encode(data).decode()}})


_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/connect+json\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
_START = _event({"start": {"pid": 1}})
_END_OK = _event({"end": {"exited": True, "status": "exit status 0"}})
_END_KILLED = _event({"end": {"exitCode": -1, "status": "signal: killed"}})
_END_STREAM = _chunk(_envelope({}, 0x02))
_DEADLINE = _chunk(
    _envelope(
        {"error": {"code": "deadline_exceeded", "message": "context deadline exceeded"}}, 0x02
    )
)
_LAST_CHUNK = b"0\r\n\r\n"
_FULL_FRAME = _stdout_frame((_LINE * (FRAME_BYTES // len(_LINE) + 1))[:FRAME_BYTES])
_FRAME_BATCH = _FULL_FRAME * _FRAMES_PER_WRITE
_INSTANT = _STREAM_HEAD + _START + _END_OK + _END_STREAM + _LAST_CHUNK


def _response(status: int, reason: str, body: bytes = b"", content_type: str = "") -> bytes:
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Length: {len(body)}\r\n"
    if content_type:
        head += f"Content-Type: {content_type}\r\n"
    return head.encode() + b"\r\n" + body


def _json_response(status: int, reason: str, value: Any) -> bytes:
    return _response(status, reason, json.dumps(value).encode(), "application/json")


# -- the server (runs in the child process) ----------------------------------------------


class _Hung:
    """A ``bench-hang`` stream waiting for its SendSignal."""

    def __init__(self, run_id: str, tag: str | None, pid: int) -> None:
        self.run_id = run_id
        self.tag = tag
        self.pid = pid
        self.signalled = threading.Event()


class _State:
    """Hung streams and arrival times, shared by the connection threads."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.hung: list[_Hung] = []
        self.arrivals: dict[str, tuple[int, str]] = {}
        self.next_pid = 1000
        self.requests = 0
        self.claims = 0
        self.connections = 0

    def new_pid(self) -> int:
        with self.lock:
            self.next_pid += 1
            return self.next_pid

    def arrive(self, run_id: str, when: int, kind: str) -> None:
        with self.lock:
            self.arrivals.setdefault(run_id, (when, kind))
            self.lock.notify_all()

    def signal(self, selector: dict[str, Any], when: int) -> None:
        with self.lock:
            for hung in self.hung:
                if selector.get("tag") == hung.tag or selector.get("pid") == hung.pid:
                    self.arrivals.setdefault(hung.run_id, (when, "signal"))
                    hung.signalled.set()
            self.lock.notify_all()

    def wait_arrival(self, run_id: str, timeout: float) -> tuple[int, str] | None:
        deadline = time.monotonic() + timeout
        with self.lock:
            while run_id not in self.arrivals:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self.lock.wait(remaining)
            return self.arrivals.pop(run_id)


class _Request:
    def __init__(self, method: str, target: str, headers: dict[str, str], body: bytes) -> None:
        self.method = method
        self.path, _, self.query = target.partition("?")
        self.headers = headers
        self.body = body


def _read_request(reader: IO[bytes]) -> _Request | None:
    line = reader.readline(65536)
    if not line:
        return None
    method, target, _ = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while (header := reader.readline(65536)) not in (b"\r\n", b"\n", b""):
        name, _, value = header.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = _read_chunked(reader)
    else:
        body = reader.read(int(headers.get("content-length", "0") or 0))
    return _Request(method, target, headers, body)


def _read_chunked(reader: IO[bytes]) -> bytes:
    parts: list[bytes] = []
    while True:
        size = int(reader.readline(1024).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while reader.readline(65536) not in (b"\r\n", b"\n", b""):
                pass
            return b"".join(parts)
        parts.append(reader.read(size))
        reader.readline(16)


def _start_request(body: bytes) -> dict[str, Any]:
    if len(body) < 5:
        return {}
    length = struct.unpack(">I", body[1:5])[0]
    value = json.loads(body[5 : 5 + length])
    return value if isinstance(value, dict) else {}


class _Connection:
    """One client connection, served on its own thread."""

    def __init__(self, sock: socket.socket, state: _State) -> None:
        self.sock = sock
        self.state = state
        self.reader = cast(IO[bytes], sock.makefile("rb", buffering=65536))

    def serve(self) -> None:
        try:
            while (request := _read_request(self.reader)) is not None:
                self.handle(request)
                if request.headers.get("connection", "").lower() == "close":
                    break
        except OSError:
            pass  # the client went away
        except Exception as error:  # a request this server does not understand
            print(f"loopback server: {type(error).__name__}: {error}", file=sys.stderr)
        finally:
            with contextlib.suppress(OSError):
                self.reader.close()
                self.sock.close()

    def handle(self, request: _Request) -> None:
        path = request.path
        if not path.startswith("/_bench/"):
            with self.state.lock:
                self.state.requests += 1
        if path == "/process.Process/Start":
            self.start(request)
        elif path == "/process.Process/SendSignal":
            when = time.monotonic_ns()
            selector = json.loads(request.body or b"{}").get("process") or {}
            self.state.signal(selector, when)
            self.sock.sendall(_json_response(200, "OK", {}))
        elif path in ("/sandboxes", "/v2/sandboxes") and request.method == "POST":
            self.sock.sendall(_json_response(201, "Created", _CREATED))
        elif path.startswith("/sandboxes/") or path == "/health":
            self.sock.sendall(_response(204, "No Content"))
        elif path == "/_bench/signal":
            self.arrival(request)
        elif path == "/_bench/requests":
            with self.state.lock:
                counts = {
                    "requests": self.state.requests,
                    "claims": self.state.claims,
                    "connections": self.state.connections,
                }
            self.sock.sendall(_json_response(200, "OK", counts))
        elif path == "/execute":
            self.execute(request)
        elif (claim := _CLAIMS.match(path)) is not None:
            self.claim(request, claim.group(1))
        else:
            self.sock.sendall(_json_response(404, "Not Found", {}))

    def claim(self, request: _Request, name: str | None) -> None:
        if name is None and request.method == "POST":
            with self.state.lock:
                self.state.claims += 1
            self.sock.sendall(_response(201, "Created", request.body, "application/json"))
        elif name is None:
            self.sock.sendall(_json_response(200, "OK", {"items": []}))
        elif request.method == "GET":
            ready = {
                "status": {
                    "conditions": [{"type": "Ready", "status": "True"}],
                    "sandbox": {"name": f"pool-{name}"},
                }
            }
            self.sock.sendall(_json_response(200, "OK", ready))
        else:
            self.sock.sendall(_json_response(200, "OK", {}))

    def execute(self, request: _Request) -> None:
        command = str(json.loads(request.body or b"{}").get("command", ""))
        stdout = ""
        if CHECK_MARKER in command:
            unlisted = "1" if "'PISHIP_PROBE_UNLISTED=" in command else "unset"
            stdout = f"{CHECK_MARKER} {unlisted}\n"
        elif (sleep := _SLEEP.search(command)) is not None:
            time.sleep(int(sleep.group(1)) / 1000)
        answer = {"stdout": stdout, "stderr": "", "exit_code": 0}
        self.sock.sendall(_json_response(200, "OK", answer))

    def arrival(self, request: _Request) -> None:
        query = urllib.parse.parse_qs(request.query)
        found = self.state.wait_arrival(query["id"][0], float(query.get("wait", ["2"])[0]))
        if found is None:
            self.sock.sendall(_json_response(404, "Not Found", {}))
        else:
            self.sock.sendall(_json_response(200, "OK", {"t_ns": found[0], "kind": found[1]}))

    def start(self, request: _Request) -> None:
        start = _start_request(request.body)
        process = start.get("process") or {}
        args = process.get("args") or []
        script = args[2] if len(args) > 2 and isinstance(args[2], str) else ""
        word, _, argument = script.partition(" ")
        if word == "bench-stream":
            self.stream(int(argument))
        elif word == "bench-sleep":
            time.sleep(int(argument) / 1000)
            self.sock.sendall(_INSTANT)
        elif word == "bench-hang":
            self.hang(argument, start.get("tag"), request.headers.get("connect-timeout-ms"))
        elif CHECK_MARKER in script:
            unlisted = (process.get("envs") or {}).get("PISHIP_PROBE_UNLISTED") or "unset"
            output = f"{CHECK_MARKER} {unlisted}\n".encode()
            self.sock.sendall(
                _STREAM_HEAD + _START + _stdout_frame(output) + _END_OK + _END_STREAM + _LAST_CHUNK
            )
        else:
            self.sock.sendall(_INSTANT)

    def stream(self, total: int) -> None:
        send = self.sock.sendall
        send(_STREAM_HEAD + _START)
        frames, rest = divmod(total, FRAME_BYTES)
        batches, single = divmod(frames, _FRAMES_PER_WRITE)
        for _ in range(batches):
            send(_FRAME_BATCH)
        if single:
            send(_FULL_FRAME * single)
        tail = _stdout_frame((_LINE * (rest // len(_LINE) + 1))[:rest]) if rest else b""
        send(tail + _END_OK + _END_STREAM + _LAST_CHUNK)

    def hang(self, run_id: str, tag: Any, timeout_ms: str | None) -> None:
        hung = _Hung(run_id, tag if isinstance(tag, str) else None, self.state.new_pid())
        with self.state.lock:
            self.state.hung.append(hung)
        try:
            self.sock.sendall(_STREAM_HEAD + _event({"start": {"pid": hung.pid}}))
            limit = int(timeout_ms) / 1000 if timeout_ms else HANG_LIMIT
            if hung.signalled.wait(min(limit, HANG_LIMIT)):
                self.sock.sendall(_END_KILLED + _END_STREAM + _LAST_CHUNK)
            else:
                self.state.arrive(run_id, time.monotonic_ns(), "deadline")
                self.sock.sendall(_DEADLINE + _LAST_CHUNK)
        finally:
            with self.state.lock:
                self.state.hung.remove(hung)


def serve(listener: socket.socket, stop: Callable[[], bool]) -> None:
    """Accept connections on ``listener`` until ``stop()``; one daemon thread each."""
    state = _State()
    listener.settimeout(0.1)
    while not stop():
        try:
            sock, _ = listener.accept()
        except TimeoutError:
            continue
        with state.lock:
            state.connections += 1
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(
            target=_Connection(sock, state).serve, name="piship-bench-conn", daemon=True
        ).start()


def _main() -> None:
    listener = socket.create_server(("127.0.0.1", 0), backlog=256)
    stopped = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read()  # the parent closes our stdin to stop us
        stopped.set()

    threading.Thread(target=watch_stdin, name="piship-bench-stdin", daemon=True).start()
    print(f"{READY}{listener.getsockname()[1]}", flush=True)
    serve(listener, stopped.is_set)
    listener.close()


# -- the handle (used by the harness) ----------------------------------------------------


class LoopbackServer:
    """Runs the server in a child process; a context manager that stops it on exit."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.loopback"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert self._process.stdout is not None
        line = readline_within(self._process.stdout, _STARTUP_TIMEOUT)
        if not line.startswith(READY):
            self.close()
            raise RuntimeError(f"the loopback server did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line[len(READY) :])}"
        self._session = requests.Session()

    def signal_arrival(self, run_id: str, wait: float = 2.0) -> tuple[int, str] | None:
        """When the kill of ``bench-hang <run_id>`` arrived: (monotonic ns, "signal"|"deadline")."""
        response = self._session.get(
            f"{self.url}/_bench/signal", params={"id": run_id, "wait": str(wait)}, timeout=wait + 5
        )
        if response.status_code != 200:
            return None
        found = response.json()
        return int(found["t_ns"]), str(found["kind"])

    def request_count(self) -> int:
        """How many requests the server answered so far (its own ``/_bench/`` ones aside)."""
        response = self._session.get(f"{self.url}/_bench/requests", timeout=10)
        return int(response.json()["requests"])

    def connection_count(self) -> int:
        """How many connections the server accepted so far (the harness's own included)."""
        response = self._session.get(f"{self.url}/_bench/requests", timeout=10)
        return int(response.json()["connections"])

    def claim_count(self) -> int:
        """How many SandboxClaims were created so far."""
        response = self._session.get(f"{self.url}/_bench/requests", timeout=10)
        return int(response.json()["claims"])

    def close(self) -> None:
        """Stop the child process (closing its stdin), killing it if it lingers."""
        with contextlib.suppress(AttributeError):
            self._session.close()
        process = self._process
        if process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()
        try:
            process.wait(_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()

    def __enter__(self) -> LoopbackServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def stop_child(process: subprocess.Popen[str], timeout: float) -> None:
    """End a child that stops when its stdin closes: close it, wait ``timeout`` seconds,
    then kill; its stdout is closed too."""
    if process.stdin is not None:
        with contextlib.suppress(OSError):
            process.stdin.close()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if process.stdout is not None:
        process.stdout.close()


def readline_within(stream: IO[str], timeout: float) -> str:
    """One line from ``stream`` within ``timeout`` (``""`` if none came)."""
    lines: list[str] = []
    reader = threading.Thread(
        target=lambda: lines.append(stream.readline()), name="piship-bench-startup", daemon=True
    )
    reader.start()
    reader.join(timeout)
    return lines[0].strip() if lines else ""


if __name__ == "__main__":
    _main()
