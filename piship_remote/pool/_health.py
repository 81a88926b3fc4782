"""The service's health, checked once for a pool and again after any failure.

    health = HealthOnce(backend)
    activate = functools.partial(activate_sandbox, policy, backend=health.backend, ...)
    sandbox = health.watch(activate)     # a failure makes the next create check again

A single activation checks the service's health before it creates anything
(``activate_sandbox``'s fixed order). A pool creates many sandboxes on one service,
so it asks once: creates that come while a check is in flight wait for its answer, a
passing answer serves every create after it, and any failure (a failed check, a
failed create or activation, a sandbox that broke under a task) forgets it, so the
next create asks again. A failed check is never kept: it stops the create that asked
(and those that waited for it), as before every single activation.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from piship_remote.backends.base import Availability, Backend, Instance
from piship_remote.model.policy import SandboxProfile
from piship_remote.model.report import Capabilities

__all__ = ["HealthOnce"]

_T = TypeVar("_T")


class _Check:
    """One health check in flight, and its answer (``None`` when it raised)."""

    def __init__(self, failures: int) -> None:
        self.failures = failures  # the failure count when it began
        self.answer: Availability | None = None
        self.done = threading.Event()


class HealthOnce:
    """The pool's memory of a passing health check; thread-safe.

    :attr:`backend` is the backend the pool activates with: ``available()`` asks the
    real one only when no passing answer is kept.
    """

    def __init__(self, backend: Backend) -> None:
        self._check = backend.available
        self._lock = threading.Lock()
        self._passed: Availability | None = None
        self._flight: _Check | None = None
        self._failures = 0  # a check that began before a failure is not kept
        self.backend: Backend = _CheckedOnce(backend, self)

    def available(self) -> Availability:
        """The kept passing answer, the one in flight, or a fresh check."""
        with self._lock:
            if self._passed is not None:
                return self._passed
            flight = self._flight
            leading = flight is None
            if flight is None:
                flight = self._flight = _Check(self._failures)
        if leading:
            return self._lead(flight)
        flight.done.wait()
        if flight.answer is not None:
            return flight.answer
        return self._check()  # the check in flight raised: ask on our own

    def _lead(self, flight: _Check) -> Availability:
        try:
            answer = self._check()
            flight.answer = answer
        finally:
            with self._lock:
                self._flight = None
                answer_ok = flight.answer is not None and flight.answer.available
                if answer_ok and flight.failures == self._failures:
                    self._passed = flight.answer
            flight.done.set()
        return answer

    def forget(self) -> None:
        """A failure: the next create checks the service's health again."""
        with self._lock:
            self._passed = None
            self._failures += 1

    def watch(self, activate: Callable[[], _T]) -> _T:
        """``activate()``; when it fails, the next create checks the health again."""
        try:
            return activate()
        except BaseException:
            self.forget()
            raise


class _CheckedOnce:
    """``backend`` with its ``available()`` answered by the pool's :class:`HealthOnce`."""

    def __init__(self, backend: Backend, health: HealthOnce) -> None:
        self._backend = backend
        self._health = health
        self.id = backend.id
        self.provider = backend.provider
        self.redactor = backend.redactor

    def available(self) -> Availability:
        return self._health.available()

    def capabilities(self) -> Capabilities:
        return self._backend.capabilities()

    def prepare(self, profile: SandboxProfile) -> Instance:
        return self._backend.prepare(profile)
