"""E2bCompatibleBackend on its own: every request it sends and every way a service can fail it.

The fake E2B service (``e2b_server``) covers the well-behaved and the configurable
answers; ``raw_server`` below answers with hand-built bytes for hostile cases
(garbage frames, HTML pages, plain-JSON edge errors, 429 with Retry-After).
"""

from __future__ import annotations

import base64
import gc
import http.server
import json
import random
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from werkzeug import Request, Response

from piship_remote.backends.base import Backend, BackendResult, ExecRequest, Instance
from piship_remote.backends.e2b import _stream as e2b_stream
from piship_remote.backends.e2b.backend import (
    CreateRetry,
    E2bCompatibleBackend,
    E2bInstance,
    remote_directory,
)
from piship_remote.model.errors import CommandCancelled, PiShipError
from piship_remote.model.policy import SandboxProfile
from piship_remote.model.redact import Redactor
from piship_remote.testing import (
    THREAD_PREFIX,
    E2bServer,
    MockHttpClient,
    MockRequest,
    MockResponse,
    RecordingServer,
    json_response,
)
from piship_remote.testing.recorder import DropConnection
from piship_remote.transport import HttpReply, Transport, TransportError
from piship_remote.transport._cancel import CancelToken
from piship_remote.transport.deadline import Deadline
from piship_remote.wire.connect import END_STREAM, EnvelopeReader, connect_envelope
from tests.support.loopback_http import LoopbackHttp
from tests.support.optional_peers import install_hint
from tests.support.seed import Clocks

pytestmark = pytest.mark.timeout(10)

E2bFactory = Callable[..., E2bServer]
Route = Callable[[RecordingServer, Request], Response]

CREATED = {
    "sandboxID": "sbx1",
    "templateID": "piship-workspace",
    "envdVersion": "0.4.0",
    "envdAccessToken": "envd-token-1",
    "domain": None,
}


# -- fixtures and helpers ------------------------------------------------------------------


def backend_for(url: str, **options: Any) -> E2bCompatibleBackend:
    return E2bCompatibleBackend(
        endpoint=url, **{"envd_url": url, "template": "piship-workspace", **options}
    )


@pytest.fixture
def profile(workspace: Path) -> SandboxProfile:
    return SandboxProfile(workspace=str(workspace))


@pytest.fixture
def prepared(
    e2b_server: E2bFactory, profile: SandboxProfile
) -> Iterator[Callable[..., tuple[E2bServer, E2bInstance]]]:
    """``prepared(**E2bServer options)`` → (mock, instance); the instance is disposed at the end."""
    instances: list[E2bInstance] = []

    def make(**options: Any) -> tuple[E2bServer, E2bInstance]:
        mock = e2b_server(**options)
        instance = backend_for(mock.url).prepare(profile)
        instances.append(instance)
        return mock, instance

    yield make
    for instance in instances:
        instance.dispose()


@pytest.fixture
def raw_server() -> Iterator[Callable[..., RecordingServer]]:
    """``raw_server(start=..., create=..., ...)``: the seed mock's routes, any of them replaced.

    Route names: ``health``, ``create`` (POST /sandboxes), ``renew``
    (/sandboxes/sbx1/timeout), ``delete`` (DELETE /sandboxes/…), ``start``, ``signal``.
    """
    servers: list[RecordingServer] = []

    def make(**routes: Route) -> RecordingServer:
        table: dict[str, Route] = {**DEFAULT_ROUTES, **routes}
        holder: list[RecordingServer] = []

        def handle(request: Request) -> Response:
            route = _route(request)
            return _404() if route is None else table[route](holder[0], request)

        server = RecordingServer(handle)
        holder.append(server)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


def _route(request: Request) -> str | None:
    path, method = request.path, request.method
    if path == "/health":
        return "health"
    if path == "/sandboxes" and method == "POST":
        return "create"
    if path == "/sandboxes/sbx1/timeout":
        return "renew"
    if path.startswith("/sandboxes/") and method == "DELETE":
        return "delete"
    if path == "/process.Process/Start":
        return "start"
    if path == "/process.Process/SendSignal":
        return "signal"
    return None


def _404() -> Response:
    return Response(b"", status=404)


def _empty(status: int) -> Route:
    return lambda server, request: Response(b"", status=status)


def answer(status: int, body: Any, **headers: str) -> Route:
    """A route answering ``body`` (JSON value, or text/bytes as is) with ``status``.

    ``headers`` are added with ``_`` in their names turned into ``-`` (``Retry_After``).
    """

    def route(server: RecordingServer, request: Request) -> Response:
        response = json_response(status, body)
        for name, value in headers.items():
            response.headers[name.replace("_", "-")] = value
        return response

    return route


def frames(*pieces: bytes, content_type: str = "application/connect+json") -> Route:
    """A Start route streaming ``pieces`` as they are, one HTTP chunk each."""
    return lambda server, request: server.stream(request, list(pieces), content_type=content_type)


def event(body: dict[str, Any]) -> bytes:
    return connect_envelope({"event": body})


def data(stream: str, raw: bytes) -> bytes:
    return event({"data": {stream: base64.b64encode(raw).decode()}})


START = event({"start": {"pid": 42}})
END_OK = event({"end": {"exited": True, "status": "exit status 0"}})
EOS = connect_envelope({}, END_STREAM)

DEFAULT_ROUTES: dict[str, Route] = {
    "health": _empty(204),
    "create": answer(201, CREATED),
    "renew": _empty(204),
    "delete": _empty(204),
    "start": frames(START, END_OK, EOS),
    "signal": answer(200, {}),
}


class Output:
    """Collects stdout and stderr chunks as delivered."""

    def __init__(self) -> None:
        self.stdout: list[bytes] = []
        self.stderr: list[bytes] = []
        self.first = threading.Event()

    def on_stdout(self, chunk: bytes) -> None:
        self.stdout.append(chunk)
        self.first.set()

    def on_stderr(self, chunk: bytes) -> None:
        self.stderr.append(chunk)


class Rejections:
    """A ``credential_rejected`` callback that counts its calls."""

    def __init__(self, answer: bool) -> None:
        self.count = 0
        self._answer = answer

    def __call__(self) -> bool:
        self.count += 1
        return self._answer


def cancel_when(happened: threading.Event, cancel: threading.Event) -> None:
    """Set ``cancel`` from another thread once ``happened`` is set."""

    def wait_then_cancel() -> None:
        if happened.wait(5):
            cancel.set()

    threading.Thread(target=wait_then_cancel, name="test-canceller", daemon=True).start()


def run(
    instance: E2bInstance,
    command: str = "true",
    *,
    output: Output | None = None,
    workspace_path: str = ".",
    env: dict[str, str] | None = None,
    cancel: threading.Event | None = None,
) -> BackendResult:
    output = output or Output()
    return instance.exec(
        ExecRequest(command, cwd="/unused", workspace_path=workspace_path, env=env or {}),
        on_stdout=output.on_stdout,
        on_stderr=output.on_stderr,
        cancel=cancel,
    )


def prepare_raw(server: RecordingServer, profile: SandboxProfile, **options: Any) -> E2bInstance:
    return backend_for(server.url, **options).prepare(profile)


def library_threads() -> set[threading.Thread]:
    """Live threads the library started (the doubles' own threads excluded)."""
    return {
        thread
        for thread in threading.enumerate()
        if thread.name.startswith("piship-") and not thread.name.startswith(THREAD_PREFIX)
    }


def start_bodies(server: RecordingServer) -> list[dict[str, Any]]:
    return [
        EnvelopeReader().push(r.body)[0].message
        for r in server.find("POST", "/process.Process/Start")
    ]


# -- without a socket: MockHttpClient, for tests about what the backend asks and decides ------

MockRoute = Callable[[MockRequest], MockResponse]


def reply(status: int, body: Any, **headers: str) -> MockRoute:
    """A mock route answering ``body`` (JSON value, or bytes as they are) with ``status``.

    ``headers`` are added with ``_`` in their names turned into ``-`` (``Retry_After``).
    """
    named = {name.replace("_", "-"): value for name, value in headers.items()}
    if isinstance(body, bytes):
        return lambda request: MockResponse(status, body, named)
    return lambda request: MockResponse.of_json(status, body, named)


def mock_control(create: MockRoute) -> MockHttpClient:
    """A client answering creates with ``create`` and every DELETE with 204."""

    def handle(request: MockRequest) -> MockResponse:
        if (request.method, request.path) == ("POST", "/sandboxes"):
            return create(request)
        return MockResponse(204 if request.method == "DELETE" else 404)

    return MockHttpClient(handle)


def prepare_mocked(client: MockHttpClient, profile: SandboxProfile, **options: Any) -> E2bInstance:
    return backend_for("http://127.0.0.1:1", client=client, **options).prepare(profile)


# -- identity, options, availability ----------------------------------------------------------


def test_identity_and_capabilities() -> None:
    backend = backend_for("http://127.0.0.1:1")
    assert isinstance(backend, Backend)
    assert (backend.id, backend.provider) == ("e2b-compatible", "e2b-compatible")
    capabilities = backend.capabilities()
    assert capabilities.network_probe is None
    assert list(capabilities.network) == ["deny", "allow"]
    assert capabilities.to_dict() == {
        "isolation": "remote",
        "planes": ["host-filesystem-isolation", "network-deny", "environment-filter"],
        "network": ["deny", "allow"],
        "localProcesses": False,
        "workspace": {"mode": "snapshot"},
    }


def test_refuses_an_endpoint_with_embedded_credentials() -> None:
    with pytest.raises(PiShipError) as caught:
        E2bCompatibleBackend(endpoint="https://user:pw@api.example.com")
    assert caught.value.code == "CONFIG_INVALID"
    assert "pw" not in str(caught.value)


def test_refuses_plain_http_to_a_non_loopback_endpoint() -> None:
    with pytest.raises(PiShipError) as caught:
        E2bCompatibleBackend(endpoint="http://api.example.com")
    assert caught.value.code == "NETWORK_DENIED"


def test_health_check_sends_no_credential(e2b_server: E2bFactory) -> None:
    mock = e2b_server()
    backend = backend_for(mock.url, credential=lambda: "health-key-000001")
    availability = backend.available()
    assert availability.available is True
    (health,) = mock.requests
    assert (health.method, health.path) == ("GET", "/health")
    assert "x-api-key" not in health.headers


def test_unhealthy_service_is_unavailable_with_its_status(e2b_server: E2bFactory) -> None:
    availability = backend_for(e2b_server(health=503).url).available()
    assert availability.available is False
    assert availability.reason == "the e2b-compatible endpoint health check returned HTTP 503"


def test_unreachable_service_is_unavailable_without_raising() -> None:
    availability = backend_for("http://127.0.0.1:1").available()
    assert availability.available is False
    assert availability.reason is not None
    assert availability.reason.startswith("the e2b-compatible endpoint is unreachable: ")


def test_keeps_an_endpoint_path_prefix(raw_server: Callable[..., RecordingServer]) -> None:
    server = raw_server()
    backend = E2bCompatibleBackend(endpoint=server.url + "/api/", envd_url=server.url)
    backend.available()
    assert server.requests[0].path == "/api/health"


# -- create ---------------------------------------------------------------------------------------


def test_create_body_is_compact_json_in_the_originals_key_order(
    e2b_server: E2bFactory, profile: SandboxProfile
) -> None:
    mock = e2b_server()
    backend_for(mock.url).prepare(profile).dispose()
    (create,) = mock.find("POST", "/sandboxes")
    assert create.body == (
        b'{"templateID":"piship-workspace","timeout":3600,'
        b'"metadata":{"created-by":"piship"},"allow_internet_access":false}'
    )
    assert create.headers["content-type"] == "application/json"
    assert re.fullmatch("[a-z0-9-]{1,255}", create.headers["idempotency-key"])


@pytest.mark.parametrize(("given", "sent"), [(120, 120), (0, 3600), (-5, 3600), (True, 3600)])
def test_lifetime_is_sent_on_create_and_renewal_with_a_fallback(
    e2b_server: E2bFactory, profile: SandboxProfile, given: Any, sent: int
) -> None:
    mock = e2b_server()
    instance = backend_for(mock.url, lifetime_seconds=given).prepare(profile)
    run(instance)
    instance.dispose()
    assert mock.find("POST", "/sandboxes")[0].json()["timeout"] == sent
    assert mock.find("POST", "/sandboxes/sbx1/timeout")[0].json() == {"timeout": sent}


def test_create_failure_names_status_and_detail(
    e2b_server: E2bFactory, profile: SandboxProfile
) -> None:
    with pytest.raises(PiShipError) as caught:
        backend_for(e2b_server(create=500).url).prepare(profile)
    assert caught.value.code == "SANDBOX_UNAVAILABLE"
    assert str(caught.value) == (
        'creating the sandbox failed: HTTP 500: {"code":500,"message":"no capacity"}'
    )


def test_create_failure_redacts_the_echoed_key(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile
) -> None:
    key = "e2b_0123456789abcdef-key"
    server = raw_server(create=answer(400, {"code": 400, "message": f"bad key {key}"}))
    with pytest.raises(PiShipError) as caught:
        prepare_raw(server, profile, credential=lambda: key)
    assert key not in str(caught.value)
    assert "HTTP 400" in str(caught.value)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"<html>not json</html>", "the response is not JSON"),
        (b'["sbx1"]', "the response is not a JSON object"),
        (b'{"pad":"' + b"x" * (1 << 20) + b'"}', "the response is too large"),
    ],
    ids=["not-json", "not-object", "too-large"],
)
def test_invalid_create_answer_is_reported_and_nothing_is_deleted(
    profile: SandboxProfile, body: bytes, expected: str
) -> None:
    client = mock_control(create=reply(201, body))
    with pytest.raises(PiShipError) as caught:
        prepare_mocked(client, profile)
    assert caught.value.code == "SANDBOX_UNAVAILABLE"
    assert expected in str(caught.value)
    assert client.count("DELETE") == 0


def test_a_lost_create_answer_says_a_sandbox_may_exist_and_when_it_expires(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile
) -> None:
    def drop(_server: RecordingServer, _request: Request) -> Response:
        raise DropConnection()

    server = raw_server(create=drop)
    with pytest.raises(PiShipError) as caught:
        prepare_raw(server, profile)
    assert caught.value.code == "SANDBOX_UNAVAILABLE"
    assert str(caught.value).startswith("creating the sandbox failed: ")
    assert str(caught.value).endswith(
        "; a sandbox may have been created without its ID reaching this library, "
        "and it expires on its own within 3600 s"
    )
    assert server.count("POST", "/sandboxes") == 1


@pytest.mark.parametrize("sandbox_id", [None, 123, "", "-leading-dash", "../sbx1", "a" * 129])
def test_create_answer_without_a_valid_sandbox_id_is_refused(
    profile: SandboxProfile, sandbox_id: Any
) -> None:
    client = mock_control(create=reply(201, {**CREATED, "sandboxID": sandbox_id}))
    with pytest.raises(PiShipError, match=r"^the sandbox service returned no valid sandbox ID$"):
        prepare_mocked(client, profile)
    assert client.count("DELETE") == 0


@pytest.mark.parametrize("token", [123, ["t"], "token with spaces", "line\nbreak"])
def test_invalid_envd_token_deletes_the_created_sandbox(
    profile: SandboxProfile, token: Any
) -> None:
    client = mock_control(create=reply(201, {**CREATED, "envdAccessToken": token}))
    with pytest.raises(PiShipError) as caught:
        prepare_mocked(client, profile)
    assert caught.value.code == "SANDBOX_UNAVAILABLE"
    assert str(caught.value) == "the sandbox service returned an invalid envd access token"
    assert [r.path for r in client.find("DELETE")] == ["/sandboxes/sbx1"]


def test_absent_envd_token_sends_no_access_token_header(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile
) -> None:
    server = raw_server(create=answer(201, {**CREATED, "envdAccessToken": None}))
    instance = prepare_raw(server, profile)
    assert run(instance).exit_code == 0
    instance.dispose()
    (start,) = server.find("POST", "/process.Process/Start")
    assert "x-access-token" not in start.headers


def test_envd_url_callable_gets_the_sandbox_id_and_a_valid_domain(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile
) -> None:
    server = raw_server(create=answer(201, {**CREATED, "domain": "sandboxes.example.com"}))
    seen: list[tuple[str, str | None]] = []

    def envd_url(sandbox_id: str, domain: str | None) -> str:
        seen.append((sandbox_id, domain))
        return server.url + "/"

    instance = E2bCompatibleBackend(endpoint=server.url, envd_url=envd_url).prepare(profile)
    assert run(instance).exit_code == 0
    instance.dispose()
    assert seen == [("sbx1", "sandboxes.example.com")]


@pytest.mark.parametrize(
    ("domain", "host"),
    [("sandboxes.example.com", "49983-sbx1.sandboxes.example.com"), (None, "49983-sbx1.127.0.0.1")],
)
def test_envd_url_is_built_from_the_domain_and_refused_when_unusable(
    raw_server: Callable[..., RecordingServer],
    profile: SandboxProfile,
    domain: str | None,
    host: str,
) -> None:
    # Plain HTTP is only for loopback, so the built per-sandbox host is refused here,
    # which shows the URL that was built; the sandbox is deleted again.
    server = raw_server(create=answer(201, {**CREATED, "domain": domain}))
    with pytest.raises(PiShipError) as caught:
        E2bCompatibleBackend(endpoint=server.url).prepare(profile)
    assert caught.value.code == "NETWORK_DENIED"
    assert "the sandbox's envd address cannot be used" in str(caught.value)
    assert host in str(caught.value)
    assert [r.path for r in server.find("DELETE")] == ["/sandboxes/sbx1"]


def test_create_is_retried_on_429_honouring_retry_after(profile: SandboxProfile) -> None:
    answers = iter([429, 429, 201])

    def create(request: MockRequest) -> MockResponse:
        status = next(answers)
        if status == 429:
            return reply(429, {"code": 429, "message": "rate limited"}, Retry_After="0")(request)
        return reply(201, CREATED)(request)

    client = mock_control(create=create)
    instance = prepare_mocked(client, profile)
    instance.dispose()
    assert client.count("POST", "/sandboxes") == 3


def test_create_is_retried_on_503_without_retry_after(profile: SandboxProfile) -> None:
    answers = iter([503, 201])

    def create(request: MockRequest) -> MockResponse:
        status = next(answers)
        body = CREATED if status == 201 else {"code": 503, "message": "busy"}
        return reply(status, body)(request)

    client = mock_control(create=create)
    prepare_mocked(client, profile).dispose()
    assert client.count("POST", "/sandboxes") == 2


def test_create_retries_are_bounded_and_the_error_is_retryable(profile: SandboxProfile) -> None:
    client = mock_control(
        create=reply(429, {"code": 429, "message": "rate limited"}, Retry_After="0")
    )
    with pytest.raises(PiShipError) as caught:
        prepare_mocked(client, profile)
    assert caught.value.retryable is True
    assert caught.value.retry_after == 0
    assert "creating the sandbox failed: HTTP 429" in str(caught.value)
    assert client.count("POST", "/sandboxes") == 3


def test_create_is_not_retried_when_retry_after_is_too_long(profile: SandboxProfile) -> None:
    client = mock_control(create=reply(429, {"code": 429, "message": "later"}, Retry_After="60"))
    with pytest.raises(PiShipError) as caught:
        prepare_mocked(client, profile)
    assert caught.value.retry_after == 60
    assert client.count("POST", "/sandboxes") == 1


def test_a_rejected_create_is_never_repeated(profile: SandboxProfile) -> None:
    client = mock_control(create=reply(401, {"code": 401, "message": "invalid key"}))
    rejections = Rejections(True)
    with pytest.raises(PiShipError, match="HTTP 401"):
        prepare_mocked(
            client,
            profile,
            credential=lambda: "rejected-key-000001",
            credential_rejected=rejections,
        )
    assert rejections.count == 1
    assert client.count("POST", "/sandboxes") == 1


# -- renewal ---------------------------------------------------------------------------------------


def assert_every_start_was_killed(server: RecordingServer) -> None:
    """Start overlaps the renewal: after a refused renewal, the command it started is killed."""
    tags = [frame["tag"] for frame in start_bodies(server)]
    assert len(tags) <= 1
    for tag in tags:
        signal = server.wait_for("POST", "/process.Process/SendSignal", timeout=2.0)
        assert signal.json() == {"process": {"tag": tag}, "signal": "SIGNAL_SIGKILL"}


def test_renewal_failure_reports_no_result_and_kills_the_started_command(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile
) -> None:
    server = raw_server(renew=answer(404, {"code": 404, "message": "sandbox not found"}))
    instance = prepare_raw(server, profile)
    with pytest.raises(PiShipError) as caught:
        run(instance)
    assert str(caught.value) == (
        'the sandbox is no longer available: HTTP 404: {"code":404,"message":"sandbox not found"}'
    )
    assert_every_start_was_killed(server)
    instance.dispose()


def test_the_renewal_is_on_the_wire_before_start(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile
) -> None:
    answered = threading.Event()

    def slow_renewal(_server: RecordingServer, _request: Request) -> Response:
        # Start arrives while the renewal is still unanswered: one round trip, not two.
        assert server_holder[0].wait_for(path="/process.Process/Start", timeout=5.0)
        answered.set()
        return Response(b"", status=204)

    server_holder: list[RecordingServer] = []
    server = raw_server(renew=slow_renewal)
    server_holder.append(server)
    instance = prepare_raw(server, profile)
    assert run(instance).exit_code == 0
    assert answered.is_set()
    # The two requests come on two connections, whose server threads record them in
    # either order; that Start came while the renewal waited is what the handler saw.
    paths = [r.path for r in server.requests if r.path != "/health"][1:]
    assert sorted(paths) == ["/process.Process/Start", "/sandboxes/sbx1/timeout"]
    instance.dispose()


def test_renewal_dropped_says_the_renewal_failed(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile
) -> None:
    def drop(_server: RecordingServer, _request: Request) -> Response:
        raise DropConnection()

    server = raw_server(renew=drop)
    instance = prepare_raw(server, profile)
    with pytest.raises(TransportError, match=r"^renewing the sandbox failed: .* failed: "):
        run(instance)
    assert_every_start_was_killed(server)
    instance.dispose()


def test_a_renewal_that_never_reached_the_service_sends_no_start(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile
) -> None:
    transport = Transport(redactor=Redactor())

    class Unreachable:
        """Renewals fail before anything is written (a refused connection)."""

        def request(self, method: str, url: str, **kwargs: Any) -> HttpReply:
            if url.endswith("/timeout"):
                raise TransportError("refused", request_sent=False, component="sandbox")
            return transport.request(method, url, **kwargs)

        def close(self) -> None:
            transport.close()

    server = raw_server()
    instance = prepare_raw(server, profile, client=Unreachable())
    try:
        with pytest.raises(TransportError, match=r"^renewing the sandbox failed: refused$"):
            run(instance)
        assert server.count(path="/process.Process/Start") == 0
    finally:
        instance.dispose()


def test_renewal_429_is_not_retried(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile
) -> None:
    server = raw_server(renew=answer(429, {"code": 429, "message": "slow down"}, Retry_After="0"))
    instance = prepare_raw(server, profile)
    with pytest.raises(PiShipError, match="HTTP 429"):
        run(instance)
    assert server.count(path="/sandboxes/sbx1/timeout") == 1
    instance.dispose()


def test_renewal_403_does_not_reject_the_credential(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile
) -> None:
    server = raw_server(renew=answer(403, {"code": 403, "message": "forbidden"}))
    rejections = Rejections(True)
    instance = prepare_raw(
        server,
        profile,
        credential=lambda: "forbidden-key-00001",
        credential_rejected=rejections,
    )
    with pytest.raises(PiShipError, match="HTTP 403"):
        run(instance)
    assert rejections.count == 0
    assert server.count(path="/sandboxes/sbx1/timeout") == 1
    instance.dispose()


# -- Start: the request ----------------------------------------------------------------------


def test_start_without_a_timeout_sends_no_deadline(
    prepared: Callable[..., tuple[E2bServer, E2bInstance]],
) -> None:
    mock, instance = prepared()
    run(instance, "true")
    (start,) = mock.find("POST", "/process.Process/Start")
    assert "connect-timeout-ms" not in start.headers


@pytest.mark.parametrize(("timeout", "header"), [(0.3, "1300"), (5, "6000"), (0.0001, "1001")])
def test_start_tells_envd_the_deadline_a_little_after_ours(
    prepared: Callable[..., tuple[E2bServer, E2bInstance]], timeout: float, header: str
) -> None:
    mock, instance = prepared()
    still = Deadline.after(timeout, clock=lambda: 0.0)  # exactly ``timeout`` left
    instance.exec(ExecRequest("true", cwd="/unused"), deadline=still)
    (start,) = mock.find("POST", "/process.Process/Start")
    assert start.headers["connect-timeout-ms"] == header


def test_start_request_headers_and_body(
    prepared: Callable[..., tuple[E2bServer, E2bInstance]],
) -> None:
    mock, instance = prepared()
    run(instance, "echo hi", workspace_path="sub/dir", env={"LANG": "C.UTF-8"})
    (start,) = mock.find("POST", "/process.Process/Start")
    headers = start.headers
    assert headers["content-type"] == "application/connect+json"
    assert headers["connect-protocol-version"] == "1"
    assert headers["e2b-sandbox-id"] == "sbx1"
    assert headers["e2b-sandbox-port"] == "49983"
    assert headers["x-access-token"] == "envd-token-1"
    assert headers["keepalive-ping-interval"] == "50"
    assert headers["authorization"] == "Basic dXNlcjo="
    assert "x-api-key" not in headers
    (frame,) = EnvelopeReader().push(start.body)
    assert frame.flags == 0
    tag = frame.message["tag"]
    assert re.fullmatch(r"piship-[0-9a-f]{16}", tag)
    assert frame.message == {
        "process": {
            "cmd": "/bin/bash",
            "args": ["-l", "-c", "echo hi"],
            "envs": {"LANG": "C.UTF-8"},
            "cwd": "/home/user/sub/dir",
        },
        "stdin": False,
        "tag": tag,
    }


def test_a_helper_command_starts_without_a_login_shell(
    prepared: Callable[..., tuple[E2bServer, E2bInstance]],
) -> None:
    mock, instance = prepared()
    instance.exec(ExecRequest("tar -cf /tmp/a.tar .", cwd="/unused", login=False))
    (start,) = mock.find("POST", "/process.Process/Start")
    (frame,) = EnvelopeReader().push(start.body)
    process = frame.message["process"]
    assert (process["cmd"], process["args"]) == ("/bin/sh", ["-c", "tar -cf /tmp/a.tar ."])


class SendOrder:
    """An :class:`HttpClient` recording each path as the request is handed over, then sending it."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self._lock = threading.Lock()
        self._transport = Transport(redactor=Redactor())

    def request(self, method: str, url: str, **options: Any) -> HttpReply:
        with self._lock:
            self.paths.append(urllib.parse.urlsplit(url).path)
        return self._transport.request(method, url, **options)

    def close(self) -> None:
        self._transport.close()


def test_renewal_precedes_every_start(e2b_server: E2bFactory, profile: SandboxProfile) -> None:
    # The server records requests from two connections in either order, so the order
    # is read where the client hands them over.
    mock = e2b_server()
    order = SendOrder()
    instance = backend_for(mock.url, client=order).prepare(profile)
    try:
        run(instance)
        run(instance)
    finally:
        instance.dispose()
    renewal, start = "/sandboxes/sbx1/timeout", "/process.Process/Start"
    commands = [path for path in order.paths if path in {renewal, start}]
    assert commands == [renewal, start, renewal, start]
    assert len({message["tag"] for message in start_bodies(mock)}) == 2


@pytest.mark.parametrize(
    ("workdir", "path", "expected"),
    [
        ("/home/user", ".", "/home/user"),
        ("/home/user", "", "/home/user"),
        ("/home/user", None, "/home/user"),
        ("/home/user/", ".", "/home/user/"),
        ("/home/user/", "sub", "/home/user/sub"),
        ("/workspace/repo", "sub", "/workspace/repo/sub"),
        ("/", "sub", "/sub"),
    ],
)
def test_remote_directory(workdir: str, path: str | None, expected: str) -> None:
    assert remote_directory(workdir, path) == expected


@pytest.mark.parametrize("path", ["/etc", "../up", "sub/../../up"])
def test_remote_directory_refuses_paths_outside_the_workspace(path: str) -> None:
    with pytest.raises(PiShipError, match=r"^the working directory is outside the workspace$"):
        remote_directory("/home/user", path)


def test_outside_path_fails_before_any_request(
    prepared: Callable[..., tuple[E2bServer, E2bInstance]],
) -> None:
    mock, instance = prepared()
    before = len(mock.requests)
    with pytest.raises(PiShipError, match="outside the workspace"):
        run(instance, workspace_path="../elsewhere")
    assert len(mock.requests) == before


# -- Start: failures before the stream -------------------------------------------------------


def test_edge_502_sandbox_not_found_is_a_clear_error(
    prepared: Callable[..., tuple[E2bServer, E2bInstance]],
) -> None:
    body = {"sandboxId": "sbx1", "message": "The sandbox was not found", "code": 502}
    _, instance = prepared(command=lambda start: {"status": 502, "body": body})
    with pytest.raises(PiShipError) as caught:
        run(instance)
    message = str(caught.value)
    assert message.startswith("starting the command failed: HTTP 502: ")
    assert "The sandbox was not found" in message
    assert "the sandbox is gone" in message
    assert caught.value.code == "SANDBOX_UNAVAILABLE"


def test_envd_401_with_an_integer_code_does_not_echo_the_token(
    prepared: Callable[..., tuple[E2bServer, E2bInstance]],
) -> None:
    body = {"code": 401, "message": "unauthorized access: envd-token-1"}
    _, instance = prepared(command=lambda start: {"status": 401, "body": body})
    with pytest.raises(PiShipError) as caught:
        run(instance)
    assert "starting the command failed: HTTP 401" in str(caught.value)
    assert "envd-token-1" not in str(caught.value)


def test_edge_429_is_retryable_with_its_retry_after(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile
) -> None:
    server = raw_server(
        start=answer(
            429, {"code": 429, "message": "too many concurrent connections"}, Retry_After="2"
        )
    )
    instance = prepare_raw(server, profile)
    with pytest.raises(PiShipError) as caught:
        run(instance)
    assert "HTTP 429" in str(caught.value)
    assert caught.value.retryable is True
    assert caught.value.retry_after == 2
    instance.dispose()


def test_html_error_page_is_named_not_dumped(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile
) -> None:
    page = b"<html><head><title>502 Bad Gateway</title></head><body>nginx/1.27.0</body></html>"
    server = raw_server(
        start=lambda s, r: Response(page, status=502, content_type="text/html; charset=utf-8")
    )
    instance = prepare_raw(server, profile)
    with pytest.raises(PiShipError) as caught:
        run(instance)
    message = str(caught.value)
    assert message.startswith("starting the command failed: HTTP 502 (an HTML error page")
    assert "<html>" not in message
    instance.dispose()


def test_start_answer_that_is_not_a_connect_stream_is_refused(
    prepared: Callable[..., tuple[E2bServer, E2bInstance]],
) -> None:
    _, instance = prepared(command=lambda start: {"content_type": "application/json"})
    with pytest.raises(PiShipError, match="not a Connect stream"):
        run(instance)


def test_start_answer_without_a_body_is_refused(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile
) -> None:
    server = raw_server(start=_empty(204))
    instance = prepare_raw(server, profile)
    with pytest.raises(PiShipError, match=r"^starting the command failed: HTTP 204$"):
        run(instance)
    instance.dispose()


# -- Start: the stream -----------------------------------------------------------------------


def test_output_is_delivered_per_frame_and_stderr_separately(
    prepared: Callable[..., tuple[E2bServer, E2bInstance]],
) -> None:
    _, instance = prepared(
        command=lambda start: {"stdout": "out\n", "chunks": ["a", "b"], "stderr": "err\n"}
    )
    output = Output()
    assert run(instance, output=output) == BackendResult(exit_code=0)
    assert output.stdout == [b"out\n", b"a", b"b"]
    assert output.stderr == [b"err\n"]


def test_utf8_split_across_frames_is_delivered_byte_exact(
    prepared: Callable[..., tuple[E2bServer, E2bInstance]],
) -> None:
    text = "héllo wörld".encode()
    _, instance = prepared(command=lambda start: {"chunks": [text[:2], text[2:7], text[7:]]})
    output = Output()
    run(instance, output=output)
    assert output.stdout == [text[:2], text[2:7], text[7:]]
    assert b"".join(output.stdout).decode() == "héllo wörld"


def test_keepalive_events_are_ignored(
    prepared: Callable[..., tuple[E2bServer, E2bInstance]],
) -> None:
    _, instance = prepared(command=lambda start: {"stdout": "x", "keepalive": True})
    output = Output()
    assert run(instance, output=output).exit_code == 0
    assert output.stdout == [b"x"]


def test_exit_code_is_reported(prepared: Callable[..., tuple[E2bServer, E2bInstance]]) -> None:
    _, instance = prepared(command=lambda start: {"exit_code": 7})
    assert run(instance) == BackendResult(exit_code=7)


def test_explicit_zero_exit_code_is_reported(
    prepared: Callable[..., tuple[E2bServer, E2bInstance]],
) -> None:
    _, instance = prepared(command=lambda start: {"omit_zero_exit": False})
    assert run(instance).exit_code == 0


def test_minus_one_exit_code_is_a_signal_exit(
    prepared: Callable[..., tuple[E2bServer, E2bInstance]],
) -> None:
    _, instance = prepared(command=lambda start: {"exit_code": -1})
    assert run(instance) == BackendResult(exit_code=None)


@pytest.mark.parametrize(
    ("end", "expected"),
    [
        ({"exited": True, "status": "exit status 0"}, 0),
        ({}, 0),
        ({"exit_code": 5, "exited": True}, 5),
        ({"exitCode": 3.0}, 3),
        ({"exitCode": -1, "exited": False, "status": "signal: killed"}, None),
        ({"exited": False, "status": "signal: killed"}, None),
        ({"exitCode": True, "status": "exit status 1"}, 1),
        ({"exitCode": "0", "status": "exit status 2"}, 2),
        ({"exited": True, "status": "exit status 3", "error": "exit status 3"}, 3),
    ],
)
def test_end_event_variants(
    raw_server: Callable[..., RecordingServer],
    profile: SandboxProfile,
    end: Any,
    expected: int | None,
) -> None:
    server = raw_server(start=frames(START, event({"end": end}), EOS))
    instance = prepare_raw(server, profile)
    assert run(instance).exit_code == expected
    instance.dispose()


@pytest.mark.parametrize(
    ("end", "reason"),
    [
        ("not an object", "not an object"),
        (None, "not an object"),
        ([0], "not an object"),
        ({"exitCode": True}, "not an integer"),
        ({"exitCode": "0"}, "not an integer"),
        ({"error": "exit status 1"}, "an error"),
        ({"exited": True, "status": "exploded"}, "unrecognised status"),
        ({"exited": False}, "did not exit"),
    ],
)
def test_end_event_without_a_usable_success_fails_closed(
    raw_server: Callable[..., RecordingServer],
    profile: SandboxProfile,
    end: Any,
    reason: str,
) -> None:
    server = raw_server(start=frames(START, event({"end": end}), EOS))
    instance = prepare_raw(server, profile)
    with pytest.raises(PiShipError, match=f"command stream failed: .*{reason}") as caught:
        run(instance)
    assert caught.value.code == "SANDBOX_UNAVAILABLE"
    instance.dispose()


@pytest.mark.parametrize("retry_after", [None, 2.0])
def test_create_retry_jitter_is_bounded_and_varies(retry_after: float | None) -> None:
    policy = CreateRetry()
    for attempt in (1, 2):
        low = policy.base_delay * 2.0 ** (attempt - 1) if retry_after is None else retry_after
        high = low * (1.5 if retry_after is None else 1.25)
        delays = [policy.delay(attempt, retry_after, random.Random(seed)) for seed in range(8)]
        assert all(delay is not None and low <= delay <= high for delay in delays)
        assert len(set(delays)) > 1


def test_create_retry_gives_up_on_a_long_retry_after() -> None:
    policy = CreateRetry(max_retry_after=10.0)
    assert policy.delay(1, 10.5, random.Random(0)) is None


def test_backends_jitter_their_create_retries_independently() -> None:
    backends = [backend_for("http://127.0.0.1:9") for _ in range(6)]
    delays = {b._control._retry.delay(1, None, b._control._random) for b in backends}
    assert len(delays) > 1
    for backend in backends:
        backend.close()


def test_extra_whitespace_and_unknown_fields_are_tolerated(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile
) -> None:
    def raw_frame(text: str, flags: int = 0) -> bytes:
        payload = text.encode()
        return bytes([flags]) + len(payload).to_bytes(4, "big") + payload

    server = raw_server(
        start=frames(
            raw_frame('{ "event" : { "start" : { "pid" : 9 } }, "future" : [1, 2] }'),
            raw_frame('{"event":{ "data": {"stdout":  "aGk=", "extra": true}}}'),
            raw_frame('{"event": {"end": {"exitCode": 2, "exited": true, "new": {}}}}'),
            raw_frame('{ "metadata" : {} }', END_STREAM),
        )
    )
    instance = prepare_raw(server, profile)
    output = Output()
    assert run(instance, output=output).exit_code == 2
    assert output.stdout == [b"hi"]
    instance.dispose()


def test_lenient_base64_output_is_decoded(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile
) -> None:
    raw = b"\xfb\xff\xfe?"
    urlsafe = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    server = raw_server(start=frames(START, event({"data": {"stdout": urlsafe}}), END_OK, EOS))
    instance = prepare_raw(server, profile)
    output = Output()
    run(instance, output=output)
    assert output.stdout == [raw]
    instance.dispose()


def raw_envelope(text: str, flags: int = 0) -> bytes:
    payload = text.encode()
    return bytes([flags]) + len(payload).to_bytes(4, "big") + payload


@pytest.mark.parametrize("decoder", ["pybase64", "strict_mode", "pattern"])
def test_plain_data_events_are_decoded_by_every_strict_decoder(
    raw_server: Callable[..., RecordingServer],
    profile: SandboxProfile,
    monkeypatch: pytest.MonkeyPatch,
    decoder: str,
) -> None:
    # pybase64 when installed; else binascii's strict_mode, or a pattern check before it (3.10).
    if decoder == "pybase64":
        pytest.importorskip("pybase64", reason=install_hint("speed"))
    else:
        monkeypatch.setattr(e2b_stream, "_FAST_B64", None)
        monkeypatch.setattr(e2b_stream, "_STRICT_MODE", decoder == "strict_mode")
    out, err = bytes(range(256)) * 40, b"oops\n"
    server = raw_server(
        start=frames(
            START,
            event({"data": {"stdout": base64.b64encode(out).decode()}}),
            event({"data": {"stderr": base64.b64encode(err).decode()}}),
            event({"data": {"stdout": ""}}),
            END_OK,
            EOS,
        )
    )
    instance = prepare_raw(server, profile)
    output = Output()
    run(instance, output=output)
    assert output.stdout == [out]
    assert output.stderr == [err]
    instance.dispose()


@pytest.mark.parametrize("decoder", ["pybase64", "strict_mode", "pattern"])
@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b'{"event":{"data":{"stdout":"aGk="}}}', (0, b"hi")),
        (b'{"event":{"data":{"stderr":"aGk="}}}', (1, b"hi")),
        (b'{"event":{"data":{"stdout":"aGk"}}}', None),  # unpadded: the JSON path decodes it
        (b'{"event":{"data":{"stdout":"a=Gk"}}}', None),  # padding inside
        (b'{"event":{"data":{"stdout":"aG-_"}}}', None),  # URL-safe alphabet
        (b'{"event":{"data":{"stdout":"aGk=","x":"1"}}}', None),  # another field
    ],
)
def test_the_data_fast_path_takes_only_canonical_base64(
    monkeypatch: pytest.MonkeyPatch,
    decoder: str,
    payload: bytes,
    expected: tuple[int, bytes] | None,
) -> None:
    if decoder == "pybase64":
        pytest.importorskip("pybase64", reason=install_hint("speed"))
    else:
        monkeypatch.setattr(e2b_stream, "_FAST_B64", None)
        monkeypatch.setattr(e2b_stream, "_STRICT_MODE", decoder == "strict_mode")
    assert e2b_stream._data_output(memoryview(payload)) == expected


def test_the_stream_names_the_base64_decoder_it_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pybase64", reason=install_hint("speed"))
    assert e2b_stream.base64_decoder().startswith("pybase64 ")
    monkeypatch.setattr(e2b_stream, "_FAST_B64", None)
    assert e2b_stream.base64_decoder() == "binascii (standard library)"


@pytest.mark.parametrize(
    "text",
    [
        '{"event": {"data": {"stdout": "aGk="}}}',  # protojson's random spaces
        '{"event":{"data":{"stdout":"aGk\\u003d"}}}',  # an escaped "="
        '{"event":{"data":{"stdout":"aGk"}}}',  # no padding
        '{"event":{"data":{"stdout":"aGk=","stderr":"aGk="}}}',  # both at once
    ],
)
def test_unusual_data_events_decode_the_same(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile, text: str
) -> None:
    server = raw_server(start=frames(START, raw_envelope(text), END_OK, EOS))
    instance = prepare_raw(server, profile)
    output = Output()
    run(instance, output=output)
    assert output.stdout == [b"hi"]
    instance.dispose()


def test_output_that_is_not_base64_fails_the_stream(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile
) -> None:
    server = raw_server(start=frames(START, event({"data": {"stdout": "!!!"}}), END_OK, EOS))
    instance = prepare_raw(server, profile)
    with pytest.raises(PiShipError, match="not base64"):
        run(instance)
    instance.dispose()


def test_stream_error_frame_is_reported(
    prepared: Callable[..., tuple[E2bServer, E2bInstance]],
) -> None:
    _, instance = prepared(command=lambda start: {"stream_error": "process exploded"})
    with pytest.raises(PiShipError) as caught:
        run(instance)
    assert str(caught.value) == "the command stream failed: internal process exploded"


def test_stream_error_without_code_or_message(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile
) -> None:
    server = raw_server(
        start=frames(START, connect_envelope({"error": {"details": []}}, END_STREAM))
    )
    instance = prepare_raw(server, profile)
    with pytest.raises(PiShipError, match=r"^the command stream failed: unknown$"):
        run(instance)
    instance.dispose()


def test_end_of_stream_without_an_end_event_is_an_error(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile
) -> None:
    server = raw_server(start=frames(START, EOS))
    instance = prepare_raw(server, profile)
    with pytest.raises(PiShipError, match=r"^the command stream ended without an exit status$"):
        run(instance)
    instance.dispose()


def test_missing_end_of_stream_frame_is_an_error(
    prepared: Callable[..., tuple[E2bServer, E2bInstance]],
) -> None:
    _, instance = prepared(command=lambda start: {"no_end_stream": True})
    with pytest.raises(PiShipError, match="without its end-of-stream frame"):
        run(instance)


def test_body_ending_after_start_is_an_error(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile
) -> None:
    server = raw_server(start=frames(START, b"\x00\x00\x00"))
    instance = prepare_raw(server, profile)
    with pytest.raises(PiShipError, match=r"^the command stream ended without an exit status$"):
        run(instance)
    instance.dispose()


def test_connection_dropped_mid_stream_is_an_unknown_outcome(
    prepared: Callable[..., tuple[E2bServer, E2bInstance]],
) -> None:
    _, instance = prepared(command=lambda start: {"stdout": "partial", "drop": True})
    output = Output()
    with pytest.raises(PiShipError) as caught:
        run(instance, output=output)
    assert "the command stream was interrupted" in str(caught.value)
    assert "outcome is unknown" in str(caught.value)
    assert caught.value.retryable is False
    assert output.stdout == [b"partial"]


@pytest.mark.parametrize(
    ("piece", "expected"),
    [
        (b"\x00" + (64 * 1024 * 1024).to_bytes(4, "big"), "oversized"),
        (connect_envelope({"event": {}}, 0x01), "compressed"),
        (b"\x00\x00\x00\x00\x05{not}", "not JSON"),
    ],
    ids=["oversized", "compressed", "garbage"],
)
def test_hostile_frames_fail_the_stream(
    raw_server: Callable[..., RecordingServer],
    profile: SandboxProfile,
    piece: bytes,
    expected: str,
) -> None:
    server = raw_server(start=frames(START, piece))
    instance = prepare_raw(server, profile)
    with pytest.raises(PiShipError, match=expected) as caught:
        run(instance)
    assert caught.value.code == "SANDBOX_UNAVAILABLE"
    instance.dispose()


def test_silent_stream_fails_after_the_idle_timeout(
    e2b_server: E2bFactory, profile: SandboxProfile
) -> None:
    mock = e2b_server(command=lambda start: {"hang": True})
    instance = backend_for(mock.url, stream_idle_timeout=0.3).prepare(profile)
    with pytest.raises(PiShipError, match="the command stream was interrupted"):
        run(instance)
    instance.dispose()


def test_a_stream_that_went_silent_has_its_command_killed(
    e2b_server: E2bFactory, profile: SandboxProfile
) -> None:
    mock = e2b_server(command=lambda start: {"hang": True})
    instance = backend_for(mock.url, stream_idle_timeout=0.3).prepare(profile)
    with pytest.raises(PiShipError):
        run(instance)
    signal = mock.wait_for("POST", "/process.Process/SendSignal", timeout=2.0)
    assert signal.json()["process"]["tag"] == start_bodies(mock)[-1]["tag"]
    instance.dispose()


def test_dispose_lets_a_kill_on_its_way_arrive(
    prepared: Callable[..., tuple[E2bServer, E2bInstance]],
) -> None:
    mock, instance = prepared(command=hanging)
    cancel = threading.Event()
    output = Output()
    cancel_when(output.first, cancel)
    with pytest.raises(CommandCancelled):
        run(instance, "sleep 600", output=output, cancel=cancel)
    instance.dispose()
    assert mock.count("POST", "/process.Process/SendSignal") == 1


# -- cancel ---------------------------------------------------------------------------------------


def hanging(start: dict[str, Any]) -> dict[str, Any]:
    return {"stdout": "working\n", "hang": True} if "sleep" in start["process"]["args"][2] else {}


@pytest.mark.parametrize("kind", ["event", "token"])
def test_cancel_sends_sigkill_by_tag_and_keeps_the_sandbox_usable(
    prepared: Callable[..., tuple[E2bServer, E2bInstance]], kind: str
) -> None:
    mock, instance = prepared(command=hanging)
    cancel = threading.Event() if kind == "event" else CancelToken()
    output = Output()
    cancel_when(output.first, cancel)
    with pytest.raises(CommandCancelled):
        run(instance, "sleep 600", output=output, cancel=cancel)
    signal = mock.wait_for("POST", "/process.Process/SendSignal", timeout=2.0)
    tag = start_bodies(mock)[-1]["tag"]
    assert signal.json() == {"process": {"tag": tag}, "signal": "SIGNAL_SIGKILL"}
    assert signal.headers["content-type"] == "application/json"
    assert signal.headers["x-access-token"] == "envd-token-1"
    assert signal.headers["e2b-sandbox-id"] == "sbx1"
    assert signal.headers["e2b-sandbox-port"] == "49983"
    assert signal.headers["connect-protocol-version"] == "1"
    assert "authorization" not in signal.headers
    assert "keepalive-ping-interval" not in signal.headers
    assert run(instance).exit_code == 0


def test_a_cancel_set_before_exec_sends_nothing(
    prepared: Callable[..., tuple[E2bServer, E2bInstance]],
) -> None:
    mock, instance = prepared()
    before = len(mock.requests)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(CommandCancelled):
        run(instance, cancel=cancel)
    assert len(mock.requests) == before


def test_a_cancel_during_renewal_raises_and_kills_what_it_started(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile
) -> None:
    renewing = threading.Event()

    def renew(server: RecordingServer, request: Request) -> Response:
        renewing.set()
        server.wait()
        return Response(b"", status=204)

    server = raw_server(renew=renew)
    instance = prepare_raw(server, profile)
    try:
        cancel = CancelToken()
        cancel_when(renewing, cancel)
        with pytest.raises(CommandCancelled):
            run(instance, cancel=cancel)
        # Start follows the renewal without waiting for its answer: what it started is killed.
        assert_every_start_was_killed(server)
    finally:
        instance.dispose()


# -- credentials on renewal and delete ----------------------------------------------------------


def test_delete_is_repeated_once_after_a_rejection(
    e2b_server: E2bFactory, profile: SandboxProfile
) -> None:
    mock = e2b_server(api_key="delete-key-000001", reject_once=["/sandboxes/sbx1"])
    rejections = Rejections(True)
    instance = backend_for(
        mock.url,
        credential=lambda: "delete-key-000001",
        credential_rejected=rejections,
    ).prepare(profile)
    instance.dispose()
    assert rejections.count == 1
    assert mock.count("DELETE", "/sandboxes/sbx1") == 2
    assert mock.live_sandboxes == []


def test_credential_is_read_for_every_attempt(
    e2b_server: E2bFactory, profile: SandboxProfile
) -> None:
    keys = iter(["renewed-key-000000", "renewed-key-000001", "renewed-key-000002"])
    current = ["renewed-key-000000"]

    def rejected() -> bool:
        current[0] = next(keys)
        current[0] = next(keys)
        return True

    mock = e2b_server(reject_once=["/sandboxes/sbx1/timeout"])
    instance = backend_for(
        mock.url, credential=lambda: current[0], credential_rejected=rejected
    ).prepare(profile)
    run(instance)
    instance.dispose()
    renewals = mock.find("POST", "/sandboxes/sbx1/timeout")
    assert [r.headers["x-api-key"] for r in renewals] == [
        "renewed-key-000000",
        "renewed-key-000001",
    ]


def test_a_rotated_credential_is_sent_by_the_next_request(
    e2b_server: E2bFactory, profile: SandboxProfile
) -> None:
    current = ["first-key-00000000"]
    mock = e2b_server()
    instance = backend_for(mock.url, credential=lambda: current[0]).prepare(profile)
    run(instance)
    current[0] = "rotated-key-000000"
    run(instance)
    instance.dispose()
    renewals = mock.find("POST", "/sandboxes/sbx1/timeout")
    assert [r.headers["x-api-key"] for r in renewals][-2:] == [
        "first-key-00000000",
        "rotated-key-000000",
    ]


# -- dispose --------------------------------------------------------------------------------------


def test_dispose_is_idempotent(prepared: Callable[..., tuple[E2bServer, E2bInstance]]) -> None:
    mock, instance = prepared()
    assert isinstance(instance, Instance)
    assert instance.epoch() == "sbx1"
    instance.dispose()
    instance.dispose()
    assert mock.count("DELETE", "/sandboxes/sbx1") == 1
    assert mock.live_sandboxes == []


def test_concurrent_dispose_sends_one_delete(
    prepared: Callable[..., tuple[E2bServer, E2bInstance]],
) -> None:
    mock, instance = prepared()
    go = threading.Barrier(8)

    def dispose() -> None:
        go.wait()
        instance.dispose()

    threads = [threading.Thread(target=dispose, name=f"test-dispose-{i}") for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert mock.count("DELETE", "/sandboxes/sbx1") == 1


def test_exec_after_dispose_sends_nothing(
    prepared: Callable[..., tuple[E2bServer, E2bInstance]],
) -> None:
    mock, instance = prepared()
    instance.dispose()
    before = len(mock.requests)
    with pytest.raises(PiShipError, match=r"^the sandbox was disposed$"):
        run(instance)
    assert len(mock.requests) == before


def test_dispose_ends_a_running_command_with_a_disposed_error(
    prepared: Callable[..., tuple[E2bServer, E2bInstance]],
) -> None:
    mock, instance = prepared(command=hanging)
    output = Output()
    errors: list[BaseException] = []

    def command() -> None:
        try:
            run(instance, "sleep 600", output=output)
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=command, name="test-command")
    thread.start()
    assert output.first.wait(5)
    instance.dispose()
    thread.join(2)
    assert not thread.is_alive()
    (error,) = errors
    assert isinstance(error, PiShipError)
    assert "disposed" in str(error)
    assert mock.count(path="/process.Process/SendSignal") == 0
    assert mock.count("DELETE", "/sandboxes/sbx1") == 1


def test_dispose_ignores_a_failing_delete(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile
) -> None:
    server = raw_server(delete=answer(500, {"code": 500, "message": "broken"}))
    instance = prepare_raw(server, profile)
    instance.dispose()
    assert server.count("DELETE") == 1


def test_no_library_thread_outlives_dispose(
    prepared: Callable[..., tuple[E2bServer, E2bInstance]],
) -> None:
    before = library_threads()
    mock, instance = prepared(command=hanging)
    for _ in range(3):
        cancel = threading.Event()
        output = Output()
        cancel_when(output.first, cancel)
        with pytest.raises(CommandCancelled):
            run(instance, "sleep 1", output=output, cancel=cancel)
    instance.dispose()
    assert library_threads() <= before
    assert mock.count(path="/process.Process/SendSignal") >= 1


def test_signal_threads_are_named_daemons(
    prepared: Callable[..., tuple[E2bServer, E2bInstance]],
) -> None:
    _, instance = prepared(command=hanging)
    seen: list[threading.Thread] = []
    cancel = CancelToken()
    output = Output()

    def cancel_and_look() -> None:
        output.first.wait(5)
        cancel.set()
        seen.extend(t for t in threading.enumerate() if t.name == "piship-e2b-signal")

    threading.Thread(target=cancel_and_look, name="test-canceller", daemon=True).start()
    with pytest.raises(CommandCancelled):
        run(instance, "sleep 1", output=output, cancel=cancel)
    assert seen
    assert all(thread.daemon for thread in seen)


# -- the backend's own lifetime ---------------------------------------------------------------


def test_close_disposes_live_sandboxes_and_refuses_new_ones(
    e2b_server: E2bFactory, profile: SandboxProfile
) -> None:
    mock = e2b_server()
    backend = backend_for(mock.url)
    backend.prepare(profile)
    backend.close()
    assert mock.live_sandboxes == []
    with pytest.raises(PiShipError, match="closed"):
        backend.prepare(profile)
    assert mock.count("POST", "/sandboxes") == 1


def test_envd_token_is_registered_for_redaction(
    e2b_server: E2bFactory, profile: SandboxProfile
) -> None:
    backend = backend_for(e2b_server().url)
    assert "envd-token-1" in backend.redactor.redact("token envd-token-1 here")
    backend.prepare(profile).dispose()
    assert "envd-token-1" not in backend.redactor.redact("token envd-token-1 here")


def test_dispose_cuts_a_hanging_kill_request_short(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile
) -> None:
    def signal(server: RecordingServer, request: Request) -> Response:
        server.wait()
        return json_response(200, {})

    def start(server: RecordingServer, request: Request) -> Response:
        def body() -> Iterator[bytes]:
            yield START
            yield data("stdout", b"working\n")
            server.wait()

        return server.stream(request, body(), content_type="application/connect+json")

    server = raw_server(signal=signal, start=start)
    before = library_threads()
    instance = prepare_raw(server, profile)
    cancel = CancelToken()
    output = Output()
    cancel_when(output.first, cancel)
    with pytest.raises(CommandCancelled):
        run(instance, "sleep 600", output=output, cancel=cancel)
    server.wait_for("POST", "/process.Process/SendSignal", timeout=2.0)
    instance.dispose()
    assert library_threads() <= before


def test_concurrent_commands_each_get_their_own_stream(
    prepared: Callable[..., tuple[E2bServer, E2bInstance]],
) -> None:
    mock, instance = prepared(
        command=lambda start: {
            "stdout": start["process"]["args"][2],
            "exit_code": int(start["process"]["args"][2].split()[-1]),
        }
    )
    results: dict[int, tuple[int | None, bytes]] = {}

    def command(n: int) -> None:
        output = Output()
        result = run(instance, f"exit {n}", output=output)
        results[n] = (result.exit_code, b"".join(output.stdout))

    threads = [
        threading.Thread(target=command, args=(n,), name=f"test-command-{n}") for n in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert results == {n: (n, f"exit {n}".encode()) for n in range(8)}
    assert len({message["tag"] for message in start_bodies(mock)}) == 8


def test_unreachable_envd_is_a_retryable_transport_error(
    e2b_server: E2bFactory, profile: SandboxProfile
) -> None:
    mock = e2b_server()
    instance = backend_for(mock.url, envd_url="http://127.0.0.1:1").prepare(profile)
    with pytest.raises(PiShipError) as caught:
        run(instance)
    assert caught.value.code == "GATEWAY_UNREACHABLE"
    assert caught.value.retryable is True
    instance.dispose()


TERMINATOR_DELAY = 0.05


class KeepAliveE2b:
    """The E2B routes on a stdlib HTTP/1.1 server that keeps connections open.

    (werkzeug closes every connection.) Start answers ``START``, one data frame,
    ``END_OK`` and ``EOS`` as separate HTTP chunks, then, a little later, the chunked
    terminator.
    ``ports`` holds the client port of every request.
    """

    def __init__(self) -> None:
        self.ports: list[int] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                owner.ports.append(self.client_address[1])
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path == "/process.Process/Start":
                    self.send_response(200)
                    self.send_header("Content-Type", "application/connect+json")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for piece in (START, data("stdout", b"hi\n"), END_OK, EOS):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                        self.wfile.flush()
                    # Late enough that the client has the end-of-stream frame without it
                    # (no event can tell when it has); it still waits up to 250 ms.
                    time.sleep(TERMINATOR_DELAY)
                    self.wfile.write(b"0\r\n\r\n")
                    return
                body = json.dumps(CREATED).encode() if self.path == "/sandboxes" else b""
                self.send_response(201 if body else 204)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_DELETE = do_POST

        self._http = LoopbackHttp(Handler)
        self.url = self._http.url

    def close(self) -> None:
        self._http.close()


@pytest.fixture
def keepalive_e2b() -> Iterator[KeepAliveE2b]:
    server = KeepAliveE2b()
    try:
        yield server
    finally:
        server.close()


def test_commands_reuse_one_connection_once_each_stream_has_ended(
    keepalive_e2b: KeepAliveE2b, profile: SandboxProfile
) -> None:
    # After the end-of-stream frame the reader also takes the chunked terminator, so
    # the connection goes back to the pool instead of being closed.
    instance = backend_for(keepalive_e2b.url).prepare(profile)
    output = Output()
    for _ in range(3):
        assert run(instance, output=output).exit_code == 0
    assert output.stdout == [b"hi\n"] * 3
    assert len(keepalive_e2b.ports) == 7  # create, then a renewal and a Start per command
    # The renewal and Start overlap, so they need one connection each; never a new one
    # per command.
    assert len(set(keepalive_e2b.ports)) <= 2
    instance.dispose()


def test_commands_leave_no_reference_cycle_of_the_library_behind(
    keepalive_e2b: KeepAliveE2b, profile: SandboxProfile
) -> None:
    # A cycle per command leaves its locks and events to the garbage collector, whose
    # pauses stall every thread of a busy program.
    instance = backend_for(keepalive_e2b.url).prepare(profile)
    run(instance)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(5):
            run(instance)
        gc.collect()
        library = [repr(obj)[:80] for obj in gc.garbage if _of_the_library(obj)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
        instance.dispose()
    assert library == []


def _of_the_library(obj: object) -> bool:
    code = getattr(obj, "__code__", None)
    where = code.co_filename if code is not None else getattr(type(obj), "__module__", "")
    return "piship_remote" in where and "testing" not in where


# -- the lease: shared renewals, the idle keepalive, the committed end -------------------------


def test_commands_that_start_during_a_renewal_share_it(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile
) -> None:
    both_started = threading.Event()
    held = threading.Event()
    starts: list[Request] = []

    def start(server: RecordingServer, request: Request) -> Response:
        starts.append(request)
        if len(starts) == 2:
            both_started.set()
        return server.stream(request, [START, END_OK, EOS], content_type="application/connect+json")

    def renew(_server: RecordingServer, _request: Request) -> Response:
        held.set()
        assert both_started.wait(5.0)
        return Response(b"", status=204)

    server = raw_server(start=start, renew=renew)
    instance = prepare_raw(server, profile)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(run, instance)
        assert held.wait(5.0)
        second = pool.submit(run, instance)
        assert first.result(10).exit_code == 0
        assert second.result(10).exit_code == 0
    assert server.count(path="/sandboxes/sbx1/timeout") == 1
    assert server.count(path="/process.Process/Start") == 2
    # Sequential commands still renew once each.
    run(instance)
    assert server.count(path="/sandboxes/sbx1/timeout") == 2
    instance.dispose()


class AnswerWatch(Output):
    """An :class:`Output` noting, for every chunk, whether ``answered`` was set by then."""

    def __init__(self, answered: threading.Event) -> None:
        super().__init__()
        self.answered = answered
        self.before_answer = 0

    def on_stdout(self, chunk: bytes) -> None:
        if not self.answered.is_set():
            self.before_answer += 1
        super().on_stdout(chunk)


def _two_sharing(
    raw_server: Callable[..., RecordingServer],
    profile: SandboxProfile,
    renewal_answer: Callable[[], Response],
    outputs: list[Output],
) -> tuple[RecordingServer, list[Any]]:
    """Two commands printing ``hi``, the second sharing the first's renewal, which is
    answered by ``renewal_answer()`` once both Starts have been answered; the instance
    is disposed (and its kills waited for) before this returns."""
    both_started = threading.Event()
    held = threading.Event()
    starts: list[Request] = []
    body = [START, data("stdout", b"hi\n"), END_OK, EOS]

    def start(server: RecordingServer, request: Request) -> Response:
        starts.append(request)
        if len(starts) == 2:
            both_started.set()
        return server.stream(request, body, content_type="application/connect+json")

    def renew(_server: RecordingServer, _request: Request) -> Response:
        held.set()
        assert both_started.wait(5.0)
        return renewal_answer()

    server = raw_server(start=start, renew=renew)
    instance = prepare_raw(server, profile)
    try:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(run, instance, output=outputs[0])
            assert held.wait(5.0)
            second = pool.submit(run, instance, output=outputs[1])
            outcomes = [_outcome(future) for future in (first, second)]
    finally:
        instance.dispose()
    assert server.count(path="/sandboxes/sbx1/timeout") == 1
    return server, outcomes


def _outcome(future: Any) -> Any:
    try:
        return future.result(10)
    except PiShipError as error:
        return error


def test_a_command_sharing_a_renewal_reports_its_output_only_after_the_answer(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile
) -> None:
    answered = threading.Event()

    def accept() -> Response:
        answered.set()
        return Response(b"", status=204)

    outputs = [AnswerWatch(answered), AnswerWatch(answered)]
    _, outcomes = _two_sharing(raw_server, profile, accept, outputs)
    assert outcomes == [BackendResult(0), BackendResult(0)]
    assert [output.stdout for output in outputs] == [[b"hi\n"], [b"hi\n"]]
    assert [output.before_answer for output in outputs] == [0, 0]


def test_a_command_sharing_a_refused_renewal_reports_nothing_and_is_killed(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile
) -> None:
    def refuse() -> Response:
        return json_response(404, {"code": 404, "message": "sandbox not found"})

    outputs = [Output(), Output()]
    server, outcomes = _two_sharing(raw_server, profile, refuse, outputs)
    for outcome in outcomes:
        assert isinstance(outcome, PiShipError)
        assert str(outcome).startswith("the sandbox is no longer available: HTTP 404")
    assert [output.stdout for output in outputs] == [[], []]
    started = {frame["tag"] for frame in start_bodies(server)}
    killed = {
        r.json()["process"]["tag"] for r in server.find("POST", "/process.Process/SendSignal")
    }
    assert len(started) == 2
    assert killed == started


def test_a_command_sharing_a_cancelled_commands_renewal_renews_on_its_own(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile
) -> None:
    both_started = threading.Event()
    cancel = CancelToken()
    renewals: list[Request] = []
    starts: list[Request] = []

    def start(server: RecordingServer, request: Request) -> Response:
        starts.append(request)
        if len(starts) == 2:
            both_started.set()
        return server.stream(request, [START, END_OK, EOS], content_type="application/connect+json")

    def renew(_server: RecordingServer, request: Request) -> Response:
        renewals.append(request)
        if len(renewals) == 1:
            assert both_started.wait(5.0)
            cancel.set()  # the command that sent this renewal gives up before its answer
            assert cancel.wait(5.0)
        return Response(b"", status=204)

    server = raw_server(start=start, renew=renew)
    instance = prepare_raw(server, profile)
    try:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(run, instance, cancel=cancel)
            assert server.wait_for(path="/sandboxes/sbx1/timeout", timeout=5.0)
            second = pool.submit(run, instance)
            with pytest.raises(CommandCancelled):
                first.result(10)
            assert second.result(10).exit_code == 0
        # The shared renewal's answer never reached the second command: it renewed itself.
        assert server.count(path="/sandboxes/sbx1/timeout") == 2
    finally:
        instance.dispose()


def test_an_idle_sandbox_is_kept_alive_every_quarter_lifetime(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile
) -> None:
    server = raw_server()
    instance = prepare_raw(server, profile, lifetime_seconds=1)
    renewal = server.wait_for(path="/sandboxes/sbx1/timeout", timeout=5.0)
    assert renewal.json() == {"timeout": 1}
    keepalives = [t for t in library_threads() if t.name == "piship-e2b-lease-sbx1"]
    assert len(keepalives) == 1
    assert keepalives[0].daemon
    instance.dispose()
    assert not [t for t in library_threads() if t.name.startswith("piship-e2b-lease-")]


def test_a_sandbox_past_its_committed_end_is_never_renewed(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile, clocks: Clocks
) -> None:
    server = raw_server()
    instance = prepare_raw(
        server, profile, lifetime_seconds=60, now=clocks.now, monotonic=clocks.monotonic
    )
    assert run(instance).exit_code == 0
    clocks.advance(61)
    with pytest.raises(PiShipError, match="lifetime ended"):
        run(instance)
    assert server.count(path="/sandboxes/sbx1/timeout") == 1
    assert server.count(path="/process.Process/Start") == 1
    instance.dispose()


def test_the_committed_end_follows_a_renewal_even_when_the_wall_clock_moves_back(
    raw_server: Callable[..., RecordingServer], profile: SandboxProfile, clocks: Clocks
) -> None:
    server = raw_server()
    instance = prepare_raw(
        server, profile, lifetime_seconds=60, now=clocks.now, monotonic=clocks.monotonic
    )
    clocks.advance(50)
    assert run(instance).exit_code == 0  # renewed at 50 s: it lives until 110 s
    clocks.wall -= 3600
    clocks.advance(50)
    assert run(instance).exit_code == 0
    assert server.count(path="/sandboxes/sbx1/timeout") == 2
    instance.dispose()
