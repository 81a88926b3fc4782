"""The E2B docs' idiom against the local service: ``httpx.get(f"https://{sandbox.get_host(port)}")``
with the official SDK, trusting the service's CA through ``SSL_CERT_FILE`` only.

This host's resolver need not know ``*.localhost`` (RFC 6761 names; systemd's
nss-myhostname answers them with loopback), so each test resolves them as such a host does:
``socket.getaddrinfo`` answers a name under ``localhost`` with 127.0.0.1 and passes every
other name on.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from local_e2b import local_e2b_service

from tests.support.optional_peers import install_hint

pytest.importorskip("e2b", reason=install_hint("interop"))
pytest.importorskip("cryptography", reason="HTTPS needs the local extra's cryptography")

import httpx
from e2b import Sandbox

from piship_remote.local import LocalE2bService

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]

PAGE = "served in the sandbox\n"
SERVE = (
    "mkdir -p /tmp/site && echo served in the sandbox > /tmp/site/index.html"
    " && cd /tmp/site && exec python3 -m http.server 8000"
)
READY_TIMEOUT = 15.0
SUBPROCESS_TIMEOUT = 45.0
ENVD_OVER_HTTPS = """
from e2b import Sandbox
with Sandbox.create(request_timeout=10) as sandbox:
    print(sandbox.envd_api_url[: len("https://49983-")])
    print(sandbox.commands.run("echo over https").stdout, end="")
"""


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalE2bService]:
    with local_e2b_service(state_dir=tmp_path_factory.mktemp("state")) as running:
        yield running


@pytest.fixture
def localhost_resolves(monkeypatch: pytest.MonkeyPatch) -> None:
    """Names under ``localhost`` resolve to 127.0.0.1, as nss-myhostname resolves them."""
    resolve = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.rstrip(".").endswith(".localhost"):
            host = "127.0.0.1"
        return resolve(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.fixture
def trusted(service: LocalE2bService, monkeypatch: pytest.MonkeyPatch) -> None:
    """``SSL_CERT_FILE`` names the bundle ``serve`` prints (the service CA and the defaults)."""
    assert service.ca_bundle_path is not None
    monkeypatch.setenv("SSL_CERT_FILE", service.ca_bundle_path)


@pytest.fixture
def sandbox(service: LocalE2bService) -> Iterator[Sandbox]:
    created = Sandbox.create(  # type: ignore[call-overload]
        api_key=service.api_key,
        api_url=service.url,
        sandbox_url=service.url,
        request_timeout=10,
    )
    try:
        yield created
    finally:
        created.kill()


def first_answer(url: str) -> httpx.Response:
    """What ``url`` answers once the server started (502 before: nothing listens yet)."""
    deadline = time.monotonic() + READY_TIMEOUT
    while (response := httpx.get(url)).status_code == 502:
        assert time.monotonic() < deadline, "the server in the sandbox did not start"
        time.sleep(0.2)
    return response


@pytest.mark.usefixtures("localhost_resolves", "trusted")
def test_https_and_get_host_reach_a_server_in_the_sandbox(sandbox: Sandbox) -> None:
    sandbox.commands.run(SERVE, background=True)
    response = first_answer(f"https://{sandbox.get_host(8000)}/index.html")
    assert (response.status_code, response.text) == (200, PAGE)


@pytest.mark.usefixtures("localhost_resolves")
def test_https_without_the_service_ca_fails_verification(sandbox: Sandbox) -> None:
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"https://{sandbox.get_host(8000)}/", verify=True, trust_env=False)


def test_the_sdks_host_names_the_service_port_under_localhost(
    service: LocalE2bService, sandbox: Sandbox
) -> None:
    port = service.url.rsplit(":", 1)[1]
    assert sandbox.get_host(8000) == f"8000-{sandbox.sandbox_id}.localhost:{port}"


def test_the_bundle_also_holds_the_default_authorities(service: LocalE2bService) -> None:
    assert service.ca_bundle_path is not None
    assert Path(service.ca_bundle_path).read_text().count("BEGIN CERTIFICATE") > 1


def test_with_only_the_domain_the_sdk_reaches_envd_at_its_https_host(
    service: LocalE2bService,
) -> None:
    """A program started with ``SSL_CERT_FILE`` and ``E2B_DOMAIN`` set (the SDK's envd client
    reads the trust store once per process, so in a fresh interpreter)."""
    assert service.ca_bundle_path is not None
    environment = {
        **os.environ,
        "SSL_CERT_FILE": service.ca_bundle_path,
        "E2B_DOMAIN": f"localhost:{service.url.rsplit(':', 1)[1]}",
        "E2B_API_URL": service.url,
        "E2B_API_KEY": service.api_key,
    }
    ran = subprocess.run(
        [sys.executable, "-c", ENVD_OVER_HTTPS],
        env=environment,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
    )
    assert (ran.returncode, ran.stdout) == (0, "https://49983-\nover https\n"), ran.stderr
