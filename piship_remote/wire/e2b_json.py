"""Reading and writing the E2B wire model: JSON bodies to shapes and back, Connect envelopes.

Shared by the local service and the E2B test double. The shapes are the control
plane's (:mod:`piship_remote.wire.e2b_control`: :class:`NewSandbox`,
:class:`SandboxInfo`, ...) and envd's (:mod:`piship_remote.wire.envd`:
:class:`StartRequest`, the Start stream's :class:`StartEvent`, :class:`DataEvent`,
:class:`EndEvent`, ...); envd's path rule and URL signature are in
:mod:`piship_remote.wire.envd_paths`. A Start stream's envelopes are :func:`event_frame`,
:func:`end_stream_frame` and :func:`start_message`::

    >>> event_frame("start", StartEvent(42))[5:]
    b'{"event":{"start":{"pid":42}}}'

Requests are structured with :func:`parse`, which rejects wrong JSON types
(``"5"`` is not an int, ``1`` is not a bool) and names the field::

    >>> parse(b'{"templateID": "base", "timeout": "5"}', NewSandbox)
    Traceback (most recent call last):
    ...
    piship_remote.wire.e2b_json.WireError: invalid value for type, expected int | None @ $.timeout

Answers are unstructured with :func:`to_json`, which leaves out default values the
way protojson does (``exitCode`` 0, empty ``error``, absent ``stdout``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import unquote

import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from piship_remote.wire.connect import END_STREAM, EnvelopeReader, connect_envelope
from piship_remote.wire.e2b_control import CONTROL_ALWAYS_SENT, CONTROL_NAMES
from piship_remote.wire.envd import ENVD_NAMES, ConnectError

__all__ = [
    "WireError",
    "end_stream_frame",
    "event_frame",
    "metadata_filter",
    "parse",
    "start_message",
    "structure",
    "to_json",
    "unstructure",
]

T = TypeVar("T")


class WireError(ValueError):
    """A request body that is not JSON or does not have the expected shape."""


# -- the converter ---------------------------------------------------------------------

_NAMES: Mapping[type, Mapping[str, str]] = {**CONTROL_NAMES, **ENVD_NAMES}


def _strict(kind: type, name: str) -> Callable[[object, type], object]:
    def structure(value: object, _: type) -> object:
        if type(value) is not kind:  # bool is an int subclass; JSON keeps them apart
            raise ValueError(f"invalid value for type, expected {name}")
        return value

    return structure


def _converter() -> cattrs.Converter:
    converter = cattrs.Converter(omit_if_default=True)
    converter.register_structure_hook(int, _strict(int, "int"))
    converter.register_structure_hook(str, _strict(str, "str"))
    converter.register_structure_hook(bool, _strict(bool, "bool"))
    for cls, renames in _NAMES.items():
        fields: dict[str, Any] = {name: override(rename=wire) for name, wire in renames.items()}
        converter.register_structure_hook(cls, make_dict_structure_fn(cls, converter, **fields))
        for name in CONTROL_ALWAYS_SENT.get(cls, ()):
            fields[name] = override(rename=renames.get(name), omit_if_default=False)
        converter.register_unstructure_hook(
            cls, make_dict_unstructure_fn(cls, converter, _cattrs_omit_if_default=True, **fields)
        )
    return converter


_CONVERTER = _converter()


def parse(body: bytes, cls: type[T]) -> T:
    """Structure a JSON request body as ``cls``; :class:`WireError` names what is wrong."""
    try:
        data = json.loads(body) if body.strip() else {}
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise WireError("the request body is not JSON") from None
    return structure(data, cls)


def structure(data: object, cls: type[T]) -> T:
    """Structure already-decoded JSON as ``cls`` (see :func:`parse`)."""
    if not isinstance(data, dict):
        raise WireError("the request body is not a JSON object")
    try:
        return _CONVERTER.structure(data, cls)
    except cattrs.BaseValidationError as e:
        messages = cattrs.transform_error(e)
        raise WireError(messages[0] if messages else "the request body is invalid") from None


def to_json(value: object) -> bytes:
    """Compact JSON for an attrs value (or a plain dict holding them)."""
    data = _CONVERTER.unstructure(value)
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


def unstructure(value: object) -> Any:
    """The JSON-ready form of ``value`` (defaults omitted, wire names)."""
    return _CONVERTER.unstructure(value)


# -- Connect envelopes ----------------------------------------------------------------


def event_frame(name: str, value: object) -> bytes:
    """One Start-stream envelope ``{"event": {name: value}}`` (``value`` an event or ``{}``)."""
    return connect_envelope({"event": {name: unstructure(value)}})


def end_stream_frame(error: ConnectError | None = None) -> bytes:
    """The end-of-stream envelope: ``{}`` for success, else ``{"error": {...}}``."""
    return connect_envelope({} if error is None else {"error": unstructure(error)}, END_STREAM)


def start_message(body: bytes) -> dict[str, Any]:
    """The first message of an enveloped request body (a StartRequest, not yet structured)."""
    try:
        frames = EnvelopeReader().push(body)
    except ValueError as e:
        raise WireError(str(e)) from None
    if not frames or frames[0].end_stream:
        raise WireError("the request holds no Start message")
    return frames[0].message


# -- queries ---------------------------------------------------------------------------


def metadata_filter(raw: str | None) -> dict[str, str]:
    """The pairs a ``metadata`` query value asks for; :class:`ListError` when malformed."""
    if not raw:
        return {}
    wanted: dict[str, str] = {}
    for pair in raw.split("&"):
        parts = pair.split("=")
        if len(parts) != 2:
            raise WireError(f"Invalid metadata filter: {pair[:80]}")
        wanted[unquote(parts[0])] = unquote(parts[1])
    return wanted
