"""Cancellation tokens and the watcher that bridges plain events."""

from __future__ import annotations

import threading

import pytest

from piship_remote.cancel import CancelToken, EventWatcher, bridge


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
