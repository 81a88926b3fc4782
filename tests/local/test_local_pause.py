"""Pausing and resuming a local sandbox: E2B's pause, resume and connect, and what they hold.

A paused sandbox's processes are frozen (its freezer cgroup here, ``SIGSTOP`` on a
host without one), its files stay, envd answers for it as for a missing sandbox,
and listings say ``paused``. Resuming lets the same processes carry on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from piship_remote.local import LocalE2bService
from piship_remote.local.isolation.limits import CgroupSet
from piship_remote.local.sandbox.pause import PauseState, tree_pids
from tests.support.local_service import Client, gone, marked, marker, needs_bwrap

pytestmark = pytest.mark.timeout(60)

TICKER = (
    "nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/tick; sleep 0.02; done'"
    " >/dev/null 2>&1 & echo $!"
)


def pause(client: Client, sandbox: dict[str, Any], **body: Any) -> int:
    return client.control("POST", f"/sandboxes/{sandbox['sandboxID']}/pause", json=body).status_code


def state(client: Client, sandbox: dict[str, Any]) -> str:
    detail: dict[str, Any] = client.control("GET", f"/sandboxes/{sandbox['sandboxID']}").json()
    return str(detail["state"])


def until(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``check`` (a process's progress has no event to wait on) until true or timeout."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def process_states(pids: list[int]) -> set[str]:
    states = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                states.add(handle.read().rpartition(b")")[2].split()[0].decode())
        except OSError:
            continue
    return states


def is_held(service: LocalE2bService, sandbox_id: str) -> bool:
    """Whether the sandbox's processes are frozen by its cgroup, or all stopped."""
    found = service._registry.lookup(sandbox_id)
    assert found is not None
    cgroups = found._vm.cgroups
    if cgroups.freezer is not None:
        name = "cgroup.events" if cgroups.version == "v2" else "freezer.state"
        with open(f"{cgroups.freezer}/{name}", encoding="ascii") as handle:
            text = handle.read()
        return "FROZEN" in text or "frozen 1" in text
    return process_states(tree_pids(found._vm.init_pid)) == {"T"}


@needs_bwrap
def test_pause_answers_204_and_the_sandbox_is_listed_paused(
    client: Client, sandbox: dict[str, Any]
) -> None:
    assert pause(client, sandbox) == 204
    assert state(client, sandbox) == "paused"
    listed = client.control("GET", "/v2/sandboxes").json()
    assert [(s["sandboxID"], s["state"]) for s in listed] == [(sandbox["sandboxID"], "paused")]
    assert client.control("GET", "/v2/sandboxes?state=running").json() == []
    assert client.control("GET", "/sandboxes").json() == []  # v1 lists running ones only


@needs_bwrap
def test_a_second_pause_is_409_and_resuming_a_running_sandbox_is_409(
    client: Client, sandbox: dict[str, Any]
) -> None:
    sandbox_id = sandbox["sandboxID"]
    assert client.control("POST", f"/sandboxes/{sandbox_id}/resume", json={}).status_code == 409
    assert pause(client, sandbox) == 204
    second = client.control("POST", f"/sandboxes/{sandbox_id}/pause", json={})
    assert second.status_code == 409
    assert second.json() == {"code": 409, "message": f'sandbox "{sandbox_id}" is already paused'}
    assert client.control("POST", "/sandboxes/nope/pause", json={}).status_code == 404


@needs_bwrap
def test_envd_answers_a_paused_sandbox_as_a_missing_one(
    client: Client, sandbox: dict[str, Any]
) -> None:
    assert pause(client, sandbox) == 204
    response = client.session.post(
        client.service.envd_url + "/process.Process/List",
        json={},
        headers=client.envd_headers(sandbox),
        timeout=5,
    )
    assert response.status_code == 502
    assert response.json() == {
        "sandboxId": sandbox["sandboxID"],
        "message": "The sandbox was not found",
        "code": 502,
    }


@needs_bwrap
def test_pausing_freezes_every_process_and_resuming_lets_the_same_ones_run(
    service: LocalE2bService, client: Client, sandbox: dict[str, Any]
) -> None:
    pid = client.run(sandbox, TICKER).stdout.strip()
    tick = f"{service.sandbox_home(sandbox['sandboxID'])}/../tmp/tick"
    assert until(lambda: _read(tick) > 0)
    assert pause(client, sandbox) == 204
    assert is_held(service, sandbox["sandboxID"])
    frozen_at = _read(tick)
    resumed = client.control("POST", f"/sandboxes/{sandbox['sandboxID']}/resume", json={})
    assert resumed.status_code == 201
    assert resumed.json()["envdAccessToken"] == sandbox["envdAccessToken"]
    assert until(lambda: _read(tick) > frozen_at + 2)
    assert client.run(sandbox, f"kill -0 {pid} && echo alive").stdout == "alive\n"


@needs_bwrap
def test_files_written_before_a_pause_are_there_after_it(
    client: Client, sandbox: dict[str, Any]
) -> None:
    client.run(sandbox, "echo kept > ~/kept.txt")
    assert pause(client, sandbox) == 204
    connect = client.control("POST", f"/v2/sandboxes/{sandbox['sandboxID']}/connect", json={})
    assert connect.status_code == 201
    assert client.run(sandbox, "cat ~/kept.txt").stdout == "kept\n"


@needs_bwrap
def test_connect_resumes_a_paused_sandbox_with_201_and_a_running_one_is_200(
    client: Client, sandbox: dict[str, Any]
) -> None:
    path = f"/v2/sandboxes/{sandbox['sandboxID']}/connect"
    assert client.control("POST", path, json={"timeout": 60}).status_code == 200
    assert pause(client, sandbox) == 204
    assert client.control("POST", path, json={"timeout": 60}).status_code == 201
    assert state(client, sandbox) == "running"


@needs_bwrap
def test_a_paused_sandbox_lifetime_stops_and_resume_gives_a_new_one(
    client: Client, sandbox: dict[str, Any]
) -> None:
    sandbox_id = sandbox["sandboxID"]
    before = time.time()
    assert pause(client, sandbox) == 204
    detail = client.control("GET", f"/sandboxes/{sandbox_id}").json()
    assert _seconds(detail["endAt"]) - before < 5  # its clock stopped at the pause
    renew = client.control("POST", f"/sandboxes/{sandbox_id}/timeout", json={"timeout": 9})
    assert renew.status_code == 404
    assert client.control("POST", f"/sandboxes/{sandbox_id}/resume", json={}).status_code == 201
    detail = client.control("GET", f"/sandboxes/{sandbox_id}").json()
    left = _seconds(detail["endAt"]) - time.time()
    assert 10 < left <= 15  # E2B's resume default


@needs_bwrap
def test_metrics_of_a_paused_sandbox_are_empty(client: Client, sandbox: dict[str, Any]) -> None:
    assert pause(client, sandbox) == 204
    metrics = client.control("GET", f"/sandboxes/{sandbox['sandboxID']}/metrics")
    assert (metrics.status_code, metrics.json()) == (200, [])


@needs_bwrap
def test_deleting_a_paused_sandbox_ends_its_frozen_processes(
    client: Client, sandbox: dict[str, Any]
) -> None:
    mark = marker()
    client.run(sandbox, f"nohup sleep {mark} >/dev/null 2>&1 &")
    # Polled: a command line read while its process is in execve can come back empty.
    assert gone(lambda: bool(marked(mark)))
    assert pause(client, sandbox) == 204
    assert client.control("DELETE", f"/sandboxes/{sandbox['sandboxID']}").status_code == 204
    assert gone(lambda: not marked(mark))


def test_without_a_freezer_pausing_stops_the_whole_tree_and_resuming_continues_it() -> None:
    mark = marker()
    child = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess; subprocess.run(['sleep', '{mark}'])"]
    )
    try:
        assert until(lambda: len(tree_pids(child.pid)) == 2)
        state = PauseState(CgroupSet(None, None, None), lambda: child.pid)
        assert state.pause() is True
        assert process_states(tree_pids(child.pid)) == {"T"}
        assert state.pause() is False
        assert state.resume() is True
        assert until(lambda: "T" not in process_states(tree_pids(child.pid)))
    finally:
        for pid in reversed(tree_pids(child.pid)):
            os.kill(pid, signal.SIGKILL)
        child.wait(5)


def test_without_a_freezer_a_tree_that_does_not_stop_in_time_is_continued_and_the_pause_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from piship_remote.local.sandbox import pause as pause_module

    monkeypatch.setattr(pause_module, "_held", lambda pid: False)
    monkeypatch.setattr(pause_module, "STOP_TIMEOUT", 0.0)
    child = subprocess.Popen(["sleep", marker()])
    try:
        state = PauseState(CgroupSet(None, None, None), lambda: child.pid)
        with pytest.raises(OSError, match="did not stop in time"):
            state.pause()
        assert state.paused_at is None
        assert until(lambda: "T" not in process_states([child.pid]))
    finally:
        child.kill()
        child.wait(5)


def _read(path: str) -> int:
    try:
        with open(path, encoding="ascii") as handle:
            return int(handle.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def _seconds(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def test_a_v1_group_left_freezing_by_a_fork_is_asked_again_with_a_thaw_between(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from piship_remote.local.isolation import limits

    written: list[str] = []
    monkeypatch.setattr(limits, "_write", lambda path, text: written.append(text))
    monkeypatch.setattr(limits, "FREEZE_POLL", 0.0)
    stuck_for = limits.V1_THAW_EVERY + 5  # a pass of the kernel misses a new child until then
    monkeypatch.setattr(limits, "_holds", lambda path, text: written.count("FROZEN") > stuck_for)
    group = CgroupSet("v1", None, None, freezer=str(tmp_path))
    assert group.freeze() is True
    assert written.count("FROZEN") == stuck_for + 1
    assert written.count("THAWED") == 1
    assert written.index("THAWED") == limits.V1_THAW_EVERY - 1  # after that many passes
