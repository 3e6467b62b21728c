"""The demand-planning layer (hours) and its feed-forward into pool reconfiguration (minutes).

A capacity plan that is only scored is open loop. Here the plan *drives* the pools, as a
feed-forward into the reconfiguration layer, while that layer's feedback corrects the forecast's
error (article section 22: layered controllers, each on its own time scale):

* :class:`DemandPlanner` observes the offered demand (the arrival rate before admission, which no
  layer's action changes - so the planner closes no loop through the plant) in bins of
  ``interval_s``; it refits its forecaster every ``refit_s`` (daily), conditions it on new data
  every ``update_s`` (hourly) and keeps the forecast of the next ``horizon_s``.
* Its plan for a pool at time t is the forecast need, ceil-free, at the pool's per-worker rate
  and target utilisation, taken as the *maximum over [t, t + lead_s]*: a worker needed at s must
  be started at s - start-up, and one that will be needed again within a start-up is not released.
  ``lead_s`` = start-up + warm-up + one reconfiguration sample, so workers start *before* a
  forecast rise by the start-up delay.
* :class:`PlannedPoolController` is the hysteretic pool controller with that plan as a floor on its
  need: need = max(feedback need, plan). Feedback (the measured offered rate plus the capped
  backlog term) adds workers when the forecast was low; the plan holds them when the measured rate
  has not risen yet. The dead band, dwell and cooldown rules of
  :class:`tokenfactory.controllers.reconfiguration.HystereticPoolController` are unchanged.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from tokenfactory.controllers.autoscaling import _current
from tokenfactory.controllers.forecasting import DAY_S, make_forecaster
from tokenfactory.controllers.interface import SampledController
from tokenfactory.controllers.reconfiguration import HystereticPoolController, pool_demand
from tokenfactory.signals import Measurement, ScaleAction
from tokenfactory.validation import ConfigError, check_choice, check_number

__all__ = ["DemandPlanner", "PlannedPoolController", "QUANTILES"]

#: forecast quantiles a plan can be built from
QUANTILES = ("mean", "upper_80", "upper_95")


class DemandPlanner(SampledController):
    """Forecast-led plan of workers per pool (the hours layer).

    Parameters
    ----------
    per_worker_rps : dict
        Requests/s one worker of each pool carries at full speed (``{"fill": .., "decode": ..}``).
    lead_s : float
        How far ahead of a forecast rise workers are started (start-up + warm-up + a sample).
    target_utilization : float
        Utilisation the plan provisions for (the reconfiguration layer's).
    forecaster : str
        A :data:`tokenfactory.controllers.forecasting.FORECASTERS` name.
    quantile : str
        Which forecast the plan follows (``mean``, ``upper_80``, ``upper_95``).
    interval_s : float
        Bin width of the observed demand and of the forecast (the planner's sample period).
    update_s, refit_s : float
        Condition on new data every ``update_s`` (hourly); re-estimate every ``refit_s`` (daily).
    horizon_s : float
        How far each forecast looks (at least ``update_s + lead_s``).
    history : pandas.Series, optional
        Demand observed before the run (requests/s on the ``interval_s`` grid, indexed by
        absolute time in seconds, 0 = midnight); without it the planner plans nothing until it
        has ``min_history_s`` of its own observations.
    time_offset_s : float
        Absolute time of the run's t = 0 (so daily seasonality lines up with ``history``).
    min_history_s : float
        Observations needed before the first fit.
    """

    name = "planner"

    def __init__(self, per_worker_rps: dict[str, float], *, lead_s: float, target_utilization: float = 0.85,
                 forecaster: str = "holt-winters", quantile: str = "mean", interval_s: float = 600.0,
                 update_s: float = 3600.0, refit_s: float = DAY_S, horizon_s: float | None = None,
                 history: pd.Series | None = None, time_offset_s: float = 0.0, min_history_s: float = 2 * DAY_S,
                 max_history_s: float = 7 * DAY_S):
        super().__init__(interval_s)
        if not per_worker_rps or any(p not in ("fill", "decode") for p in per_worker_rps):
            raise ConfigError("planner.per_worker_rps", f"pools must be 'fill' and/or 'decode', got {per_worker_rps}")
        self.per_worker_rps = {p: check_number(f"planner.per_worker_rps.{p}", v, low=0.0, low_inclusive=False)
                               for p, v in per_worker_rps.items()}
        self.lead_s = check_number("planner.lead_s", lead_s, low=0.0, high=4 * 3600.0)
        self.target_utilization = check_number("planner.target_utilization", target_utilization, low=0.1, high=1.0)
        make_forecaster(forecaster)  # validates the name
        self.forecaster = forecaster
        self.quantile = check_choice("planner.quantile", quantile, QUANTILES)
        self.interval_s = check_number("planner.interval_s", interval_s, low=1.0, high=3600.0)
        self.update_s = check_number("planner.update_s", update_s, low=interval_s, high=DAY_S)
        self.refit_s = check_number("planner.refit_s", refit_s, low=update_s, high=30 * DAY_S)
        self.horizon_s = check_number("planner.horizon_s", horizon_s if horizon_s is not None
                                      else 2 * update_s + lead_s, low=update_s + lead_s)
        self.time_offset_s = float(time_offset_s)
        self.min_history_s = check_number("planner.min_history_s", min_history_s, low=3 * interval_s)
        self.max_history_s = check_number("planner.max_history_s", max_history_s, low=self.min_history_s)
        if history is not None:
            if not isinstance(history, pd.Series) or history.empty:
                raise ConfigError("planner.history", "expected a non-empty pandas Series indexed by time_s")
            d = np.diff(history.index.to_numpy(dtype=float))
            if len(d) and not np.allclose(d, interval_s):
                raise ConfigError("planner.history", f"must be on the planner's {interval_s:g} s grid")
        self.history = history
        self.reset()

    def reset(self) -> None:
        h = self.history
        self._obs: dict[float, float] = {} if h is None else {float(k): float(v) for k, v in h.items()}
        self._model = None
        self._last_fit = -math.inf
        self._last_update = -math.inf
        self._plan_t = np.zeros(0)
        self._plan_rate = np.zeros(0)
        self.events: list[dict] = []  # every refit and update: time, kind, first planned rate
        self.trace: list[dict] = []   # every sample: time, observed and planned rate, floor per pool

    # -- the plan -----------------------------------------------------------------------------
    def planned_rate(self, t: float) -> float:
        """The planned demand (requests/s) for the run's time ``t``; NaN where nothing is planned."""
        if not len(self._plan_t):
            return math.nan
        ta = t + self.time_offset_s
        k = np.searchsorted(self._plan_t, ta, side="right") - 1
        if k < 0 or ta >= self._plan_t[-1] + self.interval_s:
            return math.nan
        return float(self._plan_rate[k])

    def floor(self, pool: str, t: float) -> float:
        """Workers ``pool`` should have at ``t``: the most the plan needs within [t, t + lead_s]
        (fractional; NaN where nothing is planned)."""
        if not len(self._plan_t) or pool not in self.per_worker_rps:
            return math.nan
        ta = t + self.time_offset_s
        lo = np.searchsorted(self._plan_t, ta, side="right") - 1
        hi = np.searchsorted(self._plan_t, ta + self.lead_s, side="right")
        if lo < 0 or lo >= len(self._plan_t):
            return math.nan
        peak = float(np.max(self._plan_rate[lo:max(hi, lo + 1)]))
        return peak / (self.per_worker_rps[pool] * self.target_utilization)

    def rise(self, t: float) -> float:
        """The forecast's largest rise within [t, t + lead_s] relative to its value at t (>= 1 when
        it forecasts a rise; NaN where nothing is planned). The reconfiguration layer multiplies the
        *measured* demand by it: the forecast's shape leads the pools by the start-up, the
        measurement fixes its level, so a biased forecast level costs nothing."""
        now = self.planned_rate(t)
        if not math.isfinite(now) or now <= 0:
            return math.nan
        ta = t + self.time_offset_s
        lo = np.searchsorted(self._plan_t, ta, side="right") - 1
        hi = np.searchsorted(self._plan_t, ta + self.lead_s, side="right")
        return float(np.max(self._plan_rate[lo:max(hi, lo + 1)])) / now

    def _series(self, now_abs: float) -> pd.Series:
        t = np.array(sorted(k for k in self._obs if now_abs - self.max_history_s <= k < now_abs))
        grid = np.arange(t[0], t[-1] + self.interval_s / 2, self.interval_s) if len(t) else t
        y = pd.Series([self._obs.get(float(x), np.nan) for x in grid], index=pd.Index(grid, name="time_s"))
        return y

    def _replan(self, t: float, refit: bool) -> None:
        now = t + self.time_offset_s
        y = self._series(now)
        if len(y) < 3 or y.notna().sum() * self.interval_s < self.min_history_s:
            return
        if refit or self._model is None:
            self._model = make_forecaster(self.forecaster).fit(y)
        else:
            self._model.update(y)
        steps = int(math.ceil((now + self.horizon_s - y.index[-1]) / self.interval_s))
        fc = self._model.predict(max(steps, 1))
        self._plan_t = np.asarray(fc.time_s, dtype=float)
        self._plan_rate = np.asarray(fc.quantile(self.quantile), dtype=float)
        self.events.append({"time_s": t, "kind": "refit" if refit else "update",
                            "planned_rps": self.planned_rate(t)})

    # -- the controller interface -----------------------------------------------------------
    def update(self, t: float, m: Measurement) -> None:
        """Record the last interval's offered demand; update hourly, refit daily. Acts on the
        plant only through :meth:`floor` (read by the reconfiguration layer): returns None."""
        rate = m.arrival_rate if math.isfinite(m.arrival_rate) else m.admitted_rate
        if math.isfinite(rate):
            # the measurement averages the last sample period: it is the bin that ended at m.time_s
            b = math.floor((m.time_s + self.time_offset_s) / self.interval_s) * self.interval_s - self.interval_s
            self._obs[float(b)] = float(rate)
        refit = t - self._last_fit >= self.refit_s - 1e-9
        if refit or t - self._last_update >= self.update_s - 1e-9:
            n_before = len(self.events)
            self._replan(t, refit)
            if len(self.events) > n_before:
                self._last_update = t
                if refit or self._last_fit == -math.inf:
                    self._last_fit = t
        self.trace.append({"time_s": t, "observed_rps": rate, "planned_rps": self.planned_rate(t),
                           "rise": self.rise(t), **{f"{p}_floor": self.floor(p, t) for p in self.per_worker_rps}})
        return None

    def params(self) -> dict:
        return {"per_worker_rps": dict(self.per_worker_rps), "lead_s": self.lead_s,
                "target_utilization": self.target_utilization, "forecaster": self.forecaster,
                "quantile": self.quantile, "interval_s": self.interval_s, "update_s": self.update_s,
                "refit_s": self.refit_s, "horizon_s": self.horizon_s, "sample_period": self.sample_period,
                "history_points": 0 if self.history is None else int(len(self.history))}


class PlannedPoolController(HystereticPoolController):
    """The hysteretic pool controller with a planner's feed-forward floor on its need.

    Differences from :class:`HystereticPoolController` (everything else is inherited):

    * need = max(feedback need, the measured offered rate x ``planner.rise(t)`` at the target
      utilisation) when a planner is attached: the forecast's rise over the next start-up, applied
      to what is measured now, so workers start one start-up before a forecast rise while a
      forecast that is high or low in level neither holds idle workers nor hides demand (feedback
      corrects it);
    * the decode pool is sized from the *offered* rate (arrivals before admission) and its queue is
      the ready buffer plus the admission backlog: behind an admission layer the admitted rate
      saturates at the decode capacity and the ready buffer is held at its target, so the decode
      pool would not see the demand it is short of (an inner loop hiding the outer loop's signal);
    * ``measured_fill_rate``: the fill pool's per-worker rate is read from the plant
      (fill capacity / fill workers) - prompts change length over the day, the orchestrator knows
      the tokens it queues.
    """

    name = "planned-hysteretic"

    def __init__(self, pool: str, per_worker_rps: float, *, planner: DemandPlanner | None = None,
                 measured_fill_rate: bool = False, **kw):
        super().__init__(pool, per_worker_rps, **kw)
        self.planner = planner
        self.measured_fill_rate = bool(measured_fill_rate)
        self._nominal_rps = self.per_worker_rps
        self.last_floor = math.nan

    @classmethod
    def tuned(cls, pool: str, per_worker_rps: float, rate_rps: float, *, planner: DemandPlanner | None = None,
              measured_fill_rate: bool = False, **kw) -> "PlannedPoolController":
        c = super().tuned(pool, per_worker_rps, rate_rps, **kw)
        c.planner = planner
        c.measured_fill_rate = bool(measured_fill_rate)
        c._nominal_rps = c.per_worker_rps
        c.last_floor = math.nan
        return c

    def reset(self) -> None:
        super().reset()
        self._rise = math.nan

    def need(self, rate: float, queue: float) -> float:
        fb = super().need(rate, queue)
        if not math.isfinite(self._rise):
            self.last_floor = math.nan
            return fb
        self.last_floor = max(rate, 0.0) * self._rise / (self.per_worker_rps * self.target_utilization)
        return max(fb, self.last_floor)

    def update(self, t: float, m: Measurement) -> ScaleAction:
        if self.pool == "decode":
            rate = m.arrival_rate if math.isfinite(m.arrival_rate) else m.admitted_rate
            queue = m.ready + m.backlog
        else:
            rate, queue = pool_demand(m, "fill")
            if self.measured_fill_rate and m.fill_workers > 0 and m.fill_capacity > 0:
                self.per_worker_rps = m.fill_capacity / m.fill_workers
        self._rise = self.planner.rise(t) if self.planner is not None else math.nan
        return ScaleAction(self.pool, self.recommend(t, _current(m, self.pool, provisioned=True), rate, queue))

    def params(self) -> dict:
        return {**super().params(), "per_worker_rps": self._nominal_rps, "planned": self.planner is not None,
                "measured_fill_rate": self.measured_fill_rate}
