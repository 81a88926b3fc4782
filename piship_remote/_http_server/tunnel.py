"""A connection handed over whole to an upstream socket: the bytes flow both ways unread.

A route that reaches a server behind the service (a port in a sandbox) answers its
first request's head with a connected socket; the head is sent on as it arrived,
then everything the client sends goes upstream and everything upstream answers
comes back, until either side ends (so WebSocket upgrades and keep-alive requests
pass too)::

    splice(head_bytes, rfile, client, upstream, name="piship-local-tunnel-3")

The client's side is read on the calling thread, the upstream's on a ``name``
thread, joined before :func:`splice` returns. A client that ends its sending
half-closes upstream (which may answer for :data:`CLOSE_GRACE` more seconds); an
upstream that ends cuts the client.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

__all__ = ["splice"]

PIECE = 64 * 1024
CLOSE_GRACE = 2.0
"""How long upstream may go on answering once the client has stopped sending."""


def splice(
    head: bytes, rfile: Any, client: socket.socket, upstream: socket.socket, *, name: str
) -> None:
    """Send ``head`` upstream, then relay both ways until both directions have ended.

    ``rfile`` is the client's buffered reader (it may hold bytes read past the head).
    ``upstream`` is closed here.
    """
    client.settimeout(None)
    upstream.settimeout(None)
    back = threading.Thread(target=_answers, args=(upstream, client), name=name, daemon=True)
    with upstream:
        try:
            upstream.sendall(head)
        except OSError:
            return
        back.start()
        try:
            while piece := rfile.read1(PIECE):
                upstream.sendall(piece)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                upstream.shutdown(socket.SHUT_WR)
            back.join(CLOSE_GRACE)
            with contextlib.suppress(OSError):
                upstream.shutdown(socket.SHUT_RDWR)
            back.join()


def _answers(upstream: socket.socket, client: socket.socket) -> None:
    try:
        while piece := upstream.recv(PIECE):
            client.sendall(piece)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_RDWR)
