"""HTTP for the remote backends: one pooled client, endpoint rules, cancellable calls.

The modules, one concept each:

- :mod:`.protocol`: :class:`HttpClient`, what a backend needs from a client;
- :mod:`.client`: :class:`Transport`, the default client (a pooled session);
- :mod:`.adapter`: :class:`PiShipAdapter`, the requests adapter the transport sends through,
  and the request on its way out;
- :mod:`.deadline`: :class:`Deadline`, one value for "must end by";
- :mod:`.endpoint`: which URLs and headers may be sent;
- ``_headers``: :class:`HeaderSet`, headers checked and encoded once for many requests;
- :mod:`.response`: :class:`HttpResponse`, bodies read on demand;
- :mod:`.failures`: :class:`TransportError` and how failures are named;
- ``_cancel`` (:class:`CancelToken`, the deadline timer), ``_connection`` (the call scope
  through which cancel and deadline reach the socket, the pool's connections),
  ``_dechunk``, and ``_urllib3_internals``: the one module that touches private
  urllib3 / http.client members.

::

    transport = Transport(redactor=Redactor())
    with transport.request("GET", "https://api.example.com/health", timeout=10) as r:
        ok = r.status == 200
"""

from piship_remote.transport._connection import when_sent
from piship_remote.transport._dechunk import Dechunker as _Dechunker  # noqa: F401 (tests)
from piship_remote.transport._headers import HeaderSet
from piship_remote.transport.adapter import PiShipAdapter
from piship_remote.transport.client import Transport
from piship_remote.transport.deadline import Deadline
from piship_remote.transport.endpoint import check_endpoint
from piship_remote.transport.failures import TransportError
from piship_remote.transport.protocol import HttpClient, HttpReply
from piship_remote.transport.response import HttpResponse, window_text

__all__ = [
    "Deadline",
    "HeaderSet",
    "HttpClient",
    "HttpReply",
    "HttpResponse",
    "PiShipAdapter",
    "Transport",
    "TransportError",
    "check_endpoint",
    "when_sent",
    "window_text",
]
