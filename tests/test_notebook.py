"""The library in a real Jupyter kernel (ipykernel, driven by nbclient) on the local service:
the README's notebook cells as written, output that streams while a command runs, the
kernel's interrupt on a command and on a ``map``, readable errors, and nothing left behind.

Needs the ``notebook`` extra (nbclient, nbformat, ipykernel); every interrupt is nbclient's
own (``km.interrupt_kernel()``), sent once the cell's output shows the command running.
"""

from __future__ import annotations

import asyncio
import importlib.util
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from piship_remote.local import LocalE2bService
from tests.support.optional_peers import install_hint
from tests.support.pool import settled
from tests.support.readme import ALL, EVAL_SCRIPT, MAKEFILE

nbclient = pytest.importorskip("nbclient", reason=install_hint("notebook"))
nbformat = pytest.importorskip("nbformat", reason=install_hint("notebook"))
pytest.importorskip("ipykernel", reason=install_hint("notebook"))
from jupyter_core.utils import ensure_async  # noqa: E402 (nbclient brings it)

pytestmark = [
    pytest.mark.skipif(
        LocalE2bService.check() is not None,
        reason=f"no local service here: {LocalE2bService.check()}",
    ),
    pytest.mark.timeout(600),
]

CELL_TIMEOUT = 300
README_CELLS = [e.code for e in ALL if e.kind == "notebook-local"]
SETUP = README_CELLS[0] + "\nfirst = sandbox"
RUNNING = "command-is-running"
WIDGET = "application/vnd.jupyter.widget-view+json"


class Kernel(nbclient.NotebookClient):  # type: ignore[misc]
    """A kernel running cells one by one; it records every output message with the time it
    arrived, and interrupts the kernel once an output shows ``interrupt_on``."""

    def __init__(self, path: Path) -> None:
        super().__init__(
            nbformat.v4.new_notebook(),
            timeout=CELL_TIMEOUT,
            startup_timeout=120,
            allow_errors=True,
            kernel_name="python3",
            resources={"metadata": {"path": str(path)}},
        )
        self.messages: list[tuple[float, dict[str, Any]]] = []
        self.interrupt_on: str | None = None
        self._interrupts: list[asyncio.Future[Any]] = []

    def run(self, code: str) -> list[Any]:
        """Run ``code`` as the next cell; its outputs."""
        cell = nbformat.v4.new_code_cell(code)
        self.nb.cells.append(cell)
        self.execute_cell(cell, len(self.nb.cells) - 1)
        return list(cell.outputs)

    def output(self, outs: Any, msg: dict[str, Any], display_id: Any, cell_index: int) -> Any:
        self.messages.append((time.monotonic(), msg))
        if self.interrupt_on is not None and self.interrupt_on in msg["content"].get("text", ""):
            self.interrupt_on = None
            interrupt = ensure_async(self.km.interrupt_kernel())
            self._interrupts.append(asyncio.ensure_future(interrupt))
        return super().output(outs, msg, display_id, cell_index)


@pytest.fixture(scope="module")
def service() -> Iterator[LocalE2bService]:
    with LocalE2bService() as made:
        yield made


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("notebook-project")
    (path / "Makefile").write_text(MAKEFILE)
    (path / "eval.py").write_text(EVAL_SCRIPT)
    return path


@pytest.fixture
def kernel(
    service: LocalE2bService, project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Kernel]:
    """A fresh kernel in the project's folder, the service's settings in its environment."""
    monkeypatch.setenv("PISHIP_E2B_ENDPOINT", service.url)
    monkeypatch.setenv("PISHIP_E2B_ENVD_URL", service.envd_url)
    monkeypatch.setenv("E2B_API_KEY", service.api_key)
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    client = Kernel(project)
    with client.setup_kernel():
        yield client
    assert settled(lambda: service.sandboxes() == [], timeout=30), service.sandboxes()


def texts(outputs: list[Any], name: str = "stdout") -> str:
    return "".join(o.get("text", "") for o in outputs if o.get("name") == name)


def shown(outputs: list[Any], mime: str = "text/html") -> str:
    return "".join(o.get("data", {}).get(mime, "") for o in outputs if "data" in o)


def errors(outputs: list[Any]) -> list[Any]:
    return [o for o in outputs if o.output_type == "error"]


def test_the_readme_cells_run_as_written_and_show_tables(
    kernel: Kernel, service: LocalE2bService
) -> None:
    first, second, pool, dispose = (kernel.run(code) for code in README_CELLS)
    for outputs in (first, second, pool, dispose):
        assert errors(outputs) == []
    found = re.fullmatch(r"<Sandbox (\S+) e2b-compatible active>", shown(first, "text/plain"))
    assert found is not None and found.group(1) in shown(first)
    assert "<table>" in shown(first) and found.group(1) not in service.sandboxes()
    assert "step 4" in texts(second) and "case 7 passed" in texts(second)
    assert "exit code" in shown(second)
    assert "100 tasks: 100 ok" in shown(pool)


def test_output_arrives_while_the_command_runs(kernel: Kernel) -> None:
    kernel.run(SETUP)
    kernel.messages.clear()
    outputs = kernel.run(
        'first.exec("for i in 1 2 3 4; do echo step $i; sleep 0.5; done", on_data=sys.stdout)'
    )
    assert errors(outputs) == []
    steps = [at for at, msg in kernel.messages if "step" in msg["content"].get("text", "")]
    assert len(steps) >= 3  # several messages, not one at the end
    assert steps[-1] - steps[0] >= 1.0  # the first came while the command still ran
    kernel.run("first.dispose()")


def test_the_progress_of_a_map_shows_in_the_cell(kernel: Kernel) -> None:
    kernel.run(SETUP)
    outputs = kernel.run(
        "with SandboxPool(policy, backend=backend, workspace='.', size=2, progress=True) as p:\n"
        "    results = p.map('echo {item}', range(4))\n"
        "first.dispose()"
    )
    assert errors(outputs) == []
    widget = any(WIDGET in o.get("data", {}) for o in outputs)
    if all(importlib.util.find_spec(name) for name in ("tqdm", "ipywidgets")):
        assert widget  # the kernel runs this interpreter, with the progress extra
    else:
        assert "4/4" in texts(outputs, "stderr")
    assert "IProgress" not in texts(outputs, "stderr")


def test_an_interrupt_kills_the_command_and_says_so(kernel: Kernel) -> None:
    kernel.run(SETUP)
    kernel.interrupt_on = RUNNING
    outputs = kernel.run(f'first.exec("echo {RUNNING}; sleep 600", on_data=sys.stdout.write)')
    (error,) = errors(outputs)
    assert error.ename == "KeyboardInterrupt"
    assert error.evalue == "interrupted: the remote command was killed"
    after = kernel.run(
        "left = first.run('cat /proc/[0-9]*/comm').stdout.split()\n"
        "print('sleep' in left, first.state)\n"
        "first.dispose()"
    )
    assert texts(after) == "False active\n"


def test_an_interrupt_ends_a_map_and_its_sandboxes(
    kernel: Kernel, service: LocalE2bService
) -> None:
    kernel.run(SETUP + "\nfirst.dispose()")
    kernel.interrupt_on = RUNNING
    outputs = kernel.run(
        "def sleeps(sandbox, item):\n"
        f"    return sandbox.exec('echo {RUNNING}; sleep 600', on_data=sys.stdout.write)\n"
        "pool = SandboxPool(policy, backend=backend, workspace='.', size=4, progress=False)\n"
        "pool.map(sleeps, range(4))"
    )
    (error,) = errors(outputs)
    assert error.ename == "KeyboardInterrupt" and "commands were killed" in error.evalue
    assert settled(lambda: service.sandboxes() == [], timeout=30)
    again = kernel.run("pool.map('true', [1])")
    (closed,) = errors(again)
    assert "interrupted" in closed.evalue and "new SandboxPool" in "\n".join(closed.traceback)


def test_a_library_error_shows_its_code_and_fix_without_library_frames(kernel: Kernel) -> None:
    outputs = kernel.run(
        "from piship_remote import E2bCompatibleBackend, activate_sandbox\n"
        "gone = E2bCompatibleBackend(endpoint='http://127.0.0.1:9', credential=lambda: 'k')\n"
        "activate_sandbox({'required': True}, backend=gone, workspace='.')"
    )
    (error,) = errors(outputs)
    traceback = "\n".join(error.traceback)
    assert error.ename == "GatewayUnreachable" and "GATEWAY_UNREACHABLE" in traceback
    assert "Action: " in traceback
    assert "piship_remote" not in traceback.replace("from piship_remote import", "")
    assert "interactiveshell.py" not in traceback  # IPython hides its own frame too
    assert len(traceback.splitlines()) < 10


def test_a_sandbox_kept_only_by_the_output_history_goes_with_reset_out(
    kernel: Kernel, service: LocalE2bService
) -> None:
    kernel.run(SETUP + "\nfirst.dispose()")
    for _ in range(4):  # a re-run cell whose last line shows the sandbox
        kernel.run("sandbox = activate_sandbox(policy, backend=backend, workspace='.')\nsandbox")
    assert len(service.sandboxes()) == 4
    kernel.run("%reset -f out\nimport gc; gc.collect()")
    # IPython still holds the last three results (_, __, ___), the newest named too
    assert settled(lambda: len(service.sandboxes()) == 3, timeout=30)
    kernel.run("sandbox.dispose()")
    assert len(service.sandboxes()) == 2
    # the kernel's end deletes the two IPython kept (the fixture checks none is left)


def test_a_kernel_shutdown_deletes_its_sandboxes(kernel: Kernel, service: LocalE2bService) -> None:
    kernel.run(SETUP)
    assert len(service.sandboxes()) == 1
    # the fixture's clean shutdown must leave none: checked as the kernel ends


def test_a_sandbox_attached_in_another_kernel_ends_with_that_kernel(
    kernel: Kernel, service: LocalE2bService, project: Path
) -> None:
    outputs = kernel.run(SETUP + "\nprint(first.detach())")
    kept = texts(outputs).strip()
    assert service.sandboxes() == [kept]
    other = Kernel(project)
    with other.setup_kernel():
        attached = other.run(
            SETUP.split("sandbox = activate_sandbox")[0]
            + f"sandbox = activate_sandbox(policy, backend=backend, workspace='.', attach={kept!r})"
            + "\nprint(sandbox.id)"
        )
        assert texts(attached) == f"{kept}\n"
    assert settled(lambda: service.sandboxes() == [], timeout=30)
