"""Pins the behaviour of the test doubles (piship_remote.testing), driven with plain requests."""

from __future__ import annotations

import base64
import importlib
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
import requests
from werkzeug import Request, Response

from piship_remote.testing import (
    CLAIMS,
    THREAD_PREFIX,
    Cluster,
    DropConnection,
    E2bServer,
    KubernetesServer,
    Recorded,
    RecordingServer,
    json_response,
    leaks,
)
from piship_remote.testing.kubernetes_server import claims_path
from piship_remote.testing.plugin import _closing_factory
from piship_remote.wire.connect import END_STREAM, EnvelopeReader, Frame, connect_envelope

pytestmark = pytest.mark.timeout(20)

TIMEOUT = 5.0
BASIC_USER = "Basic " + base64.b64encode(b"user:").decode()


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    """Runs client calls that block (hung requests) off the test thread.

    Teardown does not wait: a client still blocked ends when its server closes next.
    """
    executor = ThreadPoolExecutor(max_workers=16, thread_name_prefix="piship-test-client")
    yield executor
    executor.shutdown(wait=False, cancel_futures=True)


ServerHandler = Callable[[RecordingServer, Request], Response]


@pytest.fixture
def recording() -> Iterator[Callable[[ServerHandler], RecordingServer]]:
    """Makes a RecordingServer whose handler also gets the server (for wait/stream)."""
    servers: list[RecordingServer] = []

    def make(handler: ServerHandler) -> RecordingServer:
        holder: list[RecordingServer] = []
        server = RecordingServer(lambda request: handler(holder[0], request))
        holder.append(server)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


def _ok(server: RecordingServer, request: Request) -> Response:
    return json_response(200, {"ok": True})


# ---------------------------------------------------------------- recording server


def test_records_method_path_with_query_headers_lowercased_and_raw_body(recording: Any) -> None:
    server = recording(_ok)
    requests.post(
        server.url + "/a/b?x=1&y=%20",
        data=b"\x00raw",
        headers={"X-Trace-ID": "t1"},
        timeout=TIMEOUT,
    )
    [recorded] = server.requests
    assert recorded.method == "POST"
    assert recorded.path == "/a/b?x=1&y=%20"
    assert recorded.headers["x-trace-id"] == "t1"
    assert all(name == name.lower() for name in recorded.headers)
    assert recorded.body == b"\x00raw"


def test_url_is_loopback_without_trailing_slash(recording: Any) -> None:
    server = recording(_ok)
    assert server.url.startswith("http://127.0.0.1:")
    assert not server.url.endswith("/")


def test_records_a_hung_request_before_its_handler_returns(
    recording: Any, pool: ThreadPoolExecutor
) -> None:
    gate = threading.Event()

    def handler(server: RecordingServer, request: Request) -> Response:
        server.wait(gate)
        return json_response(200, {})

    server = recording(handler)
    pending = pool.submit(requests.post, server.url + "/hang", data=b"body", timeout=TIMEOUT)
    recorded = server.wait_for("POST", "/hang", timeout=TIMEOUT)
    assert recorded.body == b"body"
    assert not pending.done()
    gate.set()
    assert pending.result(TIMEOUT).status_code == 200


def test_records_in_arrival_order_while_earlier_requests_still_hang(
    recording: Any, pool: ThreadPoolExecutor
) -> None:
    def handler(server: RecordingServer, request: Request) -> Response:
        if request.path == "/hang":
            server.wait()
        return json_response(200, {})

    server = recording(handler)
    pool.submit(requests.get, server.url + "/hang", timeout=TIMEOUT)
    server.wait_for("GET", "/hang", timeout=TIMEOUT)
    requests.get(server.url + "/fast", timeout=TIMEOUT)
    assert [r.path for r in server.requests] == ["/hang", "/fast"]


def test_drop_closes_the_connection_without_a_response(recording: Any) -> None:
    def handler(server: RecordingServer, request: Request) -> Response:
        raise DropConnection

    server = recording(handler)
    with pytest.raises(requests.ConnectionError):
        requests.get(server.url + "/drop", timeout=TIMEOUT)
    assert server.count("GET", "/drop") == 1
    assert server.errors == []


def test_streamed_chunks_reach_the_client_before_the_stream_ends(recording: Any) -> None:
    gate = threading.Event()

    def handler(server: RecordingServer, request: Request) -> Response:
        def chunks() -> Iterator[bytes]:
            yield b"first"
            server.wait(gate)
            yield b"second"

        return server.stream(request, chunks())

    server = recording(handler)
    with requests.get(server.url + "/stream", stream=True, timeout=TIMEOUT) as response:
        body = response.iter_content(None)
        assert next(body) == b"first"
        gate.set()
        assert b"".join(body) == b"second"


def test_dropping_mid_stream_cuts_the_body(recording: Any) -> None:
    def handler(server: RecordingServer, request: Request) -> Response:
        def chunks() -> Iterator[bytes]:
            yield b"partial"
            raise DropConnection

        return server.stream(request, chunks())

    server = recording(handler)
    with requests.get(server.url + "/cut", stream=True, timeout=TIMEOUT) as response:
        with pytest.raises(requests.exceptions.ChunkedEncodingError):
            b"".join(response.iter_content(None))


def _held_stream(server: RecordingServer) -> Iterator[bytes]:
    yield b"x"
    if not server.wait():
        raise DropConnection
    yield b"y"


def test_close_releases_every_hung_request_within_100_ms(
    recording: Any, pool: ThreadPoolExecutor
) -> None:
    user_gate = threading.Event()

    def handler(server: RecordingServer, request: Request) -> Response:
        if request.path == "/stream":
            return server.stream(request, _held_stream(server))
        if not server.wait(user_gate if request.path == "/gated" else None):
            raise DropConnection
        return json_response(200, {})

    server = recording(handler)
    paths = ["/hang"] * 5 + ["/gated"] * 5 + ["/stream"] * 5
    calls = [pool.submit(requests.get, server.url + path, timeout=TIMEOUT) for path in paths]
    deadline = time.monotonic() + TIMEOUT
    while len(server.requests) < len(paths) and time.monotonic() < deadline:
        time.sleep(0.005)
    started = time.monotonic()
    server.close()
    assert time.monotonic() - started < 0.1
    for call in calls:
        with pytest.raises(requests.RequestException):
            call.result(1.0).content  # noqa: B018 - the stream's body is cut, not its headers
    assert user_gate.is_set()


def test_close_stops_listening(recording: Any) -> None:
    server = recording(_ok)
    server.close()
    with pytest.raises(requests.ConnectionError):
        requests.get(server.url + "/", timeout=TIMEOUT)


def test_close_is_idempotent_and_the_context_manager_closes() -> None:
    with RecordingServer(lambda request: json_response(200, {})) as server:
        assert requests.get(server.url + "/", timeout=TIMEOUT).status_code == 200
    assert server.closing
    server.close()


def test_threads_are_named_daemons_and_gone_after_close(recording: Any) -> None:
    server = recording(_ok)
    requests.get(server.url + "/", timeout=TIMEOUT)
    ours = [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]
    assert ours and all(t.daemon for t in ours)
    server.close()
    deadline = time.monotonic() + 1.0
    while any(t.is_alive() for t in ours) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert not any(t.is_alive() for t in ours)


def test_a_failing_handler_answers_500_and_keeps_the_error(recording: Any) -> None:
    def handler(server: RecordingServer, request: Request) -> Response:
        raise RuntimeError("handler bug")

    server = recording(handler)
    response = requests.get(server.url + "/boom", timeout=TIMEOUT)
    assert (response.status_code, response.content) == (500, b"")
    assert [str(e) for e in server.errors] == ["handler bug"]
    assert server.count(path="/boom") == 1


def test_wait_for_times_out_when_nothing_matches(recording: Any) -> None:
    server = recording(_ok)
    with pytest.raises(TimeoutError):
        server.wait_for("GET", "/never", timeout=0.05)


def test_recorded_json_parses_the_body() -> None:
    assert Recorded("POST", "/", {}, b'{"a":1}').json() == {"a": 1}


# ---------------------------------------------------------------- leaks


def test_leaks_reports_path_body_and_headers_not_allowed() -> None:
    secret = "sk-secret-000"
    sent = [
        Recorded("GET", f"/p?key={secret}", {}, b""),
        Recorded("POST", "/b", {"x-api-key": secret, "x-other": f"v {secret}"}, secret.encode()),
    ]
    assert leaks(sent, secret, ["X-API-Key"]) == [
        f"/p?key={secret}: path",
        "/b: body",
        "/b: header x-other",
    ]


def test_leaks_is_empty_when_the_secret_went_only_to_allowed_headers() -> None:
    sent = [Recorded("POST", "/sandboxes", {"x-api-key": "sk-secret-000"}, b"{}")]
    assert leaks(sent, "sk-secret-000", ["x-api-key"]) == []


def test_leaks_reads_the_body_as_latin1() -> None:
    sent = [Recorded("POST", "/", {}, "caf\u00e9-secret".encode("latin-1"))]
    assert leaks(sent, "caf\u00e9-secret") == ["/: body"]


def test_leaks_refuses_an_empty_secret() -> None:
    with pytest.raises(ValueError):
        leaks([], "")


# ---------------------------------------------------------------- E2B double


def _start_body(
    script: str, *, tag: str | None = None, envs: dict[str, str] | None = None
) -> bytes:
    start: dict[str, Any] = {
        "process": {"cmd": "/bin/bash", "args": ["-l", "-c", script], "envs": envs or {}},
        "stdin": False,
    }
    if tag is not None:
        start["tag"] = tag
    return connect_envelope(start)


def _start(
    mock: E2bServer, script: str, *, headers: dict[str, str] | None = None, **body: Any
) -> requests.Response:
    return requests.post(
        mock.url + "/process.Process/Start",
        data=_start_body(script, **body),
        headers={
            "Content-Type": "application/connect+json",
            "Authorization": BASIC_USER,
            **(headers or {}),
        },
        stream=True,
        timeout=TIMEOUT,
    )


def _frames(response: requests.Response) -> list[Frame]:
    return EnvelopeReader().push(response.content)


def _events(response: requests.Response) -> list[dict[str, Any]]:
    return [f.message.get("event", {"<end-stream>": f.message}) for f in _frames(response)]


def test_e2b_health_answers_the_configured_status(e2b_server: Any) -> None:
    mock = e2b_server(health=503, api_key="k-000000")
    response = requests.get(mock.url + "/health", timeout=TIMEOUT)
    assert (response.status_code, response.content) == (503, b"")


def test_e2b_create_answers_sbx1_and_the_sandbox_lives_until_deleted(e2b_server: Any) -> None:
    mock = e2b_server()
    created = requests.post(mock.url + "/sandboxes", json={"templateID": "t"}, timeout=TIMEOUT)
    assert created.status_code == 201
    assert created.headers["content-type"] == "application/json"
    assert created.json() == {
        "sandboxID": "sbx1",
        "templateID": "piship-workspace",
        "clientID": "client1",
        "envdVersion": "0.4.0",
        "envdAccessToken": "envd-token-1",
        "domain": None,
    }
    assert mock.live_sandboxes == ["sbx1"]
    renewed = requests.post(mock.url + "/sandboxes/sbx1/timeout", json={}, timeout=TIMEOUT)
    assert renewed.status_code == 204
    assert mock.live_sandboxes == ["sbx1"]
    assert requests.delete(mock.url + "/sandboxes/sbx1", timeout=TIMEOUT).status_code == 204
    assert mock.live_sandboxes == []


def test_e2b_official_sdk_create_path_is_served(e2b_server: Any) -> None:
    mock = e2b_server()
    response = requests.post(mock.url + "/v2/sandboxes", json={}, timeout=TIMEOUT)
    assert response.json()["sandboxID"] == "sbx1"


def test_e2b_create_failure_says_no_capacity_and_creates_nothing(e2b_server: Any) -> None:
    mock = e2b_server(create=500)
    response = requests.post(mock.url + "/sandboxes", json={}, timeout=TIMEOUT)
    assert response.status_code == 500
    assert response.json() == {"code": 500, "message": "no capacity"}
    assert mock.live_sandboxes == []


def test_e2b_wrong_api_key_is_refused_with_the_presented_key_echoed(e2b_server: Any) -> None:
    mock = e2b_server(api_key="right-key-0000")
    response = requests.post(
        mock.url + "/sandboxes", json={}, headers={"X-API-Key": "wrong-key-0000"}, timeout=TIMEOUT
    )
    assert response.status_code == 401
    assert response.json() == {"code": 401, "message": "invalid key wrong-key-0000"}
    assert mock.live_sandboxes == []


def test_e2b_reject_once_refuses_the_first_hit_of_a_path_only(e2b_server: Any) -> None:
    mock = e2b_server(api_key="key-000000", reject_once=["/sandboxes/sbx1/timeout"])
    key = {"X-API-Key": "key-000000"}
    url = mock.url + "/sandboxes/sbx1/timeout"
    statuses = [requests.post(url, headers=key, timeout=TIMEOUT).status_code for _ in range(2)]
    assert statuses == [401, 204]


def test_e2b_start_streams_start_output_end_and_end_of_stream(e2b_server: Any) -> None:
    mock = e2b_server(command=lambda start: {"stdout": "hi\n", "exit_code": 3})
    response = _start(mock, "exit 3")
    assert response.headers["content-type"] == "application/connect+json"
    frames = _frames(response)
    assert [f.flags for f in frames] == [0, 0, 0, END_STREAM]
    assert [f.message for f in frames] == [
        {"event": {"start": {"pid": 42}}},
        {"event": {"data": {"stdout": base64.b64encode(b"hi\n").decode()}}},
        {"event": {"end": {"exitCode": 3, "exited": True, "status": "exit status 3"}}},
        {},
    ]


def test_e2b_start_omits_a_zero_exit_code_like_envd(e2b_server: Any) -> None:
    mock = e2b_server()
    assert _events(_start(mock, "true"))[-2] == {"end": {"exited": True, "status": "exit status 0"}}


def test_e2b_command_gets_the_parsed_start_request(e2b_server: Any) -> None:
    seen: list[dict[str, Any]] = []

    def command(start: dict[str, Any]) -> dict[str, Any]:
        seen.append(start)
        return {}

    mock = e2b_server(command=command)
    _start(mock, "pwd", tag="piship-0011223344556677", envs={"LANG": "C"}).close()
    assert seen == [
        {
            "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "pwd"], "envs": {"LANG": "C"}},
            "stdin": False,
            "tag": "piship-0011223344556677",
        }
    ]


@pytest.mark.parametrize(("envs", "line"), [({}, "unset"), ({"PISHIP_PROBE_UNLISTED": "1"}, "1")])
def test_e2b_answers_the_activation_check_itself(
    e2b_server: Any, envs: dict[str, str], line: str
) -> None:
    calls: list[Any] = []
    mock = e2b_server(command=calls.append)
    script = "printf '%s %s\\n' piship-sandbox-ready \"${PISHIP_PROBE_UNLISTED:-unset}\""
    events = _events(_start(mock, script, envs=envs))
    stdout = base64.b64decode(events[1]["data"]["stdout"]).decode()
    assert stdout == f"piship-sandbox-ready {line}\n"
    assert calls == []


def test_e2b_start_refuses_another_basic_user(e2b_server: Any) -> None:
    mock = e2b_server(user="root")
    response = _start(mock, "whoami")
    assert response.status_code == 401
    assert response.json() == {"code": "unauthenticated", "message": "invalid user"}


def test_e2b_start_accepts_a_missing_authorization_as_the_default_user(e2b_server: Any) -> None:
    mock = e2b_server(user="root")
    response = requests.post(
        mock.url + "/process.Process/Start", data=_start_body("whoami"), timeout=TIMEOUT
    )
    assert response.status_code == 200


def test_e2b_hung_stream_ends_when_send_signal_names_its_tag(
    e2b_server: Any, pool: ThreadPoolExecutor
) -> None:
    mock = e2b_server(command=lambda start: {"stdout": "working\n", "hang": True})
    response = _start(mock, "sleep 600", tag="piship-aaaaaaaaaaaaaaaa")
    reader, body = EnvelopeReader(), response.iter_content(None)
    frames: list[Frame] = []
    while len(frames) < 2:
        frames += reader.push(next(body))
    rest: Future[bytes] = pool.submit(lambda: b"".join(body))
    signal = {"process": {"tag": "piship-aaaaaaaaaaaaaaaa"}, "signal": "SIGNAL_SIGKILL"}
    answer = requests.post(mock.url + "/process.Process/SendSignal", json=signal, timeout=TIMEOUT)
    assert (answer.status_code, answer.json()) == (200, {})
    assert answer.headers["content-type"] == "application/json"
    assert reader.push(rest.result(TIMEOUT)) == [Frame(END_STREAM, {})]


def test_e2b_send_signal_for_another_tag_leaves_a_stream_hanging(
    e2b_server: Any, pool: ThreadPoolExecutor
) -> None:
    mock = e2b_server(command=lambda start: {"hang": True})
    pending = pool.submit(lambda: _start(mock, "sleep 1", tag="piship-1111111111111111").content)
    mock.wait_for(path="/process.Process/Start", timeout=TIMEOUT)
    signal = {"process": {"tag": "piship-2222222222222222"}, "signal": "SIGNAL_SIGKILL"}
    requests.post(mock.url + "/process.Process/SendSignal", json=signal, timeout=TIMEOUT)
    with pytest.raises(TimeoutError):
        pending.result(0.2)


def test_e2b_send_signal_that_arrives_first_keeps_its_start_from_hanging(e2b_server: Any) -> None:
    mock = e2b_server(command=lambda start: {"hang": True})
    signal = {"process": {"tag": "piship-3333333333333333"}, "signal": "SIGNAL_SIGKILL"}
    requests.post(mock.url + "/process.Process/SendSignal", json=signal, timeout=TIMEOUT)
    frames = _frames(_start(mock, "sleep 1", tag="piship-3333333333333333"))
    assert frames[-1] == Frame(END_STREAM, {})


def test_e2b_stream_error_ends_with_an_error_and_no_end_event(e2b_server: Any) -> None:
    mock = e2b_server(command=lambda start: {"stream_error": "process exploded"})
    frames = _frames(_start(mock, "boom"))
    assert frames[-1] == Frame(
        END_STREAM, {"error": {"code": "internal", "message": "process exploded"}}
    )
    assert not any("end" in f.message.get("event", {}) for f in frames)


def test_e2b_optional_answers_shape_the_stream_like_real_envd(e2b_server: Any) -> None:
    mock = e2b_server(
        command=lambda start: {
            "stdout": "a",
            "chunks": [b"\xe2\x82", b"\xac"],
            "stderr": "err",
            "keepalive": True,
            "omit_zero_exit": False,
            "no_end_stream": True,
            "content_type": "application/connect+json; charset=utf-8",
        }
    )
    response = _start(mock, "x")
    assert response.headers["content-type"] == "application/connect+json; charset=utf-8"
    ka: dict[str, Any] = {"keepalive": {}}
    assert _events(response) == [
        {"start": {"pid": 42}},
        ka,
        {"data": {"stdout": "YQ=="}},
        ka,
        {"data": {"stdout": "4oI="}},
        ka,
        {"data": {"stdout": "rA=="}},
        ka,
        {"data": {"stderr": "ZXJy"}},
        ka,
        {"end": {"exitCode": 0, "exited": True, "status": "exit status 0"}},
    ]


def test_e2b_drop_cuts_the_stream_after_the_output(e2b_server: Any) -> None:
    mock = e2b_server(command=lambda start: {"stdout": "partial", "drop": True})
    response = _start(mock, "x")
    with pytest.raises(requests.exceptions.ChunkedEncodingError):
        b"".join(response.iter_content(None))


def test_e2b_status_answers_start_without_a_stream(e2b_server: Any) -> None:
    mock = e2b_server(command=lambda start: {"status": 502, "body": "<html>bad gateway</html>"})
    response = _start(mock, "x")
    assert (response.status_code, response.text) == (502, "<html>bad gateway</html>")


def test_e2b_after_holds_the_end_until_the_event_is_set(
    e2b_server: Any, pool: ThreadPoolExecutor
) -> None:
    done = threading.Event()
    mock = e2b_server(command=lambda start: {"stdout": "slow\n", "after": done})
    pending = pool.submit(lambda: _events(_start(mock, "slow")))
    mock.wait_for(path="/process.Process/Start", timeout=TIMEOUT)
    with pytest.raises(TimeoutError):
        pending.result(0.1)
    done.set()
    assert pending.result(TIMEOUT)[-1] == {"<end-stream>": {}}


def test_e2b_unknown_answer_key_is_a_handler_error(e2b_server: Any) -> None:
    mock = e2b_server(command=lambda start: {"exitCode": 3})
    assert _start(mock, "x").status_code == 500
    assert "exitCode" in str(mock.errors[0])


def test_e2b_close_ends_a_hung_stream_with_a_drop(
    e2b_server: Any, pool: ThreadPoolExecutor
) -> None:
    mock = e2b_server(command=lambda start: {"hang": True})
    pending = pool.submit(lambda: _start(mock, "sleep 600").content)
    mock.wait_for(path="/process.Process/Start", timeout=TIMEOUT)
    started = time.monotonic()
    mock.close()
    assert time.monotonic() - started < 0.1
    with pytest.raises(requests.RequestException):
        pending.result(1.0)


def test_e2b_unknown_paths_are_404(e2b_server: Any) -> None:
    mock = e2b_server()
    assert requests.get(mock.url + "/sandboxes/other", timeout=TIMEOUT).status_code == 404
    assert requests.get(mock.url + "/nothing", timeout=TIMEOUT).status_code == 404


# ---------------------------------------------------------------- Kubernetes double


def _claim(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxClaim",
        "metadata": {"name": name, "labels": {"agents.x-k8s.io/created-by": "piship"}},
        "spec": {"warmPoolRef": {"name": "python-pool"}},
    }


def _create(mock: KubernetesServer, name: str = "c1", **headers: str) -> requests.Response:
    return requests.post(mock.url + CLAIMS, json=_claim(name), headers=headers, timeout=TIMEOUT)


def _ready(mock: KubernetesServer, name: str = "c1") -> None:
    """Create the claim and read it until Ready (the fake's pod is ready on the second look)."""
    assert _create(mock, name).status_code == 201
    for _ in range(2):
        claim = requests.get(f"{mock.url}{CLAIMS}/{name}", timeout=TIMEOUT).json()
    assert claim["status"]["conditions"][0]["status"] == "True"


def _execute(
    mock: KubernetesServer, command: str, sandbox: str = "pool-c1", **headers: str
) -> requests.Response:
    return requests.post(
        mock.url + "/execute",
        json={"command": command},
        headers={"X-Sandbox-ID": sandbox, "X-Sandbox-Namespace": "agents", **headers},
        timeout=TIMEOUT,
    )


@pytest.fixture
def ready_cluster(kubernetes_server: Any) -> Callable[..., KubernetesServer]:
    """``ready_cluster(execute=None, cluster=None)``: a fake cluster with claim c1 ready."""

    def make(execute: Any = None, cluster: Cluster | None = None) -> KubernetesServer:
        mock: KubernetesServer = kubernetes_server(execute, cluster)
        _ready(mock)
        return mock

    return make


def test_claims_path_is_the_agents_namespace_collection() -> None:
    assert CLAIMS == "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/agents/sandboxclaims"
    assert claims_path("agents") == CLAIMS


def test_k8s_lists_no_claims(kubernetes_server: Any) -> None:
    mock = kubernetes_server()
    response = requests.get(mock.url + CLAIMS + "?limit=1", timeout=TIMEOUT)
    assert response.status_code == 200
    assert response.json()["items"] == []
    assert response.json()["kind"] == "SandboxClaimList"
    assert response.headers["content-type"] == "application/json"


def test_k8s_create_stores_the_claim_and_it_lives_until_deleted(kubernetes_server: Any) -> None:
    mock = kubernetes_server()
    created = requests.post(
        mock.url + CLAIMS,
        data=b'{"metadata":{"name":"c1"},"spec":{"warmPoolRef":{"name":"p"}},"x":1}',
        timeout=TIMEOUT,
    )
    assert created.status_code == 201
    assert (created.json()["metadata"]["name"], created.json()["x"]) == ("c1", 1)
    assert mock.live_claims == ["c1"]
    deleted = requests.delete(mock.url + CLAIMS + "/c1", timeout=TIMEOUT)
    assert (deleted.status_code, deleted.json()["metadata"]["name"]) == (200, "c1")
    assert mock.live_claims == []


def test_k8s_claim_is_ready_from_the_second_poll_with_its_pool_sandbox(
    kubernetes_server: Any,
) -> None:
    mock = kubernetes_server()
    _create(mock)
    polls = [requests.get(mock.url + CLAIMS + "/c1", timeout=TIMEOUT).json() for _ in range(2)]
    assert [p["status"]["conditions"][0]["status"] for p in polls] == ["False", "True"]
    assert polls[1]["status"]["sandbox"] == {"name": "pool-c1"}


def test_k8s_never_ready_keeps_every_poll_not_ready(kubernetes_server: Any) -> None:
    mock = kubernetes_server(None, Cluster(never_ready=True))
    _create(mock)
    for _ in range(3):
        status = requests.get(mock.url + CLAIMS + "/c1", timeout=TIMEOUT).json()["status"]
        assert status["conditions"][0]["status"] == "False"


def test_k8s_reports_pod_ips_when_the_cluster_has_one(kubernetes_server: Any) -> None:
    mock = kubernetes_server(None, Cluster(pod_ip="10.0.0.7"))
    _create(mock)
    url = mock.url + CLAIMS + "/c1"
    sandbox = [requests.get(url, timeout=TIMEOUT).json() for _ in range(2)][1]["status"]["sandbox"]
    assert sandbox == {"name": "pool-c1", "podIPs": ["10.0.0.7"]}


def test_k8s_token_is_required_on_every_request_and_echoed_when_wrong(
    kubernetes_server: Any,
) -> None:
    mock = kubernetes_server(None, Cluster(token="expected-000000"))
    wrong = requests.get(
        mock.url + CLAIMS, headers={"Authorization": "Bearer wrong-000000"}, timeout=TIMEOUT
    )
    assert wrong.status_code == 401
    assert wrong.json() == {"message": "Unauthorized: Bearer wrong-000000"}
    missing = _execute(mock, "true")
    assert (missing.status_code, missing.json()) == (401, {"message": "Unauthorized: no token"})
    right = requests.get(
        mock.url + CLAIMS, headers={"Authorization": "Bearer expected-000000"}, timeout=TIMEOUT
    )
    assert right.status_code == 200


def test_k8s_create_status_answers_an_rbac_refusal_echoing_the_bearer(
    kubernetes_server: Any,
) -> None:
    mock = kubernetes_server(None, Cluster(create_status=403))
    response = _create(mock, Authorization="Bearer b-000000")
    assert response.status_code == 403
    assert response.json() == {
        "kind": "Status",
        "reason": "Forbidden",
        "message": "sandboxclaims is forbidden: Bearer b-000000 cannot create resource "
        '"sandboxclaims" in namespace "agents"',
    }
    assert mock.live_claims == []


def test_k8s_failed_delete_leaves_the_claim_live(kubernetes_server: Any) -> None:
    mock = kubernetes_server(None, Cluster(delete_status=500))
    _create(mock)
    deleted = requests.delete(mock.url + CLAIMS + "/c1", timeout=TIMEOUT)
    assert (deleted.status_code, deleted.json()) == (500, {"message": "etcd unavailable"})
    assert mock.live_claims == ["c1"]


def test_k8s_expired_claim_is_gone_from_api_router_and_live_claims(
    ready_cluster: Callable[..., KubernetesServer],
) -> None:
    cluster = Cluster()
    mock = ready_cluster(None, cluster)
    cluster.expired.add("c1")
    assert requests.get(mock.url + CLAIMS + "/c1", timeout=TIMEOUT).status_code == 404
    assert requests.patch(mock.url + CLAIMS + "/c1", json={}, timeout=TIMEOUT).status_code == 404
    assert _execute(mock, "true", "pool-c1").status_code == 404
    assert mock.live_claims == []


def test_k8s_router_gone_sandbox_is_404_while_the_api_still_serves_it(
    ready_cluster: Callable[..., KubernetesServer],
) -> None:
    mock = ready_cluster(None, Cluster(router_gone={"c1"}))
    assert requests.patch(mock.url + CLAIMS + "/c1", json={}, timeout=TIMEOUT).status_code == 200
    assert requests.get(mock.url + CLAIMS + "/c1", timeout=TIMEOUT).status_code == 200
    assert _execute(mock, "true", "pool-c1").json() == {}
    assert _execute(mock, "true", "pool-c1").status_code == 404


def test_k8s_real_router_answers_502_for_gone_sandboxes_and_a_missing_pod_ip(
    ready_cluster: Callable[..., KubernetesServer],
) -> None:
    mock = ready_cluster(None, Cluster(router_gone={"c1"}, pod_ip="10.0.0.7", real_router=True))
    _ready(mock, "c2")
    gone = _execute(mock, "true", "pool-c1")
    assert (gone.status_code, gone.json()) == (
        502,
        {"detail": "Could not connect to the backend sandbox: pool-c1"},
    )
    assert _execute(mock, "true", "pool-c2").status_code == 502
    assert _execute(mock, "true", "pool-c2", **{"X-Sandbox-Pod-IP": "10.0.0.7"}).status_code == 200


def test_k8s_patch_gate_holds_every_patch_until_set(
    ready_cluster: Callable[..., KubernetesServer], pool: ThreadPoolExecutor
) -> None:
    gate = threading.Event()
    mock = ready_cluster(None, Cluster(patch_gate=gate))
    url = mock.url + CLAIMS + "/c1"
    pending = pool.submit(requests.patch, url, json={}, timeout=TIMEOUT)
    recorded = mock.wait_for("PATCH", CLAIMS + "/c1", timeout=TIMEOUT)
    assert recorded.json() == {}
    with pytest.raises(TimeoutError):
        pending.result(0.1)
    gate.set()
    assert pending.result(TIMEOUT).status_code == 200


def test_k8s_close_releases_the_patch_gate(
    ready_cluster: Callable[..., KubernetesServer], pool: ThreadPoolExecutor
) -> None:
    gate = threading.Event()
    mock = ready_cluster(None, Cluster(patch_gate=gate))
    pending = pool.submit(requests.patch, mock.url + CLAIMS + "/c1", json={}, timeout=TIMEOUT)
    mock.wait_for("PATCH", timeout=TIMEOUT)
    mock.close()
    assert gate.is_set()
    with pytest.raises(requests.ConnectionError):
        pending.result(1.0)


def test_k8s_execute_answers_the_result_with_stderr_defaulted(
    ready_cluster: Callable[..., KubernetesServer],
) -> None:
    commands: list[str] = []

    def execute(command: str) -> dict[str, Any]:
        commands.append(command)
        return {"stdout": "hi\n"}

    mock = ready_cluster(execute)
    response = _execute(mock, "env /bin/sh -c 'echo hi'")
    assert response.json() == {"stderr": "", "stdout": "hi\n"}
    assert commands == ["env /bin/sh -c 'echo hi'"]


def test_k8s_execute_default_answer_is_empty_with_exit_zero(
    ready_cluster: Callable[..., KubernetesServer],
) -> None:
    mock = ready_cluster()
    assert _execute(mock, "true").json() == {"stderr": "", "stdout": "", "exit_code": 0}


@pytest.mark.parametrize(
    ("command", "line"),
    [
        ("env /bin/sh -c 'printf piship-sandbox-ready'", "unset"),
        ("env 'PISHIP_PROBE_UNLISTED=1' /bin/sh -c 'printf piship-sandbox-ready'", "1"),
    ],
)
def test_k8s_answers_the_activation_check_itself(
    ready_cluster: Callable[..., KubernetesServer], command: str, line: str
) -> None:
    mock = ready_cluster(lambda command: {"status": 500})
    assert _execute(mock, command).json() == {
        "stderr": "",
        "stdout": f"piship-sandbox-ready {line}\n",
        "exit_code": 0,
    }


def test_k8s_status_answer_names_the_bearer(
    ready_cluster: Callable[..., KubernetesServer],
) -> None:
    mock = ready_cluster(lambda command: {"status": 403})
    response = _execute(mock, "forbidden", Authorization="Bearer b-000000")
    assert response.status_code == 403
    assert response.json() == {
        "message": "forbidden: Bearer b-000000 may not execute in this sandbox"
    }


def test_k8s_body_answer_is_sent_verbatim(ready_cluster: Callable[..., KubernetesServer]) -> None:
    mock = ready_cluster(lambda command: {"body": "not json"})
    response = _execute(mock, "x")
    assert (response.status_code, response.text) == (200, "not json")


def test_k8s_drop_answers_nothing_after_recording_the_command(
    ready_cluster: Callable[..., KubernetesServer],
) -> None:
    mock = ready_cluster(lambda command: {"drop": True})
    with pytest.raises(requests.ConnectionError):
        _execute(mock, "deploy")
    assert mock.find("POST", "/execute")[0].json() == {"command": "deploy"}


def test_k8s_after_holds_the_answer_until_the_event_is_set(
    ready_cluster: Callable[..., KubernetesServer], pool: ThreadPoolExecutor
) -> None:
    done = threading.Event()
    mock = ready_cluster(lambda command: {"stdout": "long\n", "after": done})
    pending = pool.submit(_execute, mock, "long job")
    mock.wait_for("POST", "/execute", timeout=TIMEOUT)
    with pytest.raises(TimeoutError):
        pending.result(0.1)
    done.set()
    assert pending.result(TIMEOUT).json()["stdout"] == "long\n"


def test_k8s_hung_execute_is_recorded_and_dropped_on_close(
    ready_cluster: Callable[..., KubernetesServer], pool: ThreadPoolExecutor
) -> None:
    mock = ready_cluster(lambda command: {"hang": True})
    pending = pool.submit(_execute, mock, "sleep 600")
    assert mock.wait_for("POST", "/execute", timeout=TIMEOUT).json() == {"command": "sleep 600"}
    started = time.monotonic()
    mock.close()
    assert time.monotonic() - started < 0.1
    with pytest.raises(requests.ConnectionError):
        pending.result(1.0)


def test_k8s_serves_claims_of_any_namespace(kubernetes_server: Any) -> None:
    mock = kubernetes_server()
    created = requests.post(mock.url + claims_path("default"), json=_claim("c9"), timeout=TIMEOUT)
    assert created.status_code == 201
    assert mock.live_claims == ["c9"]


def test_k8s_unknown_paths_are_404_json(kubernetes_server: Any) -> None:
    mock = kubernetes_server()
    response = requests.get(mock.url + "/api/v1/pods", timeout=TIMEOUT)
    assert (response.status_code, response.json()) == (404, {})


# ---------------------------------------------------------------- plugin


def test_fixture_factories_close_every_server_they_made() -> None:
    fixture = _closing_factory(E2bServer)
    make = next(fixture)
    servers = [make(), make(health=503)]
    assert requests.get(servers[1].url + "/health", timeout=TIMEOUT).status_code == 503
    with pytest.raises(StopIteration):
        next(fixture)
    assert all(server.closing for server in servers)


def test_doubles_work_as_plain_context_managers() -> None:
    with E2bServer() as e2b, KubernetesServer() as k8s:
        assert requests.get(e2b.url + "/health", timeout=TIMEOUT).status_code == 204
        assert requests.get(k8s.url + CLAIMS, timeout=TIMEOUT).status_code == 200
    assert e2b.closing and k8s.closing


@pytest.mark.parametrize("name", ["E2bServer", "KubernetesServer", "RecordingServer"])
def test_importing_a_double_without_werkzeug_names_the_extra_to_install(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setitem(sys.modules, "werkzeug", None)  # what a missing module looks like
    for module in ("recorder", "e2b_server", "kubernetes_server"):
        monkeypatch.delitem(sys.modules, f"piship_remote.testing.{module}", raising=False)
    with pytest.raises(ImportError, match=re.escape("pip install 'piship-remote[test]'")):
        getattr(importlib.import_module("piship_remote.testing"), name)
