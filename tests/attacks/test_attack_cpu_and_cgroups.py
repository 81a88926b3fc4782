"""A sandbox's CPU is limited (``max_cpus``, by its cgroup's CPU bandwidth), and its cgroup
does not give its ID away to the host's other users (``/proc/<pid>/cgroup`` is readable
by everyone). Today there was no CPU limit, and the groups were named after the IDs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from piship_remote.local import LocalE2bService
from piship_remote.local.isolation.limits import CPU_PERIOD_US, CgroupSet, Enforcement
from tests.support.local_service import Client, needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.timeout(120)]

MAX_CPUS = 0.2
BUSY_SECONDS = 1.5
NO_CPU_GROUP = Enforcement.probe().cpu is None


@pytest.fixture(scope="module")
def service() -> Iterator[LocalE2bService]:
    with LocalE2bService(max_cpus=MAX_CPUS) as running:
        yield running


def cgroups_of(service: LocalE2bService, sandbox_id: str) -> CgroupSet:
    found = service._registry.lookup(sandbox_id)
    assert found is not None
    return found.cgroups


def cpu_stat(cgroups: CgroupSet) -> dict[str, int]:
    assert cgroups.cpu is not None
    with open(os.path.join(cgroups.cpu, "cpu.stat"), encoding="ascii") as handle:
        return {key: int(value) for key, value in (line.split() for line in handle)}


@pytest.mark.skipif(NO_CPU_GROUP, reason="needs a writable cpu cgroup (root, or delegated v2)")
def test_the_cpu_limit_is_written_into_the_sandboxs_cgroup(
    service: LocalE2bService, sandbox: dict[str, Any]
) -> None:
    cgroups = cgroups_of(service, str(sandbox["sandboxID"]))
    assert cgroups.cpu is not None
    quota = round(MAX_CPUS * CPU_PERIOD_US)
    if cgroups.version == "v2":
        with open(os.path.join(cgroups.cpu, "cpu.max"), encoding="ascii") as handle:
            assert handle.read().split() == [str(quota), str(CPU_PERIOD_US)]
    else:
        with open(os.path.join(cgroups.cpu, "cpu.cfs_quota_us"), encoding="ascii") as handle:
            assert int(handle.read()) == quota


@pytest.mark.skipif(NO_CPU_GROUP, reason="needs a writable cpu cgroup (root, or delegated v2)")
def test_a_busy_loop_in_the_sandbox_is_throttled(
    service: LocalE2bService, client: Client, sandbox: dict[str, Any]
) -> None:
    cgroups = cgroups_of(service, str(sandbox["sandboxID"]))
    before = cpu_stat(cgroups)
    busy = f"timeout {BUSY_SECONDS} sh -c 'while :; do :; done'; echo done"
    assert client.run(sandbox, busy).stdout == "done\n"
    after = cpu_stat(cgroups)
    assert after["nr_throttled"] > before["nr_throttled"]


def test_no_process_of_a_sandbox_shows_its_id_in_proc_cgroup(
    service: LocalE2bService, client: Client, sandbox: dict[str, Any]
) -> None:
    sandbox_id = str(sandbox["sandboxID"])
    assert client.run(sandbox, "sleep 30 & echo started").stdout == "started\n"
    members = cgroups_of(service, sandbox_id).members()
    if not members:
        pytest.skip("the service makes no cgroups on this host (not root, none delegated)")
    for member in members:
        with open(f"/proc/{member}/cgroup", encoding="utf-8") as handle:
            assert sandbox_id not in handle.read()


def test_the_service_says_the_cpu_limit_it_holds(service: LocalE2bService) -> None:
    held = "not held" if NO_CPU_GROUP else "held"
    line = f"cpu per sandbox: at most {MAX_CPUS:g} CPUs of this host ({held})"
    assert line in service.containment.lines()


def test_no_host_path_or_command_line_of_a_sandbox_shows_its_id(
    service: LocalE2bService, client: Client, sandbox: dict[str, Any]
) -> None:
    sandbox_id = str(sandbox["sandboxID"])
    assert client.run(sandbox, "echo up").stdout == "up\n"
    assert sandbox_id not in service.sandbox_home(sandbox_id)
    with open("/proc/self/mountinfo", encoding="utf-8") as table:
        assert sandbox_id not in table.read()
    for member in cgroups_of(service, sandbox_id).members():
        with open(f"/proc/{member}/cmdline", "rb") as handle:
            assert sandbox_id.encode() not in handle.read()
