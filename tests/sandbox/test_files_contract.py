"""One contract for ``Sandbox.files``, ``push`` and ``pull``, run against every service.

Six services: the doubles over a real directory (the Kubernetes runtime's ``/execute``
and the E2B double's ``Start`` run the command in it, so the helper commands act on the
same files their file endpoints serve); the Kubernetes double on sandboxd (its REST files
and real commands in a directory per claim); the doubles as users construct them, with no
arguments (their in-memory trees and shell, nothing run on the host); and the local
service, the real thing.
"""

from __future__ import annotations

import contextlib
import io
import os
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from piship_remote import PiShipError, Sandbox, SkippedPath, activate_sandbox
from piship_remote.backends._file_protocol import SizedChunks
from piship_remote.backends.base import Backend
from piship_remote.backends.e2b.backend import E2bCompatibleBackend
from piship_remote.local import LocalE2bService
from piship_remote.model.errors import CONFIG_INVALID, FILE_NOT_FOUND
from piship_remote.testing import E2bServer, KubernetesServer
from tests.support.files import DirectoryTree, EnvdDirectoryTree, bash_command, shell_execute
from tests.support.seed import kubernetes

Activate = Callable[..., Sandbox]


@attrs.frozen
class Service:
    """One service under test: how to activate a sandbox on it, an absolute directory in
    that sandbox outside its working directory, and a path there it refuses to write (the
    in-memory doubles refuse none)."""

    activate: Activate
    elsewhere: str
    read_only: str | None
    name: str


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return path


def _starter(
    backend: Backend, workspace: Path, sandboxes: list[Sandbox], network: str = "allow"
) -> Activate:
    """Activation on ``backend``; the network mode is the one the service offers (the local
    service allows a network only with slirp4netns, Kubernetes cannot deny it): files do
    not depend on it."""

    def start(policy: dict[str, Any] | None = None, **options: Any) -> Sandbox:
        sandbox = activate_sandbox(
            {**(policy or {"required": True}), "network": {"mode": network}},
            backend=backend,
            workspace=workspace,
            env={"SECRET_TOKEN": "s3cr3t-value"},
            **options,
        )
        sandboxes.append(sandbox)
        return sandbox

    return start


@contextlib.contextmanager
def _kubernetes(tmp_path: Path, workspace: Path) -> Iterator[Service]:
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    sandboxes: list[Sandbox] = []
    with KubernetesServer(
        shell_execute(str(runtime)), file_tree=lambda _claim: DirectoryTree(str(runtime))
    ) as server:
        yield Service(
            _starter(kubernetes(server.url), workspace, sandboxes),
            str(tmp_path / "elsewhere"),
            "/proc/piship-refused",
            "kubernetes",
        )
        for sandbox in sandboxes:
            sandbox.dispose()


@contextlib.contextmanager
def _local(workspace: Path) -> Iterator[Service]:
    problem = LocalE2bService.check()
    if problem is not None:
        pytest.skip(f"LocalE2bService cannot run here: {problem}")
    sandboxes: list[Sandbox] = []
    with LocalE2bService() as service:
        yield Service(
            _starter(service.backend(), workspace, sandboxes, network="deny"),
            "/tmp/elsewhere",
            "/etc/piship-refused",
            "local",
        )
        for sandbox in sandboxes:
            sandbox.dispose()


@contextlib.contextmanager
def _e2b(tmp_path: Path, workspace: Path) -> Iterator[Service]:
    home = tmp_path / "home"
    home.mkdir()
    sandboxes: list[Sandbox] = []
    with E2bServer(
        command=bash_command(str(home)), file_tree=lambda _id: EnvdDirectoryTree(str(home))
    ) as server:
        backend = E2bCompatibleBackend(
            endpoint=server.url,
            envd_url=server.url,
            credential=lambda: "e2b-key-000001",
            workdir=str(home),
        )
        yield Service(
            _starter(backend, workspace, sandboxes),
            str(tmp_path / "elsewhere"),
            "/proc/piship-refused",  # the double's paths are this host's
            "e2b",
        )
        for sandbox in sandboxes:
            sandbox.dispose()


@contextlib.contextmanager
def _e2b_double(workspace: Path) -> Iterator[Service]:
    """``E2bServer()`` as a user constructs it: its in-memory tree, no host commands."""
    sandboxes: list[Sandbox] = []
    with E2bServer() as server:
        backend = E2bCompatibleBackend(
            endpoint=server.url, envd_url=server.url, credential=lambda: "e2b-key-000001"
        )
        yield Service(_starter(backend, workspace, sandboxes), "/tmp/elsewhere", None, "e2b-double")
        for sandbox in sandboxes:
            sandbox.dispose()


@contextlib.contextmanager
def _kubernetes_double(workspace: Path) -> Iterator[Service]:
    """``KubernetesServer()`` as a user constructs it: its in-memory tree, no host commands."""
    sandboxes: list[Sandbox] = []
    with KubernetesServer() as server:
        start = _starter(kubernetes(server.url), workspace, sandboxes)
        yield Service(start, "/tmp/elsewhere", None, "kubernetes-double")
        for sandbox in sandboxes:
            sandbox.dispose()


@contextlib.contextmanager
def _kubernetes_sandboxd(tmp_path: Path, workspace: Path) -> Iterator[Service]:
    """``KubernetesServer(runtime="sandboxd")``: each claim's sandboxd runs real commands in
    a directory of its own; its REST surface serves the files under it, helper commands the
    rest (``elsewhere`` lies outside it)."""
    pytest.importorskip("grpc", reason="pip install 'piship-remote[sandboxd]'")
    sandboxes: list[Sandbox] = []
    with KubernetesServer(runtime="sandboxd") as server:
        start = _starter(kubernetes(server.url), workspace, sandboxes)
        yield Service(
            start, str(tmp_path / "elsewhere"), "/proc/piship-refused", "kubernetes-sandboxd"
        )
        for sandbox in sandboxes:
            sandbox.dispose()


IN_MEMORY = ("e2b-double", "kubernetes-double")


def open_service(
    name: str, tmp_path: Path, workspace: Path
) -> contextlib.AbstractContextManager[Service]:
    """The service called ``name``, opened for one test."""
    services = {
        "kubernetes": lambda: _kubernetes(tmp_path, workspace),
        "local": lambda: _local(workspace),
        "e2b": lambda: _e2b(tmp_path, workspace),
        "e2b-double": lambda: _e2b_double(workspace),
        "kubernetes-double": lambda: _kubernetes_double(workspace),
        "kubernetes-sandboxd": lambda: _kubernetes_sandboxd(tmp_path, workspace),
    }
    return services[name]()


@pytest.fixture(params=["kubernetes", "kubernetes-sandboxd", "local", "e2b", *IN_MEMORY])
def service(request: pytest.FixtureRequest, tmp_path: Path, workspace: Path) -> Iterator[Service]:
    with open_service(request.param, tmp_path, workspace) as chosen:
        yield chosen


@pytest.fixture
def activate(service: Service) -> Activate:
    return service.activate


@pytest.fixture
def sandbox(activate: Activate) -> Sandbox:
    return activate()


# -- single files ----------------------------------------------------------------------


def test_write_read_and_read_text(sandbox: Sandbox) -> None:
    info = sandbox.files.write("data/in.txt", "héllo")
    assert info.type == "file" and info.size == len("héllo".encode())
    assert info.path.endswith("/data/in.txt")
    assert sandbox.files.read("data/in.txt") == "héllo".encode()
    assert sandbox.files.read_text("data/in.txt") == "héllo"


def test_a_file_object_is_streamed_in_chunks(sandbox: Sandbox) -> None:
    reads: list[int] = []

    class Source(io.BytesIO):
        def read(self, size: int | None = -1) -> bytes:
            chunk = super().read(size)
            reads.append(len(chunk))
            return chunk

    sandbox.files.write("big.bin", Source(b"z" * (5 * 1024 * 1024 + 7)))
    assert len([size for size in reads if size]) == 6  # 1 MiB at a time, never whole
    assert sandbox.files.read("big.bin") == b"z" * (5 * 1024 * 1024 + 7)


def test_list_is_one_level_and_sorted(sandbox: Sandbox) -> None:
    sandbox.files.write("d/b.txt", b"bb")
    sandbox.files.write("d/a.txt", b"a")
    sandbox.files.write("d/sub/c.txt", b"c")
    listed = sandbox.files.list("d")
    assert [(i.name, i.type) for i in listed] == [
        ("a.txt", "file"),
        ("b.txt", "file"),
        ("sub", "dir"),
    ]
    assert listed[1].size == 2


def test_exists_remove_and_make_dir(sandbox: Sandbox) -> None:
    files = sandbox.files
    assert not files.exists("made")
    assert files.make_dir("made/deep") is True
    assert files.make_dir("made/deep") is False
    assert files.exists("made/deep")
    files.write("made/deep/f", b"x")
    files.remove("made")
    assert not files.exists("made")
    files.remove("made")  # a missing path is fine


def test_an_absolute_path_outside_the_working_directory(sandbox: Sandbox, service: Service) -> None:
    outside = f"{service.elsewhere}/note.txt"
    sandbox.files.write(outside, b"far")
    seen = bytearray()
    assert sandbox.exec(f"cat {outside}", on_data=seen.extend).exit_code == 0
    assert bytes(seen) == b"far"
    assert sandbox.files.read(outside) == b"far"
    assert [i.name for i in sandbox.files.list(service.elsewhere)] == ["note.txt"]


# -- copies ----------------------------------------------------------------------------


def test_upload_and_download_a_file(sandbox: Sandbox, workspace: Path) -> None:
    (workspace / "in.txt").write_bytes(b"payload")
    summary = sandbox.files.upload(workspace / "in.txt")
    assert (summary.files, summary.bytes) == (1, 7)
    assert sandbox.files.read("in.txt") == b"payload"
    back = sandbox.files.download("in.txt", workspace / "out.txt")
    assert (back.files, (workspace / "out.txt").read_bytes()) == (1, b"payload")


@pytest.fixture(params=["local", "e2b"])
def envd_sandbox(
    request: pytest.FixtureRequest, tmp_path: Path, workspace: Path
) -> Iterator[Sandbox]:
    services = {"local": lambda: _local(workspace), "e2b": lambda: _e2b(tmp_path, workspace)}
    with services[request.param]() as chosen:
        yield chosen.activate()


def test_a_sized_upload_sends_exactly_its_declared_length(envd_sandbox: Sandbox) -> None:
    remote = envd_sandbox.files._remote  # the envd client: a known size goes as Content-Length
    path = envd_sandbox.files.resolve("sized.txt")
    info = remote.write(path, SizedChunks(iter([b"abc", b"def"]), 4))  # the source grew
    assert (info.size, envd_sandbox.files.read("sized.txt")) == (4, b"abcd")
    with pytest.raises(PiShipError, match="ended after 3 of its 10 bytes"):
        remote.write(path, SizedChunks(iter([b"abc"]), 10))  # the source came up short
    assert envd_sandbox.files.write("next.txt", b"after").size == 5  # the client carries on


def test_directories_copy_like_cp_r(sandbox: Sandbox, workspace: Path) -> None:
    source = workspace / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "m.py").write_text("print(1)\n")
    (source / "top.txt").write_text("top")
    summary = sandbox.files.upload(source, "copy/src")
    assert summary.files == 2
    assert sandbox.files.read_text("copy/src/pkg/m.py") == "print(1)\n"
    back = sandbox.files.download("copy/src", workspace / "here")
    assert back.files == 2
    assert (workspace / "here" / "pkg" / "m.py").read_text() == "print(1)\n"
    assert (workspace / "here" / "top.txt").read_text() == "top"


# -- workspace sync --------------------------------------------------------------------


def test_push_at_activation_and_pull_of_what_changed(activate: Activate, workspace: Path) -> None:
    (workspace / "Makefile").write_text("test:\n\techo ok > result.txt\n")
    (workspace / ".gitignore").write_text("build/\n")
    (workspace / "build").mkdir()
    (workspace / "build" / "junk.o").write_bytes(b"\0")
    sandbox = activate(sync="push")
    assert sandbox.files.read_text("Makefile").startswith("test:")
    assert not sandbox.files.exists("build/junk.o")
    assert sandbox.exec("echo made > result.txt").exit_code == 0
    pulled = sandbox.pull()
    assert (workspace / "result.txt").read_text() == "made\n"
    assert pulled.files == 1  # only the changed file, not the pushed Makefile


def test_the_report_tells_what_sync_did(activate: Activate, workspace: Path) -> None:
    (workspace / "a.txt").write_text("abc")
    (workspace / ".env").write_text("TOKEN=x")
    sandbox = activate(
        {
            "required": True,
            "network": {"mode": "allow"},
            "filesystem": {"read": {"deny": ["workspace/.env"]}},
        },
        sync="push-pull",
    )
    report = sandbox.report.workspace
    assert report is not None and report.declared == report.effective == "synced"
    assert report.sync is not None and report.sync.results_return is True
    assert (report.sync.pushed_files, report.sync.pushed_bytes) == (1, 3)
    assert [(s.path, s.reason) for s in report.sync.skipped] == [(".env", "read-deny")]
    assert not sandbox.files.exists(".env")


def test_push_pull_brings_results_back_at_dispose(activate: Activate, workspace: Path) -> None:
    sandbox = activate(sync="push-pull")
    sandbox.exec("echo done > out.txt")
    sandbox.dispose()
    assert (workspace / "out.txt").read_text() == "done\n"


# -- bad input -------------------------------------------------------------------------


def test_a_missing_remote_file_is_file_not_found(sandbox: Sandbox, workspace: Path) -> None:
    for action in (
        lambda: sandbox.files.read("nope.txt"),
        lambda: sandbox.files.download("nope.txt", workspace / "x"),
        lambda: sandbox.files.list("nope"),
    ):
        with pytest.raises(PiShipError) as caught:
            action()
        assert caught.value.code == FILE_NOT_FOUND and "nope" in str(caught.value)


def test_a_host_path_outside_the_workspace_is_refused(sandbox: Sandbox, tmp_path: Path) -> None:
    with pytest.raises(PiShipError) as caught:
        sandbox.push([tmp_path])
    assert caught.value.code == CONFIG_INVALID and str(tmp_path) in str(caught.value)


def test_a_denied_path_is_never_uploaded(activate: Activate, workspace: Path) -> None:
    (workspace / "secrets").mkdir()
    (workspace / "secrets" / "key").write_text("k")
    sandbox = activate(
        {
            "required": True,
            "network": {"mode": "allow"},
            "filesystem": {"read": {"deny": ["workspace/secrets"]}},
        }
    )
    summary = sandbox.files.upload(workspace / "secrets")
    assert summary.skipped == (SkippedPath(str(workspace / "secrets"), "read-deny"),)
    assert not sandbox.files.exists("secrets")


def test_a_download_outside_write_allow_is_refused(activate: Activate, tmp_path: Path) -> None:
    sandbox = activate(
        {
            "required": True,
            "network": {"mode": "allow"},
            "filesystem": {"write": {"allow": ["workspace"]}},
        }
    )
    sandbox.files.write("f", b"x")
    with pytest.raises(PiShipError) as caught:
        sandbox.files.download("f", tmp_path / "outside.txt")
    assert caught.value.code == CONFIG_INVALID and "outside.txt" in str(caught.value)
    assert not (tmp_path / "outside.txt").exists()


def test_a_hostile_archive_lands_nothing_outside(
    sandbox: Sandbox, workspace: Path, request: pytest.FixtureRequest
) -> None:
    if request.node.callspec.params["service"] in IN_MEMORY:
        pytest.skip("the doubles' in-memory trees hold no symlinks to send")
    sandbox.exec("mkdir -p evil && ln -s /etc evil/link && echo x > evil/ok")
    summary = sandbox.files.download("evil", workspace / "got")
    assert (workspace / "got" / "ok").read_text() == "x\n"
    assert not os.path.lexists(workspace / "got" / "link")
    assert [(s.path.rstrip("/").split("/")[-1], s.reason) for s in summary.skipped] == [
        ("link", "symlink")
    ]


def test_a_cut_download_leaves_no_half_file(
    sandbox: Sandbox, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox.files.write("whole.bin", b"y" * (3 * 1024 * 1024))
    remote = sandbox.files._remote

    def cut(path: str, sink: Callable[[bytes], None], **_: Any) -> int:
        sink(b"y" * 1024)
        raise PiShipError("SANDBOX_UNAVAILABLE", f"reading {path} failed: connection reset")

    monkeypatch.setattr(remote, "read", cut)
    with pytest.raises(PiShipError, match="connection reset"):
        sandbox.files.download("whole.bin", workspace / "whole.bin")
    assert os.listdir(workspace) == []


# -- bounded memory --------------------------------------------------------------------

STREAMED = 64 * 1024 * 1024
PIECE_LIMIT = 1024 * 1024  # what one read or write may hold
HELD_LIMIT = 8 * 1024 * 1024  # what the whole process may allocate beyond its start


@pytest.fixture
def local_sandbox(workspace: Path) -> Iterator[Sandbox]:
    with _local(workspace) as local:
        yield local.activate()


def test_64_mib_moves_both_ways_in_bounded_pieces(local_sandbox: Sandbox, workspace: Path) -> None:
    source = workspace / "big.bin"
    with open(source, "wb") as out:
        out.truncate(STREAMED)  # sparse: no page of it is ever in memory at once
    sent: list[int] = []
    received: list[int] = []
    tracemalloc.start()
    try:
        up = local_sandbox.files.upload(source, "big.bin", progress=sent.append)
        _, upload_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        down = local_sandbox.files.download(
            "big.bin", workspace / "back.bin", progress=received.append
        )
        _, download_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert up.bytes == down.bytes == sum(sent) == sum(received) == STREAMED
    assert max(sent) <= PIECE_LIMIT and max(received) <= PIECE_LIMIT
    assert upload_peak <= HELD_LIMIT and download_peak <= HELD_LIMIT, (upload_peak, download_peak)
    assert (workspace / "back.bin").stat().st_size == STREAMED
