"""How the Kubernetes backend talks HTTP: a bearer credential, and failure text from a Status.

The Kubernetes API and the sandbox router share these rules: the credential is a
bearer token read fresh per attempt under the 401 protocol (a POST is never
repeated), and a failed answer reads ``HTTP <status>: <reason>: <message>``::

    http = ClusterHttp(transport, credential, redactor)
    response = http.call("GET", url, cancel=token)
    if not is_success(response.status):
        raise http.errors(f"reading the SandboxClaim failed: {http.failure(response)}")
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from piship_remote.backends._common import DETAIL_LIMIT, SandboxErrors
from piship_remote.backends._credential import Credential, send_credentialed
from piship_remote.model.errors import CommandCancelled
from piship_remote.model.redact import Redactor
from piship_remote.transport import HttpClient, HttpReply, TransportError, window_text

__all__ = ["API_TIMEOUT", "ROUTER_TOKEN_ACTION", "ClusterHttp", "transient"]

API_TIMEOUT = 30.0
ROUTER_TOKEN_ACTION = (
    "set the router's own token (router_credential; PISHIP_K8S_ROUTER_TOKEN for the CLI) "
    "to its ROUTER_AUTH_TOKEN"
)
_FAILURE_WINDOW = 4096


class ClusterHttp:
    """One backend's transport and credential, with its error factory.

    ``on_401`` is the :meth:`advice` for an HTTP 401: what the user sets so the next
    request is let through (the router's own token, for the router).
    """

    def __init__(
        self,
        transport: HttpClient,
        credential: Credential,
        redactor: Redactor,
        *,
        on_401: str | None = None,
    ) -> None:
        self.transport = transport
        self._credential = credential
        self._redactor = redactor
        self._on_401 = on_401
        self.errors = SandboxErrors(redactor)

    def call(self, method: str, url: str, **kwargs: Any) -> HttpReply:
        """One request with the bearer; ``timeout`` defaults to 30 s."""
        kwargs.setdefault("timeout", API_TIMEOUT)
        return send_credentialed(
            self.transport,
            method,
            url,
            credential=self._credential,
            auth_header=_bearer,
            repeatable=method != "POST",
            **kwargs,
        )

    def failure(self, response: HttpReply) -> str:
        """``HTTP <status>: <detail>``; a Kubernetes Status body gives its reason and message."""
        body = window_text(_head(response, _FAILURE_WINDOW), _FAILURE_WINDOW)
        detail = _status_detail(body) or body
        redacted = self._redactor.redact(" ".join(detail.split()))
        detail = redacted[:DETAIL_LIMIT].strip()
        return f"HTTP {response.status}: {detail}" if detail else f"HTTP {response.status}"

    def advice(self, response: HttpReply) -> str | None:
        """What the user does about a failed answer, when this client knows (``on_401``)."""
        return self._on_401 if response.status == 401 else None


def transient(status: int) -> bool:
    """Whether a failed status may pass on its own (429, 5xx)."""
    return status == 429 or status >= 500


def _bearer(token: str) -> Mapping[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _head(response: HttpReply, limit: int) -> bytes:
    """Up to ``limit`` bytes of the body; a failed read keeps what arrived."""
    body = bytearray()
    try:
        for chunk in response.iter_raw():
            body += chunk
            if len(body) >= limit:
                break
    except (TransportError, CommandCancelled):
        pass
    finally:
        response.close()
    return bytes(body[:limit])


def _status_detail(body: str) -> str | None:
    """The message of a Kubernetes ``Status`` (``<reason>: <message>``) or a router ``detail``."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    message = value.get("message")
    if value.get("kind") == "Status" and isinstance(message, str):
        reason = value.get("reason")
        return f"{reason}: {message}" if isinstance(reason, str) and reason else message
    detail = value.get("detail")
    if isinstance(detail, str):
        return detail
    return message if isinstance(message, str) else None
