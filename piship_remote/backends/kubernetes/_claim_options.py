"""What a SandboxClaim may ask of its sandbox beyond the warm pool: env, pod metadata,
volumes, and how long a finished claim is kept.

The values go into each claim's ``spec`` as agent-sandbox names them::

    options = ClaimOptions(env={"MODE": "ci"}, pod_labels={"team": "a"},
                           ttl_seconds_after_finished=60)
    spec = options.screened(profile, redactor).spec_fields()
    # {"env": [{"name": "MODE", "value": "ci"}], "additionalPodMetadata": {...},
    #  "lifecycle": {"ttlSecondsAfterFinished": 60}}

``env`` passes the environment filter like a command's variables: only names the
policy's ``environment.allow`` lists, never a credential-looking name or value.
The controller starts a claim with ``env`` or ``volumeClaimTemplates`` cold, from
the pool's template, instead of taking a warm pod.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from piship_remote.model.environment import screen_environment
from piship_remote.model.policy import SandboxProfile
from piship_remote.model.redact import Redactor

__all__ = ["ClaimOptions"]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\Z")


def _strings(value: Mapping[str, str] | None) -> dict[str, str]:
    mapping = dict(value or {})
    for key, item in mapping.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise ValueError("claim env, pod labels and pod annotations map text to text")
    return mapping


def _templates(value: Sequence[Mapping[str, Any]] | None) -> tuple[dict[str, Any], ...]:
    templates = tuple(dict(item) for item in (value or ()))
    for template in templates:
        name = template.get("metadata", {}).get("name") if isinstance(template, dict) else None
        if not isinstance(name, str) or not name:
            raise ValueError("each volume claim template needs metadata.name")
    return templates


def _ttl(value: int | None) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError("ttl_seconds_after_finished must be a whole number of seconds, >= 0")
    return value


@attrs.frozen
class ClaimOptions:
    """The claim's own options; empty ones add nothing to the manifest."""

    env: dict[str, str] = attrs.field(factory=dict, converter=_strings)
    pod_labels: dict[str, str] = attrs.field(factory=dict, converter=_strings)
    pod_annotations: dict[str, str] = attrs.field(factory=dict, converter=_strings)
    volume_claim_templates: tuple[dict[str, Any], ...] = attrs.field(
        default=(), converter=_templates
    )
    ttl_seconds_after_finished: int | None = attrs.field(default=None, converter=_ttl)

    def screened(self, profile: SandboxProfile | None, secrets: Redactor) -> ClaimOptions:
        """These options with ``env`` through the policy's environment filter
        (no profile: nothing passes)."""
        allow = profile.environment_allow if profile is not None else ()
        env = screen_environment(allow, self.env, secrets=secrets).env
        return attrs.evolve(self, env={k: v for k, v in env.items() if _ENV_NAME.match(k)})

    def spec_fields(self) -> dict[str, Any]:
        """The claim ``spec`` fields these options set (``lifecycle`` to merge in)."""
        spec: dict[str, Any] = {}
        if self.env:
            spec["env"] = [{"name": name, "value": value} for name, value in self.env.items()]
        metadata: dict[str, Any] = {}
        if self.pod_labels:
            metadata["labels"] = dict(self.pod_labels)
        if self.pod_annotations:
            metadata["annotations"] = dict(self.pod_annotations)
        if metadata:
            spec["additionalPodMetadata"] = metadata
        if self.volume_claim_templates:
            spec["volumeClaimTemplates"] = [dict(t) for t in self.volume_claim_templates]
        if self.ttl_seconds_after_finished is not None:
            spec["lifecycle"] = {"ttlSecondsAfterFinished": self.ttl_seconds_after_finished}
        return spec

    def apply(self, spec: dict[str, Any]) -> None:
        """Add these options to a claim ``spec`` (its ``lifecycle`` merged, not replaced)."""
        for key, value in self.spec_fields().items():
            if key == "lifecycle":
                spec.setdefault("lifecycle", {}).update(value)
            else:
                spec[key] = value
