"""The official E2B Python SDK's lifecycle calls against the local service: pause and
resume (by ``connect``), paused listings, metrics, and watching a directory.

The SDK is pointed at loopback with ``api_url`` and ``sandbox_url``; nothing leaves
the machine. Polls wait for what they expect, with a deadline.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from local_e2b import local_e2b_service

from tests.support.optional_peers import install_hint

pytest.importorskip("e2b", reason=install_hint("interop"))

from e2b import (
    FilesystemEventType,
    Sandbox,
    SandboxException,
    SandboxNotRunningException,
    SandboxQuery,
    SandboxState,
)
from e2b.envd.rpc import is_transport_failure
from sdk_target import Target

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]

TICKER = (
    "nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/tick; sleep 0.05; done'"
    " >/dev/null 2>&1 & echo $!"
)


@pytest.fixture
def target() -> Iterator[Target]:
    with local_e2b_service() as service:
        yield Target(service.url, service.api_key)


@pytest.fixture
def sandbox(target: Target) -> Iterator[Sandbox]:
    sandbox = target.create()
    yield sandbox
    sandbox.kill()


def test_pause_is_true_then_false_and_the_sandbox_is_not_running(
    target: Target, sandbox: Sandbox
) -> None:
    assert sandbox.pause() is True
    assert Sandbox.pause(sandbox.sandbox_id, **target.options()) is False  # type: ignore[arg-type]
    assert sandbox.beta_pause() is False
    assert sandbox.is_running() is False
    assert sandbox.get_info().state == SandboxState.PAUSED


def test_list_shows_a_paused_sandbox_by_state(target: Target, sandbox: Sandbox) -> None:
    sandbox.pause()
    options = target.options()
    every = Sandbox.list(**options).next_items()  # type: ignore[arg-type]
    assert [(s.sandbox_id, s.state) for s in every] == [(sandbox.sandbox_id, SandboxState.PAUSED)]
    paused = SandboxQuery(state=[SandboxState.PAUSED])
    assert len(Sandbox.list(query=paused, **options).next_items()) == 1  # type: ignore[arg-type]
    running = SandboxQuery(state=[SandboxState.RUNNING])
    assert Sandbox.list(query=running, **options).next_items() == []  # type: ignore[arg-type]


def test_connect_resumes_with_the_files_and_the_background_process_kept(
    target: Target, sandbox: Sandbox
) -> None:
    sandbox.files.write("kept.txt", "kept")
    pid = sandbox.commands.run(TICKER).stdout.strip()
    sandbox.pause()
    resumed = target.connect(sandbox.sandbox_id)
    assert resumed.is_running() is True
    assert resumed.get_info().state == SandboxState.RUNNING
    assert resumed.files.read("kept.txt") == "kept"
    assert resumed.commands.run(f"kill -0 {pid} && echo alive").stdout == "alive\n"
    first = int(resumed.commands.run("cat /tmp/tick").stdout)
    deadline = time.monotonic() + 10
    while int(resumed.commands.run("cat /tmp/tick").stdout) <= first:
        assert time.monotonic() < deadline, "the background process did not carry on"


def test_on_timeout_pause_pauses_at_the_timeout_and_connect_resumes_it(target: Target) -> None:
    sandbox = target.create(lifecycle={"on_timeout": "pause"})
    try:
        assert sandbox.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": False}
        sandbox.files.write("kept.txt", "kept")
        pid = sandbox.commands.run(TICKER).stdout.strip()
        sandbox.set_timeout(0)  # the timeout is reached now
        deadline = time.monotonic() + 10
        while sandbox.get_info().state != SandboxState.PAUSED:
            assert time.monotonic() < deadline, "the sandbox was not paused at its timeout"
            time.sleep(0.05)
        resumed = target.connect(sandbox.sandbox_id)
        assert resumed.get_info().state == SandboxState.RUNNING
        assert resumed.files.read("kept.txt") == "kept"
        assert resumed.commands.run(f"kill -0 {pid} && echo alive").stdout == "alive\n"
    finally:
        sandbox.kill()


KILLED = "The sandbox was killed or reached its end of life while the request was in flight"


def test_a_command_running_when_its_sandbox_is_killed_says_the_sandbox_was_killed(
    target: Target,
) -> None:
    sandbox = target.create()
    handle = sandbox.commands.run("sleep 60", background=True)
    sandbox.kill()
    with pytest.raises(SandboxNotRunningException, match=KILLED):
        handle.wait()


def test_a_killed_sandboxs_command_stream_ends_as_a_dropped_connection(target: Target) -> None:
    # A dropped connection (not an error frame, not an orderly close) is the one end every
    # SDK version reads as "probe the sandbox", the older ones included.
    sandbox = target.create()
    handle = sandbox.commands.run("sleep 60", background=True)
    sandbox.kill()
    with pytest.raises(SandboxNotRunningException) as raised:
        handle.wait()
    assert is_transport_failure(raised.value.__cause__)  # type: ignore[arg-type]


def test_a_command_running_when_its_sandbox_times_out_says_the_sandbox_ended(
    target: Target,
) -> None:
    sandbox = target.create()
    try:
        handle = sandbox.commands.run("sleep 60", background=True)
        sandbox.set_timeout(0)  # the timeout is reached now
        with pytest.raises(SandboxNotRunningException, match=KILLED):
            handle.wait()
    finally:
        sandbox.kill()


def test_get_metrics_returns_one_sample(sandbox: Sandbox) -> None:
    (sample,) = sandbox.get_metrics()
    assert sample.cpu_count >= 1 and sample.mem_total > 0 and sample.disk_total > 0


def test_watch_dir_sees_a_write_and_stop_ends_the_watcher(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("watched")
    handle = sandbox.files.watch_dir("watched")
    sandbox.files.write("watched/a.txt", "a")
    seen: list[tuple[str, FilesystemEventType]] = []
    deadline = time.monotonic() + 10
    while ("a.txt", FilesystemEventType.WRITE) not in seen and time.monotonic() < deadline:
        seen += [(e.name, e.type) for e in handle.get_new_events()]
    assert ("a.txt", FilesystemEventType.CREATE) in seen
    assert ("a.txt", FilesystemEventType.WRITE) in seen
    handle.stop()
    with pytest.raises(SandboxException, match="The watcher is already stopped"):
        handle.get_new_events()


def test_a_recursive_watch_sees_a_file_in_a_new_directory(sandbox: Sandbox) -> None:
    handle = sandbox.files.watch_dir("", recursive=True)
    sandbox.commands.run("mkdir -p ~/new/dir && echo x > ~/new/dir/f")
    names: set[str] = set()
    deadline = time.monotonic() + 10
    while "new/dir/f" not in names and time.monotonic() < deadline:
        names |= {e.name for e in handle.get_new_events()}
    assert {"new", "new/dir", "new/dir/f"} <= names
    handle.stop()
