"""Kubernetes on sandboxd: our backend against the official agent-sandbox client's sandboxd path.

The cluster is ``KubernetesServer(runtime="sandboxd")`` (in this process; each claim's
sandboxd runs real commands). One claim per client:

- ``ours-sandbox``: ``Sandbox.exec`` on our Kubernetes backend (the runtime read from the
  template), reaching sandboxd through its own WebSocket port-forward to the pod, commands
  over the ``Start`` stream;
- ``ours-sandbox-proxy``: the same through the double's router (``sandboxd_proxy=``: its
  gRPC proxy, which forwards each call in Python in this process, and its HTTP for files);
- ``k8s-client`` (the reference): ``k8s-agent-sandbox`` 1.0.8 with its ``grpc`` extra,
  ``SandboxdInClusterConnectionConfig(mode="in-cluster-pod-ip")`` pointed at the ports where
  the double's port-forward lands (its own route, ``kubectl port-forward``, needs SPDY,
  which the double does not serve), so it skips the port-forward our rows pay for;
  commands over unary ``Execute``;
- ``grpc-start-raw`` (the floor): a bare gRPC ``Start`` iterated on the claim's forwarded
  listener, no library (the double's own cost of streaming 4 KiB chunks in this process).

Groups: ``exec`` (``true``, seconds per call, p50 in the median column), ``stream`` (MB/s
of ``head -c N /dev/zero``; N is at most 3 MiB so that the client's ``Execute`` answer
fits gRPC's default 4 MiB message limit; ours also at the size's ``stream_bytes``), and
``stop`` (seconds from the stop to the end of a ``sleep 600`` child of the command: ours
by a cancel event, the client by its ``command_timeout``, the only stop it has: a
``KeyboardInterrupt`` does not cancel its blocking ``Execute``).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from benchmarks.clients import NAMESPACE, WARM_POOL
from benchmarks.report import Role, Row, ScenarioResult, summarize, with_ratios
from benchmarks.rounds import Context, alternate
from benchmarks.sizes import MIB

__all__ = ["NAME", "run"]

NAME = "sandboxd"
SERVER = "kubernetes-sandboxd"
_ALLOW = {"required": True, "network": {"mode": "allow"}}
_STREAM_LIMIT = 3 * MIB
_STOP_AFTER = 0.2
_GONE_WITHIN = 10.0


class _Client:
    """One client's three measurements on its own claim."""

    def __init__(
        self,
        name: str,
        role: Role,
        run: Callable[[str], bytes],
        stop: Callable[[str, float], None],
    ) -> None:
        self.name = name
        self.role = role
        self.run = run
        self.stop = stop


def run(context: Context) -> ScenarioResult:
    began = time.perf_counter()
    skipped: list[str] = []
    try:
        testing = importlib.import_module("piship_remote.testing")
        importlib.import_module("grpc")
    except ImportError as error:
        return ScenarioResult(
            name=NAME, skipped=(f"the sandboxd extra is not installed ({error})",)
        )
    cluster = testing.Cluster(pod_ip="127.0.0.1")
    with (
        testing.KubernetesServer(cluster=cluster, runtime="sandboxd") as server,
        contextlib.ExitStack() as stack,
    ):
        clients = [
            _ours("ours-sandbox", server.url, context.workspace, stack),
            _ours(
                "ours-sandbox-proxy", server.url, context.workspace, stack, server.sandboxd_proxy
            ),
        ]
        clients.append(_raw_start(server, stack))
        official = _official(server, stack)
        if official is None:
            skipped.append("k8s-client: k8s-agent-sandbox[grpc] is not installed")
        else:
            clients.append(official)
        rows = _measure(context, clients)
    return ScenarioResult(
        name=NAME,
        rows=with_ratios(rows),
        skipped=tuple(skipped),
        notes=(
            "on the KubernetesServer double with runtime=sandboxd, in this process, on a busy"
            " shared machine; ours goes through its WebSocket port-forward to the pod, the"
            " official client straight to the forwarded listeners (in-cluster pod-IP mode);"
            " stream is MB/s, stop is seconds from the cancel (ours) or the gRPC deadline"
            " (the client's command_timeout) to the end of the command's child",
        ),
        seconds=time.perf_counter() - began,
    )


def _measure(context: Context, clients: list[_Client]) -> list[Row]:
    size = context.size
    rows: list[Row] = []
    execs = alternate(clients, max(1, size.exec_calls // 10), lambda c: _exec_samples(c, 10))
    sizes = sorted({min(size.stream_bytes, _STREAM_LIMIT), size.stream_bytes})
    stops = alternate(clients, max(2, size.cancel_runs // 5), _stop_sample)
    for client in clients:
        rows.append(
            summarize(
                NAME,
                SERVER,
                client.name,
                client.role,
                execs[client.name],
                unit="ms",
                group="exec true",
            )
        )
        rows.append(
            summarize(
                NAME,
                SERVER,
                client.name,
                client.role,
                stops[client.name],
                unit="ms",
                group="stop to the child's end",
            )
        )
    for stream_bytes in sizes:
        streamers = [c for c in clients if stream_bytes <= _STREAM_LIMIT or c.role != "reference"]
        rates = alternate(
            streamers, max(1, size.stream_rounds), lambda c, n=stream_bytes: [_rate(c, n)]
        )
        for client in streamers:
            rows.append(
                summarize(
                    NAME,
                    SERVER,
                    client.name,
                    client.role,
                    rates[client.name],
                    unit="MB/s",
                    group=f"stream {stream_bytes // MIB} MiB",
                    higher_is_better=True,
                )
            )
    return rows


def _exec_samples(client: _Client, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        client.run("true")
        samples.append(time.perf_counter() - start)
    return samples


def _rate(client: _Client, size: int) -> float:
    start = time.perf_counter()
    got = client.run(f"head -c {size} /dev/zero")
    elapsed = time.perf_counter() - start
    if len(got) != size:
        raise RuntimeError(f"{client.name} streamed {len(got)} of {size} bytes")
    return size / elapsed / 1e6


def _stop_sample(client: _Client) -> list[float]:
    """Seconds from the stop to the end of the command's ``sleep 600`` child."""
    with tempfile.TemporaryDirectory() as scratch:
        pid_file = os.path.join(scratch, "child")
        command = f"sleep 600 & echo $! > {pid_file}; sleep 600"
        runner = threading.Thread(
            target=client.stop, args=(command, _STOP_AFTER), name="bench-sandboxd-stop"
        )
        runner.start()
        child = _child(pid_file)
        watched = time.monotonic()
        while _alive(child) and time.monotonic() - watched < _GONE_WITHIN:
            time.sleep(0.001)
        gone = time.monotonic()
        runner.join(_GONE_WITHIN)
    stopped_at = getattr(runner, "stopped_at", None)
    if not isinstance(stopped_at, float) or _alive(child):
        raise RuntimeError(f"{client.name}: the command's child outlived its stop")
    return [gone - stopped_at]


def _child(pid_file: str) -> int:
    deadline = time.monotonic() + _GONE_WITHIN
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError), open(pid_file) as text:
            return int(text.read().strip())
        time.sleep(0.001)
    raise RuntimeError("the command never wrote its child's pid")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(") ", 1)[-1][:1] != "Z"
    except OSError:
        return False


def _ours(
    name: str, url: str, workspace: str, stack: contextlib.ExitStack, proxy: str | None = None
) -> _Client:
    from piship_remote import activate_sandbox
    from piship_remote.backends.kubernetes.backend import KubernetesAgentSandboxBackend

    backend = KubernetesAgentSandboxBackend(
        endpoint=url,
        router=url,
        template=WARM_POOL,
        namespace=NAMESPACE,
        poll_interval=0.05,
        sandboxd_proxy=None if proxy is None else f"grpc://{proxy}",
    )
    stack.callback(backend.close)
    sandbox = activate_sandbox(_ALLOW, backend=backend, workspace=workspace, env={})
    stack.callback(sandbox.dispose)

    def execute(command: str) -> bytes:
        out = bytearray()
        sandbox.exec(command, on_data=out.extend)
        return bytes(out)

    def stop(command: str, after: float) -> None:
        cancel = threading.Event()

        def fire() -> None:
            _mark_stop_on(runner)
            cancel.set()

        runner = threading.current_thread()
        timer = threading.Timer(after, fire)
        timer.start()
        with contextlib.suppress(Exception):
            sandbox.exec(command, cancel=cancel)
        timer.cancel()

    return _Client(name, "ours", execute, stop)


def _mark_stop_on(thread: threading.Thread) -> None:
    thread.stopped_at = time.monotonic()  # type: ignore[attr-defined]


def _raw_start(server: Any, stack: contextlib.ExitStack) -> _Client:
    """The floor: a bare gRPC ``Start`` on the claim's forwarded listener, no library."""
    import grpc

    from piship_remote._sandboxd import process_pb2 as pb
    from piship_remote._sandboxd.process_rpc import ProcessStub
    from piship_remote.backends.kubernetes.backend import KubernetesAgentSandboxBackend
    from piship_remote.model.policy import SandboxProfile

    backend = KubernetesAgentSandboxBackend(
        endpoint=server.url, router=server.url, template=WARM_POOL, namespace=NAMESPACE
    )
    stack.callback(backend.close)
    instance = backend.prepare(SandboxProfile(workspace=".", network="allow"))  # its claim
    stack.callback(instance.dispose)
    claim = instance.claim().name
    _, _, port = server.sandboxd_address(claim)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stack.callback(channel.close)
    stub = ProcessStub(channel)

    def start(command: str) -> Any:
        config = pb.ProcessConfig(command=["/bin/sh", "-c", command])
        return stub.start(pb.StartRequest(config=config))

    def execute(command: str) -> bytes:
        out = bytearray()
        for event in start(command):
            out += event.stdout
        return bytes(out)

    def stop(command: str, after: float) -> None:
        runner = threading.current_thread()
        call = start(command)
        pid = next(call).init.process_id

        def fire() -> None:
            _mark_stop_on(runner)
            stub.send_signal(pb.SendSignalRequest(process_id=pid, signal=pb.SIGNAL_SIGKILL))

        threading.Timer(after, fire).start()
        with contextlib.suppress(grpc.RpcError):
            for _ in call:
                pass

    return _Client("grpc-start-raw", "floor", execute, stop)


def _official(server: Any, stack: contextlib.ExitStack) -> _Client | None:
    try:
        agent_sandbox = importlib.import_module("k8s_agent_sandbox")
        models = importlib.import_module("k8s_agent_sandbox.models")
        kubernetes = importlib.import_module("kubernetes.client")
    except ImportError:
        return None
    configuration = kubernetes.Configuration()
    configuration.host = server.url
    api = kubernetes.ApiClient(configuration)
    stack.callback(api.close)
    route = models.SandboxdInClusterConnectionConfig(mode="in-cluster-pod-ip")
    client = agent_sandbox.SandboxClient(connection_config=route, api_client=api)
    stack.callback(client.delete_all)
    sandbox = client.create_sandbox(WARM_POOL, namespace=NAMESPACE, sandbox_ready_timeout=60)
    _, route.rest_port, route.grpc_port = server.sandboxd_address(sandbox.claim_name)

    def execute(command: str) -> bytes:
        result = sandbox.commands.run(command)
        return str(result.stdout).encode("latin-1", "replace")

    def stop(command: str, after: float) -> None:
        runner = threading.current_thread()
        threading.Timer(after, _mark_stop_on, args=(runner,)).start()
        with contextlib.suppress(Exception):
            sandbox.commands.run(command, command_timeout=after)

    return _Client("k8s-client", "reference", execute, stop)
