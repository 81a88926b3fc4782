"""The fake agent-sandbox controller: claims get a Sandbox, turn Ready, and expire.

It writes what the real claim controller writes, in the same order, through the
:class:`~piship_remote.testing.k8s_store.Store`:

1. on create: an annotation ``agents.x-k8s.io/controller-first-observed-at``; a Sandbox
   owned by the claim (``status.podIPs``, ``nodeName``, ``serviceFQDN`` when sandboxes
   have a Service, ``Ready=False DependenciesNotReady``); the
   claim's status with ``status.sandbox.name`` and the same ``Ready=False``;
2. once a client has seen that not-ready state (a GET, a list or a watch event), the
   pod becomes ready: the Sandbox turns ``Ready=True DependenciesReady`` and the claim's
   status gets ``Ready=True`` in one write. This keeps "not ready on the first look,
   ready on the next" deterministic, without timers;
3. on each pass of :meth:`Controller.reconcile`, a claim whose
   ``spec.lifecycle.shutdownTime`` the controller's clock has reached gets
   ``Ready=False ClaimExpired``; the pass after acts on ``shutdownPolicy``: ``Delete``
   deletes the claim and then its Sandbox, ``Retain`` (the default) deletes the Sandbox
   and clears ``status.sandbox``;
4. a deleted claim's Sandbox is garbage-collected right after it.

A missing warm pool leaves the claim ``Ready=False WarmPoolNotFound`` with no Sandbox.
"""

from __future__ import annotations

import calendar
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from piship_remote.testing.k8s_store import ApiError, Store
from piship_remote.wire.agent_sandbox import CLAIMS, SANDBOXES

__all__ = ["NODE_NAME", "WALL_CLOCK", "Controller", "ControllerSettings"]

# Taken once: a test that replaces time.time for the client under test (a clock jump)
# does not move the cluster's clock with it.
_WALL_TIME = time.time


def WALL_CLOCK() -> float:
    """The cluster's default clock: the wall clock (seconds since the epoch).

    On it, a claim whose ``shutdownTime`` had already passed when it was created is
    taken to be on a test's frozen clock (a backend given a fixed ``now``) and is not
    expired by the wall clock; set ``Cluster.clock`` to judge every claim on one clock.
    """
    return _WALL_TIME()


Object = dict[str, Any]

READY_MESSAGE = "Pod is Ready"
PENDING_MESSAGE = "Pod exists with phase: Pending"
EXPIRED_MESSAGE = "Claim expired. Sandbox cleanup initiated."
NODE_NAME = "kind-worker"
"""The node every fake sandbox pod runs on (``status.nodeName``)."""
_ANNOTATION = "agents.x-k8s.io/"


class ControllerSettings(Protocol):
    """What the controller reads from the cluster's knobs on every pass."""

    never_ready: bool
    pod_ip: str | None
    warm_pools: set[str] | None
    clock: Callable[[], float] | None
    services: bool


class Controller:
    """Drives claims and their Sandboxes in ``store`` as the real controller would."""

    def __init__(
        self,
        store: Store,
        settings: ControllerSettings,
        sandbox_name: Callable[[str], str],
        containers: list[dict[str, Any]] | None = None,
    ) -> None:
        self._store = store
        self._containers = containers or [{"name": "runtime"}]
        self._settings = settings
        self._sandbox_name = sandbox_name
        self._lock = threading.RLock()
        self._addresses = 0
        self._frozen: set[str] = set()

    # ---- the hooks the API server calls ----------------------------------------------

    def claim_created(self, namespace: str, claim: Object) -> None:
        """The first reconcile of a new claim: annotate, adopt a Sandbox, write status."""
        name = claim["metadata"]["name"]
        shutdown = _epoch(((claim.get("spec") or {}).get("lifecycle") or {}).get("shutdownTime"))
        with self._lock:
            if shutdown is not None and shutdown <= WALL_CLOCK():
                self._frozen.add(claim["metadata"]["uid"])
            self._annotate(namespace, name, "controller-first-observed-at")
            pool = (claim.get("spec") or {}).get("warmPoolRef", {}).get("name", "")
            pools = self._settings.warm_pools
            if pools is not None and pool not in pools:
                message = f'SandboxWarmPool "{pool}" not found'
                self._claim_status(
                    namespace, name, None, _ready("False", "WarmPoolNotFound", message)
                )
                return
            sandbox = self._create_sandbox(namespace, claim)
            self._claim_status(
                namespace, name, sandbox, _ready("False", "DependenciesNotReady", PENDING_MESSAGE)
            )

    def claim_observed(self, namespace: str, claim: Object) -> None:
        """A client saw ``claim``; a pending sandbox pod becomes ready now."""
        if self._settings.never_ready or _ready_of(claim).get("reason") != "DependenciesNotReady":
            return
        with self._lock:
            current = self._store.find(CLAIMS, namespace, claim["metadata"]["name"])
            if current is None or _ready_of(current).get("reason") != "DependenciesNotReady":
                return
            sandbox_name = ((current.get("status") or {}).get("sandbox") or {}).get("name")
            sandbox = self._store.find(SANDBOXES, namespace, str(sandbox_name))
            if sandbox is None:
                return
            sandbox = self._store.patch(
                SANDBOXES,
                namespace,
                sandbox["metadata"]["name"],
                {"status": {"conditions": [_ready("True", "DependenciesReady", READY_MESSAGE)]}},
                subresource_status=True,
            )
            self._claim_status(
                namespace,
                current["metadata"]["name"],
                sandbox,
                _ready("True", "DependenciesReady", READY_MESSAGE),
            )

    def claim_deleted(self, namespace: str, claim: Object) -> None:
        """Garbage-collect the Sandboxes the deleted claim owned."""
        uid = claim["metadata"]["uid"]
        with self._lock:
            for sandbox in self._store.objects(SANDBOXES, namespace):
                owners = sandbox["metadata"].get("ownerReferences") or []
                if any(owner.get("uid") == uid for owner in owners):
                    self._delete_quietly(namespace, sandbox["metadata"]["name"])

    # ---- scheduled work ----------------------------------------------------------------

    def reconcile(self) -> None:
        """One pass over every claim: expire the due ones, act on the already expired ones."""
        clock = self._settings.clock
        if clock is None:
            return
        now = clock()
        with self._lock:
            for claim in self._store.objects(CLAIMS):
                self._expire(claim, now)

    def _expire(self, claim: Object, now: float) -> None:
        namespace, name = claim["metadata"]["namespace"], claim["metadata"]["name"]
        lifecycle = (claim.get("spec") or {}).get("lifecycle") or {}
        shutdown = _epoch(lifecycle.get("shutdownTime"))
        if shutdown is None:
            return
        if self._settings.clock is WALL_CLOCK and claim["metadata"]["uid"] in self._frozen:
            return
        expired = _ready_of(claim).get("reason") == "ClaimExpired"
        if now < shutdown:
            if expired and (claim.get("status") or {}).get("sandbox") is None:
                # A Retain claim renewed after expiry is provisioned again, from scratch.
                self.claim_created(namespace, claim)
            return
        if not expired:
            self._claim_status(
                namespace, name, _keep(claim), _ready("False", "ClaimExpired", EXPIRED_MESSAGE)
            )
            return
        if lifecycle.get("shutdownPolicy") in ("Delete", "DeleteForeground"):
            try:
                deleted = self._store.delete(CLAIMS, namespace, name)
            except ApiError:
                return
            self.claim_deleted(namespace, deleted)
            return
        sandbox = ((claim.get("status") or {}).get("sandbox") or {}).get("name")
        if sandbox is not None:
            self._delete_quietly(namespace, str(sandbox))
            self._claim_status(
                namespace, name, None, _ready("False", "ClaimExpired", EXPIRED_MESSAGE)
            )

    # ---- writes ------------------------------------------------------------------------

    def _create_sandbox(self, namespace: str, claim: Object) -> Object:
        name = self._sandbox_name(claim["metadata"]["name"])
        self._delete_quietly(namespace, name)
        self._addresses += 1
        ip = self._settings.pod_ip or f"10.244.{self._addresses // 250}.{self._addresses % 250 + 2}"
        labels = {
            f"{_ANNOTATION}claim-uid": claim["metadata"]["uid"],
            f"{_ANNOTATION}launch-type": "warm",
        }
        created_by = (claim["metadata"].get("labels") or {}).get(f"{_ANNOTATION}created-by")
        if created_by is not None:
            labels[f"{_ANNOTATION}created-by"] = created_by
        body = {
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {f"{_ANNOTATION}pod-name": name},
                "ownerReferences": [
                    {
                        "apiVersion": CLAIMS.api_version,
                        "kind": CLAIMS.kind,
                        "name": claim["metadata"]["name"],
                        "uid": claim["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {"podTemplate": {"spec": {"containers": self._containers}}},
        }
        self._store.create(SANDBOXES, namespace, body)
        status = {
            "podIPs": [ip],
            "nodeName": NODE_NAME,
            "selector": f"{_ANNOTATION}sandbox-name-hash={abs(hash(name)) % 10**8:08d}",
            "conditions": [_ready("False", "DependenciesNotReady", PENDING_MESSAGE)],
        }
        if self._settings.services:
            status["serviceFQDN"] = f"{name}.{namespace}.svc.cluster.local"
        return self._store.patch(
            SANDBOXES, namespace, name, {"status": status}, subresource_status=True
        )

    def _claim_status(
        self, namespace: str, name: str, sandbox: Object | None, ready: Object
    ) -> None:
        bound: Object | None = None
        if sandbox is not None:
            bound = {"name": sandbox["metadata"]["name"]}
            ips = (sandbox.get("status") or {}).get("podIPs")
            if self._settings.pod_ip is not None and ips:
                bound["podIPs"] = ips
        self._store.patch(
            CLAIMS,
            namespace,
            name,
            {"status": {"conditions": [ready], "sandbox": bound}},
            subresource_status=True,
        )

    def _annotate(self, namespace: str, name: str, key: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        patch = {"metadata": {"annotations": {f"{_ANNOTATION}{key}": stamp}}}
        self._store.patch(CLAIMS, namespace, name, patch)

    def _delete_quietly(self, namespace: str, sandbox: str) -> None:
        try:
            self._store.delete(SANDBOXES, namespace, sandbox)
        except ApiError:
            pass


def _ready(status: str, reason: str, message: str) -> Object:
    return {
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": 1,
        "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _ready_of(obj: Object) -> Object:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if isinstance(condition, dict) and condition.get("type") == "Ready":
            return condition
    return {}


def _keep(claim: Object) -> Object | None:
    """The claim's current sandbox as an object :meth:`Controller._claim_status` takes."""
    bound = (claim.get("status") or {}).get("sandbox")
    if not isinstance(bound, dict) or "name" not in bound:
        return None
    return {"metadata": {"name": bound["name"]}, "status": {"podIPs": bound.get("podIPs")}}


def _epoch(value: Any) -> float | None:
    """Seconds since the epoch of an RFC 3339 UTC time (``…Z``, optional fraction)."""
    if not isinstance(value, str) or not value.endswith("Z"):
        return None
    whole, _, fraction = value[:-1].partition(".")
    try:
        parsed = time.strptime(whole, "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return None
    return calendar.timegm(parsed) + (float(f"0.{fraction}") if fraction.isdigit() else 0.0)
