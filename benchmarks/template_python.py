"""A Python's start in a local template sandbox, against the same Python on the host.

An image's ``.pyc`` files are valid only while each source keeps its modification time;
a template whose files all carried the unpack time made every Python start recompile
what it imports (the root is read-only, so nothing is ever cached). Each sample is one
``python3 -c 'import json, argparse, subprocess'``, timed by a parent Python in the
same place:

- ``host`` (the reference): the host's ``/usr/bin/python3``;
- ``template``: the same interpreter and standard library copied (times kept) into a
  folder, offered by a local service as a template and run in its sandbox;
- ``template-unpack-time`` (for contrast): that folder with every file stamped with
  the time of the copy, as templates were before they kept times.

Goal: ``template`` at most 1.2x ``host``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time

from benchmarks.local_service import HOME, USER, unavailable
from benchmarks.report import Row, ScenarioResult, summarize, with_ratios
from benchmarks.rounds import Context
from piship_remote.backends.e2b.backend import E2bCompatibleBackend
from piship_remote.sandbox.activation import activate_sandbox

__all__ = ["NAME", "SERVER", "run"]

NAME = "template_python_start"
SERVER = "local"
PYTHON = "/usr/bin/python3"
STARTED = "import json, argparse, subprocess"
_TIMER = (
    "import subprocess, sys, time\n"
    "for _ in range(int(sys.argv[1])):\n"
    "    began = time.perf_counter()\n"
    f"    subprocess.run([sys.executable, '-c', {STARTED!r}], check=True)\n"
    "    print(time.perf_counter() - began)\n"
)
_LIBRARY = re.compile(r"(/\S+) \(0x")
_DENY = {"required": True, "network": {"mode": "deny"}}


def run(context: Context) -> ScenarioResult:
    """One row per place: the start of ``python3 -c 'import json, ...'``, in ms."""
    began = time.perf_counter()
    problem = unavailable()
    if problem is not None:
        return ScenarioResult(NAME, skipped=(f"the local service cannot run here: {problem}",))
    if not os.path.isfile(PYTHON):
        return ScenarioResult(NAME, skipped=(f"no {PYTHON} on this host to compare with",))
    samples = context.size.exec_calls
    with tempfile.TemporaryDirectory(prefix="piship-bench-template-") as scratch:
        kept = _python_root(os.path.join(scratch, "kept"))
        stamped = _stamped_copy(kept, os.path.join(scratch, "stamped"))
        host = _timed_starts([PYTHON, "-c", _TIMER, str(samples)])
        in_template = _in_sandbox({"kept": kept, "stamped": stamped}, samples, context.workspace)
    rows: list[Row] = [
        summarize(NAME, SERVER, "host", "reference", host, unit="ms"),
        summarize(NAME, SERVER, "template", "ours", in_template["kept"], unit="ms"),
        summarize(NAME, SERVER, "template-unpack-time", "floor", in_template["stamped"], unit="ms"),
    ]
    return ScenarioResult(
        name=NAME,
        rows=with_ratios(rows),
        notes=(
            f"one {STARTED!r} per sample, timed by a parent Python in the same place; the "
            "unpack-time row (the files stamped with the copy's time) is what templates did "
            "before they kept times, shown as 'floor' only to be compared with",
        ),
        seconds=time.perf_counter() - began,
    )


def _python_root(root: str) -> str:
    """A root filesystem holding the host's Python, its standard library and ``bash``,
    with the libraries they load, every file keeping its time."""
    real = os.path.realpath(PYTHON)
    library = os.path.join("/usr/lib", os.path.basename(real))
    programs = [real, os.path.realpath("/bin/bash")]
    paths = [*programs, *(lib for program in programs for lib in _libraries(program))]
    for path in paths:
        _copy_file(path, root)
    shutil.copytree(library, root + library, symlinks=True)
    os.symlink(os.path.basename(real), root + "/usr/bin/python3")
    os.makedirs(root + "/bin", exist_ok=True)
    if not os.path.lexists(root + "/bin/bash"):
        os.symlink("/usr/bin/bash", root + "/bin/bash")
    os.makedirs(root + "/etc", exist_ok=True)
    os.makedirs(root + "/tmp", exist_ok=True)
    for folder, _, _ in os.walk(root):  # whatever the umask: a sandbox user may enter
        os.chmod(folder, 0o755)
    return root


def _copy_file(path: str, root: str) -> None:
    target = root + path
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if not os.path.exists(target):
        shutil.copy2(path, target)


def _libraries(program: str) -> list[str]:
    """The libraries (and the loader) ``program`` loads, at the paths it names them by."""
    listed = subprocess.run(["ldd", program], capture_output=True, text=True, check=False).stdout
    return [path for path in _LIBRARY.findall(listed) if os.path.exists(path)]


def _stamped_copy(root: str, target: str) -> str:
    """``root`` copied with its modes, every file's time the copy's own."""
    shutil.copytree(root, target, symlinks=True, copy_function=shutil.copy)
    return target


def _timed_starts(argv: list[str]) -> list[float]:
    printed = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return [float(line) for line in printed.split()]


def _in_sandbox(templates: dict[str, str], samples: int, workspace: str) -> dict[str, list[float]]:
    from piship_remote.local import LocalE2bService

    measured: dict[str, list[float]] = {}
    with LocalE2bService(templates=templates) as service, contextlib.ExitStack() as stack:
        for name in templates:
            backend = E2bCompatibleBackend(
                endpoint=service.url, envd_url=service.envd_url, template=name, workdir=HOME,
                user=USER, credential=lambda: service.api_key,
            )  # fmt: skip
            stack.callback(backend.close)
            with activate_sandbox(_DENY, backend=backend, workspace=workspace, env={}) as sandbox:
                command = f"python3 -c {shlex.quote(_TIMER)} {samples}"
                result = sandbox.run(command, timeout=300, check=True)
            measured[name] = [float(line) for line in result.stdout.split()]
    return measured
