"""What every parser of untrusted input must do, as checks both fuzzers drive.

Each ``check_*`` function feeds one input to a parser and asserts its contract:
it returns a well-formed value or raises the one typed error it documents;
anything else (an ``IndexError``, a ``TypeError``, a wrong answer) is a finding.
The hypothesis tests in ``test_fuzz_properties.py`` and the atheris targets
``fuzz_*.py`` (coverage-guided, run by hand) call the same functions.

Private entry points are used on purpose, each through a small adapter here:
the E2B Start stream through ``StreamOutcome.handle_payload``, the create answer
through ``ControlPlane.create`` with its HTTP exchange replaced, and the
Kubernetes claim and router answers through the functions that read them.
Archives go through the public ``unpack_tar``, each into a new temporary directory.
"""

from __future__ import annotations

import io
import ipaddress
import json
import os
import stat
import tempfile
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from piship_remote.backends._common import SandboxErrors
from piship_remote.backends._credential import Credential
from piship_remote.backends.e2b import _control as e2b_control
from piship_remote.backends.e2b._stream import StreamOutcome
from piship_remote.backends.kubernetes import _claims_api as claim_reading
from piship_remote.backends.kubernetes import _http as kubernetes_http
from piship_remote.backends.kubernetes._router import Router
from piship_remote.backends.kubernetes.claims import ClaimGone
from piship_remote.model.errors import CONFIG_INVALID, PiShipError, SandboxUnavailable
from piship_remote.model.redact import Redactor
from piship_remote.transport import Transport
from piship_remote.wire.connect import EnvelopeReader, Frame
from piship_remote.workspace._archive import unpack_tar

# -- Connect envelopes -----------------------------------------------------------------------


def check_envelopes(data: bytes, cuts: Sequence[int], max_frame_bytes: int) -> None:
    """Frames read from ``data`` in pieces equal those read at once; errors are ValueError."""
    try:
        whole: list[Frame] | None = EnvelopeReader(max_frame_bytes).push(data)
    except ValueError:
        whole = None
    reader = EnvelopeReader(max_frame_bytes)
    pieces: list[Frame] = []
    start = 0
    try:
        for cut in sorted({min(max(c, 0), len(data)) for c in cuts} | {len(data)}):
            pieces += reader.push(data[start:cut])
            start = cut
    except ValueError:
        # A piece may fail earlier than the whole (an oversized header is refused on
        # arrival), but never when reading the whole succeeded.
        assert whole is None, "a split stream failed where the whole one did not"
        return
    if whole is not None:
        assert pieces == whole, "splitting the stream changed its frames"
        assert reader.pending == _trailing(data, whole)
    for frame in pieces:
        assert isinstance(frame.message, dict)


def _trailing(data: bytes, frames: list[Frame]) -> int:
    """The bytes after the last whole frame (what a reader must still hold)."""
    position = 0
    for _ in frames:
        position += 5 + int.from_bytes(data[position + 1 : position + 5], "big")
    return len(data) - position


# -- the E2B Start stream --------------------------------------------------------------------


def stream_outcome() -> tuple[StreamOutcome, list[tuple[str, bytes]]]:
    emitted: list[tuple[str, bytes]] = []
    outcome = StreamOutcome(
        lambda chunk: emitted.append(("stdout", chunk)),
        lambda chunk: emitted.append(("stderr", chunk)),
        SandboxErrors(Redactor()),
    )
    return outcome, emitted


def check_stream_payloads(payloads: Sequence[tuple[int, bytes]]) -> None:
    """``handle_payload`` (with its data-event fast path) agrees with the plain JSON path.

    Both see the same envelopes; they must emit the same chunks, reach the same
    result and fail (with ``PiShipError`` only) at the same envelope.
    """
    fast, fast_out = stream_outcome()
    plain, plain_out = stream_outcome()
    for flags, payload in payloads:
        fast_done = _step(lambda f=flags, p=payload: fast.handle_payload(f, p))
        plain_done = _step(lambda f=flags, p=payload: plain.handle(Frame.parse(f, p)))
        assert fast_out == plain_out, "the data-event fast path decoded output differently"
        assert type(fast_done) is type(plain_done), (fast_done, plain_done)
        if isinstance(fast_done, PiShipError) or fast_done is True:
            break
    assert fast.result == plain.result
    if fast.result is not None:
        code = fast.result.exit_code
        assert code is None or (isinstance(code, int) and code >= 0)


def _step(action: Any) -> bool | PiShipError:
    try:
        done = action()
    except PiShipError as error:
        return _typed(error)
    except ValueError:  # Frame.parse on the plain path; handle_payload maps it
        return SandboxUnavailable("not JSON")  # what handle_payload raises for it
    assert isinstance(done, bool)
    return done


def _typed(error: PiShipError) -> PiShipError:
    assert error.message and "\n" not in error.message.strip()
    return error


def check_end_event(end: Any) -> None:
    """An end event gives an exit code ``>= 0`` or ``None``, or a ``PiShipError``."""
    outcome, _ = stream_outcome()
    try:
        outcome.handle(Frame(0, {"event": {"end": end}}))
    except PiShipError as error:
        _typed(error)
        return
    assert outcome.result is not None
    code = outcome.result.exit_code
    assert code is None or (type(code) is int and code >= 0)


# -- the E2B create answer -------------------------------------------------------------------


class _Answered:
    """A 201 whose body is ``answer``, in place of the create request's HTTP exchange."""

    status = 201

    def __init__(self, answer: dict[str, Any]) -> None:
        self._answer = answer

    def __enter__(self) -> _Answered:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def json_object(self, max_bytes: int) -> dict[str, Any]:
        return self._answer


class _Deletes:
    def __init__(self) -> None:
        self.deleted: list[str] = []

    def delete(self, sandbox_id: str) -> None:
        self.deleted.append(sandbox_id)


_NEW_SANDBOX = e2b_control.NewSandbox("base", 300, {}, False)
_REDACTOR = Redactor()
# Never sends: every adapter below replaces the HTTP exchange it would make.
_TRANSPORT = Transport(redactor=_REDACTOR, component="sandbox")


def _control_plane(answer: dict[str, Any], deletes: _Deletes) -> e2b_control.ControlPlane:
    redactor = Redactor()  # a fresh one: the answer's token is registered with it
    control = e2b_control.ControlPlane(
        _TRANSPORT, "http://127.0.0.1:9", Credential(lambda: None, None, redactor), 300, redactor
    )
    control._create_response = lambda request, closed, key: _Answered(answer)  # type: ignore[method-assign,assignment,return-value]
    control.delete = deletes.delete  # type: ignore[method-assign]
    return control


def check_create_answer(answer: dict[str, Any]) -> None:
    """A create answer gives a valid ID, header-safe token and host-like domain, or an error.

    A sandbox the answer named but that cannot be used is deleted.
    """
    deletes = _Deletes()
    control = _control_plane(answer, deletes)
    try:
        created = control.create(_NEW_SANDBOX, threading.Event(), key=e2b_control.idempotency_key())
    except PiShipError as error:
        _typed(error)
        if deletes.deleted:
            assert deletes.deleted == [answer["sandboxID"]]
        return
    assert e2b_control._SANDBOX_ID.match(created.sandbox_id)
    assert created.access_token is None or e2b_control._HEADER_VALUE.match(created.access_token)
    assert created.domain is None or e2b_control._DOMAIN.match(created.domain)
    assert not deletes.deleted


# -- Kubernetes claims and the router --------------------------------------------------------


def check_claim(claim: dict[str, Any]) -> None:
    """Reading a claim object: a condition, a name, a pod address; only ``ClaimGone`` raised."""
    ready = claim_reading.ready_condition(claim)
    assert isinstance(ready, dict)
    assert isinstance(claim_reading.condition_text(ready), str)
    name = claim_reading.sandbox_name(claim, "fallback")
    assert name == "fallback" or claim_reading.RESOURCE_NAME.match(name)
    address = claim_reading.pod_ip(claim)
    if address is not None:
        ipaddress.ip_address(address)
    try:
        claim_reading.raise_if_finished(claim)
    except ClaimGone as gone:
        assert str(gone)


_ROUTER = Router(
    kubernetes_http.ClusterHttp(_TRANSPORT, Credential(lambda: None, None, _REDACTOR), _REDACTOR),
    "http://127.0.0.1:9",
    namespace="default",
    port=8888,
)


def check_router_answer(answer: dict[str, Any]) -> None:
    """A router answer gives text output and an int-or-None exit code, or a ``PiShipError``."""
    try:
        result = _ROUTER._answer(answer)
    except PiShipError as error:
        _typed(error)
        return
    assert isinstance(result.stdout, str) and isinstance(result.stderr, str)
    assert result.exit_code is None or type(result.exit_code) is int


def check_status_body(body: str) -> None:
    """An error body's detail is a string or ``None``."""
    detail = kubernetes_http._status_detail(body)
    assert detail is None or isinstance(detail, str)


# -- archives from the sandbox ---------------------------------------------------------------


# Limits low enough that both bombs are within the fuzzers' reach.
ARCHIVE_MEMBERS = 64
ARCHIVE_BYTES = 1 << 24


def check_unpack_tar(data: bytes) -> None:
    """Unpacking any bytes writes only regular files and directories inside the destination.

    It returns a summary or raises ``PiShipError(CONFIG_INVALID)``; nothing is
    written beside the destination, no link, device or half-written file is left,
    and a path ``may_write`` refuses is never written.
    """
    with tempfile.TemporaryDirectory(prefix="piship-fuzz-") as parent:
        destination = os.path.join(parent, "destination")
        os.mkdir(destination)
        try:
            summary = unpack_tar(
                io.BytesIO(data),
                destination,
                may_write=_may_write,
                max_members=ARCHIVE_MEMBERS,
                max_bytes=ARCHIVE_BYTES,
            )
        except PiShipError as error:
            assert error.code == CONFIG_INVALID, error
            _typed(error)
            summary = None
        assert os.listdir(parent) == ["destination"], "the archive wrote beside its destination"
        files = _unpacked_files(destination)
        if summary is not None:
            assert len(files) <= summary.files


def _may_write(path: str) -> bool:
    return os.path.basename(path) != "deny"


def _unpacked_files(destination: str) -> list[str]:
    """The regular files below ``destination``, after checking nothing else is there."""
    files = []
    for directory, subdirectories, names in os.walk(destination):
        for name in subdirectories:
            assert not os.path.islink(os.path.join(directory, name)), "a link was unpacked"
        for name in names:
            path = os.path.join(directory, name)
            mode = os.lstat(path).st_mode
            assert stat.S_ISREG(mode), f"{path}: not a regular file ({stat.filemode(mode)})"
            assert not name.endswith(".part"), f"{path}: a half-written file was left"
            assert _may_write(path), f"{path}: written although may_write refused it"
            files.append(path)
    return files


# -- shared helpers --------------------------------------------------------------------------


def as_object(data: bytes) -> dict[str, Any] | None:
    """``data`` as a JSON object, as the transport parses a body; ``None`` when it is not one."""
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, Mapping) else None
