"""A request on its way out: its URL as checked, its origin's route, its merged headers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import requests
import requests.hooks
import requests.structures
import requests.utils
import urllib3.connectionpool

from piship_remote.transport._headers import HeaderSet
from piship_remote.transport._urllib3_internals import RETIRED
from piship_remote.transport.endpoint import request_path

if TYPE_CHECKING:
    from piship_remote.transport.adapter import PiShipAdapter

__all__ = ["Outgoing", "Route", "Target"]


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
