"""Endpoint mistakes answered with what to write, and ``localhost`` names (RFC 6761)
connected to loopback only, never looked up."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_httpserver import HTTPServer

from piship_remote import E2bCompatibleBackend, PiShipError, activate_sandbox
from piship_remote.model.redact import Redactor
from piship_remote.testing import E2bServer
from piship_remote.transport import Transport, check_endpoint
from piship_remote.transport.endpoint import is_localhost_name, loopback_addresses

pytestmark = pytest.mark.timeout(20)


@pytest.fixture
def transport() -> Iterator[Transport]:
    instance = Transport(redactor=Redactor(), component="sandbox")
    try:
        yield instance
    finally:
        instance.close()


@pytest.fixture
def server() -> Iterator[HTTPServer]:
    srv = HTTPServer(host="127.0.0.1")
    srv.expect_request("/health").respond_with_data("ok")
    srv.start()
    try:
        yield srv
    finally:
        srv.clear()
        srv.stop()


@pytest.fixture
def no_lookups(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every name resolution fails, and is recorded."""
    asked: list[str] = []

    def refuse(host: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append(str(host))
        raise socket.gaierror(socket.EAI_NONAME, "no lookups in this test")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return asked


# -- a URL without a scheme -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("typed", "first"),
    [
        ("localhost:3000", "Write http://localhost:3000"),
        ("127.0.0.1:3000", "Write http://127.0.0.1:3000"),
        ("api.e2b.app", "Write https://api.e2b.app"),
    ],
)
def test_an_endpoint_without_a_scheme_names_what_was_typed(typed: str, first: str) -> None:
    with pytest.raises(PiShipError) as caught:
        check_endpoint(typed)
    assert caught.value.code == "CONFIG_INVALID"
    assert f"'{typed}' has no scheme" in str(caught.value)
    assert "http:// or https://" in str(caught.value)
    assert "://:" not in str(caught.value)
    assert (caught.value.user_action or "").startswith(first)


def test_a_scheme_less_endpoint_with_credentials_is_not_echoed() -> None:
    with pytest.raises(PiShipError) as caught:
        check_endpoint("user:hunter2-pw@example.com")
    assert caught.value.code == "CONFIG_INVALID"
    assert "hunter2" not in str(caught.value) + (caught.value.user_action or "")


def test_the_e2b_backend_answers_a_scheme_less_endpoint_with_config_invalid() -> None:
    with pytest.raises(PiShipError) as caught:
        E2bCompatibleBackend(endpoint="localhost:3000")
    assert caught.value.code == "CONFIG_INVALID"
    assert "'localhost:3000' has no scheme" in str(caught.value)


# -- localhost names --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host", ["localhost", "LOCALHOST", "localhost.", "sbx.localhost", "49983-a1.Localhost"]
)
def test_localhost_and_names_under_it_are_loopback(host: str) -> None:
    assert is_localhost_name(host)
    assert check_endpoint(f"http://{host}:3000") == f"http://{host}:3000"


@pytest.mark.parametrize(
    "host", ["localhost.example.com", "notlocalhost", ".localhost", "a..localhost", "127.0.0.1"]
)
def test_other_names_are_not_localhost_names(host: str) -> None:
    assert not is_localhost_name(host)
    assert loopback_addresses(host, 80) is None


def test_localhost_names_map_to_the_loopback_addresses_only() -> None:
    addresses = loopback_addresses("sbx.localhost", 3000) or []
    assert addresses[0][4][0] == "127.0.0.1"
    assert {address[4][0] for address in addresses} <= {"127.0.0.1", "::1"}


def test_a_localhost_name_is_connected_to_loopback_without_a_lookup(
    server: HTTPServer, transport: Transport, no_lookups: list[str]
) -> None:
    response = transport.request("GET", f"http://49983-sbx1.localhost:{server.port}/health")
    with response:
        assert (response.status, b"".join(response.iter_raw())) == (200, b"ok")
    assert no_lookups == []


def test_a_localhost_name_bypasses_a_configured_proxy(
    server: HTTPServer, transport: Transport, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as probe:  # a proxy address nothing answers at
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{dead}")
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{dead}")
    with transport.request("GET", f"http://sbx.localhost:{server.port}/health") as response:
        assert response.status == 200


# -- the envd address -------------------------------------------------------------------------


def test_without_an_envd_address_a_localhost_endpoint_reaches_envd_by_its_derived_name(
    e2b_server: Callable[..., E2bServer], workspace: Path, no_lookups: list[str]
) -> None:
    mock = e2b_server(command=lambda start: {"stdout": "hi\n"})
    port = mock.url.rsplit(":", 1)[1]
    backend = E2bCompatibleBackend(endpoint=f"http://localhost:{port}")
    with activate_sandbox({"required": True}, backend=backend, workspace=workspace, env={}) as box:
        assert box.run("echo hi").stdout == "hi\n"
    assert no_lookups == []
    assert any(r.headers.get("host", "").startswith("49983-") for r in mock.requests)


def test_a_missing_envd_address_names_the_variable_and_the_option(
    e2b_server: Callable[..., E2bServer], workspace: Path
) -> None:
    mock = e2b_server()  # on 127.0.0.1: no per-sandbox name can be derived from an address
    backend = E2bCompatibleBackend(endpoint=mock.url)
    with pytest.raises(PiShipError) as caught:
        activate_sandbox({"required": True}, backend=backend, workspace=workspace, env={})
    assert caught.value.code == "NETWORK_DENIED"
    assert "PISHIP_E2B_ENVD_URL" in str(caught.value)
    assert "envd_url=" in str(caught.value)
    assert "PISHIP_E2B_ENVD_URL" in (caught.value.user_action or "")
    assert mock.live_sandboxes == []
