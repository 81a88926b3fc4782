"""The CPU limit on cgroup v1 under a parent group that has a quota of its own (a service in a
container with a CPU limit): v1 refuses a child quota above the parent's, so the sandbox
gets the parent's, which binds anyway, rather than failing to start."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest

from piship_remote.local.isolation.limits import (
    CPU_PERIOD_US,
    V1_ROOT,
    CgroupSet,
    Enforcement,
    Limits,
)

V1_CPU = os.path.join(V1_ROOT, "cpu")
PARENT_QUOTA = CPU_PERIOD_US // 2

pytestmark = pytest.mark.skipif(
    not (os.path.exists(os.path.join(V1_CPU, "cpu.cfs_quota_us")) and os.access(V1_CPU, os.W_OK)),
    reason="needs a writable cgroup v1 cpu hierarchy (root on a v1 host)",
)


@pytest.fixture
def limited_parent() -> Iterator[str]:
    """A v1 cpu group limited to half a CPU, as a container's would be."""
    parent = os.path.join(V1_CPU, f"piship-test-{secrets.token_hex(4)}")
    os.mkdir(parent)
    try:
        with open(os.path.join(parent, "cpu.cfs_quota_us"), "w", encoding="ascii") as handle:
            handle.write(str(PARENT_QUOTA))
        yield parent
    finally:
        os.rmdir(parent)


def test_a_sandbox_under_a_lower_parent_quota_gets_the_parents(limited_parent: str) -> None:
    support = Enforcement("v1", None, None, False, cpu=limited_parent)
    group = CgroupSet.create(support, "sandbox", Limits(cpus=2))
    try:
        assert group.cpu is not None
        with open(os.path.join(group.cpu, "cpu.cfs_quota_us"), encoding="ascii") as handle:
            assert int(handle.read()) == PARENT_QUOTA
    finally:
        group.remove()
