"""What a controller sees of the plant and what it may command (bottom layer).

The same types pass between controllers and every plant representation (the admission-loop fluid
plant, the pool model, the request simulator), so a controller object runs unchanged in all:
a :class:`Measurement` in, an :class:`AdmissionAction`, a :class:`ScaleAction`, a
:class:`BatchCapAction`, a :class:`ReserveAction` or a list of them out (:func:`sort_actions`
sorts a controller's return value; :func:`split_action` keeps the admission and scale actions).

Plants that see requests one by one (the request simulator) also offer each arrival to an
admission controller that has a ``decide(t, arrival) -> Decision`` method (an *arrival gate*):
an :class:`Arrival` in, a :class:`Decision` (admit, defer or reject, with a reason) out. Plants
without individual requests use the controller's :class:`AdmissionAction` only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

from tokenfactory.core.errors import ConfigError

__all__ = ["Measurement", "ClassLoad", "AdmissionAction", "ScaleAction", "BatchCapAction", "ReserveAction",
           "Arrival", "Decision", "ADMIT", "REJECT_REASONS", "DEFER_REASONS", "VERDICTS", "POOLS", "Actions",
           "split_action", "sort_actions", "count_reversals"]

#: why a request can be rejected (every rejection in every plant carries one of these):
#: ``backlog_over_bound`` - shed from the admission queue over the commanded bound;
#: ``decode_overloaded`` - decode would make it wait past its TPOT SLO (or is full);
#: ``predicted_slo_violation`` - its predicted TTFT exceeds its SLO;
#: ``over_admission_rate`` - admitting it would exceed the commanded admission rate;
#: ``deferral_expired`` - a deferred request found no room before its holding deadline;
#: ``infeasible_slo`` - its own service alone on an empty cluster already exceeds its SLO
REJECT_REASONS = ("backlog_over_bound", "decode_overloaded", "predicted_slo_violation", "over_admission_rate",
                  "deferral_expired", "infeasible_slo")
#: why a request of a deferrable class is held instead of admitted (the rejection reasons that
#: describe "no room now", plus room held for a higher-priority class)
DEFER_REASONS = ("decode_overloaded", "predicted_slo_violation", "over_admission_rate", "reserved_capacity")
#: what an arrival gate may answer
VERDICTS = ("admit", "defer", "reject")
#: the pools a :class:`ScaleAction` can size
POOLS = ("fill", "decode")


@dataclass(frozen=True)
class ClassLoad:
    """What the orchestrator sees of one request class (counts are requests, tokens are new
    prompt tokens - input minus the prefix-cache hit - and rates requests/s).

    Parameters
    ----------
    backlog : float
        Requests of the class waiting at the orchestrator for admission.
    deferred : float
        Requests held in the class's holding queue (deferrable classes).
    fill_in_progress : float
        Admitted requests not yet KV-ready in decode (queued for or in fill, or in transfer).
    fill_queued_tokens : float
        New prompt tokens of the class still to be filled (queued or partly filled).
    ready : float
        Requests with KV at decode waiting for a slot.
    active_decodes : float
        Sequences of the class decoding.
    arrival_rate : float
        Arrivals of the class (requests/s), before admission.
    predicted_wait_s : float
        Fill queueing time a new arrival of the class would see: the new prompt tokens queued
        ahead of it (its own class and higher-priority ones) over the fill token capacity (s).
    """

    backlog: float = 0.0
    deferred: float = 0.0
    fill_in_progress: float = 0.0
    fill_queued_tokens: float = 0.0
    ready: float = 0.0
    active_decodes: float = 0.0
    arrival_rate: float = 0.0
    predicted_wait_s: float = 0.0


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
    fill_queued_tokens : float
        New prompt tokens (input minus prefix-cache hits) admitted and not yet filled, queued or
        partly filled; NaN (default) when the plant does not know them.
    fill_token_capacity : float
        New prompt tokens/s the serving fill workers fill (full steps at the roofline); NaN
        (default) when unknown.
    decode_pass_s : float
        Decode pass time of the busy decode workers (s, their mean), the per-token time a
        decoding sequence sees; NaN (default) when nothing decodes or the plant does not say.
    decode_context_tokens : float
        Mean context of the decoding sequences (tokens); NaN (default) when unknown.
    decode_batch_cap : float
        Largest decode batch per worker in force (sequences; default inf, KV memory only).
    classes : mapping of str to ClassLoad
        Per request class (default empty: the plant has one class).
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
    fill_queued_tokens: float = math.nan
    fill_token_capacity: float = math.nan
    decode_pass_s: float = math.nan
    decode_context_tokens: float = math.nan
    decode_batch_cap: float = math.inf
    classes: Mapping[str, ClassLoad] = field(default_factory=dict)

    @property
    def decode_utilization(self) -> float:
        """Active decodes per decode slot (0-1; 0 when there are no slots)."""
        return self.active_decodes / self.decode_slots if self.decode_slots > 0 else 0.0

    @property
    def kv_occupancy(self) -> float:
        """Sequences holding KV in decode or waiting for it, per decode slot (a busy signal)."""
        return (self.active_decodes + self.ready) / self.decode_slots if self.decode_slots > 0 else math.inf

    def to_dict(self) -> dict:
        """The fields as a plain dict (one row of a measurement log; ``classes`` nested)."""
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


@dataclass(frozen=True)
class BatchCapAction:
    """The largest decode batch a decode worker may run (sequences per worker): the decode
    batch cap as a control input (section 18: "avoid changing batch size before the system can
    observe its effect"). A lower cap than the batch a worker holds takes effect as sequences
    complete (nobody is evicted for it); KV memory still limits the batch below the cap.

    Parameters
    ----------
    batch_per_worker : float
        Sequences per decode worker (>= 1; ``math.inf`` lifts the cap).

    Raises
    ------
    ConfigError
        When ``batch_per_worker`` is below 1 or NaN.
    """

    batch_per_worker: float

    def __post_init__(self) -> None:
        if not (self.batch_per_worker >= 1.0):
            raise ConfigError("BatchCapAction.batch_per_worker", f"expected >= 1, got {self.batch_per_worker!r}")


@dataclass(frozen=True)
class ReserveAction:
    """Capacity held for a request class: the share of every fill step's token budget that
    lower-priority classes may not take (held: a fill step cannot be interrupted), and the share
    of decode slots the controller plans to keep free for the class (lower-priority sequences may
    borrow idle slots; the plant preempts them when the class needs a slot).

    Parameters
    ----------
    fill_share : float
        Share of the fill token budget held ([0, 1]).
    decode_share : float
        Share of decode slots held for planning ([0, 1]; default 0).
    request_class : str
        The class the capacity is held for (default ``"interactive"``).

    Raises
    ------
    ConfigError
        For a share outside [0, 1].
    """

    fill_share: float
    decode_share: float = 0.0
    request_class: str = "interactive"

    def __post_init__(self) -> None:
        for f in ("fill_share", "decode_share"):
            v = getattr(self, f)
            if not (0.0 <= v <= 1.0):
                raise ConfigError(f"ReserveAction.{f}", f"expected a share in [0, 1], got {v!r}")


class Arrival(NamedTuple):
    """What the orchestrator knows of a request when it arrives (or when a deferred one is
    offered again): what an arrival gate decides on.

    Parameters
    ----------
    request_class : str
        The request's class.
    input_tokens : int
        Prompt tokens, cached prefix included.
    cached_tokens : int
        Prefix tokens the orchestrator expects to find in the prefix cache (a peek at the cache
        index: nothing is recorded).
    expected_output_tokens : float
        Output tokens expected (the output is unknown at arrival: the plant's mean for the class).
    arrived_s : float
        When it first arrived (s); a deferred request is offered again later with the same value.
    """

    request_class: str
    input_tokens: int
    cached_tokens: int
    expected_output_tokens: float
    arrived_s: float

    @property
    def prompt_tokens(self) -> int:
        """New tokens its fill computes (at least one)."""
        return max(self.input_tokens - self.cached_tokens, 1)


class Decision(NamedTuple):
    """An arrival gate's answer: ``verdict`` one of :data:`VERDICTS` and, unless admitted, the
    reason (one of :data:`REJECT_REASONS` for a rejection, :data:`DEFER_REASONS` for a deferral).

    Parameters
    ----------
    verdict : str
        ``"admit"``, ``"defer"`` or ``"reject"``.
    reason : str
        Why it is not admitted (empty when admitted).
    """

    verdict: str
    reason: str = ""


#: the gate's answer to admit a request
ADMIT = Decision("admit")


class Actions(NamedTuple):
    """A controller's return value sorted by type (:func:`sort_actions`).

    Parameters
    ----------
    admission : AdmissionAction or None
        At most one admission command.
    scales : list of ScaleAction
        Pool sizes.
    batch_cap : BatchCapAction or None
        At most one decode batch cap.
    reserve : ReserveAction or None
        At most one reservation.
    """

    admission: AdmissionAction | None
    scales: list
    batch_cap: BatchCapAction | None
    reserve: ReserveAction | None


_ACTION_KINDS = {AdmissionAction: "admission", BatchCapAction: "batch_cap", ReserveAction: "reserve",
                 ScaleAction: "scale"}


def sort_actions(action) -> Actions:
    """Sort a controller's return value by action type.

    Parameters
    ----------
    action : action, sequence of actions, float or None
        What :meth:`Controller.update` returned: an :class:`AdmissionAction`,
        :class:`ScaleAction`, :class:`BatchCapAction`, :class:`ReserveAction`, a sequence of
        them (at most one of each kind but scale actions), a bare number (an admission rate) or
        None.

    Returns
    -------
    Actions
        ``(admission, scales, batch_cap, reserve)``.

    Raises
    ------
    ConfigError
        For two actions of a kind that allows one, or an object that is no action.
    """
    if action is None:
        return Actions(None, [], None, None)
    if type(action) is AdmissionAction:  # the common case, without the loop
        return Actions(action, [], None, None)
    items = action if isinstance(action, (list, tuple)) else (
        list(action) if isinstance(action, Sequence) and not isinstance(action, str) else [action])
    adm = cap = res = None
    scales: list[ScaleAction] = []
    for a in items:
        kind = _ACTION_KINDS.get(type(a))
        if kind == "scale":
            scales.append(a)
            continue
        if kind is None and isinstance(a, (int, float)) and not isinstance(a, bool):
            a, kind = AdmissionAction(float(a)), "admission"
        if kind is None:
            raise ConfigError("action", f"{type(a).__name__} is not an action")
        if {"admission": adm, "batch_cap": cap, "reserve": res}[kind] is not None:
            raise ConfigError("action", f"at most one {type(a).__name__} per update, got more")
        if kind == "admission":
            adm = a
        elif kind == "batch_cap":
            cap = a
        else:
            res = a
    return Actions(adm, scales, cap, res)


def split_action(action) -> tuple[AdmissionAction | None, list[ScaleAction]]:
    """Sort a controller's return value into (admission action or None, scale actions).

    Parameters
    ----------
    action : action, sequence of actions, float or None
        What :meth:`Controller.update` returned; a bare number is an admission rate. A sequence
        holds scale actions and at most one admission action (what a control stack returns);
        batch caps and reservations are left out (:func:`sort_actions` keeps them).

    Returns
    -------
    tuple
        ``(AdmissionAction | None, list[ScaleAction])``.
    """
    sorted_ = sort_actions(action)
    return sorted_.admission, sorted_.scales


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
