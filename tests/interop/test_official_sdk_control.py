"""The official E2B Python SDK's control-plane calls against the local service: connect's
timeout rule, list filters, idempotent creates, forks, snapshots and the auto-pause
variants, each as the SDK's own suite checks it.

The SDK is pointed at loopback with ``api_url`` and ``sandbox_url``; nothing leaves
the machine. Polls wait for what they expect, with a deadline.
"""

from __future__ import annotations

import http.client
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from local_e2b import local_e2b_service

from tests.support.optional_peers import install_hint

pytest.importorskip("e2b", reason=install_hint("interop"))

from e2b import (
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
    Template,
)
from sdk_target import Target

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]


@pytest.fixture
def target() -> Iterator[Target]:
    with local_e2b_service() as service:
        yield Target(service.url, service.api_key)


@pytest.fixture
def sandbox(target: Target) -> Iterator[Sandbox]:
    sandbox = target.create(timeout=300)
    yield sandbox
    sandbox.kill()


def test_connect_with_a_shorter_timeout_leaves_the_end_unchanged(
    target: Target, sandbox: Sandbox
) -> None:
    before = sandbox.get_info().end_at
    target.connect(sandbox.sandbox_id, timeout=10)
    assert sandbox.get_info().end_at == before


def test_connect_with_a_longer_timeout_extends_the_end(target: Target, sandbox: Sandbox) -> None:
    before = sandbox.get_info().end_at
    target.connect(sandbox.sandbox_id, timeout=600)
    assert sandbox.get_info().end_at > before


def test_list_started_after_includes_its_start_and_excludes_a_later_time(
    target: Target, sandbox: Sandbox
) -> None:
    started = sandbox.get_info().started_at
    assert target.listed(SandboxQuery(started_after=started)) == [sandbox.sandbox_id]
    later = started + timedelta(seconds=1)
    assert target.listed(SandboxQuery(started_after=later)) == []


def test_list_template_filter_matches_the_sandbox_template_only(
    target: Target, sandbox: Sandbox
) -> None:
    template = sandbox.get_info().template_id
    assert target.listed(SandboxQuery(template=template)) == [sandbox.sandbox_id]
    assert target.listed(SandboxQuery(template="unknown-template")) == []


def test_one_idempotency_key_makes_one_sandbox(target: Target) -> None:
    first = target.create(idempotency_key="build-42")
    try:
        again = target.create(idempotency_key="build-42")
        assert again.sandbox_id == first.sandbox_id
        assert target.listed(SandboxQuery()) == [first.sandbox_id]
    finally:
        first.kill()


def test_an_idempotency_key_reused_for_another_request_is_refused(target: Target) -> None:
    first = target.create(idempotency_key="build-43")
    try:
        with pytest.raises(SandboxException, match="422"):
            target.create(idempotency_key="build-43", metadata={"other": "request"})
    finally:
        first.kill()


def test_a_fork_starts_with_the_files_and_then_goes_its_own_way(
    target: Target, sandbox: Sandbox
) -> None:
    sandbox.files.write("/home/user/state.txt", "before fork")
    (fork,) = sandbox.fork()
    assert isinstance(fork, Sandbox)
    try:
        assert fork.sandbox_id != sandbox.sandbox_id and fork.is_running()
        assert fork.files.read("/home/user/state.txt") == "before fork"
        fork.files.write("/home/user/state.txt", "in fork")
        assert sandbox.files.read("/home/user/state.txt") == "before fork"
    finally:
        fork.kill()


def test_fork_count_makes_that_many_sandboxes(target: Target, sandbox: Sandbox) -> None:
    forks = Sandbox.fork(sandbox.sandbox_id, count=2, timeout=60, **target.options())  # type: ignore[arg-type]
    try:
        assert len({f.sandbox_id for f in forks if isinstance(f, Sandbox)}) == 2
    finally:
        for fork in forks:
            if isinstance(fork, Sandbox):
                fork.kill()


def test_forking_a_killed_sandbox_is_not_found(target: Target) -> None:
    sandbox = target.create()
    sandbox.kill()
    with pytest.raises(SandboxNotFoundException):
        sandbox.fork()


def test_a_sandbox_created_from_a_snapshot_has_its_files(
    target: Target, sandbox: Sandbox
) -> None:
    sandbox.files.make_dir("/home/user/app")
    sandbox.files.write("/home/user/app/data.txt", "kept")
    snapshot = sandbox.create_snapshot()
    made = target.create(snapshot.snapshot_id)
    try:
        assert made.files.read("/home/user/app/data.txt") == "kept"
        assert made.get_info().template_id == snapshot.snapshot_id
    finally:
        made.kill()


def test_snapshots_are_listed_by_sandbox_and_by_name(target: Target, sandbox: Sandbox) -> None:
    snapshot = sandbox.create_snapshot(name="snap-app")
    assert snapshot.names == ["snap-app"]
    options = target.options()

    def ids(**query: object) -> list[str]:
        page = Sandbox.list_snapshots(**query, **options).next_items()  # type: ignore[arg-type]
        return [s.snapshot_id for s in page]

    assert ids(sandbox_id=sandbox.sandbox_id) == [snapshot.snapshot_id]
    assert ids(name="snap-app") == [snapshot.snapshot_id]
    assert ids(name="snap-app-does-not-exist") == []


def test_template_exists_is_true_for_an_offered_template_and_false_for_no_such_name(
    target: Target,
) -> None:
    options = target.options()
    assert Template.exists("base", **options) is True  # type: ignore[arg-type]
    assert Template.exists("nonexistent-name", **options) is False  # type: ignore[arg-type]


def test_template_exists_is_true_for_a_snapshots_name(target: Target, sandbox: Sandbox) -> None:
    sandbox.create_snapshot(name="snap-named")
    assert Template.exists("snap-named", **target.options()) is True  # type: ignore[arg-type]


def test_a_snapshot_is_deleted_once(target: Target, sandbox: Sandbox) -> None:
    snapshot = sandbox.create_snapshot()
    options = target.options()
    assert Sandbox.delete_snapshot(snapshot.snapshot_id, **options) is True  # type: ignore[arg-type]
    assert Sandbox.delete_snapshot(snapshot.snapshot_id, **options) is False  # type: ignore[arg-type]


def _boot_id(sandbox: Sandbox) -> str:
    return sandbox.files.read("/proc/sys/kernel/random/boot_id").strip()


def test_a_filesystem_only_pause_reboots_on_connect_with_the_files_kept(
    target: Target, sandbox: Sandbox
) -> None:
    sandbox.files.write("/home/user/marker.txt", "persisted")
    boot = _boot_id(sandbox)
    assert boot
    assert sandbox.pause(keep_memory=False) is True
    assert sandbox.is_running() is False
    resumed = sandbox.connect()
    assert resumed.is_running() and resumed.sandbox_id == sandbox.sandbox_id
    assert resumed.files.read("/home/user/marker.txt") == "persisted"
    assert _boot_id(resumed) != boot


def test_a_full_pause_resumes_the_same_boot(target: Target, sandbox: Sandbox) -> None:
    boot = _boot_id(sandbox)
    sandbox.pause()
    assert _boot_id(target.connect(sandbox.sandbox_id)) == boot


def test_connect_on_resume_reboot_reboots_a_paused_sandbox(
    target: Target, sandbox: Sandbox
) -> None:
    boot = _boot_id(sandbox)
    sandbox.pause()
    resumed = target.connect(sandbox.sandbox_id, on_resume="reboot")
    assert _boot_id(resumed) != boot


def test_a_filesystem_only_auto_pause_waits_for_connect_then_reboots(target: Target) -> None:
    sandbox = target.create(
        timeout=60, lifecycle={"on_timeout": {"action": "pause", "keep_memory": False}}
    )
    try:
        sandbox.files.write("/home/user/marker.txt", "persisted")
        boot = _boot_id(sandbox)
        sandbox.set_timeout(0)  # the timeout is reached now
        deadline = time.monotonic() + 10
        while sandbox.get_info().state != SandboxState.PAUSED:
            assert time.monotonic() < deadline, "the sandbox was not paused at its timeout"
            time.sleep(0.05)
        assert sandbox.is_running() is False
        resumed = sandbox.connect()
        assert resumed.get_info().state == SandboxState.RUNNING
        assert resumed.files.read("/home/user/marker.txt") == "persisted"
        assert _boot_id(resumed) != boot
    finally:
        sandbox.kill()


SERVE = (
    "mkdir -p /tmp/site && cd /tmp/site && echo up > index.html"
    " && exec python3 -m http.server 8000"
)


def _status(target: Target, path: str, headers: dict[str, str]) -> int:
    """The status of ``GET path`` sent to the service's loopback address with ``headers``
    (``*.localhost`` names need not resolve on the test host)."""
    port = int(target.url.rsplit(":", 1)[1])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path, headers=headers)
        return connection.getresponse().status
    finally:
        connection.close()


def _fetch(target: Target, host: str) -> int:
    return _status(target, "/index.html", {"Host": host})


def _paused_at_timeout(sandbox: Sandbox) -> None:
    """Reach the sandbox's timeout now, and wait (through the control plane only) for the pause."""
    sandbox.set_timeout(0)
    deadline = time.monotonic() + 10
    while sandbox.get_info().state != SandboxState.PAUSED:
        assert time.monotonic() < deadline, "the sandbox was not paused at its timeout"
        time.sleep(0.05)


def _serving(target: Target, sandbox: Sandbox) -> str:
    sandbox.commands.run(SERVE, background=True)
    host = sandbox.get_host(8000)
    deadline = time.monotonic() + 15
    while _fetch(target, host) == 502:
        assert time.monotonic() < deadline, "the server in the sandbox did not start"
        time.sleep(0.1)
    return host


def test_auto_resume_wakes_a_paused_sandbox_on_a_request_to_its_port(target: Target) -> None:
    sandbox = target.create(timeout=60, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        host = _serving(target, sandbox)
        _paused_at_timeout(sandbox)
        assert _fetch(target, host) == 200
        assert sandbox.get_info().state == SandboxState.RUNNING
    finally:
        sandbox.kill()


def test_without_auto_resume_a_port_request_leaves_the_sandbox_paused(target: Target) -> None:
    sandbox = target.create(timeout=60, lifecycle={"on_timeout": "pause", "auto_resume": False})
    try:
        host = _serving(target, sandbox)
        _paused_at_timeout(sandbox)
        assert _fetch(target, host) == 502
        assert sandbox.get_info().state == SandboxState.PAUSED
        sandbox.connect()
        assert sandbox.get_info().state == SandboxState.RUNNING
        assert _fetch(target, host) == 200
    finally:
        sandbox.kill()


def test_update_network_that_changes_nothing_is_accepted(sandbox: Sandbox) -> None:
    sandbox.update_network({})
    sandbox.update_network({"allow_internet_access": False})
    assert sandbox.is_running()


def test_update_network_with_egress_rules_is_refused_saying_why(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxException, match="cannot filter or proxy"):
        sandbox.update_network({"deny_out": ["8.8.8.8"]})


def test_update_network_on_a_killed_sandbox_is_not_found(target: Target) -> None:
    sandbox = target.create()
    sandbox.kill()
    with pytest.raises(SandboxNotFoundException):
        sandbox.update_network({})


def _health(target: Target, headers: dict[str, str]) -> int:
    """``GET /health`` at the stable host form ``sandbox.<domain>``, routed by headers only."""
    stable_host = "sandbox." + target.url.rsplit("//", 1)[1].replace("127.0.0.1", "localhost")
    return _status(target, "/health", {**headers, "Host": stable_host})


def test_the_routing_headers_connect_sets_reach_the_sandbox_by_themselves(
    target: Target, sandbox: Sandbox
) -> None:
    headers = dict(target.connect(sandbox.sandbox_id).connection_config.sandbox_headers)
    assert headers["E2b-Sandbox-Id"] == sandbox.sandbox_id
    assert headers["E2b-Sandbox-Port"] == "49983"
    assert _health(target, headers) == 204
    sandbox.kill()
    assert _health(target, headers) == 502
