"""envd's JSON shapes: the process RPCs' requests and events, filesystem entries, errors.

As protojson writes them (``exitCode``, ``modifiedTime``: :data:`ENVD_NAMES`), for
``process.Process`` (:class:`StartRequest`, the Start stream's :class:`StartEvent`,
:class:`DataEvent`, :class:`EndEvent`, :class:`SignalRequest`, :class:`ProcessList`)
and ``filesystem.Filesystem`` (:class:`EntryInfo`, :class:`PathRequest`, ...), and
Connect's :class:`ConnectError`. The converter of :mod:`piship_remote.wire.e2b_json`
reads and writes them::

    >>> to_json(EndEvent(exit_code=3, exited=True, status="exit status 3"))
    b'{"exitCode":3,"exited":true,"status":"exit status 3"}'
    >>> parse(b'{"process": {"cmd": "ls"}, "stdin": false}', StartRequest).process
    ProcessConfig(cmd='ls', args=[], envs={}, cwd='')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

__all__ = [
    "ENVD_NAMES",
    "ConnectError",
    "DataEvent",
    "EndEvent",
    "EntryInfo",
    "ListDirRequest",
    "MoveRequest",
    "PathRequest",
    "ProcessConfig",
    "ProcessInfo",
    "ProcessList",
    "ProcessSelector",
    "Pty",
    "PtySize",
    "SignalRequest",
    "StartEvent",
    "StartRequest",
]


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


ENVD_NAMES: Mapping[type, Mapping[str, str]] = {
    EndEvent: {"exit_code": "exitCode"},
    EntryInfo: {
        "modified_time": "modifiedTime",
        "symlink_target": "symlinkTarget",
        "is_symlink": "isSymlink",
    },
}
"""The JSON names of the fields whose wire name is not the Python one."""
