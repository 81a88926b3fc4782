"""Many sandboxes at once: :class:`SandboxPool` runs tasks, :class:`TaskResult` says how each ended.

from piship_remote import SandboxPool
with SandboxPool(policy, backend=backend, workspace=".", size=8, warm=8) as pool:
    for result in pool.imap("pytest -q tests/{item}", shards, timeout=900):
        print(result.item, result.outcome)
"""

from __future__ import annotations

from piship_remote.pool.pool import SandboxPool
from piship_remote.pool.result import OUTCOMES, Outcome, TaskResult, TaskResults

__all__ = ["OUTCOMES", "Outcome", "SandboxPool", "TaskResult", "TaskResults"]
