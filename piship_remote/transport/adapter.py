"""The transport adapter: the fast path, behind requests' own extension point.

:class:`PiShipAdapter` is a ``requests.adapters.HTTPAdapter`` that the
:class:`~piship_remote.transport.Transport` mounts on its session (``http://`` and
``https://``, unless the session already has an adapter of its own there). The
transport asks the session which adapter serves a URL, as requests does: for a
:class:`PiShipAdapter` it sends through :meth:`PiShipAdapter.send_on` (on a connection
the transport took from the pool and armed with its call) or, through a proxy,
:meth:`PiShipAdapter.open` (cancellable
connections, one total deadline, a kept-alive request without requests' per-call
costs); any other adapter (one a user mounted for a prefix) gets the request through
``Session.send``. Either way the session's proxies, CA bundle and client certificate
apply, looked up once per origin (:meth:`PiShipAdapter.route`)::

    session = requests.Session()
    session.mount("https://", PiShipAdapter(pool_size=16))  # or let the Transport mount one
    transport = Transport(redactor=Redactor(), session=session)

Used through plain requests (``session.get(url)``) it is an ``HTTPAdapter`` whose
pools have the cancellable connection classes.

A request on its way out is an :class:`Outgoing` (its URL checked as a :class:`Target`,
its headers merged); the settings, adapter and pool of its origin are a :class:`Route`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

import attrs
import requests
import requests.adapters
import requests.hooks
import requests.structures
import requests.utils
import urllib3
import urllib3.connection
import urllib3.connectionpool
import urllib3.response
from urllib3.util.timeout import Timeout

from piship_remote.transport._connection import CURRENT, HOSTS, POOL_CLASSES, CallScope
from piship_remote.transport._headers import HeaderSet
from piship_remote.transport._streamed_response import Raw
from piship_remote.transport._urllib3_internals import RETIRED, record_retired, send_direct
from piship_remote.transport.endpoint import request_path, via_http_proxy

__all__ = ["Outgoing", "PiShipAdapter", "Route", "Target"]


@attrs.frozen
class Target:
    """One request URL as checked and normalised: what :class:`Transport` remembers."""

    label: str  # host[:port], for messages
    origin: str  # scheme://netloc, lower case
    url: str  # requests' normal form
    path: str  # what goes on the request line without a proxy


@attrs.frozen
class Route:
    """How requests to one origin are sent: the session's settings for it, the
    adapter that sends them and its pool.

    ``adapter`` and ``pool`` are ``None`` when the session routes the origin to an
    adapter that is not a ``PiShipAdapter`` (one a user mounted): ``Session.send``
    sends then. ``absolute``: the request line carries the whole URL (a plain-HTTP proxy).
    """

    settings: dict[str, Any]
    pool: urllib3.connectionpool.HTTPConnectionPool | None
    absolute: bool
    adapter: PiShipAdapter | None = None

    @property
    def direct(self) -> bool:
        """Sent by the transport's own adapter straight to the origin (no proxy)."""
        pool = self.pool
        return pool is not None and pool.proxy is None and not self.absolute

    def current(self) -> bool:
        """Whether the pool is still open and its manager's (else: look the origin up again)."""
        pool = self.pool
        return pool is None or (pool.pool is not None and pool not in RETIRED)


class Outgoing:
    """A request ready to send: method, URL, merged and checked headers, body."""

    __slots__ = ("_path", "_prepared", "body", "headers", "method", "url")

    def __init__(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str | bytes],
        body: bytes | Iterable[bytes] | None,
        prepared: requests.PreparedRequest | None,
        path: str | None = None,
    ) -> None:
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
        self._prepared = prepared
        self._path = path

    def url_for(self, *, absolute: bool) -> str:
        """The request line's target: the whole URL for a plain-HTTP proxy, else the path."""
        if absolute:
            return str(requests.utils.urldefragauth(self.url))
        if self._path is None:
            self._path = request_path(self.prepared())
        return self._path

    def prepared(self) -> requests.PreparedRequest:
        """A ``requests.PreparedRequest`` of this request (cookies, custom adapters)."""
        if self._prepared is None:
            prepared = requests.PreparedRequest()
            prepared.method = self.method
            prepared.url = self.url
            headers: requests.structures.CaseInsensitiveDict[str | bytes]
            headers = requests.structures.CaseInsensitiveDict(self.headers)
            prepared.headers = headers  # type: ignore[assignment]
            prepared.body = self.body  # type: ignore[assignment]  # requests streams iterables
            prepared.hooks = requests.hooks.default_hooks()
            self._prepared = prepared
        return self._prepared

    def chunked(self) -> bool:
        """Whether the body goes out chunked: a streamed body whose length the caller
        did not give.

        A request never carries both framings: with ``Content-Length`` and
        ``Transfer-Encoding: chunked`` together, servers and proxies may reject it as a
        smuggling attempt or read the body by the wrong one.
        """
        if self.body is None or isinstance(self.body, bytes):
            return False
        headers = self.headers
        if isinstance(headers, HeaderSet):
            return not headers.has("content-length")
        return not any(name.lower() == "content-length" for name in headers)


class PiShipAdapter(requests.adapters.HTTPAdapter):
    """An ``HTTPAdapter`` whose pools use the cancellable connection classes, and that
    sends a :class:`~piship_remote.transport.Transport`'s requests itself.

    It never retries (``max_retries=0``): a POST may have created something. Its pool
    managers record the pools they drop (see ``record_retired``).
    """

    def __init__(self, *, pool_size: int = 64) -> None:
        super().__init__(
            pool_connections=HOSTS, pool_maxsize=pool_size, pool_block=False, max_retries=0
        )

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(POOL_CLASSES)
        record_retired(self.poolmanager, HOSTS)

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> urllib3.PoolManager:
        manager: urllib3.PoolManager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if not proxy.lower().startswith("socks"):
            manager.pool_classes_by_scheme = dict(POOL_CLASSES)
        record_retired(manager, HOSTS)
        return manager

    def route(self, url: str, origin: str, settings: dict[str, Any]) -> Route:
        """How requests to ``url`` (whose origin is ``origin``) go out under the
        session's ``settings`` (``proxies``, ``verify``, ``cert``): the pool, found and
        checked once."""
        probe = requests.PreparedRequest()
        probe.url = url
        proxies, verify, cert = settings["proxies"], settings["verify"], settings["cert"]
        found = self.get_connection_with_tls_context(probe, verify, proxies=proxies, cert=cert)
        assert isinstance(found, urllib3.connectionpool.HTTPConnectionPool)
        self.cert_verify(found, url, verify, cert)  # type: ignore[no-untyped-call]
        absolute = via_http_proxy(url, origin, proxies)
        return Route(settings, found, absolute, self)

    def send_on(
        self,
        conn: urllib3.connection.HTTPConnection,
        outgoing: Outgoing,
        route: Route,
        remaining: float | None,
        *,
        stream: bool,
    ) -> Raw:
        """Send ``outgoing`` on ``conn``, taken from ``route``'s pool (a direct route,
        :attr:`Route.direct`) and armed by the caller; the answer's head read, its body not.

        ``remaining`` is the socket timeout of the connect and of the wait for the head."""
        pool = route.pool
        assert pool is not None
        return cast(
            Raw,
            send_direct(
                pool,
                outgoing.method,
                outgoing.url_for(absolute=False),
                outgoing.body,
                outgoing.headers,
                timeout=remaining,
                chunked=outgoing.chunked(),
                retries=self.max_retries,
                stream=stream,
                conn=conn,
            ),
        )

    def open(
        self, outgoing: Outgoing, route: Route, scope: CallScope, remaining: float | None
    ) -> Raw:
        """Send ``outgoing`` through ``route``'s proxy pool; the answer's head read.

        ``scope`` is the call's: its cancel shuts the connection's socket down, its
        deadline bounds the reads. ``remaining`` is the socket timeout of the connect
        and of the wait for the answer.
        """
        pool = route.pool
        assert pool is not None
        token = CURRENT.set(scope)  # urlopen takes the connection: no other way to it
        try:
            opened = self._urlopen(pool, outgoing, route, remaining)
        finally:
            CURRENT.reset(token)
        return opened

    def _urlopen(
        self,
        pool: urllib3.connectionpool.HTTPConnectionPool,
        outgoing: Outgoing,
        route: Route,
        remaining: float | None,
    ) -> urllib3.response.HTTPResponse:
        opened = pool.urlopen(
            method=outgoing.method,
            url=outgoing.url_for(absolute=route.absolute),
            body=outgoing.body,
            headers=dict(outgoing.headers),  # type: ignore[arg-type]  # copied, + proxy's
            redirect=False,
            assert_same_host=False,
            preload_content=False,
            decode_content=False,
            retries=self.max_retries,
            timeout=Timeout(connect=remaining, read=remaining),
            chunked=outgoing.chunked(),
        )
        assert isinstance(opened, urllib3.response.HTTPResponse)
        return opened
