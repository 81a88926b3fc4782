"""A map called on the main thread takes Ctrl-C itself, so its commands run without the
registry's interrupt watch (a thread started and joined per command); a map called on
another thread keeps the watch for its commands."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from piship_remote import E2bCompatibleBackend, SandboxPool
from piship_remote.sandbox._unwinding import THREAD_NAME
from piship_remote.testing import E2bServer
from tests.support.pool import POLICY, script

pytestmark = pytest.mark.timeout(30)
E2bFactory = Callable[..., E2bServer]


@pytest.fixture
def watches_seen(e2b_server: E2bFactory) -> Iterator[tuple[E2bServer, list[int]]]:
    """A server that notes, for each ``task-…`` command, how many watch threads run."""
    seen: list[int] = []

    def answer(start: dict[str, Any]) -> dict[str, Any]:
        if "task-" in script(start):
            seen.append(sum(1 for t in threading.enumerate() if t.name == THREAD_NAME))
        return {"stdout": "ok\n"}

    yield e2b_server(command=answer, distinct_ids=True), seen


def _map(server: E2bServer, workspace: Path) -> None:
    with (
        E2bCompatibleBackend(endpoint=server.url, envd_url=server.url) as backend,
        SandboxPool(POLICY, backend=backend, workspace=workspace, size=2, progress=False) as pool,
    ):
        results = pool.map("echo task-{item}", range(4))
    assert [r.outcome for r in results] == ["ok"] * 4


def test_a_map_on_the_main_thread_runs_its_commands_without_the_watch(
    watches_seen: tuple[E2bServer, list[int]], workspace: Path
) -> None:
    server, seen = watches_seen

    _map(server, workspace)

    assert seen == [0, 0, 0, 0]


def test_a_map_on_another_thread_keeps_the_watch_for_its_commands(
    watches_seen: tuple[E2bServer, list[int]], workspace: Path
) -> None:
    server, seen = watches_seen
    errors: list[BaseException] = []

    def run() -> None:
        try:
            _map(server, workspace)
        except BaseException as error:
            errors.append(error)

    caller = threading.Thread(target=run, name="a-caller")
    caller.start()
    caller.join(20)

    assert errors == [] and len(seen) == 4 and all(count == 1 for count in seen)
