"""The E2B-compatible backend: control plane, envd, streams, files and leases.

    >>> from piship_remote.backends.e2b.backend import E2bCompatibleBackend
"""

from piship_remote.backends.e2b.backend import E2bCompatibleBackend

__all__ = ["E2bCompatibleBackend"]
