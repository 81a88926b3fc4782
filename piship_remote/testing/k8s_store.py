"""The fake Kubernetes API server's object store: state, resourceVersions and the watch log.

One store holds every SandboxClaim and Sandbox of the fake cluster. Like a real API
server it keeps one global, monotonic ``resourceVersion`` (decimal strings), an ordered
log of ``ADDED``/``MODIFIED``/``DELETED`` events that a watch replays from any version
still in it, and answers every failure as a :class:`ApiError` that renders the
Kubernetes ``Status`` object::

    store = Store()
    claim = store.create(CLAIMS, "agents", {"metadata": {"name": "c1"}, "spec": {...}})
    store.patch(CLAIMS, "agents", "c1", {"spec": {"lifecycle": {...}}})
    store.events_after(CLAIMS, "agents", int(claim["metadata"]["resourceVersion"]), "c1")

Writes that change nothing are not persisted (same version, no event). ``status`` is a
subresource: main-resource writes keep the stored status, status writes touch nothing else.
"""

from __future__ import annotations

import copy
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any, cast

import attrs

from piship_remote.wire.agent_sandbox import Resource

__all__ = [
    "ApiError",
    "Event",
    "Store",
    "merge_patch",
    "rfc3339_seconds",
    "selects",
]

Object = dict[str, Any]


@attrs.frozen
class Event:
    """One persisted change: ``type`` is ADDED, MODIFIED or DELETED; ``object`` its state."""

    rv: int
    type: str
    resource: Resource
    namespace: str
    object: Object

    @property
    def name(self) -> str:
        return str(self.object["metadata"]["name"])


class ApiError(Exception):
    """A failure the API server answers with a ``Status`` body and HTTP ``code``."""

    def __init__(self, code: int, reason: str, message: str, details: Object | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> Object:
        """The ``Status`` object for the response body (and for a watch ERROR event)."""
        body: Object = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body

    @classmethod
    def not_found(cls, resource: Resource, name: str) -> ApiError:
        return cls(
            404,
            "NotFound",
            f'{resource.qualified} "{name}" not found',
            {"name": name, "group": resource.group, "kind": resource.plural},
        )

    @classmethod
    def conflict(cls, resource: Resource, name: str, why: str) -> ApiError:
        return cls(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {resource.qualified} "{name}": {why}',
            {"name": name, "group": resource.group, "kind": resource.plural},
        )

    @classmethod
    def gone(cls, rv: int, oldest: int) -> ApiError:
        return cls(410, "Expired", f"too old resource version: {rv} ({oldest})")


def rfc3339_seconds(epoch: float) -> str:
    """``2026-09-28T18:00:00Z``: whole seconds, UTC, as ``creationTimestamp`` is written."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` deletes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def selects(labels: Object, selector: str) -> bool:
    """Whether ``labels`` match a label selector of ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``."""
    for term in filter(None, (part.strip() for part in selector.split(","))):
        if "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


class Store:
    """Thread-safe objects, versions and the event log of the fake API server."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.RLock()
        self._objects: dict[tuple[Resource, str, str], Object] = {}
        self._log: list[Event] = []
        self._rv = 0
        self._compacted = 0
        self._listeners: set[threading.Event] = set()

    # ---- reads -----------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

    def get(self, resource: Resource, namespace: str, name: str) -> Object:
        with self._lock:
            stored = self._objects.get((resource, namespace, name))
            if stored is None:
                raise ApiError.not_found(resource, name)
            return copy.deepcopy(stored)

    def find(self, resource: Resource, namespace: str, name: str) -> Object | None:
        try:
            return self.get(resource, namespace, name)
        except ApiError:
            return None

    def objects(
        self, resource: Resource, namespace: str | None = None, label_selector: str = ""
    ) -> list[Object]:
        """Objects of ``resource`` (in ``namespace``, or all), in creation order."""
        with self._lock:
            return [
                copy.deepcopy(obj)
                for (kind, ns, _), obj in self._objects.items()
                if kind == resource
                and namespace in (None, ns)
                and selects(obj["metadata"].get("labels") or {}, label_selector)
            ]

    def snapshot(self, resource: Resource, namespace: str) -> tuple[list[Object], int]:
        """The objects of ``resource`` in ``namespace`` and the version they are current at."""
        with self._lock:
            return self.objects(resource, namespace), self._rv

    def events_after(
        self, resource: Resource, namespace: str, rv: int, name: str | None = None
    ) -> list[Event]:
        """Logged changes after ``rv`` (410 :class:`ApiError` when compacted away)."""
        with self._lock:
            if rv < self._compacted:
                raise ApiError.gone(rv, self._compacted + 1)
            return [
                event
                for event in self._log
                if event.rv > rv
                and event.resource == resource
                and event.namespace == namespace
                and (name is None or event.name == name)
            ]

    def compact(self) -> None:
        """Forget the event log up to now: a watch from an older version gets 410 Gone."""
        with self._lock:
            self._compacted = self._rv
            self._log.clear()

    # ---- change notification ---------------------------------------------------------

    def listen(self, listener: threading.Event) -> None:
        """Set ``listener`` on every later write (until :meth:`unlisten`)."""
        with self._lock:
            self._listeners.add(listener)

    def unlisten(self, listener: threading.Event) -> None:
        with self._lock:
            self._listeners.discard(listener)

    # ---- writes ----------------------------------------------------------------------

    def create(self, resource: Resource, namespace: str, body: Object) -> Object:
        """Store a new object: server fields set, ``status`` dropped; 409 if the name is taken."""
        metadata = dict(body.get("metadata") or {})
        name = metadata.get("name")
        if not isinstance(name, str) or not name:
            raise ApiError(
                422,
                "Invalid",
                f"{resource.kind}.{resource.group} is invalid: "
                "metadata.name: Required value: name or generateName is required",
            )
        with self._lock:
            key = (resource, namespace, name)
            if key in self._objects:
                raise ApiError(
                    409,
                    "AlreadyExists",
                    f'{resource.qualified} "{name}" already exists',
                    {"name": name, "group": resource.group, "kind": resource.plural},
                )
            metadata.update(
                namespace=namespace,
                uid=str(uuid.uuid4()),
                generation=1,
                creationTimestamp=rfc3339_seconds(self._clock()),
            )
            obj: Object = {k: copy.deepcopy(v) for k, v in body.items() if k != "status"}
            obj.update(apiVersion=resource.api_version, kind=resource.kind, metadata=metadata)
            return self._commit("ADDED", key, obj)

    def patch(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        patch: Object,
        *,
        subresource_status: bool = False,
    ) -> Object:
        """Merge-patch an object (its ``status`` only, with ``subresource_status``)."""

        def apply(current: Object) -> Object:
            expected = (patch.get("metadata") or {}).get("resourceVersion")
            if expected is not None and expected != current["metadata"]["resourceVersion"]:
                raise ApiError.conflict(
                    resource,
                    name,
                    "the object has been modified; please apply your changes to the latest "
                    "version and try again",
                )
            if subresource_status:
                return cast(Object, merge_patch(current, {"status": patch.get("status")}))
            kept = {k: v for k, v in patch.items() if k != "status"}
            return cast(Object, merge_patch(current, kept))

        return self.update(resource, namespace, name, apply)

    def update(
        self, resource: Resource, namespace: str, name: str, change: Callable[[Object], Object]
    ) -> Object:
        """Replace an object by ``change(copy)``; persisted (and logged) only when it differs."""
        with self._lock:
            key = (resource, namespace, name)
            current = self._objects.get(key)
            if current is None:
                raise ApiError.not_found(resource, name)
            changed = change(copy.deepcopy(current))
            changed["metadata"] = {**changed["metadata"], **_identity(current["metadata"])}
            if _without_rv(changed) == _without_rv(current):
                return copy.deepcopy(current)
            if changed.get("spec") != current.get("spec"):
                changed["metadata"]["generation"] = current["metadata"]["generation"] + 1
            return self._commit("MODIFIED", key, changed)

    def delete(
        self, resource: Resource, namespace: str, name: str, uid: str | None = None
    ) -> Object:
        """Remove an object at once (no finalizers): its last state, at the deletion version."""
        with self._lock:
            key = (resource, namespace, name)
            current = self._objects.get(key)
            if current is None:
                raise ApiError.not_found(resource, name)
            actual = current["metadata"]["uid"]
            if uid is not None and uid != actual:
                raise ApiError.conflict(
                    resource,
                    name,
                    f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
                    f"{actual}",
                )
            del self._objects[key]
            return self._commit("DELETED", key, copy.deepcopy(current), store=False)

    def _commit(
        self, kind: str, key: tuple[Resource, str, str], obj: Object, *, store: bool = True
    ) -> Object:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        if store:
            self._objects[key] = obj
        self._log.append(Event(self._rv, kind, key[0], key[1], copy.deepcopy(obj)))
        listeners: Iterable[threading.Event] = list(self._listeners)
        for listener in listeners:
            listener.set()
        return copy.deepcopy(obj)


def _identity(metadata: Object) -> Object:
    """The metadata fields no write may change."""
    keys = ("name", "namespace", "uid", "creationTimestamp", "generation", "resourceVersion")
    return {key: metadata[key] for key in keys if key in metadata}


def _without_rv(obj: Object) -> Object:
    metadata = {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}
    return {**obj, "metadata": metadata}
