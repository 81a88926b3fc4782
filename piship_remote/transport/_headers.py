"""Request headers checked and encoded once: :class:`HeaderSet`.

Headers that stay the same for many requests (a session's defaults, an envd
connection's routing headers, a claim's router headers) are checked against the
endpoint rules and encoded for the wire when the set is made; each request then
only adds what changes (its length, a deadline, a credential read just now)::

    routing = HeaderSet({"E2b-Sandbox-Id": "sbx1", "E2b-Sandbox-Port": "49983"})
    sent = routing.plus({"Connect-Timeout-Ms": "31000"})   # only the new header is checked
    transport.request("POST", url, headers=sent, data=body)

A set with a header that breaks the rules is still made (``valid`` is ``False``);
the transport refuses it when it would be sent, as it refuses a plain mapping.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from piship_remote.transport.endpoint import header_is_valid

__all__ = ["HeaderSet"]


class HeaderSet(Mapping[str, str]):
    """An immutable, ordered set of request headers, checked and encoded once.

    Names keep the case they were given; a later name replaces an earlier one
    whatever its case (as ``requests`` merges headers). A value of ``None``
    removes the header from what it is merged onto (``requests``' convention).
    """

    __slots__ = ("_items", "_lines", "_lower", "_merged", "_parts", "_removed", "valid")

    def __init__(self, headers: Mapping[str, str | bytes | None] | None = None) -> None:
        items: dict[str, Any] = {}  # a bytes value (a caller's session) is sent by urllib3
        spelling: dict[str, str] = {}  # lower-case name -> the name in `items`
        removed: set[str] = set()
        valid = True
        for name, value in (headers or {}).items():
            key = name.lower() if isinstance(name, str) else name
            previous = spelling.pop(key, None)
            if previous is not None:
                del items[previous]
            if value is None:
                removed.add(key)
                continue
            removed.discard(key)
            valid = valid and header_is_valid(name, value)
            items[name] = value
            spelling[key] = name
        lines = _encoded(items) if valid else None
        self._setup(items, frozenset(spelling), frozenset(removed), valid, lines)

    def _setup(
        self,
        items: dict[str, str],
        lower: frozenset[str],
        removed: frozenset[str],
        valid: bool,
        lines: tuple[bytes, ...] | None,
    ) -> None:
        self._items = items
        self._lower = lower
        self._removed = removed
        self.valid = valid
        self._lines = lines
        self._merged: tuple[HeaderSet, HeaderSet] | None = None
        self._parts: tuple[HeaderSet, HeaderSet] | None = None

    @classmethod
    def _made(
        cls,
        items: dict[str, str],
        lower: frozenset[str],
        valid: bool,
        lines: tuple[bytes, ...] | None = None,
        removed: frozenset[str] = frozenset(),
    ) -> HeaderSet:
        """A set of already checked ``items``; ``lines`` encoded here when not given."""
        made = cls.__new__(cls)
        if lines is None and valid:
            lines = _encoded(items)
        made._setup(items, lower, removed, valid, lines)
        return made

    def __getitem__(self, name: str) -> str:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"HeaderSet({sorted(self._lower)!r})"  # names only: values may be credentials

    def has(self, name: str) -> bool:
        """Whether a header called ``name`` (any case) is in the set."""
        return name.lower() in self._lower

    @property
    def names(self) -> frozenset[str]:
        """The lower-case names of the headers in the set."""
        return self._lower

    @property
    def lines(self) -> tuple[bytes, ...] | None:
        """The encoded ``Name: value`` lines (no line ends); ``None`` when not valid, or
        a value is not plain text (bytes, characters beyond Latin-1)."""
        return self._lines

    def for_requests(self) -> dict[str, str | None]:
        """The headers as ``requests`` takes them: a removed one as ``None``."""
        return {**self._items, **dict.fromkeys(self._removed)}

    def plus(self, extra: Mapping[str, str | None]) -> HeaderSet:
        """This set with ``extra`` merged on top (only ``extra`` is checked and encoded).

        The result remembers both, so merging it onto a third set reuses that set's
        merge with this one (remembered on this one).
        """
        top = HeaderSet(extra)
        result = self._merged_now(top)
        result._parts = (self, top)
        return result

    def merged(self, top: HeaderSet) -> HeaderSet:
        """This set with ``top`` on top: ``top``'s names replace or remove this set's.

        The result for one ``top`` is remembered (both sets are immutable).
        """
        cached = top._merged
        if cached is not None and cached[0] is self:
            return cached[1]
        if not top._items and not top._removed:
            return self
        parts = top._parts  # made by plus(): this set's merge with its base is remembered
        result = self._merged_now(top) if parts is None else self.merged(parts[0]).merged(parts[1])
        top._merged = (self, result)
        return result

    def _merged_now(self, top: HeaderSet) -> HeaderSet:
        items, lines = self._items, self._lines
        dropped = self._lower & (top._lower | top._removed)
        if dropped:
            kept = [name for name in items if name.lower() not in dropped]
            if lines is not None:
                by_name = dict(zip(items, lines, strict=True))
                lines = tuple(by_name[name] for name in kept)
            items = {name: items[name] for name in kept}
        else:
            items = dict(items)
        items.update(top._items)
        joined = None if lines is None or top._lines is None else lines + top._lines
        return HeaderSet._made(
            items,
            (self._lower - top._removed) | top._lower,
            self.valid and top.valid,
            joined,
            (self._removed - top._lower) | top._removed,
        )

    def with_length(self, length: int) -> HeaderSet:
        """This set plus ``Content-Length: length`` (a number: nothing to check)."""
        items = dict(self._items)
        items["Content-Length"] = str(length)  # in place if the caller spelt it so
        lines = None
        if self._lines is not None and not self.has("content-length"):
            lines = (*self._lines, b"Content-Length: %d" % length)
        return HeaderSet._made(
            items, self._lower | {"content-length"}, self.valid, lines, self._removed
        )


def _encoded(items: Mapping[str, str]) -> tuple[bytes, ...] | None:
    """The wire lines of valid headers, or ``None`` if one is not plain text."""
    lines: list[bytes] = []
    for name, value in items.items():
        if not isinstance(name, str) or not isinstance(value, str):
            return None
        try:
            lines.append(name.encode("ascii") + b": " + value.encode("latin-1"))
        except UnicodeEncodeError:
            return None
    return tuple(lines)


def header_set(
    headers: Mapping[str, str | bytes | None] | Iterable[tuple[str, str]] | None,
) -> HeaderSet:
    """``headers`` as a :class:`HeaderSet` (itself, if it is one)."""
    if isinstance(headers, HeaderSet):
        return headers
    if headers is None:
        return _EMPTY
    return HeaderSet(headers if isinstance(headers, Mapping) else dict(headers))


_EMPTY = HeaderSet()
