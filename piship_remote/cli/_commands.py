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
from typing import Any

from piship_remote.cli._files import copy, describe_transfer
from piship_remote.cli._kept import activated
from piship_remote.cli._preflight import ChecksFailed, kubernetes_checks
from piship_remote.cli._streams import command_input
from piship_remote.cli._terminal import run_on_terminal, terminal_input
from piship_remote.model.errors import (
    CONFIG_INVALID,
    CONFIG_UNAVAILABLE,
    CREDENTIAL_DENIED,
    CREDENTIAL_REQUIRED,
    FILE_NOT_FOUND,
    FILE_WRITE_FAILED,
    NETWORK_DENIED,
    ConfigInvalid,
    PiShipError,
)
from piship_remote.model.report import describe_containment
from piship_remote.model.transfer import TransferSummary
from piship_remote.sandbox._activation_steps import unenforceable_message
from piship_remote.sandbox.activation import activate_sandbox
from piship_remote.sandbox.sandbox import Sandbox

__all__ = [
    "CONFIG_CODES",
    "EXIT_CONFIG",
    "EXIT_UNAVAILABLE",
    "cp",
    "demo",
    "doctor",
    "error_status",
    "exit_status",
    "render_error",
    "run",
    "serve",
]

EXIT_CONFIG = 2
EXIT_UNAVAILABLE = 3
# activate_sandbox's fixed opening for a required sandbox it could not have, and its meaning.
UNENFORCEABLE = unenforceable_message("")
UNENFORCEABLE_MEANING = (
    "Meaning: the policy requires a sandbox and none could be had, so nothing ran"
    " (nothing ever runs on this host instead)"
)
# Something to fix on the user's side: a setting, a credential, a path that is not there or
# cannot be written.
CONFIG_CODES = frozenset(
    {
        CONFIG_INVALID,
        CONFIG_UNAVAILABLE,
        CREDENTIAL_REQUIRED,
        CREDENTIAL_DENIED,
        NETWORK_DENIED,
        FILE_NOT_FOUND,
        FILE_WRITE_FAILED,
    }
)
EXIT_OUT_OF_RANGE = 1
DEMO_SECRET_NAME = "PISHIP_DEMO_API_TOKEN"
DEMO_SECRET = "sk-demo-host-secret-that-must-stay-home"


def run(args: argparse.Namespace) -> int:
    """Activate a sandbox, run the command with live output, exit with its status."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigInvalid(
            "run needs a command after --",
            user_action="Example: piship-remote run -- echo hello",
        )
    terminal = terminal_input() if args.tty else None
    if args.tty and terminal is None:
        print(
            "piship-remote: stdin is not a terminal, so the command runs without one",
            file=sys.stderr,
        )
    stdin = None if terminal is not None else command_input(args)
    with ExitStack() as stack:
        sandbox = stack.enter_context(activated(args, stack))
        if not args.sync and not args.attach and _has_files(args.workspace):
            print(
                "piship-remote: the sandbox starts without this folder's files;"
                " --sync sends them (and brings the changes back)",
                file=sys.stderr,
            )
        if args.sync:
            _report_transfer("pushed", sandbox.push(), verbose=args.verbose)
        line = _shell_line(command)
        if terminal is not None:
            code = run_on_terminal(sandbox, line, terminal, args.timeout)
        else:
            code = sandbox.run(line, timeout=args.timeout, echo=True, stdin=stdin).exit_code
        status = exit_status(code)
        if args.sync:
            return _pull_after(sandbox, status, verbose=args.verbose)
        return status


def _pull_after(sandbox: Sandbox, status: int, *, verbose: bool) -> int:
    """Pull what the command changed; a failure is told beside the command's status."""
    try:
        _report_transfer("pulled", sandbox.pull(), verbose=verbose)
    except PiShipError as e:
        print(render_error(e), file=sys.stderr)
        print(
            f"piship-remote: the command exited with status {status}, but bringing its"
            " changes back failed (above)",
            file=sys.stderr,
        )
        return status or error_status(e)
    return status


def cp(args: argparse.Namespace) -> int:
    """Copy files between this host and the sandbox ``--attach`` names (which stays)."""
    if not args.attach:
        raise ConfigInvalid(
            "cp needs a sandbox to copy to or from",
            user_action="make one with 'ID=$(piship-remote create)', then"
            " 'piship-remote cp --attach $ID LOCAL :REMOTE'",
        )
    with ExitStack() as stack:
        sandbox = stack.enter_context(activated(args, stack))
        summary = copy(sandbox.files, args)
        _report_transfer("copied", summary)
    return 0


def _report_transfer(verb: str, summary: TransferSummary | None, *, verbose: bool = False) -> None:
    if summary is not None:
        for line in describe_transfer(verb, summary, verbose=verbose):
            print(line, file=sys.stderr)


def error_status(error: PiShipError) -> int:
    """The exit status for ``error``: 2 for a configuration error (a refused key
    included, whatever code activation gave it), else 3."""
    return EXIT_CONFIG if (error.cause_code or error.code) in CONFIG_CODES else EXIT_UNAVAILABLE


def render_error(error: PiShipError) -> str:
    """``error`` for stderr: under the code of what to fix (a refused key's
    ``CREDENTIAL_DENIED``, not activation's ``SANDBOX_UNAVAILABLE``), and, after
    activation's fixed wording, what it means in plain words."""
    rendered = error.render()
    if error.cause_code is not None and rendered.startswith(f"{error.code}: "):
        rendered = f"{error.cause_code}: {rendered[len(error.code) + 2 :]}"
    if error.message.startswith(UNENFORCEABLE):
        rendered += f"\n{UNENFORCEABLE_MEANING}"
    return rendered


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
    """Print the containment report; with ``--json`` always exactly one JSON object.

    On Kubernetes the credentials' checks come first (on stderr, or under ``checks``),
    and a failed one ends the command before any claim is created.
    """
    checks: list[dict[str, Any]] | None = None
    try:
        if args.backend == "kubernetes":
            checks = kubernetes_checks(args, quiet=args.json)
        with ExitStack() as stack:
            sandbox = stack.enter_context(activated(args, stack))
            report = sandbox.report
    except PiShipError as e:
        if not args.json:
            raise
        found = {"checks": e.checks} if isinstance(e, ChecksFailed) else {}
        print(json.dumps({"error": e.to_dict(), **found}, indent=2))
        return EXIT_UNAVAILABLE
    if args.json:
        extra = {"checks": checks} if checks is not None else {}
        print(json.dumps({**report.to_dict(), **extra}, indent=2))
    else:
        print(describe_containment(report))
    return 0


def serve(args: argparse.Namespace) -> int:
    """Serve the embedded local service in the foreground until Ctrl-C or SIGTERM."""
    from piship_remote import local

    limits = {
        name: getattr(args, name)
        for name in (
            "max_processes",
            "max_memory_mib",
            "max_disk_mib",
            "max_cpus",
            "max_lifetime",
            "max_snapshot_disk_mib",
        )
        if getattr(args, name) is not None
    }
    templates = dict(args.template)
    local.serve(
        host=args.host,
        port=args.port,
        api_key=_serve_key(args),
        templates=templates,
        python_env=args.python_env,
        **limits,
    )
    return 0


def _serve_key(args: argparse.Namespace) -> str | None:
    """``--api-key``, else the ``--api-key-file``'s, else ``E2B_API_KEY``, else ``None`` (a
    new random key): the file and the variable keep the key out of ``ps``."""
    if args.api_key:
        return str(args.api_key)
    if args.api_key_file:
        try:
            with open(args.api_key_file, encoding="utf-8") as handle:
                key = handle.read().strip()
        except OSError as e:
            raise ConfigInvalid(
                f"cannot read the API key file {args.api_key_file}: {e.strerror}"
            ) from None
        if not key:
            raise ConfigInvalid(f"the API key file {args.api_key_file} is empty")
        return key
    return os.environ.get("E2B_API_KEY") or None


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


def _has_files(workspace: str) -> bool:
    """Whether the workspace holds at least one file (empty folders do not count)."""
    return any(files for _root, _dirs, files in os.walk(workspace))


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
