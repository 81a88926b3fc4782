"""A server in a local sandbox, reached from the host at ``<port>-<id>.localhost:<service port>``
and at the loopback listener the service opens for the port.

The service hands such a request whole to the port on the sandbox's own loopback
(its agent connects from inside the sandbox's network namespace), with the network
denied or allowed; ``Sandbox.url(port)`` names the port's loopback listener on the local
service and E2B's port host elsewhere.
"""

from __future__ import annotations

import http.client
import socket
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from piship_remote import E2bCompatibleBackend
from piship_remote.local import LocalE2bService
from piship_remote.local.isolation.network import egress_problem
from piship_remote.model.errors import CONFIG_INVALID, PiShipError
from piship_remote.sandbox.activation import Sandbox, activate_sandbox
from piship_remote.testing import E2bServer
from tests.support.local_service import Client, needs_bwrap
from tests.support.seed import kubernetes

pytestmark = pytest.mark.timeout(90)

PAGE = "hello from the sandbox\n"
SERVE_PAGE = (
    "mkdir -p /tmp/site && echo hello from the sandbox > /tmp/site/index.html && cd /tmp/site"
    " && (setsid python3 -m http.server {port} >/dev/null 2>&1 &)"
)
# A server that answers an Upgrade with 101, then echoes each line it gets, upper-cased.
UPGRADE_ECHO = """
import socket
with socket.create_server(("127.0.0.1", {port})) as server:
    open("/tmp/echo.ready", "w").close()
    connection, _ = server.accept()
    with connection:
        head = b""
        while b"\\r\\n\\r\\n" not in head:
            head += connection.recv(1024)
        connection.sendall(b"HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: echo\\r\\n"
                           b"Connection: Upgrade\\r\\n\\r\\n")
        reader = connection.makefile("rb")
        for line in reader:
            connection.sendall(line.upper())
"""
READY_TIMEOUT = 15.0
EXITED_ZERO = {"exited": True, "status": "exit status 0"}


@pytest.fixture(scope="module")
def service() -> Iterator[LocalE2bService]:
    if LocalE2bService.check() is not None:
        pytest.skip(f"bubblewrap cannot run: {LocalE2bService.check()}")
    with LocalE2bService() as running:
        yield running


def service_port(service: LocalE2bService) -> int:
    return int(service.url.rsplit(":", 1)[1])


def get(service: LocalE2bService, host: str, path: str = "/", **headers: str) -> tuple[int, bytes]:
    """GET ``path`` from the service with ``Host: host`` (``*.localhost`` need not resolve here)."""
    connection = http.client.HTTPConnection("127.0.0.1", service_port(service), timeout=10)
    try:
        connection.request("GET", path, headers={"Host": host, **headers})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def port_host(service: LocalE2bService, sandbox: dict[str, Any], port: int) -> str:
    return f"{port}-{sandbox['sandboxID']}.localhost:{service_port(service)}"


def serve_page(client: Client, sandbox: dict[str, Any], port: int = 8000) -> None:
    """Start ``python3 -m http.server`` in the sandbox and wait until it answers there."""
    client.run(sandbox, SERVE_PAGE.format(port=port))
    probe = f"(exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null"
    deadline = time.monotonic() + READY_TIMEOUT
    while client.run(sandbox, probe).end != EXITED_ZERO:
        assert time.monotonic() < deadline, "the server in the sandbox did not start"
        time.sleep(0.1)


def test_a_server_in_the_sandbox_answers_at_its_port_host(
    service: LocalE2bService, client: Client, sandbox: dict[str, Any]
) -> None:
    serve_page(client, sandbox)
    status, body = get(service, port_host(service, sandbox, 8000), "/index.html")
    assert (status, body.decode()) == (200, PAGE)


def test_the_sandbox_routing_headers_reach_the_port_too(
    service: LocalE2bService, client: Client, sandbox: dict[str, Any]
) -> None:
    serve_page(client, sandbox)
    headers = {"E2b-Sandbox-Id": sandbox["sandboxID"], "E2b-Sandbox-Port": "8000"}
    status, body = get(service, f"127.0.0.1:{service_port(service)}", "/index.html", **headers)
    assert (status, body.decode()) == (200, PAGE)


def test_a_port_nothing_listens_on_is_a_502_saying_so(
    service: LocalE2bService, sandbox: dict[str, Any]
) -> None:
    status, body = get(service, port_host(service, sandbox, 8001))
    assert status == 502
    assert b"port is not open" in body


def test_a_port_of_an_unknown_sandbox_is_a_502(service: LocalE2bService) -> None:
    status, body = get(service, f"8000-nosuchsandbox.localhost:{service_port(service)}")
    assert status == 502
    assert b"not found" in body


def test_a_request_with_another_sandboxes_token_is_refused(
    service: LocalE2bService, client: Client, sandbox: dict[str, Any]
) -> None:
    serve_page(client, sandbox)
    other = client.create()
    try:
        host = port_host(service, sandbox, 8000)
        status, _ = get(service, host, **{"X-Access-Token": other["envdAccessToken"]})
        assert status == 403
        assert get(service, host, **{"X-Access-Token": sandbox["envdAccessToken"]})[0] == 200
    finally:
        client.control("DELETE", f"/sandboxes/{other['sandboxID']}")


def test_a_sandbox_without_public_traffic_needs_its_traffic_token(
    service: LocalE2bService, client: Client
) -> None:
    private = client.create(network={"allowPublicTraffic": False})
    try:
        token = private["trafficAccessToken"]
        serve_page(client, private)
        host = port_host(service, private, 8000)
        assert get(service, host)[0] == 403
        assert get(service, host, **{"E2b-Traffic-Access-Token": "0" * len(token)})[0] == 403
        assert get(service, host, **{"E2b-Traffic-Access-Token": token})[0] == 200
    finally:
        client.control("DELETE", f"/sandboxes/{private['sandboxID']}")


def test_an_upgraded_connection_carries_bytes_both_ways(
    service: LocalE2bService, client: Client, sandbox: dict[str, Any]
) -> None:
    script = UPGRADE_ECHO.format(port=9000)
    client.run(sandbox, f"cat > /tmp/echo.py <<'EOF'\n{script}\nEOF")
    client.run(sandbox, "(setsid python3 /tmp/echo.py >/dev/null 2>&1 &)")
    deadline = time.monotonic() + READY_TIMEOUT
    while client.run(sandbox, "test -e /tmp/echo.ready").end != EXITED_ZERO:
        assert time.monotonic() < deadline, "the echo server did not start"
        time.sleep(0.1)
    host = port_host(service, sandbox, 9000)
    upgrade = f"GET /ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n"
    with socket.create_connection(("127.0.0.1", service_port(service)), timeout=10) as raw:
        raw.sendall(upgrade.encode())
        reader = raw.makefile("rb")
        assert reader.readline().startswith(b"HTTP/1.1 101")
        while reader.readline() not in (b"\r\n", b""):
            pass
        raw.sendall(b"first line\n")
        assert reader.readline() == b"FIRST LINE\n"
        raw.sendall(b"second\n")
        assert reader.readline() == b"SECOND\n"


@pytest.mark.skipif(egress_problem() is not None, reason=f"no network stack: {egress_problem()}")
def test_a_sandbox_with_the_network_allowed_serves_its_port_too(
    service: LocalE2bService, client: Client
) -> None:
    networked = client.create(allow_internet_access=True)
    try:
        serve_page(client, networked)
        status, body = get(service, port_host(service, networked, 8000), "/index.html")
        assert (status, body.decode()) == (200, PAGE)
    finally:
        client.control("DELETE", f"/sandboxes/{networked['sandboxID']}")


# -- the client: Sandbox.url(port) ---------------------------------------------------------


@pytest.fixture
def localhost_unresolvable(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process resolves no ``*.localhost`` name, as a stock ``hosts: files dns`` host."""
    resolve = socket.getaddrinfo

    def stock(host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith(".localhost"):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return resolve(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", stock)


def served_sandbox_url(sandbox: Sandbox, port: int = 8000) -> str:
    """``sandbox.url(port)`` once a page is served there (polled until it answers)."""
    assert sandbox.exec(SERVE_PAGE.format(port=port)).exit_code == 0
    url = sandbox.url(port)
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        try:
            with urllib.request.urlopen(url + "/index.html", timeout=10) as answer:
                if answer.status == 200:
                    return url
        except OSError:
            pass
        assert time.monotonic() < deadline, f"no answer at {url}"
        time.sleep(0.1)


@needs_bwrap
def test_sandbox_url_is_a_loopback_address_of_its_own(
    service: LocalE2bService, workspace: Path
) -> None:
    backend = E2bCompatibleBackend(endpoint=service.url, credential=lambda: service.api_key)
    with activate_sandbox({"required": True}, backend=backend, workspace=workspace) as sandbox:
        url = sandbox.url(8000)
        parts = urllib.parse.urlsplit(url)
        assert (parts.scheme, parts.hostname) == ("http", "127.0.0.1")
        assert parts.port != service_port(service)
        assert sandbox.url(8000) == url  # one listener per port


@needs_bwrap
def test_sandbox_url_is_read_by_urllib_where_localhost_names_do_not_resolve(
    service: LocalE2bService, workspace: Path, localhost_unresolvable: None
) -> None:
    backend = E2bCompatibleBackend(endpoint=service.url, credential=lambda: service.api_key)
    with activate_sandbox({"required": True}, backend=backend, workspace=workspace) as sandbox:
        with pytest.raises(socket.gaierror):
            socket.getaddrinfo(f"8000-{sandbox.id}.localhost", 80)
        url = served_sandbox_url(sandbox)
        with urllib.request.urlopen(url + "/index.html", timeout=10) as answer:
            assert answer.read().decode() == PAGE


@needs_bwrap
def test_sandbox_url_is_read_by_requests_where_localhost_names_do_not_resolve(
    service: LocalE2bService, workspace: Path, localhost_unresolvable: None
) -> None:
    backend = E2bCompatibleBackend(endpoint=service.url, credential=lambda: service.api_key)
    with activate_sandbox({"required": True}, backend=backend, workspace=workspace) as sandbox:
        url = served_sandbox_url(sandbox)
        answer = requests.get(url + "/index.html", timeout=10)
        assert (answer.status_code, answer.text) == (200, PAGE)


@needs_bwrap
def test_a_ports_listener_is_closed_when_the_sandbox_ends(
    service: LocalE2bService, workspace: Path
) -> None:
    backend = E2bCompatibleBackend(endpoint=service.url, credential=lambda: service.api_key)
    with activate_sandbox({"required": True}, backend=backend, workspace=workspace) as sandbox:
        parts = urllib.parse.urlsplit(sandbox.url(8000))
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((parts.hostname, parts.port), timeout=5).close()


@needs_bwrap
def test_the_e2b_port_host_stays_for_the_official_sdks(
    service: LocalE2bService, client: Client, sandbox: dict[str, Any]
) -> None:
    # get_host(port) is "<port>-<id>.<domain>" with the create answer's domain.
    assert sandbox["domain"] == f"localhost:{service_port(service)}"
    serve_page(client, sandbox)
    status, body = get(service, port_host(service, sandbox, 8000), "/index.html")
    assert (status, body.decode()) == (200, PAGE)


def test_sandbox_url_names_the_port_host_of_an_e2b_double(workspace: Path) -> None:
    with E2bServer() as server:
        backend = E2bCompatibleBackend(endpoint=server.url, envd_url=server.url)
        with activate_sandbox({"required": True}, backend=backend, workspace=workspace) as sandbox:
            host = urllib.parse.urlsplit(server.url).netloc
            assert sandbox.url(3000) == f"http://3000-{sandbox.id}.{host}"


@pytest.mark.parametrize("port", [0, 65536, -1])
def test_sandbox_url_refuses_a_port_out_of_range(workspace: Path, port: int) -> None:
    with E2bServer() as server:
        backend = E2bCompatibleBackend(endpoint=server.url, envd_url=server.url)
        with activate_sandbox({"required": True}, backend=backend, workspace=workspace) as sandbox:
            with pytest.raises(PiShipError) as raised:
                sandbox.url(port)
    assert raised.value.code == CONFIG_INVALID


def test_sandbox_url_on_kubernetes_says_it_has_none(
    kubernetes_server: Any, workspace: Path, home: Path
) -> None:
    mock = kubernetes_server(lambda command: {"stdout": "", "exit_code": 0})
    policy = {"required": True, "network": {"mode": "allow"}}
    with activate_sandbox(
        policy, backend=kubernetes(mock.url), workspace=workspace, home_dir=home
    ) as sandbox:
        with pytest.raises(PiShipError) as raised:
            sandbox.url(8000)
    assert raised.value.code == CONFIG_INVALID
    assert "does not reach a sandbox's ports" in raised.value.message
