"""What a controller sees of the plant and what it may command (bottom layer).

The same types pass between controllers and every plant representation (the admission-loop fluid
plant, the pool model, the request simulator), so a controller object runs unchanged in all:
a :class:`Measurement` in, an :class:`AdmissionAction`, a :class:`ScaleAction` or a list of them
out (:func:`split_action` sorts a controller's return value).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from tokenfactory.errors import ConfigError

__all__ = ["Measurement", "AdmissionAction", "ScaleAction", "REJECT_REASONS", "POOLS", "split_action",
           "count_reversals"]

#: why a request can be rejected (every rejection in every plant carries one of these)
REJECT_REASONS = ("backlog_over_bound", "decode_overloaded", "predicted_slo_violation")
#: the pools a :class:`ScaleAction` can size
POOLS = ("fill", "decode")


@dataclass(frozen=True)
class Measurement:
    """A sample of the plant as the orchestrator sees it, already ``measurement_delay_s`` old.

    Counts are requests; rates are requests per second. ``time_s`` is when the sample was taken
    (its age is the plant's measurement delay), ``decode_slots`` and ``fill_capacity`` describe
    the pools at that moment. ``*_workers`` count serving workers, ``*_workers_starting`` the ones
    provisioned but not yet serving (a pool autoscaler's moves still in transit);
    ``arrival_rate`` is what reached the orchestrator (before admission), when the plant knows it.

    Every plant builds these (the fluid plant, the pool model, the request simulator); the
    request-level plants average the rates over the controller's sample period, as a scrape of
    counters would.

    Parameters
    ----------
    time_s : float
        When the sample was taken (s of plant time); the controller reads it at
        ``time_s + measurement_delay_s``.
    backlog : float
        Requests waiting at the orchestrator for admission into the fill (prefill) pool.
    fill_in_progress : float
        Requests admitted and not yet KV-ready in decode: queued at or running on fill workers,
        or having their KV transferred.
    ready : float
        Requests whose KV is ready and that wait for a decode slot (the ready buffer).
    active_decodes : float
        Sequences holding a decode slot and generating tokens.
    completion_rate : float
        Requests finishing decode (requests/s).
    admitted_rate : float
        Requests released from the backlog into fill (requests/s).
    decode_slots : float
        Sequences the serving decode workers can hold at once (KV capacity at the request shape).
    fill_capacity : float
        Prefill throughput of the serving fill workers (requests/s).
    fill_workers, decode_workers : float
        Serving workers of each pool; NaN (default) when the plant does not report them (a fluid
        plant's decode count may be fractional during a worker-loss scenario).
    fill_workers_starting, decode_workers_starting : float
        Workers provisioned but still starting or warming up (default 0).
    arrival_rate : float
        Requests reaching the orchestrator, before admission (requests/s); NaN (default) when
        the plant does not measure it.
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
        """Active decodes per decode slot (0-1; 0 when there are no slots)."""
        return self.active_decodes / self.decode_slots if self.decode_slots > 0 else 0.0

    @property
    def kv_occupancy(self) -> float:
        """Sequences holding KV in decode or waiting for it, per decode slot (a busy signal)."""
        return (self.active_decodes + self.ready) / self.decode_slots if self.decode_slots > 0 else math.inf

    def to_dict(self) -> dict:
        """The fields as a plain dict (one row of a measurement log)."""
        return asdict(self)


@dataclass(frozen=True)
class AdmissionAction:
    """An admission command: release ``rate`` requests/s from the backlog into fill, and shed
    (reject with ``reason``) whatever backlog exceeds ``backlog_bound``. Early rejection at arrival
    is ``backlog_bound=0`` with its own reason.

    The plant holds the command until the controller's next sample; the admitted flow is also
    limited by the fill capacity and by what is in the backlog.

    Parameters
    ----------
    rate : float
        Admission rate (requests/s, >= 0); ``math.inf`` admits as fast as fill takes requests.
    backlog_bound : float
        Largest backlog kept (requests, >= 0; default ``inf``, nothing shed); the excess is
        rejected with ``reason``.
    reason : str
        Why shed requests are rejected, one of :data:`REJECT_REASONS` (default
        ``"backlog_over_bound"``).

    Raises
    ------
    ValueError
        When ``rate`` is negative or NaN, ``backlog_bound`` is negative or NaN, or ``reason`` is
        not a known reason.
    """

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


@dataclass(frozen=True)
class ScaleAction:
    """Desired number of workers for ``pool`` (``"fill"`` or ``"decode"``), with Kubernetes
    deployment semantics: the plant starts or drains workers to reach ``replicas``.

    Parameters
    ----------
    pool : str
        ``"fill"`` (prefill) or ``"decode"``, one of :data:`POOLS`.
    replicas : int
        Desired provisioned workers in the pool, serving plus starting (>= 0). Below the current
        count the plant cancels starting workers first, then drains the newest serving ones;
        above it, new workers serve only after the plant's start-up delay.

    Raises
    ------
    ConfigError
        When ``pool`` is unknown or ``replicas`` is not a non-negative integer.
    """

    pool: str
    replicas: int

    def __post_init__(self) -> None:
        if self.pool not in POOLS:
            raise ConfigError("ScaleAction.pool", f"{self.pool!r} is not one of {POOLS}")
        if isinstance(self.replicas, bool) or int(self.replicas) != self.replicas or self.replicas < 0:
            raise ConfigError("ScaleAction.replicas", f"expected an integer >= 0, got {self.replicas!r}")


def split_action(action) -> tuple[AdmissionAction | None, list[ScaleAction]]:
    """Sort a controller's return value into (admission action or None, scale actions).

    Parameters
    ----------
    action : AdmissionAction, ScaleAction, sequence of ScaleAction, float or None
        What :meth:`Controller.update` returned; a bare number is an admission rate. A sequence
        holds scale actions and at most one admission action (what a control stack returns).

    Returns
    -------
    tuple
        ``(AdmissionAction | None, list[ScaleAction])``.
    """
    if action is None:
        return None, []
    if isinstance(action, AdmissionAction):
        return action, []
    if isinstance(action, ScaleAction):
        return None, [action]
    if isinstance(action, Sequence) and not isinstance(action, str):
        # a composed controller (a control stack) may return one admission action among its scale actions
        admissions = [a for a in action if isinstance(a, AdmissionAction)]
        if len(admissions) > 1:
            raise ConfigError("action", f"at most one AdmissionAction per update, got {len(admissions)}")
        return (admissions[0] if admissions else None), [a for a in action if not isinstance(a, AdmissionAction)]
    return AdmissionAction(float(action)), []


def count_reversals(actions: Sequence[dict]) -> int:
    """Scale actions that reverse the previous action's direction on the same pool.

    An up after a down or a down after an up: a direct count of flapping that needs no
    regularity, unlike the oscillation detectors.

    Parameters
    ----------
    actions : sequence of dict
        Rows with ``pool``, ``from`` and ``to`` (worker counts), in time order.

    Returns
    -------
    int
        The number of reversals.
    """
    last: dict[str, int] = {}
    n = 0
    for a in actions:
        d = (a["to"] > a["from"]) - (a["to"] < a["from"])
        if d == 0:
            continue
        if last.get(a["pool"], d) != d:
            n += 1
        last[a["pool"]] = d
    return n
