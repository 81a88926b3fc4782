"""The SandboxClaim schema and request parsing of the fake API server.

What the CRD's OpenAPI schema and the API server's request decoding do before a
write reaches the store: ``generateName`` expansion, the required
``spec.warmPoolRef``, the ``shutdownPolicy: Retain`` default, JSON bodies (a missing
``Content-Type`` is JSON) and the one field selector custom resources support.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from piship_remote.testing.k8s_store import ApiError
from piship_remote.wire.agent_sandbox import CLAIMS

__all__ = ["defaulted_claim", "field_selector_name", "json_object"]

_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def field_selector_name(selector: str, namespace: str) -> str | None:
    """The name a ``metadata.name=`` selector asks for (400 for any other field)."""
    name: str | None = None
    for term in filter(None, (part.strip() for part in selector.split(","))):
        field, _, value = term.replace("==", "=").partition("=")
        if field == "metadata.name":
            name = value
        elif field == "metadata.namespace" and value == namespace:
            continue
        else:
            raise ApiError(400, "BadRequest", f"field label not supported: {field}")
    return name


def defaulted_claim(body: dict[str, Any]) -> dict[str, Any]:
    """The claim as the CRD's schema validates and defaults it."""
    metadata = dict(body.get("metadata") or {})
    if not metadata.get("name") and metadata.get("generateName"):
        suffix = "".join(secrets.choice(_NAME_ALPHABET) for _ in range(5))
        metadata["name"] = f"{metadata['generateName']}{suffix}"
    name = metadata.get("name", "")
    spec = dict(body.get("spec") or {})
    if not (spec.get("warmPoolRef") or {}).get("name"):
        raise ApiError(
            422,
            "Invalid",
            f'SandboxClaim.extensions.agents.x-k8s.io "{name}" is invalid: spec.warmPoolRef: '
            "Required value",
            {
                "name": name,
                "group": CLAIMS.group,
                "kind": CLAIMS.kind,
                "causes": [
                    {
                        "reason": "FieldValueRequired",
                        "message": "Required value",
                        "field": "spec.warmPoolRef",
                    }
                ],
            },
        )
    if isinstance(spec.get("lifecycle"), dict):
        spec["lifecycle"] = {"shutdownPolicy": "Retain", **spec["lifecycle"]}
    return {**body, "metadata": metadata, "spec": spec}


def json_object(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ApiError(400, "BadRequest", "the request body is not a JSON object")
    return value
