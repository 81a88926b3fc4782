"""File metadata in a local sandbox, as envd keeps it: extended attributes ``user.e2b.<key>``.

An upload's ``X-Metadata-<key>: <value>`` headers replace the file's metadata (none
clears it), and every entry the file API describes carries it. The attributes are
read and written inside the sandbox, as the requesting user, by a few lines of the
host's Python (standard library only; see :meth:`Sandbox.python_command`), so an
attribute set by a command in the sandbox shows too::

    problem = invalid(metadata)                  # None, or why envd would refuse it
    ran = run(sandbox, 'f=$1 m=$2; shift 2; exec "$@" "$f" "$m"', path, json.dumps(metadata),
              *writer(sandbox))
    script = f'find ... -printf ...; "$@" 0 "$1" 2>/dev/null; exit 0'
    ran = run(sandbox, script, path, *reader(sandbox))     # entries, then the metadata
    entries = parse_entries(ran.stdout)          # (in fs.py) each with its metadata
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import cattrs

from piship_remote.local.sandbox.registry import Sandbox

__all__ = ["HEADER_PREFIX", "from_headers", "invalid", "parse_found", "reader", "writer"]

HEADER_PREFIX = "x-metadata-"
MAX_KEY_BYTES = 246
MAX_TOTAL_BYTES = 4096

# Run as ``python -c HELPER get DEPTH ROOT...`` (each ROOT itself at depth 0, else the
# entries up to DEPTH below it, symlinks below ROOT not followed): prints {path: {key: value}} for
# those with metadata. ``set PATH JSON`` replaces PATH's metadata with the JSON object.
_HELPER = r"""
import json, os, sys
P = "user.e2b."
def read(path):
    try:
        names = os.listxattr(path)
    except OSError:
        return {}
    found = {}
    for name in names:
        if name.startswith(P):
            try:
                found[name[len(P):]] = os.getxattr(path, name).decode("ascii", "replace")
            except OSError:
                pass
    return found
def walk(found, directory, level, depth):
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        metadata = read(entry.path)
        if metadata:
            found[entry.path] = metadata
        if level < depth and entry.is_dir(follow_symlinks=False):
            walk(found, entry.path, level + 1, depth)
if sys.argv[1] == "set":
    path, wanted = sys.argv[2], json.loads(sys.argv[3])
    for name in os.listxattr(path):
        if name.startswith(P):
            os.removexattr(path, name)
    for key, value in wanted.items():
        os.setxattr(path, P + key, value.encode("ascii"))
else:
    depth, found = int(sys.argv[2]), {}
    for root in sys.argv[3:]:
        if depth == 0:
            metadata = read(root)
            if metadata:
                found[root] = metadata
        else:
            walk(found, root, 1, depth)
    sys.stdout.write(json.dumps(found))
"""


def reader(sandbox: Sandbox) -> tuple[str, ...]:
    """The argv that, given ``DEPTH ROOT...``, prints the metadata found there as JSON."""
    return (*sandbox.python_command("-c", _HELPER), "get")


def writer(sandbox: Sandbox) -> tuple[str, ...]:
    """The argv that, given ``PATH JSON``, gives it the metadata (a JSON object)."""
    return (*sandbox.python_command("-c", _HELPER), "set")


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
    """What :func:`reader` printed: metadata by path (empty when it printed nothing usable)."""
    try:
        found = json.loads(text.decode(errors="surrogateescape")) if text.strip() else {}
        return _CONVERTER.structure(found, dict[str, dict[str, str]])
    except (UnicodeDecodeError, json.JSONDecodeError, cattrs.BaseValidationError):
        return {}


_CONVERTER = cattrs.Converter(detailed_validation=True)


def _printable(text: str) -> bool:
    return all(" " <= c <= "~" for c in text)
