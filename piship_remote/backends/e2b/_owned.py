"""Reattaching to and reaping the sandboxes this library created on an E2B-compatible service.

``POST /sandboxes/<id>/connect`` hands back an existing sandbox with a fresh envd
access token (and extends its lifetime); ``GET /v2/sandboxes?metadata=…`` lists
only the sandboxes whose metadata carries ``created-by: piship``::

    created = connect(control, "sbx1")
    owned = list_owned(control)
"""

from __future__ import annotations

import re
import urllib.parse

import attrs

from piship_remote.backends._common import is_success
from piship_remote.backends._owned import CREATED_BY, CREATOR, OwnedSandbox, parse_timestamp
from piship_remote.backends.e2b._control import (
    BACKEND_ID,
    MAX_CONTROL_RESPONSE,
    ControlPlane,
    Created,
)
from piship_remote.model.errors import (
    ConfigInvalid,
    SandboxUnavailable,
)
from piship_remote.transport import TransportError

__all__ = ["OWNED_QUERY", "connect", "list_owned"]

OWNED_QUERY = "metadata=" + urllib.parse.quote(f"{CREATED_BY}={CREATOR}", safe="")
_PAGE_LIMIT = 100
_MAX_PAGES = 100
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,127}\Z")


@attrs.frozen
class _Connect:
    timeout: int


def connect(control: ControlPlane, sandbox_id: str) -> Created:
    """The existing sandbox ``sandbox_id``, its lifetime renewed; a clear error when gone."""
    check_id(sandbox_id)
    try:
        response = control.request(
            "POST",
            f"/sandboxes/{sandbox_id}/connect",
            repeatable=True,
            body=_Connect(control.lifetime),
        )
    except TransportError as error:
        raise SandboxUnavailable(
            f"attaching to sandbox {sandbox_id} failed: {error.message}",
            retryable=True,
            component="sandbox",
        ) from None
    with response:
        if response.status == 404:
            raise SandboxUnavailable(
                f"sandbox {sandbox_id} does not exist any more (deleted or expired); "
                "activate a new one",
                component="sandbox",
            )
        if not is_success(response.status):
            raise SandboxUnavailable(
                f"attaching to sandbox {sandbox_id} failed: {response.failure()}",
                component="sandbox",
            )
        try:
            answer = response.json_object(MAX_CONTROL_RESPONSE)
        except (ValueError, TransportError) as e:
            raise SandboxUnavailable(
                f"attaching to sandbox {sandbox_id} failed: the answer was invalid: {e}",
                component="sandbox",
            ) from None
    created = control.sandbox_of(answer, delete_on_failure=False)
    if created.sandbox_id != sandbox_id:
        raise SandboxUnavailable(
            f"attaching to sandbox {sandbox_id} failed: the service answered for another sandbox",
            component="sandbox",
        )
    return created


def list_owned(control: ControlPlane) -> list[OwnedSandbox]:
    """Every live sandbox whose metadata says ``created-by: piship`` (all pages)."""
    owned: list[OwnedSandbox] = []
    token: str | None = None
    for _ in range(_MAX_PAGES):
        query = f"{OWNED_QUERY}&limit={_PAGE_LIMIT}"
        if token:
            query += "&nextToken=" + urllib.parse.quote(token, safe="")
        with control.request("GET", f"/v2/sandboxes?{query}", repeatable=True) as response:
            if not is_success(response.status):
                raise SandboxUnavailable(
                    f"listing the sandboxes failed: {response.failure()}",
                    component="sandbox",
                )
            page = response.json_value(MAX_CONTROL_RESPONSE)
            token = response.headers.get("X-Next-Token")
        owned.extend(
            _owned(item) for item in (page if isinstance(page, list) else ()) if _ours(item)
        )
        if not token:
            break
    return owned


def check_id(sandbox_id: str) -> None:
    """``sandbox_id`` is an E2B sandbox id (it becomes part of a URL)."""
    if not isinstance(sandbox_id, str) or not _ID.match(sandbox_id):
        raise ConfigInvalid(f"not an E2B sandbox id: {sandbox_id!r}")


def _ours(item: object) -> bool:
    """Listed with the metadata filter, and checked again: never touch anything else."""
    if not isinstance(item, dict):
        return False
    metadata = item.get("metadata")
    sandbox_id = item.get("sandboxID")
    return (
        isinstance(metadata, dict)
        and metadata.get(CREATED_BY) == CREATOR
        and isinstance(sandbox_id, str)
        and _ID.match(sandbox_id) is not None
    )


def _owned(item: dict[str, object]) -> OwnedSandbox:
    return OwnedSandbox(
        id=str(item["sandboxID"]),
        created=parse_timestamp(item.get("startedAt")) or 0.0,
        backend=BACKEND_ID,
        expires=parse_timestamp(item.get("endAt")),
        labels=_text_mapping(item.get("metadata")),
    )


def _text_mapping(value: object) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}
