"""The sub-commands ``run``, ``doctor``, ``serve`` and ``demo``."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

from piship_remote.activation import Sandbox, activate_sandbox
from piship_remote.cli._files import copy, describe_transfer
from piship_remote.cli._setup import backend_for, policy_for
from piship_remote.errors import CONFIG_INVALID, PiShipError
from piship_remote.report import describe_containment
from piship_remote.transfer import TransferSummary

__all__ = ["EXIT_UNAVAILABLE", "cp", "demo", "doctor", "exit_status", "run", "serve"]

EXIT_UNAVAILABLE = 3
EXIT_OUT_OF_RANGE = 1
DEMO_SECRET_NAME = "PISHIP_DEMO_API_TOKEN"
DEMO_SECRET = "sk-demo-host-secret-that-must-stay-home"


def run(args: argparse.Namespace) -> int:
    """Activate a sandbox, run the command with live output, exit with its status."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise PiShipError(
            CONFIG_INVALID,
            "run needs a command after --",
            user_action="Example: piship-remote run -- echo hello",
        )
    with ExitStack() as stack:
        sandbox = stack.enter_context(_activated(args, stack))
        if args.sync:
            _report_transfer("pushed", sandbox.push())
        result = sandbox.run(_shell_line(command), timeout=args.timeout, echo=True)
        if args.sync:
            _report_transfer("pulled", sandbox.pull())
        if args.keep:
            print(f"kept sandbox {sandbox.detach()} (use it with --attach)", file=sys.stderr)
        return exit_status(result.exit_code)


def cp(args: argparse.Namespace) -> int:
    """Copy files between this host and the sandbox ``--attach`` names."""
    if not args.attach:
        raise PiShipError(
            CONFIG_INVALID,
            "cp needs a sandbox to copy to or from",
            user_action="keep one with 'piship-remote run --keep -- true', then"
            " 'piship-remote cp --attach ID LOCAL :REMOTE'",
        )
    with ExitStack() as stack:
        sandbox = stack.enter_context(_activated(args, stack))
        summary = copy(sandbox.files, args)
        _report_transfer("copied", summary)
        sandbox.detach()
    return 0


def _report_transfer(verb: str, summary: TransferSummary | None) -> None:
    if summary is not None:
        for line in describe_transfer(verb, summary):
            print(line, file=sys.stderr)


def exit_status(remote: int) -> int:
    """The remote exit code as a process status: one outside 0-255 never reads as success."""
    if 0 <= remote <= 255:
        return remote
    print(
        f"piship-remote: the remote exit code {remote} does not fit an exit status;"
        f" exiting {EXIT_OUT_OF_RANGE}",
        file=sys.stderr,
    )
    return EXIT_OUT_OF_RANGE


def doctor(args: argparse.Namespace) -> int:
    """Print the containment report; with ``--json`` always exactly one JSON object."""
    try:
        with ExitStack() as stack:
            sandbox = stack.enter_context(_activated(args, stack))
            report = sandbox.report
    except PiShipError as e:
        if not args.json:
            raise
        print(json.dumps({"error": e.to_dict()}, indent=2))
        return EXIT_UNAVAILABLE
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(describe_containment(report))
    return 0


def serve(args: argparse.Namespace) -> int:
    """Serve the embedded local service in the foreground until Ctrl-C or SIGTERM."""
    from piship_remote import local

    limits = {
        name: getattr(args, name)
        for name in ("max_processes", "max_memory_mib", "max_disk_mib", "max_lifetime")
        if getattr(args, name) is not None
    }
    local.serve(host=args.host, port=args.port, api_key=args.api_key, **limits)
    return 0


def demo(args: argparse.Namespace) -> int:
    """Show containment on the embedded local service: variables, secrets, network, streaming."""
    from piship_remote.local import LocalE2bService

    with LocalE2bService() as service, _listener() as port:
        _say(f"Started the embedded sandbox service at {service.url}")
        policy = {
            "required": True,
            "network": {"mode": "deny"},
            "environment": {"allow": ["LANG", "DOCS_MODE", DEMO_SECRET_NAME]},
        }
        env = {"LANG": "C.UTF-8", "DOCS_MODE": "demo", DEMO_SECRET_NAME: DEMO_SECRET}
        with activate_sandbox(
            policy, backend=service.backend(), workspace=os.getcwd(), env=env
        ) as sandbox:
            _say("\nContainment: " + describe_containment(sandbox.report))
            for title, command in _demo_commands(port):
                _say(f"\n$ {command}    # {title}")
                result = sandbox.run(command, echo=True, timeout=30)
                _say(f"[exit {result.exit_code}]")
        _say("\nThe sandbox was deleted. Done.")
    return 0


def _demo_commands(port: int) -> list[tuple[str, str]]:
    return [
        ("where am I?", 'echo "user=$(id -un 2>/dev/null || id -u) cwd=$PWD"; uname -sm'),
        ("only approved variables arrive", "env | sort"),
        (
            "a host secret stays home",
            f'echo "{DEMO_SECRET_NAME}=${{{DEMO_SECRET_NAME}:-<not set>}}"',
        ),
        (
            "the network is denied (a listener on this host's loopback)",
            f"(exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null"
            " && echo reachable || echo 'blocked: no route out'",
        ),
        ("output streams live", "for i in 1 2 3; do echo tick $i; sleep 0.2; done"),
    ]


@contextmanager
def _activated(args: argparse.Namespace, stack: ExitStack) -> Iterator[Sandbox]:
    backend = backend_for(args, stack)
    policy = policy_for(args)
    with activate_sandbox(
        policy,
        backend=backend,
        workspace=args.workspace,
        attach=getattr(args, "attach", None),
    ) as sandbox:
        yield sandbox


def _shell_line(command: Sequence[str]) -> str:
    """One argument is a shell line as given; several are quoted word by word."""
    return command[0] if len(command) == 1 else shlex.join(command)


def _say(text: str) -> None:
    print(text, flush=True)


@contextmanager
def _listener() -> Iterator[int]:
    """A TCP listener on this host's loopback, for the demo's network-denial check."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield server.getsockname()[1]
