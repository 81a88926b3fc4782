"""Errors by kind: a subclass of PiShipError per code, in ``piship_remote.errors`` (DESIGN §1.2)."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import piship_remote
import piship_remote.errors as errors
from piship_remote import E2bCompatibleBackend, SandboxPolicy, activate_sandbox
from piship_remote.cli._preflight import ChecksFailed
from piship_remote.model.errors import ERROR_CLASSES, ERROR_CODES, error_for
from piship_remote.testing import E2bServer
from piship_remote.transport import TransportError

PACKAGE = Path(piship_remote.__file__).parent
E2bFactory = Callable[..., E2bServer]


def _class_name(code: str) -> str:
    return "".join(word.capitalize() for word in code.split("_"))


@pytest.mark.parametrize("code", sorted(ERROR_CODES))
def test_every_code_has_a_subclass_named_after_it(code: str) -> None:
    error_class = ERROR_CLASSES[code]

    assert error_class.__name__ == _class_name(code)
    assert issubclass(error_class, errors.PiShipError)
    assert getattr(errors, error_class.__name__) is error_class


@pytest.mark.parametrize("code", sorted(set(ERROR_CODES) - {"COMMAND_FAILED"}))
def test_a_subclass_keeps_its_code_and_is_caught_as_a_pi_ship_error(code: str) -> None:
    with pytest.raises(errors.PiShipError) as caught:
        raise ERROR_CLASSES[code]("what went wrong", retryable=True, component="sandbox")

    assert caught.value.code == code
    assert (str(caught.value), caught.value.retryable) == ("what went wrong", True)
    assert caught.value.to_dict()["code"] == code


def test_sandbox_unavailable_is_caught_by_its_own_class() -> None:
    with pytest.raises(errors.SandboxUnavailable):
        raise errors.SandboxUnavailable("gone")


def test_config_invalid_is_also_a_value_error() -> None:
    with pytest.raises(ValueError, match="size"):
        raise errors.ConfigInvalid("size must be at least 1")


def test_the_factory_gives_the_class_of_a_code_known_at_run_time() -> None:
    error = error_for("NETWORK_DENIED", "no network", user_action="allow it")

    assert type(error) is errors.NetworkDenied
    assert (error.code, error.user_action) == ("NETWORK_DENIED", "allow it")


def test_the_factory_gives_a_plain_pi_ship_error_for_a_code_without_a_class() -> None:
    error = error_for("SOMETHING_NEW", "new")

    assert type(error) is errors.PiShipError and error.code == "SOMETHING_NEW"


def test_a_command_failed_without_a_result_carries_its_message() -> None:
    error = errors.CommandFailed("cannot write to the command: it has ended")

    assert (error.code, error.result, error.exit_code) == ("COMMAND_FAILED", None, None)
    assert str(error) == "cannot write to the command: it has ended"


def test_the_errors_module_re_exports_the_package_level_exceptions() -> None:
    for name in ("PiShipError", "CommandTimeout", "CommandCancelled", "CommandFailed"):
        assert getattr(errors, name) is getattr(piship_remote, name)
    assert not issubclass(errors.CommandTimeout, errors.PiShipError)
    assert not issubclass(errors.CommandCancelled, errors.PiShipError)


def test_the_library_s_own_error_kinds_derive_from_their_code_s_class() -> None:
    assert issubclass(TransportError, errors.GatewayUnreachable)
    assert issubclass(ChecksFailed, errors.SandboxUnavailable)


# A command ended by dispose: tests/sandbox/test_unwinding.py pins its exact type.
PLAIN_ON_PURPOSE = {"sandbox/_exec_errors.py"}


def test_the_library_raises_no_bare_pi_ship_error() -> None:
    """Every raising site names its code's class (or uses error_for for a run-time code)."""
    bare = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).as_posix() in {"model/errors.py", *PLAIN_ON_PURPOSE}:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "PiShipError"
            ):
                bare.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")

    assert bare == []


@pytest.fixture
def unhealthy(e2b_server: E2bFactory) -> Iterator[E2bCompatibleBackend]:
    server = e2b_server(health=503)
    with E2bCompatibleBackend(endpoint=server.url, envd_url=server.url) as backend:
        yield backend


def test_a_required_sandbox_that_cannot_be_had_raises_sandbox_unavailable(
    unhealthy: E2bCompatibleBackend, workspace: Path
) -> None:
    with pytest.raises(errors.SandboxUnavailable, match="cannot be enforced") as caught:
        activate_sandbox({"required": True}, backend=unhealthy, workspace=workspace)

    assert caught.value.code == "SANDBOX_UNAVAILABLE"


def test_a_bad_policy_raises_config_invalid() -> None:
    with pytest.raises(errors.ConfigInvalid, match="network"):
        SandboxPolicy.from_dict({"network": {"mode": "sometimes"}})


def test_a_missing_file_raises_file_not_found(
    e2b_server: E2bFactory, workspace: Path
) -> None:
    server = e2b_server()
    with E2bCompatibleBackend(endpoint=server.url, envd_url=server.url) as backend:
        with activate_sandbox({"required": True}, backend=backend, workspace=workspace) as box:
            with pytest.raises(errors.FileNotFound):
                box.files.read("no-such-file")


PUBLIC_METHODS_THAT_RAISE = [
    piship_remote.activate_sandbox,
    piship_remote.Sandbox.exec,
    piship_remote.Sandbox.run,
    piship_remote.Sandbox.start,
    piship_remote.Sandbox.push,
    piship_remote.Sandbox.pull,
    piship_remote.Sandbox.url,
    piship_remote.Sandbox.detach,
    piship_remote.Sandbox.id.fget,
    piship_remote.SandboxFiles.write,
    piship_remote.SandboxFiles.read,
    piship_remote.SandboxFiles.read_text,
    piship_remote.SandboxFiles.list,
    piship_remote.SandboxFiles.exists,
    piship_remote.SandboxFiles.remove,
    piship_remote.SandboxFiles.make_dir,
    piship_remote.SandboxFiles.upload,
    piship_remote.SandboxFiles.download,
    piship_remote.CommandHandle.wait,
    piship_remote.CommandHandle.send_stdin,
    piship_remote.CommandHandle.resize,
    piship_remote.SandboxPool.sandbox,
    piship_remote.SandboxPool.map,
    piship_remote.SandboxPool.imap,
    piship_remote.SandboxPolicy.from_dict,
    piship_remote.E2bCompatibleBackend,
    piship_remote.E2bCompatibleBackend.prepare,
    piship_remote.E2bCompatibleBackend.attach,
    piship_remote.KubernetesAgentSandboxBackend,
    piship_remote.KubernetesAgentSandboxBackend.from_kubeconfig,
    piship_remote.KubernetesAgentSandboxBackend.in_cluster,
    piship_remote.KubernetesAgentSandboxBackend.attach,
    piship_remote.EnvelopeReader.push,
]


@pytest.mark.parametrize(
    "method", PUBLIC_METHODS_THAT_RAISE, ids=lambda m: getattr(m, "__qualname__", str(m))
)
def test_a_public_method_that_raises_lists_what_in_its_docstring(method: object) -> None:
    doc = inspect.getdoc(method) or ""
    section = doc.partition("Raises")[2]

    assert section, f"no Raises: section in {method!r}"
    assert any(name in section for name in (*errors.__all__, "ValueError", "TimeoutError"))
