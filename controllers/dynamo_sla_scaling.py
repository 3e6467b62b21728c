"""Dynamo's SLA-mode load scaling of the decode pool, before and after ai-dynamo PR #9294, on the
plant's own pass time - and the 2 <-> 1 cycle the flat rule makes under constant load.

The rule (ai-dynamo 1.4.2 ``planner/core/load_scaling.py``, ``_decode_load_decision`` and
``_scale_decision``), every ``load_adjustment_interval_seconds``: each decode worker's ITL is
estimated at its scheduled plus queued sequences; +1 replica when the estimate exceeds the ITL SLA
on every worker, -1 when scale-down is allowed. PR #9294 ("make SLA-mode scale-down
consolidation-aware again", merged 2026-05-07) changed when it is allowed:

* **before** (``consolidation_aware=False``): the estimate below ``sensitivity`` x SLA (default
  80 %). At 2 workers each under 80 % of the SLA the planner removes one, "but the surviving
  worker would immediately blow SLA, causing 2 <-> 1 oscillation under constant load" (the PR,
  at its production tier: 2 workers, KV use about 0.7 each, ITL 23 ms against a 32 ms threshold);
* **after** (``consolidation_aware=True``, 1.4.2): the survivors' load is n / (n - 1) of today's;
  refused when that load does not fit the KV cache or its estimated ITL reaches ``sensitivity`` x SLA.

Here the perf model Dynamo fits from forward passes is the plant's pass time: the service model's
curve inside the cache and, beyond it (queued sequences), its secant over the upper half of the
batch range continued linearly - a linear regression on forward passes near full batches learns
that slope. The pool-level measurement gives every worker the pool's mean, as in
:class:`tokenfactory.controllers.autoscaling.DynamoLoadPlanner`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from tokenfactory.controllers.autoscaling import serving_replicas, PoolAutoscaler
from tokenfactory.core.signals import Measurement, ScaleAction
from tokenfactory.core.validation import check_number

__all__ = ["DynamoSLALoadScaling", "itl_estimate", "SLAScalingCycle", "predict_sla_scaling_cycle"]


def itl_estimate(pass_s: Callable[[float], float], slots: float) -> Callable[[float], float]:
    """The ITL a linear perf model fitted near full batches predicts at ``batch`` sequences per
    worker: ``pass_s`` up to ``slots``, then its secant over [slots / 2, slots] continued.

    Parameters
    ----------
    pass_s : callable
        ``pass_s(batch) -> s``: one decode pass at ``batch`` sequences (capped at the slots).
    slots : float
        Decode slots of one worker (> 0).
    """
    slots = check_number("itl_estimate.slots", slots, low=0.0, low_inclusive=False)
    top = float(pass_s(slots))
    slope = (top - float(pass_s(slots / 2.0))) / (slots / 2.0)

    def estimate(batch: float) -> float:
        return float(pass_s(batch)) if batch <= slots else top + slope * (batch - slots)

    return estimate


class DynamoSLALoadScaling(PoolAutoscaler):
    """Dynamo's SLA-mode decode load scaling (see the module docstring), one step per tick.

    Parameters
    ----------
    itl_s : float
        ITL SLA (s, > 0; Dynamo's ``itl_ms`` / 1000).
    pass_s : callable
        ``pass_s(batch) -> s``: the plant's decode pass time per worker (:func:`itl_estimate`
        extends it past the cache).
    slots_per_worker : float
        Decode slots of one worker (> 0).
    sensitivity : float
        Dynamo's ``load_scaling_down_sensitivity`` / 100 ((0, 1]; default 0.8).
    consolidation_aware : bool
        True (ai-dynamo 1.4.2, after PR #9294): judge a scale-down at the survivors' load;
        False (before it): at today's. Default True.
    min_replicas, max_replicas : int
        Bounds (Dynamo's ``min_endpoint`` and the GPU budget; defaults 1 and 1000).
    sample_period : float
        Tick (s, > 0; Dynamo's ``load_adjustment_interval_seconds``, default 5).
    """

    name = "dynamo-sla-load"

    def __init__(self, itl_s: float, pass_s: Callable[[float], float], slots_per_worker: float, *,
                 sensitivity: float = 0.8, consolidation_aware: bool = True, min_replicas: int = 1,
                 max_replicas: int = 1000, sample_period: float = 5.0):
        super().__init__(sample_period)
        self._init_pool("dynamo_sla", "decode", min_replicas, max_replicas)
        self.itl_s = check_number("dynamo_sla.itl_s", itl_s, low=0.0, low_inclusive=False)
        self.slots_per_worker = check_number("dynamo_sla.slots_per_worker", slots_per_worker, low=0.0,
                                             low_inclusive=False)
        self.sensitivity = check_number("dynamo_sla.sensitivity", sensitivity, low=0.0, high=1.0, low_inclusive=False)
        self.consolidation_aware = bool(consolidation_aware)
        self.estimate = itl_estimate(pass_s, self.slots_per_worker)
        self.reset()

    def reset(self) -> None:
        self._target: int | None = None

    def recommend(self, n: int, batch: float) -> int:
        """The decision at ``n`` serving workers each holding ``batch`` scheduled + queued sequences."""
        if n <= 0:
            return self._bounded(n)
        if self.estimate(batch) > self.itl_s:
            return self._bounded(n + 1)
        if n > 1:
            if self.consolidation_aware:
                post = batch * n / (n - 1)
                allowed = post < self.slots_per_worker and self.estimate(post) < self.sensitivity * self.itl_s
            else:
                allowed = self.estimate(batch) < self.sensitivity * self.itl_s
            if allowed:
                return self._bounded(n - 1)
        return self._bounded(n)

    def update(self, t: float, m: Measurement) -> ScaleAction:
        """One tick: hold while a worker starts or the last target is not reached, else :meth:`recommend`."""
        n = serving_replicas(m, "decode")
        provisioned = serving_replicas(m, "decode", provisioned=True)
        if self._target is not None and self._target == n and provisioned == n:
            self._target = None
        if m.decode_workers_starting > 0 or (self._target is not None and self._target != n):
            return ScaleAction("decode", self._target if self._target is not None else provisioned)
        batch = (max(m.active_decodes, 0.0) + max(m.ready, 0.0)) / n if n else 0.0
        want = self.recommend(n, batch)
        if want != n:
            self._target = want
        return ScaleAction("decode", want)

    def params(self) -> dict:
        return {"pool": "decode", "itl_s": self.itl_s, "sensitivity": self.sensitivity,
                "consolidation_aware": self.consolidation_aware, "slots_per_worker": self.slots_per_worker,
                "min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                "sample_period": self.sample_period}


@dataclass(frozen=True)
class SLAScalingCycle:
    """The 2 <-> 1 style cycle: between ``low`` and ``high`` workers, with its period's parts (s).

    Parameters
    ----------
    period_s : float
        The cycle's period (s).
    low_replicas, high_replicas : int
        The worker counts it moves between.
    phases_s : dict
        The period's parts (s), by phase name.
    """

    period_s: float
    low_replicas: int
    high_replicas: int
    phases_s: dict

    @property
    def amplitude(self) -> float:
        return (self.high_replicas - self.low_replicas) / 2.0

    def to_dict(self) -> dict:
        return {"period_s": self.period_s, "amplitude": self.amplitude, "low_replicas": self.low_replicas,
                "high_replicas": self.high_replicas, "phases_s": dict(self.phases_s)}


def _largest(pred, lo: float, hi: float) -> float:
    """The largest x in [lo, hi] with pred(x) true, pred monotone (true below, false above)."""
    if pred(hi):
        return hi
    for _ in range(100):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if pred(mid) else (lo, mid)
    return lo


def predict_sla_scaling_cycle(rule: DynamoSLALoadScaling, n: int, demand_rps: float, worker_rps: float,
                              startup_s: float) -> SLAScalingCycle | None:
    """The cycle ``rule`` settles into between ``n - 1`` and ``n`` workers at a constant demand, or
    None when it holds ``n`` - before any simulation.

    T, the sequences in the pool (decoding and queued), sets every worker's batch T / workers. At
    the steady demand each of ``n`` workers holds S x demand / (n x worker_rps). Piecewise, with the
    queue growing at demand - workers x worker_rps while the workers are full:

    1. *release*: the rule releases one worker as soon as T / n is below its down level b_down (the
       largest batch it releases at) - in the settled cycle, at T = n x b_down, queue and all;
    2. *detect*: the survivors' estimate at T / (n - 1) must exceed the SLA; T grows to
       (n - 1) x b_up (the batch at which it does), then one tick;
    3. *start-up*: T keeps growing for the start-up;
    4. *drain*: ``n`` workers drain T back to n x b_down, then one tick.

    Parameters
    ----------
    rule : DynamoSLALoadScaling
        The rule and its plant's pass time.
    n : int
        Workers it holds when it does not cycle (>= 2).
    demand_rps, worker_rps : float
        The constant demand and one worker's completions at full slots (req/s, > 0).
    startup_s : float
        Decision to a serving worker (s, >= 0).

    Returns
    -------
    SLAScalingCycle or None
        None when the rule never releases at ``n`` or ``n - 1`` workers carry the demand within the SLA.
    """
    S, tick = rule.slots_per_worker, rule.sample_period
    steady = S * demand_rps / (n * worker_rps)
    top = 64.0 * S * max(1.0, demand_rps / worker_rps)
    if rule.recommend(n, steady) >= n:
        return None
    b_down = _largest(lambda b: rule.recommend(n, b) < n, steady, top)
    growth = demand_rps - (n - 1) * worker_rps
    t0 = n * b_down
    b_up = _largest(lambda b: rule.estimate(b) <= rule.itl_s, 0.0, top)
    if t0 / (n - 1) > b_up:
        detect = tick
        t_up = t0
    elif growth > 0:
        t_up = (n - 1) * b_up
        detect = (t_up - max(t0, (n - 1) * S)) / growth + tick
    else:
        return None    # the survivors carry the demand within the SLA: a release, not a cycle
    t_peak = t_up + max(growth, 0.0) * startup_s
    drain_rate = n * worker_rps - demand_rps
    if drain_rate <= 0:
        return None
    drain = max(t_peak - t0, 0.0) / drain_rate + tick
    return SLAScalingCycle(tick + detect + startup_s + drain, n - 1, n,
                           {"release": tick, "detect": detect, "start_up": startup_s, "drain": drain})
