# ruff: noqa: F811  (a test names the fixture it takes from another test module)
"""The watch for Ctrl-C while the main thread waits for a pool's workers.

What it looks for is checked on a helper thread standing in for the main one; the
watch thread's lifetime with commands run off the main thread on a fake backend. The
whole path (a script, SIGINT, the double seeing kill and delete) is in
``test_lifecycle_interrupted_threads.py``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from piship_remote.backends.base import BackendResult, ExecRequest
from piship_remote.model.errors import CommandCancelled, PiShipError
from piship_remote.sandbox._unwinding import (
    THREAD_NAME,
    UnwindWatch,
    waits_for_workers_after_interrupt,
)
from piship_remote.sandbox.activation import Sandbox
from tests.sandbox.test_activation import (  # noqa: F401 (fixture)
    Behaviour,
    FakeBackend,
    activate,
    hangs_until_cancelled,
    ws,
)
from tests.support.pool import settled

pytestmark = pytest.mark.timeout(30)


def watch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


@contextmanager
def stand_in(body: Callable[[ThreadPoolExecutor], None], *, after_ctrl_c: bool) -> Iterator[int]:
    """A thread that submits a blocked job, then runs ``body`` (in an ``except
    KeyboardInterrupt`` clause if ``after_ctrl_c``); its id.

    The job is released when the block ends, so the thread's waits end too.
    """
    release = threading.Event()
    waiting = threading.Event()

    def job() -> None:
        waiting.set()
        release.wait(10)

    def run() -> None:
        pool = ThreadPoolExecutor(1, thread_name_prefix="stand-in-worker")
        pool.submit(job)
        try:
            if after_ctrl_c:
                raise KeyboardInterrupt
            body(pool)
        except KeyboardInterrupt:
            if after_ctrl_c:
                body(pool)

    thread = threading.Thread(target=run, name="stand-in-main")
    thread.start()
    try:
        assert waiting.wait(10)
        yield thread.ident or 0
    finally:
        release.set()
        thread.join(10)


def shut_down(pool: ThreadPoolExecutor) -> None:
    pool.shutdown(wait=True)


def reaches(thread_id: int, function: Callable[..., object]) -> bool:
    """Whether the thread is seen inside ``function`` within five seconds."""
    return settled(lambda: _inside(thread_id, function))


def _inside(thread_id: int, function: Callable[..., object]) -> bool:
    frame = sys._current_frames().get(thread_id)
    while frame is not None:
        if frame.f_code is function.__code__:
            return True
        frame = frame.f_back
    return False


def seen_within(thread_id: int, looks: int) -> bool:
    """Whether the thread is seen waiting after Ctrl-C in ``looks`` looks 10 ms apart."""
    return settled(lambda: waits_for_workers_after_interrupt(thread_id), looks * 0.01)


def test_a_thread_waiting_in_a_pool_shutdown_after_ctrl_c_is_seen() -> None:
    with stand_in(shut_down, after_ctrl_c=True) as thread_id:
        assert seen_within(thread_id, 500)


def test_a_with_block_ended_by_ctrl_c_is_seen() -> None:
    def end_block_by_ctrl_c(pool: ThreadPoolExecutor) -> None:
        with pool:
            raise KeyboardInterrupt

    with stand_in(end_block_by_ctrl_c, after_ctrl_c=False) as thread_id:
        assert seen_within(thread_id, 500)


def test_a_pool_shutdown_without_ctrl_c_is_not_seen() -> None:
    with stand_in(shut_down, after_ctrl_c=False) as thread_id:
        assert reaches(thread_id, ThreadPoolExecutor.shutdown)
        assert not seen_within(thread_id, 30)


def test_ctrl_c_handled_while_waiting_elsewhere_is_not_seen() -> None:
    elsewhere = threading.Event()

    def wait_elsewhere(pool: ThreadPoolExecutor) -> None:
        elsewhere.wait(10)
        pool.shutdown(wait=False)

    with stand_in(wait_elsewhere, after_ctrl_c=True) as thread_id:
        try:
            assert reaches(thread_id, wait_elsewhere)
            assert not seen_within(thread_id, 30)
        finally:
            elsewhere.set()


def test_the_watch_thread_runs_only_while_a_watching_block_is_open() -> None:
    watch = UnwindWatch(lambda: None)
    assert watch_threads() == []
    with watch.watching():
        with watch.watching():
            assert len(watch_threads()) == 1
        assert len(watch_threads()) == 1
    assert watch_threads() == []


def hangs_once_started(started: threading.Event) -> Behaviour:
    def hangs(
        request: ExecRequest, out: Callable[[bytes], None], cancel: threading.Event
    ) -> BackendResult:
        started.set()
        return hangs_until_cancelled(request, out, cancel)

    return hangs


def exec_on_a_thread(
    sandbox: Sandbox, errors: list[BaseException], cancel: threading.Event | None = None
) -> threading.Thread:
    """``sandbox.exec`` on a new thread; what it raises goes to ``errors``."""

    def run() -> None:
        try:
            sandbox.exec("sleep", cancel=cancel)
        except BaseException as e:
            errors.append(e)

    worker = threading.Thread(target=run)
    worker.start()
    return worker


def test_the_watch_thread_ends_with_the_last_command_off_the_main_thread(ws: Path) -> None:
    started = threading.Event()
    sandbox = activate(FakeBackend(hangs_once_started(started)), ws)
    cancel = threading.Event()
    errors: list[BaseException] = []
    try:
        worker = exec_on_a_thread(sandbox, errors, cancel)
        assert started.wait(10)
        assert len(watch_threads()) == 1
        cancel.set()
        worker.join(10)
        assert watch_threads() == []  # the sandbox is still live
    finally:
        sandbox.dispose()
    assert [type(e) for e in errors] == [CommandCancelled]


def test_the_watch_thread_is_gone_once_dispose_ends_the_commands(ws: Path) -> None:
    started = threading.Event()
    sandbox = activate(FakeBackend(hangs_once_started(started)), ws)
    errors: list[BaseException] = []
    worker = exec_on_a_thread(sandbox, errors)
    try:
        assert started.wait(10)
        assert len(watch_threads()) == 1
    finally:
        sandbox.dispose()
        worker.join(10)
    assert [type(e) for e in errors] == [PiShipError]
    assert watch_threads() == []
