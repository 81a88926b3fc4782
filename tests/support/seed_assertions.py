"""The seed suite's literal expectations, and the Python ports that must assert the same.

The seed (``remote.test.ts``) is the contract: a ported case asserts exactly what the seed
asserts. This module reads the seed's ``it(...)`` cases and, in each, the literal values
its ``expect(...)`` matchers expect (``toEqual``, ``toBe``, ``toThrow``, ``toMatch``, ...;
an argument that is not a plain literal, such as a variable or a call, is left out). A
Python test says which case it ports with a ``# seed: "<case name>"`` comment, in its body
or just above it. :func:`findings` lists where the ports differ::

    cases = seed_cases(Path("../shared/seed/remote.test.ts").read_text())
    problems = findings(cases, {"tests/test_e2b_seed.py": source})

A port differs when a literal the seed expects is missing from the constants of the
functions that port the case (a string may sit inside a longer one, as in an error
message; a regular expression's source may, without its anchors), when a dict literal
with the keys of an object the seed expects (``toEqual``) holds other values, or when a
port changes what it asserts on (``.pop(``, ``del``, ``.clear()``...).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

__all__ = ["Expected", "Regex", "findings", "ported_functions", "seed_cases"]

_MATCHERS = (
    "toEqual",
    "toStrictEqual",
    "toBe",
    "toThrow",
    "toMatchObject",
    "toMatch",
    "toContain",
    "toHaveLength",
)
_EXPECTATION = re.compile(r"\.(" + "|".join(_MATCHERS) + r")\(")
_CASE = re.compile(r"(?<![\w.])it(\.each)?\(")
_MARKER = re.compile(r'# seed: "(.*?)"')
# What a port may not call on the data it asserts: it would change what is compared.
_MUTATORS = frozenset({"pop", "popitem", "clear", "remove", "discard", "setdefault"})
_REGEX_BEFORE = "(,=:[!&|?{};"
# What the seed's JavaScript names as a string, the Python port names as a class.
_PYTHON_NAMES = {"AbortError": "CommandCancelled"}


@attrs.frozen
class Regex:
    """A JavaScript regular expression literal's source."""

    source: str


@attrs.frozen
class Expected:
    """One matcher of a seed case and the literal value it expects."""

    matcher: str
    value: Any


class NotLiteral(ValueError):
    """The argument is not a plain literal (a variable, a call, a template with ``${}``)."""


# -- the seed --------------------------------------------------------------------------


def seed_cases(text: str) -> dict[str, list[Expected]]:
    """Each ``it(...)`` case's name (``it.each``'s with its ``%s``) and literal expectations."""
    quoted = _quoted(text)
    cases: dict[str, list[Expected]] = {}
    for match in _CASE.finditer(text):
        position = match.end() - 1
        if quoted[match.start()]:
            continue
        if match.group(1):  # it.each([...])("name", fn)
            position = _balanced_end(text, position)
            if position >= len(text) or text[position] != "(":
                continue
        end = _balanced_end(text, position)
        try:
            name = next(_tokens(text[position + 1 : end - 1].lstrip()))
        except (StopIteration, NotLiteral):
            continue
        if isinstance(name, _Str):
            found = _expectations(text, position, end, quoted)
            cases.setdefault(name.text, []).extend(found)
    return cases


def _expectations(text: str, start: int, end: int, quoted: bytearray) -> Iterator[Expected]:
    for match in _EXPECTATION.finditer(text, start, end):
        if quoted[match.start()]:
            continue
        opening = match.end() - 1
        argument = text[opening + 1 : _balanced_end(text, opening) - 1].strip()
        if not argument:
            continue
        try:
            value = js_literal(argument)
        except NotLiteral:
            continue
        yield Expected(match.group(1), value)


def _quoted(text: str) -> bytearray:
    """1 for each index of ``text`` inside a string, template, comment or regex literal."""
    mask = bytearray(len(text))
    i = 0
    while i < len(text):
        end, skipped = _skip(text, i)
        if skipped:
            mask[i:end] = b"\x01" * (min(end, len(text)) - i)
            i = end
        else:
            i += 1
    return mask


def _skip(text: str, i: int) -> tuple[int, bool]:
    """Past the string, template, comment or regex literal at ``i``: (its end, True), else
    (``i``, False)."""
    char = text[i]
    if char in "\"'`":
        j = i + 1
        while j < len(text) and text[j] != char:
            j += 2 if text[j] == "\\" else 1
        return j + 1, True
    if text.startswith("//", i):
        end = text.find("\n", i)
        return (len(text) if end < 0 else end), True
    if text.startswith("/*", i):
        end = text.find("*/", i + 2)
        return (len(text) if end < 0 else end + 2), True
    # A slash after one of these (or at the start: "" is in every string) opens a regex.
    if char == "/" and text[:i].rstrip()[-1:] in _REGEX_BEFORE:
        j = i + 1
        in_class = False
        while j < len(text) and (text[j] != "/" or in_class) and text[j] != "\n":
            if text[j] == "\\":
                j += 1
            elif text[j] == "[":
                in_class = True
            elif text[j] == "]":
                in_class = False
            j += 1
        return j + 1, True
    return i, False


def _balanced_end(text: str, opening: int) -> int:
    """The index just past the bracket that closes the one at ``opening``."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack = [pairs[text[opening]]]
    i = opening + 1
    while i < len(text) and stack:
        i, skipped = _skip(text, i)
        if skipped:
            continue
        char = text[i]
        if char in pairs:
            stack.append(pairs[char])
        elif char in ")]}":
            stack.pop()
        i += 1
    return i


# -- JavaScript literals -----------------------------------------------------------------


@attrs.frozen
class _Str:
    text: str


@attrs.frozen
class _Punct:
    char: str


@attrs.frozen
class _Name:
    name: str


_NUMBER = re.compile(r"-?(?:\d[\d_]*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_IDENT = re.compile(r"[A-Za-z_$][\w$]*")
_KEYWORDS = {"true": True, "false": False, "null": None, "undefined": None}


def js_literal(text: str) -> Any:
    """``text`` as a Python value: strings, numbers, ``true``/``false``/``null``, arrays,
    objects and regular expressions (:class:`Regex`); :class:`NotLiteral` otherwise."""
    tokens = list(_tokens(text))
    value, rest = _value(tokens)
    if rest:
        raise NotLiteral(text)
    return value


def _tokens(text: str) -> Iterator[object]:
    i = 0
    while i < len(text):
        char = text[i]
        if char.isspace():
            i += 1
        elif char in "\"'":
            end, _ = _skip(text, i)
            yield _Str(_unescape(text[i + 1 : end - 1]))
            i = end
        elif char == "`":
            end, _ = _skip(text, i)
            inner = text[i + 1 : end - 1]
            if "${" in inner:
                raise NotLiteral(text)
            yield _Str(_unescape(inner))
            i = end
        elif char == "/" and not text.startswith("//", i) and not text.startswith("/*", i):
            end, _ = _skip(text, i)
            source = text[i + 1 : text.rindex("/", i + 1, end)]
            yield Regex(source.replace("\\/", "/"))
            i = end
            while i < len(text) and text[i].isalpha():
                i += 1  # flags
        elif char in "[]{},:":
            yield _Punct(char)
            i += 1
        elif number := _NUMBER.match(text, i):
            yield float(number.group().replace("_", "")) if "." in number.group() else int(
                number.group().replace("_", "")
            )
            i = number.end()
        elif ident := _IDENT.match(text, i):
            yield _Name(ident.group())
            i = ident.end()
        else:
            raise NotLiteral(text)


def _unescape(body: str) -> str:
    quoted = re.sub(r'(?<!\\)"', '\\\\"', body.replace("\\'", "'"))
    try:
        return str(json.loads(f'"{quoted}"', strict=False))
    except ValueError:
        raise NotLiteral(body) from None


def _value(tokens: list[object]) -> tuple[Any, list[object]]:
    if not tokens:
        raise NotLiteral("")
    head, rest = tokens[0], tokens[1:]
    if isinstance(head, _Str):
        return head.text, rest
    if isinstance(head, (int, float, Regex)):
        return head, rest
    if isinstance(head, _Name):
        if head.name in _KEYWORDS:
            return _KEYWORDS[head.name], rest
        raise NotLiteral(head.name)
    if head == _Punct("["):
        items: list[Any] = []
        while rest and rest[0] != _Punct("]"):
            item, rest = _value(rest)
            items.append(item)
            rest = rest[1:] if rest and rest[0] == _Punct(",") else rest
        return items, rest[1:]
    if head == _Punct("{"):
        fields: dict[str, Any] = {}
        while rest and rest[0] != _Punct("}"):
            key = rest[0]
            if not isinstance(key, (_Str, _Name)) or len(rest) < 2 or rest[1] != _Punct(":"):
                raise NotLiteral("an object with computed or shorthand keys")
            fields[key.text if isinstance(key, _Str) else key.name], rest = _value(rest[2:])
            rest = rest[1:] if rest and rest[0] == _Punct(",") else rest
        return fields, rest[1:]
    raise NotLiteral(str(head))


# -- the ports ---------------------------------------------------------------------------


Function = ast.FunctionDef | ast.AsyncFunctionDef


@attrs.frozen
class Port:
    """A test function that ports a seed case, and its module's other functions."""

    path: str
    function: Function
    helpers: Mapping[str, Function]

    def with_helpers(self) -> Iterator[Function]:
        """The function and the module functions it calls, transitively."""
        seen: set[str] = set()
        pending: list[Function] = [self.function]
        while pending:
            function = pending.pop()
            yield function
            for node in ast.walk(function):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                    name = node.func.id
                    if name in self.helpers and name not in seen:
                        seen.add(name)
                        pending.append(self.helpers[name])


def ported_functions(sources: Mapping[str, str]) -> dict[str, list[Port]]:
    """For each seed case named by a ``# seed:`` marker: its ports.

    A marker inside a function names it; one outside every function, the next one."""
    ported: dict[str, list[Port]] = {}
    for path, source in sources.items():
        tree = ast.parse(source)
        helpers = {
            node.name: node
            for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        functions = [
            node
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name.startswith("test")
        ]
        for number, line in enumerate(source.splitlines(), start=1):
            marker = _MARKER.search(line)
            if marker is None:
                continue
            function = _function_at(functions, number)
            if function is not None:
                ported.setdefault(marker.group(1), []).append(Port(path, function, helpers))
    return ported


def _function_at(functions: list[Function], line: int) -> Function | None:
    for function in functions:
        if function.lineno <= line <= (function.end_lineno or function.lineno):
            return function
    after = [f for f in functions if _first_line(f) > line]
    return min(after, key=_first_line) if after else None


def _first_line(function: Function) -> int:
    return min([function.lineno, *(d.lineno for d in function.decorator_list)])


def findings(cases: Mapping[str, list[Expected]], sources: Mapping[str, str]) -> list[str]:
    """Where the ports in ``sources`` (path -> text) differ from the seed's ``cases``."""
    problems: list[str] = []
    for name, ports in sorted(ported_functions(sources).items()):
        seed_name = _seed_name(name, cases)
        if seed_name is None:
            where = ", ".join(f"{port.path}:{port.function.name}" for port in ports)
            problems.append(f"{where}: no seed case is called {name!r}")
            continue
        constants = _Constants()
        for port in ports:
            for function in port.with_helpers():
                constants.add(function)
            where = f"{port.path}:{port.function.name}"
            problems.extend(f"{where}: {m}" for m in _mutations(port.function))
        for expected in cases[seed_name]:
            problems.extend(f"{name!r}: {p}" for p in constants.differences(expected))
    return problems


def _seed_name(name: str, cases: Mapping[str, list[Expected]]) -> str | None:
    if name in cases:
        return name
    if name.endswith("..."):  # a long name cut short: the one case it begins
        begun = [seed_name for seed_name in cases if seed_name.startswith(name[:-3].rstrip())]
        return begun[0] if len(begun) == 1 else None
    # A port may name a case with its parameter filled in ("... when the router answers 502").
    for seed_name in cases:
        if "%s" in seed_name:
            pattern = ".*".join(re.escape(part) for part in seed_name.split("%s"))
            if re.fullmatch(pattern, name):
                return seed_name
    return None


class _Constants:
    """The literal values of the functions that port one seed case."""

    def __init__(self) -> None:
        self.strings: list[str] = []
        self.numbers: set[float] = set()
        self.others: list[object] = []  # True, False, None
        self.dicts: list[dict[Any, Any]] = []
        self.names: set[str] = set()

    def add(self, function: ast.AST) -> None:
        for node in ast.walk(function):
            if isinstance(node, ast.Name):
                self.names.add(node.id)
            elif isinstance(node, ast.Constant):
                if isinstance(node.value, str):
                    self.strings.append(node.value)
                elif isinstance(node.value, bool) or node.value is None:
                    self.others.append(node.value)
                elif isinstance(node.value, (int, float)):
                    self.numbers.add(node.value)
            elif isinstance(node, ast.Dict):
                try:
                    value = ast.literal_eval(node)
                except ValueError:
                    continue
                self.dicts.append(value)

    def differences(self, expected: Expected) -> Iterator[str]:
        value = expected.value
        if expected.matcher in ("toEqual", "toStrictEqual") and isinstance(value, dict):
            for candidate in self.dicts:
                if set(candidate) == set(value) and _plain(candidate) != _plain(value):
                    yield f"{expected.matcher}({value!r}) is asserted as {candidate!r}"
        if expected.matcher == "toBe" and isinstance(value, bool):
            return  # expect(<a predicate>).toBe(true): a port asserts the predicate itself
        for leaf in _leaves(value):
            if not self._has(leaf):
                yield f"{expected.matcher}: the seed's {leaf!r} is not asserted"

    def _has(self, leaf: object) -> bool:
        if isinstance(leaf, str) and leaf in _PYTHON_NAMES:
            return _PYTHON_NAMES[leaf] in self.names
        if isinstance(leaf, Regex):
            core = leaf.source.removeprefix("^").removesuffix("$")
            return any(core in s or _unescaped(core) in s for s in self.strings)
        if isinstance(leaf, str):
            return any(leaf in s for s in self.strings)
        if isinstance(leaf, bool) or leaf is None:
            return any(leaf is other for other in self.others)
        return leaf in self.numbers


def _leaves(value: object) -> Iterator[object]:
    """The scalars of a value; an object's keys are names, which a port may spell its way."""
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item)
    elif value != "":
        yield value


def _plain(value: object) -> object:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _unescaped(source: str) -> str:
    """A regular expression's source with its escapes of plain characters removed."""
    return re.sub(r"\\([^A-Za-z0-9])", r"\1", source)


def _mutations(function: ast.AST) -> Iterator[str]:
    for node in ast.walk(function):
        if isinstance(node, ast.Delete):
            yield f"line {node.lineno}: `del` changes what the seed's case compares"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _MUTATORS
        ):
            yield (
                f"line {node.lineno}: .{node.func.attr}() changes what the seed's case compares"
            )
