"""Kept sandboxes: ``create``, ``kill``, and what ``run``/``cp`` leave alive.

A sandbox the user named with ``--attach`` (or asked to keep with ``--keep``, or
made with ``create``) outlives the command, whatever ends it: a failed copy, a
timeout, Ctrl-C. Only ``kill`` deletes it (or its lease running out)::

    ID=$(piship-remote create --lease 2h)
    piship-remote cp --attach "$ID" data.csv :data.csv
    piship-remote run --attach "$ID" -- wc -l data.csv
    piship-remote kill "$ID"
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from types import FrameType

from piship_remote.backends.base import Reattachable
from piship_remote.cli._setup import backend_for, lease_seconds, policy_for
from piship_remote.model.errors import ConfigInvalid, PiShipError
from piship_remote.sandbox.activation import activate_sandbox
from piship_remote.sandbox.sandbox import Sandbox

__all__ = ["ENDING_SIGNALS", "activated", "create", "describe_lease", "keeps", "kill"]

ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
# An attached sandbox about to end still gets this long (seconds) after the command.
_MIN_LEASE_LEFT = 60.0


def keeps(args: argparse.Namespace) -> bool:
    """Whether this command leaves its sandbox alive: ``--keep``, ``--attach``, ``create``."""
    return bool(getattr(args, "keep", False) or getattr(args, "attach", None))


@contextmanager
def activated(args: argparse.Namespace, stack: ExitStack) -> Iterator[Sandbox]:
    """The sandbox the command works in; deleted at the end unless it is kept.

    A kept one is let go of (detached) on every way out, an exception or Ctrl-C
    included, and a line on stderr says how long it lives and how to end it.
    """
    if keeps(args):
        _refuse_local(args)
        args = _with_lease_left(args)
    backend = backend_for(args, stack)
    sandbox = activate_sandbox(
        policy_for(args),
        backend=backend,
        workspace=args.workspace,
        attach=getattr(args, "attach", None),
    )
    if not keeps(args):
        with sandbox:
            yield sandbox
        return
    with _ending_signals_interrupt() as received:
        try:
            yield sandbox
        finally:
            _let_go(sandbox, lease_seconds(args))
            if received:
                raise SystemExit(128 + received[0])


@contextmanager
def _ending_signals_interrupt() -> Iterator[list[int]]:
    """SIGTERM and SIGHUP stop the command as Ctrl-C does (the remote command is killed),
    so a kept sandbox is let go of instead of deleted; the signals received are listed.

    Where Ctrl-C cannot be raised (not the main thread, SIGINT ignored) they keep
    their handlers, which delete the sandbox.
    """
    received: list[int] = []
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield received
        return

    def interrupt(number: int, _frame: FrameType | None) -> None:
        received.append(number)
        signal.raise_signal(signal.SIGINT)

    previous = {number: signal.signal(number, interrupt) for number in ENDING_SIGNALS}
    try:
        yield received
    finally:
        for number, handler in previous.items():
            if handler is not None:
                signal.signal(number, handler)


def _with_lease_left(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with ``--lease`` set, for ``--attach ID`` without one, to what the sandbox
    has left of its lease (at least a minute), so attaching neither shortens nor resets it.

    Unchanged when ``--lease`` was given, or when the service does not list the sandbox
    with an end (then the kept default applies).
    """
    attach: str | None = getattr(args, "attach", None)
    if attach is None or getattr(args, "lease", None) is not None:
        return args
    left = _lease_left(args, attach)
    if left is None:
        return args
    return argparse.Namespace(**{**vars(args), "lease": max(_MIN_LEASE_LEFT, left)})


def _lease_left(args: argparse.Namespace, sandbox_id: str) -> float | None:
    with ExitStack() as stack:
        backend = backend_for(args, stack)
        try:
            if not isinstance(backend, Reattachable):
                return None
            owned = [o for o in backend.list_owned() if o.id == sandbox_id]
        except PiShipError:
            return None  # the attach itself reports what is wrong
        finally:
            close = getattr(backend, "close", None)
            if callable(close):
                close()
    if len(owned) != 1 or owned[0].expires is None:
        return None
    return owned[0].expires - time.time()


def _refuse_local(args: argparse.Namespace) -> None:
    if args.backend == "local":
        raise ConfigInvalid(
            "the local backend's sandboxes end with this command, so none can be kept",
            user_action="Start 'piship-remote serve' in another shell and use the e2b"
            " backend with the endpoint it prints",
        )


def _let_go(sandbox: Sandbox, lease: float) -> None:
    try:
        sandbox_id = sandbox.detach()
    except PiShipError as e:
        print(f"piship-remote: the sandbox could not be kept: {e.message}", file=sys.stderr)
        return
    print(describe_lease(sandbox_id, lease), file=sys.stderr)


def describe_lease(sandbox_id: str, lease: float, now: float | None = None) -> str:
    """The stderr line of a kept sandbox: its id, how long it lives, how to extend or end it."""
    ends = time.strftime("%H:%M UTC", time.gmtime((now or time.time()) + lease))
    return (
        f"kept sandbox {sandbox_id} for {_duration(lease)} (until {ends}); renew it with"
        f" 'piship-remote run --attach {sandbox_id} --lease DURATION -- true',"
        f" delete it with 'piship-remote kill {sandbox_id}'"
    )


def create(args: argparse.Namespace) -> int:
    """Make a kept sandbox; its id alone on stdout (``ID=$(piship-remote create)``)."""
    args.keep = True
    with ExitStack() as stack, activated(args, stack) as sandbox:
        sandbox_id = sandbox.id
    print(sandbox_id, flush=True)
    return 0


def kill(args: argparse.Namespace) -> int:
    """Delete the kept sandbox ``args.sandbox_id`` (an error if there is none by that id)."""
    _refuse_local(args)
    with ExitStack() as stack:
        backend = backend_for(args, stack)
        if not isinstance(backend, Reattachable):
            raise ConfigInvalid(f"the {backend.id} backend keeps no sandboxes")
        backend.attach(args.sandbox_id).dispose()
        close = getattr(backend, "close", None)
        if callable(close):
            close()
    print(f"deleted sandbox {args.sandbox_id}", file=sys.stderr)
    return 0


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    if seconds >= 60:
        return f"{seconds / 60:.0f}m"
    return f"{seconds:g}s"
