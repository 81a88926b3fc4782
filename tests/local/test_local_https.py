"""HTTPS on the local service's own port: ``https://<port>-<id>.localhost:<service port>``.

A connection that opens with a TLS handshake is answered with a certificate the service's
CA signed for the name the client asked for; every other connection is plain HTTP as
before. A client that trusts the service's bundle (and nothing else) reaches a sandbox's
port as the E2B SDKs' ``"https://" + get_host(port)`` does; one that does not trust it
fails verification. ``*.localhost`` need not resolve here, so each test connects to
127.0.0.1 and names the host in its SNI and ``Host`` header.
"""

from __future__ import annotations

import http.client
import io
import os
import socket
import ssl
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from piship_remote.local import LocalE2bService, serve
from piship_remote.local.certificates import CA_KEY_FILE, default_state_dir
from tests.local.test_local_ports import (
    EXITED_ZERO,
    PAGE,
    READY_TIMEOUT,
    UPGRADE_ECHO,
    port_host,
    serve_page,
    service_port,
)
from tests.support.local_service import Client, needs_bwrap

pytest.importorskip("cryptography", reason="HTTPS needs the local extra's cryptography")

pytestmark = [needs_bwrap, pytest.mark.timeout(90)]


KEEP_ALIVE_SERVER = (
    'import http.server as h; h.SimpleHTTPRequestHandler.protocol_version = "HTTP/1.1";'
    ' h.ThreadingHTTPServer(("127.0.0.1", 8002), h.SimpleHTTPRequestHandler).serve_forever()'
)


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("state")


@pytest.fixture(scope="module")
def service(state_dir: Path) -> Iterator[LocalE2bService]:
    with LocalE2bService(state_dir=state_dir) as running:
        yield running


def trusting(service: LocalE2bService) -> ssl.SSLContext:
    """A client context whose only trust is the service's bundle (as ``SSL_CERT_FILE``)."""
    assert service.ca_bundle_path is not None
    return ssl.create_default_context(cafile=service.ca_bundle_path)


def https(
    service: LocalE2bService, host: str, path: str = "/", context: ssl.SSLContext | None = None
) -> tuple[int, bytes]:
    """GET ``https://{host}{path}`` through 127.0.0.1 (SNI and ``Host`` name ``host``)."""
    connection = _connection(service, host, context or trusting(service))
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _connection(
    service: LocalE2bService, host: str, context: ssl.SSLContext
) -> http.client.HTTPSConnection:
    name, _, port = host.rpartition(":")
    connection = http.client.HTTPSConnection(name, int(port), context=context, timeout=10)
    connection.sock = context.wrap_socket(
        socket.create_connection(("127.0.0.1", service_port(service)), timeout=10),
        server_hostname=name,
    )
    return connection


def wait_listening(client: Client, sandbox: dict[str, Any], port: int) -> None:
    probe = f"(exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null"
    deadline = time.monotonic() + READY_TIMEOUT
    while client.run(sandbox, probe).end != EXITED_ZERO:
        assert time.monotonic() < deadline, f"nothing listens on {port} in the sandbox"
        time.sleep(0.1)


def test_a_client_trusting_the_bundle_reaches_a_sandbox_port_over_https(
    service: LocalE2bService, client: Client, sandbox: dict[str, Any]
) -> None:
    serve_page(client, sandbox)
    status, body = https(service, port_host(service, sandbox, 8000), "/index.html")
    assert (status, body.decode()) == (200, PAGE)


def test_plain_http_on_the_same_port_still_reaches_the_sandbox_port(
    service: LocalE2bService, client: Client, sandbox: dict[str, Any]
) -> None:
    serve_page(client, sandbox)
    connection = http.client.HTTPConnection("127.0.0.1", service_port(service), timeout=10)
    connection.request("GET", "/index.html", headers={"Host": port_host(service, sandbox, 8000)})
    response = connection.getresponse()
    assert (response.status, response.read().decode()) == (200, PAGE)


def test_a_client_that_does_not_trust_the_service_ca_fails_verification(
    service: LocalE2bService, sandbox: dict[str, Any]
) -> None:
    untrusting = ssl.create_default_context()  # the system's CAs only
    with pytest.raises(ssl.SSLCertVerificationError):
        https(service, port_host(service, sandbox, 8000), context=untrusting)


def test_a_name_outside_localhost_gets_no_certificate_for_it(service: LocalE2bService) -> None:
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
        https(service, f"sandbox.example.com:{service_port(service)}", "/health")


def test_the_control_plane_answers_over_https_at_the_loopback_address(
    service: LocalE2bService,
) -> None:
    assert https(service, f"127.0.0.1:{service_port(service)}", "/health")[0] == 204


def test_keep_alive_requests_to_a_sandbox_port_share_one_tls_connection(
    service: LocalE2bService, client: Client, sandbox: dict[str, Any]
) -> None:
    serve_page(client, sandbox)  # writes the page
    client.run(sandbox, f"cd /tmp/site && (setsid python3 -c '{KEEP_ALIVE_SERVER}' &)")
    wait_listening(client, sandbox, 8002)
    connection = _connection(service, port_host(service, sandbox, 8002), trusting(service))
    try:
        answers, sockets = [], set()
        for _ in range(3):
            connection.request("GET", "/index.html")
            response = connection.getresponse()
            answers.append((response.status, response.read().decode()))
            sockets.add(id(connection.sock))
    finally:
        connection.close()
    assert answers == [(200, PAGE)] * 3
    assert len(sockets) == 1


def test_an_upgraded_connection_to_a_sandbox_port_echoes_over_tls(
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
    raw = socket.create_connection(("127.0.0.1", service_port(service)), timeout=10)
    with trusting(service).wrap_socket(raw, server_hostname=host.rpartition(":")[0]) as tls:
        upgrade = f"GET / HTTP/1.1\r\nHost: {host}\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n"
        tls.sendall(upgrade.encode())
        reader = tls.makefile("rb")
        assert reader.readline().startswith(b"HTTP/1.1 101")
        while reader.readline() not in (b"\r\n", b""):
            pass
        echoed = []
        for line in (b"one\n", b"two\n"):
            tls.sendall(line)
            echoed.append(reader.readline())
    assert echoed == [b"ONE\n", b"TWO\n"]


def test_the_ca_key_is_kept_private_in_the_state_directory(
    service: LocalE2bService, state_dir: Path
) -> None:
    mode = stat.S_IMODE(os.stat(state_dir / CA_KEY_FILE).st_mode)
    assert mode == 0o600


def test_the_ca_key_is_not_reachable_from_a_sandbox(
    service: LocalE2bService, client: Client, sandbox: dict[str, Any], state_dir: Path
) -> None:
    key_path = state_dir / CA_KEY_FILE
    default = default_state_dir()
    seen = client.run(sandbox, f"cat {key_path} {default}/{CA_KEY_FILE}; ls {state_dir} {default}")
    assert "PRIVATE KEY" not in seen.stdout
    assert seen.stdout == ""


def test_a_second_service_with_the_same_state_directory_keeps_the_ca(
    service: LocalE2bService, state_dir: Path
) -> None:
    assert service.ca_path is not None
    first = Path(service.ca_path).read_bytes()
    with LocalE2bService(state_dir=state_dir) as second:
        assert second.ca_path is not None
        assert Path(second.ca_path).read_bytes() == first
        assert https(second, f"localhost:{service_port(second)}", "/health")[0] == 204


def test_no_tls_thread_is_left_once_the_service_closed(state_dir: Path) -> None:
    with LocalE2bService(state_dir=state_dir) as running:
        context = trusting(running)
        connection = _connection(running, f"localhost:{service_port(running)}", context)
        connection.request("GET", "/health")
        assert connection.getresponse().status == 204  # the connection stays open
    left = [t.name for t in threading.enumerate() if t.name.startswith("piship-local-tls")]
    connection.close()
    assert left == []


def test_serve_prints_the_variables_that_trust_its_ca(state_dir: Path) -> None:
    out, stop = io.StringIO(), threading.Event()
    serving = threading.Thread(
        target=serve, kwargs={"out": out, "stop": stop, "state_dir": state_dir}, daemon=True
    )
    serving.start()
    deadline = time.monotonic() + READY_TIMEOUT
    while "Press Ctrl-C" not in out.getvalue():
        assert time.monotonic() < deadline, out.getvalue()
        time.sleep(0.05)
    stop.set()
    serving.join(READY_TIMEOUT)
    printed = out.getvalue()
    assert f"export SSL_CERT_FILE={state_dir / 'ca-bundle.pem'}" in printed
    assert f"export REQUESTS_CA_BUNDLE={state_dir / 'ca-bundle.pem'}" in printed
    assert f"export NODE_EXTRA_CA_CERTS={state_dir / 'ca.pem'}" in printed


def test_where_the_ca_cannot_be_kept_the_port_answers_plain_http_and_says_why(
    tmp_path: Path,
) -> None:
    not_a_directory = tmp_path / "state"
    not_a_directory.write_text("")
    with LocalE2bService(state_dir=not_a_directory) as plain_only:
        assert (plain_only.ca_path, plain_only.ca_bundle_path) == (None, None)
        assert plain_only.tls_problem is not None
        assert str(not_a_directory) in plain_only.tls_problem
        health = http.client.HTTPConnection("127.0.0.1", service_port(plain_only), timeout=10)
        health.request("GET", "/health")
        assert health.getresponse().status == 204
        health.close()
