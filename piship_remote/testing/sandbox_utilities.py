"""The utilities of the doubles' in-memory shell (``find`` and ``tar`` have their own modules).

Each utility takes its arguments and standard input and returns an exit status; it
writes standard output and error through the interpreter, the way the GNU tools do
for the options the library's helper commands (and simple user commands) use.
"""

from __future__ import annotations

import posixpath

from piship_remote.testing.sandbox_find import find
from piship_remote.testing.sandbox_interpreter import (
    Exit,
    Failed,
    Interpreter,
    Utility,
    split_flags,
)
from piship_remote.testing.sandbox_tar import tar
from piship_remote.testing.sandbox_tree import ShellTree

__all__ = ["UTILITIES"]


def _true(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    return 0


def _false(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    return 1


def _exit(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    raise Exit(int(args[0]) if args and args[0].lstrip("-").isdigit() else int(shell.vars["?"]))


def _echo(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    newline = not (args and args[0] == "-n")
    out += (" ".join(args[1:] if not newline else args) + ("\n" if newline else "")).encode()
    return 0


def _printf(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    """``printf FORMAT [ARGUMENT...]``: ``%s``, ``%d``, ``%b``, ``%%`` and the backslash
    escapes; the format is reused while arguments remain, as POSIX says."""
    if not args:
        raise Failed("usage: printf FORMAT [ARGUMENT...]", 2)
    form, values = args[0], list(args[1:])
    while True:
        used = _format(form, values, out)
        if not values or not used:
            return 0


def _format(form: str, values: list[str], out: bytearray) -> bool:
    """Write ``form`` once, taking its arguments from ``values``; whether it took any."""
    used, i = False, 0
    while i < len(form):
        c = form[i]
        if c == "\\" and i + 1 < len(form):
            text, i = _escape(form, i + 1)
            out += text
        elif c == "%" and i + 1 < len(form):
            spec, i = form[i + 1], i + 2
            if spec == "%":
                out += b"%"
                continue
            if spec not in "sdb":
                raise Failed(f"%{spec}: invalid conversion specification")
            used = used or bool(values)
            value = values.pop(0) if values else ""
            if spec == "d":
                if not value.lstrip("+-").isdigit() and value:
                    raise Failed(f"{value}: expected a numeric value")
                out += str(int(value or "0")).encode()
            elif spec == "b":
                out += b"".join(_escapes(value))
            else:
                out += value.encode("utf-8", "surrogateescape")
        else:
            out += c.encode("utf-8", "surrogateescape")
            i += 1
    return used


def _escapes(text: str) -> list[bytes]:
    parts: list[bytes] = []
    i = 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            part, i = _escape(text, i + 1)
        else:
            part, i = text[i].encode("utf-8", "surrogateescape"), i + 1
        parts.append(part)
    return parts


def _escape(text: str, i: int) -> tuple[bytes, int]:
    """The byte of the escape whose letter is at ``text[i]``, and where the text goes on."""
    if text[i] in "01234567":
        end = i + 1
        while end < min(i + 3, len(text)) and text[end] in "01234567":
            end += 1
        return bytes([int(text[i:end], 8) & 0xFF]), end
    named = {"n": b"\n", "t": b"\t", "r": b"\r", "\\": b"\\", "a": b"\a", "f": b"\f", "v": b"\v"}
    return named.get(text[i], b"\\" + text[i].encode()), i + 1


def _export(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    """Every variable already reaches what the script runs; ``NAME=value`` sets one."""
    for arg in args:
        name, equals, value = arg.partition("=")
        if equals:
            shell.vars[name] = value
    return 0


def _pwd(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    out += f"{shell.cwd}\n".encode()
    return 0


def _cd(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    _, operands = split_flags(args)
    target = shell.path(operands[0] if operands else "/")
    if not shell.is_a("dir", target):
        raise Failed(f"can't cd to {operands[0] if operands else '/'}", 2)
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
        raise Failed(f"unsupported test: {' '.join(args)}", 2)
    return int(result == negate)


def _mkdir(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    flags, operands = split_flags(args)
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
    flags, operands = split_flags(args)
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
    for operand in split_flags(args)[1]:
        shell.tree.touch(shell.path(operand))
    return 0


def _cat(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    operands = split_flags(args)[1]
    if not operands:
        out += stdin
    for operand in operands:
        out += shell.tree.read_file(shell.path(operand))
    return 0


def _wc(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    flags, operands = split_flags(args)
    if flags != {"c"}:
        raise Failed("only wc -c is supported")
    if not operands:
        out += f"{len(stdin)}\n".encode()
    for operand in operands:
        out += f"{len(shell.tree.read_file(shell.path(operand)))} {operand}\n".encode()
    return 0


def _copy(shell: Interpreter, args: list[str], *, move: bool) -> int:
    flags, operands = split_flags(args)
    if len(operands) != 2:
        raise Failed("exactly one source and one destination are supported")
    source, target = shell.path(operands[0]), shell.path(operands[1])
    if shell.is_a("dir", target):
        target = posixpath.join(target, posixpath.basename(source))
    kind = shell.tree.kind(source)
    if kind is None:
        raise FileNotFoundError(2, "No such file or directory", operands[0])
    if kind == "dir":
        if not move and not flags & {"r", "R", "a"}:
            raise Failed(f"-r not specified; omitting directory '{operands[0]}'")
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
        raise Failed("only sh -c SCRIPT is supported", 2)
    return shell.nested(rest[1], stdin, out, dict(shell.vars))


UTILITIES: dict[str, Utility] = {
    ":": _true,
    "true": _true,
    "false": _false,
    "exit": _exit,
    "echo": _echo,
    "printf": _printf,
    "export": _export,
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
    "find": find,
    "tar": tar,
}
