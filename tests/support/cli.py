"""What the command line's tests share: the E2B double set in the environment, the local
service's skip mark, and the CLI as a child process speaking bytes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from piship_remote.local import LocalE2bService
from piship_remote.testing import E2bServer

__all__ = ["NEEDS_BWRAP", "E2bFactory", "cli_process", "e2b_environ", "use_e2b"]

E2bFactory = Callable[..., E2bServer]
NEEDS_BWRAP = pytest.mark.skipif(
    LocalE2bService.check() is not None,
    reason=f"the local service cannot isolate commands here: {LocalE2bService.check()}",
)


def e2b_environ(mock: E2bServer, api_key: str) -> dict[str, str]:
    """The variables that point the CLI at ``mock`` with ``api_key``."""
    return {
        "PISHIP_E2B_ENDPOINT": mock.url,
        "PISHIP_E2B_ENVD_URL": mock.url,
        "E2B_API_KEY": api_key,
    }


def use_e2b(cli_environ: pytest.MonkeyPatch, mock: E2bServer, api_key: str) -> None:
    """Point ``cli.main`` in this process at ``mock``."""
    for name, value in e2b_environ(mock, api_key).items():
        cli_environ.setenv(name, value)


def cli_process(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    stdin: int | None = subprocess.DEVNULL,
) -> subprocess.Popen[bytes]:
    """``python -m piship_remote ARGS`` with only PATH, HOME and this checkout's path set."""
    environ = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/root"),
        "PYTHONPATH": str(Path(__file__).parents[2]),
        **(env or {}),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "piship_remote", *args],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environ,
        cwd=cwd,
    )
