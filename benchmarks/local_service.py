"""The local E2B-compatible service (bubblewrap) in a child process, for the file scenarios.

The file scenarios measure real transfers into real sandboxes, so they run against
:class:`piship_remote.local.LocalE2bService` rather than the loopback double. It runs
in its own process (``python -m benchmarks.local_service``), so its threads never
share the clients' GIL, with a per-sandbox disk large enough for the files moved::

    with LocalServiceProcess(disk_mib=3072) as service:
        service.url, service.api_key          # control plane and envd on one port
        backend = service_backend(service.url, service.api_key, stack)

It stops when its stdin closes; every sandbox is deleted then.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
from types import TracebackType

from benchmarks.loopback import READY, ROOT, readline_within, stop_child
from piship_remote.backends.e2b.backend import E2bCompatibleBackend

__all__ = ["HOME", "USER", "LocalServiceProcess", "service_backend", "unavailable"]

HOME = "/home/user"
USER = "user"
_STARTUP_TIMEOUT = 30.0
_STOP_TIMEOUT = 20.0


def service_backend(url: str, api_key: str, stack: contextlib.ExitStack) -> E2bCompatibleBackend:
    """Our E2B backend for the service at ``url`` (or a proxy before it), closed by ``stack``."""
    backend = E2bCompatibleBackend(
        endpoint=url, envd_url=url, credential=lambda: api_key, workdir=HOME, user=USER
    )
    stack.callback(backend.close)
    return backend


def unavailable() -> str | None:
    """Why the local service cannot run here, or ``None``."""
    from piship_remote.local import check

    return check()


class LocalServiceProcess:
    """A :class:`~piship_remote.local.LocalE2bService` in a child process."""

    def __init__(self, disk_mib: int, *, max_sandboxes: int | None = None) -> None:
        """``max_sandboxes`` raises (or lowers) the service's cap on sandboxes at once."""
        cap = [] if max_sandboxes is None else ["--max-sandboxes", str(max_sandboxes)]
        self._process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.local_service", "--disk-mib", str(disk_mib), *cap],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert self._process.stdout is not None
        line = readline_within(self._process.stdout, _STARTUP_TIMEOUT)
        if not line.startswith(READY):
            self.close()
            raise RuntimeError(f"the local service did not start: {line!r}")
        self.url, self.api_key = line[len(READY) :].split()

    def close(self) -> None:
        """Close the child's stdin (it then deletes its sandboxes and stops)."""
        stop_child(self._process, _STOP_TIMEOUT)

    def __enter__(self) -> LocalServiceProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _main() -> None:
    from piship_remote.local import LocalE2bService

    parser = argparse.ArgumentParser(prog="python -m benchmarks.local_service")
    parser.add_argument("--disk-mib", type=int, required=True, help="per-sandbox disk")
    parser.add_argument("--max-sandboxes", type=int, help="sandboxes at once (the service's cap)")
    args = parser.parse_args()
    cap = {} if args.max_sandboxes is None else {"max_sandboxes": args.max_sandboxes}
    with LocalE2bService(workdir=HOME, user=USER, max_disk_mib=args.disk_mib, **cap) as service:
        print(f"{READY}{service.url} {service.api_key}", flush=True)
        sys.stdin.read()  # the parent closes our stdin to stop us


if __name__ == "__main__":
    _main()
