"""Container images for the local service's template tests, made without docker.

:func:`minimal_rootfs` copies a few host programs (a shell, the tools the file API
runs) and the libraries they load into a directory: a root filesystem with no
``/usr`` and no Python. :func:`layer` makes one layer tar; :func:`oci_layout_tar`
and :func:`docker_save_tar` wrap layers as ``skopeo``/``podman save --format oci``
and ``docker save`` write them::

    rootfs = minimal_rootfs(tmp_path / "rootfs")
    base = layer_of_directory(rootfs)
    oci_layout_tar(tmp_path / "app.tar", [base, layer({"etc/motd": b"hi\n"})])
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path

PROGRAMS = (
    "sh", "bash", "cat", "stat", "dirname", "basename", "mkdir", "mv", "rm", "find", "head", "tail",
    "id", "ls", "echo", "sleep", "touch", "ln",
)  # fmt: skip
_LIBRARY = re.compile(r"(/\S+) \(0x")

Entry = bytes | str | None
"""A layer entry: file content (bytes), a symlink target (``"->target"``), or a directory (None)."""


def minimal_rootfs(target: Path, programs: Sequence[str] = PROGRAMS) -> Path:
    """``target`` holding ``/bin/<program>`` copies and their libraries (at their host paths,
    under ``/lib*`` rather than ``/usr``), an ``/etc`` and a ``/tmp``."""
    for name in ("bin", "etc", "tmp", "lib", "lib64"):
        (target / name).mkdir(parents=True, exist_ok=True)
    for program in programs:
        source = shutil.which(program, path="/usr/bin:/bin")
        assert source is not None, f"the host has no {program}"
        shutil.copy2(os.path.realpath(source), target / "bin" / program)
        for library in _libraries(source):
            inside = target / _below_lib(library).lstrip("/")
            inside.parent.mkdir(parents=True, exist_ok=True)
            if not inside.exists():
                shutil.copy2(os.path.realpath(library), inside)
    return target


def _libraries(program: str) -> list[str]:
    listed = subprocess.run(["ldd", program], capture_output=True, text=True, check=False).stdout
    found = _LIBRARY.findall(listed)
    return [path for path in found if os.path.exists(path)]


def _below_lib(path: str) -> str:
    """The library's path with a leading ``/usr`` taken off (the image has no ``/usr``)."""
    return path[len("/usr") :] if path.startswith("/usr/") else path


def layer(entries: Mapping[str, Entry]) -> bytes:
    """One layer tar: ``{"a/b": b"content", "a/l": "->target", "a/d": None}``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, entry in entries.items():
            info = tarfile.TarInfo(name)
            if entry is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif isinstance(entry, str):
                info.type, info.linkname = tarfile.SYMTYPE, entry.removeprefix("->")
                tar.addfile(info)
            else:
                info.size, info.mode = len(entry), 0o755
                tar.addfile(info, io.BytesIO(entry))
    return buffer.getvalue()


def layer_of_directory(root: Path) -> bytes:
    """A layer tar of everything under ``root``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(root.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(root)), recursive=False)
    return buffer.getvalue()


def oci_layout_tar(target: Path, layers: Sequence[bytes]) -> Path:
    """An OCI image layout in a tar (gzip layers), as ``podman save --format oci-archive``."""
    blobs: dict[str, bytes] = {}

    def blob(data: bytes) -> dict[str, object]:
        digest = hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"digest": f"sha256:{digest}", "size": len(data)}

    compressed = [gzip.compress(data, mtime=0) for data in layers]
    config = blob(json.dumps({"architecture": "amd64", "os": "linux"}).encode())
    manifest = {
        "schemaVersion": 2,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
        "layers": [
            {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **blob(data)}
            for data in compressed
        ],
    }
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **blob(json.dumps(manifest).encode()),
            }
        ],
    }
    files = {"oci-layout": b'{"imageLayoutVersion": "1.0.0"}', "index.json": json.dumps(index)}
    files.update({f"blobs/sha256/{digest}": data for digest, data in blobs.items()})
    return _archive(target, files)


def docker_save_tar(target: Path, layers: Sequence[bytes]) -> Path:
    """What ``docker save`` writes: ``manifest.json`` naming each ``<id>/layer.tar``."""
    files: dict[str, bytes | str] = {}
    names = []
    for number, data in enumerate(layers):
        name = f"{number:064x}/layer.tar"
        files[name] = data
        names.append(name)
    files["config.json"] = json.dumps({"architecture": "amd64", "os": "linux"})
    manifest = [{"Config": "config.json", "RepoTags": ["app:latest"], "Layers": names}]
    files["manifest.json"] = json.dumps(manifest)
    return _archive(target, files)


def _archive(target: Path, files: Mapping[str, bytes | str]) -> Path:
    with tarfile.open(target, "w") as tar:
        for name, content in files.items():
            data = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return target
