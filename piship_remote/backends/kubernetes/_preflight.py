"""What the credentials may do, asked before any claim exists: RBAC, the warm pool, the router.

Each check is one line a user can act on (``doctor --backend kubernetes`` prints them)::

    for check in Preflight(api, router, endpoint=..., router_url=..., namespace="agents",
                           template="python-pool").run():
        print(check.line)   # "ok: may create sandboxclaims in namespace agents"

- a ``SelfSubjectAccessReview`` for each verb the backend uses on claims (and, reaching
  the router by port-forward, for reading its Service and Endpoints and creating
  ``pods/portforward`` in its namespace);
- the ``SandboxWarmPool``: it exists, and has ready sandboxes (else a claim waits for
  a cold start);
- the router: a request without routing headers, which the router answers 400 once
  it accepted the token (401 or 403 when it did not).
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from piship_remote.backends._common import is_success
from piship_remote.backends.kubernetes._http import ROUTER_TOKEN_ACTION, ClusterHttp
from piship_remote.backends.kubernetes._port_forward import RouterTunnel
from piship_remote.model.errors import PiShipError
from piship_remote.transport import HttpReply, TransportError

__all__ = ["CLAIM_VERBS", "Check", "Preflight"]

CLAIM_VERBS = ("create", "get", "patch", "watch", "delete")
_GROUP = "extensions.agents.x-k8s.io"
_REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
_TIMEOUT = 10.0


@attrs.frozen
class Check:
    """One finding: ``ok``, ``warn`` (works, but not as it should) or ``fail``, and the fix."""

    status: Literal["ok", "warn", "fail"]
    what: str
    fix: str | None = None

    @property
    def line(self) -> str:
        text = f"{self.status}: {self.what}"
        return f"{text} (fix: {self.fix})" if self.fix else text

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "check": self.what, "fix": self.fix}


class Preflight:
    """The checks for one backend's namespace, warm pool and router."""

    def __init__(
        self,
        api: ClusterHttp,
        router: ClusterHttp,
        *,
        endpoint: str,
        router_url: str,
        namespace: str,
        template: str,
        tunnel: RouterTunnel | None = None,
    ) -> None:
        self._api, self._router = api, router
        self._tunnel = tunnel
        self._endpoint, self._router_url = endpoint, router_url
        self._namespace, self._template = namespace, template

    def run(self) -> list[Check]:
        """Every check, in order; none creates anything but access reviews."""
        checks = [self._may(verb) for verb in CLAIM_VERBS]
        if self._tunnel is not None:
            checks += self._may_port_forward(self._tunnel.forward.namespace)
        return [*checks, self._warm_pool(), self._router_answer()]

    def _may_port_forward(self, namespace: str) -> list[Check]:
        """What ``kubectl port-forward svc/…`` needs in the router's namespace."""
        fix = (
            f"grant it, e.g. kubectl create role piship-router-tunnel -n {namespace} "
            "--verb=get --resource=services,endpoints and a role with --verb=create "
            "--resource=pods/portforward, then bind them with kubectl create rolebinding"
        )
        return [
            self._may("get", "services", "", namespace, fix=fix),
            self._may("get", "endpoints", "", namespace, fix=fix),
            self._may("create", "pods/portforward", "", namespace, fix=fix),
        ]

    def _may(
        self,
        verb: str,
        resource: str = "sandboxclaims",
        group: str = _GROUP,
        namespace: str | None = None,
        *,
        fix: str | None = None,
    ) -> Check:
        namespace = namespace or self._namespace
        what = f"{verb} {resource} in namespace {namespace}"
        plural, _, subresource = resource.partition("/")
        attributes = {"namespace": namespace, "verb": verb, "group": group, "resource": plural}
        if subresource:
            attributes["subresource"] = subresource
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        }
        try:
            reply = self._api.call(
                "POST", f"{self._endpoint}{_REVIEWS}", json=review, timeout=_TIMEOUT
            )
        except (TransportError, PiShipError) as error:
            return Check("fail", f"cannot ask whether it may {what}: {error}", _api_fix())
        with reply:
            if not is_success(reply.status):
                return Check(
                    "fail",
                    f"cannot ask whether it may {what}: {self._api.failure(reply)}",
                    _api_fix(),
                )
            body = _json(reply)
        if _mapping(body.get("status")).get("allowed") is True:
            return Check("ok", f"may {what}")
        return Check(
            "fail",
            f"may not {what}",
            fix
            or f"grant it, e.g. kubectl create role piship-claims -n {self._namespace} "
            f"--verb={','.join(CLAIM_VERBS)} --resource=sandboxclaims.{_GROUP}, then bind it "
            "to this user or service account with kubectl create rolebinding",
        )

    def _warm_pool(self) -> Check:
        url = (
            f"{self._endpoint}/apis/{_GROUP}/v1beta1/namespaces/{self._namespace}"
            f"/sandboxwarmpools/{self._template}"
        )
        pool = f"warm pool {self._template} in namespace {self._namespace}"
        try:
            reply = self._api.call("GET", url, timeout=_TIMEOUT)
        except (TransportError, PiShipError) as error:
            return Check("fail", f"cannot read the {pool}: {error}", _api_fix())
        with reply:
            if reply.status == 404:
                return Check(
                    "fail",
                    f"the {pool} does not exist",
                    "create the SandboxWarmPool, or name an existing one (--pool; "
                    f"kubectl get sandboxwarmpools -n {self._namespace})",
                )
            if not is_success(reply.status):
                return Check(
                    "warn",
                    f"cannot read the {pool}: {self._api.failure(reply)}",
                    "grant get on sandboxwarmpools to see it here; claims may still work",
                )
            body = _json(reply)
        ready = _mapping(body.get("status")).get("readyReplicas") or 0
        if isinstance(ready, int) and ready > 0:
            return Check("ok", f"the {pool} has {ready} ready sandbox(es)")
        return Check(
            "warn",
            f"the {pool} has no ready sandbox: a claim waits for one to start",
            f"check the pool's pods: kubectl get pods -n {self._namespace}",
        )

    def _router_answer(self) -> Check:
        if self._tunnel is None:
            return self._router_reply()
        try:
            self._tunnel.hold(self)
        except PiShipError as error:
            return Check(
                "fail",
                f"the sandbox router cannot be port-forwarded: {error}",
                "check the router's Service and namespace (--router-service, "
                "--router-namespace) and that the credential may get services and endpoints "
                "and create pods/portforward there",
            )
        try:
            return self._router_reply()
        finally:
            self._tunnel.release(self)

    def _router_reply(self) -> Check:
        url = f"{self._router_url}/"
        try:
            reply = self._router.call("GET", url, timeout=_TIMEOUT)
        except (TransportError, PiShipError) as error:
            return Check(
                "fail",
                f"the sandbox router at {self._router_url} does not answer: {error}",
                "check the router URL (--router), or port-forward its service: kubectl "
                "port-forward svc/sandbox-router-svc 8080:8080",
            )
        with reply:
            status = reply.status
            if status in (401, 403):
                return Check(
                    "fail",
                    f"the sandbox router refused the token: {self._router.failure(reply)}",
                    ROUTER_TOKEN_ACTION,
                )
            if status == 400 or is_success(status):
                return Check("ok", f"the sandbox router at {self._router_url} accepts the token")
            return Check(
                "warn",
                f"the sandbox router answered {self._router.failure(reply)}",
                "check that the router URL points at the agent-sandbox router",
            )


def _api_fix() -> str:
    return "check the API server's address and the credential (kubectl auth can-i --list)"


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _json(reply: HttpReply) -> dict[str, Any]:
    try:
        value = reply.json_object()
    except (ValueError, TransportError):
        return {}
    return value if isinstance(value, dict) else {}
