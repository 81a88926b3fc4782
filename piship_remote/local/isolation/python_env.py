"""A host Python environment lent, read-only, to every sandbox: its ``python3`` is the sandbox's.

A user whose virtual environment holds a project's test dependencies runs that suite
in local sandboxes with no image, no docker and no network: the environment (and the
installation its interpreter comes from, when that is not under ``/usr``) is bound
read-only at the same host paths, so its scripts' ``#!`` lines and its ``pyvenv.cfg``
still hold, and its ``bin`` comes first on the sandbox's ``PATH``::

    env = PythonEnv.find(".venv")           # ValueError saying why it cannot be used
    env.mounts()    # ['/src/project/.venv', '/root/.pyenv/versions/3.11.7']
    env.search_path("/usr/bin:/bin")        # '/src/project/.venv/bin:/usr/bin:/bin'

A folder that is not a virtual environment but has ``bin/python3`` (an installation
prefix, a conda environment) is lent as it is. A package installed in it in editable
mode (``pip install -e``) lives in a folder of its own on this host, named by a ``.pth``
file or setuptools' editable finder: that folder is lent read-only too.

A service run as host root runs bubblewrap as a host uid of no one (see
:mod:`~piship_remote.local.isolation.user_map`), which cannot bind a folder below one it
may not search (a Python under ``/root``). :meth:`PythonEnv.staged` binds such a folder
read-only into the service's own directory first (``<service>/lent/N``), and the sandbox
binds it from there, still at its own path; the service's removal detaches those binds
before it removes anything.
"""

from __future__ import annotations

import ast
import glob
import os
import re
from collections.abc import Mapping

import attrs

from piship_remote.local.isolation.limits import bind_readonly
from piship_remote.local.isolation.user_map import unsearchable

__all__ = ["LENT_FOLDER", "PythonEnv"]

LENT_FOLDER = "lent"  # in the service's directory: the staged binds of a lent Python

_CONFIG = "pyvenv.cfg"
_MAPPING = re.compile(r"MAPPING\s*(?::[^=]*)?=\s*(\{.*\})\s*\Z")
_SYSTEM = ("/usr", "/bin", "/lib", "/lib64", "/sbin")
# Where a sandbox has places of its own: a lent folder there would hide or mix with them.
_RESERVED = ("/proc", "/dev", "/sys", "/etc", "/run")


@attrs.frozen
class PythonEnv:
    """A host Python environment: ``root`` (its folder) and ``base`` (the installation its
    interpreter comes from, when it must be lent too; ``None`` under ``/usr``)."""

    root: str
    base: str | None
    virtual: bool
    editable: tuple[str, ...] = ()
    """The folders of packages installed in editable mode, lent at their own paths."""
    bound_from: Mapping[str, str] = attrs.field(factory=dict)
    """Where a folder is bound from when not from its own path (see :meth:`staged`)."""

    @classmethod
    def find(cls, path: str | os.PathLike[str], *, workdir: str = "/home/user") -> PythonEnv:
        """The environment at ``path``; ``ValueError`` saying why it cannot be lent."""
        root = os.path.realpath(os.fspath(path))
        python = os.path.join(root, "bin", "python3")
        if not os.path.isdir(root):
            raise ValueError(f"the Python environment {os.fspath(path)} is not found")
        if not (os.path.isfile(python) and os.access(python, os.X_OK)):
            raise ValueError(
                f"{os.fspath(path)} has no bin/python3: name a virtual environment"
                " (python3 -m venv) or a Python installation"
            )
        for place in (workdir, *_RESERVED):
            if _within(root, place) or _within(place, root):
                raise ValueError(
                    f"the Python environment {root} overlaps the sandbox's own {place};"
                    " make it elsewhere"
                )
        virtual = os.path.isfile(os.path.join(root, _CONFIG))
        home = _config_home(os.path.join(root, _CONFIG)) if virtual else None
        base = os.path.dirname(os.path.realpath(home)) if home else _prefix_of(python)
        lent = base != root and not any(_within(base, d) for d in _SYSTEM)
        places = (root, workdir, *_RESERVED, *_SYSTEM)
        editable = tuple(
            folder
            for folder in _editable_folders(root)
            if not any(_within(folder, place) or _within(place, folder) for place in places)
        )
        return cls(root, base if lent else None, virtual, editable)

    def mounts(self) -> list[str]:
        """The host folders to bind read-only, each at its own path."""
        folders = [] if any(_within(self.root, d) for d in _SYSTEM) else [self.root]
        return folders + ([self.base] if self.base is not None else []) + list(self.editable)

    def sources(self) -> dict[str, str]:
        """``{host folder to bind from: its path in the sandbox}``."""
        return {self.bound_from.get(folder, folder): folder for folder in self.mounts()}

    def staged(self, directory: str) -> PythonEnv:
        """This environment with each folder that others (a sandbox's host uid) cannot
        reach bound read-only below ``directory``/``lent`` (``OSError`` if it cannot be)."""
        mounts = self.mounts()
        unreachable = [f for f in mounts if unsearchable(os.path.dirname(f)) is not None]
        if not unreachable:
            return self
        lent = os.path.join(directory, LENT_FOLDER)
        os.makedirs(lent, mode=0o711, exist_ok=True)
        bound_from: dict[str, str] = {}
        for number, folder in enumerate(unreachable):
            target = os.path.join(lent, str(number))
            os.mkdir(target, 0o755)
            bind_readonly(folder, target)
            bound_from[folder] = target
        return attrs.evolve(self, bound_from=bound_from)

    def search_path(self, path: str) -> str:
        """``PATH`` with the environment's ``bin`` first."""
        return f"{self.root}/bin:{path}"

    def variables(self, path: str) -> dict[str, str]:
        """What a command's environment gets: that ``PATH`` and, for a virtual environment,
        ``VIRTUAL_ENV`` (as ``activate`` sets it)."""
        extra = {"PATH": self.search_path(path)}
        if self.virtual:
            extra["VIRTUAL_ENV"] = self.root
        return extra


def _editable_folders(root: str) -> list[str]:
    """The host folders the environment's editable installs import from: absolute folder
    lines of its ``.pth`` files and the ``MAPPING`` of setuptools' editable finders."""
    found: list[str] = []
    for site in glob.glob(os.path.join(glob.escape(root), "lib", "python3*", "site-packages")):
        for pth in sorted(glob.glob(os.path.join(glob.escape(site), "*.pth"))):
            found += [line for line in _lines(pth) if line.startswith("/")]
        for finder in sorted(glob.glob(os.path.join(glob.escape(site), "__editable__*finder.py"))):
            found += _finder_mapping(finder)
    folders = [os.path.realpath(path) for path in found]
    return sorted({folder for folder in folders if os.path.isdir(folder)})


def _lines(path: str) -> list[str]:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return [line.strip() for line in handle]


def _finder_mapping(finder: str) -> list[str]:
    """The folders an editable finder's ``MAPPING = {name: folder}`` names (a literal)."""
    for line in _lines(finder):
        match = _MAPPING.match(line)
        if match is None:
            continue
        try:
            mapping = ast.literal_eval(match.group(1))
        except (ValueError, SyntaxError):
            return []
        if isinstance(mapping, dict):
            return [value for value in mapping.values() if isinstance(value, str)]
    return []


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _config_home(config: str) -> str | None:
    """``home`` of a ``pyvenv.cfg``: the folder of the interpreter the environment was made
    from."""
    with open(config, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            key, equals, value = line.partition("=")
            if equals and key.strip() == "home":
                return value.strip() or None
    return None


def _prefix_of(python: str) -> str:
    """The installation folder of ``python`` (``<prefix>/bin/python3``)."""
    return os.path.dirname(os.path.dirname(os.path.realpath(python)))
