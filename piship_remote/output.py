"""Capturing a command's output for ``Sandbox.run``: text results and live echo."""

from __future__ import annotations

import codecs
import sys

import attrs

__all__ = ["CommandResult", "OutputCapture"]


@attrs.frozen
class CommandResult:
    """What ``Sandbox.run`` returns: the exit code and the decoded output."""

    exit_code: int
    stdout: str
    stderr: str


class OutputCapture:
    """Collects stdout and stderr chunks; with ``echo`` also writes them as they arrive.

    The echo looks ``sys.stdout``/``sys.stderr`` up on every write, so in Jupyter
    the text lands in the cell that is running.
    """

    def __init__(self, *, echo: bool = False) -> None:
        self._echo = echo
        self._chunks: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
        self._decoders = {
            name: codecs.getincrementaldecoder("utf-8")("replace") for name in self._chunks
        }

    def write(self, stream: str, chunk: bytes) -> None:
        self._chunks[stream].append(chunk)
        if self._echo:
            text = self._decoders[stream].decode(chunk)
            target = sys.stderr if stream == "stderr" else sys.stdout
            target.write(text)
            target.flush()

    def result(self, exit_code: int) -> CommandResult:
        if self._echo:
            for stream, decoder in self._decoders.items():
                tail = decoder.decode(b"", final=True)
                if tail:
                    (sys.stderr if stream == "stderr" else sys.stdout).write(tail)
        return CommandResult(
            exit_code=exit_code,
            stdout=b"".join(self._chunks["stdout"]).decode("utf-8", "replace"),
            stderr=b"".join(self._chunks["stderr"]).decode("utf-8", "replace"),
        )
