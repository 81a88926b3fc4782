"""A command whose stream a proxy cuts or stalls, on the E2B double (which keeps nothing),
with ``resumable=True``: the whole output comes back from the spool, in order, with the
real exit code, and the command starts once. The double follows only commands armed with
a cut, so points past the end arm each stream without cutting it: the proxy makes the
faults, as in ``python -m benchmarks --only stream_cuts``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from piship_remote import E2bCompatibleBackend, Sandbox, activate_sandbox
from piship_remote.testing import E2bServer
from piship_remote.testing.cutting_proxy import CuttingProxy

pytestmark = pytest.mark.timeout(60)

LINES = "".join(f"{n}\n" for n in range(1, 20_001))  # 108894 bytes, ~145 kB on the wire
COMMAND_STREAMS = "/process.Process/"
PAST_THE_END = [len(LINES) + 1] * 8


@pytest.fixture
def server(e2b_server: Callable[..., E2bServer]) -> E2bServer:
    double = e2b_server(command=lambda start: {"stdout": LINES, "exit_code": 3})
    double.faults.cut_streams_after(*PAST_THE_END)
    return double


@pytest.fixture
def proxy(server: E2bServer) -> Iterator[CuttingProxy]:
    with CuttingProxy(server.url) as relay:
        yield relay


@pytest.fixture
def sandbox(server: E2bServer, proxy: CuttingProxy, tmp_path: Path) -> Iterator[Sandbox]:
    backend = E2bCompatibleBackend(endpoint=server.url, envd_url=proxy.url, stream_idle_timeout=1.0)
    with activate_sandbox({"required": True}, backend=backend, workspace=tmp_path, env={}) as box:
        server.faults.clear()
        server.faults.cut_streams_after(*PAST_THE_END)
        yield box


def starts(server: E2bServer) -> int:
    return [r.path for r in server.requests].count("/process.Process/Start") - 1  # readiness


def test_cut_command_streams_come_back_whole_from_the_spool(
    sandbox: Sandbox, server: E2bServer, proxy: CuttingProxy
) -> None:
    proxy.plan([20_000, 60_000], path=COMMAND_STREAMS)
    result = sandbox.run("numbers", resumable=True)
    assert proxy.cuts >= 1
    assert (result.exit_code, result.stdout) == (3, LINES)
    assert result.missing == {"stdout": 0, "stderr": 0}
    assert starts(server) == 1


def test_a_stalled_command_stream_is_given_up_and_read_back_from_the_spool(
    sandbox: Sandbox, server: E2bServer, proxy: CuttingProxy
) -> None:
    proxy.plan([50_000], stall=True, path=COMMAND_STREAMS)
    result = sandbox.run("numbers", resumable=True)
    assert proxy.cuts == 1
    assert (result.exit_code, result.stdout) == (3, LINES)
    assert starts(server) == 1


def test_a_plan_for_other_paths_leaves_the_command_stream_whole(
    sandbox: Sandbox, proxy: CuttingProxy
) -> None:
    proxy.plan([1_000], path="/files")
    result = sandbox.run("numbers")
    assert proxy.cuts == 0
    assert (result.exit_code, result.stdout) == (3, LINES)
