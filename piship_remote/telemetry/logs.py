"""The ``piship_remote`` logger's events, their arguments through the redaction.

INFO says what a person wants to know (a sandbox created or deleted, a claim replaced,
a renewal refused, a command whose outcome is unknown, a variable the policy dropped);
DEBUG the wire steps (``piship_remote`` in ``transport/client.py``). The package's
``NullHandler`` keeps every line off stderr until the application configures logging.
"""

from __future__ import annotations

import logging

from piship_remote.model.redact import Redactor, redaction

__all__ = ["LOGGER", "info", "log_environment_warnings"]

LOGGER = "piship_remote"


def info(message: str, *args: object, redactor: Redactor | None = None) -> None:
    """Log ``message % args`` at INFO, each text argument redacted first."""
    log = logging.getLogger(LOGGER)
    if not log.isEnabledFor(logging.INFO):
        return
    clean = redaction(redactor)
    log.info(message, *(clean(arg) if isinstance(arg, str) else arg for arg in args), stacklevel=2)


def log_environment_warnings(warnings: tuple[str, ...]) -> None:
    """Each environment warning as a WARNING (names only, never values)."""
    log = logging.getLogger(LOGGER)
    for warning in warnings:
        log.warning("environment: %s", warning, stacklevel=2)
