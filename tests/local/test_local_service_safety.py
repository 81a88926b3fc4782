"""The local service on a shared host: hostile clients without the key, and no leftovers.

The service runs as a subprocess where its memory is measured (``VmRSS`` in
``/proc``) and where its exits are real (interpreter exit, SIGTERM, SIGKILL).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import requests

from piship_remote.local import LocalE2bService
from piship_remote.local.service import remove_stale_directories

PROBLEM = LocalE2bService.check()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"bubblewrap cannot run: {PROBLEM}")
ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 30.0
MIB = 1024 * 1024


@attrs.frozen
class Served:
    process: subprocess.Popen[str]
    url: str
    api_key: str


@pytest.fixture
def parent() -> Iterator[Path]:
    """A fresh directory for services' directories, searchable by every user as /tmp is
    (a root service's sandboxes run as unprivileged host uids that look their places up)."""
    made = Path(tempfile.mkdtemp(prefix="piship-safety-"))
    made.chmod(0o711)
    yield made
    shutil.rmtree(made, ignore_errors=True)


def environment(parent: Path) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "TMPDIR": str(parent)}


@pytest.fixture
def served(parent: Path) -> Iterator[Served]:
    """``python -m piship_remote.local`` with its temporary directory in ``parent``."""
    process = subprocess.Popen(
        [sys.executable, "-m", "piship_remote.local"],
        stdout=subprocess.PIPE,
        text=True,
        env=environment(parent),
    )
    assert process.stdout is not None
    lines: dict[str, str] = {}
    deadline = time.monotonic() + START_TIMEOUT
    while "Press" not in lines and time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        name, _, value = line.partition(":")
        lines[name.split()[0] if name.strip() else ""] = value.strip()
    try:
        assert "Press" in lines, "the service did not start"
        yield Served(process, lines["endpoint"], lines["api"])
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        process.stdout.close()


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    assert match is not None
    return int(match.group(1)) / 1024


def keyed_request(served: Served) -> requests.Response:
    return requests.get(
        served.url + "/sandboxes/none", headers={"X-API-Key": served.api_key}, timeout=5
    )


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("piship-local-*"))


def test_half_sent_bodies_and_idle_connections_leave_it_small_and_serving(
    served: Served,
) -> None:
    port = port_of(served.url)
    head = b"POST /sandboxes HTTP/1.1\r\nHost: x\r\nContent-Length: 16777216\r\n\r\n"
    half_sent: list[socket.socket] = []
    idle: list[socket.socket] = []
    try:
        for _ in range(40):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            half_sent.append(sock)
            with contextlib.suppress(OSError):  # refused on its headers: the rest is never read
                sock.sendall(head + b"x" * (8 * MIB))
        for _ in range(500):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        started = time.monotonic()
        response = keyed_request(served)
        elapsed = time.monotonic() - started
        rss = rss_mib(served.process.pid)
    finally:
        for sock in half_sent + idle:
            sock.close()
    assert response.status_code == 404  # past the key check: the sandbox does not exist
    assert elapsed < 2.0
    print(f"service RSS after 40 half-sent bodies and 500 idle connections: {rss:.1f} MiB")
    assert rss < 100


def test_a_request_without_the_key_is_refused_before_its_body_is_sent(served: Served) -> None:
    with socket.create_connection(("127.0.0.1", port_of(served.url)), timeout=5) as sock:
        sock.sendall(b"POST /sandboxes HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 401")


def test_sigterm_stops_the_served_service_and_removes_its_directory(
    served: Served, parent: Path
) -> None:
    assert len(leftovers(parent)) == 1
    served.process.send_signal(signal.SIGTERM)
    assert served.process.wait(15) == 0
    assert leftovers(parent) == []


def test_the_readme_one_liner_leaves_no_directory_at_interpreter_exit(parent: Path) -> None:
    script = "from piship_remote.local import LocalE2bService; LocalE2bService().backend()"
    subprocess.run([sys.executable, "-c", script], env=environment(parent), check=True, timeout=60)
    assert leftovers(parent) == []


def test_a_killed_services_directory_is_removed_when_the_next_one_starts(parent: Path) -> None:
    script = (
        "import sys, time; from piship_remote.local import LocalE2bService\n"
        f"s = LocalE2bService(root={str(parent)!r}); print(s.root, flush=True); time.sleep(60)"
    )
    killed = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=environment(parent)
    )
    assert killed.stdout is not None
    left = Path(killed.stdout.readline().strip())
    killed.kill()
    killed.wait(10)
    killed.stdout.close()
    assert left.is_dir()
    with LocalE2bService(root=parent) as service:
        assert leftovers(parent) == [Path(service.root).name]


def test_stale_directory_removal_keeps_live_services_and_foreign_names(parent: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(10)
    (parent / f"piship-local-{dead.pid}-abc" / "sbx").mkdir(parents=True)
    (parent / f"piship-local-{os.getpid()}-def").mkdir()
    (parent / "piship-local-unowned").mkdir()
    removed = remove_stale_directories(str(parent))
    assert [Path(p).name for p in removed] == [f"piship-local-{dead.pid}-abc"]
    assert leftovers(parent) == [f"piship-local-{os.getpid()}-def", "piship-local-unowned"]
