"""Shared fixtures: the test doubles' plugin, the seed's workspace layout, the local service,
settable clocks, the secret sweep."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import requests

from piship_remote.backends.kubernetes.backend import KubernetesInstance
from piship_remote.local import LocalE2bService
from piship_remote.testing import Recorded, RecordingServer, leaks
from tests.support.claims import FakeCluster
from tests.support.host_secrets import HOST_SECRETS
from tests.support.local_service import Client
from tests.support.seed import Clocks

pytest_plugins = ["piship_remote.testing.plugin", "tests.support.telemetry"]


@pytest.fixture
def ctrl_c() -> Iterator[None]:
    """SIGINT raises ``KeyboardInterrupt`` here and in the processes the test starts.

    Started from a background job, the suite inherits SIGINT ignored, and so would
    every child: a Ctrl-C test puts Python's handler in place for its own length.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.fixture
def instances() -> Iterator[list[KubernetesInstance]]:
    """Kubernetes instances to dispose at teardown, whatever the test did."""
    made: list[KubernetesInstance] = []
    yield made
    for instance in made:
        instance.dispose()


@pytest.fixture
def cluster() -> FakeCluster:
    """An in-memory cluster behind a claim manager (``claims_support``)."""
    return FakeCluster()


@pytest.fixture
def clocks() -> Clocks:
    """A settable wall clock and monotonic clock for a backend's lifetime arithmetic."""
    return Clocks()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The test's temporary directory with symlinks resolved (the seed's ``root``)."""
    return Path(os.path.realpath(tmp_path))


@pytest.fixture
def workspace(root: Path) -> Path:
    """``<root>/ws``, with ``ws/sub`` created."""
    path = root / "ws"
    (path / "sub").mkdir(parents=True)
    return path


@pytest.fixture
def home(root: Path) -> Path:
    """``<root>/home`` (not created), the home directory the seed activates with."""
    return root / "home"


@pytest.fixture
def service() -> Iterator[LocalE2bService]:
    """A local E2B-compatible service (a module may override it with one of its own)."""
    with LocalE2bService() as running:
        yield running


@pytest.fixture
def client(service: LocalE2bService) -> Iterator[Client]:
    """The ``service``'s two planes over one session (see ``local_service_support``)."""
    client = Client(service)
    yield client
    client.session.close()


@pytest.fixture
def sandbox(client: Client) -> Iterator[dict[str, Any]]:
    """A sandbox of the ``service``, deleted after the test (a module's service outlives it)."""
    created = client.create()
    yield created
    with contextlib.suppress(requests.ConnectionError):  # a test may have stopped the service
        client.control("DELETE", f"/sandboxes/{created['sandboxID']}")


@pytest.fixture
def cli_environ(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No ambient PISHIP/E2B settings or proxies: ``cli.main`` reads only what a test sets."""
    for name in list(os.environ):
        upper = name.upper()
        if upper.startswith(("PISHIP_", "E2B_")) or upper.endswith("_PROXY"):
            monkeypatch.delenv(name)
    return monkeypatch


# ---------------------------------------------------------------- the secret sweep
#
# After every test, no secret may appear in a request any double recorded outside
# its one allowed header, nor in any log record of the ``piship_remote`` loggers.
# Every RecordingServer a test creates (the E2B and Kubernetes doubles, custom
# ones, fault proxies) is tracked by wrapping its constructor for the test's
# duration. The secrets are (a) host secrets the suite puts in source
# environments, which may appear nowhere, and (b) every credential the library
# sent, learnt from the requests themselves: an ``X-API-Key`` value may appear only
# in that header and only on a control path (``…/sandboxes…``), a bearer only in
# ``Authorization``, an envd token only in ``X-Access-Token`` and never to a control
# path. Responses are not swept: doubles echo keys in 401 bodies on purpose. Tests
# that put a secret in a request deliberately opt out with
# ``@pytest.mark.no_secret_sweep``; tests may add their own secrets with
# ``secret_sweep.add(value, allowed_headers)``. A test with the ``otel`` fixture
# (tests/support/telemetry.py) also has every exported span and metric swept.

SWEEP_MARKER = "no_secret_sweep: skip the end-of-test secret sweep (a test that leaks on purpose)"
_MIN_SECRET = 6  # shorter values are not registered as secrets by the library either
_CONTROL_PATH = re.compile(r"/sandboxes(?:/|\?|$)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", SWEEP_MARKER)


class SecretSweep:
    """The servers and log records of one test, and the secrets to look for in them."""

    def __init__(self) -> None:
        self.servers: list[RecordingServer] = []
        self.records: list[logging.LogRecord] = []
        self.exported: list[str] = []  # what OpenTelemetry exported (tests/support/telemetry.py)
        self._extra: dict[str, tuple[str, ...]] = {}

    def add(self, secret: str, allowed_headers: Sequence[str] = ()) -> None:
        """Also sweep for ``secret``, allowed only in ``allowed_headers`` (lower-case names)."""
        self._extra[secret] = tuple(h.lower() for h in allowed_headers)

    def findings(self) -> list[str]:
        requests = [r for server in self.servers for r in server.requests]
        allowed = {**dict.fromkeys(HOST_SECRETS, ()), **self._extra}
        for secret, header in _sent_credentials(requests, self.servers):
            allowed.setdefault(secret, (header,))
        found = [
            f"{secret[:8]}… in {place}"
            for secret, headers in allowed.items()
            for place in leaks(requests, secret, headers)
        ]
        found += _misrouted(requests)
        for record in self.records:
            text = _record_text(record)
            found += [
                f"{s[:8]}… in a {record.levelname} log record of {record.name}"
                for s in allowed
                if s in text
            ]
        found += [f"{s[:8]}… in an exported span or metric" for s in allowed if self._exported(s)]
        return found

    def _exported(self, secret: str) -> bool:
        return any(secret in text for text in self.exported)


def _sent_credentials(
    requests: Sequence[Recorded], servers: Sequence[RecordingServer]
) -> Iterator[tuple[str, str]]:
    """Each credential value seen in a request, with the one header it belongs in."""
    for server in servers:
        token = getattr(getattr(server, "cluster", None), "token", None)
        if isinstance(token, str) and len(token) >= _MIN_SECRET:
            yield token, "authorization"
    for request in requests:
        headers = request.headers
        key = headers.get("x-api-key", "")
        if len(key) >= _MIN_SECRET:
            yield key, "x-api-key"
        scheme, _, bearer = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and len(bearer) >= _MIN_SECRET:
            yield bearer, "authorization"
        envd_token = headers.get("x-access-token", "")
        if len(envd_token) >= _MIN_SECRET:
            yield envd_token, "x-access-token"


def _misrouted(requests: Sequence[Recorded]) -> list[str]:
    """Credentials sent in their own header but to the wrong place."""
    found = []
    for request in requests:
        path = request.path.split("?", 1)[0]
        if request.headers.get("x-api-key") and not _CONTROL_PATH.search(path):
            found.append(f"an API key sent to {request.path}")
        if request.headers.get("x-access-token") and _CONTROL_PATH.search(path):
            found.append(f"an envd token sent to {request.path}")
    return found


def _record_text(record: logging.LogRecord) -> str:
    parts = [record.getMessage(), record.exc_text or "", record.stack_info or ""]
    if record.exc_info and record.exc_info[1] is not None:
        parts.append("".join(traceback.format_exception(*record.exc_info)))
    return "\n".join(parts)


class _Capture(logging.Handler):
    def __init__(self, sink: list[logging.LogRecord]) -> None:
        super().__init__(logging.DEBUG)
        self._sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self._sink.append(record)


@pytest.fixture(autouse=True)
def secret_sweep(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[SecretSweep]:
    """Fails the test (at teardown) when a secret leaked into a request or a log record."""
    sweep = SecretSweep()
    if request.node.get_closest_marker("no_secret_sweep") is not None:
        yield sweep
        return
    original = RecordingServer.__init__

    def tracked(self: RecordingServer, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        sweep.servers.append(self)

    monkeypatch.setattr(RecordingServer, "__init__", tracked)
    logger = logging.getLogger("piship_remote")
    capture, level = _Capture(sweep.records), logger.level
    logger.addHandler(capture)
    logger.setLevel(logging.DEBUG)
    try:
        yield sweep
    finally:
        logger.removeHandler(capture)
        logger.setLevel(level)
    findings = sweep.findings()
    if findings:
        pytest.fail("secret sweep: " + "; ".join(dict.fromkeys(findings)), pytrace=False)
