"""The utilities of the doubles' in-memory shell, and the interpreter that runs its syntax tree.

Each utility takes its arguments and standard input and returns an exit status; it
writes standard output and error through the interpreter, the way the GNU tools do
for the options the library's helper commands (and simple user commands) use.
"""

from __future__ import annotations

import posixpath
import tarfile
from collections.abc import Callable
from typing import Any

from piship_remote.errors import PiShipError
from piship_remote.testing.sandbox_archive import pack, unpack
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

__all__ = ["UTILITIES", "Interpreter"]


class _Exit(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class _Failed(Exception):
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
        except _Exit as done:
            status = done.status
        return ShellResult(status, bytes(self.stdout), bytes(self.stderr))

    def argv(self, argv: list[str]) -> ShellResult:
        try:
            status = self._utility(argv, b"", self.stdout)
        except _Exit as done:
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
                before = self.tree.read_file(target) if append and self._is("file", target) else b""
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
        name = argv[0].rsplit("/", 1)[-1] if argv[0].startswith("/") else argv[0]
        utility = UTILITIES.get(name)
        if utility is None:
            self.stderr += f"sh: {argv[0]}: not found\n".encode()
            return 127
        try:
            return utility(self, argv[1:], stdin, out)
        except _Failed as failed:
            self.stderr += f"{name}: {failed}\n".encode()
            return failed.status
        except OSError as error:
            where = f"'{error.filename}': " if error.filename else ""
            self.stderr += f"{name}: {where}{error.strerror or error}\n".encode()
            return 1

    def path(self, raw: str) -> str:
        return posixpath.normpath(posixpath.join(self.cwd, raw)) if raw else self.cwd

    def _is(self, kind: str, path: str) -> bool:
        return self.tree.kind(path) == kind

    def nested(self, script: str, stdin: bytes, out: bytearray, env: dict[str, str]) -> int:
        inner = Interpreter(self.tree, self.cwd, env)
        try:
            status = inner._sequence(parse(script), stdin, out)
        except ShellSyntaxError as error:
            self.stderr += f"sh: syntax error: {error}\n".encode()
            return 2
        except _Exit as done:
            status = done.status
        finally:
            self.stderr += inner.stderr
        return status


Utility = Callable[[Interpreter, list[str], bytes, bytearray], int]


def _split(args: list[str]) -> tuple[set[str], list[str]]:
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


def _true(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    return 0


def _false(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    return 1


def _exit(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    raise _Exit(int(args[0]) if args and args[0].lstrip("-").isdigit() else int(shell.vars["?"]))


def _echo(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    newline = not (args and args[0] == "-n")
    out += (" ".join(args[1:] if not newline else args) + ("\n" if newline else "")).encode()
    return 0


def _pwd(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    out += f"{shell.cwd}\n".encode()
    return 0


def _cd(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    _, operands = _split(args)
    target = shell.path(operands[0] if operands else "/")
    if not shell._is("dir", target):
        raise _Failed(f"can't cd to {operands[0] if operands else '/'}", 2)
    shell.cwd = target
    return 0


def _test(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    if args and args[-1] == "]":
        args = args[:-1]
    negate = bool(args) and args[0] == "!"
    if negate:
        args = args[1:]
    if len(args) == 2 and args[0] in ("-d", "-f", "-e", "-L", "-h", "-s"):
        kind = shell.tree.kind(shell.path(args[1]))
        result = {
            "-d": kind == "dir",
            "-f": kind == "file",
            "-e": kind is not None,
            "-s": kind == "file" and bool(shell.tree.read_file(shell.path(args[1]))),
        }.get(args[0], False)  # the in-memory tree holds no links
    elif len(args) == 2 and args[0] in ("-n", "-z"):
        result = bool(args[1]) == (args[0] == "-n")
    elif len(args) == 3 and args[1] in ("=", "!="):
        result = (args[0] == args[2]) == (args[1] == "=")
    elif len(args) == 1:
        result = bool(args[0])
    else:
        raise _Failed(f"unsupported test: {' '.join(args)}", 2)
    return int(result == negate)


def _mkdir(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    flags, operands = _split(args)
    for operand in operands:
        path = shell.path(operand)
        if "p" in flags:
            _make_parents(shell.tree, path)
        else:
            shell.tree.make_dir(path)
    return 0


def _make_parents(tree: ShellTree, path: str) -> None:
    kind = tree.kind(path)
    if kind == "dir":
        return
    if kind == "file":
        raise FileExistsError(17, "File exists", path)
    _make_parents(tree, posixpath.dirname(path))
    tree.make_dir(path)


def _rm(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    flags, operands = _split(args)
    status = 0
    for operand in operands:
        path = shell.path(operand)
        kind = shell.tree.kind(path)
        if kind is None:
            if "f" not in flags:
                shell.stderr += (
                    f"rm: cannot remove '{operand}': No such file or directory\n".encode()
                )
                status = 1
            continue
        if kind == "dir" and not flags & {"r", "R"}:
            shell.stderr += f"rm: cannot remove '{operand}': Is a directory\n".encode()
            status = 1
            continue
        shell.tree.remove(path)
    return status


def _touch(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    for operand in _split(args)[1]:
        shell.tree.touch(shell.path(operand))
    return 0


def _cat(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    operands = _split(args)[1]
    if not operands:
        out += stdin
    for operand in operands:
        out += shell.tree.read_file(shell.path(operand))
    return 0


def _wc(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    flags, operands = _split(args)
    if flags != {"c"}:
        raise _Failed("only wc -c is supported")
    if not operands:
        out += f"{len(stdin)}\n".encode()
    for operand in operands:
        out += f"{len(shell.tree.read_file(shell.path(operand)))} {operand}\n".encode()
    return 0


def _copy(shell: Interpreter, args: list[str], *, move: bool) -> int:
    flags, operands = _split(args)
    if len(operands) != 2:
        raise _Failed("exactly one source and one destination are supported")
    source, target = shell.path(operands[0]), shell.path(operands[1])
    if shell._is("dir", target):
        target = posixpath.join(target, posixpath.basename(source))
    kind = shell.tree.kind(source)
    if kind is None:
        raise FileNotFoundError(2, "No such file or directory", operands[0])
    if kind == "dir":
        if not move and not flags & {"r", "R", "a"}:
            raise _Failed(f"-r not specified; omitting directory '{operands[0]}'")
        _copy_tree(shell.tree, source, target, keep_times=move)
    else:
        kept = shell.tree.mtime(source) if move else None  # cp makes new files, mv keeps them
        shell.tree.write_file(target, shell.tree.read_file(source), kept)
    if move:
        shell.tree.remove(source)
    return 0


def _copy_tree(tree: ShellTree, source: str, target: str, *, keep_times: bool) -> None:
    if tree.kind(target) is None:
        tree.make_dir(target)
    for name in tree.names(source):
        child, copy = posixpath.join(source, name), posixpath.join(target, name)
        if tree.kind(child) == "dir":
            _copy_tree(tree, child, copy, keep_times=keep_times)
        else:
            kept = tree.mtime(child) if keep_times else None
            tree.write_file(copy, tree.read_file(child), kept)


def _cp(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    return _copy(shell, args, move=False)


def _mv(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    return _copy(shell, args, move=True)


def _env(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    env = dict(shell.vars)
    while args and "=" in args[0] and not args[0].startswith("-"):
        name, _, value = args[0].partition("=")
        env[name] = value
        args = args[1:]
    if not args:
        out += "".join(f"{k}={v}\n" for k, v in env.items() if k != "?").encode()
        return 0
    saved = shell.vars
    shell.vars = env
    try:
        return shell._utility(args, stdin, out)
    finally:
        shell.vars = saved


def _sh(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    rest = [arg for arg in args if arg != "-l"]
    if not rest or rest[0] != "-c" or len(rest) < 2:
        raise _Failed("only sh -c SCRIPT is supported", 2)
    return shell.nested(rest[1], stdin, out, dict(shell.vars))


def _find(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
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


def _walk(tree: ShellTree, shown: str, path: str, depth: int) -> Any:
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
                raise _Failed(f"unknown predicate `{word}'")
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


def _tar(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    mode, archive, directory, names, from_stdin = "", None, shell.cwd, [], False
    null = recursive = True
    null = False
    words = list(args)
    while words:
        word = words.pop(0)
        if word in ("--no-same-owner", "--no-same-permissions", "--numeric-owner"):
            continue
        if word == "--null":
            null = True
        elif word == "--no-recursion":
            recursive = False
        elif word == "-C":
            directory = shell.path(words.pop(0))
        elif word == "-T":
            from_stdin = words.pop(0) == "-"
        elif word.startswith("-") and not word.startswith("--"):
            for letter in word[1:]:
                if letter in "xc":
                    mode = letter
                elif letter == "f":
                    archive = shell.path(words.pop(0))
                elif letter not in "pv":
                    raise _Failed(f"unsupported option -{letter}", 2)
        elif word.startswith("--"):
            raise _Failed(f"unsupported option {word}", 2)
        else:
            names.append(word)
    if archive is None or mode not in ("x", "c"):
        raise _Failed("only tar -xf ARCHIVE and tar -cf ARCHIVE are supported", 2)
    if mode == "x":
        return _extract(shell, archive, directory)
    if from_stdin:
        separator = "\0" if null else "\n"
        names += [n for n in stdin.decode("utf-8", "surrogateescape").split(separator) if n]
    try:
        data = pack(shell.tree, directory, names, recursive=recursive)
    except FileNotFoundError as missing:
        raise _Failed(f"{missing.filename}: {missing.strerror}", 2) from None
    shell.tree.write_file(archive, data)
    return 0


def _extract(shell: Interpreter, archive: str, directory: str) -> int:
    if not shell._is("dir", directory):
        raise _Failed(f"{directory}: Cannot open: No such file or directory", 2)
    try:
        refused = unpack(shell.tree, shell.tree.read_file(archive), directory)
    except (PiShipError, tarfile.TarError) as error:
        raise _Failed(f"This does not look like a tar archive ({error})", 2) from None
    for name in refused:
        shell.stderr += f"tar: {name}: refused (it would land outside {directory})\n".encode()
    return 2 if refused else 0


UTILITIES: dict[str, Utility] = {
    ":": _true,
    "true": _true,
    "false": _false,
    "exit": _exit,
    "echo": _echo,
    "pwd": _pwd,
    "cd": _cd,
    "[": _test,
    "test": _test,
    "mkdir": _mkdir,
    "rm": _rm,
    "touch": _touch,
    "cat": _cat,
    "wc": _wc,
    "cp": _cp,
    "mv": _mv,
    "env": _env,
    "sh": _sh,
    "bash": _sh,
    "find": _find,
    "tar": _tar,
}
