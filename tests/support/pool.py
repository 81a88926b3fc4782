"""Shared pieces of the pool tests: the E2B double's command answers and library threads."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from piship_remote import KubernetesAgentSandboxBackend, SandboxPool
from piship_remote.backends.base import Backend
from piship_remote.testing import KubernetesServer
from piship_remote.testing.sandbox_shell import script_of

POLICY = {"required": True, "network": {"mode": "deny"}}
K8S_POLICY = {"required": True, "network": {"mode": "allow"}}
_EXIT = re.compile(r"exit-with-(\d+)")


def script(start: dict[str, Any]) -> str:
    """The shell script of an E2B Start request."""
    return script_of(start.get("process", {}).get("args")) or ""


def exit_as_asked(start: dict[str, Any]) -> dict[str, Any]:
    """A command answer: ``exit-with-N`` in the script exits N, and the script is echoed."""
    text = script(start)
    found = _EXIT.search(text)
    return {"stdout": text + "\n", "exit_code": int(found.group(1)) if found else 0}


def pool_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("piship-pool")]


def settled(check: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Whether ``check()`` became true within ``timeout`` seconds (polled)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.01)
    return check()


@contextmanager
def pool_maker(
    policy: Mapping[str, Any], backend: Backend, workspace: Path
) -> Iterator[Callable[..., SandboxPool]]:
    """Makes pools of ``policy`` on ``backend`` (no env; options as given); closes them all
    at the end."""
    pools: list[SandboxPool] = []

    def make(**options: Any) -> SandboxPool:
        pool = SandboxPool(policy, backend=backend, workspace=workspace, env={}, **options)
        pools.append(pool)
        return pool

    try:
        yield make
    finally:
        for pool in pools:
            pool.close()


def cluster_backend(server: KubernetesServer) -> KubernetesAgentSandboxBackend:
    """Our Kubernetes backend on the ``KubernetesServer`` double (API server and router)."""
    return KubernetesAgentSandboxBackend(
        endpoint=server.url, router=server.url, template="python-pool", namespace="agents",
        poll_interval=0.01,
    )  # fmt: skip
