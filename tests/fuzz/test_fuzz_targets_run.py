"""Each atheris target runs briefly without a finding (skipped when atheris is not installed).

By hand, for longer: ``python tests/fuzz/fuzz_connect.py -max_total_time=600``.
``PISHIP_FUZZ_SECONDS`` sets the run length here (default 5 s per target).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.optional_peers import install_hint

pytest.importorskip("atheris", reason=install_hint("fuzz"))

HERE = Path(__file__).parent
TARGETS = sorted(HERE.glob("fuzz_*.py"))
SECONDS = int(os.environ.get("PISHIP_FUZZ_SECONDS", "5"))


def test_every_parser_has_a_target() -> None:
    assert {t.stem for t in TARGETS} == {
        "fuzz_connect",
        "fuzz_envd_stream",
        "fuzz_create_answer",
        "fuzz_claim",
        "fuzz_router_answer",
        "fuzz_archive",
    }


@pytest.mark.timeout(SECONDS + 60)
@pytest.mark.parametrize("target", TARGETS, ids=[t.stem for t in TARGETS])
def test_the_target_finds_nothing(target: Path, tmp_path: Path) -> None:
    root = HERE.parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(HERE)])}
    run = subprocess.run(
        [
            sys.executable,
            str(target),
            f"-max_total_time={SECONDS}",
            f"-artifact_prefix={tmp_path}/",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=SECONDS + 50,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Done" in run.stderr
