"""Issue 11: request classes, SLO-aware admission in the simulator, reserved interactive capacity,
the gated batch cap and the overload study (the gate's own units: test_slo_admission.py; the batch
cap's: test_batch_gate.py; the replay's: test_replay.py)."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from conftest import classed_trace, poisson_trace, run_study_without_traces
from tokenfactory.core.classes import DEFAULT_CLASSES
from tokenfactory.plant_models import ClusterConfig, simulate
from tokenfactory.registry import build_admission
from tokenfactory.replay import build_replay, class_outputs, run_replay
from tokenfactory.core.signals import DEFER_REASONS, REJECT_REASONS, ReserveAction


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


# -- the SLO-aware admission in the simulator -----------------------------------------------


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


# -- scenario files for simulate --------------------------------------------------------------


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


# -- infeasible requests ----------------------------------------------------------------------


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
