"""What comes back from a sandbox, and what a refused write becomes, on every service.

The same three services as the files contract: the Kubernetes and E2B doubles over a
real directory, and the local service. A sandbox here may be hostile (its login files
replace tools) and the host may be unwritable (a full or read-only filesystem).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from piship_remote import PiShipError, Sandbox
from piship_remote.model.errors import CONFIG_INVALID, FILE_WRITE_FAILED
from piship_remote.model.transfer import SkippedPath, TransferLimits
from tests.sandbox import test_files_contract as contract
from tests.sandbox.test_files_contract import Activate, Service
from tests.support.files import small_filesystem

# The contract's services that run real commands (a hostile sandbox needs a shell), and
# its fixtures: one sandbox set-up for both modules.
workspace = contract.workspace
activate = contract.activate
sandbox = contract.sandbox

MIB = 1024 * 1024
NO_RESERVE = TransferLimits(min_free_bytes=0)


@pytest.fixture(params=["kubernetes", "local", "e2b"])
def service(request: pytest.FixtureRequest, tmp_path: Path, workspace: Path) -> Iterator[Service]:
    with contract.open_service(request.param, tmp_path, workspace) as chosen:
        yield chosen


def _make(sandbox: Sandbox, script: str) -> None:
    result = sandbox.exec(script)
    assert result.exit_code == 0, (result.stdout, result.stderr)


# -- a write the sandbox refuses ----------------------------------------------------------


def test_a_write_to_a_read_only_remote_path_is_a_file_error_and_the_sandbox_carries_on(
    sandbox: Sandbox, service: Service
) -> None:
    with pytest.raises(PiShipError) as raised:
        sandbox.files.write(service.read_only, b"x")
    assert raised.value.code == FILE_WRITE_FAILED
    assert service.read_only in str(raised.value)
    assert sandbox.files.write("after.txt", b"fine").size == 4
    assert sandbox.exec("true").exit_code == 0


def test_making_or_filling_a_read_only_remote_folder_is_a_file_error(
    sandbox: Sandbox, service: Service, workspace: Path
) -> None:
    (workspace / "tree").mkdir()
    (workspace / "tree" / "a.txt").write_text("a")
    for action in (
        lambda: sandbox.files.make_dir(service.read_only),
        lambda: sandbox.files.upload(workspace / "tree", service.read_only),
    ):
        with pytest.raises(PiShipError) as raised:
            action()
        assert raised.value.code == FILE_WRITE_FAILED
        assert service.read_only in str(raised.value)
    assert sandbox.exec("true").exit_code == 0


def test_a_remote_file_where_a_folder_must_be_is_a_file_error(sandbox: Sandbox) -> None:
    sandbox.files.write("plain.txt", b"a file")
    with pytest.raises(PiShipError) as raised:
        sandbox.files.write("plain.txt/inner", b"x")
    assert raised.value.code == FILE_WRITE_FAILED and "plain.txt" in str(raised.value)
    assert sandbox.files.read("plain.txt") == b"a file"


# -- bounded host writes ----------------------------------------------------------------


def test_a_download_past_the_byte_limit_stops_while_reading_and_leaves_nothing(
    sandbox: Sandbox, workspace: Path
) -> None:
    _make(sandbox, "mkdir -p out && head -c 16777216 /dev/zero > out/big.bin")
    sandbox.files.limits = TransferLimits(max_bytes=MIB)
    for remote in ("out/big.bin", "out"):
        received: list[int] = []
        with pytest.raises(PiShipError, match="the max_bytes limit") as raised:
            sandbox.files.download(remote, workspace / "got", progress=received.append)
        assert raised.value.code == CONFIG_INVALID
        assert sum(received) < 8 * MIB, (remote, sum(received))  # not the whole 16 MiB first
        assert os.listdir(workspace) == []


def test_a_pull_past_the_entry_limit_leaves_the_workspace_as_it_was(
    activate: Activate, workspace: Path
) -> None:
    (workspace / "kept.txt").write_text("host")
    sandbox = activate(sync="push")
    _make(sandbox, "for n in 1 2 3 4 5; do echo $n > made$n.txt; done")
    sandbox.files.limits = TransferLimits(max_entries=3)
    with pytest.raises(PiShipError, match="the max_entries limit"):
        sandbox.pull()
    assert os.listdir(workspace) == ["kept.txt"]


def test_a_full_host_disk_names_the_path_and_leaves_nothing(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    _make(sandbox, "mkdir -p out && head -c 2097152 /dev/zero > out/big.bin")
    sandbox.files.limits = NO_RESERVE  # the disk itself refuses, not the reserve
    with small_filesystem(tmp_path / "disk", "1m") as disk:
        for remote, local in (("out/big.bin", disk / "big.bin"), ("out", disk / "tree")):
            with pytest.raises(PiShipError) as raised:
                sandbox.files.download(remote, local)
            assert raised.value.code == FILE_WRITE_FAILED
            assert str(disk) in str(raised.value) and "the disk is full" in str(raised.value)
            assert os.listdir(disk) == []


def test_a_pull_onto_a_full_disk_leaves_the_workspace_as_it_was(
    activate: Activate, workspace: Path
) -> None:
    with small_filesystem(workspace, "1m"):
        (workspace / "kept.txt").write_text("host")
        sandbox = activate(sync="push")
        sandbox.files.limits = NO_RESERVE  # the disk itself refuses, not the reserve
        _make(sandbox, "echo small > a.txt && head -c 2097152 /dev/zero > z.bin")
        with pytest.raises(PiShipError) as raised:
            sandbox.pull()
        assert raised.value.code == FILE_WRITE_FAILED and "the disk is full" in str(raised.value)
        assert os.listdir(workspace) == ["kept.txt"]
        sandbox.dispose()


def test_a_read_only_host_folder_is_a_file_error_naming_it(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    sandbox.files.write("f.txt", b"x")
    with small_filesystem(tmp_path / "ro", "1m", read_only=True) as read_only:
        with pytest.raises(PiShipError) as raised:
            sandbox.files.download("f.txt", read_only / "f.txt")
    assert raised.value.code == FILE_WRITE_FAILED
    assert str(read_only / "f.txt") in str(raised.value) and "read-only" in str(raised.value)


def test_a_host_file_where_a_folder_must_be_is_a_file_error_naming_it(
    sandbox: Sandbox, workspace: Path
) -> None:
    sandbox.files.write("f.txt", b"x")
    (workspace / "plain").write_text("a file")
    with pytest.raises(PiShipError) as raised:
        sandbox.files.download("f.txt", workspace / "plain" / "sub" / "f.txt")
    assert raised.value.code == FILE_WRITE_FAILED
    assert str(workspace / "plain") in str(raised.value)
    assert os.listdir(workspace) == ["plain"]


def test_a_pull_reports_a_name_clash_and_applies_the_rest(
    activate: Activate, workspace: Path
) -> None:
    (workspace / "out").write_text("a host file")
    sandbox = activate(sync="push")
    _make(sandbox, "rm out && mkdir out && echo a > out/a.txt && echo b > b.txt")
    summary = sandbox.pull()
    assert [(s.path.removeprefix("./"), s.reason) for s in summary.skipped] == [
        ("out/a.txt", "name clash")
    ]
    assert (workspace / "b.txt").read_text() == "b\n"
    assert (workspace / "out").read_text() == "a host file"


# -- the helper commands are the library's ------------------------------------------------

# The attack: a tar, first on the login shell's PATH and as a function, that
# makes the pull's "archive" a sparse 100 GB file.
EVIL_TAR = r"""#!/bin/sh
echo fooled > "$HOME/fooled"
while [ $# -gt 0 ]; do
    [ "$1" = -cf ] && /usr/bin/truncate -s 100G "$2"
    shift
done
"""
HOSTILE_PROFILE = f"""
mkdir -p "$HOME/.evil"
cat > "$HOME/.evil/tar" <<'EOF'
{EVIL_TAR}EOF
chmod +x "$HOME/.evil/tar"
printf 'export PATH="$HOME/.evil:$PATH"\\ntar() {{ "$HOME/.evil/tar" "$@"; }}\\n' \\
    > "$HOME/.bash_profile"
"""


def test_a_sandbox_cannot_replace_the_helpers_through_its_login_files(
    service: Service, activate: Activate, workspace: Path
) -> None:
    if service.name == "kubernetes":
        pytest.skip("the Kubernetes runtime starts no login shell; its double runs on this host")
    (workspace / "kept.txt").write_text("host")
    sandbox = activate(sync="push")
    _make(sandbox, HOSTILE_PROFILE)
    seen = bytearray()
    sandbox.exec("type tar", on_data=seen.extend)
    assert b"function" in seen  # the sandbox's own commands do get its login files
    _make(sandbox, "echo result > result.txt")
    summary = sandbox.pull()
    assert (workspace / "result.txt").read_text() == "result\n"
    assert summary.files >= 1
    assert not sandbox.files.exists("fooled")
    downloaded = sandbox.files.download(".", workspace.parent / "copy")
    assert downloaded.files >= 2 and not sandbox.files.exists("fooled")


# -- pull mirrors push ------------------------------------------------------------------


def test_pull_leaves_out_what_push_ignores(activate: Activate, workspace: Path) -> None:
    (workspace / ".gitignore").write_text("build/\n*.pyc\n.coverage\n")
    sandbox = activate(sync="push")
    _make(
        sandbox,
        "mkdir -p build pkg && echo o > build/x.o && echo c > pkg/m.pyc"
        " && echo c > .coverage && echo r > result.txt",
    )
    summary = sandbox.pull()
    assert summary.files == 1 and (workspace / "result.txt").exists()
    assert sorted((s.path.removeprefix("./"), s.reason) for s in summary.skipped) == [
        (".coverage", "ignored"),
        ("build/x.o", "ignored"),
        ("pkg/m.pyc", "ignored"),
    ]
    assert sorted(os.listdir(workspace)) == [".gitignore", "result.txt"]


def test_push_leaves_well_known_secrets_at_home_and_says_why(
    activate: Activate, workspace: Path
) -> None:
    (workspace / ".env").write_text("TOKEN=abc")
    (workspace / "id_rsa").write_text("-----BEGIN OPENSSH PRIVATE KEY-----")
    (workspace / ".aws").mkdir()
    (workspace / ".aws" / "credentials").write_text("[default]")
    (workspace / "main.py").write_text("print(1)")
    sandbox = activate(sync="push")
    assert sandbox.files.read_text("main.py") == "print(1)"
    for secret in (".env", "id_rsa", ".aws"):
        assert not sandbox.files.exists(secret)
    report = sandbox.report.workspace
    assert report is not None and report.sync is not None
    assert sorted((s.path, s.reason) for s in report.sync.skipped) == [
        (".aws", "secret folder"),
        (".env", "secret file"),
        ("id_rsa", "secret file"),
    ]
    assert SkippedPath(".env", "secret file") in sandbox.push().skipped


def test_a_secret_file_the_policy_names_in_read_allow_is_pushed(
    activate: Activate, workspace: Path
) -> None:
    (workspace / ".env").write_text("TOKEN=abc")
    (workspace / "id_rsa").write_text("-----BEGIN OPENSSH PRIVATE KEY-----")
    policy = {"required": True, "filesystem": {"read": {"allow": ["workspace/.env"]}}}
    sandbox = activate(policy, sync="push")
    assert sandbox.files.read_text(".env") == "TOKEN=abc"
    assert not sandbox.files.exists("id_rsa")
