"""The attacks again, as a normal user (from a root run): CI runs as root, and this starts
pytest once more on ``tests/attacks`` as a spare unused uid (``setpriv``), so both the
root service's and the normal user's service's answers to each attack are checked in one
run. Where that uid cannot run this Python (it lives under a directory only root may
search) the check is skipped, saying so.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from tests.local.test_local_as_normal_user import RUN_TIMEOUT, as_user, spare_uid

HERE = Path(__file__).resolve()


@pytest.mark.timeout(RUN_TIMEOUT + 30)
def test_the_attacks_fail_against_a_normal_users_service_too() -> None:
    if os.geteuid() != 0:
        pytest.skip("this run is a normal user's already: the attacks ran as one")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed: cannot switch to a spare uid")
    uid = spare_uid()
    home = tempfile.mkdtemp(prefix="piship-normal-user-")
    os.chown(home, uid, uid)
    try:
        probe = as_user(uid, [sys.executable, "-c", "import piship_remote, pytest"], home)
        if probe.returncode != 0:
            reason = (probe.stderr.strip().splitlines() or ["no output"])[-1]
            pytest.skip(f"uid {uid} cannot import this Python's packages ({reason[:200]})")
        pytest_argv = ["-m", "pytest", "-q", "-p", "no:cacheprovider", f"--ignore={HERE}"]
        ran = as_user(uid, [sys.executable, *pytest_argv, str(HERE.parent)], home)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
