"""Directory trees 10,000 deep against the host side of the local service: removing a
sandbox's directories at delete and close, and a crashed service's at the next start.
``shutil.rmtree`` recursed (``RecursionError`` past about 1,000 levels) and left the
sandbox's files, and a service that is not root then failed on every start."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from piship_remote.local import LocalE2bService
from piship_remote.local.isolation.trees import remove_tree
from piship_remote.local.service import DIRECTORY_PREFIX, remove_stale_directories
from tests.support.local_service import Client, needs_bwrap
from tests.support.trees import DEEP, depth_of, make_deep_tree, searchable_root

pytestmark = pytest.mark.timeout(180)
__all__ = ["searchable_root"]  # a fixture

SPARE_UID = 65534  # nobody
DEEP_IN_SANDBOX = (
    f'python3 -c \'import os\nfor _ in range({DEEP}): os.mkdir("d"); os.chdir("d")\n'
    'open("leaf", "w").close()\''
)


def test_a_10000_deep_tree_with_read_only_directories_is_removed(
    searchable_root: Path,
) -> None:
    make_deep_tree(searchable_root / "deep", DEEP)
    (searchable_root / "deep" / "d").chmod(0o500)
    remove_tree(str(searchable_root / "deep"))
    assert not (searchable_root / "deep").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to a spare uid")
def test_a_service_that_is_not_root_removes_its_own_10000_deep_tree(
    searchable_root: Path,
) -> None:
    service_directory = searchable_root / "service"  # the spare uid's own, as a service's is
    top = service_directory / "sandbox"
    service_directory.mkdir()
    make_deep_tree(top, DEEP)
    owner = f"{SPARE_UID}:{SPARE_UID}"
    subprocess.run(["chown", "-R", owner, str(service_directory)], check=True, timeout=60)
    (top / "d").chmod(0o500)
    assert _as_spare_uid(lambda: remove_tree(str(top))) == 0
    assert not top.exists()


def _as_spare_uid(work: Callable[[], None]) -> int:
    """Run ``work`` in a child process as the spare uid; its exit status."""
    pid = os.fork()
    if pid == 0:  # the child: no return from here
        status = 1
        try:
            os.setgroups([])
            os.setgid(SPARE_UID)
            os.setuid(SPARE_UID)
            work()
            status = 0
        finally:
            os._exit(status)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_a_crashed_services_10000_deep_directory_is_removed_at_the_next_start(
    searchable_root: Path,
) -> None:
    dead_pid = _reaped_pid()
    stale = searchable_root / f"{DIRECTORY_PREFIX}{dead_pid}-x1"
    stale.mkdir()
    make_deep_tree(stale / "sandbox", DEEP)
    assert remove_stale_directories(str(searchable_root)) == [str(stale)]
    assert not stale.exists()


def _reaped_pid() -> int:
    """The pid of a process that ran and was reaped: no process has it now."""
    process = subprocess.Popen(["true"])
    process.wait(timeout=30)
    return process.pid


@needs_bwrap
def test_deleting_a_sandbox_holding_a_10000_deep_tree_removes_it_all(
    service: LocalE2bService, client: Client
) -> None:
    sandbox = client.create()
    sandbox_id = sandbox["sandboxID"]
    made = client.run(sandbox, f"cd ~ && {DEEP_IN_SANDBOX} && echo made")
    assert made.stdout == "made\n", made.stderr
    directory = Path(service.sandbox_home(sandbox_id)).parent
    assert depth_of(Path(service.sandbox_home(sandbox_id))) == DEEP
    assert client.control("DELETE", f"/sandboxes/{sandbox_id}").status_code == 204
    assert sandbox_id not in service.sandboxes()
    assert not directory.exists()


@needs_bwrap
def test_closing_a_service_whose_sandbox_holds_a_10000_deep_tree_removes_it_all(
    searchable_root: Path,
) -> None:
    service = LocalE2bService(root=searchable_root)
    try:
        client = Client(service)
        sandbox = client.create()
        made = client.run(sandbox, f"cd /tmp && {DEEP_IN_SANDBOX} && echo made")
        assert made.stdout == "made\n", made.stderr
    finally:
        service.close()
    assert os.listdir(searchable_root) == []


@needs_bwrap
def test_forking_a_sandbox_holding_a_10000_deep_tree_succeeds_or_fails_cleanly(
    service: LocalE2bService, client: Client
) -> None:
    sandbox = client.create()
    made = client.run(sandbox, f"cd ~ && {DEEP_IN_SANDBOX} && echo made")
    assert made.stdout == "made\n", made.stderr
    directories = set(os.listdir(service.root))
    running = set(service.sandboxes())
    answer = client.control("POST", f"/sandboxes/{sandbox['sandboxID']}/fork", json={})
    assert answer.status_code == 201
    [result] = answer.json()
    if "error" in result:
        assert service.root not in str(result["error"])
        assert set(service.sandboxes()) == running
        assert set(os.listdir(service.root)) == directories
    else:
        fork_id = result["sandbox"]["sandboxID"]
        assert depth_of(Path(service.sandbox_home(fork_id))) == DEEP
