"""HeaderSet: headers checked and encoded once, merged as requests merges them, and the
request bytes the transport sends with them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests

from piship_remote.model.errors import CONFIG_INVALID, PiShipError
from piship_remote.model.redact import Redactor
from piship_remote.transport import HeaderSet, Transport
from tests.transport.test_transport_framing import RecordingServer

AGENT = f"python-requests/{requests.__version__}".encode()


@pytest.fixture
def transport() -> Iterator[Transport]:
    client = Transport(redactor=Redactor())
    yield client
    client.close()


def test_a_set_holds_its_headers_encoded_in_order() -> None:
    headers = HeaderSet({"X-A": "1", "Accept": "*/*"})
    assert dict(headers) == {"X-A": "1", "Accept": "*/*"}
    assert headers.lines == (b"X-A: 1", b"Accept: */*")


def test_a_later_name_replaces_an_earlier_one_whatever_its_case() -> None:
    headers = HeaderSet({"X-A": "1", "B": "2", "x-a": "3"})
    assert list(headers.items()) == [("B", "2"), ("x-a", "3")]
    assert headers.lines == (b"B: 2", b"x-a: 3")


def test_a_merged_header_replaces_the_base_one_at_the_end() -> None:
    merged = HeaderSet({"Accept": "*/*", "X-A": "1"}).merged(HeaderSet({"accept": "a/b"}))
    assert list(merged.items()) == [("X-A", "1"), ("accept", "a/b")]
    assert merged.lines == (b"X-A: 1", b"accept: a/b")


def test_a_none_value_removes_the_base_header() -> None:
    merged = HeaderSet({"Accept": "*/*", "X-A": "1"}).merged(HeaderSet({"ACCEPT": None}))
    assert list(merged.items()) == [("X-A", "1")]
    assert not merged.has("accept")


def test_merging_a_plus_equals_merging_the_whole_at_once() -> None:
    defaults = HeaderSet({"Accept-Encoding": "gzip", "Accept": "*/*", "X-Drop": "d"})
    base = {"X-A": "1", "accept-encoding": "identity", "X-Drop": None}
    extra = {"X-B": "2", "x-a": "3"}
    stepwise = defaults.merged(HeaderSet(base).plus(extra))
    whole = defaults.merged(HeaderSet({**base, **extra}))
    assert list(stepwise.items()) == list(whole.items())
    assert stepwise.lines == whole.lines


def test_a_merge_with_the_same_sets_is_remembered() -> None:
    defaults, given = HeaderSet({"A": "1"}), HeaderSet({"B": "2"})
    assert defaults.merged(given) is defaults.merged(given)


def test_a_header_with_a_line_break_makes_the_set_invalid() -> None:
    headers = HeaderSet({"X-A": "1"}).plus({"X-Key": "value\r\nX-B: 2"})
    assert not headers.valid
    assert headers.lines is None


def test_a_value_beyond_latin_1_is_valid_but_left_to_urllib3_to_encode() -> None:
    headers = HeaderSet({"X-A": "\u20ac"})
    assert headers.valid
    assert headers.lines is None


def test_the_length_is_added_last_or_replaced_in_place() -> None:
    assert HeaderSet({"A": "1"}).with_length(5).lines == (b"A: 1", b"Content-Length: 5")
    replaced = HeaderSet({"Content-Length": "9", "A": "1"}).with_length(5)
    assert replaced.lines == (b"Content-Length: 5", b"A: 1")


def test_the_repr_names_the_headers_but_never_shows_a_value() -> None:
    assert "s3cr3t" not in repr(HeaderSet({"X-API-Key": "s3cr3t"}))


def test_an_invalid_set_is_refused_without_echoing_it(transport: Transport) -> None:
    headers = HeaderSet({"X-API-Key": "leak-me\r\nX: y"})
    with pytest.raises(PiShipError) as raised:
        transport.request("GET", "http://127.0.0.1:9/x", headers=headers)
    assert raised.value.code == CONFIG_INVALID
    assert "leak-me" not in str(raised.value)


def _sent(transport: Transport, method: str, **kwargs: Any) -> bytes:
    recorder = RecordingServer()
    try:
        transport.request(method, recorder.url, timeout=10, **kwargs).close()
        assert recorder.received.wait(5)
        host = recorder.url.split("/")[2].encode()
        return recorder.raw.replace(host, b"HOST")
    finally:
        recorder.close()


@pytest.mark.timeout(20)
@pytest.mark.parametrize("as_set", [False, True], ids=["mapping", "header-set"])
def test_json_with_replaced_and_removed_session_headers_goes_out_as_before(
    transport: Transport, as_set: bool
) -> None:
    given: dict[str, str | None] = {"X-A": "1", "accept": "a/b", "X-Gone": None}
    headers = HeaderSet(given) if as_set else given
    sent = _sent(transport, "POST", headers=headers, json={"a": 'é"\u2028\x01'})
    assert sent == (
        b"POST /files HTTP/1.1\r\nHost: HOST\r\nUser-Agent: " + AGENT + b"\r\n"
        b"Accept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\nX-A: 1\r\n"
        b"accept: a/b\r\nContent-Type: application/json\r\nContent-Length: 21\r\n\r\n"
        b'{"a":"\xc3\xa9\\"\xe2\x80\xa8\\u0001"}'
    )


@pytest.mark.timeout(20)
@pytest.mark.parametrize("as_set", [False, True], ids=["mapping", "header-set"])
def test_a_callers_content_length_keeps_its_place(transport: Transport, as_set: bool) -> None:
    given = {"Content-Length": "3", "X-B": "v"}
    headers = HeaderSet(given) if as_set else given
    sent = _sent(transport, "POST", headers=headers, data=b"abc")
    assert sent == (
        b"POST /files HTTP/1.1\r\nHost: HOST\r\nUser-Agent: " + AGENT + b"\r\n"
        b"Accept-Encoding: gzip, deflate\r\nAccept: */*\r\nConnection: keep-alive\r\n"
        b"Content-Length: 3\r\nX-B: v\r\n\r\nabc"
    )


@pytest.mark.timeout(20)
def test_a_bodyless_request_replacing_the_agent_goes_out_as_before(transport: Transport) -> None:
    headers = HeaderSet({"Accept-Encoding": "identity"}).plus({"User-Agent": "me"})
    sent = _sent(transport, "DELETE", headers=headers)
    assert sent == (
        b"DELETE /files HTTP/1.1\r\nHost: HOST\r\nAccept: */*\r\nConnection: keep-alive\r\n"
        b"Accept-Encoding: identity\r\nUser-Agent: me\r\nContent-Length: 0\r\n\r\n"
    )
