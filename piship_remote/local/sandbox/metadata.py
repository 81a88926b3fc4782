"""File metadata in a local sandbox, as envd keeps it: extended attributes ``user.e2b.<key>``.

An upload's ``X-Metadata-<key>: <value>`` headers replace the file's metadata (none
clears it), and every entry the file API describes carries it. The attributes are
read and written inside the sandbox, as the requesting user, by its agent (see
:mod:`piship_remote.local.isolation.agent_files`), so an attribute set by a command in
the sandbox shows too::

    problem = invalid(metadata)                  # None, or why envd would refuse it
    metadata = from_headers(request.headers)     # {"key": "value"}
    found = parse_found(b'{"/home/user/a": {"k": "v"}}')   # the agent's JSON, checked
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import cattrs

__all__ = ["HEADER_PREFIX", "from_headers", "invalid", "parse_found"]

HEADER_PREFIX = "x-metadata-"
MAX_KEY_BYTES = 246
MAX_TOTAL_BYTES = 4096


def from_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The metadata an upload's ``X-Metadata-<key>`` headers give (keys lowercased)."""
    prefix = len(HEADER_PREFIX)
    return {
        name[prefix:].lower(): value
        for name, value in headers.items()
        if name.lower().startswith(HEADER_PREFIX)
    }


def invalid(metadata: Mapping[str, str]) -> str | None:
    """Why envd refuses ``metadata`` (printable ASCII, short keys, 4 KiB in all), or None."""
    total = 0
    for key, value in metadata.items():
        if not key or not _printable(key) or not _printable(value):
            return f"invalid metadata: key {key[:40]!r} or its value is not printable ASCII"
        if len(key) > MAX_KEY_BYTES:
            return f"invalid metadata: key {key[:40]!r}… is longer than {MAX_KEY_BYTES} bytes"
        total += len(key) + len(value)
    if total > MAX_TOTAL_BYTES:
        return f"invalid metadata: {total} bytes in all, more than {MAX_TOTAL_BYTES}"
    return None


def parse_found(text: bytes) -> dict[str, dict[str, str]]:
    """The metadata after a listing's entries: by path (empty when there is nothing usable)."""
    try:
        found = json.loads(text.decode(errors="surrogateescape")) if text.strip() else {}
        return _CONVERTER.structure(found, dict[str, dict[str, str]])
    except (UnicodeDecodeError, json.JSONDecodeError, cattrs.BaseValidationError):
        return {}


_CONVERTER = cattrs.Converter(detailed_validation=True)


def _printable(text: str) -> bool:
    return all(" " <= c <= "~" for c in text)
