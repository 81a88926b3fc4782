"""What the control plane reports about sandboxes: lists (filtered, paged) and states, and
the pause and resume request bodies (metrics are :mod:`~piship_remote.local.sandbox.metrics`'s).

``GET /v2/sandboxes`` takes ``metadata`` (``k=v&k2=v2``, each key and value
percent-encoded once more), ``state`` (comma-separated ``running``/``paused``;
both when absent), ``order``, ``limit`` (at
most 100) and ``nextToken`` (base64url of ``<startedAt>__<sandboxID>``; the next
page's token is sent in ``X-Next-Token`` only when more remain)::

    page = Page.of(query)                       # WireError-free: ListError on bad input
    chosen, token = page.select(sandboxes)
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable
from datetime import datetime, timezone
from urllib.parse import parse_qs, urlsplit

import attrs

from piship_remote.local.sandbox.list_filter import ListFilter
from piship_remote.local.sandbox.registry import Sandbox
from piship_remote.wire.e2b_json import WireError, metadata_filter

__all__ = [
    "Lifecycle",
    "ListError",
    "Page",
    "PauseRequest",
    "ResumeRequest",
    "lifecycle",
    "metadata_filter",
    "query_of",
    "rfc3339",
    "state",
]

MAX_LIMIT = 100


ListError = WireError
"""A list query the API refuses (400)."""
RESUME_TIMEOUT = 15


@attrs.frozen
class PauseRequest:
    """``POST /sandboxes/<id>/pause``: ``memory: false`` asks for a filesystem-only pause
    (the files are kept and resuming reboots the sandbox); otherwise the sandbox is frozen
    whole. ``requireHealthyGuest`` is ignored, since freezing a local sandbox needs no
    answer from inside it."""

    memory: bool | None = None


@attrs.frozen
class ResumeRequest:
    """``POST /sandboxes/<id>/resume``: the new lifetime (E2B's default 15 s)."""

    timeout: int = RESUME_TIMEOUT


@attrs.frozen
class Lifecycle:
    """What a create body asks for at the end of the sandbox's lifetime.

    ``autoPause: true`` pauses the sandbox when its timeout is reached instead of
    killing it (the SDKs send it for ``on_timeout: "pause"``); it is then kept,
    paused, up to the service's maximum lifetime, and ``connect`` resumes it with
    a fresh timeout, files and processes kept. ``autoResume: {"enabled": true}``
    resumes such a sandbox on envd traffic (any envd request naming it), to live
    its create ``timeout`` again, and on a request to one of its ports.
    ``autoPauseMemory: false`` makes that pause filesystem-only: resuming reboots the
    sandbox with its files kept.
    """

    auto_pause: bool = False
    auto_resume: bool = False

    @classmethod
    def of(cls, body: bytes) -> Lifecycle:
        """The lifecycle fields of a create body (already known to be a JSON object)."""
        data = json.loads(body) if body.strip() else {}
        auto_pause = data.get("autoPause", False)
        if not isinstance(auto_pause, bool):
            raise WireError("autoPause must be a boolean")
        resume = data.get("autoResume")
        enabled: object = False
        if resume is not None:
            enabled = resume.get("enabled", False) if isinstance(resume, dict) else None
            if not isinstance(enabled, bool):
                raise WireError('autoResume must be {"enabled": <boolean>}')
        return cls(auto_pause, enabled is True)


def lifecycle(sandbox: Sandbox) -> dict[str, object]:
    """The ``lifecycle`` of a sandbox's details: ``onTimeout`` and ``autoResume``."""
    return {
        "onTimeout": "pause" if sandbox.auto_pause else "kill",
        "autoResume": sandbox.auto_resume,
    }


def state(sandbox: Sandbox) -> str:
    """E2B's ``state`` of a sandbox: ``"paused"`` or ``"running"``."""
    return "paused" if sandbox.pause_state.paused else "running"


def query_of(target: str) -> dict[str, str]:
    """A request target's query parameters, the first value of each (blank ones left out)."""
    return {k: v[0] for k, v in parse_qs(urlsplit(target).query).items()}


def rfc3339(timestamp: float) -> str:
    """``timestamp`` as RFC 3339 UTC with a ``Z``."""
    return datetime.fromtimestamp(timestamp, timezone.utc).isoformat().replace("+00:00", "Z")


@attrs.frozen
class Page:
    """One page request: states, metadata pairs, order, size and where it starts, and the
    start time and template asked for."""

    states: frozenset[str]
    metadata: dict[str, str]
    descending: bool
    limit: int
    after: tuple[str, str] | None
    wanted: ListFilter = attrs.field(factory=ListFilter)

    @classmethod
    def of(cls, query: dict[str, str]) -> Page:
        states = frozenset(s.strip() for s in query.get("state", "running,paused").split(","))
        raw_limit = query.get("limit", str(MAX_LIMIT))
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIMIT:
            raise ListError(f"limit must be between 1 and {MAX_LIMIT}")
        order = query.get("order", "desc").lower()
        if order not in ("asc", "desc"):
            raise ListError("order must be asc or desc")
        token = query.get("nextToken")
        return cls(
            states,
            metadata_filter(query.get("metadata")),
            order == "desc",
            int(raw_limit),
            _decode_token(token) if token else None,
            ListFilter.of(query),
        )

    def select(self, sandboxes: Iterable[Sandbox]) -> tuple[list[Sandbox], str | None]:
        """The sandboxes of this page, and the next page's token (``None`` at the end)."""
        matching = [s for s in sandboxes if self.matches(s)]
        matching.sort(key=_key, reverse=self.descending)
        if self.after is not None:
            after = self.after
            matching = [s for s in matching if (_key(s) < after) == self.descending]
            matching = [s for s in matching if _key(s) != after]
        chosen = matching[: self.limit]
        more = len(matching) > self.limit
        return chosen, _encode_token(_key(chosen[-1])) if more and chosen else None

    def matches(self, sandbox: Sandbox) -> bool:
        if state(sandbox) not in self.states or not self.wanted.matches(sandbox):
            return False
        return all(sandbox.metadata.get(k) == v for k, v in self.metadata.items())


def _key(sandbox: Sandbox) -> tuple[str, str]:
    started = datetime.fromtimestamp(sandbox.started_at, timezone.utc)
    return started.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), sandbox.id


def _encode_token(key: tuple[str, str]) -> str:
    return base64.urlsafe_b64encode(f"{key[0]}__{key[1]}".encode()).decode()


def _decode_token(token: str) -> tuple[str, str]:
    try:
        text = base64.urlsafe_b64decode(token.encode() + b"=" * (-len(token) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ListError("Invalid next token") from None
    started, sep, sandbox_id = text.partition("__")
    if not sep or not sandbox_id:
        raise ListError("Invalid next token")
    return started, sandbox_id.removesuffix("__asc")
