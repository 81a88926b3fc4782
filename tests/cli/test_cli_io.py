"""What ``run`` reads and writes: stdin passed on, bytes unchanged, a closed pipe, the sync hint,
and a failed pull told beside the command's own status."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from piship_remote import cli
from piship_remote.model.errors import CONFIG_INVALID, PiShipError
from piship_remote.sandbox.activation import activate_sandbox
from piship_remote.testing import KubernetesServer
from piship_remote.testing.kubernetes_server import Cluster
from tests.support.cli import NEEDS_BWRAP, E2bFactory, cli_process, e2b_environ, use_e2b
from tests.support.files import small_filesystem

API_KEY = "e2b_cli_io_key_0123456789"
K8S_TOKEN = "k8s-cli-io-bearer-0123456789abcdef"
KubernetesFactory = Callable[..., KubernetesServer]
# Every byte value, and sequences that are not UTF-8: a decode would change them.
BINARY = bytes(range(256)) * 139 + b"\xff\xfe\xc3(\x80"
CHILD_WITHIN = 60.0  # seconds a child CLI may take (the local service starts in about one)
pytestmark = pytest.mark.timeout(120)


def cli_bytes(
    *args: str, cwd: Path, given: bytes | None = None, env: dict[str, str] | None = None
) -> tuple[int, bytes, str]:
    """The CLI as a child process fed ``given`` on stdin: status, stdout bytes, stderr."""
    process = cli_process(
        *args, cwd=cwd, env=env, stdin=subprocess.PIPE if given is not None else subprocess.DEVNULL
    )
    try:
        out, err = process.communicate(given, timeout=CHILD_WITHIN)
    finally:
        process.kill()
        process.wait()
    return process.returncode, out, err.decode()


def closed_reader(*args: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    """The CLI with its stdout a pipe whose reader went away before anything was written."""
    process = cli_process(*args, cwd=cwd, env=env)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    try:
        _, err = process.communicate(timeout=CHILD_WITHIN)
    finally:
        process.kill()
        process.wait()
    return process.returncode, err.decode()


# -- standard input and bytes (the local service: a real envd over a real process) -------


@NEEDS_BWRAP
def test_run_passes_standard_input_to_the_command(tmp_path: Path) -> None:
    status, out, err = cli_bytes(
        "run", "--backend", "local", "--", "cat", cwd=tmp_path, given=b"hi\nthere\n"
    )
    assert status == 0, err
    assert out == b"hi\nthere\n"


@NEEDS_BWRAP
def test_the_commands_input_is_closed_at_its_end(tmp_path: Path) -> None:
    status, out, err = cli_bytes(
        "run", "--backend", "local", "--", "wc -c; echo done", cwd=tmp_path, given=b"12345"
    )
    assert status == 0, err
    assert out.split() == [b"5", b"done"]


@NEEDS_BWRAP
def test_no_stdin_passes_nothing(tmp_path: Path) -> None:
    status, out, err = cli_bytes(
        "run", "--backend", "local", "--no-stdin", "--", "wc -c", cwd=tmp_path, given=b"12345"
    )
    assert status == 0, err
    assert out.strip() == b"0"


@NEEDS_BWRAP
def test_binary_output_comes_out_byte_for_byte(tmp_path: Path) -> None:
    status, out, err = cli_bytes(
        "run", "--backend", "local", "--", "cat", cwd=tmp_path, given=BINARY
    )
    assert status == 0, err
    assert out == BINARY


def test_run_sends_stdin_with_send_input_then_closes_it(
    e2b_server: E2bFactory, tmp_path: Path
) -> None:
    mock = e2b_server(api_key=API_KEY, command=lambda start: {"cat": True})
    env = e2b_environ(mock, API_KEY)
    status, out, err = cli_bytes("run", "--", "cat", cwd=tmp_path, given=BINARY, env=env)
    assert status == 0, err
    assert out == BINARY
    start = json.loads([r for r in mock.requests if r.path.endswith("/Start")][-1].body[5:])
    assert start["stdin"] is True
    inputs = [r.path for r in mock.requests if r.path.endswith(("/SendInput", "/CloseStdin"))]
    assert inputs[-1] == "/process.Process/CloseStdin"
    assert inputs.count("/process.Process/CloseStdin") == 1


def test_run_from_dev_null_starts_the_command_without_an_input_pipe(
    e2b_server: E2bFactory, tmp_path: Path
) -> None:
    mock = e2b_server(api_key=API_KEY)
    status, _, err = cli_bytes("run", "--", "true", cwd=tmp_path, env=e2b_environ(mock, API_KEY))
    assert status == 0, err
    start = json.loads([r for r in mock.requests if r.path.endswith("/Start")][-1].body[5:])
    assert start["stdin"] is False
    assert not any(r.path.endswith(("/SendInput", "/CloseStdin")) for r in mock.requests)


@NEEDS_BWRAP
def test_a_closed_output_pipe_ends_run_quietly_with_141(tmp_path: Path) -> None:
    status, err = closed_reader("run", "--backend", "local", "--", "yes", cwd=tmp_path)
    assert status == cli.EXIT_BROKEN_PIPE == 141
    assert "Traceback" not in err
    assert "BrokenPipeError" not in err


def test_doctor_json_into_a_closed_pipe_ends_quietly_with_141(
    e2b_server: E2bFactory, tmp_path: Path
) -> None:
    mock = e2b_server(api_key=API_KEY)
    env = e2b_environ(mock, API_KEY)
    status, err = closed_reader("doctor", "--json", cwd=tmp_path, env=env)
    assert status == 141
    assert "Traceback" not in err
    assert mock.live_sandboxes == []


# -- Kubernetes: its router cannot pass input ----------------------------------------------


def test_input_waiting_for_a_kubernetes_command_is_a_configuration_error(tmp_path: Path) -> None:
    status, _, err = cli_bytes(
        "run", "--backend", "kubernetes", "--", "cat", cwd=tmp_path, given=b"data"
    )
    assert status == cli.EXIT_CONFIG
    assert err.startswith("CONFIG_INVALID: the kubernetes backend cannot pass standard input")
    assert "--no-stdin" in err


@pytest.mark.timeout(30)
def test_the_kubernetes_backend_refuses_input_before_running_anything(
    kubernetes_server: KubernetesFactory, workspace: Path
) -> None:
    from piship_remote.backends.kubernetes.backend import KubernetesAgentSandboxBackend

    ran: list[str] = []
    mock = kubernetes_server(lambda command: ran.append(command) or {}, Cluster(token=K8S_TOKEN))
    backend = KubernetesAgentSandboxBackend(
        endpoint=mock.url,
        router=mock.url,
        template="python-pool",
        namespace="agents",
        credential=lambda: K8S_TOKEN,
    )
    policy = {"required": True, "network": {"mode": "allow"}}
    with activate_sandbox(policy, backend=backend, workspace=workspace) as sandbox:
        before = len(ran)
        with pytest.raises(PiShipError) as refused:
            sandbox.run("cat", stdin=[b"data"])
    assert refused.value.code == CONFIG_INVALID
    assert "cannot pass standard input" in refused.value.message
    assert len(ran) == before


# -- the --sync hint -------------------------------------------------------------------------


SYNC_HINT = "--sync sends them"


@pytest.mark.timeout(30)
def test_run_without_sync_in_a_workspace_with_files_says_sync_sends_them(
    e2b_server: E2bFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    use_e2b(cli_environ, e2b_server(api_key=API_KEY), API_KEY)
    (workspace / "Makefile").write_text("test:\n\ttrue\n")
    assert cli.main(["run", "--workspace", str(workspace), "--", "make test"]) == 0
    hints = [line for line in capsys.readouterr().err.splitlines() if SYNC_HINT in line]
    assert len(hints) == 1


@pytest.mark.timeout(30)
def test_run_in_a_workspace_without_files_gives_no_hint(
    e2b_server: E2bFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    use_e2b(cli_environ, e2b_server(api_key=API_KEY), API_KEY)
    assert cli.main(["run", "--workspace", str(workspace), "--", "true"]) == 0
    assert SYNC_HINT not in capsys.readouterr().err


# -- a pull that fails after the command --------------------------------------------------

# The command writes more than the host's workspace can hold: bringing it back fails.
FILLS_THE_HOST = "head -c 4194304 /dev/zero > big; exit {status}"


@NEEDS_BWRAP
@pytest.mark.parametrize(("command_status", "statuses"), [(4, {4}), (0, {2})])
def test_a_failed_pull_is_told_beside_the_commands_own_status(
    command_status: int, statuses: set[int], tmp_path: Path
) -> None:
    """The CLI exits with the command's status, or the error's when the command exited 0."""
    with small_filesystem(tmp_path / "workspace", "1m") as workspace:
        (workspace / "a").write_text("x\n")
        command = FILLS_THE_HOST.format(status=command_status)
        status, _, err = cli_bytes(
            "run", "--backend", "local", "--sync", "--", command, cwd=workspace
        )
    assert status in statuses, err
    told = f"the command exited with status {command_status}, but bringing its changes back failed"
    assert told in err
    assert "FILE_WRITE_FAILED" in err
    assert "Traceback" not in err


@pytest.mark.timeout(60)
def test_with_runtime_sandboxd_standard_input_reaches_the_command_byte_for_byte(
    tmp_path: Path,
) -> None:
    pytest.importorskip("grpc", reason="pip install 'piship-remote[sandboxd]'")
    with KubernetesServer(runtime="sandboxd") as server:
        status, out, err = cli_bytes(
            *("run", "--backend", "kubernetes", "--runtime", "sandboxd", "--network", "allow"),
            *("--api", server.url, "--router", server.url, "--pool", "python-pool"),
            *("--namespace", "agents", "--", "cat"),
            cwd=tmp_path,
            given=BINARY,
        )
        assert status == 0, err
        assert out == BINARY
        assert server.live_claims == []
