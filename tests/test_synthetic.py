import math

import pytest

from tokenfactory import ConfigError
from tokenfactory.traces import (
    SyntheticWorkload,
    counts,
    fit_workload,
    generate_rates,
    generate_requests,
    rate_at,
)


@pytest.mark.parametrize("idc", [1.0, 4.0, 10.0])
def test_dispersion_hits_target(idc):
    w = SyntheticWorkload(mean_rate_rps=20.0, daily_amplitude=0.0, daily_second_harmonic=0.0, weekend_factor=1.0,
                          idc=idc, burst_window_s=10.0, seed=5)
    df = generate_requests(w, 6 * 3600)
    c = counts(df["arrival_s"].to_numpy(), 10.0)
    assert c.mean() / 10.0 == pytest.approx(20.0, rel=0.03)
    assert c.var() / c.mean() == pytest.approx(idc, rel=0.15)


def test_size_quantiles_hit_lognormal_targets():
    w = SyntheticWorkload(mean_rate_rps=50.0, input_median=800.0, input_sigma=1.0, output_median=120.0,
                          output_sigma=0.8, seed=2)
    df = generate_requests(w, 3600)
    for col, med, sig in (("input_tokens", 800.0, 1.0), ("output_tokens", 120.0, 0.8)):
        assert df[col].median() == pytest.approx(med, rel=0.05)
        assert df[col].quantile(0.9) == pytest.approx(med * math.exp(1.2816 * sig), rel=0.10)


def test_daily_seasonality_recovered_by_fit():
    w = SyntheticWorkload(mean_rate_rps=100.0, daily_amplitude=0.4, daily_second_harmonic=0.1, peak_hour=15.0,
                          weekend_factor=0.7, rate_noise_cv=0.1, seed=9)
    r = generate_rates(w, 14 * 86400.0)
    f = fit_workload(r)
    assert f.daily_amplitude == pytest.approx(0.4, rel=0.10)
    assert f.peak_hour == pytest.approx(15.0, abs=0.5)
    assert f.weekend_factor == pytest.approx(0.7, rel=0.10)
    assert f.rate_noise_cv == pytest.approx(0.1, rel=0.25)


def test_rate_function_shape():
    w = SyntheticWorkload(mean_rate_rps=10.0, daily_amplitude=0.5, daily_second_harmonic=0.0, peak_hour=12.0,
                          weekend_factor=0.5, trend_per_day=0.0)
    assert rate_at(w, 12 * 3600.0) == pytest.approx(15.0)     # Monday noon: peak
    assert rate_at(w, 0.0) == pytest.approx(5.0)              # Monday midnight: trough
    assert rate_at(w, 5 * 86400 + 12 * 3600.0) == pytest.approx(7.5)  # Saturday noon


def test_agentic_sessions_reuse_prefix_and_compact():
    w = SyntheticWorkload(mean_rate_rps=5.0, agentic_fraction=1.0, session_turns_mean=40.0, context_limit=60_000,
                          session_initial_context_median=20_000.0, session_new_tokens_median=2_000.0, seed=4)
    df = generate_requests(w, 4 * 3600)
    s = df[df["session_id"] != ""]
    assert len(s) > 100
    assert (s["input_tokens"] <= w.context_limit).all()
    assert (s["cached_tokens"] <= s["input_tokens"]).all()
    later = s[s["turn"] > 0]
    assert later["cached_tokens"].sum() / later["input_tokens"].sum() > 0.8  # most of each turn is prefix
    assert (later["cached_tokens"] == 0).any()  # compaction dropped a prefix somewhere
    tt = later["think_time_s"]
    assert tt.quantile(0.99) / tt.median() > 10  # heavy-tailed think times


def test_deterministic_by_seed():
    a = generate_requests(SyntheticWorkload(seed=3, agentic_fraction=0.3), 600)
    b = generate_requests(SyntheticWorkload(seed=3, agentic_fraction=0.3), 600)
    c = generate_requests(SyntheticWorkload(seed=4, agentic_fraction=0.3), 600)
    assert a.equals(b) and not a.equals(c)
    ra, rb = generate_rates(SyntheticWorkload(seed=1), 86400 * 2), generate_rates(SyntheticWorkload(seed=1), 86400 * 2)
    assert ra.equals(rb)


def test_missing_windows_are_nan():
    r = generate_rates(SyntheticWorkload(seed=1), 14 * 86400, missing_fraction=0.02)
    assert r["rate_rps"].isna().sum() == int(0.02 * len(r))


@pytest.mark.parametrize("kw,field", [({"idc": 0.5}, "synthetic.idc"), ({"daily_amplitude": 2}, "synthetic.daily_amplitude"),
                                      ({"seed": -1}, "synthetic.seed")])
def test_bad_config(kw, field):
    with pytest.raises(ConfigError, match=field):
        SyntheticWorkload(**kw)
    with pytest.raises(ConfigError, match="synthetic.colour"):
        SyntheticWorkload.from_dict({"colour": 1})


def test_fit_counts_turns_per_session_only_over_session_rows():
    w = SyntheticWorkload(mean_rate_rps=4.0, agentic_fraction=0.3, session_turns_mean=20.0, daily_amplitude=0.0,
                          seed=5)
    r = generate_requests(w, 4 * 3600.0)
    truth = float(r[r["session_id"] != ""].groupby("session_id").size().mean())
    assert fit_workload(r).session_turns_mean == pytest.approx(truth)


def test_superposed_sessions_keep_their_turn_order():
    from tokenfactory.traces import superpose_trace

    w = SyntheticWorkload(mean_rate_rps=2.0, agentic_fraction=0.5, session_turns_mean=8.0, daily_amplitude=0.0,
                          seed=9)
    r = generate_requests(w, 3600.0)
    out = superpose_trace(r, 2.5, seed=3)
    assert (out["session_id"] == "").sum() == pytest.approx(2.5 * (r["session_id"] == "").sum(), rel=0.1)
    for sid, g in out[out["session_id"] != ""].groupby("session_id"):
        assert g.sort_values("arrival_s")["turn"].is_monotonic_increasing, sid
    # whole sessions of the fractional copy are kept or dropped
    halves = out[out["session_id"].str.endswith("#2")].groupby("session_id")
    originals = r[r["session_id"] != ""].groupby("session_id").size()
    for sid, g in halves:
        assert len(g) == originals[sid.rsplit("#", 1)[0]]
