"""The E2B wire model: the JSON shapes of the control plane and of envd, and their converter.

Shared by the local service and the E2B test double. Control plane: the create
request (:class:`NewSandbox`) and answer (:class:`SandboxInfo`), details, errors.
envd: :class:`StartRequest`, the process events of a Start stream
(:class:`StartEvent`, :class:`DataEvent`, :class:`EndEvent`) and the Connect
envelopes that carry them (:func:`event_frame`, :func:`end_stream_frame`,
:func:`start_message`)::

    >>> event_frame("start", StartEvent(42))[5:]
    b'{"event":{"start":{"pid":42}}}'

Requests are structured with :func:`parse`, which rejects wrong JSON types
(``"5"`` is not an int, ``1`` is not a bool) and names the field::

    >>> parse(b'{"templateID": "base", "timeout": "5"}', NewSandbox)
    Traceback (most recent call last):
    ...
    piship_remote.local.wire.WireError: invalid value for type, expected int @ $.timeout

Answers are unstructured with :func:`to_json`, which leaves out default values the
way protojson does (``exitCode`` 0, empty ``error``, absent ``stdout``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import posixpath
from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import unquote

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from piship_remote.connect import END_STREAM, EnvelopeReader, connect_envelope

__all__ = [
    "ApiError",
    "ConnectError",
    "ConnectRequest",
    "DataEvent",
    "EndEvent",
    "EntryInfo",
    "ListDirRequest",
    "ListedSandbox",
    "MoveRequest",
    "NewSandbox",
    "PathError",
    "PathRequest",
    "ProcessConfig",
    "ProcessInfo",
    "ProcessList",
    "ProcessSelector",
    "Pty",
    "PtySize",
    "Refresh",
    "SandboxDetail",
    "SandboxInfo",
    "SandboxMetric",
    "SignalRequest",
    "StartEvent",
    "StartRequest",
    "TimeoutRequest",
    "WireError",
    "end_stream_frame",
    "event_frame",
    "metadata_filter",
    "parse",
    "resolve",
    "signature",
    "start_message",
    "structure",
    "to_json",
    "unstructure",
]

T = TypeVar("T")


class WireError(ValueError):
    """A request body that is not JSON or does not have the expected shape."""


class PathError(ValueError):
    """A sandbox path that cannot be resolved (``~user``, a NUL byte)."""


def resolve(path: str, home: str) -> str:
    """envd's path rule: empty is the home, ``~`` expands, relative joins the home; cleaned."""
    if "\0" in path:
        raise PathError(f"path '{path[:200]}' contains a NUL byte")
    if not path or path == "~":
        return home
    if path.startswith("~/"):
        path = home + path[1:]
    elif path.startswith("~"):
        shown = path[:200]
        raise PathError(f"error expanding and resolving path '{shown}': ~user is not supported")
    elif not path.startswith("/"):
        path = posixpath.join(home, path)
    cleaned = posixpath.normpath(path)
    return "/" + cleaned.lstrip("/")


# -- control plane -------------------------------------------------------------------


@attrs.frozen
class NewSandbox:
    """``POST /sandboxes``: the fields the local service uses; others are ignored."""

    template_id: str
    timeout: int | None = None
    """Seconds; absent means 300 on ``/v2/sandboxes`` and 15 on ``/sandboxes``, as E2B does."""
    allow_internet_access: bool | None = None
    env_vars: dict[str, str] = attrs.field(factory=dict)
    metadata: dict[str, str] = attrs.field(factory=dict)


@attrs.frozen
class TimeoutRequest:
    """``POST /sandboxes/<id>/timeout``."""

    timeout: int


@attrs.frozen
class ConnectRequest:
    """``POST /sandboxes/<id>/connect``: the lifetime from now (absent: 300 s)."""

    timeout: int | None = None


@attrs.frozen
class Refresh:
    """``POST /sandboxes/<id>/refreshes``."""

    duration: int = 0


@attrs.frozen
class SandboxInfo:
    """The ``201`` answer to a create; ``domain`` is always sent (``null``: E2B's default)."""

    sandbox_id: str
    template_id: str
    client_id: str
    envd_version: str
    envd_access_token: str
    domain: str | None = None


@attrs.frozen
class SandboxDetail:
    """``GET /sandboxes/<id>``."""

    sandbox_id: str
    template_id: str
    client_id: str
    envd_version: str
    envd_access_token: str
    started_at: str
    end_at: str
    cpu_count: int
    memory_mb: int
    disk_size_mb: int
    state: str
    metadata: dict[str, str] = attrs.field(factory=dict)
    domain: str | None = None


@attrs.frozen
class ListedSandbox:
    """One entry of ``GET /sandboxes`` and ``GET /v2/sandboxes``."""

    sandbox_id: str
    template_id: str
    client_id: str
    started_at: str
    end_at: str
    cpu_count: int
    memory_mb: int
    disk_size_mb: int
    state: str
    envd_version: str
    metadata: dict[str, str] = attrs.field(factory=dict)


@attrs.frozen
class SandboxMetric:
    """One sample of ``GET /sandboxes/<id>/metrics``."""

    timestamp: str
    timestamp_unix: int
    cpu_count: int
    cpu_used_pct: float
    mem_used: int
    mem_total: int
    mem_cache: int
    disk_used: int
    disk_total: int


@attrs.frozen
class ApiError:
    """The control plane's error body: an integer ``code`` (the HTTP status)."""

    code: int
    message: str


# -- envd (Connect) --------------------------------------------------------------------


@attrs.frozen
class ProcessConfig:
    """What to run: ``cmd`` with ``args``, extra ``envs``, in ``cwd`` (default: the home)."""

    cmd: str
    args: list[str] = attrs.field(factory=list)
    envs: dict[str, str] = attrs.field(factory=dict)
    cwd: str = ""


@attrs.frozen
class PtySize:
    cols: int = 0
    rows: int = 0


@attrs.frozen
class Pty:
    size: PtySize = attrs.field(factory=PtySize)


@attrs.frozen
class StartRequest:
    """``/process.Process/Start``: a pipe for stdin unless ``stdin`` is false; or a ``pty``."""

    process: ProcessConfig
    tag: str = ""
    stdin: bool | None = None
    pty: Pty | None = None


@attrs.frozen
class ProcessSelector:
    """A oneof: a process by ``pid`` or by ``tag``."""

    pid: int | None = None
    tag: str | None = None


@attrs.frozen
class SignalRequest:
    """``/process.Process/SendSignal``; ``signal`` is an enum name or number."""

    process: ProcessSelector
    signal: Any = None


@attrs.frozen
class StartEvent:
    pid: int


@attrs.frozen
class DataEvent:
    """Output bytes, base64 (standard alphabet, padded)."""

    stdout: str | None = None
    stderr: str | None = None
    pty: str | None = None


@attrs.frozen
class EndEvent:
    """How a process ended; Go's ``ProcessState`` fields."""

    exit_code: int = 0
    exited: bool = False
    status: str = ""
    error: str = ""


@attrs.frozen
class ProcessInfo:
    config: ProcessConfig
    pid: int
    tag: str = ""


@attrs.frozen
class ProcessList:
    processes: list[ProcessInfo] = attrs.field(factory=list)


@attrs.frozen
class EntryInfo:
    """``filesystem.EntryInfo``: ``size`` is an int64, so a JSON string; ``type`` an enum name."""

    name: str
    type: str
    path: str
    size: str = "0"
    mode: int = 0
    permissions: str = ""
    owner: str = ""
    group: str = ""
    modified_time: str | None = None
    symlink_target: str | None = None
    is_symlink: bool = False
    metadata: dict[str, str] = attrs.field(factory=dict)


@attrs.frozen
class PathRequest:
    """``Stat``, ``MakeDir``, ``Remove``: one ``path``."""

    path: str = ""


@attrs.frozen
class ListDirRequest:
    """``ListDir``: ``depth`` 0 means 1."""

    path: str = ""
    depth: int = 0


@attrs.frozen
class MoveRequest:
    source: str = ""
    destination: str = ""


@attrs.frozen
class ConnectError:
    """A Connect error: a lower_snake ``code`` string and a message."""

    code: str
    message: str


# -- the converter ---------------------------------------------------------------------

_RENAMES: Mapping[type, Mapping[str, str]] = {
    NewSandbox: {"template_id": "templateID", "env_vars": "envVars"},
    SandboxInfo: {
        "sandbox_id": "sandboxID",
        "template_id": "templateID",
        "client_id": "clientID",
        "envd_version": "envdVersion",
        "envd_access_token": "envdAccessToken",
    },
    SandboxDetail: {
        "sandbox_id": "sandboxID",
        "template_id": "templateID",
        "client_id": "clientID",
        "envd_version": "envdVersion",
        "envd_access_token": "envdAccessToken",
        "started_at": "startedAt",
        "end_at": "endAt",
        "cpu_count": "cpuCount",
        "memory_mb": "memoryMB",
        "disk_size_mb": "diskSizeMB",
    },
    EndEvent: {"exit_code": "exitCode"},
    ListedSandbox: {
        "sandbox_id": "sandboxID",
        "template_id": "templateID",
        "client_id": "clientID",
        "started_at": "startedAt",
        "end_at": "endAt",
        "cpu_count": "cpuCount",
        "memory_mb": "memoryMB",
        "disk_size_mb": "diskSizeMB",
        "envd_version": "envdVersion",
    },
    SandboxMetric: {
        "timestamp_unix": "timestampUnix",
        "cpu_count": "cpuCount",
        "cpu_used_pct": "cpuUsedPct",
        "mem_used": "memUsed",
        "mem_total": "memTotal",
        "mem_cache": "memCache",
        "disk_used": "diskUsed",
        "disk_total": "diskTotal",
    },
    EntryInfo: {
        "modified_time": "modifiedTime",
        "symlink_target": "symlinkTarget",
        "is_symlink": "isSymlink",
    },
}
_ALWAYS_SENT: Mapping[type, frozenset[str]] = {
    SandboxInfo: frozenset({"domain"}),
    SandboxMetric: frozenset(a.name for a in attrs.fields(SandboxMetric)),
    ListedSandbox: frozenset({"metadata"}),
}


def _strict(kind: type, name: str) -> Callable[[object, type], object]:
    def structure(value: object, _: type) -> object:
        if type(value) is not kind:  # bool is an int subclass; JSON keeps them apart
            raise ValueError(f"invalid value for type, expected {name}")
        return value

    return structure


def _converter() -> cattrs.Converter:
    converter = cattrs.Converter(omit_if_default=True)
    converter.register_structure_hook(int, _strict(int, "int"))
    converter.register_structure_hook(str, _strict(str, "str"))
    converter.register_structure_hook(bool, _strict(bool, "bool"))
    for cls, renames in _RENAMES.items():
        fields: dict[str, Any] = {name: override(rename=wire) for name, wire in renames.items()}
        converter.register_structure_hook(cls, make_dict_structure_fn(cls, converter, **fields))
        for name in _ALWAYS_SENT.get(cls, ()):
            fields[name] = override(rename=renames.get(name), omit_if_default=False)
        converter.register_unstructure_hook(
            cls, make_dict_unstructure_fn(cls, converter, _cattrs_omit_if_default=True, **fields)
        )
    return converter


_CONVERTER = _converter()


def parse(body: bytes, cls: type[T]) -> T:
    """Structure a JSON request body as ``cls``; :class:`WireError` names what is wrong."""
    try:
        data = json.loads(body) if body.strip() else {}
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise WireError("the request body is not JSON") from None
    return structure(data, cls)


def structure(data: object, cls: type[T]) -> T:
    """Structure already-decoded JSON as ``cls`` (see :func:`parse`)."""
    if not isinstance(data, dict):
        raise WireError("the request body is not a JSON object")
    try:
        return _CONVERTER.structure(data, cls)
    except cattrs.BaseValidationError as e:
        messages = cattrs.transform_error(e)
        raise WireError(messages[0] if messages else "the request body is invalid") from None


def to_json(value: object) -> bytes:
    """Compact JSON for an attrs value (or a plain dict holding them)."""
    data = _CONVERTER.unstructure(value)
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


def unstructure(value: object) -> Any:
    """The JSON-ready form of ``value`` (defaults omitted, wire names)."""
    return _CONVERTER.unstructure(value)


# -- Connect envelopes -------------------------------------------------------------


def event_frame(name: str, value: object) -> bytes:
    """One Start-stream envelope ``{"event": {name: value}}`` (``value`` an event or ``{}``)."""
    return connect_envelope({"event": {name: unstructure(value)}})


def end_stream_frame(error: ConnectError | None = None) -> bytes:
    """The end-of-stream envelope: ``{}`` for success, else ``{"error": {...}}``."""
    return connect_envelope({} if error is None else {"error": unstructure(error)}, END_STREAM)


def start_message(body: bytes) -> dict[str, Any]:
    """The first message of an enveloped request body (a StartRequest, not yet structured)."""
    try:
        frames = EnvelopeReader().push(body)
    except ValueError as e:
        raise WireError(str(e)) from None
    if not frames or frames[0].end_stream:
        raise WireError("the request holds no Start message")
    return frames[0].message


# -- queries and signatures --------------------------------------------------------


def metadata_filter(raw: str | None) -> dict[str, str]:
    """The pairs a ``metadata`` query value asks for; :class:`ListError` when malformed."""
    if not raw:
        return {}
    wanted: dict[str, str] = {}
    for pair in raw.split("&"):
        parts = pair.split("=")
        if len(parts) != 2:
            raise WireError(f"Invalid metadata filter: {pair[:80]}")
        wanted[unquote(parts[0])] = unquote(parts[1])
    return wanted


def signature(path: str, operation: str, username: str, token: str, expiration: int | None) -> str:
    """The signature envd expects for ``operation`` (``read``/``write``) on ``path``."""
    text = f"{path}:{operation}:{username}:{token}"
    if expiration is not None:
        text += f":{expiration}"
    digest = hashlib.sha256(text.encode()).digest()
    return "v1_" + base64.b64encode(digest).decode().rstrip("=")
