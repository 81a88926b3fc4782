"""What following a command's stream costs when nothing is cut: ``exec("true")`` on the
local service with this library against the library before the reattach machinery.

Two copies of one package cannot share a process, so each library runs in a child
process of its own (``python -P``, the library first on ``PYTHONPATH``), both on the
same local service, and they take alternating rounds as the harness's clients do. The
library before is ``git archive`` of :data:`BASELINE_REF` (the commit before issue 46's
reattach) out of this repository::

    with ExecTimer("ours-sandbox", ROOT, url, api_key) as timer:
        timer.batch(25)         # 25 latencies in seconds
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from types import TracebackType

from benchmarks.loopback import ROOT, readline_within, stop_child
from benchmarks.report import Row, summarize, with_ratios
from benchmarks.rounds import alternate

__all__ = ["BASELINE", "BASELINE_REF", "GROUP", "ExecTimer", "baseline_library", "exec_rows"]

BASELINE_REF = "8d7913b"
"""main just before the reattach machinery (issue 46) landed."""
BASELINE = "ours-before-reattach"
GROUP = "exec true, nothing cut"
_READY = "ready "
_STARTUP_TIMEOUT = 120.0
_WARMUP = 10
_TIMER = """
import sys, tempfile, time
import piship_remote
from piship_remote import activate_sandbox
from piship_remote.backends.e2b.backend import E2bCompatibleBackend

url, key = sys.argv[1], sys.argv[2]
backend = E2bCompatibleBackend(
    endpoint=url, envd_url=url, credential=lambda: key, workdir="/home/user", user="user"
)
policy = {"required": True, "network": {"mode": "deny"}}
with tempfile.TemporaryDirectory() as workspace, activate_sandbox(
    policy, backend=backend, workspace=workspace, env={}
) as sandbox:
    for _ in range(int(sys.argv[3])):
        sandbox.exec("true")
    print("ready", piship_remote.__file__, flush=True)
    for line in sys.stdin:
        times = []
        for _ in range(int(line)):
            began = time.perf_counter()
            sandbox.exec("true")
            times.append(time.perf_counter() - began)
        print(" ".join(map(repr, times)), flush=True)
backend.close()
"""


@contextlib.contextmanager
def baseline_library() -> Iterator[str]:
    """A folder holding :data:`BASELINE_REF`'s ``piship_remote``; raises ``OSError`` or
    ``subprocess.CalledProcessError`` when the repository cannot give it."""
    with tempfile.TemporaryDirectory(prefix="piship-bench-baseline-") as folder:
        archive = os.path.join(folder, "library.tar")
        subprocess.run(
            ["git", "-C", str(ROOT), "archive", "-o", archive, BASELINE_REF, "piship_remote"],
            check=True,
            capture_output=True,
        )
        with tarfile.open(archive) as tar:
            tar.extractall(folder, filter="data")
        yield folder


class ExecTimer:
    """A child process with a sandbox of ``library`` on the service, timing ``exec("true")``."""

    def __init__(self, name: str, library: str, url: str, api_key: str) -> None:
        self.name = name
        environment = {**os.environ, "PYTHONPATH": library}
        self._process = subprocess.Popen(
            [sys.executable, "-P", "-c", _TIMER, url, api_key, str(_WARMUP)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=environment,
            cwd=tempfile.gettempdir(),
        )
        assert self._process.stdout is not None
        line = readline_within(self._process.stdout, _STARTUP_TIMEOUT)
        if not line.startswith(_READY):
            self.close()
            raise RuntimeError(f"{name}: the timing child did not start: {line!r}")
        loaded_from = line[len(_READY) :].strip()
        if not loaded_from.startswith(os.path.join(library, "")):
            self.close()
            raise RuntimeError(f"{name}: loaded {loaded_from}, not the library in {library}")

    def batch(self, count: int) -> list[float]:
        """``count`` latencies of ``exec("true")``, in seconds."""
        process = self._process
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(f"{count}\n")
        process.stdin.flush()
        return [float(value) for value in readline_within(process.stdout, 600.0).split()]

    def close(self) -> None:
        stop_child(self._process, 30)

    def __enter__(self) -> ExecTimer:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def exec_rows(
    scenario: str, server: str, url: str, api_key: str, rounds: int, batch: int
) -> tuple[tuple[Row, ...], tuple[str, ...]]:
    """This library's ``exec("true")`` against the one before the reattach machinery,
    alternating rounds of ``batch``; the second item says why the baseline is absent."""
    with contextlib.ExitStack() as stack:
        timers = [stack.enter_context(ExecTimer("ours-sandbox", str(ROOT), url, api_key))]
        skipped: tuple[str, ...] = ()
        try:
            library = stack.enter_context(baseline_library())
            timers.append(stack.enter_context(ExecTimer(BASELINE, library, url, api_key)))
        except (OSError, subprocess.CalledProcessError, RuntimeError) as error:
            skipped = (f"no {BASELINE} row: {BASELINE_REF} could not be loaded ({error})",)
        samples = alternate(timers, rounds=rounds, measure=lambda timer: timer.batch(batch))
        rows = [
            summarize(
                scenario,
                server,
                timer.name,
                "ours" if timer.name == "ours-sandbox" else "reference",
                samples[timer.name],
                unit="ms",
                group=GROUP,
            )
            for timer in timers
        ]
    return with_ratios(rows), skipped
