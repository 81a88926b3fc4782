"""The registry of live sandboxes: exit, garbage collection and opt-in signals dispose them."""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from piship_remote.sandbox import lifecycle


class Owner:
    """Stands for a Sandbox façade: only its lifetime matters here."""


@pytest.fixture(autouse=True)
def empty_registry() -> None:
    lifecycle.dispose_all(1.0)


def test_a_tracked_sandbox_is_disposed_by_dispose_all() -> None:
    done = threading.Event()
    owner = Owner()
    lifecycle.track(owner, "sbx-1", done.set)
    assert lifecycle.live_count() == 1
    assert lifecycle.dispose_all(5.0) == []
    assert done.is_set()
    assert lifecycle.live_count() == 0


def test_an_untracked_sandbox_is_left_alone() -> None:
    done = threading.Event()
    owner = Owner()
    lifecycle.untrack(lifecycle.track(owner, "sbx-1", done.set))
    lifecycle.dispose_all(5.0)
    assert not done.is_set()


def test_dispose_all_runs_the_deletions_in_parallel() -> None:
    barrier = threading.Barrier(3, timeout=5)
    owners = [Owner() for _ in range(3)]
    for number, owner in enumerate(owners):
        lifecycle.track(owner, f"sbx-{number}", barrier.wait)
    assert lifecycle.dispose_all(5.0) == []  # each waits for the other two: only parallel passes


def test_dispose_all_gives_up_at_its_deadline_and_names_what_is_left() -> None:
    release = threading.Event()
    owner = Owner()
    lifecycle.track(owner, "sbx-stuck", lambda: release.wait(10))
    try:
        assert lifecycle.dispose_all(0.1) == ["sbx-stuck"]
    finally:
        release.set()


def test_dispose_all_waits_for_a_deletion_an_earlier_call_started() -> None:
    release = threading.Event()
    done = threading.Event()
    owner = Owner()

    def slow() -> None:
        release.wait(10)
        done.set()

    lifecycle.track(owner, "sbx-slow", slow)
    assert lifecycle.dispose_all(0.0) == ["sbx-slow"]  # started, not waited for
    try:
        assert lifecycle.dispose_all(0.1) == ["sbx-slow"]  # still under way: named again
    finally:
        release.set()
    assert lifecycle.dispose_all(5.0) == []
    assert done.is_set()


def test_a_collected_undisposed_sandbox_is_disposed_with_a_resource_warning() -> None:
    done = threading.Event()
    owner = Owner()
    lifecycle.track(owner, "sbx-dropped", done.set)
    with pytest.warns(ResourceWarning, match="sbx-dropped was garbage-collected"):
        del owner
        gc.collect()
    assert done.wait(5)
    assert lifecycle.live_count() == 0


def test_a_failing_deletion_does_not_stop_the_others() -> None:
    done = threading.Event()
    owners = [Owner(), Owner()]

    def fail() -> None:
        raise RuntimeError("boom")

    lifecycle.track(owners[0], "sbx-fails", fail)
    lifecycle.track(owners[1], "sbx-ok", done.set)
    assert lifecycle.dispose_all(5.0) == []
    assert done.is_set()


CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    from piship_remote.sandbox import lifecycle

    class Owner: pass
    owner = Owner()
    marker = Path(sys.argv[1])
    lifecycle.track(owner, "sbx-child", lambda: marker.write_text("disposed"))
    if sys.argv[2] == "signals":
        lifecycle.cleanup_on_signals()
    if sys.argv[2] == "signals-twice":
        lifecycle.cleanup_on_signals()
        lifecycle.cleanup_on_signals()
    if sys.argv[2] == "raise":
        raise SystemExit("uncaught")
    if sys.argv[2] in ("signals", "signals-twice", "plain-signal"):
        print("ready", flush=True)
        time.sleep(30)
    if sys.argv[2] == "signals-inside-the-registry":
        lifecycle.cleanup_on_signals()
        with lifecycle._REGISTRY._lock:  # as while the main thread collects a sandbox
            print("ready", flush=True)
            time.sleep(30)
    """
)


def run_child(tmp_path: Path, mode: str, send: int | None = None) -> tuple[int, bool]:
    marker = tmp_path / "marker"
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, str(marker), mode], stdout=subprocess.PIPE, text=True
    ) as child:
        if send is not None:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready"
            child.send_signal(send)
        status = child.wait(timeout=20)
    return status, marker.exists()


@pytest.mark.timeout(30)
def test_a_normal_exit_disposes_what_is_live(tmp_path: Path) -> None:
    assert run_child(tmp_path, "exit") == (0, True)


@pytest.mark.timeout(30)
def test_an_uncaught_exception_disposes_what_is_live(tmp_path: Path) -> None:
    assert run_child(tmp_path, "raise") == (1, True)


@pytest.mark.timeout(30)
def test_sigterm_with_cleanup_on_signals_disposes_then_dies_by_the_signal(tmp_path: Path) -> None:
    assert run_child(tmp_path, "signals", signal.SIGTERM) == (-signal.SIGTERM, True)


@pytest.mark.timeout(30)
def test_sighup_with_cleanup_on_signals_disposes_then_dies_by_the_signal(tmp_path: Path) -> None:
    assert run_child(tmp_path, "signals", signal.SIGHUP) == (-signal.SIGHUP, True)


@pytest.mark.timeout(30)
def test_cleanup_on_signals_asked_twice_still_disposes_then_dies_by_the_signal(
    tmp_path: Path,
) -> None:
    assert run_child(tmp_path, "signals-twice", signal.SIGTERM) == (-signal.SIGTERM, True)


@pytest.mark.timeout(30)
def test_sigterm_while_the_main_thread_is_inside_the_registry_still_disposes(
    tmp_path: Path,
) -> None:
    assert run_child(tmp_path, "signals-inside-the-registry", signal.SIGTERM) == (
        -signal.SIGTERM,
        True,
    )


@pytest.mark.timeout(30)
def test_no_signal_handler_is_installed_unless_asked(tmp_path: Path) -> None:
    assert run_child(tmp_path, "plain-signal", signal.SIGTERM) == (-signal.SIGTERM, False)


def test_cleanup_on_signals_chains_to_the_previous_handler() -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda number, frame: seen.append(number))
    try:
        lifecycle.cleanup_on_signals([signal.SIGUSR1])
        done = threading.Event()
        owner = Owner()
        lifecycle.track(owner, "sbx-usr1", done.set)
        signal.raise_signal(signal.SIGUSR1)
        assert done.is_set()
        assert seen == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, previous)
