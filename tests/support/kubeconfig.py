"""Kubeconfig files for tests: one cluster, one user, one context, written as JSON (which
is YAML)::

    config = write_kubeconfig(tmp_path / "config", mock.url, {"token": "t"}, ca=pki.ca)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from piship_remote.backends.kubernetes.backend import KubernetesAgentSandboxBackend


def write_kubeconfig(
    path: Path,
    server: str,
    user: dict[str, Any],
    *,
    ca: Path | None = None,
    namespace: str | None = "agents",
    context: str = "test",
) -> Path:
    """A one-context kubeconfig (JSON is YAML) whose current context is ``context``."""
    cluster: dict[str, Any] = {"server": server}
    if ca is not None:
        cluster["certificate-authority"] = str(ca)
    context_body: dict[str, Any] = {"cluster": "double", "user": "me"}
    if namespace is not None:
        context_body["namespace"] = namespace
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "double", "cluster": cluster}],
        "users": [{"name": "me", "user": user}],
        "contexts": [{"name": context, "context": context_body}],
        "current-context": context,
    }
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def kubeconfig_backend(
    server: str, ca: Path, directory: Path, user: dict[str, Any], **options: Any
) -> KubernetesAgentSandboxBackend:
    """A backend from a kubeconfig (in ``directory``) naming ``server`` with its ``ca``
    and ``user``; the router is ``server`` too unless ``router`` is given."""
    config = write_kubeconfig(directory / "config", server, user, ca=ca)
    options.setdefault("router", server)
    return KubernetesAgentSandboxBackend.from_kubeconfig(config, template="python-pool", **options)


def exec_user(script: Path) -> dict[str, Any]:
    """A kubeconfig ``exec`` user running the Python plugin ``script``."""
    return {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(script)],
            "interactiveMode": "Never",
        }
    }


def plugin_runs(runs: Path) -> int:
    """How often a plugin that appends a line to ``runs`` on each run has run."""
    return len(runs.read_text().splitlines())
