"""Inputs the fuzzers found, kept as regular tests."""

from __future__ import annotations

import io
import json
import tarfile
import tempfile

import pytest
from hostile_tar import Member, tar_bytes
from parsers import check_stream_payloads, check_unpack_tar, stream_outcome

from piship_remote.model.errors import PiShipError
from piship_remote.wire.connect import END_STREAM, Frame
from piship_remote.workspace._archive import unpack_tar


def test_an_end_of_stream_error_with_a_newline_gives_a_one_line_message() -> None:
    # atheris, fuzz_envd_stream: crash-b501f3ce7e9e43d530afbfad2efbfb3373e41ee9
    payload = json.dumps({"error": {"code": "\nxxxxxxxxx"}}).encode()
    check_stream_payloads([(END_STREAM, payload)])


def test_an_end_of_stream_error_keeps_the_server_text_with_its_whitespace_collapsed() -> None:
    outcome, _ = stream_outcome()
    error = {"code": "internal\r\n", "message": "line one\n\tline two"}
    with pytest.raises(PiShipError) as caught:
        outcome.handle(Frame(END_STREAM, {"error": error}))
    assert caught.value.message == "the command stream failed: internal line one line two"


def test_an_archive_entry_whose_name_is_too_long_for_the_host_fails_typed() -> None:
    # hypothesis, test_fuzz_archive: an OSError (ENAMETOOLONG) escaped unpack_tar
    check_unpack_tar(tar_bytes([Member("a/" + "x" * 300, tarfile.REGTYPE, b"data")]))


def test_an_archive_entry_where_a_directory_is_named_fails_typed() -> None:
    archive = [Member("a", tarfile.REGTYPE, b"file"), Member("a/b", tarfile.REGTYPE, b"below")]
    check_unpack_tar(tar_bytes(archive))


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", [tarfile.REGTYPE, tarfile.GNUTYPE_SPARSE], ids=["file", "sparse"])
def test_a_refused_entry_declaring_a_huge_size_fails_at_once_as_a_bomb(kind: bytes) -> None:
    # hypothesis, test_fuzz_archive: tarfile skipped the 2**50 declared bytes block by
    # block (a hang) because only written files counted toward the size limit.
    entry = Member("../escape", kind, b"x", size=2**50, format=tarfile.GNU_FORMAT)
    archive = tar_bytes([entry])
    with pytest.raises(PiShipError, match="more than 68719476736 bytes"):
        unpack_tar(io.BytesIO(archive), tempfile.mkdtemp(prefix="piship-fuzz-"))


def test_an_archive_entry_whose_name_holds_a_nul_byte_fails_typed() -> None:
    # atheris, fuzz_archive: crash-d92356fc94fe1262cf37967eda0d966cc320c35a (a pax path
    # with a NUL made os.lstat raise ValueError)
    check_unpack_tar(tar_bytes([Member("a\0b", tarfile.REGTYPE, b"x", format=tarfile.PAX_FORMAT)]))
