"""Loop models of today's pool autoscalers, for margins and limit-cycle predictions before any
simulation.

Every threshold autoscaler here (Kubernetes HPA and KEDA's HPA, Knative KPA, AIBrix APA, Ray
Serve) sets the desired replicas from a metric total M over the pool and a per-replica target:
``desired = ceil(M / target)`` (HPA: ceil(current x average / target); KPA and Ray: the window
average over the target; APA: the same outside its fluctuation band). What M does when the pool
changes decides the loop:

* **queue-bearing metrics** (requests waiting, requests in flight, KV use with waiting sequences
  counted) contain the queue q, which integrates the capacity deficit: dq/dt = lambda - mu n.
  Where the pool is short of capacity the loop is an integrator with delay,
  L(s) = (c_q mu / target) e^{-theta s} / s - c_q the metric's units per queued request, mu one
  worker's requests/s, theta the metric delay + half a sample + the averaging window's half +
  the start-up of a new worker (article section 12: reconfiguration as a delayed loop).
* **utilisation metrics** (busy slots over slots) do not see the queue: below saturation M =
  lambda x service time / slots does not depend on n (the rule is a static feed-forward, no loop),
  at saturation M = n and the rule multiplies the pool by 1/target each sample until new workers
  serve - the start-up cascade (AIBrix #2670: 2 -> 4 -> 8 -> 16 while pods are pending).

Whole replicas make every such loop a relay around the demand: where lambda lies between the
capacities of n and n + 1 workers the queue rises at n and drains at n + 1, and the rule's up and
down levels are the relay's switching levels. :func:`predict_autoscaler_cycle` solves that relay
with the describing function (:func:`tokenfactory.controllers.reconfiguration.predict_pool_flapping`);
a queue-bearing metric has no steady state at n + 1 (an empty queue reads as idle), so it cycles
unless its floor or ceiling holds it, while a utilisation metric holds n + 1 when the dead band
covers it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import control

from tokenfactory.controllers.autoscaling import AIBrixAPA, HorizontalPodAutoscaler, KnativeAutoscaler, hpa_policy_limit
from tokenfactory.controllers.describing import LimitCycle
from tokenfactory.controllers.reconfiguration import predict_pool_flapping
from tokenfactory.controllers.stability import DelayedLoop, Margins, stability_margins
from tokenfactory.core.errors import ConfigError
from tokenfactory.core.validation import check_number

__all__ = ["PoolOperatingPoint", "AutoscalerLoop", "autoscaler_loop", "autoscaler_margins",
           "predict_autoscaler_cycle", "predict_startup_cascade", "RelayCycle", "AutoscalerCertificate", "certify_autoscaler",
           "QUEUE_BEARING"]

#: metric signal -> units of M per queued request (0: the metric does not see the queue);
#: ``kv_occupancy`` counts waiting sequences per KV slot, so 1 / slots per worker
QUEUE_BEARING = {"decode_waiting": 1.0, "decode_concurrency": 1.0, "fill_concurrency": 1.0,
                 "kv_occupancy": None, "decode_utilization": 0.0, "fill_utilization": 0.0}


@dataclass(frozen=True)
class PoolOperatingPoint:
    """The pool an autoscaler sizes, at the operating point it is certified for.

    Parameters
    ----------
    per_worker_rps : float
        Requests/s one serving worker sustains (> 0).
    demand_rps : float
        The demand the pool serves (req/s, > 0).
    metric_delay_s : float
        Age of the metric when the autoscaler reads it (s, >= 0).
    startup_s : float
        From a scale-up decision to a serving worker (s, >= 0; warm-up included at its share).
    slots_per_worker : float
        Decode slots of one worker (sequences, > 0): the unit of KV-occupancy metrics.
    service_s : float
        Time a request occupies a slot (s, > 0): requests in flight = demand x service time.
    """

    per_worker_rps: float
    demand_rps: float
    metric_delay_s: float
    startup_s: float
    slots_per_worker: float = 1.0
    service_s: float = 1.0

    def __post_init__(self):
        for name, low_open in (("per_worker_rps", True), ("demand_rps", True), ("slots_per_worker", True),
                               ("service_s", True), ("metric_delay_s", False), ("startup_s", False)):
            check_number(f"operating_point.{name}", getattr(self, name), low=0.0, low_inclusive=not low_open)

    @property
    def workers_needed(self) -> float:
        """Demand over one worker's rate: the pool size at which the queue neither grows nor drains."""
        return self.demand_rps / self.per_worker_rps


@dataclass(frozen=True)
class AutoscalerLoop:
    """The loop an autoscaler closes around a pool (see the module docstring).

    Parameters
    ----------
    name : str
        The autoscaler (``"hpa"``, ``"kpa"``, ``"aibrix-apa"``, ``"ray-serve"``).
    signal : str
        The plant signal its metric reads.
    target : float
        Metric per replica it aims for.
    queue_units : float
        Units of the metric total per queued request (0: not queue-bearing).
    served_total : float
        The metric total the served requests contribute at the operating point.
    up_ratio, down_ratio : float
        It scales up when metric / (replicas x target) exceeds ``up_ratio``, down when below
        ``down_ratio``.
    sample_s : float
        Decision period (s).
    window_s : float
        Averaging window of the metric (s; its mean age is half of it).
    up_delay_s, down_delay_s : float
        Scale-up: decision to serving worker (start-up, plus a consecutive-decision delay);
        scale-down: the stabilisation window, cooldown or delay before a release.
    counts_starting : bool
        Whether the replica count it multiplies includes starting workers (HPA, APA), which
        cascades while the metric, from serving workers, stays saturated.
    up_pods, up_factor : float
        Largest growth per decision: to max(n + up_pods, floor(n x up_factor)) (HPA's policies,
        KPA's max scale-up rate; inf: none).
    min_replicas, max_replicas : int
        Its bounds.
    point : PoolOperatingPoint
        The plant.
    up_window_s : float
        Scale-up stabilisation: the lowest recommendation of this window acts (HPA's
        ``scaleUp.stabilizationWindowSeconds``; s, default 0).
    up_policies : tuple of (str, float, float)
        HPA's scale-up policies ``(kind, value, period_s)`` with their own periods; when given they
        bound the growth in place of ``up_pods`` / ``up_factor`` (default empty).
    up_select : str
        How the policies combine: ``"max"`` (default), ``"min"`` or ``"disabled"``.
    unready_at_zero : bool
        Starting workers count at 0 in the average on a scale-up (upstream HPA's replica
        calculator): the rule asks for ceil(serving x ratio) and holds while the average over all
        provisioned workers is within the tolerance (default False).
    """

    name: str
    signal: str
    target: float
    queue_units: float
    served_total: float
    up_ratio: float
    down_ratio: float
    sample_s: float
    window_s: float
    up_delay_s: float
    down_delay_s: float
    counts_starting: bool
    up_pods: float
    up_factor: float
    min_replicas: int
    max_replicas: int
    point: PoolOperatingPoint
    up_window_s: float = 0.0
    up_policies: tuple = ()
    up_select: str = "max"
    unready_at_zero: bool = False

    @property
    def delay_s(self) -> float:
        """Delay of the integrating loop: metric age + half a sample + half the window + the
        scale-up stabilisation + start-up."""
        return (self.point.metric_delay_s + self.sample_s / 2.0 + self.window_s / 2.0 + self.up_window_s
                + self.up_delay_s)

    def linear(self) -> DelayedLoop | None:
        """The linear part of the loop where it is closed, or None where the rule is a static
        feed-forward (no loop to destabilise).

        * queue-bearing metric, pool short of capacity: L(s) = (queue_units x mu / target)
          e^{-delay s} / s (the queue integrates the deficit);
        * utilisation metric with the replica count including starting workers (HPA, APA): in
          log replicas the rule is x[k+1] = x[k] + log(lambda / (mu target)) - x[k - d], d the
          start-up in samples - an integrator of gain 1 per sample behind the start-up,
          L(s) ~ e^{-delay s} / (sample s);
        * a utilisation metric over serving workers (KPA, Ray Serve) gives x[k+1] = const: none.
        """
        if self.queue_units > 0:
            k = self.queue_units * self.point.per_worker_rps / self.target
            return DelayedLoop(control.tf([k], [1.0, 0.0]), self.delay_s, f"{self.name} on {self.signal}")
        if self.counts_starting:
            return DelayedLoop(control.tf([1.0 / self.sample_s], [1.0, 0.0]), self.delay_s,
                               f"{self.name} on {self.signal} (log replicas)")
        return None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["delay_s"] = self.delay_s
        return d


def _queue_units(signal: str, point: PoolOperatingPoint) -> float:
    units = QUEUE_BEARING.get(signal)
    if signal not in QUEUE_BEARING:
        raise ConfigError("autoscaler.metric", f"{signal!r} has no loop model; modelled: {', '.join(QUEUE_BEARING)}")
    return 1.0 / point.slots_per_worker if units is None else units


def _served_total(signal: str, point: PoolOperatingPoint) -> float:
    in_flight = point.demand_rps * point.service_s
    return {"decode_waiting": 0.0, "decode_concurrency": in_flight, "fill_concurrency": in_flight,
            "kv_occupancy": in_flight / point.slots_per_worker,
            "decode_utilization": in_flight / point.slots_per_worker,
            "fill_utilization": point.workers_needed}[signal]


def autoscaler_loop(controller, point: PoolOperatingPoint) -> AutoscalerLoop:
    """The :class:`AutoscalerLoop` of an autoscaler object on ``point``.

    Supported: :class:`HorizontalPodAutoscaler` (and so KEDA), :class:`KnativeAutoscaler`,
    :class:`AIBrixAPA` and :class:`~tokenfactory.controllers.ray_serve_autoscaler.RayServeAutoscaler`.

    Parameters
    ----------
    controller : autoscaler
        One of the supported autoscaler objects; its ``params()`` give the loop's target, metric,
        bands, delays and bounds.
    point : PoolOperatingPoint
        The pool and demand it is modelled at.

    Raises
    ------
    ConfigError
        For an autoscaler of another type, or a metric with no loop model (not in :data:`QUEUE_BEARING`).
    """
    from tokenfactory.controllers.ray_serve_autoscaler import RayServeAutoscaler

    p = controller.params()
    su = point.startup_s
    if isinstance(controller, HorizontalPodAutoscaler):
        tol = p["tolerance"]
        unready = bool(p.get("starting_unready", True))
        return AutoscalerLoop("hpa", p["metric"], p["target"], _queue_units(p["metric"], point),
                              _served_total(p["metric"], point), 1.0 + tol, 1.0 - tol, p["sample_period"], 0.0,
                              su, p["downscale_stabilization_s"], not unready, p["scale_up_pods"],
                              1.0 + p["scale_up_percent"] / 100.0, p["min_replicas"], p["max_replicas"], point,
                              up_window_s=p.get("upscale_stabilization_s", 0.0),
                              up_policies=tuple(p.get("scale_up_policies", ())), up_select=p.get("scale_up_select",
                                                                                                   "max"),
                              unready_at_zero=unready)
    if isinstance(controller, KnativeAutoscaler):
        return AutoscalerLoop("kpa", p["metric"], p["target"], _queue_units(p["metric"], point),
                              _served_total(p["metric"], point), 1.0, 1.0, p["sample_period"], p["stable_window_s"],
                              su, p["stable_window_s"] / 2.0, False, 0.0, p["max_scale_up_rate"], p["min_replicas"],
                              p["max_replicas"], point)
    if isinstance(controller, AIBrixAPA):
        return AutoscalerLoop("aibrix-apa", p["metric"], p["target"], _queue_units(p["metric"], point),
                              _served_total(p["metric"], point), 1.0 + p["up_band"], 1.0 - p["down_band"],
                              p["sample_period"], 0.0, su, p["scale_down_cooldown_s"], True, math.inf, math.inf,
                              controller.min_replicas, controller.max_replicas, point)
    if isinstance(controller, RayServeAutoscaler):
        return AutoscalerLoop("ray-serve", p["metric"], p["target_ongoing_requests"], _queue_units(p["metric"], point),
                              _served_total(p["metric"], point), 1.0, 1.0, p["sample_period"],
                              p["look_back_period_s"] + p["metrics_interval_s"], su + p["upscale_delay_s"],
                              p["downscale_delay_s"], False, math.inf, math.inf, p["min_replicas"],
                              p["max_replicas"], point)
    raise ConfigError("autoscaler", f"no loop model for {type(controller).__name__}")


def autoscaler_margins(loop: AutoscalerLoop) -> Margins | None:
    """Nyquist verdict and margins of the loop's linear part (:meth:`AutoscalerLoop.linear`);
    None where the rule is a static feed-forward.

    Parameters
    ----------
    loop : AutoscalerLoop
        The loop (:func:`autoscaler_loop`).
    """
    lin = loop.linear()
    return None if lin is None else stability_margins(lin)


def _levels(loop: AutoscalerLoop, n_low: int) -> tuple[float, float]:
    """The queue levels (requests) at which the rule moves n_low + 1 -> n_low and n_low -> n_low + 1."""
    t, u = loop.target, loop.queue_units
    # up: metric / (n_low x target) > up_ratio, and ceil(M / target) > n_low
    up_total = max(loop.up_ratio * n_low * t, n_low * t)
    # down from n_low + 1: metric / ((n_low + 1) target) < down_ratio and ceil(M / target) <= n_low
    down_total = min(loop.down_ratio * (n_low + 1) * t, n_low * t)
    return (max(0.0, (down_total - loop.served_total) / u), max(0.0, (up_total - loop.served_total) / u))


def _rule_keeps(loop: AutoscalerLoop, n: int, total: float) -> bool:
    """Whether the rule leaves ``n`` replicas where the metric total is ``total``."""
    ratio = total / (n * loop.target)
    want = math.ceil(total / loop.target - 1e-9)
    if ratio > loop.up_ratio and min(want, loop.max_replicas) > n:
        return False
    return not (ratio < loop.down_ratio and max(want, loop.min_replicas) < n)


@dataclass(frozen=True)
class RelayCycle:
    """The flapping an autoscaler's rule settles into around a demand it cannot hold.

    Parameters
    ----------
    period_s : float
        Time between two scale-ups.
    low_replicas, high_replicas : int
        The pool sizes it moves between.
    queue_peak : float
        Largest queue of the cycle (requests; 0 for a metric that does not see the queue).
    phases_s : dict
        The period's parts: ``"detect"`` (queue reaching the up level, metric age, half a sample),
        ``"start_up"``, ``"drain"`` (the larger pool emptying the queue) and ``"hold"`` (the
        stabilisation window or cooldown before the release).
    describing_function : LimitCycle or None
        The first-harmonic prediction of the same relay between the two sizes around the demand
        (:func:`~tokenfactory.controllers.reconfiguration.predict_pool_flapping`), for comparison:
        it assumes a symmetric relay, so it misses the cycle's overshoot to ``high_replicas``.
    """

    period_s: float
    low_replicas: int
    high_replicas: int
    queue_peak: float
    phases_s: dict
    describing_function: LimitCycle | None

    @property
    def amplitude(self) -> float:
        """Half the swing of the pool (workers)."""
        return (self.high_replicas - self.low_replicas) / 2.0

    def to_dict(self) -> dict:
        df = self.describing_function
        return {"period_s": self.period_s, "amplitude": self.amplitude, "low_replicas": self.low_replicas,
                "high_replicas": self.high_replicas, "queue_peak": self.queue_peak, "phases_s": dict(self.phases_s),
                "describing_function": None if df is None else {"period_s": df.period_s, "amplitude": df.amplitude}}


def predict_autoscaler_cycle(loop: AutoscalerLoop) -> RelayCycle | None:
    """The cycle the rule settles into at the operating demand, or None when it holds a pool.

    The rule's floor is the pool it releases to once the queue is empty: ``n_down`` =
    max(min replicas, ceil(served contribution / target)). If ``n_down`` workers carry the demand
    there is nothing to flap. Otherwise, piecewise (each phase is linear, so the cycle is exact
    for the loop model, article section 12's relay):

    1. *detect*: at ``n_down`` the queue grows at lambda - n_down mu until the metric crosses
       the up ratio, seen a metric age plus half a sample later;
    2. *start-up*: the rule keeps asking while the queue grows - the peak pool is the start-up
       cascade of :func:`predict_startup_cascade` (bounded by the policies and max replicas);
    3. *drain*: the peak pool empties the queue at n_peak mu - lambda;
    4. *hold*: the stabilisation window (HPA), cooldown (APA), half the stable window (KPA) or
       downscale delay (Ray) after the last high reading, then the release to ``n_down``.

    A metric that does not see the queue (utilisation) reads the larger pool's spare capacity and
    keeps ceil(served / target) workers, so it cycles only when that is short of the demand.

    Parameters
    ----------
    loop : AutoscalerLoop
        The loop (:func:`autoscaler_loop`), at the demand of its operating point.
    """
    point = loop.point
    lam, mu = point.demand_rps, point.per_worker_rps
    n_down = max(1, loop.min_replicas, math.ceil(loop.served_total / loop.target - 1e-9))
    n_down = min(n_down, loop.max_replicas)
    if n_down * mu >= lam:
        return None
    if loop.queue_units == 0:
        return None   # short but not cycling: the rule holds a pool the demand overloads (cascade reports it)
    growth = lam - n_down * mu
    up_total = loop.up_ratio * n_down * loop.target
    q_up = max(0.0, (up_total - loop.served_total) / loop.queue_units)
    base = point.metric_delay_s + loop.sample_s / 2.0 + loop.window_s / 2.0
    detect = q_up / growth + base
    n_peak = predict_startup_cascade(loop, n_down, lam)
    drain_rate = n_peak * mu - lam
    if n_peak <= n_down or drain_rate <= 0:
        return None   # it cannot catch up: overloaded at its ceiling, not flapping
    q_peak = q_up + growth * (loop.up_delay_s + base)
    drain = q_peak / drain_rate
    hold = loop.down_delay_s + base
    n_low = math.floor(point.workers_needed)
    df = None
    if n_low >= 1 and n_low < loop.max_replicas:
        low, high = _levels(loop, n_low)
        df = predict_pool_flapping(mu, base + (loop.up_delay_s + loop.down_delay_s) / 2.0, low, max(high, low))
    return RelayCycle(detect + loop.up_delay_s + drain + hold, n_down, n_peak, q_peak,
                      {"detect": detect, "start_up": loop.up_delay_s, "drain": drain, "hold": hold}, df)


def predict_startup_cascade(loop: AutoscalerLoop, from_replicas: int, demand_rps: float | None = None) -> int:
    """Peak replicas the rule asks for after a demand step to ``demand_rps`` (default: the
    operating point's) from ``from_replicas`` serving workers, before the first new worker serves.

    The serving pool stays short for the start-up: a queue-bearing metric grows with the queue, a
    utilisation metric reads saturated. HPA and APA multiply the replica count *including* starting
    workers by the serving workers' average over the target, so they compound every sample (the
    cascade); KPA and Ray Serve divide the metric total by the target and ask once for what it shows.

    Parameters
    ----------
    loop : AutoscalerLoop
        The loop (:func:`autoscaler_loop`).
    from_replicas : int
        Serving workers when the demand steps (>= 1).
    demand_rps : float, optional
        The demand after the step (req/s, > 0); default None: the operating point's.

    Returns
    -------
    int
        The largest replica count asked for within the start-up (bounded by the growth policies
        and ``max_replicas``; ``from_replicas`` when the rule does not scale up).
    """
    point = loop.point
    demand = point.demand_rps if demand_rps is None else demand_rps
    mu = point.per_worker_rps
    deficit = max(demand - from_replicas * mu, 0.0)
    share = min(demand, from_replicas * mu) / point.demand_rps       # of the served contribution
    n = from_replicas
    # the first new worker serves a start-up after the first scale-up, which the scale-up
    # stabilisation delays by its window
    samples = max(1, math.ceil((loop.up_delay_s + loop.up_window_s) / loop.sample_s))
    recs: list[tuple[float, int]] = [(0.0, n)]   # (time, unstabilised recommendation); the step's own at 0
    events: list[tuple[float, int]] = []    # (time, replicas added)
    for k in range(1, samples + 1):
        t = k * loop.sample_s
        age = max(t - point.metric_delay_s - loop.window_s / 2.0, 0.0)
        if loop.queue_units > 0:
            total = loop.served_total * share + loop.queue_units * deficit * age
        else:
            total = loop.served_total * share
        ratio = total / (from_replicas * loop.target)
        want = n
        if loop.unready_at_zero:
            # upstream's replica calculator: starting pods at 0 in the average; no change while that
            # average is within the tolerance, else ceil(ready x ratio)
            if ratio > loop.up_ratio and ratio * from_replicas / n > loop.up_ratio:
                want = max(n, math.ceil(from_replicas * ratio - 1e-9))
        elif ratio > loop.up_ratio:
            want = max(n, math.ceil((n if loop.counts_starting else from_replicas) * ratio - 1e-9))
        recs.append((t, want))
        if loop.up_window_s > 0:   # stabilizeRecommendationWithBehaviors: the lowest of the window
            want = max(n, min(r for ts, r in recs if ts >= t - loop.up_window_s))
        if want <= n:
            continue
        if loop.up_policies:
            limit = max(hpa_policy_limit(loop.up_policies, loop.up_select, events, (), t, n, True), n)
        elif math.isfinite(loop.up_factor):
            limit = max(n + loop.up_pods, math.floor(n * loop.up_factor))
        else:
            limit = want
        new = int(min(want, limit, loop.max_replicas))
        if new > n:
            events.append((t, new - n))
            n = new
    return int(n)


@dataclass(frozen=True)
class AutoscalerCertificate:
    """What the loop model says of an autoscaler setting before any simulation.

    Parameters
    ----------
    loop : AutoscalerLoop
        The loop certified.
    margins : Margins or None
        Stability margins of its linear part (:func:`autoscaler_margins`); None for a static
        feed-forward.
    predicted_cycle : RelayCycle or None
        The cycle at the operating demand (:func:`predict_autoscaler_cycle`); None when it holds a pool.
    cascade_peak : int
        Peak replicas asked for during a start-up from max(1, min replicas) (:func:`predict_startup_cascade`).
    workers_needed : float
        Demand over one worker's rate at the operating point (workers).
    gm_floor : float
        Gain margin the linear part must reach for :attr:`margins_met` (a factor).
    pm_floor_deg : float
        Phase margin it must reach for :attr:`margins_met` (degrees).
    """

    loop: AutoscalerLoop
    margins: Margins | None
    predicted_cycle: RelayCycle | None
    cascade_peak: int
    workers_needed: float
    gm_floor: float
    pm_floor_deg: float

    @property
    def pinned(self) -> bool:
        """Floor = ceiling: the rule cannot move the pool, so no loop closes (no margins to report)."""
        return self.loop.max_replicas <= max(1, self.loop.min_replicas)

    @property
    def stable(self) -> bool:
        return self.margins is None or bool(self.margins.stable)

    @property
    def margins_met(self) -> bool:
        """The linear part meets the floors (or there is no closed loop)."""
        m = self.margins
        return m is None or bool(m.stable and m.gain_margin >= self.gm_floor and m.phase_margin_deg >= self.pm_floor_deg)

    @property
    def overshoot_bounded(self) -> bool:
        """A start-up from the floor asks for at most one worker more than the demand needs, or
        than the floor holds: workers held on purpose (for a burst shorter than the start-up) are
        the setting, not an overshoot of the rule."""
        return self.cascade_peak <= max(math.ceil(self.workers_needed - 1e-9) + 1, self.loop.min_replicas)

    @property
    def ceiling_carries(self) -> bool:
        """The largest pool the rule may ask for carries the demand."""
        return self.loop.max_replicas >= self.workers_needed

    @property
    def passed(self) -> bool:
        """No predicted cycle at the operating point, a ceiling that carries the demand and a
        bounded start-up overshoot.

        The linear part's margins are reported but not required: they describe the regime where
        the pool is short and the queue integrates (or, for a utilisation metric counted over
        starting workers, the compounding during a start-up), which every reactive rule behind a
        start-up of minutes fails - what matters there is how far it overshoots, which
        :attr:`overshoot_bounded` checks. At an operating point the pool can carry, the loop is
        open (the metric sits at its served value) unless it relays, which the cycle check finds.
        """
        return self.predicted_cycle is None and self.overshoot_bounded and self.ceiling_carries

    def to_dict(self) -> dict:
        m = self.margins
        cyc = self.predicted_cycle
        lin = self.loop.linear()
        return {"passed": self.passed, "stable": self.stable, "margins_met": self.margins_met,
                "overshoot_bounded": self.overshoot_bounded, "ceiling_carries": self.ceiling_carries,
                "linear_part": None if lin is None else (
                    f"none: pinned at {self.loop.max_replicas} workers (floor = ceiling)" if self.pinned
                    else "where the pool is short of capacity (the overshoot regime)"),
                "gain_reduction_to_stabilize": None if m is None or m.stable else _finite(m.lower_gain_margin),
                "gain_margin": None if m is None else _finite(m.gain_margin),
                "phase_margin_deg": None if m is None else _finite(m.phase_margin_deg),
                "delay_margin_s": None if m is None else _finite(m.delay_margin_s),
                "loop_delay_s": self.loop.delay_s,
                "loop": "static feed-forward" if lin is None else "pinned pool" if self.pinned else lin.name,
                "predicted_cycle": None if cyc is None else cyc.to_dict(),
                "cascade_peak_replicas": self.cascade_peak, "workers_needed": self.workers_needed,
                "gm_floor": self.gm_floor, "pm_floor_deg": self.pm_floor_deg}

    def summary(self) -> str:
        """One line from the numbers."""
        d = self.to_dict()
        c = self.predicted_cycle
        cyc = (f"predicts a {c.period_s:.0f} s cycle between {c.low_replicas} and {c.high_replicas} workers "
               f"(queue peak {c.queue_peak:.0f})" if c else "predicts no cycle")
        if self.pinned:
            loop = f"no closed loop (pinned at {self.loop.max_replicas} workers: floor = ceiling)"
        elif self.margins is None:
            loop = "no closed loop (a static feed-forward on the demand)"
        else:
            gm = "inf" if d["gain_margin"] is None else f"{d['gain_margin']:.2f}"
            pm = "n/a" if d["phase_margin_deg"] is None else f"{d['phase_margin_deg']:.0f} deg"
            loop = (f"{'stable' if self.stable else 'UNSTABLE'} loop ({d['loop']}), GM {gm}, PM {pm}, "
                    f"delay {self.loop.delay_s:.0f} s")
        short = "" if self.ceiling_carries else f"; its ceiling of {self.loop.max_replicas} cannot carry the demand"
        return (f"{'PASS' if self.passed else 'FAIL'} {self.loop.name} on {self.loop.signal} (target "
                f"{self.loop.target:g}): {loop}; {cyc}; a step from {max(1, self.loop.min_replicas)} worker(s) asks "
                f"for up to {self.cascade_peak} during start-up ({self.workers_needed:.2f} needed){short}")


def _finite(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def certify_autoscaler(controller, point: PoolOperatingPoint, *, gm_floor: float = 2.0,
                       pm_floor_deg: float = 45.0) -> AutoscalerCertificate:
    """Margins of the linear part, the predicted cycle and the start-up cascade of one autoscaler.

    Parameters
    ----------
    controller : autoscaler
        A :class:`HorizontalPodAutoscaler`, :class:`KnativeAutoscaler`, :class:`AIBrixAPA` or
        ``RayServeAutoscaler`` (see :func:`autoscaler_loop`).
    point : PoolOperatingPoint
        The pool and demand it is certified at.
    gm_floor : float
        Gain margin required for :attr:`AutoscalerCertificate.margins_met` (default 2).
    pm_floor_deg : float
        Phase margin required for it (degrees; default 45).

    Raises
    ------
    ConfigError
        As :func:`autoscaler_loop`, for a controller or metric with no loop model.
    """
    loop = autoscaler_loop(controller, point)
    pinned = loop.max_replicas <= max(1, loop.min_replicas)   # floor = ceiling: no loop closes
    return AutoscalerCertificate(loop, None if pinned else autoscaler_margins(loop), predict_autoscaler_cycle(loop),
                                 predict_startup_cascade(loop, max(1, loop.min_replicas)), point.workers_needed,
                                 gm_floor, pm_floor_deg)
