"""Inputs the fuzzers found, kept as regular tests."""

from __future__ import annotations

import json

import pytest
from parsers import check_stream_payloads

from piship_remote.connect import END_STREAM

ONE_LINE_FIX = (
    "backends/e2b.py _Outcome._finish puts envd's error code and message into the "
    "PiShipError as sent; a newline in them makes a multi-line message "
    "(fix: collapse whitespace, ' '.join(text.split()), before building it)"
)


@pytest.mark.xfail(strict=True, reason=ONE_LINE_FIX)
def test_an_end_of_stream_error_with_a_newline_gives_a_one_line_message() -> None:
    # atheris, fuzz_envd_stream: crash-b501f3ce7e9e43d530afbfad2efbfb3373e41ee9
    payload = json.dumps({"error": {"code": "\nxxxxxxxxx"}}).encode()
    check_stream_payloads([(END_STREAM, payload)])
