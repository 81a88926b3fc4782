"""The fake API server's resource routes: SandboxClaims and Sandboxes over REST and watch.

One object answers the agent-sandbox resource paths of
:class:`~piship_remote.testing.kubernetes_server.KubernetesServer`, reading and
changing its store as the real API server would, and telling its controller what
clients created, deleted and saw::

    api = ResourceApi(store, cluster, controller, faults, server)
    match = RESOURCE_PATH.match(request.path)
    if match is not None:
        return api.handle(request, match)      # a Status object for every ApiError

Claims can be created, read, listed (``labelSelector``), watched, merge-patched (also
``/status``) and deleted (a ``preconditions.uid`` body is honoured); Sandboxes can be
read, listed and watched. A watch streams one JSON event per line until
``timeoutSeconds`` (see the server's docstring for its start and 410 rules).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from werkzeug import Request, Response

from piship_remote.testing.faults import CreateFailure, Faults
from piship_remote.testing.k8s_controller import Controller
from piship_remote.testing.k8s_schema import defaulted_claim, field_selector_name, json_object
from piship_remote.testing.k8s_store import ApiError, Store
from piship_remote.testing.recorder import DropConnection, json_response
from piship_remote.wire.agent_sandbox import CLAIMS as CLAIM_RESOURCE
from piship_remote.wire.agent_sandbox import SANDBOXES, Resource

__all__ = ["RESOURCE_PATH", "ApiSettings", "ResourceApi", "Serving"]

RESOURCE_PATH = re.compile(
    r"^/apis/(?P<group>extensions\.agents\.x-k8s\.io|agents\.x-k8s\.io)/v1beta1/namespaces/"
    r"(?P<ns>[^/]+)/(?P<plural>sandboxclaims|sandboxes)(?:/(?P<name>[^/]+)(?P<status>/status)?)?$"
)
_RESOURCES = {r.plural: r for r in (CLAIM_RESOURCE, SANDBOXES)}
_DEFAULT_WATCH_SECONDS = 1800


class ApiSettings(Protocol):
    """The :class:`~piship_remote.testing.kubernetes_server.Cluster` knobs read here."""

    create_status: int | None
    delete_status: int | None
    patch_gate: threading.Event | None
    gone_as_http: bool


class Serving(Protocol):
    """What the API needs of the server it runs in: held waits and streamed answers."""

    @property
    def closing(self) -> bool: ...

    def wait(self, event: threading.Event | None = None, timeout: float | None = None) -> bool: ...

    def stream(
        self,
        request: Request,
        chunks: Iterable[bytes],
        *,
        status: int = 200,
        content_type: str = "application/octet-stream",
    ) -> Response: ...


class ResourceApi:
    """The SandboxClaim and Sandbox routes of one fake API server."""

    def __init__(
        self,
        store: Store,
        cluster: ApiSettings,
        controller: Controller,
        faults: Faults,
        server: Serving,
        apply_expired: Callable[[], None],
    ) -> None:
        self._store = store
        self._cluster = cluster
        self._controller = controller
        self._faults = faults
        self._server = server
        self._apply_expired = apply_expired

    def handle(self, request: Request, match: re.Match[str]) -> Response:
        """Answer ``request`` on a :data:`RESOURCE_PATH` ``match``."""
        try:
            return self._route(request, match)
        except ApiError as error:
            return json_response(error.code, error.status())

    def _route(self, request: Request, match: re.Match[str]) -> Response:
        resource = _RESOURCES[match.group("plural")]
        if resource.group != match.group("group"):
            return json_response(404, {})
        namespace, name = match.group("ns"), match.group("name")
        method = request.method
        if name is None:
            if method == "GET":
                return self._read_collection(request, resource, namespace)
            if method == "POST" and resource is CLAIM_RESOURCE:
                return self._create(request, namespace)
        elif method == "GET":
            obj = self._store.get(resource, namespace, name)
            self.observed(resource, namespace, obj)
            return json_response(200, obj)
        elif resource is CLAIM_RESOURCE and method == "PATCH":
            return self._patch(request, namespace, name, status=bool(match.group("status")))
        elif resource is CLAIM_RESOURCE and method == "DELETE" and not match.group("status"):
            return self._delete(request, namespace, name)
        return json_response(
            405,
            ApiError(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            ).status(),
        )

    def observed(self, resource: Resource, namespace: str, obj: dict[str, Any]) -> None:
        """A client saw ``obj`` (the controller moves a claim on once seen not ready)."""
        if resource is CLAIM_RESOURCE:
            self._controller.claim_observed(namespace, obj)

    def _read_collection(self, request: Request, resource: Resource, namespace: str) -> Response:
        args = request.args
        name = field_selector_name(args.get("fieldSelector", ""), namespace)
        if args.get("watch") in ("true", "1"):
            return self._watch(request, resource, namespace, name)
        items = self._store.objects(resource, namespace, args.get("labelSelector", ""))
        items = [item for item in items if name is None or item["metadata"]["name"] == name]
        for item in items:
            self.observed(resource, namespace, item)
        return json_response(
            200,
            {
                "apiVersion": resource.api_version,
                "kind": f"{resource.kind}List",
                "metadata": {"resourceVersion": str(self._store.resource_version)},
                "items": items,
            },
        )

    def _create(self, request: Request, namespace: str) -> Response:
        status = self._cluster.create_status
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
        failure = self._faults.take_create_failure()
        if failure is not None:
            return _refused_create(failure)
        body = json_object(request.get_data())
        claim = self._store.create(CLAIM_RESOURCE, namespace, defaulted_claim(body))
        self._controller.claim_created(namespace, claim)
        if self._faults.take_lost_answer():
            raise DropConnection
        return json_response(201, claim)

    def _patch(self, request: Request, namespace: str, name: str, *, status: bool) -> Response:
        gate = self._cluster.patch_gate
        if gate is not None and not self._server.wait(gate):
            raise DropConnection
        self._apply_expired()
        kind = request.headers.get("Content-Type", "").split(";")[0].strip()
        if kind in ("application/strategic-merge-patch+json", "application/json-patch+json"):
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types "
                "include: application/merge-patch+json",
            )
        patch = json_object(request.get_data())
        claim = self._store.patch(CLAIM_RESOURCE, namespace, name, patch, subresource_status=status)
        return json_response(200, claim)

    def _delete(self, request: Request, namespace: str, name: str) -> Response:
        status = self._cluster.delete_status
        if status is not None and status >= 400:
            return json_response(status, {"message": "etcd unavailable"})
        options = json_object(request.get_data()) if request.get_data() else {}
        uid = (options.get("preconditions") or {}).get("uid")
        deleted = self._store.delete(CLAIM_RESOURCE, namespace, name, uid)
        self._controller.claim_deleted(namespace, deleted)
        return json_response(status, {}) if status is not None else json_response(200, deleted)

    def _watch(
        self, request: Request, resource: Resource, namespace: str, name: str | None
    ) -> Response:
        start = request.args.get("resourceVersion", "")
        timeout = request.args.get("timeoutSeconds", "")
        seconds = int(timeout) if timeout.isdigit() else _DEFAULT_WATCH_SECONDS
        if start not in ("", "0") and self._cluster.gone_as_http:
            self._store.events_after(resource, namespace, int(start), name)  # 410 when too old
        chunks = self._watch_events(resource, namespace, name, start, time.monotonic() + seconds)
        return self._server.stream(request, chunks, content_type="application/json")

    def _watch_events(
        self, resource: Resource, namespace: str, name: str | None, start: str, deadline: float
    ) -> Iterator[bytes]:
        listener = threading.Event()
        self._store.listen(listener)
        try:
            yield b""  # the status line and headers go out now, before any event
            if start in ("", "0"):
                current, rv = self._store.snapshot(resource, namespace)
                for obj in current:
                    if name is None or obj["metadata"]["name"] == name:
                        yield _line("ADDED", obj)
                        self.observed(resource, namespace, obj)
            else:
                rv = int(start)
            while True:
                listener.clear()
                try:
                    events = self._store.events_after(resource, namespace, rv, name)
                except ApiError as gone:
                    yield _line("ERROR", gone.status())
                    return
                for event in events:
                    rv = event.rv
                    yield _line(event.type, event.object)
                    self.observed(resource, namespace, event.object)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                if (
                    not events
                    and not self._server.wait(listener, remaining)
                    and self._server.closing
                ):
                    raise DropConnection
        finally:
            self._store.unlisten(listener)


def _refused_create(failure: CreateFailure) -> Response:
    reason = "TooManyRequests" if failure.status == 429 else "ServiceUnavailable"
    response = json_response(
        failure.status,
        ApiError(failure.status, reason, "the server is handling too many requests").status(),
    )
    if failure.retry_after is not None:
        response.headers["Retry-After"] = str(failure.retry_after)
    return response


def _line(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode() + b"\n"
