"""Shared pieces of the reliability suite: secrets, error checks, thread and fd counts."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs

from piship_remote.model.errors import CommandCancelled, CommandTimeout, PiShipError
from piship_remote.testing import THREAD_PREFIX

API_KEY = "reliability-api-key-SENTINEL-0101"
BEARER = "reliability-bearer-SENTINEL-0102"
ENVD_TOKEN = "envd-token-1"  # the E2B double's envd access token
HOST_SECRETS = {
    "ACME_API_TOKEN": "sk-live-never-in-remote-backends",
    "AWS_SECRET_ACCESS_KEY": "aws-never-in-remote-backends",
    "GITHUB_TOKEN": "ghp_never_in_remote_backends_0000000000",
}
HOST_ENV = {"LANG": "C.UTF-8", "DOCS_MODE": "demo", **HOST_SECRETS}
ALL_SECRETS = (API_KEY, BEARER, ENVD_TOKEN, *HOST_SECRETS.values())


def policy(network: str) -> dict[str, Any]:
    """A required policy whose allow list also names a credential (which must be dropped)."""
    return {
        "required": True,
        "network": {"mode": network},
        "environment": {"allow": ["LANG", "DOCS_MODE", "ACME_API_TOKEN"]},
    }


# Text that only an unwrapped library exception would put in a message.
RAW_ERROR_MARKS = (
    "Traceback",
    "HTTPConnectionPool",
    "Max retries",
    "urllib3",
    "requests.exceptions",
    "object at 0x",
    "JSONDecodeError",
    "KeyError",
    "Errno",
)
TYPED_ERRORS = (PiShipError, CommandTimeout, CommandCancelled)


def check_error(error: BaseException, secrets: Iterable[str] = ALL_SECRETS) -> None:
    """``error`` is typed, has a clear one-line message, and carries no secret anywhere."""
    assert isinstance(error, TYPED_ERRORS), f"untyped error {type(error).__name__}: {error!r}"
    text = str(error)
    if isinstance(error, PiShipError):
        assert error.code, "a PiShipError without a code"
        assert text.strip(), "an empty message"
        assert len(text) <= 1200, f"an overlong message ({len(text)} chars)"
    assert "\n" not in text, f"a multi-line message: {text!r}"
    for mark in RAW_ERROR_MARKS:
        assert mark not in text, f"raw library text {mark!r} in {text!r}"
    if isinstance(error, PiShipError) and "unknown" in text:
        assert not error.retryable, f"an unknown outcome marked retryable: {text!r}"
    shown = [text, repr(error), getattr(error, "user_action", None) or ""]
    shown += [str(linked) for linked in _visible_chain(error)]
    for secret in secrets:
        for part in shown:
            assert secret not in part, f"secret {secret[:6]}… in {part!r}"


def _visible_chain(error: BaseException) -> list[BaseException]:
    """The exceptions a printed traceback would show besides ``error`` itself."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and len(chain) < 20:
        linked = current.__cause__
        if linked is None and not current.__suppress_context__:
            linked = current.__context__
        if linked is not None:
            chain.append(linked)
        current = linked
    return chain


@attrs.frozen
class Outcome:
    """What one call did: its value or its exception, and how long it took."""

    value: Any
    error: Exception | None
    seconds: float


def attempt(action: Callable[[], Any]) -> Outcome:
    """Run ``action``, keeping its exception instead of raising it."""
    start = time.monotonic()
    try:
        value = action()
    except Exception as e:
        return Outcome(None, e, time.monotonic() - start)
    return Outcome(value, None, time.monotonic() - start)


def library_threads() -> set[threading.Thread]:
    """Live threads the library started (``piship-…``, not the doubles' ``piship-double-…``)."""
    return {
        t
        for t in threading.enumerate()
        if t.name.startswith("piship-") and not t.name.startswith(THREAD_PREFIX)
    }


def settled(check: Callable[[], bool], timeout: float = 3.0, interval: float = 0.01) -> bool:
    """Poll ``check`` until it holds or ``timeout`` passes (for state that has no event)."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def open_fds() -> int:
    """How many file descriptors this process has open."""
    return len(os.listdir("/proc/self/fd"))


def rss_bytes() -> int:
    """This process's resident set size."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


class SecretLogCheck(logging.Handler):
    """Checks each ``piship_remote`` record for secrets as it is emitted, keeping none."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__(logging.DEBUG)
        self._secrets = tuple(secrets)
        self.records = 0
        self.leaked: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records += 1
        text = record.getMessage()
        self.leaked += [f"{s[:8]}… in {text[:80]!r}" for s in self._secrets if s in text]


@contextmanager
def checked_logs(secrets: Iterable[str] = ALL_SECRETS) -> Iterator[SecretLogCheck]:
    """Every ``piship_remote`` record at DEBUG goes to a :class:`SecretLogCheck` only.

    Records do not propagate meanwhile, so a long run does not pile them up in
    pytest's log capture (which would also count as memory growth).
    """
    logger = logging.getLogger("piship_remote")
    check = SecretLogCheck(secrets)
    level, propagate = logger.level, logger.propagate
    logger.addHandler(check)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield check
    finally:
        logger.removeHandler(check)
        logger.setLevel(level)
        logger.propagate = propagate
