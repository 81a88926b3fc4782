"""Who may import whom among the service-side folders: local/, testing/, wire/, _http_server/.

Each file's imports are read from its syntax tree (every ``import`` and ``from``, at any
depth, relative ones resolved), so a lazy import inside a function counts too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import piship_remote

PACKAGE = Path(piship_remote.__file__).parent
LOCAL_MAY_IMPORT = (
    "piship_remote.local",
    "piship_remote.wire",
    "piship_remote._http_server",
    "piship_remote.model",
)
"""The service's own folders, the shared wire shapes and HTTP base, and the value model."""
PUBLIC_NAMES = "piship_remote"
"""``from piship_remote import E2bCompatibleBackend``: what ``LocalE2bService.backend()`` gives."""
WIRE_MAY_IMPORT = (
    *("__future__", "base64", "binascii", "collections.abc", "hashlib", "json", "posixpath"),
    *("struct", "typing", "urllib.parse", "attrs", "cattrs", "piship_remote.wire"),
)
"""Encoding, hashing and shapes: nothing that opens a socket, a file or a thread."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file()


def _imported(path: Path) -> Iterator[str]:
    """Every module ``path`` imports (for ``from X import y``: X, and X.y if y is a module)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{a.name}" for a in node.names if _is_module(f"{base}.{a.name}"))


def _imports_of(folder: str) -> list[tuple[str, str]]:
    return [
        (str(path.relative_to(PACKAGE)), name)
        for path in sorted((PACKAGE / folder).rglob("*.py"))
        for name in _imported(path)
    ]


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_no_module_of_the_doubles_imports_the_local_service() -> None:
    arrows = [(f, n) for f, n in _imports_of("testing") if _within(n, "piship_remote.local")]

    assert arrows == []


def test_the_local_service_imports_no_client_internals() -> None:
    outside = [
        (f, n)
        for f, n in _imports_of("local")
        if _within(n, "piship_remote")
        and n != PUBLIC_NAMES
        and not any(_within(n, allowed) for allowed in LOCAL_MAY_IMPORT)
    ]

    assert outside == []


def test_the_http_server_imports_nothing_else_of_the_package() -> None:
    outside = [
        (f, n)
        for f, n in _imports_of("_http_server")
        if _within(n, "piship_remote") and not _within(n, "piship_remote._http_server")
    ]

    assert outside == []


def test_the_wire_shapes_do_no_io() -> None:
    doing_io = [
        (f, n)
        for f, n in _imports_of("wire")
        if not any(_within(n, allowed) for allowed in WIRE_MAY_IMPORT)
    ]

    assert doing_io == []


@pytest.mark.parametrize(
    ("folder", "may_import"),
    [
        ("local/isolation", ("isolation",)),
        ("local/sandbox", ("sandbox", "isolation")),
        ("local/envd", ("envd", "sandbox", "isolation")),
    ],
)
def test_the_local_service_layers_import_only_downwards(
    folder: str, may_import: tuple[str, ...]
) -> None:
    upwards = [
        (f, n)
        for f, n in _imports_of(folder)
        if _within(n, "piship_remote.local")
        and not any(_within(n, f"piship_remote.local.{lower}") for lower in may_import)
    ]

    assert upwards == []
