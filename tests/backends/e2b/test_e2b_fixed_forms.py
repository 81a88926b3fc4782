"""envd's fixed forms handled without the JSON encoder or parser: the Start envelope is
byte-identical to the generic encoding, and the start, keepalive and end events act
exactly as the parsed frames do."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from piship_remote.backends._common import SandboxErrors
from piship_remote.backends.e2b._instance import _WIRE, start_envelope, start_request
from piship_remote.backends.e2b._stream import StreamOutcome
from piship_remote.model.errors import PiShipError
from piship_remote.wire.connect import END_STREAM, Frame, connect_envelope

ODD = 'é "quoted" \\ back \x00\x01\x1f\x7f \u2028\u2029 \U0001f600 </script> \t\n\r'


def _generic(command: str, env: Mapping[str, str], cwd: str, tag: str) -> bytes:
    return connect_envelope(_WIRE.unstructure(start_request(command, env, cwd, tag)))


@pytest.mark.parametrize(
    ("command", "env", "cwd", "tag"),
    [
        ("true", {}, "/home/user", "run-1"),
        (ODD, {"A": ODD, ODD: "b", "EMPTY": ""}, ODD, ODD),
        ("", {"K": "v", "k": "V"}, "", ""),
    ],
    ids=["plain", "unusual-strings", "empty-strings"],
)
def test_the_start_envelope_is_byte_identical_to_the_generic_encoding(
    command: str, env: Mapping[str, str], cwd: str, tag: str
) -> None:
    assert start_envelope(start_request(command, env, cwd, tag)) == _generic(command, env, cwd, tag)


def test_a_lone_surrogate_fails_as_the_generic_encoding_fails() -> None:
    with pytest.raises(UnicodeEncodeError):
        _generic("\ud800", {}, "/", "t")
    with pytest.raises(UnicodeEncodeError):
        start_envelope(start_request("\ud800", {}, "/", "t"))


class _Text(str):
    """A str subclass: not plain text for the fixed form, which leaves it to json."""


def test_a_string_subclass_goes_through_the_generic_encoding() -> None:
    env = {"A": _Text("b")}
    assert start_envelope(start_request("true", env, "/", "t")) == _generic("true", env, "/", "t")


def _outcome() -> StreamOutcome:
    return StreamOutcome(None, None, SandboxErrors())


def _fast(flags: int, payload: bytes) -> tuple[bool | None, object]:
    outcome = _outcome()
    try:
        complete = outcome.handle_payload(flags, payload)
    except PiShipError as error:
        return None, str(error)
    return complete, outcome.result


def _parsed(flags: int, payload: bytes) -> tuple[bool | None, object]:
    outcome = _outcome()
    try:
        frame = Frame.parse(flags, payload)
    except ValueError as error:  # what handle_payload makes of it
        return None, str(SandboxErrors()(str(error)))
    try:
        complete = outcome.handle(frame)
    except PiShipError as error:
        return None, str(error)
    return complete, outcome.result


FIXED_EVENTS = [
    b'{"event":{"start":{"pid":4242}}}',
    b'{"event":{"keepalive":{}}}',
    b'{"event":{"end":{"exited":true,"status":"exit status 0"}}}',
    b'{"event":{"end":{"exitCode":3,"exited":true,"status":"exit status 3"}}}',
    b'{"event":{"end":{"exitCode":-1,"exited":false,"status":"signal: killed"}}}',
    b'{"event":{"end":{"exitCode":0,"exited":true,"status":""}}}',
    b'{"event":{"end":{"exited":false,"status":""}}}',
    b'{"event":{"end":{"exited":true,"status":"something odd"}}}',
]

OTHER_EVENTS = [
    b'{"event": {"start": {"pid": 1}}}',
    b'{"event":{"start":{"pid":1,"cmdId":"x"}}}',
    b'{"event":{"end":{"exitCode":01,"exited":true,"status":""}}}',
    b'{"event":{"end":{"exited":true,"status":"exit status \\u0033"}}}',
    b'{"event":{"end":{"exitCode":2,"exited":true,"status":"exit status 2","error":"e"}}}',
    b'{"event":{"end":"not an object"}}',
]


@pytest.mark.parametrize("payload", FIXED_EVENTS)
def test_a_fixed_event_is_recognised_without_the_parser(payload: bytes) -> None:
    try:
        assert _outcome()._fixed_event(0, payload) is not None
    except PiShipError:
        pass  # an end event that reports a failure: recognised, and refused as parsed


@pytest.mark.parametrize("payload", FIXED_EVENTS + OTHER_EVENTS)
def test_an_event_acts_as_its_parsed_frame(payload: bytes) -> None:
    assert _fast(0, payload) == _parsed(0, payload)


@pytest.mark.parametrize("payload", OTHER_EVENTS)
def test_any_other_form_goes_to_the_parser(payload: bytes) -> None:
    assert _outcome()._fixed_event(0, payload) is None


def test_the_end_of_stream_frame_after_an_end_event_completes_the_stream() -> None:
    outcome = _outcome()
    outcome.handle_payload(0, b'{"event":{"end":{"exitCode":7,"exited":true,"status":"x"}}}')
    assert outcome.handle_payload(END_STREAM, memoryview(b"{}")) is True
    assert outcome.result is not None and outcome.result.exit_code == 7


def test_an_end_of_stream_frame_without_an_end_event_fails_as_parsed() -> None:
    assert _fast(END_STREAM, b"{}") == _parsed(END_STREAM, b"{}")
    assert _fast(END_STREAM, b"{}")[0] is None


def test_an_end_of_stream_frame_with_an_error_goes_to_the_parser() -> None:
    payload = b'{"error":{"code":"unavailable","message":"gone"}}'
    assert _outcome()._fixed_event(END_STREAM, payload) is None
    assert _fast(END_STREAM, payload) == _parsed(END_STREAM, payload)
