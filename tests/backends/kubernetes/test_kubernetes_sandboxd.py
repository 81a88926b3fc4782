"""The Kubernetes backend on agent-sandbox 1.0's sandboxd, against
``KubernetesServer(runtime="sandboxd")``: output streams live, commands take input and a
terminal, a cancel, a timeout or Ctrl-C kills the command's process group and the claim
keeps serving; the runtime is chosen from the claim's template; faults on demand."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.seed import assert_no_library_thread_left, kubernetes

pytest.importorskip("grpc", reason="pip install 'piship-remote[sandboxd]'")

from piship_remote import (
    CommandCancelled,
    CommandTimeout,
    PiShipError,
    Sandbox,
    SandboxPool,
    activate_sandbox,
)
from piship_remote.model.errors import COMMAND_FAILED, CONFIG_INVALID, SANDBOX_UNAVAILABLE
from piship_remote.testing import CLAIMS, KubernetesServer
from piship_remote.testing.k8s_sandboxd import START_PATH

POLICY = {"required": True, "network": {"mode": "allow"}, "environment": {"allow": ["GREETING"]}}
WITHIN = 10.0
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def server() -> Iterator[KubernetesServer]:
    with KubernetesServer(runtime="sandboxd") as running:
        yield running


@pytest.fixture
def activate(server: KubernetesServer, workspace: Path) -> Iterator[Callable[..., Sandbox]]:
    sandboxes: list[Sandbox] = []

    def start(**options: Any) -> Sandbox:
        backend = kubernetes(server.url, **options)
        sandbox = activate_sandbox(POLICY, backend=backend, workspace=workspace, env={})
        sandboxes.append(sandbox)
        return sandbox

    yield start
    for sandbox in sandboxes:
        sandbox.dispose()
    assert_no_library_thread_left()


@pytest.fixture
def sandbox(activate: Callable[..., Sandbox]) -> Sandbox:
    return activate()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers: it is dead once its state says so
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[-1][:1] != "Z"
    except FileNotFoundError:
        return False


def wait_for_file(path: Path) -> str:
    deadline = time.monotonic() + WITHIN
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.01)
    raise AssertionError(f"{path} never appeared")


# -- live output, input, a terminal ------------------------------------------------------


def test_the_first_chunk_arrives_before_the_command_ends(sandbox: Sandbox) -> None:
    seen: list[tuple[float, bytes]] = []
    started = time.monotonic()
    result = sandbox.exec(
        "for i in 1 2 3; do echo $i; sleep 1; done",
        on_data=lambda chunk: seen.append((time.monotonic(), chunk)),
    )
    ended = time.monotonic()
    assert result.exit_code == 0
    assert b"".join(chunk for _, chunk in seen) == b"1\n2\n3\n"
    assert seen[0][1] == b"1\n"
    assert seen[0][0] < ended - 1.5 and seen[0][0] - started < 1.5


def test_cat_echoes_what_send_stdin_sent(sandbox: Sandbox) -> None:
    handle = sandbox.start("cat", stdin=True)
    handle.send_stdin("hello from the host\n")
    handle.send_stdin(b"\x00\xffbytes")
    handle.close_stdin()
    result = handle.wait(timeout=WITHIN)
    assert result.exit_code == 0
    assert result.stdout == "hello from the host\n\x00\ufffdbytes"


def test_exec_with_stdin_feeds_the_chunks_then_ends_the_input(sandbox: Sandbox) -> None:
    result = sandbox.run("wc -c", stdin=iter([b"abc", b"de"]))
    assert result.stdout.strip() == "5"


def test_a_command_without_input_reads_end_of_file(sandbox: Sandbox) -> None:
    assert sandbox.run("cat; echo done", timeout=WITHIN).stdout == "done\n"


def test_pty_true_reports_a_terminal_and_resize_reaches_it(sandbox: Sandbox) -> None:
    handle = sandbox.start(
        "tty; stty size; read line; stty size", pty=True, stdin=True, timeout=WITHIN
    )
    assert handle.pid is not None
    output = ""
    for _, chunk in handle:
        output += chunk.decode()
        if "24 80" in output and "go" not in output:
            handle.resize(120, 40)
            handle.send_stdin("go\n")
    lines = output.replace("\r", "").splitlines()
    assert lines[0].startswith("/dev/pts/")
    assert lines[1] == "24 80"
    assert lines[-1] == "40 120"
    assert handle.wait(timeout=WITHIN).exit_code == 0


def test_a_handle_iterates_its_output_as_it_comes(sandbox: Sandbox) -> None:
    handle = sandbox.start("echo out; echo err >&2; sleep 0.2; echo late")
    chunks = list(handle)
    assert ("stdout", b"out\n") in chunks and ("stderr", b"err\n") in chunks
    assert chunks[-1] == ("stdout", b"late\n")
    assert handle.wait(timeout=WITHIN).exit_code == 0


def test_env_cwd_and_exit_code_reach_the_command(sandbox: Sandbox, workspace: Path) -> None:
    (workspace / "deeper").mkdir()
    sandbox.exec("mkdir -p deeper")
    result = sandbox.run(
        "echo $GREETING; basename $(pwd); exit 7", cwd=workspace / "deeper", env={"GREETING": "hi"}
    )
    assert (result.exit_code, result.stdout) == (7, "hi\ndeeper\n")


# -- ending a command: the claim keeps serving -------------------------------------------


def test_cancel_ends_sleep_and_its_children_within_a_second(
    sandbox: Sandbox, server: KubernetesServer, tmp_path: Path
) -> None:
    cancel = threading.Event()
    child_file = tmp_path / "child.pid"
    errors: list[BaseException] = []

    def run() -> None:
        try:
            sandbox.exec(f"sleep 600 & echo $! > {child_file}; sleep 600", cancel=cancel)
        except BaseException as error:
            errors.append(error)

    runner = threading.Thread(target=run)
    runner.start()
    child = int(wait_for_file(child_file))
    cancelled = time.monotonic()
    cancel.set()
    runner.join(WITHIN)
    while alive(child) and time.monotonic() - cancelled < 1.0:
        time.sleep(0.01)
    assert not alive(child), "the command's child outlived the cancel by 1 s"
    assert time.monotonic() - cancelled < 1.0
    assert len(errors) == 1 and isinstance(errors[0], CommandCancelled)
    assert sandbox.exec("echo next").exit_code == 0
    assert len(server.live_claims) == 1  # the same claim, not retired


def test_ctrl_c_kills_the_process_group_and_the_next_command_succeeds(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    child_file = tmp_path / "child.pid"

    def interrupt() -> None:
        wait_for_file(child_file)
        signal.raise_signal(signal.SIGINT)

    interrupter = threading.Thread(target=interrupt, daemon=True)
    interrupter.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            sandbox.exec(f"sleep 600 & echo $! > {child_file}; sleep 600")
        interrupted = time.monotonic()
    finally:
        signal.signal(signal.SIGINT, previous)
    interrupter.join()
    child = int(child_file.read_text())
    while alive(child) and time.monotonic() - interrupted < 1.0:
        time.sleep(0.01)
    assert not alive(child)
    assert sandbox.exec("echo next").exit_code == 0


def test_a_timeout_kills_the_command_and_keeps_the_claim(
    sandbox: Sandbox, server: KubernetesServer
) -> None:
    with pytest.raises(CommandTimeout):
        sandbox.exec("sleep 600", timeout=0.5)
    claims = list(server.live_claims)
    assert sandbox.exec("echo again").exit_code == 0
    assert server.live_claims == claims


def test_kill_ends_a_started_command_with_sigkill_and_keeps_the_claim(
    sandbox: Sandbox, server: KubernetesServer
) -> None:
    claims = list(server.live_claims)
    handle = sandbox.start("sleep 600")
    assert handle.pid is not None
    assert handle.kill() is True
    assert handle.wait(timeout=WITHIN).exit_code == 137
    assert sandbox.exec("true").exit_code == 0
    assert server.live_claims == claims


# -- faults on demand --------------------------------------------------------------------


def test_a_stream_dropped_after_output_is_an_unknown_outcome_and_the_claim_serves_on(
    sandbox: Sandbox, server: KubernetesServer
) -> None:
    server.faults.drop_stream_after_output()
    seen = bytearray()
    with pytest.raises(PiShipError) as caught:
        sandbox.exec("echo partial; sleep 600", on_data=seen.extend)
    assert caught.value.code == SANDBOX_UNAVAILABLE
    assert "outcome is unknown" in str(caught.value)
    assert bytes(seen) == b"partial\n"
    assert sandbox.exec("echo fine").exit_code == 0


def test_a_stalled_start_ends_at_the_timeout(sandbox: Sandbox, server: KubernetesServer) -> None:
    server.faults.stall(START_PATH)
    with pytest.raises(CommandTimeout):
        sandbox.exec("echo never", timeout=0.5)
    assert sandbox.exec("echo fine").exit_code == 0


def test_input_to_a_process_sandboxd_does_not_know_is_command_failed(
    sandbox: Sandbox, server: KubernetesServer
) -> None:
    handle = sandbox.start("cat", stdin=True)
    assert handle.pid is not None
    server.faults.lose_processes()
    with pytest.raises(PiShipError) as caught:
        handle.send_stdin("x")
    assert caught.value.code == COMMAND_FAILED
    handle.close_stdin()
    assert handle.wait(timeout=WITHIN).exit_code == 0


# -- which runtime, and without the extra ------------------------------------------------


def test_auto_reads_the_template_and_goes_through_the_pod_port_forward(
    sandbox: Sandbox, server: KubernetesServer
) -> None:
    assert sandbox.exec("echo via-sandboxd").exit_code == 0
    forwards = [r.path for r in server.requests if r.path.endswith("/portforward?ports=9090")]
    assert forwards and all("/pods/pool-piship-" in path for path in forwards)
    assert not any(r.path == "/execute" for r in server.requests)


def test_python_runtime_forces_the_router(
    activate: Callable[..., Sandbox], server: KubernetesServer
) -> None:
    sandbox = activate(runtime="python-runtime")
    sandbox.exec("echo hi")
    assert any(r.path == "/execute" for r in server.requests)


def test_without_the_extra_a_sandboxd_claim_is_refused_and_deleted(
    server: KubernetesServer, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "grpc", None)
    with pytest.raises(PiShipError) as caught:
        activate_sandbox(POLICY, backend=kubernetes(server.url), workspace=workspace, env={})
    assert caught.value.code == CONFIG_INVALID
    assert "piship-remote[sandboxd]" in (caught.value.user_action or "")
    assert server.live_claims == []


def test_forced_sandboxd_without_the_extra_creates_no_claim(
    server: KubernetesServer, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "grpc", None)
    backend = kubernetes(server.url, runtime="sandboxd")
    with pytest.raises(PiShipError) as caught:
        activate_sandbox(POLICY, backend=backend, workspace=workspace, env={})
    assert caught.value.code == CONFIG_INVALID
    assert server.count("POST", CLAIMS) == 0


def test_the_plain_install_imports_no_grpc() -> None:
    probe = (
        "import sys, piship_remote, piship_remote.backends.kubernetes.backend, "
        "piship_remote.testing; print('grpc' in sys.modules, 'google.protobuf' in sys.modules)"
    )
    answer = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert answer.stdout.split() == ["False", "False"]


# -- through the router's gRPC proxy -----------------------------------------------------


def test_the_router_route_runs_commands_and_files_without_a_port_forward(
    server: KubernetesServer, workspace: Path
) -> None:
    server.cluster.router_token = "router-secret"
    backend = kubernetes(
        server.url,
        sandboxd_proxy=f"grpc://{server.sandboxd_proxy}",
        router_credential=lambda: "router-secret",
    )
    with activate_sandbox(POLICY, backend=backend, workspace=workspace, env={}) as sandbox:
        seen = bytearray()
        assert sandbox.exec("echo through the router", on_data=seen.extend).exit_code == 0
        assert bytes(seen) == b"through the router\n"
        handle = sandbox.start("cat", stdin=True)
        handle.send_stdin("typed\n")
        handle.close_stdin()
        assert handle.wait(timeout=WITHIN).stdout == "typed\n"
        sandbox.files.write("routed/file.txt", b"routed")
        assert sandbox.files.read("routed/file.txt") == b"routed"
    assert not any("/portforward" in r.path for r in server.requests)
    rest = [r for r in server.requests if r.path.startswith("/v1/files/")]
    assert rest and all(r.headers.get("x-sandbox-port") == "8080" for r in rest)
    assert all(r.headers.get("authorization") == "Bearer router-secret" for r in rest)
    assert_no_library_thread_left()


def test_the_router_proxy_refuses_a_call_without_its_token(
    server: KubernetesServer, workspace: Path
) -> None:
    server.cluster.router_token = "router-secret"
    backend = kubernetes(server.url, sandboxd_proxy=f"grpc://{server.sandboxd_proxy}")
    with pytest.raises(PiShipError) as caught:
        activate_sandbox(POLICY, backend=backend, workspace=workspace, env={})
    assert "sandboxd did not start the command (UNAUTHENTICATED" in str(caught.value)
    assert server.live_claims == []


@pytest.mark.parametrize(
    "proxy", ["grpc://router.example.com:9090", "http://127.0.0.1:9090", "grpcs://no-port"]
)
def test_a_sandboxd_proxy_must_be_grpcs_or_loopback(proxy: str) -> None:
    with pytest.raises(ValueError, match="sandboxd_proxy"):
        kubernetes("http://127.0.0.1:1", sandboxd_proxy=proxy)


def test_a_pool_maps_tasks_over_sandboxd_claims(server: KubernetesServer, workspace: Path) -> None:
    with SandboxPool(
        POLICY, backend=kubernetes(server.url), workspace=workspace, size=2, progress=False
    ) as pool:
        results = pool.map("echo item {item}", ["a", "b", "c"], timeout=WITHIN)
    assert [(r.outcome, r.value.stdout) for r in results] == [
        ("ok", "item a\n"),
        ("ok", "item b\n"),
        ("ok", "item c\n"),
    ]
    assert server.live_claims == []
    assert not any(r.path == "/execute" for r in server.requests)
