"""A pool's progress display: a tqdm bar when tqdm is there, plain lines on a terminal
without it, nothing when asked for none or when nobody watches."""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from piship_remote import E2bCompatibleBackend, SandboxPool
from piship_remote.pool._progress import NoProgress, PlainProgress, progress_for
from piship_remote.testing import E2bServer
from tests.support.pool import POLICY

pytestmark = pytest.mark.timeout(30)


class Terminal(io.StringIO):
    """A text stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def without_tqdm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # importing it raises ImportError


def test_progress_false_shows_nothing_even_on_a_terminal() -> None:
    assert isinstance(progress_for(False, 3, Terminal()), NoProgress)


def test_progress_none_shows_nothing_when_nobody_watches() -> None:
    assert isinstance(progress_for(None, 3, io.StringIO()), NoProgress)


@pytest.mark.usefixtures("without_tqdm")
def test_without_tqdm_a_terminal_gets_a_plain_line_per_finished_task() -> None:
    stream = Terminal()
    progress = progress_for(None, 3, stream)
    assert isinstance(progress, PlainProgress)
    for outcome in ("ok", "failed", "infra"):
        progress.started()
        progress.finished(outcome)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[-1].startswith("pool: 3/3 done, 0 running, 1 failed, 1 infra, ")
    assert lines[-1].endswith(" tasks/s")


def test_with_tqdm_a_bar_counts_the_tasks_and_their_outcomes(capsys) -> None:
    pytest.importorskip("tqdm")
    progress = progress_for(True, 2)
    progress.started()
    progress.finished("failed")
    progress.started()
    progress.finished("ok")
    progress.close()
    err = capsys.readouterr().err
    assert "2/2" in err and "failed=1" in err and "task/s" in err


@pytest.mark.usefixtures("without_tqdm")
def test_a_pool_asked_for_progress_reports_each_task(
    e2b_server: Callable[..., E2bServer], workspace: Path, capsys
) -> None:
    server = e2b_server(distinct_ids=True)
    with E2bCompatibleBackend(endpoint=server.url, envd_url=server.url) as backend:
        options: dict[str, Any] = {"size": 2, "progress": True, "env": {}}
        with SandboxPool(POLICY, backend=backend, workspace=workspace, **options) as pool:
            pool.map("echo {item}", range(3))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("pool:")]
    assert len(lines) == 3 and lines[-1].startswith("pool: 3/3 done")


@pytest.fixture
def in_a_notebook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("piship_remote.pool._progress.in_notebook", lambda: True)


@pytest.mark.usefixtures("without_tqdm", "in_a_notebook")
def test_without_tqdm_a_notebook_gets_one_line_rewritten_in_place() -> None:
    stream = io.StringIO()
    progress = progress_for(None, 2, stream)
    for outcome in ("ok", "failed"):
        progress.started()
        progress.finished(outcome)
    progress.close()
    shown = stream.getvalue()
    assert shown.startswith("\rpool: 1/2 done") and shown.endswith(" tasks/s\n")
    assert shown.count("\n") == 1 and "\rpool: 2/2 done, 0 running, 1 failed" in shown


@pytest.mark.usefixtures("without_tqdm", "in_a_notebook")
def test_progress_true_is_never_silent_without_tqdm() -> None:
    assert isinstance(progress_for(True, 1, io.StringIO()), PlainProgress)


@pytest.mark.usefixtures("in_a_notebook")
def test_in_a_notebook_without_ipywidgets_tqdm_draws_text_without_a_warning(
    monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    pytest.importorskip("tqdm")
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # find_spec says it is not there
    progress = progress_for(True, 1)
    progress.started()
    progress.finished("ok")
    progress.close()
    err = capsys.readouterr().err
    assert "1/1" in err and "IProgress" not in err
