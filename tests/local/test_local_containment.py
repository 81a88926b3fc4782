"""What the local service says it enforces: limits, network modes and what does not hold."""

from __future__ import annotations

import pytest

from piship_remote.local import containment as containment_module
from piship_remote.local.containment import COMMAND_LINES, NETWORK_ALLOW, containment
from piship_remote.local.isolation.limits import MIB, Enforcement, Limits

ENFORCED = Enforcement(cgroup="v1", processes="v1", memory="v1", disk=True)
NOTHING = Enforcement(
    cgroup=None,
    processes=None,
    memory=None,
    disk=False,
    problems=("no cgroup hierarchy with the pids controller can be written here",),
)


def test_the_limits_line_names_each_limit_and_which_hold() -> None:
    summary = containment(Limits(processes=64, memory=256 * MIB, disk=128 * MIB), ENFORCED)

    assert summary.lines()[0] == (
        "limits per sandbox: processes: 64, memory: 256 MiB, disk: 128 MiB,"
        " lifetime: at most 86400 s (held: processes, memory, disk, lifetime)"
    )


def test_a_limit_the_host_cannot_hold_is_a_warning() -> None:
    summary = containment(Limits(), NOTHING)

    assert "processes" not in summary.held
    assert NOTHING.problems[0] in summary.warnings


def test_the_programs_a_script_starts_are_said_to_show_their_arguments() -> None:
    summary = containment(Limits(), ENFORCED)

    assert COMMAND_LINES in summary.warnings
    assert f"warning: {COMMAND_LINES}" in summary.lines()


def test_network_allow_is_offered_with_slirp4netns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(containment_module, "egress_problem", lambda: None)

    summary = containment(Limits(), ENFORCED)

    assert NETWORK_ALLOW in summary.network
    assert any("non-loopback addresses" in warning for warning in summary.warnings)


def test_network_allow_is_refused_with_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(containment_module, "egress_problem", lambda: "install slirp4netns")

    summary = containment(Limits(), ENFORCED)

    assert summary.network == (containment_module.NETWORK_DENY,)
    assert "network allow is refused: install slirp4netns" in summary.warnings


def test_egress_rules_are_said_to_hold_where_nft_can_load_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(containment_module, "egress_problem", lambda: None)
    monkeypatch.setattr(containment_module, "rules_problem", lambda: None)

    summary = containment(Limits(), ENFORCED)

    assert containment_module.NETWORK_RULES in summary.network


def test_egress_rules_are_said_to_be_refused_with_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(containment_module, "egress_problem", lambda: None)
    monkeypatch.setattr(containment_module, "rules_problem", lambda: "install nftables")

    summary = containment(Limits(), ENFORCED)

    assert containment_module.NETWORK_RULES not in summary.network
    assert "egress rules (allowOut/denyOut) are refused: install nftables" in summary.warnings
