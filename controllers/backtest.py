"""Rolling-origin backtests of forecasters (Hyndman & Athanasopoulos, *Forecasting: Principles and
Practice*, 3rd ed., sec. 5.10 "time series cross-validation").

At each origin the model sees only the past. Parameters are re-estimated every ``refit_every_s``
and, between refits, the model is conditioned on the new data with its parameters fixed (what a
production planner does: refit daily, update hourly). Metrics over all forecast points whose
actual value is present:

* MASE: mean |error| / in-sample MAE of the daily seasonal-naive forecast on the history before
  the first origin (Hyndman & Koehler 2006);
* sMAPE: mean 200 |e| / (|y| + |y_hat|) (%);
* coverage of the 80 % and 95 % intervals; mean time of a full fit, of an update with fixed
  parameters, and of a prediction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tokenfactory.controllers.forecasting import DAY_S, Forecaster, make_forecaster
from tokenfactory.core.validation import ConfigError, check_number

__all__ = ["BacktestResult", "backtest", "mase_scale", "pick_best_model"]


def mase_scale(y: pd.Series, season_steps: int) -> float:
    """In-sample MAE of the seasonal-naive forecast (pairs with both ends present).

    The denominator of MASE (Hyndman & Koehler 2006): a MASE below 1 beats the seasonal-naive
    forecast's in-sample error.

    Parameters
    ----------
    y : Series
        The training history (demand, requests/s; NaN for missing windows).
    season_steps : int
        Season length in samples (>= 1; a day of 10-minute windows is 144).

    Returns
    -------
    float
        Mean of |y[t] - y[t - season_steps]| over pairs where both are present (requests/s).

    Raises
    ------
    ConfigError
        When no pair is present or every seasonal difference is 0.
    """
    v = y.to_numpy(dtype=float)
    d = np.abs(v[season_steps:] - v[:-season_steps])
    d = d[np.isfinite(d)]
    if not len(d) or d.mean() == 0:
        raise ConfigError("series", "cannot scale MASE: no seasonal-naive error in the training history")
    return float(d.mean())


@dataclass
class BacktestResult:
    """Per-point forecasts (``points``, one row per model x origin x step) and per-model metrics.

    Parameters
    ----------
    horizon_steps : int
        Forecast horizon in samples.
    interval_s : float
        Sample spacing of the series (s).
    points : DataFrame
        One row per model x origin x step: ``model``, ``origin_s``, ``step`` (1..horizon),
        ``time_s``, ``actual`` (NaN where missing), ``mean`` and the 80 % / 95 % bounds
        ``lower_80``, ``upper_80``, ``lower_95``, ``upper_95`` (requests/s).
    metrics : DataFrame
        Indexed by model: ``mase``, ``smape`` (%), ``coverage_80``, ``coverage_95`` (0-1),
        ``fit_seconds``, ``update_seconds`` (None when the model never updated), ``fits``,
        ``predict_seconds``, ``origins`` and ``points`` (scored points).
    scale : float
        The MASE denominator (:func:`mase_scale` of the history before the first origin).
    origins : list of float
        Forecast origins (s, the series' ``time_s``).
    """

    horizon_steps: int
    interval_s: float
    points: pd.DataFrame
    metrics: pd.DataFrame
    scale: float
    origins: list = field(default_factory=list)

    def to_pandas(self) -> pd.DataFrame:
        """The per-model metrics table (``metrics``)."""
        return self.metrics


def backtest(y: pd.Series, models, horizon_steps: int, *, test_days: float = 4.0, origin_every_s: float | None = None,
             refit_every_s: float = DAY_S, min_train_days: float = 2.0) -> BacktestResult:
    """Rolling-origin evaluation of ``models`` (names or Forecaster factories) on ``y``.

    Origins run from ``test_days`` before the end, every ``origin_every_s`` (default: the
    horizon), as long as the whole horizon fits in the data.

    Parameters
    ----------
    y : Series
        Demand (requests/s) on a regular grid indexed by ``time_s`` (0 = midnight), NaN for
        missing windows; at least 10 points.
    models : sequence of str or callable
        Model names of :data:`~tokenfactory.controllers.forecasting.FORECASTERS`, or
        zero-argument factories returning a fresh
        :class:`~tokenfactory.controllers.forecasting.Forecaster`.
    horizon_steps : int
        Steps forecast from each origin (>= 1).
    test_days : float
        Length of the test period at the end of the series (days, > 0; default 4).
    origin_every_s : float, optional
        Spacing of origins (s; default: the horizon, so test windows do not overlap).
    refit_every_s : float
        Re-estimate parameters this often (s; default one day); between refits non-cheap models
        are only updated with fixed parameters, cheap ones are refitted at every origin.
    min_train_days : float
        Least training history before the first origin (days; default 2).

    Returns
    -------
    BacktestResult
        Every forecast point and the per-model metrics (scored where the actual is present).

    Raises
    ------
    ConfigError
        For a series that is not a Series of at least 10 points, ``horizon_steps`` < 1,
        ``test_days`` <= 0, a test period leaving less than ``min_train_days`` of history, no
        origin with a whole horizon, an unknown model name, or a history MASE cannot be scaled
        on.
    """
    if not isinstance(y, pd.Series) or len(y) < 10:
        raise ConfigError("series", "backtest needs a pandas Series of at least 10 points")
    t = y.index.to_numpy(dtype=float)
    dt = float(t[1] - t[0])
    check_number("horizon_steps", horizon_steps, low=1)
    check_number("test_days", test_days, low=0.0, low_inclusive=False)
    every = origin_every_s or horizon_steps * dt
    first = len(y) - int(round(test_days * DAY_S / dt))
    if first * dt < min_train_days * DAY_S:
        raise ConfigError("test_days", f"leaves {first * dt / DAY_S:.1f} days of training history; "
                          f"needs at least {min_train_days}")
    step = max(1, int(round(every / dt)))
    origins = list(range(first, len(y) - horizon_steps + 1, step))
    if not origins:
        raise ConfigError("horizon_steps", "no origin leaves a whole horizon inside the data")
    scale = mase_scale(y.iloc[:first], int(round(DAY_S / dt)))
    refit = max(1, int(round(refit_every_s / dt)))
    names = [m if isinstance(m, str) else m().name for m in models]
    rows, timing = [], {n: {"fit": [], "update": [], "predict": []} for n in names}
    for spec, name in zip(models, names):
        f: Forecaster | None = None
        last_fit = None
        for o in origins:
            hist = y.iloc[:o]
            if f is None or last_fit is None or o - last_fit >= refit or f.cheap:
                f = make_forecaster(spec) if isinstance(spec, str) else spec()
                f.fit(hist)
                last_fit = o
                timing[name]["fit"].append(f.fit_seconds)
            else:
                f.update(hist)
                timing[name]["update"].append(f.fit_seconds)
            fc = f.predict(horizon_steps)
            timing[name]["predict"].append(f.predict_seconds)
            actual = y.iloc[o:o + horizon_steps].to_numpy(dtype=float)
            rows.append(pd.DataFrame({"model": name, "origin_s": t[o], "step": np.arange(1, horizon_steps + 1),
                                      "time_s": fc.time_s, "actual": actual, "mean": fc.mean,
                                      "lower_80": fc.lower_80, "upper_80": fc.upper_80,
                                      "lower_95": fc.lower_95, "upper_95": fc.upper_95}))
    points = pd.concat(rows, ignore_index=True)
    mets = []
    for name in names:
        p = points[(points["model"] == name) & points["actual"].notna()]
        e = p["mean"] - p["actual"]
        denom = p["actual"].abs() + p["mean"].abs()
        mets.append({
            "model": name,
            "mase": float(e.abs().mean() / scale),
            "smape": float((200 * e.abs() / denom.where(denom > 0)).mean()),
            "coverage_80": float(((p["actual"] >= p["lower_80"]) & (p["actual"] <= p["upper_80"])).mean()),
            "coverage_95": float(((p["actual"] >= p["lower_95"]) & (p["actual"] <= p["upper_95"])).mean()),
            "fit_seconds": float(np.mean(timing[name]["fit"])),
            "update_seconds": float(np.mean(timing[name]["update"])) if timing[name]["update"] else None,
            "fits": len(timing[name]["fit"]),
            "predict_seconds": float(np.mean(timing[name]["predict"])),
            "origins": len(origins), "points": int(len(p)),
        })
    return BacktestResult(horizon_steps, dt, points, pd.DataFrame(mets).set_index("model"), scale,
                          [float(t[o]) for o in origins])


def pick_best_model(metrics: pd.DataFrame, min_coverage_80: float = 0.7) -> tuple[str, str]:
    """Lowest MASE among models whose 80 % intervals cover at least ``min_coverage_80`` (a user
    sizing capacity from an upper quantile needs honest intervals); if none does, lowest MASE.

    Parameters
    ----------
    metrics : DataFrame
        :attr:`BacktestResult.metrics` (indexed by model, with ``mase`` and ``coverage_80``).
    min_coverage_80 : float
        Least acceptable coverage of the 80 % intervals (0-1; default 0.7).

    Returns
    -------
    model : str
        The chosen model.
    reason : str
        Why, with its MASE (a sentence for the study's summary).
    """
    ok = metrics[metrics["coverage_80"] >= min_coverage_80]
    pool = ok if len(ok) else metrics
    best = pool["mase"].idxmin()
    why = (f"lowest MASE ({pool.loc[best, 'mase']:.3f}) among models with 80 % coverage >= {min_coverage_80:.0%}"
           if len(ok) else f"lowest MASE ({pool.loc[best, 'mase']:.3f}); no model reached {min_coverage_80:.0%} coverage")
    return str(best), why
