"""``tar`` in the doubles' in-memory shell: ``-xf`` through the library's safe unpacker,
``-cf`` of named paths or of a ``--null`` list read with ``-T -``."""

from __future__ import annotations

import tarfile

from piship_remote.model.errors import PiShipError
from piship_remote.testing.sandbox_archive import pack, unpack
from piship_remote.testing.sandbox_interpreter import Failed, Interpreter

__all__ = ["tar"]


def tar(shell: Interpreter, args: list[str], stdin: bytes, out: bytearray) -> int:
    mode, archive, directory, names, from_stdin = "", None, shell.cwd, [], False
    null, recursive = False, True
    words = list(args)
    while words:
        word = words.pop(0)
        if word in ("--no-same-owner", "--no-same-permissions", "--numeric-owner"):
            continue  # the in-memory tree keeps no owners or permissions
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
                    raise Failed(f"unsupported option -{letter}", 2)
        elif word.startswith("--"):
            raise Failed(f"unsupported option {word}", 2)
        else:
            names.append(word)
    if archive is None or mode not in ("x", "c"):
        raise Failed("only tar -xf ARCHIVE and tar -cf ARCHIVE are supported", 2)
    if mode == "x":
        return _extract(shell, archive, directory)
    if from_stdin:
        separator = "\0" if null else "\n"
        names += [n for n in stdin.decode("utf-8", "surrogateescape").split(separator) if n]
    try:
        data = pack(shell.tree, directory, names, recursive=recursive)
    except FileNotFoundError as missing:
        raise Failed(f"{missing.filename}: {missing.strerror}", 2) from None
    shell.tree.write_file(archive, data)
    return 0


def _extract(shell: Interpreter, archive: str, directory: str) -> int:
    if not shell.is_a("dir", directory):
        raise Failed(f"{directory}: Cannot open: No such file or directory", 2)
    try:
        refused = unpack(shell.tree, shell.tree.read_file(archive), directory)
    except (PiShipError, tarfile.TarError) as error:
        raise Failed(f"This does not look like a tar archive ({error})", 2) from None
    for skipped in refused:
        shell.stderr += f"tar: {skipped.path}: refused ({skipped.reason})\n".encode()
    return 2 if refused else 0
