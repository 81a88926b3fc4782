"""The interpreter of the doubles' in-memory shell: runs a parsed script against a tree.

Utilities (:data:`~piship_remote.testing.sandbox_utilities.UTILITIES`) take their
arguments and standard input and return an exit status; they write standard output
to ``out`` and errors through the interpreter, or raise :class:`Failed`.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from typing import Any

from piship_remote.testing.sandbox_shell import (
    AndOr,
    CommandList,
    Group,
    If,
    Pipeline,
    ShellResult,
    ShellSyntaxError,
    Simple,
    Word,
    parse,
)
from piship_remote.testing.sandbox_tree import ShellTree

__all__ = ["Exit", "Failed", "Interpreter", "Utility", "split_flags"]


class Exit(Exception):
    """``exit``: the script ends with ``status``."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class Failed(Exception):
    """A utility's error: its message goes to stderr, the status is returned."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


class Interpreter:
    """One run of a script: variables, the working directory, what it printed."""

    def __init__(self, tree: ShellTree, cwd: str, env: dict[str, str]) -> None:
        self.tree = tree
        self.cwd = cwd
        self.vars: dict[str, str] = {**env, "?": "0"}
        self.stdout = bytearray()
        self.stderr = bytearray()

    # ---- entry points ----------------------------------------------------------------

    def script(self, text: str) -> ShellResult:
        try:
            status = self._sequence(parse(text), b"", self.stdout)
        except ShellSyntaxError as error:
            self.stderr += f"sh: syntax error: {error}\n".encode()
            status = 2
        except Exit as done:
            status = done.status
        return ShellResult(status, bytes(self.stdout), bytes(self.stderr))

    def argv(self, argv: list[str]) -> ShellResult:
        try:
            status = self._utility(argv, b"", self.stdout)
        except Exit as done:
            status = done.status
        return ShellResult(status, bytes(self.stdout), bytes(self.stderr))

    # ---- the syntax tree -------------------------------------------------------------

    def _sequence(self, tree: CommandList, stdin: bytes, out: bytearray) -> int:
        status = 0
        for item in tree.items:
            status = self._and_or(item, stdin, out)
        return status

    def _and_or(self, tree: AndOr, stdin: bytes, out: bytearray) -> int:
        status = self._pipeline(tree.first, stdin, out)
        for op, pipeline in tree.rest:
            if (op == "&&") == (status == 0):
                status = self._pipeline(pipeline, stdin, out)
        return status

    def _pipeline(self, tree: Pipeline, stdin: bytes, out: bytearray) -> int:
        data, status = stdin, 0
        for index, command in enumerate(tree.commands):
            last = index == len(tree.commands) - 1
            sink = out if last else bytearray()
            status = self._command(command, data, sink)
            data = bytes(sink)
        if tree.negated:
            status = int(status == 0)
        self.vars["?"] = str(status)
        return status

    def _command(self, tree: Any, stdin: bytes, out: bytearray) -> int:
        if isinstance(tree, Group):
            return self._sequence(tree.body, stdin, out)
        if isinstance(tree, If):
            for condition, body in tree.branches:
                if self._sequence(condition, stdin, out) == 0:
                    return self._sequence(body, stdin, out)
            return self._sequence(tree.otherwise, stdin, out) if tree.otherwise else 0
        assert isinstance(tree, Simple)
        return self._simple(tree, stdin, out)

    def _simple(self, tree: Simple, stdin: bytes, out: bytearray) -> int:
        values = {name: self._expand(value) for name, value in tree.assignments}
        argv = [self._expand(word) for word in tree.words]
        if not argv:
            self.vars.update(values)
            return 0
        sink, errors, quiet = out, self.stderr, False
        target: str | None = None
        append = False
        for op, word in tree.redirects:
            if op == "<":
                try:
                    stdin = self.tree.read_file(self.path(self._expand(word)))
                except OSError as error:
                    self.stderr += f"sh: {self._expand(word)}: {error.strerror}\n".encode()
                    return 1
            elif op in (">", ">>"):
                target, append, sink = self.path(self._expand(word)), op == ">>", bytearray()
            elif op == "2>":
                quiet = self._expand(word) == "/dev/null"
        if quiet:
            self.stderr = bytearray()
        try:
            status = self._utility(argv, stdin, sink)
        finally:
            if quiet:
                self.stderr = errors
        if target is not None and target != "/dev/null":
            try:
                before = (
                    self.tree.read_file(target) if append and self.is_a("file", target) else b""
                )
                self.tree.write_file(target, before + bytes(sink))
            except OSError as error:
                self.stderr += f"sh: can't create {target}: {error.strerror}\n".encode()
                return 2
        return status

    def _expand(self, word: Word) -> str:
        text = []
        for kind, value in word:
            if kind in ("lit", "q"):
                text.append(value)
            elif kind == "var":
                text.append(self.vars.get(value, ""))
            else:
                inner = Interpreter(self.tree, self.cwd, dict(self.vars))
                result = inner.script(value)
                self.stderr += result.stderr
                text.append(result.stdout.decode("utf-8", "replace").rstrip("\n"))
        return "".join(text)

    # ---- utilities -------------------------------------------------------------------

    def _utility(self, argv: list[str], stdin: bytes, out: bytearray) -> int:
        from piship_remote.testing.sandbox_utilities import UTILITIES  # they import this module

        name = argv[0].rsplit("/", 1)[-1] if argv[0].startswith("/") else argv[0]
        utility = UTILITIES.get(name)
        if utility is None:
            self.stderr += f"sh: {argv[0]}: not found\n".encode()
            return 127
        try:
            return utility(self, argv[1:], stdin, out)
        except Failed as failed:
            self.stderr += f"{name}: {failed}\n".encode()
            return failed.status
        except OSError as error:
            where = f"'{error.filename}': " if error.filename else ""
            self.stderr += f"{name}: {where}{error.strerror or error}\n".encode()
            return 1

    def path(self, raw: str) -> str:
        return posixpath.normpath(posixpath.join(self.cwd, raw)) if raw else self.cwd

    def is_a(self, kind: str, path: str) -> bool:
        return self.tree.kind(path) == kind

    def nested(self, script: str, stdin: bytes, out: bytearray, env: dict[str, str]) -> int:
        inner = Interpreter(self.tree, self.cwd, env)
        try:
            status = inner._sequence(parse(script), stdin, out)
        except ShellSyntaxError as error:
            self.stderr += f"sh: syntax error: {error}\n".encode()
            return 2
        except Exit as done:
            status = done.status
        finally:
            self.stderr += inner.stderr
        return status


Utility = Callable[[Interpreter, list[str], bytes, bytearray], int]


def split_flags(args: list[str]) -> tuple[set[str], list[str]]:
    """Short flags (``-rf`` is ``r`` and ``f``) and operands; ``--`` ends the flags."""
    flags: set[str] = set()
    operands: list[str] = []
    ended = False
    for arg in args:
        if not ended and arg == "--":
            ended = True
        elif not ended and arg.startswith("-") and len(arg) > 1:
            flags.update(arg[1:])
        else:
            operands.append(arg)
    return flags, operands
