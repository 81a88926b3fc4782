"""envd's HTTP file endpoints on the local service: ``GET /files`` and ``POST /files``.

``GET /files?path=<p>[&username=<u>]`` streams the file out of the sandbox;
``POST /files`` streams an ``application/octet-stream`` body (``path`` required) or a
``multipart/form-data`` body (each ``file`` part's filename is its path, unless
``path`` is given) into it, creating missing parent directories. Bodies of any
size pass through in pieces (chunked request bodies too), and every byte is read
and written inside the sandbox, by its agent (see :mod:`piship_remote.local.sandbox.fs`).

A request carrying ``X-Access-Token`` must carry the sandbox's; one without it must
carry a valid ``signature`` (``v1_`` + unpadded base64 of SHA-256 over
``path:op:username:token[:expiration]``), as the SDKs' ``download_url``/``upload_url``
make. ``username`` picks who reads or writes (the sandbox's user by default;
``root`` where the sandboxes have one, relative paths then from ``/root``). Errors
are ``{"code": <status>, "message": …}``: 404 ``path '<p>' does not exist``, 400
for a directory, 507 when the sandbox's disk is full, and envd's 500s for a path the
user may not reach (``error checking if path exists '<p>': stat <p>: permission
denied``, as envd's ``os.Stat`` fails) or a file it may not read (``error opening
file '<p>': open <p>: permission denied``). envd itself reads as root, so on E2B a
user reads even root's files; here ``username`` is who reads::

    files = FileEndpoints(users=SandboxUsers.of(user="user", workdir="/home/user", root=True))
    reply = files.handle(sandbox, request)
"""

from __future__ import annotations

import hmac
import json
import mimetypes
import posixpath
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from urllib.parse import parse_qs, urlsplit

import attrs

from piship_remote._http_server.messages import BodyReader, DropConnection, Head, Reply, Request
from piship_remote.local.envd.multipart import MultipartError, MultipartReader, boundary_of
from piship_remote.local.isolation.user_map import ROOT_REFUSAL, Identity, SandboxUsers
from piship_remote.local.sandbox.fs import FilesFailed, StreamBroken, read, write
from piship_remote.local.sandbox.metadata import from_headers, invalid
from piship_remote.local.sandbox.registry import Sandbox
from piship_remote.wire.e2b_control import ApiError
from piship_remote.wire.e2b_json import to_json
from piship_remote.wire.envd_paths import PathError, resolve, signature

__all__ = ["FILES_PATH", "FileEndpoints", "sandbox_missing"]

FILES_PATH = "/files"
_JSON = "application/json; charset=utf-8"
EXPIRED = "signature is already expired"


class FileEndpoints:
    """``/files`` for the sandboxes of one service, read and written as one of ``users``."""

    def __init__(self, *, users: SandboxUsers, clock: Callable[[], float] = time.time) -> None:
        self._users = users
        self._clock = clock

    def signed_for(self, sandbox: Sandbox, head: Head) -> bool:
        """Whether ``head``'s URL carries a signature made with ``sandbox``'s token."""
        operation = {"GET": "read", "POST": "write"}.get(head.method)
        if operation is None:
            return False
        query = _query(head.target)
        if "signature" not in query:
            return False
        problem = self._signature_problem(sandbox, query, operation)
        return problem is None or problem == "signature is already expired"

    def handle(self, sandbox: Sandbox, request: Request) -> Reply:
        query = _query(request.target)
        operation = {"GET": "read", "POST": "write"}.get(request.method)
        if operation is None:
            return Reply(405, headers=(("Allow", "GET, POST"),))
        user = self._user(sandbox, request.headers, query, operation)
        if isinstance(user, Reply):
            return user
        if request.method == "GET":
            return self._download(sandbox, query.get("path", ""), user)
        return self._upload(sandbox, request, query, user)

    def _user(
        self, sandbox: Sandbox, headers: Mapping[str, str], query: dict[str, str], operation: str
    ) -> Identity | Reply:
        """Who the request reads or writes as, or its refusal (a bad token, signature, user)."""
        token = headers.get("x-access-token")
        if token is not None:
            if not hmac.compare_digest(token.encode(), sandbox.access_token.encode()):
                return sandbox_missing(sandbox.id)
        else:
            problem = self._signature_problem(sandbox, query, operation)
            if problem == EXPIRED:  # a valid signature: its holder knows the token
                return error(401, problem)
            if problem is not None:
                return sandbox_missing(sandbox.id)
        username = query.get("username", self._users.default.name)
        user = self._users.named(username)
        if user is None:
            shown = username[:64]
            reason = f"error looking up user '{shown}': user: unknown user {shown}"
            return error(401, f"{reason}; {ROOT_REFUSAL}" if username == "root" else reason)
        return user

    def _signature_problem(
        self, sandbox: Sandbox, query: dict[str, str], operation: str
    ) -> str | None:
        given = query.get("signature")
        if given is None:
            return "missing signature query parameter"
        raw_expiration = query.get("signature_expiration")
        expiration = None
        if raw_expiration is not None:
            if not raw_expiration.lstrip("-").isdigit():
                return "invalid signature"
            expiration = int(raw_expiration)
        expected = signature(
            query.get("path", ""),
            operation,
            query.get("username", ""),
            sandbox.access_token,
            expiration,
        )
        if not hmac.compare_digest(given.encode(), expected.encode()):
            return "invalid signature"
        if expiration is not None and expiration < self._clock():
            return EXPIRED
        return None

    # ---- download ----------------------------------------------------------------

    def _download(self, sandbox: Sandbox, raw_path: str, user: Identity) -> Reply:
        try:
            path = resolve(raw_path, user.home)
        except PathError as e:
            return error(400, str(e))
        name = posixpath.basename(path)
        headers = (("Vary", "Accept-Encoding"), ("Content-Disposition", f"inline; filename={name}"))
        try:
            size, chunks = read(sandbox, path, user=user)
        except FilesFailed as e:
            return _read_failure(path, e)
        return Reply(
            200,
            content_type=_content_type(path),
            headers=(*headers, ("Content-Length", str(size))),
            stream=_exactly(chunks, size),
        )

    # ---- upload ------------------------------------------------------------------

    def _upload(
        self, sandbox: Sandbox, request: Request, query: dict[str, str], user: Identity
    ) -> Reply:
        body = _body_of(request)
        encoding = request.headers.get("content-encoding", "").strip().lower()
        if encoding not in ("", "identity", "gzip"):
            supported = "unsupported Content-Encoding: "
            return error(
                400,
                f"error decompressing request body: {supported}{encoding[:40]}, supported: [gzip]",
            )
        if encoding == "gzip":
            body = _Gunzipped(body)
        metadata = from_headers(request.headers)
        problem = invalid(metadata)
        if problem is not None:
            return error(400, problem)
        content_type = request.headers.get("content-type", "")
        media = content_type.partition(";")[0].strip().lower()
        target = _Target(sandbox, user, metadata)
        if media == "application/octet-stream":
            if "path" not in query:
                return error(400, "path query parameter is required for raw body upload")
            return self._write_raw(target, body, query["path"])
        if media.startswith("multipart/"):
            try:
                return self._write_multipart(target, body, content_type, query.get("path"))
            except MultipartError as e:
                return error(500, f"error parsing multipart form: {e}")
        return error(
            400,
            f"unsupported content type: {media[:80]}, "
            "expected multipart/form-data or application/octet-stream",
        )

    def _write_raw(self, target: _Target, body: BodyReader, raw_path: str) -> Reply:
        try:
            path = resolve(raw_path, target.user.home)
        except PathError as e:
            return error(400, str(e))
        failure = self._write(target, path, body.read)
        if failure is not None:
            return failure
        return _written([path], target.metadata)

    def _write_multipart(
        self, target: _Target, body: BodyReader, content_type: str, fixed: str | None
    ) -> Reply:
        reader = MultipartReader(body, boundary_of(content_type))
        written: list[str] = []
        while (part := reader.next_part()) is not None:
            if part.name != "file":
                continue
            raw = fixed if fixed is not None else part.filename
            if raw is None:
                return error(
                    400,
                    "error getting multipart custom part file name: "
                    "filename not found in Content-Disposition header",
                )
            try:
                path = resolve(raw, target.user.home)
            except PathError as e:
                return error(400, str(e))
            if path in written:
                return error(
                    400,
                    f"you cannot upload multiple files to the same path '{path}' in one upload "
                    "request, only the first specified file was uploaded",
                )
            failure = self._write(target, path, reader.read)
            if failure is not None:
                return failure
            written.append(path)
        return _written(written, target.metadata)

    def _write(self, target: _Target, path: str, source: Callable[[int], bytes]) -> Reply | None:
        """Write ``path``, then replace its metadata (a new file has none to clear)."""
        try:
            write(target.sandbox, path, source, metadata=target.metadata, user=target.user)
        except FilesFailed as e:
            return _write_failure(path, e)
        return None


@attrs.frozen
class _Target:
    """Where an upload's files go: the sandbox, the user writing them, their metadata."""

    sandbox: Sandbox
    user: Identity
    metadata: dict[str, str]


def _read_failure(path: str, failure: FilesFailed) -> Reply:
    if failure.code == "ENOENT":
        return error(404, f"path '{path}' does not exist")
    if failure.code == "EISDIR":
        return error(400, f"path '{path}' is a directory")
    if failure.code == "EACCES" and failure.details.get("stage") == "stat":
        reason = f"stat {path}: permission denied"
        return error(500, f"error checking if path exists '{path}': {reason}")
    if failure.code == "EACCES":
        return error(500, f"error opening file '{path}': open {path}: permission denied")
    return error(500, f"error reading file: {failure.reason}")


def _write_failure(path: str, failure: FilesFailed) -> Reply:
    """envd's answer for a write that failed: the file in the way, read-only, no space, …"""
    code, details = failure.code, failure.details
    if code == "EISDIR":
        return error(400, f"path is a directory: {path}")
    if code == "ENOSPC":
        return error(507, "not enough disk space available")
    if code == "EDQUOT":
        return error(507, "not enough inodes available")
    if code == "EMETADATA":
        return error(500, f"error setting metadata: {failure.reason}")
    if details.get("stage") == "parent":
        if code == "ENOTDIR":
            return error(500, f"error ensuring directories: path is a file: {details['blocked']}")
        return error(500, f"error ensuring directories: mkdir {details['path']}: {failure.reason}")
    if details.get("stage") == "open":
        return error(500, f"error opening file '{path}': open {path}: {failure.reason}")
    return error(500, f"error writing file: {failure.reason}")


def _query(target: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(target).query, keep_blank_values=True).items()}


def _written(paths: list[str], metadata: dict[str, str]) -> Reply:
    extra = {"metadata": metadata} if metadata else {}
    entries = [{"path": p, "name": posixpath.basename(p), "type": "file", **extra} for p in paths]
    return Reply(200, to_json(entries), "application/json")


def _exactly(chunks: Iterator[bytes], size: int) -> Iterator[bytes]:
    """``size`` bytes: a file that grew while read is cut at its size; one that shrank, or a
    read that failed, drops the connection (the client sees a cut body, never a short
    "success")."""
    left = size
    try:
        for chunk in chunks:
            if len(chunk) >= left:
                yield chunk[:left]
                left = 0
                break
            left -= len(chunk)
            yield chunk
    except StreamBroken:
        raise DropConnection from None
    finally:
        _close(chunks)
    if left:
        raise DropConnection


def _close(chunks: Iterator[bytes]) -> None:
    close = getattr(chunks, "close", None)
    if close is not None:
        close()


def _content_type(path: str) -> str:
    guessed = mimetypes.guess_type(path)[0] or "application/octet-stream"
    return guessed + "; charset=utf-8" if guessed.startswith("text/") else guessed


def _body_of(request: Request) -> BodyReader:
    return request.stream if request.stream is not None else _WholeBody(request.body)


class _WholeBody:
    """A body already read, behind the :class:`BodyReader` interface."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)

    @property
    def exhausted(self) -> bool:
        return not self._data

    def read(self, size: int) -> bytes:
        piece, self._data = self._data[:size], self._data[size:]
        return bytes(piece)


class _Gunzipped:
    """A gzip-encoded body, decompressed in pieces (output bounded per read)."""

    def __init__(self, body: BodyReader) -> None:
        self._body = body
        self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)

    @property
    def exhausted(self) -> bool:
        return self._body.exhausted and not self._inflate.unconsumed_tail

    def read(self, size: int) -> bytes:
        while True:
            data = self._inflate.unconsumed_tail or self._body.read(size)
            if not data:
                return self._inflate.flush()
            try:
                out = self._inflate.decompress(data, size)
            except zlib.error:
                raise MultipartError("the gzip body is corrupt") from None
            if out:
                return out


def sandbox_missing(sandbox_id: str) -> Reply:
    """envd's answer for a sandbox that is not there, or paused (502); also for one whose
    token or signature the request does not hold, so ids cannot be probed."""
    gone = {"sandboxId": sandbox_id[:128], "message": "The sandbox was not found", "code": 502}
    return Reply(502, json.dumps(gone, separators=(",", ":")).encode(), _JSON)


def error(status: int, message: str) -> Reply:
    """envd's ``/files`` error: the status and ``{"code": status, "message": message}``."""
    return Reply(status, to_json(ApiError(status, message)), _JSON)
