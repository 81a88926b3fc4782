"""What a notebook user sees: results, result lists and sandboxes as HTML tables (escaped)
and readable text, and a closed pool that says why it closed."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from piship_remote import (
    CommandResult,
    E2bCompatibleBackend,
    PiShipError,
    SandboxPool,
    TaskResult,
    TaskResults,
    activate_sandbox,
)
from piship_remote.sandbox import lifecycle
from piship_remote.testing import E2bServer
from tests.support.pool import POLICY

pytestmark = pytest.mark.timeout(30)

MARKUP = "<script>alert('x')</script>"


def task_result(item: Any, outcome: str, value: Any = None, error: Any = None) -> TaskResult:
    return TaskResult(item, value, error, outcome, "sbx-1", 1, 0.25)


@pytest.fixture
def backend(e2b_server: Callable[..., E2bServer]) -> Iterator[E2bCompatibleBackend]:
    server = e2b_server(distinct_ids=True)
    with E2bCompatibleBackend(endpoint=server.url, envd_url=server.url) as made:
        yield made


def test_a_command_result_renders_as_an_escaped_table() -> None:
    shown = CommandResult(1, f"out {MARKUP}", "err & more")._repr_html_()
    assert "<table>" in shown and "exit code" in shown
    assert MARKUP not in shown and "&lt;script&gt;" in shown
    assert "err &amp; more" in shown


def test_a_long_command_result_shows_the_end_of_its_output() -> None:
    result = CommandResult(0, "x" * 100_000 + "THE END", "")
    assert len(repr(result)) < 3000
    assert "THE END" in repr(result) and "THE END" in result._repr_html_()
    assert "characters before" in repr(result)


def test_a_short_command_result_reads_as_its_fields() -> None:
    assert (
        repr(CommandResult(0, "hi\n", ""))
        == "CommandResult(exit_code=0, stdout='hi\\n', stderr='')"
    )


def test_a_task_result_renders_its_outcome_and_error_escaped() -> None:
    shown = task_result(MARKUP, "failed", error=ValueError("bad <b>"))._repr_html_()
    assert "failed" in shown and "ValueError: bad &lt;b&gt;" in shown
    assert MARKUP not in shown and "<b>" not in shown


def test_a_result_list_counts_the_outcomes_and_shows_the_failures_first() -> None:
    results = TaskResults(
        [
            task_result("a", "ok", CommandResult(0, "fine\n", "")),
            task_result("b", "failed", CommandResult(2, "", "broke\n")),
            task_result("c", "ok", CommandResult(0, "fine\n", "")),
            task_result("d", "infra", error=PiShipError("SANDBOX_UNAVAILABLE", "no sandbox")),
        ]
    )
    assert results.counts() == {"ok": 2, "failed": 1, "infra": 1}
    assert [r.item for r in results.failures()] == ["b", "d"]
    shown = results._repr_html_()
    assert "4 tasks: 2 ok, 1 failed, 1 infra" in shown
    assert shown.index("&#x27;b&#x27;") < shown.index("&#x27;a&#x27;")
    assert "exit 2: broke" in shown


def test_a_result_list_reads_as_a_summary_and_a_table_in_text() -> None:
    pytest.importorskip("IPython")
    from IPython.lib.pretty import pretty

    results = TaskResults([task_result(1, "ok"), task_result(2, "timeout")])
    lines = pretty(results).splitlines()
    assert lines[0] == "2 tasks: 1 ok, 1 timeout"
    assert lines[1].split() == ["item", "outcome", "detail", "sandbox", "attempts", "seconds"]
    assert lines[2].split()[:2] == ["2", "timeout"]


def test_a_result_list_is_still_a_list() -> None:
    results = TaskResults([task_result(1, "ok")])
    assert isinstance(results, list) and results == [task_result(1, "ok")]


def test_map_returns_a_result_list(backend: E2bCompatibleBackend, workspace: Path) -> None:
    with SandboxPool(POLICY, backend=backend, workspace=workspace, size=2, env={}) as pool:
        results = pool.map("echo {item}", ["a", "b"])
    assert isinstance(results, TaskResults) and results.counts() == {"ok": 2}


def test_a_sandbox_shows_its_id_backend_and_state(
    backend: E2bCompatibleBackend, workspace: Path
) -> None:
    sandbox = activate_sandbox(POLICY, backend=backend, workspace=workspace, env={})
    with sandbox:
        assert repr(sandbox) == f"<Sandbox {sandbox.id} e2b-compatible active>"
        shown = sandbox._repr_html_()
        assert sandbox.id in shown and "e2b-compatible" in shown and "active" in shown
    assert sandbox.state == "disposed" and repr(sandbox).endswith(" disposed>")


def test_a_detached_sandbox_says_so(backend: E2bCompatibleBackend, workspace: Path) -> None:
    sandbox = activate_sandbox(POLICY, backend=backend, workspace=workspace, env={})
    sandbox_id = sandbox.detach()
    assert repr(sandbox) == f"<Sandbox {sandbox_id} e2b-compatible detached>"
    activate_sandbox(POLICY, backend=backend, workspace=workspace, attach=sandbox_id).dispose()


def test_a_pool_closed_by_its_caller_says_so_and_that_a_new_one_is_needed(
    backend: E2bCompatibleBackend, workspace: Path
) -> None:
    pool = SandboxPool(POLICY, backend=backend, workspace=workspace, size=1, env={})
    pool.close()
    with pytest.raises(PiShipError) as raised:
        pool.map("echo {item}", [1])
    assert "closed by the caller" in str(raised.value)
    assert raised.value.user_action == "Make a new SandboxPool to run more tasks"
    assert "closed by the caller" in repr(pool) and "new SandboxPool" in repr(pool)


@pytest.mark.usefixtures("ctrl_c")
def test_an_interrupted_pool_says_it_was_interrupted(
    e2b_server: Callable[..., E2bServer], workspace: Path
) -> None:
    arrived = threading.Event()

    def hang(start: Any) -> dict[str, Any]:
        arrived.set()
        return {"hang": True}

    server = e2b_server(command=hang, distinct_ids=True)
    interrupter = threading.Thread(
        target=lambda: arrived.wait(10) and os.kill(os.getpid(), signal.SIGINT), daemon=True
    )
    with E2bCompatibleBackend(endpoint=server.url, envd_url=server.url) as backend:
        pool = SandboxPool(POLICY, backend=backend, workspace=workspace, size=1, env={})
        interrupter.start()
        with pytest.raises(KeyboardInterrupt) as raised:
            pool.map("sleep 600 # {item}", [1])
        assert "running commands were killed" in str(raised.value)
        with pytest.raises(PiShipError, match="interrupted"):
            pool.map("echo {item}", [1])


def test_a_pool_closed_at_a_signal_names_it(backend: E2bCompatibleBackend, workspace: Path) -> None:
    previous = signal.getsignal(signal.SIGUSR1)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # after the cleanup: no default action
    try:
        lifecycle.cleanup_on_signals([signal.SIGUSR1])
        pool = SandboxPool(POLICY, backend=backend, workspace=workspace, size=1, env={})
        signal.raise_signal(signal.SIGUSR1)
        with pytest.raises(PiShipError, match="closed on SIGUSR1"):
            pool.map("echo {item}", [1])
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_report_shown_says_when_no_workspace_file_was_sent(
    backend: E2bCompatibleBackend, workspace: Path
) -> None:
    with activate_sandbox(POLICY, backend=backend, workspace=workspace, env={}) as sandbox:
        shown = sandbox.report._repr_html_()
    assert "none sent: the sandbox starts without this workspace&#x27;s files" in shown


def test_a_report_shown_after_a_push_says_what_went(
    backend: E2bCompatibleBackend, workspace: Path
) -> None:
    options: dict[str, Any] = {"env": {}, "sync": "push"}
    with activate_sandbox(POLICY, backend=backend, workspace=workspace, **options) as sandbox:
        shown = sandbox.report._repr_html_()
    assert "none sent" not in shown and "synced" in shown
