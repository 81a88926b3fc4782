"""A backend's credential and the 401 protocol both backends send their requests under.

The credential is read fresh for every attempt; a 401 to a request that carried it
calls the rejection callback, and a repeatable request is sent once more when that
says a renewed credential is ready::

    credential = Credential(lambda: os.environ["E2B_API_KEY"], None, redactor,
                            name="E2B_API_KEY")
    response = send_credentialed(transport, "DELETE", url, credential=credential,
                                 auth_header=lambda key: {"X-API-Key": key}, repeatable=True)

A read that fails (``KeyError`` for an unset variable) or gives ``""`` is a
``CREDENTIAL_REQUIRED`` error naming what to set, raised before anything is sent.
A read that gives ``None`` sends no credential, unless the credential is
``required`` (E2B's API key): then it is the same error. No callable at all
(``credential=None``) always sends none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from piship_remote.model.errors import CredentialRequired, PiShipError

if TYPE_CHECKING:
    from piship_remote.model.redact import Redactor
    from piship_remote.transport import HttpClient, HttpReply

__all__ = ["Credential", "send_credentialed"]

_EXAMPLE = "lambda: os.environ['E2B_API_KEY']"


def _checked_callable(value: object, option: str) -> Any:
    if value is None or callable(value):
        return value
    if option == "credential":
        raise TypeError(
            f"credential must be a callable returning the key, e.g. {_EXAMPLE}; "
            f"got {type(value).__name__}"
        )
    raise TypeError(f"{option} must be a callable or None; got {type(value).__name__}")


class Credential:
    """A credential read fresh for every request attempt, plus its rejection callback.

    ``read`` returns the current value (``None``: send none); ``rejected`` is called
    on HTTP 401 and returns ``True`` when a renewed value is ready. ``name`` says
    what a user sets when the value is missing (a variable or an option).
    """

    def __init__(
        self,
        read: Callable[[], str | None] | None,
        rejected: Callable[[], bool] | None,
        redactor: Redactor,
        *,
        name: str = "the credential option",
        required: bool = False,
    ) -> None:
        self._read: Callable[[], str | None] | None = _checked_callable(read, "credential")
        self._rejected: Callable[[], bool] | None = _checked_callable(
            rejected, "credential_rejected"
        )
        self._redactor = redactor
        self._name = name
        self._required_value = required
        self._registered: str | None = None  # the redactor never forgets a value

    def current(self) -> str | None:
        """The value to send now (registered with the redactor), or ``None``.

        Raises ``CREDENTIAL_REQUIRED`` when the read fails or gives an empty value
        (or ``None``, for a ``required`` credential).
        """
        if self._read is None:
            return None
        try:
            value = self._read()
        except KeyError as error:
            raise self._required(_key_name(error) or self._name, "is not set") from None
        except Exception as error:
            raise self._required(
                self._name, f"could not be read ({type(error).__name__})"
            ) from None
        if value is None:
            if self._required_value:
                raise self._required(self._name, "is not set (no value was given)")
            return None
        if not isinstance(value, str):
            raise self._required(self._name, f"is a {type(value).__name__}, not text")
        if value == "":
            raise self._required(self._name, "is empty")
        if value != self._registered:
            self._redactor.register(value)
            self._registered = value
        return value

    def missing(self) -> PiShipError | None:
        """The ``CREDENTIAL_REQUIRED`` error :meth:`current` would raise now, or ``None``.

        Lets a backend say what to set before it sends any request at all.
        """
        try:
            self.current()
        except PiShipError as error:
            return error
        return None

    def reject(self) -> bool:
        """Report a 401; ``True`` means a renewed credential can be read now."""
        if self._rejected is None:
            return False
        try:
            return bool(self._rejected())
        except Exception:  # a failing callback counts as "not renewed"
            return False

    def _required(self, name: str, problem: str) -> PiShipError:
        return CredentialRequired(
            f"the sandbox service needs a credential, but {name} {problem}",
            user_action=f"Set {name} to the service's credential, or pass a credential "
            f"callable that returns it (credential={_EXAMPLE})",
            component="sandbox",
        )


def _key_name(error: KeyError) -> str | None:
    key = error.args[0] if error.args else None
    return key if isinstance(key, str) and key.isidentifier() else None


def send_credentialed(
    client: HttpClient,
    method: str,
    url: str,
    *,
    credential: Credential,
    auth_header: Callable[[str], Mapping[str, str]],
    repeatable: bool,
    **request_kwargs: Any,
) -> HttpReply:
    """``client.request`` with the credential and the 401 protocol.

    The credential is read for each attempt and sent as ``auth_header(value)``
    (nothing when it is ``None``). A 401 to a request that carried it calls
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
    """One attempt, and whether it carried the credential. The credentialed headers live
    only in this frame and are cleared before an error leaves it, so no traceback's
    locals hold the secret."""
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
