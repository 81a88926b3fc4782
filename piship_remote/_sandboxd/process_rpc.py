"""The methods of sandboxd's ``process.v1.ProcessService``, bound by hand to the messages
of :mod:`.process_pb2` (their package is this library's own, see ``process.proto``)::

    stub = ProcessStub(grpc.insecure_channel("127.0.0.1:9090"))
    for event in stub.start(StartRequest(config=ProcessConfig(command=["sh", "-c", "ls"]))):
        ...
    server.add_generic_rpc_handlers((service_handler(servicer),))   # the double's side
"""

from __future__ import annotations

from typing import Any, Protocol

try:
    import grpc

    from piship_remote._sandboxd import process_pb2 as pb
except ImportError as missing:  # the sandboxd extra
    raise ImportError(
        f"sandboxd needs grpcio and protobuf ({missing}): pip install 'piship-remote[sandboxd]'"
    ) from missing

__all__ = ["SERVICE", "ProcessServicer", "ProcessStub", "service_handler"]

SERVICE = "process.v1.ProcessService"
_METHODS: dict[str, tuple[Any, Any, bool]] = {
    "Start": (pb.StartRequest, pb.StartResponse, True),
    "Execute": (pb.ExecuteRequest, pb.ExecuteResponse, False),
    "WriteStdin": (pb.WriteStdinRequest, pb.WriteStdinResponse, False),
    "SendSignal": (pb.SendSignalRequest, pb.SendSignalResponse, False),
    "ResizeTTY": (pb.ResizeTTYRequest, pb.ResizeTTYResponse, False),
}


class ProcessStub:
    """The client side: one callable per method, on ``channel``."""

    def __init__(self, channel: grpc.Channel) -> None:
        def bound(name: str) -> Any:
            request, response, streams = _METHODS[name]
            make = channel.unary_stream if streams else channel.unary_unary
            return make(
                f"/{SERVICE}/{name}",
                request_serializer=request.SerializeToString,
                response_deserializer=response.FromString,
            )

        self.start = bound("Start")
        self.execute = bound("Execute")
        self.write_stdin = bound("WriteStdin")
        self.send_signal = bound("SendSignal")
        self.resize_tty = bound("ResizeTTY")


class ProcessServicer(Protocol):
    """The server side: a method per RPC, as grpc calls them (request, context)."""

    def Start(self, request: pb.StartRequest, context: grpc.ServicerContext) -> Any: ...

    def Execute(
        self, request: pb.ExecuteRequest, context: grpc.ServicerContext
    ) -> pb.ExecuteResponse: ...

    def WriteStdin(
        self, request: pb.WriteStdinRequest, context: grpc.ServicerContext
    ) -> pb.WriteStdinResponse: ...

    def SendSignal(
        self, request: pb.SendSignalRequest, context: grpc.ServicerContext
    ) -> pb.SendSignalResponse: ...

    def ResizeTTY(
        self, request: pb.ResizeTTYRequest, context: grpc.ServicerContext
    ) -> pb.ResizeTTYResponse: ...


def service_handler(servicer: ProcessServicer) -> grpc.GenericRpcHandler:
    """``servicer``'s methods as the service's, for ``server.add_generic_rpc_handlers``."""
    handlers = {}
    for name, (request, response, streams) in _METHODS.items():
        make = (
            grpc.unary_stream_rpc_method_handler if streams else grpc.unary_unary_rpc_method_handler
        )
        handlers[name] = make(
            getattr(servicer, name),
            request_deserializer=request.FromString,
            response_serializer=response.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(SERVICE, handlers)
