"""The pooled session: :class:`Transport`, the default HTTP client of the backends.

A :class:`Transport` is shared by every thread of one backend::

    transport = Transport(redactor=Redactor(), component="sandbox")
    api = transport.endpoint("https://api.example.com/")          # validated, no trailing "/"
    with transport.request("GET", f"{api}/health", timeout=10, cancel=token) as response:
        if response.status != 200:
            raise RuntimeError(response.failure())                # "HTTP 503: <redacted body>"

What it guarantees:

- endpoint rules: no credentials in URLs, plain HTTP only to loopback, redirects never
  followed, TLS verification always on, proxies from the environment honoured;
- it sends through the adapter its session routes the URL to: its own
  :class:`~piship_remote.transport.adapter.PiShipAdapter` (mounted for ``http://`` and
  ``https://`` unless the session has an adapter of another kind there), or one the user
  mounted; the session's proxies, CA bundle and client certificate apply either way;
- connections are pooled and kept alive (a short request costs one round trip), and a
  request is never re-sent automatically (a POST may have created something);
- ``timeout`` (or a :class:`~piship_remote.transport.deadline.Deadline` given as
  ``deadline``) bounds the whole exchange (a server dripping bytes cannot stretch it); a
  stream's body is bounded by ``idle_timeout`` and its reader instead;
- ``cancel`` (a :class:`~piship_remote.transport._cancel.CancelToken` or a ``threading.Event``)
  shuts down the socket of *that* call only, so a connect, a wait for headers or a body
  read ends within milliseconds with :class:`~piship_remote.model.errors.CommandCancelled`;
- a transport failure is a :class:`~piship_remote.transport.TransportError` whose
  message never carries the underlying exception's text (it can contain header values),
  and which is raised from frames that no longer hold the request's headers.
"""

from __future__ import annotations

import contextlib
import json as jsonlib
import logging
import threading
import time
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import requests
import requests.adapters
import requests.cookies
import urllib3.connectionpool
import urllib3.response

from piship_remote.model.errors import (
    CommandCancelled,
    ConfigInvalid,
    PiShipError,
    TlsPolicyViolation,
)
from piship_remote.model.redact import Redactor
from piship_remote.transport._cancel import EventWatcher
from piship_remote.transport._connection import Call, arm, disarm
from piship_remote.transport._headers import HeaderSet, header_set
from piship_remote.transport._streamed_response import Raw, StreamedResponse
from piship_remote.transport._urllib3_internals import (
    connect_taken,
    return_to_pool,
    taken_from_pool,
)
from piship_remote.transport.adapter import Outgoing, PiShipAdapter, Route, Target
from piship_remote.transport.deadline import Deadline
from piship_remote.transport.endpoint import (
    check_endpoint,
    check_url,
    is_localhost_name,
    request_path,
)
from piship_remote.transport.response import EAGER_BYTES, HttpResponse

__all__ = ["Transport"]

_LOG = logging.getLogger("piship_remote")
_SETTINGS_CACHE = 256  # URLs and origins whose checks and settings are remembered
_JSON_TYPE = {"Content-Type": "application/json"}
_NO_HEADERS = HeaderSet()


def _no_auth(request: requests.PreparedRequest) -> requests.PreparedRequest:
    # Passed as `auth` so that requests neither reads ~/.netrc nor applies a session's
    # auth: the only credential sent is the one the caller put in the headers.
    return request


class Transport:
    """The HTTP client of one backend: a pooled session shared by all its threads."""

    def __init__(
        self,
        *,
        redactor: Redactor,
        component: str = "sandbox",
        session: requests.Session | None = None,
        pool_size: int = 64,
    ) -> None:
        self.redactor = redactor
        self.component = component
        self._owns_session = session is None
        self._session = session if session is not None else requests.Session()
        verify = self._session.verify
        if verify is False:
            raise TlsPolicyViolation(
                "Refusing a requests.Session with TLS verification disabled",
                component=component,
            )
        # A CA bundle path configured on the given session is kept; never False.
        self._verify: bool | str = verify if isinstance(verify, str) else True
        self._adapter = PiShipAdapter(pool_size=pool_size)
        for prefix in ("http://", "https://"):
            if _replaceable(self._session.adapters.get(prefix)):
                self._session.mount(prefix, self._adapter)
        self._watcher = EventWatcher()
        # The session's own headers, checked and encoded once: nobody else holds it.
        self._defaults = HeaderSet(self._session.headers) if self._owns_session else None
        self._targets: dict[str, Target] = {}
        self._jar_used = False  # a server set a cookie in the session's jar
        self._routes: dict[str, Route] = {}

    def endpoint(self, url: str) -> str:
        """``url`` checked against the endpoint rules, without trailing slashes.

        Raises ``PiShipError`` ``CONFIG_INVALID`` (credentials in the URL, no host) or
        ``NETWORK_DENIED`` (plain HTTP to a non-loopback host, another scheme).
        """
        return check_endpoint(url)

    def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        json: Any = None,
        data: bytes | Iterable[bytes] | None = None,
        timeout: float | None = 30.0,
        cancel: threading.Event | None = None,
        stream: bool = False,
        idle_timeout: float | None = None,
        deadline: Deadline | None = None,
    ) -> HttpResponse:
        """Send one request; never retried, never redirected.

        ``timeout`` bounds the whole exchange: connect, headers and, unless ``stream``,
        the body, however slowly the server sends it (``None``: no deadline); a
        ``deadline`` given instead is that bound as it is (``timeout`` is then unused). A stream's
        body has its own rules instead: ``idle_timeout`` bounds the silence between its
        bytes, and its reader decides how long the whole may take. ``cancel`` set before
        or during the call raises ``CommandCancelled``. ``json`` is sent compact.
        """
        target = self._target(url)
        if cancel is not None and cancel.is_set():
            raise CommandCancelled()
        started = time.monotonic()
        if deadline is None:
            deadline = Deadline.never() if timeout is None else Deadline.after(timeout)
        call = Call(
            self.component,
            self.redactor,
            target.label,
            deadline,
            stream=stream,
            idle_timeout=idle_timeout,
        )
        failure = self._exchange(method, target, headers, json, data, call, cancel)
        headers = None  # the credential leaves this frame before anything is raised from it
        if isinstance(failure, BaseException):
            self._log(method, url, type(failure).__name__, started)
            raise failure
        self._log(method, url, failure.status, started)
        result = HttpResponse(failure, call)
        if call.scope.cancelled:
            result.close()
            raise CommandCancelled()
        if stream:
            call.scope.end_deadline()
        else:
            try:
                result._read_upto(EAGER_BYTES)
            except BaseException:
                result.close()
                raise
        return result

    def _exchange(
        self,
        method: str,
        target: Target,
        headers: Mapping[str, str] | None,
        json: Any,
        data: bytes | Iterable[bytes] | None,
        call: Call,
        cancel: threading.Event | None,
    ) -> Raw | BaseException:
        """Send the request and wait for the response headers.

        A failure is returned, not raised: mapped to our errors and without the
        traceback and chained exceptions of the frames that held the headers.
        """
        try:
            if cancel is not None:
                call.watch(cancel, self._watcher)
            return self._send(method, target, headers, json, data, call)
        except BaseException as exc:
            headers = None
            call.finish()
            mapped = call.error(exc)
            if mapped is exc and not isinstance(exc, (PiShipError, CommandCancelled)):
                raise  # a bug or a bad argument: its traceback is for debugging
            mapped.__traceback__ = mapped.__context__ = mapped.__cause__ = None
            return mapped

    @contextlib.contextmanager
    def extra_connection(self, url: str, timeout: float) -> Iterator[None]:
        """While the block runs, hold one more connection to ``url``'s origin open.

        One connection is taken out of the pool before the block starts (an idle one,
        else a new one, which a ``piship-connect`` thread connects: TCP, and TLS for
        https) and held until the block ends, so requests made in the block use
        others; then it goes back to the pool, and two requests there can start at
        once without a connection set-up. The set-up overlaps the block's own
        requests. Best effort: a failure to connect is the next request's to report.
        The thread is joined before the block returns.
        """
        try:
            pool = self._route(self._target(url)).pool
        except Exception:
            pool = None
        if pool is None:
            yield
            return
        done = threading.Event()
        conn = taken_from_pool(pool)  # here, so the block's own requests cannot take it
        thread = threading.Thread(
            target=_hold_connection,
            args=(pool, conn, timeout, done),
            name="piship-connect",
            daemon=True,
        )
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def _log(self, method: str, url: str, outcome: object, started: float) -> None:
        """One DEBUG line per request: method, path (redacted), outcome, time taken."""
        if _LOG.isEnabledFor(logging.DEBUG):
            elapsed = (time.monotonic() - started) * 1000
            path = self.redactor.redact(urllib.parse.urlsplit(url).path)
            _LOG.debug("%s %s %s -> %s in %.1f ms", self.component, method, path, outcome, elapsed)

    def close(self) -> None:
        """Close the pooled connections (and the session if this transport made it)."""
        self._watcher.close()
        if self._owns_session:
            self._session.close()
        else:
            self._adapter.close()
        self._routes.clear()

    def _send(
        self,
        method: str,
        target: Target,
        headers: Mapping[str, str] | None,
        json: Any,
        data: bytes | Iterable[bytes] | None,
        call: Call,
    ) -> Raw:
        given = header_set(headers)
        headers = None
        if json is not None:
            data = jsonlib.dumps(json, separators=(",", ":"), ensure_ascii=False).encode()
            if not given.has("content-type"):
                given = given.plus(_JSON_TYPE)
        method = method.upper()
        outgoing = self._outgoing(method, target, given, data)
        given = _NO_HEADERS
        if outgoing is None:
            # requests' message would quote the value, which may be a credential.
            raise ConfigInvalid(
                "A request header value is not valid (line breaks or surrounding whitespace)",
                component=self.component,
            )
        remaining = call.scope.remaining()
        if remaining is not None and remaining <= 0:
            raise TimeoutError("the deadline passed before the request")
        if remaining is None:
            remaining = call.idle_timeout  # no deadline: each socket wait is still bounded
        return self._open(outgoing, self._route(target), call, remaining)

    def _target(self, url: str) -> Target:
        """``url`` checked against the endpoint rules and normalised, remembered per URL."""
        target = self._targets.get(url)
        if target is None:
            label, origin = check_url(url)
            probe = requests.PreparedRequest()
            probe.prepare_url(url, None)  # requests' normal form: IDNA, quoting
            normal = probe.url or url
            target = Target(label, origin, normal, request_path(probe))
            if len(self._targets) >= _SETTINGS_CACHE:
                self._targets.clear()
            self._targets[url] = target
        return target

    def _outgoing(
        self,
        method: str,
        target: Target,
        headers: HeaderSet,
        data: bytes | Iterable[bytes] | None,
    ) -> Outgoing | None:
        """The request as the session would prepare it, without its per-call costs;
        ``None`` when a header is not valid.

        A session with cookies, default query parameters or response hooks prepares
        it itself (cookies are sent, parameters added).
        """
        session = self._session
        if self._session_prepares():
            try:
                prepared = session.prepare_request(
                    requests.Request(
                        method, target.url, headers=headers.for_requests(), data=data, auth=_no_auth
                    )
                )
            except requests.exceptions.InvalidHeader:
                return None
            if data is not None and not isinstance(data, bytes) and "Content-Length" in headers:
                prepared.headers.pop("Transfer-Encoding", None)  # one framing, the caller's
            return Outgoing(method, prepared.url or target.url, prepared.headers, data, prepared)
        defaults = self._defaults
        if defaults is None:
            defaults = HeaderSet(session.headers)  # the caller's session: read every time
        merged = defaults.merged(headers)  # a request header replaces one of any case
        if not merged.valid:
            return None
        if isinstance(data, bytes):
            merged = merged.with_length(len(data))
        elif data is not None:
            pass  # streamed: chunked, unless the caller gave its Content-Length
        elif method not in ("GET", "HEAD"):
            merged = merged.with_length(0)
        return Outgoing(method, target.url, merged, data, None, target.path)

    def _session_prepares(self) -> bool:
        """Whether the session has cookies, default parameters or hooks to apply.

        A session of our own gets them only from a server's ``Set-Cookie``, so until
        one arrived its jar is not looked at (iterating it costs a lock and a walk).
        """
        if self._owns_session and not self._jar_used:
            return False
        session = self._session
        return bool(session.cookies or session.params or any(session.hooks.values()))

    def _route(self, target: Target) -> Route:
        """How requests to ``target``'s origin are sent, remembered per origin.

        requests derives proxies, CA bundle and client certificate from the environment,
        finds the pool and checks the CA bundle on every call, which costs more than the
        rest of a kept-alive request; here that happens once per origin (and again when
        the pool manager has closed the pool).
        """
        route = self._routes.get(target.origin)
        if route is not None and route.current() and route.settings["cert"] == self._session.cert:
            return route  # (a refreshed client certificate needs a pool of its own)
        settings: dict[str, Any] = dict(
            self._session.merge_environment_settings(target.url, {}, True, self._verify, None)
        )
        if is_localhost_name(urllib.parse.urlsplit(target.origin).hostname or ""):
            settings["proxies"] = {}  # a proxy would resolve the name its own way
        adapter = self._session.get_adapter(target.url)
        if isinstance(adapter, PiShipAdapter):
            route = adapter.route(target.url, target.origin, settings)
        else:
            route = Route(settings, None, False)
        if len(self._routes) >= _SETTINGS_CACHE:
            self._routes.clear()
        self._routes[target.origin] = route
        return route

    def _open(self, outgoing: Outgoing, route: Route, call: Call, remaining: float | None) -> Raw:
        """Send through the adapter the session routes the URL to; the answer's head read."""
        adapter = route.adapter
        if adapter is None:  # an adapter the caller mounted on the session: it sends
            response = self._session.send(
                outgoing.prepared(),
                timeout=(remaining, remaining),
                allow_redirects=False,
                **route.settings,
            )
            raw: urllib3.response.HTTPResponse = response.raw
            return raw
        if route.direct:
            assert route.pool is not None
            conn = taken_from_pool(route.pool)
            arm(conn, call.scope)
            try:
                opened = adapter.send_on(conn, outgoing, route, remaining, stream=call.stream)
            finally:
                disarm(conn, call.scope)
        else:
            opened = adapter.open(outgoing, route, call.scope, remaining)
        if isinstance(opened, StreamedResponse):
            return opened  # no cookie in its head
        if "set-cookie" in opened.headers:
            self._jar_used = True
            requests.cookies.extract_cookies_to_jar(  # type: ignore[no-untyped-call]
                self._session.cookies, outgoing.prepared(), opened
            )
        return opened


def _replaceable(adapter: requests.adapters.BaseAdapter | None) -> bool:
    """Whether the session's adapter for a prefix is requests' default (or none): one a
    user mounted there, of another kind, is kept and sends for that prefix."""
    return adapter is None or type(adapter) is requests.adapters.HTTPAdapter


def _hold_connection(
    pool: urllib3.connectionpool.HTTPConnectionPool,
    conn: urllib3.connection.HTTPConnection,
    timeout: float,
    done: threading.Event,
) -> None:
    """Connect ``conn`` (taken from ``pool``), hold it until ``done``, give it back."""
    try:
        connect_taken(pool, conn, timeout)
    except Exception:
        return  # the request that needs it connects (and reports) by itself
    done.wait()
    return_to_pool(pool, conn)
