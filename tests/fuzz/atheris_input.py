"""Turn atheris' bytes into the JSON-like values the parsers read (keys from the vocabulary)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import atheris
from vocabulary import KEYS, STRINGS


def json_value(fdp: atheris.FuzzedDataProvider, depth: int = 0) -> Any:
    kind = fdp.ConsumeIntInRange(0, 8 if depth < 4 else 5)
    if kind == 0:
        return None
    if kind == 1:
        return fdp.ConsumeBool()
    if kind == 2:
        return fdp.ConsumeIntInRange(-(2**40), 2**40)
    if kind == 3:
        return fdp.ConsumeRegularFloat() if fdp.ConsumeBool() else fdp.ConsumeFloat()
    if kind == 4:
        return STRINGS[fdp.ConsumeIntInRange(0, len(STRINGS) - 1)]
    if kind == 5:
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 16))
    if kind == 6:
        return [json_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 4))]
    return json_object(fdp, depth + 1)


def json_object(fdp: atheris.FuzzedDataProvider, depth: int = 0) -> dict[str, Any]:
    return {key(fdp): json_value(fdp, depth) for _ in range(fdp.ConsumeIntInRange(0, 5))}


def key(fdp: atheris.FuzzedDataProvider) -> str:
    if fdp.ConsumeIntInRange(0, 7):
        return KEYS[fdp.ConsumeIntInRange(0, len(KEYS) - 1)]
    return fdp.ConsumeUnicodeNoSurrogates(6)


def run(target: Callable[[bytes], None]) -> None:
    """Fuzz ``target`` with libFuzzer's command line (``-max_total_time=600``, ``-runs=N``)."""
    atheris.Setup(sys.argv, target)
    atheris.Fuzz()
