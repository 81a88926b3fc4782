"""``required: false`` is honest: an unreachable service leaves a sandbox that says why and runs
nothing, never a command on this host."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from piship_remote import E2bCompatibleBackend, PiShipError, Sandbox, activate_sandbox
from piship_remote.model.report import describe_containment
from piship_remote.testing import E2bServer

POLICY = {"required": False, "network": {"mode": "deny"}}
KEY = "e2b_0123456789abcdef0123456789abcdef"


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.fixture
def unreachable(closed_port: int, workspace: Path) -> Iterator[Sandbox]:
    backend = E2bCompatibleBackend(
        endpoint=f"http://127.0.0.1:{closed_port}", credential=lambda: KEY
    )
    sandbox = activate_sandbox(POLICY, backend=backend, workspace=workspace, env={})
    yield sandbox
    sandbox.dispose()


def test_the_report_names_the_refused_connection(unreachable: Sandbox, closed_port: int) -> None:
    assert unreachable.report.level == "unavailable"
    assert unreachable.report.reason is not None
    assert f"127.0.0.1:{closed_port}" in unreachable.report.reason
    assert "ECONNREFUSED" in unreachable.report.reason


def test_the_report_line_says_nothing_runs(unreachable: Sandbox) -> None:
    line = describe_containment(unreachable.report)
    assert line.endswith("No command runs: piship_remote runs commands only in a sandbox")
    assert "privileges" not in line


def test_the_first_run_carries_the_real_reason(unreachable: Sandbox) -> None:
    with pytest.raises(PiShipError) as caught:
        unreachable.run("echo hi")
    assert caught.value.code == "SANDBOX_UNAVAILABLE"
    assert "ECONNREFUSED" in str(caught.value)
    assert "never runs commands unsandboxed" in str(caught.value)


def test_the_first_exec_carries_the_real_reason(unreachable: Sandbox) -> None:
    with pytest.raises(PiShipError, match="ECONNREFUSED"):
        unreachable.exec("echo hi")


def test_no_credential_reaches_the_report_or_the_error(unreachable: Sandbox) -> None:
    with pytest.raises(PiShipError) as caught:
        unreachable.exec("echo hi")
    assert KEY not in str(caught.value)
    assert KEY not in describe_containment(unreachable.report)


@pytest.mark.timeout(20)
def test_a_refused_connection_at_activation_is_gateway_unreachable_and_retryable(
    tmp_path: Path,
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{holder.getsockname()[1]}"
        backend = E2bCompatibleBackend(endpoint=url, envd_url=url)
        with pytest.raises(PiShipError) as raised:
            activate_sandbox({"required": True}, backend=backend, workspace=tmp_path)
    error = raised.value
    assert (error.code, error.retryable) == ("GATEWAY_UNREACHABLE", True)
    assert url.removeprefix("http://") in str(error)
    assert error.user_action is not None and "reachable" in error.user_action


@pytest.mark.timeout(20)
def test_a_missing_api_key_at_activation_names_the_variable(
    tmp_path: Path, e2b_server: Callable[..., E2bServer]
) -> None:
    mock = e2b_server(api_key="e2b_needed_key_0123456789")
    backend = E2bCompatibleBackend(
        endpoint=mock.url, envd_url=mock.url, credential=lambda: os.environ["PISHIP_NO_SUCH_KEY"]
    )
    with pytest.raises(PiShipError) as raised:
        activate_sandbox({"required": True}, backend=backend, workspace=tmp_path)
    assert raised.value.code == "CREDENTIAL_REQUIRED"
    assert "PISHIP_NO_SUCH_KEY is not set" in str(raised.value)
    assert mock.requests == []


@pytest.mark.timeout(20)
def test_a_credential_giving_none_at_activation_names_e2b_api_key_with_a_readable_hint(
    tmp_path: Path, e2b_server: Callable[..., E2bServer]
) -> None:
    mock = e2b_server(api_key="e2b_needed_key_0123456789")
    backend = E2bCompatibleBackend(endpoint=mock.url, envd_url=mock.url, credential=lambda: None)
    with pytest.raises(PiShipError) as raised:
        activate_sandbox({"required": True}, backend=backend, workspace=tmp_path)
    assert raised.value.code == "CREDENTIAL_REQUIRED"
    assert "E2B_API_KEY is not set" in str(raised.value)
    assert "credential=lambda: os.environ['E2B_API_KEY']" in (raised.value.user_action or "")
    assert mock.requests == []
