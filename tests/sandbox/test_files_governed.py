"""File operations governed like commands: a timeout, a cancel event and dispose stop them.

Each stalled transfer is held by the double (``server.faults.stall``) until the test
stops it; it must then end within ``PROMPT`` seconds with the error that says why.
"""

from __future__ import annotations

import gc
import inspect
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from piship_remote import (
    CommandCancelled,
    CommandTimeout,
    PiShipError,
    Sandbox,
    SandboxFiles,
    activate_sandbox,
)
from piship_remote.backends.e2b.backend import E2bCompatibleBackend
from piship_remote.model.errors import CONFIG_INVALID, SANDBOX_UNAVAILABLE
from piship_remote.testing import E2bServer, KubernetesServer
from tests.support.seed import kubernetes

pytestmark = pytest.mark.timeout(60)

Double = E2bServer | KubernetesServer
POLICY = {"required": True, "network": {"mode": "allow"}}
PROMPT = 2.0  # seconds a stopped transfer may take to end (it takes milliseconds)
# The operations DESIGN section 1.5 gives SandboxFiles.
FILE_OPERATIONS = ("write", "read", "read_text", "list", "exists", "remove", "make_dir")
COPIES = ("upload", "download")


@pytest.fixture(params=["e2b", "kubernetes"])
def double(request: pytest.FixtureRequest) -> Iterator[Double]:
    server: Double = E2bServer() if request.param == "e2b" else KubernetesServer()
    with server:
        yield server


@pytest.fixture
def sandbox(double: Double, tmp_path: Path) -> Iterator[Sandbox]:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    if isinstance(double, E2bServer):
        backend: Any = E2bCompatibleBackend(
            endpoint=double.url, envd_url=double.url, credential=lambda: "e2b-key-000001"
        )
    else:
        backend = kubernetes(double.url)
    sandbox = activate_sandbox(POLICY, backend=backend, workspace=workspace)
    sandbox.files.write("data.bin", b"x" * 1000)
    yield sandbox
    sandbox.dispose()


def _read(sandbox: Sandbox, _local: Path, **bounds: Any) -> object:
    return sandbox.files.read("data.bin", **bounds)


def _upload(sandbox: Sandbox, local: Path, **bounds: Any) -> object:
    source = local / "up.bin"
    source.write_bytes(b"u" * 1000)
    return sandbox.files.upload(source, "up.bin", **bounds)


def _download(sandbox: Sandbox, local: Path, **bounds: Any) -> object:
    return sandbox.files.download("data.bin", local / "down.bin", **bounds)


Operation = Callable[..., object]
OPERATIONS: dict[str, Operation] = {"read": _read, "upload": _upload, "download": _download}


def stalled_path(double: Double, operation: str) -> tuple[str, str]:
    """The method and path prefix of the request that moves the file's bytes."""
    if isinstance(double, E2bServer):
        return ("POST" if operation == "upload" else "GET"), "/files"
    return ("POST", "/upload") if operation == "upload" else ("GET", "/download/")


def arrived(double: Double, method: str, prefix: str, timeout: float = 10.0) -> None:
    """Wait until a ``method`` request whose path starts with ``prefix`` reached the double."""
    deadline = time.monotonic() + timeout
    while not any(
        r.method == method and r.path.startswith(prefix) for r in double.requests
    ):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {method} {prefix} arrived")
        time.sleep(0.005)


class Running:
    """``action()`` on a thread; what it raised, and how long after ``mark()`` it ended."""

    def __init__(self, action: Callable[[], object]) -> None:
        self.error: BaseException | None = None
        self.ended = threading.Event()
        self._marked = 0.0
        self._end = 0.0
        self._thread = threading.Thread(target=self._run, args=(action,), daemon=True)
        self._thread.start()

    def _run(self, action: Callable[[], object]) -> None:
        try:
            action()
        except BaseException as error:
            self.error = error
        finally:
            self._end = time.monotonic()
            self.ended.set()

    def mark(self) -> None:
        self._marked = time.monotonic()

    def after_mark(self) -> float:
        assert self.ended.wait(30), "the file operation did not end"
        self._thread.join(5)
        return self._end - self._marked


def stall(double: Double, operation: str, tmp_path: Path, **bounds: Any) -> Running:
    method, prefix = stalled_path(double, operation)
    double.faults.stall(prefix)
    sandbox_of = bounds.pop("sandbox")
    running = Running(lambda: OPERATIONS[operation](sandbox_of, tmp_path, **bounds))
    arrived(double, method, prefix)
    return running


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_a_stalled_transfer_ends_promptly_when_cancelled(
    double: Double, sandbox: Sandbox, tmp_path: Path, operation: str
) -> None:
    cancel = threading.Event()
    running = stall(double, operation, tmp_path, sandbox=sandbox, cancel=cancel)
    running.mark()
    cancel.set()
    assert running.after_mark() < PROMPT
    assert isinstance(running.error, CommandCancelled)


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_a_stalled_transfer_times_out(
    double: Double, sandbox: Sandbox, tmp_path: Path, operation: str
) -> None:
    running = stall(double, operation, tmp_path, sandbox=sandbox, timeout=0.5)
    running.mark()
    assert running.after_mark() < PROMPT
    assert isinstance(running.error, CommandTimeout)
    assert str(running.error) == "timeout:0.5"


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_a_stalled_transfer_is_stopped_by_dispose(
    double: Double, sandbox: Sandbox, tmp_path: Path, operation: str
) -> None:
    running = stall(double, operation, tmp_path, sandbox=sandbox)
    running.mark()
    sandbox.dispose()
    assert running.after_mark() < PROMPT
    assert isinstance(running.error, PiShipError)
    assert running.error.code == SANDBOX_UNAVAILABLE
    assert "disposed" in str(running.error)


def test_a_stalled_helper_command_of_a_directory_download_ends_when_cancelled(
    double: Double, sandbox: Sandbox, tmp_path: Path
) -> None:
    sandbox.files.write("tree/a.txt", b"a")
    path = "/process.Process/Start" if isinstance(double, E2bServer) else "/execute"
    before = double.count("POST", path)
    double.faults.stall(path)
    cancel = threading.Event()
    running = Running(lambda: sandbox.files.download("tree", tmp_path / "tree", cancel=cancel))
    deadline = time.monotonic() + 10
    while double.count("POST", path) == before and time.monotonic() < deadline:
        time.sleep(0.005)
    running.mark()
    cancel.set()
    assert running.after_mark() < PROMPT
    assert isinstance(running.error, CommandCancelled)
    assert not (tmp_path / "tree").exists()


def test_a_stalled_push_times_out(double: Double, sandbox: Sandbox) -> None:
    double.faults.stall("/files" if isinstance(double, E2bServer) else "/upload")
    started = time.monotonic()
    with pytest.raises(CommandTimeout) as raised:
        sandbox.push(timeout=0.5)
    assert time.monotonic() - started < 0.5 + PROMPT
    assert raised.value.timeout == 0.5


@pytest.mark.parametrize("timeout", [0, -1, 0.0])
def test_a_timeout_that_is_not_positive_is_refused_before_any_request(
    double: Double, sandbox: Sandbox, timeout: float
) -> None:
    sent = len(double.requests)
    with pytest.raises(PiShipError) as raised:
        sandbox.files.read("data.bin", timeout=timeout)
    assert raised.value.code == CONFIG_INVALID
    assert len(double.requests) == sent


def test_a_cancel_already_set_raises_before_any_request(double: Double, sandbox: Sandbox) -> None:
    cancel = threading.Event()
    cancel.set()
    sent = len(double.requests)
    with pytest.raises(CommandCancelled):
        sandbox.files.write("other.bin", b"o", cancel=cancel)
    assert len(double.requests) == sent


def test_an_operation_after_a_timeout_works_again(double: Double, sandbox: Sandbox) -> None:
    double.faults.stall("/files" if isinstance(double, E2bServer) else "/download/")
    with pytest.raises(CommandTimeout):
        sandbox.files.read("data.bin", timeout=0.3)
    assert sandbox.files.read("data.bin", timeout=10) == b"x" * 1000


# -- the public surface ---------------------------------------------------------------


def test_sandbox_files_offers_the_file_operations_and_none_of_the_sync_plumbing() -> None:
    public = {name for name in dir(SandboxFiles) if not name.startswith("_")}

    assert public == {*FILE_OPERATIONS, *COPIES, "limits", "resolve", "working_directory"}


@pytest.mark.parametrize(
    "method",
    [getattr(SandboxFiles, name) for name in (*FILE_OPERATIONS, *COPIES)]
    + [Sandbox.push, Sandbox.pull],
    ids=lambda method: method.__qualname__,
)
def test_every_file_operation_takes_timeout_and_cancel_keywords(method: Any) -> None:
    parameters = inspect.signature(method).parameters

    assert parameters["timeout"].kind is inspect.Parameter.KEYWORD_ONLY
    assert parameters["cancel"].kind is inspect.Parameter.KEYWORD_ONLY
    assert parameters["timeout"].default is None and parameters["cancel"].default is None


def _files_timers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "piship-files-timer"]


def test_the_file_timer_thread_ends_with_dispose(sandbox: Sandbox) -> None:
    sandbox.files.read("data.bin", timeout=10)
    assert len(_files_timers()) == 1
    sandbox.dispose()
    assert _files_timers() == []


def test_the_file_timer_thread_ends_with_detach(sandbox: Sandbox) -> None:
    sandbox.files.read("data.bin", timeout=10)
    sandbox.detach()
    assert _files_timers() == []


def test_the_file_timer_thread_ends_when_an_undisposed_sandbox_is_collected(
    double: Double, tmp_path: Path
) -> None:
    backend: Any = (
        E2bCompatibleBackend(
            endpoint=double.url, envd_url=double.url, credential=lambda: "e2b-key-000001"
        )
        if isinstance(double, E2bServer)
        else kubernetes(double.url)
    )
    dropped = activate_sandbox(POLICY, backend=backend, workspace=tmp_path)
    dropped.files.exists("anything", timeout=10)
    assert len(_files_timers()) == 1
    with pytest.warns(ResourceWarning, match="garbage-collected"):
        del dropped
        gc.collect()
    assert _files_timers() == []
