"""A sandbox stand-in for file tests: remote paths are host paths, commands run in bash."""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import subprocess
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from piship_remote.backends.base import RemoteFiles
from piship_remote.model.errors import FILE_NOT_FOUND, CommandCancelled, PiShipError
from piship_remote.model.transfer import FileInfo
from piship_remote.sandbox.files import SandboxFiles
from piship_remote.testing.e2b_files import MemoryTree
from piship_remote.testing.k8s_runtime import FileTree
from piship_remote.transport.deadline import Deadline
from piship_remote.wire.e2b_json import unstructure
from piship_remote.wire.envd import ConnectError, EntryInfo
from piship_remote.wire.envd_paths import resolve
from piship_remote.workspace._remote_archives import CommandRunner, RemoteArchives


class DirectoryFiles:
    """``RemoteFiles`` over a host directory (the 'sandbox' working directory)."""

    def __init__(self, root: str, chunk: int = 64 * 1024) -> None:
        self.root = root
        self.chunk = chunk
        self.writes: list[str] = []

    def working_directory(
        self, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> str:
        return self.root

    def stat(
        self, path: str, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> FileInfo | None:
        _check(cancel)
        if not os.path.lexists(path):
            return None
        return _info(path)

    def list_dir(
        self, path: str, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> list[FileInfo]:
        _check(cancel)
        if not os.path.isdir(path):
            raise PiShipError(FILE_NOT_FOUND, f"no directory at {path}")
        return [_info(os.path.join(path, name)) for name in os.listdir(path)]

    def make_dir(
        self, path: str, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> bool:
        existed = os.path.isdir(path)
        os.makedirs(path, exist_ok=True)
        return not existed

    def remove(
        self, path: str, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> None:
        subprocess.run(["rm", "-rf", "--", path], check=True)

    def write(
        self,
        path: str,
        chunks: Iterable[bytes],
        *,
        cancel: threading.Event | None = None,
        deadline: Deadline | None = None,
    ) -> FileInfo:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.writes.append(path)
        with open(path, "wb") as out:
            for chunk in chunks:
                _check(cancel)
                out.write(chunk)
        return _info(path)

    def read(
        self,
        path: str,
        sink: Callable[[bytes], None],
        *,
        cancel: threading.Event | None = None,
        deadline: Deadline | None = None,
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


@contextlib.contextmanager
def small_filesystem(path: Path, size: str, *, read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of ``size`` (``"1m"``) mounted at ``path`` (made), unmounted afterwards;
    skips the test where mounting is not allowed (not root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace')}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def sandbox_files(
    remote: RemoteFiles,
    run: CommandRunner,
    *,
    workspace: str | os.PathLike[str] | None = None,
    read_deny: Sequence[str] = (),
    write_allow: Sequence[str] = (),
) -> SandboxFiles:
    """``SandboxFiles`` over ``remote``, its helper commands run by ``run``."""
    archives = RemoteArchives(remote, run, write_allow=write_allow)
    return SandboxFiles(archives, workspace=workspace, read_deny=read_deny)


def bash_runner(command: str, _call: object = None) -> tuple[int, str]:
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


class EnvdDirectoryTree(MemoryTree):
    """``E2bServer``'s file tree over a real directory: sandbox paths are host paths and the
    home is ``root``, so commands run by :func:`bash_command` see the same files."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.root = root

    def snapshot(self) -> dict[str, bytes]:
        return {
            os.path.join(self.root, k): v for k, v in DirectoryTree(self.root).snapshot().items()
        }

    def read(self, raw: str) -> tuple[int, Any]:
        path = resolve(raw, self.root)
        if os.path.isdir(path):
            return _api_error(400, f"path '{path}' is a directory")
        if not os.path.isfile(path):
            return _api_error(404, f"path '{path}' does not exist")
        with open(path, "rb") as handle:
            return 200, handle.read()

    def write(self, raw: str, data: bytes) -> tuple[int, Any]:
        path = resolve(raw, self.root)
        if os.path.isdir(path):
            return _api_error(400, f"path is a directory: {path}")
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            return _api_error(500, f"error ensuring directories: path is a file: {path}")
        with open(path, "wb") as out:
            out.write(data)
        return 200, [{"path": path, "name": os.path.basename(path), "type": "file"}]

    def rpc(self, method: str, body: Any) -> tuple[int, Any]:
        request = body if isinstance(body, dict) else {}
        path = resolve(str(request.get("path", "")), self.root)
        if method == "Stat":
            if not os.path.lexists(path):
                return _rpc_error("not_found", f"file not found: lstat {path}: no such file")
            return 200, {"entry": _envd_entry(path)}
        if method == "ListDir":
            if not os.path.isdir(path):
                return _rpc_error("not_found", f"path not found: stat {path}: no such file")
            names = sorted(os.listdir(path))
            return 200, {"entries": [_envd_entry(os.path.join(path, name)) for name in names]}
        if method == "MakeDir":
            if os.path.isdir(path):
                return _rpc_error("already_exists", f"directory already exists: {path}")
            try:
                os.makedirs(path)
            except OSError as e:  # envd's answer: the sandbox is fine, the place is not
                refused = e.errno in (errno.EACCES, errno.EPERM)
                code = "permission_denied" if refused else "internal"
                return _rpc_error(code, f"error creating directory: {e.strerror}")
            return 200, {"entry": _envd_entry(path)}
        if method == "Remove":
            subprocess.run(["rm", "-rf", "--", path], check=True)
            return 200, {}
        return _rpc_error("unimplemented", f"filesystem.Filesystem/{method} is not supported")


def _api_error(status: int, message: str) -> tuple[int, Any]:
    return status, {"code": status, "message": message}


def _rpc_error(code: str, message: str) -> tuple[int, Any]:
    status = {
        "not_found": 404,
        "already_exists": 409,
        "permission_denied": 403,
        "internal": 500,
    }.get(code, 501)
    return status, unstructure(ConnectError(code, message))


def _envd_entry(path: str) -> Any:
    linked = os.path.islink(path)
    is_dir = os.path.isdir(path)
    kind = "FILE_TYPE_DIRECTORY" if is_dir else "FILE_TYPE_FILE"
    entry = EntryInfo(
        name=os.path.basename(path),
        type=kind if os.path.exists(path) else "FILE_TYPE_UNSPECIFIED",
        path=path,
        size=str(os.lstat(path).st_size),
        symlink_target=os.readlink(path) if linked else None,
    )
    return unstructure(entry)


def bash_command(root: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A ``command`` for ``E2bServer`` that runs the Start request's process (``/bin/bash -l
    -c <script>``) in its ``cwd`` (default ``root``) with the request's environment."""

    def command(start: dict[str, Any]) -> dict[str, Any]:
        process = start.get("process") or {}
        argv = [str(process.get("cmd", "/bin/bash")), *map(str, process.get("args") or [])]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": root}
        env.update({str(k): str(v) for k, v in (process.get("envs") or {}).items()})
        done = subprocess.run(
            argv,
            cwd=process.get("cwd") or root,
            env=env,
            capture_output=True,
            timeout=60,
            check=False,
        )
        return {"stdout": done.stdout, "stderr": done.stderr, "exit_code": done.returncode}

    return command
