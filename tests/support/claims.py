"""An in-memory cluster behind the claim manager, for the manager's tests."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from piship_remote.backends.kubernetes.claims import Claim, ClaimGone, ClaimManager
from piship_remote.backends.lifetime import Anchor
from piship_remote.model.errors import CommandCancelled
from piship_remote.transport._cancel import CancelToken
from tests.support.seed import Clocks

__all__ = ["FakeCluster", "MakeManager", "managers_on", "piship_threads"]

MakeManager = Callable[..., ClaimManager]


class FakeCluster:
    """The :class:`ClaimApi` of a cluster held in memory; every call is recorded."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.renewed: list[tuple[str, int]] = []
        self.checked: list[str] = []
        self.gone: set[str] = set()
        self.create_gate: threading.Event | None = None
        self.renew_gate: threading.Event | None = None
        self.check_gate: threading.Event | None = None
        self.checking = threading.Event()
        self.create_error: Exception | None = None
        self.check_error: Exception | None = None
        # Runs while a create or check is in flight (e.g. moves a clock: a slow answer).
        self.in_flight: Callable[[], None] = lambda: None
        self.delete_error: Exception | None = None
        self.creating = threading.Event()

    def create(self, anchor: Anchor, cancel: CancelToken) -> Claim:
        with self.lock:
            name = f"piship-{len(self.created):012x}"
            self.created.append(name)
        self.creating.set()
        self._wait(self.create_gate, cancel)
        self.in_flight()
        if self.create_error is not None:
            raise self.create_error
        return Claim(name, f"pool-{name}", anchor)

    def renew(self, claim: Claim, shutdown: int, cancel: CancelToken) -> None:
        with self.lock:
            self.renewed.append((claim.name, shutdown))
        self._wait(self.renew_gate, cancel)
        if claim.name in self.gone:
            raise ClaimGone("the SandboxClaim no longer exists")

    def check(self, claim: Claim, cancel: CancelToken) -> None:
        with self.lock:
            self.checked.append(claim.name)
        self.checking.set()
        self._wait(self.check_gate, cancel)
        self.in_flight()
        if self.check_error is not None:
            raise self.check_error
        if claim.name in self.gone:
            raise ClaimGone("the SandboxClaim no longer exists")

    def delete(self, claim: Claim) -> None:
        with self.lock:
            self.deleted.append(claim.name)
        if self.delete_error is not None:
            raise self.delete_error

    def renewals_of(self, name: str) -> list[int]:
        with self.lock:
            return [shutdown for claim, shutdown in self.renewed if claim == name]

    def wait_for_a_renewal(self) -> None:
        """Until a renewal started (it may be held at ``renew_gate``)."""
        while not self.renewed:
            threading.Event().wait(0.005)

    @staticmethod
    def _wait(gate: threading.Event | None, cancel: CancelToken) -> None:
        if gate is None:
            return
        woken = threading.Event()
        forget = cancel.on_cancel(woken.set)
        while not gate.is_set() and not woken.is_set():
            woken.wait(0.005)
        forget()
        if not gate.is_set():
            raise CommandCancelled()


def piship_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("piship-")]


@contextlib.contextmanager
def managers_on(cluster: FakeCluster, clocks: Clocks) -> Iterator[MakeManager]:
    """``make(lifetime=, keepalive_every=, existence_window=0.0, prepare=False)``: managers
    on ``cluster`` and ``clocks``, all disposed at the end, with no library thread left."""
    managers: list[ClaimManager] = []

    def make(
        *,
        lifetime: float,
        keepalive_every: float,
        existence_window: float = 0.0,
        prepare: bool = False,
    ) -> ClaimManager:
        manager = ClaimManager(
            cluster,
            clocks.clock(lifetime),
            keepalive_every=keepalive_every,
            existence_window=existence_window,
        )
        managers.append(manager)
        if prepare:
            manager.prepare()
        return manager

    try:
        yield make
    finally:
        for manager in managers:
            manager.dispose()
    assert piship_threads() == []
