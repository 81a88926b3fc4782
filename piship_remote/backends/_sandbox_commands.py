"""The helper commands the library runs in a sandbox to move files, as text, in one place.

    run(unpack_command("/tmp/.piship-1.tar", "/home/user", then=stamp_command(stamp)))
    run(pack_changed_command("/home/user", ["."], "/tmp/.piship-2.tar", newer_than=stamp))

Each is a POSIX shell line that starts by fixing ``PATH`` (:data:`HELPER_PATH`), so
the tools are the image's own (``/usr/bin/tar``), never one the sandbox put earlier on
its path. They are run with :data:`HELPER_SHELL` (``/bin/sh -c``): no login shell, so
no ``~/.bash_profile`` or ``/etc/profile`` a sandbox could use to replace them. The
shapes, for a double that recognises them (``Q`` is a ``shlex.quote``d value)::

    PATH=/usr/bin:/bin:/usr/sbin:/sbin; export PATH; <body>

    unpack:   mkdir -p Q && tar -xf Q -C Q --no-same-owner[ && <then>];
              status=$?; rm -f Q; exit $status
    stamp:    touch Q
    pack:     cd Q && find Q... ! -type d[ -newer Q] -print0 2>/dev/null
              | tar --null --no-recursion -cf Q -T -
    tree:     tar -cf Q -C Q .
    listing:  cd Q && find . -type f -print0 && printf %s piship-listing-end
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

__all__ = [
    "HELPER_PATH",
    "HELPER_SHELL",
    "LISTING_END",
    "STAGING_PREFIX",
    "copy_out_command",
    "helper_script",
    "list_dir_command",
    "list_files_command",
    "make_dir_command",
    "move_in_command",
    "pack_changed_command",
    "pack_tree_command",
    "remove_command",
    "stamp_command",
    "stat_command",
    "unpack_command",
    "working_directory_command",
]

HELPER_SHELL = ("/bin/sh", "-c")
HELPER_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"
LISTING_END = "piship-listing-end"
STAGING_PREFIX = ".piship-"
"""How the names of what the library stages in a sandbox begin (archives, sync stamps,
uploads on their way in), so nothing a user keeps there is taken for one."""


def helper_script(body: str) -> str:
    """``body`` run with the fixed :data:`HELPER_PATH`."""
    return f"PATH={HELPER_PATH}; export PATH; {body}"


def unpack_command(archive: str, target: str, then: str = "") -> str:
    """Unpack the tar ``archive`` into ``target`` (made if missing), run ``then`` after a
    good unpack, and remove the archive whatever happened; the unpack's status is kept."""
    after = f" && {then}" if then else ""
    return helper_script(
        f"mkdir -p {_q(target)} && tar -xf {_q(archive)} -C {_q(target)} --no-same-owner{after};"
        f" status=$?; rm -f {_q(archive)}; exit $status"
    )


def stamp_command(stamp: str) -> str:
    """The bare command that marks a push's end (a ``then`` for :func:`unpack_command`)."""
    return f"touch {_q(stamp)}"


def pack_changed_command(
    root: str, starts: Sequence[str], archive: str, *, newer_than: str | None
) -> str:
    """Write the tar ``archive`` of the non-directories below ``starts`` (relative to
    ``root``), only those newer than the file ``newer_than`` when it is given."""
    newer = f" -newer {_q(newer_than)}" if newer_than is not None else ""
    paths = " ".join(_q(start) for start in starts)
    return helper_script(
        f"cd {_q(root)} && find {paths} ! -type d{newer} -print0 2>/dev/null"
        f" | tar --null --no-recursion -cf {_q(archive)} -T -"
    )


def pack_tree_command(source: str, archive: str) -> str:
    """Write the tar ``archive`` of everything in the directory ``source``."""
    return helper_script(f"tar -cf {_q(archive)} -C {_q(source)} .")


def list_files_command(root: str) -> str:
    """Every regular file below ``root`` as ``./relative`` NUL-terminated, then
    :data:`LISTING_END` (missing when the listing was cut)."""
    return helper_script(
        f"cd {_q(root)} && find . -type f -print0 && printf %s {LISTING_END}"
    )


# -- the Kubernetes runtime's file operations that its endpoints do not offer --------------


def working_directory_command() -> str:
    return helper_script("pwd")


def make_dir_command(path: str) -> str:
    """``made``, or ``existed`` when ``path`` already was a directory."""
    q = _q(path)
    return helper_script(f"if [ -d {q} ]; then echo existed; else mkdir -p -- {q} && echo made; fi")


def remove_command(path: str) -> str:
    return helper_script(f"rm -rf -- {_q(path)}")


def move_in_command(source: str, target: str, parent: str) -> str:
    """Move the staged file ``source`` to ``target`` (``parent`` made); ``source`` goes
    either way."""
    s = _q(source)
    return helper_script(
        f"mkdir -p -- {_q(parent)} && mv -f -- {s} {_q(target)}"
        f" || {{ status=$?; rm -f -- {s}; exit $status; }}"
    )


def copy_out_command(source: str, copy: str) -> str:
    """``copied`` once the file ``source`` is copied to ``copy``, else ``missing``."""
    s = _q(source)
    return helper_script(
        f"if [ -f {s} ]; then cp -- {s} {_q(copy)} && echo copied; else echo missing; fi"
    )


def stat_command(path: str) -> str:
    """``<kind> <size>``: ``symlink``, ``dir``, ``file``, ``other`` or ``missing``."""
    q = _q(path)
    return helper_script(
        f"if [ -L {q} ]; then echo symlink 0; elif [ -d {q} ]; then echo dir 0;"
        f" elif [ -f {q} ]; then echo file $(wc -c < {q}); elif [ -e {q} ]; then echo other 0;"
        " else echo missing 0; fi"
    )


def list_dir_command(path: str) -> str:
    """``<type> <size> <name>`` NUL-terminated for each entry, or ``missing``."""
    q = _q(path)
    return helper_script(
        f"[ -d {q} ] || {{ echo missing; exit 0; }};"
        f" find {q} -mindepth 1 -maxdepth 1 -printf '%y %s %f\\0'"
    )


def _q(value: str) -> str:
    return shlex.quote(value)
