"""Today's autoscalers as faithful baselines (issue 6 builds the reconfiguration study on them).

Each is a :class:`tokenfactory.controllers.interface.SampledController` whose ``update(t, measurement)``
returns a :class:`ScaleAction` (desired workers of one pool); the decision core is a pure
``recommend`` method so it can be checked against hand-worked sequences from the documented
algorithm. The metric is any function of the :class:`tokenfactory.core.signals.Measurement`.

* :class:`HorizontalPodAutoscaler` - Kubernetes HPA, autoscaling/v2 (kubernetes.io docs,
  "Horizontal Pod Autoscaling", algorithm details and default behavior): desired =
  ceil(current x metric / target), no change while |metric / target - 1| <= 0.1 (tolerance);
  scale-down stabilization window 300 s (the highest recommendation in the window is used);
  default scale-up policies 4 pods or 100 % per 15 s, the larger wins; scale-down 100 % per 15 s;
  sync period 15 s.
* :class:`KnativeAutoscaler` - Knative KPA (knative.dev docs, "Additional autoscaling
  configuration for Knative Pod Autoscaler"): stable window 60 s, panic window 10 % of it (6 s),
  panic threshold 200 %, max scale-up rate 1000, max scale-down rate 2, tick 2 s; desired =
  ceil(window-average metric / target per replica); in panic mode it never scales down and it
  leaves panic after a stable window without a panic condition.
* :class:`DynamoThroughputPlanner` - NVIDIA Dynamo planner, throughput (SLA) mode: every
  adjustment interval (180 s) predict the next interval's demand with the planner's predictors
  (constant, ARIMA, Kalman; here :mod:`tokenfactory.controllers.load_predictors`) and set
  replicas = ceil(predicted demand / per-engine capacity).
* :class:`DynamoLoadPlanner` - Dynamo planner, load mode: every 5 s tick, +1 replica when the
  per-replica load exceeds the SLA target, -1 only if the load consolidated onto one replica
  fewer (load x n / (n - 1)) stays under 80 % of the target.
* :class:`AIBrixAPA` - AIBrix APA: scale to ceil(current x metric / target) only outside a
  +/-10 % band around the target, and scale down no sooner than 300 s after the last change.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from tokenfactory.controllers.interface import SampledController
from tokenfactory.core.signals import Measurement, ScaleAction
from tokenfactory.core.validation import ConfigError, check_choice, check_int, check_number

__all__ = ["ScaleAction", "HorizontalPodAutoscaler", "KnativeAutoscaler", "DynamoThroughputPlanner",
           "DynamoLoadPlanner", "AIBrixAPA", "POOL_METRICS"]



#: metrics a pool autoscaler can watch, as functions of a Measurement
POOL_METRICS: dict[str, Callable[[Measurement], float]] = {
    "decode_utilization": lambda m: m.decode_utilization,   # per-replica average, HPA-style
    "decode_concurrency": lambda m: m.active_decodes + m.ready,  # total, KPA-style
    "fill_utilization": lambda m: m.admitted_rate / m.fill_capacity if m.fill_capacity > 0 else 0.0,
    "fill_concurrency": lambda m: m.fill_in_progress + m.backlog,
    # KV demand per KV capacity, waiting sequences included (vLLM's running + waiting): > 1 = queueing
    "kv_occupancy": lambda m: m.kv_occupancy if m.decode_slots > 0 else 0.0,
    # requests waiting for a decode slot per serving decode replica (vLLM num_requests_waiting)
    "decode_waiting": lambda m: m.ready / m.decode_workers if m.decode_workers > 0 else m.ready,
}


def _current(m: Measurement, pool: str, *, provisioned: bool = False) -> int:
    """Serving workers of ``pool``; with ``provisioned``, plus those still starting (a Kubernetes
    deployment's replica count, which HPA and APA scale from)."""
    n = m.decode_workers if pool == "decode" else m.fill_workers
    if not math.isfinite(n):
        raise ConfigError("measurement", f"the plant does not report {pool}_workers")
    if provisioned:
        n += m.decode_workers_starting if pool == "decode" else m.fill_workers_starting
    return int(round(n))


class _PoolAutoscaler(SampledController):
    """What every pool autoscaler shares: the pool it sizes and its replica bounds."""

    def _init_pool(self, where: str, pool: str, min_replicas: int, max_replicas: int) -> None:
        self.pool = check_choice(f"{where}.pool", pool, ("fill", "decode"))
        self.min_replicas = check_int(f"{where}.min_replicas", min_replicas, low=0)
        self.max_replicas = check_int(f"{where}.max_replicas", max_replicas, low=max(1, self.min_replicas))

    def _bounded(self, replicas: int) -> int:
        return int(min(max(replicas, self.min_replicas), self.max_replicas))


class HorizontalPodAutoscaler(_PoolAutoscaler):
    """Kubernetes HPA on a per-replica average metric (e.g. utilization 0-1) with target ``target``.

    The current replica count is the deployment's (serving plus starting workers), while the
    metric comes from serving workers only; during a start-up both together can cascade.

    Parameters
    ----------
    pool : str
        The pool it sizes: ``"fill"`` or ``"decode"``.
    target : float
        Desired value of the metric (> 0; a utilization in 0-1, or KV occupancy).
    metric : str
        A key of :data:`POOL_METRICS`: the measured signal the target refers to (default
        ``"decode_utilization"``).
    min_replicas, max_replicas : int
        Bounds of the recommendation (workers; defaults 1 and 1000; max >= max(1, min)).
    tolerance : float
        No change while |metric / target - 1| is at most this ([0, 1]; default 0.1).
    downscale_stabilization_s : float
        Scale-down stabilization window (s, >= 0; default 300): never scale below the highest
        recommendation of this window.
    scale_up_pods : int
        Scale-up policy: add at most this many pods per sample (>= 0; default 4) ...
    scale_up_percent : float
        ... or this percentage of the current count (>= 0; default 100), whichever allows more.
    scale_down_percent : float
        Scale-down policy: remove at most this percentage per sample ([0, 100]; default 100).
    sample_period : float
        Sync period (s, > 0; default 15); the scaling policies apply per sample.
    """

    name = "hpa"

    def __init__(self, pool: str, target: float, metric: str = "decode_utilization", *, min_replicas: int = 1,
                 max_replicas: int = 1000, tolerance: float = 0.1, downscale_stabilization_s: float = 300.0,
                 scale_up_pods: int = 4, scale_up_percent: float = 100.0, scale_down_percent: float = 100.0,
                 sample_period: float = 15.0):
        super().__init__(sample_period)
        self._init_pool("hpa", pool, min_replicas, max_replicas)
        self.target = check_number("hpa.target", target, low=0.0, low_inclusive=False)
        self.metric = check_choice("hpa.metric", metric, POOL_METRICS)
        self.tolerance = check_number("hpa.tolerance", tolerance, low=0.0, high=1.0)
        self.downscale_stabilization_s = check_number("hpa.downscale_stabilization_s", downscale_stabilization_s, low=0.0)
        self.scale_up_pods = check_int("hpa.scale_up_pods", scale_up_pods, low=0)
        self.scale_up_percent = check_number("hpa.scale_up_percent", scale_up_percent, low=0.0)
        self.scale_down_percent = check_number("hpa.scale_down_percent", scale_down_percent, low=0.0, high=100.0)
        self.reset()

    def reset(self) -> None:
        self._recs: deque = deque()  # (t, recommendation) for the scale-down stabilization window

    def recommend(self, t: float, current: int, metric_value: float) -> int:
        """The HPA decision at one sync (records the raw recommendation for stabilization).

        Parameters
        ----------
        t : float
            Time of the sync (s).
        current : int
            Current replicas (the deployment's, starting ones included).
        metric_value : float
            The metric's current per-replica average.

        Returns
        -------
        int
            Desired replicas: ceil(current x metric / target) outside the tolerance,
            stabilized on scale-down, rate-limited by the policies, within the bounds.
        """
        ratio = metric_value / self.target
        raw = current if abs(ratio - 1.0) <= self.tolerance else math.ceil(current * ratio - 1e-9)
        self._recs.append((t, raw))
        while self._recs and self._recs[0][0] < t - self.downscale_stabilization_s:
            self._recs.popleft()
        # scale-down stabilization: never below the highest recommendation in the window
        desired = raw if raw >= current else min(current, max(r for _, r in self._recs))
        up_limit = max(current + self.scale_up_pods, math.floor(current * (1 + self.scale_up_percent / 100.0)))
        down_limit = math.ceil(current * (1 - self.scale_down_percent / 100.0))
        desired = min(max(desired, down_limit), up_limit)
        return self._bounded(desired)

    def update(self, t: float, m: Measurement) -> ScaleAction:
        """One sync on the plant's sample: :meth:`recommend` as a :class:`ScaleAction`."""
        # currentReplicas is the deployment's spec (starting pods included); the metric is the
        # average over pods that report it (serving ones) - together they cascade during start-up
        return ScaleAction(self.pool, self.recommend(t, _current(m, self.pool, provisioned=True),
                                                     POOL_METRICS[self.metric](m)))

    def params(self) -> dict:
        return {k: getattr(self, k) for k in ("pool", "target", "metric", "min_replicas", "max_replicas", "tolerance",
                                              "downscale_stabilization_s", "scale_up_pods", "scale_up_percent",
                                              "scale_down_percent", "sample_period")}


class KnativeAutoscaler(_PoolAutoscaler):
    """Knative KPA on a total metric (e.g. concurrency) with ``target`` per replica.

    Parameters
    ----------
    pool : str
        The pool it sizes: ``"fill"`` or ``"decode"``.
    target : float
        Metric per replica the autoscaler aims for (> 0; e.g. sequences in flight per
        replica).
    metric : str
        A key of :data:`POOL_METRICS`: the measured signal the target refers to (default
        ``"decode_concurrency"``).
    min_replicas, max_replicas : int
        Bounds of the recommendation (workers; defaults 1 and 1000; max >= max(1, min)).
    stable_window_s : float
        Averaging window of the stable mode (s, [6, 3600]; default 60).
    panic_window_percent : float
        The panic window as a percentage of the stable window ([1, 100]; default 10, i.e. 6 s).
    panic_threshold_percent : float
        Enter panic when the panic-window recommendation reaches this percentage of the
        current replicas ([110, 1000]; default 200).
    max_scale_up_rate : float
        At most this factor x current replicas per decision (> 1; default 1000).
    max_scale_down_rate : float
        At least current replicas / this factor per decision (> 1; default 2).
    sample_period : float
        Tick (s, > 0; default 2).
    """

    name = "kpa"

    def __init__(self, pool: str, target: float, metric: str = "decode_concurrency", *, min_replicas: int = 1,
                 max_replicas: int = 1000, stable_window_s: float = 60.0, panic_window_percent: float = 10.0,
                 panic_threshold_percent: float = 200.0, max_scale_up_rate: float = 1000.0,
                 max_scale_down_rate: float = 2.0, sample_period: float = 2.0):
        super().__init__(sample_period)
        self._init_pool("kpa", pool, min_replicas, max_replicas)
        self.target = check_number("kpa.target", target, low=0.0, low_inclusive=False)
        self.metric = check_choice("kpa.metric", metric, POOL_METRICS)
        self.stable_window_s = check_number("kpa.stable_window_s", stable_window_s, low=6.0, high=3600.0)
        self.panic_window_s = self.stable_window_s * check_number(
            "kpa.panic_window_percent", panic_window_percent, low=1.0, high=100.0) / 100.0
        self.panic_threshold = check_number("kpa.panic_threshold_percent", panic_threshold_percent,
                                            low=110.0, high=1000.0) / 100.0
        self.max_scale_up_rate = check_number("kpa.max_scale_up_rate", max_scale_up_rate, low=1.0, low_inclusive=False)
        self.max_scale_down_rate = check_number("kpa.max_scale_down_rate", max_scale_down_rate, low=1.0,
                                                low_inclusive=False)
        self.reset()

    def reset(self) -> None:
        self._obs: deque = deque()
        self._panic_since: float | None = None   # last time the panic condition held
        self.in_panic = False

    def _avg(self, t: float, window: float) -> float:
        vals = [v for (s, v) in self._obs if s > t - window]
        return sum(vals) / len(vals) if vals else 0.0

    def recommend(self, t: float, current: int, metric_value: float) -> int:
        """The KPA decision at one tick (records the observation in the windows).

        Parameters
        ----------
        t : float
            Time of the tick (s).
        current : int
            Serving (ready) replicas.
        metric_value : float
            The metric's current total over the pool.

        Returns
        -------
        int
            Desired replicas: ceil(stable-window average / target), or in panic
            max(ceil(panic-window average / target), current); rate-limited and within the
            bounds.
        """
        self._obs.append((t, metric_value))
        while self._obs and self._obs[0][0] <= t - self.stable_window_s:
            self._obs.popleft()
        stable = math.ceil(self._avg(t, self.stable_window_s) / self.target - 1e-9)
        panic = math.ceil(self._avg(t, self.panic_window_s) / self.target - 1e-9)
        ready = max(current, 1)
        if panic / ready >= self.panic_threshold:
            self.in_panic, self._panic_since = True, t
        elif self.in_panic and t - self._panic_since >= self.stable_window_s:
            self.in_panic = False
        desired = max(panic, current) if self.in_panic else stable
        desired = min(desired, math.ceil(ready * self.max_scale_up_rate))
        desired = max(desired, math.floor(ready / self.max_scale_down_rate))
        return self._bounded(desired)

    def update(self, t: float, m: Measurement) -> ScaleAction:
        """One tick on the plant's sample: :meth:`recommend` as a :class:`ScaleAction`."""
        return ScaleAction(self.pool, self.recommend(t, _current(m, self.pool), POOL_METRICS[self.metric](m)))

    def params(self) -> dict:
        return {k: getattr(self, k) for k in ("pool", "target", "metric", "min_replicas", "max_replicas",
                                              "stable_window_s", "panic_window_s", "panic_threshold",
                                              "max_scale_up_rate", "max_scale_down_rate", "sample_period")}


class DynamoThroughputPlanner(_PoolAutoscaler):
    """Dynamo throughput-mode planner: predicted demand / per-engine capacity, every interval.

    Each adjustment interval the planner records the interval's request count, asks its load
    predictor (:mod:`tokenfactory.controllers.load_predictors`: Dynamo's ``constant``, ``arima``
    - the planner's default - or ``kalman``) for the next interval's count, and sizes the pool
    for it. Dynamo predicts once per interval for both pools: planners of the two pools may share
    one predictor object (the first to sample at a time records the count, the other reads the
    same forecast). The plants average rates over a controller's sample period (what a scrape of
    counters gives), so the count is the interval's mean rate x the interval.

    Parameters
    ----------
    pool : str
        The pool it sizes: ``"fill"`` or ``"decode"``.
    per_engine_rps : float
        Demand one worker serves at its target load (requests/s, > 0).
    predictor : str or LoadPredictor
        ``"constant"`` (default), ``"arima"`` or ``"kalman"`` (a fresh predictor with Dynamo's
        defaults), or a predictor object (shared between the pools' planners).
    metric : callable, optional
        ``metric(measurement) -> requests/s``, the demand the pool receives (default: the
        admitted rate).
    demand_scale : callable, optional
        ``demand_scale(measurement) -> factor`` applied to the predicted rate, e.g. the prompt
        length now over the nominal one for the fill pool (Dynamo predicts ISL too); default 1.
    warmup : sequence of float, optional
        Interval rates before the run (requests/s, oldest first): Dynamo's warm-up trace.
    min_replicas, max_replicas : int
        Bounds of the recommendation (workers; defaults 1 and 1000; max >= max(1, min)).
    sample_period : float
        Adjustment interval (s, > 0; default 180).
    observe_period : float
        Dynamo's metric-collection period; accepted for its configuration shape and recorded, but
        the plants' interval averaging makes it unnecessary here (default 5).
    """

    name = "dynamo-throughput"

    def __init__(self, pool: str, per_engine_rps: float, predictor="constant", *,
                 metric: Callable[[Measurement], float] | None = None,
                 demand_scale: Callable[[Measurement], float] | None = None, warmup=None, min_replicas: int = 1,
                 max_replicas: int = 1000, sample_period: float = 180.0, observe_period: float = 5.0):
        from tokenfactory.controllers.load_predictors import LoadPredictor, make_load_predictor

        super().__init__(sample_period)
        self._init_pool("dynamo", pool, min_replicas, max_replicas)
        self.per_engine_rps = check_number("dynamo.per_engine_rps", per_engine_rps, low=0.0, low_inclusive=False)
        if isinstance(predictor, LoadPredictor):
            self._predictor, self.predictor = predictor, predictor.name
        else:
            self.predictor = check_choice("dynamo.predictor", predictor, ("constant", "arima", "kalman"))
            self._predictor = make_load_predictor(self.predictor)
        self.metric = metric or (lambda m: m.admitted_rate)  # the demand the pool receives
        self.demand_scale = demand_scale
        self.warmup = None if warmup is None else [float(v) for v in warmup]
        self.reset()

    def reset(self) -> None:
        p = self._predictor
        if getattr(p, "_reset_by", None) is not self and getattr(p, "_reset_by", None) is not None:
            return  # a shared predictor is reset (and warmed up) once, by its first planner
        p.reset()
        p._reset_by, p._last_t = self, None
        if self.warmup is not None:
            p.warm_up([v * self.sample_period for v in self.warmup])

    def recommend(self, demand_this_interval: float, t: float | None = None, scale: float = 1.0) -> int:
        """Record this interval's demand and size the pool for the predicted next one.

        Parameters
        ----------
        demand_this_interval : float
            Demand observed at this adjustment (requests/s).
        t : float, optional
            Time of the adjustment; a predictor shared with another pool's planner records one
            value per time.
        scale : float
            Factor on the predicted demand (:attr:`demand_scale`).

        Returns
        -------
        int
            ceil(predicted demand x ``scale`` / ``per_engine_rps``) within the bounds.
        """
        p = self._predictor
        if t is None or p._last_t != t:
            p.observe(float(demand_this_interval) * self.sample_period)  # Dynamo's predictors see counts
            p._last_t = t
        pred = p.predict_next() / self.sample_period
        want = math.ceil(max(pred, 0.0) * scale / self.per_engine_rps - 1e-9)
        return self._bounded(want)

    def update(self, t: float, m: Measurement) -> ScaleAction:
        """One adjustment on the plant's sample: :meth:`recommend` as a :class:`ScaleAction`."""
        scale = self.demand_scale(m) if self.demand_scale is not None else 1.0
        return ScaleAction(self.pool, self.recommend(self.metric(m), t, scale))

    def params(self) -> dict:
        return {"pool": self.pool, "per_engine_rps": self.per_engine_rps, "predictor": self.predictor,
                "min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                "sample_period": self.sample_period, "warmup_points": len(self.warmup or [])}


class DynamoLoadPlanner(_PoolAutoscaler):
    """Dynamo load-mode planner: +1 above the SLA target, -1 only if consolidation stays < 80 %.

    Parameters
    ----------
    pool : str
        The pool it sizes: ``"fill"`` or ``"decode"``.
    sla_target : float
        Per-replica load above which a replica is added (> 0; default 0.9).
    metric : str
        A key of :data:`POOL_METRICS`: the measured signal the target refers to (default
        ``"decode_utilization"``).
    consolidation_fraction : float
        Remove a replica only if the load spread over one replica fewer stays under this
        fraction of ``sla_target`` ((0, 1]; default 0.8).
    min_replicas, max_replicas : int
        Bounds of the recommendation (workers; defaults 1 and 1000; max >= max(1, min)).
    sample_period : float
        Tick (s, > 0; default 5).
    """

    name = "dynamo-load"

    def __init__(self, pool: str, sla_target: float = 0.9, metric: str = "decode_utilization", *,
                 consolidation_fraction: float = 0.8, min_replicas: int = 1, max_replicas: int = 1000,
                 sample_period: float = 5.0):
        super().__init__(sample_period)
        self._init_pool("dynamo", pool, min_replicas, max_replicas)
        self.sla_target = check_number("dynamo.sla_target", sla_target, low=0.0, low_inclusive=False)
        self.metric = check_choice("dynamo.metric", metric, POOL_METRICS)
        self.consolidation_fraction = check_number("dynamo.consolidation_fraction", consolidation_fraction,
                                                   low=0.0, high=1.0, low_inclusive=False)

    def recommend(self, current: int, load: float) -> int:
        """The load-mode decision at one tick.

        Parameters
        ----------
        current : int
            Serving replicas.
        load : float
            The metric's current per-replica value.

        Returns
        -------
        int
            current + 1, current - 1 or current, within the bounds.
        """
        if load > self.sla_target:
            want = current + 1
        elif current > 1 and load * current / (current - 1) < self.consolidation_fraction * self.sla_target:
            want = current - 1
        else:
            want = current
        return self._bounded(want)

    def update(self, t: float, m: Measurement) -> ScaleAction:
        """One tick on the plant's sample: :meth:`recommend` as a :class:`ScaleAction`."""
        return ScaleAction(self.pool, self.recommend(_current(m, self.pool), POOL_METRICS[self.metric](m)))

    def params(self) -> dict:
        return {"pool": self.pool, "sla_target": self.sla_target, "metric": self.metric,
                "consolidation_fraction": self.consolidation_fraction, "sample_period": self.sample_period}


class AIBrixAPA(_PoolAutoscaler):
    """AIBrix APA: a +/-10 % band around the target and a 300 s scale-down cooldown.

    Parameters
    ----------
    pool : str
        The pool it sizes: ``"fill"`` or ``"decode"``.
    target : float
        Desired per-replica value of the metric (> 0).
    metric : str
        A key of :data:`POOL_METRICS`: the measured signal the target refers to (default
        ``"decode_utilization"``).
    up_band : float
        Scale up only when metric / target exceeds 1 + this ([0, 1]; default 0.1).
    down_band : float
        Scale down only when metric / target is below 1 - this ([0, 1]; default 0.1).
    scale_down_cooldown_s : float
        No scale-down sooner than this after the last change, up or down (s, >= 0; default 300).
    min_replicas, max_replicas : int
        Bounds of the recommendation (workers; defaults 1 and 1000; max >= max(1, min)).
    sample_period : float
        Decision period (s, > 0; default 15).
    """

    name = "aibrix-apa"

    def __init__(self, pool: str, target: float, metric: str = "decode_utilization", *, up_band: float = 0.1,
                 down_band: float = 0.1, scale_down_cooldown_s: float = 300.0, min_replicas: int = 1,
                 max_replicas: int = 1000, sample_period: float = 15.0):
        super().__init__(sample_period)
        self._init_pool("apa", pool, min_replicas, max_replicas)
        self.target = check_number("apa.target", target, low=0.0, low_inclusive=False)
        self.metric = check_choice("apa.metric", metric, POOL_METRICS)
        self.up_band = check_number("apa.up_band", up_band, low=0.0, high=1.0)
        self.down_band = check_number("apa.down_band", down_band, low=0.0, high=1.0)
        self.scale_down_cooldown_s = check_number("apa.scale_down_cooldown_s", scale_down_cooldown_s, low=0.0)
        self.reset()

    def reset(self) -> None:
        self._last_change = -math.inf

    def recommend(self, t: float, current: int, metric_value: float) -> int:
        """The APA decision at one sample (records the time of a change for the cooldown).

        Parameters
        ----------
        t : float
            Time of the decision (s).
        current : int
            Current replicas (serving plus starting).
        metric_value : float
            The metric's current per-replica value.

        Returns
        -------
        int
            ceil(current x metric / target) outside the band (down only after the cooldown),
            else current; within the bounds.
        """
        ratio = metric_value / self.target
        want = current
        if ratio > 1.0 + self.up_band:
            want = math.ceil(current * ratio - 1e-9)
        elif ratio < 1.0 - self.down_band and t - self._last_change >= self.scale_down_cooldown_s:
            want = math.ceil(current * ratio - 1e-9)
        want = self._bounded(want)
        if want != current:
            self._last_change = t
        return want

    def update(self, t: float, m: Measurement) -> ScaleAction:
        """One decision on the plant's sample: :meth:`recommend` as a :class:`ScaleAction`."""
        return ScaleAction(self.pool, self.recommend(t, _current(m, self.pool, provisioned=True),
                                                     POOL_METRICS[self.metric](m)))

    def params(self) -> dict:
        return {"pool": self.pool, "target": self.target, "metric": self.metric, "up_band": self.up_band,
                "down_band": self.down_band, "scale_down_cooldown_s": self.scale_down_cooldown_s,
                "sample_period": self.sample_period}
