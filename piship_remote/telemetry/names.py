"""The names piship_remote's spans, attributes and metrics carry, and their units.

Metric names follow OpenTelemetry's semantic-convention style (``piship.<thing>.<measure>``,
durations in seconds ``s``, bytes ``By``, counts in ``{unit}`` annotations); attribute keys
reuse the conventions' own where one exists (``error.type``, ``process.exit.code``,
``http.response.status_code``).
"""

from __future__ import annotations

from types import MappingProxyType

__all__ = [
    "ACTIVATION_DURATION",
    "ACTIVATION_SPAN",
    "ACTIVE_SANDBOXES",
    "ATTEMPTS",
    "BACKEND",
    "BYTES",
    "CLAIM_RENEW_SPAN",
    "COMMAND_DURATION",
    "COMMAND_OUTCOMES",
    "COMMAND_SPAN",
    "CREATE_REFUSALS",
    "CREATE_RETRIES",
    "DIRECTION",
    "DURATION_BUCKETS",
    "ERROR_TYPE",
    "EXIT_CODE",
    "HTTP_STATUS",
    "LEASE_RENEW_SPAN",
    "OUTCOME",
    "POOL_TASK_DURATION",
    "POOL_TASK_SPAN",
    "PULL_SPAN",
    "PUSH_SPAN",
    "SANDBOX_ID",
    "SCOPE",
    "STEP_SPANS",
    "TRANSFER_IO",
    "TRANSFER_SPAN",
]

SCOPE = "piship_remote"
"""The instrumentation scope: the tracer's and the meter's name."""

# -- spans ------------------------------------------------------------------------------

ACTIVATION_SPAN = "piship.activate"
STEP_SPANS = MappingProxyType(
    {
        "health": "piship.activate.health",
        "create": "piship.activate.create",
        "readiness": "piship.activate.readiness",
        "push": "piship.activate.push",
    }
)
COMMAND_SPAN = "piship.command"
TRANSFER_SPAN = "piship.files.transfer"
PUSH_SPAN = "piship.push"
PULL_SPAN = "piship.pull"
CLAIM_RENEW_SPAN = "piship.claim.renew"
LEASE_RENEW_SPAN = "piship.lease.renew"
"""An E2B sandbox's keepalive renewal (an idle sandbox's). The renewal every command sends
has no span of its own: it is part of the command's span, whose ``traceparent`` it carries
and whose ``error.type`` its refusal becomes."""
POOL_TASK_SPAN = "piship.pool.task"

# -- attributes -------------------------------------------------------------------------

BACKEND = "piship.backend"
SANDBOX_ID = "piship.sandbox.id"
"""The E2B sandbox id, or the Kubernetes SandboxClaim's name."""
OUTCOME = "piship.outcome"
"""``ok``, ``failed`` (a non-zero exit), ``timeout``, ``cancelled``, ``not-started``,
``unknown`` (the request was sent, what became of it is not known), ``error``,
``unavailable`` (an optional policy that could not be enforced)."""
ERROR_TYPE = "error.type"
EXIT_CODE = "process.exit.code"
BYTES = "piship.transfer.bytes"
DIRECTION = "piship.transfer.direction"
"""``upload`` (host to sandbox) or ``download`` (sandbox to host)."""
ATTEMPTS = "piship.pool.attempts"
HTTP_STATUS = "http.response.status_code"

# -- metrics: (name, unit, description) -------------------------------------------------

ACTIVATION_DURATION = ("piship.sandbox.activation.duration", "s", "How long activations took")
COMMAND_DURATION = ("piship.command.duration", "s", "How long commands ran")
POOL_TASK_DURATION = ("piship.pool.task.duration", "s", "How long pool tasks took")
COMMAND_OUTCOMES = ("piship.command.outcomes", "{command}", "Commands ended, by outcome")
CREATE_REFUSALS = (
    "piship.sandbox.create.refusals",
    "{refusal}",
    "Creates the service refused for capacity (429, 503)",
)
CREATE_RETRIES = ("piship.sandbox.create.retries", "{retry}", "Creates sent again after a refusal")
TRANSFER_IO = ("piship.transfer.io", "By", "Bytes moved between the host and sandboxes")
ACTIVE_SANDBOXES = ("piship.sandbox.active", "{sandbox}", "Sandboxes activated, not yet disposed")

DURATION_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 30.0,
    60.0, 120.0, 300.0, 600.0,
)  # fmt: skip
"""Histogram boundaries in seconds: the SDK's defaults are for milliseconds."""
