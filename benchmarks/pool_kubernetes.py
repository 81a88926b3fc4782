"""Many sandboxes on Kubernetes: ``pool.map`` against the official agent-sandbox client's loops.

The cluster is the ``KubernetesServer`` double (werkzeug, in this process; behind the
delay proxy at a non-zero round trip, API server and router alike), its runtime
answering every command at once. Each client runs the same short tasks (``true``),
``POOL_SIZE`` at a time:

- ``ours-pool-reuse``: ``SandboxPool(size=8).map`` on our Kubernetes backend (claims reused);
- ``ours-pool-fresh-warm``: ``SandboxPool(size=8, warm=8, reuse=False)``: a fresh claim
  per task, activated ahead;
- ``k8s-client-per-task`` (the reference): the official ``k8s-agent-sandbox`` client
  hand-rolled the way its users do it: a ``ThreadPoolExecutor``, and per task
  ``create_sandbox`` → ``commands.run`` → ``terminate``;
- ``k8s-client-reuse`` (in the floor column): eight sandboxes of the official client made
  first, each task run on a free one.

Goals: reuse at least 3x, fresh-with-warm at least 1.0x the official client's
create-per-task loop (``ratio_reference``). ``requests`` and ``claims`` are what the
cluster answered and the claims it was asked to create, per task.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Mapping
from typing import Any

from benchmarks.clients import NAMESPACE, WARM_POOL, kubernetes_backend
from benchmarks.pool_loops import Loop, ours_pool_loops, reuse_loop, threaded, throughput_rows
from benchmarks.proxy import at_rtt
from benchmarks.report import Role, ScenarioResult, with_ratios
from benchmarks.rounds import Context
from piship_remote.testing import CLAIMS, KubernetesServer

__all__ = ["NAME", "SERVER", "run"]

NAME = "pool_kubernetes"
SERVER = "kubernetes"
OFFICIAL_MISSING = (
    "the official k8s-agent-sandbox client is not installed (pip install -e '.[interop]')"
)
_ALLOW = {"required": True, "network": {"mode": "allow"}}
_READY_TIMEOUT = 60


def _answer(command: str) -> Mapping[str, Any]:
    return {"stdout": "", "exit_code": 0}


def run(context: Context) -> ScenarioResult:
    """One row per client: tasks per second over ``concurrency_rounds`` rounds."""
    began = time.perf_counter()
    skipped: list[str] = []
    with (
        KubernetesServer(_answer) as cluster,
        at_rtt(cluster.url, context.rtt_ms) as url,
        contextlib.ExitStack() as stack,
    ):
        loops = _loops(url, context.workspace, stack, skipped)

        def counters() -> dict[str, int]:
            return {"requests": len(cluster.requests), "claims": cluster.count("POST", CLAIMS)}

        rows = throughput_rows(context, NAME, SERVER, loops, counters=counters)
    return ScenarioResult(
        name=NAME,
        rows=with_ratios(rows),
        skipped=tuple(skipped),
        notes=(
            "throughput of short tasks (true) on the KubernetesServer double; requests = "
            "requests the cluster answered per task (API server and router), claims = claims "
            "created per task; reference = the official k8s-agent-sandbox client's "
            "create-per-task ThreadPoolExecutor loop, floor column = its hand-rolled reuse loop",
        ),
        seconds=time.perf_counter() - began,
    )


def _loops(
    url: str, workspace: str, stack: contextlib.ExitStack, skipped: list[str]
) -> dict[str, tuple[Role, Loop]]:
    backend = kubernetes_backend(url, stack)
    loops = ours_pool_loops(stack, _ALLOW, backend, workspace)
    official = _official_client(url, stack)
    if official is None:
        skipped.append(f"k8s-client loops: {OFFICIAL_MISSING}")
        return loops

    def create() -> Any:
        return official.create_sandbox(
            WARM_POOL, namespace=NAMESPACE, sandbox_ready_timeout=_READY_TIMEOUT
        )

    def per_task() -> None:
        sandbox = create()
        try:
            sandbox.commands.run("true")
        finally:
            sandbox.terminate()

    loops["k8s-client-per-task"] = ("reference", threaded(per_task, "bench-k8s"))
    loops["k8s-client-reuse"] = ("floor", reuse_loop(create, "terminate", stack))
    return loops


def _official_client(url: str, stack: contextlib.ExitStack) -> Any | None:
    """The official ``SandboxClient`` on the cluster at ``url`` (API server and router), as
    its interop test builds it; ``None`` when it is not installed."""
    try:
        agent_sandbox = importlib.import_module("k8s_agent_sandbox")
        models = importlib.import_module("k8s_agent_sandbox.models")
        kubernetes = importlib.import_module("kubernetes.client")
    except ImportError:
        return None
    configuration = kubernetes.Configuration()
    configuration.host = url
    api = kubernetes.ApiClient(configuration)
    stack.callback(api.close)
    client = agent_sandbox.SandboxClient(
        connection_config=models.SandboxDirectConnectionConfig(api_url=url), api_client=api
    )
    stack.callback(client.delete_all)
    return client
