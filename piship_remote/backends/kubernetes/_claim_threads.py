"""The claim manager's threading helpers: its re-arming keepalive timer, a cancellable wait."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future

from piship_remote.model.errors import CommandCancelled
from piship_remote.transport._cancel import CancelToken

__all__ = ["Keepalive", "wait_for"]


class Keepalive(threading.Timer):
    """A re-arming timer: calls ``tick(self)`` every ``interval`` seconds until stopped."""

    def __init__(self, interval: float, tick: Callable[[Keepalive], None], name: str) -> None:
        super().__init__(interval, tick, args=(self,))
        self.name = name
        self.daemon = True
        self.abort = CancelToken()  # set on stop: ends a renewal in flight

    def run(self) -> None:
        while not self.finished.wait(self.interval):
            self.function(*self.args, **self.kwargs)

    def stop(self, grace: float = 0.0) -> None:
        """Stop ticking; a tick in progress gets ``grace`` seconds, then its request is aborted.

        The grace lets a renewal already answered (say, with "gone") take effect.
        """
        self.cancel()
        if self is threading.current_thread():
            return
        self.join(grace)
        self.abort.set()
        self.join()


def wait_for(future: Future[None], cancel: CancelToken, timeout: float | None = None) -> None:
    """Wait until ``future`` is done; ``CommandCancelled`` when ``cancel`` fires (or
    ``timeout`` seconds pass) first."""
    if future.done():
        return
    woken = threading.Event()
    future.add_done_callback(lambda _future: woken.set())
    forget = cancel.on_cancel(woken.set)
    try:
        woken.wait(timeout)
    finally:
        forget()
    if not future.done():
        raise CommandCancelled()
