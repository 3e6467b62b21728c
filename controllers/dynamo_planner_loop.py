"""The loop model of NVIDIA Dynamo's own planner (``ai-dynamo`` 1.4.2) on a disaggregated plant:
what its settings do to each pool before any simulation - the cycle its thresholds and whole
workers make, its start-up peak and the margins of its linear part.

The rule, from the installed package (``dynamo/planner/core/load_scaling.py``), for
``optimization_target: load`` (the target the loop model covers; :class:`NotModelled` otherwise):

* every ``load_adjustment_interval_seconds`` (``PlannerConfig``; the pipeline tick), both pools
  are judged from their workers' forward-pass metrics, and *nothing* is decided while a scale of
  either pool is in progress (``_advance_load_disagg``: ``_scaling_in_progress("prefill") or
  ("decode")`` -> observe only). A scale-up is in progress until the new worker counts as ready
  (``state_machine.py`` ``_scaling_in_progress``: expected != ready), so the rule takes one step
  per start-up: it never cascades;
* prefill (``_prefill_easy_decision``): a worker's queued prompt tokens (beyond the tokens its
  step schedules; the adapter counts the pool's prompts in fill, split evenly - modelled as
  arrivals x fill latency, which the pool model's 1 s fill step does not hold: there it is a queue); +1 when any worker has >= ``prefill_scale_up_queue_tokens``, -1 when every
  worker has <= ``prefill_scale_down_queue_tokens`` (and more than one worker);
* decode (``_decode_easy_decision``): a worker's KV use, (scheduled + queued KV tokens) /
  ``max_kv_tokens``; +1 when any worker is >= ``decode_scale_up_kv_rate`` %, -1 when every worker is
  <= ``decode_scale_down_kv_rate`` %;
* then the floor ``min_endpoint`` (a -1 below it is no change) and the GPU budget
  (``_apply_global_budget``: ``max_gpu_budget`` GPUs over both pools).

On the plant (the adapter :class:`~tokenfactory.controllers.dynamo_planner.DynamoPlanner` gives
every worker the pool's mean): at demand lambda below capacity, a pool of n workers reads
``m(n) = (lambda x occupancy x unit + offset_total) / n - offset`` - the requests it holds (Little)
in metric units, per worker. Above capacity the queue adds ``queue_unit`` per queued request and
integrates the deficit. So the rule is a relay on whole workers:

* it **holds** n where ``down < m(n) < up``: the set of such n is where the dead band covers a
  worker's share. Where that set is empty between the floor and the ceiling, it **cycles**
  between the largest n that reads >= up and n + 1, which reads <= down - a 2 <-> 1 plateau
  cycle at a demand the dead band does not cover (e.g. the defaults 60 / 90 % flap 1 <-> 2 for any
  demand between 0.9 and 1.2 workers' worth);
* the metric is noisy: a Poisson stream keeps ``lambda x occupancy`` requests in the pool with
  standard deviation its square root (M/G/inf occupancy). ``z`` (:func:`predict_planner_cycle`)
  asks the band to clear that many standard deviations on either side; the certificate uses the
  mean (:data:`NOISE_Z` = 0) because how often noise crosses depends on how fast the occupancy
  decorrelates against the tick, which the model does not know: in the request simulator a
  decode pool whose mean cleared the up level by 0.6 sigma held for 400 s (a 279 s decode time
  decorrelates slowly). A cycle that
  only the noise makes is flagged ``noise_driven`` (its period is then a lower bound);
* its period is the phases of the relay, each rounded up to the tick: at n + 1, the start-up and
  warm-up (the adapter counts a worker ready when it serves at full speed, and the rule waits for
  it) plus the metric delay; at n, the metric delay (at least one tick);
* its start-up peak: one step per start-up from the floor while the pool reads >= up, with the
  backlog the short pool built during each start-up counted in the metric (a queued request
  counts ``queue_unit``) - the only overshoot this rule has.

The linear part (for the margins the certificate reports): where the pool is short the queue
integrates the deficit and the band acts like a proportional rule with gain 1 worker per
(up - down) of a worker's metric - L(s) = (queue_unit x mu / (up - down)) e^{-theta s} / s,
theta = the metric delay + half a tick + the start-up (its ±1 step limit can only lower this gain).
Below capacity a pool's metric falls as 1/n with the pool, so the rule is the static feed-forward
n in (m_total / up, m_total / down) - no loop to destabilise.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass

import control

from tokenfactory.controllers.autoscaler_loops import AutoscalerCertificate, AutoscalerLoop, PoolOperatingPoint, \
    RelayCycle
from tokenfactory.controllers.formats.common import NotModelled
from tokenfactory.controllers.stability import DelayedLoop, stability_margins
from tokenfactory.core.errors import ConfigError
from tokenfactory.core.validation import check_choice, check_number

__all__ = ["PlannerPoolLoop", "planner_pool_loops", "predict_planner_cycle", "planner_startup_peak",
           "certify_planner", "NOISE_Z", "PlannerCycle"]

#: standard deviations of the occupancy noise the dead band must clear on each side in the
#: certificate (0: the mean; see the module docstring for why not more)
NOISE_Z = 0.0


@dataclass(frozen=True)
class PlannerPoolLoop:
    """One pool of the planner's load rule on the plant (see the module docstring).

    Parameters
    ----------
    pool : str
        ``"fill"`` (Dynamo's prefill) or ``"decode"``.
    signal : str
        What a worker's metric is (``"queued prefill tokens"`` or ``"KV use"``).
    up, down : float
        The rule's per-worker levels (metric units: tokens, or the KV fraction).
    unit : float
        Metric units per request the pool holds (per worker when the pool's load is split evenly).
    offset : float
        Subtracted from a worker's share (the prompt tokens one prefill step schedules; 0 for KV).
    queue_unit : float
        Metric units per queued request (above capacity).
    occupancy_s : float
        Time a request is held by the pool below capacity (s: fill latency, or the decode time).
    point : PoolOperatingPoint
        The pool (its worker rate, the demand, the metric delay, the start-up as the rule sees it).
    tick_s : float
        ``load_adjustment_interval_seconds``.
    min_replicas, max_replicas : int
        ``min_endpoint`` and what the GPU budget leaves this pool.
    """

    pool: str
    signal: str
    up: float
    down: float
    unit: float
    offset: float
    queue_unit: float
    occupancy_s: float
    point: PoolOperatingPoint
    tick_s: float
    min_replicas: int
    max_replicas: int

    def reading(self, n: int, queue: float = 0.0, z: float = 0.0) -> float:
        """A worker's metric at ``n`` workers with ``queue`` requests queued, ``z`` standard
        deviations of the occupancy noise above its mean."""
        held = min(self.point.demand_rps, n * self.point.per_worker_rps) * self.occupancy_s
        held += z * math.sqrt(max(held, 0.0))
        return max(held * self.unit / n + queue * self.queue_unit / n - self.offset, 0.0)

    def short(self, n: int) -> bool:
        return n * self.point.per_worker_rps <= self.point.demand_rps

    def rule(self, n: int, queue: float = 0.0, z: float = 0.0) -> int:
        """The decision at ``n`` workers (+1, -1 or 0), ``z`` sigma of noise towards each level."""
        if (self.short(n) or self.reading(n, queue, z) >= self.up) and n < self.max_replicas:
            return +1
        if n > max(1, self.min_replicas) and self.reading(n, queue, -z) <= self.down:
            return -1
        return 0

    @property
    def workers_needed(self) -> float:
        """Workers the demand needs (what the certificate bounds the peak and the ceiling by)."""
        return self.point.workers_needed

    @property
    def delay_s(self) -> float:
        """Delay of the integrating part: metric age + half a tick + the start-up."""
        return self.point.metric_delay_s + self.tick_s / 2.0 + self.point.startup_s

    def ticks(self, s: float) -> float:
        """``s`` rounded up to whole ticks (at least one)."""
        return max(1, math.ceil(s / self.tick_s - 1e-9)) * self.tick_s

    @property
    def gain(self) -> float:
        """The linear part's integrator gain (1/s): queue_unit x mu / (up - down)."""
        return self.queue_unit * self.point.per_worker_rps / max(self.up - self.down, 1e-12)

    def linear(self) -> DelayedLoop:
        """L(s) = gain e^{-delay s} / s, where the pool is short (the module docstring)."""
        return DelayedLoop(control.tf([self.gain], [1.0, 0.0]), self.delay_s,
                           f"dynamo-planner on {self.pool} {self.signal}")

    def as_autoscaler_loop(self) -> AutoscalerLoop:
        """The same loop in :class:`AutoscalerLoop`'s fields (what certificates and reports read):
        one worker per decision, no cascade over starting workers."""
        return AutoscalerLoop(f"dynamo-planner ({self.pool})", self.signal, self.up, self.queue_unit,
                              self.point.demand_rps * self.occupancy_s * self.unit, 1.0, self.down / self.up,
                              self.tick_s, 0.0, self.point.startup_s, 0.0, False, 1.0, 1.0, self.min_replicas,
                              self.max_replicas, self.point)


@dataclass(frozen=True)
class PlannerCycle(RelayCycle):
    """A :class:`RelayCycle` of the planner's rule.

    Parameters
    ----------
    period_s, low_replicas, high_replicas, queue_peak, phases_s, describing_function : see RelayCycle
        As for :class:`~tokenfactory.controllers.autoscaler_loops.RelayCycle`.
    noise_driven : bool
        The mean holds a pool and only the occupancy noise crosses the band (the period is then
        a lower bound).
    """

    noise_driven: bool = False

    def to_dict(self) -> dict:
        return {**super().to_dict(), "noise_driven": self.noise_driven}


def planner_pool_loops(setting, plant, *, demand_rps: float, metric_delay_s: float, startup_s: float,
                       warmup_s: float = 0.0, gpus_per_worker: int | Mapping[str, int] = 1,
                       service_rate_factor: float = 1.0,
                       capabilities=None) -> dict[str, PlannerPoolLoop]:
    """The two pools' loops of a Dynamo planner config on a plant at a demand.

    Parameters
    ----------
    setting : DynamoPlannerSetting
        The planner config (:func:`tokenfactory.controllers.formats.read_control_plane`).
    plant : FluidParams
        The plant's parameters: worker rates, slots, prompt/output tokens, fill latency.
    demand_rps : float
        The demand (req/s, > 0).
    metric_delay_s, startup_s, warmup_s : float
        Metric age, start-up and warm-up (s, >= 0): the rule waits for a new worker to be ready,
        which the adapter counts once it serves at full speed (start-up + warm-up).
    gpus_per_worker : int or dict
        GPUs of one worker (the budget's unit), or ``{"fill": .., "decode": ..}`` per pool.
    service_rate_factor : float
        Scales both pools' worker rates (the stack's envelope; default 1).
    capabilities : DynamoCapabilities, optional
        What the adapter tells the planner of the engines (prompt, a prefill step's token budget,
        decode slots and context); default: from ``plant`` as the adapter's fluid path does (a
        step of one nominal prompt).

    Raises
    ------
    ConfigError
        For a ``min_endpoint`` the GPU budget cannot hold on both pools.
    NotModelled
        For a config the loop model does not cover (a target other than ``load``, load scaling
        off, or what :meth:`DynamoPlannerSetting.planner_fields` rejects), naming the field.
    """
    fields = setting.planner_fields()   # NotModelled for what the planner adapter cannot run either
    target = fields["optimization_target"]
    check_number("demand_rps", demand_rps, low=0.0, low_inclusive=False)
    check_choice("setting.mode", fields["mode"], ("disagg",))
    prompt = plant.prompt_tokens if plant.prompt_tokens > 0 else 1.0
    ctx = float((plant.provenance or {}).get("decode_context_tokens", prompt + plant.output_tokens / 2.0))
    slots = plant.decode_slots_per_worker
    budget = float(prompt)
    if capabilities is not None:   # DynamoPlanner's WorkerCapabilities and FPM split (dynamo_planner.py)
        prompt, ctx = capabilities.prompt_tokens, capabilities.context_tokens
        slots, budget = capabilities.decode_slots, float(capabilities.fill_token_budget)
    hold = startup_s + warmup_s
    g = {pool: max(int(gpus_per_worker[pool] if isinstance(gpus_per_worker, Mapping) else gpus_per_worker), 1)
         for pool in ("fill", "decode")}
    lo = max(int(fields["min_endpoint"]), 1)
    # _apply_global_budget (state_machine.py) clamps both pools in proportion to max_gpu_budget GPUs
    # (counted across pools, each worker at its pool's GPUs): a pool gets at most what the other
    # pool's floor leaves; a floor the budget cannot hold on both pools is no setting (Dynamo would
    # clamp both pools below min_endpoint)
    budget_workers = {"fill": 10 ** 6, "decode": 10 ** 6}
    if fields["max_gpu_budget"] > 0:
        floor_gpus = lo * (g["fill"] + g["decode"])
        if floor_gpus > fields["max_gpu_budget"]:
            per = f"{g['fill']}" if g["fill"] == g["decode"] else f"{g['fill']} fill / {g['decode']} decode"
            raise ConfigError("min_endpoint", f"{lo} workers on each pool need {floor_gpus} GPUs; max_gpu_budget "
                              f"is {fields['max_gpu_budget']} (at {per} GPUs per worker)")
        other = {"fill": "decode", "decode": "fill"}
        budget_workers = {pool: (int(fields["max_gpu_budget"]) - lo * g[other[pool]]) // g[pool]
                          for pool in g}
    mu_d = plant.decode_capacity(1) * service_rate_factor
    mu_f = plant.fill_rate_per_worker * service_rate_factor
    if target == "sla":
        from tokenfactory.controllers.dynamo_planner_sla_loop import sla_pool_loops

        return sla_pool_loops(fields, plant, demand_rps=demand_rps, metric_delay_s=metric_delay_s, hold_s=hold,
                              lo=lo, budget_workers=budget_workers, mu_f=mu_f, mu_d=mu_d, slots=slots,
                              prompt=prompt,
                              service_rate_factor=service_rate_factor)
    levels = _easy_levels(target, fields, prompt + plant.output_tokens)
    tick = float(fields["load_adjustment_interval_seconds"])
    decode = PlannerPoolLoop(
        "decode", "KV use", levels["decode_up"], levels["decode_down"],
        1.0 / slots, 0.0, prompt / (ctx * slots), slots / mu_d,
        PoolOperatingPoint(mu_d, demand_rps, metric_delay_s, hold, slots, slots / mu_d), tick, lo,
        budget_workers["decode"])
    fill = PlannerPoolLoop(
        "fill", "queued prefill tokens", levels["fill_up"], levels["fill_down"], prompt, budget, prompt, plant.fill_latency_s,
        PoolOperatingPoint(mu_f, demand_rps, metric_delay_s, hold, 1.0, plant.fill_latency_s), tick, lo,
        budget_workers["fill"])
    return {"fill": fill, "decode": decode}


#: the throughput target's static thresholds (``load_scaling.py`` ``_PREFILL_THROUGHPUT_SCALE_*``:
#: queued prompt tokens over the engine's ``context_length``; ``_DECODE_THROUGHPUT_SCALE_*``: KV use);
#: the rule compares them strictly (``>``, ``<``) where the load target uses ``>=``, ``<=`` - the
#: same relay on a continuous mean
THROUGHPUT_LEVELS = {"fill_up": 1.0, "fill_down": 0.1, "decode_up": 1.0, "decode_down": 0.6}


def _easy_levels(target: str, fields: dict, context_tokens: float) -> dict[str, float]:
    """The relay's levels per pool: the load target's user thresholds, or the throughput target's
    fixed ones (prefill in tokens of ``context_length`` = prompt + output, as the adapter reports it)."""
    if target == "throughput":
        t = THROUGHPUT_LEVELS
        return {"fill_up": t["fill_up"] * context_tokens, "fill_down": t["fill_down"] * context_tokens,
                "decode_up": t["decode_up"], "decode_down": t["decode_down"]}
    return {"fill_up": float(fields["prefill_scale_up_queue_tokens"]),
            "fill_down": float(fields["prefill_scale_down_queue_tokens"]),
            "decode_up": fields["decode_scale_up_kv_rate"] / 100.0,
            "decode_down": fields["decode_scale_down_kv_rate"] / 100.0}


def predict_planner_cycle(loop: PlannerPoolLoop, z: float = NOISE_Z) -> RelayCycle | None:
    """The cycle the rule settles into at the loop's demand, or None when it holds a pool.

    The rule's fixed points are the n in [floor, ceiling] where it decides 0 with ``z`` sigma of
    noise towards each level; with none, the relay moves between ``n_low`` - the largest n the
    rule raises (at least the floor) - and ``n_low + 1``. Phases (each rounded up to the tick):
    at n_low + 1 the start-up and warm-up plus the metric delay; at n_low the metric delay.
    When the mean alone holds a pool and only the noise moves it, the period is a lower bound.

    Parameters
    ----------
    loop : PlannerPoolLoop
        One pool (:func:`planner_pool_loops`).
    z : float
        Noise sigmas the band must clear (default :data:`NOISE_Z`; 0: the mean only).
    """
    lo, hi = max(1, loop.min_replicas), loop.max_replicas
    if any(loop.rule(n, 0.0, z) == 0 for n in range(lo, hi + 1)) or hi <= lo:
        # the sla target's feed-forward floor can still flip with the predicted demand's noise
        return loop.floor_cycle() if hasattr(loop, "floor_cycle") else None
    pairs = [n for n in range(lo, hi) if loop.rule(n, 0.0, z) > 0 and loop.rule(n + 1, 0.0, z) < 0]
    if not pairs:
        return None   # pinned at its ceiling, short of the demand: overloaded, not flapping
    n_low = max(pairs)
    up_phase = loop.ticks(loop.point.startup_s + loop.point.metric_delay_s)
    down_phase = loop.ticks(loop.point.metric_delay_s)
    noise = any(loop.rule(n, 0.0, 0.0) == 0 for n in range(lo, hi + 1))
    return PlannerCycle(up_phase + down_phase, n_low, n_low + 1, 0.0,
                        {"at_high": up_phase, "at_low": down_phase}, None, noise_driven=noise)


def planner_startup_peak(loop: PlannerPoolLoop, from_replicas: int, demand_rps: float | None = None) -> int:
    """Peak workers after a demand step: one step per start-up while a worker's metric, with the
    backlog the short pool built, reads >= up (the mean; noise is the cycle's business).

    Parameters
    ----------
    loop : PlannerPoolLoop
        One pool's loop (:func:`planner_pool_loops`).
    from_replicas : int
        Workers before the step (>= 1).
    demand_rps : float, optional
        The demand after the step (req/s; default the loop's operating point).

    Returns
    -------
    int
        The largest pool size the rule reaches.
    """
    lam = loop.point.demand_rps if demand_rps is None else float(demand_rps)
    mu = loop.point.per_worker_rps
    n, q, peak = max(int(from_replicas), 1), 0.0, max(int(from_replicas), 1)
    hold = loop.ticks(loop.point.startup_s + loop.point.metric_delay_s)
    for _ in range(4 * loop.max_replicas + 8):
        if n >= loop.max_replicas:
            break
        short = n * mu <= lam
        if not short and loop.reading(n, q) < loop.up:
            break
        q = max(q + (lam - n * mu) * hold, 0.0)   # the backlog while the next worker starts
        n += 1
        peak = max(peak, n)
        q = max(q - (n * mu - lam) * loop.tick_s, 0.0) if n * mu > lam else q   # a tick of the larger pool
    return int(peak)


def _margins(loop: PlannerPoolLoop):
    """Margins of the loop's linear part, computed once per (gain, delay, name): a knob search
    certifies hundreds of candidates that share a few linear parts."""
    return _integrator_margins(round(loop.gain, 12), round(loop.delay_s, 9), loop.linear().name)


@functools.lru_cache(maxsize=256)
def _integrator_margins(k: float, delay_s: float, name: str):
    return stability_margins(DelayedLoop(control.tf([k], [1.0, 0.0]), delay_s, name))


def certify_planner(loop: PlannerPoolLoop, *, gm_floor: float = 2.0, pm_floor_deg: float = 45.0,
                    z: float = NOISE_Z) -> AutoscalerCertificate:
    """One pool's certificate in :class:`AutoscalerCertificate`'s terms: the margins of the linear
    part, the predicted cycle (:func:`predict_planner_cycle`) and the start-up peak from the floor
    (:func:`planner_startup_peak`).

    Parameters
    ----------
    loop : PlannerPoolLoop
        One pool (:func:`planner_pool_loops`).
    gm_floor, pm_floor_deg : float
        Floors of the margins the certificate reports (defaults 2 and 45 degrees).
    z : float
        Noise sigmas (:func:`predict_planner_cycle`).
    """
    # the sla target without load scaling sizes from the predicted demand alone: no loop through the plant
    # floor = ceiling pins the pool: no loop closes, whatever the rule's gain
    pinned = loop.max_replicas <= max(1, loop.min_replicas)
    return AutoscalerCertificate(loop.as_autoscaler_loop(), _margins(loop) if loop.gain > 0 and not pinned else None,
                                 predict_planner_cycle(loop, z), planner_startup_peak(loop, max(1, loop.min_replicas)),
                                 loop.workers_needed, gm_floor, pm_floor_deg)
