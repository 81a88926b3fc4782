"""``Sandbox.run`` stopped by its timeout (or a sandbox failure) still gives what the command
wrote until then, as ``error.output``; a pool task's timeout keeps it and names the task's
own timeout."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from piship_remote import CommandTimeout, E2bCompatibleBackend, activate_sandbox
from piship_remote.testing import E2bServer
from tests.support.pool import POLICY, pool_maker, script

pytestmark = pytest.mark.timeout(30)
E2bFactory = Callable[..., E2bServer]


def hangs_after_a_line(start: dict[str, Any]) -> dict[str, Any]:
    if "hang" in script(start):
        return {"stdout": "half way\n", "stderr": "warming up\n", "hang": True}
    return {"stdout": "ok\n"}


@pytest.fixture
def backend(e2b_server: E2bFactory):
    server = e2b_server(command=hangs_after_a_line, distinct_ids=True)
    with E2bCompatibleBackend(endpoint=server.url, envd_url=server.url) as backend:
        yield backend


def test_a_timed_out_run_carries_what_the_command_wrote(backend, workspace: Path) -> None:
    with activate_sandbox(POLICY, backend=backend, workspace=workspace, env={}) as sandbox:
        with pytest.raises(CommandTimeout) as raised:
            sandbox.run("hang", timeout=0.5)
    output = raised.value.output
    assert output is not None
    assert (output.exit_code, output.stdout, output.stderr) == (-1, "half way\n", "warming up\n")


def test_a_pool_task_timeout_names_the_tasks_timeout_and_keeps_the_output(
    backend, workspace: Path
) -> None:
    with pool_maker(POLICY, backend, workspace) as make, make(size=1) as pool:
        [result] = pool.map("hang {item}", ["x"], timeout=0.6)
    assert result.outcome == "timeout"
    assert str(result.error) == "timeout:0.6"
    assert result.error.output.stdout == "half way\n"
