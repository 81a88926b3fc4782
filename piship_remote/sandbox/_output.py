"""Capturing a command's output for ``Sandbox.run``: bounded text results and live echo.

Each stream keeps at most ``limit`` bytes: the *last* ones, since a failing
command says why at the end (and :class:`~piship_remote.model.errors.CommandFailed`
shows that end). A stream that had to drop its beginning is marked truncated on
the :class:`CommandResult`. The live echo sees every byte.
"""

from __future__ import annotations

import codecs
import sys

import attrs

__all__ = ["NO_EXIT", "OUTPUT_LIMIT", "CommandResult", "OutputCapture"]

OUTPUT_LIMIT = 16 * 1024 * 1024
"""The bytes of each stream ``Sandbox.run`` keeps by default."""


NO_EXIT = -1  # the exit code of the output of a command that did not exit on its own


@attrs.frozen
class CommandResult:
    """What ``Sandbox.run`` returns: the exit code and the decoded output.

    ``stdout_truncated``/``stderr_truncated``: the stream was longer than the
    limit, and only its last ``limit`` bytes are in ``stdout``/``stderr``.
    """

    exit_code: int
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False


class _Tail:
    """The last ``limit`` bytes written (all of them when ``limit`` is ``None``)."""

    def __init__(self, limit: int | None) -> None:
        self._limit = limit
        self._kept = bytearray()
        self.truncated = False

    def write(self, chunk: bytes) -> None:
        kept = self._kept
        kept += chunk
        excess = len(kept) - self._limit if self._limit is not None else 0
        if excess > 0:
            del kept[:excess]  # cheap: a bytearray drops its front by moving its start
            self.truncated = True

    def text(self) -> str:
        kept = self._kept
        start = 0
        if self.truncated:
            # The cut may have split a character: drop its continuation bytes.
            while start < min(3, len(kept)) and kept[start] & 0xC0 == 0x80:
                start += 1
        with memoryview(kept) as view, view[start:] as text:  # decoded in place, not copied
            return str(text, "utf-8", "replace")


class OutputCapture:
    """Collects stdout and stderr chunks; with ``echo`` also writes them as they arrive.

    ``limit`` is the bytes kept per stream (``None``: everything). The echo looks
    ``sys.stdout``/``sys.stderr`` up on every write, so in Jupyter the text lands
    in the cell that is running; a stream with a binary ``buffer`` (a file, a pipe)
    gets the bytes unchanged, any other the text decoded as UTF-8.
    """

    def __init__(self, *, echo: bool = False, limit: int | None = OUTPUT_LIMIT) -> None:
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise TypeError(f"the output limit must be an int or None, not {type(limit).__name__}")
        if limit is not None and limit < 0:
            raise ValueError(f"the output limit must not be negative, not {limit}")
        self._echo = echo
        self._kept = {"stdout": _Tail(limit), "stderr": _Tail(limit)}
        self._decoders = {
            name: codecs.getincrementaldecoder("utf-8")("replace") for name in self._kept
        }

    def write(self, stream: str, chunk: bytes) -> None:
        self._kept[stream].write(chunk)
        if self._echo:
            target = sys.stderr if stream == "stderr" else sys.stdout
            raw = getattr(target, "buffer", None)
            if raw is not None:
                # The bytes as they came: a binary output piped on stays identical.
                target.flush()
                raw.write(chunk)
                raw.flush()
                return
            target.write(self._decoders[stream].decode(chunk))
            target.flush()

    def result(self, exit_code: int) -> CommandResult:
        if self._echo:
            for stream, decoder in self._decoders.items():
                tail = decoder.decode(b"", final=True)
                if tail:
                    (sys.stderr if stream == "stderr" else sys.stdout).write(tail)
        stdout, stderr = self._kept["stdout"], self._kept["stderr"]
        return CommandResult(
            exit_code=exit_code,
            stdout=stdout.text(),
            stderr=stderr.text(),
            stdout_truncated=stdout.truncated,
            stderr_truncated=stderr.truncated,
        )
