"""The metric instruments of one :class:`~piship_remote.telemetry.telemetry.Telemetry`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from piship_remote.telemetry import names

if TYPE_CHECKING:
    from opentelemetry.metrics import Counter, Histogram, Meter

__all__ = ["Instruments"]


class Instruments:
    """The histograms and counters, made once from ``meter`` (the SDK hands the same
    instrument back to every object that asks for the same name)."""

    def __init__(self, meter: Meter) -> None:
        self._meter = meter
        self.activation_duration = self._histogram(names.ACTIVATION_DURATION)
        self.command_duration = self._histogram(names.COMMAND_DURATION)
        self.pool_task_duration = self._histogram(names.POOL_TASK_DURATION)
        self.command_outcomes = self._counter(names.COMMAND_OUTCOMES)
        self.create_refusals = self._counter(names.CREATE_REFUSALS)
        self.create_retries = self._counter(names.CREATE_RETRIES)
        self.transfer_io = self._counter(names.TRANSFER_IO)
        self.active_sandboxes = meter.create_up_down_counter(*names.ACTIVE_SANDBOXES)

    def _histogram(self, spec: tuple[str, str, str]) -> Histogram:
        name, unit, description = spec
        return self._meter.create_histogram(
            name, unit, description, explicit_bucket_boundaries_advisory=names.DURATION_BUCKETS
        )

    def _counter(self, spec: tuple[str, str, str]) -> Counter:
        return self._meter.create_counter(*spec)
