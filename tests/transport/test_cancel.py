"""Cancellation tokens and the watcher that bridges plain events."""

from __future__ import annotations

import threading

import pytest

from piship_remote.transport._cancel import CancelToken, EventWatcher, bridge, when_cancelled


def test_setting_a_token_runs_its_callbacks_once() -> None:
    token = CancelToken()
    calls: list[str] = []
    token.on_cancel(lambda: calls.append("a"))
    token.on_cancel(lambda: calls.append("b"))
    token.set()
    token.set()
    assert calls == ["a", "b"]


def test_a_callback_registered_after_set_runs_at_once() -> None:
    token = CancelToken()
    token.set()
    calls: list[int] = []
    token.on_cancel(lambda: calls.append(1))
    assert calls == [1]


def test_an_unregistered_callback_does_not_run() -> None:
    token = CancelToken()
    calls: list[int] = []
    forget = token.on_cancel(lambda: calls.append(1))
    forget()
    token.set()
    assert calls == []


def test_a_failing_callback_does_not_stop_the_others() -> None:
    token = CancelToken()
    calls: list[int] = []

    def broken() -> None:
        raise RuntimeError("boom")

    token.on_cancel(broken)
    token.on_cancel(lambda: calls.append(1))
    token.set()
    assert calls == [1]


@pytest.mark.timeout(5)
def test_bridge_mirrors_a_plain_event_and_the_watcher_stops_on_close() -> None:
    watcher = EventWatcher()
    event = threading.Event()
    with bridge(event, watcher) as token:
        fired = threading.Event()
        token.on_cancel(fired.set)
        event.set()
        assert fired.wait(2)
    watcher.close()
    assert not [t for t in threading.enumerate() if t.name == "piship-cancel-watch"]


def test_bridge_passes_a_token_through_and_sets_a_mirror_of_a_set_event() -> None:
    watcher = EventWatcher()
    token = CancelToken()
    with bridge(token, watcher) as same:
        assert same is token
    event = threading.Event()
    event.set()
    with bridge(event, watcher) as mirror:
        assert mirror.is_set()
    with bridge(None, watcher) as fresh:
        assert not fresh.is_set()
    watcher.close()


@pytest.mark.timeout(5)
def test_when_set_runs_its_action_once_on_the_watcher_thread() -> None:
    watcher = EventWatcher()
    event = threading.Event()
    ran: list[str] = []
    twice = threading.Event()

    def action() -> None:
        ran.append(threading.current_thread().name)
        if len(ran) > 1:
            twice.set()

    watcher.when_set(event, action)
    event.set()
    assert not twice.wait(0.1)  # 50 watcher rounds with the event still set
    watcher.close()
    assert ran == ["piship-cancel-watch"]


def test_when_set_forgotten_before_the_event_runs_nothing() -> None:
    watcher = EventWatcher(interval=0.001)
    event = threading.Event()
    ran: list[int] = []
    forget = watcher.when_set(event, lambda: ran.append(1))
    forget()
    event.set()
    watcher.close()
    assert ran == []


def test_when_cancelled_runs_from_a_token_set_without_a_watcher_thread() -> None:
    watcher = EventWatcher()
    token = CancelToken()
    ran: list[str] = []
    when_cancelled(token, watcher, lambda: ran.append(threading.current_thread().name))
    token.set()
    assert ran == [threading.current_thread().name]
    watcher.close()


def test_when_cancelled_runs_at_once_for_an_event_already_set() -> None:
    watcher = EventWatcher()
    event = threading.Event()
    event.set()
    ran: list[int] = []
    when_cancelled(event, watcher, lambda: ran.append(1))
    assert ran == [1]
    assert when_cancelled(None, watcher, lambda: ran.append(2))() is None
    assert ran == [1]
    watcher.close()


@pytest.mark.timeout(5)
def test_when_cancelled_polls_a_plain_event() -> None:
    watcher = EventWatcher()
    event = threading.Event()
    fired = threading.Event()
    when_cancelled(event, watcher, fired.set)
    event.set()
    assert fired.wait(2)
    watcher.close()
