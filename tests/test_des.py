import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.signal import welch

from tokenfactory.controllers import SmoothedAdmission, assess
from tokenfactory.plant_models import (
    ClusterConfig,
    DecodeRateDip,
    DESParams,
    LinkSlowdown,
    LoopScenario,
    Reconfiguration,
    Worker,
    WorkerCrash,
    accelerator_preset,
    model_preset,
    simulate,
    simulate_loop,
)
from conftest import ConstantAdmission, poisson_trace
from tokenfactory import ConfigError
from tokenfactory.traces import SyntheticWorkload, generate_requests, load_trace, trace_available


@pytest.fixture(scope="module")
def params(des_params):
    return des_params


@pytest.fixture(scope="module")
def prefit():
    """The two agreement tests below check that the request simulator and the fluid plant agree
    on one parameter set; they keep the rates they were written on - the pre-fit roofline
    (compute 0.6, memory 0.8, network 0.7, no per-layer overhead or collective latency), where
    the section-18 naive loop is a self-sustained limit cycle. At the fitted defaults the
    noise-free naive fluid loop sits inside its stability boundary (it cycles only when demand
    noise kicks it, as study feedback-oscillation shows), so there is no deterministic cycle to
    compare, and the overload run's rejected count differs by a third between the two plants
    (708 vs 533). Even the 0.7 ms of collective latency per pass alone turns the simulator's naive
    loop irregular (Thornhill r 1.12 -> 0.44): it sits at the edge of the regularity test. Left
    to the plant restructuring (issue 13 parts 3-5)."""
    import dataclasses
    import tomllib

    from tokenfactory.plant_models.published_points import PRE_FIT_EFFICIENCY
    from tokenfactory.scenario import scenario_from_dict
    from tokenfactory.studies.feedback_oscillation import scenario_path

    eff = {f.name: getattr(PRE_FIT_EFFICIENCY, f.name) for f in dataclasses.fields(PRE_FIT_EFFICIENCY)}
    scs = {}
    for name in ("naive", "smoothed"):
        with open(scenario_path(name), "rb") as fh:
            d = tomllib.load(fh)
        d["plant"]["efficiency"] = eff
        scs[name] = scenario_from_dict(d, name)
    w = Worker(model_preset("deepseek-v3"), accelerator_preset("h200"), efficiency=PRE_FIT_EFFICIENCY)
    return scs, DESParams.from_workers(w, w)


def test_decode_table_matches_roofline(params):
    w = Worker(model_preset("deepseek-v3"), accelerator_preset("h200"))
    for b, c in [(933, 2560), (500, 2560), (100, 2560), (50, 30000), (1, 8000)]:
        assert params.decode_pass(b, c)[0] == pytest.approx(w.decode(b, c, check_memory=False).time_s, rel=0.03)


def _erlang_c_wait(lam, mu, c):
    a = lam / mu
    rho = a / c
    s = sum(a ** k / math.factorial(k) for k in range(c))
    top = a ** c / math.factorial(c) / (1 - rho)
    return top / (s + top) / (c * mu - lam)


def _degenerate(step_s=0.01):
    # instantaneous fill and transfer, one sequence per decode worker, constant pass time
    return DESParams(fill_token_budget=10 ** 9, fill_step_tokens=(1.0, 1e9), fill_step_s=(1e-9, 1e-9),
                     fill_s_per_cached_token=0.0, kv_bytes_per_token=0.0, kv_link_bandwidth=math.inf,
                     kv_setup_s=0.0, decode_kv_capacity_bytes=math.inf, decode_batches=(1.0, 2.0),
                     decode_contexts=(1.0, 1e9), decode_table_s=((step_s, step_s), (step_s, step_s)),
                     decode_max_batch=1)


def _mmc_run(servers, rho, n, seed):
    mean_service = 200 * 0.01  # decode tokens geometric (mean 200) x 10 ms: ~exponential, mean 2 s
    lam = rho * servers / mean_service
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / lam, n))
    tokens = rng.geometric(1 / 200, n)
    tr = pd.DataFrame({"arrival_s": t, "input_tokens": 1, "cached_tokens": 0, "output_tokens": 1 + tokens})
    r = simulate(tr, _degenerate(), ClusterConfig(fill_workers=1, decode_workers=servers, progress=False,
                                                  prefix_cache_blocks=0, drain_s=3600))
    return t, tokens * 0.01, r, lam, 1 / mean_service


@pytest.mark.parametrize("servers", [1, 3])
def test_queueing_matches_exact_fcfs_recursion(servers):
    """Same samples, exact FCFS multi-server recursion (Kiefer-Wolfowitz): waits agree exactly."""
    t, service, r, *_ = _mmc_run(servers, 0.8, 20000, 7)
    free, waits = np.zeros(servers), np.empty(len(t))
    for k, (a, s) in enumerate(zip(t, service)):
        j = int(np.argmin(free))
        start = max(a, free[j])
        waits[k] = start - a
        free[j] = start + s
    q = r.records
    np.testing.assert_allclose((q["decode_start_s"] - q["kv_ready_s"]).to_numpy(), waits, atol=1e-6)
    # Little's law over the same run: time-average number in system = total sojourn time / duration
    # (agrees to 1e-4 here; the 2 % of the large Erlang-C run below)
    s = r.series
    L = (s["backlog"] + s["fill_in_progress"] + s["ready"] + s["active_decodes"]).mean()
    done = q[q["state"] == "completed"]
    assert L == pytest.approx((done["completion_s"] - done["arrival_s"]).sum() / r.metrics["duration_s"], rel=0.02)


# Slow (2 x 100,000 requests per point, about a quarter of the default suite's time): in the default
# run the exact FCFS recursion above checks every request's wait on the same M/M/c plant (the mean
# Erlang C predicts follows from those samples), and Little's law on that run.
@pytest.mark.slow
@pytest.mark.parametrize("servers", [1, 4])
def test_erlang_c_and_littles_law(servers):
    waits, expect = [], None
    for seed in (1, 2):
        t, _, r, lam, mu = _mmc_run(servers, 0.7, 100_000, seed)
        q = r.records[(r.records["state"] == "completed") & (r.records["arrival_s"] > 0.05 * t[-1])]
        waits.append((q["decode_start_s"] - q["kv_ready_s"]).mean())
        expect = _erlang_c_wait(lam, mu, servers)
        # Little's law over the run: time-average number in system = total sojourn time / duration
        s = r.series
        L = (s["backlog"] + s["fill_in_progress"] + s["ready"] + s["active_decodes"]).mean()
        done = r.records[r.records["state"] == "completed"]
        assert L == pytest.approx((done["completion_s"] - done["arrival_s"]).sum() / r.metrics["duration_s"], rel=0.02)
    assert np.mean(waits) == pytest.approx(expect, rel=0.05)


def test_agreement_with_fluid_model(prefit):
    """Steady overload (1.1 x decode capacity) with a 5 s backlog bound, exponential outputs."""
    scs, params = prefit
    sc = scs["smoothed"]
    plant, tuned = sc.plant, sc.controller
    c = plant.decode_capacity
    ctrl = SmoothedAdmission(tuned.target_ready, tuned.gains, filter_tau=tuned.filter_tau,
                             service_filter_tau=tuned.service_filter_tau, sample_period=tuned.sample_period,
                             rate_limit=tuned.rate_limit, backlog_bound=5 * c)
    dur = 300.0
    tr = poisson_trace(1.1 * c, dur, 1)
    des = simulate(tr, params, ClusterConfig(fill_workers=6, decode_workers=4, measurement_delay_s=0.5,
                                             duration_s=dur, progress=False, prefix_cache_blocks=0), ctrl)
    flu = simulate_loop(plant, ctrl, LoopScenario(demand=1.1 * c, duration_s=dur, dt=0.01))
    s = des.series[des.series["time_s"] > 100]
    w = flu.window(100)
    assert s["completion_rate"].mean() == pytest.approx(flu.column("completion_rate")[w].mean(), rel=0.05)
    assert s["ready"].mean() == pytest.approx(flu.column("ready")[w].mean(), rel=0.15)
    assert s["backlog"].mean() == pytest.approx(flu.column("backlog")[w].mean(), rel=0.15)
    assert des.metrics["rejected"] == pytest.approx(flu.column("rejected")[-1], rel=0.15)


def _dominant_period_s(x, dt):
    f, pxx = welch(x - x.mean(), fs=1.0 / dt, nperseg=512)
    return 1.0 / f[1 + int(np.argmax(pxx[1:]))]


def _oscillation_agreement(prefit, seeds):
    """At 1.05 x decode capacity (pre-fit rates, see ``prefit``) the naive loop cycles at the fluid
    model's period in the request simulator too, and the smoothed loop does not cycle, on each seeded
    trace; returns how many seeds the detector's full verdict calls regular.

    The stochastic naive loop's cycle is less regular than the fluid one's (completion counts are
    Poisson-noisy and fill adds chunking delay): over a 240 s window Thornhill's regularity index
    r is bimodal across seeds (about half the runs above the detector's r > 1, measured 9 of 16
    seeds before the simulator's rewrite and 7 of 16 after), so a single seed's full verdict is a
    coin flip. What holds on every seed is the spectrum: the ready queue's power concentrates at
    the fluid loop's period (checked within 25 %), and the smoothed loop's does not concentrate."""
    scs, params = prefit
    naive_scenario, smoothed_scenario = scs["naive"], scs["smoothed"]
    c = smoothed_scenario.plant.decode_capacity
    cl = ClusterConfig(fill_workers=6, decode_workers=4, measurement_delay_s=0.5, duration_s=300.0,
                       progress=False, prefix_cache_blocks=0)
    fluid = {}
    for name, sc in (("naive", naive_scenario), ("smoothed", smoothed_scenario)):
        f = simulate_loop(sc.plant, sc.controller, LoopScenario(demand=1.05 * c, duration_s=300.0))
        fluid[name] = assess(f.sampled("ready", 0.1, 60), 0.1, min_amplitude=1.0)
    assert fluid["naive"].oscillating and not fluid["smoothed"].oscillating
    regular = 0
    for seed in seeds:
        tr = poisson_trace(1.05 * c, 300.0, seed)
        for name, sc in (("naive", naive_scenario), ("smoothed", smoothed_scenario)):
            d = simulate(tr, params, cl, sc.controller).series
            x = d.loc[d["time_s"] > 60, "ready"].to_numpy()
            v = assess(x, 0.1, min_amplitude=1.0)
            peak = v.to_dict()["spectral_peak_fraction"]
            if name == "naive":
                assert peak >= 0.5, f"seed {seed}: {v}"
                assert _dominant_period_s(x, 0.1) == pytest.approx(fluid["naive"].period_s, rel=0.25), f"seed {seed}"
                regular += v.oscillating
            else:
                assert not v.oscillating and peak < 0.4, f"seed {seed}: {v}"
    return regular


def test_agreement_on_which_loops_oscillate(prefit):
    # one seed in the default run: every per-seed assertion (the naive spectrum at the fluid period,
    # the smoothed loop quiet) on the same code path as the slow three-seed test below
    _oscillation_agreement(prefit, (1,))


@pytest.mark.slow
def test_agreement_on_which_loops_oscillate_on_three_seeds(prefit):
    assert _oscillation_agreement(prefit, (1, 2, 3)) >= 1


def test_prefix_hit_ratio_on_mooncake(params):
    if not trace_available("mooncake-conversation"):
        pytest.skip("shared trace data absent (set TOKENFACTORY_TRACES)")
    tr = load_trace("mooncake-conversation")
    r = simulate(tr, params, ClusterConfig(fill_workers=4, decode_workers=2, progress=False, drain_s=600))
    assert r.metrics["prefix_hit_ratio"] == pytest.approx(0.374, abs=0.01)
    lru = simulate(tr, params, ClusterConfig(fill_workers=4, decode_workers=2, progress=False, drain_s=600,
                                             prefix_cache_blocks=5000))
    assert lru.metrics["prefix_hit_ratio"] < r.metrics["prefix_hit_ratio"]


def test_crash_loses_no_request(params):
    tr = poisson_trace(100.0, 60.0, 3, inp=1000, out_mean=200)
    cl = ClusterConfig(fill_workers=2, decode_workers=2, progress=False, drain_s=600,
                       events=(WorkerCrash(20.0, "decode", 0, restart_s=10.0), WorkerCrash(25.0, "fill", 1, 5.0)))
    r = simulate(tr, params, cl)
    m = r.metrics
    assert m["requeued"] > 0
    assert m["completed"] == m["requests"] == len(tr) and m["in_flight_end"] == 0


def test_deterministic(params):
    tr = generate_requests(SyntheticWorkload(mean_rate_rps=20, seed=4), 120)
    cl = ClusterConfig(fill_workers=1, decode_workers=1, progress=False)
    a = simulate(tr, params, cl).records
    b = simulate(tr, params, cl).records
    pd.testing.assert_frame_equal(a, b)


def test_reconfiguration_moves_a_worker(params):
    tr = poisson_trace(50.0, 60.0, 5, inp=1000, out_mean=100)
    r = simulate(tr, params, ClusterConfig(fill_workers=2, decode_workers=2, progress=False, drain_s=300,
                                           events=(Reconfiguration(10.0, "decode", "fill", 1, 5.0),)))
    s = r.series
    assert s.loc[s["time_s"] < 9, "decode_workers"].max() == 2
    assert s.loc[s["time_s"] > 40, "decode_workers"].min() == 1 and s.loc[s["time_s"] > 40, "fill_workers"].max() == 3
    assert r.metrics["completed"] == len(tr)


def test_closed_agentic_sessions_wait_for_think_time(params):
    tr = pd.DataFrame({"arrival_s": [0.0, 5.0, 9.0, 0.0, 3.0], "input_tokens": [100, 300, 500, 200, 400],
                       "cached_tokens": [0, 100, 300, 0, 200], "output_tokens": [10, 10, 10, 10, 10],
                       "session_id": ["a", "a", "a", "b", "b"], "turn": [0, 1, 2, 0, 1],
                       "think_time_s": [np.nan, 4.0, 2.0, np.nan, 7.0]})
    tr.attrs["per_session_clock"] = True
    r = simulate(tr, params, ClusterConfig(fill_workers=1, decode_workers=1, progress=False)).records
    assert (r["state"] == "completed").all()
    assert r.loc[1, "arrival_s"] == pytest.approx(r.loc[0, "completion_s"] + 4.0)
    assert r.loc[2, "arrival_s"] == pytest.approx(r.loc[1, "completion_s"] + 2.0)
    assert r.loc[4, "arrival_s"] == pytest.approx(r.loc[3, "completion_s"] + 7.0)


events = st.one_of(
    st.builds(WorkerCrash, st.floats(0, 40), st.sampled_from(["fill", "decode"]), st.integers(0, 2), st.floats(0, 20)),
    st.builds(LinkSlowdown, st.floats(0, 40), st.floats(0.1, 20), st.floats(0.05, 1.0)),
    st.builds(DecodeRateDip, st.floats(0, 40), st.floats(0.1, 20), st.floats(0.1, 1.0)),
    st.builds(Reconfiguration, st.floats(0, 40), *map(st.just, ("fill", "decode")), st.integers(1, 1), st.floats(0, 10)),
    st.builds(Reconfiguration, st.floats(0, 40), *map(st.just, ("decode", "fill")), st.integers(1, 1), st.floats(0, 10)),
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10 ** 6), rate=st.floats(5, 200), evs=st.lists(events, max_size=4),
       bound=st.one_of(st.just(math.inf), st.floats(0, 500)), duration=st.one_of(st.none(), st.floats(5, 80)))
def test_conservation_under_random_seeds_and_faults(params, seed, rate, evs, bound, duration):
    tr = generate_requests(SyntheticWorkload(mean_rate_rps=rate, seed=seed % 1000, agentic_fraction=0.2), 50)
    cl = ClusterConfig(fill_workers=2, decode_workers=2, progress=False, events=tuple(evs), duration_s=duration,
                       prefix_cache_blocks=None)
    r = simulate(tr, params, cl, ConstantAdmission(rate, bound, sample_period=0.5))
    m = r.metrics
    assert m["requests"] == m["completed"] + m["rejected"] + m["in_flight_end"]
    states = r.records["state"].value_counts()
    assert states.get("completed", 0) == m["completed"] and states.get("rejected", 0) == m["rejected"]
    assert (r.records.loc[r.records["state"] == "rejected", "reject_reason"] != "").all()


def test_bad_cluster_config():
    with pytest.raises(ConfigError, match="cluster.fill_workers"):
        ClusterConfig(fill_workers=-1)
    with pytest.raises(ConfigError, match=r"cluster.events\[0\].kind"):
        ClusterConfig.from_dict({"events": [{"kind": "flood"}]})
    with pytest.raises(ConfigError, match=r"cluster.events\[0\].pool"):
        ClusterConfig.from_dict({"events": [{"kind": "worker_crash", "at_s": 1.0, "pool": "gpu"}]})
    with pytest.raises(ConfigError, match=r"worker_crash.pool"):
        WorkerCrash(1.0, "gpu")
    with pytest.raises(ConfigError, match=r"cluster.events\[0\]"):
        ClusterConfig(events=(LoopScenario,))
    with pytest.raises(ConfigError, match="cluster.colour"):
        ClusterConfig.from_dict({"colour": 1})


def test_policies_plug_in(params):
    """The seams the overload work builds on: a batching rule (a DecodeStage subclass overriding
    ``can_join``, passed in ``stages``) and a prefix-cache policy object."""
    from tokenfactory.plant_models import PrefixCache, Simulator
    from tokenfactory.plant_models.des.decode import DecodeStage

    class CappedBatch(DecodeStage):
        def can_join(self, w, i):
            return w.batch < 4 and super().can_join(w, i)

    class HalfCached(PrefixCache):
        def lookup(self, blocks, input_tokens, given_cached):
            return input_tokens // 2

    tr = poisson_trace(40.0, 20.0, 2, inp=1000, out_mean=50)
    cl = ClusterConfig(fill_workers=2, decode_workers=2, progress=False, drain_s=600)
    r = Simulator(tr, params, cl, prefix_cache=HalfCached(), stages={"decode": CappedBatch}).run()
    assert r.series["active_decodes"].max() <= 2 * 4
    assert r.metrics["completed"] == len(tr)
    assert (r.records["cached_tokens"] == 500).all() and r.metrics["prefix_hit_ratio"] == pytest.approx(0.5)
    assert r.config["prefix_cache"] == {"policy": "HalfCached"}
    # the old seam (a Simulator subclass overriding a stage's method) would be ignored: refused by name
    class OldSeam(Simulator):
        def can_join(self, w, i):
            return False

    with pytest.raises(ConfigError, match="OldSeam.can_join"):
        OldSeam(tr, params, cl)
    with pytest.raises(ConfigError, match="stages.decode"):
        Simulator(tr, params, cl, stages={"decode": HalfCached})
    with pytest.raises(ConfigError, match="stages"):
        Simulator(tr, params, cl, stages={"prefill": CappedBatch})


def test_stages_name_the_record_states(params):
    from tokenfactory.plant_models import Stage

    tr = poisson_trace(200.0, 5.0, 4, inp=1000, out_mean=400)
    r = simulate(tr, params, ClusterConfig(fill_workers=1, decode_workers=1, progress=False, duration_s=5.0))
    states = r.records["state"].cat.categories
    assert [s.name.lower() for s in Stage] == list(states)
    in_flight = r.records["state"].isin([s.name.lower() for s in Stage.in_system()]).sum()
    assert in_flight == r.metrics["in_flight_end"] > 0


def test_per_pool_gpus_bill_each_pool_of_the_request_simulator_at_its_own_gpus():
    """gpus_per_worker {fill, decode}: pinned pools (no autoscaler) bill each pool's billed workers x
    that pool's GPUs over the run, where the scalar bills both at one number; serving is unchanged
    (GPUs price the run, they do not change it)."""
    from pathlib import Path

    from tokenfactory.replay import build_replay, run_replay

    small = Path(__file__).parent / "data" / "small_plant"
    plant_cfg = {"model": str(small / "model.toml"), "hardware": "h100-sxm", "parallelism": {"tp": 2, "pp": 1, "ep": 2}}
    rng = np.random.default_rng(3)
    arrivals = np.sort(rng.uniform(0.0, 120.0, 60))
    trace = pd.DataFrame({"arrival_s": arrivals, "input_tokens": np.full(60, 500), "output_tokens": np.full(60, 50),
                          "cached_tokens": np.zeros(60, dtype=int)})
    runs = {}
    for name, gpus in (("scalar", 4), ("per_pool", {"fill": 4, "decode": 12})):
        cluster = {"fill_workers": 2, "decode_workers": 1, "measurement_delay_s": 1.0, "slo_ttft_s": 2.0,
                   "slo_tpot_s": 0.05, "dynamics": {"startup_s": 30.0, "gpus_per_worker": gpus}, "seed": 1,
                   "progress": False}
        runs[name] = run_replay(trace, build_replay(trace, plant_cfg), "open", 1.0, cluster)
    (m_s, _), (m_p, r_p) = runs["scalar"], runs["per_pool"]
    s = r_p.series
    fill_wh, dec_wh = float(s["fill_workers_billed"].sum()), float(s["decode_workers_billed"].sum())
    assert fill_wh > 0 and dec_wh > 0
    # the ratio is exact whatever the snapshot step: (4 fill + 12 decode) / 4 per worker-step
    assert m_p["gpu_hours"] / m_s["gpu_hours"] == pytest.approx((4 * fill_wh + 12 * dec_wh) / (4 * (fill_wh + dec_wh)),
                                                                 rel=1e-12)
    assert m_p["completed"] == m_s["completed"] == 60 and m_p["slo_attainment"] == m_s["slo_attainment"]
