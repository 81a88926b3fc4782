"""``piship-remote sweep``: list and delete the sandboxes and claims this library created.

Only what carries this library's mark is listed (E2B metadata ``created-by: piship``,
the claim label ``agents.x-k8s.io/created-by: piship``), and only what is older than
``--older-than`` and carries every ``--label`` (a pool's ``labels``) is deleted::

    piship-remote sweep --backend e2b --older-than 2h --dry-run
    piship-remote sweep --backend kubernetes --label run=nightly-42   # no --router/--pool needed

Each line names the sandbox, its backend, its age and its labels. The local backend's
sandboxes end with the process that made them; ``--backend local`` lists and removes
what a process killed outright (SIGKILL, a lost machine) left of theirs on this host.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from contextlib import ExitStack

from piship_remote.backends._owned import OwnedSandbox, has_labels, user_labels
from piship_remote.backends.base import Reattachable
from piship_remote.cli._setup import backend_for, kubernetes_backend
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
    now = time.time()
    due = _sweep_local(args, now) if args.backend == "local" else _sweep_service(args, now)
    _report(due, now, args)
    return 0


def _sweep_service(args: argparse.Namespace, now: float) -> list[OwnedSandbox]:
    """What a service (E2B, a cluster) holds of this library's, listed and deleted there."""
    with ExitStack() as stack:
        if args.backend == "kubernetes":
            backend: object = kubernetes_backend(args, listing=True)
        else:
            backend = backend_for(args, stack)
        if not isinstance(backend, Reattachable):
            raise ConfigInvalid(f"the {args.backend} backend cannot be swept")
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
    return due


def _sweep_local(args: argparse.Namespace, now: float) -> list[OwnedSandbox]:
    """The local backend's sandboxes live in the process that made them and end with it;
    a process killed outright leaves its service directory (their files, their disks):
    one row each, named after that directory, removed unless ``--dry-run``. They carry
    no labels."""
    from piship_remote.local.service import remove_service_directory, stale_services

    if args.label:
        return []  # the local service keeps labels in its process only
    left = [s for s in stale_services() if now - s.created >= args.older_than]
    if not args.dry_run:
        for service in left:
            remove_service_directory(service.directory)
    return [OwnedSandbox(os.path.basename(s.directory), s.created, "local") for s in left]


def _report(due: list[OwnedSandbox], now: float, args: argparse.Namespace) -> None:
    if args.json:
        listed = [
            {**owned.to_dict(), "ageSeconds": round(owned.age(now)), "labels": user_labels(owned)}
            for owned in due
        ]
        print(json.dumps({"dryRun": bool(args.dry_run), "sandboxes": listed}))
        return
    verb = "would delete" if args.dry_run else "deleted"
    for owned in due:
        labels = "".join(f", {key}={value}" for key, value in sorted(user_labels(owned).items()))
        print(f"{verb} {owned.id} ({owned.backend}, {_age(owned.age(now))} old{labels})")
    if not due:
        print("nothing to sweep", file=sys.stderr)


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"
