"""The ``piship-remote`` command line: ``demo``, ``run``, ``doctor`` and ``serve``.

    piship-remote demo
    piship-remote run --backend e2b -- make test
    piship-remote doctor --backend kubernetes --network allow --json

``run -- CMD ARG...`` quotes each argument (``shlex.join``); a single argument is
a shell line as given (``run -- 'echo $HOME | wc -c'``).

Exit status: the command's own for ``run``; 2 for a configuration error, 3 when
no sandbox can be had, 124 when ``--timeout`` expired, 130 after Ctrl-C (the
remote command is killed first in both cases).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

from piship_remote.activation import Sandbox, activate_sandbox
from piship_remote.backends.base import Backend
from piship_remote.errors import (
    CONFIG_INVALID,
    CONFIG_UNAVAILABLE,
    NETWORK_DENIED,
    CommandCancelled,
    CommandTimeout,
    PiShipError,
)
from piship_remote.policy import SandboxPolicy
from piship_remote.report import describe_containment

__all__ = ["main"]

EXIT_CONFIG = 2
EXIT_UNAVAILABLE = 3
EXIT_TIMEOUT = 124
EXIT_INTERRUPTED = 130
CONFIG_CODES = frozenset({CONFIG_INVALID, CONFIG_UNAVAILABLE, NETWORK_DENIED})
DEFAULT_ALLOW = ("LANG", "LC_ALL", "TERM", "TZ")
DEMO_SECRET_NAME = "PISHIP_DEMO_API_TOKEN"
DEMO_SECRET = "sk-demo-host-secret-that-must-stay-home"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
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


# -- the parser ---------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="piship-remote",
        description="Run shell commands in remote sandboxes under a containment policy.",
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    demo = commands.add_parser(
        "demo", help="try it out on the embedded local sandbox service (no account needed)"
    )
    demo.set_defaults(handler=_demo)

    run = commands.add_parser("run", help="run one command in a fresh sandbox")
    _add_sandbox_options(run)
    run.add_argument(
        "--timeout", type=float, default=None, help="seconds before the command is killed"
    )
    run.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    run.set_defaults(handler=_run)

    doctor = commands.add_parser(
        "doctor", help="activate a sandbox and print its containment report"
    )
    _add_sandbox_options(doctor)
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.set_defaults(handler=_doctor)

    serve = commands.add_parser("serve", help="serve the embedded local E2B-compatible service")
    serve.add_argument("--host", default="127.0.0.1", help="loopback address to listen on")
    serve.add_argument("--port", type=int, default=0, help="port (default: any free port)")
    serve.set_defaults(handler=_serve)
    return parser


def _add_sandbox_options(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument(
        "--backend",
        choices=("e2b", "kubernetes", "local"),
        default=env("PISHIP_BACKEND", "e2b"),
        help="which service (env PISHIP_BACKEND; default e2b)",
    )
    parser.add_argument("--policy", help="a policy file (JSON, or YAML with PyYAML installed)")
    parser.add_argument("--network", choices=("deny", "allow"), help="network mode (default deny)")
    parser.add_argument(
        "--allow-env", action="append", metavar="NAME", help="a variable that may reach the sandbox"
    )
    parser.add_argument("--workspace", default=".", help="the workspace root (default: here)")
    group = parser.add_argument_group("e2b options")
    group.add_argument(
        "--endpoint",
        default=env("PISHIP_E2B_ENDPOINT", "https://api.e2b.app"),
        help="control-plane URL (env PISHIP_E2B_ENDPOINT)",
    )
    group.add_argument(
        "--template",
        default=env("PISHIP_E2B_TEMPLATE", "base"),
        help="template (env PISHIP_E2B_TEMPLATE)",
    )
    group.add_argument(
        "--user",
        default=env("PISHIP_E2B_USER", "user"),
        help="envd user; root for CubeSandbox (env PISHIP_E2B_USER)",
    )
    group.add_argument(
        "--envd-url",
        default=env("PISHIP_E2B_ENVD_URL"),
        help="envd base URL, for self-hosted services (env PISHIP_E2B_ENVD_URL)",
    )
    k8s = parser.add_argument_group("kubernetes options")
    k8s.add_argument(
        "--api", default=env("PISHIP_K8S_API"), help="Kubernetes API URL (env PISHIP_K8S_API)"
    )
    k8s.add_argument(
        "--router",
        default=env("PISHIP_K8S_ROUTER"),
        help="sandbox router URL (env PISHIP_K8S_ROUTER)",
    )
    k8s.add_argument(
        "--pool",
        default=env("PISHIP_K8S_TEMPLATE"),
        help="warm pool name (env PISHIP_K8S_TEMPLATE)",
    )
    k8s.add_argument(
        "--namespace",
        default=env("PISHIP_K8S_NAMESPACE", "default"),
        help="namespace (env PISHIP_K8S_NAMESPACE)",
    )


# -- subcommands ----------------------------------------------------------------


def _run(args: argparse.Namespace) -> int:
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
        result = sandbox.run(_shell_line(command), timeout=args.timeout, echo=True)
        return result.exit_code


def _shell_line(command: Sequence[str]) -> str:
    """One argument is a shell line as given; several are quoted word by word."""
    return command[0] if len(command) == 1 else shlex.join(command)


def _doctor(args: argparse.Namespace) -> int:
    with ExitStack() as stack:
        sandbox = stack.enter_context(_activated(args, stack))
        if args.json:
            print(json.dumps(sandbox.report.to_dict(), indent=2))
        else:
            print(describe_containment(sandbox.report))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from piship_remote import local

    local.serve(host=args.host, port=args.port)
    return 0


def _demo(args: argparse.Namespace) -> int:
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


# -- helpers ----------------------------------------------------------------------


@contextmanager
def _activated(args: argparse.Namespace, stack: ExitStack) -> Iterator[Sandbox]:
    backend = _backend(args, stack)
    policy = _policy(args)
    with activate_sandbox(policy, backend=backend, workspace=args.workspace) as sandbox:
        yield sandbox


def _policy(args: argparse.Namespace) -> SandboxPolicy:
    data: dict[str, Any] = _load_policy(args.policy) if args.policy else {"required": True}
    if args.network:
        data["network"] = {"mode": args.network}
    data.setdefault("network", {"mode": "deny"})
    if args.allow_env:
        data["environment"] = {"allow": args.allow_env}
    data.setdefault("environment", {"allow": list(DEFAULT_ALLOW)})
    return SandboxPolicy.from_dict(data)


def _load_policy(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as e:
        raise PiShipError(
            CONFIG_INVALID, f"cannot read the policy file {path}: {e.strerror}"
        ) from None
    data = _parse_policy(path, text)
    if not isinstance(data, dict):
        raise PiShipError(CONFIG_INVALID, f"the policy file {path} does not hold a mapping")
    return data.get("sandbox", data) if isinstance(data.get("sandbox"), dict) else data


def _parse_policy(path: str, text: str) -> Any:
    if path.endswith((".yaml", ".yml")):
        try:
            import yaml  # type: ignore[import-untyped]
        except ImportError:
            raise PiShipError(
                CONFIG_INVALID,
                "reading a YAML policy needs PyYAML",
                user_action="pip install 'piship-remote[yaml]', or write the policy as JSON",
            ) from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as e:
            problem = getattr(e, "problem", None) or "malformed YAML"
            raise PiShipError(
                CONFIG_INVALID, f"the policy file {path} is not valid YAML: {problem}"
            ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise PiShipError(CONFIG_INVALID, f"the policy file {path} is not JSON: {e.msg}") from None


def _backend(args: argparse.Namespace, stack: ExitStack) -> Backend:
    if args.backend == "local":
        from piship_remote.local import LocalE2bService

        return stack.enter_context(LocalE2bService()).backend()
    if args.backend == "kubernetes":
        return _kubernetes(args)
    from piship_remote.backends.e2b import E2bCompatibleBackend

    return E2bCompatibleBackend(
        endpoint=args.endpoint,
        template=args.template,
        user=args.user,
        envd_url=args.envd_url,
        credential=_env_reader("E2B_API_KEY"),
    )


def _kubernetes(args: argparse.Namespace) -> Backend:
    from piship_remote.backends.kubernetes import KubernetesAgentSandboxBackend

    needed = (("--api", args.api), ("--router", args.router), ("--pool", args.pool))
    missing = [name for name, value in needed if not value]
    if missing:
        raise PiShipError(
            CONFIG_INVALID,
            f"the kubernetes backend needs {', '.join(missing)}",
            user_action="Set PISHIP_K8S_API, PISHIP_K8S_ROUTER and PISHIP_K8S_TEMPLATE",
        )
    try:
        return KubernetesAgentSandboxBackend(
            endpoint=args.api,
            router=args.router,
            template=args.pool,
            namespace=args.namespace,
            credential=_env_reader("PISHIP_K8S_TOKEN"),
        )
    except ValueError as e:
        raise PiShipError(CONFIG_INVALID, str(e)) from None


def _env_reader(name: str, environ: Mapping[str, str] = os.environ) -> Callable[[], str | None]:
    return lambda: environ.get(name) or None


def _say(text: str) -> None:
    print(text, flush=True)


@contextmanager
def _listener() -> Iterator[int]:
    """A TCP listener on this host's loopback, for the demo's network-denial check."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield server.getsockname()[1]
