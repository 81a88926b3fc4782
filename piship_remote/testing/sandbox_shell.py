"""A small POSIX shell over a double's in-memory tree: what the library's helper commands do.

The library moves directories by uploading a tar and running ``tar`` in the sandbox,
asks ``pwd``, stats with ``[ -d … ]``, lists with ``find``… A double runs no command on
the host: it interprets these scripts against its tree instead::

    shell = Shell(tree, cwd="/home/user")
    if shell.understands(script):
        result = shell.run(script)      # ShellResult(exit_code, stdout, stderr)

The grammar is the part of ``sh`` such scripts use: ``;``, ``&&``, ``||``, ``|``,
``{ …; }``, ``if/elif/else/fi``, quotes, ``$?``, ``$NAME``, ``$(…)``, redirections
``< > >> 2>/dev/null``, ``NAME=value``. :mod:`~piship_remote.testing.sandbox_interpreter`
runs it; the utilities are in :data:`~piship_remote.testing.sandbox_utilities.UTILITIES`
(``find`` and ``tar`` in modules of their own). It covers every helper of
:mod:`piship_remote.backends._sandbox_commands`
(``tests/testing/test_double_shell.py`` checks each).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import attrs

from piship_remote.backends._sandbox_commands import STAGING_PREFIX
from piship_remote.testing.sandbox_tree import ShellTree

__all__ = ["STAGING", "Shell", "ShellResult", "ShellSyntaxError", "script_of"]

STAGING = f"/{STAGING_PREFIX}"
"""What the library's archive transfers name (their staged tars and sync stamps): a script
naming it runs in the tree even beside a test's own ``command``/``execute`` answers,
which cannot act on the tree."""

_OPERATORS = ("&&", "||", ">>", "2>&1", "2>", ";", "|", "<", ">", "\n", "(", ")")
_KEYWORDS = frozenset({"if", "then", "elif", "else", "fi", "{", "}"})
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


class ShellSyntaxError(ValueError):
    """A script outside the grammar this shell knows."""


@attrs.frozen
class ShellResult:
    exit_code: int
    stdout: bytes
    stderr: bytes

    def answer(self) -> dict[str, Any]:
        """The result as a double's command answer."""
        return {"stdout": self.stdout, "stderr": self.stderr, "exit_code": self.exit_code}


def script_of(args: object) -> str | None:
    """The script of a ``sh -c SCRIPT`` argument list (``-l`` and the like before it)."""
    if not isinstance(args, list) or "-c" not in args:
        return None
    after = args.index("-c") + 1
    script = args[after] if after < len(args) else None
    return script if isinstance(script, str) else None


# A word is a list of pieces: ("lit", text), quoted ("q", text), ("var", name) or
# ("sub", script).
Piece = tuple[str, str]
Word = tuple[Piece, ...]


@attrs.frozen
class _Op:
    text: str


Token = Word | _Op


def tokenize(script: str) -> list[Token]:
    """Words and operators of ``script``; quotes kept as literal pieces."""
    tokens: list[Token] = []
    i, n = 0, len(script)
    while i < n:
        c = script[i]
        if c in " \t":
            i += 1
            continue
        if c == "#":
            while i < n and script[i] != "\n":
                i += 1
            continue
        op = next((o for o in _OPERATORS if script.startswith(o, i)), None)
        if op is None and c == "&":
            raise ShellSyntaxError("background jobs (&) are not supported")
        if op is not None:
            tokens.append(_Op(";" if op == "\n" else op))
            i += len(op)
            continue
        word, i = _word(script, i)
        tokens.append(word)
    return tokens


def _word(script: str, i: int) -> tuple[Word, int]:
    pieces: list[Piece] = []
    n = len(script)
    while i < n:
        c = script[i]
        if c in " \t\n;&|<>()":
            break
        if c == "'":
            end = script.find("'", i + 1)
            if end < 0:
                raise ShellSyntaxError("an unterminated ' quote")
            pieces.append(("q", script[i + 1 : end]))
            i = end + 1
        elif c == '"':
            i = _double_quoted(script, i + 1, pieces)
        elif c == "\\":
            pieces.append(("q", script[i + 1 : i + 2]))
            i += 2
        elif c == "$":
            i = _dollar(script, i, pieces)
        else:
            pieces.append(("lit", c))
            i += 1
    return tuple(pieces), i


def _double_quoted(script: str, i: int, pieces: list[Piece]) -> int:
    n = len(script)
    pieces.append(("q", ""))  # "" is a word even when empty
    while i < n and script[i] != '"':
        c = script[i]
        if c == "\\" and i + 1 < n and script[i + 1] in '"\\$`':
            pieces.append(("q", script[i + 1]))
            i += 2
        elif c == "$":
            i = _dollar(script, i, pieces)
        else:
            pieces.append(("q", c))
            i += 1
    if i >= n:
        raise ShellSyntaxError('an unterminated " quote')
    return i + 1


def _dollar(script: str, i: int, pieces: list[Piece]) -> int:
    rest = script[i + 1 :]
    if rest.startswith("("):
        depth, j = 0, i + 1
        while j < len(script):
            depth += {"(": 1, ")": -1}.get(script[j], 0)
            if depth == 0:
                pieces.append(("sub", script[i + 2 : j]))
                return j + 1
            j += 1
        raise ShellSyntaxError("an unterminated $(")
    if rest[:1] == "?":
        pieces.append(("var", "?"))
        return i + 2
    if rest[:1] == "{":
        end = script.find("}", i)
        pieces.append(("var", script[i + 2 : end]))
        return end + 1
    j = i + 1
    while j < len(script) and script[j] in _NAME_CHARS:
        j += 1
    if j == i + 1:
        pieces.append(("lit", "$"))
        return j
    pieces.append(("var", script[i + 1 : j]))
    return j


# ---- the syntax tree --------------------------------------------------------------------


@attrs.frozen
class Simple:
    assignments: tuple[tuple[str, Word], ...]
    words: tuple[Word, ...]
    redirects: tuple[tuple[str, Word], ...]


@attrs.frozen
class Group:
    body: Any


@attrs.frozen
class If:
    branches: tuple[tuple[Any, Any], ...]
    otherwise: Any


@attrs.frozen
class Pipeline:
    commands: tuple[Any, ...]
    negated: bool = False


@attrs.frozen
class AndOr:
    first: Pipeline
    rest: tuple[tuple[str, Pipeline], ...]


@attrs.frozen
class CommandList:
    items: tuple[AndOr, ...]


def literal(word: Word) -> str | None:
    """The word's text when it has no expansion."""
    if all(kind in ("lit", "q") for kind, _ in word):
        return "".join(text for _, text in word)
    return None


class _Parser:
    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.at = 0

    def peek(self) -> Token | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def keyword(self) -> str | None:
        token = self.peek()
        if isinstance(token, tuple):
            text = literal(token)
            if text in _KEYWORDS and all(kind == "lit" for kind, _ in token):
                return text
        return None

    def expect(self, keyword: str) -> None:
        if self.keyword() != keyword:
            raise ShellSyntaxError(f"expected {keyword}")
        self.at += 1

    def sequence(self, *ends: str) -> CommandList:
        items: list[AndOr] = []
        while True:
            while isinstance(self.peek(), _Op) and self.peek() == _Op(";"):
                self.at += 1
            if self.peek() is None or self.keyword() in ends:
                return CommandList(tuple(items))
            items.append(self.and_or())
            token = self.peek()
            if isinstance(token, _Op) and token.text == ";":
                continue
            if token is None or self.keyword() in ends:
                return CommandList(tuple(items))
            raise ShellSyntaxError(f"unexpected {token!r}")

    def and_or(self) -> AndOr:
        first = self.pipeline()
        rest: list[tuple[str, Pipeline]] = []
        while isinstance(self.peek(), _Op) and self.peek() in (_Op("&&"), _Op("||")):
            op = self.tokens[self.at]
            assert isinstance(op, _Op)
            self.at += 1
            while self.peek() == _Op(";"):
                raise ShellSyntaxError("a command must follow && or ||")
            rest.append((op.text, self.pipeline()))
        return AndOr(first, tuple(rest))

    def pipeline(self) -> Pipeline:
        negated = False
        if self.keyword() is None and isinstance(self.peek(), tuple):
            token = self.peek()
            assert isinstance(token, tuple)
            if literal(token) == "!":
                negated = True
                self.at += 1
        commands = [self.command()]
        while self.peek() == _Op("|"):
            self.at += 1
            commands.append(self.command())
        return Pipeline(tuple(commands), negated)

    def command(self) -> Any:
        keyword = self.keyword()
        if keyword == "{":
            self.at += 1
            body = self.sequence("}")
            self.expect("}")
            return Group(body)
        if keyword == "if":
            return self.if_clause()
        if keyword is not None:
            raise ShellSyntaxError(f"unexpected {keyword}")
        return self.simple()

    def if_clause(self) -> If:
        branches: list[tuple[CommandList, CommandList]] = []
        otherwise: CommandList | None = None
        self.expect("if")
        while True:
            condition = self.sequence("then")
            self.expect("then")
            body = self.sequence("elif", "else", "fi")
            branches.append((condition, body))
            keyword = self.keyword()
            self.at += 1
            if keyword == "elif":
                continue
            if keyword == "else":
                otherwise = self.sequence("fi")
                self.expect("fi")
            elif keyword != "fi":
                raise ShellSyntaxError("expected fi")
            return If(tuple(branches), otherwise)

    def simple(self) -> Simple:
        assignments: list[tuple[str, Word]] = []
        words: list[Word] = []
        redirects: list[tuple[str, Word]] = []
        while True:
            token = self.peek()
            if isinstance(token, _Op):
                if token.text in ("<", ">", ">>", "2>"):
                    self.at += 1
                    target = self.peek()
                    if not isinstance(target, tuple):
                        raise ShellSyntaxError(f"{token.text} needs a file")
                    redirects.append((token.text, target))
                    self.at += 1
                    continue
                if token.text == "2>&1":
                    self.at += 1
                    redirects.append(("2>&1", ()))
                    continue
                break
            if token is None:
                break
            assignment = _assignment(token) if not words else None
            if assignment is not None:
                assignments.append(assignment)
            else:
                words.append(token)
            self.at += 1
        if not words and not assignments:
            raise ShellSyntaxError("an empty command")
        return Simple(tuple(assignments), tuple(words), tuple(redirects))


def _assignment(word: Word) -> tuple[str, Word] | None:
    if not word or word[0][0] != "lit":
        return None
    head = "".join(text for kind, text in _leading_literals(word))
    name, equals, _ = head.partition("=")
    if not equals or not name or not set(name) <= _NAME_CHARS or name[0].isdigit():
        return None
    remaining: list[Piece] = []
    skipped = len(name) + 1
    for kind, text in word:
        if kind == "lit" and skipped:
            cut = min(skipped, len(text))
            skipped -= cut
            text = text[cut:]
            if not text:
                continue
        remaining.append((kind, text))
    return name, tuple(remaining)


def _leading_literals(word: Word) -> Iterator[Piece]:
    for piece in word:
        if piece[0] != "lit":
            return
        yield piece


def parse(script: str) -> CommandList:
    parser = _Parser(tokenize(script))
    tree = parser.sequence()
    if parser.peek() is not None:
        raise ShellSyntaxError(f"unexpected {parser.peek()!r}")
    return tree


def utilities(tree: Any) -> Iterator[str | None]:
    """Every utility name the script may run (``None`` for one named by an expansion)."""
    if isinstance(tree, CommandList):
        for item in tree.items:
            yield from utilities(item)
    elif isinstance(tree, AndOr):
        yield from utilities(tree.first)
        for _, pipeline in tree.rest:
            yield from utilities(pipeline)
    elif isinstance(tree, Pipeline):
        for command in tree.commands:
            yield from utilities(command)
    elif isinstance(tree, Group):
        yield from utilities(tree.body)
    elif isinstance(tree, If):
        for condition, body in tree.branches:
            yield from utilities(condition)
            yield from utilities(body)
        if tree.otherwise is not None:
            yield from utilities(tree.otherwise)
    elif isinstance(tree, Simple):
        for word in (*tree.words, *(value for _, value in tree.assignments)):
            for kind, text in word:
                if kind == "sub":
                    yield from utilities(parse(text))
        if tree.words:
            yield from _argv_utilities([literal(word) for word in tree.words])


def _argv_utilities(argv: Sequence[str | None]) -> Iterator[str | None]:
    """The utilities an argv runs, looking through ``env`` and ``sh -c``."""
    name = argv[0]
    yield name
    if name == "env":
        rest = argv[1:]
        while rest and rest[0] is not None and "=" in rest[0]:
            rest = rest[1:]
        if rest:
            yield from _argv_utilities(rest)
    elif name is not None and name.rsplit("/", 1)[-1] in ("sh", "bash") and "-c" in argv:
        script = argv[argv.index("-c") + 1] if argv.index("-c") + 1 < len(argv) else None
        if script is None:
            yield None
        else:
            yield from utilities(parse(script))


def understood(tree: Any, known: frozenset[str]) -> bool:
    try:
        return all(name is not None and _base(name) in known for name in utilities(tree))
    except ShellSyntaxError:
        return False


def _base(name: str) -> str:
    return name.rsplit("/", 1)[-1] if name.startswith("/") else name


class Shell:
    """Runs scripts against ``tree``, starting in ``cwd``."""

    def __init__(self, tree: ShellTree, cwd: str) -> None:
        self.tree = tree
        self.cwd = cwd

    def understands(self, script: str, known: frozenset[str] | None = None) -> bool:
        """Whether every utility ``script`` names is one this shell runs."""
        from piship_remote.testing.sandbox_utilities import UTILITIES

        try:
            tree = parse(script)
        except ShellSyntaxError:
            return False
        return understood(tree, known if known is not None else frozenset(UTILITIES))

    def takes(self, script: str, everything: bool) -> bool:
        """Whether a double runs ``script`` here: every script it understands when
        ``everything``, else only the library's archive transfers (:data:`STAGING`)."""
        return self.understands(script) and (everything or STAGING in script)

    def takes_argv(self, argv: list[str], everything: bool) -> bool:
        """:meth:`takes` for an argv run without a shell (``env … /bin/sh -c SCRIPT``)."""
        if not argv or not self.understands_argv(argv):
            return False
        return everything or any(STAGING in arg for arg in argv)

    def understands_argv(self, argv: list[str]) -> bool:
        from piship_remote.testing.sandbox_utilities import UTILITIES

        try:
            names = list(_argv_utilities(list(argv)))
        except ShellSyntaxError:
            return False
        return all(name is not None and _base(name) in UTILITIES for name in names)

    def run(self, script: str, env: dict[str, str] | None = None) -> ShellResult:
        from piship_remote.testing.sandbox_interpreter import Interpreter

        return Interpreter(self.tree, self.cwd, dict(env or {})).script(script)

    def run_argv(self, argv: list[str]) -> ShellResult:
        """Run an argv without a shell (as a runtime that splits a command line does)."""
        from piship_remote.testing.sandbox_interpreter import Interpreter

        return Interpreter(self.tree, self.cwd, {}).argv(argv)
