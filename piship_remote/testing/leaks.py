"""Find where a secret appears in recorded requests.

>>> from piship_remote.testing.recorder import Recorded
>>> sent = [Recorded("POST", "/sandboxes?k=s3cret-key", {"x-api-key": "s3cret-key"}, b"")]
>>> leaks(sent, "s3cret-key", ["x-api-key"])
['/sandboxes?k=s3cret-key: path']
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from piship_remote.testing.recorder import Recorded

__all__ = ["leaks"]


def leaks(
    requests: Iterable[Recorded], secret: str, allowed_headers: Iterable[str] = ()
) -> list[str]:
    """Every place ``secret`` occurs, in request order; empty when it leaked nowhere.

    Reports ``"<path>: path"`` (path or query), ``"<path>: body"`` (body read as
    latin-1) and ``"<path>: header <name>"`` for each header not in
    ``allowed_headers`` (names compared lower-case).
    """
    if not secret:
        raise ValueError("leaks() needs a non-empty secret")
    allowed = {name.lower() for name in allowed_headers}
    found: list[str] = []
    for request in requests:
        if secret in request.path:
            found.append(f"{request.path}: path")
        if secret in request.body.decode("latin-1"):
            found.append(f"{request.path}: body")
        for name, value in request.headers.items():
            if name.lower() not in allowed and secret in str(value):
                found.append(f"{request.path}: header {name}")
    return found
