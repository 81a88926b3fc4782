"""A pool task given as a shell command: its check, and its ``{item}``.

    check_command("pytest -q tests/{item}")            # raises ConfigInvalid for a bad one
    command_for("pytest -q tests/{item}", "a b.py")    # "pytest -q tests/'a b.py'"

Only the literal ``{item}`` is replaced, by the item quoted as one shell word
(``shlex.quote``): ``a b`` stays one argument and ``x; rm -rf ~`` runs nothing, and
every other brace (``${HOME}``, awk's ``{print}``, ``{Item}``) reaches the shell as
written. A caller who wants the item unquoted passes a callable task instead.
"""

from __future__ import annotations

import shlex
import warnings
from typing import Any

from piship_remote.model.errors import ConfigInvalid

__all__ = ["ITEM", "NoItemWarning", "check_command", "command_for"]

ITEM = "{item}"


class NoItemWarning(UserWarning):
    """A pool command without ``{item}``: every task runs the same command."""


def command_for(command: str, item: Any) -> str:
    """``command`` with every ``{item}`` replaced by ``item`` quoted as one shell word."""
    return command.replace(ITEM, shlex.quote(str(item)))


def check_command(command: str, *, stacklevel: int = 2) -> None:
    """Refuse a command that cannot run (before any sandbox is used); warn (a
    :class:`NoItemWarning` at ``stacklevel`` above the caller) when it has no ``{item}``.

    Raises:
        ConfigInvalid: the command is blank, holds a NUL character, or leaves a quote
            open.
    """
    problem = command_problem(command)
    if problem is not None:
        raise ConfigInvalid(
            f"the task command {problem}",
            component="pool",
            user_action="Fix the command; {item} is replaced by the item as one quoted word",
        )
    if ITEM not in command:
        warnings.warn(no_item_warning(command), NoItemWarning, stacklevel=stacklevel + 1)


def no_item_warning(command: str) -> str:
    return f"the task command has no {ITEM}, so every task runs the same command: {command}"


def command_problem(command: str) -> str | None:
    """Why ``command`` cannot run, or ``None``."""
    if not command.strip():
        return "is empty"
    if "\0" in command:
        return "holds a NUL character, which no shell command can"
    if "$'" in command:  # bash's $'…' quoting allows \' inside, which shlex cannot read
        return None
    try:
        shlex.split(command.replace(ITEM, "x"), comments=True)
    except ValueError:
        return "leaves a quotation mark open"
    return None
