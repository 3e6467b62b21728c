"""NVIDIA Dynamo's online load predictors (observe one interval, predict the next), made affordable
for runs of days.

Dynamo's throughput planner (``components/planner/.../utils/load_predictor.py``, ai-dynamo/dynamo)
feeds each adjustment interval's request count to a predictor and sizes the pools for its one-step
forecast:

* ``constant`` - the last value;
* ``arima`` (the planner's default) - ``pmdarima.auto_arima`` fitted once enough points exist,
  then updated with every new point;
* ``kalman`` - a local-linear-trend Kalman filter with *fixed* noise variances (``kalman_q_level``
  1.0, ``kalman_q_trend`` 0.1, ``kalman_r`` 10.0, ``kalman_min_points`` 5 by default), on the
  counts (or their log1p).

Here ARIMA is statsmodels' SARIMAX of a fixed order (:class:`tokenfactory.controllers.forecasting.
Arima`'s (2, 1, 1); pmdarima's order search is not run) fitted on the last ``window`` points, and
between refits (every ``refit_every`` points; Dynamo re-estimates a little at every update) the
fitted state-space model is filtered one observation at a time with its parameters fixed - the
exact Kalman recursion of the fitted model, microseconds per interval instead of a refit (what
:mod:`tokenfactory.controllers.backtest` does between daily refits). Both predictors accept a
warm-up series (Dynamo's ``load_predictor_warmup_trace``).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from tokenfactory.core.validation import ConfigError, check_choice, check_int, check_number

__all__ = ["LoadPredictor", "ConstantPredictor", "StateSpaceStep", "ArimaPredictor", "KalmanPredictor",
           "LOAD_PREDICTORS", "make_load_predictor"]


class LoadPredictor:
    """Observe one value per interval, predict the next (Dynamo's ``BasePredictor``).

    Parameters
    ----------
    min_points : int
        Below this many observations the prediction is the last value (>= 1).
    """

    name = "predictor"

    def __init__(self, min_points: int = 1):
        self.min_points = check_int("predictor.min_points", min_points, low=1)
        self.reset()

    def reset(self) -> None:
        """Forget every observation."""
        self.values: list[float] = []

    def warm_up(self, values) -> "LoadPredictor":
        """Observe a history before the run (Dynamo's warm-up trace).

        Parameters
        ----------
        values : iterable of float
            One value per interval, oldest first (NaN counts as 0, as in Dynamo).

        Returns
        -------
        LoadPredictor
            ``self``.
        """
        for v in values:
            self.observe(float(v))
        return self

    def observe(self, value: float) -> None:
        """Record one interval's value (NaN as 0).

        Parameters
        ----------
        value : float
            The interval's value.
        """
        self.values.append(0.0 if math.isnan(value) else float(value))

    def predict_next(self) -> float:
        """The next interval's value (the last one before ``min_points``; 0 with none)."""
        return self.values[-1] if self.values else 0.0


class ConstantPredictor(LoadPredictor):
    """The last value (Dynamo's ``constant``).

    Parameters
    ----------
    min_points : int
        As :class:`LoadPredictor` (the prediction is the last value from the first point on).
    """

    name = "constant"


class StateSpaceStep:
    """One-step Kalman recursion of a linear Gaussian state-space model with fixed matrices:
    y_t = Z a_t + eps (var H), a_{t+1} = T a_t + R eta (var Q).

    Parameters
    ----------
    design, transition, selection, state_cov : array_like
        Z (1 x k), T (k x k), R (k x r), Q (r x r).
    obs_cov : float
        H.
    state : array_like
        The predicted state a_{t|t-1} (k).
    state_cov_pred : array_like
        Its covariance P_{t|t-1} (k x k).
    """

    def __init__(self, design, transition, selection, state_cov, obs_cov: float, state, state_cov_pred):
        self.Z = np.asarray(design, dtype=float).reshape(1, -1)
        self.T = np.asarray(transition, dtype=float)
        R = np.asarray(selection, dtype=float)
        self.RQR = R @ np.asarray(state_cov, dtype=float) @ R.T
        self.H = float(obs_cov)
        self.a = np.asarray(state, dtype=float).reshape(-1)
        self.P = np.asarray(state_cov_pred, dtype=float)

    def forecast(self) -> float:
        """The one-step forecast of y (Z a)."""
        return float((self.Z @ self.a)[0])

    def step(self, y: float) -> None:
        """Condition on y_t and predict the state of t + 1.

        Parameters
        ----------
        y : float
            The observation (NaN: no update, prediction only).
        """
        if math.isfinite(y):
            F = float((self.Z @ self.P @ self.Z.T)[0, 0]) + self.H
            K = (self.P @ self.Z.T).reshape(-1) / F
            v = y - float((self.Z @ self.a)[0])
            a_f = self.a + K * v
            P_f = self.P - np.outer(K, self.Z @ self.P)
        else:
            a_f, P_f = self.a, self.P
        self.a = self.T @ a_f
        self.P = self.T @ P_f @ self.T.T + self.RQR


class ArimaPredictor(LoadPredictor):
    """ARIMA refit every ``refit_every`` points on the last ``window``, filtered with fixed
    parameters in between (see the module docstring).

    Parameters
    ----------
    order : tuple of int
        (p, d, q) (default (2, 1, 1)).
    window : int
        Points the fit sees (>= 10; default 480, a day of 180-s intervals).
    refit_every : int
        Points between refits (>= 1; default 480).
    min_points : int
        First fit once this many points exist (default 5, Dynamo's).
    log1p : bool
        Model log1p of the values (Dynamo's ``load_predictor_log1p``; default False).
    """

    name = "arima"

    def __init__(self, order=(2, 1, 1), *, window: int = 480, refit_every: int = 480, min_points: int = 5,
                 log1p: bool = False):
        self.order = tuple(int(x) for x in order)
        if len(self.order) != 3 or min(self.order) < 0:
            raise ConfigError("arima.order", f"expected (p, d, q) of non-negative integers, got {order!r}")
        self.window = check_int("arima.window", window, low=10)
        self.refit_every = check_int("arima.refit_every", refit_every, low=1)
        self.log1p = bool(log1p)
        super().__init__(min_points)

    def reset(self) -> None:
        """Forget every observation and the fit."""
        super().reset()
        self._filter: StateSpaceStep | None = None
        self._since_fit = 0
        self.fits = 0

    def _tr(self, v: float) -> float:
        return math.log1p(max(v, 0.0)) if self.log1p else v

    def _fit(self) -> None:
        from statsmodels.tsa.statespace.sarimax import SARIMAX

        y = np.array([self._tr(v) for v in self.values[-self.window:]])
        if np.ptp(y) == 0:  # constant data: nothing to estimate (Dynamo returns the constant too)
            self._filter = None
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = SARIMAX(y, order=self.order).fit(disp=False)
        fr = res.filter_results  # the time-invariant matrices at the fitted parameters
        m = {k: np.asarray(getattr(fr, k)) for k in ("design", "transition", "selection", "state_cov", "obs_cov")}
        m = {k: v[..., 0] if v.ndim == 3 else v for k, v in m.items()}
        self._filter = StateSpaceStep(m["design"], m["transition"], m["selection"], m["state_cov"],
                                      float(np.ravel(m["obs_cov"])[0]), res.predicted_state[:, -1],
                                      res.predicted_state_cov[:, :, -1])
        self._since_fit = 0
        self.fits += 1

    def observe(self, value: float) -> None:
        """Record the value; refit when due, else filter it with the fitted parameters.

        Parameters
        ----------
        value : float
            The interval's value.
        """
        super().observe(value)
        n = len(self.values)
        if n < self.min_points:
            return
        if self._filter is None or self._since_fit + 1 >= self.refit_every:
            self._fit()
        else:
            self._filter.step(self._tr(self.values[-1]))
            self._since_fit += 1

    def predict_next(self) -> float:
        """The fitted model's one-step forecast (>= 0), or the last value before the first fit."""
        if self._filter is None:
            return super().predict_next()
        f = self._filter.forecast()
        return max(math.expm1(f) if self.log1p else f, 0.0)


class KalmanPredictor(LoadPredictor):
    """Dynamo's local-linear-trend Kalman predictor with fixed noise variances.

    Parameters
    ----------
    q_level, q_trend : float
        Process noise of the level and of the trend (> 0; Dynamo's defaults 1.0 and 0.1).
    r : float
        Measurement noise (> 0; default 10.0).
    min_points : int
        Predictions start after this many points (default 5).
    log1p : bool
        Filter log1p of the values (default False).
    """

    name = "kalman"

    def __init__(self, *, q_level: float = 1.0, q_trend: float = 0.1, r: float = 10.0, min_points: int = 5,
                 log1p: bool = False):
        self.q_level = check_number("kalman.q_level", q_level, low=0.0, low_inclusive=False)
        self.q_trend = check_number("kalman.q_trend", q_trend, low=0.0, low_inclusive=False)
        self.r = check_number("kalman.r", r, low=0.0, low_inclusive=False)
        self.log1p = bool(log1p)
        super().__init__(min_points)

    def reset(self) -> None:
        """Forget every observation and the filter state."""
        super().reset()
        self._filter: StateSpaceStep | None = None

    def observe(self, value: float) -> None:
        """Record the value and update the filter (initialised at the first point, trend 0).

        Parameters
        ----------
        value : float
            The interval's value.
        """
        super().observe(value)
        z = math.log1p(max(self.values[-1], 0.0)) if self.log1p else self.values[-1]
        if self._filter is None:
            # state [level, trend] = [z, 0] with P = 1000 I (Dynamo's filterpy set-up), predicted to the
            # next point: a = T a, P = T P T' + Q
            T, Q = np.array([[1.0, 1.0], [0.0, 1.0]]), np.diag([self.q_level, self.q_trend])
            self._filter = StateSpaceStep([[1.0, 0.0]], T, np.eye(2), Q, self.r, T @ np.array([z, 0.0]),
                                          T @ (1000.0 * np.eye(2)) @ T.T + Q)
        else:
            self._filter.step(z)

    def predict_next(self) -> float:
        """The filter's predicted level (>= 0), or the last value before ``min_points``."""
        if self._filter is None or len(self.values) < self.min_points:
            return super().predict_next()
        f = self._filter.forecast()
        return max(math.expm1(f) if self.log1p else f, 0.0)


#: Dynamo's predictor names and their classes here
LOAD_PREDICTORS = {"constant": ConstantPredictor, "arima": ArimaPredictor, "kalman": KalmanPredictor}


def make_load_predictor(name: str, **kw) -> LoadPredictor:
    """A fresh predictor by Dynamo's name.

    Parameters
    ----------
    name : str
        ``"constant"``, ``"arima"`` or ``"kalman"``.
    **kw
        The predictor's parameters.

    Returns
    -------
    LoadPredictor
    """
    return LOAD_PREDICTORS[check_choice("dynamo.predictor", name, tuple(LOAD_PREDICTORS))](**kw)
