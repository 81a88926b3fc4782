"""The official E2B Python SDK's control-plane calls against the local service: connect's
timeout rule, list filters, idempotent creates, forks, snapshots and the auto-pause
variants, each as the SDK's own suite checks it.

The SDK is pointed at loopback with ``api_url`` and ``sandbox_url``; nothing leaves
the machine. Polls wait for what they expect, with a deadline.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import attrs
import pytest
from optional_peers import install_hint

pytest.importorskip("e2b", reason=install_hint("interop"))

from e2b import Sandbox, SandboxQuery

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]


@attrs.frozen
class Target:
    url: str
    api_key: str

    def options(self) -> dict[str, object]:
        return {"api_key": self.api_key, "api_url": self.url, "request_timeout": 10}

    def create(self, *args: object, **extra: object) -> Sandbox:
        return Sandbox.create(*args, sandbox_url=self.url, **self.options(), **extra)  # type: ignore[arg-type]

    def connect(self, sandbox_id: str, **extra: object) -> Sandbox:
        return Sandbox.connect(sandbox_id, sandbox_url=self.url, **self.options(), **extra)  # type: ignore[arg-type]

    def listed(self, query: SandboxQuery) -> list[str]:
        page = Sandbox.list(query=query, **self.options()).next_items()  # type: ignore[arg-type]
        return [s.sandbox_id for s in page]


@pytest.fixture
def target() -> Iterator[Target]:
    local = pytest.importorskip("piship_remote.local")
    problem = local.LocalE2bService.check()
    if problem is not None:
        pytest.skip(f"LocalE2bService cannot run here: {problem}")
    with local.LocalE2bService() as service:
        yield Target(service.url, service.api_key)


@pytest.fixture
def sandbox(target: Target) -> Iterator[Sandbox]:
    sandbox = target.create(timeout=300)
    yield sandbox
    sandbox.kill()


def test_connect_with_a_shorter_timeout_leaves_the_end_unchanged(
    target: Target, sandbox: Sandbox
) -> None:
    before = sandbox.get_info().end_at
    target.connect(sandbox.sandbox_id, timeout=10)
    assert sandbox.get_info().end_at == before


def test_connect_with_a_longer_timeout_extends_the_end(target: Target, sandbox: Sandbox) -> None:
    before = sandbox.get_info().end_at
    target.connect(sandbox.sandbox_id, timeout=600)
    assert sandbox.get_info().end_at > before


def test_list_started_after_includes_its_start_and_excludes_a_later_time(
    target: Target, sandbox: Sandbox
) -> None:
    started = sandbox.get_info().started_at
    assert target.listed(SandboxQuery(started_after=started)) == [sandbox.sandbox_id]
    later = started + timedelta(seconds=1)
    assert target.listed(SandboxQuery(started_after=later)) == []


def test_list_template_filter_matches_the_sandbox_template_only(
    target: Target, sandbox: Sandbox
) -> None:
    template = sandbox.get_info().template_id
    assert target.listed(SandboxQuery(template=template)) == [sandbox.sandbox_id]
    assert target.listed(SandboxQuery(template="unknown-template")) == []
