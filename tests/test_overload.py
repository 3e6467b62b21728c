"""Issue 11: request classes, SLO-aware admission, reserved interactive capacity, the gated batch
cap and the overload study."""

import dataclasses
import json
import math

import numpy as np
import pandas as pd
import pytest

from conftest import poisson_trace, run_study_without_traces
from tokenfactory import ConfigError
from tokenfactory.core.classes import DEFAULT_CLASSES
from tokenfactory.controllers import (
    MarginLoopConfig,
    SLOAdmissionConfig,
    SLOAwareAdmission,
    tune_slo_admission,
)
from tokenfactory.controllers.slo_admission import MISS_ERROR_FLOOR
from tokenfactory.plant_models import ClusterConfig, simulate
from tokenfactory.registry import build_admission
from tokenfactory.replay import build_replay, class_outputs, replay_scenario_from_dict, run_replay
from tokenfactory.core.signals import ADMIT, DEFER_REASONS, REJECT_REASONS, Arrival, Measurement, ReserveAction


def classed_trace(rate_interactive, rate_batch, duration, seed=5, inp=3000, out_mean=150):
    """Poisson interactive and batch streams (seeded) on one clock."""
    parts = []
    for k, (name, rate) in enumerate((("interactive", rate_interactive), ("batch", rate_batch))):
        if rate > 0:
            t = poisson_trace(rate, duration, seed + k, inp=inp, out_mean=out_mean)
            t["request_class"] = name
            parts.append(t)
    return pd.concat(parts).sort_values("arrival_s", kind="stable").reset_index(drop=True)


@pytest.fixture(scope="module")
def setup():
    return build_replay(classed_trace(1.0, 1.0, 60.0))


CLUSTER = {"drain_s": 60.0, "progress": False, "classes": DEFAULT_CLASSES}


# -- conservation, deferral and rejection reasons -------------------------------------------


@pytest.fixture(scope="module")
def overloaded(setup):
    cap = setup.slo_capacity(0.1)[0]
    tr = classed_trace(0.8 * cap, 1.5 * cap, 60.0)
    return run_replay(tr, setup, "slo-aware", cluster=CLUSTER, batch_cap="static")


def test_conservation_with_classes_and_reasons(overloaded):
    m, res = overloaded
    rec = res.records
    assert m["requests"] == len(rec) == m["completed"] + m["rejected"] + m["in_flight_end"]
    assert m["rejected"] > 0 and m["deferred"] > 0  # the gate acted at 2.3x capacity
    # every rejection and deferral carries a known reason, and the reason counts add up
    assert sum(m["rejected_by_reason"].values()) == m["rejected"]
    assert sum(m["deferred_by_reason"].values()) == m["deferred"]
    assert set(rec.loc[rec["state"] == "rejected", "reject_reason"]) <= set(REJECT_REASONS)
    # per class: the classes partition the requests and each is conserved
    cls = m["classes"]
    assert set(cls) == {"interactive", "batch"}
    assert sum(c["requests"] for c in cls.values()) == m["requests"]
    for c in cls.values():
        assert c["requests"] == c["completed"] + c["rejected"] + c["in_flight_end"]
    # only the deferrable class is deferred; rejected requests spent no prefill
    assert cls["interactive"]["deferred"] == 0 and cls["batch"]["deferred"] > 0
    assert rec.loc[rec["state"] == "rejected", "filled_tokens"].sum() == 0
    assert set(m["deferred_by_reason"]) <= set(DEFER_REASONS)


def test_admitted_requests_mostly_meet_their_slo(overloaded):
    m, _ = overloaded
    # measured 0.98-1.0 on this seeded case; the target is 0.99 (see the study)
    assert m["slo_attainment_admitted"] >= 0.95
    assert m["goodput_tokens_per_s"] > 0 and 0.0 <= m["slo_attainment"] <= 1.0


# -- the TTFT predictor against the simulator ----------------------------------------------


def _predicted_vs_measured_ttft(ctrl, tr, setup, measurement_delay_s):
    """Admit every arrival of ``tr`` through ``ctrl`` on 2 fill + 1 decode workers, recording the
    TTFT it predicts at each arrival: (arrivals predicted, prediction - measured TTFT, mean
    measured TTFT) over the requests that got a first token (at least 99 % of them)."""
    preds = []

    def decide(t, a):
        if ctrl.m is not None:
            preds.append((a.arrived_s, ctrl.predict(t, a)[0]))
        ctrl._admitted(t, a)
        return ADMIT

    ctrl.decide = decide
    cl = ClusterConfig.from_dict({"fill_workers": 2, "decode_workers": 1, "seed": 0, "drain_s": 60.0,
                                  "measurement_delay_s": measurement_delay_s, "progress": False})
    res = simulate(tr, setup.params, cl, ctrl)
    p = np.array(preds)
    measured = res.records.set_index("arrival_s").loc[p[:, 0], "ttft_s"].to_numpy()
    ok = np.isfinite(measured)
    assert ok.mean() > 0.99
    return len(p), p[ok, 1] - measured[ok], measured[ok].mean()


def test_ttft_predictor_against_the_simulator(setup):
    """Poisson arrivals of one shape at 0.8 x the fill pool's capacity (an M/D/c-like fill queue);
    every request admitted; the predicted TTFT at each arrival against the simulator's.

    Bound: the prediction counts one whole step for the step in progress, while the measured
    residual is between 0 and one step, so per request the error is within about one fill step;
    the mean within 15 %."""
    # the replay set up for this shape (capacity is per request of this shape), 2 fill workers
    setup = build_replay(classed_trace(1.0, 0.0, 60.0, seed=3, inp=4096, out_mean=200),
                         {"fill_workers": 2, "decode_workers": 1})
    rate = 0.8 * setup.plant.fill_capacity
    tr = classed_trace(rate, 0.0, 60.0, seed=3, inp=4096, out_mean=200)
    ctx = setup.context(2.0, 0.1, rate_rps=rate, class_outputs=class_outputs(tr))
    ctrl = build_admission("slo-aware", ctx, {"batch_gate": False})
    n, err, mean_ttft = _predicted_vs_measured_ttft(ctrl, tr, setup, setup.plant.params.measurement_delay_s)
    assert n > 1000
    assert abs(err.mean()) <= 0.15 * mean_ttft
    assert np.percentile(np.abs(err), 90) <= 1.1 * ctrl.fill_step_s


def test_ttft_predictor_with_the_requests_own_fill_on_mixed_prompts():
    """Prompts of 1k-30k tokens (long ones' chunks attend over their growing context) at 0.6 x
    the fill pool's capacity from the requests' own costs, every request admitted: the predictor
    with each request's own chunked fill from the service model against the simulator's TTFT,
    and against the same predictor with one full step per chunk.

    Measured on this seeded case: mean error -0.27 s on a mean TTFT of 2.45 s (-11 %; one step per
    chunk: -0.51 s), 90th percentile of |error| 1.56 s (2.07 s). Bound: mean within 15 % and the
    90th percentile below the per-chunk predictor's (steps shared with a long prompt's chunk wait
    for its attention, which neither predictor sees - the spread that remains)."""
    from tokenfactory.replay import service_capacity

    def mixed(rate, prompt_seed):
        t = poisson_trace(rate, 120.0, 4, inp=4096, out_mean=200)
        t["input_tokens"] = np.random.default_rng(prompt_seed).choice([1000, 4000, 12000, 30000], len(t),
                                                                      p=[0.4, 0.3, 0.2, 0.1])
        t["request_class"] = "interactive"
        return t

    setup = build_replay(mixed(1.0, 4), {"fill_workers": 2, "decode_workers": 1})
    rate = 0.6 * service_capacity(setup.costs, setup.params, 2, 1, 50)["fill"]
    tr = mixed(rate, 5)
    errors = {}
    for own_fill in (True, False):
        ctx = setup.context(2.0, 0.1, rate_rps=rate, class_outputs=class_outputs(tr))
        ctrl = build_admission("slo-aware", ctx, {"batch_gate": False})
        assert ctrl.fill_time_s is not None  # the registry hands it the service model's per-request fill
        if not own_fill:
            ctrl.fill_time_s = None
        n, err, mean_ttft = _predicted_vs_measured_ttft(ctrl, tr, setup, 0.5)
        assert n > 500
        errors[own_fill] = (err, mean_ttft)
    err, mean_ttft = errors[True]
    assert abs(err.mean()) <= 0.15 * mean_ttft
    assert np.percentile(np.abs(err), 90) < np.percentile(np.abs(errors[False][0]), 90)
    assert abs(err.mean()) < abs(errors[False][0].mean())


# -- reserved interactive capacity under a batch flood ----------------------------------------


def test_slo_aware_holds_interactive_latency_under_a_batch_flood(setup):
    cap = setup.slo_capacity(0.1)[0]
    out = {}
    for flood in (False, True):
        tr = classed_trace(0.5 * cap, 2.0 * cap if flood else 0.0, 60.0)
        for policy in ("open", "slo-aware"):
            m, res = run_replay(tr, setup, policy, cluster=CLUSTER, batch_cap="static")
            out[(flood, policy)] = (m, res)
    calm = out[(False, "slo-aware")][0]["classes"]["interactive"]
    m_new, res_new = out[(True, "slo-aware")]
    flood_new, flood_open = m_new["classes"]["interactive"], out[(True, "open")][0]["classes"]["interactive"]
    # the controller reserves a share of each fill step for the interactive class
    reserve = res_new.actions[res_new.actions["kind"] == "reserve"]
    assert len(reserve) and reserve["fill_share"].max() > 0
    # batch work floods at 2x capacity: the gate turns batch work away, interactive work keeps its
    # SLO and its TTFT moves little (the target is 10 %; the study reports its own). This
    # seeded one-minute case measures 0.986 (0.993 open admission with the priority queues, at the
    # setup's static cap; 0.956 for both at the flood trace's own cap before issue 27): its misses
    # are TPOT (admitted batch sequences share the decode passes at the static slot limit), not TTFT
    assert m_new["classes"]["batch"]["rejected"] + m_new["classes"]["batch"]["deferred"] > 0
    n = flood_new["requests"]
    assert flood_new["slo_attainment"] >= max(0.95, flood_open["slo_attainment"] - 1.0 / n)
    assert flood_new["ttft_p99"] <= flood_open["ttft_p99"]
    assert flood_new["ttft_p99"] <= 1.5 * calm["ttft_p99"]


class HoldReserve:
    """Holds a fixed share of each fill step for the interactive class."""

    sample_period = 0.25

    def __init__(self, share):
        self.share = share

    def reset(self):
        pass

    def update(self, t, m):
        return [ReserveAction(self.share, 0.0, "interactive")]


def test_reserved_fill_share_shortens_interactive_waits_under_a_prefill_flood(setup):
    """Long batch prompts at 1.5 x the fill pool's token rate, interactive ones at 0.3 x: the
    share of each step held for interactive work (not lent to batch work) cuts its TTFT p99
    (measured 0.36 s without, 0.29 s with half of each step held, 0.24 s with no flood)."""
    tok_rate = setup.plant.fill_capacity * setup.shape.prompt_tokens
    a = classed_trace(0.3 * tok_rate / 3000, 0.0, 60.0, inp=3000, out_mean=50)
    b = poisson_trace(1.5 * tok_rate / 16000, 60.0, 9, inp=16000, out_mean=5)
    b["request_class"] = "batch"
    tr = pd.concat([a, b]).sort_values("arrival_s", kind="stable").reset_index(drop=True)
    cl = ClusterConfig.from_dict({"fill_workers": 2, "decode_workers": 1, "seed": 0, "drain_s": 60.0,
                                  "progress": False, "classes": DEFAULT_CLASSES,
                                  "measurement_delay_s": setup.plant.params.measurement_delay_s})
    p99 = {}
    for share in (0.0, 0.5):
        res = simulate(tr, setup.params, cl, None, [HoldReserve(share)])
        assert res.metrics["requests"] == res.metrics["completed"] + res.metrics["rejected"] + \
            res.metrics["in_flight_end"]
        p99[share] = res.metrics["classes"]["interactive"]["ttft_p99"]
    assert p99[0.5] < 0.9 * p99[0.0]


# -- the gated batch cap ----------------------------------------------------------------------


def test_gate_before_after_oscillation_verdict(setup):
    """Section 18's large-batch recovery in the fluid plant: the cap corrected every sample with
    gain 1 oscillates; gated (held until observed, SIMC gain) it does not."""
    from tokenfactory.studies.overload import gate_before_after_fluid

    fp = setup.plant.params
    r = gate_before_after_fluid(fp, 2, 1, 0.1, 240.0)
    assert r["ungated"]["verdict"]["oscillating"]
    assert not r["gated"]["verdict"]["oscillating"]
    assert r["gated"]["cap_max"] - r["gated"]["cap_min"] < r["ungated"]["cap_max"] - r["ungated"]["cap_min"]


# -- the SLO-aware admission's loop ---------------------------------------------------------


def test_slo_admission_loops_meet_the_floors_over_the_envelope():
    t = tune_slo_admission(1.0, 2.5, 0.25)
    for loop in ("fill", "decode"):
        assert t[loop].envelope_ok and t[loop].limit_cycle is None
        assert all(r["stable"] and r["gain_margin"] >= 2 and abs(r["phase_margin_deg"]) >= 45
                   for r in t[loop].envelope)
    # the decode loop sees the longer delay, so it is tuned slower
    assert t["decode"].ki < t["fill"].ki


def test_slo_admission_rejects_and_defers_with_reasons():
    ctrl = SLOAwareAdmission(SLOAdmissionConfig(fill_token_rate=20000, fill_step_s=0.1, kv_transfer_s=0.05,
                                                decode_pass_s=0.08, prompt_tokens=2000, output_tokens=200,
                                                sample_period=0.25, decode_slots=100))
    # nothing measured yet: predicted on the prior (an empty plant of the configured pools)
    assert ctrl.decide(0.0, Arrival("interactive", 2000, 0, 200, 0.0)) == ADMIT
    m = Measurement(time_s=1.0, backlog=0, fill_in_progress=40, ready=0, active_decodes=10, completion_rate=1,
                    admitted_rate=1, decode_slots=100, fill_capacity=10, fill_workers=1, decode_workers=1,
                    fill_queued_tokens=800000.0, fill_token_capacity=20000.0, decode_pass_s=0.05)
    ctrl.update(1.0, m)
    # 40 s of fill work ahead: an interactive request (TTFT SLO 2 s) is rejected, a batch one (30 s)
    # deferred
    d_i = ctrl.decide(1.0, Arrival("interactive", 2000, 0, 200, 1.0))
    d_b = ctrl.decide(1.0, Arrival("batch", 2000, 0, 200, 1.0))
    assert d_i.verdict == "reject" and d_i.reason == "predicted_slo_violation"
    assert d_b.verdict == "defer" and d_b.reason in DEFER_REASONS + REJECT_REASONS
    # past its deferral deadline the batch request is rejected
    assert ctrl.decide(100.0, Arrival("batch", 2000, 0, 200, 1.0)).verdict == "reject"
    with pytest.raises(ConfigError, match="slo_aware.ttft_fraction"):
        SLOAwareAdmission(fill_token_rate=1, fill_step_s=0.1, kv_transfer_s=0, decode_pass_s=0.08,
                          prompt_tokens=1, output_tokens=2, ttft_fraction=1.5)
    with pytest.raises(ConfigError, match="slo_aware.fill_step_s"):
        SLOAwareAdmission(SLOAdmissionConfig(1, 0.1, 0, 0.08, 1, 2), fill_step_s=0.2)
    with pytest.raises(ConfigError, match="slo_aware.outer.quantile"):
        MarginLoopConfig(quantile=0.9)


def _gate(**kw):
    cfg = dict(fill_token_rate=20000, fill_step_s=0.1, kv_transfer_s=0.05, decode_pass_s=0.08, prompt_tokens=2000,
               output_tokens=200, decode_slots=64)
    cfg.update(kw)
    return SLOAwareAdmission(SLOAdmissionConfig(**cfg))


def test_no_fail_open_a_flood_before_the_first_sample_is_refused_with_reasons():
    """Issue 21 item 4: every arrival is decided from t = 0 on the prior sample plus the ledger, so
    a flood before the first measurement is admitted only up to what the SLO allows, the rest
    refused with a reason; a gate that does not know its decode slots starts closed."""
    ctrl = _gate()
    verdicts = [ctrl.decide(1e-4 * i, Arrival("interactive", 2000, 0, 200, 1e-4 * i)) for i in range(500)]
    admitted = sum(v.verdict == "admit" for v in verdicts)
    # 2 s of TTFT at 20,000 tokens/s is about 20 prompts of 2,000 tokens
    assert 5 <= admitted <= 25
    assert {v.reason for v in verdicts if v.verdict != "admit"} <= {"predicted_slo_violation", "decode_overloaded"}
    closed = _gate(decode_slots=0.0)
    d = closed.decide(0.0, Arrival("interactive", 2000, 0, 200, 0.0))
    assert d.verdict == "reject" and d.reason == "decode_overloaded"


def test_no_fail_open_on_the_small_plant_flood(tmp_path):
    """The small-plant case at ``--scale 1000000``: all 2,000 requests arrive before the first
    sample; they are decided one by one, most refused with a reason, the admitted ones meet their
    SLO, nothing is lost (it admitted all of them and met the SLO for 0.057 before)."""
    import shutil
    from pathlib import Path

    from tokenfactory.cli import main

    case = Path(__file__).parent / "data" / "small_plant"   # a copy of ../shared/cases/small-plant
    for f in ("sim.toml", "model.toml", "requests.csv"):
        shutil.copy(case / f, tmp_path / f)
    import os

    cwd = os.getcwd()
    os.chdir(tmp_path)  # the case's paths are relative to its folder
    try:
        assert main(["simulate", "--scenario", "sim.toml", "--trace", "requests.csv", "--scale", "1000000", "--seed",
                     "1", "--no-progress", "--out", "out"]) == 0
    finally:
        os.chdir(cwd)
    m = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert m["requests"] == 2000 and m["requests"] == m["completed"] + m["rejected"] + m["in_flight_end"]
    assert m["rejected"] >= 1500 and m["in_flight_end"] == 0
    assert sum(m["rejected_by_reason"].values()) == m["rejected"]
    assert m["slo_attainment_admitted"] >= 0.99


def test_outer_loop_relaxes_on_measured_slack_and_tightens_on_misses():
    """The margin moves only while the gate refuses (relax) or when admitted requests miss
    (tighten): slack and refusals relax it, misses tighten it, slack without refusals leaves it."""
    ctrl = _gate(outer=MarginLoopConfig(sample_period_s=1.0, ki=0.05, min_samples=20))
    m = Measurement(time_s=0.0, backlog=0, fill_in_progress=0, ready=0, active_decodes=0, completion_rate=0,
                    admitted_rate=0, decode_slots=64, fill_capacity=10, fill_workers=1, decode_workers=1,
                    fill_queued_tokens=0.0, fill_token_capacity=20000.0)
    ctrl.observe(0.5, [("interactive", 0.5, 0.04)] * 50)  # slack 0.5 of the TTFT/TPOT SLO
    ctrl.update(1.0, m)
    assert ctrl.margin["interactive"] == 0.0  # nothing refused: no windup
    ctrl.refused_class["interactive"] = 3
    ctrl.update(2.0, m)
    relaxed = ctrl.margin["interactive"]
    assert relaxed > 0.0
    share, z, _ = ctrl._knobs("interactive")
    assert share > ctrl.ttft_fraction and z < ctrl.completion_z
    ctrl.observe(2.5, [("interactive", 3.0, 0.2)] * 400)  # every admitted request misses
    ctrl.update(3.0, m)
    assert ctrl.margin["interactive"] < relaxed
    for _ in range(100):
        ctrl.update(ctrl.outer_last_s + 1.0, m)
    assert ctrl.margin["interactive"] == -1.0  # clamped
    assert ctrl.outer_log and "interactive:margin" in ctrl.outer_log[-1]


def test_outer_loop_integrates_the_miss_share_in_budget_units():
    """The outer loop seeks goodput: r += ki T (setpoint q - y) / q with y the admitted misses'
    share over the window - a class meeting its SLO relaxes at setpoint budget units while the
    gate refuses, or refused since the window's oldest outcome was admitted; misses above the
    setpoint tighten it in proportion. (The old signal, the 1 % slack quantile held at 0, moved
    by that quantile's value: 0.03 here, 27 x slower.)"""
    o = MarginLoopConfig(sample_period_s=1.0, ki=0.01, min_samples=20, window=200)
    ctrl = _gate(outer=o)
    m = Measurement(time_s=0.0, backlog=0, fill_in_progress=0, ready=0, active_decodes=0, completion_rate=0,
                    admitted_rate=0, decode_slots=64, fill_capacity=10, fill_workers=1, decode_workers=1,
                    fill_queued_tokens=0.0, fill_token_capacity=20000.0)
    ctrl.decide(0.5, Arrival("interactive", 2_000_000, 0, 200, 0.5))  # refused (its own fill misses the SLO)
    ctrl.refused_class["interactive"] = 1
    ctrl.last_refused_s["interactive"] = 0.5
    ctrl.observe(0.9, [("interactive", 1.94, 0.097)] * 200)  # every one met, slack 0.03
    ctrl.update(1.0, m)
    step = o.ki * 1.0 * o.miss_setpoint
    assert ctrl.margin["interactive"] == pytest.approx(step, rel=1e-9)
    # no refusal this period, but one since the window's oldest outcome was admitted: still binding
    ctrl.update(2.0, m)
    assert ctrl.margin["interactive"] == pytest.approx(2 * step, rel=1e-9)
    # a window admitted after the last refusal: nothing binds, no windup
    ctrl.observe(50.0, [("interactive", 1.0, 0.05)] * 200)
    ctrl.update(51.0, m)
    assert ctrl.margin["interactive"] == pytest.approx(2 * step, rel=1e-9)
    # 2.5 % of the window missed: y = 0.025, e = (0.8 x 0.01 - 0.025) / 0.01 = -1.7 budget units
    ctrl.observe(51.5, [("interactive", 3.0, 0.05)] * 5 + [("interactive", 1.0, 0.05)] * 195)
    ctrl.update(52.0, m)
    r = 2 * step - o.ki * 1.7
    assert ctrl.margin["interactive"] == pytest.approx(r, rel=1e-6)
    assert ctrl.outer_log[-1]["interactive:miss_share"] == pytest.approx(0.025)
    # a burst: 20 % missed is -19.2 budgets, clipped at the floor (a saturation only slows the loop)
    ctrl.observe(52.5, [("interactive", 3.0, 0.05)] * 40 + [("interactive", 1.0, 0.05)] * 160)
    ctrl.update(53.0, m)
    assert ctrl.margin["interactive"] == pytest.approx(r + o.ki * MISS_ERROR_FLOOR, rel=1e-6)
    summary = ctrl.params()["outer_margin"]["interactive"]
    assert summary["final"] == ctrl.margin["interactive"] and summary["max"] == pytest.approx(2 * step)
    with pytest.raises(ConfigError, match="slo_aware.outer.miss_setpoint"):
        MarginLoopConfig(miss_setpoint=0.0)


def test_outer_loop_schedules_a_faster_start_on_windows_without_misses():
    """Issue 21: the outer loop's start. A full window with no miss in it (the flat region below the
    knee) integrates the top class's margin at ``ki_flat``; a window with a miss at ``ki``; the
    first window over the setpoint ends the start (a later missless window integrates at ``ki``
    again); a lower class always integrates at ``ki`` (its relaxation spends the top class's
    latency). The old rule integrated at ``ki`` everywhere (0.008 per second here where this moves
    0.08)."""
    o = MarginLoopConfig(sample_period_s=1.0, ki=0.01, ki_flat=0.1, min_samples=20, window=200)
    ctrl = _gate(outer=o)
    m = Measurement(time_s=0.0, backlog=0, fill_in_progress=0, ready=0, active_decodes=0, completion_rate=0,
                    admitted_rate=0, decode_slots=64, fill_capacity=10, fill_workers=1, decode_workers=1,
                    fill_queued_tokens=0.0, fill_token_capacity=20000.0)
    met, missed = ("interactive", 1.0, 0.05), ("interactive", 3.0, 0.05)
    for n in ctrl.classes:
        ctrl.refused_class[n] = 1
        ctrl.last_refused_s[n] = 1e9  # binding throughout
    ctrl.observe(0.5, [met] * 200)
    ctrl.observe(0.5, [("batch", 10.0, 0.05)] * 200)
    ctrl.update(1.0, m)
    flat = o.ki_flat * o.miss_setpoint
    assert ctrl.margin["interactive"] == pytest.approx(flat, rel=1e-9)
    step = o.ki * o.miss_setpoint
    assert ctrl.margin["batch"] == pytest.approx(step, rel=1e-9)  # a lower class: ki
    # one miss in the window: e = (0.008 - 0.005) / 0.01 = 0.3 at ki
    ctrl.observe(1.5, [missed] + [met] * 199)
    ctrl.update(2.0, m)
    assert ctrl.margin["interactive"] == pytest.approx(flat + o.ki * 0.3, rel=1e-6)
    assert ctrl.margin["batch"] == pytest.approx(2 * step, rel=1e-6)
    # the knee: 2 % missed tightens at ki and ends the start, so a missless window relaxes at ki
    r = ctrl.margin["interactive"]
    ctrl.observe(2.5, [missed] * 4 + [met] * 196)
    ctrl.update(3.0, m)
    assert ctrl.margin["interactive"] == pytest.approx(r - o.ki * 1.2, rel=1e-6)
    r = ctrl.margin["interactive"]
    ctrl.observe(3.5, [met] * 200)
    ctrl.update(4.0, m)
    assert ctrl.margin["interactive"] == pytest.approx(r + o.ki * o.miss_setpoint, rel=1e-6)
    assert MarginLoopConfig(ki=0.01).ki_scheduled == 0.01  # no ki_flat: no scheduling
    with pytest.raises(ConfigError, match="slo_aware.outer.ki_flat"):
        MarginLoopConfig(ki=0.01, ki_flat=0.005)


def test_flat_region_gain_is_certified_and_capped_by_the_start_overshoot(setup):
    """The scheduled gain: SIMC at the flat region's gain (FLAT_MARGIN_GAIN) over the delay x gain
    envelope, capped so that over theta + half a sample it moves the margin by at most
    FLAT_OVERSHOOT; its margins meet the floors there and it stays separated from the fast gate.
    The registry gives it to the recommended gate."""
    from tokenfactory.controllers import (FLAT_MARGIN_GAIN, FLAT_OVERSHOOT, margin_separation, tune_flat_margin_gain,
                                          tune_margin_loop)
    from tokenfactory.registry import flat_margin_tuning, margin_tuning, slo_admission_tuning

    nominal = tune_margin_loop(35.0, 245.0)
    f = tune_flat_margin_gain(nominal.ki, 35.0, 245.0, sample_period_s=5.0)
    simc = tune_margin_loop(35.0, 245.0, gain=FLAT_MARGIN_GAIN)
    cap = FLAT_OVERSHOOT / (0.8 * (35.0 + 2.5))
    assert f.ki == pytest.approx(max(min(simc.ki, cap), nominal.ki))
    assert nominal.ki < f.ki <= cap * (1 + 1e-12)
    d = f.to_dict()
    assert f.envelope_ok and d["worst_gm"] >= 2.0 and d["worst_pm_deg"] >= 45.0 and f.gain == FLAT_MARGIN_GAIN
    # a short delay: the cap does not bind, SIMC's ki at the flat gain is K / K_flat x the nominal one
    short = tune_flat_margin_gain(1e-6, 1.0, 2.0, sample_period_s=0.1, overshoot=1.0)
    assert short.ki == pytest.approx(tune_margin_loop(1.0, 2.0, gain=FLAT_MARGIN_GAIN).ki)
    ctx = setup.context(classes=DEFAULT_CLASSES, class_outputs=class_outputs(setup.trace), rate_rps=2.0)
    ctrl = build_admission("slo-aware", ctx)
    ft = flat_margin_tuning(ctx, ctrl.outer, ctrl.outcome_delay_s, ctrl.outer.ki)
    assert ctrl.outer.ki_flat == pytest.approx(ft.ki) and ctrl.outer.ki_flat > ctrl.outer.ki and ft.envelope_ok
    assert ft.ki == pytest.approx(tune_flat_margin_gain(ctrl.outer.ki, margin_tuning(ctx, ctrl.outer,
                                                                                    ctrl.outcome_delay_s).theta_s,
                                                        ft.window_s, sample_period_s=ctrl.outer.sample_period_s).ki)
    sep = margin_separation(ft, slo_admission_tuning(ctrl, setup.plant.params.measurement_delay_s)["fill"])
    assert sep.ratio >= 5.0 and sep.real.stable
    with pytest.raises(ConfigError, match="outer.overshoot"):
        tune_flat_margin_gain(0.001, 35.0, 245.0, overshoot=0.0)


def test_outer_loop_past_the_model_discounts_the_queue_prediction_while_outcomes_allow():
    """Issue 21: the margin may pass r = 1 (the model's expectation) up to ``margin_max`` = 2,
    where the TTFT check counts (2 - r) of the predicted fill-queue wait. A measured queue of 1.5 s
    (30,000 tokens at 20,000 tokens/s) over the top class's fill limit of 0.85 s: while every
    admitted request meets its SLO and the gate refuses, the margin climbs; stopped at 1 (the old
    rule) the gate refuses every such arrival for ever, past 1 it admits once 1.5 (2 - r) <= 0.85,
    and misses bring it back below 1, refusing again. The own fill is still a hard limit."""
    m0 = Measurement(time_s=0.0, backlog=0, fill_in_progress=0, ready=0, active_decodes=0, completion_rate=0,
                     admitted_rate=0, decode_slots=64, fill_capacity=10, fill_workers=1, decode_workers=1,
                     fill_queued_tokens=30000.0, fill_token_capacity=20000.0)

    def run(margin_max):
        ctrl = _gate(fill_ki=0.0, outer=MarginLoopConfig(sample_period_s=1.0, ki=0.05, min_samples=20,
                                                         margin_max=margin_max))
        ctrl.observe(0.0, [("interactive", 0.5, 0.04)] * 200)  # every admitted request met its SLO
        verdicts = []
        for k in range(1, 61):
            t = float(k)
            ctrl.update(t, dataclasses.replace(m0, time_s=t))
            ctrl.ledger.clear()  # the queue stays as measured (nothing admitted joins it here)
            ctrl.led_tokens = {n: 0.0 for n in ctrl.classes}
            ctrl.led_count = {n: 0 for n in ctrl.classes}
            verdicts.append(ctrl.decide(t, Arrival("interactive", 2000, 0, 200, t)).verdict)
        return ctrl, verdicts

    old, v_old = run(1.0)
    assert old.margin["interactive"] == 1.0 and set(v_old) == {"reject"}
    new, v_new = run(2.0)
    assert new.margin["interactive"] > 1.4
    assert new.queue_weight("interactive") == pytest.approx(2.0 - new.margin["interactive"])
    assert v_new[-1] == "admit" and v_new[0] == "reject"
    # the own fill stays a hard limit at any margin (2,000,000 tokens: 100 s alone)
    assert new.decide(61.0, Arrival("interactive", 2_000_000, 0, 200, 61.0)).verdict == "reject"
    # misses: back below 1, refusing again
    new.observe(61.0, [("interactive", 3.0, 0.2)] * 200)
    for k in range(62, 80):
        new.update(float(k), dataclasses.replace(m0, time_s=float(k)))
    assert new.margin["interactive"] < 1.0
    assert new.decide(79.0, Arrival("interactive", 2000, 0, 200, 79.0)).verdict == "reject"
    with pytest.raises(ConfigError, match="slo_aware.outer.margin_max"):
        MarginLoopConfig(margin_max=2.5)
    with pytest.raises(ConfigError, match="slo_aware.outer.initial_margin"):
        MarginLoopConfig(initial_margin=1.5, margin_max=1.0)


def test_gate_rejects_little_below_the_measured_capacity():
    """Issue 21: at 0.9 x the capacity measured under open admission the gate should reject
    (almost) nothing and keep its admitted requests within their SLO. Seeded Poisson classes
    (interactive 4 : batch 1, 3,000-token prompts, outputs 30 + geometric of mean 120), 300 s at
    0.9 x the measured capacity (9.36 req/s): the old outer loop (1 % slack quantile held at 0)
    rejected 3.61 % (57 of 1,578) with batch admitted at 0.985; the miss-share loop 2.03 % (32),
    interactive admitted at 1.000 (r = 0.05 after 300 s), batch 0.986 (73 completions: one miss is 1.4 %).
    Bound 2.5 %: the loop starts at r = 0 and relaxes over the run, so a longer run rejects less."""
    parts = []
    for k, (name, rate) in enumerate((("interactive", 4.0), ("batch", 1.0))):
        rng = np.random.default_rng(5 + k)
        t = np.cumsum(rng.exponential(1 / rate, int(rate * 300.0 * 1.2) + 10))
        t = t[t < 300.0]
        parts.append(pd.DataFrame({"arrival_s": t, "input_tokens": 3000, "cached_tokens": 0,
                                   "output_tokens": 30 + rng.geometric(1 / 120, len(t)), "request_class": name}))
    tr = pd.concat(parts).sort_values("arrival_s", kind="stable").reset_index(drop=True)
    s = build_replay(tr)
    cl = {"seed": 0, "classes": DEFAULT_CLASSES, "progress": False, "drain_s": 60.0}
    m, _ = run_replay(tr, s, "slo-aware", cluster=cl, load=0.9, capacity="measured")
    assert m["requests"] == m["completed"] + m["rejected"] + m["in_flight_end"]
    assert m["rejected"] <= 0.025 * m["requests"]
    assert m["classes"]["interactive"]["slo_attainment_admitted"] >= 0.99
    assert m["classes"]["batch"]["slo_attainment_admitted"] >= 0.98


def test_outer_loop_is_certified_and_separated_from_the_fast_gate(setup):
    """The outer loop's SIMC tuning meets GM >= 2 and PM >= 45 deg over delay x 0.5-2 and gain x
    0.25-4, and crosses over well below the fast gate's closed-loop bandwidth (>= 5 x, the stack
    certificate's floor), staying stable with the fast gate in series."""
    from tokenfactory.controllers import margin_separation, tune_margin_loop
    from tokenfactory.registry import margin_tuning, slo_admission_tuning

    t = tune_margin_loop(40.0, 60.0)
    assert t.envelope_ok and t.to_dict()["worst_gm"] >= 2.0 and t.to_dict()["worst_pm_deg"] >= 45.0
    ctx = setup.context(classes=DEFAULT_CLASSES, class_outputs=class_outputs(setup.trace), rate_rps=2.0)
    ctrl = build_admission("slo-aware", ctx)
    ot = margin_tuning(ctx, ctrl.outer, ctrl.outcome_delay_s)
    assert ctrl.outer.ki == pytest.approx(ot.ki) and ot.envelope_ok
    sep = margin_separation(ot, slo_admission_tuning(ctrl, setup.plant.params.measurement_delay_s)["fill"])
    assert sep.ratio >= 5.0 and sep.real.stable and sep.pm_loss_deg < 5.0


# -- scenario files for simulate --------------------------------------------------------------


def test_replay_scenario_rejects_unknown_fields_by_name():
    for bad, field in (({"cluster": {"slo_ttft": 2}}, "slo_ttft"), ({"simulation": {"loadx": 1}}, "loadx"),
                       ({"controller": {"kind": "slo-aware", "bogus": 1}}, "bogus"),
                       ({"plant": {"prompt_tokens": 100}}, "plant.prompt_tokens"),
                       ({"simulation": {"demand_factor": 2}}, "simulation.demand_factor"),
                       ({"extra": {}}, "extra")):
        with pytest.raises(ConfigError, match=field):
            replay_scenario_from_dict(bad)


def test_scenario_fields_reach_the_simulation(tmp_path):
    """A changed field changes the result: the SLO (attainment), the cluster size (completions)
    and the load (requests), through ``tokenfactory simulate --scenario``."""
    from tokenfactory.cli import main

    def run(extra, name):
        lines = ['[simulation]', f'load = {extra.get("load", 1.0)}', '[cluster]',
                 f'slo_ttft_s = {extra.get("ttft", 2.0)}', f'decode_workers = {extra.get("decode", 1)}',
                 '[controller]', 'kind = "open"']
        path = tmp_path / f"{name}.toml"
        path.write_text("\n".join(lines) + "\n")
        out = tmp_path / name
        assert main(["simulate", "--trace", "synthetic", "--duration", "2m", "--scenario", str(path),
                     "--capacity", "model", "--no-progress", "--out", str(out)]) == 0
        return json.loads((out / "metrics.json").read_text())

    base = run({}, "base")
    assert base["admission"] == "open" and base["load"] == 1.0
    assert {"slo_attainment_admitted", "goodput_tokens_per_s", "classes", "wasted_prefill_tokens"} <= set(base)
    assert run({"load": 2.0}, "load")["scale"] == pytest.approx(2.0 * base["scale"])
    assert run({"ttft": 0.01}, "ttft")["slo_attainment"] < base["slo_attainment"]
    assert run({"decode": 2}, "decode")["config"]["cluster"]["decode_workers"] == 2


# -- the study ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    return run_study_without_traces("overload", tmp_path_factory)


def test_overload_study_quick(study):
    out, m = study
    rows = m["rows"]
    assert {r["policy"] for r in rows} == {"open", "vllm-watermark", "mooncake", "mooncake-predictive", "smoothed",
                                           "slo-aware"}
    for r in rows:
        assert r["requests"] == r["completed"] + r["rejected"] + r["in_flight_end"]
        assert r["goodput_tokens_per_s"] >= 0
    assert len(m["targets"]) >= 7 and all(t["met"] in (True, False, None) for t in m["targets"])
    for k in ("fill", "decode", "batch_gate", "outer"):
        assert m["margins"][k]["envelope_ok"]
    assert m["margins"]["outer"]["separation_ratio"] >= 5.0 and m["margins"]["outer"]["with_fast_gate_stable"]
    # (e) faults under overload: every policy at 1.3x and 2x, nothing lost
    faults = m["faults"]["rows"]
    assert {(r["load"], r["policy"]) for r in faults} == {(x, p) for x in (1.3, 2.0) for p in {r["policy"] for r in rows}}
    assert all(r["conserved"] and r["events"] == 3 for r in faults)
    summary = (out / "summary.md").read_text()
    assert "Goodput vs load" in summary and "SLO-aware" in summary and "Faults under overload" in summary
    for f in ("goodput_vs_load.png", "latency_cdfs.png", "surge.png", "gate_before_after.png"):
        assert (out / f).stat().st_size > 0
    assert not math.isnan(m["sweep_wall_seconds"])


def test_slo_aware_in_the_pool_model_and_the_fluid_plant(setup):
    """The same controller object in plants without requests (its rate form): at 2x the capacity at
    the SLO the decode pass stays at the TPOT target and completions near capacity; the pool
    model's ready buffer does not oscillate (the 10 ms fluid plant rings with an amplitude of
    about one request - reported, not asserted)."""
    from tokenfactory.controllers import assess
    from tokenfactory.plant_models import FluidPlant, LoopScenario, PoolScenario, simulate_loop, simulate_pools
    from tokenfactory.registry import PlantContext

    fp = setup.plant.params
    # the classes' outputs the capacity at the SLO is computed with (its batch cap serves the short requests)
    ctx = PlantContext(fp, 2, 1, slo_ttft_s=2.0, slo_tpot_s=0.1, class_outputs=class_outputs(setup.trace))
    cap = setup.slo_capacity(0.1)[0]
    pools = simulate_pools(fp, 2, 1, PoolScenario(demand=2.0 * cap, duration_s=300, dt=0.25),
                           controllers=[build_admission("slo-aware", ctx)])
    after = pools.series[pools.series["time_s"] > 60]
    target = build_admission("slo-aware", ctx).batch_gate.target_s
    assert after["decode_pass_s"].max() <= 1.02 * target
    assert after["completion_rate"].mean() >= 0.85 * cap
    assert pools.metrics["rejected"] > 0.3 * pools.metrics["requests"]
    assert not assess(after["ready"].to_numpy(), 0.25, min_amplitude=1.0).oscillating
    fluid = simulate_loop(FluidPlant(fp, 2, 1), build_admission("slo-aware", ctx),
                          LoopScenario(demand=2.0 * cap, duration_s=60, dt=0.01))
    assert fluid.metrics["conservation_residual"] < 1e-6
    s = fluid.series[fluid.series["time_s"] > 20]
    assert s["decode_pass_s"].max() <= 1.02 * target and s["completion_rate"].mean() >= 0.85 * cap


# -- the load axis from each request's own cost; infeasible requests ---------------------------


def test_capacity_from_the_requests_own_costs():
    """Fill capacity is the workers over the mean of each request's fill seconds: for one shape
    that is the shape's figure; for a mix of short and long prompts it is below the mean
    request's (a long prompt's chunks attend over their growing context)."""
    from tokenfactory.replay import request_costs, service_capacity

    one = poisson_trace(2.0, 60.0, 1, inp=4096, out_mean=100)
    s1 = build_replay(one)
    c1 = request_costs(one, s1.params)
    caps = service_capacity(c1, s1.params, 2, 1, 50)
    assert caps["fill"] == pytest.approx(2 / s1.params.fill_seconds(4096, 0), rel=1e-9)
    passes = (np.maximum(one["output_tokens"], 1) - 1).mean()
    ctx = float(((np.maximum(one["output_tokens"], 1) - 1) * (4096 + one["output_tokens"] / 2)).sum()
                / (np.maximum(one["output_tokens"], 1) - 1).sum())
    assert caps["decode"] == pytest.approx(50 / (passes * s1.params.decode_pass(50, ctx)[0]), rel=1e-9)
    mix = one.copy()
    mix["input_tokens"] = np.where(np.arange(len(mix)) % 4 == 0, 60000, 1000)
    s2 = build_replay(mix)
    c2 = request_costs(mix, s2.params)
    shape = s2.shape
    per_request = service_capacity(c2, s2.params, 2, 1, 50)["fill"]
    assert per_request < 0.9 * 2 / s2.params.fill_seconds(shape.prompt_tokens, shape.cached_tokens)
    # the load axis of the study and of simulate --load is this capacity
    cap, neck, batch = s2.slo_capacity(0.1)
    assert cap == pytest.approx(min(service_capacity(c2, s2.params, 2, 1, batch).values()))


def test_infeasible_requests_are_counted_and_rejected_at_arrival():
    """A prompt whose chunked fill alone takes longer than the TTFT SLO misses under every
    policy; the SLO-aware gate rejects it at arrival (``infeasible_slo``) without prefilling it."""
    tr = poisson_trace(0.5, 60.0, 2, inp=2000, out_mean=50)
    tr["input_tokens"] = np.where(np.arange(len(tr)) % 5 == 0, 90000, 2000)
    tr["request_class"] = "interactive"
    setup = build_replay(tr)
    bad = setup.infeasible_share(DEFAULT_CLASSES)
    long = tr["input_tokens"].to_numpy() == 90000
    assert setup.params.request_fill_s(90000) > 2.0 > setup.params.request_fill_s(2000)
    assert bad["ttft"] == pytest.approx(long.mean()) and bad["any"] >= bad["ttft"]
    out = {}
    for policy in ("open", "slo-aware"):
        m, res = run_replay(tr, setup, policy, cluster=CLUSTER, batch_cap="static")
        out[policy] = (m, res.records)
    m, rec = out["slo-aware"]
    rejected = rec["state"] == "rejected"
    assert (rec.loc[long, "reject_reason"] == "infeasible_slo").all()
    assert rec.loc[rejected & ~long, "reject_reason"].ne("infeasible_slo").all()
    assert rec.loc[long, "filled_tokens"].sum() == 0
    m_open, rec_open = out["open"]
    assert not (rec_open.loc[long, "ttft_s"] <= 2.0).any()  # admitted, none meets its SLO (or even finishes)
    assert m["slo_attainment_admitted"] > m_open["slo_attainment_admitted"]
    # the study's split of the misses: the long prompts that completed missed intrinsically
    from tokenfactory.studies.overload import miss_causes

    mc = miss_causes(rec_open, setup.params, DEFAULT_CLASSES)
    done = (rec_open["state"] == "completed").to_numpy()
    late = done & (rec_open["ttft_s"].to_numpy() > 2.0)
    assert mc["infeasible"] == pytest.approx(long.mean())
    assert mc["ttft_intrinsic"] == pytest.approx((late & long).sum() / len(tr))
    assert mc["ttft_queueing"] == pytest.approx((late & ~long).sum() / len(tr))
    assert miss_causes(rec, setup.params, DEFAULT_CLASSES)["ttft_intrinsic"] == 0.0  # rejected, not missed


def test_capacity_is_the_simulated_clusters_and_doubles_with_both_pools():
    """Issue 27: the capacity is computed for the cluster simulated. The model is linear in each
    pool's workers (no resource shared between workers), so doubling both pools doubles it exactly;
    measured by bisection under open admission it grows by 2x within the queueing's non-linearity
    (a larger pool multiplexes bursts better: +9 % at 2 + 1 -> 4 + 2 on a 3,600-request stream)
    and the bisection's noise (attainment is not monotone in the rate at the 1 % level: 0.94 x on
    this 2,700-request one), so within -15 % / +20 %; events are excluded from it. (The trace must be long enough that the queues reach
    their steady state at the rates tried: at 720 requests the 4 + 4 cluster "measured" 6 x the
    2 + 2 one, the whole stream finishing inside the transient.)"""
    from tokenfactory.core.events import WorkerCrash

    tr = poisson_trace(6.0, 450.0, 3, inp=2000, out_mean=120)
    setup = build_replay(tr)
    small = setup.capacity({"fill_workers": 2, "decode_workers": 1, "drain_s": 60.0}, measure=True)
    big = setup.capacity({"fill_workers": 4, "decode_workers": 2, "drain_s": 60.0}, measure=True)
    assert big.model_rps == pytest.approx(2.0 * small.model_rps, rel=1e-9)
    assert big.batch_cap == small.batch_cap and big.cluster["fill_workers"] == 4
    assert 2.0 * 0.85 <= big.measured_rps / small.measured_rps <= 2.0 * 1.2
    for c in (small, big):
        assert c.rps == c.measured_rps and c.measured["runs"] >= 3
        a = [p["slo_attainment"] for p in c.measured["points"]]
        assert min(a) < c.measured["target_attainment"] <= max(a)
    # cached on the setup; events do not change it
    crash = {"fill_workers": 2, "decode_workers": 1, "drain_s": 60.0, "events": (WorkerCrash(10.0, "decode"),)}
    assert setup.capacity(crash).model_rps == small.model_rps
    # a scenario's SLO changes it (the static cap and the model's decode capacity follow the TPOT SLO)
    assert setup.capacity({"slo_tpot_s": 0.05}).batch_cap < small.batch_cap


def test_batch_admission_counts_the_preemption_the_reservation_causes(setup):
    """A batch request plans around the interactive occupancy's upper quantile over its own decode
    time (``preempt_z``), so it is admitted into room that stays free: fewer preemptions than
    planning on the mean (``preempt_z = 0``; measured 3 vs 20, 32 more batch requests turned
    away), its admitted SLO attainment no worse."""
    cap = setup.slo_capacity(0.1)[0]
    tr = classed_trace(0.8 * cap, 1.5 * cap, 60.0)
    out = {}
    for z in (0.0, 1.0):
        m, _ = run_replay(tr, setup, "slo-aware", cluster=CLUSTER, batch_cap="static",
                          admission_params={"preempt_z": z, "outer": {"enabled": False}})
        out[z] = m
    assert out[1.0]["preempted"] <= out[0.0]["preempted"]
    b0, b1 = out[0.0]["classes"]["batch"], out[1.0]["classes"]["batch"]
    assert (b1["slo_attainment_admitted"] or 1.0) >= (b0["slo_attainment_admitted"] or 1.0) - 1e-9
