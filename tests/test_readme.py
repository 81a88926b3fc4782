"""Every example in README.rst still works: each one is run against the local service or a double.

An example is a literal block (``::`` or ``.. code-block::``). The RST comment just
before it says how it is checked, so none is left unchecked by accident:

- ``.. readme-test: python-local`` — Python, run in a fresh interpreter with
  ``PISHIP_E2B_ENDPOINT``, ``PISHIP_E2B_ENVD_URL`` and ``E2B_API_KEY`` pointing at a
  local service, in a workspace holding a Makefile;
- ``.. readme-test: python-local-otel`` — the same as ``python-local``, with
  OpenTelemetry's SDK (skipped without the ``otel`` extra and ``opentelemetry-sdk``);
- ``.. readme-test: python-k8s-double`` — the same against ``KubernetesServer``
  (``PISHIP_K8S_*`` set);
- ``.. readme-test: python-e2b-sdk`` — Python using the official ``e2b`` SDK, run with
  ``E2B_API_URL``, ``E2B_SANDBOX_URL`` and ``E2B_API_KEY`` pointing at a local service
  (skipped without the ``interop`` extra);
- ``.. readme-test: shell-local`` — each ``$ `` line run with the same settings;
- ``.. readme-test: notebook-local`` — a notebook cell: all of them, in order, run as one
  ``python-local`` script here and in a real kernel by ``tests/test_notebook.py``;
- ``.. readme-test: set-up`` — a set-up command for a fresh machine, run verbatim by
  ``.ci/run`` in a fresh venv (``.ci/readme_commands.py`` reads it from here);
- ``.. readme-test: pytest-doubles`` — a user's pytest module, run by pytest with this
  package's plugin (its fixtures ``e2b_server`` and ``kubernetes_server``); it must pass;
- ``.. readme-test: not-run <reason>`` — shown, not run (an install line, output, a
  cloud account), and the reason is required.

An example that runs checks its result, not only that it ends well: its code asserts, or
its note says what it prints (``.. readme-test: python-local prints "exit 0"``), and the
runner looks for each text in its standard output.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from piship_remote.local import LocalE2bService
from piship_remote.testing import KubernetesServer
from tests.support.optional_peers import install_hint
from tests.support.readme import ALL, EVAL_SCRIPT, MAKEFILE, ROOT, Example

KINDS = {
    "python-local",
    "python-local-otel",
    "python-e2b-sdk",
    "python-k8s-double",
    "shell-local",
    "notebook-local",
    "pytest-doubles",
    "set-up",
    "not-run",
}
RUNS = {"python-local", "python-local-otel", "python-e2b-sdk", "python-k8s-double", "shell-local"}
NEEDS_BWRAP = pytest.mark.skipif(
    LocalE2bService.check() is not None, reason=f"no local service here: {LocalE2bService.check()}"
)
EXAMPLE_TIMEOUT = 120
NOTEBOOK = Example(
    line=next((e.line for e in ALL if e.kind == "notebook-local"), 0),
    kind="python-local",
    note="the Notebooks section's cells, in order",
    code="\n\n".join(e.code for e in ALL if e.kind == "notebook-local"),
)


def test_every_example_says_how_it_is_checked() -> None:
    unmarked = [str(example) for example in ALL if example.kind not in KINDS]
    assert unmarked == [], "add a '.. readme-test: KIND' comment before each example"


def test_every_example_that_runs_checks_its_result() -> None:
    running = [*(e for e in ALL if e.kind in RUNS), NOTEBOOK]
    unchecked = [str(e) for e in running if not e.prints and "assert " not in e.code]
    assert unchecked == [], 'assert in the example, or note what it prints: prints "..."'


def test_the_readme_has_notebook_cells() -> None:
    assert NOTEBOOK.line > 0 and "SandboxPool" in NOTEBOOK.code


def test_every_example_that_is_not_run_says_why() -> None:
    silent = [str(e) for e in ALL if e.kind == "not-run" and not e.note]
    assert silent == []


def test_the_readme_gives_both_set_up_commands() -> None:
    assert [e.code for e in ALL if e.kind == "set-up"] == [
        "python -m pip install '.[local]' && python -m piship_remote demo",
        "python -m pip install -e '.[test]' && python -m pytest",
    ]


def test_ci_runs_the_set_up_commands_the_readme_gives() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "readme_commands.py")],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert done.stdout.splitlines() == [e.code for e in ALL if e.kind == "set-up"]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A newcomer's project: a Makefile whose test target writes a result file, and the
    notebook's evaluation script."""
    path = tmp_path_factory.mktemp("project")
    (path / "Makefile").write_text(MAKEFILE)
    (path / "eval.py").write_text(EVAL_SCRIPT)
    return path


def _run(example: Example, env: dict[str, str], cwd: Path) -> None:
    environ = {**_clean_environ(), **env}
    if example.kind.startswith("python"):
        argv = [sys.executable, "-c", example.code]
        done = subprocess.run(
            argv,
            cwd=cwd,
            env=environ,
            capture_output=True,
            text=True,
            timeout=EXAMPLE_TIMEOUT,
            check=False,
        )
        assert done.returncode == 0, f"{example} failed:\n{done.stdout}\n{done.stderr}"
        _check_prints(example, done.stdout)
        return
    printed = []
    for command in _shell_lines(example.code):
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=cwd,
            env=environ,
            capture_output=True,
            text=True,
            timeout=EXAMPLE_TIMEOUT,
            check=False,
        )
        assert done.returncode == 0, f"{example}: {command!r} failed:\n{done.stdout}\n{done.stderr}"
        printed.append(done.stdout)
    _check_prints(example, "".join(printed))


def _check_prints(example: Example, stdout: str) -> None:
    missing = [text for text in example.prints if text not in stdout]
    assert missing == [], f"{example} did not print {missing}:\n{stdout[-4000:]}"


def _shell_lines(code: str) -> list[str]:
    return [
        line[2:].split("  #", 1)[0].strip() for line in code.splitlines() if line.startswith("$ ")
    ]


def _clean_environ() -> dict[str, str]:
    """The settings an example runs with: its ``piship-remote`` (anywhere on a line, a pipe's
    far end included) is this interpreter's, activated or not (``.venv/bin/python -m pytest``)."""
    keep = ("PATH", "HOME", "LANG", "SYSTEMROOT", "TMPDIR")
    env = {name: os.environ[name] for name in keep if name in os.environ}
    env["PATH"] = os.pathsep.join([sysconfig.get_path("scripts"), env.get("PATH", os.defpath)])
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    # The environment the tests run in, as `activate` leaves it: a README line may name
    # $VIRTUAL_ENV, or run piship-remote anywhere in a pipeline.
    env["VIRTUAL_ENV"] = sys.prefix
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    return env


def test_a_piped_command_line_runs_this_interpreters_piship_remote(tmp_path: Path) -> None:
    # As with `.venv/bin/python -m pytest`: the venv's bin directory is not on PATH.
    scripts = sysconfig.get_path("scripts")
    inherited = os.pathsep.join(
        p for p in os.environ.get("PATH", os.defpath).split(os.pathsep) if p != scripts
    )
    example = Example(0, "shell-local", "", "$ printf 'x\\n' | piship-remote --help >/dev/null\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", inherited)
        _run(example, {}, tmp_path)


@NEEDS_BWRAP
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "example", [e for e in ALL if e.kind in ("python-local", "shell-local")], ids=str
)
def test_a_local_example_runs(example: Example, project: Path) -> None:
    _run_on_the_local_service(example, project)


@NEEDS_BWRAP
@pytest.mark.timeout(600)
def test_the_notebook_cells_run_in_order_as_a_script(project: Path) -> None:
    _run_on_the_local_service(NOTEBOOK, project)


@NEEDS_BWRAP
@pytest.mark.timeout(600)
@pytest.mark.parametrize("example", [e for e in ALL if e.kind == "python-local-otel"], ids=str)
def test_an_observability_example_runs(example: Example, project: Path) -> None:
    pytest.importorskip("opentelemetry.sdk", reason=install_hint("otel") + " opentelemetry-sdk")
    _run_on_the_local_service(example, project)


def _run_on_the_local_service(example: Example, project: Path) -> None:
    with LocalE2bService() as service:
        env = {
            "PISHIP_E2B_ENDPOINT": service.url,
            "PISHIP_E2B_ENVD_URL": service.envd_url,
            "E2B_API_KEY": service.api_key,
        }
        _run(example, env, project)
        assert service.sandboxes() == []


@NEEDS_BWRAP
@pytest.mark.interop
@pytest.mark.timeout(300)
@pytest.mark.parametrize("example", [e for e in ALL if e.kind == "python-e2b-sdk"], ids=str)
def test_an_official_sdk_example_runs(example: Example, project: Path) -> None:
    pytest.importorskip("e2b", reason=install_hint("interop"))
    with LocalE2bService() as service:
        env = {
            "E2B_API_URL": service.url,
            "E2B_SANDBOX_URL": service.envd_url,
            "E2B_API_KEY": service.api_key,
            "NO_PROXY": "127.0.0.1,localhost,::1",
        }
        _run(example, env, project)
        assert service.sandboxes() == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("example", [e for e in ALL if e.kind == "python-k8s-double"], ids=str)
def test_a_kubernetes_example_runs_against_the_double(example: Example, project: Path) -> None:
    with KubernetesServer(lambda command: {"stdout": "Python 3.12.0\n", "exit_code": 0}) as mock:
        env = {
            "PISHIP_K8S_API": mock.url,
            "PISHIP_K8S_ROUTER": mock.url,
            "PISHIP_K8S_TEMPLATE": "python-pool",
            "PISHIP_K8S_NAMESPACE": "agents",
        }
        _run(example, env, project)
        assert mock.live_claims == []


@pytest.mark.timeout(300)
@pytest.mark.parametrize("example", [e for e in ALL if e.kind == "pytest-doubles"], ids=str)
def test_a_pytest_example_passes_on_the_doubles(example: Example, tmp_path: Path) -> None:
    (tmp_path / "test_users_code.py").write_text(example.code, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_users_code.py"],
        cwd=tmp_path,
        env=_clean_environ(),
        capture_output=True,
        text=True,
        timeout=EXAMPLE_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, f"{example} failed:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
    assert " passed" in done.stdout
