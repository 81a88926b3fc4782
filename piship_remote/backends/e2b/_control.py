"""The control plane of an E2B-compatible service: health, create, renew and delete sandboxes.

The REST API under the endpoint (``/health``, ``/sandboxes…``) is the only
place the API key travels (``X-API-Key``, read fresh per attempt, under the 401
protocol)::

    control = ControlPlane(transport, endpoint, credential, wire_lifetime(1800.0), redactor)
    created = control.create(NewSandbox("base", control.lifetime, {}, False), closed)
    control.renew(created.sandbox_id, cancel)
    control.delete(created.sandbox_id)

Every create carries an ``Idempotency-Key`` (one per logical create, the same on each
of its repeats). It is repeated (bounded, jittered) on 429 or 503, which mean nothing
was created, and after a lost answer only when the service is known to honour the key
(``idempotent``: the repeat answers the sandbox the first one made); otherwise a lost
answer is an error saying a sandbox may exist, never a second create. Lifetimes travel
as whole seconds, rounded up.
"""

from __future__ import annotations

import contextlib
import math
import random
import re
import threading
import urllib.parse
import uuid
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import attrs
import cattrs
from cattrs.gen import make_dict_unstructure_fn, override

from piship_remote.backends._common import (
    DETAIL_LIMIT,
    SandboxErrors,
    is_success,
    retry_after_seconds,
)
from piship_remote.backends._credential import Credential, send_credentialed
from piship_remote.backends.base import Availability
from piship_remote.backends.lifetime import lifetime_seconds
from piship_remote.model.errors import (
    CONFIG_INVALID,
    CREDENTIAL_DENIED,
    GATEWAY_UNREACHABLE,
    PiShipError,
)
from piship_remote.model.redact import Redactor
from piship_remote.telemetry import Telemetry
from piship_remote.telemetry.logs import info
from piship_remote.telemetry.names import LEASE_RENEW_SPAN
from piship_remote.transport import HttpClient, HttpReply, TransportError
from piship_remote.transport.endpoint import is_localhost_name, is_loopback
from piship_remote.wire.e2b_control import TimeoutRequest

__all__ = [
    "CONTROL_TIMEOUT",
    "HEALTH_TIMEOUT",
    "ControlPlane",
    "CreateRetry",
    "Created",
    "NewSandbox",
    "idempotency_key",
    "wire_lifetime",
]

BACKEND_ID = "e2b-compatible"
HEALTH_TIMEOUT = 10.0
CONTROL_TIMEOUT = 30.0
MAX_CONTROL_RESPONSE = 1 << 20
CREATE_ATTEMPTS = 3
RETRY_BASE_DELAY = 0.5
MAX_RETRY_AFTER = 10.0
RETRIED_CREATE_STATUSES = frozenset({429, 503})
LISTED_TEMPLATES = 20  # template names an unknown-template error lists at most
IDEMPOTENCY_HEADER = "Idempotency-Key"

_SANDBOX_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,127}\Z")
_DOMAIN = re.compile(r"[A-Za-z0-9.-]+(?::[0-9]{1,5})?\Z")
# What may travel in an HTTP header value: visible ASCII, nothing that ends a line.
_HEADER_VALUE = re.compile(r"[\x21-\x7e]+\Z")


@runtime_checkable
class _ExtraConnection(Protocol):
    """A client that can open a connection while a request is in flight (``Transport``)."""

    def extra_connection(
        self, url: str, timeout: float
    ) -> contextlib.AbstractContextManager[None]: ...


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


def idempotency_key() -> str:
    """A fresh key for one logical create: lower-case hex and hyphens, as E2B takes them.

    >>> re.fullmatch(r"[a-z0-9-]{1,255}", idempotency_key()) is not None
    True
    """
    return f"piship-{uuid.uuid4()}"


def wire_lifetime(value: object) -> int:
    """A lifetime option (seconds, int or float) as the whole seconds E2B takes, rounded up.

    >>> wire_lifetime(1800.0), wire_lifetime(0.2), wire_lifetime("soon")
    (1800, 1, 3600)
    """
    return math.ceil(lifetime_seconds(value))  # type: ignore[arg-type]


@attrs.frozen
class NewSandbox:
    """The body of ``POST /sandboxes``."""

    template_id: str
    timeout: int
    metadata: Mapping[str, str]
    allow_internet_access: bool


def _wire_converter() -> cattrs.Converter:
    converter = cattrs.Converter()
    converter.register_unstructure_hook(
        NewSandbox,
        make_dict_unstructure_fn(NewSandbox, converter, template_id=override(rename="templateID")),
    )
    converter.register_unstructure_hook(Mapping, dict)
    return converter


_WIRE = _wire_converter()


@attrs.frozen
class Created:
    """The parts of the create answer a backend uses."""

    sandbox_id: str
    access_token: str | None
    domain: str | None


class ControlPlane:
    """The service's REST API (``/health``, ``/sandboxes…``): the only place the key is sent."""

    def __init__(
        self,
        transport: HttpClient,
        endpoint: str,
        credential: Credential,
        lifetime: int,
        redactor: Redactor,
        *,
        retry: CreateRetry | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.lifetime = lifetime
        self._transport = transport
        self._credential = credential
        self._redactor = redactor
        self._errors = SandboxErrors(redactor)
        self._retry = retry or CreateRetry()
        self._random = rng or random.Random()
        self._telemetry = Telemetry.load(BACKEND_ID, redactor)

    def request(
        self,
        method: str,
        path: str,
        *,
        repeatable: bool,
        body: object = None,
        cancel: threading.Event | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> HttpReply:
        """One request under the 401 protocol; ``body`` is an attrs wire shape."""
        return send_credentialed(
            self._transport,
            method,
            f"{self.endpoint}{path}",
            credential=self._credential,
            auth_header=_api_key_header,
            repeatable=repeatable,
            json=None if body is None else _WIRE.unstructure(body),
            timeout=CONTROL_TIMEOUT,
            cancel=cancel,
            # trace headers go to the control plane only: never to envd
            headers={**self._telemetry.trace_headers(), **(headers or {})},
        )

    def health(self, spare: str | None = None) -> Availability:
        """``GET /health`` without credentials; any 2xx means available. Never raises.

        ``spare`` is the envd base URL when it is known before the create answers:
        while the health check is in flight, one more connection to it is opened, so
        the readiness command's renewal and Start go out together on open connections.
        """
        with self._extra_connection(spare):
            return self._health()

    def _extra_connection(self, url: str | None) -> contextlib.AbstractContextManager[None]:
        client = self._transport
        if url is None or not isinstance(client, _ExtraConnection):
            return contextlib.nullcontext()
        return client.extra_connection(url, HEALTH_TIMEOUT)

    def _health(self) -> Availability:
        try:
            response = self._transport.request(
                "GET", f"{self.endpoint}/health", timeout=HEALTH_TIMEOUT
            )
        except Exception as e:  # availability is reported, never raised
            text = self._redactor.redact(str(e) or type(e).__name__)[:DETAIL_LIMIT]
            return Availability(
                False, f"the {BACKEND_ID} endpoint is unreachable: {text}", GATEWAY_UNREACHABLE
            )
        response.close()
        if is_success(response.status):
            return Availability(True)
        return Availability(
            False, f"the {BACKEND_ID} endpoint health check returned HTTP {response.status}"
        )

    def create(
        self,
        request: NewSandbox,
        closed: threading.Event,
        *,
        key: str,
        idempotent: bool = False,
    ) -> Created:
        """``POST /sandboxes`` with ``Idempotency-Key: key``; on any failure after the
        answer, the sandbox is deleted.

        ``closed`` ends the waits between repeats (the backend was closed). When the
        answer is lost, the create is sent again with the same key only if the service
        is ``idempotent`` (known to answer a repeated key with the sandbox it made);
        otherwise, or when every repeat lost its answer too, the error says a sandbox
        may exist and when it expires.
        """
        lost = ""
        for attempt in range(1, self._retry.attempts + 1):
            if attempt > 1:
                delay = self._retry.delay(attempt - 1, None, self._random)
                if closed.wait(delay or 0.0):
                    raise self.closed_error()
            outcome = self._create_once(request, closed, key, known=attempt > 1)
            if isinstance(outcome, Created):
                return outcome
            lost = outcome
            if not idempotent:
                break
        raise self._lost_answer(lost)

    def _create_once(
        self, request: NewSandbox, closed: threading.Event, key: str, *, known: bool
    ) -> Created | str:
        """The sandbox one create (and its 429/503 repeats) made, or why its answer was lost.

        ``known``: an earlier send of this key may have made a sandbox, so a create
        refused outright may still have one behind it: that is reported as lost too."""
        try:
            response = self._create_response(request, closed, key)
        except TransportError as error:
            if not error.request_sent and not known:
                raise self._unreachable(error) from None
            return error.message
        with response:
            if not is_success(response.status):
                if known:  # the lost first answer may still have made one
                    return response.failure()
                raise self._create_failure(response, request.template_id)
            try:
                answer = response.json_object(MAX_CONTROL_RESPONSE)
            except ValueError as e:
                return f"the create answer was invalid: {e}"
            except TransportError as error:
                return error.message
            return self.sandbox_of(answer, delete_on_failure=True)

    def sandbox_of(self, answer: Mapping[str, Any], *, delete_on_failure: bool) -> Created:
        """The sandbox a create or connect answer names (its envd token registered as secret)."""
        sandbox_id = answer.get("sandboxID")
        if not isinstance(sandbox_id, str) or not _SANDBOX_ID.match(sandbox_id):
            raise self._errors("the sandbox service returned no valid sandbox ID")
        try:
            return Created(sandbox_id, self._access_token(answer), _domain(answer))
        except BaseException:
            if delete_on_failure:
                self.delete(sandbox_id)
            raise

    def keepalive(self, sandbox_id: str, cancel: threading.Event) -> None:
        """:meth:`renew` on its own, not for a command: in a span of its own."""
        with self._telemetry.span(LEASE_RENEW_SPAN, sandbox_id):
            self.renew(sandbox_id, cancel)

    def renew(self, sandbox_id: str, cancel: threading.Event) -> None:
        """``POST /sandboxes/<id>/timeout``: the sandbox lives ``lifetime`` seconds from now.

        No span: a command's renewal is part of the command (its span, its ``traceparent``,
        its failure the command's ``error.type``)."""
        try:
            response = self.request(
                "POST",
                f"/sandboxes/{sandbox_id}/timeout",
                repeatable=True,
                body=TimeoutRequest(self.lifetime),
                cancel=cancel,
            )
        except TransportError as error:
            raise TransportError(
                f"renewing the sandbox failed: {error.message}",
                request_sent=error.request_sent,
                component=error.component or "sandbox",
            ) from None
        with response:
            if not is_success(response.status):
                info(
                    "renewing %s sandbox %s was refused (HTTP %s)",
                    BACKEND_ID,
                    sandbox_id,
                    response.status,
                    redactor=self._redactor,
                )
                raise self._errors(
                    f"the sandbox is no longer available: {response.failure()}",
                    not_started=True,
                )

    def port_listener(self, sandbox_id: str, port: int) -> str | None:
        """``http://<loopback>:<p>``, the service's own listener for the sandbox's ``port``
        (``POST /sandboxes/<id>/ports/<port>``, the local service's), or ``None`` where the
        service has none (any failure: the caller falls back to E2B's port host)."""
        try:
            path = f"/sandboxes/{sandbox_id}/ports/{port}"
            response = self.request("POST", path, repeatable=True)
        except TransportError:
            return None
        with response:
            if not is_success(response.status):
                return None
            try:
                url = response.json_object(MAX_CONTROL_RESPONSE).get("url")
            except (ValueError, TransportError):
                return None
        return url if isinstance(url, str) and is_loopback_url(url) else None

    def delete(self, sandbox_id: str) -> None:
        """``DELETE /sandboxes/<id>``; every outcome is ignored (it also expires on its own)."""
        try:
            self.request("DELETE", f"/sandboxes/{sandbox_id}", repeatable=True).close()
        except Exception:
            pass  # best effort by design

    def closed_error(self) -> PiShipError:
        """The error of a backend used after ``close()``."""
        return self._errors(f"the {BACKEND_ID} backend was closed; create a new one")

    def _create_response(self, request: NewSandbox, closed: threading.Event, key: str) -> HttpReply:
        """Send the create; repeat it (bounded, jittered) only on 429 or 503.

        Those statuses mean nothing was created, unlike a 401 or a lost answer,
        after which a repeat could leave a second sandbox behind.
        """
        attempt = 0
        while True:
            response = self.request(
                "POST",
                "/sandboxes",
                repeatable=False,
                body=request,
                headers={IDEMPOTENCY_HEADER: key},
            )
            attempt += 1
            if response.status not in RETRIED_CREATE_STATUSES:
                return response
            self._telemetry.create_refused(response.status)
            if attempt >= self._retry.attempts:
                return response
            asked = retry_after_seconds(response.headers.get("Retry-After"))
            delay = self._retry.delay(attempt, asked, self._random)
            if delay is None:
                return response
            response.close()
            self._telemetry.create_retried()
            if closed.wait(delay):
                raise self.closed_error()

    def _unreachable(self, error: TransportError) -> PiShipError:
        """Nothing was sent (refused, unresolvable): safe to try again later."""
        return self._errors(
            f"the {BACKEND_ID} service at {self.endpoint} is unreachable: {error.message}",
            code=GATEWAY_UNREACHABLE,
            retryable=True,
            user_action=f"Check that the sandbox service at {self.endpoint} is running and "
            "reachable, then try again",
        )

    def _lost_answer(self, reason: str) -> PiShipError:
        """The service may have created a sandbox whose ID never arrived, and it could
        not be looked up, so the error says it may exist and how long it lives."""
        return self._errors(
            f"creating the sandbox failed: {reason}; a sandbox may have been created "
            f"without its ID reaching this library, and it expires on its own within "
            f"{self.lifetime} s"
        )

    def _create_failure(self, response: HttpReply, template: str) -> PiShipError:
        status = response.status
        if status == 401:
            return self._errors(
                f"creating the sandbox failed: {response.failure()}; the service refused"
                " the API key",
                code=CREDENTIAL_DENIED,
                user_action="Set E2B_API_KEY (or the backend's credential) to a key this"
                f" service at {self.endpoint} accepts",
            )
        if status == 404:
            failure = response.failure()
            offered = self._offered_templates()
            listed = f"; it offers: {', '.join(offered)}" if offered else ""
            return self._errors(
                f"creating the sandbox failed: {failure}; the service has no template"
                f" {template!r}{listed}",
                code=CONFIG_INVALID,
                user_action="Name a template the service offers (--template, or the"
                " backend's template=), or check the endpoint",
            )
        retryable = status in RETRIED_CREATE_STATUSES
        retry_after = response.headers.get("Retry-After")
        return self._errors(
            f"creating the sandbox failed: {response.failure()}",
            retryable=retryable,
            retry_after=retry_after_seconds(retry_after) if retryable else None,
        )

    def _offered_templates(self) -> list[str]:
        """The names ``GET /templates`` lists (E2B's shape), or none when it cannot say;
        asked without the key, as ``/health`` is (a service that wants one says nothing)."""
        try:
            url = f"{self.endpoint}/templates"
            with self._transport.request("GET", url, timeout=HEALTH_TIMEOUT) as response:
                if response.status != 200:
                    return []
                listed = response.json_value(MAX_CONTROL_RESPONSE)
        except Exception:  # only a hint for an error message
            return []
        names = [_template_name(entry) for entry in listed] if isinstance(listed, list) else []
        return sorted({name for name in names if name})[:LISTED_TEMPLATES]

    def _access_token(self, answer: Mapping[str, Any]) -> str | None:
        token = answer.get("envdAccessToken")
        if token is None or token == "":
            return None
        if not isinstance(token, str) or not _HEADER_VALUE.match(token):
            raise self._errors("the sandbox service returned an invalid envd access token")
        self._redactor.register(token)
        return token


def is_loopback_url(url: str) -> bool:
    """An ``http://`` URL of a loopback address (never a name: no resolution needed)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    try:
        port = parts.port
    except ValueError:
        return False
    return (
        parts.scheme == "http"
        and port is not None
        and not is_localhost_name(host)
        and is_loopback(host)
    )


def _api_key_header(key: str) -> Mapping[str, str]:
    return {"X-API-Key": key}


def _domain(answer: Mapping[str, Any]) -> str | None:
    domain = answer.get("domain")
    return domain if isinstance(domain, str) and _DOMAIN.match(domain) else None


def _template_name(entry: object) -> str | None:
    """A listed template's first alias, else its ID."""
    if not isinstance(entry, dict):
        return None
    aliases = entry.get("aliases")
    if isinstance(aliases, list) and aliases and isinstance(aliases[0], str):
        return aliases[0]
    template_id = entry.get("templateID")
    return template_id if isinstance(template_id, str) else None
