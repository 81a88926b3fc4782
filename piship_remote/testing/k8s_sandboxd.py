"""The fake cluster's ``sandboxd`` (``KubernetesServer(runtime="sandboxd")``): per sandbox pod,
a gRPC ``ProcessService`` and the REST filesystem, each on its own loopback port.

A pod's processes really run, as subprocesses of this process in the pod's own temporary
directory (its sandbox root; commands start there and may reach the host's other paths,
which a real pod would not have). As in sandboxd, every command is the leader of a new
process group (here: of a new session), ``SendSignal`` signals that group, and process
ids are the service's own, counted from 1. A ``Start`` whose client goes away kills its
process group (the real daemon kills the leader, its ``WaitDelay`` the rest)::

    pods = SandboxdPods(faults)
    pod = pods.pod("pool-sandbox-claim-1")     # started on first use
    pod.grpc_port, pod.rest_port, pod.root
    pods.sweep({"pool-sandbox-claim-2"})       # pods whose Sandbox is gone stop
    pods.close()

Faults (the server's :class:`~piship_remote.testing.faults.Faults`):
``drop_stream_after_output()`` ends the next ``Start`` stream with ``UNAVAILABLE`` after its
first output (the process runs on); ``stall(START_PATH)`` holds the next ``Start`` before
its process starts, until the call is cancelled, ``release()`` or the server closes;
``lose_processes()`` makes the next ``WriteStdin``/``SendSignal``/``ResizeTTY`` find no
such process (``NOT_FOUND``).

Needs the ``sandboxd`` extra (grpcio, protobuf).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import pty
import queue
import shutil
import signal
import struct
import subprocess
import tempfile
import termios
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

try:
    import grpc

    from piship_remote._sandboxd import process_pb2 as pb
except ImportError as missing:  # the sandboxd extra
    raise ImportError(
        f"sandboxd needs grpcio and protobuf ({missing}): pip install 'piship-remote[sandboxd]'"
    ) from missing
from piship_remote._sandboxd.process_rpc import SERVICE, service_handler
from piship_remote.testing.faults import Faults
from piship_remote.testing.k8s_sandboxd_files import PathEscapes, SandboxdFiles, resolve
from piship_remote.testing.recorder import THREAD_PREFIX, RecordingServer

__all__ = ["GRPC_PORT", "REST_PORT", "START_PATH", "SandboxdPod", "SandboxdPods"]

GRPC_PORT = 9090
REST_PORT = 8080
START_PATH = f"/{SERVICE}/Start"
_CHUNK = 4096
_SIGNALS = {
    pb.SIGNAL_SIGINT: signal.SIGINT,
    pb.SIGNAL_SIGTERM: signal.SIGTERM,
    pb.SIGNAL_SIGKILL: signal.SIGKILL,
}
_POLL = 0.05


class _Process:
    """One running command: its group, its input, its terminal."""

    def __init__(self, popen: subprocess.Popen[bytes], stdin: int | None, terminal: int | None):
        self.popen = popen
        self.stdin = stdin
        self.terminal = terminal
        self.lock = threading.Lock()

    def signal(self, number: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, number)

    def write(self, data: bytes) -> None:
        with self.lock:
            if self.stdin is None:
                raise BrokenPipeError("the input is closed")
            view = memoryview(data)
            while view:
                view = view[os.write(self.stdin, view) :]

    def close_input(self) -> None:
        with self.lock:
            if self.terminal is not None:
                os.write(self.terminal, b"\x04")
                return
            if self.stdin is not None:
                os.close(self.stdin)
                self.stdin = None

    def release(self) -> None:
        with self.lock:
            for fd in {self.stdin, self.terminal} - {None}:
                with contextlib.suppress(OSError):
                    os.close(fd)  # type: ignore[arg-type]
            self.stdin = self.terminal = None


class ProcessService:
    """The ``ProcessService`` of one pod, as sandboxd serves it."""

    def __init__(self, root: str, faults: Faults, closing: threading.Event) -> None:
        self._root = root
        self._faults = faults
        self._closing = closing
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._processes: dict[int, _Process] = {}

    # ---- the RPCs ----------------------------------------------------------------------

    def Start(self, request: pb.StartRequest, context: grpc.ServicerContext) -> Iterator[Any]:
        self._hold_if_stalled(context)
        config = request.config
        cwd = self._cwd(config, context)
        terminal = request.pty if request.HasField("pty") else None
        process = self._spawn(config, cwd, terminal, context)
        pid = next(self._ids)
        with self._lock:
            self._processes[pid] = process
        events: queue.Queue[tuple[str, bytes] | None] = queue.Queue()
        readers = self._readers(process, events)
        drop = self._faults.take_dropped_stream()
        try:
            yield pb.StartResponse(init=pb.InitEvent(process_id=pid))
            ended = 0
            while ended < len(readers):
                if not context.is_active() or self._closing.is_set():
                    process.signal(signal.SIGKILL)
                    return
                try:
                    item = events.get(timeout=_POLL)
                except queue.Empty:
                    continue
                if item is None:
                    ended += 1
                    continue
                stream, data = item
                yield (
                    pb.StartResponse(stdout=data)
                    if stream == "stdout"
                    else pb.StartResponse(stderr=data)
                )
                if drop:
                    context.abort(grpc.StatusCode.UNAVAILABLE, "the stream was dropped")
            code = process.popen.wait()
            yield pb.StartResponse(exit=pb.ExitEvent(exit_code=code if code >= 0 else -1))
        finally:
            if not drop:
                with self._lock:
                    self._processes.pop(pid, None)
                if process.popen.poll() is None:
                    process.signal(signal.SIGKILL)
                process.popen.wait()
                process.release()

    def Execute(self, request: pb.ExecuteRequest, context: grpc.ServicerContext) -> Any:
        cwd = self._cwd(request.config, context)
        process = self._spawn(request.config, cwd, None, context)
        process.close_input()
        context.add_callback(lambda: process.signal(signal.SIGKILL))
        events: queue.Queue[tuple[str, bytes] | None] = queue.Queue()
        readers = self._readers(process, events)
        out = {"stdout": bytearray(), "stderr": bytearray()}
        ended = 0
        while ended < len(readers):
            item = events.get()
            if item is None:
                ended += 1
            else:
                out[item[0]] += item[1]
        code = process.popen.wait()
        process.release()
        return pb.ExecuteResponse(
            exit_code=code if code >= 0 else -1,
            stdout=bytes(out["stdout"]),
            stderr=bytes(out["stderr"]),
        )

    def WriteStdin(self, request: pb.WriteStdinRequest, context: grpc.ServicerContext) -> Any:
        process = self._process(request.process_id, context)
        if request.HasField("eof"):
            process.close_input()
            return pb.WriteStdinResponse()
        try:
            process.write(request.input)
        except OSError as error:
            context.abort(grpc.StatusCode.INTERNAL, f"failed to write stdin: {error}")
        return pb.WriteStdinResponse()

    def SendSignal(self, request: pb.SendSignalRequest, context: grpc.ServicerContext) -> Any:
        process = self._process(request.process_id, context)
        number = _SIGNALS.get(request.signal)
        if number is None:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"unsupported or unspecified signal: {request.signal}",
            )
        assert number is not None
        process.signal(number)  # a process that already ended: nothing to do
        return pb.SendSignalResponse()

    def ResizeTTY(self, request: pb.ResizeTTYRequest, context: grpc.ServicerContext) -> Any:
        process = self._process(request.process_id, context)
        if process.terminal is None:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"failed to resize TTY: process {request.process_id} has no terminal",
            )
        assert process.terminal is not None
        _set_size(process.terminal, request.cols, request.rows)
        process.signal(signal.SIGWINCH)
        return pb.ResizeTTYResponse()

    # ---- the pieces --------------------------------------------------------------------

    def kill_all(self) -> None:
        with self._lock:
            processes = list(self._processes.values())
        for process in processes:
            process.signal(signal.SIGKILL)

    def _hold_if_stalled(self, context: grpc.ServicerContext) -> None:
        stall = self._faults.take_stall(START_PATH)
        if stall is None:
            return
        gate, left = stall.gate, stall.seconds
        while context.is_active() and not self._closing.is_set() and not gate.is_set():
            if left is not None:
                if left <= 0:
                    return
                left -= _POLL
            gate.wait(_POLL)
        if not context.is_active() or self._closing.is_set():
            context.abort(grpc.StatusCode.CANCELLED, "the call ended while it was held")

    def _cwd(self, config: pb.ProcessConfig, context: grpc.ServicerContext) -> str:
        if not config.command:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "command is required")
        if not config.HasField("cwd") or not config.cwd:
            return self._root
        try:
            return resolve(self._root, config.cwd)
        except PathEscapes as error:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, f"cwd: {error}")
        raise AssertionError("unreachable")

    def _spawn(
        self,
        config: pb.ProcessConfig,
        cwd: str,
        terminal: pb.PTY | None,
        context: grpc.ServicerContext,
    ) -> _Process:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": self._root}
        env.update(config.env_vars)
        try:
            if terminal is None:
                popen = subprocess.Popen(
                    list(config.command),
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
                assert popen.stdin is not None
                stdin = os.dup(popen.stdin.fileno())
                popen.stdin.close()
                return _Process(popen, stdin, None)
            main, side = pty.openpty()
            _set_size(main, terminal.cols or 80, terminal.rows or 24)
            popen = subprocess.Popen(
                list(config.command),
                cwd=cwd,
                env={**env, "TERM": "xterm"},
                stdin=side,
                stdout=side,
                stderr=side,
                start_new_session=True,
            )
            os.close(side)
            return _Process(popen, main, main)
        except FileNotFoundError as error:
            context.abort(grpc.StatusCode.NOT_FOUND, f"command or path not found: {error}")
        except PermissionError as error:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, f"permission denied: {error}")
        raise AssertionError("unreachable")

    def _readers(
        self, process: _Process, events: queue.Queue[tuple[str, bytes] | None]
    ) -> list[threading.Thread]:
        popen = process.popen
        sources = (
            [("stdout", process.terminal)]
            if process.terminal is not None
            else [("stdout", popen.stdout.fileno()), ("stderr", popen.stderr.fileno())]  # type: ignore[union-attr]
        )
        threads = []
        for stream, fd in sources:
            thread = threading.Thread(
                target=_read_into,
                args=(fd, stream, events),
                name=f"{THREAD_PREFIX}sandboxd-{stream}",
                daemon=True,
            )
            thread.start()
            threads.append(thread)
        return threads

    def _process(self, pid: int, context: grpc.ServicerContext) -> _Process:
        with self._lock:
            process = None if self._faults.take_lost_process() else self._processes.get(pid)
        if process is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"process {pid} not found")
        assert process is not None
        return process


def _read_into(fd: int, stream: str, events: queue.Queue[tuple[str, bytes] | None]) -> None:
    try:
        while data := os.read(fd, _CHUNK):
            events.put((stream, data))
    except OSError:  # a terminal whose last writer ended reads EIO
        pass
    finally:
        events.put(None)


def _set_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class SandboxdPod:
    """One pod's sandboxd: its root, its ``ProcessService`` and its REST filesystem."""

    def __init__(self, name: str, faults: Faults) -> None:
        self.name = name
        self.root = os.path.realpath(tempfile.mkdtemp(prefix="piship-sandboxd-"))
        self._closing = threading.Event()
        self.processes = ProcessService(self.root, faults, self._closing)
        self._workers = ThreadPoolExecutor(
            max_workers=32, thread_name_prefix=f"{THREAD_PREFIX}sandboxd-rpc"
        )
        self._grpc = grpc.server(self._workers)
        self._grpc.add_generic_rpc_handlers((service_handler(self.processes),))
        self.grpc_port = self._grpc.add_insecure_port("127.0.0.1:0")
        self._grpc.start()
        self.files = SandboxdFiles(self.root)
        self._rest = RecordingServer(self.files.handle)
        self.rest_port = self._rest.port

    def address(self, port: int) -> tuple[str, int] | None:
        """Where the pod's ``port`` (9090 or 8080) is served, or ``None``: nothing listens."""
        if port == GRPC_PORT:
            return ("127.0.0.1", self.grpc_port)
        if port == REST_PORT:
            return ("127.0.0.1", self.rest_port)
        return None

    def close(self) -> None:
        self._closing.set()
        self.processes.kill_all()
        self._grpc.stop(grace=None).wait(5.0)
        self._workers.shutdown(wait=True, cancel_futures=True)  # its threads end with it
        self._rest.close()
        shutil.rmtree(self.root, ignore_errors=True)


class SandboxdPods:
    """The sandboxd of every live sandbox pod, started on first use."""

    def __init__(self, faults: Faults) -> None:
        self._faults = faults
        self._lock = threading.Lock()
        self._pods: dict[str, SandboxdPod] = {}
        self._closed = False

    def pod(self, name: str) -> SandboxdPod:
        with self._lock:
            if self._closed:
                raise RuntimeError("the fake cluster is closed")
            found = self._pods.get(name)
            if found is None:
                found = self._pods[name] = SandboxdPod(name, self._faults)
            return found

    def sweep(self, live: set[str]) -> None:
        """Stop the pods not in ``live`` (their Sandbox is gone)."""
        with self._lock:
            gone = [self._pods.pop(name) for name in list(self._pods) if name not in live]
        for pod in gone:
            pod.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pods = list(self._pods.values())
            self._pods.clear()
        for pod in pods:
            pod.close()
