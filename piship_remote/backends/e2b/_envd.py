"""The envd client of one E2B sandbox: Start a command as a Connect stream, SendSignal to kill it.

envd's Process service runs in the sandbox on port 49983; the service's edge
routes to it by the ``E2b-Sandbox-Id``/``E2b-Sandbox-Port`` headers::

    envd = Envd(transport, base, sandbox_id, access_token, "user", 100.0, errors)
    try:
        response = envd.transport.request(                # the instance sends Start itself,
            "POST", envd.start_url, headers=envd.start_headers,  # with its deadline's header
            data=start_envelope(start_request("make", {}, "/home/user", tag)), stream=True,
        )
    except TransportError as e:
        raise envd.start_failed(e) from None
    with envd.started(response):
        ...                                   # decoded by e2b_stream.read_stream
    envd.kill(tag, None)
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Mapping
from json.encoder import encode_basestring

import attrs
import cattrs

from piship_remote.backends._common import (
    SandboxErrors,
    is_success,
    retry_after_seconds,
)
from piship_remote.backends._sandbox_commands import HELPER_SHELL
from piship_remote.backends.control import TerminalSize
from piship_remote.backends.e2b._stream import UNKNOWN_OUTCOME
from piship_remote.model.errors import PiShipError
from piship_remote.transport import HeaderSet, HttpClient, HttpReply, TransportError
from piship_remote.wire.connect import connect_envelope, encoded_envelope

__all__ = [
    "CONNECT_CONTENT_TYPE",
    "ENVD_PORT",
    "KEEPALIVE_INTERVAL",
    "SERVER_DEADLINE_SLACK",
    "SIGNAL_TIMEOUT",
    "Envd",
    "StartRequest",
    "connect_envelope_for",
    "start_envelope",
    "start_request",
]

ENVD_PORT = 49983
SIGNAL_TIMEOUT = 5.0
KEEPALIVE_INTERVAL = 50
# envd is told a deadline this much later than ours, as a backstop if this client is gone.
SERVER_DEADLINE_SLACK = 1.0
CONNECT_CONTENT_TYPE = "application/connect+json"


@attrs.frozen
class _ProcessConfig:
    cmd: str
    args: tuple[str, ...]
    envs: Mapping[str, str]
    cwd: str


@attrs.frozen
class _PtySize:
    cols: int
    rows: int


@attrs.frozen
class _Pty:
    size: _PtySize


@attrs.frozen
class StartRequest:
    """The body of ``/process.Process/Start``."""

    process: _ProcessConfig
    stdin: bool
    tag: str
    pty: _Pty | None = None


@attrs.frozen
class _ProcessSelector:
    tag: str


@attrs.frozen
class _SignalRequest:
    process: _ProcessSelector
    signal: str


@attrs.frozen
class _Input:
    stdin: str | None = None  # base64, one of the two
    pty: str | None = None


@attrs.frozen
class _UpdateRequest:
    process: _ProcessSelector
    pty: _Pty


@attrs.frozen
class _InputRequest:
    process: _ProcessSelector
    input: _Input


@attrs.frozen
class _CloseStdinRequest:
    process: _ProcessSelector


def _wire_converter() -> cattrs.Converter:
    converter = cattrs.Converter(omit_if_default=True)
    converter.register_unstructure_hook(Mapping, dict)
    return converter


_WIRE = _wire_converter()


def start_request(
    command: str,
    env: Mapping[str, str],
    cwd: str,
    tag: str,
    *,
    login: bool = True,
    stdin: bool = False,
    pty: TerminalSize | None = None,
) -> StartRequest:
    """Start ``command`` with ``/bin/bash -l -c`` in ``cwd``, tagged for SendSignal; with
    ``login=False`` with :data:`HELPER_SHELL` (``/bin/sh -c``), which reads no startup file.
    ``stdin``: its standard input is a pipe that SendInput writes to; ``pty``: it runs
    on a terminal of that size instead (its output then comes as ``pty`` data)."""
    cmd, *args = ("/bin/bash", "-l", "-c") if login else HELPER_SHELL
    return StartRequest(
        process=_ProcessConfig(cmd=cmd, args=(*args, command), envs=env, cwd=cwd),
        stdin=stdin,
        tag=tag,
        pty=None if pty is None else _Pty(_PtySize(pty.cols, pty.rows)),
    )


def connect_envelope_for(tag: str) -> bytes:
    """The Connect request's envelope: follow the command tagged ``tag`` again."""
    return connect_envelope({"process": _WIRE.unstructure(_ProcessSelector(tag))})


def start_envelope(start: StartRequest) -> bytes:
    """The Start request's envelope: the bytes ``connect_envelope`` makes of it, built
    from its strings (each JSON-quoted as ``json.dumps`` quotes it), without walking it
    generically; anything but strings in it goes through ``connect_envelope``."""
    process = start.process
    envs = process.envs
    strings = (process.cmd, *process.args, process.cwd, start.tag, *envs.keys(), *envs.values())
    plain = all(type(text) is str for text in strings) and type(start.stdin) is bool
    if not plain or start.pty is not None:
        return connect_envelope(_WIRE.unstructure(start))
    quote = encode_basestring
    text = "".join(
        (
            '{"process":{"cmd":',
            quote(process.cmd),
            ',"args":[',
            ",".join(map(quote, process.args)),
            '],"envs":{',
            ",".join(f"{quote(name)}:{quote(value)}" for name, value in envs.items()),
            '},"cwd":',
            quote(process.cwd),
            '},"stdin":',
            "true" if start.stdin else "false",
            ',"tag":',
            quote(start.tag),
            "}",
        )
    )
    return encoded_envelope(text.encode())


class Envd:
    """The Process service of one sandbox's envd: Start streams and SendSignal kills."""

    def __init__(
        self,
        transport: HttpClient,
        base: str,
        sandbox_id: str,
        access_token: str | None,
        user: str,
        idle_timeout: float,
        errors: SandboxErrors,
    ) -> None:
        self.transport = transport
        self._base = base
        self.start_url = f"{base}/process.Process/Start"
        self.connect_url = f"{base}/process.Process/Connect"
        self.idle_timeout = idle_timeout
        self._errors = errors
        headers = {
            "Connect-Protocol-Version": "1",
            "E2b-Sandbox-Id": sandbox_id,
            "E2b-Sandbox-Port": str(ENVD_PORT),
        }
        if access_token is not None:
            headers["X-Access-Token"] = access_token
        # Checked and encoded once for the connection, not for every request.
        self._headers = HeaderSet(headers)
        self.start_headers = HeaderSet(
            {
                "Content-Type": CONNECT_CONTENT_TYPE,
                **headers,
                "Keepalive-Ping-Interval": str(KEEPALIVE_INTERVAL),
                "Authorization": _basic(user),
                # A compressed body would hide the envelopes from the reader.
                "Accept-Encoding": "identity",
            }
        )

    def start_failed(self, error: TransportError) -> BaseException:
        """What a Start that failed in the transport raises: ``error`` itself if it
        never reached envd, else a failure saying the command may have started."""
        if not error.request_sent:
            return error
        return self._errors(
            f"starting the command failed: {error}; whether the command started is unknown, "
            f"so {UNKNOWN_OUTCOME}"
        )

    def started(self, response: HttpReply) -> HttpReply:
        """``response`` to Start, checked to be a Connect stream (closed if not), not yet read."""
        try:
            self._check_started(response)
        except BaseException:
            response.close()
            raise
        return response

    def kill(self, tag: str, cancel: threading.Event | None) -> None:
        """SendSignal SIGKILL to the command tagged ``tag`` (plain JSON, short deadline)."""
        self.transport.request(
            "POST",
            f"{self._base}/process.Process/SendSignal",
            headers=self._headers,
            json=_WIRE.unstructure(_SignalRequest(_ProcessSelector(tag), "SIGNAL_SIGKILL")),
            timeout=SIGNAL_TIMEOUT,
            cancel=cancel,
        ).close()

    def send_input(
        self, tag: str, data: bytes, cancel: threading.Event | None, *, pty: bool = False
    ) -> bool:
        """SendInput ``data`` to the stdin (``pty``: the terminal) of the command tagged
        ``tag``; False if refused."""
        encoded = base64.b64encode(data).decode("ascii")
        given = _Input(pty=encoded) if pty else _Input(stdin=encoded)
        body = _InputRequest(_ProcessSelector(tag), given)
        return self._unary("SendInput", _WIRE.unstructure(body), cancel)

    def resize(self, tag: str, size: TerminalSize, cancel: threading.Event | None) -> bool:
        """Update the terminal of the command tagged ``tag`` to ``size``; False if refused."""
        body = _UpdateRequest(_ProcessSelector(tag), _Pty(_PtySize(size.cols, size.rows)))
        return self._unary("Update", _WIRE.unstructure(body), cancel)

    def close_stdin(self, tag: str, cancel: threading.Event | None) -> bool:
        """CloseStdin of the command tagged ``tag`` (it reads end of file); False if refused."""
        body = _CloseStdinRequest(_ProcessSelector(tag))
        return self._unary("CloseStdin", _WIRE.unstructure(body), cancel)

    def _unary(self, method: str, body: object, cancel: threading.Event | None) -> bool:
        with self.transport.request(
            "POST",
            f"{self._base}/process.Process/{method}",
            headers=self._headers,
            json=body,
            timeout=self.idle_timeout,
            cancel=cancel,
        ) as response:
            return is_success(response.status)

    def _check_started(self, response: HttpReply) -> None:
        status = response.status
        if not is_success(status):
            raise _start_failure(response, self._errors)
        if status in (204, 205):
            raise self._errors(f"starting the command failed: HTTP {status}")
        content_type = response.headers.get("Content-Type", "")
        if not content_type.lower().startswith(CONNECT_CONTENT_TYPE):
            shown = content_type[:100] or "no content type"
            raise self._errors(
                f"starting the command failed: HTTP {status} with {shown}, not a Connect stream"
            )


_GONE_HINT = "the sandbox is gone (it expired or was deleted); activate a new sandbox"


def _start_failure(response: HttpReply, errors: SandboxErrors) -> PiShipError:
    """A non-2xx Start: envd's own errors, or plain JSON and HTML from the edge proxy."""
    status = response.status
    if "html" in response.headers.get("Content-Type", "").lower():
        detail = f"HTTP {status} (an HTML error page from a proxy, not an answer from envd)"
        response.close()
    else:
        detail = response.failure()
    hint = _start_hint(status, detail)
    retry_after = response.headers.get("Retry-After")
    return errors(
        f"starting the command failed: {detail}" + (f"; {hint}" if hint else ""),
        retryable=status == 429,
        not_started=hint == _GONE_HINT,
        retry_after=retry_after_seconds(retry_after) if status == 429 else None,
    )


def _start_hint(status: int, detail: str) -> str | None:
    if status == 401:
        return "envd refused the access token or the user"
    if status == 429:
        return "the sandbox has too many concurrent connections; try again shortly"
    if status == 502 and "not found" in detail.lower():
        return _GONE_HINT
    if status in (502, 503, 504):
        return "the sandbox cannot be reached"
    return None


def _basic(user: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:".encode()).decode("ascii")
