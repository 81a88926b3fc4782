"""envd's watcher RPCs on the local service: ``WatchDir`` (a server stream), and
``CreateWatcher``, ``GetWatcherEvents``, ``RemoveWatcher`` (unary, polled).

The path is resolved inside the sandbox first, by its agent (so a symlink means what
it means there), with envd's errors: ``path <p> not found``, ``path <p> not a
directory``, and ``internal`` ``error statting path <p>: stat <p>: permission
denied`` or ``error adding path <p> to watcher: permission denied`` for a place the
user may not reach or read (where envd's stat or inotify fails). The agent then
watches it, inside the sandbox, as the user; its events come to a :class:`DirWatch`.
Only the sandbox's own writable places can be watched (its home, ``/tmp``,
``/dev/shm``, root's home); other paths are refused with ``invalid_argument``. A sandbox
holds at most :data:`MAX_WATCHERS` watchers; they all end with it (a ``WatchDir`` stream
then ends with ``unavailable``)::

    watches = Watches(home="/home/user")
    reply = watches.create(sandbox, b'{"path": "src", "recursive": true}')  # {"watcherId"}
    reply = watches.events(sandbox, b'{"watcherId": "…"}')                  # {"events": [...]}
    reply = watches.stream(sandbox, body, keepalive=50.0)                    # Connect stream
"""

from __future__ import annotations

import posixpath
import secrets
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, override

from piship_remote._http_server.messages import Reply
from piship_remote.local.envd.watcher import DirWatch, WatchEvent, WatchPump
from piship_remote.local.isolation.user_map import Identity
from piship_remote.local.sandbox.fs import FilesFailed, call, entries_of, watch
from piship_remote.local.sandbox.registry import Sandbox
from piship_remote.wire.connect import connect_envelope
from piship_remote.wire.e2b_json import WireError, end_stream_frame, to_json, unstructure
from piship_remote.wire.envd import ConnectError
from piship_remote.wire.envd_paths import PathError, resolve

__all__ = ["MAX_WATCHERS", "WatchFailed", "Watches"]

MAX_WATCHERS = 64
SYNC_TIMEOUT = 2.0
CONNECT_JSON = "application/connect+json"
T = TypeVar("T")
DESCRIBED_AT_ONCE = 16 * 1024
"""The bytes of paths one describe request carries (a request is one packet to the agent)."""
_WITH_ENTRY = frozenset({"EVENT_TYPE_CREATE", "EVENT_TYPE_WRITE", "EVENT_TYPE_CHMOD"})


class WatchFailed(Exception):
    """A watch request envd refuses: its Connect code and message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.error = ConnectError(code, message)


@attrs.frozen
class WatchRequest:
    """``WatchDir``/``CreateWatcher``: the directory and whether to watch below it."""

    path: str = ""
    recursive: bool = False
    include_entry: bool = False
    allow_network_mounts: bool = False


@attrs.frozen
class WatcherRequest:
    """``GetWatcherEvents``/``RemoveWatcher``: which watcher."""

    watcher_id: str = ""


def _converter() -> cattrs.Converter:
    converter = cattrs.Converter()
    fields = {"watcher_id": override(rename="watcherId")}
    hook = make_dict_structure_fn(WatcherRequest, converter, **fields)  # type: ignore[arg-type]
    converter.register_structure_hook(WatcherRequest, hook)
    flags = {
        "include_entry": override(rename="includeEntry"),
        "allow_network_mounts": override(rename="allowNetworkMounts"),
    }
    watch_hook = make_dict_structure_fn(WatchRequest, converter, **flags)  # type: ignore[arg-type]
    converter.register_structure_hook(WatchRequest, watch_hook)
    for kind in (str, bool):
        converter.register_structure_hook(kind, _strict(kind))
    return converter


def _strict(kind: type) -> Callable[[object, type], object]:
    def structure(value: object, _: type) -> object:
        if type(value) is not kind:
            raise ValueError(f"invalid value for type, expected {kind.__name__}")
        return value

    return structure


_CONVERTER = _converter()


def _structure(data: object, cls: type[T]) -> T:
    if not isinstance(data, dict):
        raise WireError("the request body is not a JSON object")
    try:
        return _CONVERTER.structure(data, cls)
    except cattrs.BaseValidationError as e:
        messages = cattrs.transform_error(e)
        raise WireError(messages[0] if messages else "the request body is invalid") from None


@attrs.frozen
class _Watcher:
    """One watch of a sandbox: how its events are described (``entries``: with the entry)."""

    sandbox: Sandbox
    watch: DirWatch
    path: str
    entries: bool
    user: Identity | None

    def events(self) -> list[dict[str, object]]:
        """The events since the last call, as envd sends them."""
        self.watch.sync(SYNC_TIMEOUT)  # what happened before the request is in it
        taken = self.watch.take()
        described = self._described(taken) if self.entries else {}
        return [_event(e, described.get(e.name)) for e in taken]

    def _described(self, events: list[WatchEvent]) -> dict[str, dict[str, object]]:
        """The entries of the paths still there that were created, written or changed."""
        names = sorted({e.name for e in events if e.type in _WITH_ENTRY})
        if not names:
            return {}
        paths = [posixpath.join(self.path, name) for name in names]
        by_path: dict[str, dict[str, object]] = {}
        for batch in _batches(paths):
            try:
                found = call(self.sandbox, "describe", {"paths": batch}, user=self.user)
            except (FilesFailed, OSError):
                continue
            by_path.update({e.path: unstructure(e) for e in entries_of(found)})
        return {n: by_path[p] for n, p in zip(names, paths, strict=True) if p in by_path}


class Watches:
    """The watchers of every sandbox of one service, by id."""

    def __init__(self, *, home: str) -> None:
        self._home = home
        self._lock = threading.Lock()
        self._watchers: dict[str, _Watcher] = {}
        self._pump = WatchPump()

    def create(self, sandbox: Sandbox, request: object, user: Identity | None = None) -> Reply:
        """``CreateWatcher``: ``{"watcherId"}`` (the path resolved as ``user``)."""
        watcher = self._open(sandbox, _structure(request, WatchRequest), user)
        watcher_id = self._keep(watcher)
        return _ok({"watcherId": watcher_id})

    def events(self, sandbox: Sandbox, request: object) -> Reply:
        """``GetWatcherEvents``: the events since the last call."""
        watcher = self._find(sandbox, _structure(request, WatcherRequest).watcher_id)
        return _ok({"events": watcher.events()})

    def remove(self, sandbox: Sandbox, request: object) -> Reply:
        """``RemoveWatcher``: ``{}``."""
        watcher_id = _structure(request, WatcherRequest).watcher_id
        self._find(sandbox, watcher_id)
        self._forget(watcher_id)
        return _ok({})

    def stream(
        self,
        sandbox: Sandbox,
        request: object,
        *,
        keepalive: float,
        user: Identity | None = None,
    ) -> Iterator[bytes]:
        """``WatchDir``: start, then each event (or a keepalive), until the sandbox ends.

        :class:`WatchFailed` before the stream starts when the path cannot be watched.
        """
        watcher = self._open(sandbox, _structure(request, WatchRequest), user)
        return self._frames(self._keep(watcher), watcher, keepalive)

    def _frames(self, stream_id: str, watcher: _Watcher, keepalive: float) -> Iterator[bytes]:
        watch = watcher.watch
        try:
            yield connect_envelope({"start": {}})
            while True:
                if not watch.wait(keepalive):
                    yield connect_envelope({"keepalive": {}})
                    continue
                for event in watcher.events():
                    yield connect_envelope({"filesystem": event})
                if watch.closed:
                    yield end_stream_frame(ConnectError("unavailable", "the sandbox was deleted"))
                    return
        finally:
            self._forget(stream_id)

    def _keep(self, watcher: _Watcher) -> str:
        """Register ``watcher`` under a new id; it ends with its sandbox."""
        watcher_id = secrets.token_hex(8)
        with self._lock:
            self._watchers[watcher_id] = watcher
        self._pump.add(watcher.watch)
        watcher.sandbox.on_end(lambda: self._forget(watcher_id))
        return watcher_id

    def _open(self, sandbox: Sandbox, request: WatchRequest, user: Identity | None) -> _Watcher:
        with self._lock:
            owned = sum(1 for w in self._watchers.values() if w.sandbox.id == sandbox.id)
        if owned >= MAX_WATCHERS:
            raise WatchFailed(
                "resource_exhausted", f"a sandbox may hold at most {MAX_WATCHERS} watchers"
            )
        try:
            path = resolve(request.path, self._home if user is None else user.home)
        except PathError as e:
            raise WatchFailed("invalid_argument", str(e)) from None
        try:
            canonical = str(call(sandbox, "canonical", {"path": path}, user=user))
        except FilesFailed as e:
            raise _watch_refusal(path, e) from None
        if not _in_places(sandbox, canonical):
            places = ", ".join(sandbox.host_dirs)
            raise WatchFailed(
                "invalid_argument",
                f"cannot watch {path}: the local service watches directories under {places} only",
            )
        try:
            events = watch(sandbox, canonical, recursive=request.recursive, user=user)
        except FilesFailed as e:
            raise _watch_refusal(path, e) from None
        return _Watcher(sandbox, DirWatch(events), path, request.include_entry, user)

    def _find(self, sandbox: Sandbox, watcher_id: str) -> _Watcher:
        with self._lock:
            found = self._watchers.get(watcher_id)
        if found is None or found.sandbox.id != sandbox.id:
            raise WatchFailed("not_found", f"watcher with id {watcher_id[:64]} not found")
        return found

    def _forget(self, watcher_id: str) -> None:
        with self._lock:
            found = self._watchers.pop(watcher_id, None)
        if found is not None:
            self._pump.remove(found.watch)


def _batches(paths: list[str]) -> Iterator[list[str]]:
    """``paths`` in runs of at most :data:`DESCRIBED_AT_ONCE` bytes (at least one each)."""
    batch: list[str] = []
    size = 0
    for path in paths:
        if batch and size + len(path) > DESCRIBED_AT_ONCE:
            yield batch
            batch, size = [], 0
        batch.append(path)
        size += len(path) + 4
    if batch:
        yield batch


def _watch_refusal(path: str, failure: FilesFailed) -> WatchFailed:
    """envd's refusal of a watch of ``path`` (its stat or its inotify watch failing)."""
    if failure.code == "ENOENT":
        return WatchFailed("not_found", f"path {path} not found: no such file or directory")
    if failure.code == "ENOTDIR":
        return WatchFailed("invalid_argument", f"path {path} not a directory: not a directory")
    if failure.code == "EACCES" and failure.details.get("stage") == "stat":
        reason = f"stat {path}: permission denied"
        return WatchFailed("internal", f"error statting path {path}: {reason}")
    if failure.code == "EACCES":
        return WatchFailed("internal", f"error adding path {path} to watcher: permission denied")
    return WatchFailed("internal", f"error resolving {path}: {failure.reason}")


def _in_places(sandbox: Sandbox, canonical: str) -> bool:
    """Whether the sandbox path ``canonical`` is in one of the sandbox's writable places."""
    return any(
        canonical == inside or canonical.startswith(inside.rstrip("/") + "/")
        for inside in sandbox.host_dirs
    )


def _event(event: WatchEvent, entry: dict[str, object] | None) -> dict[str, object]:
    described: dict[str, object] = {"name": event.name, "type": event.type}
    if entry is not None:
        described["entry"] = entry
    return described


def _ok(value: object) -> Reply:
    return Reply(200, to_json(value), "application/json")
