"""From command-line arguments to a policy and a backend."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from piship_remote.backends.base import Backend
from piship_remote.model.errors import ConfigInvalid, ConfigUnavailable
from piship_remote.model.policy import SandboxPolicy

if TYPE_CHECKING:
    from piship_remote.backends.kubernetes.backend import (
        KubernetesAgentSandboxBackend,
        PortForward,
    )

__all__ = [
    "DEFAULT_ALLOW",
    "backend_for",
    "env_reader",
    "kubernetes_backend",
    "lease_seconds",
    "policy_for",
]

DEFAULT_ALLOW = ("LANG", "LC_ALL", "TERM", "TZ")
# The CLI's sandboxes live on a short lease the library renews while the CLI runs, so one
# whose CLI was killed (SIGKILL, a lost machine) ends on its own within five minutes.
CLI_LEASE_SECONDS = 300.0
# A sandbox kept for later (--keep, --attach, create) lives this long without --lease.
KEPT_LEASE_SECONDS = 3600.0
# What a backend made only to list and delete claims (sweep) is given for the router and
# warm pool it never uses: those calls go to the API server alone.
LISTING_POOL = "piship-sweep"
LISTING_ROUTER = "http://127.0.0.1:9"


def lease_seconds(args: argparse.Namespace) -> float:
    """The lifetime a sandbox gets from this command: ``--lease``, or the default for
    a kept sandbox (``--keep``, ``--attach``) or for one deleted at the end."""
    lease: float | None = getattr(args, "lease", None)
    if lease is not None:
        return lease
    kept = getattr(args, "keep", False) or getattr(args, "attach", None)
    return KEPT_LEASE_SECONDS if kept else CLI_LEASE_SECONDS


def policy_for(args: argparse.Namespace) -> SandboxPolicy:
    """The policy file (or a required default), with ``--network``/``--allow-env`` applied."""
    data: dict[str, Any] = _load_policy(args.policy) if args.policy else {"required": True}
    if args.network:
        data["network"] = {"mode": args.network}
    data.setdefault("network", {"mode": "deny"})
    if args.allow_env:
        data["environment"] = {"allow": args.allow_env}
    data.setdefault("environment", {"allow": list(DEFAULT_ALLOW)})
    return SandboxPolicy.from_dict(data)


def backend_for(args: argparse.Namespace, stack: ExitStack) -> Backend:
    """The backend ``--backend`` names; a local service is closed with ``stack``."""
    if args.backend == "local":
        from piship_remote.local import LocalE2bService

        service = stack.enter_context(LocalE2bService(python_env=args.python_env))
        return service.backend(template=args.template, lifetime_seconds=lease_seconds(args))
    if args.backend == "kubernetes":
        return kubernetes_backend(args)
    from piship_remote.backends.e2b.backend import E2bCompatibleBackend

    return E2bCompatibleBackend(
        endpoint=args.endpoint,
        template=args.template,
        user=args.user,
        envd_url=args.envd_url,
        credential=env_reader("E2B_API_KEY"),
        lifetime_seconds=lease_seconds(args),
    )


def env_reader(name: str, environ: Mapping[str, str] = os.environ) -> Callable[[], str | None]:
    """A credential callable reading ``name`` fresh each time (``None`` when unset or empty)."""
    return lambda: environ.get(name) or None


def kubernetes_backend(
    args: argparse.Namespace, *, listing: bool = False
) -> KubernetesAgentSandboxBackend:
    """The Kubernetes backend: ``--api`` with ``PISHIP_K8S_TOKEN``, else the pod's service
    account inside a cluster (without ``--kubeconfig``/``--context``), else a kubeconfig.
    ``listing``: only to list and delete claims (``sweep``), which needs no router or pool."""
    from piship_remote.backends.kubernetes.backend import KubernetesAgentSandboxBackend

    needed = [("--api", _cluster_known(args))]
    if not listing:
        needed += [("--router", args.router), ("--pool", args.pool)]
    missing = [name for name, value in needed if not value]
    if missing:
        raise ConfigInvalid(
            f"the kubernetes backend needs {', '.join(missing)}",
            user_action="Set PISHIP_K8S_ROUTER and PISHIP_K8S_TEMPLATE, and PISHIP_K8S_API "
            "unless a kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config) names the cluster",
        )
    router_token = env_reader(args.router_token)
    options: dict[str, Any] = {
        "template": args.pool or LISTING_POOL,
        "lifetime_seconds": lease_seconds(args),
        "router_auth": args.router_auth,
        "runtime": getattr(args, "runtime", "auto"),
        "sandboxd_proxy": getattr(args, "sandboxd_proxy", None),
    }
    if args.namespace:
        options["namespace"] = args.namespace
    try:
        options["router"] = _router(args)
        if args.api:
            has_router_token = bool(os.environ.get(args.router_token))
            return KubernetesAgentSandboxBackend(
                endpoint=args.api,
                credential=env_reader("PISHIP_K8S_TOKEN"),
                router_credential=router_token if has_router_token else None,
                **options,
            )
        options["router_credential"] = router_token
        if not (args.kubeconfig or args.context) and os.environ.get("KUBERNETES_SERVICE_HOST"):
            return KubernetesAgentSandboxBackend.in_cluster(**options)
        return KubernetesAgentSandboxBackend.from_kubeconfig(
            args.kubeconfig, context=args.context, **options
        )
    except ValueError as e:
        raise ConfigInvalid(str(e)) from None


def _router(args: argparse.Namespace) -> str | PortForward:
    """``--router``: a URL, or port-forward to ``--router-service`` in ``--router-namespace``."""
    from piship_remote.backends.kubernetes.backend import PORT_FORWARD, PortForward

    url: str = args.router or LISTING_ROUTER
    if url != PORT_FORWARD:
        return url
    return PortForward(service=args.router_service, namespace=args.router_namespace)


def _cluster_known(args: argparse.Namespace) -> bool:
    """Whether ``--api``, a kubeconfig or the pod's service account says where the API is."""
    if args.api or args.kubeconfig or args.context or os.environ.get("KUBERNETES_SERVICE_HOST"):
        return True
    from piship_remote.backends.kubernetes._cluster_config import kubeconfig_path

    paths = kubeconfig_path(None).split(os.pathsep)
    return any(os.path.exists(os.path.expanduser(path)) for path in paths if path)


def _load_policy(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as e:
        raise ConfigUnavailable(f"cannot read the policy file {path}: {e.strerror}") from None
    data = _parse_policy(path, text)
    if not isinstance(data, dict):
        raise ConfigInvalid(f"the policy file {path} does not hold a mapping")
    return data.get("sandbox", data) if isinstance(data.get("sandbox"), dict) else data


def _parse_policy(path: str, text: str) -> Any:
    if path.endswith((".yaml", ".yml")):
        return _parse_yaml(path, text)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigInvalid(f"the policy file {path} is not JSON: {e.msg}") from None


def _parse_yaml(path: str, text: str) -> Any:
    try:
        import yaml  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        raise ConfigInvalid(
            "reading a YAML policy needs PyYAML",
            user_action="pip install 'piship-remote[yaml]', or write the policy as JSON",
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or "malformed YAML"
        raise ConfigInvalid(f"the policy file {path} is not valid YAML: {problem}") from None
