"""The loop model of NVIDIA Dynamo's planner (``ai-dynamo`` 1.4.2) at its ``sla`` target on a
disaggregated plant: a feed-forward floor from the predicted demand under a feedback rule on the
perf model's TTFT / ITL estimates - the pool size it holds, its start-up peak, the margins of its
linear part, and why its rounding does not cycle at the mean.

The rule, from the installed package (cited per function):

* **feed-forward** (``throughput_scaling.py``; every ``throughput_adjustment_interval_seconds``):
  the PREDICT stage's next-interval request count (``load/predictors.py``: constant, ARIMA, Kalman
  or Prophet - at a constant demand each predicts that demand) over the interval is the demand;
  ``_compute_prefill_replicas`` / ``_compute_decode_replicas`` give
  ``max(ceil(demand / engine_rps), min_endpoint)``, ``engine_rps`` the perf model's
  ``find_engine_capacity_rps`` at the TTFT / ITL target. With load scaling on (the sla default
  in the adapter) ``_throughput_disagg`` only *sets a lower bound*, which the next load tick applies
  (``_advance_load_disagg``: ``max(load decision, _throughput_lower_bound_*)``, then
  ``min_endpoint`` and ``_apply_global_budget``);
* **feedback** (``load_scaling.py``; every ``load_adjustment_interval_seconds``, none while either
  pool scales): decode (``_decode_load_decision``) +1 when the estimated ITL at each worker's
  scheduled plus queued sequences exceeds ``itl_ms``; -1 only when the survivors' load
  (x n / (n - 1)) fits the KV cache and its estimated ITL is under
  ``load_scaling_down_sensitivity`` x ``itl_ms`` - consolidation-aware since PR #9294. Prefill
  (``_prefill_load_decision``): +1 when the estimated TTFT of the queued prompt tokens plus the
  next request exceeds ``ttft_ms``; -1 only when the queue-induced part at n / (n - 1) stays under
  sensitivity x (``ttft_ms`` - the request's own pass). ``_scale_decision`` combines them.

The perf model's estimates are the plant's own pass times
(:func:`~tokenfactory.controllers.dynamo_sla_scaling.itl_estimate`: the curve inside the cache,
its secant beyond) - the planner tunes its model from live forward passes every load tick
(``PlannerEnginePerfModel.add_observations``), which is what the older planner's observed /
expected correction factors (``planner_core.py``, ai-dynamo 0.x) did; 1.4.2 has no separate
correction factor, the refit *is* the correction. A decode worker at demand lambda / n holds
``b = (lambda / n) x osl x ITL(b)`` sequences (Little), solved by fixed point, the excess over its
slots queued.

What follows from the rule:

* it **holds** every n with ``ITL(n) <= itl`` and ``ITL(n - 1) >= s x itl`` (the survivors' load at
  n - 1 workers is exactly the load of n - 1 workers), above the floor. A cycle n <-> n + 1 would
  need ``ITL(n) > itl`` (up from n) and ``ITL(n) < s x itl`` (down from n + 1) at once - impossible
  for s <= 1: the consolidation-aware rule has no mean limit cycle. Where the band is wide (a flat
  pass-time curve: a decode pass dominated by reading the weights) the rule holds whatever size it
  reaches, so the size it settles at is the first n from below that reads ``<= itl`` - or the
  floor, if that is higher;
* the floor's rounding (``ceil``) can flip between k and k + 1 when the predicted demand's noise
  (a Poisson count over the interval: sigma = sqrt(lambda T) / T) straddles k x engine_rps; an
  up-flip is then held by the refused scale-down (the survivors would read about the SLA, above
  s x the SLA), so it is a ratchet of one worker, not a cycle (:attr:`SLAPoolLoop.floor_flip`);
  a ``min_endpoint`` at or above the upper step (k + 1) pins the floor (the ``max`` takes both
  sides of the noise to it), so it cannot flip there;
* where a pool is short the queue integrates the deficit: the linear part is an integrator
  (metric per queued request x mu / (up - down)) behind the metric delay, half a load tick and
  the start-up, as for the load target.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from tokenfactory.controllers.autoscaler_loops import PoolOperatingPoint
from tokenfactory.controllers.dynamo_planner_loop import PlannerCycle, PlannerPoolLoop
from tokenfactory.controllers.dynamo_sla_scaling import itl_estimate

__all__ = ["SLAPoolLoop", "sla_pool_loops"]


@dataclass(frozen=True)
class SLAPoolLoop(PlannerPoolLoop):
    """One pool of the planner's ``sla`` rule on the plant (see the module docstring). The fields
    of :class:`~tokenfactory.controllers.dynamo_planner_loop.PlannerPoolLoop`, with ``up`` the
    target (s: ``ttft_ms`` or ``itl_ms`` / 1000), ``down`` the scale-down level (s) and:

    Parameters
    ----------
    pool, signal, unit, offset, queue_unit, occupancy_s, point, tick_s : see PlannerPoolLoop
        As there (``signal`` is the estimated TTFT or ITL here).
    up : float
        The SLA target (s): ``ttft_ms`` / 1000 on fill, ``itl_ms`` / 1000 on decode.
    down : float
        The scale-down level (s): the target x ``sensitivity``.
    min_replicas, max_replicas : int
        ``min_endpoint`` and what the GPU budget leaves this pool.
    sensitivity : float
        ``load_scaling_down_sensitivity`` / 100.
    floor_replicas : int
        The feed-forward floor at the operating point: ``max(ceil(demand / engine_rps), min_endpoint)``.
    engine_rps : float
        One worker's rate at the target (the perf model's ``find_engine_capacity_rps``).
    own_s : float
        Fill: one request's own prefill pass (s); decode: unused (0).
    output_tokens : float
        Tokens a request decodes (decode's Little's law; fill: unused).
    pass_curve : tuple
        Decode: ``(batch, pass_s)`` knots of the plant's pass time (fill: empty).
    interval_s : float
        ``throughput_adjustment_interval_seconds`` (the floor's prediction window).
    feedback : bool
        ``enable_load_scaling`` (Dynamo's default is false: the floor alone sizes the pool).
    """

    sensitivity: float = 0.8
    floor_replicas: int = 1
    engine_rps: float = math.inf
    own_s: float = 0.0
    output_tokens: float = 1.0
    pass_curve: tuple = ()
    interval_s: float = 180.0
    feedback: bool = True

    @property
    def workers_needed(self) -> float:
        """Workers the demand needs at the target (demand / engine_rps), at least at full rate."""
        at_target = self.point.demand_rps / self.engine_rps if self.engine_rps > 0 else math.inf
        return max(self.point.workers_needed, at_target)

    @property
    def gain(self) -> float:
        """The linear part's integrator gain (1/s); 0 without load scaling (feed-forward only)."""
        return super().gain if self.feedback else 0.0

    # ---- the perf model's estimate at n workers -------------------------------------------
    def _pass(self, batch: float) -> float:
        xs, ys = zip(*self.pass_curve)

        def curve(b: float) -> float:
            b = min(max(b, xs[0]), xs[-1])
            for (x0, y0), (x1, y1) in zip(self.pass_curve, self.pass_curve[1:]):
                if b <= x1:
                    return y0 + (y1 - y0) * (b - x0) / max(x1 - x0, 1e-12)
            return ys[-1]

        return itl_estimate(curve, xs[-1])(batch)

    def batch(self, n: int, z: float = 0.0) -> float:
        """Decode sequences per worker at n workers (Little, fixed point), ``z`` sigma of Poisson
        noise in the sequences held; beyond the slots they are queued (the estimate counts them)."""
        lam = self.point.demand_rps / n
        b = lam * self.output_tokens * self._pass(1.0)
        for _ in range(60):
            b = lam * self.output_tokens * self._pass(min(b, self.point.slots_per_worker))
        b += z * math.sqrt(max(b, 0.0))
        if n * self.point.per_worker_rps <= self.point.demand_rps:
            b = max(b, self.point.slots_per_worker * (1.0 + 1e-6))   # short: the queue grows past the slots
        return b

    def reading(self, n: int, queue: float = 0.0, z: float = 0.0) -> float:
        """The estimate a worker's rule compares (s): decode ITL at its sequences plus ``queue``
        queued requests' share; fill TTFT of its queued prompts plus the next request."""
        if self.pass_curve:
            return self._pass(self.batch(n, z) + queue / n)
        held = min(self.point.demand_rps, n * self.point.per_worker_rps) * self.occupancy_s / n
        held += z * math.sqrt(max(held, 0.0))
        return self.own_s + (held + queue / n) * self.queue_unit

    def rule(self, n: int, queue: float = 0.0, z: float = 0.0) -> int:
        """+1, -1 or 0 at ``n`` workers (``_scale_decision`` with the consolidation checks, then the
        feed-forward floor); ``z`` sigma of noise towards each level."""
        if n < min(self.floor_replicas, self.max_replicas):
            return +1
        if not self.feedback:   # enable_load_scaling false: the predicted demand's floor alone decides
            return -1 if n > max(1, self.min_replicas, self.floor_replicas) else 0
        if (self.short(n) or self.reading(n, queue, z) > self.up) and n < self.max_replicas:
            return +1
        if n > max(1, self.min_replicas, self.floor_replicas):
            fits = not self.pass_curve or self.batch(n - 1, -z) < self.point.slots_per_worker
            if fits and not self.short(n - 1) and self.reading(n - 1, queue, -z) < self.down:
                return -1
        return 0

    def floor_steps(self) -> tuple[int, int] | None:
        """The feed-forward floor at the predicted demand two standard deviations below and above
        its mean: ``max(ceil(demand / engine_rps), min_endpoint)`` (``throughput_scaling.py``
        ``_compute_decode_replicas`` / ``_compute_prefill_replicas``, ai-dynamo 1.4.2), the demand a
        Poisson count over the interval (sigma = sqrt(lambda T) / T: the ``constant`` predictor
        returns the last interval's count, ``load/predictors.py`` ``ConstantPredictor``; the others
        smooth it, so this is their upper bound). None without a finite engine rate."""
        lam = self.point.demand_rps
        if not math.isfinite(self.engine_rps) or self.engine_rps <= 0:
            return None
        sigma = math.sqrt(lam * self.interval_s) / self.interval_s

        def floor(demand: float) -> int:
            return max(math.ceil(demand / self.engine_rps - 1e-9), self.min_replicas, 1)

        return floor(lam - 2 * sigma), floor(lam + 2 * sigma)

    @property
    def floor_flip(self) -> bool:
        """The floor's ceil straddles a step within two standard deviations of the predicted demand
        (:meth:`floor_steps`). A ``min_endpoint`` at or above the upper step pins the floor: the
        ``max`` with it takes both sides to the same size, and nothing flips."""
        steps = self.floor_steps()
        return steps is not None and steps[0] != steps[1]

    def floor_cycle(self) -> PlannerCycle | None:
        """The cycle the floor's rounding makes, or None: when the floor flips (:attr:`floor_flip`)
        between k (its lower step, ``min_endpoint`` included) and k + 1 and nothing holds k + 1 - no
        load scaling, or a load rule that lets the survivors go (its consolidated estimate at k
        under the scale-down level). Noise-driven: at least one prediction interval at each size,
        so its period is a lower bound."""
        if not self.floor_flip:
            return None
        k = self.floor_steps()[0]
        if k + 1 > self.max_replicas:
            return None
        if self.feedback and not (not self.short(k) and self.reading(k) < self.down
                                  and (not self.pass_curve or self.batch(k) < self.point.slots_per_worker)):
            return None   # the refused scale-down holds k + 1: a ratchet of one worker, not a cycle
        up = self.ticks(max(self.interval_s, self.point.startup_s + self.point.metric_delay_s))
        return PlannerCycle(up + self.ticks(self.interval_s), k, k + 1, 0.0,
                            {"at_high": up, "at_low": self.ticks(self.interval_s)}, None, noise_driven=True)


def _capacity_at(loop_pass, slots: float, osl: float, target_s: float) -> float:
    """One decode worker's rate at an ITL target: the batch whose pass is the target (capped at the
    slots) over its decode time (``find_engine_capacity_rps`` on the plant's curve)."""
    lo, hi = 1.0, float(slots)
    if loop_pass(hi) <= target_s:
        return hi / (osl * loop_pass(hi))
    if loop_pass(lo) > target_s:
        return 0.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if loop_pass(mid) <= target_s else (lo, mid)
    return lo / (osl * loop_pass(lo))


def sla_pool_loops(fields: dict, plant, *, demand_rps: float, metric_delay_s: float, hold_s: float, lo: int,
                   budget_workers: int | Mapping[str, int], mu_f: float, mu_d: float, slots: float, prompt: float,
                   service_rate_factor: float = 1.0) -> dict[str, SLAPoolLoop]:
    """The two pools' ``sla`` loops (called by
    :func:`~tokenfactory.controllers.dynamo_planner_loop.planner_pool_loops`, which resolves the
    budget, the floor and the capabilities).

    Parameters
    ----------
    fields : dict
        ``DynamoPlannerSetting.planner_fields()``.
    plant : FluidParams
        The plant (its decode pass time ``decode_step_s``, output tokens, fill latency).
    demand_rps, metric_delay_s, hold_s : float
        Demand (req/s), metric age and start-up + warm-up (s).
    lo : int
        ``min_endpoint``.
    budget_workers : int or mapping
        The workers the GPU budget leaves each pool: ``{"fill": .., "decode": ..}`` (a pool of
        fewer GPUs per worker fits more workers in what the other pool's floor leaves), or one
        number for both.
    mu_f, mu_d, slots, prompt : float
        Worker rates (req/s), decode slots and prompt tokens, as the load loops use them.
    service_rate_factor : float
        Scales the pass times (the stack's envelope).
    """
    ceiling = (dict(budget_workers) if isinstance(budget_workers, Mapping)
               else {"fill": int(budget_workers), "decode": int(budget_workers)})
    tick = float(fields["load_adjustment_interval_seconds"])
    s = float(fields["load_scaling_down_sensitivity"]) / 100.0
    interval = float(fields["throughput_adjustment_interval_seconds"])
    floor_on = bool(fields["enable_throughput_scaling"])
    feedback = bool(fields["enable_load_scaling"])
    itl, ttft = float(fields["itl_ms"]) / 1000.0, float(fields["ttft_ms"]) / 1000.0
    osl = max(float(plant.output_tokens), 1.0)
    grid = sorted({max(1.0, slots * f) for f in (1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 3 / 4, 1)})
    curve = tuple((b, float(plant.decode_step_s(b)) / service_rate_factor) for b in grid)
    probe = SLAPoolLoop("decode", "", itl, s * itl, 1.0, 0.0, 0.0, 0.0,
                        PoolOperatingPoint(mu_d, demand_rps, metric_delay_s, hold_s, slots, slots / mu_d),
                        tick, lo, ceiling["decode"], pass_curve=curve)
    r_d = _capacity_at(probe._pass, slots, osl, itl)
    own = float(plant.fill_latency_s) / service_rate_factor
    # prefill capacity at the TTFT target: an M/D/1 worker whose queueing wait is ttft - own
    wait = max(ttft - own, 0.0)
    r_f = mu_f * (2 * mu_f * wait) / (1 + 2 * mu_f * wait) if wait > 0 else 0.0

    def floor(rate: float) -> int:
        if not floor_on or rate <= 0:
            return lo
        return max(math.ceil(demand_rps / rate - 1e-9), lo)

    top = probe._pass(slots)
    slope = (top - probe._pass(slots / 2.0)) / (slots / 2.0)
    decode = SLAPoolLoop("decode", "ITL estimate", itl, s * itl, 1.0, 0.0, slope, slots / mu_d, probe.point, tick,
                         lo, ceiling["decode"], sensitivity=s, floor_replicas=floor(r_d), engine_rps=r_d,
                         output_tokens=osl, pass_curve=curve, interval_s=interval, feedback=feedback)
    fill = SLAPoolLoop("fill", "TTFT estimate", ttft, own + s * wait, prompt, 0.0, 1.0 / mu_f, float(plant.fill_latency_s),
                       PoolOperatingPoint(mu_f, demand_rps, metric_delay_s, hold_s, 1.0, plant.fill_latency_s), tick,
                       lo, ceiling["fill"], sensitivity=s, floor_replicas=floor(r_f), engine_rps=r_f, own_s=own,
                       interval_s=interval, feedback=feedback)
    return {"fill": fill, "decode": decode}
