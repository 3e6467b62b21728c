"""What a controller sees of the plant and what it may command.

The same two types pass between controllers and every plant representation (fluid model now,
request-level simulator later), so a controller object runs unchanged in both.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

__all__ = ["Measurement", "AdmissionAction", "REJECT_REASONS"]

#: why a request can be rejected (every rejection in every plant carries one of these)
REJECT_REASONS = ("backlog_over_bound", "decode_overloaded", "predicted_slo_violation")


@dataclass(frozen=True)
class Measurement:
    """A sample of the plant as the orchestrator sees it, already ``measurement_delay_s`` old.

    Counts are requests; rates are requests per second. ``time_s`` is when the sample was taken
    (its age is the plant's measurement delay), ``decode_slots`` and ``fill_capacity`` describe
    the pools at that moment. ``*_workers`` count serving workers, ``*_workers_starting`` the ones
    provisioned but not yet serving (a pool autoscaler's moves still in transit);
    ``arrival_rate`` is what reached the orchestrator (before admission), when the plant knows it.
    """

    time_s: float
    backlog: float
    fill_in_progress: float
    ready: float
    active_decodes: float
    completion_rate: float
    admitted_rate: float
    decode_slots: float
    fill_capacity: float
    fill_workers: float = math.nan
    decode_workers: float = math.nan
    fill_workers_starting: float = 0.0
    decode_workers_starting: float = 0.0
    arrival_rate: float = math.nan

    @property
    def decode_utilization(self) -> float:
        return self.active_decodes / self.decode_slots if self.decode_slots > 0 else 0.0

    @property
    def kv_occupancy(self) -> float:
        """Sequences holding KV in decode or waiting for it, per decode slot (a busy signal)."""
        return (self.active_decodes + self.ready) / self.decode_slots if self.decode_slots > 0 else math.inf

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class AdmissionAction:
    """An admission command: release ``rate`` requests/s from the backlog into fill, and shed
    (reject with ``reason``) whatever backlog exceeds ``backlog_bound``. Early rejection at arrival
    is ``backlog_bound=0`` with its own reason."""

    rate: float
    backlog_bound: float = math.inf
    reason: str = "backlog_over_bound"

    def __post_init__(self) -> None:
        if not (self.rate >= 0.0) or math.isnan(self.rate):
            raise ValueError(f"AdmissionAction.rate must be >= 0, got {self.rate}")
        if not self.backlog_bound >= 0.0:
            raise ValueError(f"AdmissionAction.backlog_bound must be >= 0, got {self.backlog_bound}")
        if self.reason not in REJECT_REASONS:
            raise ValueError(f"AdmissionAction.reason must be one of {REJECT_REASONS}, got {self.reason!r}")
