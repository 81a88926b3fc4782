"""Single-file upload and download MB/s on the local service, ours against the SDK and a socket.

Every client has a sandbox on the same local E2B-compatible service (bubblewrap, in a
child process; see :mod:`benchmarks.local_service`), behind a delay proxy of its own
when ``rtt_ms`` is set. Each round, in alternating order, every client uploads the
same host file (random bytes) and downloads it back into a host file; the copy is
checked by size and by its first and last MiB. MB/s is 10^6 bytes per second.

The ``RSS`` rows are ours only: a fresh child process (``python -m
benchmarks.file_transfer``) warms up with 1 MiB, resets VmHWM, then uploads and
downloads the whole file; the row is the peak resident growth in MiB.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from benchmarks.file_clients import FileClient, OursFiles, file_clients, ours_sandbox
from benchmarks.file_sizes import FILE_SIZES, MIB
from benchmarks.local_service import HOME, LocalServiceProcess, unavailable
from benchmarks.loopback import ROOT
from benchmarks.proxy import at_rtt
from benchmarks.report import Row, ScenarioResult, summarize, with_ratios
from benchmarks.rounds import Context, alternate
from benchmarks.sampling import memory_kib, reset_peak_rss

__all__ = ["NAME", "RSS_GROUP", "SERVER", "run", "served"]

NAME = "file_transfer"
SERVER = "local"
RSS_GROUP = "RSS upload+download"
_DIRECTIONS = ("upload", "download")
_CHILD_TIMEOUT = 900.0


@contextlib.contextmanager
def served(
    context: Context, disk_mib: int, *, max_sandboxes: int | None = None
) -> Iterator[tuple[LocalServiceProcess, str]]:
    """The local service and the URL clients use at ``context.rtt_ms``."""
    with (
        LocalServiceProcess(disk_mib, max_sandboxes=max_sandboxes) as service,
        at_rtt(service.url, context.rtt_ms) as url,
    ):
        yield service, url


def random_file(path: str, size: int) -> None:
    """``size`` random bytes (a fresh random MiB repeated: incompressible for any codec)."""
    block = os.urandom(MIB)
    with open(path, "wb") as out:
        for offset in range(0, size, MIB):
            out.write(block[: min(MIB, size - offset)])


def same_file(one: str, other: str) -> bool:
    """Same size, and the same first and last MiB (a cheap check for a GiB)."""
    size = os.path.getsize(one)
    if size != os.path.getsize(other):
        return False
    with open(one, "rb") as a, open(other, "rb") as b:
        if a.read(MIB) != b.read(MIB):
            return False
        a.seek(max(0, size - MIB))
        b.seek(max(0, size - MIB))
        return a.read() == b.read()


def run(context: Context) -> ScenarioResult:
    """Rows of MB/s per direction and client, and ours' RSS growth."""
    began = time.perf_counter()
    problem = unavailable()
    if problem is not None:
        return ScenarioResult(NAME, skipped=(f"the local service cannot run here: {problem}",))
    size = FILE_SIZES[context.size.name]
    problems: list[str] = []
    with (
        tempfile.TemporaryDirectory(prefix="piship-bench-files-", dir=context.workspace) as scratch,
        served(context, size.disk_mib) as (service, url),
        contextlib.ExitStack() as stack,
    ):
        source = os.path.join(scratch, "source.bin")
        random_file(source, size.file_bytes)
        clients, skipped = file_clients(url, service.api_key, context.workspace, stack)
        # One unmeasured round each first: a sandbox's first 1 GiB lands on pages its
        # tmpfs has never held, which would charge that cost to whichever client goes first.
        for client in clients:
            _round(client, source, scratch, problems)
        samples = alternate(
            clients,
            rounds=size.file_rounds,
            measure=lambda client: _round(client, source, scratch, problems),
        )
        rows = [
            summarize(
                NAME,
                SERVER,
                client.name,
                client.role,
                samples[client.name][index::2],
                unit="MB/s",
                group=direction,
                higher_is_better=True,
                extra={"MiB": size.file_bytes // MIB},
            )
            for client in clients
            for index, direction in enumerate(_DIRECTIONS)
        ]
        memory = _child(url, service.api_key, size.file_bytes)
    if "skipped" in memory:
        skipped.append(str(memory["skipped"]))
    else:
        rows.append(_rss_row(memory, size.file_bytes))
    return ScenarioResult(
        name=NAME,
        rows=with_ratios(rows),
        skipped=tuple(skipped + problems),
        notes=(
            f"{size.file_bytes // MIB} MiB host file -> sandbox -> host file per client and round "
            "on the local service; x floor is one octet-stream POST/GET on a plain socket",
        ),
        seconds=time.perf_counter() - began,
    )


def _round(client: FileClient, source: str, scratch: str, problems: list[str]) -> list[float]:
    remote = f"{HOME}/bench-{client.name}.bin"
    copy = os.path.join(scratch, f"copy-{client.name}.bin")
    size = os.path.getsize(source)
    start = time.perf_counter()
    client.upload(source, remote)
    uploaded = time.perf_counter()
    client.download(remote, copy)
    downloaded = time.perf_counter()
    if not same_file(source, copy):
        problems.append(f"{client.name}: the downloaded copy differs from the upload")
    os.unlink(copy)
    return [size / 1e6 / (uploaded - start), size / 1e6 / (downloaded - uploaded)]


def _rss_row(memory: dict[str, Any], total: int) -> Row:
    return summarize(
        NAME,
        SERVER,
        "ours-sandbox",
        "ours",
        [memory["growth_kib"] / 1024],
        unit="MiB",
        group=RSS_GROUP,
        extra={
            "MiB moved": 2 * total // MIB,
            "baseline_MiB": round(memory["baseline_kib"] / 1024, 1),
            "hwm_reset": str(memory["hwm_reset"]),
        },
    )


def _child(url: str, api_key: str, total: int) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "benchmarks.file_transfer",
        "--url",
        url,
        "--api-key",
        api_key,
        "--bytes",
        str(total),
    ]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=_CHILD_TIMEOUT, check=False, cwd=ROOT
        )
    except subprocess.TimeoutExpired:
        return {"skipped": f"RSS: the child did not finish in {_CHILD_TIMEOUT:.0f} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"skipped": f"RSS: the child failed (exit {done.returncode}): {tail}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _measure(url: str, api_key: str, total: int) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="piship-bench-rss-") as scratch,
        contextlib.ExitStack() as stack,
    ):
        client = OursFiles(ours_sandbox(url, api_key, scratch, stack))
        warm, source, copy = (os.path.join(scratch, name) for name in ("warm", "source", "copy"))
        random_file(warm, MIB)
        random_file(source, total)
        client.upload(warm, f"{HOME}/warm.bin")
        client.download(f"{HOME}/warm.bin", copy)
        reset = reset_peak_rss()
        baseline, _ = memory_kib()
        client.upload(source, f"{HOME}/rss.bin")
        client.download(f"{HOME}/rss.bin", copy)
        _, peak = memory_kib()
    return {"baseline_kib": baseline, "growth_kib": max(0, peak - baseline), "hwm_reset": reset}


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--bytes", type=int, required=True)
    args = parser.parse_args()
    print(json.dumps(_measure(args.url, args.api_key, args.bytes)), flush=True)


if __name__ == "__main__":
    _main()
