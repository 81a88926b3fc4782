"""After dispose() and close(), no client socket to the service stays open, on any path."""

from __future__ import annotations

import threading

import pytest

from piship_remote import CommandCancelled, CommandTimeout, PiShipError, activate_sandbox
from piship_remote.backends.e2b.backend import E2bCompatibleBackend
from piship_remote.testing import E2bServer
from tests.support.open_sockets import sockets_to

pytestmark = pytest.mark.timeout(30)
ANSWERS = {
    "failed": {"stream_error": "boom"},
    "dropped": {"stdout": "x", "drop": True},
    "timed-out": {"hang": True},
    "cancelled": {"hang": True},
}


@pytest.mark.parametrize("path", sorted(ANSWERS))
def test_no_socket_outlives_dispose_and_close(path, tmp_path) -> None:
    with E2bServer(command=lambda _start: ANSWERS[path]) as server:
        port = int(server.url.rsplit(":", 1)[1].strip("/"))
        backend = E2bCompatibleBackend(endpoint=server.url, envd_url=server.url)
        policy = {"required": True, "network": {"mode": "deny"}}
        sandbox = activate_sandbox(policy, backend=backend, workspace=tmp_path)
        cancel = threading.Event()
        if path == "cancelled":
            threading.Timer(0.2, cancel.set).start()
        with pytest.raises((PiShipError, CommandTimeout, CommandCancelled)):
            sandbox.exec("x", timeout=0.3 if path == "timed-out" else None, cancel=cancel)
        sandbox.dispose()
        backend.close()
        assert sockets_to(port) == 0
