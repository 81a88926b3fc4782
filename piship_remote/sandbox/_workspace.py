"""The host workspace: that it exists, real paths, and a working directory inside it."""

from __future__ import annotations

import os
from typing import Union

from piship_remote.model.errors import ConfigInvalid

__all__ = ["check_workspace", "real_path", "workspace_relative"]

PathLike = Union[str, "os.PathLike[str]"]


def check_workspace(workspace: PathLike) -> None:
    """A workspace must be an existing directory: a typo would otherwise start empty."""
    try:
        path = os.fspath(workspace)
    except TypeError:
        raise TypeError(
            f"workspace must be a path (str or os.PathLike), not {type(workspace).__name__}"
        ) from None
    if os.path.isdir(path):
        return
    problem = "is not a directory" if os.path.exists(path) else "does not exist"
    raise ConfigInvalid(
        f"the workspace {path!r} {problem}",
        user_action="Pass workspace= an existing directory (the host folder whose files"
        ' the sandbox works on), e.g. workspace="."',
    )


def real_path(path: PathLike) -> str:
    """The real path of ``path``'s nearest existing ancestor, plus the missing tail."""
    absolute = os.path.abspath(os.fspath(path))
    tail: list[str] = []
    current = absolute
    while not os.path.exists(current):
        parent = os.path.dirname(current)
        if parent == current:
            break
        tail.append(os.path.basename(current))
        current = parent
    return os.path.join(os.path.realpath(current), *reversed(tail))


def workspace_relative(cwd: PathLike | None, root: str, adapter: str) -> str:
    """``cwd`` as a path relative to the workspace ``root`` (``"."`` for none or the root)."""
    if cwd is None:
        return "."
    real = real_path(cwd)
    if real == root:
        return "."
    if not real.startswith(root.rstrip(os.sep) + os.sep):
        raise ConfigInvalid(
            "Working directory is outside the workspace, where the "
            f"{adapter} sandbox backend cannot run commands: {os.fspath(cwd)}",
        )
    return os.path.relpath(real, root).replace(os.sep, "/")
