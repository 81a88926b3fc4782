"""Where an exec's time goes at 0 ms: ours with and without its lease renewal, against the SDK.

Run on its own (not a scenario of the harness)::

    python -m benchmarks.exec_split --commands 2000

On the fast loopback server, on the main thread, in alternating rounds, the p50 of
``exec("true")`` for:

- ``ours-sandbox`` and ``ours-instance`` as they are (a renewal and a Start per command);
- the same with the renewal left out (``-no-renewal``): ``SandboxLease.cover`` replaced,
  in this process only, by a bare send of Start. The library never skips the renewal
  (every command renews its sandbox, before Start is on the wire); the difference
  is what the renewal costs a command;
- ``e2b-sdk`` (the reference: one request per command);
- ``raw-renewal-and-start``: the floor of our two requests, written as fixed bytes on
  two kept-alive sockets and read with no parsing beyond the ends.

Printed: each client's p50 and its ratio to the SDK's.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import statistics
import tempfile
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs

from benchmarks.clients import e2b_clients, start_body, start_headers
from benchmarks.loopback import LoopbackServer
from benchmarks.rounds import alternate, timed
from piship_remote.backends.e2b._lease import SandboxLease

__all__ = ["main"]

_COMMAND = "true"
_BATCH = 50
_WARM_UP = 100
_STREAM_END = b"0\r\n\r\n"
_HEAD_END = b"\r\n\r\n"


@attrs.define
class _Client:
    name: str
    run: Callable[[], object]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.exec_split", description=__doc__)
    parser.add_argument("--commands", type=int, default=2000, help="per client")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        workspace = stack.enter_context(tempfile.TemporaryDirectory(prefix="piship-split-"))
        server = stack.enter_context(LoopbackServer())
        clients = _clients(server.url, workspace, stack)
        for client in clients:
            for _ in range(_WARM_UP):
                client.run()
        samples = alternate(
            clients,
            rounds=max(1, args.commands // _BATCH),
            measure=lambda client: [timed(client.run) for _ in range(_BATCH)],
        )
    sdk = statistics.median(samples["e2b-sdk"]) if samples.get("e2b-sdk") else None
    for name, values in samples.items():
        p50 = statistics.median(values)
        ratio = f"{p50 / sdk:.2f}x SDK" if sdk else "-"
        print(f"{name:28s} p50 {p50 * 1e6:7.0f} us   {ratio}")


def _clients(url: str, workspace: str, stack: contextlib.ExitStack) -> list[_Client]:
    found, skipped = e2b_clients(
        url, workspace, stack, names=("ours-sandbox", "ours-instance", "e2b-sdk")
    )
    for reason in skipped:
        print(f"skipped: {reason}")
    clients: list[_Client] = []
    for client in found:
        clients.append(_Client(client.name, _command(client.run)))
        if client.name != "e2b-sdk":
            clients.append(_Client(f"{client.name}-no-renewal", _without_renewal(client.run)))
    clients.append(_Client("raw-renewal-and-start", _raw_pair(url, stack)))
    return clients


def _command(run: Callable[[str], object]) -> Callable[[], object]:
    return lambda: run(_COMMAND)


def _without_renewal(run: Callable[[str], object]) -> Callable[[], object]:
    def bare(self: SandboxLease, send: Callable[[], Any], cancel: object, **_: object) -> Any:
        return send()

    def run_bare() -> object:
        with _replaced(SandboxLease, "cover", bare):
            return run(_COMMAND)

    return run_bare


@contextlib.contextmanager
def _replaced(owner: type, name: str, value: object) -> Iterator[None]:
    kept = owner.__dict__[name]
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, kept)


def _raw_pair(url: str, stack: contextlib.ExitStack) -> Callable[[], None]:
    """A renewal and a Start as fixed bytes on two kept-alive sockets, read to their ends."""
    parts = urllib.parse.urlsplit(url)
    address = (parts.hostname or "127.0.0.1", parts.port or 80)
    host = f"Host: {address[0]}:{address[1]}\r\n"
    renewal_body = b'{"timeout":3600}'
    renewal = (
        "POST /sandboxes/sbx1/timeout HTTP/1.1\r\n"
        f"{host}Content-Type: application/json\r\nContent-Length: {len(renewal_body)}\r\n\r\n"
    ).encode() + renewal_body
    start_body_bytes = start_body(_COMMAND)
    start = (
        "POST /process.Process/Start HTTP/1.1\r\n"
        + host
        + "".join(f"{name}: {value}\r\n" for name, value in start_headers().items())
        + f"Content-Length: {len(start_body_bytes)}\r\n\r\n"
    ).encode() + start_body_bytes
    control, envd = (_kept_socket(address, stack) for _ in range(2))

    def run() -> None:
        control.sendall(renewal)
        envd.sendall(start)
        _read_until(envd, _STREAM_END)
        _read_until(control, _HEAD_END)

    return run


def _kept_socket(address: tuple[str, int], stack: contextlib.ExitStack) -> socket.socket:
    sock = stack.enter_context(socket.create_connection(address))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read_until(sock: socket.socket, end: bytes) -> None:
    received = b""
    while not received.endswith(end):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the loopback server closed the connection")
        received += chunk


if __name__ == "__main__":
    main()
