"""envd's rules for a sandbox path: where a request's path lands, and the URL signature for it.

:func:`resolve` turns the path a request names into an absolute one, as envd does
(empty is the user's home, ``~`` expands, a relative path joins the home), and
:func:`signature` is the ``signature`` a ``/files`` URL carries instead of the
access token. A ``~user`` path or a NUL byte is a :class:`PathError`::

    >>> resolve("notes/../a.txt", "/home/user")
    '/home/user/a.txt'
    >>> resolve("", "/home/user"), resolve("~/b", "/home/user")
    ('/home/user', '/home/user/b')
    >>> signature("/home/user/a.txt", "read", "user", "token", None)[:3]
    'v1_'
"""

from __future__ import annotations

import base64
import hashlib
import posixpath

__all__ = ["PathError", "resolve", "signature"]


class PathError(ValueError):
    """A sandbox path that cannot be resolved (``~user``, a NUL byte)."""


def resolve(path: str, home: str) -> str:
    """envd's path rule: empty is the home, ``~`` expands, relative joins the home; cleaned."""
    if "\0" in path:
        raise PathError(f"path '{path[:200]}' contains a NUL byte")
    if not path or path == "~":
        return home
    if path.startswith("~/"):
        path = home + path[1:]
    elif path.startswith("~"):
        shown = path[:200]
        raise PathError(f"error expanding and resolving path '{shown}': ~user is not supported")
    elif not path.startswith("/"):
        path = posixpath.join(home, path)
    cleaned = posixpath.normpath(path)
    return "/" + cleaned.lstrip("/")


def signature(path: str, operation: str, username: str, token: str, expiration: int | None) -> str:
    """The signature envd expects for ``operation`` (``read``/``write``) on ``path``."""
    text = f"{path}:{operation}:{username}:{token}"
    if expiration is not None:
        text += f":{expiration}"
    digest = hashlib.sha256(text.encode()).digest()
    return "v1_" + base64.b64encode(digest).decode().rstrip("=")
