"""The sandboxes' own ports, reached through the service: E2B's ``<port>-<id>.<domain>`` hosts.

A request whose ``Host`` is ``<port>-<sandbox id>.localhost:<service port>`` (what
the SDKs' ``get_host(port)`` names), or that carries ``E2b-Sandbox-Id`` with an
``E2b-Sandbox-Port`` other than envd's, is handed whole to that port on the
sandbox's own loopback: the sandbox's agent connects from inside its network
namespace (with the network denied or allowed) and passes the socket out, and the
connection is spliced to it, WebSocket upgrades included::

    ports = SandboxPorts(registry)
    server = HttpServer(route, tunnel=ports.tunnel)

A sandbox created with ``network.allowPublicTraffic: false`` answers only requests
carrying its ``E2b-Traffic-Access-Token``; any sandbox refuses a request carrying
another sandbox's token (traffic or envd ``X-Access-Token``). Without either, as on
E2B, a port is public (here: to the host's loopback). A paused sandbox created with
``autoResume`` is resumed by such a request once its tokens are checked; otherwise
it, an unknown sandbox and a port nothing listens on are answered 502 as E2B's edge
does.
"""

from __future__ import annotations

import hmac
import json
import socket
from collections.abc import Mapping

from piship_remote._http_server.messages import Head, Reply
from piship_remote.local.envd.router import ENVD_PORT
from piship_remote.local.isolation.agent_link import DialFailed
from piship_remote.local.sandbox.pause import Paused
from piship_remote.local.sandbox.registry import Registry, Sandbox, SandboxGone

__all__ = ["ENVD_PORT", "SandboxPorts", "port_target"]

TRAFFIC_TOKEN_HEADER = "e2b-traffic-access-token"


def port_target(headers: Mapping[str, str]) -> tuple[int, str] | None:
    """The (port, sandbox id) a request is for, when it is for a sandbox port but envd's."""
    port_text = headers.get("e2b-sandbox-port", "")
    sandbox_id = headers.get("e2b-sandbox-id", "")
    if not (port_text and sandbox_id):
        label = headers.get("host", "").partition(".")[0]
        port_text, _, sandbox_id = label.partition("-")
    if not (port_text.isdigit() and sandbox_id) or len(port_text) > 5:
        return None
    port = int(port_text)
    return None if port == ENVD_PORT or not 0 < port < 65536 else (port, sandbox_id)


class SandboxPorts:
    """Connects requests for a sandbox port to it (the HTTP server's ``tunnel``)."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    def tunnel(self, head: Head) -> socket.socket | Reply | None:
        """A socket connected to the port the request names, the refusal, or ``None``."""
        target = port_target(head.headers)
        if target is None:
            return None
        port, sandbox_id = target
        known = self._registry.lookup(sandbox_id)
        if known is None:
            return _answer(502, sandbox_id, port, "The sandbox was not found")
        if not _admitted(known, head.headers):  # before an autoResume sandbox is resumed
            return _answer(403, sandbox_id, port, "Invalid or missing traffic access token")
        sandbox = self._registry.get(sandbox_id)
        if sandbox is None:
            return _answer(502, sandbox_id, port, "The sandbox was not found")
        try:
            return sandbox.dial(port)
        except DialFailed:
            return _answer(502, sandbox_id, port, "The sandbox is running but port is not open")
        except (SandboxGone, Paused, OSError):
            return _answer(502, sandbox_id, port, "The sandbox was not found")


def _admitted(sandbox: Sandbox, headers: Mapping[str, str]) -> bool:
    """Whether the request carries this sandbox's tokens only (its traffic one if it has one)."""
    traffic = headers.get(TRAFFIC_TOKEN_HEADER)
    envd = headers.get("x-access-token")
    expected = sandbox.traffic_access_token
    if traffic is None:
        traffic_ok = expected is None
    else:
        traffic_ok = expected is not None and _same(traffic, expected)
    return traffic_ok and (envd is None or _same(envd, sandbox.access_token))


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def _answer(status: int, sandbox_id: str, port: int, message: str) -> Reply:
    body = {"code": status, "message": message, "sandboxId": sandbox_id, "port": port}
    return Reply(status, json.dumps(body).encode(), "application/json")
