"""The E2B double's record of one live sandbox, and the list API's shape of it."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

import attrs

from piship_remote.wire.e2b_control import ListedSandbox
from piship_remote.wire.e2b_json import unstructure

__all__ = ["CLIENT_ID", "ENVD_VERSION", "TEMPLATE_ID", "LiveSandbox", "has_metadata", "listed"]

CLIENT_ID = "client1"
TEMPLATE_ID = "piship-workspace"
ENVD_VERSION = "0.4.0"


@attrs.define
class LiveSandbox:
    """One live creation: its id, metadata, when it started and when its lifetime ends."""

    sandbox_id: str
    metadata: dict[str, str]
    started_at: float
    expires_at: float


def listed(live: LiveSandbox, now: float) -> dict[str, Any]:
    end = time.time() + max(live.expires_at - now, 0.0)
    entry = ListedSandbox(
        sandbox_id=live.sandbox_id,
        template_id=TEMPLATE_ID,
        client_id=CLIENT_ID,
        started_at=rfc3339(live.started_at),
        end_at=rfc3339(end),
        cpu_count=2,
        memory_mb=512,
        disk_size_mb=1024,
        state="running",
        envd_version=ENVD_VERSION,
        metadata=live.metadata,
    )
    listed: dict[str, Any] = unstructure(entry)
    return listed


def rfc3339(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).isoformat().replace("+00:00", "Z")


def has_metadata(metadata: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    return all(metadata.get(k) == v for k, v in wanted.items())
