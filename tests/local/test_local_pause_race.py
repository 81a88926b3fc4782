"""A command started while its sandbox is being paused: answered at once, never left waiting.

Either the start finishes first and the pause waits for it, or the pause came first
and the start is refused with envd's answer for a paused sandbox (502). The
interleavings are forced with events, not timing.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import requests

from piship_remote.local import LocalE2bService
from piship_remote.local.isolation.process import LocalProcess, Output
from piship_remote.local.sandbox.pause import Paused
from piship_remote.local.sandbox.registry import Sandbox
from piship_remote.wire.connect import connect_envelope
from piship_remote.wire.envd import ProcessConfig
from tests.support.local_service import BASIC_USER, Client, needs_bwrap

pytestmark = pytest.mark.timeout(30)

PROMPT = 3.0
"""Well under the 10 s a start waits for a frozen agent's answer."""


def found(service: LocalE2bService, sandbox: dict[str, Any]) -> Sandbox:
    sandbox_object = service._registry.lookup(sandbox["sandboxID"])
    assert sandbox_object is not None
    return sandbox_object


def echo(text: str) -> ProcessConfig:
    return ProcessConfig(cmd="/bin/sh", args=["-c", f"echo {text}"])


def start_request(client: Client, sandbox: dict[str, Any]) -> requests.Response:
    process = {"cmd": "/bin/sh", "args": ["-c", "echo hi"]}
    headers = {"Content-Type": "application/connect+json", "Authorization": BASIC_USER}
    return client.session.post(
        client.service.envd_url + "/process.Process/Start",
        data=connect_envelope({"process": process, "stdin": False}),
        headers=client.envd_headers(sandbox, **headers),
        timeout=(5, 15),
    )


@needs_bwrap
def test_a_start_on_a_sandbox_paused_after_it_was_found_is_refused_at_once(
    service: LocalE2bService, client: Client
) -> None:
    sandbox = found(service, client.create())
    assert service._registry.pause(sandbox.id) is True
    began = time.monotonic()
    with pytest.raises(Paused):
        sandbox.start(echo("late"), tag="")
    assert time.monotonic() - began < PROMPT


@needs_bwrap
def test_envd_answers_a_start_paused_after_the_lookup_as_a_paused_sandbox(
    service: LocalE2bService, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox = client.create()
    rpc = service._envd._process
    handle = rpc.handle

    def pause_then_handle(found: Sandbox, *args: Any) -> object:
        assert service._registry.pause(found.id) is True  # after envd found it running
        return handle(found, *args)

    monkeypatch.setattr(rpc, "handle", pause_then_handle)
    began = time.monotonic()
    response = start_request(client, sandbox)
    assert time.monotonic() - began < PROMPT
    assert response.status_code == 502
    assert response.json() == {
        "sandboxId": sandbox["sandboxID"],
        "message": "The sandbox was not found",
        "code": 502,
    }


class WatchedLock:
    """A lock that reports each attempt to take it, so a test knows a thread is waiting."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._attempts = 0
        self._changed = threading.Condition()

    def __enter__(self) -> bool:
        with self._changed:
            self._attempts += 1
            self._changed.notify_all()
        return self._lock.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._lock.__exit__(*exc)

    def wait_attempts(self, count: int) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self._attempts >= count, timeout=10)


@needs_bwrap
def test_a_pause_asked_for_during_a_start_waits_for_it_and_the_command_runs(
    service: LocalE2bService, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox = found(service, client.create())
    lock = WatchedLock()
    monkeypatch.setattr(sandbox.pause_state, "_lock", lock)
    entered, release = threading.Event(), threading.Event()
    order: list[str] = []
    vm_start = sandbox._vm.start

    def held_start(*args: Any, **kwargs: Any) -> LocalProcess:
        entered.set()
        assert release.wait(10)
        process = vm_start(*args, **kwargs)
        order.append("started")
        return process

    monkeypatch.setattr(sandbox._vm, "start", held_start)
    started: list[LocalProcess] = []
    starter = threading.Thread(target=lambda: started.append(sandbox.start(echo("ran"), tag="")))
    starter.start()
    assert entered.wait(10)
    pauser = threading.Thread(
        target=lambda: order.append("paused" if service._registry.pause(sandbox.id) else "no")
    )
    pauser.start()
    assert lock.wait_attempts(2)  # the start holds the lock; the pause waits for it
    release.set()
    starter.join(PROMPT)
    pauser.join(PROMPT)
    assert order == ["started", "paused"]
    assert service._registry.resume(sandbox.id, 60) is True
    events = started[0].events(deadline=time.monotonic() + 10, keepalive=5)
    assert b"".join(e.data for e in events if isinstance(e, Output)) == b"ran\n"
