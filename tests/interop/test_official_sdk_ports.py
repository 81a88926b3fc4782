"""The official E2B SDK's ``get_host(port)`` against the local service: a server in the sandbox
answers there, and a sandbox created without public traffic wants its traffic token.

``*.localhost`` names need not resolve on the test host, so requests go to the
service's loopback address with the ``Host`` the SDK names (what a browser sends).
"""

from __future__ import annotations

import http.client
import time
from collections.abc import Iterator

import pytest
from local_e2b import local_e2b_service

from tests.support.optional_peers import install_hint

pytest.importorskip("e2b", reason=install_hint("interop"))

from e2b import Sandbox

from piship_remote.local import LocalE2bService

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]

PAGE = "served in the sandbox\n"
SERVE = (
    "mkdir -p /tmp/site && echo served in the sandbox > /tmp/site/index.html"
    " && cd /tmp/site && exec python3 -m http.server 8000"
)
READY_TIMEOUT = 15.0


@pytest.fixture(scope="module")
def service() -> Iterator[LocalE2bService]:
    with local_e2b_service() as running:
        yield running


def create(service: LocalE2bService, **extra: object) -> Sandbox:
    return Sandbox.create(  # type: ignore[call-overload,no-any-return]
        api_key=service.api_key,
        api_url=service.url,
        sandbox_url=service.url,
        request_timeout=10,
        **extra,
    )


def fetch(service: LocalE2bService, host: str, **headers: str) -> tuple[int, str]:
    port = int(service.url.rsplit(":", 1)[1])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", "/index.html", headers={"Host": host, **headers})
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def serving(service: LocalE2bService, sandbox: Sandbox, **headers: str) -> tuple[int, str]:
    """Start the server with the SDK, in the background; the first answer that is not a 502."""
    sandbox.commands.run(SERVE, background=True)
    host = sandbox.get_host(8000)
    deadline = time.monotonic() + READY_TIMEOUT
    while (answer := fetch(service, host, **headers))[0] == 502:
        assert time.monotonic() < deadline, "the server in the sandbox did not start"
        time.sleep(0.1)
    return answer


def test_a_server_in_the_sandbox_answers_at_the_sdks_get_host(service: LocalE2bService) -> None:
    sandbox = create(service)
    try:
        assert serving(service, sandbox) == (200, PAGE)
    finally:
        sandbox.kill()


def test_a_sandbox_without_public_traffic_answers_only_with_its_traffic_token(
    service: LocalE2bService,
) -> None:
    private = create(service, network={"allow_public_traffic": False})
    other = create(service, network={"allow_public_traffic": False})
    try:
        token = private.traffic_access_token
        assert token is not None
        assert serving(service, private, **{"E2b-Traffic-Access-Token": token}) == (200, PAGE)
        host = private.get_host(8000)
        assert fetch(service, host)[0] == 403
        assert other.traffic_access_token is not None
        stolen = {"E2b-Traffic-Access-Token": other.traffic_access_token}
        assert fetch(service, host, **stolen)[0] == 403
    finally:
        private.kill()
        other.kill()
