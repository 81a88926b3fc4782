"""The envd side of the local service: the ``process.Process`` and ``filesystem.Filesystem``
Connect RPCs, and the ``/files`` endpoints.

Requests pick their sandbox with the ``E2b-Sandbox-Id`` header (what E2B's edge
routes on), or a ``Host`` of ``49983-<id>.<domain>``, and must carry that sandbox's
``X-Access-Token`` (``/files`` may carry a URL signature instead); a request without
them is answered as one for an unknown sandbox, so ids cannot be probed. A Basic
``Authorization`` user must be the service's user (a missing header means it), or
``root`` where the sandboxes have a root beside it (the service runs as host root,
see :mod:`~piship_remote.local.isolation.user_map`): root's commands and file operations
run as uid 0 with home ``/root``. Any other name is refused with envd's
``unauthenticated``, as an end-of-stream error on a streaming call. The Process RPCs are
:class:`~piship_remote.local.envd.process_rpc.ProcessRpc`; the Filesystem RPCs, directory
watchers included, :class:`~piship_remote.local.envd.filesystem_rpc.FilesystemRpc`; ``/health``,
``/envs`` and ``/metrics`` are answered by :mod:`~piship_remote.local.envd.plain_http`. A paused
sandbox is not found (502), as on E2B, also when it was paused while a request for it
was under way; one created with ``autoResume`` is resumed by any request naming it
(see :class:`~piship_remote.local.sandbox.listing.Lifecycle`)::

    envd = Envd(registry)            # its users: registry.users
    reply = envd.handle(request)     # a server.Reply; Start's carries a stream

What differs from envd: a kill takes the command's whole process group and
session (envd signals the leader only); ``StreamInput`` is read whole, so its
input reaches the command when the client ends the stream, not message by
message; a ``Connect`` after the command ended is ``not_found`` (envd keeps the
end a moment longer); and where the service does not run as host root, ``root``
is refused unless it is the service's user: a sandbox's user namespace then maps
one uid only, and mapping a second one from inside would need a writable
``/proc`` there, which would let the sandbox reach host-wide settings.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Mapping

import attrs

from piship_remote._http_server.messages import Head, Reply, Request
from piship_remote.local.envd.files_http import FILES_PATH, FileEndpoints
from piship_remote.local.envd.files_http import sandbox_missing as _missing
from piship_remote.local.envd.filesystem_rpc import FILESYSTEM_PREFIX, FilesystemRpc
from piship_remote.local.envd.plain_http import ENVD_HTTP_PATHS, envd_http
from piship_remote.local.envd.process_rpc import (
    CONNECT_JSON,
    DEFAULT_KEEPALIVE,
    STREAMING,
    ProcessRpc,
    connect_error,
    stream_error,
)
from piship_remote.local.isolation.user_map import Identity
from piship_remote.local.sandbox.pause import Paused
from piship_remote.local.sandbox.registry import Registry, Sandbox

__all__ = ["CONNECT_JSON", "DEFAULT_KEEPALIVE", "ENVD_PORT", "PREFIX", "Envd", "is_envd"]

PREFIX = "/process.Process/"
ENVD_PORT = 49983


def is_envd(head: Head) -> bool:
    """Whether a request is for envd (by its path, or a ``Host`` naming envd's port)."""
    if head.path.startswith((PREFIX, FILESYSTEM_PREFIX)) or head.path == FILES_PATH:
        return True
    if head.path in ENVD_HTTP_PATHS and "e2b-sandbox-id" in head.headers:
        return True
    return _host_sandbox(head.headers) is not None


def _host_sandbox(headers: Mapping[str, str]) -> str | None:
    label = headers.get("host", "").partition(".")[0]
    port, _, sandbox_id = label.partition("-")
    return sandbox_id if port == str(ENVD_PORT) and sandbox_id else None


class Envd:
    """Routes envd requests to the sandboxes of a :class:`Registry`."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        self._users = registry.users
        self._files = FileEndpoints(users=registry.users)
        self._filesystem = FilesystemRpc(home=registry.users.default.home)
        self._process = ProcessRpc()

    def screen(self, head: Head) -> Reply | None:
        """The refusal of a request for no sandbox or without its token, before its body."""
        sandbox = self._sandbox(head)
        return sandbox if isinstance(sandbox, Reply) else None

    def streams_body(self, head: Head) -> bool:
        """Whether the request's body is read as it arrives (uploads), not whole."""
        return head.path == FILES_PATH and head.method == "POST"

    def handle(self, request: Request) -> Reply:
        """Answer one envd request (see :func:`is_envd`)."""
        head = Head(request.method, request.target, request.path, request.headers)
        sandbox = self._sandbox(head)
        if isinstance(sandbox, Reply):
            return sandbox
        try:
            return self._dispatch(sandbox, request)
        except Paused:  # paused between the lookup and a command's start
            return _missing(sandbox.id)

    def _dispatch(self, sandbox: Sandbox, request: Request) -> Reply:
        if request.path == FILES_PATH:
            return self._files.handle(sandbox, request)
        if request.path in ENVD_HTTP_PATHS:
            return envd_http(sandbox, request)
        if request.method != "POST":
            return Reply(405, headers=(("Allow", "POST"),))
        user = self._user(request.headers.get("authorization"))
        if request.path.startswith(FILESYSTEM_PREFIX):
            if isinstance(user, Refusal):
                return self._filesystem.handle(sandbox, request, user.message)
            return self._filesystem.handle(sandbox, request, None, user)
        method = request.path[len(PREFIX) :]
        if isinstance(user, Refusal):
            if method in STREAMING:
                return stream_error("unauthenticated", user.message)
            return connect_error(401, "unauthenticated", user.message)
        return self._process.handle(sandbox, method, request, user)

    def _sandbox(self, head: Head) -> Sandbox | Reply:
        """The sandbox the request names and holds the token of, or the refusal.

        The token is checked on the sandbox as it is (paused or not) before anything
        changes: only a request holding it resumes an ``autoResume`` sandbox.
        """
        headers = head.headers
        sandbox_id = headers.get("e2b-sandbox-id") or _host_sandbox(headers) or ""
        if not sandbox_id and head.path == FILES_PATH:
            sandbox_id = self._signed_by(head)
        known = self._registry.lookup(sandbox_id)
        if known is None or not self._holds_token(known, head):
            return _missing(sandbox_id)  # as for an unknown id: ids cannot be probed
        sandbox = self._registry.get(sandbox_id)  # resumes an autoResume sandbox
        return _missing(sandbox_id) if sandbox is None else sandbox

    def _holds_token(self, sandbox: Sandbox, head: Head) -> bool:
        """Whether the request carries the sandbox's token (on ``/files``: or a URL signed
        with it, the file endpoints telling an expired signature apart)."""
        token = head.headers.get("x-access-token")
        if head.path == FILES_PATH and token is None:
            return self._files.signed_for(sandbox, head)
        return token is not None and hmac.compare_digest(
            token.encode(), sandbox.access_token.encode()
        )

    def _signed_by(self, head: Head) -> str:
        """The sandbox whose token signs a ``/files`` URL that names no sandbox (else ``""``).

        An SDK given one URL for every sandbox makes ``download_url``/``upload_url``
        without the sandbox's id; the signature is what tells them apart.
        """
        for sandbox_id in self._registry.ids():
            sandbox = self._registry.lookup(sandbox_id)  # not get: it would auto-resume
            if sandbox is not None and self._files.signed_for(sandbox, head):
                return sandbox_id
        return ""

    def _user(self, authorization: str | None) -> Identity | Refusal:
        """The Basic user (a missing header means the default user), or why it is refused."""
        if authorization is None:
            return self._users.default
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() != "basic":
            return Refusal("invalid authorization scheme")
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return Refusal("invalid authorization header")
        name = decoded.partition(":")[0]
        user = self._users.named(name)
        return Refusal(self._users.refusal(name)) if user is None else user


@attrs.frozen
class Refusal:
    """Why a request's user is refused."""

    message: str


def _media_type(request: Request) -> str:
    return request.headers.get("content-type", "").partition(";")[0].strip().lower()
