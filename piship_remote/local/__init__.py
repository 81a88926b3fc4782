"""The embedded local E2B-compatible sandbox service (commands isolated by bubblewrap).

    from piship_remote.local import LocalE2bService

    with LocalE2bService() as service:
        backend = service.backend()

``serve()`` runs it in the foreground (``piship-remote serve``); ``check()`` says
why it cannot run here, or returns ``None``. What one HTTP client may hold and what an
image may cost to unpack are :class:`HttpLimits` and :class:`ImageLimits` (defaults
:data:`DEFAULT_HTTP_LIMITS`, :data:`DEFAULT_IMAGE_LIMITS`), given as ``http_limits=``
and ``image_limits=``. It needs Linux and bubblewrap:
``pip install 'piship-remote[local]'``.
"""

from piship_remote._http_server.messages import Limits as HttpLimits
from piship_remote.local.isolation.bubblewrap import find_bwrap, isolation_problem
from piship_remote.local.isolation.oci_archive import DEFAULT_IMAGE_LIMITS, ImageLimits
from piship_remote.local.service import DEFAULT_HTTP_LIMITS, LocalE2bService, main, serve

__all__ = [
    "DEFAULT_HTTP_LIMITS",
    "DEFAULT_IMAGE_LIMITS",
    "HttpLimits",
    "ImageLimits",
    "LocalE2bService",
    "check",
    "find_bwrap",
    "isolation_problem",
    "main",
    "serve",
]

check = isolation_problem
