"""The fake router's ways to a sandbox pod's sandboxd, beside the pod's port-forward: a gRPC
proxy on a loopback port of its own, and sandboxd's REST surface through the router's HTTP.

Both route as the router routes HTTP: ``X-Sandbox-ID`` (the Sandbox, whose pod it is) and
``X-Sandbox-Namespace``, as gRPC metadata or HTTP headers, and ``X-Sandbox-Port`` for REST
(sandboxd's 8080). A sandbox the router cannot reach is ``UNAVAILABLE`` (gRPC) or a 502
``{"detail": "Could not connect to the backend sandbox: <id>"}``; ``cluster.router_token``
is checked as on the router's other paths (``UNAUTHENTICATED``)::

    proxy = SandboxdProxy(pods, live)
    proxy.address                      # "127.0.0.1:<port>", the gRPC proxy
    response = rest(request, pods, live)   # a /v1/... request through the router, or None
    proxy.close()

Needs the ``sandboxd`` extra (grpcio).
"""

from __future__ import annotations

import http.client
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

from werkzeug import Request, Response

from piship_remote.testing.recorder import THREAD_PREFIX, json_response

try:
    import grpc

    from piship_remote._sandboxd.process_rpc import SERVICE
except ImportError as missing:  # the sandboxd extra
    raise ImportError(
        f"sandboxd needs grpcio and protobuf ({missing}): pip install 'piship-remote[sandboxd]'"
    ) from missing

from piship_remote.testing.k8s_sandboxd import REST_PORT, SandboxdPods

__all__ = ["Live", "SandboxdProxy", "rest"]

Live = Callable[[str, str], bool]
"""``(namespace, sandbox)`` → whether the router reaches that sandbox's pod now."""
_STREAMING = {"Start"}
_REST_TIMEOUT = 60.0


def _identity(data: bytes) -> bytes:
    return data


class _Routes(grpc.GenericRpcHandler):  # type: ignore[misc]
    def __init__(self, proxy: SandboxdProxy) -> None:
        self._proxy = proxy

    def service(self, details: Any) -> Any:
        service, _, method = details.method.lstrip("/").partition("/")
        if service != SERVICE:
            return None
        forward = self._proxy.forward(details.method, method in _STREAMING)
        make = (
            grpc.unary_stream_rpc_method_handler
            if method in _STREAMING
            else grpc.unary_unary_rpc_method_handler
        )
        return make(forward, request_deserializer=_identity, response_serializer=_identity)


class SandboxdProxy:
    """The router's gRPC proxy: each call forwarded whole to the pod its metadata names."""

    def __init__(self, pods: SandboxdPods, live: Live, token: Callable[[], str | None]) -> None:
        self._pods = pods
        self._live = live
        self._token = token
        self._channels: dict[int, Any] = {}
        self._workers = ThreadPoolExecutor(
            max_workers=32, thread_name_prefix=f"{THREAD_PREFIX}grpc-proxy"
        )
        self._server = grpc.server(self._workers)
        self._server.add_generic_rpc_handlers((_Routes(self),))
        self.address = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def forward(self, method: str, streams: bool) -> Callable[[bytes, Any], Any]:
        def unary(request: bytes, context: Any) -> Any:
            channel, metadata = self._route(context)
            call = channel.unary_unary(method, _identity, _identity).future(
                request, metadata=metadata
            )
            context.add_callback(call.cancel)
            try:
                return call.result()
            except grpc.RpcError as error:
                context.abort(error.code(), error.details())

        def stream(request: bytes, context: Any) -> Iterator[bytes]:
            channel, metadata = self._route(context)
            call = channel.unary_stream(method, _identity, _identity)(request, metadata=metadata)
            context.add_callback(call.cancel)
            try:
                yield from call
            except grpc.RpcError as error:
                if context.is_active():
                    context.abort(error.code(), error.details())

        return stream if streams else unary

    def _route(self, context: Any) -> tuple[Any, tuple[tuple[str, str], ...]]:
        metadata = dict(context.invocation_metadata())
        token = self._token()
        if token is not None and metadata.get("authorization") != f"Bearer {token}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "the router's token is required")
        sandbox = metadata.get("x-sandbox-id", "")
        namespace = metadata.get("x-sandbox-namespace", "default")
        if not sandbox or not self._live(namespace, sandbox):
            context.abort(
                grpc.StatusCode.UNAVAILABLE, f"Could not connect to the backend sandbox: {sandbox}"
            )
        port = self._pods.pod(sandbox).grpc_port
        channel = self._channels.get(port)
        if channel is None:
            channel = self._channels[port] = grpc.insecure_channel(f"127.0.0.1:{port}")
        passed = tuple((k, v) for k, v in metadata.items() if not k.startswith(("x-", "author")))
        return channel, passed

    def close(self) -> None:
        self._server.stop(grace=None).wait(5.0)
        self._workers.shutdown(wait=True, cancel_futures=True)  # its threads end with it
        for channel in self._channels.values():
            channel.close()


def rest(
    request: Request, pods: SandboxdPods, live: Live, headers: Mapping[str, str]
) -> Response | None:
    """A request for sandboxd's REST surface through the router (``X-Sandbox-Port`` its
    REST port, a ``/v1/`` path), forwarded to the pod; ``None`` for any other request."""
    if not request.path.startswith("/v1/") or headers.get("x-sandbox-port") != str(REST_PORT):
        return None
    sandbox = headers.get("x-sandbox-id", "")
    if not sandbox or not live(headers.get("x-sandbox-namespace", "default"), sandbox):
        detail = f"Could not connect to the backend sandbox: {sandbox}"
        return json_response(502, {"detail": detail})
    pod = pods.pod(sandbox)
    connection = http.client.HTTPConnection("127.0.0.1", pod.rest_port, timeout=_REST_TIMEOUT)
    try:
        target = quote(request.path, safe="/")
        if request.query_string:
            target += "?" + request.query_string.decode("latin-1")
        passed = {k: v for k, v in headers.items() if k in ("content-type", "accept-encoding")}
        connection.request(request.method, target, body=request.get_data(), headers=passed)
        answer = connection.getresponse()
        body = answer.read()
    finally:
        connection.close()
    response = Response(body, status=answer.status)
    for name in ("Content-Type", "Content-Length"):
        if answer.getheader(name) is not None:
            response.headers[name] = answer.getheader(name)
    return response
