"""The exceptions of piship_remote, one class per error code.

Every failure of an activation or a command is a :class:`PiShipError`; each code has
a subclass named after it, so a caller catches the kind it can handle and leaves the
rest to ``except PiShipError`` (``e.code`` stays the code's string)::

    from piship_remote.errors import PiShipError, SandboxUnavailable

    try:
        sandbox = activate_sandbox(policy, backend=backend, workspace=".")
    except SandboxUnavailable as e:  # code "SANDBOX_UNAVAILABLE"
        ...
    except PiShipError as e:
        print(f"{e.code}: {e}")

``ConfigInvalid`` is also a ``ValueError``. A timeout and a cancel are not failures of
the sandbox, so :class:`CommandTimeout` (a ``TimeoutError``) and
:class:`CommandCancelled` are not ``PiShipError``.
"""

from piship_remote.model import errors as _errors
from piship_remote.model.errors import *  # noqa: F403 (the public names are its __all__)

__all__ = _errors.__all__
