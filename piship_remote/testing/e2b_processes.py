"""The E2B double's process table: what envd keeps about the commands it runs.

:class:`~piship_remote.testing.e2b_server.E2bServer` parses the process RPCs and hands
their values here:

- ``send_input(tag, chunk, closing=)`` (SendInput, CloseStdin) keeps a command's input
  per tag; a ``cat`` answer waits for CloseStdin of its tag and echoes it.
- ``signal(tag)`` (SendSignal) ends the hung streams with that tag (every one for
  ``None``) and remembers the tag, so a Start with it that arrives later does not hang.
- ``cut(sandbox_id)`` ends every hung stream of a sandbox that was killed.
- ``frames(answer, tag, sandbox_id, is_gone=)`` is a Start stream: the answer's
  envelopes, held open as the answer asks.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator

from piship_remote.testing.e2b_commands import CommandAnswer, answer_frames

__all__ = ["ProcessTable"]

Gate = tuple[str | None, threading.Event]


class ProcessTable:
    """The input, hung streams and signals of one double's commands."""

    def __init__(self, wait: Callable[[threading.Event], bool]) -> None:
        self._wait = wait
        self._lock = threading.Lock()
        self._hung: list[Gate] = []
        self._killed: set[str] = set()
        self._stdin: dict[str, tuple[bytearray, threading.Event]] = {}
        self._streams: list[tuple[str, threading.Event]] = []

    def stdin(self, tag: str) -> bytes:
        """The input SendInput gave the command tagged ``tag`` so far."""
        with self._lock:
            return bytes(self._input_of(tag)[0])

    def send_input(self, tag: str, chunk: bytes, *, closing: bool) -> None:
        """Add ``chunk`` to ``tag``'s input; ``closing`` (CloseStdin) ends it."""
        with self._lock:
            received, closed = self._input_of(tag)
            received += chunk
        if closing:
            closed.set()

    def signal(self, tag: str | None) -> None:
        """End the hung streams tagged ``tag`` (every one for ``None``)."""
        with self._lock:
            if tag is not None:
                self._killed.add(tag)
            gates = [gate for hung, gate in self._hung if tag is None or hung == tag]
        for gate in gates:
            gate.set()

    def cut(self, sandbox_id: str) -> None:
        """End every hung stream of ``sandbox_id`` (call once it counts as gone)."""
        with self._lock:
            gates = [gate for owner, gate in self._streams if owner == sandbox_id]
        for gate in gates:
            gate.set()

    def frames(
        self,
        answer: CommandAnswer,
        tag: str | None,
        sandbox_id: str,
        *,
        is_gone: Callable[[str], bool],
    ) -> Iterator[bytes]:
        """The Start stream of ``answer``; a ``hang`` ends on a signal or ``cut``."""
        if not answer.get("hang"):
            stdin = functools.partial(self._read_stdin, tag)
            yield from answer_frames(answer, wait=self._wait, hang=None, stdin=stdin)
            return
        # Listen for SendSignal before the start frame goes out: a client may send
        # it as soon as it has the pid (the official SDK's kill() does).
        entry: Gate = (tag, threading.Event())
        stream = (sandbox_id, entry[1])
        with self._lock:
            self._hung.append(entry)
            self._streams.append(stream)
        # Checked after the stream is listed: a kill that marked the sandbox gone
        # before this point finds the stream in cut(), or this check sees it gone.
        if is_gone(sandbox_id):
            entry[1].set()
        try:
            hang = lambda: self._hang(*entry) and not is_gone(sandbox_id)  # noqa: E731
            yield from answer_frames(answer, wait=self._wait, hang=hang)
        finally:
            with self._lock:
                self._hung.remove(entry)
                self._streams.remove(stream)

    def _input_of(self, tag: str) -> tuple[bytearray, threading.Event]:
        """The input of ``tag`` and its closed event (made on first use; hold the lock)."""
        return self._stdin.setdefault(tag, (bytearray(), threading.Event()))

    def _read_stdin(self, tag: str | None) -> bytes | None:
        """Wait for CloseStdin of ``tag``: its input, or ``None`` when the server closed."""
        with self._lock:
            _, closed = self._input_of(tag or "")
        if not self._wait(closed):
            return None
        return self.stdin(tag or "")

    def _hang(self, tag: str | None, gate: threading.Event) -> bool:
        """Wait for a SendSignal; True when one came, False when the server closed."""
        with self._lock:
            if tag is not None and tag in self._killed:
                return True
        return self._wait(gate)
