"""The values the claim manager hands out and the cluster calls it drives.

:mod:`piship_remote.backends.kubernetes.claims` re-exports every name here; import them from there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import attrs

from piship_remote.backends.kubernetes._claim_timing import Sighting
from piship_remote.backends.lifetime import Anchor
from piship_remote.transport._cancel import CancelToken

__all__ = ["Claim", "ClaimApi", "ClaimGone", "ClaimUse"]


class ClaimGone(Exception):
    """The claim cannot be used any more: expired locally, or the cluster lost it."""


@attrs.frozen
class Claim:
    """A ready SandboxClaim: its name, the router's id for its sandbox, and its clock anchor.

    ``seen``: when the request that found it ready was sent (``None``: unknown, the
    manager then counts from the start of its creation).
    """

    name: str
    sandbox: str
    anchor: Anchor
    pod_ip: str | None = None
    seen: Sighting | None = attrs.field(default=None, eq=False)
    uid: str | None = None
    """The Sandbox's UID, when it was read (the router's ``X-Sandbox-UID``)."""
    service_fqdn: str | None = None
    """The Sandbox's Service name (``status.serviceFQDN``; only sandboxes with a Service)."""
    node_name: str | None = None
    """The node its pod runs on (``status.nodeName``)."""
    pod_name: str | None = None
    """Its pod (the ``agents.x-k8s.io/pod-name`` annotation, else the Sandbox's name)."""
    sandboxd_grpc: str | None = None
    """Where its pod's sandboxd serves gRPC (``SANDBOXD_GRPC_ADDR``), when it runs one."""
    sandboxd_rest: str | None = None
    """Where its pod's sandboxd serves REST (``SANDBOXD_REST_ADDR``)."""


class ClaimApi(Protocol):
    """The cluster calls the manager needs (:mod:`piship_remote.backends.kubernetes.backend`)."""

    def create(self, anchor: Anchor, cancel: CancelToken) -> Claim:
        """Create a claim whose shutdownTime is ``anchor.expires`` and wait until it is ready.

        On any failure it deletes what it created before raising.
        """
        ...

    def renew(self, claim: Claim, shutdown: int, cancel: CancelToken) -> None:
        """Move the claim's shutdownTime to ``shutdown`` (µs); :class:`ClaimGone` on 404."""
        ...

    def check(self, claim: Claim, cancel: CancelToken) -> None:
        """Confirm the claim still exists and has not failed; :class:`ClaimGone` otherwise."""
        ...

    def delete(self, claim: Claim) -> None:
        """Delete the claim (errors are ignored by the manager)."""
        ...


@attrs.frozen
class ClaimUse:
    """The claim one command runs in; :meth:`retire` it when the sandbox is in doubt.

    ``cancel`` fires when the command is cancelled or the manager disposed.
    """

    claim: Claim
    cancel: CancelToken
    _retire: Callable[[bool], None]
    _exists: Callable[[], bool | None] = lambda: None

    def retire(self, *, gone: bool = False) -> None:
        """No later command uses this claim; it is deleted once no command runs in it.

        ``gone=True``: the cluster or router no longer has it, so stop renewing it too.
        """
        self._retire(gone)

    def exists(self) -> bool | None:
        """Ask the API once: ``False`` when the claim is gone (it is then retired as gone),
        ``True`` when the API still has it, ``None`` when the API could not say or the
        command was cancelled meanwhile."""
        return self._exists()
