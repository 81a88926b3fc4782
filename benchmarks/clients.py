"""The clients the benchmarks compare, behind one small interface.

``Client.run(script, count)`` runs one command to completion; ``count(n)``, when
given, receives the size of every output chunk (text or bytes) as it arrives::

    with contextlib.ExitStack() as stack:
        clients, skipped = e2b_clients(server.url, workspace, stack)
        for client in clients:
            client.run("true")

Ours: ``ours-sandbox`` (``Sandbox.exec`` from :func:`activate_sandbox`) and
``ours-instance`` (the bare backend instance's ``exec``). Reference: ``e2b-sdk``
(``Sandbox.commands.run`` of the official SDK). Floors: ``requests-raw`` (the same
Start request on a kept-alive ``requests.Session``, body read without decoding)
and ``socket-raw`` (the response body read straight from a socket; streams only).
"""

from __future__ import annotations

import contextlib
import importlib
import socket
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import requests
import requests.adapters

from benchmarks.report import Role
from piship_remote.backends.base import ExecRequest, Instance
from piship_remote.backends.e2b.backend import E2bCompatibleBackend
from piship_remote.model.policy import SandboxProfile
from piship_remote.sandbox.activation import Sandbox, activate_sandbox
from piship_remote.wire.connect import connect_envelope

__all__ = [
    "API_KEY",
    "SDK_MISSING",
    "Client",
    "Count",
    "OursInstance",
    "OursSandbox",
    "RawRequests",
    "RawSocket",
    "SdkClient",
    "e2b_clients",
    "kubernetes_clients",
    "load_sdk",
    "quietly",
    "start_body",
    "start_headers",
]

API_KEY = "e2b_" + "0" * 40
ACCESS_TOKEN = "envd-token-1"
SDK_MISSING = "the official E2B SDK is not installed (pip install e2b==2.63.0)"
KUBERNETES_MISSING = "piship_remote.backends.kubernetes.backend is not available"
NAMESPACE = "agents"
WARM_POOL = "bench-pool"
POOL_SIZE = 64
_READ = 256 * 1024
_DENY = {"required": True, "network": {"mode": "deny"}}
_ALLOW = {"required": True, "network": {"mode": "allow"}}

Count = Callable[[int], None]


class Client(Protocol):
    """One way of running a command."""

    name: str
    role: Role

    def run(self, script: str, count: Count | None = None) -> None:
        """Run ``script`` to completion; ``count`` gets each output chunk's size."""
        ...


def _counter(count: Count | None) -> Callable[[Any], None] | None:
    return None if count is None else (lambda chunk: count(len(chunk)))


class OursSandbox:
    """``Sandbox.exec`` of an activated sandbox (the governed path: worker thread, queue)."""

    role: Role = "ours"

    def __init__(self, sandbox: Sandbox, name: str = "ours-sandbox") -> None:
        self.name = name
        self.sandbox = sandbox

    def run(self, script: str, count: Count | None = None) -> None:
        result = self.sandbox.exec(script, on_data=_counter(count))
        if result.exit_code != 0:
            raise RuntimeError(f"{self.name}: exit {result.exit_code}")


class OursInstance:
    """The bare backend instance's ``exec`` (no activation layer)."""

    role: Role = "ours"

    def __init__(self, instance: Instance, workspace: str, name: str = "ours-instance") -> None:
        self.name = name
        self.instance = instance
        self.workspace = workspace

    def request(self, script: str) -> ExecRequest:
        return ExecRequest(script, cwd=self.workspace)

    def run(self, script: str, count: Count | None = None) -> None:
        result = self.instance.exec(self.request(script), on_stdout=_counter(count))
        if result.exit_code != 0:
            raise RuntimeError(f"{self.name}: exit {result.exit_code}")


class SdkClient:
    """The official SDK's ``commands.run``: its defaults, or no retention for streams."""

    name = "e2b-sdk"
    role: Role = "reference"

    def __init__(self, sdk_sandbox: Any) -> None:
        self.sdk = sdk_sandbox

    def run(self, script: str, count: Count | None = None) -> None:
        if count is None:
            self.sdk.commands.run(script)
        else:
            self.sdk.commands.run(script, on_stdout=_counter(count), retain_output=False, timeout=0)


def start_body(script: str, tag: str | None = None) -> bytes:
    """The Start request envelope the official SDK sends (plus a tag when given)."""
    start: dict[str, Any] = {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", script]}}
    start["stdin"] = False
    if tag is not None:
        start["tag"] = tag
    return connect_envelope(start)


def start_headers() -> dict[str, str]:
    """The Start headers both clients send, minus the optional ones."""
    return {
        "Content-Type": "application/connect+json",
        "Connect-Protocol-Version": "1",
        "X-Access-Token": ACCESS_TOKEN,
        "Keepalive-Ping-Interval": "50",
    }


def pooled_session() -> requests.Session:
    """A ``requests.Session`` whose pool holds :data:`POOL_SIZE` connections per host."""
    session = requests.Session()
    adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=POOL_SIZE)
    session.mount("http://", adapter)
    return session


class RawRequests:
    """The floor: the same Start on a kept-alive session, its body read but not decoded."""

    name = "requests-raw"
    role: Role = "floor"

    def __init__(self, envd: str) -> None:
        self.url = f"{envd}/process.Process/Start"
        self.session = pooled_session()
        self.headers = start_headers()

    def run(self, script: str, count: Count | None = None) -> None:
        body = start_body(script)
        if count is None:
            response = self.session.post(self.url, data=body, headers=self.headers, timeout=60)
            response.close()  # the body was read already (stream=False)
            return
        with self.session.post(
            self.url, data=body, headers=self.headers, stream=True, timeout=60
        ) as response:
            for chunk in response.iter_content(_READ):
                count(len(chunk))


class RawSocket:
    """The physical limit: one connection, the request written once, the body read to EOF."""

    name = "socket-raw"
    role: Role = "floor"

    def __init__(self, envd: str) -> None:
        parts = urllib.parse.urlsplit(envd)
        self.address = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.buffer = bytearray(1024 * 1024)

    def run(self, script: str, count: Count | None = None) -> None:
        body = start_body(script)
        head = "".join(
            [
                "POST /process.Process/Start HTTP/1.1\r\n",
                f"Host: {self.address[0]}:{self.address[1]}\r\n",
                *(f"{name}: {value}\r\n" for name, value in start_headers().items()),
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n",
            ]
        )
        view = memoryview(self.buffer)
        with socket.create_connection(self.address) as sock:
            sock.sendall(head.encode() + body)
            while received := sock.recv_into(view):
                if count is not None:
                    count(received)


def load_sdk() -> Any | None:
    """The ``e2b`` module, or ``None`` when it is not installed."""
    try:
        return importlib.import_module("e2b")
    except ImportError:
        return None


def e2b_clients(
    url: str,
    workspace: str,
    stack: contextlib.ExitStack,
    *,
    names: Iterable[str] = ("ours-sandbox", "ours-instance", "e2b-sdk", "requests-raw"),
) -> tuple[list[Client], list[str]]:
    """The named clients against the E2B service at ``url``, each warmed up with one command.

    Everything they hold is released by ``stack``. A client that cannot be set up is
    left out and named in the second list, with why.
    """
    makers: dict[str, Callable[[], Client]] = {
        "ours-sandbox": lambda: _ours_sandbox(url, workspace, stack),
        "ours-instance": lambda: _ours_instance(url, workspace, stack),
        "e2b-sdk": lambda: _sdk(url, stack),
        "requests-raw": lambda: _raw_requests(url, stack),
        "socket-raw": lambda: RawSocket(url),
    }
    clients: list[Client] = []
    skipped: list[str] = []
    for name in names:
        try:
            client = makers[name]()
            client.run("true")
        except _Skip as skip:
            skipped.append(f"{name}: {skip}")
            continue
        except Exception as error:
            skipped.append(f"{name}: setup failed: {type(error).__name__}: {error}")
            continue
        clients.append(client)
    return clients, skipped


class _Skip(Exception):
    """A client that cannot run here, and why."""


def ours_backend(url: str, stack: contextlib.ExitStack) -> E2bCompatibleBackend:
    """Our E2B backend against ``url`` (control plane and envd), closed by ``stack``."""
    backend = E2bCompatibleBackend(endpoint=url, envd_url=url, credential=lambda: API_KEY)
    stack.callback(backend.close)
    return backend


def _ours_sandbox(url: str, workspace: str, stack: contextlib.ExitStack) -> OursSandbox:
    backend = ours_backend(url, stack)
    sandbox = activate_sandbox(_DENY, backend=backend, workspace=workspace, env={})
    stack.callback(sandbox.dispose)
    return OursSandbox(sandbox)


def _ours_instance(url: str, workspace: str, stack: contextlib.ExitStack) -> OursInstance:
    backend = ours_backend(url, stack)
    instance = backend.prepare(SandboxProfile(workspace=workspace))
    stack.callback(instance.dispose)
    return OursInstance(instance, workspace)


def sdk_sandbox(url: str, stack: contextlib.ExitStack) -> Any:
    """An official-SDK sandbox on the service at ``url``, killed by ``stack``."""
    sdk = load_sdk()
    if sdk is None:
        raise _Skip(SDK_MISSING)
    sandbox = sdk.Sandbox.create(
        api_key=API_KEY, api_url=url, sandbox_url=url, validate_api_key=False
    )
    stack.callback(quietly, sandbox.kill)
    return sandbox


def _sdk(url: str, stack: contextlib.ExitStack) -> SdkClient:
    return SdkClient(sdk_sandbox(url, stack))


def _raw_requests(url: str, stack: contextlib.ExitStack) -> RawRequests:
    client = RawRequests(url)
    stack.callback(client.session.close)
    return client


# -- Kubernetes -------------------------------------------------------------------------


class RawExecute:
    """The Kubernetes floor: ``POST /execute`` on a kept-alive session, answer read."""

    name = "requests-raw"
    role: Role = "floor"

    def __init__(self, router: str) -> None:
        self.url = f"{router}/execute"
        self.session = pooled_session()
        self.headers = {"X-Sandbox-ID": "pool-bench", "X-Sandbox-Namespace": NAMESPACE}

    def run(self, script: str, count: Count | None = None) -> None:
        response = self.session.post(
            self.url, json={"command": script}, headers=self.headers, timeout=60
        )
        if count is not None:
            count(len(response.content))


def kubernetes_backend(url: str, stack: contextlib.ExitStack) -> Any:
    """Our Kubernetes backend against the mock cluster at ``url`` (API and router)."""
    try:
        module = importlib.import_module("piship_remote.backends.kubernetes.backend")
    except ImportError as error:
        raise _Skip(f"{KUBERNETES_MISSING}: {error}") from None
    backend = module.KubernetesAgentSandboxBackend(
        endpoint=url, router=url, template=WARM_POOL, namespace=NAMESPACE, poll_interval=0.05
    )
    close = getattr(backend, "close", None)
    if callable(close):
        stack.callback(close)
    return backend


def kubernetes_clients(
    url: str, workspace: str, stack: contextlib.ExitStack
) -> tuple[list[Client], list[str]]:
    """``ours-sandbox`` (activated on our Kubernetes backend) and the raw ``/execute`` floor."""
    clients: list[Client] = []
    skipped: list[str] = []
    try:
        backend = kubernetes_backend(url, stack)
        sandbox = activate_sandbox(_ALLOW, backend=backend, workspace=workspace, env={})
        stack.callback(sandbox.dispose)
        ours = OursSandbox(sandbox)
        ours.run("true")
        clients.append(ours)
    except _Skip as skip:
        skipped.append(f"ours-sandbox: {skip}")
    except Exception as error:
        skipped.append(f"ours-sandbox: setup failed: {type(error).__name__}: {error}")
    raw = RawExecute(url)
    stack.callback(raw.session.close)
    clients.append(raw)
    return clients, skipped


def activate_kubernetes(backend: Any, workspace: str) -> Sandbox:
    """Activate ``backend`` (network allow, the only mode it offers)."""
    return activate_sandbox(_ALLOW, backend=backend, workspace=workspace, env={})


def activate_e2b(backend: E2bCompatibleBackend, workspace: str) -> Sandbox:
    """Activate ``backend`` with network deny and an empty host environment."""
    return activate_sandbox(_DENY, backend=backend, workspace=workspace, env={})


def quietly(action: Callable[[], object]) -> None:
    """``action()``, any exception dropped (cleanup of a scenario's sandboxes)."""
    with contextlib.suppress(Exception):
        action()
