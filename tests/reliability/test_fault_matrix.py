"""The fault matrix: every request the library makes, under every fault, on both backends.

One test id per cell, ``test_cell[<backend>-<request>-<fault>]``. A cell activates a
sandbox through a :class:`~fault_layer.FaultProxy` in front of the normal double,
arms one fault for one request, runs the step that sends it (activation, a command,
or dispose), then a follow-up, then disposes, and checks:

- the step's outcome is the expected one, and any error is typed
  (``PiShipError``/``CommandTimeout``/``CommandCancelled``) with a clear one-line
  message that carries no secret (every fault body echoes the credentials);
- no command was sent twice (each command's Start or ``/execute`` arrives at most
  once), and an error that says the outcome is unknown is not retryable;
- the sandbox is usable afterwards or cleanly retired: the follow-up command works,
  or raises ``SANDBOX_UNAVAILABLE`` promptly; a failed activation leaves the
  backend able to activate again;
- after dispose the double holds no sandbox or claim (except where the delete
  itself met the fault: then the request was attempted and the lifetime bounds it;
  a create whose answer was lost is resolved: the claim is read by its name, the
  E2B create sent again with its ``Idempotency-Key``, which the double honours);
- no library thread outlives dispose.

Requests (the reference catalogues): E2B ``health``, ``create``, ``renew``, ``start``
(``/process.Process/Start``), ``signal`` (SendSignal), ``delete``; Kubernetes
``list``, ``claim-create``, ``claim-ready`` (the readiness GET), ``claim-check``
(the GET before a command), ``patch`` (the renewal before a command), ``execute``,
``claim-delete``. Faults: :data:`fault_layer.FAULTS`.

Short deadlines: ``stream_idle_timeout`` is an option; the other request deadlines
are module constants (``CONTROL_TIMEOUT``, ``HEALTH_TIMEOUT``, ``SIGNAL_TIMEOUT`` in
``backends.e2b``; ``_API_TIMEOUT``, ``_AVAILABLE_TIMEOUT`` in
``backends.kubernetes``), patched here. ``/execute`` has no deadline by design, so
its stall is ended by the command's ``timeout=``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from fault_layer import FAULTS, STATUS_FAULTS, Door, FaultProxy
from reliability_support import (
    API_KEY,
    BEARER,
    HOST_ENV,
    Outcome,
    attempt,
    check_error,
    library_threads,
    policy,
    settled,
)

import piship_remote.backends.e2b._control as e2b_control
import piship_remote.backends.e2b._files as e2b_files
import piship_remote.backends.e2b._instance as e2b_envd
import piship_remote.backends.kubernetes._claims_api as k8s_claims
import piship_remote.backends.kubernetes._files as k8s_files
import piship_remote.backends.kubernetes._http as k8s_http
from piship_remote.backends._sandbox_commands import working_directory_command
from piship_remote.backends.base import Backend
from piship_remote.backends.e2b.backend import E2bCompatibleBackend
from piship_remote.backends.kubernetes.backend import KubernetesAgentSandboxBackend
from piship_remote.backends.kubernetes.claims import (
    DEFAULT_EXISTENCE_WINDOW as EXISTENCE_WINDOW,
)
from piship_remote.model.errors import CommandTimeout, PiShipError
from piship_remote.sandbox.activation import Sandbox, activate_sandbox
from piship_remote.testing import Cluster, E2bServer, KubernetesServer, RecordingServer

pytestmark = pytest.mark.timeout(30)

STALL_DEADLINE = 0.5  # every request deadline in the matrix
SETTLE = 1.0
PROMPT = 3.0  # "promptly": a follow-up that fails must fail within this
HANG_TIMEOUT = 0.2  # the command timeout that makes the E2B cells send SendSignal
T = 1790618400.0

E2B_FILE_REQUESTS = ("files-get", "files-post", "stat", "list-dir", "make-dir", "remove")
E2B_REQUESTS = ("health", "create", "renew", "start", "signal", "delete", *E2B_FILE_REQUESTS)
K8S_REQUESTS = (
    "list",
    "claim-create",
    "claim-ready",
    "claim-check",
    "patch",
    "execute",
    "claim-delete",
    "upload",
    "download",
    "list-files",
    "exists",
)
# The runtime's file endpoints: a file call never has an "unknown" outcome.
FILE_REQUESTS = ("upload", "download", "list-files", "exists")
# The step in which each request is faulted.
PHASE = {
    "health": "activate",
    "create": "activate",
    "renew": "exec",
    "start": "exec",
    "signal": "exec",
    "delete": "dispose",
    "list": "activate",
    "claim-create": "activate",
    "claim-ready": "activate",
    "claim-check": "exec",
    "patch": "exec",
    "execute": "exec",
    "claim-delete": "dispose",
    **dict.fromkeys(FILE_REQUESTS, "files"),
    **dict.fromkeys(E2B_FILE_REQUESTS, "files"),
}
# For "refused": which door shuts, and after how many more connections (requests).
REFUSE = {
    "health": ("control", 0),
    "create": ("control", 1),
    "renew": ("control", 0),
    "start": ("envd", 0),
    "signal": ("envd", 1),
    "delete": ("control", 0),
    "list": ("api", 0),
    "claim-create": ("api", 1),
    "claim-ready": ("api", 2),
    "claim-check": ("api", 0),
    "patch": ("api", 0),
    "execute": ("router", 0),
    "claim-delete": ("api", 0),
    **{request: ("router", 0) for request in FILE_REQUESTS},
    **{request: ("envd", 0) for request in E2B_FILE_REQUESTS},
}
# The proxy's name for the request a row faults.
PROXY_KIND = {"claim-ready": "claim-get", "claim-check": "claim-get"}
FORWARDED = ("html", "nonjson", "drop-before", "drop-mid", "stall")


@attrs.frozen
class Cell:
    backend: str
    request: str
    fault: str

    @property
    def id(self) -> str:
        return f"{self.backend}-{self.request}-{self.fault}"


CELLS = [Cell("e2b", r, f) for r in E2B_REQUESTS for f in FAULTS] + [
    Cell("k8s", r, f) for r in K8S_REQUESTS for f in FAULTS
]


# ---------------------------------------------------------------- expectations


@attrs.frozen
class Expect:
    """The outcome a cell's faulted step must have."""

    ok: bool  # the step succeeds despite the fault (else it raises a typed error)
    error: type[BaseException] = PiShipError
    leftover: str | None = None  # why a sandbox or claim may outlive dispose
    orphan: bool = False  # the leftover's ID never arrived: the error must say it may exist


def expect(cell: Cell) -> Expect:
    """What the reference and the library's design promise for ``cell``."""
    request, fault = cell.request, cell.fault
    if request in FILE_REQUESTS:
        return _file_expect(request, fault)
    if request in E2B_FILE_REQUESTS:
        return _envd_file_expect(request, fault)
    status = fault in STATUS_FAULTS
    garbage_2xx = fault in ("html", "nonjson")
    if request in ("delete", "claim-delete"):
        refused_delete = fault == "refused" or (status and fault != "401")
        why = "the service refused the DELETE, which is not retried; the lifetime removes it"
        return Expect(ok=True, leftover=why if refused_delete else None)
    if request == "signal":
        return Expect(ok=False, error=CommandTimeout)
    renewable_401 = fault == "401" and request in (
        "renew",
        "list",
        "claim-ready",
        "claim-check",
        "patch",
    )
    if renewable_401:
        return Expect(ok=True)  # the credential is renewed and the request repeated once
    if request in ("health", "list", "renew", "claim-check", "patch") and garbage_2xx:
        return Expect(ok=True)  # a 2xx whose body is not needed
    if request == "create" and fault in ("429", "503"):
        return Expect(ok=True)  # nothing was created: the create is repeated
    if request == "claim-create" and (fault == "409" or garbage_2xx):
        return Expect(ok=True)  # 409: a fresh name; 2xx: the body is not needed
    if request == "claim-create" and fault in ("drop-before", "drop-mid", "stall"):
        return Expect(ok=True)  # the lost answer is resolved: the claim is read by its name
    if request in ("claim-check", "patch") and fault == "404":
        return Expect(ok=True)  # the claim is gone: the command runs in a new one
    if request == "execute" and fault == "stall":
        return Expect(ok=False, error=CommandTimeout)
    if request == "create" and fault in FORWARDED:
        # The lost answer is resolved: the create is repeated with its Idempotency-Key.
        return Expect(ok=True)
    if request == "claim-ready" and fault == "refused":
        why = "the API was down for the cleanup too; the claim's shutdownTime removes it"
        return Expect(ok=False, leftover=why)
    return Expect(ok=False)


def _file_expect(request: str, fault: str) -> Expect:
    if fault == "401" and request != "upload":
        return Expect(ok=True)  # a GET is repeated once with the renewed credential
    if request == "upload" and fault in ("html", "nonjson"):
        return Expect(ok=True)  # the upload took effect; its answer's body is not needed
    if request == "download" and fault == "nonjson":
        # A 200 octet-stream body is the file, whatever it holds: no client can tell.
        return Expect(ok=True)
    return Expect(ok=False)


def _envd_file_expect(request: str, fault: str) -> Expect:
    garbage_2xx = fault in ("html", "nonjson")
    if request == "files-get" and garbage_2xx:
        # envd serves a file with the type its name suggests, so a 200 of any type is the
        # file's bytes: no client can tell a page in its place.
        return Expect(ok=True)
    if request in ("make-dir", "remove") and garbage_2xx:
        return Expect(ok=True)  # it took effect; its answer's body is not needed
    return Expect(ok=False)


class Leaked(AssertionError):
    """A sandbox or claim outlived dispose without a reason."""


# ---------------------------------------------------------------- the harness


def e2b_kind(method: str, path: str) -> str | None:
    if path == "/health":
        return "health"
    if path == "/sandboxes" and method == "POST":
        return "create"
    if path.startswith("/sandboxes/") and path.endswith("/timeout"):
        return "renew"
    if path.startswith("/sandboxes/") and method == "DELETE":
        return "delete"
    if path == "/process.Process/Start":
        return "start"
    if path == "/process.Process/SendSignal":
        return "signal"
    if path == "/files":
        return {"GET": "files-get", "POST": "files-post"}.get(method)
    if path.startswith("/filesystem.Filesystem/"):
        return _FILESYSTEM_KINDS.get(path.rsplit("/", 1)[-1])
    return None


_FILESYSTEM_KINDS = {
    "Stat": "stat",
    "ListDir": "list-dir",
    "MakeDir": "make-dir",
    "Remove": "remove",
}


_CLAIM_PATH = re.compile(r"^/apis/[^?]*/sandboxclaims(?P<one>/[^/?]+)?$")


def k8s_kind(method: str, path: str) -> str | None:
    if path == "/execute":
        return "execute"
    if path == "/upload" and method == "POST":
        return "upload"
    for prefix, kind in (
        ("/download/", "download"),
        ("/list/", "list-files"),
        ("/exists/", "exists"),
    ):
        if path.startswith(prefix) and method == "GET":
            return kind
    match = _CLAIM_PATH.match(path)
    if match is None:
        return None
    if match.group("one") is None:
        return {"GET": "list", "POST": "claim-create"}.get(method)
    return {"GET": "claim-get", "PATCH": "patch", "DELETE": "claim-delete"}.get(method)


class Clock:
    """A settable clock (the Kubernetes claim lifetime is measured on it)."""

    def __init__(self) -> None:
        self.value = T

    def __call__(self) -> float:
        return self.value


@attrs.define
class Harness:
    """One cell's double, proxy, doors and backend."""

    cell: Cell
    mock: E2bServer | KubernetesServer
    proxy: FaultProxy
    doors: dict[str, Door]
    workspace: Path
    clock: Clock = attrs.field(factory=Clock)
    backend: Backend | None = None

    def url(self, plane: str) -> str:
        door = self.doors.get(plane)
        return door.url if door is not None else self.proxy.url

    def make_backend(self) -> Backend:
        if self.cell.backend == "e2b":
            idle = 5.0 if self.cell.request == "signal" else STALL_DEADLINE
            self.backend = E2bCompatibleBackend(
                endpoint=self.url("control"),
                envd_url=self.url("envd"),
                credential=lambda: API_KEY,
                credential_rejected=lambda: True,
                stream_idle_timeout=idle,
                idempotent_creates=True,
            )
        else:
            self.backend = KubernetesAgentSandboxBackend(
                endpoint=self.url("api"),
                router=self.url("router"),
                template="python-pool",
                namespace="agents",
                poll_interval=0.01,
                lifetime_seconds=60,
                now=self.clock,
                monotonic=self.clock,
                credential=lambda: BEARER,
                credential_rejected=lambda: True,
            )
        return self.backend

    def activate(self) -> Sandbox:
        assert self.backend is not None
        return activate_sandbox(
            policy("deny" if self.cell.backend == "e2b" else "allow"),
            backend=self.backend,
            workspace=self.workspace,
            env=HOST_ENV,
            settle_timeout=SETTLE,
            probe_timeout=5.0,
        )

    def inject(self) -> None:
        cell = self.cell
        if cell.request == "patch":
            self.clock.value += 40  # 20 s of a 60 s lifetime left: renewed before the command
        if cell.request == "claim-check":
            self.clock.value += EXISTENCE_WINDOW  # past the window: checked before the command
        if cell.fault == "refused":
            plane, after = REFUSE[cell.request]
            self.doors[plane].shut(after=after)
        else:
            self.proxy.arm(PROXY_KIND.get(cell.request, cell.request), cell.fault)

    def restore(self) -> None:
        self.proxy.disarm()
        for door in self.doors.values():
            door.reopen()

    def commands_sent(self, marker: str) -> int:
        """How many command requests (Start or /execute) carried ``marker``."""
        path = "/process.Process/Start" if self.cell.backend == "e2b" else "/execute"
        return sum(marker.encode() in r.body for r in self.proxy.find("POST", path))

    def leftovers(self) -> list[str]:
        if isinstance(self.mock, E2bServer):
            return self.mock.live_sandboxes
        return self.mock.live_claims


def _e2b_command(start: dict[str, Any]) -> dict[str, Any]:
    script = start["process"]["args"][2]
    return {"hang": True} if script.startswith("sleep") else {"stdout": f"ran {script}\n"}


@pytest.fixture
def harness(
    request: pytest.FixtureRequest,
    e2b_server: Callable[..., E2bServer],
    kubernetes_server: Callable[..., KubernetesServer],
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Harness]:
    cell: Cell = request.param
    for module, name in (
        (e2b_control, "CONTROL_TIMEOUT"),
        (e2b_control, "HEALTH_TIMEOUT"),
        (e2b_envd, "SIGNAL_TIMEOUT"),
        (k8s_http, "API_TIMEOUT"),
        (k8s_claims, "_AVAILABLE_TIMEOUT"),
        (k8s_files, "FILE_TIMEOUT"),
        (k8s_files, "TRANSFER_IDLE"),
        (e2b_files, "FILE_TIMEOUT"),
        (e2b_files, "TRANSFER_IDLE"),
    ):
        monkeypatch.setattr(module, name, STALL_DEADLINE)
    mock: E2bServer | KubernetesServer
    if cell.backend == "e2b":
        mock = e2b_server(command=_e2b_command, api_key=API_KEY)
        planes = ("control", "envd")
    else:
        mock = kubernetes_server(_k8s_command, Cluster(token=BEARER))
        planes = ("api", "router")
    proxy = FaultProxy(mock.url, e2b_kind if cell.backend == "e2b" else k8s_kind)
    doors = {plane: Door(proxy.url) for plane in planes} if cell.fault == "refused" else {}
    h = Harness(cell, mock, proxy, doors, workspace)
    try:
        yield h
    finally:
        if h.backend is not None:
            h.backend.close()  # type: ignore[attr-defined]
        for door in doors.values():
            door.close()
        mock.close()  # first: releases the requests the proxy still forwards
        proxy.close()


# ---------------------------------------------------------------- the cells


@pytest.mark.parametrize("harness", [pytest.param(c, id=c.id) for c in CELLS], indirect=True)
def test_cell(harness: Harness) -> None:
    h, cell = harness, harness.cell
    want = expect(cell)
    threads_before = library_threads()
    h.make_backend()
    phase = PHASE[cell.request]
    deploy, after = f"deploy-{cell.id}", f"after-{cell.id}"
    if cell.request == "signal":
        deploy = f"sleep-{cell.id}"

    sandbox: Sandbox | None = None
    if phase == "activate":
        h.inject()
        outcome = attempt(h.activate)
        h.restore()
        _check_outcome(outcome, want)
        sandbox = outcome.value if outcome.error is None else _reactivates(h)
        assert sandbox.exec(after).exit_code == 0
    elif phase == "files":
        sandbox = h.activate()
        step = _file_step(sandbox, cell.request, h.workspace)
        before = sorted(os.listdir(h.workspace))
        h.inject()
        outcome = attempt(step)
        h.restore()
        _check_outcome(outcome, want)
        _check_host_whole(h.workspace, before, outcome)
        if outcome.error is not None:
            assert "unknown" not in str(outcome.error), str(outcome.error)
        elif cell.fault not in ("nonjson", "html"):
            assert outcome.value == _FILE_RESULT[cell.request], outcome.value
        _follow_up(sandbox, after)
    elif phase == "exec":
        sandbox = h.activate()
        h.inject()
        timeout = CELL_TIMEOUT.get(cell.request, {}).get(cell.fault)
        outcome = attempt(lambda: sandbox.exec(deploy, timeout=timeout))  # type: ignore[union-attr]
        if cell.request == "signal":
            _await_kill(h)
        h.restore()
        _check_outcome(outcome, want)
        _follow_up(sandbox, after)
    else:
        sandbox = h.activate()
        assert sandbox.exec(deploy).exit_code == 0
        h.inject()
        outcome = attempt(sandbox.dispose)
        h.restore()
        _check_outcome(outcome, want)
        assert outcome.seconds < STALL_DEADLINE * 2 + 1.0, "dispose waited too long"
        _retired(sandbox, after)

    sandbox.dispose()
    h.backend.close()  # type: ignore[union-attr]

    _check_fault_applied(h, outcome)

    for marker in (deploy, after):
        assert h.commands_sent(marker) <= 1, f"{marker} was sent more than once"
    if outcome.error is not None and "unknown" in str(outcome.error):
        assert h.commands_sent(deploy) == 1
    _check_leftovers(h, want, outcome)
    assert settled(lambda: library_threads() <= threads_before), (
        f"library threads outlived dispose: {sorted(t.name for t in library_threads())}"
    )
    assert h.mock.errors == [] and h.proxy.errors == []


_FILE_RESULT: dict[str, object] = {
    "upload": None,
    "download": b"data",
    "list-files": ["f.txt"],
    "exists": True,
    "files-post": None,
    "files-get": b"data",
    "stat": True,
    "list-dir": ["f.txt"],
    "make-dir": True,
    "remove": False,
}
DOWNLOADED = "got.txt"


def _file_step(sandbox: Sandbox, request: str, workspace: Path) -> Callable[[], object]:
    """The file call that sends ``request`` (its file written first where it needs one)."""
    files = sandbox.files
    if request in E2B_FILE_REQUESTS:
        return _envd_file_step(sandbox, request, workspace)
    if request == "upload":
        return lambda: files.write("/app/f.txt", b"data") and None
    files.write("/app/f.txt", b"data")
    if request == "download":
        return lambda: files.read("/app/f.txt")
    if request == "list-files":
        return lambda: [info.name for info in files.list("/app")]
    return lambda: files.exists("/app/f.txt")


def _envd_file_step(sandbox: Sandbox, request: str, workspace: Path) -> Callable[[], object]:
    files = sandbox.files
    if request == "files-post":
        return lambda: files.write("f.txt", b"data") and None
    files.write("f.txt", b"data")
    if request == "files-get":
        got = workspace / DOWNLOADED
        return lambda: files.download("f.txt", got) and got.read_bytes()
    if request == "stat":
        return lambda: files.exists("f.txt")
    if request == "list-dir":
        return lambda: [info.name for info in files.list(".")]
    if request == "make-dir":
        return lambda: files.make_dir("made")
    return lambda: files.remove("f.txt") or files.exists("f.txt")


def _check_host_whole(workspace: Path, before: list[str], outcome: Outcome) -> None:
    """A failed file call leaves the host workspace as it was: no half file, no temporary."""
    after = sorted(os.listdir(workspace))
    if outcome.error is not None:
        assert after == before, f"the failed call left {sorted(set(after) - set(before))}"
    else:
        assert set(after) <= {*before, DOWNLOADED}, after


def _k8s_command(command: str) -> dict[str, Any]:
    """The runtime: ``pwd`` is its base ``/app``; a stat finds the 4-byte file."""
    if working_directory_command() in command:
        return {"stdout": "/app\n", "exit_code": 0}
    if "echo symlink 0" in command:
        return {"stdout": "file 4\n", "exit_code": 0}
    return {"stdout": "ok\n", "exit_code": 0}


# The command timeout of the faulted command, where one is needed.
CELL_TIMEOUT: dict[str, dict[str, float]] = {
    "signal": dict.fromkeys(FAULTS, HANG_TIMEOUT),
    "execute": {"stall": STALL_DEADLINE},
}


def _check_fault_applied(h: Harness, outcome: Outcome) -> None:
    """The armed fault really met its request (a cell that tests nothing must fail)."""
    cell = h.cell
    if cell.fault != "refused":
        kind = PROXY_KIND.get(cell.request, cell.request)
        assert [(k, f) for k, f, _ in h.proxy.injected] == [(kind, cell.fault)]
    elif outcome.error is not None and cell.request != "signal":
        assert "ECONNREFUSED" in str(outcome.error), str(outcome.error)


def _await_kill(h: Harness) -> None:
    """SendSignal is fire-and-forget: let it meet its fault before the fault is disarmed."""
    if h.cell.fault != "refused":
        h.proxy.wait_for("POST", "/process.Process/SendSignal")
    # The kill thread starts before exec() returns; a refused one ends at once.
    assert settled(lambda: not any(t.name == "piship-e2b-signal" for t in library_threads()))


def _check_outcome(outcome: Outcome, want: Expect) -> None:
    if want.ok:
        assert outcome.error is None, f"expected success, got {outcome.error!r}"
        return
    assert outcome.error is not None, "expected a typed error, the step succeeded"
    check_error(outcome.error)
    assert isinstance(outcome.error, want.error), repr(outcome.error)


def _reactivates(h: Harness) -> Sandbox:
    """After a failed activation the same backend activates again once the fault is gone."""
    return h.activate()


def _follow_up(sandbox: Sandbox, command: str) -> None:
    """The next command works, or the sandbox says promptly that it is unavailable."""
    outcome = attempt(lambda: sandbox.exec(command, timeout=PROMPT + 2))
    if outcome.error is None:
        assert outcome.value.exit_code == 0
        return
    check_error(outcome.error)
    assert isinstance(outcome.error, PiShipError), repr(outcome.error)
    assert outcome.error.code == "SANDBOX_UNAVAILABLE", repr(outcome.error)
    assert outcome.seconds < PROMPT


def _retired(sandbox: Sandbox, command: str) -> None:
    outcome = attempt(lambda: sandbox.exec(command))
    assert isinstance(outcome.error, PiShipError), repr(outcome.error)
    assert outcome.error.code == "SANDBOX_UNAVAILABLE"
    assert outcome.seconds < PROMPT


def _check_leftovers(h: Harness, want: Expect, outcome: Outcome) -> None:
    leftovers = h.leftovers()
    if not leftovers:
        return
    if want.leftover is None:
        raise Leaked(f"leaked after dispose: {leftovers}")
    if want.orphan:
        # The create carries no unique mark to find it by, so the user is told instead.
        assert len(leftovers) == 1, leftovers
        assert "a sandbox may have been created" in str(outcome.error), str(outcome.error)
        return
    # Acceptable only because a DELETE could not get through: then it was attempted
    # (the proxy saw it, or the door refused it) and the lifetime bounds the leftover.
    deletes = h.proxy.find("DELETE")
    assert deletes or h.cell.fault == "refused", "no DELETE was even attempted"


def _recorded(server: RecordingServer) -> list[str]:  # debugging aid for failures
    return [f"{r.method} {r.path}" for r in server.requests]
