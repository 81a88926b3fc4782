"""Files on a Kubernetes agent-sandbox: the runtime's file endpoints, and commands for the rest.

The runtime behind the router serves files under its base directory only:
``POST /upload`` (multipart field ``file`` whose filename is the path, parents
created), ``GET /download/<path>``, ``GET /list/<path>`` and ``GET /exists/<path>``.
It has no stat, remove or mkdir, so those are idempotent commands through
``/execute``; a path outside the base directory (or with a name the endpoints
cannot carry) moves through a staging file in the base and one ``mv``/``cp``
(the flow of :class:`._rooted_files.RootedFiles`; here, its requests)::

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
from contextlib import AbstractContextManager, nullcontext

from piship_remote.backends._common import CountedChunks, is_success
from piship_remote.backends._file_protocol import request_timeout, write_failed
from piship_remote.backends._sandbox_commands import working_directory_command
from piship_remote.backends.base import ChunkSink, ExecRequest
from piship_remote.backends.kubernetes._http import ClusterHttp
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
from piship_remote.backends.kubernetes._router import Retire, Router, RouterAnswer, runtime_command
from piship_remote.backends.kubernetes.claims import ClaimUse
from piship_remote.model.errors import CommandCancelled, ConfigInvalid, PiShipError
from piship_remote.model.transfer import FileInfo
from piship_remote.transport import HttpReply, TransportError
from piship_remote.transport.deadline import Deadline

__all__ = ["FILE_TIMEOUT", "TRANSFER_IDLE", "ClaimScope", "RuntimeFiles"]

# Names the endpoints carry unchanged: the runtime decodes URL paths twice, an upload's
# filename never, so a name with '%' (or a quote or a line break) goes through staging.
_AWKWARD = frozenset('%"\r\n\\')

ClaimScope = Callable[[threading.Event | None], AbstractContextManager[ClaimUse]]
CallCancel = threading.Event | None
"""What a file call's requests go through here: its cancel (each takes the claim itself)."""


class RuntimeFiles(RootedFiles[CallCancel]):
    """The ``RemoteFiles`` of one Kubernetes sandbox (whichever claim is current)."""

    def __init__(
        self,
        http: ClusterHttp,
        router: Router,
        router_url: str,
        *,
        workdir: str | None,
        claimed: ClaimScope,
    ) -> None:
        super().__init__(http.errors, workdir)
        self._http = http
        self._router = router
        self._url = router_url.rstrip("/")
        self._claimed = claimed

    # -- the runtime's surface ----------------------------------------------------------

    def _call(self, cancel: threading.Event | None) -> AbstractContextManager[CallCancel]:
        return nullcontext(cancel)

    def _root_key(self, call: threading.Event | None) -> str:
        return ""  # one base directory for every claim

    def _ask_root(self, call: threading.Event | None, deadline: Deadline | None) -> str:
        answer = self._command(
            working_directory_command(),
            "finding the sandbox's working directory",
            call,
            deadline,
        )
        base = answer.strip()
        if not posixpath.isabs(base):
            raise self._errors(f"the sandbox runtime reported no working directory: {base!r}")
        return base

    def _carries(self, relative: str) -> bool:
        return not _AWKWARD.intersection(relative)

    def _known_missing(
        self, path: str, cancel: threading.Event | None, deadline: Deadline | None
    ) -> bool:
        relative = self._relative(cancel, path, deadline)
        return relative is not None and not self._exists(relative, path, cancel, deadline)

    def _execute(
        self, script: str, what: str, cancel: threading.Event | None, deadline: Deadline | None
    ) -> tuple[int | None, str, str]:
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
                raise self._errors(f"{what} failed: {outcome.error}") from None
        return answer.exit_code, answer.stdout, answer.stderr

    def _list(
        self, call: threading.Event | None, relative: str, path: str, deadline: Deadline | None
    ) -> list[FileInfo]:
        with self._claimed(call) as use:
            response = self._get(use, f"/list/{_url_path(relative)}", deadline, stream=False)
            with response:
                if response.status == 404:
                    raise not_found(path, "directory")
                self._check(response, f"listing {path}")
                try:
                    entries = response.json_value(LIST_LIMIT)
                except ValueError as error:
                    raise self._errors(f"listing {path} failed: {error}") from None
        return (
            [listed_entry(path, entry) for entry in entries if is_entry(entry)]
            if isinstance(entries, list)
            else []
        )

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
                    raise self._errors(f"checking {path} failed: {error}") from None
        return answer.get("exists") is True

    def _upload(
        self,
        call: threading.Event | None,
        relative: str,
        path: str,
        chunks: Iterable[bytes],
        deadline: Deadline | None,
    ) -> int:
        counted = CountedChunks(chunks)
        boundary = f"piship-{secrets.token_hex(16)}"
        with self._claimed(call) as use:
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
        call: threading.Event | None,
        relative: str,
        path: str,
        sink: ChunkSink,
        deadline: Deadline | None,
    ) -> int:
        with self._claimed(call) as use:
            response = self._get(use, f"/download/{_url_path(relative)}", deadline, stream=True)
            with response:
                if response.status == 404:
                    raise not_found(path, "file")
                self._check(response, f"reading {path}")
                if "html" in response.headers.get("Content-Type", "").lower():
                    raise self._errors(
                        f"reading {path} failed: an HTML page came back instead of the file"
                    )
                try:
                    return sink_body(response, sink)
                except TransportError as error:
                    raise self._transfer_failed(f"reading {path}", error) from None

    # -- the pieces -------------------------------------------------------------------

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
        raise self._errors(
            f"{what} failed: {self._http.failure(response)}",
            user_action=self._http.advice(response),
        )

    def _transfer_failed(self, what: str, error: TransportError) -> PiShipError:
        return self._errors(f"{what} failed: {error}", retryable=not error.request_sent)


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


# The runtime's answers to an upload it could not write (a full disk, a file where a
# folder must be); the router's 502/503 is the sandbox gone.
_WRITE_REFUSED = frozenset({500, 507})
