"""The seed suite's shared setup (``remote.test.ts``): its policy, host environment and helpers.

Both seed ports use the same temporary workspace, the same host environment with
secrets that must never leave, and the same ``activate``/``run`` helpers. The
Kubernetes and claim tests also share the seed's ``kubernetes(url, options)``, its
settable clocks, and the check that no library thread outlives a test.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from piship_remote.backends.base import Backend, ExecRequest
from piship_remote.backends.kubernetes.backend import KubernetesAgentSandboxBackend
from piship_remote.backends.lifetime import ClaimClock
from piship_remote.model.policy import SandboxProfile
from piship_remote.sandbox.activation import Sandbox, activate_sandbox
from piship_remote.testing import THREAD_PREFIX, Recorded

T = 1790618400.0
"""2026-09-28T18:00:00Z, the seed's clock origin (seconds)."""

SECRETS = {
    "ACME_API_TOKEN": "sk-live-never-in-remote-backends",
    "AWS_SECRET_ACCESS_KEY": "aws-never-in-remote-backends",
    "GITHUB_TOKEN": "ghp_never_in_remote_backends_0000000000",
}
UNLISTED = "unlisted-host-value"
ENV = {
    "PATH": "/opt/host/bin",
    "HOME": "/home/alice",
    "LANG": "C.UTF-8",
    "DOCS_MODE": "demo",
    "UNLISTED_VARIABLE": UNLISTED,
    **SECRETS,
}
CLAIM_THREADS = ("piship-keepalive-", "piship-claim-create", "piship-claim-check")


def seed_policy(network: str = "deny", **overrides: Any) -> dict[str, Any]:
    """The seed's policy: required, ``~/.ssh`` read-denied, the five-name allow list."""
    return {
        "required": True,
        "filesystem": {"read": {"deny": ["~/.ssh"]}, "write": {"allow": ["workspace"]}},
        "network": {"mode": network},
        "environment": {"allow": ["PATH", "HOME", "LANG", "DOCS_MODE", "ACME_API_TOKEN"]},
        **overrides,
    }


@attrs.frozen
class Run:
    exit_code: int
    output: str


@attrs.frozen
class Seed:
    """The seed's ``activate`` and ``run`` over one temporary workspace."""

    workspace: Path
    home: Path
    network: str = "deny"

    def activate(self, backend: Backend, config: Mapping[str, Any] | None = None) -> Sandbox:
        return activate_sandbox(
            seed_policy(self.network) if config is None else config,
            backend=backend,
            workspace=self.workspace,
            home_dir=self.home,
            env=ENV,
            settle_timeout=2.0,
        )

    def run(
        self,
        sandbox: Sandbox,
        command: str,
        *,
        cwd: Path | None = None,
        timeout: float | None = None,
        cancel: threading.Event | None = None,
    ) -> Run:
        output = bytearray()
        result = sandbox.exec(
            command,
            self.workspace if cwd is None else cwd,
            on_data=output.extend,
            timeout=timeout,
            cancel=cancel,
        )
        return Run(result.exit_code, output.decode())

    def request(self, command: str) -> ExecRequest:
        return ExecRequest(command, str(self.workspace), ".", {})

    def profile(self) -> SandboxProfile:
        return SandboxProfile(workspace=str(self.workspace), network=self.network)


def wire(requests: Iterable[Recorded]) -> str:
    """Every request's headers and body as one text, to search for what must never be sent."""
    return json.dumps([{"headers": r.headers, "body": r.body.decode("latin-1")} for r in requests])


def host_values_in(text: str, *more: str) -> list[str]:
    """The host secrets, the unlisted host variable's value and ``more`` that occur in ``text``."""
    return [value for value in (*SECRETS.values(), UNLISTED, *more) if value in text]


def failure_of(action: Callable[[], object]) -> BaseException:
    """What ``action`` raises (the seed's ``expect(…).rejects``); fails the test if nothing."""
    try:
        action()
    except BaseException as error:
        return error
    raise AssertionError("expected a failure")


class Rejections:
    """A ``credential_rejected`` callback that counts its calls and answers ``answer``."""

    def __init__(self, answer: bool = True) -> None:
        self.count = 0
        self._answer = answer

    def __call__(self) -> bool:
        self.count += 1
        return self._answer


class Clocks:
    """A settable wall clock and monotonic clock in seconds (the seed's ``now``, ``monotonic``)::

    clocks = Clocks()
    backend = kubernetes(url, clocks=clocks, lifetime_seconds=60)
    clocks.advance(61)  # real time passed: both clocks move
    clocks.wall -= 3600  # the wall clock alone is set back
    """

    def __init__(self, wall: float = T, mono: float = 0.0) -> None:
        self.wall = wall
        self.mono = mono

    def now(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds

    def clock(self, lifetime: float) -> ClaimClock:
        """A claim clock for ``lifetime`` seconds that reads these clocks."""
        return ClaimClock.for_lifetime(lifetime, now=self.now, monotonic=self.monotonic)


def kubernetes(
    url: str, *, clocks: Clocks | None = None, **options: Any
) -> KubernetesAgentSandboxBackend:
    """The seed's ``kubernetes(url, options)``: pool ``python-pool`` in ``agents``, 10 ms polls.

    API and router are both ``url`` unless ``router`` says otherwise; ``clocks``, when
    given, are the claims' ``now`` and ``monotonic``.
    """
    settings: dict[str, Any] = {
        "endpoint": url,
        "router": url,
        "template": "python-pool",
        "namespace": "agents",
        "poll_interval": 0.01,
    }
    if clocks is not None:
        settings.update(now=clocks.now, monotonic=clocks.monotonic)
    return KubernetesAgentSandboxBackend(**{**settings, **options})


def library_threads() -> list[str]:
    """The live threads the library started (the doubles' own excluded)."""
    return [
        t.name
        for t in threading.enumerate()
        if t.name.startswith("piship-") and not t.name.startswith(THREAD_PREFIX)
    ]


def assert_no_library_thread_left(grace: float = 3.0) -> None:
    """No claim thread at all, and no other library thread once ``grace`` seconds passed."""
    # The claim manager joins its own threads in dispose(): none may be left at all.
    assert [n for n in library_threads() if n.startswith(CLAIM_THREADS)] == []
    # Others (the activation's per-command workers) are finishing their last lines.
    deadline = time.monotonic() + grace
    while library_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert library_threads() == []
