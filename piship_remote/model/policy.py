"""The sandbox policy (a manifest's ``sandbox:`` section) and its resolved profile.

A :class:`SandboxPolicy` says what the sandbox must guarantee; it is built
directly or from the manifest shape::

    policy = SandboxPolicy.from_dict({
        "required": True,
        "filesystem": {"read": {"deny": ["~/.ssh"]}, "write": {"allow": ["workspace"]}},
        "network": {"mode": "deny"},
        "environment": {"allow": ["LANG"]},
    })

:func:`resolve_profile` turns it into a :class:`SandboxProfile` (what a backend's
``prepare`` receives) with the path tokens ``workspace``, ``tmp`` and ``~``
expanded to real, symlink-resolved paths::

    profile = resolve_profile(policy, workspace="/srv/project", home_dir="/home/alice")
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import attrs
import cattrs
from cattrs.errors import (
    AttributeValidationNote,
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
)
from cattrs.gen import make_dict_structure_fn

from piship_remote.model.errors import ConfigInvalid, PiShipError

__all__ = [
    "DEFAULT_ENVIRONMENT_ALLOW",
    "DEFAULT_READ_DENY",
    "DEFAULT_WRITE_ALLOW",
    "NetworkMode",
    "SandboxPolicy",
    "SandboxProfile",
    "realpath_nearest",
    "resolve_profile",
]

NetworkMode = Literal["deny", "allow"]

DEFAULT_READ_DENY: tuple[str, ...] = (
    "~/.ssh",
    "~/.aws",
    "~/.gnupg",
    "~/.config/gcloud",
    "~/.azure",
    "~/.kube",
    "~/.docker",
    "~/.netrc",
    "~/.npmrc",
    "~/.pi",
)
DEFAULT_WRITE_ALLOW: tuple[str, ...] = ("workspace", "tmp")
DEFAULT_ENVIRONMENT_ALLOW: tuple[str, ...] = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TERM",
    "TZ",
    "SHELL",
    "TMPDIR",
)

_PATH_TOKENS = ("workspace", "tmp", "~")


def _kind(value: object) -> str:
    """The JSON name of a value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return f"a {type(value).__name__}"


def _shown(value: object) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        return _kind(value)
    return text if len(text) <= 60 else _kind(value)


def _invalid(message: str) -> PiShipError:
    return ConfigInvalid(message, component="sandbox")


def _token_rest(value: str, token: str) -> str | None:
    """``""`` for the bare token, the remainder for ``token/...``, else ``None``."""
    if value == token:
        return ""
    if value.startswith(token + "/"):
        return value[len(token) + 1 :]
    return None


def _check_path_rule(value: str) -> None:
    if "\0" in value:
        raise _invalid(f"Sandbox path {json.dumps(value)} must not contain a NUL character")
    if os.path.isabs(value) or any(_token_rest(value, t) is not None for t in _PATH_TOKENS):
        return
    raise _invalid(f'Sandbox path "{value}" must be absolute or start with workspace, tmp, or ~')


def _path_rules(value: Iterable[str]) -> tuple[str, ...]:
    rules = _strings(value)
    for rule in rules:
        _check_path_rule(rule)
    return rules


def _strings(value: Iterable[str]) -> tuple[str, ...]:
    problem = _invalid("sandbox policy lists must be sequences of strings")
    if isinstance(value, (str, bytes)):
        raise problem
    try:
        items = tuple(value)
    except TypeError:
        raise problem from None
    if not all(isinstance(item, str) for item in items):
        raise problem
    return items


def _network_mode(value: str) -> NetworkMode:
    if value == "deny":
        return "deny"
    if value == "allow":
        return "allow"
    raise _invalid(
        f'sandbox policy field "network.mode" must be "deny" or "allow", not {_shown(value)}'
    )


@attrs.frozen
class SandboxPolicy:
    """What a sandbox must guarantee. Omitted fields take the manifest defaults.

    >>> SandboxPolicy(required=True).network
    'deny'
    >>> SandboxPolicy(write_allow=["workspace"]).write_allow
    ('workspace',)

    Path rules are ``workspace``, ``tmp``, ``~`` (optionally followed by ``/...``)
    or absolute; anything else raises :class:`~piship_remote.model.errors.ConfigInvalid`.
    """

    required: bool = False
    read_deny: tuple[str, ...] = attrs.field(default=DEFAULT_READ_DENY, converter=_path_rules)
    write_allow: tuple[str, ...] = attrs.field(default=DEFAULT_WRITE_ALLOW, converter=_path_rules)
    # Secret-looking files (``.env``, private keys, …) at or below these paths are pushed;
    # every other one stays at home.
    read_allow: tuple[str, ...] = attrs.field(default=(), converter=_path_rules)
    # Fail closed: a policy that does not name a network mode denies the network.
    network: NetworkMode = attrs.field(default="deny", converter=_network_mode)
    environment_allow: tuple[str, ...] = attrs.field(
        default=DEFAULT_ENVIRONMENT_ALLOW, converter=_strings
    )

    @classmethod
    def from_dict(cls, mapping: Any) -> SandboxPolicy:
        """Structure the manifest shape; bad input raises ``ConfigInvalid`` naming the field.

        >>> SandboxPolicy.from_dict({"required": True, "network": {"mode": "allow"}}).network
        'allow'

        Raises:
            ConfigInvalid: a field is missing its shape or value; the message names it.
        """
        if not isinstance(mapping, Mapping):
            raise _invalid(f"sandbox policy must be a mapping, not {_kind(mapping)}")
        try:
            manifest = _CONVERTER.structure(mapping, _Manifest)
        except PiShipError:
            raise
        except Exception as exc:  # cattrs wraps every problem; report the first one
            raise _invalid(_describe(exc)) from None
        return cls(
            required=manifest.required,
            read_deny=manifest.filesystem.read.deny,
            read_allow=manifest.filesystem.read.allow,
            write_allow=manifest.filesystem.write.allow,
            network=manifest.network.mode or "deny",
            environment_allow=manifest.environment.allow,
        )


# The manifest shape, only used to structure ``from_dict`` input.
@attrs.frozen
class _ReadRules:
    deny: tuple[str, ...] = DEFAULT_READ_DENY
    allow: tuple[str, ...] = ()


@attrs.frozen
class _WriteRules:
    allow: tuple[str, ...] = DEFAULT_WRITE_ALLOW


@attrs.frozen
class _Filesystem:
    read: _ReadRules = attrs.Factory(_ReadRules)
    write: _WriteRules = attrs.Factory(_WriteRules)


@attrs.frozen
class _Network:
    mode: NetworkMode | None = None


@attrs.frozen
class _Environment:
    allow: tuple[str, ...] = DEFAULT_ENVIRONMENT_ALLOW


@attrs.frozen
class _Manifest:
    required: bool = False
    filesystem: _Filesystem = attrs.Factory(_Filesystem)
    network: _Network = attrs.Factory(_Network)
    environment: _Environment = attrs.Factory(_Environment)


class _FieldError(ValueError):
    """A bad value; ``message`` completes ``sandbox policy field "<path>" ...``."""

    def __init__(self, message: str, subpath: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.subpath = subpath


def _structure_bool(value: object, _: object) -> bool:
    if isinstance(value, bool):
        return value
    raise _FieldError(f"must be true or false, not {_kind(value)}")


def _structure_strings(value: object, _: object) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        raise _FieldError(f"must be a list of strings, not {_kind(value)}")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise _FieldError(f"must be a string, not {_kind(item)}", f"[{index}]")
    return tuple(value)


def _structure_mode(value: object, _: object) -> NetworkMode:
    if value == "deny" or value == "allow":
        return "deny" if value == "deny" else "allow"
    raise _FieldError(f'must be "deny" or "allow", not {_shown(value)}')


def _mapping_first(converter: cattrs.Converter) -> Callable[[type[Any]], Any]:
    """A hook factory for the manifest classes that refuses non-mappings first."""

    def factory(cls: type[Any]) -> Callable[[object, object], Any]:
        structure = make_dict_structure_fn(cls, converter)

        def hook(value: object, type_: object) -> Any:
            if not isinstance(value, Mapping):
                raise _FieldError(f"must be a mapping, not {_kind(value)}")
            return structure(value, cls)

        return hook

    return factory


def _make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    converter.register_structure_hook(bool, _structure_bool)
    converter.register_structure_hook_func(lambda t: t == tuple[str, ...], _structure_strings)
    converter.register_structure_hook_func(lambda t: t == (NetworkMode | None), _structure_mode)
    converter.register_structure_hook_factory(attrs.has, _mapping_first(converter))
    return converter


_CONVERTER = _make_converter()


def _first_problem(exc: BaseException, path: str) -> tuple[str, BaseException]:
    """Walk cattrs' exception groups to the first leaf error and its dotted path."""
    if isinstance(exc, (ClassValidationError, IterableValidationError)):
        with_notes, without_notes = exc.group_exceptions()
        for inner, note in with_notes:
            step = note.name if isinstance(note, AttributeValidationNote) else f"[{note.index}]"
            joined = f"{path}.{step}" if path and not step.startswith("[") else path + step
            return _first_problem(inner, joined)
        for inner in without_notes:
            return _first_problem(inner, path)
    return path, exc


def _describe(exc: BaseException) -> str:
    path, leaf = _first_problem(exc, "")
    if isinstance(leaf, ForbiddenExtraKeysError):
        extra = sorted(map(str, leaf.extra_fields))[0]
        field = f"{path}.{extra}" if path else extra
        return f'sandbox policy field "{field}" is not recognized'
    if isinstance(leaf, _FieldError):
        return f'sandbox policy field "{path}{leaf.subpath}" {leaf.message}'
    return f'sandbox policy field "{path}" is malformed'


def _as_tuple(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _fspath(value: str | os.PathLike[str]) -> str:
    return os.fspath(value)


@attrs.frozen
class SandboxProfile:
    """A policy resolved for one activation; what ``backend.prepare`` receives.

    Paths are absolute and symlink-resolved. Constructible directly::

        SandboxProfile(workspace="/srv/project", network="allow", environment_allow=("LANG",))
    """

    workspace: str = attrs.field(converter=_fspath)
    home_dir: str | None = None
    network: str = "deny"
    environment_allow: tuple[str, ...] = attrs.field(default=(), converter=_as_tuple)
    read_deny: tuple[str, ...] = attrs.field(default=(), converter=_as_tuple)
    write_allow: tuple[str, ...] = attrs.field(default=(), converter=_as_tuple)
    read_allow: tuple[str, ...] = attrs.field(default=(), converter=_as_tuple)
    warnings: tuple[str, ...] = attrs.field(default=(), converter=_as_tuple)


def realpath_nearest(path: str | os.PathLike[str]) -> str:
    """The absolute path with symlinks resolved through its nearest existing ancestor.

    The missing tail is kept as written, so a rule for a path that does not
    exist yet still cannot be redirected by a symlink above it.
    """
    text = os.fspath(path)
    if "\0" in text:
        raise _invalid(f"Path {json.dumps(text)} must not contain a NUL character")
    # Normalize first (like Node's path.resolve), so `a/link/..` means `a`.
    return os.path.realpath(os.path.abspath(text))


def _is_within(path: str, root: str) -> bool:
    return path == root or path.startswith(root if root.endswith(os.sep) else root + os.sep)


def _expand(rule: str, bases: Mapping[str, str | None]) -> str:
    for token, base in bases.items():
        rest = _token_rest(rule, token)
        if rest is None:
            continue
        if base is None:
            raise _invalid(f'Sandbox path "{rule}" needs a home directory; pass home_dir')
        return os.path.join(base, rest) if rest else base
    _check_path_rule(rule)
    return rule


def _resolve_all(rules: Iterable[str], bases: Mapping[str, str | None]) -> tuple[str, ...]:
    resolved = (realpath_nearest(_expand(rule, bases)) for rule in rules)
    return tuple(dict.fromkeys(resolved))


def _conflicts(deny: Iterable[str], writable: Iterable[str]) -> tuple[str, ...]:
    warnings = (
        f"{path} is inside the read-denied path {denied}; deny wins and it is hidden in the sandbox"
        for denied in deny
        for path in writable
        if _is_within(path, denied)
    )
    return tuple(dict.fromkeys(warnings))


def _os_home() -> str | None:
    home = os.path.expanduser("~")
    return None if home == "~" else home


def resolve_profile(
    policy: SandboxPolicy,
    *,
    workspace: str | os.PathLike[str],
    home_dir: str | os.PathLike[str] | None = None,
    tmp_dir: str | os.PathLike[str] | None = None,
) -> SandboxProfile:
    """Resolve ``policy`` against this host's paths.

    ``workspace`` (need not exist) and ``home_dir`` (default: the OS home; the
    ``~`` token) and ``tmp_dir`` (default: the system temp dir; the ``tmp``
    token) are realpath'd through their nearest existing ancestor. Path rules
    are expanded, realpath'd and de-duplicated in first-seen order; a write or
    workspace path inside a read-denied one yields a warning (deny wins).
    """
    root = realpath_nearest(workspace)
    home_source = os.fspath(home_dir) if home_dir is not None else _os_home()
    home = realpath_nearest(home_source) if home_source is not None else None
    tmp = realpath_nearest(tmp_dir if tmp_dir is not None else tempfile.gettempdir())
    bases: dict[str, str | None] = {"workspace": root, "tmp": tmp, "~": home}
    read_deny = _resolve_all(policy.read_deny, bases)
    write_allow = _resolve_all(policy.write_allow, bases)
    return SandboxProfile(
        workspace=root,
        home_dir=home,
        network=policy.network,
        environment_allow=tuple(dict.fromkeys(policy.environment_allow)),
        read_deny=read_deny,
        write_allow=write_allow,
        read_allow=_resolve_all(policy.read_allow, bases),
        warnings=_conflicts(read_deny, (root, *write_allow)),
    )
