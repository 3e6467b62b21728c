import numpy as np
import pandas as pd
import pytest

from tokenfactory.controllers import FORECASTERS, backtest, make_forecaster, mase_scale, pick_best_model
from tokenfactory import ConfigError

DT = 600.0
DAY = 86400.0


def seasonal_series(days=12, noise=5.0, seed=0, gaps=0):
    """Known daily + weekly seasonality with iid Gaussian noise of sd ``noise``."""
    rng = np.random.default_rng(seed)
    t = np.arange(0, days * DAY, DT)
    mean = 100 + 30 * np.cos(2 * np.pi * t / DAY) + 10 * np.sin(4 * np.pi * t / DAY) + 8 * np.cos(2 * np.pi * t / (7 * DAY))
    y = mean + noise * rng.standard_normal(len(t))
    if gaps:
        idx = rng.choice(len(t) - 200, gaps, replace=False)
        y[idx] = np.nan
    return pd.Series(y, index=pd.Index(t, name="time_s"))


@pytest.mark.parametrize("name", list(FORECASTERS))
def test_every_model_fits_and_predicts_through_gaps(name):
    y = seasonal_series(days=9, gaps=30)
    fc = make_forecaster(name).fit(y).predict(36)
    df = fc.to_pandas()
    assert len(df) == 36 and np.isfinite(df.to_numpy()).all()
    assert (df["lower_95"] <= df["lower_80"] + 1e-9).all() and (df["lower_80"] <= df["mean"] + 1e-9).all()
    assert (df["mean"] <= df["upper_80"] + 1e-9).all() and (df["upper_80"] <= df["upper_95"] + 1e-9).all()
    assert df.index[0] == y.index[-1] + DT


def test_good_model_beats_seasonal_naive():
    r = backtest(seasonal_series(days=14, noise=8.0), ["seasonal-naive-daily", "fourier", "ucm"], 144,
                 test_days=3, origin_every_s=DAY / 2)
    m = r.metrics
    assert m.loc["fourier", "mase"] < 0.9 * m.loc["seasonal-naive-daily", "mase"]
    assert m.loc["ucm", "mase"] < m.loc["seasonal-naive-daily", "mase"]


def test_interval_coverage_on_known_noise():
    # the Fourier regression is the true model here: its intervals should be calibrated
    r = backtest(seasonal_series(days=14, noise=6.0, seed=3), ["fourier"], 144, test_days=4, origin_every_s=DAY / 2)
    assert r.metrics.loc["fourier", "coverage_80"] == pytest.approx(0.80, abs=0.06)
    assert r.metrics.loc["fourier", "coverage_95"] == pytest.approx(0.95, abs=0.04)


def test_seasonal_naive_repeats_the_last_day():
    y = seasonal_series(days=3, noise=0.0)
    fc = make_forecaster("seasonal-naive-daily").fit(y).predict(144)
    np.testing.assert_allclose(fc.mean, y.to_numpy()[-144:])


def test_mase_scale_and_best_pick():
    y = seasonal_series(days=4, noise=0.0)
    y.iloc[:] = np.tile(np.arange(144.0), 4)
    with pytest.raises(ConfigError, match="MASE"):
        mase_scale(y, 144)  # a perfectly periodic history has no seasonal-naive error
    m = pd.DataFrame({"mase": [0.5, 0.6, 0.9], "coverage_80": [0.4, 0.8, 0.9]}, index=["a", "b", "c"])
    assert pick_best_model(m)[0] == "b"  # a is sharper but its intervals are not honest


def test_bad_inputs():
    with pytest.raises(ConfigError, match="models"):
        make_forecaster("prophet")
    with pytest.raises(ConfigError, match="regular grid"):
        make_forecaster("constant").fit(pd.Series([1.0, 2, 3], index=[0.0, 1.0, 5.0]))
    with pytest.raises(ConfigError, match="horizon"):
        make_forecaster("constant").fit(seasonal_series(days=1)).predict(0)
    with pytest.raises(ConfigError, match="test_days"):
        backtest(seasonal_series(days=3), ["constant"], 6, test_days=2.5)
