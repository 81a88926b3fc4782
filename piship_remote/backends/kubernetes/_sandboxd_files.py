"""Files on a claim running sandboxd: its REST surface, ``/v1/files/{path}``, for what lies
under its root, and helper commands through ``Execute`` for the rest.

sandboxd serves files under its root only (``/workspace`` by default; the directory its
commands start in, asked once per claim with ``pwd``): ``GET`` streams a file or lists a
directory, ``PUT`` writes a file atomically with its parents, ``DELETE ?recursive=true``
removes. It has no stat and no mkdir, so those are idempotent commands; a path outside the
root moves through a staging file under the root and one ``mv``/``cp``, as on the router's
runtime (the flow of :class:`._rooted_files.RootedFiles`; here, its requests)::

    files = SandboxdFiles(errors, workdir=None, claimed=instance.sandboxd_use)
    files.write("/workspace/data/in.csv", iter([b"a,b\\n"]))
    files.read("/workspace/data/in.csv", sys.stdout.buffer.write)

Through the pod's port-forward no credential goes to sandboxd; through the router, the
router's own, as with its other requests.
"""

from __future__ import annotations

import posixpath
import threading
import urllib.parse
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

import attrs

from piship_remote.backends._common import CountedChunks, SandboxErrors, is_success
from piship_remote.backends._file_protocol import request_timeout, write_failed
from piship_remote.backends._sandbox_commands import working_directory_command
from piship_remote.backends.base import ChunkSink
from piship_remote.backends.kubernetes._rooted_files import (
    FILE_TIMEOUT,
    LIST_LIMIT,
    TRANSFER_IDLE,
    RootedFiles,
    is_entry,
    listed_entry,
    not_found,
    sink_body,
)
from piship_remote.backends.kubernetes._sandboxd_link import SandboxdLink
from piship_remote.model.errors import ConfigInvalid
from piship_remote.model.transfer import FileInfo
from piship_remote.transport import HttpReply, TransportError
from piship_remote.transport._cancel import CancelToken
from piship_remote.transport.deadline import Deadline

__all__ = ["SandboxdFiles", "SandboxdUse"]


@attrs.frozen
class SandboxdUse:
    """One file call's claim: its sandboxd link and the call's cancel token."""

    link: SandboxdLink
    cancel: CancelToken


SandboxdScope = Callable[[threading.Event | None], AbstractContextManager[SandboxdUse]]


class SandboxdFiles(RootedFiles[SandboxdUse]):
    """The ``RemoteFiles`` of a Kubernetes sandbox on sandboxd (whichever claim is current)."""

    def __init__(
        self,
        errors: SandboxErrors,
        *,
        workdir: str | None,
        claimed: SandboxdScope,
    ) -> None:
        super().__init__(errors, workdir)
        self._claimed = claimed

    # -- sandboxd's surface -------------------------------------------------------------

    def _call(self, cancel: threading.Event | None) -> AbstractContextManager[SandboxdUse]:
        return self._claimed(cancel)

    def _root_key(self, call: SandboxdUse) -> str:
        return call.link.claim  # asked once per claim

    def _ask_root(self, call: SandboxdUse, deadline: Deadline | None) -> str:
        code, out, err = call.link.processes.execute(working_directory_command(), None, call.cancel)
        root = out.decode("utf-8", "replace").strip()
        if code != 0 or not posixpath.isabs(root):
            raise self._errors(f"sandboxd reported no root directory: {(err or out)[-200:]!r}")
        return root

    def _carries(self, relative: str) -> bool:
        return relative != ""  # the root itself is no file to PUT or GET

    def _execute(
        self, script: str, what: str, cancel: threading.Event | None, deadline: Deadline | None
    ) -> tuple[int | None, str, str]:
        with self._claimed(cancel) as use:
            code, out, err = use.link.processes.execute(
                script, None, use.cancel, request_timeout(None, deadline)
            )
        return code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

    def _list(
        self, call: SandboxdUse, relative: str, path: str, deadline: Deadline | None
    ) -> list[FileInfo]:
        with self._request(call, "GET", relative, deadline, f"listing {path}") as response:
            if response.status == 404:
                raise not_found(path, "directory")
            self._check(response, f"listing {path}")
            if "json" not in response.headers.get("Content-Type", ""):
                raise ConfigInvalid(f"{path} in the sandbox is a file, not a directory")
            try:
                listing = response.json_object(LIST_LIMIT)
            except ValueError as error:
                raise self._errors(f"listing {path} failed: {error}") from None
        entries = listing.get("entries")
        return [
            listed_entry(path, entry)
            for entry in (entries if isinstance(entries, list) else [])
            if is_entry(entry)
        ]

    def _removed_over_rest(
        self, path: str, cancel: threading.Event | None, deadline: Deadline | None
    ) -> bool:
        with self._claimed(cancel) as use:
            relative = self._relative(use, path, deadline)
            if not relative:  # outside the root, or the root itself
                return False
            query = {"recursive": "true"}
            with self._request(
                use, "DELETE", relative, deadline, f"removing {path}", query=query
            ) as response:
                if response.status != 404:
                    self._check(response, f"removing {path}")
        return True

    def _upload(
        self,
        call: SandboxdUse,
        relative: str,
        path: str,
        chunks: Iterable[bytes],
        deadline: Deadline | None,
    ) -> int:
        counted = CountedChunks(chunks)
        with self._request(
            call,
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

    def _download(
        self,
        call: SandboxdUse,
        relative: str,
        path: str,
        sink: ChunkSink,
        deadline: Deadline | None,
    ) -> int:
        with self._request(
            call, "GET", relative, deadline, f"reading {path}", stream=True
        ) as response:
            if response.status == 404:
                raise not_found(path, "file")
            self._check(response, f"reading {path}")
            if "json" in response.headers.get("Content-Type", ""):
                raise ConfigInvalid(f"{path} in the sandbox is a directory, not a file")
            try:
                return sink_body(response, sink)
            except TransportError as error:
                raise self._errors(f"reading {path} failed: {error}") from None

    # -- the pieces -------------------------------------------------------------------

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

    def _check(self, response: HttpReply, what: str) -> None:
        if is_success(response.status):
            return
        if response.status == 403:
            raise ConfigInvalid(
                f"{what} failed: sandboxd refused the path ({_detail(response)})",
                component="files",
            )
        raise self._errors(f"{what} failed: HTTP {response.status}: {_detail(response)}")


def _detail(response: HttpReply) -> str:
    """The ``message`` of sandboxd's ``{"code", "message"}`` error, else the status."""
    try:
        body = response.json_object(64 * 1024)
    except (ValueError, TransportError):
        return f"HTTP {response.status}"
    code, message = body.get("code"), body.get("message")
    return f"{code}: {message}" if isinstance(message, str) else f"HTTP {response.status}"
