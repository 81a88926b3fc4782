"""The host uids of a root service's sandboxes: a range of its own each, out of a reserved block.

Sandbox ``n`` (a *slot*) maps its uid ``u`` (0 for root, 1000 for its user) onto host uid
``BLOCK_START + n * SLOT_SIZE + u``, so no two live sandboxes share a host uid: one cannot
signal, trace or own the files of another, whatever path it finds. Template files belong to
:data:`TEMPLATE_OWNER`, just below the block, which no sandbox maps. A slot is held for the
sandbox's whole life, by this process (an exclusive lock on a file named after it, which the
kernel drops when the holder dies, so two services on one host never share one) and is only
taken again once no process runs as one of its uids::

    block = UidBlock()
    ids = block.take()             # SandboxIds(slot=0, base=2147000000)
    ids.host(1000)                 # 2147001000
    block.give_back(ids)           # after the sandbox's processes and files are gone
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time

import attrs

__all__ = [
    "BLOCK_START",
    "SLOTS",
    "SLOT_SIZE",
    "TEMPLATE_OWNER",
    "TRIAL_IDS",
    "SandboxIds",
    "UidBlock",
    "UidsExhausted",
    "sandbox_uid",
]

# Unused by any account, below the 2**31 - 1 limit of 32-bit ids and far above where
# distributions allocate users and containers' subordinate ranges (100000 + 65536 * n).
BLOCK_START = 2_147_000_000
SLOT_SIZE = 1024  # a sandbox maps uids 0 and 1000 of its range
SLOTS = (2**31 - 1 - BLOCK_START) // SLOT_SIZE
TEMPLATE_OWNER = BLOCK_START - 1
# The range of the service's one trial sandbox (is bubblewrap usable here?), below the block.
TRIAL_BASE = BLOCK_START - SLOT_SIZE
LOCK_DIRECTORY = "/run/piship-local-uids"
RELEASE_TIMEOUT = 5.0
RELEASE_POLL = 0.01


class UidsExhausted(OSError):
    """Every slot of the block is held (by this or another service) or still has processes."""


@attrs.frozen
class SandboxIds:
    """One sandbox's range of host uids (and gids): sandbox uid ``u`` is ``base + u`` here."""

    slot: int
    base: int

    def host(self, uid: int) -> int:
        """The host uid (and gid) sandbox uid ``uid`` maps onto."""
        return self.base + uid

    def owns(self, host_uid: int) -> bool:
        """Whether ``host_uid`` is one of this range's."""
        return self.base <= host_uid < self.base + SLOT_SIZE


def sandbox_uid(host_uid: int) -> int | None:
    """The sandbox uid a host uid of the block stands for (``None`` outside the block)."""
    if BLOCK_START <= host_uid < BLOCK_START + SLOTS * SLOT_SIZE:
        return (host_uid - BLOCK_START) % SLOT_SIZE
    return None


TRIAL_IDS = SandboxIds(-1, TRIAL_BASE)


def slot_ids(slot: int) -> SandboxIds:
    """The range of slot ``slot``."""
    return SandboxIds(slot, BLOCK_START + slot * SLOT_SIZE)


class UidBlock:
    """The slots this service holds; thread-safe."""

    def __init__(self, lock_directory: str = LOCK_DIRECTORY) -> None:
        self._lock_directory = lock_directory
        self._held: dict[int, int] = {}  # slot -> its lock file's descriptor
        self._mutex = threading.Lock()

    def take(self) -> SandboxIds:
        """The lowest slot no one holds and no process runs in; :class:`UidsExhausted` if none."""
        os.makedirs(self._lock_directory, 0o700, exist_ok=True)
        with self._mutex:
            busy = _running_uids()
            for slot in range(SLOTS):
                if slot in self._held:
                    continue
                ids = slot_ids(slot)
                if any(ids.owns(uid) for uid in busy):
                    continue
                fd = self._lock(slot)
                if fd is not None:
                    self._held[slot] = fd
                    return ids
        raise UidsExhausted("every host uid range of the local service's block is in use")

    def give_back(self, ids: SandboxIds, *, timeout: float = RELEASE_TIMEOUT) -> bool:
        """Release ``ids``'s slot once its sandbox's files are gone and no process runs as
        one of its uids (waiting up to ``timeout`` for the last ones to exit); ``False``
        when some still run: the slot stays held until :meth:`close`."""
        deadline = time.monotonic() + timeout
        while any(ids.owns(uid) for uid in _running_uids()):
            if time.monotonic() >= deadline:
                return False
            time.sleep(RELEASE_POLL)
        with self._mutex:
            fd = self._held.pop(ids.slot, None)
        if fd is not None:
            os.close(fd)  # closing drops the lock
        return True

    def close(self) -> None:
        """Release every slot."""
        with self._mutex:
            held, self._held = list(self._held.values()), {}
        for fd in held:
            os.close(fd)

    def _lock(self, slot: int) -> int | None:
        path = os.path.join(self._lock_directory, f"slot-{slot}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd


def _running_uids() -> set[int]:
    """Every real, effective, saved and filesystem uid of a live process, in the block (a
    zombie, which can no longer act, waiting for its reaper, does not count)."""
    found: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError):
            with open(f"/proc/{name}/status", encoding="ascii", errors="replace") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
            if fields.get("State", "").split()[:1] == ["Z"]:
                continue
            uids = map(int, fields.get("Uid", "").split())
            found.update(uid for uid in uids if sandbox_uid(uid) is not None)
    return found
