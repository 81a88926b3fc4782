"""JSON nested too deep for the parser is malformed input, never a bare RecursionError."""

from __future__ import annotations

import pytest

from piship_remote.model.redact import Redactor
from piship_remote.testing import RecordingServer, json_response
from piship_remote.transport import Transport
from piship_remote.wire.connect import EnvelopeReader, connect_envelope

DEEP = b"[" * 200_000 + b"]" * 200_000


def test_a_deeply_nested_stream_frame_is_a_value_error() -> None:
    envelope = connect_envelope({})[:1] + len(DEEP).to_bytes(4, "big") + DEEP
    with pytest.raises(ValueError, match="not JSON"):
        EnvelopeReader().push(envelope)


@pytest.mark.timeout(20)
def test_a_deeply_nested_answer_is_not_json_not_a_recursion_error() -> None:
    with RecordingServer(lambda request: json_response(200, DEEP)) as server:
        transport = Transport(redactor=Redactor())
        try:
            response = transport.request("GET", f"{server.url}/deep")
            with pytest.raises(ValueError, match="the response is not JSON"):
                response.json_object(len(DEEP) + 1)
        finally:
            transport.close()
