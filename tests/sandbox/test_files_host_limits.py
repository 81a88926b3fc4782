"""What a sandbox's files may take of this host: memory for ``read``, disk for a transfer.

``files.read()`` holds at most ``max_bytes`` (64 MiB by default) and stops reading there;
a download or pull stops before the host filesystem's free space falls below
``TransferLimits.min_free_bytes``. Both end in a ``PiShipError`` that says what to do, and
leave nothing behind. Run on the files contract's services that run real commands.
"""

from __future__ import annotations

import os
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from piship_remote import PiShipError, Sandbox
from piship_remote.model.errors import CONFIG_INVALID, FILE_WRITE_FAILED
from piship_remote.model.transfer import TransferLimits
from piship_remote.sandbox.files import READ_LIMIT
from tests.sandbox import test_files_contract as contract
from tests.sandbox.test_files_contract import Activate, Service
from tests.support.files import small_filesystem

workspace = contract.workspace
activate = contract.activate
sandbox = contract.sandbox

MIB = 1024 * 1024

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["kubernetes", "local", "e2b"])
def service(request: pytest.FixtureRequest, tmp_path: Path, workspace: Path) -> Iterator[Service]:
    with contract.open_service(request.param, tmp_path, workspace) as chosen:
        yield chosen


def _make(sandbox: Sandbox, script: str) -> None:
    result = sandbox.exec(script)
    assert result.exit_code == 0, (result.stdout, result.stderr)


# -- read: memory ------------------------------------------------------------------------


def test_a_read_past_max_bytes_names_download(sandbox: Sandbox) -> None:
    _make(sandbox, "head -c 3145728 /dev/zero > big.bin")
    for read in (sandbox.files.read, sandbox.files.read_text):
        with pytest.raises(PiShipError) as raised:
            read("big.bin", max_bytes=MIB)
        assert raised.value.code == CONFIG_INVALID
        assert "big.bin" in str(raised.value) and f"max_bytes ({MIB} bytes)" in str(raised.value)
        assert "files.download()" in (raised.value.user_action or "")


def test_a_read_within_max_bytes_is_whole(sandbox: Sandbox) -> None:
    _make(sandbox, "head -c 3145728 /dev/zero > big.bin")
    assert len(sandbox.files.read("big.bin", max_bytes=3 * MIB)) == 3 * MIB


@pytest.mark.parametrize("max_bytes", [0, -1, 1.5, True])
def test_a_max_bytes_that_is_not_a_positive_int_is_refused(
    sandbox: Sandbox, max_bytes: object
) -> None:
    with pytest.raises(PiShipError) as raised:
        sandbox.files.read("any.txt", max_bytes=max_bytes)  # type: ignore[arg-type]
    assert raised.value.code == CONFIG_INVALID


def test_read_holds_64_mib_at_most_by_default() -> None:
    assert READ_LIMIT == 64 * MIB


def test_a_huge_sparse_file_is_refused_by_read_without_holding_it(
    tmp_path: Path, workspace: Path
) -> None:
    # The case: a 3 GiB sparse file in the sandbox, read with the default limit.
    with contract.open_service("local", tmp_path, workspace) as local:
        sandbox = local.activate()
        _make(sandbox, "truncate -s 3G huge.bin")
        tracemalloc.start()
        try:
            with pytest.raises(PiShipError) as raised:
                sandbox.files.read("huge.bin")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert "files.download()" in (raised.value.user_action or "")
    assert peak < 4 * READ_LIMIT


# -- download and pull: the host's free space ------------------------------------------------


def test_a_download_stops_at_the_free_space_reserve_and_leaves_nothing(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    _make(sandbox, "mkdir -p out && head -c 6291456 /dev/zero > out/big.bin")
    sandbox.files.limits = TransferLimits(min_free_bytes=4 * MIB)
    with small_filesystem(tmp_path / "disk", "8m") as disk:
        for remote, local in (("out/big.bin", disk / "big.bin"), ("out", disk / "tree")):
            with pytest.raises(PiShipError) as raised:
                sandbox.files.download(remote, local)
            assert raised.value.code == FILE_WRITE_FAILED
            assert "min_free_bytes" in str(raised.value) and str(disk) in str(raised.value)
            assert os.listdir(disk) == []


def test_a_download_that_leaves_the_reserve_free_is_written(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    _make(sandbox, "head -c 6291456 /dev/zero > big.bin")
    sandbox.files.limits = TransferLimits(min_free_bytes=MIB)
    with small_filesystem(tmp_path / "disk", "8m") as disk:
        assert sandbox.files.download("big.bin", disk / "big.bin").bytes == 6 * MIB


def test_a_pull_of_a_sparse_file_stops_at_the_reserve_and_leaves_the_workspace(
    activate: Activate, workspace: Path
) -> None:
    with small_filesystem(workspace, "8m"):
        (workspace / "kept.txt").write_text("host")
        sandbox = activate(sync="push")
        sandbox.files.limits = TransferLimits(min_free_bytes=MIB)
        _make(sandbox, "echo small > a.txt && truncate -s 256M sparse.bin")
        with pytest.raises(PiShipError) as raised:
            sandbox.pull()
        assert raised.value.code == FILE_WRITE_FAILED
        assert "min_free_bytes" in str(raised.value)
        assert os.listdir(workspace) == ["kept.txt"]
        sandbox.dispose()


def test_the_default_reserve_is_512_mib() -> None:
    assert TransferLimits().min_free_bytes == 512 * MIB


def test_a_negative_reserve_is_refused() -> None:
    with pytest.raises(ValueError, match="min_free_bytes"):
        TransferLimits(min_free_bytes=-1)
