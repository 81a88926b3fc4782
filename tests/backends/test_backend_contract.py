"""One backend contract (``piship_remote.backends.base``): the protocols with capabilities as
declared attributes, one deadline and one cancel token for every ``exec``."""

from __future__ import annotations

import ast
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest

import piship_remote
from piship_remote import E2bCompatibleBackend, SandboxPool
from piship_remote.backends import base
from piship_remote.backends.e2b._instance import E2bInstance
from piship_remote.backends.kubernetes._instance import KubernetesInstance
from piship_remote.model.errors import CommandTimeout
from piship_remote.sandbox.activation import activate_sandbox
from piship_remote.testing import E2bServer
from piship_remote.transport._cancel import CancelToken
from piship_remote.transport.deadline import Deadline
from tests.sandbox.test_one_deadline import DeadlineBackend, DeadlineInstance

PACKAGE = Path(piship_remote.__file__).parent
E2bFactory = Callable[..., E2bServer]

PROTOCOLS = [
    "CommandInput",
    "Backend",
    "Instance",
    "ServesPorts",
    "SupportsFiles",
    "RemoteFiles",
    "Detachable",
    "Reattachable",
    "Labelled",
]


@pytest.mark.parametrize("name", PROTOCOLS)
def test_the_contract_module_holds_every_protocol(name: str) -> None:
    assert name in base.__all__
    assert getattr(getattr(base, name), "_is_protocol", False)


# The protocols inside one backend, between its own modules (none is implemented by
# another backend).
INTERNAL = {
    "backends/e2b/_control.py:_ExtraConnection",
    "backends/e2b/_lease.py:_Closeable",
    "backends/kubernetes/claims.py:ClaimApi",
}


def test_no_other_module_defines_a_protocol_a_backend_implements() -> None:
    found = []
    for path in sorted((PACKAGE / "backends").rglob("*.py")):
        if path.name in {"base.py", "control.py"}:  # control.py: CommandInput, in base too
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(b, ast.Name) and b.id == "Protocol" for b in node.bases
            ):
                found.append(f"{path.relative_to(PACKAGE)}:{node.name}")

    assert set(found) <= INTERNAL


@pytest.mark.parametrize(
    ("instance", "prompt", "controls"),
    [(E2bInstance, True, True), (KubernetesInstance, True, False)],
)
def test_the_built_in_instances_declare_their_capabilities(
    instance: type, prompt: bool, controls: bool
) -> None:
    assert (instance.cancels_promptly, instance.controls_commands) == (prompt, controls)


def test_an_instance_without_its_capabilities_is_not_an_instance() -> None:
    class Undeclared:
        def exec(self, request: base.ExecRequest, **_: object) -> base.BackendResult:
            return base.BackendResult(0)

        def epoch(self) -> str | None:
            return None

        def dispose(self) -> None:
            return None

    assert not isinstance(Undeclared(), base.Instance)


def test_a_request_carries_no_time_limit_of_its_own() -> None:
    assert "timeout" not in {field.name for field in attrs.fields(base.ExecRequest)}


def test_the_engine_hands_exec_one_deadline_and_one_cancel_token(ws: Path) -> None:
    backend = DeadlineBackend()
    with activate_sandbox({"required": True}, backend=backend, workspace=ws) as sandbox:
        sandbox.exec("true", cancel=threading.Event())
        assert isinstance(backend.instance, DeadlineInstance)
        ((deadline,), (token,)) = (backend.instance.deadlines, backend.instance.tokens)

    assert isinstance(deadline, Deadline) and isinstance(token, CancelToken)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def hanging(e2b_server: E2bFactory) -> Iterator[E2bCompatibleBackend]:
    server = e2b_server(command=lambda start: {"hang": True})
    with E2bCompatibleBackend(endpoint=server.url, envd_url=server.url) as backend:
        yield backend


@pytest.mark.timeout(30)
def test_a_pool_task_s_timeout_is_the_one_its_command_reports(
    hanging: E2bCompatibleBackend, ws: Path
) -> None:
    with SandboxPool({"required": True}, backend=hanging, workspace=ws, size=1) as pool:
        [result] = pool.map("sleep 60 {item}", ["x"], timeout=0.5)

    assert result.outcome == "timeout"
    assert isinstance(result.error, CommandTimeout) and str(result.error) == "timeout:0.5"
