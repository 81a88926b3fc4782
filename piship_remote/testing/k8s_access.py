"""Who may do what on the fake cluster: bearer tokens, access reviews, the warm pool's state.

The API server and the router check different tokens when the cluster has a
``router_token`` (the router's ``ROUTER_AUTH_TOKEN``); without one both check
``token``. A ``scoped_router`` refuses the routing headers a scoped token cannot
vouch for (``X-Sandbox-Pod-IP``, ``X-Sandbox-UID``)::

    refusal = refused(request.headers, cluster, router=True)   # None: let it through
    review = access_review(body, cluster)                      # SelfSubjectAccessReview
    pool = warm_pool("agents", "python-pool", cluster)         # SandboxWarmPool or None
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

__all__ = ["AccessSettings", "access_review", "refused", "warm_pool"]

_POOL_API = "extensions.agents.x-k8s.io/v1beta1"
_REVIEW_API = "authorization.k8s.io/v1"


class AccessSettings(Protocol):
    """The :class:`~piship_remote.testing.kubernetes_server.Cluster` knobs read here."""

    token: str | None
    router_token: str | None
    scoped_router: bool
    denied: set[str]
    warm_pools: set[str] | None
    pool_ready_replicas: int
    client_subject: str | None


def refused(
    headers: Mapping[str, str],
    cluster: AccessSettings,
    *,
    router: bool,
    subject: str | None = None,
) -> tuple[int, dict[str, Any]] | None:
    """The status and body refusing a request, or ``None`` when it may pass.

    ``headers`` have lower-case names; ``subject`` is the common name of the client
    certificate the connection presented.
    """
    authorization = headers.get("authorization")
    if not router and cluster.client_subject is not None:
        if subject == cluster.client_subject:
            return None
        if cluster.token is None or authorization != f"Bearer {cluster.token}":
            return 401, {"message": f"Unauthorized: {subject or 'no client certificate'}"}
    elif router and cluster.router_token is not None:
        # The real router's answers to a missing and a wrong token.
        if not authorization or not authorization.startswith("Bearer "):
            return 401, {"detail": "Missing or invalid Authorization header."}
        if authorization != f"Bearer {cluster.router_token}":
            return 401, {"detail": "Invalid token."}
    elif cluster.token is not None and authorization != f"Bearer {cluster.token}":
        return 401, {"message": f"Unauthorized: {authorization or 'no token'}"}
    if router and cluster.scoped_router:
        for name in ("X-Sandbox-Pod-IP", "X-Sandbox-UID"):
            if headers.get(name.lower()) is not None:
                return 403, {"detail": f"{name} is not allowed with a scoped token"}
    return None


def access_review(body: Mapping[str, Any], cluster: AccessSettings) -> dict[str, Any]:
    """The answered ``SelfSubjectAccessReview``: allowed unless ``cluster.denied`` names
    ``"<verb> <resource>[/<subresource>]"`` (e.g. ``"delete sandboxclaims"``,
    ``"create pods/portforward"``)."""
    spec = body.get("spec") if isinstance(body.get("spec"), dict) else {}
    attributes = spec.get("resourceAttributes") if isinstance(spec, dict) else None
    attributes = attributes if isinstance(attributes, dict) else {}
    key = f"{attributes.get('verb', '')} {attributes.get('resource', '')}"
    if attributes.get("subresource"):
        key += f"/{attributes['subresource']}"
    allowed = key not in cluster.denied
    status: dict[str, Any] = {"allowed": allowed}
    if not allowed:
        status["reason"] = "no RBAC policy matched"
    return {
        "apiVersion": _REVIEW_API,
        "kind": "SelfSubjectAccessReview",
        "metadata": {"creationTimestamp": None},
        "spec": spec,
        "status": status,
    }


def warm_pool(namespace: str, name: str, cluster: AccessSettings) -> dict[str, Any] | None:
    """The ``SandboxWarmPool`` ``name`` (one replica, ``pool_ready_replicas`` of it
    ready), or ``None`` when ``cluster.warm_pools`` does not hold it."""
    if cluster.warm_pools is not None and name not in cluster.warm_pools:
        return None
    return {
        "apiVersion": _POOL_API,
        "kind": "SandboxWarmPool",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": 1, "sandboxTemplateRef": {"name": name}},
        "status": {"replicas": 1, "readyReplicas": cluster.pool_ready_replicas},
    }
