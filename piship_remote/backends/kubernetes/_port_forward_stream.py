"""One port-forward stream: a pod's port reached through the API server over WebSocket.

The ``portforward`` subresource of a pod speaks ``v4.channel.k8s.io``: for the one
port asked for, channel 0 carries its data and channel 1 its errors; every message
starts with its channel's byte, and each channel's first two bytes are the port
number (little endian), which are not data::

    socket_ = dial(Dial(url, bearer, ssl_context), timeout=30.0)    # DialRefused
    relay = Relay(socket_, local_connection, name="piship-router-tunnel-3")
    relay.run()          # until either side ends; relay.stop() from another thread

Needs the ``websocket-client`` package (the ``kubernetes`` extra), imported here
only when a stream is opened.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Any

import attrs

from piship_remote.model.errors import ConfigInvalid

__all__ = ["PROTOCOL", "Dial", "DialRefused", "Relay", "dial", "require_websocket_client"]

PROTOCOL = "v4.channel.k8s.io"
_DATA, _ERROR = 0, 1
_PORT_PREFIX = 2
_PIECE = 64 * 1024


@attrs.frozen
class Dial:
    """Where and how to open one stream: ``wss://…/portforward?ports=N``."""

    url: str
    bearer: str | None = attrs.field(repr=False)
    ssl_context: ssl.SSLContext | None = attrs.field(repr=False)


class DialRefused(Exception):
    """The API server refused the upgrade (``status``), or could not be reached (0)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


def dial(target: Dial, *, timeout: float) -> Any:
    """An open WebSocket to ``target`` speaking :data:`PROTOCOL`, or :class:`DialRefused`."""
    websocket = _websocket_module()
    header = [f"Authorization: Bearer {target.bearer}"] if target.bearer else []
    sslopt = {"context": target.ssl_context} if target.ssl_context is not None else {}
    try:
        connection = websocket.create_connection(
            target.url,
            timeout=timeout,
            header=header,
            subprotocols=[PROTOCOL],
            sslopt=sslopt,
            enable_multithread=True,
        )
    except websocket.WebSocketBadStatusException as refused:
        raise DialRefused(refused.status_code, _refusal(refused)) from None
    except (websocket.WebSocketException, OSError) as error:
        raise DialRefused(0, _short(error)) from None
    finally:
        header.clear()  # no traceback's locals hold the bearer
    if connection.getsubprotocol() != PROTOCOL:
        connection.close()
        raise DialRefused(0, f"the API server does not speak {PROTOCOL}")
    connection.settimeout(None)
    return connection


class Relay:
    """Copies bytes both ways between a local connection and an open stream.

    ``run()`` sends what the local side writes (on the calling thread) and starts a
    ``<name>-down`` thread for what comes back; it returns once both ended.
    ``error`` holds the API server's message on the error channel, if any, and
    ``answered`` whether any byte came back; an error before any answer is given to
    ``refused(local, message, drain=False)`` to answer the local side.
    """

    def __init__(
        self,
        stream: Any,
        local: socket.socket,
        *,
        name: str,
        refused: Callable[..., None],
    ) -> None:
        self._stream = stream
        self._local = local
        self._name = name
        self._refused = refused
        self._prefix = {_DATA: _PORT_PREFIX, _ERROR: _PORT_PREFIX}
        self.error = ""
        self.answered = False

    def run(self) -> None:
        down = threading.Thread(target=self._down, name=f"{self._name}-down", daemon=True)
        down.start()
        try:
            while piece := self._local.recv(_PIECE):
                self._stream.send_binary(bytes([_DATA]) + piece)
        except Exception:  # the stream or the local side ended: both end
            pass
        finally:
            self.stop()
            down.join()

    def stop(self) -> None:
        """End both sides now (from any thread)."""
        with contextlib.suppress(OSError):
            self._local.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):
            self._stream.shutdown()

    def _down(self) -> None:
        opcodes = _websocket_module().ABNF
        try:
            while True:
                opcode, message = self._stream.recv_data()
                if opcode == opcodes.OPCODE_CLOSE or not message:
                    break
                if opcode != opcodes.OPCODE_BINARY:
                    continue
                channel, data = message[0], self._unprefixed(message[0], message[1:])
                if channel == _DATA and data:
                    self.answered = True
                    self._local.sendall(data)
                elif channel == _ERROR and data:
                    self.error += data.decode("utf-8", "replace")
                    if not self.answered:  # nothing reached the router: say so
                        self._refused(self._local, self.error, drain=False)
                    break
        except Exception:  # the stream or the local side ended: both end
            pass
        finally:
            self.stop()

    def _unprefixed(self, channel: int, data: bytes) -> bytes:
        left = self._prefix.get(channel, 0)
        if left:
            self._prefix[channel] = max(0, left - len(data))
            data = data[left:]
        return data


def _refusal(refused: Any) -> str:
    """``HTTP <status>: <the Status message>`` of a refused upgrade."""
    body = getattr(refused, "resp_body", None) or b""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    message = parsed.get("message") if isinstance(parsed, dict) else None
    detail = message if isinstance(message, str) else text
    return f"HTTP {refused.status_code}: {_short(detail)}".rstrip(": ")


def _short(error: object) -> str:
    return " ".join(str(error).split())[:200] or type(error).__name__


def require_websocket_client() -> None:
    """``CONFIG_INVALID`` naming the extra when websocket-client is not installed."""
    _websocket_module()


def _websocket_module() -> Any:
    try:
        import websocket  # type: ignore[import-untyped, import-not-found, unused-ignore]
    except ImportError:
        raise ConfigInvalid(
            "reaching the sandbox router by port-forward needs the websocket-client package",
            user_action="pip install 'piship-remote[kubernetes]'",
        ) from None
    return websocket
