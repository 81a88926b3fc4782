"""Test doubles for piship_remote: fake E2B and Kubernetes agent-sandbox services.

Usable from plain scripts and notebooks::

    from piship_remote.testing import E2bServer
    with E2bServer(command=lambda start: {"stdout": "hi\\n"}) as mock:
        ...  # point a backend at mock.url; inspect mock.requests afterwards

and from pytest through the fixtures ``e2b_server`` and ``kubernetes_server``
(:mod:`piship_remote.testing.plugin`). Where a test is not about the wire,
:class:`~piship_remote.testing.mock_http.MockHttpClient` answers a backend's requests
in-process, without sockets or threads. Every server listens on 127.0.0.1, records
each request on arrival, and on exit releases every held request and stops.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from piship_remote.testing.leaks import leaks

if TYPE_CHECKING:
    from piship_remote.testing.e2b_server import E2bServer
    from piship_remote.testing.faults import Faults
    from piship_remote.testing.kubernetes_server import CLAIMS, Cluster, KubernetesServer
    from piship_remote.testing.mock_http import MockHttpClient, MockRequest, MockResponse
    from piship_remote.testing.recorder import (
        THREAD_PREFIX,
        DropConnection,
        Recorded,
        RecordingServer,
        json_response,
    )

# The doubles need the test extra (werkzeug); importing them lazily lets the
# pytest plugin and ``leaks`` load in an install without it.
TEST_EXTRA_HINT = "pip install 'piship-remote[test]'"
_TEST_EXTRA_MODULES = frozenset({"werkzeug", "pytest_httpserver"})
_HOMES = {
    "E2bServer": "e2b_server",
    "Faults": "faults",
    "CLAIMS": "kubernetes_server",
    "Cluster": "kubernetes_server",
    "KubernetesServer": "kubernetes_server",
    "MockHttpClient": "mock_http",
    "MockRequest": "mock_http",
    "MockResponse": "mock_http",
    "THREAD_PREFIX": "recorder",
    "DropConnection": "recorder",
    "Recorded": "recorder",
    "RecordingServer": "recorder",
    "json_response": "recorder",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        module = import_module(f"{__name__}.{home}")
    except ModuleNotFoundError as missing:
        if (missing.name or "").partition(".")[0] not in _TEST_EXTRA_MODULES:
            raise
        raise ImportError(
            f"piship_remote.testing.{name} needs the test extra ({missing.name} is missing):"
            f" {TEST_EXTRA_HINT}",
            name=missing.name,
        ) from missing
    return getattr(module, name)


__all__ = [
    "CLAIMS",
    "THREAD_PREFIX",
    "Cluster",
    "DropConnection",
    "E2bServer",
    "Faults",
    "KubernetesServer",
    "MockHttpClient",
    "MockRequest",
    "MockResponse",
    "Recorded",
    "RecordingServer",
    "json_response",
    "leaks",
]
