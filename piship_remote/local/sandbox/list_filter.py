"""The ``GET /v2/sandboxes`` filters beside state and metadata: ``startedAfter`` and ``template``.

``startedAfter`` is an ISO 8601 time with an offset (the SDKs send one); a sandbox
started at that very moment or later is listed. ``template`` names the template the
sandbox was made from (for a sandbox made from a snapshot: the snapshot's ID)::

    wanted = ListFilter.of(query)       # WireError on a malformed time
    chosen = [s for s in sandboxes if wanted.matches(s)]

:class:`~piship_remote.local.sandbox.listing.Page` applies it with the other filters.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

import attrs

from piship_remote.local.sandbox.instance import Sandbox
from piship_remote.wire.e2b_json import WireError

__all__ = ["ListFilter", "parse_time"]

_FRACTION = re.compile(r"\.(\d+)")


@attrs.frozen
class ListFilter:
    """Which sandboxes a list asks for by start time and template (``None``: any)."""

    started_after: datetime | None = None
    template: str | None = None

    @classmethod
    def of(cls, query: dict[str, str]) -> ListFilter:
        """The filters of a list query (its values already percent-decoded)."""
        raw = query.get("startedAfter")
        return cls(parse_time(raw) if raw else None, query.get("template") or None)

    def matches(self, sandbox: Sandbox) -> bool:
        """Whether ``sandbox`` passes both filters."""
        if self.template is not None and sandbox.template != self.template:
            return False
        if self.started_after is None:
            return True
        return datetime.fromtimestamp(sandbox.started_at, timezone.utc) >= self.started_after


def parse_time(text: str) -> datetime:
    """An ISO 8601 time with an offset (``Z`` too, any digits of fraction); WireError if not."""
    normalized = _FRACTION.sub(lambda m: "." + (m.group(1) + "000000")[:6], text.strip(), count=1)
    if normalized.endswith(("Z", "z")):
        normalized = normalized[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(normalized)
    except ValueError:
        raise WireError(f"startedAfter must be an RFC 3339 time, not {text[:60]!r}") from None
    if moment.tzinfo is None:
        raise WireError("startedAfter must carry a time zone offset")
    return moment
