"""Files on a claim running sandboxd: its REST surface, ``/v1/files/{path}``, for what lies
under its root, and helper commands through ``Execute`` for the rest.

sandboxd serves files under its root only (``/workspace`` by default; the directory its
commands start in, asked once per claim with ``pwd``): ``GET`` streams a file or lists a
directory, ``PUT`` writes a file atomically with its parents, ``DELETE ?recursive=true``
removes. It has no stat and no mkdir, so those are idempotent commands; a path outside the
root moves through a staging file under the root and one ``mv``/``cp``, as on the router's
runtime (:mod:`._files`)::

    files = SandboxdFiles(errors, workdir=None, claimed=instance.sandboxd_use)
    files.write("/workspace/data/in.csv", iter([b"a,b\\n"]))
    files.read("/workspace/data/in.csv", sys.stdout.buffer.write)

Through the pod's port-forward no credential goes to sandboxd; through the router, the
router's own, as with its other requests.
"""

from __future__ import annotations

import posixpath
import secrets
import threading
import urllib.parse
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

import attrs

from piship_remote.backends._common import CountedChunks, SandboxErrors, is_success
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
from piship_remote.backends.base import ChunkSink
from piship_remote.backends.kubernetes._files import (
    FILE_TIMEOUT,
    TRANSFER_IDLE,
    _listed,
    _name,
    _not_found,
    _valid,
    listed_by_command,
)
from piship_remote.backends.kubernetes._sandboxd_link import SandboxdLink
from piship_remote.model.errors import ConfigInvalid
from piship_remote.model.transfer import FileInfo
from piship_remote.transport import HttpReply, TransportError
from piship_remote.transport._cancel import CancelToken
from piship_remote.transport.deadline import Deadline

__all__ = ["SandboxdFiles", "SandboxdUse"]

_LIST_LIMIT = 16 * 1024 * 1024


@attrs.frozen
class SandboxdUse:
    """One file call's claim: its sandboxd link and the call's cancel token."""

    link: SandboxdLink
    cancel: CancelToken


SandboxdScope = Callable[[threading.Event | None], AbstractContextManager[SandboxdUse]]


class SandboxdFiles:
    """The ``RemoteFiles`` of a Kubernetes sandbox on sandboxd (whichever claim is current)."""

    def __init__(
        self,
        errors: SandboxErrors,
        *,
        workdir: str | None,
        claimed: SandboxdScope,
    ) -> None:
        self._errors = errors
        self._workdir = workdir
        self._claimed = claimed
        self._lock = threading.Lock()
        self._roots: dict[str, str] = {}

    # -- RemoteFiles ------------------------------------------------------------------

    def working_directory(
        self, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> str:
        if self._workdir is not None:
            return self._workdir
        with self._claimed(cancel) as use:
            return self._root(use)

    def stat(
        self, path: str, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> FileInfo | None:
        output = self._command(stat_command(path), f"checking {path}", cancel, deadline)
        kind, _, size = output.strip().partition(" ")
        if kind == "missing":
            return None
        if kind not in ("file", "dir", "symlink", "other"):
            raise self._errors(f"checking {path} failed: the sandbox answered {kind!r}")
        return FileInfo(path, _name(path), kind, int(size) if size.isdigit() else 0)

    def list_dir(
        self, path: str, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> list[FileInfo]:
        with self._claimed(cancel) as use:
            relative = self._relative(use, path)
            if relative is not None:
                with self._request(use, "GET", relative, deadline, f"listing {path}") as response:
                    if response.status == 404:
                        raise _not_found(path, "directory")
                    self._check(response, f"listing {path}")
                    if "json" not in response.headers.get("Content-Type", ""):
                        raise ConfigInvalid(
                            f"{path} in the sandbox is a file, not a directory"
                        )
                    try:
                        listing = response.json_object(_LIST_LIMIT)
                    except ValueError as error:
                        raise self._errors(f"listing {path} failed: {error}") from None
                entries = listing.get("entries")
                return [
                    _listed(path, entry)
                    for entry in (entries if isinstance(entries, list) else [])
                    if _valid(entry)
                ]
        output = self._command(list_dir_command(path), f"listing {path}", cancel, deadline)
        return listed_by_command(path, output)

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
        with self._claimed(cancel) as use:
            relative = self._relative(use, path)
            if relative:
                query = {"recursive": "true"}
                with self._request(
                    use, "DELETE", relative, deadline, f"removing {path}", query=query
                ) as response:
                    if response.status != 404:
                        self._check(response, f"removing {path}")
                return
        self._command(remove_command(path), f"removing {path}", cancel, deadline, writing=path)

    def write(
        self,
        path: str,
        chunks: Iterable[bytes],
        *,
        cancel: threading.Event | None = None,
        deadline: Deadline | None = None,
    ) -> FileInfo:
        with self._claimed(cancel) as use:
            relative = self._relative(use, path)
            target = relative if relative else self._staging()
            size = self._put(use, target, path, chunks, deadline)
            if relative:
                return FileInfo(path, _name(path), "file", size)
            source = posixpath.join(self._root(use), target)
        self._command(
            move_in_command(source, path, posixpath.dirname(path) or "/"),
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
        with self._claimed(cancel) as use:
            relative = self._relative(use, path)
            if relative:
                return self._get(use, relative, path, sink, deadline)
            staging = self._staging()
            copy = posixpath.join(self._root(use), staging)
        output = self._command(copy_out_command(path, copy), f"reading {path}", cancel, deadline)
        if output.strip() != "copied":
            raise _not_found(path, "file")
        try:
            with self._claimed(cancel) as use:
                return self._get(use, staging, path, sink, deadline)
        finally:
            self._command(remove_command(copy), f"cleaning up after reading {path}", None, None)

    # -- the pieces -------------------------------------------------------------------

    def _root(self, use: SandboxdUse) -> str:
        """The claim's sandbox root (where its commands start), asked once per claim."""
        claim = use.link.claim
        with self._lock:
            known = self._roots.get(claim)
        if known is not None:
            return known
        code, out, err = use.link.processes.execute(working_directory_command(), None, use.cancel)
        root = out.decode("utf-8", "replace").strip()
        if code != 0 or not posixpath.isabs(root):
            raise self._errors(f"sandboxd reported no root directory: {(err or out)[-200:]!r}")
        with self._lock:
            self._roots[claim] = root
        return root

    def _relative(self, use: SandboxdUse, path: str) -> str | None:
        """``path`` relative to the root (``""``: the root), or ``None`` outside it."""
        relative = posixpath.relpath(posixpath.normpath(path), self._root(use))
        if relative == ".":
            return ""
        if relative == ".." or relative.startswith("../"):
            return None
        return relative

    def _staging(self) -> str:
        return f"{STAGING_PREFIX}{secrets.token_hex(8)}.part"

    def _request(
        self,
        use: SandboxdUse,
        method: str,
        relative: str,
        deadline: Deadline | None,
        what: str,
        *,
        query: dict[str, str] | None = None,
        **options: Any,
    ) -> HttpReply:
        url = f"{use.link.rest}/v1/files/{urllib.parse.quote(relative, safe='/')}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        options.setdefault("timeout", request_timeout(FILE_TIMEOUT, deadline))
        headers = {**use.link.headers, "Accept-Encoding": "identity", **options.pop("headers", {})}
        try:
            return use.link.send(
                method,
                url,
                cancel=use.cancel,
                headers=headers,
                idle_timeout=TRANSFER_IDLE,
                **options,
            )
        except TransportError as error:
            raise self._errors(
                f"{what} failed: {error}", retryable=not error.request_sent
            ) from None

    def _put(
        self,
        use: SandboxdUse,
        relative: str,
        path: str,
        chunks: Iterable[bytes],
        deadline: Deadline | None,
    ) -> int:
        counted = CountedChunks(chunks)
        with self._request(
            use,
            "PUT",
            relative,
            deadline,
            f"writing {path}",
            headers={"Content-Type": "application/octet-stream"},
            data=counted,
            timeout=request_timeout(None, deadline),
        ) as response:
            if response.status in (400, 500, 507):
                raise write_failed(path, _detail(response))
            self._check(response, f"writing {path}")
        return counted.total

    def _get(
        self,
        use: SandboxdUse,
        relative: str,
        path: str,
        sink: ChunkSink,
        deadline: Deadline | None,
    ) -> int:
        total = 0
        with self._request(
            use, "GET", relative, deadline, f"reading {path}", stream=True
        ) as response:
            if response.status == 404:
                raise _not_found(path, "file")
            self._check(response, f"reading {path}")
            if "json" in response.headers.get("Content-Type", ""):
                raise ConfigInvalid(
                    f"{path} in the sandbox is a directory, not a file"
                )
            try:
                for chunk in response.iter_raw():
                    sink(bytes(chunk))
                    total += len(chunk)
            except TransportError as error:
                raise self._errors(f"reading {path} failed: {error}") from None
        return total

    def _check(self, response: HttpReply, what: str) -> None:
        if is_success(response.status):
            return
        if response.status == 403:
            raise ConfigInvalid(
                f"{what} failed: sandboxd refused the path ({_detail(response)})",
                component="files",
            )
        raise self._errors(f"{what} failed: HTTP {response.status}: {_detail(response)}")

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
        with self._claimed(cancel) as use:
            code, out, err = use.link.processes.execute(
                script, None, use.cancel, request_timeout(None, deadline)
            )
        if code != 0:
            detail = " ".join((err or out).decode("utf-8", "replace").split())[-300:]
            if writing is not None:
                raise write_failed(writing, detail)
            raise self._errors(f"{what} in the sandbox failed (exit {code}): {detail}")
        return out.decode("utf-8", "replace")


def _detail(response: HttpReply) -> str:
    """The ``message`` of sandboxd's ``{"code", "message"}`` error, else the status."""
    try:
        body = response.json_object(64 * 1024)
    except (ValueError, TransportError):
        return f"HTTP {response.status}"
    code, message = body.get("code"), body.get("message")
    return f"{code}: {message}" if isinstance(message, str) else f"HTTP {response.status}"
