"""A sandbox stand-in for file tests: remote paths are host paths, commands run in bash."""

from __future__ import annotations

import os
import shlex
import subprocess
import threading
from collections.abc import Callable, Iterable
from typing import Any

from piship_remote.errors import FILE_NOT_FOUND, CommandCancelled, PiShipError
from piship_remote.testing.k8s_runtime import FileTree
from piship_remote.transfer import FileInfo


class DirectoryFiles:
    """``RemoteFiles`` over a host directory (the 'sandbox' working directory)."""

    def __init__(self, root: str, chunk: int = 64 * 1024) -> None:
        self.root = root
        self.chunk = chunk
        self.writes: list[str] = []

    def working_directory(self, *, cancel: threading.Event | None = None) -> str:
        return self.root

    def stat(self, path: str, *, cancel: threading.Event | None = None) -> FileInfo | None:
        _check(cancel)
        if not os.path.lexists(path):
            return None
        return _info(path)

    def list_dir(self, path: str, *, cancel: threading.Event | None = None) -> list[FileInfo]:
        _check(cancel)
        if not os.path.isdir(path):
            raise PiShipError(FILE_NOT_FOUND, f"no directory at {path}")
        return [_info(os.path.join(path, name)) for name in os.listdir(path)]

    def make_dir(self, path: str, *, cancel: threading.Event | None = None) -> bool:
        existed = os.path.isdir(path)
        os.makedirs(path, exist_ok=True)
        return not existed

    def remove(self, path: str, *, cancel: threading.Event | None = None) -> None:
        subprocess.run(["rm", "-rf", "--", path], check=True)

    def write(
        self, path: str, chunks: Iterable[bytes], *, cancel: threading.Event | None = None
    ) -> FileInfo:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.writes.append(path)
        with open(path, "wb") as out:
            for chunk in chunks:
                _check(cancel)
                out.write(chunk)
        return _info(path)

    def read(
        self, path: str, sink: Callable[[bytes], None], *, cancel: threading.Event | None = None
    ) -> int:
        if not os.path.isfile(path):
            raise PiShipError(FILE_NOT_FOUND, f"no file at {path}")
        total = 0
        with open(path, "rb") as handle:
            while data := handle.read(self.chunk):
                _check(cancel)
                sink(data)
                total += len(data)
        return total


def bash_runner(command: str) -> tuple[int, str]:
    done = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=60, check=False
    )
    return done.returncode, done.stdout + done.stderr


def _check(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise CommandCancelled()


def _info(path: str) -> FileInfo:
    kind = (
        "symlink"
        if os.path.islink(path)
        else "dir"
        if os.path.isdir(path)
        else "file"
        if os.path.isfile(path)
        else "other"
    )
    size = os.lstat(path).st_size if kind == "file" else 0
    return FileInfo(path=path, name=os.path.basename(path), type=kind, size=size)


class DirectoryTree(FileTree):
    """The fake runtime's file tree over a real directory, so helper commands see it too."""

    def __init__(self, root: str) -> None:
        super().__init__()
        self.root = root

    def snapshot(self) -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        for directory, _dirs, names in os.walk(self.root):
            for name in names:
                path = os.path.join(directory, name)
                with open(path, "rb") as handle:
                    found[os.path.relpath(path, self.root)] = handle.read()
        return found

    def write(self, path: str, data: bytes) -> None:
        target = os.path.join(self.root, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as out:
            out.write(data)

    def read(self, path: str) -> bytes | None:
        target = os.path.join(self.root, path)
        if not os.path.isfile(target):
            return None
        with open(target, "rb") as handle:
            return handle.read()

    def exists(self, path: str) -> bool:
        return os.path.lexists(os.path.join(self.root, path))

    def entries(self, path: str) -> list[dict[str, Any]] | None:
        target = os.path.join(self.root, path)
        if not os.path.isdir(target):
            return None
        return [
            {
                "name": entry.name,
                "size": entry.stat().st_size,
                "type": "directory" if entry.is_dir() else "file",
                "mod_time": entry.stat().st_mtime,
            }
            for entry in os.scandir(target)
        ]


def shell_execute(root: str) -> Callable[[str], dict[str, Any]]:
    """An ``execute`` for ``KubernetesServer`` that runs the command in ``root``, like the runtime
    (split like a POSIX shell, run without one)."""

    def execute(command: str) -> dict[str, Any]:
        done = subprocess.run(
            shlex.split(command), cwd=root, capture_output=True, timeout=60, check=False
        )
        return {
            "stdout": done.stdout.decode("utf-8", "replace"),
            "stderr": done.stderr.decode("utf-8", "replace"),
            "exit_code": done.returncode,
        }

    return execute
