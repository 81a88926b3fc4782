"""``piship-remote cp`` and the transfer lines of ``run --sync``: files moved, with progress."""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import TextIO

from piship_remote.model.errors import ConfigInvalid
from piship_remote.model.transfer import TransferSummary
from piship_remote.sandbox.files import SandboxFiles

__all__ = ["PROGRESS_FROM", "Progress", "copy", "describe_transfer"]

PROGRESS_FROM = 8 * 1024 * 1024  # bytes a transfer moves before a progress line is drawn
_REDRAW = 0.1  # seconds between progress redraws


class Progress:
    """A one-line progress meter on a terminal (nothing elsewhere): bytes moved and rate."""

    def __init__(self, what: str, stream: TextIO | None = None) -> None:
        self._what = what
        self._stream = stream if stream is not None else sys.stderr
        self._shown = self._stream.isatty()
        self._done = 0
        self._started = time.monotonic()
        self._drawn = 0.0

    def __call__(self, moved: int) -> None:
        self._done += moved
        now = time.monotonic()
        if not self._shown or self._done < PROGRESS_FROM or now - self._drawn < _REDRAW:
            return
        self._drawn = now
        rate = self._done / max(now - self._started, 1e-6)
        line = f"\r{self._what}: {_size(self._done)} ({_size(rate)}/s)"
        self._stream.write(line.ljust(60))
        self._stream.flush()

    def close(self) -> None:
        if self._shown and self._drawn:
            self._stream.write("\n")
            self._stream.flush()


def copy(sandbox_files: SandboxFiles, args: argparse.Namespace) -> TransferSummary:
    """``cp SOURCE DESTINATION``: exactly one side is remote, written ``:path``."""
    source, destination = args.source, args.destination
    upload = destination.startswith(":") and not source.startswith(":")
    download = source.startswith(":") and not destination.startswith(":")
    if upload == download:
        raise ConfigInvalid(
            "cp copies between this host and the sandbox: exactly one side is ':REMOTE'",
            user_action="piship-remote cp LOCAL :REMOTE, or piship-remote cp :REMOTE LOCAL",
        )
    progress = Progress("uploading" if upload else "downloading")
    try:
        if upload:
            remote = destination[1:] or None
            return _call(sandbox_files, "upload", source, remote, progress)
        return _call(sandbox_files, "download", source[1:] or ".", destination, progress)
    finally:
        progress.close()


def _call(
    files: SandboxFiles, method: str, first: str | None, second: str | None, progress: Progress
) -> TransferSummary:
    action: Callable[..., TransferSummary] = getattr(files, method)
    return action(first, second, progress=progress)


def describe_transfer(verb: str, summary: TransferSummary, *, verbose: bool = False) -> list[str]:
    """Lines for stderr: what moved, how many paths were left out for each reason, and
    (``verbose``) each path left out."""
    line = f"{verb} {summary.files} file(s), {_size(summary.bytes)}"
    reasons = Counter(skipped.reason for skipped in summary.skipped)
    if reasons:
        counted = ", ".join(f"{count} {reason}" for reason, count in sorted(reasons.items()))
        line += f"; skipped {len(summary.skipped)}: {counted}"
        if not verbose:
            line += " (-v lists them)"
    lines = [line]
    if verbose:
        lines.extend(f"  skipped {skipped.path}: {skipped.reason}" for skipped in summary.skipped)
    return lines


def _size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"
