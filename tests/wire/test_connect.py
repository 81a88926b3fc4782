"""The Connect envelope codec."""

from __future__ import annotations

from typing import Any

import pytest

from piship_remote.wire.connect import END_STREAM, EnvelopeReader, Frame, connect_envelope


def test_an_envelope_is_flags_length_and_compact_json() -> None:
    payload = '{"a":[1,"é"]}'.encode()
    assert connect_envelope({"a": [1, "é"]}, END_STREAM) == b"\x02\x00\x00\x00\x0e" + payload


@pytest.mark.parametrize("split", range(1, 30))
def test_frames_split_anywhere_decode_the_same(split: int) -> None:
    data = connect_envelope({"event": {"start": {"pid": 1}}}) + connect_envelope({}, END_STREAM)
    reader = EnvelopeReader()
    frames = reader.push(data[:split]) + reader.push(data[split:])
    assert frames == [Frame(0, {"event": {"start": {"pid": 1}}}), Frame(END_STREAM, {})]
    assert reader.pending == 0


def test_one_byte_at_a_time() -> None:
    data = b"".join(connect_envelope({"n": n}) for n in range(20))
    reader = EnvelopeReader()
    frames = [frame for byte in data for frame in reader.push(bytes([byte]))]
    assert [frame.message["n"] for frame in frames] == list(range(20))


def test_an_empty_payload_or_a_non_object_is_an_empty_message() -> None:
    reader = EnvelopeReader()
    assert reader.push(b"\x00\x00\x00\x00\x00" + connect_envelope([1, 2])) == [  # type: ignore[arg-type]
        Frame(0, {}),
        Frame(0, {}),
    ]


def test_an_oversized_frame_is_refused_before_its_payload_arrives() -> None:
    header = b"\x00" + (64 * 1024 * 1024).to_bytes(4, "big")
    with pytest.raises(ValueError, match="oversized"):
        EnvelopeReader().push(header)


def test_a_compressed_frame_is_refused() -> None:
    with pytest.raises(ValueError, match="compressed"):
        EnvelopeReader().push(connect_envelope({}, 0x01))


def test_a_payload_that_is_not_json_is_refused() -> None:
    with pytest.raises(ValueError, match="not JSON"):
        EnvelopeReader().push(b"\x00\x00\x00\x00\x03{x}")


def test_a_partial_frame_is_held_until_complete() -> None:
    data = connect_envelope({"big": "x" * 100_000})
    reader = EnvelopeReader()
    for start in range(0, len(data) - 1, 4096):
        assert reader.push(data[start : min(start + 4096, len(data) - 1)]) == []
    assert reader.pending == len(data) - 1
    assert reader.push(data[-1:]) == [Frame(0, {"big": "x" * 100_000})]


def test_end_stream_is_a_flag_bit() -> None:
    assert Frame(END_STREAM | 0x80, {}).end_stream
    assert not Frame(0x80, {}).end_stream


class CountingBuffer(bytearray):
    """A reader buffer that counts the bytes copied into it and shifted inside it.

    Both counts bound the reader's work: if neither exceeds the bytes fed, decoding
    is linear however the input is split (the quadratic readers re-slice or shift a
    growing buffer for every frame or chunk).
    """

    def __init__(self) -> None:
        super().__init__()
        self.written = 0
        self.shifted = 0

    def __iadd__(self, other: Any) -> CountingBuffer:
        self.written += len(other)
        super().__iadd__(other)
        return self

    def __delitem__(self, index: Any) -> None:
        before = len(self)
        super().__delitem__(index)
        self.shifted += len(self) if isinstance(index, slice) else before - 1


@pytest.mark.parametrize(
    ("frames", "chunk"),
    [
        ([b"x" * (4 << 20)], 1000),  # one 4 MiB frame in 1000-byte chunks
        ([b"y" * 43_700] * 96, 4093),  # 32 KiB stdout frames, reads that straddle them
        ([b"z" * 10] * 50_000, 7),  # many tiny frames, tinier reads
        ([b"z" * 10] * 50_000, 256 * 1024),  # many frames in each read
    ],
)
def test_the_reader_copies_each_byte_at_most_once(frames: list[bytes], chunk: int) -> None:
    data = b"".join(connect_envelope({"d": payload.decode()}) for payload in frames)
    largest = max(len(connect_envelope({"d": payload.decode()})) for payload in frames)
    reader = EnvelopeReader()
    buffer = reader._buffer = CountingBuffer()
    decoded = 0
    for start in range(0, len(data), chunk):
        decoded += len(reader.payloads(data[start : start + chunk]))
        assert reader.pending < largest  # at most one partial frame is held
    assert decoded == len(frames)
    assert reader._buffer is buffer  # one buffer throughout, never re-sliced
    assert 0 < buffer.written <= len(data)
    assert buffer.shifted <= len(data)
