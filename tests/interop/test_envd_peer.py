"""Our client against an independent envd: the e2b wheel's Process stubs on connectrpc.

The peer (``envd_peer.py``) runs every command for real in ``/bin/bash`` and follows
envd's process semantics; the Connect framing and JSON codec are the official
``connectrpc`` runtime's, not ours. Three groups:

- the peer is faithful: raw wire checks, and the official SDK accepts it;
- the seed's e2b scenarios, through ``activate_sandbox``, against the peer;
- real-peer behaviour the seed's mock cannot show (keepalive, real signals, deadlines).
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.support.optional_peers import install_hint

pytest.importorskip("e2b.envd.process.process_connect", reason=install_hint("interop"))

import requests
from e2b import CommandExitException, Sandbox, TimeoutException
from envd_peer import ENVD_PATH, ControlPlane, EnvdPeer, PeerProcess

from piship_remote.backends.e2b.backend import E2bCompatibleBackend
from piship_remote.model.errors import CommandCancelled, CommandTimeout, PiShipError
from piship_remote.sandbox.activation import Sandbox as PiSandbox
from piship_remote.testing import leaks
from piship_remote.wire.connect import EnvelopeReader, Frame, connect_envelope
from tests.support.seed import Seed, host_values_in, wire

pytestmark = [pytest.mark.interop, pytest.mark.timeout(20)]

TOKEN = "envd-peer-token-0001"
START = "/process.Process/Start"
SEND_SIGNAL = "/process.Process/SendSignal"

Backends = Callable[..., E2bCompatibleBackend]


# -- fixtures ----------------------------------------------------------------------------


@pytest.fixture
def sandbox_home(root: Path) -> Path:
    """The sandbox user's home on the peer (the backend's workdir), with ``sub``."""
    (root / "sandbox-home" / "sub").mkdir(parents=True)
    return root / "sandbox-home"


@pytest.fixture
def peers(sandbox_home: Path) -> Iterator[Callable[..., EnvdPeer]]:
    """A factory of peers (``EnvdPeer`` options), all closed at teardown."""
    made: list[EnvdPeer] = []

    def make(**options: Any) -> EnvdPeer:
        peer = EnvdPeer(**{"home": sandbox_home, "access_token": TOKEN, **options})
        made.append(peer)
        return peer

    yield make
    for peer in made:
        peer.close()


@pytest.fixture
def envd(peers: Callable[..., EnvdPeer]) -> EnvdPeer:
    return peers()


@pytest.fixture
def control(envd: EnvdPeer) -> Iterator[ControlPlane]:
    with ControlPlane(envd) as plane:
        yield plane


@pytest.fixture
def backends(sandbox_home: Path) -> Iterator[Backends]:
    """``backends(control, envd, **options)``: our client for that pair, closed at teardown."""
    made: list[E2bCompatibleBackend] = []

    def make(control: ControlPlane, envd: EnvdPeer, **options: Any) -> E2bCompatibleBackend:
        backend = E2bCompatibleBackend(
            endpoint=control.url,
            envd_url=envd.url,
            **{"template": "piship-workspace", "workdir": str(sandbox_home), **options},
        )
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


class Session:
    """One activated sandbox over the peer, with the seed's ``run`` helper."""

    def __init__(self, sandbox: PiSandbox, workspace: Path) -> None:
        self.sandbox = sandbox
        self.workspace = workspace

    def run(
        self,
        command: str,
        *,
        cwd: Path | None = None,
        timeout: float | None = 10.0,
        on_data: Callable[[bytes], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> tuple[int, bytes]:
        output = bytearray()

        def collect(chunk: bytes) -> None:
            output.extend(chunk)
            if on_data is not None:
                on_data(chunk)

        result = self.sandbox.exec(
            command,
            self.workspace if cwd is None else cwd,
            on_data=collect,
            timeout=timeout,
            cancel=cancel,
        )
        return result.exit_code, bytes(output)

    def dispose(self) -> None:
        self.sandbox.dispose()


Activate = Callable[..., Session]


@pytest.fixture
def activate(backends: Backends, workspace: Path, home: Path) -> Activate:
    """``activate(control, envd, network="deny", **backend_options)``: the seed's activation."""

    def activate_on(
        control: ControlPlane, envd: EnvdPeer, network: str = "deny", **options: Any
    ) -> Session:
        backend = backends(control, envd, **options)
        return Session(Seed(workspace, home, network).activate(backend), workspace)

    return activate_on


@pytest.fixture
def session(control: ControlPlane, envd: EnvdPeer, activate: Activate) -> Iterator[Session]:
    session = activate(control, envd)
    yield session
    session.dispose()


def start_request(request: Any) -> dict[str, Any]:
    message: dict[str, Any] = EnvelopeReader().push(request.body)[0].message
    return message


def tagged(tag: str) -> Callable[[PeerProcess], bool]:
    return lambda process: process.tag == tag


def raw_start(
    envd: EnvdPeer,
    script: str,
    headers: Mapping[str, str] | None = None,
    *,
    process_cwd: str | None = None,
) -> tuple[requests.Response, list[Frame]]:
    """POST a StartRequest by hand (as the SDK shapes it); the response and its frames."""
    process: dict[str, Any] = {"cmd": "/bin/bash", "args": ["-l", "-c", script]}
    if process_cwd is not None:
        process["cwd"] = process_cwd
    body = connect_envelope({"process": process, "stdin": False})
    response = requests.post(
        envd.url + START,
        data=body,
        headers={
            "Content-Type": "application/connect+json",
            "Connect-Protocol-Version": "1",
            "X-Access-Token": TOKEN,
            **(headers or {}),
        },
        timeout=10,
    )
    if not response.headers.get("content-type", "").startswith("application/connect"):
        return response, []
    return response, EnvelopeReader().push(response.content)


def events(frames: list[Frame]) -> list[dict[str, Any]]:
    return [frame.message["event"] for frame in frames if not frame.end_stream]


# -- the peer is faithful ------------------------------------------------------------------


def test_peer_omits_a_zero_exit_code_and_ends_with_an_empty_end_of_stream(
    envd: EnvdPeer,
) -> None:
    response, frames = raw_start(envd, "echo hi")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/connect+json"
    assert events(frames)[0]["start"]["pid"] > 0
    assert events(frames)[1] == {"data": {"stdout": base64.b64encode(b"hi\n").decode()}}
    assert events(frames)[-1] == {"end": {"exited": True, "status": "exit status 0"}}
    assert frames[-1].end_stream and frames[-1].message == {}


def test_peer_reports_a_non_zero_exit_with_code_and_error(envd: EnvdPeer) -> None:
    _, frames = raw_start(envd, "exit 3")
    assert events(frames)[-1] == {
        "end": {"exitCode": 3, "exited": True, "status": "exit status 3", "error": "exit status 3"}
    }


def test_peer_kills_the_process_when_the_connect_deadline_expires(envd: EnvdPeer) -> None:
    _, frames = raw_start(envd, "exec sleep 30", {"Connect-Timeout-Ms": "300"})
    assert frames[-1].end_stream
    assert frames[-1].message["error"] == {
        "code": "deadline_exceeded",
        "message": "context deadline exceeded",
    }
    assert envd.processes()[-1].wait() == -9


def test_peer_sends_keepalives_while_the_process_is_silent(
    peers: Callable[..., EnvdPeer],
) -> None:
    envd = peers(keepalive_interval=0.05)
    _, frames = raw_start(envd, "sleep 0.3; echo done")
    assert {"keepalive": {}} in events(frames)
    assert events(frames)[-1]["end"]["status"] == "exit status 0"


def test_peer_refuses_a_wrong_access_token_with_plain_json(envd: EnvdPeer) -> None:
    response, _ = raw_start(envd, "true", {"X-Access-Token": "wrong"})
    assert response.status_code == 401
    assert response.json()["code"] == 401
    assert envd.processes() == []


def test_peer_refuses_a_missing_cwd_inside_the_stream(envd: EnvdPeer) -> None:
    response, frames = raw_start(envd, "true", process_cwd="/nonexistent/dir")
    assert response.status_code == 200
    assert frames[-1].end_stream
    assert frames[-1].message["error"] == {
        "code": "invalid_argument",
        "message": "cwd '/nonexistent/dir' does not exist",
    }
    assert envd.processes() == []


def test_official_sdk_runs_commands_on_the_peer(envd: EnvdPeer, control: ControlPlane) -> None:
    sandbox = sdk_sandbox(control, envd)
    result = sandbox.commands.run("echo hello; echo oops >&2", timeout=10)
    assert (result.stdout, result.stderr, result.exit_code) == ("hello\n", "oops\n", 0)
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("exit 7", timeout=10)
    assert failed.value.exit_code == 7
    assert sandbox.kill() is True
    assert control.live_sandboxes == []


def test_official_sdk_timeout_is_a_server_side_kill_on_the_peer(
    envd: EnvdPeer, control: ControlPlane
) -> None:
    sandbox = sdk_sandbox(control, envd)
    with pytest.raises(TimeoutException):
        sandbox.commands.run("exec sleep 30", timeout=0.3)
    assert envd.wait_for(START).headers["connect-timeout-ms"] == "300"
    assert envd.processes()[-1].wait() == -9
    sandbox.kill()


def test_official_sdk_kill_ends_a_background_command_with_minus_one(
    envd: EnvdPeer, control: ControlPlane
) -> None:
    sandbox = sdk_sandbox(control, envd)
    handle = sandbox.commands.run("exec sleep 30", background=True, timeout=10)
    assert handle.kill() is True
    with pytest.raises(CommandExitException) as killed:
        handle.wait()
    assert killed.value.exit_code == -1
    assert killed.value.error == "signal: killed"
    signal_body = envd.wait_for(SEND_SIGNAL).json()
    assert signal_body == {"process": {"pid": handle.pid}, "signal": "SIGNAL_SIGKILL"}
    assert sandbox.commands.kill(handle.pid) is False  # envd: not_found once it is gone
    sandbox.kill()


def sdk_sandbox(control: ControlPlane, envd: EnvdPeer) -> Sandbox:
    return Sandbox.create(
        api_key="e2b_0", api_url=control.url, sandbox_url=envd.url, request_timeout=10
    )


# -- the seed's e2b scenarios against the peer ------------------------------------------------


def test_activation_runs_the_readiness_check_for_real(session: Session, envd: EnvdPeer) -> None:
    # seed: "creates, checks, runs, and deletes a sandbox" (the check half)
    report = session.sandbox.report
    assert (report.level, report.adapter, report.verification) == (
        "enforced",
        "e2b-compatible",
        "backend-attested",
    )
    check = envd.processes()[0]
    assert "piship-sandbox-ready" in check.config.args[2]
    assert check.output == [("stdout", b"piship-sandbox-ready unset\n")]


def test_creates_runs_in_the_mapped_cwd_and_deletes(
    control: ControlPlane, envd: EnvdPeer, activate: Activate, workspace: Path, sandbox_home: Path
) -> None:
    # seed: "creates, checks, runs, and deletes a sandbox"
    session = activate(control, envd)
    assert session.run("pwd", cwd=workspace / "sub") == (0, f"{sandbox_home}/sub\n".encode())
    assert session.run("exit 3")[0] == 3
    session.dispose()
    calls = [(r.method, r.path) for r in control.requests]
    sandbox_path = calls[2][1].removesuffix("/timeout")
    assert calls == [
        ("GET", "/health"),
        ("POST", "/sandboxes"),
        *[("POST", f"{sandbox_path}/timeout")] * 3,
        ("DELETE", sandbox_path),
    ]
    assert control.live_sandboxes == []
    for request in envd.requests:
        assert request.headers["x-access-token"] == TOKEN
        assert request.headers["authorization"] == "Basic " + base64.b64encode(b"user:").decode()
        assert request.headers["e2b-sandbox-port"] == "49983"


def test_maps_the_workspace_root_onto_the_workdir_and_allows_network_only_when_asked(
    control: ControlPlane, envd: EnvdPeer, activate: Activate, sandbox_home: Path
) -> None:
    # seed: "maps the workspace onto a configured workdir and allows the network only when asked"
    session = activate(control, envd, network="allow")
    assert session.run("pwd") == (0, f"{sandbox_home}\n".encode())
    session.dispose()
    create = next(r for r in control.requests if r.path == "/sandboxes")
    assert create.json()["allow_internet_access"] is True


def test_sends_the_control_plane_key_only_to_the_control_plane(
    envd: EnvdPeer, activate: Activate
) -> None:
    # seed: "sends a required API key only as X-API-Key to the control plane, ..."
    key = "fake-sandbox-key-SENTINEL-0101"
    with ControlPlane(envd, api_key=key) as plane:
        session = activate(plane, envd, credential=lambda: key)
        assert session.run("true") == (0, b"")
        session.dispose()
        assert leaks(plane.requests, key, ["x-api-key"]) == []
        assert all(r.headers["x-api-key"] == key for r in plane.requests if r.path != "/health")
    assert leaks(envd.requests, key) == []


def test_large_output_arrives_byte_for_byte_across_32_kib_frames(
    session: Session, envd: EnvdPeer
) -> None:
    expected = "".join(f"{n}\n" for n in range(1, 40001)).encode()
    assert session.run("seq 1 40000") == (0, expected)
    assert len(envd.processes()[-1].output) > 1


def test_streams_stdout_and_stderr_as_they_come(session: Session, sandbox_home: Path) -> None:
    # The command waits for a file the test creates only once "first" arrived: it can
    # only finish if output is streamed while it runs.
    go = sandbox_home / "go"

    def on_data(chunk: bytes) -> None:
        if b"first" in chunk:
            go.touch()

    code, output = session.run(
        "echo first; echo warn >&2; while [ ! -e ~/go ]; do sleep 0.01; done; echo second",
        on_data=on_data,
    )
    assert code == 0
    assert sorted(output.decode().splitlines()) == ["first", "second", "warn"]
    assert output.decode().index("first") < output.decode().index("second")


def test_sends_only_approved_variables_and_the_peer_adds_its_own(
    session: Session, envd: EnvdPeer, sandbox_home: Path
) -> None:
    # seed: "sends only approved, non-host variables and no credentials"
    code, output = session.run("env")
    assert code == 0
    seen = dict(line.split("=", 1) for line in output.decode().splitlines() if "=" in line)
    assert seen["LANG"] == "C.UTF-8"
    assert seen["DOCS_MODE"] == "demo"
    assert seen["PATH"] == ENVD_PATH
    assert seen["HOME"] == str(sandbox_home)
    assert "UNLISTED_VARIABLE" not in seen
    assert start_request(envd.requests[-1])["process"]["envs"] == {
        "LANG": "C.UTF-8",
        "DOCS_MODE": "demo",
    }
    host_paths = ("/home/alice", "/opt/host/bin")
    assert host_values_in(wire(envd.requests), *host_paths) == []
    assert host_values_in(output.decode(), *host_paths) == []


def test_timeout_kills_the_remote_process(session: Session, envd: EnvdPeer) -> None:
    # seed: "kills the remote process on timeout and reports PiShip's outcome"
    with pytest.raises(CommandTimeout, match=r"^timeout:0\.3$"):
        session.run("exec sleep 600", timeout=0.3)
    signal_request = envd.wait_for(SEND_SIGNAL)
    tag = start_request(envd.requests[-2])["tag"]
    assert signal_request.json() == {"process": {"tag": tag}, "signal": "SIGNAL_SIGKILL"}
    assert signal_request.headers["content-type"] == "application/json"
    process = envd.wait_for_process(tagged(tag))
    assert process.wait() == -9
    assert session.run("true") == (0, b"")


def test_cancel_kills_the_remote_process(session: Session, envd: EnvdPeer) -> None:
    cancel = threading.Event()

    def on_data(chunk: bytes) -> None:
        if b"started" in chunk:
            cancel.set()

    with pytest.raises(CommandCancelled, match=r"^aborted$"):
        session.run("echo started; exec sleep 600", on_data=on_data, cancel=cancel)
    tag = envd.wait_for(SEND_SIGNAL).json()["process"]["tag"]
    assert envd.wait_for_process(tagged(tag)).wait() == -9
    assert session.run("echo again") == (0, b"again\n")


def test_a_signalled_process_is_a_signal_exit(session: Session, envd: EnvdPeer) -> None:
    # seed: "maps envd's -1 for a signalled process to a signal exit"
    assert session.run("kill -9 $$")[0] == 1
    assert envd.processes()[-1].wait() == -9


def test_utf8_split_across_frames_arrives_intact(session: Session, envd: EnvdPeer) -> None:
    code, output = session.run(r"printf '\342\202'; sleep 0.2; printf '\254 done\n'")
    assert code == 0
    assert output.decode() == "€ done\n"
    assert envd.processes()[-1].output == [("stdout", b"\xe2\x82"), ("stdout", b"\xac done\n")]


def test_one_byte_frames_reassemble_multibyte_text(
    peers: Callable[..., EnvdPeer], activate: Activate
) -> None:
    envd = peers(chunk_size=1)
    with ControlPlane(envd) as plane:
        session = activate(plane, envd)
        text = "héllo wörld € 𝄞\n"
        assert session.run(f"printf '%s\\n' '{text.strip()}'") == (0, text.encode())
        assert len(envd.processes()[-1].output) == len(text.encode())
        session.dispose()


def test_keepalives_hold_an_idle_stream_open(
    peers: Callable[..., EnvdPeer], activate: Activate
) -> None:
    envd = peers(keepalive_interval=0.03)
    with ControlPlane(envd) as plane:
        session = activate(plane, envd, stream_idle_timeout=0.15)
        assert session.run("sleep 0.5; echo done") == (0, b"done\n")
        session.dispose()


def test_a_silent_stream_without_keepalives_hits_the_idle_timeout(
    envd: EnvdPeer, control: ControlPlane, activate: Activate
) -> None:
    session = activate(control, envd, stream_idle_timeout=0.15)
    with pytest.raises(PiShipError, match="interrupted") as failed:
        session.run("exec sleep 5")
    assert "outcome is unknown" in str(failed.value)
    session.dispose()


def test_a_missing_remote_cwd_is_reported(session: Session, workspace: Path) -> None:
    (workspace / "only-on-host").mkdir()
    with pytest.raises(PiShipError, match="invalid_argument") as failed:
        session.run("pwd", cwd=workspace / "only-on-host")
    assert "does not exist" in str(failed.value)


def test_an_unknown_envd_user_is_refused_and_root_works_when_configured(
    peers: Callable[..., EnvdPeer], activate: Activate
) -> None:
    # seed: "runs commands as root for a CubeSandbox-style service when configured"
    envd = peers(users=("root",), default_user="root")
    with ControlPlane(envd) as plane:
        with pytest.raises(PiShipError) as refused:
            activate(plane, envd)
        assert refused.value.code == "SANDBOX_UNAVAILABLE"
        assert "unauthenticated" in str(refused.value)
        assert plane.live_sandboxes == []
        session = activate(plane, envd, user="root")
        assert session.run("echo $USER") == (0, b"root\n")
        session.dispose()


def test_a_wrong_envd_token_fails_activation_without_leaking_it(
    peers: Callable[..., EnvdPeer], activate: Activate
) -> None:
    envd = peers(access_token="the-real-envd-token-0002")
    with ControlPlane(envd, envd_token="a-stale-envd-token-0003") as plane:
        with pytest.raises(PiShipError) as refused:
            activate(plane, envd)
    assert refused.value.code == "SANDBOX_UNAVAILABLE"
    assert "HTTP 401" in str(refused.value)
    assert "a-stale-envd-token-0003" not in str(refused.value)
    assert envd.processes() == []


def test_concurrent_commands_each_get_their_own_stream(session: Session) -> None:
    results: dict[int, tuple[int, bytes]] = {}

    def run(n: int) -> None:
        results[n] = session.run(f"sleep 0.1; echo {n}; exit {n}")

    threads = [threading.Thread(target=run, args=(n,), name=f"piship-test-{n}") for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert results == {n: (n, f"{n}\n".encode()) for n in range(4)}


def test_dispose_mid_command_deletes_the_sandbox_and_its_processes(
    control: ControlPlane, envd: EnvdPeer, activate: Activate
) -> None:
    session = activate(control, envd)
    disposer = threading.Thread(target=session.dispose, name="piship-test-dispose")

    def on_data(chunk: bytes) -> None:
        if b"started" in chunk:
            disposer.start()

    with pytest.raises(PiShipError, match="disposed"):
        session.run("echo started; exec sleep 600", on_data=on_data)
    # The command ends as soon as dispose aborts it; the delete follows on that thread.
    disposer.join(10)
    process = envd.processes()[-1]
    assert process.wait() == -9
    assert control.live_sandboxes == []
