import numpy as np
import pandas as pd
import pytest

from tokenfactory.traces import acf_at, counts, rates_from_requests, trace_available, trace_info, load_trace


def _poisson_table(rate, duration, seed):
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0, duration, rng.poisson(rate * duration)))
    df = pd.DataFrame({"arrival_s": t, "input_tokens": 100, "cached_tokens": 0, "output_tokens": 10,
                       "session_id": "", "turn": 0, "think_time_s": np.nan})
    df.attrs["kind"] = "requests"
    return df


@pytest.mark.parametrize("seed", [0, 1])
def test_poisson_has_unit_dispersion(seed):
    info = trace_info(_poisson_table(20.0, 20000.0, seed))
    assert info["mean_rate_rps"] == pytest.approx(20.0, rel=0.02)
    assert info["idc_10s"] == pytest.approx(1.0, abs=0.1)
    assert info["prefix_reuse_ratio"] is None


def test_counts_and_acf():
    c = counts(np.array([0.5, 1.5, 1.7, 9.9]), 1.0)
    assert c.tolist() == [1, 2, 0, 0, 0, 0, 0, 0, 0]  # the partial window at 9.9 s is dropped
    x = np.sin(np.arange(1000) * 2 * np.pi / 50)
    assert acf_at(x, 50) == pytest.approx(1.0, abs=1e-6)   # over the overlapping pairs
    assert acf_at(x, 25) == pytest.approx(-1.0, abs=1e-6)
    x[::7] = np.nan
    assert acf_at(x, 50) == pytest.approx(1.0, abs=1e-3)   # gaps are skipped, not zero


def test_rates_from_requests():
    r = rates_from_requests(_poisson_table(5.0, 3600.0, 3), 60.0)
    assert r.attrs["kind"] == "rates" and r["rate_rps"].mean() == pytest.approx(5.0, rel=0.05)


def test_real_rate_trace_stats():
    if not trace_available("servegen:m-small"):
        pytest.skip("shared trace data absent")
    info = trace_info(load_trace("servegen:m-small"))
    assert info["missing_windows"] == 37 and info["acf_1d"] > 0.3 and info["daily_peak_to_trough"] > 1.5
