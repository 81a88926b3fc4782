"""The control plane of the local service: E2B's sandbox REST API, the parts clients use.

=========================================  ======================================
``GET /health``                            204, no key needed
``POST /sandboxes`` (and ``/v2/sandboxes``)  201 with ``sandboxID``, ``envdAccessToken``…
``GET /sandboxes``                         200: the running sandboxes (``metadata`` filter)
``GET /v2/sandboxes``                      200: one page (``metadata``, ``state``, ``template``…)
``GET /templates``                         200 (no key needed): the names offered (``templateID``)
``GET /templates/aliases/<alias>``         200 ``{templateID, public}``; 404 if none has it
``GET /sandboxes/<id>``                    200 with the sandbox's details (``state``)
``POST /sandboxes/<id>/connect`` (+ v2)    200 with its ``envdAccessToken``; 201 if it resumed
``POST /sandboxes/<id>/pause``             204: its processes frozen; 409 if already paused
``POST /sandboxes/<id>/resume``            201: thawed, to live ``timeout`` (15) s; 409 running
``GET /sandboxes/<id>/metrics``            200: its samples (one taken now), ``?start=&end=``
``POST /sandboxes/<id>/timeout``           204: live ``timeout`` more seconds from now
``POST /sandboxes/<id>/refreshes``         204: live at least ``duration`` more seconds
``DELETE /sandboxes/<id>``                 204: kill its processes, remove its files
``PUT /sandboxes/<id>/network``            204: internet on/off, rules cleared; 400 if not held
``POST /sandboxes/<id>/ports/<port>``      200 ``{"url": "http://127.0.0.1:<p>"}``: its port
``POST /sandboxes/<id>/fork``, snapshots   see :mod:`~piship_remote.local.control_copies`
=========================================  ======================================

A paused sandbox keeps its files and its frozen processes; envd answers for it as
for a sandbox that is not there (502), its lifetime stops (it is kept up to the
service's maximum lifetime), and the timeout calls answer 404 for it, as E2B's
do. Resuming (``resume``, or ``connect`` with its ``timeout``, 300 s on v2 when
absent) gives it a new lifetime from then; ``connect`` on a running sandbox only ever
extends its lifetime. A sandbox created with ``autoPause: true`` is paused, not killed,
when its timeout is reached; with ``autoResume: {"enabled": true}`` envd traffic naming
it, or a request to one of its ports, resumes it (see
:class:`~piship_remote.local.sandbox.listing.Lifecycle`). Details carry its ``lifecycle``.

Every ``/sandboxes…`` request needs ``X-API-Key``. A create without ``timeout``
lives 300 s on ``/v2/sandboxes`` (the current SDKs send none) and 15 s on
``/sandboxes``, E2B's defaults; one carrying an ``Idempotency-Key`` makes one sandbox per key
(see :mod:`~piship_remote.local.idempotency`). ``memory: false`` on pause, ``autoPauseMemory:
false`` and ``memory: false`` on connect ask for a filesystem-only pause or resume: the
files are kept and resuming reboots the sandbox (nothing of what ran survives). Create
and connect answers carry ``domain`` (``localhost:<port>``), so ``get_host(port)`` names a
loopback host the service routes (see :mod:`~piship_remote.local.ports`); a sandbox created with
``network.allowPublicTraffic: false`` also gets a ``trafficAccessToken`` its ports want.
``/ports/<port>`` (this service's own, not E2B's) gives a port an address any HTTP client
reaches without resolving a ``*.localhost`` name: a loopback listener spliced to it, closed
when the sandbox ends (403 for a sandbox whose ports want its traffic token).
Errors are E2B's ``{"code": <status>, "message": …}``. A sandbox reaches the internet unless
created with ``"allow_internet_access": false`` (E2B's default); ``network.allowOut`` and
``denyOut`` are enforced or refused with 400, never ignored (see
:mod:`~piship_remote.local.sandbox.network_options`)::

    control = ControlPlane(registry, api_key="e2b_…")
    reply = control.handle(request)
"""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import Callable, Mapping
from urllib.parse import unquote

from piship_remote._http_server.messages import Head, Reply, Request
from piship_remote.local.control_copies import SandboxCopies, api_error
from piship_remote.local.idempotency import IdempotencyKeys
from piship_remote.local.isolation.egress import EgressRules, rules_problem
from piship_remote.local.sandbox.listing import (
    Lifecycle,
    ListError,
    Page,
    PauseRequest,
    ResumeRequest,
    lifecycle,
    metadata_filter,
    query_of,
    rfc3339,
    state,
)
from piship_remote.local.sandbox.metrics import SandboxMetrics, Sizes, time_range
from piship_remote.local.sandbox.network_options import NetworkOptions, OptionRefused
from piship_remote.local.sandbox.registry import (
    Registry,
    Sandbox,
    SandboxGone,
    TooManySandboxes,
    UnknownTemplate,
)
from piship_remote.wire.e2b_control import (
    ConnectRequest,
    ListedSandbox,
    NetworkUpdate,
    NewSandbox,
    Refresh,
    SandboxDetail,
    SandboxInfo,
    TimeoutRequest,
)
from piship_remote.wire.e2b_json import WireError, parse, to_json, unstructure

__all__ = ["CLIENT_ID", "ENVD_VERSION", "ControlPlane"]

ENVD_VERSION = "0.6.4"
CLIENT_ID = "piship-local"
MAX_REFRESH = 3600
V2_TIMEOUT = 300
V1_TIMEOUT = 15
_SANDBOX_PATH = re.compile(
    r"(?:/v2)?/sandboxes/([A-Za-z0-9-]{1,128})"
    r"(/timeout|/refreshes|/connect|/metrics|/pause|/resume|/fork|/snapshots|/network"
    r"|/ports/[0-9]{1,5})?\Z"
)
_ACTION_METHOD = {
    None: ("GET", "DELETE"),
    "/timeout": ("POST",),
    "/refreshes": ("POST",),
    "/connect": ("POST",),
    "/metrics": ("GET",),
    "/pause": ("POST",),
    "/resume": ("POST",),
    "/fork": ("POST",),
    "/snapshots": ("POST",),
    "/network": ("PUT",),
    "/ports": ("POST",),
}
_TEMPLATES_PATH = "/templates"
_ALIAS_PATH = re.compile(r"/templates/aliases/([^/]{1,256})\Z")
_SNAPSHOT_PATH = re.compile(r"/templates/([A-Za-z0-9_.:/-]{1,256})\Z")
_RUNNING_ONLY = ("/timeout", "/refreshes", "/network")
PortAddress = Callable[[Sandbox, int], str]
"""``host:port`` of a loopback listener spliced to a sandbox's port (the service's)."""


class ControlPlane:
    """Answers the REST requests for the sandboxes of a :class:`Registry`."""

    def __init__(
        self,
        registry: Registry,
        *,
        api_key: str,
        domain: str | None = None,
        port_address: PortAddress | None = None,
    ) -> None:
        self._registry = registry
        self._port_address = port_address
        self._api_key = api_key
        self.domain = domain
        """What create and connect answers give as ``domain`` (the service's loopback host)."""
        self._copies = SandboxCopies(registry, info=self._info)
        self._keys = IdempotencyKeys()
        self._metrics = SandboxMetrics()

    def screen(self, head: Head) -> Reply | None:
        """The refusal of a request its headers already rule out (no key), before its body."""
        return self._refusal(head.path, head.headers)

    def handle(self, request: Request) -> Reply:
        """Answer one control-plane request."""
        if request.path == "/health":
            return Reply(204)
        if request.path == _TEMPLATES_PATH:  # names only, no key needed: as /health
            if request.method != "GET":
                return api_error(405, f"{request.method} is not allowed on {request.path}")
            return self._templates()
        refusal = self._refusal(request.path, request.headers)
        if refusal is not None:
            return refusal
        try:
            return self._route(request)
        except (WireError, ListError) as e:
            return api_error(400, str(e))

    def _route(self, request: Request) -> Reply:
        if request.path in ("/sandboxes", "/v2/sandboxes"):
            if request.method == "GET":
                return self._list(request)
            if request.method != "POST":
                return api_error(405, f"{request.method} is not allowed on {request.path}")
            default = V2_TIMEOUT if request.path.startswith("/v2/") else V1_TIMEOUT
            key = request.headers.get("idempotency-key")
            if key:
                return self._create_once(key, request.body, default)
            return self._create(request.body, default)[0]
        alias = _ALIAS_PATH.match(request.path)
        if alias is not None:
            if request.method != "GET":
                return api_error(405, f"{request.method} is not allowed on {request.path}")
            return self._template_alias(unquote(alias.group(1)))
        copies = self._copy_route(request)
        if copies is not None:
            return copies
        match = _SANDBOX_PATH.match(request.path)
        if match is None:
            return api_error(404, "not found")
        sandbox_id, action = match.group(1), match.group(2)
        port = None
        if action is not None and action.startswith("/ports/"):
            action, port = "/ports", int(action[len("/ports/") :])
        sandbox = self._registry.lookup(sandbox_id)
        if sandbox is None or (action in _RUNNING_ONLY and sandbox.pause_state.paused):
            return api_error(404, f'sandbox "{sandbox_id}" not found')
        if request.method not in _ACTION_METHOD[action]:
            return api_error(405, f"{request.method} is not allowed on {request.path}")
        if action == "/connect":
            return self._connect(sandbox, request.body)
        if port is not None:
            return self._port(sandbox, port)
        if action == "/pause":
            return self._pause(sandbox, request.body)
        if action == "/resume":
            return self._resume(sandbox, request.body)
        if action == "/fork":
            return self._copies.fork(sandbox, request.body)
        if action == "/snapshots":
            return self._copies.snapshot(sandbox, request.body)
        if action == "/network":
            return _network_update(sandbox, parse(request.body, NetworkUpdate))
        if action == "/metrics":
            start, end = time_range(request.target)
            samples = self._metrics.read(sandbox, start, end)
            return Reply(200, to_json(samples), "application/json")
        if action == "/timeout":
            seconds = parse(request.body, TimeoutRequest).timeout
            return self._lifetime(sandbox_id, seconds, extend_only=False)
        if action == "/refreshes":
            duration = min(max(parse(request.body, Refresh).duration, 0), MAX_REFRESH)
            return self._lifetime(sandbox_id, duration, extend_only=True)
        if request.method == "GET":
            detail = unstructure(_detail(sandbox, self.domain))
            detail["lifecycle"] = lifecycle(sandbox)
            text = json.dumps(detail, separators=(",", ":"), ensure_ascii=False)
            return Reply(200, text.encode(), "application/json")
        self._registry.delete(sandbox_id)
        return Reply(204)

    def _templates(self) -> Reply:
        """``GET /templates``: the templates offered, in E2B's list shape."""
        offered = [
            {"templateID": name, "aliases": [name], "buildStatus": "ready", "public": False}
            for name in sorted(self._registry.templates)
        ]
        return Reply(200, json.dumps(offered).encode(), "application/json")

    def _template_alias(self, alias: str) -> Reply:
        """``GET /templates/aliases/<alias>``: the template (an offered one, or a snapshot by
        its ID or name) that ``alias`` names, as E2B's answer for the team's own."""
        if alias in self._registry.templates:
            template_id = alias
        else:
            named = self._registry.snapshots.select(name=alias)
            if not named:
                return api_error(404, f"template '{alias}' not found")
            template_id = named[-1].id  # a name moves to the newest snapshot given it
        answer = {"templateID": template_id, "public": False}
        return Reply(200, json.dumps(answer).encode(), "application/json")

    def _port(self, sandbox: Sandbox, port: int) -> Reply:
        """``{"url": ...}``: the loopback address of the sandbox's ``port``."""
        if self._port_address is None or not 0 < port < 65536:
            return api_error(404, "not found")
        try:
            address = self._port_address(sandbox, port)
        except PermissionError as e:
            return api_error(403, f"{e}: reach them at <port>-<id>.<domain> with it")
        except SandboxGone:
            return api_error(404, f'sandbox "{sandbox.id}" not found')
        except OSError as e:
            return api_error(503, f"no listener could be opened: {e.strerror or e}")
        return Reply(200, json.dumps({"url": f"http://{address}"}).encode(), "application/json")

    def _copy_route(self, request: Request) -> Reply | None:
        """The answer to ``GET /snapshots`` or ``DELETE /templates/<id>``, else ``None``."""
        if request.path == "/snapshots":
            if request.method != "GET":
                return api_error(405, f"{request.method} is not allowed on {request.path}")
            return self._copies.list(request)
        match = _SNAPSHOT_PATH.match(request.path)
        if match is None:
            return None
        if request.method != "DELETE":
            return api_error(405, f"{request.method} is not allowed on {request.path}")
        return self._copies.delete(match.group(1))

    def _list(self, request: Request) -> Reply:
        query = query_of(request.target)
        sandboxes = [s for i in self._registry.ids() if (s := self._registry.lookup(i)) is not None]
        running = [s for s in sandboxes if not s.pause_state.paused]
        headers: tuple[tuple[str, str], ...] = ()
        if request.path == "/sandboxes":  # v1: running sandboxes, metadata filter, one page
            wanted = metadata_filter(query.get("metadata"))
            chosen = [s for s in running if all(s.metadata.get(k) == v for k, v in wanted.items())]
        else:
            page = Page.of(query)
            chosen, token = page.select(sandboxes)
            if "running" in page.states:
                headers = (("X-Total-Running", str(len(running))),)
            if token is not None:
                headers += (("X-Next-Token", token),)
        listed = [_listed(s) for s in chosen]
        return Reply(200, to_json(listed), "application/json", headers)

    def _connect(self, sandbox: Sandbox, body: bytes) -> Reply:
        request = parse(body, ConnectRequest)
        seconds = V2_TIMEOUT if request.timeout is None else request.timeout
        if seconds <= 0:
            return api_error(400, "Timeout must be greater than 0")
        try:
            resumed = self._registry.resume(sandbox.id, seconds, memory=request.memory is not False)
        except OSError as e:
            return api_error(500, f"the sandbox could not be resumed: {e}")
        if resumed:
            return Reply(201, to_json(self._info(sandbox)), "application/json")
        if not self._registry.set_lifetime(sandbox.id, seconds, extend_only=True):
            return api_error(404, f'sandbox "{sandbox.id}" not found')
        # The sandbox's own envd token, as E2B answers: rotating it would cut off every
        # client already attached.
        return Reply(200, to_json(self._info(sandbox)), "application/json")

    def _pause(self, sandbox: Sandbox, body: bytes) -> Reply:
        memory = parse(body, PauseRequest).memory is not False
        try:
            paused = self._registry.pause(sandbox.id, memory=memory)
        except OSError as e:
            return api_error(500, f"the sandbox could not be paused: {e}")
        if paused is None:
            return api_error(404, f'sandbox "{sandbox.id}" not found')
        if not paused:
            return api_error(409, f'sandbox "{sandbox.id}" is already paused')
        return Reply(204)

    def _resume(self, sandbox: Sandbox, body: bytes) -> Reply:
        seconds = parse(body, ResumeRequest).timeout
        if seconds <= 0:
            return api_error(400, "Timeout must be greater than 0")
        try:
            resumed = self._registry.resume(sandbox.id, seconds)
        except OSError as e:
            return api_error(500, f"the sandbox could not be resumed: {e}")
        if resumed is None:
            return api_error(404, f'sandbox "{sandbox.id}" not found')
        if not resumed:
            return api_error(409, f'sandbox "{sandbox.id}" is already running')
        return Reply(201, to_json(self._info(sandbox)), "application/json")

    def _info(self, sandbox: Sandbox) -> SandboxInfo:
        return SandboxInfo(
            sandbox_id=sandbox.id,
            template_id=sandbox.template,
            client_id=CLIENT_ID,
            envd_version=ENVD_VERSION,
            envd_access_token=sandbox.access_token,
            domain=self.domain,
            traffic_access_token=sandbox.traffic_access_token,
        )

    def _create_once(self, key: str, body: bytes, default_timeout: int) -> Reply:
        """A create with an ``Idempotency-Key``: the key's sandbox, made once."""
        with self._keys.held(key, body) as claim:
            if claim.refused:
                return api_error(422, "the Idempotency-Key was used for a different request")
            earlier = self._registry.lookup(claim.sandbox_id) if claim.sandbox_id else None
            if earlier is not None:
                return Reply(201, to_json(self._info(earlier)), "application/json")
            reply, sandbox = self._create(body, default_timeout)
            if sandbox is not None:
                claim.record(sandbox)
            return reply

    def _create(self, body: bytes, default_timeout: int) -> tuple[Reply, Sandbox | None]:
        new = parse(body, NewSandbox)
        ending = Lifecycle.of(body)
        timeout = default_timeout if new.timeout is None else new.timeout
        if timeout < 0:
            return api_error(400, "timeout must not be negative"), None
        try:
            options = NetworkOptions.of(json.loads(body))
        except OptionRefused as e:
            return api_error(400, str(e)), None
        problem = rules_problem() if options.egress.filtered else None
        if problem is not None:
            return api_error(400, f"the egress rules cannot be enforced here: {problem}"), None
        try:
            sandbox = self._registry.create(
                template=new.template_id,
                lifetime=timeout,
                network=options,
                env_vars=new.env_vars,
                metadata=new.metadata,
                auto_pause=ending.auto_pause,
                auto_resume=ending.auto_resume,
                auto_pause_memory=new.auto_pause_memory is not False,
            )
        except UnknownTemplate:  # GET /templates lists those offered
            return api_error(404, f"template '{new.template_id}' not found"), None
        except TooManySandboxes as e:
            return api_error(429, str(e)), None
        except SandboxGone as e:
            return api_error(503, str(e)), None
        return Reply(201, to_json(self._info(sandbox)), "application/json"), sandbox

    def _lifetime(self, sandbox_id: str, seconds: int, *, extend_only: bool) -> Reply:
        if seconds < 0:
            return api_error(400, "timeout must not be negative")
        if not self._registry.set_lifetime(sandbox_id, seconds, extend_only=extend_only):
            return api_error(404, f'sandbox "{sandbox_id}" not found')
        return Reply(204)

    def _refusal(self, path: str, headers: Mapping[str, str]) -> Reply | None:
        if path in ("/health", _TEMPLATES_PATH):
            return None
        if not path.startswith(("/sandboxes", "/v2/sandboxes", "/snapshots", "/templates/")):
            return api_error(404, "not found")
        key = headers.get("x-api-key", "")
        if not hmac.compare_digest(key.encode(), self._api_key.encode()):
            return api_error(401, "Invalid API key")
        return None


def _network_update(sandbox: Sandbox, update: NetworkUpdate) -> Reply:
    """204 once the sandbox's egress is as the update says (rules it was created with are
    cleared, internet access switched); 400 for what a running local sandbox cannot get:
    address rules or a proxy (give ``allowOut``/``denyOut`` at create), egress for a
    sandbox created without any, or rules where they cannot be enforced."""
    if update.filters:
        return api_error(
            400,
            "the local service cannot filter or proxy a running sandbox's egress: give "
            "network.allowOut/denyOut (addresses, CIDRs) when creating it",
        )
    internet = update.allow_internet_access
    rules = EgressRules(sandbox.options.egress.internet if internet is None else internet)
    if rules == sandbox.options.egress:
        return Reply(204)
    if rules.reaches_out and not sandbox.network:
        return api_error(
            400,
            "the local service cannot give egress to a running sandbox created without "
            "any: create one with allow_internet_access=True",
        )
    problem = rules_problem()
    if problem is not None:
        return api_error(400, f"the sandbox's egress cannot be changed here: {problem}")
    try:
        sandbox.hold_egress(rules)
    except OSError as e:
        return api_error(500, f"the egress rules could not be loaded: {e}")
    return Reply(204)


def _detail(sandbox: Sandbox, domain: str | None) -> SandboxDetail:
    size = _sizes(sandbox)
    internet, network = sandbox.options.echo()
    return SandboxDetail(
        sandbox_id=sandbox.id,
        template_id=sandbox.template,
        client_id=CLIENT_ID,
        envd_version=ENVD_VERSION,
        envd_access_token=sandbox.access_token,
        started_at=rfc3339(sandbox.started_at),
        end_at=_end_at(sandbox),
        cpu_count=size[0],
        memory_mb=size[1],
        disk_size_mb=size[2],
        state=state(sandbox),
        metadata=sandbox.metadata,
        domain=domain,
        allow_internet_access=internet,
        network=network,
    )


def _listed(sandbox: Sandbox) -> ListedSandbox:
    size = _sizes(sandbox)
    return ListedSandbox(
        sandbox_id=sandbox.id,
        template_id=sandbox.template,
        client_id=CLIENT_ID,
        started_at=rfc3339(sandbox.started_at),
        end_at=_end_at(sandbox),
        cpu_count=size[0],
        memory_mb=size[1],
        disk_size_mb=size[2],
        state=state(sandbox),
        envd_version=ENVD_VERSION,
        metadata=sandbox.metadata,
    )


def _end_at(sandbox: Sandbox) -> str:
    """When its lifetime ends; for a paused sandbox, when it was paused (its clock stopped)."""
    paused_at = sandbox.pause_state.paused_at
    return rfc3339(paused_at if paused_at is not None else sandbox.ends_at)


def _sizes(sandbox: Sandbox) -> tuple[int, int, int]:
    """CPUs, memory MiB and disk MiB: the sandbox's limits, as ``get_metrics`` has them."""
    size = Sizes.of(sandbox)
    return size.cpus, size.memory_mib, size.disk_mib
