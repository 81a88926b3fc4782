"""The SandboxClaim API of one namespace: create and wait until ready, renew, check, delete.

A claim takes a sandbox from a warm pool, with a bounded
``lifecycle.shutdownTime`` and ``shutdownPolicy: Delete``; this is the
:class:`~piship_remote.backends.kubernetes.claims.ClaimApi` the claim manager drives::

    api = ClaimsApi(http, endpoint=..., namespace="agents", template="python-pool",
                    poll_interval=1.0, ready_timeout=120.0, monotonic=time.monotonic,
                    sight=window.now)
    claim = api.create(clock.anchor(), cancel)      # polls until Ready; claim.seen: when
                                                    # the poll that saw it Ready was sent
    api.renew(claim, shutdown, cancel)              # merge-patch the shutdownTime
    api.delete(claim)                               # best effort

A claim being deleted, or Ready=False for a reason after which it never becomes
ready, is :class:`~piship_remote.backends.kubernetes.claims.ClaimGone`.

What the answers say is read leniently (a cluster may lag the schema)::

    ready = ready_condition(claim)            # the Ready condition, or {}
    name = sandbox_name(claim, fallback)      # status.sandbox.name, else the claim's
    facts = sandbox_facts(sandbox)            # pod IP, UID, serviceFQDN, nodeName, pod,
                                              # the sandboxd addresses its template announces

What a claim may ask of its sandbox beyond the warm pool (env through the environment
filter, pod labels and annotations, volume claim templates, how long a finished claim
is kept) is a :class:`ClaimOptions`, put into each claim's ``spec``::

    spec = ClaimOptions(env={"MODE": "ci"}).screened(profile, redactor).spec_fields()
"""

from __future__ import annotations

import builtins
import copy
import ipaddress
import re
import secrets
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from piship_remote.backends._common import DETAIL_LIMIT, is_success
from piship_remote.backends._owned import CREATED_BY, CREATOR, OwnedSandbox, parse_timestamp
from piship_remote.backends.kubernetes._http import ClusterHttp, transient
from piship_remote.backends.kubernetes.claims import Claim, ClaimGone, Sighting
from piship_remote.backends.lifetime import MICROS, Anchor, rfc3339
from piship_remote.model.environment import screen_environment
from piship_remote.model.errors import (
    CONFIG_INVALID,
    GATEWAY_UNREACHABLE,
    CommandCancelled,
    PiShipError,
)
from piship_remote.model.policy import SandboxProfile
from piship_remote.model.redact import Redactor
from piship_remote.transport import HttpReply, TransportError
from piship_remote.transport._cancel import CancelToken
from piship_remote.wire.agent_sandbox import CLAIMS, SANDBOXES

__all__ = [
    "API_VERSION",
    "CREATED_BY_LABEL",
    "RESOURCE_NAME",
    "TERMINAL_REASONS",
    "ClaimOptions",
    "ClaimsApi",
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


API_VERSION = CLAIMS.api_version
_AVAILABLE_TIMEOUT = 10.0
_OWNED_SELECTOR = urllib.parse.quote(f"{CREATED_BY_LABEL}={CREATOR}", safe="")
_CREATE_ATTEMPTS = 3  # names taken (HTTP 409) before creation gives up


class ClaimsApi:
    """The ``sandboxclaims`` collection of one namespace, for one warm pool."""

    def __init__(
        self,
        http: ClusterHttp,
        *,
        endpoint: str,
        namespace: str,
        template: str,
        poll_interval: float,
        ready_timeout: float,
        monotonic: Callable[[], float],
        sight: Callable[[], Sighting | None] = lambda: None,
        options: ClaimOptions | None = None,
        foreground_deletion: bool = False,
    ) -> None:
        self._http = http
        self._delete_options = (
            {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"}
            if foreground_deletion
            else None
        )
        self._options = options if options is not None else ClaimOptions()
        self._sight = sight
        self._endpoint = endpoint
        self.claims = endpoint + CLAIMS.collection(namespace)
        self._sandboxes = endpoint + SANDBOXES.collection(namespace)
        self._template = template
        self._poll = poll_interval
        self._ready_timeout = ready_timeout
        self._monotonic = monotonic

    def with_options(self, options: ClaimOptions) -> ClaimsApi:
        """This API, creating its claims with ``options``."""
        clone = copy.copy(self)
        clone._options = options
        return clone

    def list(self) -> HttpReply:
        return self._http.call("GET", f"{self.claims}?limit=1", timeout=_AVAILABLE_TIMEOUT)

    def create(
        self, anchor: Anchor, cancel: CancelToken, *, labels: Mapping[str, str] | None = None
    ) -> Claim:
        """POST a claim (a fresh name after a 409), ``labels`` beside the library's own,
        and wait until it is ready."""
        for _ in range(_CREATE_ATTEMPTS):
            name = f"piship-{secrets.token_hex(6)}"
            response = self._post_claim(name, anchor, cancel, labels or {})
            if response is None:  # the answer was lost, but the claim exists and is ours
                return self._ready_claim(name, anchor, cancel)
            if response.status == 409:
                response.close()
                continue
            if not is_success(response.status):
                raise self._http.errors(
                    f"creating the SandboxClaim failed: {self._http.failure(response)}",
                    retryable=transient(response.status),
                )
            response.close()
            return self._ready_claim(name, anchor, cancel)
        raise self._http.errors(
            "creating the SandboxClaim failed: HTTP 409: the generated names were taken",
            retryable=True,
        )

    def renew(self, claim: Claim, shutdown: int, cancel: CancelToken) -> None:
        """Merge-patch the claim's shutdownTime forward."""
        body = {"spec": {"lifecycle": {"shutdownTime": rfc3339(shutdown)}}}
        with self._api(
            "renewing the SandboxClaim",
            "PATCH",
            self._claim_url(claim.name),
            cancel,
            json=body,
            headers={"Content-Type": "application/merge-patch+json"},
        ) as response:
            if response.status == 404:
                raise ClaimGone("the SandboxClaim no longer exists")
            if not is_success(response.status):
                raise self._http.errors(
                    f"renewing the SandboxClaim failed: {self._http.failure(response)}",
                    retryable=transient(response.status),
                )
            raise_if_finished(_lenient_json(response))

    def check(self, claim: Claim, cancel: CancelToken) -> None:
        """The claim still exists and has not failed or expired on the cluster."""
        with self._api(
            "checking the SandboxClaim", "GET", self._claim_url(claim.name), cancel
        ) as response:
            if response.status == 404:
                raise ClaimGone("the SandboxClaim no longer exists")
            if not is_success(response.status):
                raise self._http.errors(
                    f"checking the SandboxClaim failed: {self._http.failure(response)}",
                    retryable=transient(response.status),
                )
            raise_if_finished(_lenient_json(response))

    def delete(self, claim: Claim) -> None:
        self._delete_name(claim.name)

    def adopt(self, name: str, anchor: Anchor, cancel: CancelToken) -> Claim:
        """Take over the existing claim ``name``: only one labelled as this library's,
        not past its shutdownTime; its shutdownTime moves to ``anchor.expires``."""
        if not RESOURCE_NAME.match(name):
            raise self._http.errors(f"not a SandboxClaim name: {name!r}", code=CONFIG_INVALID)
        found = self._read(name, cancel)
        if found is None:
            raise self._http.errors(
                f"SandboxClaim {name} does not exist any more (deleted or expired); "
                "activate a new one"
            )
        if not ours(found):
            raise self._http.errors(
                f"SandboxClaim {name} was not created by piship_remote (it lacks the "
                f"{CREATED_BY_LABEL}={CREATOR} label), so it is not attached to",
                code=CONFIG_INVALID,
            )
        shutdown = parse_timestamp(
            mapping(mapping(found.get("spec")).get("lifecycle")).get("shutdownTime")
        )
        try:
            raise_if_finished(found)
            if shutdown is not None and shutdown * MICROS <= anchor.wall:
                raise ClaimGone("its shutdownTime has passed")
            self.renew(Claim(name, name, anchor), anchor.expires, cancel)
        except ClaimGone as gone:
            raise self._http.errors(f"SandboxClaim {name} cannot be attached to: {gone}") from None
        return self._claim(name, anchor, *self._wait_ready(name, cancel))

    def list_owned(self) -> builtins.list[OwnedSandbox]:
        """Every claim in the namespace labelled as created by this library."""
        url = f"{self.claims}?labelSelector={_OWNED_SELECTOR}"
        with self._api("listing the SandboxClaims", "GET", url, CancelToken()) as response:
            if not is_success(response.status):
                raise self._http.errors(
                    f"listing the SandboxClaims failed: {self._http.failure(response)}"
                )
            items = response.json_object().get("items")
        return [owned(item) for item in (items if isinstance(items, list) else ()) if ours(item)]

    def delete_owned(self, name: str) -> None:
        """Delete the claim ``name`` (best effort); nothing when the name is not a claim name."""
        if RESOURCE_NAME.match(name):
            self._delete_name(name)

    def _ready_claim(self, name: str, anchor: Anchor, cancel: CancelToken) -> Claim:
        try:
            return self._claim(name, anchor, *self._wait_ready(name, cancel))
        except BaseException:
            self._delete_name(name)
            raise

    @staticmethod
    def _claim(
        name: str,
        anchor: Anchor,
        sandbox: str,
        pod_ip: str | None,
        seen: Sighting | None,
        facts: SandboxFacts,
    ) -> Claim:
        """The ready claim: the pod IP the claim mirrors, else the Sandbox's."""
        return Claim(
            name,
            sandbox,
            anchor,
            pod_ip or facts.pod_ip,
            seen,
            facts.uid,
            facts.service_fqdn,
            facts.node_name,
            facts.pod_name,
            facts.sandboxd_grpc,
            facts.sandboxd_rest,
        )

    def _read(self, name: str, cancel: CancelToken) -> dict[str, Any] | None:
        """The claim ``name`` as the API has it; ``None`` when it does not exist."""
        with self._api(
            "reading the SandboxClaim", "GET", self._claim_url(name), cancel
        ) as response:
            if response.status == 404:
                return None
            if not is_success(response.status):
                raise self._http.errors(
                    f"reading the SandboxClaim failed: {self._http.failure(response)}",
                    retryable=transient(response.status),
                )
            try:
                return response.json_object()
            except ValueError as error:
                raise self._http.errors(f"reading the SandboxClaim failed: {error}") from None

    def _resolve_lost_create(self, name: str, error: TransportError, cancel: CancelToken) -> None:
        """The create was sent but its answer lost: read the claim by its (our) name.

        Ours: return, and the caller uses it. Absent: nothing was created. Unreadable:
        delete by name (best effort), so that nothing is left behind either way.
        """
        try:
            found = self._read(name, CancelToken() if cancel.is_set() else cancel)
        except (PiShipError, CommandCancelled):
            found = None
            self._delete_name(name)
        else:
            if found is not None and ours(found) and not cancel.is_set():
                return
            if found is not None:
                self._delete_name(name)
        raise self._http.errors(
            f"creating the SandboxClaim failed: {error}; no claim was left behind",
            retryable=True,
        )

    def _post_claim(
        self, name: str, anchor: Anchor, cancel: CancelToken, labels: Mapping[str, str]
    ) -> HttpReply | None:
        """The create's answer; ``None`` when it was lost but the claim turned out ours."""
        manifest: dict[str, Any] = {
            "apiVersion": API_VERSION,
            "kind": CLAIMS.kind,
            "metadata": {"name": name, "labels": {**labels, CREATED_BY_LABEL: CREATOR}},
            "spec": {
                "warmPoolRef": {"name": self._template},
                "lifecycle": {"shutdownTime": rfc3339(anchor.expires), "shutdownPolicy": "Delete"},
            },
        }
        self._options.apply(manifest["spec"])
        try:
            return self._http.call("POST", self.claims, cancel=cancel, json=manifest)
        except TransportError as error:
            if not error.request_sent:
                raise self._unreachable("creating the SandboxClaim", error) from None
            self._resolve_lost_create(name, error, cancel)
            return None
        except BaseException:
            self._delete_name(name)
            raise

    def _wait_ready(
        self, name: str, cancel: CancelToken
    ) -> tuple[str, str | None, Sighting | None, SandboxFacts]:
        """Poll the claim until Ready: its sandbox, the pod IP the claim mirrors, when
        the last poll was sent, and what the Sandbox itself says.

        The deadline is on the monotonic clock only.
        """
        deadline = self._monotonic() + self._ready_timeout
        last = ""
        while True:
            sent = self._sight()
            with self._api(
                "reading the SandboxClaim", "GET", self._claim_url(name), cancel
            ) as response:
                if not is_success(response.status):
                    raise self._http.errors(
                        f"reading the SandboxClaim failed: {self._http.failure(response)}",
                        retryable=transient(response.status),
                    )
                try:
                    claim = response.json_object()
                except ValueError as error:
                    raise self._http.errors(f"reading the SandboxClaim failed: {error}") from None
            ready = ready_condition(claim)
            if ready.get("status") == "True":
                sandbox = sandbox_name(claim, name)
                return sandbox, pod_ip(claim), sent, self._sandbox_facts(sandbox, cancel)
            reason = ready.get("reason")
            if isinstance(reason, str) and reason in TERMINAL_REASONS:
                raise self._http.errors(f"the SandboxClaim failed: {reason}")
            last = condition_text(ready) or last
            if self._monotonic() >= deadline:
                suffix = f" (last reported: {last})" if last else ""
                raise self._http.errors(f"the SandboxClaim did not become ready in time{suffix}")
            if cancel.wait(self._poll):
                raise CommandCancelled()

    def _sandbox_facts(self, sandbox: str, cancel: CancelToken) -> SandboxFacts:
        """The pod IP, UID, Service name and node from the Sandbox object (claims mirror
        the IP only on some clusters).

        Without the IP a router reaches the sandbox only by its Service, which warm-pool
        sandboxes lack; a failed read leaves that to the router.
        """
        try:
            response = self._http.call("GET", f"{self._sandboxes}/{sandbox}", cancel=cancel)
        except TransportError:
            return SandboxFacts()
        with response:
            if not is_success(response.status):
                return SandboxFacts()
            found = _lenient_json(response)
        return sandbox_facts(found)

    def _delete_name(self, name: str) -> None:
        """Best effort: a failure leaves the claim to its shutdownTime."""
        try:
            self._http.call("DELETE", self._claim_url(name), json=self._delete_options).close()
        except Exception:
            pass

    def _claim_url(self, name: str) -> str:
        return f"{self.claims}/{name}"

    def _api(
        self, action: str, method: str, url: str, cancel: CancelToken, **kwargs: Any
    ) -> HttpReply:
        """An API call whose transport failure reads ``<action> failed: …``."""
        try:
            return self._http.call(method, url, cancel=cancel, **kwargs)
        except TransportError as error:
            if not error.request_sent:
                raise self._unreachable(action, error) from None
            raise self._http.errors(f"{action} failed: {error}", retryable=True) from None

    def _unreachable(self, action: str, error: TransportError) -> PiShipError:
        """Nothing was sent (refused, unresolvable): safe to try again later."""
        return self._http.errors(
            f"{action} failed: the Kubernetes API at {self._endpoint} is unreachable: {error}",
            code=GATEWAY_UNREACHABLE,
            retryable=True,
            user_action=f"Check that the Kubernetes API at {self._endpoint} is running and "
            "reachable, then try again",
        )


def _lenient_json(response: HttpReply) -> dict[str, Any]:
    """The body as an object, or ``{}`` when it is not one (the claim only has to exist)."""
    try:
        return response.json_object()
    except (ValueError, TransportError):
        return {}
