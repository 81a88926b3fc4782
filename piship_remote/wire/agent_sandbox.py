"""The agent-sandbox custom resources as the API server names them: SandboxClaim and Sandbox.

One :class:`Resource` per kind, shared by the Kubernetes backend and the fake cluster::

    >>> CLAIMS.api_version, CLAIMS.qualified
    ('extensions.agents.x-k8s.io/v1beta1', 'sandboxclaims.extensions.agents.x-k8s.io')
    >>> SANDBOXES.collection("agents")
    '/apis/agents.x-k8s.io/v1beta1/namespaces/agents/sandboxes'
"""

from __future__ import annotations

import attrs

__all__ = ["CLAIMS", "SANDBOXES", "Resource"]


@attrs.frozen
class Resource:
    """A namespaced custom resource: its plural, API group and Kind."""

    plural: str
    group: str
    kind: str
    version: str = "v1beta1"

    @property
    def qualified(self) -> str:
        """``<plural>.<group>``, as API-server messages name it."""
        return f"{self.plural}.{self.group}"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    def collection(self, namespace: str) -> str:
        """The path of the resource's collection in ``namespace``."""
        return f"/apis/{self.api_version}/namespaces/{namespace}/{self.plural}"


CLAIMS = Resource("sandboxclaims", "extensions.agents.x-k8s.io", "SandboxClaim")
SANDBOXES = Resource("sandboxes", "agents.x-k8s.io", "Sandbox")
