"""Interop suite: the official E2B SDK against our doubles, our client against an independent envd.

Everything here needs the test-only extra ``interop`` (``e2b`` and what it pulls in:
``connectrpc``, ``protobuf-py``, ``pyqwest``); without it every module is skipped.
All traffic stays on loopback.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

INTEROP_MARKER = "interop: interop tests against the official E2B SDK or an independent envd peer"
LOOPBACK = "127.0.0.1,localhost,::1"
THREAD_GRACE = 2.0


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", INTEROP_MARKER)


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy for loopback and no ambient E2B settings: every request stays local."""
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(name, LOOPBACK)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    for name in ("E2B_API_KEY", "E2B_API_URL", "E2B_SANDBOX_URL", "E2B_DOMAIN", "E2B_DEBUG"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def no_peer_threads_left() -> Iterator[None]:
    """Every ``piship-peer-…`` thread a test started is gone once its fixtures closed."""
    yield
    deadline = time.monotonic() + THREAD_GRACE
    while (left := _peer_threads()) and time.monotonic() < deadline:
        left[0].join(max(0.0, deadline - time.monotonic()))
    assert not _peer_threads(), f"threads left running: {[t.name for t in _peer_threads()]}"


def _peer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("piship-peer-")]
