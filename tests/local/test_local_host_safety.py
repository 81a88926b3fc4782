"""A local sandbox changes nothing on its host: not as its user, not as its root.

Where the service runs as host root, a sandbox's uids are unused host uids: its
commands cannot change a host device node, every place it may write counts
toward one disk cap, and nothing of the host (the service's paths) shows inside.
As a normal user the sandbox's user is that user, which can change nothing the
service could not; the checks that hold only for a root service say so.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import piship_remote
from piship_remote.local import LocalE2bService
from piship_remote.local.isolation.user_map import SANDBOX_UID, root_mappable
from piship_remote.model.errors import CONFIG_INVALID, PiShipError
from tests.support.local_service import Client, gone, marked, marker, needs_bwrap, run_as, start_as
from tests.support.sandbox_uid import host_ids_of

pytestmark = [needs_bwrap, pytest.mark.timeout(60)]

DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")
DISK_MIB = 16
# Each change is a no-op on the value (same mode, same time, same owner) but, where it is
# allowed at all, it moves the node's ctime: the host sees that the sandbox could.
TOUCH_DEVICES = " ".join(
    f"chmod $(stat -c %a {d}) {d}; touch -c -m -r {d} {d}; chown $(stat -c %u:%g {d}) {d};"
    for d in DEVICES
)
WRITABLE = ("/dev", "/dev/shm", "/run", "/var/tmp", "/tmp", "/home/user", "/root", "/")
needs_root_service = pytest.mark.skipif(
    not root_mappable(), reason="holds where the service runs as host root (it is not here)"
)


@pytest.fixture(scope="module")
def service() -> Iterator[LocalE2bService]:
    with LocalE2bService(max_disk_mib=DISK_MIB) as running:
        yield running


def users() -> list[str]:
    return ["user", "root"] if root_mappable() else ["user"]


def device_state() -> dict[str, tuple[int, int, int, int]]:
    found = {}
    for device in DEVICES:
        if os.path.exists(device):
            info = os.stat(device)
            found[device] = (info.st_mode, info.st_uid, info.st_gid, info.st_ctime_ns)
    return found


def restore(before: dict[str, tuple[int, int, int, int]]) -> None:
    """Put back what a failing run changed (mode and owner; a ctime cannot be put back)."""
    for device, (mode, uid, gid, _) in before.items():
        info = os.stat(device)
        if (info.st_mode, info.st_uid, info.st_gid) != (mode, uid, gid):
            os.chown(device, uid, gid)
            os.chmod(device, stat.S_IMODE(mode))


@pytest.mark.parametrize("user", users())
def test_a_sandbox_changes_no_host_device_node(
    client: Client, sandbox: dict[str, Any], user: str
) -> None:
    before = device_state()
    try:
        start_as(client, sandbox, user, TOUCH_DEVICES).finish()
        after = device_state()
    finally:
        restore(before)
    assert after == before


@pytest.mark.parametrize("user", users())
def test_dev_is_read_only_in_a_sandbox(client: Client, sandbox: dict[str, Any], user: str) -> None:
    stream = start_as(client, sandbox, user, "echo x > /dev/planted; ls /dev/planted").finish()
    assert "Read-only file system" in stream.stderr
    assert stream.stdout == ""


@needs_root_service
def test_a_root_services_sandbox_runs_as_an_unused_host_uid(
    client: Client, sandbox: dict[str, Any], service: LocalE2bService
) -> None:
    mark = marker()
    start_as(client, sandbox, "user", f"sleep {mark}")
    assert gone(lambda: bool(marked(mark)))
    for pid in marked(mark):
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            uids = next(line for line in status if line.startswith("Uid:")).split()[1:]
        assert set(map(int, uids)) == {host_ids_of(service, sandbox).host(SANDBOX_UID)}


@needs_root_service
def test_every_writable_place_together_stays_under_the_disk_cap(
    client: Client, sandbox: dict[str, Any]
) -> None:
    fill = " ".join(
        f"head -c {DISK_MIB}M /dev/zero > {place}/fill-$n 2>/dev/null; n=$((n+1));"
        for place in WRITABLE
    )
    sizes = " ".join(f"{place}/fill-*" for place in WRITABLE)
    script = f"n=0; {fill} stat -c %s {sizes} 2>/dev/null"
    total = 0
    for user in users():
        stream = start_as(client, sandbox, user, script).finish()
        total = sum(int(size) for size in stream.stdout.split())
    assert 0 < total <= DISK_MIB * 1024 * 1024


def test_the_sandboxs_host_mounts_are_nosuid_and_nodev(
    service: LocalE2bService, sandbox: dict[str, Any]
) -> None:
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        ours = [line.split() for line in mounts if line.split()[1].startswith(service.root)]
    if not root_mappable():
        assert ours == []  # a normal user's service mounts nothing on the host
    for _, _, _, options, *_ in ours:
        assert {"nosuid", "nodev"} <= set(options.split(","))


def test_no_host_path_shows_inside_a_sandbox(
    client: Client, sandbox: dict[str, Any], service: LocalE2bService
) -> None:
    seen = run_as(
        client,
        sandbox,
        "user",
        "cat /proc/self/mountinfo; for p in /proc/[0-9]*; do"
        " tr '\\0' '\\n' < $p/cmdline; tr '\\0' '\\n' < $p/environ; done 2>/dev/null",
    ).stdout
    host_paths = {os.path.dirname(piship_remote.__file__), os.getcwd()}
    if not sys.prefix.startswith("/usr"):
        host_paths.add(sys.prefix)  # a Python installed outside the system's directories
    if root_mappable():
        host_paths.add(service.root)  # a normal user's places are bound from the host
    assert [path for path in host_paths if path in seen] == []


@needs_root_service
def test_a_root_service_refuses_a_directory_its_sandboxes_could_not_look_up(
    tmp_path: Path,
) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    with pytest.raises(PiShipError) as raised:
        LocalE2bService(root=closed)
    assert raised.value.code == CONFIG_INVALID
    assert "not searchable by every user" in str(raised.value)
