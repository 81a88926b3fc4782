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
import re
from collections.abc import Mapping

import attrs

from piship_remote.model.errors import ConfigInvalid

__all__ = [
    "CREATED_BY",
    "CREATOR",
    "OwnedSandbox",
    "check_labels",
    "has_labels",
    "parse_timestamp",
    "user_labels",
]

CREATED_BY = "created-by"  # the E2B metadata key; the claim label adds a prefix
CREATOR = "piship"
# A label as both services accept it (Kubernetes' rule): an optional DNS prefix and "/",
# a name of up to 63 letters, digits, "-", "_", "." (alphanumeric at both ends), and
# a value of the same shape or empty.
_LABEL_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"(?:[a-z0-9](?:[-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}\Z")
_LABEL_VALUE = re.compile(rf"(?:{_LABEL_NAME})?\Z")
_RESERVED = re.compile(r"(?:.*/)?(?:created-by|piship-.*)\Z")


@attrs.frozen
class OwnedSandbox:
    """A sandbox or claim this library created: its id, when (epoch seconds), its backend."""

    id: str
    created: float
    backend: str
    expires: float | None = None
    labels: Mapping[str, str] = attrs.field(factory=dict, eq=False)
    """Its metadata (E2B) or labels (Kubernetes), this library's own marks included."""

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


def check_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    """``labels`` as a dict, each key and value one both services accept; the library's
    own keys (``created-by``, ``piship-…``) are refused."""
    checked: dict[str, str] = {}
    for key, value in (labels or {}).items():
        if not isinstance(key, str) or not _LABEL_KEY.match(key) or _RESERVED.match(key):
            raise ConfigInvalid(f"not a usable label name: {key!r}")
        if not isinstance(value, str) or not _LABEL_VALUE.match(value):
            raise ConfigInvalid(f"not a usable value for label {key}: {value!r}")
        checked[key] = value
    return checked


def user_labels(owned: OwnedSandbox) -> dict[str, str]:
    """Its labels less this library's own marks (``created-by``, ``piship-…``)."""
    return {key: value for key, value in owned.labels.items() if not _RESERVED.match(key)}


def has_labels(owned: OwnedSandbox, wanted: Mapping[str, str]) -> bool:
    """Whether ``owned`` carries every label of ``wanted``."""
    return all(owned.labels.get(key) == value for key, value in wanted.items())


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
