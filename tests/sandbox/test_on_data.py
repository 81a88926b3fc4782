"""``Sandbox.exec(on_data=...)`` takes what a user naturally passes: a bytes callable, a text
stream or its ``write`` (Jupyter's ``sys.stdout`` has no ``buffer``), a binary stream, or a
function annotated to take ``str``; text is decoded safely across chunks."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from piship_remote import E2bCompatibleBackend, Sandbox, activate_sandbox
from piship_remote.sandbox._output import DataSink
from piship_remote.testing import E2bServer
from tests.support.pool import POLICY

pytestmark = pytest.mark.timeout(30)

SNOWMAN = "☃".encode()  # three bytes


class TextOnly(io.TextIOBase):
    """A text stream without ``buffer``, as ipykernel's ``OutStream``."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.flushes = 0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        assert isinstance(text, str)
        self.parts.append(text)
        return len(text)

    def flush(self) -> None:
        self.flushes += 1


@pytest.fixture
def sandbox(e2b_server: Callable[..., E2bServer], workspace: Path) -> Iterator[Sandbox]:
    def answer(start: Any) -> dict[str, Any]:
        return {"stdout": "héllo ☃\n", "exit_code": 0}

    server = e2b_server(command=answer)
    with E2bCompatibleBackend(endpoint=server.url, envd_url=server.url) as backend:
        with activate_sandbox(POLICY, backend=backend, workspace=workspace, env={}) as made:
            yield made


def test_a_text_streams_write_gets_text_and_is_flushed(sandbox: Sandbox) -> None:
    stream = TextOnly()
    sandbox.exec("echo", on_data=stream.write)
    assert "".join(stream.parts) == "héllo ☃\n" and stream.flushes >= 1


def test_a_text_stream_object_gets_text(sandbox: Sandbox) -> None:
    stream = io.StringIO()
    sandbox.exec("echo", on_data=stream)
    assert stream.getvalue() == "héllo ☃\n"


def test_a_binary_stream_gets_the_bytes(sandbox: Sandbox) -> None:
    stream = io.BytesIO()
    sandbox.exec("echo", on_data=stream)
    assert stream.getvalue() == "héllo ☃\n".encode()


def test_a_callable_gets_bytes_as_before(sandbox: Sandbox) -> None:
    chunks: list[bytes] = []
    sandbox.exec("echo", on_data=chunks.append)
    assert b"".join(chunks) == "héllo ☃\n".encode()


def test_a_function_that_says_it_takes_text_gets_text(sandbox: Sandbox) -> None:
    parts: list[str] = []

    def show(text: str) -> None:
        parts.append(text)

    sandbox.exec("echo", on_data=show)
    assert "".join(parts) == "héllo ☃\n"


def test_a_method_that_says_it_takes_text_gets_text(sandbox: Sandbox) -> None:
    class Log:
        def __init__(self) -> None:
            self.parts: list[str] = []

        def add(self, text: str) -> None:
            self.parts.append(text)

    log = Log()
    sandbox.exec("echo", on_data=log.add)
    assert "".join(log.parts) == "héllo ☃\n"


def test_a_builtin_callable_gets_bytes() -> None:
    kept = bytearray()
    sink = DataSink(kept.extend)
    sink.write("stdout", SNOWMAN)
    assert kept == SNOWMAN


def test_a_character_cut_between_chunks_arrives_whole() -> None:
    stream = TextOnly()
    sink = DataSink(stream)
    sink.write("stdout", SNOWMAN[:1])
    sink.write("stdout", SNOWMAN[1:])
    sink.close()
    assert stream.parts == ["☃"]


def test_stdout_and_stderr_are_decoded_apart() -> None:
    stream = TextOnly()
    sink = DataSink(stream)
    sink.write("stdout", SNOWMAN[:2])
    sink.write("stderr", b"err\n")
    sink.write("stdout", SNOWMAN[2:])
    assert stream.parts == ["err\n", "☃"]


def test_invalid_bytes_become_replacement_characters() -> None:
    stream = TextOnly()
    sink = DataSink(stream)
    sink.write("stdout", b"a\xffb")
    sink.write("stdout", SNOWMAN[:1])
    sink.close()
    assert "".join(stream.parts) == "a\ufffdb\ufffd"


def test_something_that_cannot_take_output_is_refused() -> None:
    with pytest.raises(TypeError, match="on_data must be a callable or a writable stream"):
        DataSink(42)  # type: ignore[arg-type]
