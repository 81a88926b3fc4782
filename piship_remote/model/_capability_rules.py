"""What a backend's declared capabilities let an activation claim, and what they cannot enforce.

>>> k8s = Capabilities("remote", ["host-filesystem-isolation", "environment-filter"],
...                    ["allow"], False)
>>> capability_mismatch(k8s, "deny")
'it does not provide network-deny'
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from piship_remote.model.report import (
    GIT_CONTROL_PROTECTION,
    GUARANTEES,
    HOST_FILESYSTEM_ISOLATION,
    PATH_POLICY_PLANES,
    WORKSPACE_CONFINEMENT,
    WORKSPACE_MODES,
    Capabilities,
    NetworkProbe,
)

__all__ = [
    "capability_mismatch",
    "claimed_guarantees",
    "declared_network_probe",
    "network_probe_problem",
    "required_planes",
]


def required_planes(
    network: str, isolation: str = "remote", workspace_mode: str = "snapshot"
) -> tuple[str, ...]:
    """The guarantees a required sandbox must enforce.

    >>> required_planes("deny", "remote", "snapshot")
    ('host-filesystem-isolation', 'network-deny', 'environment-filter')
    """
    if isolation == "local":
        filesystem: tuple[str, ...] = PATH_POLICY_PLANES
    elif workspace_mode == "snapshot":
        filesystem = (HOST_FILESYSTEM_ISOLATION,)
    else:
        filesystem = (WORKSPACE_CONFINEMENT, GIT_CONTROL_PROTECTION)
    return (*filesystem, *(("network-deny",) if network == "deny" else ()), "environment-filter")


def _declared_mode(capabilities: Capabilities) -> str:
    """The workspace mode; a local backend is shared, a malformed one counts as snapshot."""
    if capabilities.isolation == "local":
        return "shared"
    mode = capabilities.workspace_mode
    return mode if mode in WORKSPACE_MODES else "snapshot"


def _declared_planes(capabilities: Capabilities) -> tuple[str, ...]:
    planes = capabilities.planes
    return tuple(planes) if isinstance(planes, Sequence) else ()


def claimed_guarantees(capabilities: Capabilities, network: str) -> tuple[str, ...]:
    """The guarantees a report may show, in canonical order.

    Declared planes, keeping ``host-filesystem-isolation`` only for a remote
    snapshot workspace, ``workspace-confinement`` only for a remote backend, and
    ``network-deny`` only when the policy denies the network.
    """
    declared = _declared_planes(capabilities)
    remote = capabilities.isolation == "remote"
    snapshot = remote and _declared_mode(capabilities) == "snapshot"
    return tuple(
        plane
        for plane in GUARANTEES
        if plane in declared
        and (plane != HOST_FILESYSTEM_ISOLATION or snapshot)
        and (plane != WORKSPACE_CONFINEMENT or remote)
        and (plane != "network-deny" or network == "deny")
    )


# The host is placed in a shell command, so only these characters may reach it.
_PROBE_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:-]{0,252}")


def network_probe_problem(probe: object) -> str | None:
    """Why a declared network probe is malformed, or ``None`` when it is usable."""
    if not isinstance(probe, NetworkProbe):
        return "the network probe is not an object"
    if not isinstance(probe.host, str) or not _PROBE_HOST.fullmatch(probe.host):
        return (
            "the network probe host must be a hostname or an IP address without brackets or a port"
        )
    port = probe.port
    integral = isinstance(port, int) or (isinstance(port, float) and port.is_integer())
    if isinstance(port, bool) or not integral or not 1 <= port <= 65535:
        return "the network probe port must be an integer from 1 to 65535"
    return None


def declared_network_probe(capabilities: Capabilities) -> NetworkProbe | None:
    """The usable network probe of a remote backend, else ``None`` (local, absent, malformed)."""
    probe = capabilities.network_probe
    if capabilities.isolation != "remote" or probe is None or network_probe_problem(probe):
        return None
    return NetworkProbe(host=probe.host, port=int(probe.port))


def capability_mismatch(capabilities: Capabilities, network: str) -> str | None:
    """Why ``capabilities`` cannot enforce a policy with this network mode, or ``None``.

    >>> k8s = Capabilities("remote", ["host-filesystem-isolation", "environment-filter"],
    ...                    ["allow"], False)
    >>> capability_mismatch(k8s, "deny")
    'it does not provide network-deny'
    """
    isolation = capabilities.isolation
    if isolation not in ("local", "remote"):
        return "it declares no isolation kind"
    mode = capabilities.workspace_mode
    if isolation == "remote" and mode not in WORKSPACE_MODES:
        return (
            "it declares a malformed workspace:"
            " the workspace mode is not snapshot, synchronized, or shared"
        )
    if isolation == "remote" and capabilities.network_probe is not None:
        problem = network_probe_problem(capabilities.network_probe)
        if problem:
            return f"it declares a malformed network probe: {problem}"
    mode = _declared_mode(capabilities)
    remote_files = isolation == "remote" and mode != "snapshot"
    if remote_files and HOST_FILESYSTEM_ISOLATION in _declared_planes(capabilities):
        return (
            f"it claims {HOST_FILESYSTEM_ISOLATION} although its workspace is {mode},"
            " which reaches this host's files"
        )
    claimed = claimed_guarantees(capabilities, network)
    missing = [plane for plane in required_planes(network, isolation, mode) if plane not in claimed]
    modes = capabilities.network if isinstance(capabilities.network, Sequence) else ()
    if network == "deny" and "deny" not in modes and "network-deny" not in missing:
        missing.append("network-deny")
    if missing:
        return f"it does not provide {', '.join(missing)}"
    return None


# ---------------------------------------------------------------- the doctor line
