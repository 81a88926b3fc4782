"""``piship-remote sweep``: list and delete the sandboxes and claims this library created.

Only what carries this library's mark is listed (E2B metadata ``created-by: piship``,
the claim label ``agents.x-k8s.io/created-by: piship``), and only what is older than
``--older-than`` and carries every ``--label`` (a pool's ``labels``) is deleted::

    piship-remote sweep --backend e2b --older-than 2h --dry-run
    piship-remote sweep --backend kubernetes --label run=nightly-42
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from contextlib import ExitStack

from piship_remote.backends._owned import OwnedSandbox, has_labels
from piship_remote.backends.base import Reattachable
from piship_remote.cli._setup import backend_for
from piship_remote.model.errors import ConfigInvalid

__all__ = ["duration", "label", "sweep"]

_DURATION = re.compile(r"(?P<amount>[0-9]+(?:\.[0-9]+)?)(?P<unit>[smhd]?)\Z")
_UNIT_SECONDS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def duration(text: str) -> float:
    """``30m``, ``2h``, ``1d``, ``90s`` or plain seconds, as seconds."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"not a duration (like 30m, 2h, 1d): {text!r}")
    return float(match["amount"]) * _UNIT_SECONDS[match["unit"]]


def label(text: str) -> tuple[str, str]:
    """``k=v`` as ``(k, v)``."""
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"not a label (like run=nightly): {text!r}")
    return key, value


def sweep(args: argparse.Namespace) -> int:
    """Delete (or with ``--dry-run`` only list) this library's sandboxes older than asked
    that carry every label asked for."""
    with ExitStack() as stack:
        backend = backend_for(args, stack)
        if not isinstance(backend, Reattachable):
            raise ConfigInvalid(f"the {backend.id} backend cannot be swept")
        now = time.time()
        wanted = dict(args.label or ())
        due = [
            owned
            for owned in backend.list_owned()
            if owned.age(now) >= args.older_than and has_labels(owned, wanted)
        ]
        if not args.dry_run:
            for owned in due:
                backend.delete_owned(owned.id)
        close = getattr(backend, "close", None)
        if callable(close):
            close()
    _report(due, now, args)
    return 0


def _report(due: list[OwnedSandbox], now: float, args: argparse.Namespace) -> None:
    if args.json:
        listed = [{**owned.to_dict(), "ageSeconds": round(owned.age(now))} for owned in due]
        print(json.dumps({"dryRun": bool(args.dry_run), "sandboxes": listed}))
        return
    verb = "would delete" if args.dry_run else "deleted"
    for owned in due:
        print(f"{verb} {owned.id} ({owned.backend}, {_age(owned.age(now))} old)")
    if not due:
        print("nothing to sweep", file=sys.stderr)


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"
