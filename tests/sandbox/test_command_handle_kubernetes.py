"""``Sandbox.start`` on the Kubernetes double: what the router refuses, and ``kill`` as a cancel
(the claim retired on the router path, the process group killed in detached mode)."""

from __future__ import annotations

import shlex
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from piship_remote import (
    CommandHandle,
    PiShipError,
    Sandbox,
    activate_sandbox,
)
from piship_remote.testing import CLAIMS, Cluster, KubernetesServer
from tests.support.seed import assert_no_library_thread_left, kubernetes

POLICY = {"required": True, "network": {"mode": "allow"}, "environment": {"allow": ["LANG"]}}
WITHIN = 10.0
KubernetesFactory = Callable[..., KubernetesServer]
pytestmark = pytest.mark.timeout(60)


def hang_sleep(command: str) -> Mapping[str, Any]:
    return {"hang": True} if "sleep" in command else {"stdout": "ok\n"}


@pytest.fixture
def activated(workspace: Path) -> Iterator[Callable[..., Sandbox]]:
    sandboxes: list[Sandbox] = []

    def activate(url: str, **options: Any) -> Sandbox:
        sandbox = activate_sandbox(
            POLICY, backend=kubernetes(url, **options), workspace=workspace, env={}
        )
        sandboxes.append(sandbox)
        return sandbox

    yield activate
    for sandbox in sandboxes:
        sandbox.dispose()
    assert_no_library_thread_left()


@pytest.mark.parametrize(
    ("options", "refused"),
    [({"stdin": True}, "standard input"), ({"pty": True}, "terminal")],
)
def test_the_router_refuses_input_and_a_terminal_before_running_anything(
    kubernetes_server: KubernetesFactory,
    activated: Callable[..., Sandbox],
    options: dict[str, bool],
    refused: str,
) -> None:
    mock = kubernetes_server(hang_sleep)
    sandbox = activated(mock.url)
    sent = len(mock.requests)

    with pytest.raises(PiShipError, match=refused) as caught:
        sandbox.start("cat", **options)

    assert caught.value.code == "CONFIG_INVALID"
    assert len(mock.requests) == sent


@pytest.mark.parametrize(
    "call",
    [
        lambda handle: handle.send_stdin("x"),
        lambda handle: handle.close_stdin(),
        lambda handle: handle.resize(100, 30),
    ],
    ids=["send_stdin", "close_stdin", "resize"],
)
def test_a_router_commands_input_and_terminal_are_refused(
    kubernetes_server: KubernetesFactory,
    activated: Callable[..., Sandbox],
    call: Callable[[CommandHandle], None],
) -> None:
    sandbox = activated(kubernetes_server(hang_sleep).url)
    handle = sandbox.start("echo hi")

    with pytest.raises(PiShipError) as caught:
        call(handle)

    assert caught.value.code == "CONFIG_INVALID"
    assert handle.wait(timeout=WITHIN).stdout == "ok\n"


def test_a_router_command_has_no_pid(
    kubernetes_server: KubernetesFactory, activated: Callable[..., Sandbox]
) -> None:
    sandbox = activated(kubernetes_server(hang_sleep).url)
    handle = sandbox.start("echo hi")

    assert handle.pid is None
    assert handle.wait(timeout=WITHIN).stdout == "ok\n"


def test_kill_on_the_router_path_retires_the_claim(
    kubernetes_server: KubernetesFactory, activated: Callable[..., Sandbox]
) -> None:
    mock = kubernetes_server(hang_sleep)
    sandbox = activated(mock.url)
    handle = sandbox.start("sleep 600")
    claim = mock.wait_for("POST", CLAIMS, timeout=WITHIN).json()["metadata"]["name"]
    mock.wait_for("POST", "/execute", timeout=WITHIN)

    assert handle.kill() is True

    assert handle.wait(timeout=WITHIN).exit_code == 137
    assert mock.wait_for("DELETE", f"{CLAIMS}/{claim}", timeout=WITHIN) is not None


class ShellRuntime:
    """The runtime's ``execute`` run for real in ``base`` (split like the runtime, in its own
    session, as the detached jobs need)."""

    def __init__(self, base: Path) -> None:
        self.base = base

    def __call__(self, command: str) -> dict[str, Any]:
        done = subprocess.run(
            shlex.split(command),
            cwd=self.base,
            env={"PATH": "/usr/bin:/bin", "TMPDIR": str(self.base)},
            capture_output=True,
            start_new_session=True,
            timeout=30,
        )
        return {"stdout": done.stdout, "stderr": done.stderr, "exit_code": done.returncode}


def test_kill_in_detached_mode_ends_the_process_group_and_keeps_the_claim(
    tmp_path: Path, activated: Callable[..., Sandbox]
) -> None:
    runtime = ShellRuntime(tmp_path)
    with KubernetesServer(runtime, Cluster(proxy_timeout=2)) as fake:
        sandbox = activated(fake.url, execution="detached")
        child = tmp_path / "child.pid"
        handle = sandbox.start(f"sh -c 'sleep 600 & echo $! > {child}; echo up; wait'")
        assert next(iter(handle)) == ("stdout", b"up\n")
        sleeper = int(child.read_text())

        assert handle.kill() is True

        killed = handle.wait(timeout=WITHIN)
        assert (killed.exit_code, killed.stdout) == (137, "up\n")
        assert _gone(sleeper)
        assert sandbox.run("echo again").stdout == "again\n"
        assert fake.count("POST", CLAIMS) == 1
        assert fake.count("DELETE") == 0
        sandbox.dispose()


def _gone(pid: int) -> bool:
    """Whether process ``pid`` ended (a zombie counts as ended), waiting up to ``WITHIN``."""
    ended = threading.Event()
    for _ in range(int(WITHIN / 0.05)):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        ended.wait(0.05)
    return False
