"""What a sandbox's cgroups say it uses (the metrics' source), read from the groups' files."""

from __future__ import annotations

from pathlib import Path

from piship_remote.local.isolation.limits import CgroupSet, GroupUsage

MIB = 1024 * 1024


def test_a_v2_group_gives_memory_without_page_cache_and_cpu_time(tmp_path: Path) -> None:
    (tmp_path / "memory.current").write_text(f"{50 * MIB}\n")
    (tmp_path / "memory.stat").write_text(f"anon {30 * MIB}\nfile {20 * MIB}\n")
    (tmp_path / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
    group = CgroupSet("v2", str(tmp_path), str(tmp_path))
    assert group.usage() == GroupUsage(2.5, 30 * MIB, 20 * MIB)


def test_v1_adds_the_agents_group_to_the_commands_and_counts_no_cpu(tmp_path: Path) -> None:
    commands, agent = tmp_path / "sb", tmp_path / "sb-agent"
    for group, used, cache in ((commands, 40, 10), (agent, 12, 2)):
        group.mkdir()
        (group / "memory.usage_in_bytes").write_text(f"{used * MIB}\n")
        (group / "memory.stat").write_text(f"cache {cache * MIB}\nrss {used * MIB}\n")
    group = CgroupSet("v1", None, str(commands), agent_memory=str(agent))
    assert group.usage() == GroupUsage(None, 40 * MIB, 12 * MIB)


def test_without_a_memory_group_there_is_no_usage() -> None:
    assert CgroupSet(None, None, None).usage() is None
