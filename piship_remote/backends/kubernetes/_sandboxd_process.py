"""Commands through sandboxd's ``ProcessService``: ``Start`` streams a command's output as it
comes, ``WriteStdin``/``ResizeTTY`` serve its handle, ``SendSignal`` ends its process group::

    processes = SandboxdProcesses(ProcessStub(channel), errors)
    result = processes.run(request, "/workspace", token, on_stdout, on_stderr)
    code, out, err = processes.execute("pwd", None, token)      # a helper, whole output

A cancel (the caller's, a timeout, Ctrl-C, ``kill()``, dispose) cancels the stream and sends
``SIGKILL`` to the command's process group before ``CommandCancelled`` is raised: the
sandbox keeps serving. A stream that ends without the command's exit leaves the outcome
unknown (sandboxd cannot reattach): the process group is killed and ``SANDBOX_UNAVAILABLE``
says so. A command that takes no input gets end-of-file at once, as with no stdin at all.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

try:
    import grpc

    from piship_remote._sandboxd import process_pb2 as pb
except ImportError as missing:  # the sandboxd extra
    raise ImportError(
        f"sandboxd needs grpcio and protobuf ({missing}): pip install 'piship-remote[sandboxd]'"
    ) from missing
from piship_remote._sandboxd.process_rpc import ProcessStub
from piship_remote.backends._common import SandboxErrors
from piship_remote.backends.base import BackendResult, ExecRequest, OutputCallback
from piship_remote.backends.control import TerminalSize
from piship_remote.model.errors import (
    CommandCancelled,
    CommandFailed,
    ConfigInvalid,
    PiShipError,
)
from piship_remote.transport._cancel import CancelToken

__all__ = ["SandboxdInput", "SandboxdProcesses"]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CONTROL_TIMEOUT = 10.0
"""The bound on one unary call (input, a signal, a resize); a command's own has none."""
_SIGNALLED = -1
"""The exit code sandboxd reports for a process a signal ended."""


Metadata = Callable[[], Sequence[tuple[str, str]]]
"""The metadata every call carries (a proxy's routing and credential), read per call."""


def _no_metadata() -> Sequence[tuple[str, str]]:
    return ()


class SandboxdInput:
    """A running command's input and terminal, as its handle drives them."""

    def __init__(
        self, stub: ProcessStub, pid: int, errors: SandboxErrors, metadata: Metadata
    ) -> None:
        self._stub = stub
        self._pid = pid
        self._errors = errors
        self._metadata = metadata

    def send(self, data: bytes) -> None:
        self._call(self._stub.write_stdin, pb.WriteStdinRequest(process_id=self._pid, input=data))

    def close(self) -> None:
        request = pb.WriteStdinRequest(process_id=self._pid)
        request.eof.SetInParent()
        self._call(self._stub.write_stdin, request)

    def resize(self, size: TerminalSize) -> None:
        request = pb.ResizeTTYRequest(process_id=self._pid, cols=size.cols, rows=size.rows)
        self._call(self._stub.resize_tty, request)

    def _call(self, method: Any, request: Any) -> None:
        try:
            method(request, timeout=_CONTROL_TIMEOUT, metadata=self._metadata())
        except grpc.RpcError as error:
            raise _control_error(error, self._errors) from None


class SandboxdProcesses:
    """The ``ProcessService`` of one claim's sandboxd."""

    def __init__(
        self, stub: ProcessStub, errors: SandboxErrors, metadata: Metadata = _no_metadata
    ) -> None:
        self._stub = stub
        self._errors = errors
        self._metadata = metadata

    def run(
        self,
        request: ExecRequest,
        cwd: str | None,
        cancel: CancelToken,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
    ) -> BackendResult:
        """Run ``request`` to its end, its output to the callbacks as it arrives."""
        start = pb.StartRequest(config=_config(request.command, cwd, request.env))
        if request.pty is not None:
            start.pty.CopyFrom(pb.PTY(cols=request.pty.cols, rows=request.pty.rows))
        call = self._stub.start(start, metadata=self._metadata())
        forget = cancel.on_cancel(call.cancel)
        pid: int | None = None
        feeder: _Feeder | Any = None  # held until the command ends: a dropped future is cancelled
        try:
            for event in call:
                kind = event.WhichOneof("event")
                if kind == "stdout" and on_stdout is not None:
                    on_stdout(event.stdout)
                elif kind == "stderr" and on_stderr is not None:
                    on_stderr(event.stderr)
                elif kind == "init":
                    pid = event.init.process_id
                    feeder = self._started(request, pid)
                elif kind == "exit":
                    code = event.exit.exit_code
                    return BackendResult(exit_code=code) if code != _SIGNALLED else _signalled()
            ending, unavailable = "the stream ended", False
        except grpc.RpcError as error:
            if cancel.is_set():
                self._kill(pid)
                raise CommandCancelled() from None
            ending, unavailable = _describe(error), _code(error) == grpc.StatusCode.UNAVAILABLE
        finally:
            forget()
            if isinstance(feeder, _Feeder):
                feeder.stop()
        if pid is None:
            raise self._errors(
                f"sandboxd did not start the command ({ending})",
                retryable=unavailable,
                not_started=True,
            )
        self._kill(pid)
        raise self._errors(
            f"the command's stream from sandboxd broke before its exit ({ending}); its outcome"
            " is unknown, and what it left running was killed"
        )

    def execute(
        self, script: str, cwd: str | None, cancel: CancelToken, timeout: float | None = None
    ) -> tuple[int, bytes, bytes]:
        """One helper command through ``Execute``: its exit code and whole output."""
        future = self._stub.execute.future(
            pb.ExecuteRequest(config=_config(script, cwd, {})),
            timeout=timeout,
            metadata=self._metadata(),
        )
        forget = cancel.on_cancel(future.cancel)
        try:
            answer = future.result()
        except grpc.FutureCancelledError:
            raise CommandCancelled() from None
        except grpc.RpcError as error:
            if cancel.is_set():
                raise CommandCancelled() from None
            raise self._errors(
                f"sandboxd could not run a helper command: {_describe(error)}"
            ) from None
        finally:
            forget()
        return answer.exit_code, answer.stdout, answer.stderr

    def _started(self, request: ExecRequest, pid: int) -> _Feeder | Any:
        """Bind the handle's controls; feed ``stdin``, or end the input of a command that
        takes none (a call that is not waited on, but held: see :meth:`run`)."""
        command_input = SandboxdInput(self._stub, pid, self._errors, self._metadata)
        control = request.control
        if control is not None:
            control.bind(command_input)
            control.started(pid)
        if request.stdin is not None:
            return _Feeder(command_input, request.stdin)
        if not request.takes_input and request.pty is None:
            eof = pb.WriteStdinRequest(process_id=pid)
            eof.eof.SetInParent()
            return self._stub.write_stdin.future(
                eof, timeout=_CONTROL_TIMEOUT, metadata=self._metadata()
            )
        return None

    def _kill(self, pid: int | None) -> None:
        """SIGKILL to the command's process group; one that already ended is no error."""
        if pid is None:
            return
        with contextlib.suppress(grpc.RpcError):
            self._stub.send_signal(
                pb.SendSignalRequest(process_id=pid, signal=pb.SIGNAL_SIGKILL),
                timeout=_CONTROL_TIMEOUT,
                metadata=self._metadata(),
            )


class _Feeder:
    """Writes a command's ``stdin`` chunks as they come, then its end, on
    ``piship-sandboxd-stdin``; stopped (and joined) when the command ends."""

    def __init__(self, command_input: SandboxdInput, chunks: Iterable[bytes]) -> None:
        self._input = command_input
        self._chunks = chunks
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._run, name="piship-sandboxd-stdin", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with contextlib.suppress(PiShipError):
            for chunk in self._chunks:
                if self._ended.is_set():
                    return
                if chunk:
                    self._input.send(bytes(chunk))
            if not self._ended.is_set():
                self._input.close()

    def stop(self) -> None:
        self._ended.set()
        self._thread.join(_CONTROL_TIMEOUT)


def _config(command: str, cwd: str | None, env: Mapping[str, str]) -> pb.ProcessConfig:
    config = pb.ProcessConfig(
        command=["/bin/sh", "-c", command],
        env_vars={name: value for name, value in env.items() if _ENV_NAME.fullmatch(name)},
    )
    if cwd is not None:
        config.cwd = cwd
    return config


def _signalled() -> BackendResult:
    return BackendResult(exit_code=None, signal="a signal")


def _code(error: grpc.RpcError) -> Any:
    return error.code() if hasattr(error, "code") else None


def _describe(error: grpc.RpcError) -> str:
    code = _code(error)
    details = error.details() if hasattr(error, "details") else None
    name = code.name if code is not None else "UNKNOWN"
    return f"{name}: {details}" if details else name


def _control_error(error: grpc.RpcError, errors: SandboxErrors) -> PiShipError:
    code = _code(error)
    if code == grpc.StatusCode.NOT_FOUND:
        return CommandFailed(
            "the command has ended (sandboxd no longer knows its process)"
        )
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return ConfigInvalid(f"sandboxd refused: {_describe(error)}")
    return errors(f"sandboxd refused the command's input: {_describe(error)}")
