"""A fake Kubernetes API plus agent-sandbox router on one loopback server.

    cluster = Cluster(expired=set())
    with KubernetesServer(lambda command: {"stdout": "ok\\n", "exit_code": 0}, cluster) as mock:
        backend = KubernetesAgentSandboxBackend(
            endpoint=mock.url, router=mock.url, template="python-pool", namespace="agents")
        ...
        cluster.expired.add(name)             # the cluster removed that claim
        assert mock.count("POST", CLAIMS) == 1

Routes (the seed's mock, reference kubernetes-backend.md §9), every answer JSON:

- With ``cluster.token`` set, every request must carry ``Authorization: Bearer
  <token>``, else 401 ``{"message":"Unauthorized: <the header, or no token>"}``.
- ``GET <claims>`` (any query): ``{"items":[]}``.
- ``POST <claims>``: ``cluster.create_status`` (>= 400) with an RBAC-style Status that
  echoes the bearer, else 201 echoing the body. A created claim is live until a
  successful DELETE or until its name is put in ``cluster.expired``.
- ``DELETE <claims>/<name>``: ``cluster.delete_status`` (default 200); >= 400 answers
  ``{"message":"etcd unavailable"}``. The claim is still served afterwards.
- ``PATCH <claims>/<name>``: held until ``cluster.patch_gate`` is set, then 404 ``{}``
  when expired, else 200 ``{}``.
- ``GET <claims>/<name>``: 404 when expired; the first poll of a name (every poll with
  ``never_ready``) is ``Ready: "False"``, later ones ``Ready: "True"`` with
  ``status.sandbox.name = "pool-<name>"`` (and ``podIPs: [cluster.pod_ip]`` when set).
- ``POST /execute``: 404 ``{}`` when ``X-Sandbox-ID`` minus its first 5 characters is
  expired or in ``cluster.router_gone``; the activation check (``piship-sandbox-ready``)
  is answered ``piship-sandbox-ready <1 if 'PISHIP_PROBE_UNLISTED= was sent, else
  unset>\\n``; any other command goes to ``execute(command)`` (default: empty, exit 0).
- anything else: 404 ``{}``.

``<claims>`` is the SandboxClaim collection of any namespace; :data:`CLAIMS` is the one
for namespace ``agents``. With ``cluster.real_router`` the router behaves like the real
one instead (agent-sandbox-real-protocol.md §2): a gone sandbox is 502
``{"detail":"Could not connect to the backend sandbox: <id>"}``, and when
``cluster.pod_ip`` is set a request without that ``X-Sandbox-Pod-IP`` gets the same 502.

``execute(command)`` returns a mapping with any of:

==============  =====================================================================
``stdout``      text in the result
``stderr``      text in the result (``""`` when absent)
``exit_code``   in the result only when given
``after``       a ``threading.Event``: answer only once it is set
``hang``        True: never answer; the connection is dropped when the server closes
``drop``        True: close the connection without any response
``status``      answer with this HTTP status and ``{"message":"forbidden: <bearer or
                anonymous> may not execute in this sandbox"}`` (or ``body``)
``body``        answer with this body verbatim (text, bytes or a JSON value) instead of
                the result object, with ``status`` (default 200)
==============  =====================================================================

Every event the server waits on (``after``, ``patch_gate``) is set when it closes.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from werkzeug import Request, Response

from piship_remote.testing.recorder import DropConnection, RecordingServer, json_response

__all__ = ["CLAIMS", "Cluster", "ExecuteAnswer", "KubernetesServer", "claims_path"]

CHECK_MARKER = "piship-sandbox-ready"
SANDBOX_PREFIX = "pool-"


def claims_path(namespace: str) -> str:
    """The SandboxClaim collection path of ``namespace``."""
    return f"/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/{namespace}/sandboxclaims"


CLAIMS = claims_path("agents")
"""The claims collection for namespace ``agents`` (the seed's)."""

ExecuteAnswer = Mapping[str, Any]
Execute = Callable[[str], ExecuteAnswer]

_CLAIM_PATH = re.compile(
    r"^/apis/extensions\.agents\.x-k8s\.io/v1beta1/namespaces/(?P<ns>[^/]+)/sandboxclaims"
    r"(?:/(?P<name>[^/]+))?$"
)
_CONTROL_KEYS = frozenset({"after", "hang", "drop", "status", "body"})
_ANSWER_KEYS = _CONTROL_KEYS | {"stdout", "stderr", "exit_code"}


@attrs.define
class Cluster:
    """The mock cluster's state; tests may change any field while the server runs."""

    token: str | None = None
    create_status: int | None = None
    delete_status: int | None = None
    expired: set[str] = attrs.field(factory=set)
    router_gone: set[str] = attrs.field(factory=set)
    patch_gate: threading.Event | None = None
    never_ready: bool = False
    pod_ip: str | None = None
    """When set, ready claims report ``status.sandbox.podIPs == [pod_ip]``."""
    real_router: bool = False
    """Answer like the real router: 502 for gone sandboxes, and require ``X-Sandbox-Pod-IP``."""


class KubernetesServer(RecordingServer):
    """The started fake cluster; see the module docstring for its routes and answers."""

    def __init__(self, execute: Execute | None = None, cluster: Cluster | None = None) -> None:
        self.cluster = cluster if cluster is not None else Cluster()
        self._execute = execute
        self._state = threading.Lock()
        self._created: list[str] = []
        self._deleted: set[str] = set()
        self._polls: dict[str, int] = {}
        super().__init__(self._handle)

    @property
    def live_claims(self) -> list[str]:
        """Claims created, not deleted successfully, and not expired, in creation order."""
        expired = set(self.cluster.expired)
        with self._state:
            return [n for n in self._created if n not in self._deleted and n not in expired]

    # ---- routing ---------------------------------------------------------------------

    def _handle(self, request: Request) -> Response:
        authorization = request.headers.get("Authorization")
        token = self.cluster.token
        if token is not None and authorization != f"Bearer {token}":
            return json_response(401, {"message": f"Unauthorized: {authorization or 'no token'}"})
        if request.path == "/execute" and request.method == "POST":
            return self._router(request)
        match = _CLAIM_PATH.match(request.path)
        if match is None:
            return json_response(404, {})
        name = match.group("name")
        if name is None:
            return self._collection(request, match.group("ns"))
        return self._claim(request, name)

    def _collection(self, request: Request, namespace: str) -> Response:
        if request.method == "POST":
            return self._create(request, namespace)
        if request.method == "GET":
            return json_response(200, {"items": []})
        return json_response(404, {})

    def _create(self, request: Request, namespace: str) -> Response:
        status = self.cluster.create_status
        if status is not None and status >= 400:
            who = request.headers.get("Authorization") or "anonymous"
            return json_response(
                status,
                {
                    "kind": "Status",
                    "reason": "Forbidden",
                    "message": f"sandboxclaims is forbidden: {who} cannot create resource "
                    f'"sandboxclaims" in namespace "{namespace}"',
                },
            )
        name = _claim_name(request.get_data())
        if name is not None:
            with self._state:
                self._created.append(name)
        return json_response(201, request.get_data())

    def _claim(self, request: Request, name: str) -> Response:
        if request.method == "DELETE":
            return self._delete(name)
        if request.method == "PATCH":
            gate = self.cluster.patch_gate
            if gate is not None and not self.wait(gate):
                raise DropConnection
            return json_response(404 if name in self.cluster.expired else 200, {})
        if name in self.cluster.expired:
            return json_response(404, {})
        return json_response(200, self._claim_status(name))

    def _delete(self, name: str) -> Response:
        status = self.cluster.delete_status or 200
        if status >= 400:
            return json_response(status, {"message": "etcd unavailable"})
        with self._state:
            self._deleted.add(name)
        return json_response(status, {})

    def _claim_status(self, name: str) -> dict[str, Any]:
        with self._state:
            polls = self._polls[name] = self._polls.get(name, 0) + 1
        if polls == 1 or self.cluster.never_ready:
            return {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
        sandbox: dict[str, Any] = {"name": SANDBOX_PREFIX + name}
        if self.cluster.pod_ip is not None:
            sandbox["podIPs"] = [self.cluster.pod_ip]
        return {"status": {"conditions": [{"type": "Ready", "status": "True"}], "sandbox": sandbox}}

    # ---- router ----------------------------------------------------------------------

    def _router(self, request: Request) -> Response:
        sandbox = request.headers.get("X-Sandbox-ID", "")
        if sandbox[len(SANDBOX_PREFIX) :] in self.cluster.expired | self.cluster.router_gone:
            return self._unreachable(sandbox, real=404)
        pod_ip = self.cluster.pod_ip
        sent_ip = request.headers.get("X-Sandbox-Pod-IP")
        if self.cluster.real_router and pod_ip and sent_ip != pod_ip:
            return self._unreachable(sandbox, real=502)
        command = json.loads(request.get_data())["command"]
        if not isinstance(command, str):
            raise ValueError("the /execute body has no command string")
        answer = self._answer(command)
        return self._respond(request, answer)

    def _unreachable(self, sandbox: str, *, real: int) -> Response:
        if not self.cluster.real_router:
            return json_response(real, {})
        detail = f"Could not connect to the backend sandbox: {sandbox}"
        return json_response(502, {"detail": detail})

    def _answer(self, command: str) -> ExecuteAnswer:
        if CHECK_MARKER in command:
            unlisted = "1" if "'PISHIP_PROBE_UNLISTED=" in command else "unset"
            return {"stdout": f"{CHECK_MARKER} {unlisted}\n", "exit_code": 0}
        answer = dict(self._execute(command)) if self._execute else {"stdout": "", "exit_code": 0}
        unknown = set(answer) - _ANSWER_KEYS
        if unknown:
            raise ValueError(f"KubernetesServer: unknown execute answer keys {sorted(unknown)}")
        return answer

    def _respond(self, request: Request, answer: ExecuteAnswer) -> Response:
        after = answer.get("after")
        if after is not None and not self.wait(after):
            raise DropConnection
        if answer.get("hang"):
            self.wait()
            raise DropConnection
        if answer.get("drop"):
            raise DropConnection
        status = answer.get("status")
        if "body" in answer:
            return json_response(int(status or 200), answer["body"])
        if status is not None:
            who = request.headers.get("Authorization") or "anonymous"
            message = f"forbidden: {who} may not execute in this sandbox"
            return json_response(int(status), {"message": message})
        result = {"stderr": ""}
        result.update({k: v for k, v in answer.items() if k not in _CONTROL_KEYS})
        return json_response(200, result)


def _claim_name(body: bytes) -> str | None:
    try:
        claim = json.loads(body)
    except ValueError:
        return None
    metadata = claim.get("metadata") if isinstance(claim, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) else None
