"""Under CI a job is ended with SIGTERM: a script whose pool runs tasks, with the one line
``cleanup_on_signals()``, deletes every sandbox of the pool before it dies by the signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from piship_remote.testing import E2bServer
from tests.support.pool import script, settled

pytestmark = pytest.mark.timeout(60)
E2bFactory = Callable[..., E2bServer]

CHILD = textwrap.dedent(
    """
    import sys
    import piship_remote
    from piship_remote import E2bCompatibleBackend, SandboxPool

    piship_remote.cleanup_on_signals()
    url = sys.argv[1]
    backend = E2bCompatibleBackend(endpoint=url, envd_url=url)
    policy = {"required": True, "network": {"mode": "deny"}}
    with SandboxPool(policy, backend=backend, workspace=".", size=3, env={}) as pool:
        pool.map("sleep-forever {item}", range(3))
    """
)


def hang_when_asked(start: dict[str, Any]) -> dict[str, Any]:
    return {"hang": True} if "sleep-forever" in script(start) else {"stdout": "ok\n"}


def started(server: E2bServer) -> int:
    """How many task commands (not readiness checks) the sandboxes were sent."""
    return sum(1 for r in server.requests if b"sleep-forever" in (r.body or b""))


def test_sigterm_with_cleanup_on_signals_deletes_the_pools_sandboxes(
    e2b_server: E2bFactory, tmp_path: Path
) -> None:
    server = e2b_server(command=hang_when_asked, distinct_ids=True)
    environ = {**os.environ, "E2B_API_KEY": "e2b_pool_signal_key"}
    child = subprocess.Popen([sys.executable, "-c", CHILD, server.url], cwd=tmp_path, env=environ)
    try:
        assert settled(lambda: started(server) == 3, timeout=30)
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) == -signal.SIGTERM
    finally:
        child.kill()
        child.wait()
    assert server.live_sandboxes == []
