"""Scoring and calibrating the service model on measured runs (plant_models/calibration.py)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tokenfactory.plant_models import calibration as cal
from tokenfactory.plant_models.measured_runs import read_measured_runs
from tokenfactory.plant_models.roofline import Efficiency
from tokenfactory.core.validation import ConfigError

SUBSET = Path(__file__).parent / "data" / "silicon_subset.csv"


@pytest.fixture(scope="module")
def runs():
    return read_measured_runs(SUBSET)


def test_error_metrics_reference_values():
    t = pd.DataFrame({"tpot_error": [-0.5, -0.1, 0.0, 0.2, 0.3], "ttft_error": [0.0] * 5,
                      "hardware": ["a", "a", "b", "b", "b"]})
    m = cal.error_metrics(t, splits=("hardware",))
    assert m["tpot"]["median_abs_error"] == pytest.approx(0.2)
    assert m["tpot"]["within_25pct"] == pytest.approx(0.6)
    assert m["tpot"]["p10_error"] == pytest.approx(np.percentile([-0.5, -0.1, 0, 0.2, 0.3], 10))
    assert m["tpot"]["by_hardware"]["a"]["rows"] == 2
    assert m["ttft"]["within_25pct"] == 1.0


def test_simulated_benchmark_is_finite_and_conserves(runs):
    r = next(x for x in runs.runs if x.model == "llama-3.1-70b")
    out = cal.simulate_run(r)
    assert out["completed"] == r.concurrency * 3 == out["requests"]
    assert 0 < out["tpot_s"] < 1 and 0 < out["ttft_s"] < 60
    # the first wave queues behind every client's prompt: its TTFT is at least the later ones'
    assert out["ttft_wave_s"] >= out["ttft_steady_s"] * 0.99


@pytest.mark.parametrize("model", ["llama-3.1-70b", "qwen3-32b", "deepseek-v3"])
def test_steady_state_tracks_the_simulator(runs, model):
    r = next(x for x in runs.runs if x.model == model)
    row = cal.cross_check([r]).iloc[0]
    assert row["tpot_ratio"] == pytest.approx(1.0, abs=0.3)
    assert row["ttft_ratio"] == pytest.approx(1.0, abs=0.6)


def test_faster_memory_means_faster_decode(runs):
    r = next(x for x in runs.runs if x.model == "llama-3.1-70b")
    slow = cal.steady_state_run(r, cal.RunSettings(efficiency=Efficiency(memory=0.2)))
    fast = cal.steady_state_run(r, cal.RunSettings(efficiency=Efficiency(memory=0.6)))
    assert fast["tpot_s"] < 0.5 * slow["tpot_s"]


def test_front_end_overhead_adds_to_ttft(runs):
    r = runs.runs[1]
    a = cal.steady_state_run(r)
    b = cal.steady_state_run(r, cal.RunSettings(ttft_overhead_s=0.1, ttft_s_per_input_token=1e-6))
    assert b["ttft_s"] - a["ttft_s"] == pytest.approx(0.1 + 1e-6 * r.input_tokens, rel=1e-9)
    assert b["tpot_s"] == a["tpot_s"]


def test_predict_runs_reports_every_run(runs):
    table, failed = cal.predict_runs(runs, method="steady-state")
    assert len(table) + sum(failed.values()) == len(runs.runs)
    assert np.isfinite(table[["predicted_tpot_s", "predicted_ttft_s", "tpot_error", "ttft_error"]]).all().all()
    np.testing.assert_allclose(table["tpot_error"], table["predicted_tpot_s"] / table["measured_tpot_s"] - 1)


def test_published_points_score_single_pass():
    runs = read_measured_runs("published")
    table, failed = cal.predict_runs(runs)
    assert not failed and len(table) == len(runs.runs)
    assert table["tpot_error"].notna().sum() + table["ttft_error"].notna().sum() == len(table)


def test_fit_recovers_a_known_plant(runs):
    """Runs whose 'measurements' are the model's own predictions at known parameters: the fit,
    started from the defaults, brings the predictions to them (median within 5 %)."""
    truth = cal.settings_from({**cal.params_of(cal.BASE_SETTINGS), "memory": 0.55, "compute": 0.7,
                               "layer_overhead_s": 30e-6, "ttft_overhead_s": 0.05})
    synth = []
    for r in runs.runs[:8]:  # two residuals a run: at least as many as the free parameters
        p = cal.steady_state_run(r, truth)
        synth.append(dataclasses.replace(r, tpot_s=p["tpot_s"], ttft_s=p["ttft_s"]))
    before = cal._log_residuals(synth, cal.BASE_SETTINGS)
    # the subset's 8 runs give 16 residuals: the first wave's request share (0 in the truth) stays
    # at its start, the other 16 parameters are free
    free = [n for n in cal.CALIBRATION_PARAMETERS if n != "client_request_share"]
    fit = cal.fit_calibration(synth, max_nfev=20, choose_kv=False, published=(), free=free)
    after = cal._log_residuals(synth, fit.settings)
    assert np.median(np.abs(after)) < 0.05 < np.median(np.abs(before))
    assert np.max(np.abs(after)) < np.max(np.abs(before)) / 3
    assert fit.params["memory"] == pytest.approx(0.55, rel=0.3)
    assert set(fit.std_error) == set(cal.CALIBRATION_PARAMETERS)


def test_fit_needs_enough_runs(runs):
    with pytest.raises(ConfigError, match="cannot fit"):
        cal.fit_calibration(runs.runs[:2])


def test_settings_validate():
    with pytest.raises(ConfigError, match="first_wave_weight"):
        cal.RunSettings(first_wave_weight=1.5)
    with pytest.raises(ConfigError, match="kv_precision"):
        cal.RunSettings(kv_precision={"vllm": "fp4"})


def test_training_sample_is_stratified_and_seeded(runs):
    a = cal.training_sample(runs.runs, per_group=1, seed=1)
    b = cal.training_sample(runs.runs, per_group=1, seed=1)
    assert [r.key for r in a] == [r.key for r in b]
    groups = {(r.hardware, r.engine, r.model, r.mode, r.batch_band) for r in runs.runs}
    assert len(a) == len(groups)


def test_engine_ttft_factor_scales_only_its_engine(runs):
    r = runs.runs[1]
    a = cal.steady_state_run(r)
    b = cal.steady_state_run(r, cal.RunSettings(engine_ttft_factor={r.engine: 2.0}))
    c = cal.steady_state_run(r, cal.RunSettings(engine_ttft_factor={"other": 2.0}))
    assert b["ttft_s"] == pytest.approx(2.0 * a["ttft_s"]) and c["ttft_s"] == a["ttft_s"]
    p = cal.params_of(cal.settings_from({"ttft_factor_vllm": 1.5}))
    assert p["ttft_factor_vllm"] == 1.5 and p["ttft_factor_sglang"] == 1.0 and "ttft_factor_trtllm" not in p


def test_nvlink_bandwidth_efficiency_is_fixed_and_ttft_weighted(runs):
    """With the collectives' latency fitted, NVLink's bandwidth efficiency is not a free
    parameter: it stays at the documented bus-bandwidth efficiency of FIT_START in the fit and in
    the calibrated set; a run's TTFT residual enters the fit at TTFT_RESIDUAL_WEIGHT."""
    assert "network" not in cal.CALIBRATION_PARAMETERS
    assert {"collective_latency_s", "scale_up_latency_s"} <= set(cal.CALIBRATION_PARAMETERS)
    assert cal.FIT_START.efficiency.network == pytest.approx(0.8)
    assert cal.calibrated_settings().efficiency.network == cal.FIT_START.efficiency.network
    st = cal.settings_from({"memory": 0.4})
    assert st.efficiency.network == cal.FIT_START.efficiency.network and st.efficiency.memory == 0.4
    full = cal._log_residuals(runs.runs[:3], cal.BASE_SETTINGS)
    half = cal._log_residuals(runs.runs[:3], cal.BASE_SETTINGS, ttft_weight=0.5)
    np.testing.assert_allclose(half[0::2], full[0::2])
    np.testing.assert_allclose(half[1::2], 0.5 * full[1::2])


def _residual_table(missing_s):
    """Rows at two contexts and two batches on 1-GPU workers; measured = predicted + missing_s(B, ctx)."""
    rows = []
    for batch, band in ((16, "9-32"), (256, ">128")):
        for isl in (1000, 8000):
            pred = 0.02
            meas = pred + missing_s(batch, isl + 500)
            rows.append({"isl": isl, "osl": 1000, "gpus_per_worker": 1, "pp": 1, "tp": 1, "batch_band": band,
                         "predicted_batch": batch, "predicted_tpot_s": pred, "measured_tpot_s": meas,
                         "tpot_error": pred / meas - 1.0})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("name, missing_s, short_us, long_us", [
    # a cost per sequence: the same missing time per sequence at 1.5k and 8.5k context
    ("per-sequence", lambda b, c: 20e-6 * b, 20.0, 20.0),
    # a cost per sequence per context token: it grows with the context (1.5k -> 8.5k tokens)
    ("per-sequence-per-token", lambda b, c: 10e-9 * b * c, 15.0, 85.0),
])
def test_residual_by_batch_and_context_tells_the_costs_apart(name, missing_s, short_us, long_us):
    r = cal.residual_by_batch_and_context(_residual_table(missing_s)).set_index(["batch_band", "context_band"])
    big = r.loc[">128"]
    assert big.loc["0-1500", "missing_us_per_sequence"] == pytest.approx(short_us, rel=1e-6)
    assert big.loc[">6000", "missing_us_per_sequence"] == pytest.approx(long_us, rel=1e-6)
    assert (r["rows"] == 1).all() and (r["tpot_signed_median"] < 0).all()


def test_predict_runs_records_the_steady_state_batch(runs):
    table, _ = cal.predict_runs(runs.runs[:3], method="steady-state")
    assert (table["predicted_batch"] >= 1).all()


def test_fit_recovers_planted_large_batch_terms(runs):
    """Synthetic runs at three client counts whose 'measurements' are the model's own at a planted
    per-sequence cost and KV-read efficiency: fitting just those two from FIT_START recovers them."""
    truth = cal.settings_from({"sequence_overhead_s": 25e-6, "attention_memory": 0.15})
    synth = []
    for r in (x for x in runs.runs if x.model in ("deepseek-v3", "llama-3.1-70b")):
        for n in (8, 96, 384):
            run = dataclasses.replace(r, concurrency=n, max_batch=0)
            p = cal.steady_state_run(run, truth)
            synth.append(dataclasses.replace(run, tpot_s=p["tpot_s"], ttft_s=p["ttft_s"]))
    fit = cal.fit_calibration(synth, max_nfev=10, choose_kv=False, published=(),
                              free=("sequence_overhead_s", "attention_memory"))
    assert fit.params["sequence_overhead_s"] == pytest.approx(25e-6, rel=0.15)
    assert fit.params["attention_memory"] == pytest.approx(0.15, rel=0.15)
    # the parameters not freed stay at the start, with no standard error
    assert fit.params["memory"] == cal.params_of(cal.FIT_START)["memory"] and fit.std_error["memory"] == 0.0
    assert np.median(np.abs(cal._log_residuals(synth, fit.settings))) < 0.01
    with pytest.raises(ConfigError, match="free"):
        cal.fit_calibration(synth, free=("no_such_parameter",))


def test_attention_dp_imbalance_is_fitted_and_slows_aggregated_attention_dp_runs(runs):
    """The imbalance is a free parameter of the fit (start 0: the defaults), round-trips through
    the settings, and reaches the benchmark's prediction: an aggregated attention-DP run's TPOT
    grows with it, an aggregated TP-attention run's does not move."""
    assert cal.CALIBRATION_PARAMETERS["attention_dp_imbalance"][:2] == (0.0, 1.0)
    assert cal.params_of(cal.FIT_START)["attention_dp_imbalance"] == 0.0
    on = cal.settings_from({"attention_dp_imbalance": 1.0})
    assert cal.params_of(on)["attention_dp_imbalance"] == 1.0
    dp = next(r for r in runs.runs if r.fill_parallelism is None and r.parallelism.dp_attention > 1)
    tp = next(r for r in runs.runs if r.fill_parallelism is None and r.parallelism.dp_attention == 1)
    assert cal.steady_state_run(dp, on)["tpot_s"] > cal.steady_state_run(dp, cal.FIT_START)["tpot_s"]
    assert cal.steady_state_run(tp, on)["tpot_s"] == cal.steady_state_run(tp, cal.FIT_START)["tpot_s"]


def _agg_run(runs, dp: int = 1):
    return next(r for r in runs.runs if r.mode == "agg" and r.parallelism.dp_attention == dp)


@pytest.mark.parametrize("n, isl", [(1, 1024), (4, 3000), (16, 1024), (9, 8192), (32, 2000)])
def test_first_wave_is_the_sum_of_its_chunk_passes(runs, n, isl):
    """N prompts of ISL tokens arriving at once on an aggregated worker with a chunked-prefill
    budget of C tokens per pass: prompt j (1-based, FIFO) finishes with pass ceil(j ISL / C), so
    the wave's mean TTFT is that pass count averaged over the prompts, times one full pass."""
    r = dataclasses.replace(_agg_run(runs), concurrency=n, input_tokens=isl, workers=1)
    s = cal.run_service(r)
    c = s.fill_token_budget
    passes = [math.ceil(j * isl / c - 1e-9) for j in range(1, n + 1)]
    expected = s.fill_step_s(min(c, n * isl)) * sum(passes) / n
    assert cal.steady_state_run(r)["ttft_wave_s"] == pytest.approx(expected, rel=1e-12)


def test_predicted_ttft_closed_form():
    """k (W wave + (1 - W) steady + overhead + per-token x ISL), W = s + (1 - s) w with
    s = min(1, N / R) the first wave's share of the benchmark's R requests."""
    run = type("Run", (), {"engine": "sglang", "input_tokens": 2000, "concurrency": 50})()  # the fields read
    st = cal.RunSettings(first_wave_weight=0.2, ttft_overhead_s=0.05, ttft_s_per_input_token=1e-5,
                         engine_ttft_factor={"sglang": 2.0}, client_request_share=1 / 200)
    assert cal.first_wave_share(run, st) == pytest.approx(0.25 + 0.75 * 0.2, rel=1e-12)
    got = cal.predicted_ttft_s(run, st, wave_s=0.8, steady_s=0.2)
    assert got == pytest.approx(2.0 * (0.4 * 0.8 + 0.6 * 0.2 + 0.05 + 0.02), rel=1e-12)
    # more clients than requests: every request is in the first wave
    assert cal.first_wave_share(run, dataclasses.replace(st, client_request_share=1 / 30)) == 1.0
    # unstated (the default): the first-wave weight alone, as before the request count existed
    assert cal.first_wave_share(run, dataclasses.replace(st, client_request_share=0.0)) == 0.2


def test_client_request_share_weights_the_wave_more_at_high_concurrency(runs):
    """With a finite request count the first wave weighs more, the more clients there are: the
    predicted TTFT moves toward the wave's, monotonically in N, TPOT unchanged; the default
    (unstated) leaves every prediction as it was."""
    r = _agg_run(runs)
    base = cal.RunSettings(first_wave_weight=0.3)
    assert cal.steady_state_run(r, base) == cal.steady_state_run(r, dataclasses.replace(base, client_request_share=0.0))
    lifts = []
    for n in (4, 32, 128):
        rn = dataclasses.replace(r, concurrency=n, input_tokens=4096, workers=1, max_batch=0)
        a = cal.steady_state_run(rn, base)
        b = cal.steady_state_run(rn, dataclasses.replace(base, client_request_share=1 / 256))
        # the solve weighs the wave as at least the steady state (max(wave, steady))
        s, gap = n / 256.0, max(a["ttft_wave_s"] - a["ttft_steady_s"], 0.0)
        assert b["tpot_s"] == a["tpot_s"] and (gap > 0 or n < 128)
        assert b["ttft_s"] - a["ttft_s"] == pytest.approx(s * 0.7 * gap, rel=1e-9)
        lifts.append((b["ttft_s"] - a["ttft_s"]) / a["ttft_s"])
    assert lifts == sorted(lifts) and lifts[-1] > lifts[0]
    p = cal.params_of(cal.settings_from({"client_request_share": 0.002}))
    assert p["client_request_share"] == 0.002


@pytest.mark.parametrize("value", [-0.01, 1.5, math.nan, math.inf])
def test_client_request_share_out_of_range_is_a_config_error(value):
    with pytest.raises(ConfigError, match="client_request_share"):
        cal.RunSettings(client_request_share=value)


# -- the two-stage fit (issue 24) --------------------------------------------------------------
_PLANTED = {"first_wave_weight": 0.3, "ttft_overhead_s": 0.04, "ttft_s_per_input_token": 2e-5,
            "ttft_factor_sglang": 1.8, "ttft_factor_vllm": 0.6, "client_request_share": 1 / 300}


def _varied(runs):
    """The subset's runs at several concurrencies: wave and steady TTFT that differ run to run."""
    return [dataclasses.replace(r, concurrency=n) for r in runs.runs for n in (1, 4, 32, 256)]


def test_ttft_terms_act_after_the_fixed_point(runs):
    """The TTFT terms change neither TPOT, the batch nor the pass-and-queue TTFT of the solve; the
    vectorised prediction over ttft_components is predicted_ttft_s run by run."""
    truth = cal.settings_from(_PLANTED)
    rs = _varied(runs)
    comp = cal.ttft_components(rs, truth)
    got = cal._ttft_from_components(comp, cal.params_of(truth))
    for i, r in enumerate(rs):
        a, b = cal.steady_state_run(r, cal.FIT_START), cal.steady_state_run(r, truth)
        assert (a["tpot_s"], a["batch"], a["ttft_steady_s"], a["ttft_wave_s"]) == \
            (b["tpot_s"], b["batch"], b["ttft_steady_s"], b["ttft_wave_s"])
        assert got[i] == pytest.approx(b["ttft_s"], rel=1e-12)
        assert 0.0 <= b["ttft_queue_s"] <= b["ttft_steady_s"] * (1 + 1e-3) + 1e-12  # a part of the steady TTFT
    assert set(cal.TTFT_TERMS) == set(_PLANTED) and not set(cal.TTFT_TERMS) & set(cal.EFFICIENCY_TERMS)


def test_stage_one_recovers_planted_ttft_terms(runs):
    """Runs whose measured TTFT is the closed form k_e (W wave + (1 - W) steady + o + p ISL) at known
    terms: stage 1, from FIT_START (every term elsewhere), recovers each to 1 % (noise-free; the
    prior is off), the predictions to 1e-6, and engines not in the runs keep their start."""
    truth = cal.settings_from(_PLANTED)
    rs = [dataclasses.replace(r, ttft_s=cal.steady_state_run(r, truth)["ttft_s"]) for r in _varied(runs)]
    fit = cal.fit_ttft_terms(rs, cal.FIT_START, prior_weight=0.0)
    for k, v in _PLANTED.items():
        assert fit.params[k] == pytest.approx(v, rel=0.01), k
        assert fit.std_error[k] < 0.05 * v, k
    for k in cal.EFFICIENCY_TERMS:  # held
        assert fit.params[k] == cal.params_of(cal.FIT_START)[k] and fit.std_error[k] == 0.0
    comp = cal.ttft_components(rs, cal.FIT_START)
    assert np.allclose(cal._ttft_from_components(comp, fit.params), comp["measured_ttft_s"], rtol=1e-6)
    no_vllm = [r for r in rs if r.engine != "vllm"]
    f2 = cal.fit_ttft_terms(no_vllm, cal.FIT_START, prior_weight=0.0)
    assert f2.params["ttft_factor_vllm"] == 1.0 and f2.std_error["ttft_factor_vllm"] == 0.0


def test_stage_one_validates(runs):
    with pytest.raises(ConfigError, match="robust_scale"):
        cal.fit_ttft_terms(runs.runs, cal.FIT_START, robust_scale=0.0)
    with pytest.raises(ConfigError, match="names"):
        cal.fit_ttft_terms(runs.runs, cal.FIT_START, names=["compute"])
    with pytest.raises(ConfigError, match="alternations"):
        cal.fit_two_stage(runs.runs, alternations=0)
    with pytest.raises(ConfigError, match="alternations"):
        cal.calibrate(runs.runs, cv=False, alternations=0, two_stage=True)
    with pytest.raises(ConfigError, match="alternations"):
        cal.fit_two_stage(runs.runs, alternations=-1, joint_first=True)


@pytest.mark.parametrize("by", ["hardware", "engine"])
def test_two_stage_folds_see_no_held_out_run(runs, monkeypatch, by):
    """Each fold's stage 1 fits on every run of the other GPUs / engines and on none of the held-out
    one, its stage 2 on a sample of the same; the held-out engine is predicted with factor 1."""
    seen = {"ttft": [], "eff": []}
    stage1, stage2 = cal.fit_ttft_terms, cal.fit_calibration

    def spy1(rs, *a, **k):
        seen["ttft"].append(list(rs))
        return stage1(rs, *a, **k)

    def spy2(rs, *a, **k):
        seen["eff"].append(list(rs))
        return stage2(rs, *a, **{**k, "max_nfev": 1})

    monkeypatch.setattr(cal, "fit_ttft_terms", spy1)
    monkeypatch.setattr(cal, "fit_calibration", spy2)
    rs = _varied(runs)
    v = "sglang" if by == "engine" else "b200"
    tab, fold = cal._fold(rs, by, v, 1, 0, {"max_nfev": 1, "published": ()}, two_stage=True)
    others = [r for r in rs if getattr(r, by) != v]
    assert len(seen["ttft"]) == 2 and all(got == others for got in seen["ttft"])  # stage 1, stage 2, stage 1
    assert len(seen["eff"]) == 1 and all(getattr(r, by) != v for r in seen["eff"][0])
    assert len(tab) == sum(getattr(r, by) == v for r in rs) and set(tab[by]) == {v}
    if by == "engine":
        base = cal.settings_from(fold["params"], {k: p for k, p in fold["kv_precision"].items() if k != v})
        base = dataclasses.replace(base, engine_ttft_factor={**base.engine_ttft_factor, v: 1.0})
        want = [cal.steady_state_run(r, base)["ttft_s"] for r in rs if r.engine == v]
        assert fold["params"]["ttft_factor_sglang"] == 1.0  # never fitted: not in the fold's runs
        assert np.allclose(tab["predicted_ttft_s"].to_numpy(), want, rtol=1e-12)


def test_two_stage_calibrate_records_its_stages(runs):
    rep = cal.calibrate(_varied(runs), per_group=1, max_nfev=1, cv=False, two_stage=True, alternations=2)
    prov = rep["provenance"]
    assert prov["two_stage"] is True and prov["alternations"] == 2 and prov["ttft_rows"] == 32
    assert prov["joint_first"] is False
    assert set(rep["fit"]["std_error"]) == set(cal.CALIBRATION_PARAMETERS)
    assert all(math.isfinite(v) and v >= 0 for v in rep["fit"]["std_error"].values())
    assert rep["fit"]["train_rows"] == len(cal.training_sample(_varied(runs), 1, 0))
    assert cal.calibrate(runs.runs, per_group=1, max_nfev=1, cv=False, fixed=["client_request_share"])[
        "provenance"]["two_stage"] is False


def test_joint_first_starts_from_the_joint_fit(runs, monkeypatch):
    """joint_first: the joint fit of every free parameter on the sample, then stage 1 on every run;
    with no alternation the efficiencies are the joint fit's and the TTFT terms stage 1's."""
    calls = []
    stage2 = cal.fit_calibration

    def spy(rs, *a, **k):
        calls.append(list(k.get("free") or cal.CALIBRATION_PARAMETERS))
        return stage2(rs, *a, **k)

    monkeypatch.setattr(cal, "fit_calibration", spy)
    rs = _varied(runs)
    fit = cal.fit_two_stage(rs, per_group=1, alternations=0, joint_first=True, max_nfev=1, published=())
    assert calls == [list(cal.CALIBRATION_PARAMETERS)]
    joint = stage2(cal.training_sample(rs, 1, 0), max_nfev=1, published=())
    assert all(fit.params[k] == joint.params[k] for k in cal.EFFICIENCY_TERMS)
    stage1 = cal.fit_ttft_terms(rs, joint.settings)
    assert all(fit.params[k] == pytest.approx(stage1.params[k], rel=1e-9) for k in cal.TTFT_TERMS)
