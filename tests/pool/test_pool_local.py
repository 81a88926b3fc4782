"""``SandboxPool`` on the local service: real commands in bubblewrap sandboxes, a sandbox
deleted under a running command, and close() with tasks running."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from piship_remote import SandboxPool, TaskResult
from piship_remote.local import LocalE2bService
from tests.support.local_service import Client, needs_bwrap
from tests.support.pool import POLICY, pool_threads, settled

pytestmark = [needs_bwrap, pytest.mark.timeout(60)]
ONE_COMMAND_FOR_EVERY_ITEM = pytest.mark.filterwarnings(
    "ignore::piship_remote.pool._command.NoItemWarning"
)


def test_map_runs_real_commands_and_a_reset_cleans_between_tasks(
    service: LocalE2bService, tmp_path: Path
) -> None:
    backend = service.backend()
    with SandboxPool(
        POLICY, backend=backend, workspace=tmp_path, env={}, size=2, warm=1, reset="rm -f mark"
    ) as pool:
        results = pool.map("test ! -e mark && touch mark && echo {item}; exit {item}", range(4))
    assert [r.outcome for r in results] == ["ok", "failed", "failed", "failed"]
    assert [r.value.stdout for r in results] == [f"{n}\n" for n in range(4)]
    assert [r.value.exit_code for r in results] == [0, 1, 2, 3]
    assert service.sandboxes() == []
    assert settled(lambda: pool_threads() == [])


def started_in(service: LocalE2bService, sandbox_id: str) -> bool:
    """Whether the task's command (``touch "$HOME/started"``) began in that sandbox."""
    return os.path.exists(os.path.join(service.sandbox_home(sandbox_id), "started"))


@ONE_COMMAND_FOR_EVERY_ITEM
def test_a_sandbox_deleted_after_its_command_started_is_unknown_and_never_rerun(
    service: LocalE2bService, client: Client, tmp_path: Path
) -> None:
    backend = service.backend()
    results: list[TaskResult] = []
    with SandboxPool(POLICY, backend=backend, workspace=tmp_path, env={}, size=1) as pool:
        runner = threading.Thread(
            target=lambda: results.extend(pool.map('touch "$HOME/started"; sleep 30', ["x"]))
        )
        runner.start()
        assert settled(lambda: any(started_in(service, s) for s in service.sandboxes()), 15)
        [victim] = service.sandboxes()
        client.control("DELETE", f"/sandboxes/{victim}")
        runner.join(15)
    [result] = results
    assert (result.outcome, result.attempts, result.sandbox_id) == ("unknown", 1, victim)
    assert service.sandboxes() == []
    backend.close()


@ONE_COMMAND_FOR_EVERY_ITEM
def test_close_with_tasks_running_ends_them_as_closed_and_leaves_no_sandbox(
    service: LocalE2bService, tmp_path: Path
) -> None:
    backend = service.backend()
    pool = SandboxPool(POLICY, backend=backend, workspace=tmp_path, env={}, size=2)
    results: list[TaskResult] = []
    runner = threading.Thread(
        target=lambda: results.extend(pool.map('touch "$HOME/started"; sleep 30', [1, 2]))
    )
    runner.start()
    assert settled(lambda: sum(started_in(service, s) for s in service.sandboxes()) == 2, 15)
    pool.close()
    runner.join(15)
    assert [r.outcome for r in results] == ["cancelled"] * 2
    assert all("closed" in str(r.error) for r in results)
    assert service.sandboxes() == []
    assert settled(lambda: pool_threads() == [])
    backend.close()
