"""A local service killed with SIGKILL (or the Jupyter kernel hosting it) leaves no mount and
no sandbox data on the host; the next start removes what an older one left.

A root service mounts only in a mount namespace of its own, which the kernel tears down
with its last process, so its sandboxes' tmpfs (their data with them) is gone at once;
a normal user's service mounts nothing, and its directory is removed by the next start.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from piship_remote.local.isolation.trees import mounts_below
from piship_remote.local.isolation.user_map import root_mappable
from piship_remote.local.service import remove_stale_directories
from tests.support.local_service import Client, needs_bwrap, run_as

pytestmark = [needs_bwrap, pytest.mark.timeout(120)]
START_TIMEOUT = 60
# Starts a service in ``argv[1]``, says where it listens, then waits to be killed.
SERVE = """
import json, sys, threading
from piship_remote.local import LocalE2bService
service = LocalE2bService(root=sys.argv[1])
print(json.dumps({"url": service.url, "envd_url": service.envd_url,
                  "api_key": service.api_key, "root": service.root}), flush=True)
threading.Event().wait()
"""
WRITER = "root" if root_mappable() else "user"


@pytest.fixture
def parent() -> Iterator[str]:
    """A directory every user may search (a root service's sandboxes look their places up)."""
    made = tempfile.mkdtemp(prefix="piship-killed-", dir="/tmp")
    os.chmod(made, 0o755)
    yield made
    shutil.rmtree(made, ignore_errors=True)


@pytest.fixture
def served(parent: str) -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    if not os.access(sys.executable, os.X_OK):
        pytest.skip(f"this user cannot start {sys.executable} again to host a service")
    process = subprocess.Popen(
        [sys.executable, "-c", SERVE, parent],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, "the service did not start"
        yield process, json.loads(line)
    finally:
        process.kill()
        process.wait(START_TIMEOUT)


def test_a_killed_service_leaves_no_mount_and_no_sandbox_data(
    served: tuple[subprocess.Popen[str], dict[str, Any]], parent: str
) -> None:
    process, started = served
    client = Client(SimpleNamespace(**started))  # type: ignore[arg-type]
    sandbox = client.create()
    run_as(client, sandbox, "user", "head -c 4M /dev/urandom > ~/data && cp ~/data /tmp/data")
    run_as(client, sandbox, WRITER, "mkdir -p /app && head -c 4M /dev/urandom > /app/data")
    process.send_signal(signal.SIGKILL)
    process.wait(START_TIMEOUT)
    assert mounts_below(started["root"]) == []
    if root_mappable():  # each sandbox's directory went with its tmpfs
        left = [path for path in Path(started["root"]).iterdir() if path.name != "templates"]
        assert left != [] and all(list(path.iterdir()) == [] for path in left)
    assert started["root"] in remove_stale_directories(parent)  # what the next start does
    assert not Path(started["root"]).exists()


@pytest.mark.skipif(not root_mappable(), reason="mounting on the host needs root")
def test_the_next_start_unmounts_and_removes_what_an_older_service_left(parent: str) -> None:
    ended = subprocess.Popen(["true"])
    ended.wait()
    left = Path(parent) / f"piship-local-{ended.pid}-older"
    (left / "sandbox").mkdir(parents=True)
    libc = ctypes.CDLL(None, use_errno=True)
    target = os.fsencode(left / "sandbox")
    mounted = libc.mount(b"tmpfs", target, b"tmpfs", 0, b"size=1m")
    assert mounted == 0, os.strerror(ctypes.get_errno())
    (left / "sandbox" / "data").write_bytes(b"x" * 1024)
    assert mounts_below(str(left)) != []
    assert str(left) in remove_stale_directories(parent)
    assert mounts_below(str(left)) == []
    assert not left.exists()
