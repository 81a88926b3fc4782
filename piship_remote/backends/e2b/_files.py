"""Files on an E2B-compatible sandbox: envd's ``/files`` endpoint and its Filesystem service.

Reads and writes stream through ``GET``/``POST /files`` (raw ``application/octet-stream``
bodies, the path and user in the query, the access token as ``X-Access-Token``);
``Stat``, ``ListDir``, ``MakeDir`` and ``Remove`` are unary Connect calls in JSON::

    files = EnvdFiles(transport, "https://49983-sbx.e2b.app", headers, user="user",
                      workdir="/home/user", errors=errors)
    files.write("/home/user/a.txt", iter([b"hello"]))
"""

from __future__ import annotations

import base64
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs

from piship_remote.backends._common import CountedChunks
from piship_remote.backends._file_protocol import SizedChunks, request_timeout, write_failed
from piship_remote.backends.base import ChunkSink
from piship_remote.model.errors import FileNotFound, PiShipError
from piship_remote.model.transfer import FileInfo
from piship_remote.transport import HttpClient, HttpReply
from piship_remote.transport.deadline import Deadline

__all__ = ["FILE_TIMEOUT", "EnvdFiles"]

FILE_TIMEOUT = 60.0  # a unary call or the headers of a transfer
TRANSFER_IDLE = 60.0  # silence allowed in the middle of a streamed body
_TYPES = {
    "FILE_TYPE_FILE": "file",
    "FILE_TYPE_DIRECTORY": "dir",
    "FILE_TYPE_SYMLINK": "symlink",
    # the ``/files`` upload answer names its entries' types in lower case
    "file": "file",
    "dir": "dir",
}

ErrorFactory = Callable[..., PiShipError]


class EnvdFiles:
    """The ``RemoteFiles`` of one E2B sandbox."""

    def __init__(
        self,
        transport: HttpClient,
        base: str,
        headers: Mapping[str, str],
        *,
        user: str,
        workdir: str,
        errors: ErrorFactory,
    ) -> None:
        self._transport = transport
        self._base = base
        self._headers = dict(headers)
        self._user = user
        self._workdir = workdir
        self._errors = errors
        self._rpc_headers = {
            **self._headers,
            "Connect-Protocol-Version": "1",
            "Content-Type": "application/json",
            "Authorization": "Basic " + base64.b64encode(f"{user}:".encode()).decode("ascii"),
        }

    def working_directory(
        self, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> str:
        return self._workdir

    def stat(
        self, path: str, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> FileInfo | None:
        answer = self._rpc("Stat", {"path": path}, cancel, deadline, missing_ok=True)
        return None if answer is None else _entry(answer.get("entry"), path)

    def list_dir(
        self, path: str, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> list[FileInfo]:
        answer = self._rpc("ListDir", {"path": path, "depth": 1}, cancel, deadline)
        entries = answer.get("entries") if answer is not None else None
        if not isinstance(entries, list):
            return []
        return [_entry(entry, path) for entry in entries if _known_type(entry)]

    def make_dir(
        self, path: str, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> bool:
        try:
            self._rpc("MakeDir", {"path": path}, cancel, deadline, answer_needed=False)
        except _AlreadyExists:
            return False
        return True

    def remove(
        self, path: str, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> None:
        self._rpc("Remove", {"path": path}, cancel, deadline, missing_ok=True, answer_needed=False)

    def write(
        self,
        path: str,
        chunks: Iterable[bytes],
        *,
        cancel: threading.Event | None = None,
        deadline: Deadline | None = None,
    ) -> FileInfo:
        sent: CountedChunks = CountedChunks(chunks)
        length: dict[str, str] = {}
        if isinstance(chunks, SizedChunks):
            sent = _Exact(chunks, chunks.size, path, self._errors)
            length = {"Content-Length": str(chunks.size)}
        # With its length known the body goes out as it is, without chunked framing
        # (which copies every piece once more). The headers (with the access token) are
        # built in the call, so no frame of a raised error's traceback holds them.
        response = self._transport.request(
            "POST",
            self._files_url(path),
            headers={
                **self._headers,
                "Content-Type": "application/octet-stream",
                **length,
            },
            data=sent,
            idle_timeout=TRANSFER_IDLE,
            **self._whole(deadline),
            cancel=cancel,
        )
        with response:
            if response.status != 200:
                raise self._file_failure(response, path, "writing")
            answer = self._parsed(response.json_value, f"writing {path}")
        first = answer[0] if isinstance(answer, list) and answer else None
        if not isinstance(first, dict):
            raise self._errors(f"writing {path} failed: envd did not describe the written file")
        # envd's answer names the file but gives no size: the bytes sent are its size.
        written = _entry(first, path)
        return attrs.evolve(written, size=sent.total) if written.type == "file" else written

    def read(
        self,
        path: str,
        sink: ChunkSink,
        *,
        cancel: threading.Event | None = None,
        deadline: Deadline | None = None,
    ) -> int:
        response = self._transport.request(
            "GET",
            self._files_url(path),
            headers={**self._headers, "Accept-Encoding": "identity"},
            timeout=request_timeout(FILE_TIMEOUT, deadline),
            idle_timeout=TRANSFER_IDLE,
            cancel=cancel,
            stream=True,
        )
        with response:
            if response.status != 200:
                raise self._file_failure(response, path, "reading")
            total = 0
            for chunk in response.iter_raw():
                sink(bytes(chunk))
                total += len(chunk)
        return total

    def _whole(self, deadline: Deadline | None) -> dict[str, Any]:
        """A transfer's bound: the operation's own deadline, handed down as it is."""
        if deadline is not None and deadline.bounded:
            return {"deadline": deadline}
        return {"timeout": request_timeout(None, deadline)}

    def _files_url(self, path: str) -> str:
        query = urllib.parse.urlencode({"path": path, "username": self._user})
        return f"{self._base}/files?{query}"

    def _rpc(
        self,
        method: str,
        body: Mapping[str, Any],
        cancel: threading.Event | None,
        deadline: Deadline | None,
        *,
        missing_ok: bool = False,
        answer_needed: bool = True,
    ) -> dict[str, Any] | None:
        response = self._transport.request(
            "POST",
            f"{self._base}/filesystem.Filesystem/{method}",
            headers=self._rpc_headers,
            json=body,
            timeout=request_timeout(FILE_TIMEOUT, deadline),
            cancel=cancel,
        )
        path = str(body.get("path", ""))
        with response:
            if response.status == 200:
                if not answer_needed:
                    return {}  # it took effect; what the answer says is not used
                answer: dict[str, Any] = self._parsed(
                    response.json_object, f"{_VERBS.get(method, method)} {path}"
                )
                return answer
            code, message = _connect_error(response)
        if code == "not_found":
            if missing_ok:
                return None
            raise _not_found(path)
        if code == "already_exists":
            raise _AlreadyExists()
        if method in _WRITING_RPCS and code in _REFUSED_CODES:
            raise write_failed(path, f"{code}: {message}")
        raise self._errors(f"{_VERBS.get(method, method)} {path} failed: {code}: {message}")

    def _parsed(self, parse: Callable[[], Any], what: str) -> Any:
        try:
            return parse()
        except ValueError as e:
            raise self._errors(f"{what} failed: envd's answer was unreadable ({e})") from None

    def _file_failure(self, response: HttpReply, path: str, verb: str) -> PiShipError:
        status = response.status
        message = _json_message(response)
        if status == 404:
            return _not_found(path)
        if verb == "writing" and status in _WRITE_REFUSED:
            return write_failed(path, "the sandbox's disk is full" if status == 507 else message)
        return self._errors(f"{verb} {path} failed: HTTP {status}: {message}")


# envd's answers to a write it could not make (the sandbox itself is fine): a directory
# at the path (400), no permission (403), a read-only place or a file where a folder
# must be (500), a full disk (507). A gateway's 502 or 503 is the sandbox gone.
_WRITE_REFUSED = frozenset({400, 403, 500, 507})

# A MakeDir or Remove envd could not do (a read-only place, a full disk): the sandbox is fine.
_WRITING_RPCS = frozenset({"MakeDir", "Remove"})
_REFUSED_CODES = frozenset({"permission_denied", "internal", "resource_exhausted"})

_VERBS = {"Stat": "checking", "ListDir": "listing", "MakeDir": "making", "Remove": "removing"}


class _AlreadyExists(Exception):
    pass


class _Exact(CountedChunks):
    """Exactly ``size`` bytes of the chunks: cut where the source grew, a failure where it
    came up short (the declared length must match what is sent)."""

    def __init__(self, chunks: Iterable[bytes], size: int, path: str, errors: ErrorFactory) -> None:
        super().__init__(chunks)
        self._size = size
        self._path = path
        self._errors = errors

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._chunks:
            room = self._size - self.total
            if len(chunk) >= room:
                self.total += room
                if room:
                    yield chunk[:room]
                return
            self.total += len(chunk)
            yield chunk
        if self.total < self._size:
            raise self._errors(
                f"writing {self._path} failed: the source ended after {self.total} of its"
                f" {self._size} bytes"
            )


def _not_found(path: str) -> PiShipError:
    return FileNotFound(f"no file or directory at {path} in the sandbox", component="files")


def _connect_error(response: HttpReply) -> tuple[str, str]:
    try:
        answer = response.json_object(64 * 1024)
    except (ValueError, PiShipError):
        return f"HTTP {response.status}", ""
    code = answer.get("code")
    message = answer.get("message")
    return (
        code if isinstance(code, str) else f"HTTP {response.status}",
        " ".join(message.split())[:300] if isinstance(message, str) else "",
    )


def _json_message(response: HttpReply) -> str:
    try:
        answer = response.json_object(64 * 1024)
    except (ValueError, PiShipError):
        return ""
    message = answer.get("message")
    return " ".join(message.split())[:300] if isinstance(message, str) else ""


def _known_type(entry: object) -> bool:
    return isinstance(entry, dict) and entry.get("type") in _TYPES


def _entry(entry: object, fallback: str) -> FileInfo:
    if not isinstance(entry, dict):
        return FileInfo(path=fallback, name=fallback.rsplit("/", 1)[-1], type="other")
    path = str(entry["path"]) if isinstance(entry.get("path"), str) else fallback
    name = str(entry["name"]) if isinstance(entry.get("name"), str) else path.rsplit("/", 1)[-1]
    linked = entry.get("symlinkTarget") is not None or entry.get("isSymlink") is True
    kind = "symlink" if linked else _TYPES.get(str(entry.get("type")), "other")
    return FileInfo(path=str(path), name=str(name), type=kind, size=_size(entry.get("size")))


def _size(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return max(0, value)
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return 0
