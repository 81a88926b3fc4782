"""A host process that activates a sandbox on a double and then ends in a chosen way.

    python lifecycle_child.py e2b|k8s URL MODE [LIFETIME] [ATTACH_ID]

It prints ``ready <sandbox id>`` once the sandbox is active, then:
``exit`` returns normally, ``raise`` ends by an uncaught exception, ``wait`` blocks
(for SIGTERM, SIGINT or SIGKILL from the test; ``cleanup_on_signals`` is on),
``drop`` loses the last reference without dispose and exits, ``detach`` detaches
and prints ``detached <id>``, ``attach`` attaches to ATTACH_ID, runs a command and
prints ``ran <output>``, then disposes.
"""

from __future__ import annotations

import gc
import sys
import threading

import piship_remote
from piship_remote import activate_sandbox
from piship_remote.backends.base import Backend
from piship_remote.backends.e2b.backend import E2bCompatibleBackend
from piship_remote.backends.kubernetes.backend import KubernetesAgentSandboxBackend


def backend(kind: str, url: str, lifetime: float) -> Backend:
    if kind == "e2b":
        return E2bCompatibleBackend(endpoint=url, envd_url=url, lifetime_seconds=lifetime)
    return KubernetesAgentSandboxBackend(
        endpoint=url,
        router=url,
        template="python-pool",
        namespace="agents",
        poll_interval=0.05,
        lifetime_seconds=lifetime,
    )


def main() -> None:
    kind, url, mode = sys.argv[1:4]
    lifetime = float(sys.argv[4]) if len(sys.argv) > 4 else 3600.0
    attach = sys.argv[5] if len(sys.argv) > 5 else None
    piship_remote.cleanup_on_signals()
    network = "deny" if kind == "e2b" else "allow"
    policy = {"required": True, "network": {"mode": network}}
    sandbox = activate_sandbox(
        policy, backend=backend(kind, url, lifetime), workspace=".", attach=attach
    )
    print("ready", sandbox.id, flush=True)
    if mode == "raise":
        raise RuntimeError("the host script failed")
    if mode == "wait":
        threading.Event().wait()
    if mode == "drop":
        del sandbox
        gc.collect()
    if mode == "detach":
        print("detached", sandbox.detach(), flush=True)
    if mode == "attach":
        result = sandbox.run("echo attached", check=True)
        print("ran", result.stdout.strip(), flush=True)
        sandbox.dispose()


if __name__ == "__main__":
    main()
