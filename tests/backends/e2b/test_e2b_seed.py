"""The seed's E2B cases (``remote.test.ts``), one for one, against the fake E2B service.

Sections ported: the e2b half of "remote capability reporting" and all of
"e2b-compatible backend against a mock server". Each test names its seed case in
a ``# seed:`` comment and keeps the seed's assertions (request counts, bodies,
headers, exact strings).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from piship_remote.backends.e2b.backend import E2bCompatibleBackend
from piship_remote.model.errors import CommandTimeout, PiShipError
from piship_remote.model.report import NetworkDenial, describe_containment
from piship_remote.testing import E2bServer, Recorded, leaks
from piship_remote.wire.connect import END_STREAM, EnvelopeReader, Frame, connect_envelope
from tests.support.seed import SECRETS, Run, Seed, seed_policy

E2bFactory = Callable[..., E2bServer]


DOCTOR_LINE = (
    "enforced by e2b-compatible (required, attested by the backend): network-deny, "
    "environment-filter, host-filesystem-isolation; network deny (attested by the backend, "
    "not verified). Contains shell commands; MCP stdio servers cannot be contained by this "
    "backend and do not start, not the agent process or in-process extensions. The sandbox "
    "cannot reach this host's files, but it does not enforce sandbox.filesystem path rules; "
    "they govern only the local file tools. Workspace: snapshot. Remote commands see a copy, "
    "not the files the agent edits; this is not a complete coding-agent workspace."
)

pytestmark = pytest.mark.timeout(20)


def e2b(url: str, **options: Any) -> E2bCompatibleBackend:
    """The seed's ``e2b(url, options)``: template ``piship-workspace``, envd on the mock."""
    return E2bCompatibleBackend(
        endpoint=url, envd_url=url, **{"template": "piship-workspace", **options}
    )


@pytest.fixture
def seed(workspace: Path, home: Path) -> Seed:
    return Seed(workspace, home)


def starts(requests: list[Recorded]) -> list[dict[str, Any]]:
    """The StartRequests sent, in order."""
    return [
        EnvelopeReader().push(request.body)[0].message
        for request in requests
        if request.path == "/process.Process/Start"
    ]


def created_body(mock: E2bServer) -> Any:
    return next(r for r in mock.requests if r.path == "/sandboxes").json()


class Rejections:
    """A ``credential_rejected`` callback that counts its calls."""

    def __init__(self, answer: bool) -> None:
        self.count = 0
        self._answer = answer

    def __call__(self) -> bool:
        self.count += 1
        return self._answer


# ---------------------------------------------------------- remote capability reporting


def test_capabilities_never_declare_filesystem_path_planes() -> None:
    # seed: "never declares PiShip's filesystem path planes for a remote backend" (e2b half)
    capabilities = e2b("http://127.0.0.1:1").capabilities()
    assert capabilities.isolation == "remote"
    assert list(capabilities.planes) == [
        "host-filesystem-isolation",
        "network-deny",
        "environment-filter",
    ]
    assert "filesystem-read-deny" not in capabilities.planes
    assert "filesystem-write-allowlist" not in capabilities.planes
    assert capabilities.local_processes is False
    assert capabilities.to_dict()["workspace"] == {"mode": "snapshot"}


def test_network_denial_is_attested_with_one_sandbox_and_no_probe(
    seed: Seed, e2b_server: E2bFactory
) -> None:
    # seed: "reports e2b network denial attested: no probe, one sandbox, no connection attempt"
    mock = e2b_server()
    backend = e2b(mock.url)
    assert backend.capabilities().network_probe is None
    sandbox = seed.activate(backend)
    assert sandbox.report.network_denial == NetworkDenial(
        evidence="attested",
        probe=False,
        reason="the backend declares no network probe to check it with",
    )
    created = mock.find("POST", "/sandboxes")
    assert len(created) == 1
    assert created[0].json()["allow_internet_access"] is False
    for request in mock.requests:
        assert "/dev/tcp/" not in request.body.decode("latin-1")
    sandbox.dispose()


def test_report_and_doctor_line_state_only_enforced_guarantees(
    seed: Seed, e2b_server: E2bFactory
) -> None:
    # seed: "reports only enforced guarantees in the containment report and doctor line"
    mock = e2b_server()
    sandbox = seed.activate(e2b(mock.url))
    assert list(sandbox.report.planes) == [
        "network-deny",
        "environment-filter",
        "host-filesystem-isolation",
    ]
    line = describe_containment(sandbox.report)
    assert line == DOCTOR_LINE
    report = sandbox.report.to_dict()
    assert report["isolation"] == "remote"
    assert report["workspace"] == {
        "declared": "snapshot",
        "effective": "snapshot",
        "verification": "not-required",
        "gitControlProtection": "not-applicable",
        "complete": False,
    }
    # A snapshot is never checked: no sentinel reaches the service.
    assert seed.run(sandbox, "true").exit_code == 0
    workspace_report = sandbox.workspace()
    assert workspace_report is not None
    assert workspace_report.verification == "not-required"
    wire = "\n".join(request.body.decode("utf-8", "replace") for request in mock.requests)
    assert not re.search(r"piship-ws|\.git/piship-workspace", wire)
    assert not re.search(r"filesystem-read-deny|filesystem-write-allowlist", line)
    sandbox.dispose()


# ---------------------------------------------- e2b-compatible backend against a mock server


def test_creates_checks_runs_and_deletes_a_sandbox(seed: Seed, e2b_server: E2bFactory) -> None:
    # seed: "creates, checks, runs, and deletes a sandbox"
    mock = e2b_server(
        command=lambda start: {
            "stdout": f"cwd={start['process']['cwd']}\n",
            "exit_code": 3 if start["process"]["args"][2] == "exit 3" else 0,
        }
    )
    sandbox = seed.activate(e2b(mock.url))
    report = sandbox.report
    assert report.level == "enforced"
    assert report.adapter == "e2b-compatible"
    assert report.provider == "e2b-compatible"
    assert report.verification == "backend-attested"
    assert report.local_processes is False
    assert seed.run(sandbox, "pwd", cwd=seed.workspace / "sub") == Run(0, "cwd=/home/user/sub\n")
    assert seed.run(sandbox, "exit 3").exit_code == 3
    sandbox.dispose()
    body = created_body(mock)
    assert body == {
        "templateID": "piship-workspace",
        "timeout": 3600,
        "metadata": {"created-by": "piship"},
        "allow_internet_access": False,
    }
    start = starts(mock.requests)[-1]
    assert start["process"]["cmd"] == "/bin/bash"
    assert start["process"]["args"] == ["-l", "-c", "exit 3"]
    assert start["stdin"] is False
    assert mock.count(path="/sandboxes/sbx1/timeout") == 3
    last = mock.requests[-1]
    assert (last.method, last.path) == ("DELETE", "/sandboxes/sbx1")


def test_maps_the_workspace_onto_a_workdir_and_allows_network_only_when_asked(
    seed: Seed, e2b_server: E2bFactory
) -> None:
    # seed: "maps the workspace onto a configured workdir and allows the network only when asked"
    mock = e2b_server(command=lambda start: {"stdout": f"{start['process']['cwd']}\n"})
    sandbox = seed.activate(e2b(mock.url, workdir="/workspace/repo"), seed_policy("allow"))
    assert seed.run(sandbox, "pwd").output == "/workspace/repo\n"
    assert seed.run(sandbox, "pwd", cwd=seed.workspace / "sub").output == "/workspace/repo/sub\n"
    sandbox.dispose()
    assert created_body(mock)["allow_internet_access"] is True


def test_sends_only_approved_non_host_variables_and_no_credentials(
    seed: Seed, e2b_server: E2bFactory
) -> None:
    # seed: "sends only approved, non-host variables and no credentials"
    mock = e2b_server()
    sandbox = seed.activate(e2b(mock.url))
    seed.run(sandbox, "env")
    sandbox.dispose()
    assert starts(mock.requests)[-1]["process"]["envs"] == {"LANG": "C.UTF-8", "DOCS_MODE": "demo"}
    wire = json.dumps(
        [
            {"headers": request.headers, "body": request.body.decode("latin-1")}
            for request in mock.requests
        ]
    )
    for value in [*SECRETS.values(), "unlisted-host-value", "/home/alice", "/opt/host/bin"]:
        assert value not in wire


def test_sends_the_endpoint_credential_to_the_control_plane_only(
    seed: Seed, e2b_server: E2bFactory
) -> None:
    # seed: "sends the endpoint credential to the control plane only"
    mock = e2b_server()
    sandbox = seed.activate(e2b(mock.url, credential=lambda: "runtime-credential-1"))
    seed.run(sandbox, "true")
    sandbox.dispose()
    for request in mock.requests:
        control = request.path.startswith("/sandboxes") and request.path != "/health"
        if control:
            assert request.headers["x-api-key"] == "runtime-credential-1"
        else:
            assert "runtime-credential-1" not in json.dumps(request.headers)
        if request.path.startswith("/process.Process/"):
            assert request.headers["x-access-token"] == "envd-token-1"
            assert request.headers["e2b-sandbox-id"] == "sbx1"
            assert request.headers["e2b-sandbox-port"] == "49983"
            assert request.headers["connect-protocol-version"] == "1"


def test_sends_a_required_api_key_only_as_x_api_key_to_the_control_plane(
    seed: Seed, e2b_server: E2bFactory
) -> None:
    # seed: "sends a required API key only as X-API-Key to the control plane, never in a path, body, or envd request"  # noqa: E501
    key = "fake-sandbox-key-SENTINEL-0001"
    mock = e2b_server(api_key=key)
    sandbox = seed.activate(e2b(mock.url, credential=lambda: key))
    seed.run(sandbox, "true")
    sandbox.dispose()
    assert leaks(mock.requests, key, ["x-api-key"]) == []
    for request in mock.requests:
        if request.headers.get("x-api-key"):
            assert request.path.startswith("/sandboxes")


def test_reports_a_rejected_key_and_never_repeats_the_create(
    seed: Seed, e2b_server: E2bFactory
) -> None:
    # seed: "reports a rejected key and never repeats the create; the echoed key stays out of the error"  # noqa: E501
    key = "fake-sandbox-key-SENTINEL-0002"
    mock = e2b_server(api_key="fake-other-key-0000")
    rejected = Rejections(True)
    with pytest.raises(PiShipError) as caught:
        seed.activate(e2b(mock.url, credential=lambda: key, credential_rejected=rejected))
    assert caught.value.code == "SANDBOX_UNAVAILABLE"
    assert key not in str(caught.value)
    assert rejected.count == 1
    assert mock.count("POST", "/sandboxes") == 1


def test_repeats_a_renewal_once_with_a_renewed_key_after_a_rejection(
    seed: Seed, e2b_server: E2bFactory
) -> None:
    # seed: "repeats a renewal once with a renewed key after a rejection"
    mock = e2b_server(
        api_key="fake-sandbox-key-SENTINEL-0003", reject_once=["/sandboxes/sbx1/timeout"]
    )
    rejected = Rejections(True)
    sandbox = seed.activate(
        e2b(
            mock.url,
            credential=lambda: "fake-sandbox-key-SENTINEL-0003",
            credential_rejected=rejected,
        )
    )
    assert seed.run(sandbox, "true").exit_code == 0
    sandbox.dispose()
    assert rejected.count == 1
    assert mock.count(path="/sandboxes/sbx1/timeout") >= 2


def test_does_not_repeat_a_rejected_request_when_the_credential_cannot_be_renewed(
    seed: Seed, e2b_server: E2bFactory
) -> None:
    # seed: "does not repeat a rejected request when the credential cannot be renewed"
    mock = e2b_server(
        api_key="fake-sandbox-key-SENTINEL-0004", reject_once=["/sandboxes/sbx1/timeout"]
    )
    with pytest.raises(PiShipError, match="HTTP 401"):
        seed.activate(
            e2b(
                mock.url,
                credential=lambda: "fake-sandbox-key-SENTINEL-0004",
                credential_rejected=lambda: False,
            )
        )
    assert mock.count(path="/sandboxes/sbx1/timeout") == 1


def test_does_not_treat_a_403_from_the_control_plane_as_a_rejected_key(
    seed: Seed, e2b_server: E2bFactory
) -> None:
    # seed: "does not treat a 403 from the control plane as a rejected key"
    key = "fake-sandbox-key-SENTINEL-0005"
    mock = e2b_server(api_key=key, create=403)
    rejected = Rejections(True)
    with pytest.raises(PiShipError) as caught:
        seed.activate(e2b(mock.url, credential=lambda: key, credential_rejected=rejected))
    assert caught.value.code == "SANDBOX_UNAVAILABLE"
    assert re.search(r"HTTP 403", str(caught.value))
    assert rejected.count == 0
    assert mock.count("POST", "/sandboxes") == 1


def test_kills_the_remote_process_on_timeout_and_reports_the_outcome(
    seed: Seed, e2b_server: E2bFactory
) -> None:
    # seed: "kills the remote process on timeout and reports PiShip's outcome"
    mock = e2b_server(
        command=lambda start: (
            {"stdout": "working\n", "hang": True}
            if start["process"]["args"][2].startswith("sleep")
            else {"exit_code": 0}
        )
    )
    sandbox = seed.activate(e2b(mock.url))
    with pytest.raises(CommandTimeout) as caught:
        seed.run(sandbox, "sleep 600", timeout=0.3)
    assert str(caught.value) == "timeout:0.3"
    # The kill is sent right after PiShip stops waiting; wait for it (the seed polls 2 s).
    signal = mock.wait_for(path="/process.Process/SendSignal", timeout=2.0)
    tag = starts(mock.requests)[-1]["tag"]
    assert re.fullmatch(r"piship-[0-9a-f]{16}", tag)
    assert signal.json() == {"process": {"tag": tag}, "signal": "SIGNAL_SIGKILL"}
    assert signal.headers["content-type"] == "application/json"
    # The sandbox settled the cancelled stream, so it stays usable.
    assert seed.run(sandbox, "true").exit_code == 0
    sandbox.dispose()


def test_maps_envds_minus_one_for_a_signalled_process_to_a_signal_exit(
    seed: Seed, e2b_server: E2bFactory
) -> None:
    # seed: "maps envd's -1 for a signalled process to a signal exit"
    mock = e2b_server(command=lambda start: {"exit_code": -1})
    sandbox = seed.activate(e2b(mock.url))
    assert seed.run(sandbox, "kill -9 $$").exit_code == 1
    sandbox.dispose()


def test_runs_commands_as_the_e2b_default_user(seed: Seed, e2b_server: E2bFactory) -> None:
    # seed: "runs commands as the E2B default user"
    mock = e2b_server()
    sandbox = seed.activate(e2b(mock.url))
    seed.run(sandbox, "whoami")
    sandbox.dispose()
    for request in mock.find(path="/process.Process/Start"):
        assert request.headers["authorization"] == "Basic dXNlcjo="


def test_runs_commands_as_root_for_a_cubesandbox_style_service_when_configured(
    seed: Seed, e2b_server: E2bFactory
) -> None:
    # seed: "runs commands as root for a CubeSandbox-style service when configured"
    cube = e2b_server(user="root")
    # Without the setting, the service refuses the E2B default user.
    with pytest.raises(PiShipError) as caught:
        seed.activate(e2b(cube.url))
    assert caught.value.code == "SANDBOX_UNAVAILABLE"
    assert "HTTP 401" in str(caught.value)
    sandbox = seed.activate(e2b(cube.url, user="root"))
    assert seed.run(sandbox, "whoami").exit_code == 0
    sandbox.dispose()
    assert cube.find(path="/process.Process/Start")[-1].headers["authorization"] == (
        "Basic cm9vdDo="
    )


def test_surfaces_a_failed_command_stream(seed: Seed, e2b_server: E2bFactory) -> None:
    # seed: "surfaces a failed command stream"
    mock = e2b_server(command=lambda start: {"stream_error": "process exploded"})
    sandbox = seed.activate(e2b(mock.url))
    with pytest.raises(Exception, match="process exploded"):
        seed.run(sandbox, "boom")
    sandbox.dispose()


def test_fails_closed_when_unhealthy_or_unable_to_create(
    seed: Seed, e2b_server: E2bFactory
) -> None:
    # seed: "fails closed when the service is unhealthy or cannot create a sandbox"
    unhealthy = e2b_server(health=503)
    with pytest.raises(PiShipError) as caught:
        seed.activate(e2b(unhealthy.url))
    assert caught.value.code == "SANDBOX_UNAVAILABLE"
    assert "HTTP 503" in str(caught.value)
    assert not any(request.path == "/sandboxes" for request in unhealthy.requests)
    full = e2b_server(create=500)
    with pytest.raises(PiShipError) as caught:
        seed.activate(e2b(full.url))
    assert caught.value.code == "SANDBOX_UNAVAILABLE"
    assert "no capacity" in str(caught.value)


def test_splits_connect_envelopes_across_chunk_boundaries() -> None:
    # seed: "splits Connect envelopes across chunk boundaries"
    data = connect_envelope({"event": {"start": {"pid": 1}}}) + connect_envelope({}, END_STREAM)
    reader = EnvelopeReader()
    frames = [*reader.push(data[:3]), *reader.push(data[3:20]), *reader.push(data[20:])]
    assert frames == [
        Frame(flags=0, message={"event": {"start": {"pid": 1}}}),
        Frame(flags=2, message={}),
    ]
    oversized = bytes([0]) + (64 * 1024 * 1024).to_bytes(4, "big")
    with pytest.raises(ValueError, match="oversized"):
        EnvelopeReader().push(oversized)
