"""The e2b-compatible backend: E2B-style sandboxes, commands streamed from their envd.

A REST control plane (E2B, CubeSandbox, ...) creates the sandbox
(``POST /sandboxes``), renews its lifetime before every command and deletes it
at the end (:mod:`~piship_remote.backends.e2b._control`); each command is one
Connect server stream (``POST /process.Process/Start``) from the sandbox's
``envd`` daemon (:mod:`~piship_remote.backends.e2b._instance`), run by the instance
(:mod:`~piship_remote.backends.e2b._instance`) and decoded by
:mod:`~piship_remote.backends.e2b._stream`::

    with E2bCompatibleBackend(
        endpoint="https://api.e2b.app", credential=lambda: os.environ["E2B_API_KEY"]
    ) as backend:
        instance = backend.prepare(SandboxProfile(workspace="."))
        try:
            result = instance.exec(ExecRequest("make test", cwd="."),
                                   on_stdout=sys.stdout.buffer.write)
        finally:
            instance.dispose()

Real services differ from a minimal mock in ways this backend handles:
keepalive events, an omitted ``exitCode``, truncated streams, plain-JSON and
HTML errors from the edge proxy, and 429 on create.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING

from piship_remote.backends._common import (
    OpenInstances,
    SandboxErrors,
    remote_directory,
)
from piship_remote.backends._credential import Credential
from piship_remote.backends._owned import CREATED_BY, CREATOR, OwnedSandbox, check_labels
from piship_remote.backends.base import Availability
from piship_remote.backends.e2b._control import (
    BACKEND_ID,
    ControlPlane,
    Created,
    CreateRetry,
    NewSandbox,
    idempotency_key,
    wire_lifetime,
)
from piship_remote.backends.e2b._files import EnvdFiles
from piship_remote.backends.e2b._instance import (
    ENVD_PORT,
    KEEPALIVE_INTERVAL,
    E2bInstance,
    Envd,
)
from piship_remote.backends.e2b._lease import SandboxLease
from piship_remote.backends.e2b._owned import check_id, connect, list_owned
from piship_remote.backends.lifetime import Anchor, ClaimClock, keepalive_interval
from piship_remote.model.errors import PiShipError
from piship_remote.model.redact import Redactor
from piship_remote.model.report import Capabilities
from piship_remote.transport import HttpClient, Transport, check_endpoint

if TYPE_CHECKING:
    import requests

    from piship_remote.model.policy import SandboxProfile

__all__ = ["CreateRetry", "E2bCompatibleBackend", "E2bInstance", "remote_directory"]

# The variables a user sets for the API key and the envd address, named when missing.
API_KEY_VARIABLE = "E2B_API_KEY"
ENVD_URL_VARIABLE = "PISHIP_E2B_ENVD_URL"

EnvdUrl = Callable[[str, str | None], str] | str | None


class E2bCompatibleBackend:
    """Sandboxes from an E2B-compatible service (E2B itself, CubeSandbox, ...).

    ``credential`` is read fresh for every control-plane request and sent only as
    ``X-API-Key`` to ``/sandboxes…``; one that fails, or gives ``""`` or ``None``, is a
    ``CREDENTIAL_REQUIRED`` error naming ``E2B_API_KEY`` (``credential=None``: no key);
    ``credential_rejected`` is called on HTTP 401
    (``True`` = a renewed credential is ready; renewals and deletes are then sent
    once more, a create never). ``user`` is envd's process user (``"root"`` for
    CubeSandbox). ``envd_url`` overrides the envd base URL: a string, or a callable
    of ``(sandbox_id, domain)``; tests point it at their mock.
    ``stream_idle_timeout`` is how long a command stream may stay silent (envd
    sends a keepalive every 50 s) before it counts as lost. ``client`` replaces the
    HTTP client (any :class:`~piship_remote.transport.HttpClient`, e.g. a recording
    wrapper around :class:`~piship_remote.transport.Transport`); ``session`` is then unused.

    Every create carries an ``Idempotency-Key``. ``idempotent_creates=True`` says the
    service honours it (one sandbox per key: the local service and ``E2bServer`` do), so
    a create whose answer was lost is sent again with the same key and answered with the
    sandbox it made. Without it (E2B's hosted API documents no such promise) a lost
    answer is never repeated: the error says a sandbox may exist and when it expires.

    Every command renews the sandbox's lifetime, and an idle sandbox is renewed every
    quarter lifetime, so a short ``lifetime_seconds`` is safe; a sandbox past the end
    last committed (by the wall clock or the monotonic clock, ``now`` and ``monotonic``,
    whichever advanced more) is never renewed again.

    Raises (on construction):
        NetworkDenied: plain HTTP to an endpoint that is not on loopback.
        TlsPolicyViolation: a ``session`` with TLS verification turned off.
        ConfigInvalid: an option or the endpoint is wrong; the message names it.
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
        lifetime_seconds: float = 3600,
        credential: Callable[[], str | None] | None = None,
        credential_rejected: Callable[[], bool] | None = None,
        envd_url: EnvdUrl = None,
        session: requests.Session | None = None,
        stream_idle_timeout: float = 2.0 * KEEPALIVE_INTERVAL,
        client: HttpClient | None = None,
        now: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        idempotent_creates: bool = False,
    ) -> None:
        self.redactor = Redactor()
        self._idempotent_creates = idempotent_creates
        self._errors = SandboxErrors(self.redactor)
        credentials = Credential(
            credential, credential_rejected, self.redactor, name=API_KEY_VARIABLE, required=True
        )
        self._credentials = credentials
        control_endpoint = check_endpoint(endpoint)
        self._transport: HttpClient = client or Transport(
            redactor=self.redactor, component="sandbox", session=session
        )
        self._control = ControlPlane(
            self._transport,
            control_endpoint,
            credentials,
            wire_lifetime(lifetime_seconds),
            self.redactor,
        )
        self._template = template
        self._workdir = workdir
        self._user = user
        self._envd_url = envd_url
        self._idle_timeout = stream_idle_timeout
        self._clock = ClaimClock.for_lifetime(self._control.lifetime, now=now, monotonic=monotonic)
        self._open = OpenInstances()

    def __repr__(self) -> str:
        return f"<E2bCompatibleBackend {self._control.endpoint}>"

    def __enter__(self) -> E2bCompatibleBackend:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def capabilities(self) -> Capabilities:
        """Remote isolation, network deny or allow, filtered environment; no network probe."""
        return Capabilities(
            isolation="remote",
            planes=("host-filesystem-isolation", "network-deny", "environment-filter"),
            network=("deny", "allow"),
            local_processes=False,
        )

    def available(self) -> Availability:
        """``GET /health`` without credentials; any 2xx means available. Never raises.

        A credential callable that gives nothing is reported first, before any request.
        """
        missing = self._credentials.missing()
        if missing is not None:
            return Availability(False, str(missing), missing.code, missing.user_action)
        known = self._envd_url if isinstance(self._envd_url, str) else None
        return self._control.health(spare=known)

    def prepare(
        self, profile: SandboxProfile, *, labels: Mapping[str, str] | None = None
    ) -> E2bInstance:
        """Create a sandbox for ``profile`` (only its network mode is used), ``labels`` in
        its metadata.

        The create carries an ``Idempotency-Key``; when its answer is lost it is sent
        again with the same key only with ``idempotent_creates`` (the service answers
        the sandbox the key made), else the error says a sandbox may exist: a lost
        answer never leaves a second sandbox behind.

        Raises:
            SandboxUnavailable: the service refused or failed the create (retryable when nothing was
                created).
            CredentialRequired: the service needs a credential and none was given.
            GatewayUnreachable: the service could not be reached.
        """
        if self._open.closed.is_set():
            raise self._control.closed_error()
        read = self._clock.anchor()
        # The service counts the lifetime from when the create arrived: later than this.
        anchor = Anchor(read.wall, read.monotonic, read.wall + self._clock.lifetime)
        control = self._control
        created = control.create(
            NewSandbox(
                template_id=self._template,
                timeout=control.lifetime,
                metadata={**check_labels(labels), CREATED_BY: CREATOR},
                allow_internet_access=profile.network == "allow",
            ),
            self._open.closed,
            key=idempotency_key(),
            idempotent=self._idempotent_creates,
        )
        try:
            instance = self._instance(created, anchor)
        except BaseException:
            self._control.delete(created.sandbox_id)
            raise
        if self._open.admit(instance):
            return instance
        instance.dispose()
        raise self._control.closed_error()

    def attach(self, sandbox_id: str) -> E2bInstance:
        """An instance for the existing sandbox ``sandbox_id`` (``connect``: a fresh envd token).

        Raises:
            SandboxUnavailable: the service no longer knows the sandbox, or refused the connect.
            GatewayUnreachable: the service could not be reached.
        """
        if self._open.closed.is_set():
            raise self._control.closed_error()
        read = self._clock.anchor()
        created = connect(self._control, sandbox_id)
        anchor = Anchor(read.wall, read.monotonic, read.wall + self._clock.lifetime)
        instance = self._instance(created, anchor)
        if self._open.admit(instance):
            return instance
        instance.detach()
        raise self._control.closed_error()

    def list_owned(self) -> list[OwnedSandbox]:
        """The live sandboxes whose metadata says this library created them."""
        return list_owned(self._control)

    def delete_owned(self, sandbox_id: str) -> None:
        """Delete one sandbox this library created (best effort, like every delete)."""
        check_id(sandbox_id)
        self._control.delete(sandbox_id)

    def close(self) -> None:
        """Dispose every sandbox this backend still holds and release its connections.

        Idempotent; ``prepare`` raises afterwards. ``with backend:`` calls it on exit.
        """
        self._open.close()
        self._transport.close()

    # -- one sandbox's clients --------------------------------------------------------------

    def _instance(self, created: Created, anchor: Anchor) -> E2bInstance:
        sandbox_id = created.sandbox_id
        lease = SandboxLease(
            lambda cancel: self._control.renew(sandbox_id, cancel),
            lambda cancel: self._control.keepalive(sandbox_id, cancel),
            self._clock,
            anchor,
            keepalive_every=keepalive_interval(self._control.lifetime),
            name=sandbox_id,
            errors=self._errors,
        )
        base = self._envd_base(created)
        envd = Envd(
            self._transport,
            base,
            created.sandbox_id,
            created.access_token,
            self._user,
            self._idle_timeout,
            self._errors,
        )
        instance = E2bInstance(
            sandbox_id, self._workdir, self._control, lease, envd, self._errors, self._open.forget
        )
        instance.attach_files(self._envd_files(created, base))
        parts = urllib.parse.urlsplit(self._control.endpoint)
        instance.attach_ports(parts.scheme, created.domain or _strip_api(parts.netloc))
        lease.start()
        return instance

    def _envd_files(self, created: Created, base: str) -> EnvdFiles:
        headers = {"E2b-Sandbox-Id": created.sandbox_id, "E2b-Sandbox-Port": str(ENVD_PORT)}
        if created.access_token is not None:
            headers["X-Access-Token"] = created.access_token
        return EnvdFiles(
            self._transport,
            base,
            headers,
            user=self._user,
            workdir=self._workdir,
            errors=self._errors,
        )

    def _envd_base(self, created: Created) -> str:
        try:
            if callable(self._envd_url):
                url = self._envd_url(created.sandbox_id, created.domain)
            elif self._envd_url is not None:
                url = self._envd_url
            else:
                parts = urllib.parse.urlsplit(self._control.endpoint)
                domain = created.domain or _strip_api(parts.netloc)
                url = f"{parts.scheme}://{ENVD_PORT}-{created.sandbox_id}.{domain}"
            return check_endpoint(url)
        except PiShipError as e:
            if self._envd_url is None:  # derived from the endpoint: say what to set
                raise self._errors(
                    f"the sandbox's envd address cannot be used: none was given (set"
                    f" {ENVD_URL_VARIABLE} or pass envd_url=), and the one derived from the"
                    f" endpoint is refused: {e}",
                    code=e.code,
                    user_action=f"Set {ENVD_URL_VARIABLE} or pass envd_url= the service's envd"
                    " base URL (for a local or self-hosted service, often the endpoint itself)",
                ) from None
            raise self._errors(
                f"the sandbox's envd address cannot be used: {e}",
                code=e.code,
                user_action="Pass envd_url= the sandbox's envd base URL (https, or http on "
                "loopback), as a string or a callable of (sandbox_id, domain)",
            ) from None
        except Exception as e:  # a failing envd_url callable
            raise self._errors(
                f"the sandbox's envd address cannot be used: {type(e).__name__}: {e}"
            ) from None


# -- one sandbox ----------------------------------------------------------------------------


def _strip_api(netloc: str) -> str:
    return netloc[len("api.") :] if netloc.startswith("api.") else netloc
