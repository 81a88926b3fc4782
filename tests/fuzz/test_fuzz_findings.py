"""Inputs the fuzzers found, kept as regular tests."""

from __future__ import annotations

import json

import pytest
from parsers import check_stream_payloads, stream_outcome

from piship_remote.connect import END_STREAM, Frame
from piship_remote.errors import PiShipError


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
