"""Dynamo's load predictors: the fixed-parameter Kalman step reproduces the fitted model's own
one-step forecasts, the local-linear-trend filter follows a ramp, a shared predictor records one
value per adjustment for both pools' planners."""

import math

import numpy as np
import pytest

from tokenfactory.controllers.autoscaling import DynamoThroughputPlanner
from tokenfactory.controllers.load_predictors import ArimaPredictor, KalmanPredictor, make_load_predictor
from tokenfactory.core.validation import ConfigError


@pytest.mark.filterwarnings("ignore::statsmodels.tools.sm_exceptions.EstimationWarning")
def test_arima_filter_between_refits_matches_the_fitted_models_forecasts():
    from statsmodels.tsa.statespace.sarimax import SARIMAX

    rng = np.random.default_rng(3)
    y = 1000.0 + np.cumsum(rng.normal(0.0, 20.0, 80)) + 50.0 * np.sin(np.arange(80) / 5.0)
    p = ArimaPredictor(window=60, refit_every=1000, min_points=60)
    preds = []
    for v in y:
        p.observe(v)
        preds.append(p.predict_next())
    assert p.fits == 1  # fitted once at point 60, filtered after
    res = SARIMAX(y[:60], order=(2, 1, 1)).fit(disp=False)
    # the fitted model, its parameters fixed, filtered over all 80 points: its one-step forecasts
    full = SARIMAX(y, order=(2, 1, 1)).filter(res.params)
    expected = full.get_prediction(start=60, end=80).predicted_mean  # forecast of y[t] from y[:t]
    assert np.asarray(preds[59:80]) == pytest.approx(np.maximum(np.asarray(expected), 0.0), rel=1e-6)


def test_kalman_follows_a_ramp_and_starts_from_the_last_value():
    k = KalmanPredictor()
    k.observe(100.0)
    assert k.predict_next() == 100.0  # fewer than min_points: the last value
    for i in range(1, 60):
        k.observe(100.0 + 10.0 * i)
    # a local-linear trend: the next point of the ramp, not the last one
    assert k.predict_next() == pytest.approx(100.0 + 10.0 * 60, rel=0.01)


def test_shared_predictor_records_one_value_per_adjustment():
    shared = make_load_predictor("constant")
    fill = DynamoThroughputPlanner("fill", 10.0, predictor=shared)
    decode = DynamoThroughputPlanner("decode", 5.0, predictor=shared)
    assert fill.recommend(30.0, t=180.0) == 3 and decode.recommend(30.0, t=180.0) == 6
    assert len(shared.values) == 1 and shared.values[0] == pytest.approx(30.0 * 180.0)  # counts per interval
    with pytest.raises(ConfigError, match="dynamo.predictor"):
        make_load_predictor("prophet")
    assert math.isfinite(fill.recommend(40.0, t=360.0)) and len(shared.values) == 2
