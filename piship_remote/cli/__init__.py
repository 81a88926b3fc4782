"""The ``piship-remote`` command line: ``demo``, ``run``, ``map``, ``cp``, ``create``,
``kill``, ``doctor``, ``serve``, ``sweep``.

    piship-remote demo
    piship-remote run --backend local --sync -- make test
    piship-remote map --size 8 --warm 8 --sync -- 'pytest -q tests/{item}' test_a.py test_b.py
    ID=$(piship-remote create --lease 2h)     # a kept sandbox; only its id on stdout
    piship-remote cp --attach "$ID" data.csv :data/data.csv
    piship-remote run --attach "$ID" -- wc -l data/data.csv
    piship-remote kill "$ID"
    piship-remote doctor --backend kubernetes --network allow --json

``run -- CMD ARG...`` quotes each argument (``shlex.join``); a single argument is
a shell line as given (``run -- 'echo $HOME | wc -c'``). Standard input, when it
is not a terminal, is the command's; its output reaches stdout byte for byte.
A sandbox named with ``--attach`` (or kept with ``--keep``) is never deleted by
``run`` or ``cp``, however they end.

Exit status: the command's own for ``run`` (1 when the remote code does not fit
0-255); for ``map`` 0 when every task is ``ok``, else 1; 2 for a configuration
error, 3 when no sandbox can be had, 124 when ``--timeout`` expired, 130 after
Ctrl-C (the remote command is killed first), 141 when the reader of stdout went
away (as ``cat`` in a shell).
SIGTERM and SIGHUP delete the sandbox first (a kept one is let go of, its command
killed), then end the process (128+n).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from piship_remote import __version__
from piship_remote.cli import _commands, _kept, _map, _sweep
from piship_remote.cli._commands import (
    EXIT_CONFIG,
    EXIT_UNAVAILABLE,
    error_status,
    render_error,
)
from piship_remote.cli._parser import (
    Parser,
    add_python_env,
    add_sandbox_options,
    non_negative_int,
    port_number,
    positive_int,
    positive_number,
    template_pair,
)
from piship_remote.cli._streams import EXIT_BROKEN_PIPE, silence_stdout
from piship_remote.model.errors import CommandCancelled, CommandTimeout, PiShipError
from piship_remote.sandbox import lifecycle

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_CONFIG",
    "EXIT_INTERRUPTED",
    "EXIT_TIMEOUT",
    "EXIT_UNAVAILABLE",
    "main",
]

EXIT_TIMEOUT = 124
EXIT_INTERRUPTED = 130


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    lifecycle.cleanup_on_signals()
    if not hasattr(args, "handler"):
        parser.print_help()
        return EXIT_CONFIG
    try:
        status = int(args.handler(args))
        sys.stdout.flush()  # a reader gone away is found here, not at the interpreter's exit
        return status
    except BrokenPipeError:
        silence_stdout()
        return EXIT_BROKEN_PIPE
    except PiShipError as e:
        print(render_error(e), file=sys.stderr)
        return error_status(e)
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
    _add_verbose(run)
    run.add_argument(
        "--keep",
        action="store_true",
        help="keep the sandbox afterwards (its id, lease and how to end it go to stderr)",
    )
    run.add_argument("--attach", metavar="ID", help="run in a kept sandbox (never deleted by run)")
    _add_lease(run)
    run.add_argument(
        "-n",
        "--no-stdin",
        action="store_true",
        help="pass no standard input (by default a non-terminal stdin is the command's)",
    )
    run.add_argument(
        "-t",
        "--tty",
        action="store_true",
        help="run the command on a terminal, typed into from this one (when stdin is a terminal)",
    )
    run.add_argument("command", nargs="...", help="the command, after --")
    run.set_defaults(handler=_commands.run)

    _add_map(parser)

    create = parser.command(
        "create", help="make a kept sandbox and print only its id (ID=$(piship-remote create))"
    )
    add_sandbox_options(create)
    _add_lease(create)
    create.set_defaults(handler=_kept.create)

    kill = parser.command("kill", help="delete a kept sandbox")
    add_sandbox_options(kill)
    kill.add_argument("sandbox_id", metavar="ID", help="the sandbox's id")
    kill.set_defaults(handler=_kept.kill)

    cp = parser.command(
        "cp",
        help="copy files between this host and a kept sandbox (LOCAL :REMOTE or :REMOTE LOCAL)",
    )
    add_sandbox_options(cp)
    cp.add_argument(
        "--attach", metavar="ID", help="the sandbox (made with create; never deleted by cp)"
    )
    _add_lease(cp)
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
        "--api-key",
        default=None,
        help="the API key clients must send (visible in ps: prefer --api-key-file or"
        " E2B_API_KEY; default: a new random one)",
    )
    serve.add_argument(
        "--api-key-file", metavar="PATH", default=None, help="read the API key from this file"
    )
    for option, what in (
        ("--max-processes", "processes per sandbox"),
        ("--max-memory-mib", "memory per sandbox, MiB"),
        ("--max-disk-mib", "disk (home, /tmp, /dev/shm) per sandbox, MiB"),
        ("--max-lifetime", "seconds a sandbox may live at most"),
        ("--max-snapshot-disk-mib", "host disk all snapshots may take together, MiB"),
    ):
        serve.add_argument(option, type=positive_int, default=None, help=what)
    serve.add_argument(
        "--max-cpus",
        type=positive_number,
        default=None,
        help="CPUs per sandbox, as a bandwidth (0.5: half a CPU; default: half the host's)",
    )
    serve.add_argument(
        "--template",
        metavar="NAME=PATH",
        type=template_pair,
        action="append",
        default=[],
        help="offer template NAME made from PATH: a root filesystem directory or an image"
        " archive (docker save, podman save, an OCI layout tar, a docker export root"
        " filesystem tar); repeatable",
    )
    add_python_env(serve, serve)
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
    sweep.add_argument(
        "--label",
        type=_sweep.label,
        action="append",
        metavar="K=V",
        help="only those carrying this label (a pool's labels=; repeatable)",
    )
    sweep.add_argument("--dry-run", action="store_true", help="list them, delete nothing")
    sweep.add_argument("--json", action="store_true", help="print one JSON object")
    sweep.set_defaults(handler=_sweep.sweep)
    return parser


def _add_map(parser: Parser) -> None:
    mapping = parser.command(
        "map", help="run a command for each item over a pool of sandboxes ({item} in the command)"
    )
    add_sandbox_options(mapping)
    mapping.add_argument(
        "--size", type=positive_int, default=4, help="sandboxes at once (default 4)"
    )
    mapping.add_argument(
        "--warm", type=non_negative_int, default=0, help="sandboxes activated ahead (default 0)"
    )
    mapping.add_argument(
        "--sync", action="store_true", help="push the workspace into every sandbox once"
    )
    _add_verbose(mapping)
    mapping.add_argument(
        "--fresh", action="store_true", help="a new sandbox for every task (default: reuse)"
    )
    mapping.add_argument("--reset", metavar="CMD", help="a command run before a sandbox's reuse")
    mapping.add_argument(
        "--timeout", type=float, default=None, help="seconds each task may take at most"
    )
    mapping.add_argument(
        "--max-create-rate", type=float, default=None, metavar="PER_SECOND", help="creates/s"
    )
    mapping.add_argument(
        "--max-attempts",
        type=positive_int,
        default=2,
        help="sandboxes a task that never started may try (default 2)",
    )
    mapping.add_argument(
        "--label",
        type=_sweep.label,
        action="append",
        metavar="K=V",
        help="put on every sandbox (sweep --label finds them; repeatable)",
    )
    mapping.add_argument(
        "--items-file", metavar="PATH", help="more items, one per line (- reads standard input)"
    )
    mapping.add_argument(
        "--jsonl", action="store_true", help="one JSON object per task on standard output"
    )
    mapping.add_argument("command", nargs="...", help="after --: the command, then the items")
    mapping.set_defaults(handler=_map.map_items)


def _add_verbose(parser: Parser) -> None:
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="with --sync: list every path left out"
    )


def _add_lease(parser: Parser) -> None:
    parser.add_argument(
        "--lease",
        type=_sweep.duration,
        default=None,
        metavar="DURATION",
        help="how long a kept sandbox lives after this command (30m, 2h; default 1h,"
        " or for --attach what it had left)",
    )
