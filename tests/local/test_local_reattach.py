"""A command whose stream drops is followed again on the local service: the output
written meanwhile is replayed from the service's ring, the real exit code comes back,
and the command runs once."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from piship_remote import ExecResult, OutputGap, Sandbox, activate_sandbox
from piship_remote.local import LocalE2bService
from piship_remote.testing.cutting_proxy import CuttingProxy
from tests.support.local_service import needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.timeout(120)]

LINES = 60_000  # numbered lines, ~650 kB
COUNTED = f"echo run >> $HOME/runs; seq 1 {LINES}; echo done >&2; exit 3"
EXPECTED = "".join(f"{n}\n" for n in range(1, LINES + 1))


@pytest.fixture(scope="module")
def service() -> Iterator[LocalE2bService]:
    with LocalE2bService() as running:
        yield running


@pytest.fixture
def proxy(service: LocalE2bService) -> Iterator[CuttingProxy]:
    with CuttingProxy(service.envd_url) as relay:
        yield relay


@pytest.fixture
def sandbox(service: LocalE2bService, proxy: CuttingProxy, tmp_path: Path) -> Iterator[Sandbox]:
    backend = service.backend(envd_url=proxy.url, stream_idle_timeout=1.0)
    with activate_sandbox({"required": True}, backend=backend, workspace=tmp_path, env={}) as box:
        yield box


def runs(sandbox: Sandbox) -> str:
    return sandbox.run("cat $HOME/runs").stdout


def test_a_cut_stream_is_followed_again_with_all_the_output_and_the_exit_code(
    sandbox: Sandbox, proxy: CuttingProxy
) -> None:
    proxy.plan(random.Random(46).sample(range(20_000, 250_000), 3))
    result = sandbox.run(COUNTED)
    assert proxy.cuts == 3
    assert (result.exit_code, result.stdout, result.stderr) == (3, EXPECTED, "done\n")
    assert result.missing == {"stdout": 0, "stderr": 0}


def test_a_command_whose_stream_was_cut_ran_once(sandbox: Sandbox, proxy: CuttingProxy) -> None:
    proxy.plan([30_000, 200_000])
    sandbox.run(COUNTED)
    assert runs(sandbox) == "run\n"


def test_a_stalled_stream_is_given_up_after_the_idle_timeout_and_followed_again(
    sandbox: Sandbox, proxy: CuttingProxy
) -> None:
    proxy.plan([100_000], stall=True)
    result = sandbox.run(COUNTED)
    assert proxy.cuts == 1
    assert (result.exit_code, result.stdout) == (3, EXPECTED)
    assert runs(sandbox) == "run\n"


def test_exec_hands_on_data_the_output_joined_at_its_offset_with_no_gap_notice(
    sandbox: Sandbox, proxy: CuttingProxy
) -> None:
    chunks: list[bytes] = []
    proxy.plan([50_000])
    result = sandbox.exec(f"seq 1 {LINES}", on_data=chunks.append)
    assert result.exit_code == 0
    assert not any(isinstance(chunk, OutputGap) for chunk in chunks)
    assert b"".join(chunks).decode() == EXPECTED


def test_a_handle_whose_stream_was_cut_reports_nothing_missing(
    sandbox: Sandbox, proxy: CuttingProxy
) -> None:
    proxy.plan([40_000])
    handle = sandbox.start(f"seq 1 {LINES}")
    result = handle.wait(timeout=60)
    assert (result.exit_code, result.stdout) == (0, EXPECTED)
    assert handle.missing == {"stdout": 0, "stderr": 0}


def test_exec_whose_stream_was_cut_reports_nothing_missing(
    sandbox: Sandbox, proxy: CuttingProxy
) -> None:
    proxy.plan([60_000])
    result = sandbox.exec(f"seq 1 {LINES}; exit 3")
    assert proxy.cuts == 1
    assert result == ExecResult(3, {"stdout": 0, "stderr": 0})
