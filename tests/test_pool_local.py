"""``SandboxPool`` on the local service: real commands in bubblewrap sandboxes."""

from __future__ import annotations

from pathlib import Path

import pytest
from local_service_support import needs_bwrap
from pool_support import POLICY, pool_threads, settled

from piship_remote import SandboxPool
from piship_remote.local import LocalE2bService

pytestmark = [needs_bwrap, pytest.mark.timeout(60)]


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
