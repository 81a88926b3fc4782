"""The fake sandbox router: header checks, routing to a Sandbox, proxy limits, ``/execute``.

Like agent-sandbox's Python router:

- ``X-Sandbox-ID`` (required) and ``X-Sandbox-Namespace`` must be DNS-1123 labels,
  ``X-Sandbox-Port`` 1..65535, ``X-Sandbox-Pod-IP`` an address that is not loopback,
  link-local, multicast or unspecified; otherwise 400 ``{"detail": …}``;
- it reaches the Sandbox by ``X-Sandbox-Pod-IP`` or, without one, by name (only when
  sandboxes have a Service, ``services``); a Sandbox that does not exist, has no such
  address, cannot be named, or whose pod is not ready is 502
  ``Could not connect to the backend sandbox: <id>`` (the router never answers 404);
- a command that outlives ``X-Sandbox-Timeout`` or the router's own limit (the
  smaller) is 504 ``Timed out waiting for the backend sandbox: <id>``.

The cluster's fault knobs (``expired``, ``router_gone``) make the router answer 404
``{}`` for ``pool-<claim>`` (what the backend's own tests pin), or the real router's 502
with ``real_router``.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs

from piship_remote.backends._sandbox_commands import working_directory_command
from piship_remote.testing.k8s_runtime import (
    FileTree,
    Reply,
    Runtime,
    decoded,
    spawn_failure,
    timed_out,
)
from piship_remote.testing.k8s_store import Store
from piship_remote.testing.recorder import DropConnection
from piship_remote.testing.sandbox_shell import Shell, script_of
from piship_remote.wire.agent_sandbox import SANDBOXES

__all__ = ["CHECK_MARKER", "SANDBOX_PREFIX", "Router", "RouterRequest", "RouterSettings"]

CHECK_MARKER = "piship-sandbox-ready"
_JOBS = "/piship-jobs/"  # in a detached job's scripts
SANDBOX_PREFIX = "pool-"

ExecuteAnswer = Mapping[str, Any]
Execute = Callable[[str], ExecuteAnswer]
Wait = Callable[[threading.Event | None, float | None], bool]

# The library's question for the runtime's working directory, answered by the runtime
# whatever a test's ``execute`` says (it could not answer it usefully).
_ASK_DIRECTORY = working_directory_command()
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_CONTROL_KEYS = frozenset({"after", "hang", "drop", "status", "body"})
_ANSWER_KEYS = _CONTROL_KEYS | {"stdout", "stderr", "exit_code"}


class RouterSettings(Protocol):
    expired: set[str]
    router_gone: set[str]
    real_router: bool
    pod_ip: str | None
    proxy_timeout: float
    runtime_timeout: float
    services: bool


@attrs.frozen
class RouterRequest:
    """A router request as the HTTP layer hands it over (header names lower-case)."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes
    upload: tuple[str | None, bytes | None] = (None, None)


@attrs.frozen
class _Target:
    sandbox: str
    claim: str
    limit: float


class _Refusal(Exception):
    def __init__(self, reply: Reply) -> None:
        super().__init__(reply.status)
        self.reply = reply


class Router:
    """Routes requests to the runtime of a live Sandbox in ``store``."""

    def __init__(
        self,
        store: Store,
        settings: RouterSettings,
        execute: Execute | None,
        wait: Wait,
        closing: Callable[[], bool],
        file_tree: Callable[[str], FileTree] | None = None,
        drop_next: Callable[[], bool] = lambda: False,
    ) -> None:
        self._drop_next = drop_next
        self._store = store
        self._in_memory = file_tree is None
        self._file_tree = file_tree or (lambda _claim: FileTree())
        self._settings = settings
        self._execute = execute
        self._wait = wait
        self._closing = closing
        self._lock = threading.Lock()
        self._trees: dict[str, FileTree] = {}

    def forget(self, claim: str) -> None:
        """Drop the files of ``claim``'s sandbox (it is gone)."""
        with self._lock:
            self._trees.pop(claim, None)

    def files(self, claim: str) -> dict[str, bytes]:
        """The files the runtime of ``claim``'s sandbox holds, by path."""
        return self._tree(claim).snapshot()

    def handle(self, request: RouterRequest) -> Reply:
        try:
            target = self._target(request)
        except _Refusal as refusal:
            return refusal.reply
        runtime = Runtime(self._tree(target.claim))
        path, method = request.path, request.method
        if path == "/execute" and method == "POST":
            return self._run(request, target)
        if path == "/upload" and method == "POST":
            return runtime.upload(*request.upload)
        for prefix, endpoint in (
            ("/download/", runtime.download),
            ("/list/", runtime.list),
            ("/exists/", runtime.exists),
        ):
            if path.startswith(prefix) and method == "GET":
                return endpoint(path[len(prefix) :])
        if path == "/" and method == "GET":
            return Reply(200, {"status": "ok", "message": "Sandbox Runtime is active."})
        return Reply(404, {"detail": "Not Found"})

    # ---- routing -----------------------------------------------------------------------

    def _target(self, request: RouterRequest) -> _Target:
        headers = request.headers
        sandbox = headers.get("x-sandbox-id")
        namespace = headers.get("x-sandbox-namespace", "default")
        if not sandbox:
            raise _Refusal(_detail(400, "X-Sandbox-ID header is required."))
        if len(sandbox) > 63 or not _LABEL.match(sandbox):
            raise _Refusal(_detail(400, "Invalid sandbox ID format."))
        if len(namespace) > 63 or not _LABEL.match(namespace):
            raise _Refusal(_detail(400, "Invalid namespace format."))
        port = headers.get("x-sandbox-port", "8888")
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise _Refusal(_detail(400, "Invalid port format."))
        sent_ip = headers.get("x-sandbox-pod-ip")
        if sent_ip is not None:
            _check_address(sent_ip)
        settings = self._settings
        if sandbox[len(SANDBOX_PREFIX) :] in settings.expired | settings.router_gone:
            raise _Refusal(self._unreachable(sandbox, knob_status=404))
        if settings.real_router and settings.pod_ip and sent_ip != settings.pod_ip:
            raise _Refusal(self._unreachable(sandbox, knob_status=502))
        found = self._find(namespace, sandbox, sent_ip)
        if found is None or (sent_ip is None and not settings.services):
            raise _Refusal(_detail(502, f"Could not connect to the backend sandbox: {sandbox}"))
        owner = (found["metadata"].get("ownerReferences") or [{}])[0].get("name", sandbox)
        return _Target(sandbox, str(owner), self._limit(headers.get("x-sandbox-timeout")))

    def _find(self, namespace: str, sandbox: str, ip: str | None) -> dict[str, Any] | None:
        candidates = [
            s
            for s in self._store.objects(SANDBOXES, namespace)
            if _pod_ready(s)
            and (
                (ip is None and s["metadata"]["name"] == sandbox)
                or (ip is not None and ip in ((s.get("status") or {}).get("podIPs") or []))
            )
        ]
        named = [s for s in candidates if s["metadata"]["name"] == sandbox]
        return (named or candidates)[0] if candidates else None

    def _limit(self, header: str | None) -> float:
        limit = float(self._settings.proxy_timeout)
        try:
            asked = float(header) if header is not None else limit
        except ValueError:
            asked = limit
        return min(limit, asked) if asked > 0 else limit

    def _unreachable(self, sandbox: str, *, knob_status: int) -> Reply:
        if not self._settings.real_router:
            return Reply(knob_status, {})
        return _detail(502, f"Could not connect to the backend sandbox: {sandbox}")

    def _tree(self, claim: str) -> FileTree:
        with self._lock:
            if claim not in self._trees:
                self._trees[claim] = self._file_tree(claim)
            return self._trees[claim]

    # ---- /execute ----------------------------------------------------------------------

    def _run(self, request: RouterRequest, target: _Target) -> Reply:
        try:
            body = json.loads(request.body)
        except ValueError:
            body = None
        command = body.get("command") if isinstance(body, dict) else None
        if not isinstance(command, str):
            detail = [
                {
                    "type": "missing",
                    "loc": ["body", "command"],
                    "msg": "Field required",
                    "input": body,
                }
            ]
            return Reply(422, {"detail": detail})
        failure = spawn_failure(command)
        if failure is not None:
            return Reply(200, {"stdout": "", "stderr": failure, "exit_code": 1})
        answer = self._answer(command, target.claim)
        if self._drop_next():
            answer = {**answer, "drop": True}
        runtime_limit = float(self._settings.runtime_timeout)
        if answer.get("hang") or answer.get("after") is not None:
            budget = min(target.limit, runtime_limit)
            if not self._wait(answer.get("after"), budget):
                if self._closing():
                    raise DropConnection
                if runtime_limit <= target.limit:
                    return Reply(200, timed_out(command, runtime_limit))
                return _detail(504, f"Timed out waiting for the backend sandbox: {target.sandbox}")
        return self._reply(request, answer)

    def _answer(self, command: str, claim: str) -> ExecuteAnswer:
        if CHECK_MARKER in command and _JOBS not in command:  # a detached job's launch runs
            unlisted = "1" if "'PISHIP_PROBE_UNLISTED=" in command else "unset"
            return {"stdout": f"{CHECK_MARKER} {unlisted}\n", "exit_code": 0}
        if self._in_memory:
            tree = self._tree(claim)
            shell = Shell(tree.memory, tree.base)
            argv = shlex.split(command)
            asks_directory = script_of(argv) == _ASK_DIRECTORY
            if shell.takes_argv(argv, self._execute is None or asks_directory):
                return shell.run_argv(argv).answer()
        answer = dict(self._execute(command)) if self._execute else {"stdout": "", "exit_code": 0}
        unknown = set(answer) - _ANSWER_KEYS
        if unknown:
            raise ValueError(f"KubernetesServer: unknown execute answer keys {sorted(unknown)}")
        return answer

    def _reply(self, request: RouterRequest, answer: ExecuteAnswer) -> Reply:
        if answer.get("drop"):
            raise DropConnection
        status = answer.get("status")
        if "body" in answer:
            return Reply(int(status or 200), answer["body"])
        if status is not None:
            who = request.headers.get("authorization") or "anonymous"
            message = f"forbidden: {who} may not execute in this sandbox"
            return Reply(int(status), {"message": message})
        result: dict[str, Any] = {"stdout": answer.get("stdout", ""), "stderr": ""}
        result.update({k: v for k, v in answer.items() if k not in _CONTROL_KEYS})
        return Reply(200, decoded(result))


def _detail(status: int, detail: str) -> Reply:
    return Reply(status, {"detail": detail})


def _check_address(value: str) -> None:
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        raise _Refusal(_detail(400, "Invalid target IP address format.")) from None
    if (
        address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or (address.is_unspecified)
    ):
        raise _Refusal(_detail(400, "Invalid target IP address."))


def _pod_ready(sandbox: dict[str, Any]) -> bool:
    for condition in (sandbox.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False
