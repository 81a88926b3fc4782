"""The argument parser of ``piship-remote``: options, validation, and "did you mean" hints."""

from __future__ import annotations

import argparse
import difflib
import os
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

__all__ = [
    "Parser",
    "add_python_env",
    "add_sandbox_options",
    "existing_directory",
    "non_negative_int",
    "port_number",
    "positive_int",
    "suggest",
    "template_pair",
]

BACKENDS = ("e2b", "kubernetes", "local")


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors name the closest valid option or command.

    It remembers its option strings and sub-commands itself (argparse keeps them private)::

        parser = Parser(prog="piship-remote")
        run = parser.command("run", help="run one command")
        run.add_argument("--timeout", type=float)
        parser.parse_args(["run", "--timout", "5"])   # error: ... (did you mean --timeout?)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        self.known_options: list[str] = []
        self.commands: dict[str, Parser] = {}
        self._commands_action: Any = None
        super().__init__(*args, **kwargs)

    def add_argument(self, *names: Any, **kwargs: Any) -> argparse.Action:
        self.known_options.extend(str(name) for name in names if str(name).startswith("-"))
        return super().add_argument(*names, **kwargs)

    def command(self, name: str, **kwargs: Any) -> Parser:
        """Add the sub-command ``name`` and return its parser."""
        if self._commands_action is None:
            self._commands_action = self.add_subparsers(
                title="commands", metavar="COMMAND", dest="command_name", parser_class=Parser
            )
        parser: Parser = self._commands_action.add_parser(name, **kwargs)
        self.commands[name] = parser
        return parser

    def option(self, group: Any, *names: str, **kwargs: Any) -> None:
        """``group.add_argument(*names, **kwargs)``, remembering the names for hints."""
        self.known_options.extend(names)
        group.add_argument(*names, **kwargs)

    def error(self, message: str) -> NoReturn:
        """The mistake and its closest fix at once, under a one-line usage (``--help``
        has the long one)."""
        self.exit(
            2,
            f"usage: {self.prog} [options] ...\n"
            f"{self.prog}: error: {message}{self._hint(message)}\n"
            f"('{self.prog} --help' lists the options)\n",
        )

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            chosen = self.commands.get(getattr(parsed, "command_name", None) or "", self)
            chosen.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def _hint(self, message: str) -> str:
        if "unrecognized arguments:" in message:
            words = message.split("unrecognized arguments:", 1)[1].split()
            options = [word.split("=", 1)[0] for word in words if word.startswith("-")]
            return suggest(options[0], self.known_options) if options else ""
        if "invalid choice:" in message:
            choice = message.split("invalid choice:", 1)[1].split("'")[1:2]
            return suggest(choice[0], self.commands) if choice else ""
        return ""


def suggest(word: str, candidates: Iterable[str]) -> str:
    """``" (did you mean --timeout?)"`` for the closest candidate, or ``""``."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 (any free port) to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is not between 0 and 65535")
    return port


def template_pair(text: str) -> tuple[str, str]:
    """An argparse type: ``NAME=PATH`` (a ``serve --template``)."""
    name, separator, path = text.partition("=")
    if not (separator and name and path):
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, not {text!r}")
    return name, path


def positive_int(text: str) -> int:
    """An argparse type: a whole number above zero."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not above zero")
    return value


def positive_number(text: str) -> float:
    """An argparse type: a finite number above zero (``0.5``, ``2``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a number above zero")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: a whole number, zero or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is below zero")
    return value


def existing_directory(text: str) -> str:
    """An argparse type: a directory that exists (the workspace root)."""
    if not os.path.isdir(text):
        what = "is not a directory" if os.path.exists(text) else "does not exist"
        raise argparse.ArgumentTypeError(f"the workspace {text!r} {what}")
    return text


def add_python_env(parser: Parser, group: Any) -> None:
    """``--python-env PATH``: the local service lends its sandboxes this Python environment."""
    parser.option(
        group,
        "--python-env",
        metavar="PATH",
        default=os.environ.get("PISHIP_LOCAL_PYTHON_ENV"),
        help="with --backend local: every sandbox's python3 is this host environment (a venv"
        " holding your test dependencies), lent read-only (env PISHIP_LOCAL_PYTHON_ENV)",
    )


def add_sandbox_options(parser: Parser) -> None:
    """The options every command that activates a sandbox takes (env defaults in brackets)."""
    env = os.environ.get
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default=env("PISHIP_BACKEND", "e2b"),
        help="which service: e2b, kubernetes, or local (the embedded one) (env PISHIP_BACKEND)",
    )
    parser.add_argument("--policy", help="a policy file (JSON, or YAML with PyYAML installed)")
    parser.add_argument("--network", choices=("deny", "allow"), help="network mode (default deny)")
    parser.add_argument(
        "--allow-env", action="append", metavar="NAME", help="a variable that may reach the sandbox"
    )
    parser.add_argument(
        "--workspace",
        type=existing_directory,
        default=".",
        help="the workspace root (default: here)",
    )
    local = parser.add_argument_group("local options")
    add_python_env(parser, local)
    group = parser.add_argument_group("e2b options")
    parser.option(
        group,
        "--endpoint",
        default=env("PISHIP_E2B_ENDPOINT", "https://api.e2b.app"),
        help="control-plane URL (env PISHIP_E2B_ENDPOINT)",
    )
    parser.option(
        group,
        "--template",
        default=env("PISHIP_E2B_TEMPLATE", "base"),
        help="template (env PISHIP_E2B_TEMPLATE)",
    )
    parser.option(
        group,
        "--user",
        default=env("PISHIP_E2B_USER", "user"),
        help="envd user; root for CubeSandbox (env PISHIP_E2B_USER)",
    )
    parser.option(
        group,
        "--envd-url",
        default=env("PISHIP_E2B_ENVD_URL"),
        help="envd base URL, for self-hosted services (env PISHIP_E2B_ENVD_URL)",
    )
    k8s = parser.add_argument_group("kubernetes options")
    parser.option(
        k8s, "--api", default=env("PISHIP_K8S_API"), help="Kubernetes API URL (env PISHIP_K8S_API)"
    )
    parser.option(
        k8s,
        "--router",
        default=env("PISHIP_K8S_ROUTER"),
        help="sandbox router URL, or port-forward to reach its Service through the API"
        " server as kubectl port-forward does (env PISHIP_K8S_ROUTER)",
    )
    parser.option(
        k8s,
        "--router-service",
        default=env("PISHIP_K8S_ROUTER_SERVICE", "sandbox-router-svc"),
        help="with --router port-forward: the router's Service (env PISHIP_K8S_ROUTER_SERVICE;"
        " default sandbox-router-svc)",
    )
    parser.option(
        k8s,
        "--router-namespace",
        default=env("PISHIP_K8S_ROUTER_NAMESPACE", "agent-sandbox-system"),
        help="with --router port-forward: the Service's namespace (env"
        " PISHIP_K8S_ROUTER_NAMESPACE; default agent-sandbox-system)",
    )
    parser.option(
        k8s,
        "--runtime",
        choices=("auto", "python-runtime", "sandboxd"),
        default=env("PISHIP_K8S_RUNTIME", "auto"),
        help="the pod's runtime: auto reads the claim's template; sandboxd passes standard"
        " input (env PISHIP_K8S_RUNTIME; default auto)",
    )
    parser.option(
        k8s,
        "--sandboxd-proxy",
        default=env("PISHIP_K8S_SANDBOXD_PROXY"),
        help="reach sandboxd through the router's gRPC proxy, grpcs://host:port, instead of a"
        " port-forward to the pod (env PISHIP_K8S_SANDBOXD_PROXY)",
    )
    parser.option(
        k8s,
        "--pool",
        default=env("PISHIP_K8S_TEMPLATE"),
        help="warm pool name (env PISHIP_K8S_TEMPLATE)",
    )
    parser.option(
        k8s,
        "--namespace",
        default=env("PISHIP_K8S_NAMESPACE"),
        help="namespace (env PISHIP_K8S_NAMESPACE; default: the kubeconfig context's, the"
        " pod's, or default)",
    )
    parser.option(
        k8s,
        "--kubeconfig",
        default=env("PISHIP_K8S_KUBECONFIG"),
        help="kubeconfig file, when --api is not given (env PISHIP_K8S_KUBECONFIG; default:"
        " $KUBECONFIG, else ~/.kube/config, or the pod's service account inside a cluster)",
    )
    parser.option(
        k8s,
        "--context",
        default=env("PISHIP_K8S_CONTEXT"),
        help="kubeconfig context (env PISHIP_K8S_CONTEXT; default: the current one)",
    )
    parser.option(
        k8s,
        "--router-token",
        metavar="VARIABLE",
        default=env("PISHIP_K8S_ROUTER_TOKEN_ENV", "PISHIP_K8S_ROUTER_TOKEN"),
        help="the environment variable holding the router's own token, read for each"
        " request (default PISHIP_K8S_ROUTER_TOKEN; unset: the router gets none with a"
        " kubeconfig, PISHIP_K8S_TOKEN with --api)",
    )
    parser.option(
        k8s,
        "--router-auth",
        choices=("bearer", "scoped-token"),
        default=env("PISHIP_K8S_ROUTER_AUTH", "bearer"),
        help="scoped-token: the router checks tokens scoped to one sandbox, so no pod IP or"
        " UID is sent (env PISHIP_K8S_ROUTER_AUTH)",
    )
