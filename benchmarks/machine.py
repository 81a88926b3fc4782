"""A description of the machine and the library versions behind a run.

>>> describe().nproc >= 1
True
"""

from __future__ import annotations

import importlib.metadata
import os
import platform

from benchmarks.report import Machine
from piship_remote.backends.e2b._stream import base64_decoder

__all__ = ["describe"]

_PACKAGES = ("requests", "urllib3", "e2b", "werkzeug", "pyqwest", "connectrpc", "pybase64")


def describe() -> Machine:
    """CPU count and model, platform, Python, the versions of the HTTP stacks and the
    base64 decoder our E2B stream reader uses."""
    versions: dict[str, str] = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return Machine(
        nproc=_nproc(),
        cpu_model=_cpu_model(),
        platform=platform.platform(),
        python=platform.python_version(),
        versions=versions,
        base64_decoder=base64_decoder(),
    )


def _nproc() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
