"""The output-offset extension of envd's ``Connect``: replaying what a command wrote while
nobody listened.

A client that follows a command again after its stream dropped sends
``Piship-Output-Offset: stdout=<n>,stderr=<m>`` on ``/process.Process/Connect``: the bytes
of each stream it already has. A service that keeps recent output (the local service)
answers with the same header naming where its replay of each stream begins (later than
asked when its ring no longer holds the start) and streams from there; envd and the
official SDKs neither send nor read it, so the wire stays envd's::

    >>> format_offsets({"stdout": 10, "stderr": 0})
    'stdout=10,stderr=0'
    >>> parse_offsets("stdout=10, stderr=0")
    {'stdout': 10, 'stderr': 0}
    >>> parse_offsets("stdout=x") is None
    True

On a service that keeps nothing, a command run ``resumable`` also writes its output to a
spool directory in the sandbox (:func:`spooled_command`): ``out`` and ``err`` there are
the whole of each stream, read back by offset after a drop::

    >>> spool_directory("piship-1a2b")
    '/tmp/piship-spool-piship-1a2b'
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "OFFSET_HEADER",
    "OUTPUT_STREAMS",
    "SPOOL_FILES",
    "format_offsets",
    "parse_offsets",
    "spool_directory",
    "spool_of",
    "spooled_command",
]

OFFSET_HEADER = "Piship-Output-Offset"
OUTPUT_STREAMS = ("stdout", "stderr")
SPOOL_FILES = {"stdout": "out", "stderr": "err"}
_SPOOL_ROOT = "/tmp/piship-spool-"
_SPOOL_MARK = "# piship-spool "
_TAG_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")
_MAX_DIGITS = 19


def format_offsets(offsets: Mapping[str, int]) -> str:
    """The header's value for ``offsets`` (stdout, then stderr)."""
    return ",".join(f"{stream}={int(offsets.get(stream, 0))}" for stream in OUTPUT_STREAMS)


def parse_offsets(value: str | None) -> dict[str, int] | None:
    """The offsets in a header's value; ``None`` for a missing or malformed one."""
    if value is None:
        return None
    offsets: dict[str, int] = {}
    for part in value.split(","):
        name, sep, number = part.strip().partition("=")
        if not sep or name not in OUTPUT_STREAMS or name in offsets:
            return None
        if not number.isdigit() or not number.isascii() or len(number) > _MAX_DIGITS:
            return None
        offsets[name] = int(number)
    return {stream: offsets.get(stream, 0) for stream in OUTPUT_STREAMS}


def spool_directory(tag: str) -> str:
    """Where the command tagged ``tag`` (letters, digits, ``-``) spools its output."""
    if not 0 < len(tag) <= 64 or not set(tag) <= _TAG_CHARACTERS:
        raise ValueError(f"a spool's tag is 1-64 letters, digits or '-', not {tag!r}")
    return _SPOOL_ROOT + tag


def spooled_command(command: str, directory: str) -> str:
    """``command`` (a bash script) with its stdout and stderr also appended to ``out`` and
    ``err`` in ``directory``; its exit status is the command's."""
    out = f"{directory}/{SPOOL_FILES['stdout']}"  # spool_directory's: nothing to quote
    err = f"{directory}/{SPOOL_FILES['stderr']}"
    return (
        f"{_SPOOL_MARK}{directory}\n"
        f"mkdir -p {directory}\n"
        f"{{ {command}\n}} 2> >(tee -a {err} >&2) | tee -a {out}; exit \"${{PIPESTATUS[0]}}\""
    )


def spool_of(script: str) -> str | None:
    """The spool directory a :func:`spooled_command` script writes to, if it is one."""
    if not script.startswith(_SPOOL_MARK + _SPOOL_ROOT):
        return None
    directory = script[len(_SPOOL_MARK) :].partition("\n")[0]
    tag = directory[len(_SPOOL_ROOT) :]
    return directory if tag and set(tag) <= _TAG_CHARACTERS and len(tag) <= 64 else None
