"""What both backends do the same way: options, close(), `with`, credentials, refusals."""

from __future__ import annotations

import json
import socket
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from piship_remote.backends._common import exit_code_of, exit_status, remote_directory
from piship_remote.backends.base import BackendResult, ExecRequest
from piship_remote.backends.e2b.backend import E2bCompatibleBackend
from piship_remote.backends.kubernetes.backend import KubernetesAgentSandboxBackend
from piship_remote.model.errors import (
    CONFIG_INVALID,
    CREDENTIAL_REQUIRED,
    GATEWAY_UNREACHABLE,
    PiShipError,
)
from piship_remote.model.policy import SandboxProfile
from piship_remote.model.redact import Redactor
from piship_remote.testing import E2bServer, KubernetesServer
from piship_remote.transport import HttpReply, Transport
from tests.support.seed import kubernetes

pytestmark = pytest.mark.timeout(20)

Backend = E2bCompatibleBackend | KubernetesAgentSandboxBackend
BackendFor = Callable[..., Backend]


def e2b(url: str, **options: Any) -> E2bCompatibleBackend:
    return E2bCompatibleBackend(endpoint=url, envd_url=url, **options)


@pytest.fixture
def profile(tmp_path: Path) -> SandboxProfile:
    return SandboxProfile(workspace=str(tmp_path), network="allow")


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A loopback URL whose port refuses connections (bound, never listening)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{holder.getsockname()[1]}"


@pytest.fixture(params=["e2b", "kubernetes"])
def served(
    request: pytest.FixtureRequest,
    e2b_server: Callable[..., E2bServer],
    kubernetes_server: Callable[..., KubernetesServer],
) -> tuple[E2bServer | KubernetesServer, BackendFor]:
    """A double and a factory of backends pointed at it, for each backend."""
    if request.param == "e2b":
        mock: E2bServer | KubernetesServer = e2b_server()
        return mock, lambda **options: e2b(mock.url, **options)
    mock = kubernetes_server(lambda command: {"stdout": "ok\n", "exit_code": 0})
    return mock, lambda **options: kubernetes(mock.url, **options)


def live(mock: E2bServer | KubernetesServer) -> list[str]:
    return mock.live_sandboxes if isinstance(mock, E2bServer) else mock.live_claims


# -- the shared rules -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("workdir", "path", "expected"),
    [
        ("/home/user", ".", "/home/user"),
        ("/home/user/", "a/b", "/home/user/a/b"),
        ("/", "sub", "/sub"),
        (None, ".", None),
        (None, "sub", "sub"),
    ],
)
def test_remote_directory_maps_a_workspace_path(
    workdir: str | None, path: str, expected: str | None
) -> None:
    assert remote_directory(workdir, path) == expected


@pytest.mark.parametrize("path", ["/etc", "../up", "a/../../b"])
def test_remote_directory_refuses_paths_outside_the_workspace(path: str) -> None:
    with pytest.raises(PiShipError) as caught:
        remote_directory("/home/user", path)
    assert caught.value.code == CONFIG_INVALID


@pytest.mark.parametrize(
    ("value", "expected"), [(3, 3), (3.0, 3), (-1, -1), (2.5, None), (True, None), ("0", None)]
)
def test_exit_code_of_accepts_only_integers(value: object, expected: int | None) -> None:
    assert exit_code_of(value) == expected


def test_exit_status_of_a_signal_exit_is_128_plus_the_signal() -> None:
    assert exit_status(BackendResult(None, "SIGTERM")) == 143
    assert exit_status(BackendResult(None, "SIGNOPE")) == 1


# -- lifetime_seconds -----------------------------------------------------------------------


@pytest.mark.parametrize(("lifetime", "sent"), [(1800.0, 1800), (1800, 1800), (0.4, 1)])
def test_e2b_takes_a_float_lifetime_and_sends_whole_seconds_rounded_up(
    e2b_server: Callable[..., E2bServer], profile: SandboxProfile, lifetime: float, sent: int
) -> None:
    mock = e2b_server()
    with e2b(mock.url, lifetime_seconds=lifetime) as backend:
        backend.prepare(profile).dispose()
    create = next(r for r in mock.requests if r.method == "POST" and r.path == "/sandboxes")
    assert json.loads(create.body)["timeout"] == sent


# -- close() and `with backend:`, the same on both --------------------------------------


def test_with_backend_disposes_what_it_prepared(
    served: tuple[E2bServer | KubernetesServer, BackendFor], profile: SandboxProfile
) -> None:
    mock, backend_for = served
    with backend_for() as backend:
        backend.prepare(profile)
        assert len(live(mock)) == 1
    assert live(mock) == []


def test_prepare_after_close_is_refused_without_a_request(
    served: tuple[E2bServer | KubernetesServer, BackendFor], profile: SandboxProfile
) -> None:
    mock, backend_for = served
    backend = backend_for()
    backend.close()
    sent = len(mock.requests)
    with pytest.raises(PiShipError, match="backend was closed; create a new one"):
        backend.prepare(profile)
    assert len(mock.requests) == sent


def test_close_is_idempotent_and_leaves_disposed_instances_alone(
    served: tuple[E2bServer | KubernetesServer, BackendFor], profile: SandboxProfile
) -> None:
    mock, backend_for = served
    backend = backend_for()
    backend.prepare(profile).dispose()
    deletes = sum(r.method == "DELETE" for r in mock.requests)
    backend.close()
    backend.close()
    assert sum(r.method == "DELETE" for r in mock.requests) == deletes


# -- credentials ----------------------------------------------------------------------------


def test_a_string_credential_is_a_type_error_on_both(
    served: tuple[E2bServer | KubernetesServer, BackendFor],
) -> None:
    _, backend_for = served
    with pytest.raises(TypeError, match="credential must be a callable returning the key"):
        backend_for(credential="fake-key-0001")


def test_an_unset_key_is_credential_required_before_any_request(
    served: tuple[E2bServer | KubernetesServer, BackendFor], profile: SandboxProfile
) -> None:
    mock, backend_for = served
    environ: dict[str, str] = {}
    with backend_for(credential=lambda: environ["PISHIP_TEST_KEY"]) as backend:
        with pytest.raises(PiShipError) as caught:
            backend.prepare(profile)
    assert caught.value.code == CREDENTIAL_REQUIRED
    assert "PISHIP_TEST_KEY" in str(caught.value)
    assert "PISHIP_TEST_KEY" in (caught.value.user_action or "")
    assert [r for r in mock.requests if r.method != "DELETE"] == []


def test_an_empty_e2b_key_names_e2b_api_key(
    e2b_server: Callable[..., E2bServer], profile: SandboxProfile
) -> None:
    mock = e2b_server()
    with e2b(mock.url, credential=lambda: "") as backend:
        with pytest.raises(PiShipError) as caught:
            backend.prepare(profile)
    assert caught.value.code == CREDENTIAL_REQUIRED
    assert "E2B_API_KEY is empty" in str(caught.value)
    assert mock.requests == []


def test_an_e2b_credential_giving_none_is_credential_required_naming_e2b_api_key(
    e2b_server: Callable[..., E2bServer], profile: SandboxProfile
) -> None:
    mock = e2b_server()
    with e2b(mock.url, credential=lambda: None) as backend:
        with pytest.raises(PiShipError) as caught:
            backend.prepare(profile)
    assert caught.value.code == CREDENTIAL_REQUIRED
    assert "E2B_API_KEY is not set" in str(caught.value)
    assert (caught.value.user_action or "").startswith("Set E2B_API_KEY")
    assert mock.requests == []


def test_an_e2b_backend_without_a_credential_callable_sends_no_key(
    e2b_server: Callable[..., E2bServer], profile: SandboxProfile
) -> None:
    mock = e2b_server()
    with e2b(mock.url) as backend:
        backend.prepare(profile).dispose()
    created = mock.find("POST", "/sandboxes")
    assert len(created) == 1
    assert "x-api-key" not in created[0].headers


@pytest.mark.parametrize("read", [lambda: None, lambda: "", lambda: {}["E2B_API_KEY"]])
def test_an_e2b_availability_check_names_the_missing_key_before_any_request(
    e2b_server: Callable[..., E2bServer], read: Callable[[], str | None]
) -> None:
    mock = e2b_server()
    with e2b(mock.url, credential=read) as backend:
        availability = backend.available()
    assert availability.available is False
    assert availability.code == CREDENTIAL_REQUIRED
    assert "E2B_API_KEY" in (availability.reason or "")
    assert "E2B_API_KEY" in (availability.user_action or "")
    assert mock.requests == []


def test_a_kubernetes_credential_giving_none_sends_no_bearer(
    kubernetes_server: Callable[..., KubernetesServer], profile: SandboxProfile
) -> None:
    mock = kubernetes_server()
    with kubernetes(mock.url, credential=lambda: None) as backend:
        assert backend.available().available is True
    assert mock.requests
    assert all("authorization" not in r.headers for r in mock.requests)


# -- an unreachable service -----------------------------------------------------------------


def test_a_refused_e2b_create_is_gateway_unreachable_naming_the_endpoint(
    refused_url: str, profile: SandboxProfile
) -> None:
    with e2b(refused_url) as backend:
        with pytest.raises(PiShipError) as caught:
            backend.prepare(profile)
    assert caught.value.code == GATEWAY_UNREACHABLE
    assert caught.value.retryable
    assert refused_url in str(caught.value)
    assert refused_url in (caught.value.user_action or "")


def test_a_refused_claims_api_is_gateway_unreachable_naming_the_endpoint(
    refused_url: str, profile: SandboxProfile
) -> None:
    with kubernetes(refused_url) as backend:
        with pytest.raises(PiShipError) as caught:
            backend.prepare(profile)
    assert caught.value.code == GATEWAY_UNREACHABLE
    assert caught.value.retryable
    assert refused_url in str(caught.value)


class RecordingClient:
    """An ``HttpClient`` that wraps the default one and records what passes through."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.calls: list[tuple[str, str]] = []
        self.closed = False

    def request(self, method: str, url: str, **kwargs: Any) -> HttpReply:
        self.calls.append((method, urllib.parse.urlsplit(url).path))
        return self.inner.request(method, url, **kwargs)

    def close(self) -> None:
        self.closed = True
        self.inner.close()


def test_a_backend_sends_every_request_through_the_client_it_is_given(
    served: tuple[E2bServer | KubernetesServer, BackendFor], profile: SandboxProfile
) -> None:
    mock, backend_for = served
    client = RecordingClient(Transport(redactor=Redactor()))
    with backend_for(client=client) as backend:
        instance = backend.prepare(profile)
        instance.exec(ExecRequest(command="true", cwd=profile.workspace))
        instance.dispose()
    # The same requests; not the same order: a command's renewal and its Start overlap on
    # two connections, so they may reach the server in either order.
    assert sorted(path for _, path in client.calls) == sorted(
        request.path.split("?", 1)[0] for request in mock.requests
    )
    assert client.closed
