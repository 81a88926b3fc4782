"""Transport failures: the error a failed request ends with, and how it is named.

A failure below HTTP becomes a :class:`TransportError` whose message says what failed
(``sandbox request to api.example.com timed out``, ``... failed: ECONNREFUSED``) and
never carries the underlying exception's text, which can quote header values.
"""

from __future__ import annotations

import errno
import http.client
import re
import socket
import ssl
from collections.abc import Iterator

import requests
import urllib3.exceptions

from piship_remote.model.errors import GatewayUnreachable

__all__ = ["NETWORK_ERRORS", "TransportError", "failure_code", "timed_out"]

# Transport-level failures a call can end with; anything else (a bug, a bad argument)
# propagates unchanged. requests' exceptions all derive from OSError.
NETWORK_ERRORS = (OSError, urllib3.exceptions.HTTPError, http.client.HTTPException)
_TIMEOUT_ERRORS = (
    requests.Timeout,
    urllib3.exceptions.ReadTimeoutError,
    urllib3.exceptions.ConnectTimeoutError,
)
_SYSTEM_CODE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
_GAI_NAMES = {
    value: name
    for name, value in vars(socket).items()
    if name.startswith("EAI_") and isinstance(value, int)
}


class TransportError(GatewayUnreachable):
    """A request that failed below HTTP: refused, reset, dropped, or past its deadline.

    Code ``GATEWAY_UNREACHABLE``, retryable. ``request_sent`` is ``False`` only when the
    request certainly never reached the server (name resolution or connect failed), so
    a caller may safely resend even a POST::

        except TransportError as e:
            if not e.request_sent:
                ...  # nothing was created remotely
    """

    request_sent: bool

    def __init__(self, message: str, *, request_sent: bool, component: str) -> None:
        super().__init__(message, retryable=True, component=component)
        self.request_sent = request_sent


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception it wraps (causes, contexts, urllib3 reasons, args)."""
    seen: set[int] = set()
    pending = [exc]
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        linked = (current.__cause__, current.__context__, getattr(current, "reason", None))
        pending.extend(e for e in (*linked, *current.args) if isinstance(e, BaseException))


def timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` is a socket timeout (a deadline or idle limit), not a refusal."""
    for e in _chain(exc):
        if isinstance(e, urllib3.exceptions.NewConnectionError):
            continue  # derives from ConnectTimeoutError, but is a refusal
        if isinstance(e, TimeoutError) and e.errno is None:
            return True  # a socket timeout, i.e. our deadline or idle limit
        if isinstance(e, _TIMEOUT_ERRORS):
            return True
    return False


def failure_code(exc: BaseException) -> str:
    """The first system error name in the chain (``ECONNREFUSED``), else ``network error``.

    A TLS failure is named by OpenSSL's reason (``CERTIFICATE_VERIFY_FAILED``): its
    ``errno`` is an OpenSSL error class, not a system error.
    """
    for e in _chain(exc):
        name: str | None
        if isinstance(e, ssl.SSLError):
            name = e.reason if isinstance(e.reason, str) else None
        elif isinstance(e, socket.gaierror):
            name = _GAI_NAMES.get(e.errno) if isinstance(e.errno, int) else None
        elif isinstance(e, OSError) and isinstance(e.errno, int):
            name = errno.errorcode.get(e.errno)
        else:
            continue
        if name is not None and _SYSTEM_CODE.fullmatch(name):
            return name
    return "network error"
