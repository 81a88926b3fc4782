"""The request shapes of the ``process.Process`` RPCs beyond Start, List and SendSignal.

As protojson writes them: a selector is ``{"pid": n}`` or ``{"tag": t}``, input
is ``{"stdin": base64}`` or ``{"pty": base64}``::

    >>> parse(b'{"process": {"pid": 7}, "input": {"stdin": "aGkK"}}', SendInputRequest).input
    ProcessInput(stdin='aGkK', pty=None)
"""

from __future__ import annotations

import base64
import binascii

import attrs

from piship_remote.wire.e2b_json import WireError
from piship_remote.wire.envd import ProcessSelector, Pty

__all__ = [
    "CloseStdinRequest",
    "ConnectProcessRequest",
    "ProcessInput",
    "SendInputRequest",
    "StreamInputMessage",
    "UpdateRequest",
    "decoded",
]


@attrs.frozen
class ProcessInput:
    """A oneof: bytes for the process's stdin pipe, or for its terminal."""

    stdin: str | None = None
    pty: str | None = None


@attrs.frozen
class SendInputRequest:
    process: ProcessSelector = attrs.field(factory=ProcessSelector)
    input: ProcessInput = attrs.field(factory=ProcessInput)


@attrs.frozen
class CloseStdinRequest:
    process: ProcessSelector = attrs.field(factory=ProcessSelector)


@attrs.frozen
class ConnectProcessRequest:
    process: ProcessSelector = attrs.field(factory=ProcessSelector)


@attrs.frozen
class UpdateRequest:
    process: ProcessSelector = attrs.field(factory=ProcessSelector)
    pty: Pty | None = None


@attrs.frozen
class StreamStart:
    process: ProcessSelector = attrs.field(factory=ProcessSelector)


@attrs.frozen
class StreamData:
    input: ProcessInput = attrs.field(factory=ProcessInput)


@attrs.frozen
class StreamKeepalive:
    """An empty message that only keeps the stream open."""


@attrs.frozen
class StreamInputMessage:
    """One message of a StreamInput request: its ``start``, then ``data`` or ``keepalive``."""

    start: StreamStart | None = None
    data: StreamData | None = None
    keepalive: StreamKeepalive | None = None


def decoded(value: str) -> bytes:
    """Protojson bytes (standard or URL-safe base64, padding optional); :class:`WireError`."""
    text = value.replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise WireError("the input is not valid base64") from None
