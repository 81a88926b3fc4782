"""The claim calls of one Kubernetes sandbox that may start from, or end as, a kept claim.

A :class:`ClaimManager` creates its first claim with ``create``; for an attached
sandbox that first ``create`` adopts the existing claim instead. A detached
sandbox's manager is disposed with its current claim *kept*: every claim is
deleted as usual except that one::

    claims = KeptClaims(api, adopt="piship-0a1b2c3d4e5f")
    manager = ClaimManager(claims, clock, keepalive_every=900)
    manager.prepare()             # adopts the claim (it must carry our label)
    claims.keep(manager.epoch())  # then manager.dispose() leaves it alone
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from piship_remote.backends.kubernetes._claims_api import ClaimsApi
from piship_remote.backends.kubernetes.claims import Claim
from piship_remote.backends.lifetime import Anchor
from piship_remote.transport._cancel import CancelToken

__all__ = ["KeptClaims"]


class KeptClaims:
    """A :class:`~piship_remote.backends.kubernetes.claims.ClaimApi` that adopts, then keeps."""

    def __init__(
        self,
        api: ClaimsApi,
        *,
        adopt: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        self._api = api
        self._labels = dict(labels or {})
        self._lock = threading.Lock()
        self._adopt = adopt
        self._kept: str | None = None

    def keep(self, name: str | None) -> None:
        """Never delete the claim ``name`` (the sandbox is detached, not disposed)."""
        with self._lock:
            self._kept = name

    def create(self, anchor: Anchor, cancel: CancelToken) -> Claim:
        with self._lock:
            adopt, self._adopt = self._adopt, None
        if adopt is not None:
            return self._api.adopt(adopt, anchor, cancel)
        return self._api.create(anchor, cancel, labels=self._labels)

    def renew(self, claim: Claim, shutdown: int, cancel: CancelToken) -> None:
        self._api.renew(claim, shutdown, cancel)

    def check(self, claim: Claim, cancel: CancelToken) -> None:
        self._api.check(claim, cancel)

    def delete(self, claim: Claim) -> None:
        with self._lock:
            if claim.name == self._kept:
                return
        self._api.delete(claim)
