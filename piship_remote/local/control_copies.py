"""The control plane's copies of sandboxes: forks and snapshots, as SDK 2.63 calls them.

=========================================  ======================================
``POST /sandboxes/<id>/fork``              201: ``[{"sandbox": …} | {"error": …}]``, ``count``
``POST /sandboxes/<id>/snapshots``         201: ``{"snapshotID", "names"}``
``GET /snapshots``                         200: ``sandboxID``, ``name``, ``limit``, ``nextToken``
``DELETE /templates/<snapshot id>``        204; 404 when there is no such snapshot
=========================================  ======================================

Both copy the sandbox's files (home, ``/tmp``, ``/dev/shm``, root's home, and what it
wrote and deleted of its root filesystem) while it runs, exported by its own agent (a
snapshot's copy counts against the service's snapshot disk budget: 507 past it), which is
all a local sandbox has to keep: a fork or a sandbox created from a snapshot
(``templateID`` = the snapshot's ID) starts with those files and its source's template,
variables and metadata, but not its running processes.
A fork lives ``timeout`` seconds (300 when absent)::

    copies = SandboxCopies(registry, info=control_plane_info)
    reply = copies.fork(sandbox, body)
"""

from __future__ import annotations

from collections.abc import Callable

from piship_remote._http_server.messages import Reply, Request
from piship_remote.local.sandbox.listing import query_of
from piship_remote.local.sandbox.registry import (
    CopyFailed,
    Registry,
    Sandbox,
    SandboxGone,
    Snapshot,
    SnapshotBudgetExceeded,
    TooManySandboxes,
    TooManySnapshots,
)
from piship_remote.wire.e2b_control import (
    ApiError,
    ForkRequest,
    SandboxInfo,
    SnapshotInfo,
    SnapshotRequest,
)
from piship_remote.wire.e2b_json import parse, to_json

__all__ = ["FORK_TIMEOUT", "MAX_FORKS", "SandboxCopies", "api_error"]

FORK_TIMEOUT = 300
MAX_FORKS = 20
MAX_PAGE = 100


class SandboxCopies:
    """Answers the fork and snapshot requests for the sandboxes of a :class:`Registry`."""

    def __init__(self, registry: Registry, *, info: Callable[[Sandbox], SandboxInfo]) -> None:
        self._registry = registry
        self._info = info

    def fork(self, sandbox: Sandbox, body: bytes) -> Reply:
        """``count`` new sandboxes with copies of ``sandbox``'s files, each or its error."""
        request = parse(body, ForkRequest)
        if not 1 <= request.count <= MAX_FORKS:
            return api_error(400, f"count must be between 1 and {MAX_FORKS}")
        lifetime = FORK_TIMEOUT if request.timeout is None else request.timeout
        if lifetime <= 0:
            return api_error(400, "Timeout must be greater than 0")
        results: list[dict[str, object]] = []
        for _ in range(request.count):
            try:
                fork = self._registry.fork(sandbox.id, lifetime)
            except TooManySandboxes as e:
                results.append({"error": ApiError(429, str(e))})
                continue
            except SandboxGone as e:
                results.append({"error": ApiError(503, str(e))})
                continue
            if fork is None:
                return api_error(404, f'sandbox "{sandbox.id}" not found')
            results.append({"sandbox": self._info(fork)})
        return Reply(201, to_json(results), "application/json")

    def snapshot(self, sandbox: Sandbox, body: bytes) -> Reply:
        """A snapshot of ``sandbox``'s files, named as asked."""
        request = parse(body, SnapshotRequest)
        try:
            snapshot = self._registry.snapshot(sandbox.id, request.name or None)
        except TooManySnapshots as e:
            return api_error(429, str(e))
        except SnapshotBudgetExceeded as e:
            return api_error(507, str(e))
        except CopyFailed as e:
            return api_error(500, f"the snapshot could not be taken: {e}")
        except OSError:
            return api_error(500, "the snapshot could not be taken: its agent could not be reached")
        if snapshot is None:
            return api_error(404, f'sandbox "{sandbox.id}" not found')
        return Reply(201, to_json(_snapshot_info(snapshot)), "application/json")

    def list(self, request: Request) -> Reply:
        """One page of snapshots, oldest first; ``X-Next-Token`` when more remain."""
        query = query_of(request.target)
        raw_limit = query.get("limit", str(MAX_PAGE))
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_PAGE:
            return api_error(400, f"limit must be between 1 and {MAX_PAGE}")
        found = self._registry.snapshots.select(
            source=query.get("sandboxID") or None, name=query.get("name") or None
        )
        after = query.get("nextToken")
        if after:
            ids = [s.id for s in found]
            if after not in ids:
                return api_error(400, "Invalid next token")
            found = found[ids.index(after) + 1 :]
        page = found[: int(raw_limit)]
        more = len(found) > len(page)
        headers = (("X-Next-Token", page[-1].id),) if more and page else ()
        listed = [_snapshot_info(s) for s in page]
        return Reply(200, to_json(listed), "application/json", headers)

    def delete(self, snapshot_id: str) -> Reply:
        """Remove a snapshot (sandboxes made from it keep their files)."""
        if not self._registry.snapshots.delete(snapshot_id):
            return api_error(404, f"snapshot '{snapshot_id}' not found")
        return Reply(204)


def _snapshot_info(snapshot: Snapshot) -> SnapshotInfo:
    return SnapshotInfo(snapshot.id, list(snapshot.names))


def api_error(status: int, message: str) -> Reply:
    """E2B's error answer ``{"code": status, "message": …}``."""
    return Reply(status, to_json(ApiError(status, message)), "application/json")
