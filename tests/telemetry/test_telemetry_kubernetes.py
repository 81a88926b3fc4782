"""The claim manager's telemetry: a span per claim renewal, and its INFO events (a claim
created, replaced, deleted, or whose renewal was refused)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from piship_remote.backends.kubernetes.claims import ClaimManager
from piship_remote.telemetry import Telemetry, names
from piship_remote.transport._cancel import CancelToken
from tests.support.claims import FakeCluster
from tests.support.seed import Clocks

pytestmark = pytest.mark.timeout(10)


@pytest.fixture
def manager(cluster: FakeCluster, clocks: Clocks) -> Iterator[ClaimManager]:
    """A manager with a 60 s lifetime and the library's telemetry (spans with the SDK)."""
    telemetry = Telemetry.load("kubernetes-agent-sandbox")
    manager = ClaimManager(cluster, clocks.clock(60), keepalive_every=3600, telemetry=telemetry)
    yield manager
    manager.dispose()


def run(manager: ClaimManager) -> str:
    with manager.command(CancelToken()) as use:
        return use.claim.name


def test_a_claim_renewal_has_a_span_with_the_claim_name(otel, manager, cluster, clocks):
    manager.prepare()
    clocks.advance(40)
    run(manager)
    [renewal] = otel.spans(names.CLAIM_RENEW_SPAN)
    assert renewal.attributes[names.SANDBOX_ID] == cluster.created[0]
    assert renewal.attributes[names.BACKEND] == "kubernetes-agent-sandbox"
    assert renewal.attributes[names.OUTCOME] == "ok"


def test_a_claim_created_replaced_and_deleted_is_said_at_info(manager, cluster, caplog):
    caplog.set_level(logging.INFO, logger="piship_remote")
    manager.prepare()
    cluster.gone.add(cluster.created[0])
    run(manager)
    first, second = cluster.created
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert f"SandboxClaim {first} created" in said
    assert f"SandboxClaim {second} created" in said
    assert any(m.startswith(f"SandboxClaim {first} replaced:") for m in said)
    assert f"SandboxClaim {first} deleted" in said


def test_a_refused_keepalive_renewal_is_said_at_info(manager, cluster, caplog):
    caplog.set_level(logging.INFO, logger="piship_remote")
    with manager.command(CancelToken()) as use:
        cluster.gone.add(use.claim.name)
        manager.keepalive_now()
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any(m.startswith(f"renewing SandboxClaim {use.claim.name} was refused") for m in said)
