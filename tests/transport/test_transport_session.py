# ruff: noqa: F811  (a test names the fixture it takes from test_transport)
"""A user's own requests.Session is honoured (its adapters, proxies, CA bundle); a
given Deadline bounds a request.

The transport sends through the adapter the session routes a URL to: its own
``PiShipAdapter`` (the fast path), or one the user mounted, which then sends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import requests.adapters
from pytest_httpserver import HTTPServer

from piship_remote.model.redact import Redactor
from piship_remote.transport import Transport, TransportError
from piship_remote.transport.adapter import PiShipAdapter
from piship_remote.transport.deadline import Deadline
from tests.transport.test_transport import (  # noqa: F401 (the fixtures, shared)
    KeepAliveServer,
    free_port,
    gate,
    hang_before_headers,
    keepalive,
    redactor,
    server,
    tls_files,
    tls_server,
    transport,
)


class RecordingAdapter(requests.adapters.HTTPAdapter):
    """A user's adapter: requests' own, noting every URL it sends."""

    def __init__(self) -> None:
        super().__init__(max_retries=0)
        self.sent: list[str] = []

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> Any:
        self.sent.append(str(request.url))
        return super().send(request, *args, **kwargs)


@pytest.fixture
def session() -> Iterator[requests.Session]:
    with requests.Session() as given:
        yield given


def test_a_user_adapter_mounted_for_the_scheme_sends_the_requests(
    redactor: Redactor, session: requests.Session, keepalive: KeepAliveServer
) -> None:
    adapter = RecordingAdapter()
    session.mount("http://", adapter)
    transport = Transport(redactor=redactor, session=session)
    try:
        assert transport.request("GET", f"{keepalive.url}/x").json_object() == {"ok": True}
    finally:
        transport.close()
    assert adapter.sent == [f"{keepalive.url}/x"]


def test_a_user_adapter_mounted_for_a_narrower_prefix_wins_there_only(
    redactor: Redactor, session: requests.Session, keepalive: KeepAliveServer
) -> None:
    adapter = RecordingAdapter()
    session.mount(f"{keepalive.url}/special/", adapter)
    transport = Transport(redactor=redactor, session=session)
    try:
        transport.request("GET", f"{keepalive.url}/special/x").close()
        transport.request("GET", f"{keepalive.url}/plain").close()
    finally:
        transport.close()
    assert adapter.sent == [f"{keepalive.url}/special/x"]
    assert len(keepalive.ports) == 2


def test_a_pi_ship_adapter_the_user_mounted_is_the_one_that_sends(
    redactor: Redactor, session: requests.Session, keepalive: KeepAliveServer
) -> None:
    adapter = PiShipAdapter(pool_size=2)
    session.mount("http://", adapter)
    transport = Transport(redactor=redactor, session=session)
    try:
        transport.request("GET", f"{keepalive.url}/x").close()
        assert len(adapter.poolmanager.pools) == 1
    finally:
        transport.close()
        adapter.close()


def test_the_session_proxies_carry_the_requests(
    redactor: Redactor,
    session: requests.Session,
    keepalive: KeepAliveServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    session.proxies = {"http": keepalive.url}
    transport = Transport(redactor=redactor, session=session)
    try:
        # Nothing listens at the target: only the proxy can answer.
        response = transport.request("GET", f"http://127.0.0.1:{free_port()}/x")
        assert response.json_object() == {"ok": True}
    finally:
        transport.close()
    assert len(keepalive.ports) == 1


def test_the_session_ca_bundle_verifies_the_server(
    redactor: Redactor,
    session: requests.Session,
    tls_server: HTTPServer,
    tls_files: dict[str, Path],
) -> None:
    tls_server.expect_request("/x").respond_with_data("ok")
    session.verify = str(tls_files["ca"])
    transport = Transport(redactor=redactor, session=session)
    try:
        with transport.request("GET", tls_server.url_for("/x")) as response:
            assert response.status == 200
    finally:
        transport.close()


def test_plain_requests_through_the_adapter_work(
    session: requests.Session, keepalive: KeepAliveServer
) -> None:
    adapter = PiShipAdapter()
    session.mount("http://", adapter)
    assert session.get(f"{keepalive.url}/x", timeout=5).json() == {"ok": True}


# --------------------------------------------------------------------------- a given deadline


@pytest.mark.timeout(10)
def test_a_given_deadline_bounds_the_wait_instead_of_the_timeout(
    transport: Transport, server: HTTPServer, gate: threading.Event
) -> None:
    url, _ = hang_before_headers(server, gate)
    started = time.monotonic()
    with pytest.raises(TransportError) as caught:
        transport.request("GET", url, timeout=30, deadline=Deadline.after(0.2))
    assert 0.15 < time.monotonic() - started < 1.0
    assert str(caught.value).endswith(" timed out")


def test_a_passed_deadline_sends_nothing(transport: Transport, server: HTTPServer) -> None:
    clock = [0.0]
    deadline = Deadline.after(1, clock=lambda: clock[0])
    clock[0] = 2.0
    with pytest.raises(TransportError) as caught:
        transport.request("GET", server.url_for("/x"), deadline=deadline)
    assert caught.value.request_sent is False
    assert server.log == []


def test_without_a_deadline_a_plain_body_is_read_whole(
    transport: Transport, keepalive: KeepAliveServer
) -> None:
    response = transport.request("GET", f"{keepalive.url}/x", timeout=None)
    assert response.json_object() == {"ok": True}
