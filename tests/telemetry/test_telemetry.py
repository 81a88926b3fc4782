"""OpenTelemetry spans and metrics (the ``otel`` extra), on the E2B double, with the SDK's
in-memory exporter and reader; none of them carries a secret."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from piship_remote import (
    CommandTimeout,
    E2bCompatibleBackend,
    PiShipError,
    SandboxPool,
    activate_sandbox,
)
from piship_remote.model.redact import Redactor
from piship_remote.telemetry import Telemetry, names, trace_headers
from piship_remote.testing import E2bServer
from tests.support.host_secrets import HOST_SECRETS
from tests.support.optional_peers import install_hint
from tests.support.pool import exit_as_asked
from tests.support.telemetry import Recorded, total

pytestmark = pytest.mark.timeout(60)

API_KEY = "e2b-key-telemetry-0123456789"
COMMAND_MARK = "command-text-mark-7f3a"
ARGUMENT_MARK = "argument-mark-91c2"
ENV_MARK = "env-value-mark-55d0"
CONTENT_MARK = "file-content-mark-c4e8"
SECRETS = (*HOST_SECRETS, API_KEY, COMMAND_MARK, ARGUMENT_MARK, ENV_MARK, CONTENT_MARK)
POLICY = {"required": True, "network": {"mode": "deny"}, "environment": {"allow": ["KEEP"]}}
HOST_ENV = {"KEEP": ENV_MARK, "AWS_SECRET_ACCESS_KEY": "aws-never-in-remote-backends"}
START_PATH = "/process.Process/Start"
E2bFactory = Callable[..., E2bServer]


@pytest.fixture
def server(e2b_server: E2bFactory) -> E2bServer:
    return e2b_server(command=exit_as_asked, distinct_ids=True)


@pytest.fixture
def backend(server: E2bServer) -> Iterator[E2bCompatibleBackend]:
    with E2bCompatibleBackend(
        endpoint=server.url, envd_url=server.url, credential=lambda: API_KEY
    ) as backend:
        yield backend


@pytest.fixture
def workspace_files(workspace: Path) -> Path:
    (workspace / "notes.txt").write_text(CONTENT_MARK)
    return workspace


def _by_name(otel: Recorded, name: str) -> list[Any]:
    spans = otel.spans(name)
    assert spans, f"no {name} span among {[s.name for s in otel.spans()]}"
    return spans


def _everything(backend: E2bCompatibleBackend, workspace: Path) -> None:
    """An activation with a push, commands, a push and pull, file transfers, a pool map."""
    with activate_sandbox(
        POLICY, backend=backend, workspace=workspace, env=HOST_ENV, sync="push"
    ) as sandbox:
        sandbox.run(f"echo {COMMAND_MARK}", env=HOST_ENV)
        sandbox.run(["printf", ARGUMENT_MARK, "exit-with-3"])
        sandbox.push()
        sandbox.pull()
        sandbox.files.write("/tmp/x.txt", CONTENT_MARK)
        assert sandbox.files.read("/tmp/x.txt") == CONTENT_MARK.encode()
    with SandboxPool(POLICY, backend=backend, workspace=workspace, env=HOST_ENV, size=2) as pool:
        pool.map(f"echo {COMMAND_MARK} {{item}}", ["a", "b", "c"])


def test_an_activation_has_a_span_with_its_steps_as_children(otel, backend, workspace_files):
    _everything(backend, workspace_files)
    [activation] = [s for s in _by_name(otel, names.ACTIVATION_SPAN) if s.parent is None][:1]
    steps = [s for s in otel.spans() if s.parent and s.parent.span_id == activation.context.span_id]
    assert [s.name for s in steps] == [names.STEP_SPANS[k] for k in names.STEP_SPANS]
    assert activation.attributes[names.BACKEND] == "e2b-compatible"
    assert activation.attributes[names.SANDBOX_ID].startswith("sbx")
    assert activation.attributes[names.OUTCOME] == "ok"
    push_step = next(s for s in steps if s.name == names.STEP_SPANS["push"])
    step_id = push_step.context.span_id
    [push] = [s for s in otel.spans(names.PUSH_SPAN) if s.parent and s.parent.span_id == step_id]
    assert push.attributes[names.BYTES] == len(CONTENT_MARK)


def test_commands_have_spans_with_exit_code_and_outcome(otel, backend, workspace_files):
    _everything(backend, workspace_files)
    commands = _by_name(otel, names.COMMAND_SPAN)
    codes = {s.attributes[names.EXIT_CODE]: s.attributes[names.OUTCOME] for s in commands}
    assert codes == {0: "ok", 3: "failed"}
    assert all(s.attributes[names.SANDBOX_ID].startswith("sbx") for s in commands)


def test_push_pull_and_file_transfers_have_spans_with_bytes(otel, backend, workspace_files):
    _everything(backend, workspace_files)
    [_at_activation, push] = _by_name(otel, names.PUSH_SPAN)
    [pull] = _by_name(otel, names.PULL_SPAN)
    assert (push.attributes[names.DIRECTION], push.attributes[names.BYTES]) == (
        "upload",
        len(CONTENT_MARK),
    )
    assert pull.attributes[names.DIRECTION] == "download"
    transfers = _by_name(otel, names.TRANSFER_SPAN)
    assert sorted(
        (s.attributes[names.DIRECTION], s.attributes[names.BYTES]) for s in transfers
    ) == [
        ("download", len(CONTENT_MARK)),
        ("upload", len(CONTENT_MARK)),
    ]


def test_each_pool_task_has_a_span_with_its_outcome_sandbox_and_attempts(
    otel, backend, workspace_files
):
    _everything(backend, workspace_files)
    tasks = _by_name(otel, names.POOL_TASK_SPAN)
    assert len(tasks) == 3
    for task in tasks:
        assert task.attributes[names.OUTCOME] == "ok"
        assert task.attributes[names.ATTEMPTS] == 1
        assert task.attributes[names.SANDBOX_ID].startswith("sbx")


def test_an_idle_sandboxs_keepalive_renewal_has_a_span(otel, server, workspace):
    with (
        E2bCompatibleBackend(
            endpoint=server.url, envd_url=server.url, credential=lambda: API_KEY, lifetime_seconds=1
        ) as backend,
        activate_sandbox(POLICY, backend=backend, workspace=workspace, env={}) as sandbox,
    ):
        renewals = otel.wait_for(names.LEASE_RENEW_SPAN, timeout=10.0)
        assert renewals, "no keepalive renewal within 10 s of a 1 s lifetime"
        assert renewals[0].attributes[names.SANDBOX_ID] == sandbox.id
        assert renewals[0].attributes[names.OUTCOME] == "ok"


def test_a_commands_renewal_is_part_of_its_command_span(otel, server, backend, workspace):
    with activate_sandbox(POLICY, backend=backend, workspace=workspace, env={}) as sandbox:
        otel.clear()
        sandbox.run("true")
    [command] = _by_name(otel, names.COMMAND_SPAN)
    assert otel.spans(names.LEASE_RENEW_SPAN) == []  # an hour's lifetime: no keepalive yet
    [*_, renewal] = [r for r in server.requests if r.path.endswith("/timeout")]
    assert f"-{command.context.span_id:016x}-" in renewal.headers["traceparent"]


def test_the_metrics_have_their_names_units_and_attributes(otel, backend, workspace_files):
    _everything(backend, workspace_files)
    found = otel.metrics()
    expected = {
        "piship.sandbox.activation.duration": "s",
        "piship.command.duration": "s",
        "piship.pool.task.duration": "s",
        "piship.command.outcomes": "{command}",
        "piship.transfer.io": "By",
        "piship.sandbox.active": "{sandbox}",
    }
    assert {name: found[name].unit for name in expected if name in found} == expected
    assert total(otel, "piship.command.outcomes", piship__outcome="failed") >= 1
    assert total(otel, "piship.transfer.io", piship__transfer__direction="upload") >= 3 * len(
        CONTENT_MARK
    )


def test_a_disposed_sandbox_is_no_longer_counted_active(otel, backend, workspace_files):
    before = total(otel, "piship.sandbox.active")
    sandbox = activate_sandbox(POLICY, backend=backend, workspace=workspace_files, env={})
    assert total(otel, "piship.sandbox.active") == before + 1
    sandbox.dispose()
    sandbox.dispose()
    assert total(otel, "piship.sandbox.active") == before


def test_no_span_or_metric_carries_a_command_argument_value_content_or_credential(
    otel, backend, workspace_files
):
    _everything(backend, workspace_files)
    texts = list(otel.texts())
    assert texts
    assert [s for s in SECRETS for text in texts if s in text] == []


def test_a_timed_out_command_says_so_without_its_message(otel, server, backend, workspace):
    with activate_sandbox(POLICY, backend=backend, workspace=workspace, env={}) as sandbox:
        server.faults.stall(START_PATH, seconds=2.0)
        with pytest.raises(CommandTimeout):
            sandbox.run(f"echo {COMMAND_MARK}", timeout=0.2)
    [span] = [s for s in _by_name(otel, names.COMMAND_SPAN) if names.ERROR_TYPE in s.attributes]
    assert span.attributes[names.OUTCOME] == "timeout"
    assert span.status.description == span.attributes[names.ERROR_TYPE] == "CommandTimeout"
    assert span.events == ()


def test_a_callers_span_is_the_parent_of_pool_task_spans(otel, backend, workspace):
    from opentelemetry import trace

    with SandboxPool(POLICY, backend=backend, workspace=workspace, env={}, size=2) as pool:
        with trace.get_tracer("app").start_as_current_span("caller") as caller:
            pool.map("echo {item}", [1, 2, 3])
    tasks = _by_name(otel, names.POOL_TASK_SPAN)
    assert {s.parent.span_id for s in tasks} == {caller.get_span_context().span_id}
    commands = _by_name(otel, names.COMMAND_SPAN)
    task_ids = {s.context.span_id for s in tasks}
    assert {s.parent.span_id for s in commands} <= task_ids


def test_a_callable_tasks_commands_are_children_of_its_task_span(otel, backend, workspace):
    from opentelemetry import trace

    with SandboxPool(POLICY, backend=backend, workspace=workspace, env={}, size=2) as pool:
        with trace.get_tracer("app").start_as_current_span("caller"):
            pool.map(lambda sandbox, item: sandbox.run(f"echo {item}"), [1, 2])
    tasks = {s.context.span_id for s in _by_name(otel, names.POOL_TASK_SPAN)}
    commands = _by_name(otel, names.COMMAND_SPAN)
    assert len(tasks) == 2
    assert {s.parent.span_id for s in commands} == tasks


def test_a_callers_span_reaches_the_main_thread_worker(otel, server, backend, workspace):
    from opentelemetry import trace

    # A program with its own SIGINT handler makes the main thread hand calls to a worker.
    previous = signal.signal(signal.SIGINT, lambda *_: None)
    try:
        with activate_sandbox(POLICY, backend=backend, workspace=workspace, env={}) as sandbox:
            otel.clear()
            with trace.get_tracer("app").start_as_current_span("caller"):
                sandbox.run("echo on-a-worker")
    finally:
        signal.signal(signal.SIGINT, previous)
    [command] = _by_name(otel, names.COMMAND_SPAN)
    [*_, renewal] = [r for r in server.requests if r.path.endswith("/timeout")]
    # The renewal is sent on piship-exec-N, in the command span's context.
    assert f"-{command.context.span_id:016x}-" in renewal.headers["traceparent"]


def test_traceparent_goes_to_the_control_plane_only(otel, server, backend, workspace):
    from opentelemetry import trace

    with trace.get_tracer("app").start_as_current_span("caller") as caller:
        with activate_sandbox(POLICY, backend=backend, workspace=workspace, env={}) as sandbox:
            sandbox.run("env")
    trace_id = format(caller.get_span_context().trace_id, "032x")
    control = [r for r in server.requests if r.path.startswith("/sandboxes")]
    envd = [r for r in server.requests if not r.path.startswith(("/sandboxes", "/health"))]
    assert control and envd
    assert all(trace_id in r.headers.get("traceparent", "") for r in control)
    assert [r.path for r in envd if "traceparent" in r.headers] == []
    assert all(b"traceparent" not in r.body.lower() for r in envd)


def test_refused_creates_are_counted_with_their_retries(otel, server, backend, workspace):
    refusals = total(otel, "piship.sandbox.create.refusals", http__response__status_code=429)
    retries = total(otel, "piship.sandbox.create.retries")
    server.faults.fail_creates(2, status=429, retry_after=0)
    with activate_sandbox(POLICY, backend=backend, workspace=workspace, env={}):
        pass
    assert total(otel, "piship.sandbox.create.refusals", http__response__status_code=429) == (
        refusals + 2
    )
    assert total(otel, "piship.sandbox.create.retries") == retries + 2


def test_a_warm_pool_activates_under_the_span_that_made_the_pool(otel, backend, workspace):
    from opentelemetry import trace

    with trace.get_tracer("app").start_as_current_span("caller") as caller:
        pool = SandboxPool(POLICY, backend=backend, workspace=workspace, env={}, size=1, warm=1)
    with pool:
        pool.map("echo {item}", [1])
    activations = _by_name(otel, names.ACTIVATION_SPAN)
    assert {s.parent.span_id for s in activations} == {caller.get_span_context().span_id}


def test_a_command_whose_outcome_is_unknown_says_so_in_its_span_and_log(
    otel, server, backend, workspace, caplog
):
    caplog.set_level(logging.INFO, logger="piship_remote")
    with activate_sandbox(POLICY, backend=backend, workspace=workspace, env={}) as sandbox:
        server.faults.drop_stream_after_output()
        with pytest.raises(PiShipError):
            sandbox.run("echo some output")
    [span] = [s for s in _by_name(otel, names.COMMAND_SPAN) if names.ERROR_TYPE in s.attributes]
    assert span.attributes[names.OUTCOME] == "unknown"
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any(m.startswith("a command's outcome is unknown") for m in said)


def test_each_started_command_has_a_span_ended_with_its_exit_code(otel, backend, workspace):
    with activate_sandbox(POLICY, backend=backend, workspace=workspace, env={}) as sandbox:
        otel.clear()
        handles = [sandbox.start(f"exit-with-{code}") for code in (0, 4, 0, 4)]
        results = [handle.wait(timeout=10) for handle in handles]
    assert [r.exit_code for r in results] == [0, 4, 0, 4]
    commands = _by_name(otel, names.COMMAND_SPAN)
    assert sorted(s.attributes[names.EXIT_CODE] for s in commands) == [0, 0, 4, 4]
    assert {s.attributes[names.OUTCOME] for s in commands} == {"ok", "failed"}


def test_a_started_command_whose_outcome_is_unknown_is_logged_when_nothing_is_recorded(
    server, backend, workspace, caplog
):
    context = pytest.importorskip("opentelemetry.context", reason=install_hint("otel"))
    caplog.set_level(logging.INFO, logger="piship_remote")
    suppressed = context.set_value(context._SUPPRESS_INSTRUMENTATION_KEY, True)
    token = context.attach(suppressed)  # OpenTelemetry's suppress_instrumentation
    try:
        with activate_sandbox(POLICY, backend=backend, workspace=workspace, env={}) as sandbox:
            server.faults.drop_stream_after_output()
            handle = sandbox.start("echo some output")
            with pytest.raises(PiShipError):
                handle.wait(timeout=10)
    finally:
        context.detach(token)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any(m.startswith("a command's outcome is unknown") for m in said)


def test_a_sandbox_id_holding_a_registered_secret_is_redacted_in_spans(otel):
    redactor = Redactor()
    redactor.register("s3cr3t-in-an-id")
    telemetry = Telemetry.load("e2b-compatible", redactor)
    with telemetry.span(names.COMMAND_SPAN, "sbx-s3cr3t-in-an-id") as span:
        span.set(names.DIRECTION, "upload s3cr3t-in-an-id")
    [recorded] = otel.spans(names.COMMAND_SPAN)
    assert recorded.attributes[names.SANDBOX_ID] == "sbx-[REDACTED]"
    assert recorded.attributes[names.DIRECTION] == "upload [REDACTED]"


def test_traceparent_is_the_w3c_header_of_the_current_span(otel):
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    assert trace_headers() == {}
    with trace.get_tracer("app").start_as_current_span("caller"):
        expected: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(expected)
        assert trace_headers() == {"traceparent": expected["traceparent"]}
