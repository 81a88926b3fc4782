"""Hostile input, property-based: what a service or a caller sends cannot break the library.

- ``EnvelopeReader`` on random bytes split anywhere: frames or ``ValueError``, nothing
  else, never a complete frame left buffered, never more than one declared frame
  held; valid envelopes always come back whole.
- ``runtime_command`` round-trips any command text, environment value, argv and
  working directory through the runtime's ``shlex.split`` and a real ``/bin/sh``.
- ``command_environment`` never passes a credential-looking, host-bound or network
  name, and passes every other allowed one unchanged.
- An error built from a response body never shows a registered secret, not even
  part of it, also when the read window cuts it in two.

``SandboxPolicy.from_dict`` on arbitrary JSON and redaction of a registered secret
in every encoding are covered in ``tests/test_policy.py`` and ``tests/test_redact.py``.
"""

from __future__ import annotations

import itertools
import json
import shlex
import string
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from piship_remote.backends.base import ExecRequest
from piship_remote.backends.kubernetes.backend import runtime_command
from piship_remote.model.environment import (
    HOST_BOUND_VARIABLES,
    NETWORK_SETTING_VARIABLES,
    command_environment,
    is_credential_name,
    is_network_setting_name,
)
from piship_remote.model.redact import Redactor
from piship_remote.testing import RecordingServer, json_response
from piship_remote.transport import Transport
from piship_remote.wire.connect import COMPRESSED, EnvelopeReader, Frame, connect_envelope

pytestmark = pytest.mark.timeout(60)

FAST = settings(max_examples=150, deadline=None)
SLOW = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
HEADER = struct.Struct(">BI")

# ---------------------------------------------------------------- EnvelopeReader


def splits(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at the given offsets (taken modulo its length)."""
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def one_shot(data: bytes, limit: int) -> tuple[list[Frame], bool]:
    """The frames in ``data`` decoded one by one, and whether a frame was invalid."""
    frames: list[Frame] = []
    offset = 0
    while len(data) - offset >= HEADER.size:
        _, length = HEADER.unpack_from(data, offset)
        try:
            reader = EnvelopeReader(max_frame_bytes=limit)
            frame = reader.push(data[offset : offset + HEADER.size + length])
        except ValueError:
            return frames, True
        if not frame:
            break
        frames += frame
        offset += HEADER.size + length
    return frames, False


@FAST
@given(
    data=st.binary(max_size=600),
    cuts=st.lists(st.integers(min_value=0), max_size=12),
    limit=st.sampled_from([0, 1, 16, 64, 1024]),
)
def test_envelope_reader_gives_frames_or_value_error(
    data: bytes, cuts: list[int], limit: int
) -> None:
    reader = EnvelopeReader(max_frame_bytes=limit)
    frames: list[Frame] = []
    pushed = 0
    failed = False
    for chunk in splits(data, cuts):
        try:
            frames += reader.push(chunk)
        except ValueError:
            failed = True
            break
        pushed += len(chunk)
        # Never more than the frame being received is held, and never a whole one.
        held = reader.pending
        if held >= HEADER.size:
            _, length = HEADER.unpack_from(data, pushed - held)
            assert length <= limit
            assert held < HEADER.size + length
        else:
            assert held < HEADER.size
    expected, invalid = one_shot(data, limit)
    assert failed == invalid
    assert frames == expected[: len(frames)]
    if not failed:
        assert frames == expected


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
messages = st.dictionaries(st.text(max_size=10), json_values, max_size=5)


@FAST
@given(
    stream=st.lists(st.tuples(messages, st.integers(0, 255)), max_size=8),
    cuts=st.lists(st.integers(min_value=0), max_size=16),
)
def test_valid_envelopes_come_back_whole_however_split(
    stream: list[tuple[dict[str, Any], int]], cuts: list[int]
) -> None:
    data = b"".join(connect_envelope(m, flags & ~COMPRESSED) for m, flags in stream)
    reader = EnvelopeReader()
    frames = [frame for chunk in splits(data, cuts) for frame in reader.push(chunk)]
    assert frames == [Frame(flags & ~COMPRESSED, m) for m, flags in stream]
    assert reader.pending == 0


@FAST
@given(length=st.integers(min_value=1025, max_value=2**32 - 1), flags=st.integers(0, 255))
def test_an_oversized_header_is_refused_before_its_payload(length: int, flags: int) -> None:
    reader = EnvelopeReader(max_frame_bytes=1024)
    with pytest.raises(ValueError):
        reader.push(HEADER.pack(flags, length))


# ---------------------------------------------------------------- runtime_command

# What can travel in argv and the environment: any text without NUL (and encodable).
arg_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40)
# Any name: a valid one, or any text (a trailing newline included).
env_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True) | st.text(max_size=6)


def runtime_argv(request: ExecRequest, workdir: str | None = None) -> list[str]:
    """What the agent-sandbox runtime executes: ``shlex.split`` of the command string."""
    return shlex.split(runtime_command(request, workdir))


def run_argv(argv: list[str], cwd: str | None = None) -> bytes:
    """Execute argv without a shell, as the runtime does, with an empty environment."""
    done = subprocess.run(argv, capture_output=True, env={}, cwd=cwd, timeout=10, check=True)
    return done.stdout


@FAST
@given(
    command=arg_text,
    env=st.dictionaries(env_names, arg_text, max_size=5),
)
def test_the_runtime_split_gives_back_the_command_and_assignments(
    command: str, env: dict[str, str]
) -> None:
    argv = runtime_argv(ExecRequest(command, "/ws", ".", env))
    kept = [f"{k}={v}" for k, v in env.items() if k.isidentifier() and k.isascii()]
    assert argv == ["env", *kept, "/bin/sh", "-c", command]


def test_a_name_ending_in_a_newline_is_dropped() -> None:
    command = runtime_command(ExecRequest("true", "/ws", ".", {"A\n": "v"}), None)
    assert command == "env /bin/sh -c 'true'"


@SLOW
@given(value=arg_text)
def test_an_environment_value_arrives_exactly(value: str) -> None:
    request = ExecRequest("printf '%s' \"$PISHIP_VALUE\"", "/ws", ".", {"PISHIP_VALUE": value})
    assert run_argv(runtime_argv(request)) == value.encode()


@SLOW
@given(args=st.lists(arg_text, max_size=6))
def test_a_command_runs_with_exactly_its_arguments(args: list[str]) -> None:
    command = "printf '%s\\0' " + " ".join(shlex.quote(a) for a in args) if args else "true"
    output = run_argv(runtime_argv(ExecRequest(command, "/ws", ".", {})))
    assert output.split(b"\0")[:-1] == [a.encode() for a in args]


segment = st.text(
    st.characters(codec="utf-8", exclude_characters="\x00/"), min_size=1, max_size=12
).filter(lambda s: s not in (".", "..") and len(s.encode()) < 200)


@SLOW
@given(segments=st.lists(segment, min_size=1, max_size=3))
def test_a_working_directory_arrives_exactly(tmp_path: Path, segments: list[str]) -> None:
    relative = "/".join(segments)
    target = tmp_path / relative
    target.mkdir(parents=True, exist_ok=True)
    request = ExecRequest("pwd", "/ws", relative, {})
    output = run_argv(runtime_argv(request, str(tmp_path)))
    assert output == f"{tmp_path}/{relative}\n".encode()


# ---------------------------------------------------------------- environment filtering

CREDENTIAL_WORDS = (
    "API_KEY", "APIKEY", "ACCESS_KEY", "SECRET_KEY", "SECRET", "TOKEN",
    "SESSION_TOKEN", "PASSWORD", "CREDENTIAL", "CREDENTIALS", "AUTH",
)  # fmt: skip
CREDENTIAL_PREFIXES = ("AWS_", "OPENAI_", "ANTHROPIC_", "GITHUB_TOKEN", "HF_", "PI_")
plain_word = st.text(string.ascii_letters + string.digits, min_size=1, max_size=6)


@st.composite
def credential_names(draw: st.DrawFn) -> str:
    """A name the reference calls a credential: a credential word as a segment, or a prefix."""
    if draw(st.booleans()):
        word = draw(st.sampled_from(CREDENTIAL_WORDS))
        before = draw(st.lists(plain_word, max_size=2))
        after = draw(st.lists(plain_word, max_size=2))
        name = "_".join([*before, word, *after])
    else:
        name = draw(st.sampled_from(CREDENTIAL_PREFIXES)) + draw(plain_word)
    return "".join(c.lower() if draw(st.booleans()) else c for c in name)


def any_case(names: frozenset[str]) -> st.SearchStrategy[str]:
    return st.sampled_from(sorted(names)).flatmap(
        lambda n: st.sampled_from([n, n.lower(), n.title()])
    )


names = (
    credential_names()
    | any_case(HOST_BOUND_VARIABLES)
    | any_case(NETWORK_SETTING_VARIABLES)
    | st.from_regex(r"(NPM_CONFIG|YARN|GIT_CONFIG)_[A-Z]{1,5}", fullmatch=True)
    | st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)
)


@FAST
@given(
    allow=st.lists(names, max_size=12),
    source=st.dictionaries(names, arg_text, max_size=12),
    extra=st.lists(credential_names(), max_size=3),
)
def test_environment_filtering_never_passes_a_credential_or_host_name(
    allow: list[str], source: dict[str, str], extra: list[str]
) -> None:
    allow = allow + extra
    source = {**source, **dict.fromkeys(extra, "hunter2-secret-value")}
    output = command_environment(allow, source)
    for name, value in output.items():
        assert name in allow and source[name] == value
        assert not is_credential_name(name)
        assert name.upper() not in HOST_BOUND_VARIABLES
        assert not is_network_setting_name(name)
    assert not set(extra) & set(output)
    # Everything else that was allowed and present does arrive, in allow-list order.
    wanted = [
        n
        for n in dict.fromkeys(allow)
        if n in source
        and not is_credential_name(n)
        and n.upper() not in HOST_BOUND_VARIABLES
        and not is_network_setting_name(n)
    ]
    assert list(output) == wanted


@FAST
@given(name=credential_names())
def test_credential_looking_names_are_recognised(name: str) -> None:
    assume(name.upper() not in ("SSH_AUTH_SOCK",))
    assert is_credential_name(name)


# ---------------------------------------------------------------- errors from hostile bodies

SECRET_ALPHABET = string.ascii_uppercase + string.digits
FILLER = st.text(string.ascii_lowercase + " \t\n.,:{}\"'", max_size=80)


@pytest.fixture(scope="module")
def echo_server() -> Iterator[RecordingServer]:
    """Answers 401 with the body given in the ``X-Body`` header (hex), like a key echo."""
    with RecordingServer(
        lambda r: json_response(401, bytes.fromhex(r.headers.get("X-Body", "")))
    ) as server:
        yield server


def failure_text(server: RecordingServer, secret: str, body: bytes) -> str:
    redactor = Redactor()
    redactor.register(secret)
    transport = Transport(redactor=redactor)
    try:
        with transport.request("GET", f"{server.url}/x", headers={"X-Body": body.hex()}) as r:
            return r.failure()
    finally:
        transport.close()


def shows_part(text: str, secret: str, size: int = 6) -> bool:
    return any(secret[i : i + size] in text for i in range(len(secret) - size + 1))


@SLOW
@given(
    secret=st.text(SECRET_ALPHABET, min_size=12, max_size=40),
    before=FILLER,
    after=FILLER,
    padding=st.integers(0, 300),
)
def test_an_echoed_secret_never_shows_in_a_failure(
    echo_server: RecordingServer, secret: str, before: str, after: str, padding: int
) -> None:
    body = (" " * padding + before + secret + after).encode()
    assert not shows_part(failure_text(echo_server, secret, body), secret)


def test_a_secret_cut_by_the_read_window_does_not_show(echo_server: RecordingServer) -> None:
    secret = "ZQ7XK2M9PL4WRT8B"
    body = (" " * 4085 + secret + " end").encode()
    assert not shows_part(failure_text(echo_server, secret, body), secret)


def test_the_echo_server_answers_with_the_body_it_was_given(echo_server: RecordingServer) -> None:
    body = json.dumps({"message": "invalid key"}).encode()
    assert (
        failure_text(echo_server, "unused-secret", body) == 'HTTP 401: {"message": "invalid key"}'
    )
