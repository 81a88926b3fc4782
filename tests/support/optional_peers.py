"""The one way a test asks for an optional peer: skip, naming the extra to install.

Each optional package belongs to an extra of ``setup.cfg`` (``interop``, ``speed``,
``fuzz``, ``yaml``); without it the tests that need it are skipped with the install
line that brings it, so ``pip install -e '.[test]' && pytest`` passes as it is::

    pytest.importorskip("e2b", reason=install_hint("interop"))
"""

from __future__ import annotations

__all__ = ["install_hint"]


def install_hint(extra: str) -> str:
    """The skip reason for a package of ``extra`` that is not installed."""
    return f"needs the {extra} extra: pip install -e '.[{extra}]'"
