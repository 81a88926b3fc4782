"""What ``Sandbox.run`` returns: :class:`CommandResult`, the exit code and decoded output.

A value of its own, below the sandbox layer that makes it and the errors that carry it
(:class:`~piship_remote.model.errors.CommandFailed`).
"""

from __future__ import annotations

import attrs

__all__ = ["CommandResult"]


@attrs.frozen
class CommandResult:
    """What ``Sandbox.run`` returns: the exit code and the decoded output.

    ``stdout_truncated``/``stderr_truncated``: the stream was longer than the
    limit, and only its last ``limit`` bytes are in ``stdout``/``stderr``.
    """

    exit_code: int
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
