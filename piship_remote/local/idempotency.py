"""Creates that carry an ``Idempotency-Key``: one key, one sandbox.

The first create with a key makes the sandbox; a later one with the same key
(while that sandbox lives) answers the same sandbox instead of a second one, and
one with the same key but another body is refused (422), so a retried request
never doubles a sandbox and a reused key never hides a different one. Keyed
creates run one at a time; a key is forgotten when its sandbox ends::

    keys = IdempotencyKeys()
    with keys.held(key, body) as claim:
        if claim.refused: ...           # the key was used for another request
        elif claim.sandbox_id: ...      # answer that sandbox
        else: claim.record(new_sandbox)
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Iterator

import attrs

from piship_remote.local.sandbox.registry import Sandbox

__all__ = ["Claim", "IdempotencyKeys"]


@attrs.define
class Claim:
    """What an earlier create with the key made, while the key is held."""

    key: str
    digest: str
    sandbox_id: str | None
    refused: bool
    _keys: IdempotencyKeys

    def record(self, sandbox: Sandbox) -> None:
        """Remember ``sandbox`` as this key's until it ends."""
        self._keys._remember(self.key, self.digest, sandbox)


class IdempotencyKeys:
    """The keys of the live sandboxes that were created with one."""

    def __init__(self) -> None:
        self._hold = threading.Lock()  # one keyed create at a time
        self._lock = threading.Lock()
        self._made: dict[str, tuple[str, str]] = {}  # key -> (body digest, sandbox id)

    @contextlib.contextmanager
    def held(self, key: str, body: bytes) -> Iterator[Claim]:
        """The key's claim, held (no other keyed create runs) for the block."""
        digest = hashlib.sha256(body).hexdigest()
        with self._hold:
            with self._lock:
                earlier = self._made.get(key)
            refused = earlier is not None and earlier[0] != digest
            sandbox_id = None if earlier is None or refused else earlier[1]
            yield Claim(key, digest, sandbox_id, refused, self)

    def _remember(self, key: str, digest: str, sandbox: Sandbox) -> None:
        with self._lock:
            self._made[key] = (digest, sandbox.id)
        sandbox.on_end(lambda: self._forget(key, sandbox.id))

    def _forget(self, key: str, sandbox_id: str) -> None:
        with self._lock:
            if self._made.get(key, ("", ""))[1] == sandbox_id:
                del self._made[key]
