"""What a controller sees of the plant and what it may command.

The same two types pass between controllers and every plant representation (fluid model now,
request-level simulator later), so a controller object runs unchanged in both.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

__all__ = ["Measurement", "AdmissionAction"]


@dataclass(frozen=True)
class Measurement:
    """A sample of the plant as the orchestrator sees it, already ``measurement_delay_s`` old.

    Counts are requests; rates are requests per second. ``time_s`` is when the sample was taken
    (its age is the plant's measurement delay), ``decode_slots`` and ``fill_capacity`` describe
    the pools at that moment.
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
    (reject with reason ``"backlog_over_bound"``) whatever backlog exceeds ``backlog_bound``."""

    rate: float
    backlog_bound: float = math.inf

    def __post_init__(self) -> None:
        if not (self.rate >= 0.0) or math.isnan(self.rate):
            raise ValueError(f"AdmissionAction.rate must be >= 0, got {self.rate}")
        if not self.backlog_bound >= 0.0:
            raise ValueError(f"AdmissionAction.backlog_bound must be >= 0, got {self.backlog_bound}")
