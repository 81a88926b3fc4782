"""``root`` beside ``user`` in one local sandbox, as E2B's ``user="root"`` asks for it.

Where the service runs as host root, a sandbox maps two uids: its user (1000) and
its root (0, an unused host uid). Root's commands and file operations run as uid 0
with home ``/root`` and a short list of capabilities; the user's start with none.
Elsewhere ``root`` is refused, with the reason.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from piship_remote.local import LocalE2bService
from piship_remote.local.isolation.user_map import CAPABILITIES, SANDBOX_UID
from piship_remote.local.sandbox import registry as sandboxes
from tests.support.local_service import HTTP_TIMEOUT, Client, basic, needs_bwrap, run_as, start_as
from tests.support.process_rpc import pid_of, pty_shows, pty_text
from tests.support.sandbox_uid import host_ids_of

pytestmark = [needs_bwrap, pytest.mark.timeout(30)]

# Linux capability numbers of the names user_map.CAPABILITIES lists.
CAPABILITY_BITS = {
    "CAP_CHOWN": 0,
    "CAP_DAC_OVERRIDE": 1,
    "CAP_DAC_READ_SEARCH": 2,
    "CAP_FOWNER": 3,
    "CAP_FSETID": 4,
    "CAP_KILL": 5,
    "CAP_SETGID": 6,
    "CAP_SETUID": 7,
}
CAP_LINES = "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status"


@pytest.fixture(scope="module")
def service() -> Iterator[LocalE2bService]:
    if os.geteuid() != 0:
        pytest.skip("a root beside the user needs the service run as host root")
    with LocalE2bService() as running:
        yield running


def capabilities(output: str) -> dict[str, int]:
    """``{"CapEff": mask, …}`` from ``/proc/self/status`` lines."""
    fields = (line.split(":") for line in output.splitlines())
    return {name: int(value, 16) for name, value in fields}


def files(client: Client, sandbox: dict[str, Any], method: str, **kw: Any) -> requests.Response:
    headers = {**client.envd_headers(sandbox), **kw.pop("headers", {})}
    return client.session.request(
        method, client.service.url + "/files", headers=headers, timeout=HTTP_TIMEOUT, **kw
    )


# -- commands ------------------------------------------------------------------------------


def test_root_and_user_run_in_one_sandbox_as_uid_0_and_1000(
    client: Client, sandbox: dict[str, Any]
) -> None:
    root = "uid=0(root) gid=0(root) groups=0(root)\n"
    assert run_as(client, sandbox, "root", "id").stdout == root
    assert run_as(client, sandbox, "user", "id -u").stdout == "1000\n"


def test_root_has_home_root_as_home_and_default_working_directory(
    client: Client, sandbox: dict[str, Any]
) -> None:
    stream = run_as(client, sandbox, "root", 'echo "$HOME $USER $LOGNAME"; pwd')
    assert stream.stdout == "/root root root\n/root\n"


def test_roots_relative_cwd_is_taken_from_root_home(
    client: Client, sandbox: dict[str, Any]
) -> None:
    run_as(client, sandbox, "root", "mkdir /root/work")
    stream = start_as(client, sandbox, "root", "pwd", process={"cwd": "work"}).finish()
    assert stream.stdout == "/root/work\n"


def test_root_home_is_roots_alone(client: Client, sandbox: dict[str, Any]) -> None:
    assert run_as(client, sandbox, "root", "stat -c '%U %a' /root").stdout == "root 700\n"
    refused = run_as(client, sandbox, "user", "ls /root")
    assert refused.end is not None and refused.end["exitCode"] != 0
    assert "Permission denied" in refused.stderr


def test_a_users_command_cannot_start_in_root_home(client: Client, sandbox: dict[str, Any]) -> None:
    stream = start_as(client, sandbox, "user", "pwd", process={"cwd": "/root"}).finish()
    assert stream.trailer is not None and stream.trailer["error"]["code"] == "invalid_argument"
    assert stream.stdout == ""


def test_root_reads_a_file_only_its_user_may_read(client: Client, sandbox: dict[str, Any]) -> None:
    run_as(client, sandbox, "user", "echo secret > ~/s && chmod 600 ~/s")
    assert run_as(client, sandbox, "root", "cat /home/user/s").stdout == "secret\n"


def test_a_file_root_writes_is_roots_and_not_the_users_to_change(
    client: Client, sandbox: dict[str, Any]
) -> None:
    run_as(client, sandbox, "root", "echo mine > /home/user/r")
    assert run_as(client, sandbox, "user", "find ~/r -printf %u").stdout == "root"
    changed = run_as(client, sandbox, "user", "echo theirs >> ~/r")
    assert changed.end is not None and changed.end["exitCode"] != 0


def test_the_host_sees_roots_and_users_files_as_owned_by_the_unused_host_uids(
    client: Client, sandbox: dict[str, Any], service: LocalE2bService
) -> None:
    run_as(client, sandbox, "root", "echo x > /home/user/r && echo y > ~/own")
    home = service.sandbox_home(sandbox["sandboxID"])
    ids = host_ids_of(service, sandbox)
    assert os.stat(os.path.join(home, "r")).st_uid == ids.host(0)
    run_as(client, sandbox, "user", "echo z > ~/u")
    assert os.stat(os.path.join(home, "u")).st_uid == ids.host(SANDBOX_UID)


def test_a_users_command_has_no_capabilities(client: Client, sandbox: dict[str, Any]) -> None:
    caps = capabilities(run_as(client, sandbox, "user", CAP_LINES).stdout)
    assert (caps["CapInh"], caps["CapPrm"], caps["CapEff"], caps["CapAmb"]) == (0, 0, 0, 0)


def test_roots_command_has_exactly_the_listed_capabilities(
    client: Client, sandbox: dict[str, Any]
) -> None:
    expected = sum(1 << CAPABILITY_BITS[name] for name in CAPABILITIES)
    caps = capabilities(run_as(client, sandbox, "root", CAP_LINES).stdout)
    assert (caps["CapPrm"], caps["CapEff"], caps["CapBnd"]) == (expected, expected, expected)


def test_roots_background_process_is_visible_to_the_user_who_cannot_kill_it(
    client: Client, sandbox: dict[str, Any]
) -> None:
    started = run_as(client, sandbox, "root", "sleep 300 >/dev/null 2>&1 & echo $!")
    pid = started.stdout.strip()
    seen = run_as(client, sandbox, "user", f"awk '/^Uid/ {{print $2}}' /proc/{pid}/status")
    assert seen.stdout == "0\n"
    killed = run_as(client, sandbox, "user", f"kill {pid}")
    assert killed.end is not None and killed.end["exitCode"] != 0
    assert "not permitted" in killed.stderr


def test_a_root_pty_runs_as_root(client: Client, sandbox: dict[str, Any]) -> None:
    size = {"size": {"cols": 80, "rows": 24}}
    stream = start_as(client, sandbox, "root", "echo uid-$(id -u)", pty=size)
    pid_of(stream)
    assert "uid-0" in pty_text(stream.until(pty_shows("uid-0")))


# -- files ---------------------------------------------------------------------------------


def test_files_as_root_write_into_root_home_as_root(
    client: Client, sandbox: dict[str, Any]
) -> None:
    written = files(
        client,
        sandbox,
        "POST",
        params={"path": "a.txt", "username": "root"},
        data=b"root data",
        headers={"Content-Type": "application/octet-stream"},
    )
    assert written.status_code == 200, written.text
    assert written.json() == [{"path": "/root/a.txt", "name": "a.txt", "type": "file"}]
    assert run_as(client, sandbox, "root", "stat -c %U /root/a.txt").stdout == "root\n"
    read = files(client, sandbox, "GET", params={"path": "a.txt", "username": "root"})
    assert (read.status_code, read.content) == (200, b"root data")


def test_the_user_cannot_read_a_file_in_root_home(client: Client, sandbox: dict[str, Any]) -> None:
    run_as(client, sandbox, "root", "echo hidden > /root/h")
    read = files(client, sandbox, "GET", params={"path": "/root/h"})
    assert read.status_code >= 400
    assert b"hidden" not in read.content


def test_a_user_reading_under_root_home_gets_envds_permission_answer_not_404(
    client: Client, sandbox: dict[str, Any]
) -> None:
    run_as(client, sandbox, "root", "echo hidden > /root/h")
    read = files(client, sandbox, "GET", params={"path": "/root/h"})
    assert read.json() == {
        "code": 500,
        "message": "error checking if path exists '/root/h': stat /root/h: permission denied",
    }
    assert read.status_code == 500


def test_a_user_reading_a_file_only_root_may_read_gets_envds_open_error(
    client: Client, sandbox: dict[str, Any]
) -> None:
    run_as(client, sandbox, "root", "echo hidden > /tmp/r && chmod 600 /tmp/r")
    read = files(client, sandbox, "GET", params={"path": "/tmp/r"})
    assert read.status_code == 500
    assert read.json()["message"] == "error opening file '/tmp/r': open /tmp/r: permission denied"


def test_a_missing_file_in_a_readable_place_is_still_404(
    client: Client, sandbox: dict[str, Any]
) -> None:
    read = files(client, sandbox, "GET", params={"path": "/tmp/none"})
    assert (read.status_code, read.json()["message"]) == (404, "path '/tmp/none' does not exist")


def test_filesystem_rpcs_as_root_see_root_home(client: Client, sandbox: dict[str, Any]) -> None:
    run_as(client, sandbox, "root", "touch /root/listed")
    listed = client.session.post(
        client.service.envd_url + "/filesystem.Filesystem/ListDir",
        json={"path": ""},
        headers=client.envd_headers(sandbox, Authorization=basic("root")),
        timeout=HTTP_TIMEOUT,
    )
    assert listed.status_code == 200, listed.text
    entries = {e["name"]: e for e in listed.json()["entries"]}
    assert entries["listed"]["path"] == "/root/listed"
    assert entries["listed"]["owner"] == "root"


def test_a_watcher_as_root_sees_root_home(client: Client, sandbox: dict[str, Any]) -> None:
    created = client.session.post(
        client.service.envd_url + "/filesystem.Filesystem/CreateWatcher",
        json={"path": "~"},
        headers=client.envd_headers(sandbox, Authorization=basic("root")),
        timeout=HTTP_TIMEOUT,
    )
    assert created.status_code == 200, created.text
    run_as(client, sandbox, "root", "echo x > /root/watched")
    seen: list[str] = []
    deadline = time.monotonic() + 10
    while "watched" not in seen and time.monotonic() < deadline:
        polled = client.session.post(
            client.service.envd_url + "/filesystem.Filesystem/GetWatcherEvents",
            json={"watcherId": created.json()["watcherId"]},
            headers=client.envd_headers(sandbox),
            timeout=HTTP_TIMEOUT,
        )
        seen += [e["name"] for e in polled.json().get("events", [])]
    assert "watched" in seen


def create_watcher(
    client: Client, sandbox: dict[str, Any], path: str, user: str = "user"
) -> requests.Response:
    return client.session.post(
        client.service.envd_url + "/filesystem.Filesystem/CreateWatcher",
        json={"path": path},
        headers=client.envd_headers(sandbox, Authorization=basic(user)),
        timeout=HTTP_TIMEOUT,
    )


def test_a_users_watcher_on_root_home_is_refused_as_envd_refuses_an_unreadable_dir(
    client: Client, sandbox: dict[str, Any]
) -> None:
    created = create_watcher(client, sandbox, "/root")
    assert created.json() == {
        "code": "internal",
        "message": "error adding path /root to watcher: permission denied",
    }


def test_a_users_watcher_below_root_home_is_refused_as_envds_failed_stat(
    client: Client, sandbox: dict[str, Any]
) -> None:
    run_as(client, sandbox, "root", "mkdir /root/sub")
    created = create_watcher(client, sandbox, "/root/sub")
    assert created.json() == {
        "code": "internal",
        "message": "error statting path /root/sub: stat /root/sub: permission denied",
    }


# -- metrics -------------------------------------------------------------------------------


def test_the_disk_metric_counts_root_home(client: Client, sandbox: dict[str, Any]) -> None:
    def disk_used() -> int:
        path = f"/sandboxes/{sandbox['sandboxID']}/metrics"
        return int(client.control("GET", path).json()[-1]["diskUsed"])  # the newest

    before = disk_used()
    run_as(client, sandbox, "root", "head -c 3145728 /dev/zero > /root/big")
    assert disk_used() - before >= 3 * 1024 * 1024


# -- where root cannot be mapped -------------------------------------------------------------


@pytest.fixture
def single_user_service(monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalE2bService]:
    """A service that behaves as one not run as host root: its sandboxes map one uid."""
    monkeypatch.setattr(sandboxes, "root_mappable", lambda: False)
    with LocalE2bService() as running:
        yield running


def test_root_is_refused_with_the_reason_where_it_cannot_be_mapped(
    single_user_service: LocalE2bService,
) -> None:
    client = Client(single_user_service)
    sandbox = client.create()
    stream = start_as(client, sandbox, "root", "id -u").finish()
    assert stream.trailer == {
        "error": {
            "code": "unauthenticated",
            "message": "invalid username: 'root': root needs the local service run as root"
            " (host uid 0): its sandboxes map one uid",
        }
    }
    read = files(client, sandbox, "GET", params={"path": "a", "username": "root"})
    assert read.status_code == 401
    assert read.json()["message"].startswith("error looking up user 'root': user: unknown user")
    assert "root needs the local service run as root" in read.json()["message"]
    assert run_as(client, sandbox, "user", "id -u").stdout == "1000\n"
    client.session.close()


def test_a_service_whose_user_is_root_still_runs_as_root_in_its_workdir() -> None:
    with LocalE2bService(user="root") as service:
        client = Client(service)
        sandbox = client.create()
        stream = run_as(client, sandbox, "root", 'id -u; echo "$HOME"; pwd')
        assert stream.stdout == "0\n/home/user\n/home/user\n"
        client.session.close()
