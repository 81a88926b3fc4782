"""Workspace push of a many-file tree on the local service, against ``tar c`` into one raw POST.

The tree (``tree_files`` files of random bytes, ``tree_bytes`` in all, 100 files a
directory) is pushed by ours with ``Sandbox.push()``: archives of up to 5,000
members, cut from the walk as it goes, each a streamed ``POST /files`` into the
sandbox's ``/tmp`` and unpacked by a command while the next one is sent; the last
unpack marks the push. The floor is ``tar c`` of the same tree piped, piece by piece, into
one chunked ``POST /files`` of the same bytes on a plain socket (it does not unpack).
Both run side by side in alternating rounds on the same service, behind a delay
proxy at ``rtt_ms``; ours is checked once by counting the files that arrived.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator

from benchmarks.file_clients import RawFileSocket, ours_sandbox, raw_sandbox
from benchmarks.file_sizes import FILE_SIZES, MIB
from benchmarks.file_transfer import SERVER, served
from benchmarks.local_service import unavailable
from benchmarks.report import Role, ScenarioResult, summarize, with_ratios
from benchmarks.rounds import Context, alternate, timed
from piship_remote.sandbox.activation import Sandbox

__all__ = ["NAME", "make_tree", "run"]

NAME = "push"
_PER_DIRECTORY = 100
_PIPE_PIECE = 1024 * 1024
_FLOOR_ARCHIVE = "/tmp/bench-floor.tar"


def make_tree(root: str, files: int, total: int) -> None:
    """``files`` files of random bytes, ``total`` bytes in all, ``_PER_DIRECTORY`` a directory."""
    block = os.urandom(MIB)
    each = total // files
    for index in range(files):
        directory = os.path.join(root, f"d{index // _PER_DIRECTORY:04d}")
        if index % _PER_DIRECTORY == 0:
            os.makedirs(directory)
        start = (index * 4099) % max(1, MIB - each)
        with open(os.path.join(directory, f"f{index:05d}.dat"), "wb") as out:
            out.write(block[start : start + each])


class OursPush:
    name = "ours-sandbox"
    role: Role = "ours"

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    def push(self, tree: str) -> None:
        self.sandbox.push()


class TarPost:
    """``tar c`` of the tree, its output sent as it comes in one chunked POST."""

    name = "tar-post-raw"
    role: Role = "floor"

    def __init__(self, socket_client: RawFileSocket) -> None:
        self.socket = socket_client

    def push(self, tree: str) -> None:
        with subprocess.Popen(["tar", "-c", "-C", tree, "."], stdout=subprocess.PIPE) as tar:
            assert tar.stdout is not None
            self.socket.upload_stream(_FLOOR_ARCHIVE, _pieces(tar.stdout.fileno()))
        if tar.returncode != 0:
            raise RuntimeError(f"tar-post-raw: tar exited {tar.returncode}")


def _pieces(fd: int) -> Iterator[bytes]:
    while piece := os.read(fd, _PIPE_PIECE):
        yield piece


def run(context: Context) -> ScenarioResult:
    """Rows of push wall time (ms) for ours and the floor."""
    began = time.perf_counter()
    problem = unavailable()
    if problem is not None:
        return ScenarioResult(NAME, skipped=(f"the local service cannot run here: {problem}",))
    size = FILE_SIZES[context.size.name]
    skipped: list[str] = []
    with (
        tempfile.TemporaryDirectory(prefix="piship-bench-tree-", dir=context.workspace) as tree,
        served(context, size.disk_mib) as (service, url),
        contextlib.ExitStack() as stack,
    ):
        make_tree(tree, size.tree_files, size.tree_bytes)
        ours = OursPush(ours_sandbox(url, service.api_key, tree, stack))
        floor = TarPost(raw_sandbox(url, service.api_key, stack))
        clients: list[OursPush | TarPost] = [ours, floor]
        samples = alternate(
            clients, rounds=size.push_rounds, measure=lambda client: [timed(client.push, tree)]
        )
        counted: list[bytes] = []
        ours.sandbox.exec("find . -type f | wc -l", on_data=counted.append)
        arrived = b"".join(counted).decode().strip()
        if arrived != str(size.tree_files):
            skipped.append(f"ours-sandbox: {arrived} of {size.tree_files} files arrived")
    rows = [
        summarize(
            NAME,
            SERVER,
            client.name,
            client.role,
            samples[client.name],
            unit="ms",
            extra={"files": size.tree_files, "MB": size.tree_bytes // 1_000_000},
        )
        for client in clients
    ]
    return ScenarioResult(
        name=NAME,
        rows=with_ratios(rows),
        skipped=tuple(skipped),
        notes=(
            "ours: Sandbox.push() (archive POSTs, each unpacked while the next is sent); "
            "x floor is tar c piped into one chunked POST /files of the same bytes (no unpack)",
        ),
        seconds=time.perf_counter() - began,
    )
