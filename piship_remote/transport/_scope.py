"""The context variables the transport uses where a third-party call gives no other way.

- :data:`CURRENT`: the call scope (see ``_connection.CallScope``) of a request that
  urllib3's ``pool.urlopen`` sends (through a proxy): ``urlopen`` takes the connection
  from the pool itself. A request sent directly arms the connection it is sent on
  instead and never sets it.
- :data:`ON_SENT` (:func:`when_sent`): a callback the connection calls once
  http.client has written the request; a caller reaches the connection only through
  the ``HttpClient`` protocol, which has no parameter for it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from piship_remote.transport._connection import CallScope

__all__ = ["CURRENT", "ON_SENT", "when_sent"]

# The scope of the call the current thread is making (set only while it makes it).
CURRENT: contextvars.ContextVar[CallScope | None] = contextvars.ContextVar(
    "piship_transport_call", default=None
)

# Called by the connection once a request's headers and body are written (see when_sent).
ON_SENT: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "piship_on_sent", default=None
)


@contextlib.contextmanager
def when_sent(callback: Callable[[], None]) -> Iterator[None]:
    """Call ``callback`` as soon as the requests sent in this block are on the wire.

    It fires after the connection wrote the request, before the answer is read,
    so another request can follow without waiting for it.
    """
    token = ON_SENT.set(callback)
    try:
        yield
    finally:
        ON_SENT.reset(token)
