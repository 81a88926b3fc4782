"""What ``Sandbox.run`` returns: :class:`CommandResult`, the exit code and decoded output.

A value of its own, below the sandbox layer that makes it and the errors that carry it
(:class:`~piship_remote.model.errors.CommandFailed`).
"""

from __future__ import annotations

import attrs

from piship_remote.model.display import html_pre, html_table, tail
from piship_remote.model.output_gap import nothing_missing

__all__ = ["CommandResult"]


_SHOWN = 2000
"""The characters of each stream a result's display shows (its end, where errors are)."""


@attrs.frozen(repr=False)
class CommandResult:
    """What ``Sandbox.run`` returns: the exit code and the decoded output.

    ``stdout_truncated``/``stderr_truncated``: the stream was longer than the
    limit, and only its last ``limit`` bytes are in ``stdout``/``stderr``.
    ``missing``: per stream, the bytes that may be missing because the command's stream
    dropped and the output written meanwhile could not be replayed (0: nothing lost;
    ``-1``: an unknown number). ``stdout``/``stderr`` hold no marker: check ``missing``.
    Shown (``repr``, a notebook's table) with the end of each stream only.
    """

    exit_code: int
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    missing: dict[str, int] = attrs.field(factory=nothing_missing)

    def __repr__(self) -> str:
        return (
            f"CommandResult(exit_code={self.exit_code!r}, stdout={tail(self.stdout, _SHOWN)!r}, "
            f"stderr={tail(self.stderr, _SHOWN)!r}"
            + ", stdout_truncated=True" * self.stdout_truncated
            + ", stderr_truncated=True" * self.stderr_truncated
            + ")"
        )

    def _repr_html_(self) -> str:
        rows = [
            ["exit code", str(self.exit_code)],
            ["stdout" + " (truncated)" * self.stdout_truncated, tail(self.stdout, _SHOWN)],
            ["stderr" + " (truncated)" * self.stderr_truncated, tail(self.stderr, _SHOWN)],
        ]
        cells = [[f"<b>{name}</b>", html_pre(value)] for name, value in rows]
        return html_table(None, cells, caption="CommandResult", raw_cells=True)
