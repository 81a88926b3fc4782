"""``find`` in the doubles' in-memory shell: the starts, ``-mindepth``/``-maxdepth``, and a
conjunction of ``-type``, ``-newer``, ``-name`` (each may be negated with ``!``) and the
actions ``-print``, ``-print0`` and ``-printf``."""

from __future__ import annotations

import posixpath
from collections.abc import Iterator

from piship_remote.testing.sandbox_interpreter import Failed, Interpreter
from piship_remote.testing.sandbox_tree import ShellTree

__all__ = ["find"]


def find(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    starts: list[str] = []
    while args and not args[0].startswith(("-", "!", "(")):
        starts.append(args.pop(0))
    test = _FindExpression(shell, args)
    status = 0
    for start in starts or ["."]:
        root = shell.path(start)
        if shell.tree.kind(root) is None:
            shell.stderr += f"find: '{start}': No such file or directory\n".encode()
            status = 1
            continue
        for shown, path, depth in _walk(shell.tree, start, root, 0):
            if test.mindepth <= depth <= test.maxdepth:
                test.visit(shown, path, out)
    return status


def _walk(tree: ShellTree, shown: str, path: str, depth: int) -> Iterator[tuple[str, str, int]]:
    yield shown, path, depth
    if tree.kind(path) == "dir":
        for name in tree.names(path):
            yield from _walk(
                tree, posixpath.join(shown, name), posixpath.join(path, name), depth + 1
            )


class _FindExpression:
    """``find``'s options and a conjunction of tests and actions (``!`` negates one test)."""

    def __init__(self, shell: Interpreter, args: list[str]) -> None:
        self.shell = shell
        self.mindepth, self.maxdepth = 0, 1 << 30
        self.terms: list[tuple[bool, str, str]] = []
        negate = False
        words = list(args)
        while words:
            word = words.pop(0)
            if word == "!":
                negate = True
                continue
            if word in ("-mindepth", "-maxdepth"):
                setattr(self, word[1:], int(words.pop(0)))
            elif word in ("-type", "-newer", "-printf", "-name"):
                self.terms.append((negate, word, words.pop(0)))
            elif word in ("-print", "-print0"):
                self.terms.append((False, word, ""))
            else:
                raise Failed(f"unknown predicate `{word}'")
            negate = False
        if not any(term[1].startswith("-print") for term in self.terms):
            self.terms.append((False, "-print", ""))

    def visit(self, shown: str, path: str, out: bytearray) -> None:
        tree = self.shell.tree
        for negate, name, value in self.terms:
            if name == "-type":
                kind = {"file": "f", "dir": "d"}.get(tree.kind(path) or "", "?")
                if (kind == value) == negate:
                    return
            elif name == "-newer":
                newer = tree.mtime(path) > tree.mtime(self.shell.path(value))
                if newer == negate:
                    return
            elif name == "-name":
                if (posixpath.basename(shown) == value) == negate:
                    return
            elif name == "-print":
                out += f"{shown}\n".encode()
            elif name == "-print0":
                out += f"{shown}\0".encode()
            elif name == "-printf":
                out += _printf(tree, value, shown, path)


def _printf(tree: ShellTree, form: str, shown: str, path: str) -> bytes:
    kind = tree.kind(path)
    fields = {
        "y": "d" if kind == "dir" else "f",
        "s": str(len(tree.read_file(path)) if kind == "file" else 4096),
        "f": posixpath.basename(shown),
        "p": shown,
    }
    text, i = [], 0
    while i < len(form):
        if form[i] == "%" and i + 1 < len(form):
            text.append(fields.get(form[i + 1], ""))
            i += 2
        elif form[i] == "\\" and i + 1 < len(form):
            text.append({"0": "\0", "n": "\n", "t": "\t"}.get(form[i + 1], form[i + 1]))
            i += 2
        else:
            text.append(form[i])
            i += 1
    return "".join(text).encode()
