"""A credential read fresh for every request attempt, and the HTTP 401 protocol around it.

::

    credential = Credential(lambda: os.environ.get("E2B_API_KEY"), None, redactor)
    response = send_with_credential(
        client, "GET", url, credential=credential,
        auth_header=lambda key: {"X-API-Key": key}, repeatable=True, timeout=30,
    )
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from piship_remote.redact import Redactor
from piship_remote.transport.protocol import HttpClient, HttpReply

__all__ = ["Credential", "send_with_credential"]


class Credential:
    """A credential read fresh for every request attempt, plus its rejection callback.

    ``read`` returns the current value (``None``/empty: send none); ``rejected`` is
    called on HTTP 401 and returns ``True`` when a renewed value is ready::

        credential = Credential(lambda: os.environ.get("E2B_API_KEY"), None, redactor)
    """

    def __init__(
        self,
        read: Callable[[], str | None] | None,
        rejected: Callable[[], bool] | None,
        redactor: Redactor,
    ) -> None:
        self._read = read
        self._rejected = rejected
        self._redactor = redactor
        self._registered: str | None = None  # the redactor never forgets a value

    def current(self) -> str | None:
        """The value to send now (registered with the redactor), or ``None``."""
        value = self._read() if self._read is not None else None
        if not value:
            return None
        if value != self._registered:
            self._redactor.register(value)
            self._registered = value
        return value

    def reject(self) -> bool:
        """Report a 401; ``True`` means a renewed credential can be read now."""
        if self._rejected is None:
            return False
        try:
            return bool(self._rejected())
        except Exception:  # a failing callback counts as "not renewed"
            return False


def send_with_credential(
    client: HttpClient,
    method: str,
    url: str,
    *,
    credential: Credential,
    auth_header: Callable[[str], Mapping[str, str]],
    repeatable: bool,
    **request_kwargs: Any,
) -> HttpReply:
    """``client.request(...)`` with a credential and the 401 protocol.

    The credential is read for each attempt and sent as ``auth_header(value)``
    (nothing when it is empty). A 401 to a request that carried it calls
    ``credential.reject()``; if that returns ``True`` and the request is
    ``repeatable``, it is sent once more with the re-read credential (a second 401
    is reported with ``reject()`` again). A 403 is returned as is.
    """
    headers = dict(request_kwargs.pop("headers", None) or {})
    response, sent = _attempt(client, method, url, credential, auth_header, headers, request_kwargs)
    if not sent or response.status != 401:
        return response
    if not credential.reject() or not repeatable:
        return response
    response.close()
    response, sent = _attempt(client, method, url, credential, auth_header, headers, request_kwargs)
    if sent and response.status == 401:
        credential.reject()
    return response


def _attempt(
    client: HttpClient,
    method: str,
    url: str,
    credential: Credential,
    auth_header: Callable[[str], Mapping[str, str]],
    headers: Mapping[str, str],
    request_kwargs: dict[str, Any],
) -> tuple[HttpReply, bool]:
    """One attempt; whether it carried the credential. The credentialed headers live only
    in this frame, and are cleared before an error leaves it."""
    value = credential.current()
    carried = bool(value)
    sent_headers = {**headers, **auth_header(value)} if value else dict(headers)
    del value
    try:
        response = client.request(method, url, headers=sent_headers, **request_kwargs)
    except BaseException:
        sent_headers.clear()  # the dict the request() frames saw is empty, too
        del sent_headers
        raise
    del sent_headers
    return response, carried
