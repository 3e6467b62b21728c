"""The demand-planning layer (hours) and its feed-forward into pool reconfiguration (minutes).

A worker asked for now serves one start-up later, so the reconfiguration layer sizes its pools
for the demand of one *lead* ahead (start-up + warm-up + a reconfiguration sample + the rate
filter's lag), not the demand it measures. Two things about that future are unknown to a pool
controller and known, approximately, from the past days (article section 22: each layer on its
own time scale):

* the *shape* of the demand over the next lead: the daily pattern's rises (a tenant's scheduled
  batch jobs start at the same time each day) - the **rise profile** rho(tau): at each time of day
  tau, the median over the last ``days`` days of max(demand over [tau, tau + lead]) / demand(tau),
  floored at 1;
* how much the demand still exceeds that forecast - the **headroom** h: the smallest value on a
  grid for which the pool rule the reconfiguration layer runs, capacity(t) = demand(t - lead) x
  rho(t - lead) x (1 + h), replayed over the same days, leaves at most ``excess_budget`` of the
  requests above capacity (the requests admission would have to shed).

* how much that error varies from one hour to the next - the **volatility scale** v(t): the
  headroom in force is h x v(t), v(t) = s(t) / mean(s) over the replayed days, where s(t) is the
  exponentially weighted root mean square of the log change between consecutive planning
  intervals, time constant ``volatility_window_s`` (an hour; :func:`interval_volatility`). The
  forecast of the demand over the lead stays the measured
  rate x rho (persistence with the daily rise); what the last hour corrects is the spread of its
  error. This is historical simulation with volatility updating (Hull & White 1998, "Incorporating
  volatility updating into the historical simulation method for value-at-risk", Journal of Risk
  1(1), 5-19; the filtered historical simulation of Barone-Adesi, Giannopoulos & Vosper 1999): the
  replay scales each past time's headroom by that time's volatility, so h is calibrated on
  volatility-standardised errors. Why not the level itself: on ServeGen the 10-minute log
  deviation from the median daily level persists over the lead (autocorrelation 0.92 at one
  interval on m-large, 0.84 on m-small), and in the replay of the last four days (5- and
  10-minute start-ups, each day planned on the three before, capacity at 0.75 % unserved)
  forecasts that decay it towards the profile (AR(1) on the deviation) needed more capacity than
  persistence - phi 0.75 in all four cases, phi 0.9 in three (1.5 % less on m-large at 10
  minutes) - while scaling the headroom by the last hour's volatility (a one-hour moving window
  there) needed 0.4-2.4 % less in all four.

The AR(1) lead correction (``residual_ar1``, off by default) is the decay with phi fitted: least
squares on the log residual from the median daily level of the fitted days, per 10-minute interval
(regression with ARIMA errors, Hyndman & Athanasopoulos, FPP 3rd ed., ch. 9-10), the plan x
exp((phi^(lead / interval) - 1) r(t)). Measured on ServeGen's last four days, each planned on the
three before (:func:`lead_forecast_error`, lead 670 s): phi 0.81-0.90 on m-large, 0.58-0.82 on
m-small, and the plan's log error at the lead grew (sd 0.161 -> 0.177 on m-large, 0.121 -> 0.150 on
m-small), the pool model's 10-minute rows with it: m-large x5 1.173 -> 1.179 x the oracle, SLO
0.9911 -> 0.9825; m-small 1.128 -> 1.137, 0.9908 -> 0.9887. The days differ in level (m-large's
test days sit -0.50, -0.25, -0.33 and +0.74 in log from the median of the three before them), so
the residual reverts to the wrong level, and the measured rate on the 1-minute grid already
averages into the next 10-minute bin: at the plant's resolution, least squares on the lead error
itself gives the current residual a coefficient of -0.04 to +0.06, i.e. persistence. On a series
whose residual does revert around a stable daily level the correction shrinks the error
(tests/test_planning.py).

Two further corrections, off by default, measured on the same rows (``run_on_rates``, pool model,
dt 2 s, seed 0; GPU-hours / oracle, SLO attainment at 2 / 5 / 10-minute start-ups):

* the *rising trend* (``trend_s``, :func:`rising_trend`): the pool sizes for its filtered rate's
  rise over the last ``trend_s`` carried on for as long (the demand the pool model draws from is
  the 10-minute series interpolated linearly, so the last minutes' slope tells part of the next
  interval). In the in-sample replay it lowers the headroom, but the measured rate's Poisson noise,
  doubled by the difference and rectified by the max, adds capacity where the headroom is already
  0: 120 s gave m-large x5 1.061 / 0.9987, 1.074 / 0.9917, 1.156 / 0.9894 (default 1.044 / 0.9955,
  1.083 / 0.9915, 1.173 / 0.9911), m-small 1.050 / 0.9996, 1.057 / 0.9951, 1.113 / 0.9906 (default
  1.038, 1.064, 1.128); 300 s 1.080, 1.088, 1.154 / 0.9868 on m-large;
* the *phase of the hour* (``hour_phase``, :func:`hour_phase_scale`): m-large's lead error
  depends on the minute of the hour (decisions at :10-:30 carry three times the mean positive error
  of the others: a tenant's clock-driven jobs), so the headroom is weighted by the error's scale
  per 10-minute phase: m-large 10 minutes 1.164 / 0.9910, m-small 1.122 / 0.9901, the 2- and
  5-minute rows within 0.001 of the default.

Both together: m-large x5 1.061 / 0.9987, 1.074 / 0.9921, 1.151 / 0.9900; m-small 1.050 / 0.9996,
1.057 / 0.9951, 1.113 / 0.9906 - the 10-minute rows 1.9 % / 1.3 % cheaper, the 2-minute ones 1.6 % /
1.2 % dearer. So each refit keeps the trend only when its replay meets the budget with less
capacity than without it (at a 2-minute lead the headroom is already 0 and the trend can only add):
with that rule, both together give m-large x5 1.044 / 0.9955, 1.072 / 0.9907, 1.151 / 0.9900 and
m-small 1.038 / 0.9965, 1.057 / 0.9951, 1.113 / 0.9906 - no row dearer than the default, every SLO
>= 0.99 (m-large's 10-minute row at 0.99004, at the edge), the 10-minute rows still short of 1.10. Where the 10-minute cost goes (m-large x5, decode pool, 85 % of
the GPU-hours; from the run's series and the planner's trace): target utilisation below the ceiling
x1.026, rise profile x1.041, headroom in force x1.108 (mean 0.126), the rest (whole workers, dead
band, the hold over falls, the backlog term) x1.052 against the oracle's own x1.061 (whole workers,
each interval's peak). By demand phase (each 10-minute interval binned by its log change, steady
within +-0.03), measured on ``stack_default``'s 10-minute rows (m-large x5 1.150, both pools; the
pools billed every 2 s against the oracle's interval): 88 % of the excess over the oracle falls in
steady intervals (87 % of the time), 13 % in falls (6 %), -0 % in rises (7 %); m-small 89 / 14 / -3 %
(94 / 3 / 3 % of the time). Binned by the sign of the change alone, 70 % (m-small 69 %) accrues while
the demand falls, 51 % (48 %) of the time: most of it in small falls, inside the steady band. The headroom is the lever,
and the lead error's tail sets it: forecasting today's level instead of persisting the rate (the
last hour's demand over the median profile's, times the profile's peak over the lead) needed 9-37 %
more capacity than persistence x rho in the replay of the last four days at 5 and 10 minutes (each
day planned on the three before, 0.5 % unserved), a geometric half-blend of the two 0.2-10 % more.

The *error state* (``error_state``, :func:`error_state_scale`, off by default) conditions the
headroom on the lead error the plan has just made (the last interval against the plan one lead
before it): a weight per tercile of that error, fitted daily with the equal-exceedance allocation
of ``hour_phase``. On ServeGen's last four days, each planned on the three before, the lead error
is barely correlated with the one just made (m-large -0.01 to 0.22 by day, m-small -0.26 to 0.19)
and which tercile carries the tail changes from day to day, as does the 4-hour time-of-day profile
of the tail (correlation of consecutive days' profiles -0.61 to 0.69 on m-large): no stable
conditioning found. Measured (same rows): alone m-large x5 1.0442 / 0.9955, 1.0835 / 0.9913, 1.1675 /
0.9902, m-small 1.0379 / 0.9965, 1.0657 / 0.9937, 1.1234 / 0.9905 (the 5-minute rows dearer than
without it); with ``trend_s`` and ``hour_phase`` m-large x5 1.0442 / 0.9955, 1.0720 / 0.9906, 1.1501 /
0.9901, m-small 1.0379 / 0.9965, 1.0571 / 0.9951, 1.1117 / 0.9907: no row dearer than without the
three corrections and every SLO >= 0.99 (m-large's 10-minute row at the edge), so ``stack_default``
switches all three on; the 10-minute rows stay short of 1.10 (the tail has no stable predictor here).

The *forecast-fall release* (``fall_dwell_s``, :func:`fall_profile`, off by default): where the
median over the fitted days of demand(tau + lead) / demand(tau) is below 1 - :data:`FALL_THRESHOLD`
(33-38 % of the day on m-large x5 at a 10-minute start-up), the pools release after ``fall_dwell_s``
instead of their dwell and down cooldown (630 s there); scale-ups are unchanged, and the headroom's
replay follows the pool's two directions (a released worker is gone at once, one ordered serves a
lead later: :func:`calibrate_headroom`'s ``fall_hold_s``). Measured with ``stack_default`` + 90 s (GPU-h
/ oracle, SLO at 10 / 5 / 2-minute start-ups): m-large x5 1.1563 / 0.9893, 1.0690 / 0.9902, 1.0456 /
0.9959 (without it 1.1501 / 0.9901, 1.0720 / 0.9906, 1.0442 / 0.9955); m-small 1.1119 / 0.9913, 1.0563
/ 0.9951, 1.0378 / 0.9965 (1.1117 / 0.9907, 1.0571 / 0.9951, 1.0379 / 0.9965). The replay charges the
releases the demand undoes within a lead - m-large's 10-minute headroom goes from 0.10 to 0.12 - and
that costs more than the release saves; with the replay left as it was the release gives 1.1402 but
SLO 0.9876 (the old replay does not see those misses). The two-way replay alone (``fall_dwell_s`` =
the dwell) gives 1.1530 / 0.9903; 300 s 1.1560 / 0.9891 on m-large, 1.1135 / 0.9914 on m-small;
a fall threshold of 0.06 or 0.10 with 90 or 300 s 1.152-1.158, SLO 0.9896-0.9903 (m-large 10
minutes). Weighting the headroom by that flag instead (no release; the equal-exceedance allocation
of ``hour_phase`` over two bins, a fall forecast or not: weights 0.68 / 1.32) gave 1.1509 / 0.9895,
with the release 1.1654 / 0.9891 (m-large 10 minutes; not kept). So it stays off.

The profile is smoothed over one planning interval (the demand's own resolution): a median of a
few days is jagged minute to minute, and that jitter alone moved pools across a worker boundary
and back.

:class:`DemandPlanner` observes the offered demand (arrivals before admission: no layer's action
changes it, so the planner closes no loop through the plant) in bins of ``interval_s`` and
recomputes both every ``refit_s`` (daily) from the history before the run plus what it has seen.
A demand sampled coarser than the lead is interpolated linearly at ``fine_s`` (as the pool model
disaggregates it). The plan is a pair of feed-forward signals; the planner returns no action.

:class:`PlannedPoolController` is the reconfiguration layer's pool rule:

* need = measured offered rate x rho(t) x (1 + h) / (per-worker rate x target utilisation) plus a
  capped backlog term (the only feedback through the plant, certified by
  :func:`tokenfactory.controllers.separation.reconfiguration_loop`); without a planner rho = 1
  and h is the controller's fixed ``headroom``;
* scale up to ceil(need) at once (pending-aware: starting workers count);
* scale down when the need has stayed under n - 1 - dead band for ``dwell_s``, in one move sized to
  the drop (to ceil(need + dead band)), no sooner than ``cooldown_s`` after a scale-up (a worker
  started for a rise is not cancelled before it has served) nor ``down_cooldown_s`` after the last
  scale-down. The dead band is 3 sigma of the need signal's Poisson noise
  (:meth:`tokenfactory.controllers.reconfiguration.HystereticPoolController.tuned`): only the
  demand, not its noise, moves the pool.

Because the offered rate and the plan are exogenous, the feed-forward cannot oscillate through the
plant; the hysteresis keeps the noise of the measured rate from reversing the pool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.ndimage import maximum_filter1d, median_filter

from tokenfactory.controllers.autoscaling import serving_replicas
from tokenfactory.controllers.interface import SampledController, lowpass
from tokenfactory.controllers.reconfiguration import HystereticConfig, HystereticPoolController, need_noise_std
from tokenfactory.core.signals import Measurement, ScaleAction
from tokenfactory.core.validation import (REQUIRED, ConfigError, check_fields, check_int, check_number,
                                          config_or_fields, inherited_setting, setting)

__all__ = ["DemandPlannerConfig", "DemandPlanner", "PlannedPoolConfig", "PlannedPoolController", "rise_profile",
           "calibrate_headroom", "interval_volatility", "fall_profile",
           "correction_certificate", "lead_forecast_error", "rising_trend", "hour_phase_scale", "error_state_scale",
           "observed_lead_error", "ERROR_STATE_QUANTILES", "HEADROOM_GRID", "VOLATILITY_SCALE_BOUNDS", "EXCESS_BUDGET_SHARE",
           "FALL_THRESHOLD"]

DAY_S = 86400.0
#: the share of the SLO's miss budget (1 - attainment) the headroom's replay may leave unserved.
#: The replay is in-sample (the days the headroom is fitted on); on the next day the demand above
#: capacity was larger: on ServeGen's last four days (m-large x5, m-small) at 5- and 10-minute
#: start-ups, with a share of 0.75 the replays left at most 0.75 % and the pool model rejected
#: 0.81-1.37 % of the requests, the SLO missing 0.99 in three of the four runs; at 0.5 all four met
#: it (0.9908-0.9936), at 1.6-4.8 % more GPU-hours than 0.75 (layered-stack, full variant's windows).
EXCESS_BUDGET_SHARE = 0.5
#: headrooms the planner chooses from (fraction of the planned demand)
HEADROOM_GRID = tuple(round(0.01 * k, 2) for k in range(0, 61))


def _fine(y: pd.Series, fine_s: float) -> tuple[np.ndarray, np.ndarray]:
    """``y`` (gaps interpolated) linearly on a ``fine_s`` grid: (times, rates)."""
    t = y.index.to_numpy(dtype=float)
    v = pd.Series(y.to_numpy(dtype=float)).interpolate(limit_direction="both").to_numpy()
    tf = np.arange(t[0], t[-1] + fine_s / 2, fine_s)
    return tf, np.interp(tf, t, v)


def _ahead_max(v: np.ndarray, k: int) -> np.ndarray:
    """max(v[i : i + k + 1]) for every i (past the end the last value repeats, which a max ignores)."""
    if k <= 0:
        return v.copy()
    size = k + 1
    # maximum_filter1d centres its window on i (origin 0); origin -(size // 2) moves it to [i, i + k]
    return maximum_filter1d(v, size=size, origin=-(size // 2), mode="nearest")


def rising_trend(v: np.ndarray, k: int) -> np.ndarray:
    """max(v, v + (v - v k points earlier)) for every point: the rise of the last k points carried
    on for k more (Holt's linear trend with the smoothing left to the measured rate's filter,
    Hyndman & Athanasopoulos, FPP 3rd ed., sec. 8.2), falls not extrapolated (the pool holds for
    the dwell anyway). Before the first k points: v.

    Parameters
    ----------
    v : array
        The rate, on a regular grid.
    k : int
        The trend's span in grid points (<= 0: no trend, ``v`` returned).

    Returns
    -------
    array
    """
    if k <= 0:
        return v.copy()
    back = np.r_[v[:1].repeat(k), v[:-k]]
    return np.maximum(v, 2.0 * v - back)


def rise_profile(demand: pd.Series, lead_s: float, *, days: int = 3, fine_s: float = 60.0,
                 time_offset_s: float = 0.0, smooth_s: float = 0.0) -> pd.Series:
    """The median daily rise over the next ``lead_s``, by time of day.

    Parameters
    ----------
    demand : pandas.Series
        Offered demand (requests/s) on a regular grid indexed by absolute time (s, 0 = midnight);
        NaN gaps are interpolated.
    lead_s : float
        How far ahead the rise is taken (s, >= 0).
    days : int
        The last ``days`` whole days of ``demand`` are used (>= 1).
    fine_s : float
        Grid the demand is interpolated on and the profile is returned on (s).
    time_offset_s : float
        Added to the index (for a series indexed from the run's start).
    smooth_s : float
        Width of a centred running median over the time of day (s, >= 0; 0 = none). A median of a
        few days is jagged minute to minute; unsmoothed, that jitter moves the pool target across
        a worker boundary and back (a scale-up, a scale-down one cooldown later). A running median
        keeps the edge of a rise that lasts longer than half the window; a mean would shave it.

    Returns
    -------
    pandas.Series
        rho(tau) >= 1 indexed by the time of day (s, on the ``fine_s`` grid over one day).

    Raises
    ------
    ConfigError
        When ``demand`` spans less than one day plus the lead.
    """
    return _daily_median_ratio(demand, lead_s, days, fine_s, time_offset_s, smooth_s, rise=True)


#: the forecast fall that shortens the pools' scale-down dwell (``fall_dwell_s``): the profile's
#: median demand one lead ahead at least this share below the current one. 0.03 is the bound of the
#: "steady" bin (|10-minute log change| < 0.03) of the cost split in this module's docstring: a
#: forecast inside it is the day's noise, not a fall (0.06 and 0.10 measured there too).
FALL_THRESHOLD = 0.03


def fall_profile(demand: pd.Series, lead_s: float, *, days: int = 3, fine_s: float = 60.0,
                 time_offset_s: float = 0.0, smooth_s: float = 0.0) -> pd.Series:
    """The median daily change over the next ``lead_s``, by time of day: phi(tau), the median over
    the last ``days`` days of demand(tau + lead) / demand(tau) (< 1: the demand is forecast to
    fall over the lead). The pools shorten their scale-down dwell where phi < 1 - :data:`FALL_THRESHOLD`
    (:class:`DemandPlannerConfig` ``fall_dwell_s``).

    Parameters
    ----------
    demand : pandas.Series
        Offered demand (requests/s) on a regular grid indexed by absolute time (s, 0 = midnight);
        NaN gaps are interpolated.
    lead_s : float
        How far ahead the change is taken (s, >= 0).
    days : int
        The last ``days`` whole days of ``demand`` are used (>= 1).
    fine_s : float
        Grid the demand is interpolated on and the profile is returned on (s).
    time_offset_s : float
        Added to the index.
    smooth_s : float
        Width of a centred running median over the time of day (s, >= 0; 0 = none), as in
        :func:`rise_profile`.

    Returns
    -------
    pandas.Series
        phi(tau) > 0 indexed by the time of day (s, on the ``fine_s`` grid over one day; 1 where
        no day has a value).

    Raises
    ------
    ConfigError
        When ``demand`` spans less than one day plus the lead.
    """
    return _daily_median_ratio(demand, lead_s, days, fine_s, time_offset_s, smooth_s, rise=False)


def _daily_median_ratio(demand: pd.Series, lead_s: float, days: int, fine_s: float, time_offset_s: float,
                        smooth_s: float, *, rise: bool) -> pd.Series:
    """The median by time of day of max(demand over the lead) / demand (``rise``, floored at 1) or
    of demand one lead ahead / demand, smoothed by a running median."""
    check_number("planner.lead_s", lead_s, low=0.0)
    check_int("planner.days", days, low=1)
    t, v = _fine(demand, fine_s)
    t = t + time_offset_s
    k = int(round(lead_s / fine_s))
    per_day = int(round(DAY_S / fine_s))
    if len(v) < per_day + k:
        raise ConfigError("planner.history", f"needs at least one day plus the lead of demand, got "
                          f"{(t[-1] - t[0]) / 3600:.1f} h")
    ahead = _ahead_max(v, k) if rise else np.r_[v[k:], np.full(k, np.nan)]
    ratio = ahead / np.maximum(v, 1e-9)
    ratio[len(v) - k:] = np.nan  # the lead runs past the data: unknown
    tod = np.mod(np.round(t / fine_s).astype(np.int64), per_day)
    use = t >= t[-1] - days * DAY_S
    grid = np.full((per_day, days + 2), np.nan)
    fill = np.zeros(per_day, dtype=int)
    for i in np.nonzero(use)[0]:
        j = tod[i]
        if fill[j] < grid.shape[1]:
            grid[j, fill[j]] = ratio[i]
            fill[j] += 1
    with np.errstate(all="ignore"):
        med = np.nanmedian(grid, axis=1) if np.isfinite(grid).any() else np.ones(per_day)
    floor = 1.0 if rise else 0.0
    med = np.maximum(np.where(np.isfinite(med), med, 1.0), floor)
    w = int(round(check_number("planner.smooth_s", smooth_s, low=0.0) / fine_s)) + 1
    if w > 1:  # a running median (keeps a rise's edge where a mean would shave it), wrapping at midnight
        med = np.maximum(median_filter(med, size=w, mode="wrap"), floor)
    return pd.Series(med, index=pd.Index(np.arange(per_day) * fine_s, name="time_of_day_s"))


#: the volatility scale's bounds (a gap's interpolated edge or a flat hour must not zero or explode it)
VOLATILITY_SCALE_BOUNDS = (0.25, 4.0)


def interval_volatility(demand: pd.Series, window_s: float) -> pd.Series:
    """s(t): the exponentially weighted root mean square of the log change between consecutive
    points of ``demand``, with time constant ``window_s`` (RiskMetrics' EWMA volatility, J.P.
    Morgan/Reuters 1996, Technical Document 4th ed., section 5.2.1: s_t^2 = lambda s_{t-1}^2 +
    (1 - lambda) r_t^2, here lambda = exp(-interval / window_s), normalised over the points seen).

    A moving window would weigh a jump fully for one window and drop it at once: every burst
    would add a box of one window's width to the plan, a component exactly one window long that
    the oscillation detectors read as a regular cycle; the exponential weights let it fade.

    Parameters
    ----------
    demand : pandas.Series
        Offered demand (requests/s) on a regular grid (the planner's intervals); NaN gaps are
        interpolated.
    window_s : float
        Time constant of the weights (s, > 0).

    Returns
    -------
    pandas.Series
        s on the same index (the first point, with no change before it: NaN).
    """
    check_number("planner.volatility_window_s", window_s, low=0.0, low_inclusive=False)
    t = demand.index.to_numpy(dtype=float)
    step = float(np.median(np.diff(t))) if len(t) > 1 else window_s
    v = pd.Series(demand.to_numpy(dtype=float)).interpolate(limit_direction="both").to_numpy()
    d2 = pd.Series(np.diff(np.log(np.maximum(v, 1e-9))) ** 2)
    s = np.sqrt(d2.ewm(alpha=1.0 - math.exp(-step / window_s), adjust=True).mean().to_numpy())
    return pd.Series(np.r_[np.nan, s], index=demand.index)


#: the period of the headroom's phase scale (s): jobs scheduled by the clock start on the hour
HOUR_S = 3600.0


def hour_phase_scale(demand: pd.Series, profile: pd.Series | None, lead_s: float, *, days: int = 3,
                     interval_s: float = 600.0, fine_s: float = 60.0, time_offset_s: float = 0.0) -> np.ndarray:
    """w(p): how the plan's lead error depends on the phase of the hour, one weight per planning
    interval of the hour (p = floor((t mod 1 h) / interval_s)), mean 1 before the clip.

    The lead error is e(u) = log(demand(u + lead) / (demand(u) rho(u))), the error of the pool
    rule's forecast made at u (the headroom covers its upper tail); w(p) is the root mean square
    of its positive part over the decisions of phase p on the last ``days`` days, over the mean of
    those, clipped to :data:`VOLATILITY_SCALE_BOUNDS`. The optimal allocation of a fixed
    unserved budget gives every decision the same exceedance probability (minimising sum(capacity)
    + lambda sum(E[(demand - capacity)+]) sets P(demand > capacity) = 1 / lambda at every t), so
    for errors of one shape the headroom goes in proportion to their scale: a tenant's clock-driven
    jobs make the scale depend on the minute of the hour (on ServeGen m-large decisions at :10-:30
    carry three times the mean positive error of the others).

    Parameters
    ----------
    demand : pandas.Series
        Offered demand (requests/s), regular grid, absolute time index (s).
    profile : pandas.Series or None
        The rise profile (None: rho = 1).
    lead_s : float
        The lead (s).
    days : int
        Days used (the last ones).
    interval_s, fine_s : float
        The planner's interval (the phase's width) and the replay grid (s).
    time_offset_s : float
        Added to the index.

    Returns
    -------
    numpy.ndarray
        w per phase (length 3600 / ``interval_s``, rounded up).
    """
    n = max(1, int(math.ceil(HOUR_S / interval_s)))
    t, v = _fine(demand, fine_s)
    t = t + time_offset_s
    k = max(int(round(lead_s / fine_s)), 0)
    i = np.nonzero(t >= t[-1] - days * DAY_S)[0]
    i = i[i + k < len(v)]
    if len(i) < n:
        return np.ones(n)
    base = v[i]
    if profile is not None:
        base = base * profile.to_numpy()[np.mod(np.round(t[i] / fine_s).astype(np.int64), len(profile))]
    e = np.maximum(np.log(np.maximum(v[i + k], 1e-9) / np.maximum(base, 1e-9)), 0.0)
    ph = np.minimum((np.mod(t[i], HOUR_S) // interval_s).astype(np.int64), n - 1)
    rms = np.array([math.sqrt(float(np.mean(e[ph == p] ** 2))) if np.any(ph == p) else math.nan for p in range(n)])
    ref = float(np.nanmean(rms)) if np.isfinite(rms).any() else 0.0
    if not ref > 0:
        return np.ones(n)
    return np.clip(np.where(np.isfinite(rms), rms / ref, 1.0), *VOLATILITY_SCALE_BOUNDS)


def observed_lead_error(y: pd.Series, profile: np.ndarray | None, lead_s: float, fine_s: float,
                        times) -> np.ndarray:
    """e_obs(t): the log error of the plan whose lead ended by ``times``, as the planner sees it then:
    log(y(b) / (y(b - n I) rho(b - n I))), b the last interval of ``y`` ended by t, I the interval,
    n = max(1, round(lead / I)) (NaN where those intervals are missing).

    Parameters
    ----------
    y : pandas.Series
        Observed demand on the planner's intervals (absolute time index, s).
    profile : numpy.ndarray or None
        The rise profile on the ``fine_s`` grid (None: rho = 1).
    lead_s, fine_s : float
        The lead and the profile's grid (s).
    times : array_like
        Absolute decision times (s).

    Returns
    -------
    numpy.ndarray
    """
    idx = y.index.to_numpy(dtype=float)
    step = float(np.median(np.diff(idx))) if len(idx) > 1 else 1.0
    vals = y.to_numpy(dtype=float)
    n = max(1, int(round(lead_s / step)))
    b = np.searchsorted(idx + step, np.asarray(times, dtype=float), side="right") - 1
    ok = b - n >= 0
    now = np.where(ok, vals[np.clip(b, 0, len(vals) - 1)], np.nan)
    then = np.where(ok, vals[np.clip(b - n, 0, len(vals) - 1)], np.nan)
    if profile is not None:
        tod = np.mod(np.round(idx[np.clip(b - n, 0, len(idx) - 1)] / fine_s).astype(np.int64), len(profile))
        then = then * profile[tod]
    with np.errstate(all="ignore"):
        return np.log(np.maximum(now, 1e-9) / np.maximum(then, 1e-9))


#: quantiles of the observed lead error that bound the error-state bins (terciles)
ERROR_STATE_QUANTILES = (1.0 / 3.0, 2.0 / 3.0)


def error_state_scale(y: pd.Series, profile: pd.Series | None, lead_s: float, *, days: int = 3,
                      fine_s: float = 60.0) -> tuple[np.ndarray, np.ndarray]:
    """w(s): how the plan's lead error depends on the error it has just made - the bins of the
    observed lead error e_obs (:func:`observed_lead_error`) at the terciles
    (:data:`ERROR_STATE_QUANTILES`) of the last ``days`` days, and per bin the root mean square of
    the positive lead error e(u) = log(demand(u + lead) / (demand(u) rho(u))) of the decisions in
    it over the mean of those, clipped to :data:`VOLATILITY_SCALE_BOUNDS` (a quantile of the lead
    error conditioned on the recent error, by the equal-exceedance allocation of
    :func:`hour_phase_scale`).

    Parameters
    ----------
    y : pandas.Series
        Observed demand on the planner's intervals (absolute time index, s).
    profile : pandas.Series or None
        The rise profile (None: rho = 1).
    lead_s : float
        The lead (s).
    days : int
        Days used (the last ones).
    fine_s : float
        The replay grid and the profile's (s).

    Returns
    -------
    tuple of numpy.ndarray
        ``(edges, weights)``: the bin edges (len 2) and the weight per bin (len 3); weights of 1
        when the days are too few.
    """
    t, v = _fine(y, fine_s)
    k = max(int(round(lead_s / fine_s)), 0)
    i = np.nonzero(t >= t[-1] - days * DAY_S)[0]
    i = i[i + k < len(v)]
    prof = None if profile is None else profile.to_numpy()
    base = v[i] if prof is None else v[i] * prof[np.mod(np.round(t[i] / fine_s).astype(np.int64), len(prof))]
    e = np.maximum(np.log(np.maximum(v[i + k], 1e-9) / np.maximum(base, 1e-9)), 0.0)
    eo = observed_lead_error(y, prof, lead_s, fine_s, t[i])
    ok = np.isfinite(eo)
    if ok.sum() < 3 * len(ERROR_STATE_QUANTILES) + 3:
        return np.zeros(len(ERROR_STATE_QUANTILES)), np.ones(len(ERROR_STATE_QUANTILES) + 1)
    edges = np.quantile(eo[ok], ERROR_STATE_QUANTILES)
    bins = np.digitize(eo[ok], edges)
    rms = np.array([math.sqrt(float(np.mean(e[ok][bins == b] ** 2))) if np.any(bins == b) else math.nan
                    for b in range(len(edges) + 1)])
    ref = float(np.nanmean(rms)) if np.isfinite(rms).any() else 0.0
    if not ref > 0:
        return edges, np.ones(len(edges) + 1)
    return edges, np.clip(np.where(np.isfinite(rms), rms / ref, 1.0), *VOLATILITY_SCALE_BOUNDS)


#: how many time constants of past intervals the live scale is computed over (e^-6: the rest)
_VOLATILITY_SPAN = 6.0


def calibrate_headroom(demand: pd.Series, profile: pd.Series | None, lead_s: float, *, excess_budget: float,
                       utilization: float = 1.0, hold_s: float = 0.0, days: int = 3, fine_s: float = 60.0,
                       time_offset_s: float = 0.0, grid=HEADROOM_GRID,
                       scale: pd.Series | None = None, correction=None, trend_s: float = 0.0,
                       phase_scale: np.ndarray | None = None, interval_s: float = 600.0,
                       decision_weight=None, with_capacity: bool = False, fall_hold_s: float | None = None,
                       falling: np.ndarray | None = None) -> tuple[float, ...]:
    """The smallest headroom whose replay leaves at most ``excess_budget`` of the demand unserved.

    The replayed rule is the pool rule of :class:`PlannedPoolController` with perfect measurement
    and whole-worker rounding left out: the pool is sized for demand(t - lead) x rho(t - lead) x
    (1 + h v(t - lead)) at the target utilisation, so it can serve that / ``utilization``, and it is
    released no sooner than ``hold_s`` after (the scale-down dwell): capacity(t) = the largest of
    those over [t - hold_s, t]. The excess is sum(max(demand - capacity, 0)) / sum(demand) over the
    last ``days`` days. v is the volatility scale (``scale``; 1 without it).

    With ``fall_hold_s`` (the pools' forecast-fall release, :class:`DemandPlannerConfig`
    ``fall_dwell_s``) the replay follows the pool's two directions instead: the pool provisioned at
    u is P(u) = the largest decision D over [u - hold(u), u], D(u) = demand(u) x rho(u) x (1 + h
    v(u)) / utilisation, hold(u) = ``fall_hold_s`` where ``falling`` flags u's time of day, else
    ``hold_s``; a worker released is gone at once and one ordered serves a lead later, so the
    capacity serving at t is the smallest P over [t - lead, t] (a release inside the lead cannot be
    undone before it ends).

    Parameters
    ----------
    demand : pandas.Series
        Offered demand (requests/s), regular grid, absolute time index (s).
    profile : pandas.Series or None
        The rise profile (:func:`rise_profile`); None replays the rule without it (rho = 1).
    lead_s : float
        The lead (s).
    excess_budget : float
        Largest acceptable unserved fraction, in (0, 1).
    utilization : float
        The pool rule's target utilisation, in (0, 1].
    hold_s : float
        The rule holds a size at least this long before a scale-down (s, >= 0).
    days : int
        Days replayed (the last ones).
    fine_s : float
        Replay grid (s).
    time_offset_s : float
        Added to the index.
    grid : sequence of float
        Headrooms tried, increasing.
    scale : pandas.Series, optional
        The volatility scale v on the planner's intervals (same index as ``demand``), held from
        the end of each interval until the next one ends (what the planner knows then).
    correction : callable, optional
        ``correction(times, rates) -> factors``: the lead correction of the forecast
        (:meth:`DemandPlanner.lead_correction`), applied to the base at each decision time.
    trend_s : float
        The pool rule's rising trend (:func:`rising_trend` over ``trend_s``, s, >= 0; 0 = none):
        the replayed rule sizes for the demand's rise over the last ``trend_s`` carried on for as long.
    phase_scale : numpy.ndarray, optional
        The headroom's weight by phase of the hour (:func:`hour_phase_scale`), applied at each
        decision time.
    interval_s : float
        Width of one phase of ``phase_scale`` (s; the planner's interval).
    decision_weight : callable, optional
        ``decision_weight(times) -> weights``: a further weight of the headroom at each decision
        time (the error-state scale, :func:`error_state_scale`).
    with_capacity : bool
        Also return the replayed capacity over the demand (sum over sum) at that headroom.
    fall_hold_s : float, optional
        The hold where a fall is forecast (s, >= 0; None: the replay above, one hold everywhere).
    falling : numpy.ndarray, optional
        With ``fall_hold_s``: per point of the time-of-day grid (``fine_s``), whether a fall is
        forecast there (``DemandPlanner.falling_profile``; None: nowhere).

    Returns
    -------
    tuple
        ``(headroom, excess at that headroom)`` (and the capacity ratio with ``with_capacity``); the
        last grid value if none meets the budget.
    """
    check_number("planner.excess_budget", excess_budget, low=0.0, high=1.0, low_inclusive=False,
                 high_inclusive=False)
    t, v = _fine(demand, fine_s)
    t = t + time_offset_s
    k = max(int(round(lead_s / fine_s)), 0)
    use = np.nonzero(t >= t[-1] - days * DAY_S)[0]
    use = use[use >= k]
    if not len(use):
        raise ConfigError("planner.history", "too short to replay the pool rule over one lead")
    j = int(round(check_number("planner.hold_s", hold_s, low=0.0) / fine_s))
    if fall_hold_s is not None:
        return _two_way_replay(t, v, use, k, j, int(round(check_number("planner.fall_hold_s", fall_hold_s, low=0.0)
                                                          / fine_s)),
                               falling, profile, correction, trend_s, utilization, fine_s, scale, phase_scale,
                               interval_s, time_offset_s, decision_weight, excess_budget, grid, with_capacity)
    base = _replayed_base(t, v, use - k, profile, correction, trend_s, utilization, fine_s)
    vs = _replayed_scale(t[use - k], scale, phase_scale, interval_s, time_offset_s, fine_s)
    if decision_weight is not None:
        vs = vs * np.asarray(decision_weight(t[use - k]), dtype=float)

    def held(x: np.ndarray) -> np.ndarray:  # max over [t - hold, t]: the forward max of the reversed series
        return _ahead_max(x[::-1], j)[::-1] if j > 0 else x

    want = v[use]
    total = want.sum()
    const = held(base) if scale is None and phase_scale is None and decision_weight is None else None
    h_best, e_best, c_best = float(grid[-1]), math.nan, math.nan
    for h in grid:
        cap = const * (1.0 + h) if const is not None else held(base * (1.0 + h * vs))
        e = float(np.maximum(want - cap, 0.0).sum() / total) if total > 0 else 0.0
        c = float(cap.sum() / total) if total > 0 else math.nan
        if e <= excess_budget:
            return (float(h), e, c) if with_capacity else (float(h), e)
        e_best, c_best = e, c
    return (h_best, e_best, c_best) if with_capacity else (h_best, e_best)


def _held_back(x: np.ndarray, j: int) -> np.ndarray:
    """max(x[i - j : i + 1]) for every i (the window clipped at the start)."""
    return _ahead_max(x[::-1], j)[::-1] if j > 0 else x


def _two_way_replay(t, v, use, k: int, j: int, j_fall: int, falling, profile, correction, trend_s, utilization,
                    fine_s, scale, phase_scale, interval_s, time_offset_s, decision_weight, excess_budget, grid,
                    with_capacity):
    """:func:`calibrate_headroom` with the pool's two directions (its ``fall_hold_s`` branch)."""
    a = np.arange(max(int(use[0]) - k - max(j, j_fall), 0), int(use[-1]) + 1)  # every decision that matters
    base = _replayed_base(t, v, a, profile, correction, trend_s, utilization, fine_s)
    vs = _replayed_scale(t[a], scale, phase_scale, interval_s, time_offset_s, fine_s)
    if decision_weight is not None:
        vs = vs * np.asarray(decision_weight(t[a]), dtype=float)
    if falling is not None:
        f = np.asarray(falling, dtype=bool)
        flag = f[np.mod(np.round(t[a] / fine_s).astype(np.int64), len(f))]
    else:
        flag = np.zeros(len(a), dtype=bool)
    pos = use - a[0]
    want = v[use]
    total = want.sum()
    h_best, e_best, c_best = float(grid[-1]), math.nan, math.nan
    for h in grid:
        d = base * (1.0 + h * vs)
        prov = np.where(flag, _held_back(d, j_fall), _held_back(d, j))
        # serving at t: the smallest provisioned over [t - lead, t] (the forward min of the reversed series)
        serving = (-_ahead_max(-prov[::-1], k))[::-1] if k > 0 else prov
        cap = serving[pos]
        e = float(np.maximum(want - cap, 0.0).sum() / total) if total > 0 else 0.0
        c = float(cap.sum() / total) if total > 0 else math.nan
        if e <= excess_budget:
            return (float(h), e, c) if with_capacity else (float(h), e)
        e_best, c_best = e, c
    return (h_best, e_best, c_best) if with_capacity else (h_best, e_best)


def _replayed_base(t, v, at, profile, correction, trend_s: float, utilization: float, fine_s: float) -> np.ndarray:
    """The replayed pool rule's capacity at zero headroom for the decisions at indices ``at``: the
    demand (with the rising trend) x rho x the lead correction, over the target utilisation."""
    kt = int(round(check_number("planner.trend_s", trend_s, low=0.0) / fine_s))
    base = rising_trend(v, kt)[at]
    if profile is not None:
        tod = np.mod(np.round(t[at] / fine_s).astype(np.int64), len(profile))
        base = base * profile.to_numpy()[tod]
    if correction is not None:
        base = base * np.asarray(correction(t[at], v[at]), dtype=float)
    check_number("planner.utilization", utilization, low=0.0, high=1.0, low_inclusive=False)
    return base / utilization


def _replayed_scale(times, scale, phase_scale, interval_s: float, time_offset_s: float, fine_s: float) -> np.ndarray:
    """The headroom's weight at each decision time: the volatility scale known then (1 without it)
    x the phase-of-the-hour weight."""
    vs = np.ones(len(times))
    if scale is not None:
        # the bin [b, b + interval) is known from its end: the scale of the last bin ended by then
        ts = scale.index.to_numpy(dtype=float) + time_offset_s
        step = float(np.median(np.diff(ts))) if len(ts) > 1 else fine_s
        j_s = np.searchsorted(ts + step, times, side="right") - 1
        sv = scale.to_numpy(dtype=float)
        vs = np.where(j_s >= 0, sv[np.clip(j_s, 0, len(sv) - 1)], 1.0)
        vs = np.where(np.isfinite(vs), vs, 1.0)
    if phase_scale is not None:
        w = np.asarray(phase_scale, dtype=float)
        ph = np.minimum((np.mod(times, HOUR_S) // interval_s).astype(np.int64), len(w) - 1)
        vs = vs * w[ph]
    return vs


def correction_certificate(volatility_window_s: float, interval_s: float = 600.0) -> dict:
    """What the stack certificate says of the planner's short-horizon correction.

    The volatility scale is computed from the offered demand (arrivals before admission), which no
    layer's action changes, and it multiplies the headroom only - not the backlog term that closes
    the reconfiguration loop - so it adds no loop: no crossover, no separation to check, and the
    reconfiguration loop's margins are the same with it. The relay check sizes the dead band on the
    measured rate's noise alone, as it did before; the plan multiplies that noise by rho (1 + h v),
    where it was rho (1 + h): what is bounded is how far the correction can move the plan, v in
    :data:`VOLATILITY_SCALE_BOUNDS`, updated once per planning interval.

    Parameters
    ----------
    volatility_window_s : float
        The planner's window (0: no correction).
    interval_s : float
        The planner's interval (how often the scale changes).

    Returns
    -------
    dict
        ``kind``, ``feed_forward``, ``loop`` (None), ``window_s``, ``scale_bounds``, ``update_period_s``.
    """
    if not volatility_window_s:
        return {"kind": "none", "feed_forward": True, "loop": None}
    return {"kind": "volatility-scaled headroom (historical simulation with volatility updating)",
            "feed_forward": True, "loop": None, "window_s": float(volatility_window_s),
            "scale_bounds": list(VOLATILITY_SCALE_BOUNDS), "update_period_s": float(interval_s),
            "note": "reads the offered demand only and scales the headroom, not the backlog feedback: no loop "
                    "is added and the reconfiguration loop's margins are unchanged; the relay check sizes the "
                    "need's noise on the measured rate alone, as without the correction - the plan multiplies "
                    f"it by rho (1 + h v), v <= {VOLATILITY_SCALE_BOUNDS[1]:g} (1 + h without it)"}


@dataclass(frozen=True)
class DemandPlannerConfig:
    """Everything :class:`DemandPlanner` is built from but the demand seen before the run (each field
    validated here, named ``planner.FIELD``; the stack's ``seasonal-rise`` layer resolves it from a
    scenario).

    Parameters
    ----------
    lead_s : float
        How far ahead the pools are sized (s): start-up + warm-up + a reconfiguration sample +
        the rate filter's time constant ([0, 4 h]).
    excess_budget : float
        Share of the demand the replayed pool rule may leave above capacity when the headroom is
        chosen, in (0, 0.5) (default 0.005: :data:`EXCESS_BUDGET_SHARE` of a 99 % SLO's miss
        budget, the rest left for what the replay does not model - the next day's demand, Poisson
        noise, the integer pool, measurement lag, a decode overload's TPOT; stack scenarios default
        to ``EXCESS_BUDGET_SHARE`` x (1 - ``slo.attainment``)).
    days : int
        Days of demand the profile and the headroom are computed over (>= 1; default 3).
    interval_s : float
        Bin of the observed demand and the planner's sample period (s, [1, 3600]; default 600).
    refit_s : float
        Recompute profile and headroom this often (s; default one day; >= ``interval_s``).
    fine_s : float
        Grid of the profile (s, <= ``interval_s``; default 60).
    time_offset_s : float
        Absolute time of the run's t = 0 (so the time of day lines up with ``history``).
    max_headroom : float
        The largest headroom the planner may choose (default the grid's last, 0.6).
    utilization : float
        The reconfiguration layer's target utilisation, replayed with the rule (default 1).
    hold_s : float
        The reconfiguration layer's scale-down dwell, replayed with the rule (s; default 0).
    use_profile : bool
        False: plan the headroom only (rho = 1), an ablation of the rise profile (default True).
    profile_smooth_s : float, optional
        Width of the rise profile's running median (s, [0, 6 h]; default ``interval_s``).
    volatility_window_s : float
        The short-horizon correction: the headroom in force is h x the volatility scale, whose
        weights decay with this time constant (s, [0, 1 day]; default 3600; 0 = a constant
        headroom, the rule without it).
    residual_ar1 : bool
        The lead correction (:meth:`lead_correction`; default False): the log residual of the
        demand from its median daily level, r(t), is taken to decay as an AR(1) with phi fitted by
        least squares on the fitted days (regression with ARIMA errors, Hyndman &
        Athanasopoulos, Forecasting: Principles and Practice, 3rd ed., ch. 9-10: the forecast of an
        AR(1) error h steps ahead is phi^h times the current one), so the plan is multiplied by
        exp((phi^(lead / interval_s) - 1) r(t)); the headroom's replay includes it.
    trend_s : float
        The pools' rising trend (s, [0, ``interval_s``]; default 0 = none): a pool sizes for its
        filtered rate's rise over the last ``trend_s`` carried on for as long
        (:func:`rising_trend`); the headroom's replay includes it, and each refit keeps the trend
        (:attr:`trend_in_force_s`) only when its replay meets the budget with less capacity than
        without it.
    hour_phase : bool
        Weight the headroom by the phase of the hour (:func:`hour_phase_scale`, refit daily with
        the rest; the replay includes it; default False).
    error_state : bool
        Weight the headroom by the tercile of the lead error the plan has just made
        (:func:`error_state_scale`, refit daily; the replay includes it; default False).
    fall_dwell_s : float, optional
        The forecast-fall release (s, [0, 1 day]; default None = off): where the fall profile
        (:func:`fall_profile`, refit daily) forecasts the demand one lead ahead at least
        :data:`FALL_THRESHOLD` below the current one, the pools release after this dwell (and this
        least time between two scale-downs) instead of their own ``dwell_s`` / ``down_cooldown_s``;
        scale-ups and the cooldown after one are unchanged. The headroom's replay follows the
        pool's two directions with that hold (:func:`calibrate_headroom`'s ``fall_hold_s``).
    """

    lead_s: float = setting(REQUIRED, unit="s", low=0.0, high=4 * 3600.0,
                            meaning="how far ahead the pools are sized (start-up + warm-up + a reconfiguration "
                                    "sample + the rate filter's time constant)")
    excess_budget: float = setting(EXCESS_BUDGET_SHARE * 0.01, low=0.0, high=0.5, low_inclusive=False,
                                   high_inclusive=False,
                                   meaning="share of the demand the replayed pool rule may leave above capacity "
                                           "when the headroom is chosen")
    days: int = setting(3, kind=int, unit="days", low=1, high=14,
                        meaning="days of demand the profile and the headroom are computed over")
    interval_s: float = setting(600.0, unit="s", low=1.0, high=3600.0,
                                meaning="bin of the observed demand and the planner's sample period")
    refit_s: float = setting(DAY_S, unit="s", high=30 * DAY_S,
                             meaning="recompute profile and headroom this often (at least interval_s)")
    fine_s: float = setting(60.0, unit="s", low=1.0, meaning="grid of the profile (at most interval_s)")
    time_offset_s: float = setting(0.0, unit="s", meaning="absolute time of the run's t = 0")
    max_headroom: float = setting(HEADROOM_GRID[-1], low=0.0, high=HEADROOM_GRID[-1],
                                  meaning="the largest headroom the planner may choose")
    utilization: float = setting(1.0, low=0.0, high=1.0, low_inclusive=False,
                                 meaning="the reconfiguration layer's target utilisation, replayed with the rule")
    hold_s: float = setting(0.0, unit="s", low=0.0,
                            meaning="the reconfiguration layer's scale-down dwell, replayed with the rule")
    use_profile: bool = setting(True, kind=bool, meaning="plan the rise profile (false: the headroom only, rho = 1)")
    volatility_window_s: float = setting(3600.0, unit="s", low=0.0, high=DAY_S,
                                         meaning="time constant of the headroom's volatility scale (0: a constant "
                                                 "headroom; else at least interval_s)")
    profile_smooth_s: float | None = setting(None, unit="s", low=0.0, high=DAY_S / 4,
                                             meaning="width of the rise profile's running median (absent: "
                                                     "interval_s)")
    residual_ar1: bool = setting(False, kind=bool, meaning="the AR(1) lead correction of the log residual")
    trend_s: float = setting(0.0, unit="s", low=0.0,
                             meaning="span of the pools' rising trend (at most interval_s; 0: none)")
    hour_phase: bool = setting(False, kind=bool, meaning="weight the headroom by the phase of the hour")
    error_state: bool = setting(False, kind=bool,
                                meaning="weight the headroom by the tercile of the lead error just made")
    fall_dwell_s: float | None = setting(None, unit="s", low=0.0, high=DAY_S,
                                         meaning="the pools' scale-down dwell where the plan forecasts a fall "
                                                 "over the lead (absent: no forecast-driven release)")

    def __post_init__(self) -> None:  # checked once against the declarations, held as the values computed with
        check_fields(self, "planner", names=("interval_s",))
        i = self.interval_s
        check_fields(self, "planner", bounds={"refit_s": {"low": i}, "fine_s": {"high": i}, "trend_s": {"high": i}})
        if self.volatility_window_s and self.volatility_window_s < i:
            raise ConfigError("planner.volatility_window_s", f"must span at least one interval ({i:g} s) "
                              f"or be 0 (no correction), got {self.volatility_window_s:g}")


class DemandPlanner(SampledController):
    """The hours layer: the rise profile and the headroom of the next lead, refit daily.

    Parameters
    ----------
    config : DemandPlannerConfig, optional
        The planner's settings (every field validated by the config, named ``planner.FIELD``).
    history : pandas.Series, optional
        Demand observed before the run (requests/s on the ``interval_s`` grid, indexed by absolute
        time in seconds, 0 = midnight); without it the planner plans nothing until it has
        observed one day plus a lead.
    **fields
        :class:`DemandPlannerConfig` fields, when no ``config`` is given.
    """

    name = "planner"

    def __init__(self, config: DemandPlannerConfig | None = None, *, history: pd.Series | None = None, **fields):
        self.config = c = config_or_fields("planner", DemandPlannerConfig, config, fields)
        super().__init__(c.interval_s)
        (self.lead_s, self.excess_budget, self.days, self.interval_s, self.refit_s, self.fine_s, self.time_offset_s,
         self.max_headroom, self.utilization, self.hold_s, self.use_profile, self.volatility_window_s,
         self.residual_ar1, self.trend_s, self.hour_phase, self.error_state, self.fall_dwell_s) = (
            c.lead_s, c.excess_budget, c.days, c.interval_s, c.refit_s, c.fine_s, c.time_offset_s, c.max_headroom,
            c.utilization, c.hold_s, c.use_profile, c.volatility_window_s, c.residual_ar1, c.trend_s, c.hour_phase,
            c.error_state, c.fall_dwell_s)
        self.profile_smooth_s = c.interval_s if c.profile_smooth_s is None else c.profile_smooth_s
        if history is not None:
            if not isinstance(history, pd.Series) or history.empty:
                raise ConfigError("planner.history", "expected a non-empty pandas Series indexed by time_s")
            d = np.diff(history.index.to_numpy(dtype=float))
            if len(d) and not np.allclose(d, c.interval_s):
                raise ConfigError("planner.history", f"must be on the planner's {c.interval_s:g} s grid")
        self.history = history
        self.reset()

    def reset(self) -> None:
        """Forget the run's observations (the history before the run is kept) and the plan."""
        h = self.history
        self._obs: dict[float, float] = {} if h is None else {float(k): float(v) for k, v in h.items()}
        self._profile: np.ndarray | None = None
        self.headroom = math.nan
        self.replay_excess = math.nan
        self.volatility_mean = math.nan  # mean(s) over the replayed days (the scale's reference)
        self.volatility_scale = 1.0      # v now: s over the last window / volatility_mean
        self._level: np.ndarray | None = None  # median demand by time of day (the AR(1)'s mean), per interval
        self.residual_phi = math.nan     # the residual's AR(1) coefficient per interval (fitted)
        self.phase_scale: np.ndarray | None = None  # the headroom's weight by phase of the hour (fitted)
        self.trend_in_force_s = 0.0      # the trend the pools apply: trend_s when its replay is cheaper, else 0
        self._error_edges: np.ndarray | None = None  # the error-state bins' edges and weights (fitted)
        self._error_weights: np.ndarray | None = None
        self.error_state_weight = 1.0    # w now: the weight of the last observed lead error's bin
        self.falling_profile: np.ndarray | None = None  # per time of day: a fall forecast over the lead (fitted)
        self._last_fit = -math.inf
        self._fits: list[tuple[float, np.ndarray]] = []  # (fit time, profile): the rise in force from then
        self.events: list[dict] = []  # every refit: time, headroom, its replayed excess, peak rise
        self.trace: list[dict] = []   # every sample: time, observed rate, rise, headroom

    def rise(self, t: float) -> float:
        """rho at the run's time ``t`` (>= 1; NaN before the first fit)."""
        if self._profile is None:
            return math.nan
        j = int(round((t + self.time_offset_s) / self.fine_s)) % len(self._profile)
        return float(self._profile[j])

    def falling(self, t: float) -> bool:
        """Whether the plan forecasts a fall over the lead at the run's time ``t`` (the fall profile
        one lead ahead below 1 - :data:`FALL_THRESHOLD`; False without ``fall_dwell_s`` or before
        the first fit)."""
        if self.falling_profile is None:
            return False
        j = int(round((t + self.time_offset_s) / self.fine_s)) % len(self.falling_profile)
        return bool(self.falling_profile[j])

    def rise_in_force(self, times) -> np.ndarray:
        """rho at each of the run's ``times`` from the profile of the fit in force then (NaN before
        the first fit): the plan replayed after the run, e.g. with the loop through the plant opened.

        Parameters
        ----------
        times : array_like
            Plant times (s).

        Returns
        -------
        numpy.ndarray
        """
        t = np.asarray(times, dtype=float)
        out = np.full(t.shape, np.nan)
        for i, (t_fit, prof) in enumerate(self._fits):
            nxt = self._fits[i + 1][0] if i + 1 < len(self._fits) else math.inf
            sel = (t >= t_fit) & (t < nxt)
            j = np.round((t[sel] + self.time_offset_s) / self.fine_s).astype(np.int64) % len(prof)
            out[sel] = prof[j]
        return out

    def headroom_at(self, t: float) -> float:
        """The headroom in force: h x the volatility scale (NaN before the first fit).

        Parameters
        ----------
        t : float
            Plant time (s; the volatility scale is the one of the last observed interval; the
            phase weight, with ``hour_phase``, the one of ``t``'s phase of the hour - NaN: none).

        Returns
        -------
        float
            A fraction of the planned demand.
        """
        w = 1.0
        if self.phase_scale is not None and math.isfinite(t):
            ph = int(((t + self.time_offset_s) % HOUR_S) // self.interval_s)
            w = float(self.phase_scale[min(ph, len(self.phase_scale) - 1)])
        return self.headroom * self.volatility_scale * w * self.error_state_weight

    def lead_correction(self, t, rate):
        """The AR(1) lead correction exp((phi^(lead / interval_s) - 1) r), r = log(rate / level(t)).

        Persistence (the measured rate x rho) carries the current residual from the median daily
        level over the whole lead; an AR(1) residual keeps phi^(lead / interval_s) of it. r is
        clipped to [-1, 1] (a factor e within the day's own range), so the correction moves the
        plan by at most exp(1 - phi^(lead / interval_s)).

        Parameters
        ----------
        t : float or numpy.ndarray
            Absolute time(s) (s, the planner's clock plus ``time_offset_s``).
        rate : float or numpy.ndarray
            Measured offered rate(s) (requests/s).

        Returns
        -------
        float or numpy.ndarray
            The factor (1 without ``residual_ar1`` or before the first fit).
        """
        if not self.residual_ar1 or self._level is None or not math.isfinite(self.residual_phi):
            return np.ones_like(np.asarray(rate, dtype=float)) if np.ndim(rate) else 1.0
        n = len(self._level)
        tod = np.mod(np.asarray(t, dtype=float), DAY_S)
        level = np.interp(tod, np.arange(n) * self.interval_s, self._level, period=DAY_S)
        r = np.clip(np.log(np.maximum(np.asarray(rate, dtype=float), 1e-9) / np.maximum(level, 1e-9)), -1.0, 1.0)
        f = np.exp((self.residual_phi ** (self.lead_s / self.interval_s) - 1.0) * r)
        return float(f) if np.ndim(f) == 0 else f

    def _fit_residual_ar1(self, y: pd.Series, days: int) -> None:
        """The median level by time of day and the AR(1) coefficient of the log residual from it,
        by least squares (no intercept: the residual of a median) on the last ``days`` days of ``y``."""
        per_day = int(round(DAY_S / self.interval_s))
        z = y[y.index >= y.index[-1] - days * DAY_S].interpolate(limit_direction="both")
        tod = np.mod(np.round(z.index.to_numpy(dtype=float) / self.interval_s).astype(np.int64), per_day)
        level = pd.Series(z.to_numpy(dtype=float)).groupby(tod).median().reindex(range(per_day))
        level = level.interpolate(limit_direction="both").to_numpy(dtype=float)
        r = np.log(np.maximum(z.to_numpy(dtype=float), 1e-9) / np.maximum(level[tod], 1e-9))
        a, b = r[:-1], r[1:]
        den = float(np.dot(a, a))
        self._level = level
        self.residual_phi = float(np.clip(np.dot(a, b) / den, 0.0, 1.0)) if den > 0 else 1.0

    def _error_weight(self, y: pd.Series, profile: np.ndarray, times) -> np.ndarray:
        """The error-state weight at absolute ``times`` from the observed demand ``y`` (1 where the
        observed error is unknown or without the fit)."""
        if self._error_weights is None:
            return np.ones(len(np.atleast_1d(times)))
        eo = observed_lead_error(y, profile, self.lead_s, self.fine_s, np.atleast_1d(times))
        w = self._error_weights[np.digitize(np.nan_to_num(eo, nan=0.0), self._error_edges)]
        return np.where(np.isfinite(eo), w, 1.0)

    def _scale_now(self, now_abs: float) -> float:
        """v from the intervals observed before ``now_abs`` (1 before a fit or without the correction)."""
        if not self.volatility_window_s or not math.isfinite(self.volatility_mean) or self.volatility_mean <= 0:
            return 1.0
        n = int(round(_VOLATILITY_SPAN * self.volatility_window_s / self.interval_s))
        last = math.floor(now_abs / self.interval_s) * self.interval_s - self.interval_s
        pts = [self._obs.get(last - i * self.interval_s, math.nan) for i in range(n, -1, -1)]
        y = pd.Series(pts, index=np.arange(len(pts), dtype=float) * self.interval_s)
        if y.notna().sum() < 2:
            return 1.0
        s = float(interval_volatility(y, self.volatility_window_s).iloc[-1])
        lo, hi = VOLATILITY_SCALE_BOUNDS
        return float(np.clip(s / self.volatility_mean, lo, hi)) if math.isfinite(s) else 1.0

    def _series(self, now_abs: float) -> pd.Series:
        keys = sorted(k for k in self._obs if now_abs - (self.days + 1) * DAY_S - self.lead_s <= k < now_abs)
        if not keys:
            return pd.Series(dtype=float)
        grid = np.arange(keys[0], keys[-1] + self.interval_s / 2, self.interval_s)
        return pd.Series([self._obs.get(float(x), np.nan) for x in grid], index=pd.Index(grid, name="time_s"))

    def refit(self, t: float) -> bool:
        """Recompute the profile and the headroom from the demand seen up to ``t``; False when
        there is not yet one day plus a lead of it."""
        y = self._series(t + self.time_offset_s)
        if y.notna().sum() * self.interval_s < DAY_S + self.lead_s:
            return False
        days = max(1, min(self.days, int((y.index[-1] - y.index[0] - self.lead_s) // DAY_S)))
        prof = rise_profile(y, self.lead_s, days=days, fine_s=self.fine_s, smooth_s=self.profile_smooth_s)
        if not self.use_profile:
            prof[:] = 1.0
        grid = [h for h in HEADROOM_GRID if h <= self.max_headroom + 1e-12]
        scale, vmean = None, math.nan
        if self.volatility_window_s:
            vol = interval_volatility(y, self.volatility_window_s)
            replayed = vol[vol.index >= y.index[-1] - days * DAY_S]
            vmean = float(replayed.mean())
            if math.isfinite(vmean) and vmean > 0:
                scale = (vol / vmean).clip(*VOLATILITY_SCALE_BOUNDS)
        corr = None
        if self.residual_ar1:
            self._fit_residual_ar1(y, days)
            corr = self.lead_correction
        phase = (hour_phase_scale(y, prof, self.lead_s, days=days, interval_s=self.interval_s, fine_s=self.fine_s)
                 if self.hour_phase else None)
        weight = None
        if self.error_state:
            self._error_edges, self._error_weights = error_state_scale(y, prof, self.lead_s, days=days,
                                                                       fine_s=self.fine_s)
            weight = lambda times: self._error_weight(y, prof.to_numpy(), times)  # noqa: E731
        falls = None
        if self.fall_dwell_s is not None:
            phi = fall_profile(y, self.lead_s, days=days, fine_s=self.fine_s, smooth_s=self.profile_smooth_s)
            falls = phi.to_numpy() < 1.0 - FALL_THRESHOLD
        kw = dict(excess_budget=self.excess_budget, days=days, utilization=self.utilization, hold_s=self.hold_s,
                  fine_s=self.fine_s, grid=grid, scale=scale, correction=corr, phase_scale=phase,
                  interval_s=self.interval_s, decision_weight=weight, with_capacity=True,
                  fall_hold_s=self.fall_dwell_s, falling=falls)
        h, e, cap = calibrate_headroom(y, prof, self.lead_s, **kw)
        self.trend_in_force_s = 0.0
        if self.trend_s:
            # the trend only adds capacity where the headroom is already 0 (short leads): keep it
            # only when its replay meets the budget with less capacity
            ht, et, capt = calibrate_headroom(y, prof, self.lead_s, trend_s=self.trend_s, **kw)
            if capt < cap and et <= self.excess_budget:
                h, e, self.trend_in_force_s = ht, et, self.trend_s
        self.phase_scale = phase
        self.falling_profile = falls
        self._profile = prof.to_numpy()
        self._fits.append((t, self._profile))
        self.headroom, self.replay_excess = h, e
        self.volatility_mean = vmean if scale is not None else math.nan
        self.volatility_scale = self._scale_now(t + self.time_offset_s)
        self.events.append({"time_s": t, "headroom": h, "replay_excess": e, "days": days,
                            "max_rise": float(prof.max()), "mean_rise": float(prof.mean()),
                            "volatility_mean": self.volatility_mean, "residual_phi": self.residual_phi,
                            "trend_s": self.trend_in_force_s,
                            "falling_share": math.nan if falls is None else float(falls.mean())})
        return True

    def update(self, t: float, m: Measurement) -> None:
        """Record the last interval's offered demand; refit daily (or as soon as there is enough).

        Parameters
        ----------
        t : float
            Plant time (s).
        m : Measurement
            The sample (its ``arrival_rate`` averaged over this planner's period).

        Returns
        -------
        None
            The plan reaches the plant through :meth:`rise` and :attr:`headroom` only.
        """
        rate = m.arrival_rate if math.isfinite(m.arrival_rate) else m.admitted_rate
        if math.isfinite(rate):
            # the measurement averages the last sample period: it is the bin that ended at m.time_s
            b = math.floor((m.time_s + self.time_offset_s) / self.interval_s) * self.interval_s - self.interval_s
            self._obs[float(b)] = float(rate)
        if t - self._last_fit >= self.refit_s - 1e-9 and self.refit(t):
            self._last_fit = t
        self.volatility_scale = self._scale_now(m.time_s + self.time_offset_s)
        if self._error_weights is not None and self._profile is not None:
            now = t + self.time_offset_s
            y = self._series(now + self.interval_s)  # the bins ended by now (the last one included)
            self.error_state_weight = float(self._error_weight(y, self._profile, [now])[0]) if len(y) else 1.0
        self.trace.append({"time_s": t, "observed_rps": rate, "rise": self.rise(t), "headroom": self.headroom_at(t),
                           "headroom_base": self.headroom, "volatility_scale": self.volatility_scale})
        return None

    def params(self) -> dict:
        """The configuration (reported with results)."""
        return {"lead_s": self.lead_s, "excess_budget": self.excess_budget, "days": self.days,
                "interval_s": self.interval_s, "refit_s": self.refit_s, "fine_s": self.fine_s,
                "sample_period": self.sample_period, "max_headroom": self.max_headroom,
                "utilization": self.utilization, "hold_s": self.hold_s, "use_profile": self.use_profile,
                "volatility_window_s": self.volatility_window_s, "profile_smooth_s": self.profile_smooth_s,
                "residual_ar1": self.residual_ar1, "trend_s": self.trend_s,
                "hour_phase": self.hour_phase, "error_state": self.error_state, "fall_dwell_s": self.fall_dwell_s,
                "history_points": 0 if self.history is None else int(len(self.history))}


def lead_forecast_error(demand: pd.Series, lead_s: float, *, test_days: int = 4, days: int = 3,
                        interval_s: float = 600.0, fine_s: float = 60.0, residual_ar1: bool = False,
                        window_max: bool = False) -> dict:
    """The plan's forecast error at the lead, out of sample: log(demand(u + lead) / the plan made
    at u, demand(u) x rho(u) x the lead correction) - the pool sized at u serves from u + lead -
    on each of the last ``test_days`` days, the planner fitted on the ``days`` days before it
    (rolling origin: Hyndman & Athanasopoulos, Forecasting: Principles and Practice, 3rd ed., sec.
    5.10), on the ``fine_s`` grid the pool model draws arrivals from. The headroom is what covers
    this error, so its upper tail sets the plan's cost. ``window_max`` measures against the
    largest demand over [u, u + lead] instead (what rho is the median of).

    Parameters
    ----------
    demand : pandas.Series
        Offered demand (requests/s) on the ``interval_s`` grid, absolute time index (s).
    lead_s : float
        The lead (s).
    test_days : int
        Days evaluated (the last ones; >= 1).
    days : int
        Days each fit uses (>= 1).
    interval_s, fine_s : float
        The planner's grid and the profile's (s).
    residual_ar1 : bool
        With the AR(1) lead correction (:meth:`DemandPlanner.lead_correction`).
    window_max : bool
        Against the largest demand over the lead (default: the demand one lead ahead).

    Returns
    -------
    dict
        ``rms``, ``mean``, ``sd``, ``p99`` of the log error over all test points, and ``phi`` (the
        fitted AR(1) coefficient per test day; NaN without the correction).
    """
    check_int("planner.test_days", test_days, low=1)
    y = demand.astype(float)
    t_end = float(y.index[-1]) + interval_s
    k = int(round(lead_s / fine_s))
    errs, phis = [], []
    for d in range(test_days):
        d0 = t_end - (test_days - d) * DAY_S
        hist = y[y.index < d0]
        if hist.empty:
            raise ConfigError("planner.history", f"no demand before test day {d} ({d0:g} s)")
        p = DemandPlanner(DemandPlannerConfig(lead_s=lead_s, days=days, interval_s=interval_s, fine_s=fine_s,
                                              time_offset_s=d0, volatility_window_s=0.0, residual_ar1=residual_ar1),
                          history=hist)
        if not p.refit(0.0):
            raise ConfigError("planner.history", f"less than one day plus the lead before test day {d}")
        tf, v = _fine(y[(y.index >= d0 - interval_s) & (y.index < d0 + DAY_S + lead_s + interval_s)], fine_s)
        sel = np.nonzero((tf >= d0) & (tf < d0 + DAY_S))[0]
        sel = sel[sel + k < len(v)]
        need = _ahead_max(v, k)[sel] if window_max else v[sel + k]
        tod = np.mod(np.round(tf[sel] / fine_s).astype(np.int64), len(p._profile))
        base = v[sel] * p._profile[tod] * np.asarray(p.lead_correction(tf[sel], v[sel]), dtype=float)
        errs.append(np.log(np.maximum(need, 1e-9) / np.maximum(base, 1e-9)))
        phis.append(p.residual_phi)
    e = np.concatenate(errs)
    return {"rms": float(np.sqrt(np.mean(e ** 2))), "mean": float(e.mean()), "sd": float(e.std()),
            "p99": float(np.quantile(e, 0.99)), "phi": phis}


@dataclass(frozen=True, kw_only=True)
class PlannedPoolConfig(HystereticConfig):
    """Everything :class:`PlannedPoolController` is built from but its planner (each field validated
    here: ``planned.FIELD``, the hysteretic rule's own fields ``hysteretic.FIELD``; the stack's
    ``planned-hysteretic`` layer resolves it from a scenario). The hysteretic rule's fields are
    :class:`~tokenfactory.controllers.reconfiguration.HystereticConfig`'s, declared there (range,
    unit, meaning, default) but for the defaults of ``max_step_up``, ``max_step_down`` and
    ``max_replicas``; every field is keyword-only.

    Parameters
    ----------
    pool : str
        ``"fill"`` or ``"decode"``.
    per_worker_rps : float
        Requests/s one worker carries at full speed (> 0).
    headroom : float
        Fixed headroom without a planner (or before its first fit) ([0, 2]; default 0).
    min_headroom : float
        Floor of the headroom in force, the planner's included ([0, 2]; default 0). In a fixed
        fleet the workers are paid for whether a pool holds them or not, so the planner's
        cost-calibrated headroom should not remove the fixed margin (``build_stack`` sets it to
        ``headroom`` there).
    measured_fill_rate : bool
        Fill pool only: read the per-worker rate from the plant (fill capacity / fill workers)
        every sample - prompts change length over the day, the orchestrator knows the tokens it
        queues (default False).
    measured_decode_rate : bool
        Decode pool only: follow the output length the pool is serving - the per-worker rate is
        the nominal one x ``output_tokens`` / the measured passes per request, which Little's law
        gives from what an orchestrator scrapes (sequences decoding / (completions/s x pass time);
        vLLM's running requests, request-success counter and time per output token), low-passed
        with ``filter_s`` (default False).
    output_tokens : float, optional
        The output tokens ``per_worker_rps`` was computed at (> 0); required with
        ``measured_decode_rate``.
    target_utilization : float
        Utilisation the pool is sized for, in (0, 1].
    dead_band : float
        Workers the need must fall below n - 1 before a scale-down (>= 0).
    filter_s : float
        Time constant of the measured rate's filter (s).
    dwell_s : float
        The need must stay low this long before a scale-down (s).
    up_dwell_s : float, optional
        ... and high this long before a scale-up (s; default one sample).
    cooldown_s : float
        No scale-down sooner than this after a scale-up (s).
    max_step_up, max_step_down : int
        Largest move (workers; default 1000: a move is sized to the change).
    queue_clear_s : float
        The backlog term clears the queue in this time (s; the feedback loop's tuning).
    queue_headroom : float
        Cap of the backlog term as a share of the rate term.
    min_replicas, max_replicas : int
        Bounds of the pool (default 1 and 5000).
    sample_period : float
        The controller's period (s).
    down_cooldown_s : float, optional
        Least time between two scale-downs (s, >= 0; default ``dwell_s``).
    """

    pool: str = setting(REQUIRED, kind=str, choices=("fill", "decode"), meaning="the pool sized")
    per_worker_rps: float = setting(REQUIRED, unit="requests/s", low=0.0, low_inclusive=False,
                                    meaning="requests/s one worker carries at full speed")
    headroom: float = setting(0.0, low=0.0, high=2.0,
                              meaning="fixed headroom without a planner (or before its first fit)")
    min_headroom: float = setting(0.0, low=0.0, high=2.0, meaning="floor of the headroom in force, the planner's "
                                                                  "included")
    measured_fill_rate: bool = setting(False, kind=bool,
                                       meaning="fill pool: read the per-worker rate from the plant every sample")
    measured_decode_rate: bool = setting(False, kind=bool,
                                         meaning="decode pool: follow the output length the pool is serving")
    output_tokens: float | None = setting(None, unit="tokens", low=0.0, low_inclusive=False,
                                          meaning="the output tokens per_worker_rps was computed at (needed with "
                                                  "measured_decode_rate)")
    down_cooldown_s: float | None = setting(None, unit="s", low=0.0,
                                            meaning="least time between two scale-downs (absent: dwell_s)")
    # the hysteretic rule's declarations with the planned pool's defaults: a move sized to the change
    max_step_up: int = inherited_setting(HystereticConfig, "max_step_up", 1000)
    max_step_down: int = inherited_setting(HystereticConfig, "max_step_down", 1000)
    max_replicas: int = inherited_setting(HystereticConfig, "max_replicas", 5000)

    #: the fields the hysteretic rule shares (named ``hysteretic.FIELD`` in errors, as its own config's)
    _HYSTERETIC = ("pool", "min_replicas", "max_replicas", "per_worker_rps", "target_utilization", "dead_band",
                   "filter_s", "dwell_s", "up_dwell_s", "cooldown_s", "max_step_up", "max_step_down",
                   "queue_clear_s", "queue_headroom", "sample_period")

    def __post_init__(self) -> None:  # checked once against the declarations, held as the values computed with
        check_fields(self, "hysteretic", names=("min_replicas",))
        check_fields(self, "hysteretic", names=self._HYSTERETIC,
                     bounds={"max_replicas": {"low": max(1, self.min_replicas)}})
        if self.measured_decode_rate is True and self.pool != "decode":
            raise ConfigError("planned.measured_decode_rate", "applies to the decode pool only")
        if self.measured_decode_rate is True and self.output_tokens is None:
            raise ConfigError("planned.output_tokens", "needed with measured_decode_rate (> 0 tokens)")
        check_fields(self, "planned", names=("headroom", "min_headroom", "measured_fill_rate", "measured_decode_rate",
                                             "output_tokens", "down_cooldown_s"))


class PlannedPoolController(HystereticPoolController):
    """The reconfiguration layer's pool rule, led by the planner (see the module docstring).

    Parameters
    ----------
    config : PlannedPoolConfig, optional
        The pool rule's settings (every field validated by the config: ``planned.FIELD``, and the
        hysteretic rule's own fields ``hysteretic.FIELD`` as :class:`HystereticPoolController` names them).
    planner : DemandPlanner, optional
        Supplies the rise profile and the headroom; without one the rise is 1 and the headroom
        is ``headroom``.
    **fields
        :class:`PlannedPoolConfig` fields, when no ``config`` is given.
    """

    name = "planned-hysteretic"

    def __init__(self, config: PlannedPoolConfig | None = None, *, planner: DemandPlanner | None = None,
                 **fields):
        c = config_or_fields("planned", PlannedPoolConfig, config, fields)
        super().__init__(c.pool, c.per_worker_rps, c)  # a PlannedPoolConfig is a HystereticConfig
        self.planner = planner
        self.fixed_headroom, self.min_headroom = c.headroom, c.min_headroom
        self.measured_fill_rate, self.measured_decode_rate = c.measured_fill_rate, c.measured_decode_rate
        self.output_tokens = c.output_tokens
        self.down_cooldown_s = self.dwell_s if c.down_cooldown_s is None else c.down_cooldown_s
        self._nominal_rps = self.per_worker_rps
        self.reset()

    @classmethod
    def tuned(cls, pool: str, per_worker_rps: float, rate_rps: float, *, startup_s: float, warmup_s: float = 0.0,
              filter_s: float = 30.0, target_utilization: float = 0.85, z: float = 3.0, min_dead_band: float = 0.25,
              noise_std: float | None = None, **kw) -> "PlannedPoolController":
        """The documented defaults: dead band max(``min_dead_band``, z sigma) of the need signal's
        Poisson noise at ``rate_rps``, dwell 3 ``filter_s``, cooldown after a scale-up start-up +
        warm-up.

        Parameters
        ----------
        pool : str
            ``"fill"`` or ``"decode"``.
        per_worker_rps : float
            Requests/s per worker.
        rate_rps : float
            The demand the dead band is sized at (requests/s).
        startup_s, warmup_s : float
            Worker start-up and warm-up (s): the cooldown.
        filter_s : float
            Rate filter's time constant (s).
        target_utilization : float
            Utilisation the pool is sized for.
        z : float
            Dead band in standard deviations of the need noise.
        min_dead_band : float
            Smallest dead band (workers).
        noise_std : float, optional
            The need signal's noise (workers), e.g. measured; default the Poisson estimate.
        **kw
            The other fields of :class:`PlannedPoolConfig`, and ``planner``.

        Returns
        -------
        PlannedPoolController
        """
        sigma = noise_std if noise_std is not None else need_noise_std(rate_rps, per_worker_rps, target_utilization,
                                                                       filter_s)
        check_number("noise_std", sigma, low=0.0)
        kw.setdefault("dwell_s", 3.0 * filter_s)
        kw.setdefault("cooldown_s", startup_s + warmup_s)
        planner = kw.pop("planner", None)
        c = cls(PlannedPoolConfig(pool=pool, per_worker_rps=per_worker_rps, target_utilization=target_utilization,
                                  filter_s=filter_s, dead_band=max(min_dead_band, z * sigma), **kw), planner=planner)
        c.noise_std = sigma
        return c

    def reset(self) -> None:
        """Forget the filter, the dwell timers and the last moves."""
        super().reset()
        self._rise = math.nan
        if getattr(self, "measured_decode_rate", False):
            self.per_worker_rps = self._nominal_rps
        self._passes: float | None = None  # filtered output tokens per request (measured)
        self._t_passes: float | None = None
        self.last_hold = math.nan
        self._rates: list[tuple[float, float]] = []  # (time, filtered rate) over the planner's trend window
        self._falling = False  # the planner forecasts a fall at the last update

    @property
    def headroom(self) -> float:
        """The headroom in force: the planner's (x its volatility scale) once it has fitted, else
        the fixed one; never below ``min_headroom``."""
        return self.headroom_in_force(math.nan)

    def headroom_in_force(self, t: float) -> float:
        """:attr:`headroom` at plant time ``t`` (the planner's phase weight of ``t`` included)."""
        h = self.planner.headroom_at(t) if self.planner is not None else math.nan
        return max(h if math.isfinite(h) else self.fixed_headroom, self.min_headroom)

    def trend_rate(self, t: float, rate: float) -> float:
        """The filtered rate with the planner's rising trend: max(rate, 2 rate - the rate
        ``trend_s`` ago) (:func:`rising_trend`; the rate itself without a trend or until the
        window has been seen)."""
        w = self.planner.trend_in_force_s if self.planner is not None else 0.0
        if not w:
            return rate
        self._rates.append((t, rate))
        while len(self._rates) > 2 and self._rates[1][0] <= t - w + 1e-9:
            self._rates.pop(0)
        t0, r0 = self._rates[0]
        if t - t0 < w - 1e-9:
            return rate
        return max(rate, 2.0 * rate - r0)

    def hold(self, t: float, rate: float) -> float:
        """The filtered rate (with the rising trend) x the planner's rise over the lead x its lead
        correction x (1 + headroom)."""
        corr = 1.0
        if self.planner is not None and self.planner.residual_ar1:
            corr = self.planner.lead_correction(t + self.planner.time_offset_s, rate)
        rate = self.trend_rate(t, rate)
        self.last_hold = (rate * (self._rise if math.isfinite(self._rise) else 1.0) * corr
                          * (1.0 + self.headroom_in_force(t)))
        return self.last_hold

    def _fall_dwell(self) -> float | None:
        """The planner's forecast-fall dwell when it forecasts a fall now (None otherwise)."""
        p = self.planner
        if p is None or p.fall_dwell_s is None or not self._falling:
            return None
        return p.fall_dwell_s

    def scale_down_dwell(self, t: float) -> float:
        """``dwell_s``, or the planner's ``fall_dwell_s`` (when shorter) while it forecasts a fall."""
        f = self._fall_dwell()
        return self.dwell_s if f is None else min(self.dwell_s, f)

    def down_allowed(self, t: float) -> bool:
        """``cooldown_s`` after a scale-up and ``down_cooldown_s`` (the planner's ``fall_dwell_s``,
        when shorter, while it forecasts a fall) after a scale-down."""
        f = self._fall_dwell()
        down = self.down_cooldown_s if f is None else min(self.down_cooldown_s, f)
        return t - self._last_up >= self.cooldown_s - 1e-9 and t - self._last_down >= down - 1e-9

    def recommend(self, t: float, provisioned: int, rate: float, queue: float, rise: float = math.nan) -> int:
        """The decision core of :class:`HystereticPoolController` with the planner's rise.

        Parameters
        ----------
        t : float
            Now (s).
        provisioned : int
            Serving + starting workers.
        rate : float
            Measured offered rate (requests/s), filtered here.
        queue : float
            Requests queued for the pool.
        rise : float
            The planner's rho at ``t`` (NaN: none).

        Returns
        -------
        int
            Desired workers.
        """
        self._rise = rise
        return super().recommend(t, provisioned, rate, queue)

    def update(self, t: float, m: Measurement) -> ScaleAction:
        """Size the pool from the offered rate (both pools: every arrival will need a fill and a
        decode slot; behind admission the admitted rate saturates and would hide the demand).

        Parameters
        ----------
        t : float
            Plant time (s).
        m : Measurement
            The (delayed) sample.

        Returns
        -------
        ScaleAction
        """
        rate = m.arrival_rate if math.isfinite(m.arrival_rate) else m.admitted_rate
        if self.pool == "decode":
            queue = m.ready + m.backlog
            if (self.measured_decode_rate and m.active_decodes > 0 and m.completion_rate > 0
                    and m.decode_pass_s > 0 and math.isfinite(m.decode_pass_s)):
                # Little's law: a sequence holds its slot for (its tokens x the pass time)
                passes = m.active_decodes / (m.completion_rate * m.decode_pass_s)
                self._passes = lowpass(self._passes, passes, self.filter_s, t - (self._t_passes or t))
                self._t_passes = t
                self.per_worker_rps = self._nominal_rps * self.output_tokens / self._passes
        else:
            queue = m.backlog + m.fill_in_progress
            if self.measured_fill_rate and m.fill_workers > 0 and m.fill_capacity > 0:
                self.per_worker_rps = m.fill_capacity / m.fill_workers
        rise = self.planner.rise(t) if self.planner is not None else math.nan
        self._falling = self.planner.falling(t) if self.planner is not None else False
        return ScaleAction(self.pool, self.decide(t, m, rate, queue, rise))

    def params(self) -> dict:
        """The configuration (reported with results)."""
        return {**super().params(), "per_worker_rps": self._nominal_rps, "planned": self.planner is not None,
                "headroom": self.fixed_headroom, "min_headroom": self.min_headroom,
                "down_cooldown_s": self.down_cooldown_s,
                "measured_fill_rate": self.measured_fill_rate, "measured_decode_rate": self.measured_decode_rate,
                "output_tokens": self.output_tokens}
