"""The Kubernetes double's sandboxd answers as sandboxd does: its REST surface's statuses and
shapes, and the ``ProcessService``'s status codes and process groups."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import requests

pytest.importorskip("grpc", reason="pip install 'piship-remote[sandboxd]'")

import grpc

from piship_remote._sandboxd import process_pb2 as pb
from piship_remote._sandboxd.process_rpc import ProcessStub
from piship_remote.testing.faults import Faults
from piship_remote.testing.k8s_sandboxd import SandboxdPod

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def pod() -> Iterator[SandboxdPod]:
    started = SandboxdPod("pool-test", Faults())
    yield started
    started.close()


@pytest.fixture
def rest(pod: SandboxdPod) -> str:
    return f"http://127.0.0.1:{pod.rest_port}/v1"


@pytest.fixture
def stub(pod: SandboxdPod) -> Iterator[ProcessStub]:
    channel = grpc.insecure_channel(f"127.0.0.1:{pod.grpc_port}")
    yield ProcessStub(channel)
    channel.close()


def config(script: str, cwd: str | None = None) -> pb.ProcessConfig:
    made = pb.ProcessConfig(command=["/bin/sh", "-c", script])
    if cwd is not None:
        made.cwd = cwd
    return made


# -- REST ----------------------------------------------------------------------------------


def test_put_creates_parents_and_get_lists_a_directory_as_json(rest: str) -> None:
    assert (
        requests.put(f"{rest}/files/src/main.py?mode=0755", data=b"print(1)\n").status_code == 204
    )
    listing = requests.get(f"{rest}/files/src")
    assert listing.headers["Content-Type"] == "application/json"
    [entry] = listing.json()["entries"]
    assert (entry["name"], entry["size"], entry["type"], entry["mode"]) == (
        "main.py",
        9,
        "file",
        "0755",
    )
    assert listing.json()["path"] == "src"
    assert requests.get(f"{rest}/files/src/main.py").content == b"print(1)\n"


def test_a_path_out_of_the_root_is_403_permission_denied(rest: str) -> None:
    answer = requests.get(f"{rest}/files/..%2F..%2Fetc%2Fpasswd")
    assert answer.status_code == 403
    assert answer.json()["code"] == "PERMISSION_DENIED"


def test_a_non_empty_directory_needs_recursive(rest: str) -> None:
    requests.put(f"{rest}/files/d/f", data=b"x")
    refused = requests.delete(f"{rest}/files/d")
    assert (refused.status_code, refused.json()["code"]) == (409, "CONFLICT")
    assert requests.delete(f"{rest}/files/d?recursive=true").status_code == 204
    assert requests.get(f"{rest}/files/d").json()["code"] == "NOT_FOUND"


def test_a_bad_mode_is_400_and_health_is_ok(rest: str) -> None:
    answer = requests.put(f"{rest}/files/f?mode=777", data=b"x")
    assert (answer.status_code, answer.json()["code"]) == (400, "INVALID_ARGUMENT")
    assert requests.get(f"{rest}/health").json()["status"] == "ok"


# -- ProcessService ------------------------------------------------------------------------


def test_start_streams_init_output_and_exit(stub: ProcessStub, pod: SandboxdPod) -> None:
    events = list(stub.start(pb.StartRequest(config=config("echo out; echo err >&2; exit 4"))))
    kinds = [event.WhichOneof("event") for event in events]
    assert kinds[0] == "init" and kinds[-1] == "exit"
    assert events[-1].exit.exit_code == 4
    assert b"".join(e.stdout for e in events) == b"out\n"
    assert b"".join(e.stderr for e in events) == b"err\n"


def test_a_command_starts_in_the_root_and_a_cwd_outside_it_is_permission_denied(
    stub: ProcessStub, pod: SandboxdPod
) -> None:
    answer = stub.execute(pb.ExecuteRequest(config=config("pwd")))
    assert answer.stdout.decode().strip() == pod.root
    with pytest.raises(grpc.RpcError) as caught:
        stub.execute(pb.ExecuteRequest(config=config("pwd", cwd="../..")))
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_unknown_process_is_not_found_and_resize_without_a_terminal_is_refused(
    stub: ProcessStub,
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub.send_signal(pb.SendSignalRequest(process_id=999, signal=pb.SIGNAL_SIGKILL))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    call = stub.start(pb.StartRequest(config=config("sleep 600")))
    pid = next(call).init.process_id
    with pytest.raises(grpc.RpcError) as refused:
        stub.resize_tty(pb.ResizeTTYRequest(process_id=pid, cols=10, rows=10))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    stub.send_signal(pb.SendSignalRequest(process_id=pid, signal=pb.SIGNAL_SIGTERM))
    assert [e.exit.exit_code for e in call if e.WhichOneof("event") == "exit"] == [-1]


def test_send_signal_reaches_the_whole_process_group(stub: ProcessStub, pod: SandboxdPod) -> None:
    call = stub.start(pb.StartRequest(config=config("sleep 600 & echo $!; wait")))
    pid = next(call).init.process_id
    child = int(next(call).stdout)
    stub.send_signal(pb.SendSignalRequest(process_id=pid, signal=pb.SIGNAL_SIGKILL))
    list(call)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    """Running (a zombie no longer runs)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(") ", 1)[-1][:1] != "Z"
    except OSError:
        return False


def test_a_closed_pod_leaves_no_thread_behind() -> None:
    started = SandboxdPod("pool-threads", Faults())
    channel = grpc.insecure_channel(f"127.0.0.1:{started.grpc_port}")
    list(ProcessStub(channel).start(pb.StartRequest(config=config("echo x"))))
    channel.close()
    started.close()
    deadline = time.monotonic() + 5.0
    while _sandboxd_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _sandboxd_threads() == []


def _sandboxd_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("piship-double-sandboxd")]
