"""Which host files a push sends: the workspace less denied, ignored and escaping paths.

    selection = select_tree(root, read_deny=profile.read_deny)
    for entry in selection.entries: ...      # regular files, directories, inner symlinks
    selection.skipped                         # SkippedPath(path, reason) for everything left out

    walk = TreeWalk(root, read_deny=profile.read_deny)
    for entry in walk: ...                    # the same entries, each as it is reached
    walk.summary()                            # afterwards: counts and skipped, no entries kept

    rules = IgnoreRules(root)
    rules.excludes("build/out.o", is_dir=False)   # the same rules, for what a pull brings back

Rules, in order, for each path below the workspace root:

- anything under a ``read_deny`` path never leaves the host (``"read-deny"``);
- ``.git`` and paths ignored by the workspace's ``.gitignore`` files (nested files apply
  to their own directory, deeper ones first, as git does) are skipped (``"ignored"``);
- with ``skip_secrets``, well-known secret files and folders (``.env``, private keys,
  cloud credential folders: :mod:`piship_remote.workspace._secret_files`) are skipped (``"secret
  file"``, ``"secret folder"``) unless they are at or below a path in ``send_secrets``;
- a symlink whose target leaves the workspace is skipped (``"symlink leaves the
  workspace"``); one that stays inside is sent as a link, never followed;
- sockets, devices and FIFOs are skipped (``"not a regular file"``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator, Sequence

import attrs
import pathspec

from piship_remote.model.transfer import SkippedPath, TransferSummary
from piship_remote.workspace._secret_files import secret_reason

__all__ = ["IgnoreRules", "TreeEntry", "TreeSelection", "TreeWalk", "inside", "select_tree"]

GIT_DIRECTORY = ".git"
GITIGNORE = ".gitignore"


@attrs.frozen
class TreeEntry:
    """One path to send: ``relative`` uses ``/``; ``kind`` is ``file``, ``dir`` or ``symlink``."""

    relative: str
    absolute: str
    kind: str
    size: int = 0
    mode: int = 0o644
    mtime: float = 0.0
    link_target: str | None = None


@attrs.frozen
class TreeSelection:
    """What a push sends and what it leaves out, with the reasons."""

    entries: tuple[TreeEntry, ...]
    skipped: tuple[SkippedPath, ...]

    @property
    def files(self) -> int:
        return sum(1 for entry in self.entries if entry.kind == "file")

    @property
    def bytes(self) -> int:
        return sum(entry.size for entry in self.entries if entry.kind == "file")


def inside(path: str, root: str) -> bool:
    """Whether the absolute, normalised ``path`` is ``root`` or below it."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def select_tree(
    root: str,
    *,
    read_deny: Sequence[str] = (),
    paths: Iterable[str] | None = None,
    use_gitignore: bool = True,
    skip_secrets: bool = False,
    send_secrets: Sequence[str] = (),
) -> TreeSelection:
    """Walk ``root`` (or only ``paths`` below it, absolute) and decide what a push sends."""
    walk = TreeWalk(
        root,
        read_deny=read_deny,
        paths=paths,
        use_gitignore=use_gitignore,
        skip_secrets=skip_secrets,
        send_secrets=send_secrets,
    )
    entries = tuple(walk)
    return TreeSelection(entries, walk.skipped)


class TreeWalk:
    """:func:`select_tree`'s walk, one entry at a time: iterate once, in the same order.

    What it skips, and the files and bytes it yields, are counted as it goes;
    :meth:`summary` gives them (the entries themselves are not kept).
    """

    def __init__(
        self,
        root: str,
        *,
        read_deny: Sequence[str] = (),
        paths: Iterable[str] | None = None,
        use_gitignore: bool = True,
        skip_secrets: bool = False,
        send_secrets: Sequence[str] = (),
    ) -> None:
        real = os.path.realpath(root)
        # Every visited path is below the root, so only denials below it or above it apply.
        relevant = tuple(path for path in read_deny if inside(path, real) or inside(real, path))
        self._walker = _Walker(
            real,
            relevant,
            IgnoreRules(real) if use_gitignore else None,
            skip_secrets,
            tuple(os.path.realpath(path) for path in send_secrets),
        )
        self._starts = [real] if paths is None else [os.path.abspath(path) for path in paths]
        self.files = 0
        self.bytes = 0

    def __iter__(self) -> Iterator[TreeEntry]:
        for start in self._starts:
            for entry in self._walker.visit_start(start):
                if entry.kind == "file":
                    self.files += 1
                    self.bytes += entry.size
                yield entry

    @property
    def skipped(self) -> tuple[SkippedPath, ...]:
        """What the walk has left out so far, with the reasons, in walk order."""
        return tuple(self._walker.skipped)

    def summary(self) -> TransferSummary:
        """The files and bytes yielded so far, and what was skipped."""
        return TransferSummary(self.files, self.bytes, self.skipped)


@attrs.define
class _Walker:
    root: str
    read_deny: tuple[str, ...]
    ignore: IgnoreRules | None
    skip_secrets: bool
    send_secrets: tuple[str, ...]
    skipped: list[SkippedPath] = attrs.Factory(list)
    _seen: set[str] = attrs.Factory(set)

    def visit_start(self, start: str) -> Iterator[TreeEntry]:
        if not inside(start, self.root):
            self.skipped.append(SkippedPath(start, "outside the workspace"))
            return
        relative = self._relative(start)
        parents = relative.split("/")[:-1] if relative else []
        for depth in range(len(parents)):
            yield from self._directory_entry("/".join(parents[: depth + 1]))
        yield from self._visit(start, relative)

    def _visit(self, absolute: str, relative: str) -> Iterator[TreeEntry]:
        reason = self._excluded(absolute, relative)
        if reason is not None:
            self.skipped.append(SkippedPath(relative or ".", reason))
            return
        try:
            info = os.lstat(absolute)
        except OSError:
            return  # vanished while walking
        if stat.S_ISLNK(info.st_mode):
            yield from self._symlink(absolute, relative)
        elif stat.S_ISDIR(info.st_mode):
            yield from self._directory(absolute, relative, info)
        elif stat.S_ISREG(info.st_mode):
            yield from self._new(
                TreeEntry(
                    relative, absolute, "file", info.st_size, info.st_mode & 0o7777, info.st_mtime
                )
            )
        else:
            self.skipped.append(SkippedPath(relative, "not a regular file"))

    def _directory(
        self, absolute: str, relative: str, info: os.stat_result
    ) -> Iterator[TreeEntry]:
        if relative:
            yield from self._new(
                TreeEntry(relative, absolute, "dir", 0, info.st_mode & 0o7777, info.st_mtime)
            )
        try:
            names = sorted(os.listdir(absolute))
        except OSError:
            self.skipped.append(SkippedPath(relative or ".", "not readable"))
            return
        for name in names:
            yield from self._visit(
                os.path.join(absolute, name), f"{relative}/{name}" if relative else name
            )

    def _symlink(self, absolute: str, relative: str) -> Iterator[TreeEntry]:
        target = os.readlink(absolute)
        resolved = os.path.realpath(absolute)
        if not inside(resolved, self.root) or os.path.isabs(target):
            self.skipped.append(SkippedPath(relative, "symlink leaves the workspace"))
            return
        yield from self._new(TreeEntry(relative, absolute, "symlink", link_target=target))

    def _directory_entry(self, relative: str) -> Iterator[TreeEntry]:
        absolute = os.path.join(self.root, *relative.split("/"))
        info = os.lstat(absolute)
        yield from self._new(
            TreeEntry(relative, absolute, "dir", 0, info.st_mode & 0o7777, info.st_mtime)
        )

    def _new(self, entry: TreeEntry) -> Iterator[TreeEntry]:
        """``entry``, unless an earlier start already gave its path."""
        if entry.relative not in self._seen:
            self._seen.add(entry.relative)
            yield entry

    def _excluded(self, absolute: str, relative: str) -> str | None:
        if self.read_deny and any(inside(absolute, denied) for denied in self.read_deny):
            return "read-deny"
        if not relative:
            return None
        if relative.rpartition("/")[2] == GIT_DIRECTORY:
            return "ignored"
        if self.ignore is not None and self.ignore.ignored(relative, os.path.isdir(absolute)):
            return "ignored"
        if self.skip_secrets and not any(inside(absolute, sent) for sent in self.send_secrets):
            return secret_reason(relative, absolute, is_dir=_is_directory(absolute))
        return None

    def _relative(self, absolute: str) -> str:
        return (
            ""
            if absolute == self.root
            else os.path.relpath(absolute, self.root).replace(os.sep, "/")
        )


class IgnoreRules:
    """The ``.gitignore`` files of a tree, read as they are needed and kept."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._specs: dict[str, pathspec.GitIgnoreSpec | None] = {}
        self._chains: dict[str, tuple[tuple[str, pathspec.GitIgnoreSpec], ...]] = {}

    def excludes(self, relative: str, *, is_dir: bool) -> bool:
        """Whether a push leaves out ``relative``: it, or a directory above it, is ``.git``
        or ignored (git never looks inside an ignored directory)."""
        parts = relative.split("/")
        for depth in range(1, len(parts) + 1):
            below = depth < len(parts)
            if parts[depth - 1] == GIT_DIRECTORY:
                return True
            if self.ignored("/".join(parts[:depth]), below or is_dir):
                return True
        return False

    def ignored(self, relative: str, is_dir: bool) -> bool:
        """Whether the ``.gitignore`` files above ``relative`` ignore it."""
        chain = self._chain(relative.rpartition("/")[0])
        if not chain:
            return False
        candidate = relative + ("/" if is_dir else "")
        for base, spec in chain:
            below = candidate[len(base) + 1 :] if base else candidate
            verdict = spec.check_file(below).include
            if verdict is not None:
                return bool(verdict)
        return False

    def _chain(self, base: str) -> tuple[tuple[str, pathspec.GitIgnoreSpec], ...]:
        """The ``.gitignore`` files that apply in the directory ``base``, deepest first."""
        if base not in self._chains:
            spec = self._spec(base)
            above = self._chain(base.rpartition("/")[0]) if base else ()
            self._chains[base] = above if spec is None else ((base, spec), *above)
        return self._chains[base]

    def _spec(self, base: str) -> pathspec.GitIgnoreSpec | None:
        if base not in self._specs:
            path = (
                os.path.join(self.root, *base.split("/"), GITIGNORE)
                if base
                else os.path.join(self.root, GITIGNORE)
            )
            self._specs[base] = _read_spec(path)
        return self._specs[base]


def _is_directory(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _read_spec(path: str) -> pathspec.GitIgnoreSpec | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    return pathspec.GitIgnoreSpec.from_lines(lines)
