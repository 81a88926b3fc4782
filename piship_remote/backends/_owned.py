"""What a backend created and may reap: the :class:`OwnedSandbox` value and its parsing.

Both backends mark what they create (E2B metadata ``created-by: piship``, a claim
label ``agents.x-k8s.io/created-by: piship``) and list only what carries that mark,
so a sweep can never touch another client's sandboxes::

    for owned in backend.list_owned():
        if owned.age(time.time()) > 3600:
            backend.delete_owned(owned.id)
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import attrs

from piship_remote.backends.base import Instance

__all__ = [
    "CREATED_BY",
    "CREATOR",
    "Detachable",
    "OwnedSandbox",
    "Reattachable",
    "parse_timestamp",
]

CREATED_BY = "created-by"  # the E2B metadata key; the claim label adds a prefix
CREATOR = "piship"


@attrs.frozen
class OwnedSandbox:
    """A sandbox or claim this library created: its id, when (epoch seconds), its backend."""

    id: str
    created: float
    backend: str
    expires: float | None = None

    def age(self, now: float) -> float:
        """Seconds since it was created (never negative)."""
        return max(0.0, now - self.created)

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "backend": self.backend,
            "created": _iso(self.created),
            "expires": None if self.expires is None else _iso(self.expires),
        }


@runtime_checkable
class Reattachable(Protocol):
    """A backend that can attach to, list and delete the sandboxes it created."""

    def attach(self, sandbox_id: str) -> Instance:
        """An instance for the existing sandbox or claim ``sandbox_id`` (it must be ours)."""
        ...

    def list_owned(self) -> Sequence[OwnedSandbox]:
        """Every live sandbox or claim marked as created by this library."""
        ...

    def delete_owned(self, sandbox_id: str) -> None:
        """Delete one of :meth:`list_owned`'s sandboxes."""
        ...


@runtime_checkable
class Detachable(Protocol):
    """An instance that can let go of its sandbox without deleting it."""

    def detach(self) -> str:
        """Stop using the sandbox, leave it running; its id, to attach to later."""
        ...


def parse_timestamp(value: object) -> float | None:
    """An RFC 3339 timestamp as epoch seconds; ``None`` for anything else."""
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment.timestamp()


def _iso(seconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return moment.replace(microsecond=0).isoformat().replace("+00:00", "Z")
