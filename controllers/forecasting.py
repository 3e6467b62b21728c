"""Demand forecasting for the planning layer (hours to days): one fit/predict interface.

A series is a pandas Series of demand (requests/s) on a regular grid indexed by ``time_s``
(0 = midnight), NaN for missing windows: a collection gap is missing data, not zero demand.
Every model handles gaps: state-space models (ARIMA, Kalman, UCM, Fourier-ARX) skip them in the
Kalman filter; regression drops them; seasonal naive looks further back; ETS, which cannot, is fed
a seasonally imputed copy.

Models (``FORECASTERS``):

* ``seasonal-naive-daily`` / ``-weekly``: the value one season ago (the MASE scale uses daily).
* ``constant``, ``arima``, ``kalman``: the predictors NVIDIA Dynamo's planner ships (last value;
  ARIMA; a Kalman local-linear-trend filter), here on statsmodels state space.
* ``holt-winters``: ETS(A,N,A) with a daily season, heuristic initialisation (statsmodels ETSModel).
* ``fourier``: OLS on a trend and daily/weekly Fourier terms; ``fourier-arx``: the same terms as
  exogenous regressors of a SARIMAX with AR(1) errors.
* ``ucm``: statsmodels UnobservedComponents, local level + daily and weekly trigonometric
  seasonals + AR(1).

Prediction intervals are the models' own (Gaussian state-space or OLS) except for the naive and
constant models, which use empirical residual quantiles scaled by sqrt(horizon in seasons/steps).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from tokenfactory.core.validation import ConfigError

__all__ = ["Forecast", "Forecaster", "FORECASTERS", "make_forecaster", "DAY_S", "WEEK_S"]

DAY_S = 86400.0
WEEK_S = 7 * DAY_S
Z80, Z95 = stats.norm.ppf(0.9), stats.norm.ppf(0.975)


@dataclass
class Forecast:
    """Point forecast and 80 % / 95 % prediction intervals at ``time_s``.

    Every array has one value per forecast step, in the series' unit (requests/s), clipped
    at 0 (demand is not negative).

    Parameters
    ----------
    model : str
        Name of the forecaster that made it.
    time_s : ndarray
        Times of the forecast steps (s, on the series' grid after its last point).
    mean : ndarray
        Point forecast.
    lower_80, upper_80 : ndarray
        80 % prediction interval (10 % and 90 % quantiles).
    lower_95, upper_95 : ndarray
        95 % prediction interval (2.5 % and 97.5 % quantiles).
    """

    model: str
    time_s: np.ndarray
    mean: np.ndarray
    lower_80: np.ndarray
    upper_80: np.ndarray
    lower_95: np.ndarray
    upper_95: np.ndarray

    def to_pandas(self) -> pd.DataFrame:
        """The forecast as a table indexed by ``time_s`` (columns ``mean`` and the bounds)."""
        return pd.DataFrame({"mean": self.mean, "lower_80": self.lower_80, "upper_80": self.upper_80,
                             "lower_95": self.lower_95, "upper_95": self.upper_95},
                            index=pd.Index(self.time_s, name="time_s"))

    def quantile(self, which: str) -> np.ndarray:
        """``mean``, ``upper_80``, ``upper_95`` ... by name.

        Parameters
        ----------
        which : str
            ``"mean"``, ``"lower_80"``, ``"upper_80"``, ``"lower_95"`` or ``"upper_95"`` (a
            capacity plan sized on ``"upper_80"`` covers demand 90 % of the time if the
            intervals are honest).

        Returns
        -------
        ndarray
            That array.

        Raises
        ------
        ConfigError
            For another name.
        """
        if which not in ("mean", "lower_80", "upper_80", "lower_95", "upper_95"):
            raise ConfigError("quantile", f"{which!r} is not one of mean, lower_80, upper_80, lower_95, upper_95")
        return getattr(self, which)


class Forecaster:
    """Base: validates the series, remembers its grid, times fit and predict.

    Subclasses implement ``_fit(y)`` and ``_predict(steps) -> (mean, sd or (lo80, hi80, lo95,
    hi95))``. ``fit_seconds`` and ``predict_seconds`` hold the wall time of the last fit (or
    update) and prediction (s; nan before the first).
    """

    name = "forecaster"
    #: refitting is cheap: update() refits; state-space models re-filter with fixed parameters
    cheap = True

    def __init__(self):
        self.fit_seconds = math.nan
        self.predict_seconds = math.nan

    # -- grid -----------------------------------------------------------------------------
    def _grid(self, y: pd.Series) -> pd.Series:
        if not isinstance(y, pd.Series):
            raise ConfigError("series", "expected a pandas Series indexed by time_s")
        if len(y) < 3:
            raise ConfigError("series", f"needs at least 3 points, got {len(y)}")
        t = y.index.to_numpy(dtype=float)
        d = np.diff(t)
        if not np.allclose(d, d[0]):
            raise ConfigError("series", "the index must be a regular grid (reindex gaps as NaN)")
        if y.notna().sum() < 3:
            raise ConfigError("series", "fewer than 3 observed (non-missing) points")
        self.interval_s = float(d[0])
        self.t_last = float(t[-1])
        self.n_obs = len(y)
        return y.astype(float)

    def _horizon(self, steps: int) -> np.ndarray:
        if not isinstance(steps, (int, np.integer)) or steps < 1:
            raise ConfigError("horizon", f"steps must be a positive integer, got {steps!r}")
        return self.t_last + self.interval_s * np.arange(1, steps + 1)

    def period(self, seconds: float) -> int:
        """A duration (s) in samples of the fitted series' grid (at least 1)."""
        return max(1, int(round(seconds / self.interval_s)))

    # -- API -----------------------------------------------------------------------------
    def fit(self, y: pd.Series) -> "Forecaster":
        """Estimate the model on ``y``.

        Parameters
        ----------
        y : Series
            Demand (requests/s) on a regular grid indexed by ``time_s`` (0 = midnight), NaN for
            missing windows; at least 3 observed points (seasonal models need more).

        Returns
        -------
        Forecaster
            ``self``, fitted.

        Raises
        ------
        ConfigError
            For a series that is not a regular-grid Series with 3 observed points, or too short
            for the model's season.
        """
        y = self._grid(y)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._fit(y)
        self.fit_seconds = time.perf_counter() - t0
        return self

    def update(self, y: pd.Series) -> "Forecaster":
        """Condition on a longer history without re-estimating parameters (refit when cheap).

        Parameters
        ----------
        y : Series
            The whole history up to the new origin, on the grid of the fit.

        Returns
        -------
        Forecaster
            ``self``; ``fit_seconds`` is the update's wall time.
        """
        return self.fit(y)

    def predict(self, steps: int) -> Forecast:
        """Forecast ``steps`` samples past the end of the last fitted or updated series.

        Parameters
        ----------
        steps : int
            Horizon in samples (>= 1).

        Returns
        -------
        Forecast
            Mean and 80 % / 95 % intervals, clipped at 0.

        Raises
        ------
        ConfigError
            For ``steps`` that is not a positive integer.
        """
        t = self._horizon(steps)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mean, sd_or_bands = self._predict(steps)
        self.predict_seconds = time.perf_counter() - t0
        if isinstance(sd_or_bands, tuple):
            lo80, hi80, lo95, hi95 = sd_or_bands
        else:
            sd = sd_or_bands
            lo80, hi80, lo95, hi95 = mean - Z80 * sd, mean + Z80 * sd, mean - Z95 * sd, mean + Z95 * sd
        clip = lambda a: np.maximum(np.asarray(a, dtype=float), 0.0)  # noqa: E731 - demand is >= 0
        return Forecast(self.name, t, clip(mean), clip(lo80), clip(hi80), clip(lo95), clip(hi95))


def _seasonal_fill(y: pd.Series, m: int) -> np.ndarray:
    """NaNs replaced by the value one (or more) seasons earlier, then by interpolation."""
    v = y.to_numpy(dtype=float).copy()
    for i in np.nonzero(np.isnan(v))[0]:
        j = i - m
        while j >= 0 and np.isnan(v[j]):
            j -= m
        if j >= 0:
            v[i] = v[j]
    s = pd.Series(v).interpolate(limit_direction="both")
    return s.to_numpy()


class SeasonalNaive(Forecaster):
    """The value one season ago (gaps filled from earlier seasons); empirical intervals.

    Parameters
    ----------
    season_s : float
        Season length (s; default one day). Needs more than one season of history.
    """

    def __init__(self, season_s: float = DAY_S):
        super().__init__()
        self.season_s = season_s
        self.name = "seasonal-naive-daily" if season_s == DAY_S else (
            "seasonal-naive-weekly" if season_s == WEEK_S else f"seasonal-naive-{season_s:g}s")

    def _fit(self, y):
        m = self.period(self.season_s)
        if len(y) <= m:
            raise ConfigError("series", f"{self.name} needs more than one season ({m} points) of history")
        self.m = m
        self.values = _seasonal_fill(y, m)
        v = y.to_numpy(dtype=float)
        res = v[m:] - v[:-m]
        self.residuals = res[np.isfinite(res)]

    def _predict(self, steps):
        m, v = self.m, self.values
        idx = len(v) - m + (np.arange(steps) % m)
        mean = v[idx]
        k = np.sqrt(np.arange(steps) // m + 1.0)
        q = np.quantile(self.residuals, [0.1, 0.9, 0.025, 0.975]) if len(self.residuals) else np.zeros(4)
        return mean, tuple(mean + k * qi for qi in q)


class Constant(Forecaster):
    """Dynamo's constant predictor: the last observed value."""

    name = "constant"

    def _fit(self, y):
        v = y.dropna().to_numpy()
        self.last = v[-1]
        d = np.diff(v)
        self.q = np.quantile(d, [0.1, 0.9, 0.025, 0.975]) if len(d) else np.zeros(4)

    def _predict(self, steps):
        mean = np.full(steps, self.last)
        k = np.sqrt(np.arange(1, steps + 1))
        return mean, tuple(mean + k * qi for qi in self.q)


class _StateSpace(Forecaster):
    """A statsmodels MLE model; update() re-filters new data with the fitted parameters."""

    cheap = False

    def _build(self, y: pd.Series, exog=None):
        """The statsmodels model for ``y`` (each subclass names its own)."""

    def _exog(self, t: np.ndarray):
        return None

    def _fit(self, y):
        self._y = y
        t = y.index.to_numpy(dtype=float)
        # convergence is recorded, not printed: a planner run over many origins would drown in it
        self.res = self._build(y.reset_index(drop=True), self._exog(t)).fit(disp=False, warn_convergence=False)
        self.converged = bool(self.res.mle_retvals.get("converged", True)) if self.res.mle_retvals else True

    def update(self, y):
        y = self._grid(y)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.res = self.res.apply(y.reset_index(drop=True).to_numpy(), exog=self._exog(y.index.to_numpy(float)))
        self.fit_seconds = time.perf_counter() - t0
        return self

    def _predict(self, steps):
        ex = self._exog(self._horizon(steps))
        f = self.res.get_forecast(steps, exog=ex)
        mean = np.asarray(f.predicted_mean)
        ci80, ci95 = np.asarray(f.conf_int(alpha=0.2)), np.asarray(f.conf_int(alpha=0.05))
        return mean, (ci80[:, 0], ci80[:, 1], ci95[:, 0], ci95[:, 1])


class Arima(_StateSpace):
    """ARIMA on statsmodels SARIMAX (Dynamo's ARIMA predictor), without seasonal terms.

    Parameters
    ----------
    order : tuple of int
        (p, d, q) (default (2, 1, 1)).
    """

    name = "arima"

    def __init__(self, order=(2, 1, 1)):
        super().__init__()
        self.order = order

    def _build(self, y, exog=None):
        from statsmodels.tsa.statespace.sarimax import SARIMAX

        return SARIMAX(y.to_numpy(), order=self.order)


class KalmanTrend(_StateSpace):
    """Local linear trend filtered by a Kalman filter (Dynamo's Kalman predictor)."""

    name = "kalman"

    def _build(self, y, exog=None):
        from statsmodels.tsa.statespace.structural import UnobservedComponents

        return UnobservedComponents(y.to_numpy(), level="local linear trend")


class Ucm(_StateSpace):
    """Unobserved components: local level, daily and weekly trigonometric seasonals, AR(1).

    Parameters
    ----------
    daily_harmonics : int
        Harmonics of the daily season (default 4).
    weekly_harmonics : int
        Harmonics of the weekly season (default 2); used only with two weeks of history.
    """

    name = "ucm"

    def __init__(self, daily_harmonics: int = 4, weekly_harmonics: int = 2):
        super().__init__()
        self.daily_harmonics, self.weekly_harmonics = daily_harmonics, weekly_harmonics

    def _build(self, y, exog=None):
        from statsmodels.tsa.statespace.structural import UnobservedComponents

        seas = [{"period": self.period(DAY_S), "harmonics": self.daily_harmonics}]
        if len(y) >= 2 * self.period(WEEK_S):
            seas.append({"period": self.period(WEEK_S), "harmonics": self.weekly_harmonics})
        return UnobservedComponents(y.to_numpy(), level="local level", freq_seasonal=seas, autoregressive=1)


def _fourier(t: np.ndarray, daily: int, weekly: int) -> np.ndarray:
    cols = [np.ones_like(t), t / WEEK_S]
    for k in range(1, daily + 1):
        w = 2 * np.pi * k * t / DAY_S
        cols += [np.cos(w), np.sin(w)]
    for k in range(1, weekly + 1):
        w = 2 * np.pi * k * t / WEEK_S
        cols += [np.cos(w), np.sin(w)]
    return np.column_stack(cols)


class FourierOLS(Forecaster):
    """OLS on a constant, a linear trend and daily/weekly Fourier terms; OLS prediction intervals.

    Parameters
    ----------
    daily_harmonics : int
        Harmonics of the daily cycle (default 6).
    weekly_harmonics : int
        Harmonics of the weekly cycle (default 3); used only with a week of history.
    """

    name = "fourier"

    def __init__(self, daily_harmonics: int = 6, weekly_harmonics: int = 3):
        super().__init__()
        self.daily_harmonics, self.weekly_harmonics = daily_harmonics, weekly_harmonics

    def _fit(self, y):
        t = y.index.to_numpy(dtype=float)
        weekly = self.weekly_harmonics if t[-1] - t[0] >= WEEK_S else 0
        self._weekly = weekly
        X = _fourier(t, self.daily_harmonics, weekly)
        ok = y.notna().to_numpy()
        Xo, yo = X[ok], y.to_numpy()[ok]
        self.beta, *_ = np.linalg.lstsq(Xo, yo, rcond=None)
        resid = yo - Xo @ self.beta
        dof = max(len(yo) - X.shape[1], 1)
        self.sigma = math.sqrt(resid @ resid / dof)
        self.xtx_inv = np.linalg.pinv(Xo.T @ Xo)

    def _predict(self, steps):
        X = _fourier(self._horizon(steps), self.daily_harmonics, self._weekly)
        mean = X @ self.beta
        sd = self.sigma * np.sqrt(1.0 + np.einsum("ij,jk,ik->i", X, self.xtx_inv, X))
        return mean, sd


class FourierARX(_StateSpace):
    """The Fourier terms and trend as exogenous regressors of a SARIMAX with AR(1) errors.

    Parameters
    ----------
    daily_harmonics : int
        Harmonics of the daily cycle (default 4).
    weekly_harmonics : int
        Harmonics of the weekly cycle (default 2); used only with a week of history.
    """

    name = "fourier-arx"

    def __init__(self, daily_harmonics: int = 4, weekly_harmonics: int = 2):
        super().__init__()
        self.daily_harmonics, self.weekly_harmonics = daily_harmonics, weekly_harmonics
        self._weekly = weekly_harmonics

    def _exog(self, t):
        return _fourier(np.asarray(t, dtype=float), self.daily_harmonics, self._weekly)[:, 1:]

    def _fit(self, y):
        t = y.index.to_numpy(dtype=float)
        self._weekly = self.weekly_harmonics if t[-1] - t[0] >= WEEK_S else 0
        super()._fit(y)

    def _build(self, y, exog=None):
        from statsmodels.tsa.statespace.sarimax import SARIMAX

        return SARIMAX(y.to_numpy(), exog=exog, order=(1, 0, 0), trend="c")


class HoltWinters(Forecaster):
    """ETS(A,N,A), daily season, heuristic initialisation; NaNs seasonally imputed."""

    name = "holt-winters"
    cheap = False

    def _fit(self, y):
        from statsmodels.tsa.exponential_smoothing.ets import ETSModel

        m = self.period(DAY_S)
        if len(y) < 2 * m + 10:
            raise ConfigError("series", f"holt-winters needs two days of history ({2 * m + 10} points)")
        self.m = m
        filled = pd.Series(_seasonal_fill(y, m))
        self.model = ETSModel(filled, error="add", trend=None, seasonal="add", seasonal_periods=m,
                              initialization_method="heuristic")
        self.res = self.model.fit(disp=False)

    def update(self, y):
        from statsmodels.tsa.exponential_smoothing.ets import ETSModel

        y = self._grid(y)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            filled = pd.Series(_seasonal_fill(y, self.m))
            model = ETSModel(filled, error="add", trend=None, seasonal="add", seasonal_periods=self.m,
                             initialization_method="heuristic")
            self.res = model.smooth(self.res.params)
        self.fit_seconds = time.perf_counter() - t0
        return self

    def _predict(self, steps):
        n = self.res.nobs
        f80 = self.res.get_prediction(start=n, end=n + steps - 1).summary_frame(alpha=0.2)
        f95 = self.res.get_prediction(start=n, end=n + steps - 1).summary_frame(alpha=0.05)
        return f80["mean"].to_numpy(), (f80["pi_lower"].to_numpy(), f80["pi_upper"].to_numpy(),
                                        f95["pi_lower"].to_numpy(), f95["pi_upper"].to_numpy())


FORECASTERS = {
    "seasonal-naive-daily": lambda: SeasonalNaive(DAY_S),
    "seasonal-naive-weekly": lambda: SeasonalNaive(WEEK_S),
    "constant": Constant,
    "arima": Arima,
    "kalman": KalmanTrend,
    "holt-winters": HoltWinters,
    "fourier": FourierOLS,
    "fourier-arx": FourierARX,
    "ucm": Ucm,
}


def make_forecaster(name: str) -> Forecaster:
    """A fresh, unfitted forecaster by name.

    Parameters
    ----------
    name : str
        A key of :data:`FORECASTERS` (``"seasonal-naive-daily"``, ``"arima"``, ``"ucm"``, ...).

    Returns
    -------
    Forecaster

    Raises
    ------
    ConfigError
        For an unknown name (field ``models``).
    """
    if name not in FORECASTERS:
        raise ConfigError("models", f"unknown model {name!r}; models are {', '.join(FORECASTERS)}")
    return FORECASTERS[name]()
