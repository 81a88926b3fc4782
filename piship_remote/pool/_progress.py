"""A pool's progress, shown while ``map``/``imap`` run: done, running, failed, infra, rate.

    progress = progress_for(None, total=64)      # None: shown on a terminal or in a notebook
    progress.started(); progress.finished("ok"); progress.close()

With the optional ``tqdm`` (``pip install 'piship-remote[progress]'``, which brings
``ipywidgets`` too) it is a ``tqdm`` bar: a widget in a notebook that has ``ipywidgets``,
a text bar on a terminal or in a notebook without it. Without ``tqdm``, a terminal gets
one plain line per finished task on standard error and a notebook one line rewritten in
place. ``tqdm`` is imported only when a bar is shown.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import time
from typing import Any, Protocol, TextIO

from piship_remote.pool.result import FAILED, INFRA

__all__ = ["NoProgress", "PlainProgress", "Progress", "TqdmProgress", "progress_for"]


class Progress(Protocol):
    def started(self) -> None: ...

    def finished(self, outcome: str) -> None: ...

    def close(self) -> None: ...


class NoProgress:
    """Shows nothing."""

    def started(self) -> None:
        pass

    def finished(self, outcome: str) -> None:
        pass

    def close(self) -> None:
        pass


class _Counts:
    """The numbers a progress display shows; thread-safe."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = self.running = self.failed = self.infra = 0
        self.lock = threading.Lock()
        self._since = time.monotonic()

    def started(self) -> None:
        with self.lock:
            self.running += 1

    def finished(self, outcome: str) -> None:
        with self.lock:
            self.running -= 1
            self.done += 1
            self.failed += outcome == FAILED
            self.infra += outcome == INFRA

    def rate(self) -> float:
        return self.done / max(time.monotonic() - self._since, 1e-6)

    def line(self) -> str:
        return (
            f"{self.done}/{self.total} done, {self.running} running, {self.failed} failed, "
            f"{self.infra} infra, {self.rate():.1f} tasks/s"
        )


class PlainProgress:
    """One line per finished task on ``stream`` (a terminal without ``tqdm``); with
    ``in_place``, one line rewritten after a carriage return (a notebook without it)."""

    def __init__(self, total: int, stream: TextIO, *, in_place: bool = False) -> None:
        self._counts = _Counts(total)
        self._stream = stream
        self._in_place = in_place
        self._shown = False

    def started(self) -> None:
        self._counts.started()

    def finished(self, outcome: str) -> None:
        self._counts.finished(outcome)
        with self._counts.lock:
            line = self._counts.line()
            self._stream.write(f"\rpool: {line}" if self._in_place else f"pool: {line}\n")
            self._stream.flush()
            self._shown = True

    def close(self) -> None:
        with self._counts.lock:
            if self._in_place and self._shown:
                self._stream.write("\n")
                self._stream.flush()
                self._shown = False


class TqdmProgress:
    """A ``tqdm.auto`` bar: tasks done of the total, the rate, and the other counts."""

    def __init__(self, total: int, tqdm: Any) -> None:
        self._counts = _Counts(total)
        self._bar = tqdm(total=total, unit="task", file=sys.stderr, dynamic_ncols=True)
        self._lock = threading.Lock()

    def started(self) -> None:
        self._counts.started()
        self._show(0)

    def finished(self, outcome: str) -> None:
        self._counts.finished(outcome)
        self._show(1)

    def _show(self, done: int) -> None:
        counts = self._counts
        with self._lock:
            self._bar.set_postfix(
                running=counts.running, failed=counts.failed, infra=counts.infra, refresh=False
            )
            self._bar.update(done)

    def close(self) -> None:
        with self._lock:
            self._bar.close()


def progress_for(setting: bool | None, total: int, stream: TextIO | None = None) -> Progress:
    """The display ``progress=setting`` asks for: ``None`` shows one on a terminal or in a
    notebook, ``True`` always (without ``tqdm``: the plain lines), ``False`` never."""
    stream = sys.stderr if stream is None else stream
    notebook = in_notebook()
    terminal = _is_terminal(stream)
    if setting is False or (setting is None and not (terminal or notebook)):
        return NoProgress()
    # tqdm.auto draws a widget in a notebook, and warns there without ipywidgets.
    widgets = notebook and importlib.util.find_spec("ipywidgets") is not None
    try:
        tqdm = importlib.import_module("tqdm.auto" if widgets or not notebook else "tqdm.std").tqdm
    except ImportError:
        return PlainProgress(total, stream, in_place=notebook and not terminal)
    return TqdmProgress(total, tqdm)


def in_notebook() -> bool:
    """Whether this code runs in a Jupyter kernel (an IPython with a ZMQ shell)."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    shell = get() if callable(get) else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
