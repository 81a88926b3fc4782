"""The ``piship-remote`` command line: ``demo``, ``run``, ``cp``, ``doctor``, ``serve``, ``sweep``.

    piship-remote demo
    piship-remote run --backend local --sync -- make test
    piship-remote run --keep -- true          # prints the sandbox id
    piship-remote cp --attach ID data.csv :data/data.csv
    piship-remote doctor --backend kubernetes --network allow --json

``run -- CMD ARG...`` quotes each argument (``shlex.join``); a single argument is
a shell line as given (``run -- 'echo $HOME | wc -c'``).

Exit status: the command's own for ``run`` (1 when the remote code does not fit
0-255); 2 for a configuration error, 3 when no sandbox can be had, 124 when
``--timeout`` expired, 130 after Ctrl-C (the remote command is killed first).
SIGTERM and SIGHUP delete the sandbox first, then end the process (128+n).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from piship_remote import __version__, lifecycle
from piship_remote.cli import _commands, _sweep
from piship_remote.cli._commands import EXIT_UNAVAILABLE
from piship_remote.cli._parser import Parser, add_sandbox_options, port_number, positive_int
from piship_remote.errors import (
    CONFIG_INVALID,
    CONFIG_UNAVAILABLE,
    CREDENTIAL_REQUIRED,
    NETWORK_DENIED,
    CommandCancelled,
    CommandTimeout,
    PiShipError,
)

__all__ = ["EXIT_CONFIG", "EXIT_INTERRUPTED", "EXIT_TIMEOUT", "EXIT_UNAVAILABLE", "main"]

EXIT_CONFIG = 2
EXIT_TIMEOUT = 124
EXIT_INTERRUPTED = 130
CONFIG_CODES = frozenset({CONFIG_INVALID, CONFIG_UNAVAILABLE, CREDENTIAL_REQUIRED, NETWORK_DENIED})


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    lifecycle.cleanup_on_signals()
    if not hasattr(args, "handler"):
        parser.print_help()
        return EXIT_CONFIG
    try:
        return int(args.handler(args))
    except PiShipError as e:
        print(e.render(), file=sys.stderr)
        return EXIT_CONFIG if e.code in CONFIG_CODES else EXIT_UNAVAILABLE
    except (CommandCancelled, KeyboardInterrupt):
        print("interrupted: the remote command was killed", file=sys.stderr)
        return EXIT_INTERRUPTED
    except CommandTimeout as e:
        print(
            f"TIMEOUT: the command ran longer than {e.timeout:g} s and was killed", file=sys.stderr
        )
        return EXIT_TIMEOUT


def _parser() -> Parser:
    parser = Parser(
        prog="piship-remote",
        description="Run shell commands in remote sandboxes under a containment policy.",
    )
    parser.add_argument("--version", action="version", version=f"piship-remote {__version__}")

    demo = parser.command(
        "demo", help="try it out on the embedded local sandbox service (no account needed)"
    )
    demo.set_defaults(handler=_commands.demo)

    run = parser.command("run", help="run one command in a fresh sandbox")
    add_sandbox_options(run)
    run.add_argument(
        "--timeout", type=float, default=None, help="seconds before the command is killed"
    )
    run.add_argument(
        "--sync",
        action="store_true",
        help="push the workspace first, pull back what the command changed after",
    )
    run.add_argument(
        "--keep", action="store_true", help="keep the sandbox afterwards and print its id"
    )
    run.add_argument("--attach", metavar="ID", help="run in a sandbox kept earlier")
    run.add_argument("command", nargs="...", help="the command, after --")
    run.set_defaults(handler=_commands.run)

    cp = parser.command(
        "cp",
        help="copy files between this host and a kept sandbox (LOCAL :REMOTE or :REMOTE LOCAL)",
    )
    add_sandbox_options(cp)
    cp.add_argument("--attach", metavar="ID", help="the sandbox (kept with run --keep)")
    cp.add_argument("source", help="LOCAL, or :REMOTE")
    cp.add_argument("destination", help=":REMOTE, or LOCAL")
    cp.set_defaults(handler=_commands.cp)

    doctor = parser.command("doctor", help="activate a sandbox and print its containment report")
    add_sandbox_options(doctor)
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.set_defaults(handler=_commands.doctor)

    serve = parser.command("serve", help="serve the embedded local E2B-compatible service")
    serve.add_argument("--host", default="127.0.0.1", help="loopback address to listen on")
    serve.add_argument("--port", type=port_number, default=0, help="port (default: any free port)")
    serve.add_argument(
        "--api-key", default=None, help="the API key clients must send (default: a new random one)"
    )
    for option, what in (
        ("--max-processes", "processes per sandbox"),
        ("--max-memory-mib", "memory per sandbox, MiB"),
        ("--max-disk-mib", "disk (home, /tmp, /dev/shm) per sandbox, MiB"),
        ("--max-lifetime", "seconds a sandbox may live at most"),
    ):
        serve.add_argument(option, type=positive_int, default=None, help=what)
    serve.set_defaults(handler=_commands.serve)

    sweep = parser.command(
        "sweep", help="list and delete the sandboxes and claims piship created (and only those)"
    )
    add_sandbox_options(sweep)
    sweep.add_argument(
        "--older-than",
        type=_sweep.duration,
        default=0.0,
        metavar="DURATION",
        help="only those created longer ago than this (30m, 2h, 1d; default: all)",
    )
    sweep.add_argument("--dry-run", action="store_true", help="list them, delete nothing")
    sweep.add_argument("--json", action="store_true", help="print one JSON object")
    sweep.set_defaults(handler=_sweep.sweep)
    return parser
