"""What a sandbox backend declares, and the containment report an activation produces.

A backend declares its :class:`Capabilities`; the activation compares them with
the policy (``piship_remote.model._capability_rules``) and, when they suffice, reports only
what the backend enforces in a :class:`ContainmentReport`. Every report has a
one-line human description::

    >>> report = ContainmentReport(
    ...     level="enforced", adapter="kubernetes-agent-sandbox",
    ...     provider="kubernetes-agent-sandbox", required=True,
    ...     planes=("environment-filter", "host-filesystem-isolation"), network="allow",
    ...     verification="backend-attested", isolation="remote",
    ...     workspace=snapshot_workspace_report(),
    ... )
    >>> describe_containment(report)[:68]
    'enforced by kubernetes-agent-sandbox (required, attested by the back'

``to_dict()`` on each class gives the camelCase JSON shape of the report
(``networkDenial``, ``localProcesses``, ...), keys holding ``None`` left out.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, get_origin

import attrs
import cattrs
from cattrs.gen import make_dict_unstructure_fn, override

from piship_remote.model.redact import redact

__all__ = [
    "GIT_CONTROL_PROTECTION",
    "GUARANTEES",
    "HOST_FILESYSTEM_ISOLATION",
    "NOTHING_RUNS",
    "NOTHING_SENT",
    "PATH_POLICY_PLANES",
    "WORKSPACE_CONFINEMENT",
    "WORKSPACE_MODES",
    "Capabilities",
    "ContainmentReport",
    "NetworkDenial",
    "NetworkProbe",
    "SyncedPath",
    "WorkspaceReport",
    "WorkspaceSyncReport",
    "describe_containment",
    "describe_sync",
    "describe_workspace",
    "initial_workspace_report",
    "snapshot_workspace_report",
    "synced_workspace_report",
]

HOST_FILESYSTEM_ISOLATION = "host-filesystem-isolation"
WORKSPACE_CONFINEMENT = "workspace-confinement"
GIT_CONTROL_PROTECTION = "git-control-protection"

GUARANTEES: tuple[str, ...] = (
    "filesystem-read-deny",
    "filesystem-write-allowlist",
    "network-deny",
    "environment-filter",
    GIT_CONTROL_PROTECTION,
    HOST_FILESYSTEM_ISOLATION,
    WORKSPACE_CONFINEMENT,
)
"""Every guarantee a backend can claim, in the canonical (report) order."""

PATH_POLICY_PLANES: tuple[str, ...] = ("filesystem-read-deny", "filesystem-write-allowlist")
"""The planes that together enforce ``sandbox.filesystem`` path rules."""

WORKSPACE_MODES: tuple[str, ...] = ("snapshot", "synchronized", "shared")

DEFAULT_PROPAGATION_MS = 10_000

NetworkMode = Literal["deny", "allow"]
Level = Literal["enforced", "unavailable", "not-required"]


def _strings(value: Iterable[str]) -> tuple[str, ...]:
    # A bare string is one name, not a sequence of characters.
    return (value,) if isinstance(value, str) else tuple(value)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


@attrs.frozen
class NetworkProbe:
    """A TCP endpoint for the network-denial check (``host`` without brackets or port)."""

    host: str
    port: int

    def to_dict(self) -> dict[str, Any]:
        """``{"host": ..., "port": ...}``."""
        return _dict(self)


def _network_probe(value: NetworkProbe | Mapping[str, Any] | None) -> Any:
    if isinstance(value, Mapping):
        return NetworkProbe(host=value.get("host"), port=value.get("port"))  # type: ignore[arg-type]
    # Anything else is kept as declared; capability_mismatch reports it.
    return value


@attrs.frozen
class Capabilities:
    """What a backend declares it can enforce; checked before anything is prepared.

    >>> Capabilities("remote", ["host-filesystem-isolation", "environment-filter"], ["allow"],
    ...              False).to_dict()["workspace"]
    {'mode': 'snapshot'}

    ``isolation`` is ``"local"`` or ``"remote"``; ``planes`` are guarantees from
    :data:`GUARANTEES`; ``network`` lists the modes it can enforce;
    ``network_probe`` (remote only, optional) is the target of the denial check.
    ``execution`` names a way of running commands other than the usual one request
    per command (``"detached"``: in the background, their output polled).
    """

    isolation: str
    planes: tuple[str, ...] = attrs.field(converter=_strings)
    network: tuple[str, ...] = attrs.field(converter=_strings)
    local_processes: bool
    workspace_mode: str = "snapshot"
    network_probe: NetworkProbe | None = attrs.field(default=None, converter=_network_probe)
    execution: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The camelCase JSON shape (``localProcesses``, ``workspace: {"mode"}``, ...)."""
        return _dict(self)


@attrs.frozen
class NetworkDenial:
    """The evidence for network denial: ``verified`` by a probe, or ``attested`` by the backend."""

    evidence: Literal["verified", "attested"]
    probe: bool
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """``{"evidence", "probe", "reason"?}``."""
        return _dict(self)


@attrs.frozen(kw_only=True)
class SyncedPath:
    """A path a push or pull left out, and why in words (``read-deny``, ``ignored``, ...)."""

    path: str
    reason: str


@attrs.frozen(kw_only=True)
class WorkspaceSyncReport:
    """What workspace sync did: the push at activation, and whether results come back.

    ``pulled_files``/``pulled_bytes`` stay ``None`` until a pull ran.
    """

    pushed_files: int
    pushed_bytes: int
    skipped: tuple[SyncedPath, ...] = ()
    results_return: bool = False
    pulled_files: int | None = None
    pulled_bytes: int | None = None
    pull_skipped: tuple[SyncedPath, ...] | None = None


@attrs.frozen(kw_only=True)
class WorkspaceReport:
    """How the sandbox sees the workspace; for a snapshot always
    :func:`snapshot_workspace_report`."""

    declared: str
    effective: str
    verification: str
    host_to_sandbox: str | None = None
    sandbox_to_host: str | None = None
    window_ms: int | None = None
    git_control_protection: str
    verified_at: str | None = None
    reason: str | None = None
    complete: bool = False
    sync: WorkspaceSyncReport | None = None

    def to_dict(self) -> dict[str, Any]:
        """The camelCase JSON shape (``gitControlProtection``, ``windowMs``, ...)."""
        return _dict(self)


@attrs.frozen(kw_only=True)
class ContainmentReport:
    """What an activation enforces, fixed at activation; fields in their JSON order.

    ``level`` is ``enforced``, ``unavailable`` or ``not-required``; ``planes``
    are the claimed guarantees in canonical order. Show it with
    :func:`describe_containment`; in a notebook it renders as a small table.
    """

    level: Level
    adapter: str
    provider: str
    required: bool
    planes: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    network: NetworkMode
    verification: str | None = None
    network_denial: NetworkDenial | None = None
    local_processes: bool = False
    reason: str | None = None
    warnings: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    isolation: str | None = None
    workspace: WorkspaceReport | None = None
    execution: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The camelCase JSON shape (``networkDenial``, ``localProcesses``, ...)."""
        return _dict(self)

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><th style='text-align:left'>{html.escape(key)}</th>"
            f"<td style='text-align:left'>{html.escape(_cell(value))}</td></tr>"
            for key, value in self._shown_rows()
        )
        caption = html.escape(describe_containment(self))
        return f"<table><caption>{caption}</caption>{rows}</table>"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        if cycle:
            printer.text("ContainmentReport(...)")
            return
        lines = [f"ContainmentReport: {describe_containment(self)}"]
        lines += [f"  {key}: {_cell(value)}" for key, value in self._shown_rows()]
        printer.text("\n".join(lines))

    def _shown_rows(self) -> list[tuple[str, object]]:
        """The JSON fields, and for a remote sandbox given no files a row that says so (the
        line's "Remote commands see a copy" means the copy the sandbox has, not this one)."""
        rows: list[tuple[str, object]] = list(self.to_dict().items())
        workspace = self.workspace
        if self.isolation == "remote" and workspace is not None and workspace.sync is None:
            rows.append(("workspaceFiles", NOTHING_SENT))
        return rows


NOTHING_SENT = (
    'none sent: the sandbox starts without this workspace\'s files (sync="push" sends them)'
)
"""What a report shown in a notebook says of a remote sandbox activated with ``sync="none"``."""


def _cell(value: object) -> str:
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "(none)"
    if isinstance(value, dict):
        return ", ".join(f"{key}={_cell(item)}" for key, item in value.items())
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# ---------------------------------------------------------------- JSON shape


def _is_tuple(type_: Any) -> bool:
    return type_ is tuple or get_origin(type_) is tuple


def _probe_dict(value: object) -> object:
    return {"host": value.host, "port": value.port} if isinstance(value, NetworkProbe) else value


def _unstructure_factory(converter: cattrs.Converter) -> Callable[[type[Any]], Any]:
    def factory(cls: type[Any]) -> Any:
        overrides: dict[str, Any] = {
            field.name: override(rename=_camel(field.name)) for field in attrs.fields(cls)
        }
        if cls is Capabilities:
            overrides["workspace_mode"] = override(
                rename="workspace", unstruct_hook=lambda mode: {"mode": mode}
            )
            overrides["network_probe"] = override(rename="networkProbe", unstruct_hook=_probe_dict)
        unstructure = make_dict_unstructure_fn(cls, converter, **overrides)

        # Optional fields are left out rather than null; filtering afterwards
        # keeps the declared key order (cattrs' omit_if_default moves them last).
        def hook(value: object) -> dict[str, Any]:
            return {key: item for key, item in unstructure(value).items() if item is not None}

        return hook

    return factory


def _make_converter() -> cattrs.Converter:
    converter = cattrs.Converter()
    converter.register_unstructure_hook_func(
        _is_tuple, lambda value: [converter.unstructure(item) for item in value]
    )
    converter.register_unstructure_hook_factory(attrs.has, _unstructure_factory(converter))
    return converter


_CONVERTER = _make_converter()


def _dict(value: object) -> dict[str, Any]:
    result: dict[str, Any] = _CONVERTER.unstructure(value)
    return result


# ---------------------------------------------------------------- workspace


def snapshot_workspace_report() -> WorkspaceReport:
    """The workspace report of a snapshot backend; it never changes."""
    return WorkspaceReport(
        declared="snapshot",
        effective="snapshot",
        verification="not-required",
        git_control_protection="not-applicable",
        complete=False,
    )


def initial_workspace_report(mode: str) -> WorkspaceReport:
    """The workspace report at activation: snapshot needs nothing, the others are pending."""
    if mode == "snapshot":
        return snapshot_workspace_report()
    return WorkspaceReport(
        declared=mode,
        effective="snapshot",
        verification="pending",
        git_control_protection="pending",
        complete=False,
    )


def synced_workspace_report(sync: WorkspaceSyncReport) -> WorkspaceReport:
    """The workspace report of a sandbox whose workspace was pushed (and maybe pulled)."""
    return WorkspaceReport(
        declared="synced",
        effective="synced",
        verification="not-required",
        git_control_protection="not-applicable",
        complete=False,
        sync=sync,
    )


def describe_sync(sync: WorkspaceSyncReport) -> str:
    """The workspace sentence of a synced sandbox: what went in, what was left out, and back."""
    files = "file" if sync.pushed_files == 1 else "files"
    line = f"Workspace: synced (pushed {sync.pushed_files} {files}, {sync.pushed_bytes} bytes"
    if sync.skipped:
        reasons: dict[str, int] = {}
        for skipped in sync.skipped:
            reasons[skipped.reason] = reasons.get(skipped.reason, 0) + 1
        left_out = ", ".join(f"{count} {reason}" for reason, count in reasons.items())
        line += f"; left out: {left_out}"
    line += ")."
    if not sync.results_return:
        return f"{line} Results stay in the sandbox unless pulled."
    if sync.pulled_files is None:
        return f"{line} Changed files come back when the sandbox is disposed."
    pulled = "file" if sync.pulled_files == 1 else "files"
    return f"{line} Pulled back {sync.pulled_files} changed {pulled}, {sync.pulled_bytes} bytes."


def describe_workspace(report: WorkspaceReport) -> str:
    """The workspace sentence of the containment line."""
    if report.sync is not None:
        return describe_sync(report.sync)
    declared = report.declared
    if report.verification == "not-required":
        if declared == "snapshot":
            return (
                "Workspace: snapshot. Remote commands see a copy, not the files the agent edits;"
                " this is not a complete coding-agent workspace."
            )
        return "Workspace: shared (commands run on this host's files)."
    if report.verification == "pending":
        return f"Workspace: {declared} declared, verified before the first sandboxed command."
    if report.verification == "verified":
        at = report.verified_at if report.verified_at is not None else "an unknown time"
        if report.effective == "shared":
            return f"Workspace: shared (verified {at}, both directions immediate)."
        was = f"declared {declared}; " if declared != "synchronized" else ""
        window = report.window_ms if report.window_ms is not None else DEFAULT_PROPAGATION_MS
        return f"Workspace: synchronized ({was}verified {at}, within {window} ms)."
    if report.verification == "unverifiable":
        reason = report.reason if report.reason is not None else "unknown reason"
        return (
            f"Workspace: snapshot (declared {declared}; no location this library owns to verify it:"
            f" {reason})."
        )
    reason = report.reason if report.reason is not None else "the check failed"
    return (
        f"Workspace: snapshot (declared {declared}; {reason})."
        " Remote commands see a copy of the workspace."
    )


# ---------------------------------------------------------------- policy vs capabilities


DETACHED_SENTENCE = (
    "Commands run detached: in the background in their own process group in the sandbox,"
    " their output and exit status polled from files there."
)
"""What the line of a report says when commands run detached (``execution="detached"``)."""

NOTHING_RUNS = "No command runs: piship_remote runs commands only in a sandbox"
"""What the line of a report without a sandbox says happens to commands (they are refused)."""

# The snapshot line (sync="none") keeps these words exactly; a synced one says it plainly.
_HOST_ISOLATION_SENTENCE = (
    " The sandbox cannot reach this host's files, but it does not enforce sandbox.filesystem"
    " path rules; they govern only the local file tools."
)
_SYNCED_HOST_ISOLATION_SENTENCE = (
    " The sandbox cannot reach this host's files; the policy's filesystem path rules decide"
    " what push sends and what pull writes back, not what commands in the sandbox read."
)
_SNAPSHOT_SCOPE = (
    "Contains shell commands; MCP stdio servers cannot be contained by this backend"
    " and do not start, not the agent process or in-process extensions"
)
_SYNCED_SCOPE = "Contains the shell commands it runs, not this Python process"
_LOCAL_SCOPE = "Contains every command it runs, not this Python process"
_CONFINEMENT_SENTENCE = (
    " The sandbox reaches this host's files only through the workspace, where it does not"
    " enforce sandbox.filesystem path rules: a read-denied path inside the workspace is"
    " readable by sandboxed commands."
)


def _path_rules_sentence(planes: Sequence[str], *, synced: bool) -> str:
    partial = [plane for plane in PATH_POLICY_PLANES if plane in planes]
    if len(partial) == len(PATH_POLICY_PLANES):
        return ""
    if partial:
        return (
            " sandbox.filesystem path rules are only partly enforced by the backend"
            f" ({', '.join(partial)} only); push and pull still apply them in full."
        )
    if HOST_FILESYSTEM_ISOLATION in planes:
        return _SYNCED_HOST_ISOLATION_SENTENCE if synced else _HOST_ISOLATION_SENTENCE
    if WORKSPACE_CONFINEMENT in planes:
        return _CONFINEMENT_SENTENCE
    return " sandbox.filesystem path rules are not enforced by the backend."


def _enforced_line(report: ContainmentReport, workspace: WorkspaceReport | None) -> str:
    requirement = "required" if report.required else "optional"
    how = (
        f"{requirement}, attested by the backend"
        if report.verification == "backend-attested"
        else requirement
    )
    denial = report.network_denial
    if denial is None:
        evidence = ""
    elif denial.evidence == "verified":
        evidence = " (verified)"
    else:
        evidence = " (attested by the backend, not verified)"
    synced = workspace is not None and workspace.sync is not None
    scope = _SYNCED_SCOPE if synced else _SNAPSHOT_SCOPE
    if report.local_processes:
        scope = _LOCAL_SCOPE
    paths = _path_rules_sentence(report.planes, synced=synced)
    line = (
        f"enforced by {report.adapter} ({how}): {', '.join(report.planes)};"
        f" network {report.network}{evidence}. {scope}{'.' + paths if paths else ''}"
    )
    if report.execution == "detached":
        line = f"{line}{'' if line.endswith('.') else '.'} {DETACHED_SENTENCE}"
    if report.isolation != "remote" or workspace is None:
        return line
    return f"{line}{'' if line.endswith('.') else '.'} {describe_workspace(workspace)}"


def describe_containment(
    report: ContainmentReport, workspace: WorkspaceReport | None = None
) -> str:
    """The one-line description of a report (the doctor line).

    ``workspace`` is the live workspace report; ``None`` uses ``report.workspace``.
    """
    requirement = "required" if report.required else "optional"
    if report.level == "enforced":
        return _enforced_line(report, workspace if workspace is not None else report.workspace)
    if report.level == "unavailable":
        reason = redact(report.reason if report.reason is not None else "unknown reason")
        return f"unavailable on {report.adapter} ({requirement}): {reason}. {NOTHING_RUNS}"
    return f"not required: no sandbox is active. {NOTHING_RUNS}"
