"""The local service's host-safety checks, run again as a normal user (from a root run).

A root run (as CI is) starts pytest once more as a spare unused uid (``setpriv``) on
the modules that pin what a sandbox may do to its host, so both halves of the README's
"as root" / "as a normal user" hold in one run. Where that uid cannot run this Python
(it lives under a directory only root may search) the check is skipped, saying so.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from piship_remote.local.isolation.trees import remove_tree

ROOT = Path(__file__).resolve().parents[2]
MODULES = (
    "tests/local/test_local_host_safety.py",
    "tests/local/test_local_memory_limit.py",
    "tests/local/test_local_http_framing.py",
    "tests/local/test_local_root_copies.py",
    "tests/attacks/test_attack_http_flood.py",
    "tests/attacks/test_attack_token_before_state.py",
    "tests/attacks/test_attack_image_unpack.py",
    "tests/attacks/test_attack_deep_trees.py",
    "tests/attacks/test_attack_cpu_and_cgroups.py",
)
RUN_TIMEOUT = 600


def spare_uid() -> int:
    """A uid no account has."""
    for uid in range(64_000, 65_000):
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    raise AssertionError("no spare uid in 64000-64999")


def as_user(uid: int, argv: list[str], home: str) -> subprocess.CompletedProcess[str]:
    setpriv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": home,
        "TMPDIR": home,
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.run(
        [*setpriv, *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )


@pytest.mark.timeout(RUN_TIMEOUT + 30)
def test_the_host_safety_modules_pass_as_a_normal_user() -> None:
    if os.geteuid() != 0:
        pytest.skip("this run is a normal user's already: the modules ran as one")
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
        ran = as_user(
            uid, [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *MODULES], home
        )
    finally:
        remove_tree(home)  # iterative: a failed run may leave a 10,000-deep tree there
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
