"""The embedded local E2B service for the interop tests, or a skip where it cannot run here."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from piship_remote.local import LocalE2bService


@contextlib.contextmanager
def local_e2b_service(**options: object) -> Iterator[LocalE2bService]:
    """A running :class:`LocalE2bService` made with ``options``; the test is skipped where
    the service (or its module) is not there."""
    local = pytest.importorskip(
        "piship_remote.local", reason="piship_remote.local (the embedded service) is not there"
    )
    problem = local.LocalE2bService.check()
    if problem is not None:
        pytest.skip(f"LocalE2bService cannot run here: {problem}")
    with local.LocalE2bService(**options) as service:
        yield service
