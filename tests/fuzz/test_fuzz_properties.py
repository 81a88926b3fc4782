"""Property tests over every parser of untrusted input (the contracts in ``parsers.py``)."""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from parsers import (
    check_claim,
    check_create_answer,
    check_end_event,
    check_envelopes,
    check_router_answer,
    check_status_body,
    check_stream_payloads,
)
from vocabulary import KEYS, STRINGS

from piship_remote.wire.connect import END_STREAM

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats()
    | st.sampled_from(STRINGS)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=5)
    ),
    max_leaves=16,
)
json_objects = st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), json_values, max_size=6)


def _envelope(flags: int, payload: bytes, length: int | None = None) -> bytes:
    return struct.pack(">BI", flags, len(payload) if length is None else length) + payload


def _payload(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


envelopes = st.builds(
    _envelope,
    st.sampled_from([0, 0, END_STREAM, 1, 0xFF]),
    st.binary(max_size=24) | json_objects.map(_payload),
    st.none() | st.integers(0, 64),
)


@FUZZ
@given(
    data=st.lists(envelopes, max_size=5).map(b"".join) | st.binary(max_size=64),
    cuts=st.lists(st.integers(0, 200), max_size=6),
    max_frame_bytes=st.sampled_from([0, 4, 64, 1 << 20]),
)
def test_envelopes_read_the_same_whole_or_in_pieces(
    data: bytes, cuts: list[int], max_frame_bytes: int
) -> None:
    check_envelopes(data, cuts, max_frame_bytes)


def _data_event(stream: str, text: str, spaced: bool) -> bytes:
    separators = (", ", ": ") if spaced else (",", ":")
    return json.dumps({"event": {"data": {stream: text}}}, separators=separators).encode()


base64_text = st.binary(max_size=12).map(lambda raw: base64.b64encode(raw).decode()) | (
    st.sampled_from(STRINGS)
)
data_events = st.builds(
    _data_event, st.sampled_from(["stdout", "stderr"]), base64_text, st.booleans()
)
stream_payloads = st.tuples(
    st.sampled_from([0, 0, 0, END_STREAM]),
    data_events | json_objects.map(_payload) | st.binary(max_size=16),
)


@FUZZ
@given(payloads=st.lists(stream_payloads, max_size=6))
def test_the_start_stream_fast_path_agrees_with_the_json_path(
    payloads: list[tuple[int, bytes]],
) -> None:
    check_stream_payloads(payloads)


@FUZZ
@given(end=json_values | json_objects)
def test_an_end_event_gives_a_code_or_a_typed_error(end: Any) -> None:
    check_end_event(end)


@FUZZ
@given(answer=json_objects)
def test_a_create_answer_gives_a_usable_sandbox_or_a_typed_error(answer: dict[str, Any]) -> None:
    check_create_answer(answer)


@FUZZ
@given(claim=json_objects)
def test_a_claim_object_is_read_without_surprises(claim: dict[str, Any]) -> None:
    check_claim(claim)


@FUZZ
@given(answer=json_objects)
def test_a_router_answer_gives_output_or_a_typed_error(answer: dict[str, Any]) -> None:
    check_router_answer(answer)


@FUZZ
@given(body=json_objects.map(json.dumps) | st.text(max_size=40))
def test_an_error_body_gives_a_detail_or_none(body: str) -> None:
    check_status_body(body)
