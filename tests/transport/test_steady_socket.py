"""The pooled connections' socket: a timeout change below the tolerance is skipped."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from pytest_httpserver import HTTPServer

from piship_remote.model.redact import Redactor
from piship_remote.transport import Transport
from piship_remote.transport._steady_socket import TOLERANCE, SteadyTimeoutSocket


@pytest.fixture
def sock() -> Iterator[SteadyTimeoutSocket]:
    with SteadyTimeoutSocket(socket.AF_INET, socket.SOCK_STREAM) as instance:
        instance.settimeout(30.0)
        yield instance


def test_a_slightly_shorter_timeout_keeps_the_current_one(sock: SteadyTimeoutSocket) -> None:
    sock.settimeout(30.0 / (1 + TOLERANCE / 2))
    assert sock.gettimeout() == 30.0


def test_a_longer_timeout_is_applied(sock: SteadyTimeoutSocket) -> None:
    sock.settimeout(30.0001)
    assert sock.gettimeout() == 30.0001


def test_a_much_shorter_timeout_is_applied(sock: SteadyTimeoutSocket) -> None:
    sock.settimeout(29.0)
    assert sock.gettimeout() == 29.0


@pytest.mark.parametrize("value", [None, 0.0])
def test_blocking_and_non_blocking_modes_are_applied(
    sock: SteadyTimeoutSocket, value: float | None
) -> None:
    sock.settimeout(value)
    assert sock.gettimeout() == value
    assert sock.getblocking() == (value is None)


def test_an_invalid_timeout_is_refused_as_by_a_plain_socket(sock: SteadyTimeoutSocket) -> None:
    with pytest.raises(ValueError):
        sock.settimeout(-1.0)


def test_a_transport_request_runs_on_a_steady_socket(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/x").respond_with_data("ok")
    transport = Transport(redactor=Redactor())
    try:
        with transport.request("GET", httpserver.url_for("/x"), stream=True) as response:
            assert isinstance(response._call.scope.socket, SteadyTimeoutSocket)
    finally:
        transport.close()
