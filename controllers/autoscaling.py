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
  policies count the scale events of their period; sync period 15 s.
* :class:`KnativeAutoscaler` - Knative KPA (knative.dev docs, "Additional autoscaling
  configuration for Knative Pod Autoscaler"): stable window 60 s, panic window 10 % of it (6 s),
  panic threshold 200 %, max scale-up rate 1000, max scale-down rate 2, tick 2 s; desired =
  ceil(window-average metric / target per replica); in panic mode it never scales down and it
  leaves panic after a stable window without a panic condition.
* :class:`DynamoThroughputPlanner` - NVIDIA Dynamo planner, throughput (SLA) mode: every
  adjustment interval (180 s) predict the next interval's demand with the planner's predictors
  (constant, ARIMA, Kalman; here :mod:`tokenfactory.controllers.load_predictors`) and set
  replicas = ceil(predicted demand / per-engine capacity).
* :class:`DynamoLoadPlanner` - Dynamo planner's load-based scaling (``throughput`` and ``load``
  targets of ai-dynamo 1.4.2): every 5 s tick, +1 replica when a worker's queued prompt tokens
  (fill) or KV use (decode) reach the scale-up threshold, -1 when all are below the scale-down
  one, both pools frozen while either scales; checked tick by tick against the real planner.
* :class:`AIBrixAPA` - AIBrix APA: scale to ceil(current x metric / target) only outside a
  +/-10 % band around the target, at most x2 up and /2 down per decision, and scale down no
  sooner than 300 s after the last change.

The HPA, KPA and APA decision cores carry their upstream unit-test cases
(``tests/test_autoscaling_upstream.py``, each case citing its file and test).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from tokenfactory.controllers.interface import SampledController
from tokenfactory.core.signals import Measurement, ScaleAction
from tokenfactory.core.validation import (REQUIRED, ConfigError, check_choice, check_fields, check_int, check_number,
                                          config_or_fields, setting)

__all__ = ["ScaleAction", "HPASpec", "HorizontalPodAutoscaler", "KnativeAutoscaler", "DynamoThroughputPlanner",
           "DynamoLoadPlanner", "AIBrixAPA", "POOL_METRICS", "DYNAMO_THROUGHPUT_TARGET", "dynamo_load_thresholds",
           "hpa_policy_limit"]



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


def serving_replicas(m: Measurement, pool: str, *, provisioned: bool = False) -> int:
    """Serving workers of ``pool``; with ``provisioned``, plus those still starting (a Kubernetes
    deployment's replica count, which HPA and APA scale from)."""
    n = m.decode_workers if pool == "decode" else m.fill_workers
    if not math.isfinite(n):
        raise ConfigError("measurement", f"the plant does not report {pool}_workers")
    if provisioned:
        n += m.decode_workers_starting if pool == "decode" else m.fill_workers_starting
    return int(round(n))


class PoolAutoscaler(SampledController):
    """What every pool autoscaler shares: the pool it sizes and its replica bounds."""

    def _init_pool(self, where: str, pool: str, min_replicas: int, max_replicas: int) -> None:
        self.pool = check_choice(f"{where}.pool", pool, ("fill", "decode"))
        self.min_replicas = check_int(f"{where}.min_replicas", min_replicas, low=0)
        self.max_replicas = check_int(f"{where}.max_replicas", max_replicas, low=max(1, self.min_replicas))

    def _bounded(self, replicas: int) -> int:
        return int(min(max(replicas, self.min_replicas), self.max_replicas))


_SELECT = ("max", "min", "disabled")


@dataclass(frozen=True)
class HPASpec:
    """What a :class:`HorizontalPodAutoscaler` runs: the autoscaling/v2 ``HorizontalPodAutoscaler``
    spec fields the model covers (one ``spec.metrics`` entry's target and metric,
    ``spec.minReplicas`` / ``maxReplicas``, ``spec.behavior.scaleUp`` / ``scaleDown``:
    ``stabilizationWindowSeconds``, ``policies``, ``selectPolicy``) and the controller-manager's
    ``--horizontal-pod-autoscaler-tolerance`` and ``--horizontal-pod-autoscaler-sync-period``
    (validated here, fields named ``hpa.FIELD``; :mod:`tokenfactory.controllers.formats` builds it
    from a manifest). The defaults are declared here only (upstream's, as documented below).

    Parameters
    ----------
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
        Scale-down stabilization window (s, >= 0; default 300).
    upscale_stabilization_s : float
        Scale-up stabilization window (s, >= 0; default 0).
    scale_up_pods : int
        The default scale-up pods policy: this many pods per 15 s (>= 0; default 4) ...
    scale_up_percent : float
        ... and the percent policy: this percentage per 15 s (>= 0; default 100).
    scale_down_percent : float
        The default scale-down policy: this percentage per 15 s ([0, 100]; default 100).
    scale_up_policies, scale_down_policies : sequence of (kind, value, period_s), optional
        Policies replacing the defaults above: kind ``"pods"`` or ``"percent"``, value >= 0,
        period in (0, 1800] s (Kubernetes' bounds).
    scale_up_select, scale_down_select : str
        ``"max"`` (default), ``"min"`` or ``"disabled"``.
    starting_unready : bool
        Treat starting workers as unready pods, as upstream's replica calculator does (counted at 0
        on a scale-up, sized from the ready ones on a scale-down; kubernetes
        ``pkg/controller/podautoscaler/replica_calculator.go``, read at commits 0006726 and
        19e8ce7). Default True. False: every provisioned worker at the serving workers' average
        (an HPA whose starting pods report the metric; the compounding start-up cascade).
    sample_period : float
        Sync period (s, > 0; default 15).

    Raises
    ------
    ConfigError
        For a value outside its range.
    """

    target: float = setting(REQUIRED, low=0.0, low_inclusive=False, meaning="desired per-replica metric value")
    metric: str = setting("decode_utilization", kind=str, choices=tuple(POOL_METRICS),
                          meaning="the measured signal the target refers to")
    min_replicas: int = setting(1, kind=int, low=0, meaning="spec.minReplicas")
    max_replicas: int = setting(1000, kind=int, low=1, meaning="spec.maxReplicas (>= minReplicas)")
    tolerance: float = setting(0.1, low=0.0, high=1.0, meaning="no change while |metric / target - 1| is at most this")
    downscale_stabilization_s: float = setting(300.0, unit="s", low=0.0,
                                               meaning="behavior.scaleDown.stabilizationWindowSeconds")
    upscale_stabilization_s: float = setting(0.0, unit="s", low=0.0,
                                             meaning="behavior.scaleUp.stabilizationWindowSeconds")
    scale_up_pods: int = setting(4, kind=int, low=0, meaning="the default scale-up Pods policy per 15 s")
    scale_up_percent: float = setting(100.0, low=0.0, meaning="the default scale-up Percent policy per 15 s")
    scale_down_percent: float = setting(100.0, low=0.0, high=100.0,
                                        meaning="the default scale-down Percent policy per 15 s")
    scale_up_policies: tuple | None = setting(None, kind="list of tables",
                                              meaning="behavior.scaleUp.policies as (kind, value, period_s) "
                                                      "(absent: the defaults above)")
    scale_down_policies: tuple | None = setting(None, kind="list of tables",
                                                meaning="behavior.scaleDown.policies (absent: the default above)")
    scale_up_select: str = setting("max", kind=str, choices=_SELECT, meaning="behavior.scaleUp.selectPolicy")
    scale_down_select: str = setting("max", kind=str, choices=_SELECT, meaning="behavior.scaleDown.selectPolicy")
    starting_unready: bool = setting(True, kind=bool, meaning="starting workers count as unready pods")
    sample_period: float = setting(15.0, unit="s", low=0.0, low_inclusive=False, meaning="the sync period")

    def __post_init__(self) -> None:  # checked once against the declarations, held as the values computed with
        check_fields(self, "hpa", names=("min_replicas",))  # first: it sets max_replicas's floor
        check_fields(self, "hpa", names=("max_replicas",), bounds={"max_replicas": {"low": max(1, self.min_replicas)}})
        object.__setattr__(self, "starting_unready", bool(self.starting_unready))
        check_fields(self, "hpa", names=("target", "metric", "tolerance", "downscale_stabilization_s",
                                         "upscale_stabilization_s", "scale_up_pods", "scale_up_percent",
                                         "scale_down_percent"))
        if self.scale_up_policies is not None:
            object.__setattr__(self, "scale_up_policies", _policies("hpa.scale_up_policies", self.scale_up_policies))
        if self.scale_down_policies is not None:
            object.__setattr__(self, "scale_down_policies", _policies("hpa.scale_down_policies",
                                                                      self.scale_down_policies))
        check_fields(self, "hpa", names=("scale_up_select", "scale_down_select"))


class HorizontalPodAutoscaler(PoolAutoscaler):
    """Kubernetes HPA on a per-replica average metric (e.g. utilization 0-1) with target ``target``.

    The decision follows ``pkg/controller/podautoscaler`` (horizontal.go): the raw recommendation
    ceil(current x metric / target) outside the tolerance; stabilization over the recommendations
    of the last ``upscale_stabilization_s`` (the lowest) and ``downscale_stabilization_s`` (the
    highest), never moving past the current count (``stabilizeRecommendationWithBehaviors``);
    then the scaling policies (``convertDesiredReplicasWithBehaviorRate``): each policy allows
    ``pods`` or ``percent`` of the count at the start of its period, the count the scale events of
    the period are taken back from; ``select`` picks the policy that allows the largest change
    (``max``, default), the smallest (``min``) or none (``disabled``); the bounds last.
    ``tests/test_autoscaling_upstream.py`` ports upstream's unit-test cases.

    The current replica count is the deployment's (serving plus starting workers), the metric the
    serving workers' average; the starting workers are unready pods, counted at 0 on a scale-up as
    upstream's replica calculator does (``calcPlainMetricReplicas``: pending and metric-less pods
    at 0 when the ratio is above 1), so a start-up alone does not compound; the rule still grows
    with a queue-bearing metric while the queue does.

    Parameters
    ----------
    pool : str
        The pool it sizes: ``"fill"`` or ``"decode"``.
    target : float, optional
        :attr:`HPASpec.target`, when no ``spec`` is given.
    metric : str, optional
        :attr:`HPASpec.metric`, when no ``spec`` is given.
    spec : HPASpec, optional
        The autoscaler's settings.
    **fields
        The other :class:`HPASpec` fields, when no ``spec`` is given.
    """

    name = "hpa"

    def __init__(self, pool: str, target: float | None = None, metric: str | None = None, *,
                 spec: HPASpec | None = None, **fields):
        given = {k: v for k, v in (("target", target), ("metric", metric)) if v is not None}
        self.spec = c = config_or_fields("hpa", HPASpec, spec, {**given, **fields}, name="spec")
        super().__init__(c.sample_period)
        self._init_pool("hpa", pool, c.min_replicas, c.max_replicas)
        (self.starting_unready, self.target, self.metric, self.tolerance, self.downscale_stabilization_s,
         self.upscale_stabilization_s, self.scale_up_pods, self.scale_up_percent, self.scale_down_percent) = (
            c.starting_unready, c.target, c.metric, c.tolerance, c.downscale_stabilization_s,
            c.upscale_stabilization_s, c.scale_up_pods, c.scale_up_percent, c.scale_down_percent)
        self.scale_up_policies = c.scale_up_policies if c.scale_up_policies is not None else _policies(
            "hpa.scale_up_policies", (("pods", self.scale_up_pods, 15.0), ("percent", self.scale_up_percent, 15.0)))
        self.scale_down_policies = c.scale_down_policies if c.scale_down_policies is not None else _policies(
            "hpa.scale_down_policies", (("percent", self.scale_down_percent, 15.0),))
        self.scale_up_select, self.scale_down_select = c.scale_up_select, c.scale_down_select
        self.reset()

    def reset(self) -> None:
        self._recs: list = []  # (t, unstabilized recommendation)
        self._up_events: list = []  # (t, replicas added)
        self._down_events: list = []  # (t, replicas removed)

    def raw(self, current: int, metric_value: float, ready: int | None = None, unready: int = 0,
            missing: int = 0, missing_fallback: float | None = None) -> int:
        """The replica calculator (upstream ``replica_calculator.go``, ``calcPlainMetricReplicas``).

        ``metric_value`` is the average over the ``ready`` pods that report it. Without unready or
        missing pods: ceil(ratio x ready) outside the tolerance. Otherwise the ratio is recomputed
        with missing pods at ``missing_fallback`` on a scale-down (default the target: custom
        metrics; resource utilization uses max(1, target)) and at 0 on a scale-up, and unready
        (starting) pods at 0 on a scale-up; no change when the new ratio is within the tolerance
        or crosses 1, or when the result would move against it.

        Parameters
        ----------
        current : int
            The deployment's replicas.
        metric_value : float
            Average metric over the ready pods with metrics.
        ready : int, optional
            Ready pods with metrics (default ``current``).
        unready, missing : int
            Pods not ready (starting) and ready pods without metrics (default 0).
        missing_fallback : float, optional
            A missing pod's value on a scale-down (default the target).

        Returns
        -------
        int
        """
        ready = current if ready is None else int(ready)
        ratio = metric_value / self.target
        within = abs(1.0 - ratio) <= self.tolerance
        up_with_unready = unready > 0 and ratio > 1.0
        if not up_with_unready and missing == 0:
            return current if within else math.ceil(ratio * ready)
        total, n = metric_value * ready, ready
        if missing and ratio != 1.0:  # upstream fills them in only off the target
            if ratio < 1.0:
                total += missing * (self.target if missing_fallback is None else missing_fallback)
            n += missing
        if up_with_unready:
            n += unready
        new = total / n / self.target if n else ratio
        if abs(1.0 - new) <= self.tolerance or (ratio < 1.0 < new) or (ratio > 1.0 > new):
            return current
        out = math.ceil(new * n)
        if (new < 1.0 and out > current) or (new > 1.0 and out < current):
            return current
        return out

    def stabilize(self, t: float, current: int, desired: int) -> int:
        """Upstream ``stabilizeRecommendationWithBehaviors``: the lowest recommendation of the
        scale-up window and the highest of the scale-down window bound the move from ``current``;
        ``desired`` is recorded."""
        up_cut, down_cut = t - self.upscale_stabilization_s, t - self.downscale_stabilization_s
        up_rec = down_rec = desired
        for ts, r in self._recs:
            # upstream keeps a recommendation while timestamp.After(cutoff); a sync exactly one window
            # back is kept here (the controller's own clock jitters it across the boundary)
            if ts >= up_cut and self.upscale_stabilization_s > 0:
                up_rec = min(up_rec, r)
            if ts >= down_cut and self.downscale_stabilization_s > 0:
                down_rec = max(down_rec, r)
        rec = min(max(current, up_rec), down_rec)
        keep = min(up_cut, down_cut)
        self._recs = [(ts, r) for ts, r in self._recs if ts >= keep]
        self._recs.append((t, desired))
        return rec

    def _limit(self, t: float, current: int, up: bool) -> int:
        return hpa_policy_limit(self.scale_up_policies if up else self.scale_down_policies,
                                self.scale_up_select if up else self.scale_down_select,
                                self._up_events, self._down_events, t, current, up)

    def rate_limit(self, t: float, current: int, desired: int) -> tuple[int, str]:
        """Upstream ``convertDesiredReplicasWithBehaviorRate``: the policies' limits (never past the
        current count in the wrong direction) and the replica bounds, with the limiting condition
        (``ScaleUpLimit``, ``TooManyReplicas``, ``ScaleDownLimit``, ``TooFewReplicas`` or
        ``DesiredWithinRange``)."""
        if desired > current:
            limit = max(self._limit(t, current, True), current)
            if self.max_replicas > limit:
                top, why = limit, "ScaleUpLimit"
            else:
                top, why = self.max_replicas, "TooManyReplicas"
            if desired > top:
                return top, why
        elif desired < current:
            limit = min(self._limit(t, current, False), current)
            if self.min_replicas < limit:
                bottom, why = limit, "ScaleDownLimit"
            else:
                bottom, why = self.min_replicas, "TooFewReplicas"
            if desired < bottom:
                return bottom, why
        return desired, "DesiredWithinRange"

    def record_scale(self, t: float, current: int, new: int) -> None:
        """Upstream ``storeScaleEvent``: a rescale is an event the policies' periods count."""
        horizon = max([p for _, _, p in self.scale_up_policies + self.scale_down_policies] or [0.0])
        self._up_events = [(ts, c) for ts, c in self._up_events if ts > t - horizon]
        self._down_events = [(ts, c) for ts, c in self._down_events if ts > t - horizon]
        if new > current:
            self._up_events.append((t, new - current))
        elif new < current:
            self._down_events.append((t, current - new))

    def recommend(self, t: float, current: int, metric_value: float, ready: int | None = None,
                  unready: int = 0) -> int:
        """The HPA decision at one sync (records the recommendation and the scale event).

        Parameters
        ----------
        t : float
            Time of the sync (s).
        current : int
            Current replicas (the deployment's, starting ones included).
        metric_value : float
            The metric's current average over the ready replicas.
        ready, unready : int, optional
            Ready (serving) and unready (starting) replicas (default: all ``current`` ready).

        Returns
        -------
        int
            Desired replicas: the raw recommendation (:meth:`raw`), stabilized, rate-limited by
            the policies, within the bounds.
        """
        desired = self.stabilize(t, current, self.raw(current, metric_value, ready, unready))
        desired, _ = self.rate_limit(t, current, desired)
        desired = self._bounded(desired)
        self.record_scale(t, current, desired)
        return desired

    def update(self, t: float, m: Measurement) -> ScaleAction:
        """One sync on the plant's sample: :meth:`recommend` as a :class:`ScaleAction`."""
        # currentReplicas is the deployment's spec (starting pods included); the metric is the
        # average over pods that report it (serving ones); starting pods are unready: on a
        # scale-up upstream counts them at 0, on a scale-down it sizes from the ready ones
        provisioned = serving_replicas(m, self.pool, provisioned=True)
        if not self.starting_unready:  # starting pods that report the metric: every provisioned pod at the average
            return ScaleAction(self.pool, self.recommend(t, provisioned, POOL_METRICS[self.metric](m)))
        serving = serving_replicas(m, self.pool)
        return ScaleAction(self.pool, self.recommend(t, provisioned, POOL_METRICS[self.metric](m), serving,
                                                     provisioned - serving))

    def params(self) -> dict:
        return {k: getattr(self, k) for k in ("pool", "target", "metric", "min_replicas", "max_replicas", "tolerance",
                                              "downscale_stabilization_s", "upscale_stabilization_s", "scale_up_pods",
                                              "scale_up_percent", "scale_down_percent",
                                              "scale_up_policies", "scale_down_policies", "scale_up_select",
                                              "scale_down_select", "starting_unready", "sample_period")}


def hpa_policy_limit(policies, select: str, up_events, down_events, t: float, current: int, up: bool) -> int:
    """The replica count HPA's scaling policies allow at ``t`` (upstream
    ``calculateScaleUpLimitWithScalingRules`` / ``calculateScaleDownLimitWithBehaviors``): each
    policy ``(kind, value, period_s)`` allows ``value`` pods or percent of the count at the start of
    its period (the current count with the scale events of the period taken back); ``select``
    picks the largest change (``"max"``), the smallest (``"min"``) or none (``"disabled"``).

    Parameters
    ----------
    policies : sequence of (str, float, float)
        ``("pods" | "percent", value, period_s)``.
    select : str
        ``"max"``, ``"min"`` or ``"disabled"``.
    up_events, down_events : sequence of (float, int)
        Past scale events: (time, replicas added) and (time, replicas removed).
    t : float
        Now (s).
    current : int
        Replicas now.
    up : bool
        The direction: scale-up (True) or scale-down.

    Returns
    -------
    int
        The limit (``current`` when the direction is disabled).
    """
    if select == "disabled":
        return current
    best = None
    for kind, value, period in policies:
        added = sum(c for ts, c in up_events if ts > t - period)
        deleted = sum(c for ts, c in down_events if ts > t - period)
        start = current - added + deleted
        if up:
            prop = start + value if kind == "pods" else math.ceil(start * (1 + value / 100.0))
        else:  # Go's int32() truncates toward zero
            prop = start - value if kind == "pods" else int(start * (1 - value / 100.0))
        if best is None:
            best = prop
        elif up:
            best = max(best, prop) if select == "max" else min(best, prop)
        else:
            best = min(best, prop) if select == "max" else max(best, prop)
    return current if best is None else int(best)


def _policies(field: str, policies) -> tuple:
    out = []
    for i, pol in enumerate(policies):
        try:
            kind, value, period = pol
        except (TypeError, ValueError):
            raise ConfigError(f"{field}[{i}]", f"expected (kind, value, period_s), got {pol!r}") from None
        check_choice(f"{field}[{i}].kind", kind, ("pods", "percent"))
        out.append((kind, check_number(f"{field}[{i}].value", value, low=0.0),
                    check_number(f"{field}[{i}].period_s", period, low=0.0, high=1800.0, low_inclusive=False)))
    if not out:
        raise ConfigError(field, "needs at least one policy")
    return tuple(out)


class KnativeAutoscaler(PoolAutoscaler):
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
        self._panic_time: float | None = None  # last tick the panic condition held (knative's panicTime)
        self._max_panic_pods = 0

    @property
    def in_panic(self) -> bool:
        return self._panic_time is not None

    def _avg(self, t: float, window: float) -> float:
        vals = [v for (s, v) in self._obs if s > t - window]
        return sum(vals) / len(vals) if vals else 0.0

    def decide(self, t: float, ready: int, stable_value: float, panic_value: float) -> int:
        """Knative's decision on window averages (``pkg/autoscaler/scaling/autoscaler.go``
        ``Scale``): stable and panic pod counts ceil(value / target), each held within
        [floor(ready / max scale-down rate), ceil(max scale-up rate x ready)]; panic starts (and is
        extended) while the panic count is at least the panic threshold x ready and ends a stable
        window after the last such tick; in panic the larger count, never lower than the highest
        one of this panic.

        Parameters
        ----------
        t : float
            Time of the tick (s).
        ready : int
            Ready replicas (taken as at least 1).
        stable_value, panic_value : float
            The metric averaged over the stable and the panic window.

        Returns
        -------
        int
            Desired replicas within the bounds.
        """
        ready_f = max(1.0, float(ready))
        max_up = math.ceil(self.max_scale_up_rate * ready_f)
        max_down = math.floor(ready_f / self.max_scale_down_rate)
        dspc = math.ceil(stable_value / self.target)
        dppc = math.ceil(panic_value / self.target)
        stable = int(min(max(dspc, max_down), max_up))
        panic = int(min(max(dppc, max_down), max_up))
        over = dppc / ready_f >= self.panic_threshold
        if over:
            self._panic_time = t
        elif self._panic_time is not None and self._panic_time + self.stable_window_s < t:
            self._panic_time, self._max_panic_pods = None, 0
        desired = stable
        if self._panic_time is not None:  # never scale down in panic
            self._max_panic_pods = max(self._max_panic_pods, max(stable, panic))
            desired = self._max_panic_pods
        return self._bounded(desired)

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
            :meth:`decide` on the stable- and panic-window averages.
        """
        self._obs.append((t, metric_value))
        while self._obs and self._obs[0][0] <= t - self.stable_window_s:
            self._obs.popleft()
        return self.decide(t, current, self._avg(t, self.stable_window_s), self._avg(t, self.panic_window_s))

    def update(self, t: float, m: Measurement) -> ScaleAction:
        """One tick on the plant's sample: :meth:`recommend` as a :class:`ScaleAction`."""
        return ScaleAction(self.pool, self.recommend(t, serving_replicas(m, self.pool), POOL_METRICS[self.metric](m)))

    def params(self) -> dict:
        return {k: getattr(self, k) for k in ("pool", "target", "metric", "min_replicas", "max_replicas",
                                              "stable_window_s", "panic_window_s", "panic_threshold",
                                              "max_scale_up_rate", "max_scale_down_rate", "sample_period")}


class DynamoThroughputPlanner(PoolAutoscaler):
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


#: Dynamo planner 1.4.2's static thresholds of its default ``throughput`` target
#: (dynamo/planner/core/load_scaling.py): prefill queue / context length, decode KV use
DYNAMO_THROUGHPUT_TARGET = {"fill": (1.0, 0.1), "decode": (1.0, 0.6)}


def dynamo_load_thresholds(fill_token_budget: int) -> dict[str, tuple[float, float]]:
    """The ``load`` target's thresholds a user derives from the engine (one place: the real
    planner's adapter and :class:`DynamoLoadPlanner` take them from here): prefill scales up at one
    fill step's tokens queued per worker and down at a tenth of it (the ``throughput`` target's
    ratios 1.0 and 0.1 applied to the step budget); decode up at 90 % and down at 60 % KV use (the
    ``throughput`` target's 60 % scale-down; 90 % leaves vLLM's preemption headroom).

    Parameters
    ----------
    fill_token_budget : int
        Tokens one fill step takes (``max_num_batched_tokens``).

    Returns
    -------
    dict
        ``{"fill": (up tokens, down tokens), "decode": (up %, down %)}``.
    """
    return {"fill": (float(int(fill_token_budget)), float(int(fill_token_budget) // 10)), "decode": (90.0, 60.0)}


class DynamoLoadPlanner(PoolAutoscaler):
    """Dynamo's load-based scaling (``ai-dynamo`` 1.4.2, ``core/load_scaling.py``, the
    ``throughput`` and ``load`` optimization targets), one pool at a time.

    Every tick (5 s), per worker of the pool: fill - the prompt tokens queued beyond the step in
    progress; decode - the KV tokens of its decoding sequences plus those of the ready requests
    waiting for a slot, over its KV capacity. +1 replica when a worker is at or above
    ``scale_up``, -1 (never below one) when every worker is below ``scale_down``. With the
    ``throughput`` target the fill signal is divided by the context length and the decode
    comparisons are strict (Dynamo's ``>`` / ``<``); ``load`` compares ``>=`` / ``<=`` and its
    decode thresholds are percentages. A disaggregated Dynamo planner freezes both pools while
    either is scaling: nothing changes while a worker of either pool is starting or this pool has
    not reached its last target. The plants' measurements are pool-level, so every worker of a
    pool reports the pool's mean (``tests/test_dynamo_agreement.py`` checks these decisions tick
    by tick against the real planner on the same measurements).

    Parameters
    ----------
    pool : str
        The pool it sizes: ``"fill"`` or ``"decode"``.
    scale_up, scale_down : float
        Thresholds (``throughput``: ratios; ``load``: tokens for fill, KV % for decode;
        ``scale_up`` > ``scale_down`` >= 0). Default: Dynamo's ``throughput`` target
        (:data:`DYNAMO_THROUGHPUT_TARGET`).
    target : str
        ``"throughput"`` (Dynamo's default) or ``"load"``.
    prompt_tokens : float
        Tokens of a request's prompt (a ready request's KV; > 0; default 2048).
    context_tokens : float
        Nominal context of a decoding sequence (tokens, > 0; default 2560); the measured one is
        used when the plant reports it.
    output_tokens : float
        Output tokens of the nominal request (the context length is prompt + output; default 512).
    fill_step_tokens : float
        Tokens one fill step takes, in progress rather than queued (>= 0; default 0).
    kv_tokens_per_worker : float
        Decode KV capacity per worker (tokens, > 0; default 1).
    min_replicas, max_replicas : int
        Bounds of the recommendation (workers; defaults 1 and 1000; max >= max(1, min)).
    sample_period : float
        Tick (s, > 0; default 5, Dynamo's ``load_adjustment_interval_seconds``).
    """

    name = "dynamo-load"

    def __init__(self, pool: str, scale_up: float | None = None, scale_down: float | None = None, *,
                 target: str = "throughput", prompt_tokens: float = 2048.0, context_tokens: float = 2560.0,
                 output_tokens: float = 512.0, fill_step_tokens: float = 0.0, kv_tokens_per_worker: float = 1.0,
                 min_replicas: int = 1, max_replicas: int = 1000, sample_period: float = 5.0):
        super().__init__(sample_period)
        self._init_pool("dynamo", pool, min_replicas, max_replicas)
        self.target = check_choice("dynamo.target", target, ("throughput", "load"))
        up0, down0 = DYNAMO_THROUGHPUT_TARGET[self.pool]
        if self.target == "load" and (scale_up is None or scale_down is None):
            raise ConfigError("dynamo.scale_up", "the load target needs scale_up and scale_down")
        self.scale_up = check_number("dynamo.scale_up", up0 if scale_up is None else scale_up, low=0.0,
                                     low_inclusive=False)
        self.scale_down = check_number("dynamo.scale_down", down0 if scale_down is None else scale_down, low=0.0,
                                       high=self.scale_up, high_inclusive=False)
        self.prompt_tokens = check_number("dynamo.prompt_tokens", prompt_tokens, low=0.0, low_inclusive=False)
        self.context_tokens = check_number("dynamo.context_tokens", context_tokens, low=0.0, low_inclusive=False)
        self.output_tokens = check_number("dynamo.output_tokens", output_tokens, low=0.0)
        self.fill_step_tokens = check_number("dynamo.fill_step_tokens", fill_step_tokens, low=0.0)
        self.kv_tokens_per_worker = check_number("dynamo.kv_tokens_per_worker", kv_tokens_per_worker, low=0.0,
                                                 low_inclusive=False)
        self.reset()

    def reset(self) -> None:
        self._target: int | None = None

    def signal(self, m: Measurement) -> float:
        """One worker's signal (the pool's mean; Dynamo's forward-pass metrics are integers, so
        the token counts are rounded as they would be in a worker's report)."""
        if self.pool == "fill":
            n = serving_replicas(m, "fill")
            tokens = m.fill_queued_tokens if math.isfinite(m.fill_queued_tokens) else m.fill_in_progress * self.prompt_tokens
            per = max(tokens, 0.0) / n if n else 0.0
            queued = round(per - min(per, self.fill_step_tokens))
            if self.target == "throughput":
                return queued / int(round(self.prompt_tokens + self.output_tokens))
            return float(queued)
        n = serving_replicas(m, "decode")
        if not n:
            return 0.0
        ctx = m.decode_context_tokens if math.isfinite(m.decode_context_tokens) else self.context_tokens
        active, waiting = max(m.active_decodes, 0.0) / n, max(m.ready, 0.0) / n
        util = (round(active * ctx) + round(waiting * self.prompt_tokens)) / int(self.kv_tokens_per_worker)
        return util

    def recommend(self, current: int, value: float) -> int:
        """The load-scaling decision at one tick, outside a freeze.

        Parameters
        ----------
        current : int
            Serving replicas.
        value : float
            One worker's signal (:meth:`signal`; ``load`` decode: a fraction, compared with the
            thresholds / 100).

        Returns
        -------
        int
            current + 1, current - 1 or current, within the bounds.
        """
        up, down = self.scale_up, self.scale_down
        if self.target == "load" and self.pool == "decode":
            up, down = up / 100.0, down / 100.0
        if self.target == "load" or self.pool == "fill":
            above = value >= up
        else:
            above = value > up
        below = value <= down if self.target == "load" else value < down
        if current == 0:
            return self._bounded(current)
        if above:
            return self._bounded(current + 1)
        if current > 1 and below:
            return self._bounded(max(current - 1, 1))
        return self._bounded(current)

    def update(self, t: float, m: Measurement) -> ScaleAction:
        """One tick: hold while either pool is scaling, else :meth:`recommend`."""
        current = serving_replicas(m, self.pool)
        provisioned = serving_replicas(m, self.pool, provisioned=True)
        if self._target is not None and self._target == current and provisioned == current:
            self._target = None  # reached
        starting = m.fill_workers_starting + m.decode_workers_starting
        if starting > 0 or (self._target is not None and self._target != current):
            return ScaleAction(self.pool, self._target if self._target is not None else provisioned)
        want = self.recommend(current, self.signal(m))
        if want != current:
            self._target = want
        return ScaleAction(self.pool, want)

    def params(self) -> dict:
        return {"pool": self.pool, "target": self.target, "scale_up": self.scale_up, "scale_down": self.scale_down,
                "fill_step_tokens": self.fill_step_tokens, "kv_tokens_per_worker": self.kv_tokens_per_worker,
                "sample_period": self.sample_period}


class AIBrixAPA(PoolAutoscaler):
    """AIBrix APA: a +/-10 % band around the target, scale rates of at most x2 up and /2 down per
    decision (AIBrix's defaults, ``pkg/controller/podautoscaler/context/context.go``) and a 300 s
    scale-down cooldown.

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
    max_scale_up_rate, max_scale_down_rate : float
        At most ceil(rate x current) up and at least floor(current / rate) down per decision
        (>= 1; AIBrix's defaults 2 and 2).
    min_replicas, max_replicas : int
        Bounds of the recommendation (workers; defaults 1 and 1000; max >= max(1, min)).
    sample_period : float
        Decision period (s, > 0; default 15).
    """

    name = "aibrix-apa"

    def __init__(self, pool: str, target: float, metric: str = "decode_utilization", *, up_band: float = 0.1,
                 down_band: float = 0.1, scale_down_cooldown_s: float = 300.0, max_scale_up_rate: float = 2.0,
                 max_scale_down_rate: float = 2.0, min_replicas: int = 1, max_replicas: int = 1000,
                 sample_period: float = 15.0):
        super().__init__(sample_period)
        self._init_pool("apa", pool, min_replicas, max_replicas)
        self.max_scale_up_rate = check_number("apa.max_scale_up_rate", max_scale_up_rate, low=1.0)
        self.max_scale_down_rate = check_number("apa.max_scale_down_rate", max_scale_down_rate, low=1.0)
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
        want = current
        if t - self._last_change >= self.scale_down_cooldown_s or metric_value / self.target > 1.0 + self.up_band:
            want = self.target_replicas(current, metric_value)
        want = self._bounded(want)
        if want != current:
            self._last_change = t
        return want

    def target_replicas(self, current: int, metric_value: float) -> int:
        """AIBrix's ``computeTargetReplicas`` (``pkg/controller/podautoscaler/algorithm/apa.go``):
        ceil(current x metric / target) above 1 + ``up_band`` (at most ceil(max scale-up rate x
        current)) or below 1 - ``down_band`` (at least floor(current / max scale-down rate)), else
        ``current``; before the replica bounds and the cooldown.

        Parameters
        ----------
        current : int
            Current replicas.
        metric_value : float
            The metric's per-replica value.

        Returns
        -------
        int
        """
        ratio = metric_value / self.target
        if ratio > 1.0 + self.up_band:
            return min(math.ceil(current * ratio), math.ceil(self.max_scale_up_rate * current))
        if ratio < 1.0 - self.down_band:
            return max(math.ceil(current * ratio), math.floor(current / self.max_scale_down_rate))
        return current

    def update(self, t: float, m: Measurement) -> ScaleAction:
        """One decision on the plant's sample: :meth:`recommend` as a :class:`ScaleAction`."""
        return ScaleAction(self.pool, self.recommend(t, serving_replicas(m, self.pool, provisioned=True),
                                                     POOL_METRICS[self.metric](m)))

    def params(self) -> dict:
        return {"pool": self.pool, "target": self.target, "metric": self.metric, "up_band": self.up_band,
                "down_band": self.down_band, "scale_down_cooldown_s": self.scale_down_cooldown_s,
                "max_scale_up_rate": self.max_scale_up_rate, "max_scale_down_rate": self.max_scale_down_rate,
                "sample_period": self.sample_period}
