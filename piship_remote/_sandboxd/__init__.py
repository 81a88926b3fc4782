"""sandboxd's ProcessService on the wire: this library's own ``process.proto``, the message
classes made from it (``process_pb2``, checked in: see their header for the command), and
the service's methods bound by hand (:mod:`.process_rpc`).

Checked in rather than made at build: the package then installs from a plain source tree
with no protobuf compiler, and a change to the messages shows in review. Needs the
``sandboxd`` extra (grpcio, protobuf); nothing outside the modules that use it imports this.
"""
