"""The client's layers, pinned: imports go one way, downwards, and no module imports itself back.

The layers, top to bottom (``docs/architecture.md`` draws them); a module may import its
own layer and the layers below it. The service side (local/, testing/, _http_server/) is
pinned by ``test_service_layers.py``; ``wire/`` and ``_sandboxd/`` are shared by both and
import nothing of the client. Imports are read from each file's syntax tree, at any
depth (a lazy import inside a function, one under ``TYPE_CHECKING``), so none can hide a
circle.
"""

from __future__ import annotations

from collections.abc import Iterator

from tests.test_service_layers import PACKAGE, _imported, _module_name, _within

LAYERS = (
    ("piship_remote", "piship_remote.__main__", "piship_remote.errors"),
    ("piship_remote.cli",),
    ("piship_remote.pool",),
    ("piship_remote.sandbox",),
    ("piship_remote.workspace",),
    ("piship_remote.backends.e2b", "piship_remote.backends.kubernetes"),
    ("piship_remote.backends",),
    ("piship_remote.telemetry",),
    ("piship_remote.transport",),
    ("piship_remote.wire", "piship_remote._sandboxd"),
    ("piship_remote.model",),
)
SERVICE_SIDE = ("piship_remote.local", "piship_remote.testing", "piship_remote._http_server")


def _layer(module: str) -> int | None:
    """The index of ``module``'s layer (the longest prefix that names it); ``None`` for
    the service side and for modules outside the package."""
    if any(_within(module, side) for side in SERVICE_SIDE):
        return None
    best: tuple[int, int] | None = None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            exact_root = prefix == "piship_remote" and module != prefix
            longer = best is None or len(prefix) > best[0]
            if _within(module, prefix) and not exact_root and longer:
                best = (len(prefix), index)
    return None if best is None else best[1]


def _client_modules() -> dict[str, set[str]]:
    """Every client module and the client modules it imports (``from X import y``: X.y
    when y is a module, else X)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        if _layer(module) is None:
            continue
        names = set(_imported(path))
        needed = {n for n in names if not any(o.startswith(n + ".") for o in names)}
        graph[module] = {n for n in needed if _layer(n) is not None and n != module}
    return graph


def test_every_client_module_has_a_layer() -> None:
    unplaced = [
        _module_name(p)
        for p in PACKAGE.rglob("*.py")
        if _layer(_module_name(p)) is None
        and not any(_within(_module_name(p), side) for side in SERVICE_SIDE)
    ]

    assert unplaced == []


def test_no_client_module_imports_a_layer_above_its_own() -> None:
    upward = [
        f"{module} -> {name}"
        for module, names in _client_modules().items()
        for name in sorted(names)
        if _layer(name) < _layer(module)  # type: ignore[operator]
    ]

    assert upward == []


def _circles(graph: dict[str, set[str]]) -> Iterator[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(node: str) -> Iterator[list[str]]:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in graph:
                continue
            if other not in index:
                yield from visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                yield sorted(component)

    for node in sorted(graph):
        if node not in index:
            yield from visit(node)


def test_no_import_circle_in_the_client() -> None:
    assert list(_circles(_client_modules())) == []


def test_the_circle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}

    assert list(_circles(graph)) == [["a", "b", "c"]]
