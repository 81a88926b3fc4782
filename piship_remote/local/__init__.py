"""The embedded local E2B-compatible sandbox service (commands isolated by bubblewrap).

    from piship_remote.local import LocalE2bService

    with LocalE2bService() as service:
        backend = service.backend()

``serve()`` runs it in the foreground (``piship-remote serve``); ``check()`` says
why it cannot run here, or returns ``None``. It needs Linux and bubblewrap:
``pip install 'piship-remote[local]'``.
"""

from piship_remote.local.isolation.bubblewrap import find_bwrap, isolation_problem
from piship_remote.local.service import LocalE2bService, main, serve

__all__ = ["LocalE2bService", "check", "find_bwrap", "isolation_problem", "main", "serve"]

check = isolation_problem
