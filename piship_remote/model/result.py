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
    ``missing``: per stream, the bytes that may be missing because the command's stream
    dropped and the output written meanwhile could not be replayed (0: nothing lost;
    ``-1``: an unknown number). ``stdout``/``stderr`` hold no marker: check ``missing``.
    """

    exit_code: int
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    missing: dict[str, int] = attrs.field(factory=lambda: {"stdout": 0, "stderr": 0})
