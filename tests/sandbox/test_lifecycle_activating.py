"""A sandbox still being checked when SIGTERM arrives is deleted too: between the create and
the end of activation (the readiness check, a workspace push) it is already tracked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from piship_remote.testing import E2bServer
from tests.support.pool import settled

pytestmark = pytest.mark.timeout(60)
E2bFactory = Callable[..., E2bServer]

CHILD = textwrap.dedent(
    """
    import sys
    import piship_remote
    from piship_remote import E2bCompatibleBackend, activate_sandbox

    piship_remote.cleanup_on_signals()
    url = sys.argv[1]
    backend = E2bCompatibleBackend(endpoint=url, envd_url=url)
    policy = {"required": True, "network": {"mode": "deny"}}
    activate_sandbox(policy, backend=backend, workspace=".", env={}, probe_timeout=120)
    """
)


def commands_sent(server: E2bServer) -> int:
    return sum(1 for r in server.requests if r.path.endswith("/process.Process/Start"))


def test_sigterm_during_the_readiness_check_deletes_the_sandbox(
    e2b_server: E2bFactory, tmp_path: Path
) -> None:
    server = e2b_server()
    server.faults.stall("/process.Process/Start")  # the readiness check waits, unanswered
    environ = {**os.environ, "E2B_API_KEY": "e2b_activating_signal_key"}
    child = subprocess.Popen([sys.executable, "-c", CHILD, server.url], cwd=tmp_path, env=environ)
    try:
        assert settled(lambda: commands_sent(server) == 1, timeout=30)
        assert len(server.live_sandboxes) == 1
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) == -signal.SIGTERM
    finally:
        child.kill()
        child.wait()
    assert server.live_sandboxes == []
