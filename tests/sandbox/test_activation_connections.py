"""Activation opens the connections it needs while the health check is in flight.

The readiness command's renewal and Start go out together, so they need two open
connections; the second one is opened while ``GET /health`` waits for its answer (when
the envd address is known before the create answers), and a kept backend opens none.
"""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator

import pytest

from benchmarks.loopback import LoopbackServer
from piship_remote import activate_sandbox
from piship_remote.backends.e2b.backend import E2bCompatibleBackend
from piship_remote.model.redact import Redactor
from piship_remote.transport import Transport
from tests.support.loopback_http import LoopbackHttp

pytestmark = pytest.mark.timeout(60)
POLICY = {"required": True, "network": {"mode": "deny"}}


class _Counting(http.server.BaseHTTPRequestHandler):
    """Answers 204, counting connections; ``/pair`` answers once two requests wait."""

    protocol_version = "HTTP/1.1"
    connections = 0
    health_waits = False
    changed = threading.Condition()
    pair = threading.Barrier(2, timeout=10)

    def setup(self) -> None:
        with _Counting.changed:
            _Counting.connections += 1
            _Counting.changed.notify_all()
        super().setup()

    def do_GET(self) -> None:
        if self.path == "/pair":
            _Counting.pair.wait()
        status = 204
        if self.path == "/health-once-two-connections" or (
            self.path == "/health" and _Counting.health_waits
        ):
            status = 204 if _wait_for_connections(2) else 503
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _wait_for_connections(count: int) -> bool:
    """Whether the server has taken ``count`` connections within 5 s.

    A client's connect returns once the kernel accepted it, which can be well before the
    server's thread for it starts, so a count is only read after waiting for it.
    """
    with _Counting.changed:
        return _Counting.changed.wait_for(lambda: _Counting.connections >= count, timeout=5)


@pytest.fixture
def counting() -> Iterator[LoopbackHttp]:
    _Counting.connections = 0
    _Counting.pair.reset()
    server = LoopbackHttp(_Counting)
    yield server
    server.close()


@pytest.fixture
def transport() -> Iterator[Transport]:
    client = Transport(redactor=Redactor())
    yield client
    client.close()


def _pair(transport: Transport, url: str) -> None:
    """Two requests at once (the server answers neither before both arrived)."""
    statuses: list[int] = []

    def one() -> None:
        with transport.request("GET", f"{url}/pair", timeout=10) as response:
            statuses.append(response.status)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)
    assert statuses == [204, 204]


def test_an_extra_connection_lets_two_requests_start_without_a_new_connection(
    counting: LoopbackHttp, transport: Transport
) -> None:
    with transport.extra_connection(counting.url, timeout=5):
        transport.request("GET", f"{counting.url}/health", timeout=5).close()
    assert _wait_for_connections(2)
    _pair(transport, counting.url)
    assert _Counting.connections == 2


def test_the_extra_connection_opens_while_the_request_is_in_flight(
    counting: LoopbackHttp, transport: Transport
) -> None:
    with transport.extra_connection(counting.url, timeout=5):
        url = f"{counting.url}/health-once-two-connections"
        with transport.request("GET", url, timeout=10) as response:
            assert response.status == 204


def test_the_e2b_health_check_opens_the_envd_connection_meanwhile(
    counting: LoopbackHttp,
) -> None:
    _Counting.health_waits = True
    backend = E2bCompatibleBackend(endpoint=counting.url, envd_url=counting.url)
    try:
        assert backend.available().available
    finally:
        backend.close()
        _Counting.health_waits = False


def test_without_a_known_envd_address_the_health_check_opens_one_connection(
    counting: LoopbackHttp,
) -> None:
    backend = E2bCompatibleBackend(endpoint=counting.url, envd_url=lambda _id, _domain: "x")
    try:
        assert backend.available().available
        assert _Counting.connections == 1
    finally:
        backend.close()


def test_an_extra_connection_reuses_idle_ones_before_opening_another(
    counting: LoopbackHttp, transport: Transport
) -> None:
    for _ in range(3):
        with transport.extra_connection(counting.url, timeout=5):
            transport.request("GET", f"{counting.url}/health", timeout=5).close()
    assert _wait_for_connections(2)
    assert _Counting.connections == 2


def test_an_extra_connection_leaves_no_thread_behind(
    counting: LoopbackHttp, transport: Transport
) -> None:
    with transport.extra_connection(counting.url, timeout=5):
        pass
    assert not [t for t in threading.enumerate() if t.name == "piship-connect"]


def test_an_unreachable_extra_connection_is_left_to_the_next_request(
    transport: Transport,
) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with transport.extra_connection(f"http://127.0.0.1:{port}", timeout=2):
        pass
    assert not [t for t in threading.enumerate() if t.name == "piship-connect"]


@pytest.fixture(scope="module")
def loopback() -> Iterator[LoopbackServer]:
    with LoopbackServer() as server:
        yield server


def _activate_and_run(backend: E2bCompatibleBackend, workspace: str) -> None:
    sandbox = activate_sandbox(POLICY, backend=backend, workspace=workspace, env={})
    try:
        assert sandbox.exec("true").exit_code == 0
    finally:
        sandbox.dispose()


def test_activation_opens_two_connections_and_a_kept_backend_none(
    loopback: LoopbackServer, tmp_path
) -> None:
    url = loopback.url
    backend = E2bCompatibleBackend(endpoint=url, envd_url=url, credential=lambda: "k" * 20)
    try:
        before = loopback.connection_count()
        _activate_and_run(backend, str(tmp_path))
        assert loopback.connection_count() - before == 2
        before = loopback.connection_count()
        _activate_and_run(backend, str(tmp_path))
        assert loopback.connection_count() - before == 0
    finally:
        backend.close()
