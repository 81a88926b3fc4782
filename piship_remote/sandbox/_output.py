"""Capturing a command's output for ``Sandbox.run``: bounded text results and live echo.

Each stream keeps at most ``limit`` bytes: the *last* ones, since a failing
command says why at the end (and :class:`~piship_remote.model.errors.CommandFailed`
shows that end). A stream that had to drop its beginning is marked truncated on
the :class:`CommandResult`. The live echo sees every byte.
"""

from __future__ import annotations

import codecs
import inspect
import io
import sys
from collections.abc import Callable
from typing import IO, Any

from piship_remote.model.output_gap import GapTally
from piship_remote.model.result import CommandResult

__all__ = ["NO_EXIT", "OUTPUT_LIMIT", "DataSink", "OnData", "OutputCapture"]

OnData = Callable[[bytes], object] | Callable[[str], object] | IO[str] | IO[bytes]
"""What ``Sandbox.exec(on_data=...)`` takes: a callable given bytes, a callable given text
(a text stream's ``write``, ``sys.stdout.write``, or a function whose first parameter is
annotated ``str``), or a writable stream object, text or binary."""

OUTPUT_LIMIT = 16 * 1024 * 1024
"""The bytes of each stream ``Sandbox.run`` keeps by default."""


NO_EXIT = -1  # the exit code of the output of a command that did not exit on its own
def text_decoders() -> dict[str, codecs.IncrementalDecoder]:
    """One UTF-8 decoder per stream: a character cut between chunks comes out whole, and
    invalid bytes as U+FFFD."""
    return {name: codecs.getincrementaldecoder("utf-8")("replace") for name in _STREAMS}


_STREAMS = ("stdout", "stderr")


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
        self._decoders = text_decoders()
        self._gaps = GapTally()

    @property
    def missing(self) -> dict[str, int]:
        """Per stream, the bytes that may be missing so far."""
        return self._gaps.missing

    def write(self, stream: str, chunk: bytes) -> None:
        # A gap is counted, not kept: the result's text is the command's own output.
        if not self._gaps.see(stream, chunk):
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
            missing=dict(self.missing),
        )


class DataSink:
    """Hands a command's output to what a caller passed as ``on_data`` (see :data:`OnData`).

    Bytes go as they came to a callable that takes bytes or a binary stream; a text
    target gets each stream decoded as UTF-8 incrementally (a character split across
    chunks is whole; invalid bytes become U+FFFD), and :meth:`close` hands on what a
    cut character left. A stream, or the stream behind a bound ``write``, is flushed
    after every chunk, so a notebook cell shows the output as it arrives.
    """

    def __init__(self, on_data: OnData) -> None:
        owner = _stream_of(on_data)
        write: Any = on_data if callable(on_data) else getattr(on_data, "write", None)
        if not callable(write):
            raise TypeError(
                f"on_data must be a callable or a writable stream, not {type(on_data).__name__}"
            )
        self._write: Callable[[object], object] = write
        self._flush = getattr(owner, "flush", None) if owner is not None else None
        text = _is_text_stream(owner) if owner is not None else _takes_text(write)
        self._decoders = text_decoders() if text else None

    def write(self, stream: str, chunk: bytes) -> None:
        decoders = self._decoders
        if decoders is None:
            self._write(chunk)
        else:
            text = decoders[stream].decode(chunk)
            if not text:
                return
            self._write(text)
        if self._flush is not None:
            self._flush()

    def close(self) -> None:
        """Hand on the end of a character that the last chunk of a stream cut."""
        for decoder in (self._decoders or {}).values():
            left = decoder.decode(b"", final=True)
            if left:
                self._write(left)


def _stream_of(on_data: OnData) -> object | None:
    """The stream object ``on_data`` is, or whose ``write`` it is; ``None`` for a function."""
    if not callable(on_data):
        return on_data
    owner: object | None = getattr(on_data, "__self__", None)
    if owner is not None and getattr(on_data, "__name__", "") == "write":
        return owner
    # Jupyter's sys.stdout.write is a plain function set on the stream, not a bound method.
    for stream in (sys.stdout, sys.stderr):
        if stream is not None and getattr(stream, "write", None) == on_data:
            return stream
    return None


def _is_text_stream(stream: object) -> bool:
    if isinstance(stream, io.TextIOBase):
        return True  # sys.stdout, io.StringIO, Jupyter's OutStream
    if isinstance(stream, (io.RawIOBase, io.BufferedIOBase)):
        return False
    return hasattr(stream, "encoding") and "b" not in str(getattr(stream, "mode", ""))


def _takes_text(function: Callable[..., object]) -> bool:
    """Whether ``function`` (a Python function or method) says by its first parameter's
    annotation that it takes ``str``; read off its code, as this runs for every ``exec``."""
    code = getattr(function, "__code__", None)
    if code is None:  # a builtin (bytearray.extend, list.append): bytes, as documented
        return False
    names = code.co_varnames[: code.co_argcount][1 if inspect.ismethod(function) else 0 :]
    annotations = getattr(function, "__annotations__", None) or {}
    return bool(names) and annotations.get(names[0]) in (str, "str")
