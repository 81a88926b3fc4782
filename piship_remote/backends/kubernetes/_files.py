"""Files on a Kubernetes agent-sandbox: the runtime's file endpoints, and commands for the rest.

The runtime behind the router serves files under its base directory only:
``POST /upload`` (multipart field ``file`` whose filename is the path, parents
created), ``GET /download/<path>``, ``GET /list/<path>`` and ``GET /exists/<path>``.
It has no stat, remove or mkdir, so those are idempotent commands through
``/execute``; a path outside the base directory (or with a name the endpoints
cannot carry) moves through a staging file in the base and one ``mv``/``cp``::

    files = instance.files()                       # a RuntimeFiles
    files.write("/app/data/in.csv", iter([b"a,b\\n"]))
    files.read("/app/data/in.csv", sys.stdout.buffer.write)

Every call runs inside the claim manager's use of the current claim, like a
command: the claim is renewed while it runs and never deleted under it.
"""

from __future__ import annotations

import posixpath
import secrets
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from piship_remote.backends._common import CountedChunks, is_success
from piship_remote.backends._file_protocol import request_timeout, write_failed
from piship_remote.backends._sandbox_commands import (
    STAGING_PREFIX,
    copy_out_command,
    list_dir_command,
    make_dir_command,
    move_in_command,
    remove_command,
    stat_command,
    working_directory_command,
)
from piship_remote.backends.base import ChunkSink, ExecRequest
from piship_remote.backends.kubernetes._http import ClusterHttp
from piship_remote.backends.kubernetes._router import Retire, Router, RouterAnswer, runtime_command
from piship_remote.backends.kubernetes.claims import ClaimUse
from piship_remote.model.errors import (
    CommandCancelled,
    ConfigInvalid,
    FileNotFound,
    PiShipError,
)
from piship_remote.model.transfer import FileInfo
from piship_remote.transport import HttpReply, TransportError
from piship_remote.transport.deadline import Deadline

__all__ = ["FILE_TIMEOUT", "ClaimScope", "RuntimeFiles", "listed_by_command"]

FILE_TIMEOUT = 60.0
TRANSFER_IDLE = 60.0
_LIST_LIMIT = 16 * 1024 * 1024
# Names the endpoints carry unchanged: the runtime decodes URL paths twice, an upload's
# filename never, so a name with '%' (or a quote or a line break) goes through staging.
_AWKWARD = frozenset('%"\r\n\\')
_TYPES = {"file": "file", "directory": "dir", "f": "file", "d": "dir", "l": "symlink"}

ClaimScope = Callable[[threading.Event | None], AbstractContextManager[ClaimUse]]


class RuntimeFiles:
    """The ``RemoteFiles`` of one Kubernetes sandbox (whichever claim is current)."""

    def __init__(
        self,
        http: ClusterHttp,
        router: Router,
        router_url: str,
        *,
        namespace: str,
        port: int,
        workdir: str | None,
        claimed: ClaimScope,
    ) -> None:
        self._http = http
        self._router = router
        self._url = router_url.rstrip("/")
        self._namespace = namespace
        self._port = port
        self._workdir = workdir
        self._claimed = claimed
        self._lock = threading.Lock()
        self._base: str | None = None

    # -- RemoteFiles ------------------------------------------------------------------

    def working_directory(
        self, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> str:
        if self._workdir is not None:
            return self._workdir
        return self._base_directory(cancel, deadline)

    def stat(
        self, path: str, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> FileInfo | None:
        relative = self._relative(path, cancel, deadline)
        if relative is not None and not self._exists(relative, path, cancel, deadline):
            return None
        output = self._command(stat_command(path), f"checking {path}", cancel, deadline)
        kind, _, size = output.strip().partition(" ")
        if kind == "missing":
            return None
        if kind not in ("file", "dir", "symlink", "other"):
            raise self._http.errors(f"checking {path} failed: the sandbox answered {kind!r}")
        return FileInfo(path, _name(path), kind, int(size) if size.isdigit() else 0)

    def list_dir(
        self, path: str, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> list[FileInfo]:
        relative = self._relative(path, cancel, deadline)
        if relative is None:
            return self._listed_by_command(path, cancel, deadline)
        with self._claimed(cancel) as use:
            response = self._get(use, f"/list/{_url_path(relative)}", deadline, stream=False)
            with response:
                if response.status == 404:
                    raise _not_found(path, "directory")
                self._check(response, f"listing {path}")
                try:
                    entries = response.json_value(_LIST_LIMIT)
                except ValueError as error:
                    raise self._http.errors(f"listing {path} failed: {error}") from None
        return (
            [_listed(path, entry) for entry in entries if _valid(entry)]
            if isinstance(entries, list)
            else []
        )

    def make_dir(
        self, path: str, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> bool:
        output = self._command(
            make_dir_command(path), f"making {path}", cancel, deadline, writing=path
        )
        return output.strip() == "made"

    def remove(
        self, path: str, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> None:
        self._command(remove_command(path), f"removing {path}", cancel, deadline, writing=path)

    def write(
        self,
        path: str,
        chunks: Iterable[bytes],
        *,
        cancel: threading.Event | None = None,
        deadline: Deadline | None = None,
    ) -> FileInfo:
        relative = self._relative(path, cancel, deadline)
        if relative is not None and not _AWKWARD.intersection(relative):
            size = self._upload(relative, path, chunks, cancel, deadline)
            return FileInfo(path, _name(path), "file", size)
        staging = self._staging()
        size = self._upload(staging, path, chunks, cancel, deadline)
        source = posixpath.join(self._base_directory(cancel, deadline), staging)
        parent = posixpath.dirname(path) or "/"
        self._command(
            move_in_command(source, path, parent),
            f"writing {path}",
            cancel,
            deadline,
            writing=path,
        )
        return FileInfo(path, _name(path), "file", size)

    def read(
        self,
        path: str,
        sink: ChunkSink,
        *,
        cancel: threading.Event | None = None,
        deadline: Deadline | None = None,
    ) -> int:
        relative = self._relative(path, cancel, deadline)
        if relative is not None and not _AWKWARD.intersection(relative):
            return self._download(relative, path, sink, cancel, deadline)
        staging = self._staging()
        copy = posixpath.join(self._base_directory(cancel, deadline), staging)
        output = self._command(copy_out_command(path, copy), f"reading {path}", cancel, deadline)
        if output.strip() != "copied":
            raise _not_found(path, "file")
        try:
            return self._download(staging, path, sink, cancel, deadline)
        finally:
            self._command(remove_command(copy), f"cleaning up after reading {path}", None, None)

    def _exists(
        self, relative: str, path: str, cancel: threading.Event | None, deadline: Deadline | None
    ) -> bool:
        with self._claimed(cancel) as use:
            response = self._get(use, f"/exists/{_url_path(relative)}", deadline, stream=False)
            with response:
                self._check(response, f"checking {path}")
                try:
                    answer = response.json_object(64 * 1024)
                except ValueError as error:
                    raise self._http.errors(f"checking {path} failed: {error}") from None
        return answer.get("exists") is True

    # -- the pieces -------------------------------------------------------------------

    def _base_directory(self, cancel: threading.Event | None, deadline: Deadline | None) -> str:
        """The runtime's base directory (where commands start), asked once."""
        with self._lock:
            if self._base is not None:
                return self._base
        answer = self._command(
            working_directory_command(),
            "finding the sandbox's working directory",
            cancel,
            deadline,
        )
        base = answer.strip()
        if not posixpath.isabs(base):
            raise self._http.errors(f"the sandbox runtime reported no working directory: {base!r}")
        with self._lock:
            self._base = base
        return base

    def _relative(
        self, path: str, cancel: threading.Event | None, deadline: Deadline | None
    ) -> str | None:
        """``path`` relative to the runtime's base, or ``None`` when it lies outside it."""
        base = self._base_directory(cancel, deadline)
        relative = posixpath.relpath(posixpath.normpath(path), base)
        if relative == ".":
            return ""
        if relative == ".." or relative.startswith("../"):
            return None
        return relative

    def _staging(self) -> str:
        return f"{STAGING_PREFIX}{secrets.token_hex(8)}.part"

    def _upload(
        self,
        relative: str,
        path: str,
        chunks: Iterable[bytes],
        cancel: threading.Event | None,
        deadline: Deadline | None,
    ) -> int:
        counted = CountedChunks(chunks)
        boundary = f"piship-{secrets.token_hex(16)}"
        with self._claimed(cancel) as use:
            try:
                response = self._http.call(
                    "POST",
                    f"{self._url}/upload",
                    cancel=use.cancel,
                    headers={
                        **self._router.headers(use.claim),
                        "Content-Type": f"multipart/form-data; boundary={boundary}",
                    },
                    data=_multipart(boundary, relative, counted),
                    timeout=request_timeout(None, deadline),
                    idle_timeout=TRANSFER_IDLE,
                )
            except TransportError as error:
                raise self._transfer_failed(f"writing {path}", error) from None
            with response:
                if response.status in _WRITE_REFUSED:
                    raise write_failed(path, self._http.failure(response))
                self._check(response, f"writing {path}")
        return counted.total

    def _download(
        self,
        relative: str,
        path: str,
        sink: ChunkSink,
        cancel: threading.Event | None,
        deadline: Deadline | None,
    ) -> int:
        total = 0
        with self._claimed(cancel) as use:
            response = self._get(use, f"/download/{_url_path(relative)}", deadline, stream=True)
            with response:
                if response.status == 404:
                    raise _not_found(path, "file")
                self._check(response, f"reading {path}")
                if "html" in response.headers.get("Content-Type", "").lower():
                    raise self._http.errors(
                        f"reading {path} failed: an HTML page came back instead of the file"
                    )
                try:
                    for chunk in response.iter_raw():
                        sink(bytes(chunk))
                        total += len(chunk)
                except TransportError as error:
                    raise self._transfer_failed(f"reading {path}", error) from None
        return total

    def _get(
        self, use: ClaimUse, route: str, deadline: Deadline | None, *, stream: bool
    ) -> HttpReply:
        try:
            return self._http.call(
                "GET",
                f"{self._url}{route}",
                cancel=use.cancel,
                headers={
                    **self._router.headers(use.claim),
                    "Accept-Encoding": "identity",
                },
                timeout=request_timeout(FILE_TIMEOUT, deadline),
                idle_timeout=TRANSFER_IDLE,
                stream=stream,
            )
        except TransportError as error:
            raise self._transfer_failed("reaching the sandbox's files", error) from None

    def _check(self, response: HttpReply, what: str) -> None:
        if is_success(response.status):
            return
        if response.status == 403:
            raise ConfigInvalid(
                f"{what} failed: the sandbox runtime refused the path (it leaves its base"
                " directory)",
                component="files",
            )
        raise self._http.errors(
            f"{what} failed: {self._http.failure(response)}",
            user_action=self._http.advice(response),
        )

    def _transfer_failed(self, what: str, error: TransportError) -> PiShipError:
        return self._http.errors(f"{what} failed: {error}", retryable=not error.request_sent)

    def _command(
        self,
        script: str,
        what: str,
        cancel: threading.Event | None,
        deadline: Deadline | None,
        *,
        writing: str | None = None,
    ) -> str:
        """Run an idempotent helper ``script``; its stdout, or an error naming ``what``
        (``FILE_WRITE_FAILED`` for the path ``writing`` when the script exits non-zero)."""
        command = _helper_command(script)
        with self._claimed(cancel) as use:
            try:
                answer: RouterAnswer = self._router.execute(
                    use.claim,
                    command,
                    use.cancel,
                    read_timeout=request_timeout(None, deadline),
                )
            except CommandCancelled:
                use.retire()
                raise
            except Retire as outcome:
                use.retire(gone=outcome.gone)
                raise self._http.errors(f"{what} failed: {outcome.error}") from None
        if answer.exit_code != 0:
            detail = " ".join((answer.stderr or answer.stdout).split())[-300:]
            if writing is not None:
                raise write_failed(writing, detail)
            raise self._http.errors(
                f"{what} in the sandbox failed (exit {answer.exit_code}): {detail}"
            )
        return answer.stdout

    def _listed_by_command(
        self, path: str, cancel: threading.Event | None, deadline: Deadline | None
    ) -> list[FileInfo]:
        output = self._command(list_dir_command(path), f"listing {path}", cancel, deadline)
        return listed_by_command(path, output)


def listed_by_command(path: str, output: str) -> list[FileInfo]:
    """The entries of the directory ``path`` from the output of its ``list_dir_command``."""
    if output.strip() == "missing":
        raise _not_found(path, "directory")
    entries = []
    for record in output.split("\0"):
        kind, _, rest = record.partition(" ")
        size, _, name = rest.partition(" ")
        if name:
            entries.append(
                FileInfo(
                    posixpath.join(path, name),
                    name,
                    _TYPES.get(kind, "other"),
                    int(size) if size.isdigit() else 0,
                )
            )
    return entries


def _multipart(boundary: str, filename: str, chunks: Iterable[bytes]) -> Iterator[bytes]:
    yield (
        f"--{boundary}\r\n"
        f'Content-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    for chunk in chunks:
        if chunk:
            yield chunk
    yield f"\r\n--{boundary}--\r\n".encode()


def _helper_command(script: str) -> str:
    """The router command for a helper script (no environment, the runtime's directory)."""
    return runtime_command(ExecRequest(script, ".", ".", {}), None)


def _url_path(relative: str) -> str:
    """Encoded twice: the router forwards the raw path and the runtime decodes it twice."""
    return urllib.parse.quote(urllib.parse.quote(relative, safe=""), safe="")


def _name(path: str) -> str:
    return posixpath.basename(path.rstrip("/")) or "/"


def _valid(entry: object) -> bool:
    return isinstance(entry, dict) and isinstance(entry.get("name"), str)


def _listed(directory: str, entry: dict[str, Any]) -> FileInfo:
    name = str(entry["name"])
    size = entry.get("size")
    kind = _TYPES.get(str(entry.get("type")), "other")
    return FileInfo(
        posixpath.join(directory, name),
        name,
        kind,
        size if isinstance(size, int) and not isinstance(size, bool) and kind == "file" else 0,
    )


# The runtime's answers to an upload it could not write (a full disk, a file where a
# folder must be); the router's 502/503 is the sandbox gone.
_WRITE_REFUSED = frozenset({500, 507})


def _not_found(path: str, what: str) -> PiShipError:
    return FileNotFound(f"no {what} at {path} in the sandbox", component="files")
