"""What a SandboxClaim's and a Sandbox's JSON say: readiness, the bound sandbox, its address.

Pure readers of the objects the API server answers, lenient about missing or
mistyped fields (a cluster may lag the schema)::

    ready = ready_condition(claim)            # the Ready condition, or {}
    name = sandbox_name(claim, fallback)      # status.sandbox.name, else the claim's
    facts = sandbox_facts(sandbox)            # pod IP, UID, serviceFQDN, nodeName, pod,
                                              # the sandboxd addresses its template announces
    raise_if_finished(claim)                  # ClaimGone: being deleted, or failed for good
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Any

import attrs

from piship_remote.backends._common import DETAIL_LIMIT
from piship_remote.backends._owned import CREATED_BY, CREATOR, OwnedSandbox, parse_timestamp
from piship_remote.backends.kubernetes.claims import ClaimGone

__all__ = [
    "CREATED_BY_LABEL",
    "RESOURCE_NAME",
    "TERMINAL_REASONS",
    "SandboxFacts",
    "condition_text",
    "mapping",
    "ours",
    "owned",
    "pod_ip",
    "raise_if_finished",
    "ready_condition",
    "sandbox_facts",
    "sandbox_name",
]

RESOURCE_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
# Every claim this backend creates carries it; attach and sweep touch no other claim.
CREATED_BY_LABEL = f"agents.x-k8s.io/{CREATED_BY}"
# Ready=False reasons after which a claim never becomes ready (the official SDK's list).
TERMINAL_REASONS = frozenset(
    {
        "InvalidMetadata",
        "EnvVarsInjectionRejected",
        "VolumeClaimTemplatesError",
        "ClaimExpired",
        "SandboxExpired",
        "InvalidConfiguration",
        "PodFailed",
        "PodSucceeded",
    }
)


@attrs.frozen
class SandboxFacts:
    """What a Sandbox's own object says about it (each ``None`` when not said)."""

    pod_ip: str | None = None
    uid: str | None = None
    service_fqdn: str | None = None
    node_name: str | None = None
    pod_name: str | None = None
    sandboxd_grpc: str | None = None
    """``SANDBOXD_GRPC_ADDR`` on a container of its pod template: it runs sandboxd."""
    sandboxd_rest: str | None = None
    """``SANDBOXD_REST_ADDR`` beside it."""


_POD_NAME = "agents.x-k8s.io/pod-name"


def sandbox_facts(sandbox: Mapping[str, Any]) -> SandboxFacts:
    """What the Sandbox object ``sandbox`` says (its pod IP: IPv4 preferred; its pod: the
    ``agents.x-k8s.io/pod-name`` annotation, else the Sandbox's own name)."""
    status = mapping(sandbox.get("status"))
    metadata = mapping(sandbox.get("metadata"))
    env = _template_env(sandbox)
    return SandboxFacts(
        _best_ip(status.get("podIPs")),
        _text(metadata.get("uid")),
        _text(status.get("serviceFQDN")),
        _text(status.get("nodeName")),
        _text(mapping(metadata.get("annotations")).get(_POD_NAME)) or _text(metadata.get("name")),
        env.get("SANDBOXD_GRPC_ADDR"),
        env.get("SANDBOXD_REST_ADDR"),
    )


def _template_env(sandbox: Mapping[str, Any]) -> dict[str, str]:
    """The plain ``env`` values of every container of the Sandbox's pod template."""
    spec = mapping(mapping(mapping(sandbox.get("spec")).get("podTemplate")).get("spec"))
    containers = spec.get("containers")
    found: dict[str, str] = {}
    for container in containers if isinstance(containers, list) else []:
        variables = mapping(container).get("env")
        for variable in variables if isinstance(variables, list) else []:
            name, value = mapping(variable).get("name"), mapping(variable).get("value")
            if isinstance(name, str) and isinstance(value, str) and value:
                found.setdefault(name, value)
    return found


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def ours(claim: Mapping[str, Any]) -> bool:
    labels = mapping(mapping(claim.get("metadata")).get("labels"))
    return labels.get(CREATED_BY_LABEL) == CREATOR


def owned(claim: Mapping[str, Any]) -> OwnedSandbox:
    metadata = mapping(claim.get("metadata"))
    lifecycle = mapping(mapping(claim.get("spec")).get("lifecycle"))
    return OwnedSandbox(
        id=str(metadata.get("name", "")),
        created=parse_timestamp(metadata.get("creationTimestamp")) or 0.0,
        backend="kubernetes-agent-sandbox",
        expires=parse_timestamp(lifecycle.get("shutdownTime")),
        labels={str(k): str(v) for k, v in mapping(metadata.get("labels")).items()},
    )


def mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def ready_condition(claim: Mapping[str, Any]) -> dict[str, Any]:
    conditions = mapping(claim.get("status")).get("conditions")
    for condition in conditions if isinstance(conditions, list) else ():
        if isinstance(condition, dict) and condition.get("type") == "Ready":
            return condition
    return {}


def condition_text(condition: Mapping[str, Any]) -> str:
    parts = [condition.get("reason"), condition.get("message")]
    return ": ".join(p for p in parts if isinstance(p, str) and p)[:DETAIL_LIMIT]


def raise_if_finished(claim: Mapping[str, Any]) -> None:
    """A claim being deleted, or Ready=False for good (e.g. ``ClaimExpired``), is gone."""
    if mapping(claim.get("metadata")).get("deletionTimestamp"):
        raise ClaimGone("the SandboxClaim is being deleted")
    ready = ready_condition(claim)
    reason = ready.get("reason")
    if ready.get("status") == "False" and isinstance(reason, str) and reason in TERMINAL_REASONS:
        raise ClaimGone(f"the SandboxClaim failed: {reason}")


def sandbox_name(claim: Mapping[str, Any], fallback: str) -> str:
    """``status.sandbox.name`` (a warm-pool sandbox keeps the pool's name), else the claim's."""
    sandbox = mapping(mapping(claim.get("status")).get("sandbox"))
    annotations = mapping(mapping(claim.get("metadata")).get("annotations"))
    for value in (
        sandbox.get("name"),
        sandbox.get("Name"),
        annotations.get("agents.x-k8s.io/sandbox-name"),
    ):
        if isinstance(value, str) and RESOURCE_NAME.match(value):
            return value
    return fallback


def pod_ip(claim: Mapping[str, Any]) -> str | None:
    """The sandbox pod's address for ``X-Sandbox-Pod-IP`` (IPv4 preferred), if reported."""
    return _best_ip(mapping(mapping(claim.get("status")).get("sandbox")).get("podIPs"))


def _best_ip(ips: object) -> str | None:
    """The first IPv4 address of a ``podIPs`` list (IPv4-mapped IPv6 unwrapped), else IPv6."""
    addresses: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    for item in ips if isinstance(ips, list) else ():
        given = item.get("ip") if isinstance(item, dict) else item
        if not isinstance(given, str):
            continue
        try:
            address = ipaddress.ip_address(given.strip())
        except ValueError:
            continue
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        addresses.append(address)
    addresses.sort(key=lambda address: address.version)
    return str(addresses[0]) if addresses else None
