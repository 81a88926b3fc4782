"""benchmarks/profile_run.py: every thread's calls are profiled and reported per command."""

from __future__ import annotations

import pytest

from benchmarks.profile_run import cpu_per_command, main, profile_commands, report
from tests.support.optional_peers import install_hint


def _work() -> int:
    return sum(range(10))


@pytest.mark.timeout(30)
def test_every_threads_calls_are_counted_per_command() -> None:
    stats = profile_commands(_work, commands=6, threads=3)
    text = report(stats, 6, 5, "work")
    assert text.startswith("# work\n# 6 commands: ")
    assert any(line.endswith("(_work)") and " 1.0 calls " in line for line in text.splitlines())


@pytest.mark.timeout(30)
def test_the_cpu_mode_runs_every_command_once() -> None:
    done: list[int] = []
    line = cpu_per_command(lambda: done.append(1), commands=7, threads=2)
    assert len(done) == 7
    assert line.startswith("# 7 commands on 2 thread(s): ")


@pytest.mark.timeout(60)
def test_the_sdk_runs_on_the_e2b_backend_only() -> None:
    with pytest.raises(SystemExit, match="e2b backend only"):
        main(["--backend", "kubernetes", "--client", "e2b-sdk", "--commands", "1"])


@pytest.mark.interop
@pytest.mark.timeout(60)
def test_the_sdk_client_is_measured_like_ours(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("e2b", reason=install_hint("interop"))
    main(["--client", "e2b-sdk", "--cpu", "--commands", "4", "--threads", "2"])
    assert capsys.readouterr().out.startswith("# 4 commands on 2 thread(s): ")
