"""Capabilities vs policy, the containment report's JSON shape, and the doctor line (§2.4-§5)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from piship_remote.model._capability_rules import (
    capability_mismatch,
    claimed_guarantees,
    declared_network_probe,
    network_probe_problem,
    required_planes,
)
from piship_remote.model.report import (
    GUARANTEES,
    Capabilities,
    ContainmentReport,
    NetworkDenial,
    NetworkProbe,
    WorkspaceReport,
    describe_containment,
    describe_workspace,
    initial_workspace_report,
    snapshot_workspace_report,
)

E2B = Capabilities(
    isolation="remote",
    planes=("host-filesystem-isolation", "network-deny", "environment-filter"),
    network=("deny", "allow"),
    local_processes=False,
)
K8S = Capabilities(
    isolation="remote",
    planes=("host-filesystem-isolation", "environment-filter"),
    network=("allow",),
    local_processes=False,
)
NO_PROBE = "the backend declares no network probe to check it with"

SNAPSHOT_SENTENCE = (
    "Workspace: snapshot. Remote commands see a copy, not the files the agent edits;"
    " this is not a complete coding-agent workspace."
)
HOST_ISOLATION_SENTENCE = (
    " The sandbox cannot reach this host's files, but it does not enforce sandbox.filesystem"
    " path rules; they govern only the local file tools."
)


def enforced(adapter: str, capabilities: Capabilities, network: str) -> ContainmentReport:
    """The report an activation builds for a remote snapshot backend."""
    return ContainmentReport(
        level="enforced",
        adapter=adapter,
        provider=adapter,
        required=True,
        planes=claimed_guarantees(capabilities, network),
        network="deny" if network == "deny" else "allow",
        verification="backend-attested",
        network_denial=NetworkDenial("attested", False, NO_PROBE) if network == "deny" else None,
        local_processes=False,
        warnings=(),
        isolation="remote",
        workspace=snapshot_workspace_report(),
    )


@pytest.fixture
def e2b_deny() -> ContainmentReport:
    return enforced("e2b-compatible", E2B, "deny")


@pytest.fixture
def k8s_allow() -> ContainmentReport:
    return enforced("kubernetes-agent-sandbox", K8S, "allow")


# ---------------------------------------------------------------- the doctor line


def test_seed_e2b_doctor_line(e2b_deny: ContainmentReport) -> None:
    assert describe_containment(e2b_deny) == (
        "enforced by e2b-compatible (required, attested by the backend): "
        "network-deny, environment-filter, host-filesystem-isolation"
        "; network deny (attested by the backend, not verified)"
        ". Contains shell commands; MCP stdio servers cannot be contained by this backend"
        " and do not start"
        ", not the agent process or in-process extensions"
        "." + HOST_ISOLATION_SENTENCE + " " + SNAPSHOT_SENTENCE
    )


def test_kubernetes_doctor_line(k8s_allow: ContainmentReport) -> None:
    assert describe_containment(k8s_allow) == (
        "enforced by kubernetes-agent-sandbox (required, attested by the backend):"
        " environment-filter, host-filesystem-isolation; network allow. Contains shell commands;"
        " MCP stdio servers cannot be contained by this backend and do not start, not the agent"
        " process or in-process extensions. The sandbox cannot reach this host's files, but it"
        " does not enforce sandbox.filesystem path rules; they govern only the local file tools."
        " Workspace: snapshot. Remote commands see a copy, not the files the agent edits; this is"
        " not a complete coding-agent workspace."
    )


def test_e2b_allow_line_equals_the_kubernetes_line_but_for_the_adapter(
    k8s_allow: ContainmentReport,
) -> None:
    line = describe_containment(enforced("e2b-compatible", E2B, "allow"))
    assert line == describe_containment(k8s_allow).replace(
        "kubernetes-agent-sandbox", "e2b-compatible"
    )


def test_line_never_mentions_path_planes_for_remote_backends(
    e2b_deny: ContainmentReport, k8s_allow: ContainmentReport
) -> None:
    for report in (e2b_deny, k8s_allow):
        line = describe_containment(report)
        assert "filesystem-read-deny" not in line
        assert "filesystem-write-allowlist" not in line


def test_verified_network_denial(e2b_deny: ContainmentReport) -> None:
    report = attrs.evolve(e2b_deny, network_denial=NetworkDenial("verified", True))
    assert "; network deny (verified). Contains" in describe_containment(report)


def test_optional_without_attestation() -> None:
    report = ContainmentReport(
        level="enforced", adapter="x", provider="custom", required=False, planes=(), network="allow"
    )
    assert describe_containment(report) == (
        "enforced by x (optional): ; network allow. Contains shell commands; MCP stdio servers"
        " cannot be contained by this backend and do not start, not the agent process or"
        " in-process extensions. sandbox.filesystem path rules are not enforced by the backend."
    )


def test_local_processes_scope() -> None:
    report = ContainmentReport(
        level="enforced",
        adapter="x",
        provider="native",
        required=True,
        planes=("filesystem-read-deny", "filesystem-write-allowlist"),
        network="allow",
        verification="live-probe",
        local_processes=True,
        isolation="local",
    )
    assert describe_containment(report) == (
        "enforced by x (required): filesystem-read-deny, filesystem-write-allowlist;"
        " network allow. Contains every command it runs, not this Python process"
    )


def test_both_path_planes_and_a_workspace_add_the_period() -> None:
    report = ContainmentReport(
        level="enforced",
        adapter="x",
        provider="custom",
        required=True,
        planes=("filesystem-read-deny", "filesystem-write-allowlist"),
        network="allow",
        isolation="remote",
        workspace=snapshot_workspace_report(),
    )
    assert describe_containment(report).endswith(
        "not the agent process or in-process extensions. " + SNAPSHOT_SENTENCE
    )


@pytest.mark.parametrize(
    ("planes", "sentence"),
    [
        (
            ("filesystem-read-deny",),
            " sandbox.filesystem path rules are only partly enforced by the backend"
            " (filesystem-read-deny only); push and pull still apply them in full.",
        ),
        (
            ("filesystem-write-allowlist", "host-filesystem-isolation"),
            " sandbox.filesystem path rules are only partly enforced by the backend"
            " (filesystem-write-allowlist only); push and pull still apply them in full.",
        ),
        (("host-filesystem-isolation", "workspace-confinement"), HOST_ISOLATION_SENTENCE),
        (
            ("workspace-confinement",),
            " The sandbox reaches this host's files only through the workspace, where it does not"
            " enforce sandbox.filesystem path rules: a read-denied path inside the workspace is"
            " readable by sandboxed commands.",
        ),
        (
            ("environment-filter",),
            " sandbox.filesystem path rules are not enforced by the backend.",
        ),
    ],
)
def test_path_rule_sentences(planes: tuple[str, ...], sentence: str) -> None:
    report = ContainmentReport(
        level="enforced",
        adapter="x",
        provider="custom",
        required=True,
        planes=planes,
        network="allow",
    )
    assert describe_containment(report).endswith("in-process extensions." + sentence)


def test_explicit_workspace_report_overrides_the_reports(e2b_deny: ContainmentReport) -> None:
    live = initial_workspace_report("shared")
    line = describe_containment(e2b_deny, live)
    assert line.endswith(
        " Workspace: shared declared, verified before the first sandboxed command."
    )


def test_non_remote_report_has_no_workspace_sentence(e2b_deny: ContainmentReport) -> None:
    report = attrs.evolve(e2b_deny, isolation="local")
    assert "Workspace:" not in describe_containment(report)


def test_unavailable_line_redacts_the_reason() -> None:
    report = ContainmentReport(
        level="unavailable",
        adapter="e2b-compatible",
        provider="e2b-compatible",
        required=False,
        network="deny",
        reason="the endpoint said Bearer abcdefgh12345678",
    )
    assert describe_containment(report) == (
        "unavailable on e2b-compatible (optional): the endpoint said [REDACTED]."
        " No command runs: piship_remote runs commands only in a sandbox"
    )


def test_unavailable_line_without_a_reason() -> None:
    report = ContainmentReport(
        level="unavailable", adapter="k", provider="k", required=True, network="allow"
    )
    assert describe_containment(report) == (
        "unavailable on k (required): unknown reason."
        " No command runs: piship_remote runs commands only in a sandbox"
    )


def test_not_required_line() -> None:
    report = ContainmentReport(
        level="not-required",
        adapter="e2b-compatible",
        provider="e2b-compatible",
        required=False,
        network="allow",
    )
    assert describe_containment(report) == (
        "not required: no sandbox is active."
        " No command runs: piship_remote runs commands only in a sandbox"
    )


# ---------------------------------------------------------------- workspace sentences


@pytest.mark.parametrize(
    ("report", "sentence"),
    [
        (snapshot_workspace_report(), SNAPSHOT_SENTENCE),
        (
            WorkspaceReport(
                declared="shared",
                effective="shared",
                verification="not-required",
                git_control_protection="verified",
                complete=True,
            ),
            "Workspace: shared (commands run on this host's files).",
        ),
        (
            initial_workspace_report("synchronized"),
            "Workspace: synchronized declared, verified before the first sandboxed command.",
        ),
        (
            WorkspaceReport(
                declared="shared",
                effective="shared",
                verification="verified",
                verified_at="2024-01-02T03:04:05Z",
                git_control_protection="attested-renames",
                complete=True,
            ),
            "Workspace: shared (verified 2024-01-02T03:04:05Z, both directions immediate).",
        ),
        (
            WorkspaceReport(
                declared="shared",
                effective="synchronized",
                verification="verified",
                window_ms=500,
                git_control_protection="attested-renames",
            ),
            "Workspace: synchronized (declared shared; verified an unknown time, within 500 ms).",
        ),
        (
            WorkspaceReport(
                declared="synchronized",
                effective="synchronized",
                verification="verified",
                verified_at="T",
                git_control_protection="attested-renames",
            ),
            "Workspace: synchronized (verified T, within 10000 ms).",
        ),
        (
            WorkspaceReport(
                declared="shared",
                effective="snapshot",
                verification="unverifiable",
                reason="the workspace has no .git directory",
                git_control_protection="attested-renames",
            ),
            "Workspace: snapshot (declared shared; no location this library owns to verify it:"
            " the workspace has no .git directory).",
        ),
        (
            WorkspaceReport(
                declared="shared",
                effective="snapshot",
                verification="unverifiable",
                git_control_protection="attested-renames",
            ),
            "Workspace: snapshot (declared shared; no location this library owns to verify it:"
            " unknown reason).",
        ),
        (
            WorkspaceReport(
                declared="synchronized",
                effective="snapshot",
                verification="failed",
                reason="the host did not see sandbox changes",
                git_control_protection="attested-renames",
            ),
            "Workspace: snapshot (declared synchronized; the host did not see sandbox changes)."
            " Remote commands see a copy of the workspace.",
        ),
        (
            WorkspaceReport(
                declared="shared",
                effective="snapshot",
                verification="failed",
                git_control_protection="not-verified",
            ),
            "Workspace: snapshot (declared shared; the check failed). Remote commands see a copy"
            " of the workspace.",
        ),
    ],
)
def test_workspace_sentences(report: WorkspaceReport, sentence: str) -> None:
    assert describe_workspace(report) == sentence


# ---------------------------------------------------------------- JSON shapes


def test_seed_e2b_report_to_dict(e2b_deny: ContainmentReport) -> None:
    data = e2b_deny.to_dict()
    assert data == {
        "level": "enforced",
        "adapter": "e2b-compatible",
        "provider": "e2b-compatible",
        "required": True,
        "planes": ["network-deny", "environment-filter", "host-filesystem-isolation"],
        "network": "deny",
        "verification": "backend-attested",
        "networkDenial": {"evidence": "attested", "probe": False, "reason": NO_PROBE},
        "localProcesses": False,
        "warnings": [],
        "isolation": "remote",
        "workspace": {
            "declared": "snapshot",
            "effective": "snapshot",
            "verification": "not-required",
            "gitControlProtection": "not-applicable",
            "complete": False,
        },
    }


def test_to_dict_keeps_the_field_order(e2b_deny: ContainmentReport) -> None:
    assert list(e2b_deny.to_dict()) == [
        "level",
        "adapter",
        "provider",
        "required",
        "planes",
        "network",
        "verification",
        "networkDenial",
        "localProcesses",
        "warnings",
        "isolation",
        "workspace",
    ]


def test_kubernetes_allow_report_to_dict(k8s_allow: ContainmentReport) -> None:
    data = k8s_allow.to_dict()
    assert "networkDenial" not in data
    assert data["adapter"] == data["provider"] == "kubernetes-agent-sandbox"
    assert data["planes"] == ["environment-filter", "host-filesystem-isolation"]
    assert data["network"] == "allow"


def test_unavailable_report_to_dict() -> None:
    report = ContainmentReport(
        level="unavailable",
        adapter="a",
        provider="custom",
        required=False,
        network="deny",
        reason="down",
    )
    assert report.to_dict() == {
        "level": "unavailable",
        "adapter": "a",
        "provider": "custom",
        "required": False,
        "planes": [],
        "network": "deny",
        "localProcesses": False,
        "reason": "down",
        "warnings": [],
    }


def test_workspace_report_to_dict_renames_every_field() -> None:
    report = WorkspaceReport(
        declared="shared",
        effective="synchronized",
        verification="verified",
        host_to_sandbox="immediate",
        sandbox_to_host="delayed",
        window_ms=10000,
        git_control_protection="attested-renames",
        verified_at="2024-01-02T03:04:05Z",
        reason="a direction was delayed, which a mount would not be",
        complete=True,
    )
    assert list(report.to_dict()) == [
        "declared",
        "effective",
        "verification",
        "hostToSandbox",
        "sandboxToHost",
        "windowMs",
        "gitControlProtection",
        "verifiedAt",
        "reason",
        "complete",
    ]


def test_network_denial_to_dict_omits_a_missing_reason() -> None:
    assert NetworkDenial("verified", True).to_dict() == {"evidence": "verified", "probe": True}


def test_capabilities_to_dict() -> None:
    assert E2B.to_dict() == {
        "isolation": "remote",
        "planes": ["host-filesystem-isolation", "network-deny", "environment-filter"],
        "network": ["deny", "allow"],
        "localProcesses": False,
        "workspace": {"mode": "snapshot"},
    }


def test_capabilities_to_dict_with_a_probe() -> None:
    caps = attrs.evolve(E2B, network_probe=NetworkProbe("probe.test", 8443))
    assert caps.to_dict()["networkProbe"] == {"host": "probe.test", "port": 8443}


def test_capabilities_accept_a_probe_mapping_and_lists() -> None:
    caps = Capabilities(
        "remote",
        ["environment-filter"],
        ["allow"],
        False,
        network_probe={"host": "probe.test", "port": 1},
    )
    assert caps.network_probe == NetworkProbe("probe.test", 1)
    assert caps.planes == ("environment-filter",)


def test_report_sequences_are_tuples(e2b_deny: ContainmentReport) -> None:
    assert isinstance(e2b_deny.planes, tuple)
    assert isinstance(e2b_deny.warnings, tuple)


# ---------------------------------------------------------------- policy vs capabilities


def test_required_planes() -> None:
    assert required_planes("deny", "remote", "snapshot") == (
        "host-filesystem-isolation",
        "network-deny",
        "environment-filter",
    )
    assert required_planes("allow", "remote", "shared") == (
        "workspace-confinement",
        "git-control-protection",
        "environment-filter",
    )
    assert required_planes("allow", "local", "snapshot") == (
        "filesystem-read-deny",
        "filesystem-write-allowlist",
        "environment-filter",
    )


def test_guarantees_are_in_canonical_order() -> None:
    assert GUARANTEES == (
        "filesystem-read-deny",
        "filesystem-write-allowlist",
        "network-deny",
        "environment-filter",
        "git-control-protection",
        "host-filesystem-isolation",
        "workspace-confinement",
    )


def test_claimed_guarantees_follow_the_canonical_order() -> None:
    assert claimed_guarantees(E2B, "deny") == (
        "network-deny",
        "environment-filter",
        "host-filesystem-isolation",
    )


def test_claimed_guarantees_drop_network_deny_in_allow_mode() -> None:
    assert claimed_guarantees(E2B, "allow") == ("environment-filter", "host-filesystem-isolation")


def test_claimed_guarantees_drop_host_isolation_for_a_shared_workspace() -> None:
    caps = attrs.evolve(E2B, workspace_mode="shared")
    assert "host-filesystem-isolation" not in claimed_guarantees(caps, "deny")


def test_claimed_guarantees_drop_remote_planes_for_a_local_backend() -> None:
    caps = Capabilities(
        "local",
        ["workspace-confinement", "host-filesystem-isolation", "environment-filter"],
        ["allow"],
        True,
    )
    assert claimed_guarantees(caps, "allow") == ("environment-filter",)


def test_claimed_guarantees_drop_unknown_planes() -> None:
    caps = attrs.evolve(K8S, planes=("environment-filter", "teleportation"))
    assert claimed_guarantees(caps, "allow") == ("environment-filter",)


@pytest.mark.parametrize(
    ("caps", "network", "mismatch"),
    [
        (E2B, "deny", None),
        (E2B, "allow", None),
        (K8S, "allow", None),
        (K8S, "deny", "it does not provide network-deny"),
        (attrs.evolve(E2B, isolation="cloud"), "deny", "it declares no isolation kind"),
        (
            attrs.evolve(E2B, workspace_mode="mounted"),
            "deny",
            "it declares a malformed workspace:"
            " the workspace mode is not snapshot, synchronized, or shared",
        ),
        (
            attrs.evolve(E2B, workspace_mode="shared"),
            "deny",
            "it claims host-filesystem-isolation although its workspace is shared,"
            " which reaches this host's files",
        ),
        (
            attrs.evolve(K8S, planes=("environment-filter",), workspace_mode="synchronized"),
            "allow",
            "it does not provide workspace-confinement, git-control-protection",
        ),
        (
            attrs.evolve(E2B, network=("allow",)),
            "deny",
            "it does not provide network-deny",
        ),
        (
            attrs.evolve(K8S, network=("deny", "allow")),
            "deny",
            "it does not provide network-deny",
        ),
        (
            attrs.evolve(E2B, planes=("network-deny",)),
            "deny",
            "it does not provide host-filesystem-isolation, environment-filter",
        ),
        (
            Capabilities("local", ["environment-filter"], ["deny", "allow"], True),
            "allow",
            "it does not provide filesystem-read-deny, filesystem-write-allowlist",
        ),
    ],
)
def test_capability_mismatch(caps: Capabilities, network: str, mismatch: str | None) -> None:
    assert capability_mismatch(caps, network) == mismatch


MALFORMED_PROBES: list[tuple[Any, str]] = [
    ({"host": "probe.sandbox.test; rm -rf /", "port": 8443}, "host"),
    ({"host": "-oProxyCommand=x", "port": 8443}, "host"),
    ({"host": "[::1]", "port": 8443}, "host"),
    ({"host": "a" * 254, "port": 8443}, "host"),
    ({"host": None, "port": 8443}, "host"),
    ({"host": "probe.sandbox.test", "port": 0}, "port"),
    ({"host": "probe.sandbox.test", "port": 65536}, "port"),
    ({"host": "probe.sandbox.test", "port": 1.5}, "port"),
    ({"host": "probe.sandbox.test", "port": True}, "port"),
    ({"host": "probe.sandbox.test", "port": "8443"}, "port"),
    ("probe.sandbox.test:8443", "object"),
]


@pytest.mark.parametrize("network", ["deny", "allow"])
@pytest.mark.parametrize(("probe", "problem"), MALFORMED_PROBES)
def test_malformed_network_probe_is_a_mismatch(probe: Any, problem: str, network: str) -> None:
    caps = Capabilities("remote", E2B.planes, E2B.network, False, network_probe=probe)
    mismatch = capability_mismatch(caps, network)
    assert mismatch is not None
    assert mismatch.startswith("it declares a malformed network probe: ")
    assert problem in mismatch
    assert declared_network_probe(caps) is None


@pytest.mark.parametrize(
    "probe",
    [
        NetworkProbe("probe.sandbox.test", 8443),
        NetworkProbe("10.0.0.1", 1),
        NetworkProbe("fd00::1", 65535),
        NetworkProbe("a" * 253, 80),
    ],
)
def test_well_formed_network_probe(probe: NetworkProbe) -> None:
    caps = attrs.evolve(E2B, network_probe=probe)
    assert network_probe_problem(probe) is None
    assert capability_mismatch(caps, "deny") is None
    assert declared_network_probe(caps) == probe


def test_network_probe_problem_texts() -> None:
    assert network_probe_problem("x") == "the network probe is not an object"
    assert network_probe_problem(NetworkProbe("[::1]", 1)) == (
        "the network probe host must be a hostname or an IP address without brackets or a port"
    )
    assert network_probe_problem(NetworkProbe("h", 0)) == (
        "the network probe port must be an integer from 1 to 65535"
    )


def test_a_local_backends_probe_is_ignored() -> None:
    caps = Capabilities(
        "local",
        [
            "filesystem-read-deny",
            "filesystem-write-allowlist",
            "network-deny",
            "environment-filter",
        ],
        ["deny"],
        True,
        network_probe={"host": "bad host", "port": 0},
    )
    assert capability_mismatch(caps, "deny") is None
    assert declared_network_probe(caps) is None


# ---------------------------------------------------------------- notebook display


def test_repr_html_is_an_escaped_table(e2b_deny: ContainmentReport) -> None:
    report = attrs.evolve(e2b_deny, warnings=("<script>alert(1)</script>",))
    rendered = report._repr_html_()
    assert rendered.startswith("<table>")
    assert "<script>" not in rendered
    assert "&lt;script&gt;" in rendered
    assert "networkDenial" in rendered
    assert "host&#x27;s files" in rendered


def test_repr_pretty_shows_the_doctor_line(e2b_deny: ContainmentReport) -> None:
    class Printer:
        def __init__(self) -> None:
            self.parts: list[str] = []

        def text(self, value: str) -> None:
            self.parts.append(value)

    printer = Printer()
    e2b_deny._repr_pretty_(printer, False)
    text = "".join(printer.parts)
    assert text.startswith("ContainmentReport: enforced by e2b-compatible")
    assert "  planes: network-deny, environment-filter, host-filesystem-isolation" in text
