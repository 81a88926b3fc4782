"""The e2b-compatible backend: E2B-style sandboxes, commands streamed from their envd.

A REST control plane (E2B, CubeSandbox, ...) creates the sandbox
(``POST /sandboxes``), renews its lifetime before every command and deletes it
at the end; each command is one Connect server stream
(``POST /process.Process/Start``) from the sandbox's ``envd`` daemon::

    backend = E2bCompatibleBackend(
        endpoint="https://api.e2b.app", credential=lambda: os.environ.get("E2B_API_KEY")
    )
    instance = backend.prepare(SandboxProfile(workspace="."))
    try:
        result = instance.exec(ExecRequest("make test", cwd="."), on_stdout=sys.stdout.buffer.write)
    finally:
        instance.dispose()

The request catalogue, headers and texts follow ``reference/e2b-backend.md``;
behaviour of real services the seed's mock does not show (keepalive events, an
omitted ``exitCode``, truncated streams, plain-JSON and HTML edge errors, 429 on
create) follows ``reference/e2b-real-protocol.md`` §12.
"""

from __future__ import annotations

import base64
import binascii
import email.utils
import math
import random
import re
import secrets
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import cattrs
from cattrs.gen import make_dict_unstructure_fn, override

from piship_remote.backends.base import Availability, BackendResult, ExecRequest, OutputCallback
from piship_remote.cancel import CancelToken, EventWatcher
from piship_remote.connect import EnvelopeReader, Frame, connect_envelope
from piship_remote.errors import CONFIG_INVALID, SANDBOX_UNAVAILABLE, CommandCancelled, PiShipError
from piship_remote.redact import Redactor
from piship_remote.report import Capabilities
from piship_remote.transport import Credential, HttpResponse, Transport, TransportError

_FAST_B64: Callable[..., bytes] | None
try:
    from pybase64 import b64decode as _FAST_B64
except ImportError:  # optional speed-up; the standard library decodes the same
    _FAST_B64 = None

if TYPE_CHECKING:
    import requests

    from piship_remote.policy import SandboxProfile

__all__ = ["CreateRetry", "E2bCompatibleBackend", "E2bInstance", "remote_directory"]

BACKEND_ID = "e2b-compatible"
ENVD_PORT = 49983
HEALTH_TIMEOUT = 10.0
CONTROL_TIMEOUT = 30.0
SIGNAL_TIMEOUT = 5.0
KEEPALIVE_INTERVAL = 50
# envd is told a deadline this much later than ours, as a backstop if this client is gone.
SERVER_DEADLINE_SLACK = 1.0
MAX_CONTROL_RESPONSE = 1 << 20
DEFAULT_LIFETIME = 3600
CREATE_ATTEMPTS = 3
RETRY_BASE_DELAY = 0.5
MAX_RETRY_AFTER = 10.0
DETAIL_LIMIT = 300
RETRIED_CREATE_STATUSES = frozenset({429, 503})
CONNECT_CONTENT_TYPE = "application/connect+json"

_SANDBOX_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,127}\Z")
_DOMAIN = re.compile(r"[A-Za-z0-9.-]+(?::[0-9]{1,5})?\Z")
# What may travel in an HTTP header value: visible ASCII, nothing that ends a line.
_HEADER_VALUE = re.compile(r"[\x21-\x7e]+\Z")
_SIGNALLED = re.compile(r"signal|killed", re.IGNORECASE)
# A data event as envd writes it (protojson may add spaces): the base64 lies between.
_DATA_HEAD = re.compile(rb'\{\s*"event"\s*:\s*\{\s*"data"\s*:\s*\{\s*"(stdout|stderr)"\s*:\s*"')
_DATA_TAIL = re.compile(rb"\s*\}\s*\}\s*\}\s*")
_TAIL_WINDOW = 32
# binascii's strict_mode (Python 3.11+); before it, a pattern check does the same job.
_STRICT_MODE = sys.version_info >= (3, 11)
_CANONICAL_B64 = re.compile(rb"[A-Za-z0-9+/]*={0,2}")
_EXIT_STATUS = re.compile(r"\s*exit status (-?[0-9]{1,10})\s*\Z")
_STREAMS = ("stdout", "stderr")  # the order of _data_output's index
_UNKNOWN_OUTCOME = "check its effects before running it again"

EnvdUrl = Callable[[str, str | None], str] | str | None


@attrs.frozen
class CreateRetry:
    """How a create answered 429 or 503 is repeated: bounded, exponential, jittered.

    Like urllib3's ``Retry``, a value: :meth:`delay` draws its jitter from the
    ``random.Random`` it is given, so callers (and tests) choose the source.

    >>> CreateRetry().delay(1, None, random.Random(0)) <= RETRY_BASE_DELAY * 1.5
    True
    """

    attempts: int = CREATE_ATTEMPTS
    base_delay: float = RETRY_BASE_DELAY
    max_retry_after: float = MAX_RETRY_AFTER

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random) -> float | None:
        """Seconds before repeat number ``attempt`` (from 1); ``None`` = do not repeat.

        Without ``Retry-After``: ``base_delay * 2**(attempt-1)`` times 1 to 1.5. With it:
        the asked time times 1 to 1.25, or ``None`` when it asks for more than
        ``max_retry_after`` (the caller is told instead). Jitter spreads clients that
        were refused together.
        """
        if retry_after is None:
            return self.base_delay * 2.0 ** (attempt - 1) * rng.uniform(1.0, 1.5)
        if retry_after > self.max_retry_after:
            return None
        return retry_after * rng.uniform(1.0, 1.25)


# -- wire shapes ----------------------------------------------------------------------------


@attrs.frozen
class _NewSandbox:
    template_id: str
    timeout: int
    metadata: Mapping[str, str]
    allow_internet_access: bool


@attrs.frozen
class _Renewal:
    timeout: int


@attrs.frozen
class _ProcessConfig:
    cmd: str
    args: tuple[str, ...]
    envs: Mapping[str, str]
    cwd: str


@attrs.frozen
class _StartRequest:
    process: _ProcessConfig
    stdin: bool
    tag: str


@attrs.frozen
class _ProcessSelector:
    tag: str


@attrs.frozen
class _SignalRequest:
    process: _ProcessSelector
    signal: str


def _wire_converter() -> cattrs.Converter:
    converter = cattrs.Converter()
    converter.register_unstructure_hook(
        _NewSandbox,
        make_dict_unstructure_fn(_NewSandbox, converter, template_id=override(rename="templateID")),
    )
    converter.register_unstructure_hook(Mapping, dict)
    return converter


_WIRE = _wire_converter()


@attrs.frozen
class _Created:
    """The parts of the create answer this backend uses."""

    sandbox_id: str
    access_token: str | None
    domain: str | None


@attrs.frozen
class _Errors:
    """Makes this backend's errors: ``SANDBOX_UNAVAILABLE`` unless told, always redacted."""

    redactor: Redactor

    def __call__(
        self,
        message: str,
        *,
        code: str = SANDBOX_UNAVAILABLE,
        retryable: bool = False,
        retry_after: float | None = None,
    ) -> PiShipError:
        return PiShipError(
            code,
            message,
            retryable=retryable,
            retry_after=retry_after,
            component="sandbox",
            redactor=self.redactor,
        )


# -- the control plane ----------------------------------------------------------------------


class _ControlPlane:
    """The service's REST API (``/sandboxes…``): the only place ``X-API-Key`` is sent."""

    def __init__(
        self,
        transport: Transport,
        endpoint: str,
        credential: Credential,
        lifetime: int,
        errors: _Errors,
    ) -> None:
        self.endpoint = endpoint
        self.lifetime = lifetime
        self._transport = transport
        self._credential = credential
        self._errors = errors

    def request(
        self,
        method: str,
        path: str,
        *,
        repeatable: bool,
        body: object = None,
        cancel: threading.Event | None = None,
    ) -> HttpResponse:
        """One request under the 401 protocol; ``body`` is an attrs wire shape."""
        return self._transport.credentialed(
            method,
            f"{self.endpoint}{path}",
            credential=self._credential,
            auth_header=_api_key_header,
            repeatable=repeatable,
            json=None if body is None else _WIRE.unstructure(body),
            timeout=CONTROL_TIMEOUT,
            cancel=cancel,
        )

    def renew(self, sandbox_id: str, cancel: threading.Event) -> None:
        """``POST /sandboxes/<id>/timeout``: the sandbox lives ``lifetime`` seconds from now."""
        try:
            response = self.request(
                "POST",
                f"/sandboxes/{sandbox_id}/timeout",
                repeatable=True,
                body=_Renewal(self.lifetime),
                cancel=cancel,
            )
        except TransportError as error:
            raise TransportError(
                f"renewing the sandbox failed: {error.message}",
                request_sent=error.request_sent,
                component=error.component or "sandbox",
            ) from None
        with response:
            if not _ok(response.status):
                raise self._errors(f"the sandbox is no longer available: {response.failure()}")

    def delete(self, sandbox_id: str) -> None:
        """``DELETE /sandboxes/<id>``; every outcome is ignored (it also expires on its own)."""
        try:
            self.request("DELETE", f"/sandboxes/{sandbox_id}", repeatable=True).close()
        except Exception:
            pass  # best effort by design


# -- envd, the data plane of one sandbox ----------------------------------------------------


class _Envd:
    """The Process service of one sandbox's envd: Start streams and SendSignal kills."""

    def __init__(
        self,
        transport: Transport,
        base: str,
        sandbox_id: str,
        access_token: str | None,
        user: str,
        idle_timeout: float,
        errors: _Errors,
    ) -> None:
        self._transport = transport
        self._base = base
        self._idle_timeout = idle_timeout
        self._errors = errors
        self._headers = {
            "Connect-Protocol-Version": "1",
            "E2b-Sandbox-Id": sandbox_id,
            "E2b-Sandbox-Port": str(ENVD_PORT),
        }
        if access_token is not None:
            self._headers["X-Access-Token"] = access_token
        self._start_headers = {
            "Content-Type": CONNECT_CONTENT_TYPE,
            **self._headers,
            "Keepalive-Ping-Interval": str(KEEPALIVE_INTERVAL),
            "Authorization": _basic(user),
            # A compressed body would hide the envelopes from the reader.
            "Accept-Encoding": "identity",
        }

    def start(
        self, start: _StartRequest, cancel: threading.Event, timeout: float | None = None
    ) -> HttpResponse:
        """Send Start; the response is checked to be a Connect stream, not yet read.

        With a ``timeout`` envd is told the deadline too (``Connect-Timeout-Ms``), a
        little later than ours, so it ends the command even if this client is gone.
        """
        headers = self._start_headers
        if timeout is not None:
            deadline_ms = math.ceil((timeout + SERVER_DEADLINE_SLACK) * 1000)
            headers = {**headers, "Connect-Timeout-Ms": str(max(1, deadline_ms))}
        try:
            response = self._transport.request(
                "POST",
                f"{self._base}/process.Process/Start",
                headers=headers,
                data=connect_envelope(_WIRE.unstructure(start)),
                timeout=self._idle_timeout,
                idle_timeout=self._idle_timeout,
                cancel=cancel,
                stream=True,
            )
        except TransportError as e:
            if not e.request_sent:
                raise
            raise self._errors(
                f"starting the command failed: {e}; whether the command started is unknown, "
                f"so {_UNKNOWN_OUTCOME}"
            ) from None
        try:
            self._check_started(response)
        except BaseException:
            response.close()
            raise
        return response

    def kill(self, tag: str, cancel: threading.Event | None) -> None:
        """SendSignal SIGKILL to the command tagged ``tag`` (plain JSON, short deadline)."""
        self._transport.request(
            "POST",
            f"{self._base}/process.Process/SendSignal",
            headers=self._headers,
            json=_WIRE.unstructure(_SignalRequest(_ProcessSelector(tag), "SIGNAL_SIGKILL")),
            timeout=SIGNAL_TIMEOUT,
            cancel=cancel,
        ).close()

    def _check_started(self, response: HttpResponse) -> None:
        status = response.status
        if not _ok(status):
            raise _start_failure(response, self._errors)
        if status in (204, 205):
            raise self._errors(f"starting the command failed: HTTP {status}")
        content_type = response.headers.get("Content-Type", "")
        if not content_type.lower().startswith(CONNECT_CONTENT_TYPE):
            shown = content_type[:100] or "no content type"
            raise self._errors(
                f"starting the command failed: HTTP {status} with {shown}, not a Connect stream"
            )


# -- the backend ----------------------------------------------------------------------------


class E2bCompatibleBackend:
    """Sandboxes from an E2B-compatible service (E2B itself, CubeSandbox, ...).

    ``credential`` is read fresh for every control-plane request and sent only as
    ``X-API-Key`` to ``/sandboxes…``; ``credential_rejected`` is called on HTTP 401
    (``True`` = a renewed credential is ready; renewals and deletes are then sent
    once more, a create never). ``user`` is envd's process user (``"root"`` for
    CubeSandbox). ``envd_url`` overrides the envd base URL: a string, or a callable
    of ``(sandbox_id, domain)``; tests point it at their mock.
    ``stream_idle_timeout`` is how long a command stream may stay silent (envd
    sends a keepalive every 50 s) before it counts as lost.
    """

    id = BACKEND_ID
    provider = BACKEND_ID

    def __init__(
        self,
        *,
        endpoint: str,
        template: str = "base",
        workdir: str = "/home/user",
        user: str = "user",
        lifetime_seconds: int = DEFAULT_LIFETIME,
        credential: Callable[[], str | None] | None = None,
        credential_rejected: Callable[[], bool] | None = None,
        envd_url: EnvdUrl = None,
        session: requests.Session | None = None,
        stream_idle_timeout: float = 2.0 * KEEPALIVE_INTERVAL,
    ) -> None:
        self.redactor = Redactor()
        self._errors = _Errors(self.redactor)
        self._transport = Transport(redactor=self.redactor, component="sandbox", session=session)
        self._control = _ControlPlane(
            self._transport,
            self._transport.endpoint(endpoint),
            Credential(credential, credential_rejected, self.redactor),
            _lifetime(lifetime_seconds),
            self._errors,
        )
        self._template = template
        self._workdir = workdir
        self._user = user
        self._envd_url = envd_url
        self._idle_timeout = stream_idle_timeout
        self._random = random.Random()
        self._retry = CreateRetry()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._instances: set[E2bInstance] = set()

    def __repr__(self) -> str:
        return f"<E2bCompatibleBackend {self._control.endpoint}>"

    def capabilities(self) -> Capabilities:
        """Remote isolation, network deny or allow, filtered environment; no network probe."""
        return Capabilities(
            isolation="remote",
            planes=("host-filesystem-isolation", "network-deny", "environment-filter"),
            network=("deny", "allow"),
            local_processes=False,
        )

    def available(self) -> Availability:
        """``GET /health`` without credentials; any 2xx means available. Never raises."""
        try:
            response = self._transport.request(
                "GET", f"{self._control.endpoint}/health", timeout=HEALTH_TIMEOUT
            )
        except Exception as e:  # availability is reported, never raised
            text = self.redactor.redact(str(e) or type(e).__name__)[:DETAIL_LIMIT]
            return Availability(False, f"the {BACKEND_ID} endpoint is unreachable: {text}")
        response.close()
        if _ok(response.status):
            return Availability(True)
        return Availability(
            False, f"the {BACKEND_ID} endpoint health check returned HTTP {response.status}"
        )

    def prepare(self, profile: SandboxProfile) -> E2bInstance:
        """Create a sandbox for ``profile`` (only its network mode is used)."""
        if self._closed.is_set():
            raise self._closed_error()
        created = self._create(
            _NewSandbox(
                template_id=self._template,
                timeout=self._control.lifetime,
                metadata={"created-by": "piship"},
                allow_internet_access=profile.network == "allow",
            )
        )
        try:
            instance = self._instance(created)
        except BaseException:
            self._control.delete(created.sandbox_id)
            raise
        with self._lock:
            if not self._closed.is_set():
                self._instances.add(instance)
                return instance
        instance.dispose()
        raise self._closed_error()

    def close(self) -> None:
        """Dispose every sandbox this backend still holds and release its connections."""
        with self._lock:
            self._closed.set()
            instances = list(self._instances)
        for instance in instances:
            instance.dispose()
        self._transport.close()

    # -- creating a sandbox ---------------------------------------------------------------

    def _create(self, request: _NewSandbox) -> _Created:
        try:
            response = self._create_response(request)
        except TransportError as error:
            raise self._lost_answer(error.message) if error.request_sent else error from None
        with response:
            if not _ok(response.status):
                raise self._create_failure(response)
            try:
                answer = response.json_object(MAX_CONTROL_RESPONSE)
            except ValueError as e:
                raise self._lost_answer(f"the create answer was invalid: {e}") from None
            except TransportError as error:
                raise self._lost_answer(error.message) from None
        sandbox_id = answer.get("sandboxID")
        if not isinstance(sandbox_id, str) or not _SANDBOX_ID.match(sandbox_id):
            raise self._errors("the sandbox service returned no valid sandbox ID")
        try:
            return _Created(sandbox_id, self._access_token(answer), _domain(answer))
        except BaseException:
            self._control.delete(sandbox_id)
            raise

    def _create_response(self, request: _NewSandbox) -> HttpResponse:
        """Send the create; repeat it (bounded, jittered) only on 429 or 503.

        Those statuses mean nothing was created, unlike a 401 or a lost answer,
        after which a repeat could leave a second sandbox behind.
        """
        attempt = 0
        while True:
            response = self._control.request("POST", "/sandboxes", repeatable=False, body=request)
            attempt += 1
            if response.status not in RETRIED_CREATE_STATUSES or attempt >= self._retry.attempts:
                return response
            asked = _retry_after(response.headers.get("Retry-After"))
            delay = self._retry.delay(attempt, asked, self._random)
            if delay is None:
                return response
            response.close()
            if self._closed.wait(delay):
                raise self._closed_error()

    def _lost_answer(self, reason: str) -> PiShipError:
        """The service may have created a sandbox whose ID never arrived.

        Nothing can find it safely (the create carries no unique mark, and other
        clients share the key), so the error says it may exist and how long it lives.
        """
        return self._errors(
            f"creating the sandbox failed: {reason}; a sandbox may have been created "
            f"without its ID reaching PiShip, and it expires on its own within "
            f"{self._control.lifetime} s"
        )

    def _create_failure(self, response: HttpResponse) -> PiShipError:
        retryable = response.status in RETRIED_CREATE_STATUSES
        return self._errors(
            f"creating the sandbox failed: {response.failure()}",
            retryable=retryable,
            retry_after=_retry_after(response.headers.get("Retry-After")) if retryable else None,
        )

    def _access_token(self, answer: Mapping[str, Any]) -> str | None:
        token = answer.get("envdAccessToken")
        if token is None or token == "":
            return None
        if not isinstance(token, str) or not _HEADER_VALUE.match(token):
            raise self._errors("the sandbox service returned an invalid envd access token")
        self.redactor.register(token)
        return token

    def _instance(self, created: _Created) -> E2bInstance:
        envd = _Envd(
            self._transport,
            self._envd_base(created),
            created.sandbox_id,
            created.access_token,
            self._user,
            self._idle_timeout,
            self._errors,
        )
        return E2bInstance(
            created.sandbox_id, self._workdir, self._control, envd, self._errors, self._forget
        )

    def _envd_base(self, created: _Created) -> str:
        try:
            if callable(self._envd_url):
                url = self._envd_url(created.sandbox_id, created.domain)
            elif self._envd_url is not None:
                url = self._envd_url
            else:
                parts = urllib.parse.urlsplit(self._control.endpoint)
                domain = created.domain or _strip_api(parts.netloc)
                url = f"{parts.scheme}://{ENVD_PORT}-{created.sandbox_id}.{domain}"
            return self._transport.endpoint(url)
        except PiShipError as e:
            raise self._errors(
                f"the sandbox's envd address cannot be used: {e}", code=e.code
            ) from None
        except Exception as e:  # a failing envd_url callable
            raise self._errors(
                f"the sandbox's envd address cannot be used: {type(e).__name__}: {e}"
            ) from None

    def _forget(self, instance: E2bInstance) -> None:
        with self._lock:
            self._instances.discard(instance)

    def _closed_error(self) -> PiShipError:
        return self._errors(f"the {BACKEND_ID} backend was closed; create a new one")


# -- one sandbox ----------------------------------------------------------------------------


class E2bInstance:
    """One prepared sandbox: run commands in it, then dispose of it.

    Commands may run concurrently; each has its own tag (for SendSignal), its
    own renewal and its own stream. :meth:`dispose` ends running commands with an
    error mentioning "disposed", deletes the sandbox, and waits for the
    background kill requests it started.
    """

    def __init__(
        self,
        sandbox_id: str,
        workdir: str,
        control: _ControlPlane,
        envd: _Envd,
        errors: _Errors,
        on_disposed: Callable[[E2bInstance], None],
    ) -> None:
        self.sandbox_id = sandbox_id
        self._workdir = workdir
        self._control = control
        self._envd = envd
        self._errors = errors
        self._on_disposed = on_disposed
        self._lock = threading.Lock()
        self._disposed = False
        self._closing = CancelToken()
        self._running: dict[CancelToken, Callable[[], None]] = {}
        self._signallers: set[threading.Thread] = set()
        self._watcher = EventWatcher()

    def __repr__(self) -> str:
        return f"<E2bInstance {self.sandbox_id}>"

    def epoch(self) -> str | None:
        """The sandbox ID: it never changes for an instance."""
        return self.sandbox_id

    def exec(
        self,
        request: ExecRequest,
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        cancel: threading.Event | None = None,
    ) -> BackendResult:
        """Renew the sandbox, run ``request.command`` with ``/bin/bash -l -c``, stream its output.

        Setting ``cancel`` sends SendSignal SIGKILL for the command (in the
        background), closes the stream and raises :class:`CommandCancelled`.
        """
        if cancel is not None and cancel.is_set():
            raise CommandCancelled()
        cwd = remote_directory(self._workdir, request.workspace_path)
        token = self._begin(cancel)
        try:
            result = self._run(request, cwd, token, on_stdout, on_stderr)
            if token.is_set():
                # Cancelled as it ended: the kill is on its way, so the caller is told so.
                raise CommandCancelled()
            return result
        except (PiShipError, CommandCancelled) as e:
            if not token.is_set():
                raise
            # The token ended the call: say why, whatever the interrupted read raised.
            if self._closing.is_set() and not (cancel is not None and cancel.is_set()):
                raise self._errors("the sandbox was disposed while the command ran") from None
            if isinstance(e, CommandCancelled):
                raise
            raise CommandCancelled() from None
        finally:
            self._end(token)

    def dispose(self) -> None:
        """Delete the sandbox. Idempotent and thread-safe; running commands end at once."""
        with self._lock:
            if self._disposed:
                return
            self._disposed = True
            running = list(self._running)
        self._closing.set()
        for token in running:
            token.set()
        self._control.delete(self.sandbox_id)
        with self._lock:
            signallers = list(self._signallers)
        for thread in signallers:
            thread.join()
        self._watcher.close()
        self._on_disposed(self)

    # -- one command ------------------------------------------------------------------------

    def _begin(self, cancel: threading.Event | None) -> CancelToken:
        """A token for this command, set by ``cancel`` or by dispose."""
        token = CancelToken()
        with self._lock:
            if self._disposed:
                raise self._errors("the sandbox was disposed")
            self._running[token] = _nothing
        if cancel is None:
            return token
        if isinstance(cancel, CancelToken):
            forget = cancel.on_cancel(token.set)
        else:
            forget = self._watcher.watch(cancel, token)
            if cancel.is_set():
                token.set()
        with self._lock:
            self._running[token] = forget
        return token

    def _end(self, token: CancelToken) -> None:
        with self._lock:
            forget = self._running.pop(token, _nothing)
        forget()

    def _run(
        self,
        request: ExecRequest,
        cwd: str,
        token: CancelToken,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
    ) -> BackendResult:
        self._control.renew(self.sandbox_id, token)
        tag = f"piship-{secrets.token_hex(8)}"
        # Armed only after the renewal: a cancel during it aborts just the renewal.
        forget_kill = token.on_cancel(lambda: self._signal(tag))
        try:
            start = _StartRequest(
                process=_ProcessConfig(
                    cmd="/bin/bash", args=("-l", "-c", request.command), envs=request.env, cwd=cwd
                ),
                stdin=False,
                tag=tag,
            )
            with self._envd.start(start, token, request.timeout) as response:
                try:
                    return _read_stream(response, on_stdout, on_stderr, self._errors)
                except PiShipError:
                    if not token.is_set():
                        # The stream broke (idle, dropped): envd keeps a command running
                        # after a disconnect, so kill what can no longer be watched.
                        self._signal(tag)
                    raise
        finally:
            forget_kill()

    # -- SendSignal, in the background ------------------------------------------------------

    def _signal(self, tag: str) -> None:
        """Start a ``piship-e2b-signal`` thread that kills the command ``tag``; never blocks."""
        if self._closing.is_set():
            return  # dispose deletes the whole sandbox instead
        thread = threading.Thread(
            target=self._kill, args=(tag,), name="piship-e2b-signal", daemon=True
        )
        with self._lock:
            if self._disposed:
                return
            self._signallers.add(thread)
            thread.start()

    def _kill(self, tag: str) -> None:
        try:
            # Not cancelled by dispose: a kill on its way must arrive (it has a short deadline).
            self._envd.kill(tag, None)
        except Exception:
            pass  # best effort: the stream is closed anyway
        finally:
            with self._lock:
                self._signallers.discard(threading.current_thread())


# -- the Start stream -----------------------------------------------------------------------


class _Outcome:
    """What the frames of one Start stream said so far."""

    def __init__(
        self,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
        errors: _Errors,
    ) -> None:
        self.result: BackendResult | None = None
        self._outputs = {"stdout": on_stdout, "stderr": on_stderr}
        self._errors = errors

    def handle_payload(self, flags: int, payload: bytes | memoryview) -> bool:
        """Act on one envelope; a plain data event skips the JSON parser (``True``: complete).

        envd's data events are ``{"event":{"data":{"stdout":"<base64>"}}}``: the
        base64 is sliced out and strictly decoded. Anything unusual (escapes,
        other fields, lenient base64) goes through :meth:`handle` instead.
        """
        if not flags:
            output = _data_output(payload)
            if output is not None:
                index, chunk = output
                self._emit(_STREAMS[index], chunk)
                return False
        try:
            frame = Frame.parse(flags, payload)
        except ValueError as e:
            raise self._errors(str(e)) from None
        return self.handle(frame)

    def handle(self, frame: Frame) -> bool:
        """Act on one frame; ``True`` once the stream is complete."""
        if frame.end_stream:
            self._finish(frame.message)
            return True
        event = _object(frame.message.get("event"))
        data = _object(event.get("data"))
        for stream in self._outputs:
            value = data.get(stream)
            if isinstance(value, str):
                self._emit(stream, self._decode(value))
        if "end" in event:
            self.result = BackendResult(exit_code=self._exit_code(event["end"]))
        return False

    def _emit(self, stream: str, chunk: bytes) -> None:
        callback = self._outputs[stream]
        if callback is not None and chunk:
            callback(chunk)

    def cut_off(self) -> PiShipError:
        """The error for a body that ended before its end-of-stream frame."""
        if self.result is None:
            return self._errors("the command stream ended without an exit status")
        return self._errors(
            "the command stream ended without its end-of-stream frame, so the outcome "
            "the sandbox reported cannot be trusted"
        )

    def _finish(self, message: Mapping[str, Any]) -> None:
        error = _object(message.get("error"))
        if error:
            code = error.get("code")
            text = error.get("message")
            code_text = "unknown" if code is None else str(code)
            detail = "" if text is None else str(text)
            raise self._errors(f"the command stream failed: {code_text} {detail}".strip())
        if self.result is None:
            raise self._errors("the command stream ended without an exit status")

    def _exit_code(self, end: object) -> int | None:
        if not isinstance(end, dict):
            raise self._errors(
                "the command stream failed: the sandbox sent an end event that is not an object"
            )
        try:
            return _exit_code(end)
        except ValueError as e:
            raise self._errors(f"the command stream failed: {e}") from None

    def _decode(self, value: str) -> bytes:
        try:
            return _lenient_b64(value)
        except (binascii.Error, ValueError):
            raise self._errors(
                "the command stream failed: the sandbox sent output that is not base64"
            ) from None


def _read_stream(
    response: HttpResponse,
    on_stdout: OutputCallback | None,
    on_stderr: OutputCallback | None,
    errors: _Errors,
) -> BackendResult:
    """Decode frames as they arrive, until the end-of-stream frame."""
    reader = EnvelopeReader()
    outcome = _Outcome(on_stdout, on_stderr, errors)
    try:
        for chunk in response.iter_raw():
            try:
                payloads = reader.payloads(chunk)
            except ValueError as e:
                raise errors(str(e)) from None
            for flags, payload in payloads:
                if outcome.handle_payload(flags, payload):
                    assert outcome.result is not None
                    response.finish()  # the terminator: the connection can be reused
                    return outcome.result
    except TransportError as e:
        raise errors(
            f"the command stream was interrupted: {e}; the command's outcome is unknown, "
            f"so {_UNKNOWN_OUTCOME}"
        ) from None
    raise outcome.cut_off()


def _exit_code(end: Mapping[str, Any]) -> int | None:
    """envd's end event → the exit code; ``None`` for a signal exit.

    ``exitCode`` (or ``exit_code``) is used when it is an int (a bool is not): -1,
    envd's answer for a signalled process, is ``None``. protojson omits a zero
    code, so without one the code comes from ``status`` (``"exit status N"`` → N,
    ``"signal: killed"`` → ``None``), and is 0 only when nothing in the event
    says the command failed. Raises ``ValueError`` when the event reports a
    failure (an ``error``, an unreadable code or status, ``exited: false``)
    without a usable exit code: failing open to 0 would report a failure as success.

    >>> _exit_code({"exited": True, "status": "exit status 0"})
    0
    >>> _exit_code({"exitCode": 3, "exited": True, "status": "exit status 3"})
    3
    >>> _exit_code({"exitCode": -1, "exited": False, "status": "signal: killed"}) is None
    True
    """
    code = end.get("exitCode", end.get("exit_code"))
    if isinstance(code, float) and code.is_integer():
        code = int(code)
    if isinstance(code, int) and not isinstance(code, bool):
        return code if code >= 0 else None
    status = end.get("status")
    if isinstance(status, str):
        if match := _EXIT_STATUS.match(status):
            number = int(match.group(1))
            return number if number >= 0 else None
        if _SIGNALLED.search(status):
            return None
    failure = _failure_sign(code, status, end)
    if failure is not None:
        raise ValueError(f"the sandbox reported {failure} without a usable exit code")
    return 0


def _failure_sign(code: object, status: object, end: Mapping[str, Any]) -> str | None:
    """What in an end event without a usable exit code says the command did not succeed."""
    if code is not None:
        return "an exit code that is not an integer"
    if status is not None and status != "":
        return "an unrecognised status"
    error = end.get("error")
    if error is not None and error != "":
        return "an error"
    if end.get("exited") is False:
        return "a process that did not exit"
    return None


def _data_output(payload: bytes | memoryview) -> tuple[int, bytes] | None:
    """``(0 for stdout / 1 for stderr, bytes)`` of a plain data event, else ``None``.

    ``None`` also for anything the strict decoder refuses; the caller then parses
    the JSON, which handles every form (whitespace, escapes, lenient base64).
    """
    head = _DATA_HEAD.match(payload)
    if head is None:
        return None
    tail = bytes(payload[-_TAIL_WINDOW:])
    quote = tail.rfind(b'"')
    if quote < 0 or not _DATA_TAIL.fullmatch(tail, quote + 1):
        return None
    end = len(payload) - len(tail) + quote
    if end < head.end():
        return None
    try:
        data = _strict_b64(payload[head.end() : end])
    except (binascii.Error, ValueError):
        return None
    return (0 if head.group(1) == b"stdout" else 1), data


def _start_failure(response: HttpResponse, errors: _Errors) -> PiShipError:
    """A non-2xx Start: envd's own errors, or plain JSON and HTML from the edge proxy."""
    status = response.status
    if "html" in response.headers.get("Content-Type", "").lower():
        detail = f"HTTP {status} (an HTML error page from a proxy, not an answer from envd)"
        response.close()
    else:
        detail = response.failure()
    hint = _start_hint(status, detail)
    return errors(
        f"starting the command failed: {detail}" + (f"; {hint}" if hint else ""),
        retryable=status == 429,
        retry_after=_retry_after(response.headers.get("Retry-After")) if status == 429 else None,
    )


def _start_hint(status: int, detail: str) -> str | None:
    if status == 401:
        return "envd refused the access token or the user"
    if status == 429:
        return "the sandbox has too many concurrent connections; try again shortly"
    if status == 502 and "not found" in detail.lower():
        return "the sandbox is gone (it expired or was deleted); start a new session"
    if status in (502, 503, 504):
        return "the sandbox cannot be reached"
    return None


# -- small helpers --------------------------------------------------------------------------


def remote_directory(workdir: str, workspace_path: str | None) -> str:
    """The remote cwd for a workspace-relative path under ``workdir``.

    >>> remote_directory("/home/user", "sub")
    '/home/user/sub'
    >>> remote_directory("/", "sub")
    '/sub'
    """
    if not workspace_path or workspace_path == ".":
        return workdir
    if workspace_path.startswith("/") or ".." in workspace_path.split("/"):
        raise PiShipError(
            CONFIG_INVALID, "the working directory is outside the workspace", component="sandbox"
        )
    base = "" if workdir == "/" else workdir.rstrip("/")
    return f"{base}/{workspace_path}"


def _ok(status: int) -> bool:
    return 200 <= status < 300


def _api_key_header(key: str) -> Mapping[str, str]:
    return {"X-API-Key": key}


def _basic(user: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:".encode()).decode("ascii")


def _lifetime(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return DEFAULT_LIFETIME


def _domain(answer: Mapping[str, Any]) -> str | None:
    domain = answer.get("domain")
    return domain if isinstance(domain, str) and _DOMAIN.match(domain) else None


def _strip_api(netloc: str) -> str:
    return netloc[len("api.") :] if netloc.startswith("api.") else netloc


def _object(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _lenient_b64(value: str) -> bytes:
    """Standard or URL-safe base64, padding optional (as envd and Node accept)."""
    text = value.strip().replace("-", "+").replace("_", "/").rstrip("=")
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def _strict_b64(data: bytes | memoryview) -> bytes:
    """Canonical base64 (padded, standard alphabet, nothing else); ``binascii.Error`` if not.

    Uses ``pybase64`` (SIMD, ~30x faster on large output) when it is installed.
    """
    return _FAST_B64(data, validate=True) if _FAST_B64 is not None else _stdlib_strict_b64(data)


def _stdlib_strict_b64(data: bytes | memoryview) -> bytes:
    if _STRICT_MODE:
        return binascii.a2b_base64(data, strict_mode=True)  # type: ignore[call-arg,unused-ignore]
    if _CANONICAL_B64.fullmatch(data) is None:  # Python 3.10: no strict_mode
        raise binascii.Error("not canonical base64")
    return binascii.a2b_base64(data)


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` as seconds (a number or an HTTP date); ``None`` when absent or bad."""
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _nothing() -> None:
    return None
