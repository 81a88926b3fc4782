"""A stream's response that skips urllib3's response object.

A streamed, chunked body is de-chunked straight from the connection's buffered
reader (see :mod:`piship_remote.transport.response`), so of urllib3's
``HTTPResponse`` only the status, the headers and the release of the connection
would be used. Building it costs more than the rest of a short stream's head: it
checks the header block again, copies it into a new dictionary and parses the
content coding and the length again. When the head is plain (see
:mod:`piship_remote.transport._response_head`) and the body is chunked, without a
content coding and without a cookie to store, the connection hands out this
smaller object instead::

    response = StreamedResponse(inner, head, conn)
    response.pool = pool  # set by whoever took the connection from it
    response.status, response.headers["content-type"]
    response.release_conn()  # back to the pool, once the body was read to the end

It releases its connection exactly as urllib3's response does: ``close()`` closes
the connection (the body was not read to the end, so it cannot be reused) and
``release_conn()`` gives its pool slot back.
"""

from __future__ import annotations

import http.client
from typing import TypeAlias

import urllib3
import urllib3.connection
import urllib3.connectionpool
import urllib3.response

from piship_remote.transport._response_head import PlainHead
from piship_remote.transport._urllib3_internals import return_to_pool

__all__ = ["Raw", "StreamedResponse"]


class StreamedResponse:
    """The status, headers and connection of a plain, chunked stream's answer.

    ``inner`` is http.client's response, whose buffered reader the body is read from.
    """

    __slots__ = ("_connection", "headers", "inner", "pool", "status")

    def __init__(
        self,
        inner: http.client.HTTPResponse,
        head: PlainHead,
        connection: urllib3.connection.HTTPConnection,
    ) -> None:
        self.inner = inner
        self.status = head.status
        self.headers = urllib3.HTTPHeaderDict(head.fields)
        self.pool: urllib3.connectionpool.HTTPConnectionPool | None = None
        self._connection: urllib3.connection.HTTPConnection | None = connection

    def read1(self, amt: int = -1, decode_content: bool | None = None) -> bytes:
        """What has arrived of the (de-chunked) body, at most ``amt`` bytes."""
        return self.inner.read1(amt)

    def close(self) -> None:
        """Close the body and the connection (it cannot carry another request)."""
        self.inner.close()
        if self._connection is not None:
            self._connection.close()

    def release_conn(self) -> None:
        """Give the connection back to its pool (closed, if :meth:`close` ran)."""
        connection, self._connection = self._connection, None
        if connection is not None and self.pool is not None:
            return_to_pool(self.pool, connection)


Raw: TypeAlias = "urllib3.response.HTTPResponse | StreamedResponse"
"""What a request's answer is below :class:`~piship_remote.transport.response.HttpResponse`."""
