"""The hysteretic pool controller, the queue relay and the describing function of the
reconfiguration loop."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenfactory.controllers import HystereticPoolController, QueueRelayScaler, need_noise_std, predict_pool_flapping
from tokenfactory.plant_models import DemandStep, PoolDynamics, PoolScenario, simulate_pools
from tokenfactory.studies.reconfiguration import SHAPE, describing_function_check, fluid_params
from tokenfactory import ConfigError

MU = 50.0  # requests/s per worker in the hand-worked tests


def ctrl(**kw):
    base = dict(target_utilization=1.0, dead_band=0.5, filter_s=0.0, dwell_s=20.0, up_dwell_s=0.0, cooldown_s=60.0,
                max_step_up=2, max_step_down=1, queue_clear_s=10.0, queue_headroom=0.25, sample_period=5.0)
    return HystereticPoolController("decode", MU, **{**base, **kw})


@pytest.mark.parametrize("need", [2.5, 2.9, 3.0, 3.5, 4.0])
def test_no_move_inside_the_dead_band(need):
    """With 4 workers and dead band 0.5 the band is [4 - 1 - 0.5, 4] = [2.5, 4]: never a move."""
    c = ctrl()
    for k in range(100):
        assert c.recommend(5.0 * k, 4, need * MU, 0.0) == 4


def test_hand_worked_sequence():
    c = ctrl()
    assert c.recommend(0, 2, 3.2 * MU, 0.0) == 4        # need 3.2 > 2: ceil(3.2) = 4 (+2, the step limit)
    assert c.recommend(5, 4, 9.0 * MU, 0.0) == 6        # need 9: limited to +2 per decision
    assert c.recommend(10, 6, 9.0 * MU, 0.0) == 8
    # queue term: 100 queued / 10 s = 10 req/s, capped at 25 % of the rate (5): need = (20 + 5) / 50
    assert c.need(20.0, 100.0) == pytest.approx(0.5)
    # scale-down: need 2 < 8 - 1 - 0.5 must persist for the dwell (20 s) and the cooldown (60 s)
    t0 = 100.0
    assert c.recommend(t0, 8, 2.0 * MU, 0.0) == 8
    assert c.recommend(t0 + 15, 8, 2.0 * MU, 0.0) == 8
    assert c.recommend(t0 + 20, 8, 2.0 * MU, 0.0) == 7  # one at a time (max_step_down)
    assert c.recommend(t0 + 45, 7, 2.0 * MU, 0.0) == 7  # cooldown: 60 s since the last move
    assert c.recommend(t0 + 80, 7, 2.0 * MU, 0.0) == 6
    # a blip back into the band resets the dwell
    c2 = ctrl(cooldown_s=0.0)
    c2.recommend(0, 5, 1.0 * MU, 0.0)
    c2.recommend(15, 5, 3.8 * MU, 0.0)
    assert c2.recommend(25, 5, 1.0 * MU, 0.0) == 5
    assert c2.recommend(45, 5, 1.0 * MU, 0.0) == 4


@settings(max_examples=40, deadline=None)
@given(rates=st.lists(st.floats(0.0, 20.0), min_size=5, max_size=60), queues=st.floats(0.0, 1e4),
       up=st.integers(1, 4), down=st.integers(1, 3))
def test_never_exceeds_its_step_limits_or_bounds(rates, queues, up, down):
    c = ctrl(max_step_up=up, max_step_down=down, dwell_s=0.0, cooldown_s=0.0, min_replicas=1, max_replicas=12)
    n = 3
    for k, x in enumerate(rates):
        want = c.recommend(5.0 * k, n, x * MU, queues)
        assert -down <= want - n <= up
        assert 1 <= want <= 12
        n = want


def test_pending_aware_never_overscales_during_startup():
    """Demand doubles; workers take 10 minutes to start. Every decision counts the starting ones,
    so the pool never exceeds the demand-justified count."""
    fp = fluid_params(SHAPE)
    mu = fp.decode_capacity(1)
    lam = 1.5 * mu
    dyn = PoolDynamics(startup_s=600.0)
    c = HystereticPoolController.tuned("decode", mu, 2 * lam, startup_s=dyn.startup_s, max_replicas=64)
    r = simulate_pools(fp, 8, 2, PoolScenario(lam, 2400.0, dt=0.5, disturbances=(DemandStep(300.0, 2.0),),
                                              control_start_s=30.0), controllers=[c], dynamics=dyn)
    provisioned = r.series["decode_workers"] + r.series["decode_workers_starting"]
    assert provisioned.max() <= c.demand_justified(2 * lam)
    assert provisioned.max() >= math.ceil(2 * lam / (mu * c.target_utilization))  # and it does get there


def test_tuned_rule_and_the_noise_closed_form():
    c = HystereticPoolController.tuned("decode", MU, 100.0, startup_s=120.0, warmup_s=30.0, filter_s=20.0)
    sigma = math.sqrt(100.0 / 40.0) / (MU * 0.85)
    assert c.dead_band == pytest.approx(max(0.25, 3 * sigma))
    assert c.dwell_s == pytest.approx(60.0) and c.cooldown_s == pytest.approx(150.0)
    # the controller's own filter on Poisson counts scraped every 5 s has the closed-form spread
    rng = np.random.default_rng(0)
    f = HystereticPoolController("decode", MU, filter_s=20.0, target_utilization=0.85)
    needs = []
    for k in range(20000):
        f.recommend(5.0 * k, 10, rng.poisson(100.0 * 5.0) / 5.0, 0.0)
        needs.append(f.last_need)
    assert np.std(needs[100:]) == pytest.approx(need_noise_std(100.0, MU, 0.85, 20.0), rel=0.12)


DF_TOLERANCE = 0.10  # the study and the README state "within 10 %"


def _check_df_rows(rows):
    for r in rows:
        assert r["simulated_oscillating"]
        assert abs(r["period_error"]) < DF_TOLERANCE, r
        assert abs(r["amplitude_error"]) < DF_TOLERANCE, r


def test_describing_function_predicts_the_queue_relay_flapping():
    """Predicted vs simulated period and first-harmonic amplitude (the study's quick cases)."""
    rows, _ = describing_function_check(quick=True)
    assert len(rows) == 3
    _check_df_rows(rows)


@pytest.mark.slow
def test_describing_function_full_cases():
    """All six cases of the study (start-up 30-600 s, two hysteresis widths), same tolerance."""
    rows, _ = describing_function_check(quick=False)
    assert len(rows) == 6
    _check_df_rows(rows)


def test_a_pure_queue_relay_always_has_a_predicted_cycle():
    """Even a very wide hysteresis has the slow integrator solution: the describing function
    predicts flapping for every pure queue relay around a demand between two levels (why the
    hysteretic controller does not close its loop through the queue)."""
    cyc = predict_pool_flapping(50.0, 60.0, 0.0, 1e5)
    assert cyc is not None and cyc.amplitude > 5e4


def test_bad_parameters_name_the_field():
    with pytest.raises(ConfigError, match="hysteretic.target_utilization"):
        HystereticPoolController("decode", MU, target_utilization=1.5)
    with pytest.raises(ConfigError, match="hysteretic.pool"):
        HystereticPoolController("prefill", MU)
    with pytest.raises(ConfigError, match="queue_relay.high"):
        QueueRelayScaler("decode", 2, 2, 0.0, 10.0)
    with pytest.raises(ConfigError, match="queue_high"):
        predict_pool_flapping(50.0, 10.0, 10.0, 5.0)


def test_scale_up_waits_for_one_confirming_sample_by_default():
    c = HystereticPoolController("decode", MU, target_utilization=1.0, filter_s=0.0, sample_period=5.0)
    assert c.recommend(0.0, 2, 3.2 * MU, 0.0) == 2
    assert c.recommend(5.0, 2, 3.2 * MU, 0.0) == 4


def test_no_flapping_at_any_constant_demand():
    """Regression test for no-oscillation: a sweep of constant Poisson demands from 0.3 to 5
    workers' need (integer boundaries included). After settling, no reversal ever; at most one
    noise-driven step up (a ratchet, which the dead band then holds)."""
    fp = fluid_params(SHAPE)
    mu = fp.decode_capacity(1)
    for x in np.arange(0.3, 5.0, 0.2):
        lam = x * mu * 0.85
        c = HystereticPoolController.tuned("decode", mu, lam, startup_s=120.0, warmup_s=30.0, max_replicas=8)
        r = simulate_pools(fp, 4, max(1, math.ceil(x)), PoolScenario(lam, 7200.0, dt=0.5, control_start_s=60.0,
                                                                      seed=int(x * 10)), controllers=[c])
        assert r.metrics["reversals_per_hour"] == 0, (x, r.actions)
        assert len(r.actions[r.actions["time_s"] > 1200.0]) <= 1, (x, r.actions)


def test_measured_noise_matches_poisson_and_grows_with_burstiness():
    from tokenfactory.controllers import measured_need_noise

    rng = np.random.default_rng(1)
    poisson = np.cumsum(rng.exponential(1 / 100.0, 100 * 20000))
    closed = need_noise_std(100.0, MU, 0.85, 20.0)
    assert measured_need_noise(poisson, MU, 0.85, 20.0) == pytest.approx(closed, rel=0.10)
    # the same mean rate, modulated 10-s windows (gamma-mixed): more noise than Poisson
    windows = rng.gamma(2.0, 50.0, 2000)
    bursty = np.concatenate([10.0 * k + np.sort(rng.uniform(0, 10.0, rng.poisson(10.0 * r)))
                             for k, r in enumerate(windows)])
    assert measured_need_noise(bursty, MU, 0.85, 20.0) > 2 * closed
    with pytest.raises(ConfigError, match="arrival_times_s"):
        measured_need_noise(poisson[:500], MU, 0.85, 20.0)


# --------------------------------------------------------------------------------------------
# issue 21's small plant (tests/data/small_plant): one decode worker, 5 s measurement delay

from pathlib import Path  # noqa: E402

import pandas as pd  # noqa: E402

SMALL_PLANT = Path(__file__).parent / "data" / "small_plant"
BURST_S = 60.0  # the case's burst: 60 s at 5x (its README)


def _small_plant(autoscaler, *, decode_workers=None, trace=None, autoscaler_params=None):
    """`tokenfactory simulate --scenario sim.toml --trace requests.csv --autoscaler A --seed 1`
    (``decode_workers`` overrides the scenario's initial decode pool; ``trace`` its requests;
    ``autoscaler_params`` are ``--autoscaler-param`` s)."""
    from tokenfactory.core.classes import DEFAULT_CLASSES, INTERACTIVE, RequestClass
    from tokenfactory.replay import build_replay, load_replay_scenario, run_replay
    from tokenfactory.traces import load_trace

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(SMALL_PLANT)  # the scenario's paths resolve from the working folder
        sc = load_replay_scenario("sim.toml")
        trace = load_trace("requests.csv") if trace is None else trace
        # as the CLI: the interactive class at the cluster's SLO, the other default classes as they are
        slo = (sc.cluster["slo_ttft_s"], sc.cluster["slo_tpot_s"])
        cluster = {**sc.cluster, "seed": 1, "progress": False,
                   "classes": (RequestClass(INTERACTIVE, *slo, 0),
                               *(c for c in DEFAULT_CLASSES if c.name != INTERACTIVE))}
        if decode_workers is not None:
            cluster["decode_workers"] = decode_workers
        return run_replay(trace, build_replay(trace, dict(sc.plant)), "slo-aware", 1.0, cluster,
                          autoscaler=autoscaler, autoscaler_params=autoscaler_params)


def _burst(arrivals: np.ndarray) -> tuple[float, float]:
    """(onset, base rate): the start of the BURST_S window holding the most arrivals, and the
    arrival rate outside it."""
    t = np.sort(arrivals)
    counts = np.searchsorted(t, t + BURST_S) - np.arange(len(t))
    onset = float(t[int(np.argmax(counts))])
    outside = len(t) - int(counts.max())
    return onset, outside / (t[-1] - t[0] - BURST_S)


def _late_burst_trace() -> pd.DataFrame:
    """The case's requests with its first 300 s played twice before the rest: the same burst at
    600 s instead of 300 s, after HPA's 300-s scale-down stabilisation has let its start-up
    cascade go."""
    from tokenfactory.traces import load_trace

    r = load_trace(str(SMALL_PLANT / "requests.csv"))
    head = r[r["arrival_s"] < 300.0]
    later = r[r["arrival_s"] >= 300.0].assign(arrival_s=lambda d: d["arrival_s"] + 300.0)
    return pd.concat([head, head.assign(arrival_s=head["arrival_s"] + 300.0), later],
                     ignore_index=True).sort_values("arrival_s", ignore_index=True)


def _serving_at(res, t: float) -> int:
    s = res.series
    return int(s.loc[s["time_s"] <= t, "decode_workers"].iloc[-1])


@pytest.fixture(scope="module")
def small_plant_hysteretic():
    return _small_plant("hysteretic")


#: `simulate --autoscaler hysteretic --seed 1` on the small plant, measured on main 9ab8ea5
#: (issue 21: 6 scale actions, 1 reversal, 251 rejections - 185 interactive decode_overloaded, 66
#: batch deferral_expired - and no completed request over its SLO)
SMALL_PLANT_HYSTERETIC = {"slo_attainment": (0.8745, 0.01), "gpu_hours": (1.411, 0.05)}


def test_small_plant_holds(small_plant_hysteretic):
    """Issue 21's small plant: main b2c20fa's controller flapped 2 -> 1 -> 2 every 5 s (595
    reversals/h, SLO 0.71; its recorded run is judged in tests/test_oscillation.py). Now: decode
    1 -> 2 on the base load, up for the 5x burst and back down after it - one reversal, no
    verdict."""
    m, res = small_plant_hysteretic
    assert not m["oscillating"] and not m["churning"], m["oscillation"]["reason"]
    scale = res.actions[res.actions["kind"] == "scale"]
    assert set(scale["pool"]) == {"decode"} and m["oscillation"]["reversals"] <= 1, scale.to_string()
    assert len(scale) <= 6
    assert scale["to"].iloc[0] == 2 and scale["time_s"].iloc[0] > 10.0  # not on the first, partial sample
    assert m["slo_attainment_admitted"] >= 0.99
    for key, (value, tol) in SMALL_PLANT_HYSTERETIC.items():
        assert m[key] == pytest.approx(value, abs=tol), key


def test_small_plant_misses_are_the_burst_no_ordered_worker_can_reach(small_plant_hysteretic):
    """Why the small plant's attainment is 0.87 (issue 21): the burst lasts 60 s, and a worker
    ordered on the first sample that shows it serves only after the last burst request's deadline
    (onset + measurement delay + start-up >= onset + 60 s + the longest class TTFT SLO). So the
    burst is served by the workers already serving at its onset - the 2 the base demand justifies
    - and the misses are rejections of burst work, not completed requests over their SLO."""
    m, res = small_plant_hysteretic
    cl = res.config["cluster"]
    rec = res.records
    onset, base = _burst(rec["arrival_s"].to_numpy())
    longest_ttft = max(c["slo_ttft_s"] for c in cl["classes"])
    first_served = onset + cl["measurement_delay_s"] + cl["dynamics"]["startup_s"]
    assert first_served >= onset + BURST_S + longest_ttft
    decode = next(a for a in res.config["autoscalers"] if a["pool"] == "decode")
    justified = math.ceil(base / (decode["per_worker_rps"] * decode["target_utilization"]))
    assert _serving_at(res, onset) == justified == 2
    # every ordered worker the burst caused serves after the burst's last deadline
    scale = res.actions[(res.actions["kind"] == "scale") & (res.actions["to"] > res.actions["from"])]
    assert (scale.loc[scale["time_s"] >= onset, "time_s"] + cl["dynamics"]["startup_s"]
            >= onset + BURST_S + longest_ttft).all()
    # measured: 237 rejected and 17 completed past their TPOT SLO (on 9ab8ea5's admission: 251 and
    # 0; the outer loop that relaxes faster admits a few burst requests that then run late)
    miss = res.slo_misses()
    late = miss["late_ttft"] + miss["late_tpot"] + miss["unfinished"]
    assert late <= 0.10 * (miss["requests"] - miss["met"])
    assert {r for r, n in m["rejected_by_reason"].items() if n} == {"decode_overloaded", "deferral_expired"}
    slo = {c["name"]: (c["slo_ttft_s"], c["slo_tpot_s"]) for c in cl["classes"]}
    ttft_slo = rec["request_class"].map(lambda c: slo[c][0])
    tpot_slo = rec["request_class"].map(lambda c: slo[c][1])
    missed = rec[(rec["state"] != "completed") | (rec["ttft_s"] > ttft_slo) | (rec["tpot_s"] > tpot_slo)]
    assert len(missed) == miss["requests"] - miss["met"]
    in_burst = missed["arrival_s"].between(onset, onset + BURST_S)
    assert in_burst.sum() >= 0.95 * len(missed), missed["arrival_s"].describe()
    assert m["slo_attainment"] == pytest.approx(miss["met"] / miss["requests"], abs=1e-9)


def test_simulate_answer_says_why_the_small_plant_misses(small_plant_hysteretic, capsys):
    """`simulate`'s plain answer states the diagnosis from the run's own records."""
    from tokenfactory.cli.replay_answers import misses_answer

    m, res = small_plant_hysteretic
    miss = res.slo_misses()
    onset, _ = _burst(res.records["arrival_s"].to_numpy())
    misses_answer(res, onset, BURST_S)
    out = capsys.readouterr().out
    assert miss["met"] == round(m["slo_attainment"] * m["requests"])
    assert (f"SLO missed by {m['requests'] - miss['met']:,} of {m['requests']:,} requests: "
            f"{m['rejected']:,} rejected (decode_overloaded {m['rejected_by_reason']['decode_overloaded']:,}, "
            f"deferral_expired {m['rejected_by_reason']['deferral_expired']:,}), 0 completed past their TTFT SLO") in out
    assert "serves 95 s later" in out and "only workers serving before it can carry it" in out


#: `simulate ... --autoscaler hysteretic --autoscaler-param decode_min_replicas=4 --seed 1` on the
#: small plant, measured on branch advise2 after merging main bda1c79 (static 4: 0.999 at 2.00;
#: `--autoscaler hpa`: 0.994 at 1.90 before that main, 0.8535 at 1.36 GPU-hours on it - its HPA
#: now counts pods by the upstream readiness rule, so its start-up cascade no longer holds 4)
SMALL_PLANT_HYSTERETIC_FLOOR_4 = {"slo_attainment": (0.9955, 0.005), "gpu_hours": (2.00, 0.05)}


def test_small_plant_hysteretic_with_a_decode_floor_meets_the_slo(small_plant_hysteretic):
    """The floor is the lever for the burst no ordered worker reaches: held at 4 decode workers
    the hysteretic controller meets 0.99 where it reached 0.87 with the floor at 1, and holds."""
    m, res = _small_plant("hysteretic", autoscaler_params={"decode_min_replicas": 4})
    assert not m["oscillating"] and not m["churning"], m["oscillation"]["reason"]
    assert m["slo_attainment"] >= 0.99 > small_plant_hysteretic[0]["slo_attainment"]
    onset, _ = _burst(res.records["arrival_s"].to_numpy())
    assert _serving_at(res, onset) == 4
    for key, (value, tol) in SMALL_PLANT_HYSTERETIC_FLOOR_4.items():
        assert m[key] == pytest.approx(value, abs=tol), key


#: static decode pools on the small plant (no autoscaler; same admission, trace, seed), measured
#: on main 9ab8ea5: what holding n workers through the burst buys, and costs
STATIC_DECODE = [(2, 0.8795, 1.20), (3, 0.976, 1.60), (4, 0.999, 2.00)]


@pytest.mark.slow
@pytest.mark.parametrize("workers, slo, gpu_hours", STATIC_DECODE)
def test_small_plant_static_decode_pools(workers, slo, gpu_hours):
    m, _ = _small_plant(None, decode_workers=workers)
    assert m["slo_attainment"] == pytest.approx(slo, abs=0.01)
    assert m["gpu_hours"] == pytest.approx(gpu_hours, abs=0.02)


@pytest.mark.slow
def test_small_plant_hpa_meets_the_burst_with_the_workers_serving(small_plant_hysteretic):
    """With upstream's readiness rule (starting pods at 0 on a scale-up, HPA's default since issue
    22's decision) HPA does not cascade on the small plant: like the hysteretic controller it meets
    the burst at 300 s with the 2 decode workers the base demand justifies and gets no more
    attainment (issue 21's target: the hysteretic controller's SLO >= HPA's; HPA 0.8535 against
    0.873 measured on merged main with the faster outer loop, 0.8725 against 0.8745 before it),
    and the same with the burst at 600 s (0.906 against 0.909 before). Counting starting pods at the
    serving average (``starting_unready=False``), its start-up cascade still held 4 workers at
    300 s (0.994, measured before the default changed)."""
    m_hyst, _ = small_plant_hysteretic
    m, res = _small_plant("hpa")
    onset, _ = _burst(res.records["arrival_s"].to_numpy())
    assert _serving_at(res, onset) == 2
    assert m_hyst["slo_attainment"] >= m["slo_attainment"] - 0.005
    late = _late_burst_trace()
    (m_h, res_h), (m_a, res_a) = (_small_plant(a, trace=late) for a in ("hysteretic", "hpa"))
    onset, _ = _burst(late["arrival_s"].to_numpy())
    assert _serving_at(res_h, onset) == _serving_at(res_a, onset) == 2
    assert m_h["slo_attainment"] >= m_a["slo_attainment"] - 0.005
    assert not m_h["oscillating"] and not m_h["churning"]


def _hysteretic_ctx():
    from tokenfactory.studies.reconfiguration import SHAPE, fluid_params

    return PlantContext(fluid_params(SHAPE, measurement_delay_s=5.0), 1, 1, slo_ttft_s=2.0, slo_tpot_s=0.155,
                        rate_rps=1.0, dynamics=PoolDynamics(startup_s=90.0, warmup_s=30.0, warmup_factor=0.5))


def test_hysteretic_floor_per_pool_is_a_kind_parameter():
    """The hysteretic kind takes a floor per pool (``--autoscaler-param decode_min_replicas=4``):
    the lever for a burst shorter than measurement delay + start-up; the rest stays tuned."""
    ctx = _hysteretic_ctx()
    default = {c.pool: c for c in build_autoscalers("hysteretic", ctx)}
    held = {c.pool: c for c in build_autoscalers("hysteretic", ctx, {"decode_min_replicas": 4})}
    assert (default["decode"].min_replicas, held["decode"].min_replicas, held["fill"].min_replicas) == (1, 4, 1)
    assert held["decode"].params() == {**default["decode"].params(), "min_replicas": 4}


@pytest.mark.parametrize("params, field, says", [
    ({"decode_min_replicas": 0}, "autoscaler.decode_min_replicas", "[1, inf)"),
    ({"fill_min_replicas": 65}, "autoscaler.fill_min_replicas", "[1, 64]"),
    ({"decode_min_replicas": 2.5}, "autoscaler.decode_min_replicas", "integer"),
    ({"decode_floor": 4}, "autoscaler.decode_floor", "allowed keys are decode_min_replicas, fill_min_replicas"),
])
def test_hysteretic_floor_is_validated(params, field, says):
    from tokenfactory.core.validation import ConfigError

    with pytest.raises(ConfigError) as exc:
        build_autoscalers("hysteretic", _hysteretic_ctx(), params)
    assert exc.value.field == field and says in str(exc.value)


def test_hysteretic_floor_metadata_is_documented():
    from tokenfactory.core.validation import config_schema
    from tokenfactory.registry import AUTOSCALER_KINDS, HystereticParams

    rows = {r["name"]: r for r in config_schema(HystereticParams)}
    assert set(rows) == set(AUTOSCALER_KINDS["hysteretic"].keys) == {"fill_min_replicas", "decode_min_replicas"}
    assert rows["decode_min_replicas"]["low"] == 1 and "decode workers" in rows["decode_min_replicas"]["meaning"]


# --------------------------------------------------------------------------------------------
# property: the pool controller holds on random small plants, in the pool model and the request
# simulator (1-4 workers per pool, start-up 30-600 s, warm-up at half speed, measurement delay
# 1-30 s, load 0.3-1.5 x the initial pools' capacity, one burst of 1-5 x for 30-300 s)

from tokenfactory.controllers import CHURN_MIN_REVERSALS, judge_actuators  # noqa: E402
from tokenfactory.registry import PlantContext, build_autoscalers  # noqa: E402

#: examples per plant: few by default (CI runs them derandomized), many under -m slow
POOL_EXAMPLES, DES_EXAMPLES = 8, 2
SLOW_POOL_EXAMPLES, SLOW_DES_EXAMPLES = 60, 12


@st.composite
def small_plants(draw):
    return {"fill_workers": draw(st.integers(1, 4)), "decode_workers": draw(st.integers(1, 4)),
            "startup_s": draw(st.floats(30.0, 600.0)), "warmup_s": draw(st.floats(0.0, 60.0)),
            "delay_s": draw(st.floats(1.0, 30.0)), "load": draw(st.floats(0.3, 1.5)),
            "burst_factor": draw(st.floats(1.0, 5.0)), "burst_s": draw(st.floats(30.0, 300.0)),
            "burst_at": draw(st.floats(0.2, 0.6)), "seed": draw(st.integers(0, 2 ** 16))}


def _demand(base: float, plant: dict, duration: float) -> pd.Series:
    """Piecewise-constant demand: ``base`` with one burst."""
    t0 = plant["burst_at"] * duration
    return pd.Series([base, base * plant["burst_factor"], base], index=[0.0, t0, t0 + plant["burst_s"]])


def _assert_holds(res, start_s: float, hours: float, plant: dict):
    v = judge_actuators(res.series, res.actions, start_s=start_s)
    scale = res.actions[res.actions["kind"] == "scale"] if len(res.actions) else res.actions
    from tokenfactory.core.signals import count_reversals

    # at most 2 reversals per hour of run per pool (each pool follows its own demand); a run shorter
    # than an hour may still resize once and follow its burst up and back down (2 reversals, the
    # churn verdict's CHURN_MIN_REVERSALS)
    allowed = max(2.0 * hours, CHURN_MIN_REVERSALS)
    for pool in ("fill", "decode"):
        rows = scale[scale["pool"] == pool].to_dict("records") if len(scale) else []
        assert count_reversals(rows) <= allowed, (plant, pool, scale[["time_s", "pool", "from", "to"]].to_string())
    assert not v.oscillating, (plant, v.reason)


def _pool_model_holds(plant: dict):
    from tokenfactory.studies.reconfiguration import SHAPE, fluid_params

    fp = fluid_params(SHAPE, measurement_delay_s=plant["delay_s"])
    dyn = PoolDynamics(startup_s=plant["startup_s"], warmup_s=plant["warmup_s"], warmup_factor=0.5)
    nf, nd = plant["fill_workers"], plant["decode_workers"]
    duration = 3600.0
    ctx0 = PlantContext(fp, nf, nd, slo_ttft_s=2.0, slo_tpot_s=0.155, rate_rps=1.0, dynamics=dyn)
    mu_f, mu_d = (c.per_worker_rps for c in build_autoscalers("hysteretic", ctx0))
    base = plant["load"] * min(nf * mu_f, nd * mu_d)
    demand = _demand(base, plant, duration)
    ctx = PlantContext(fp, nf, nd, slo_ttft_s=2.0, slo_tpot_s=0.155, rate_rps=base, dynamics=dyn)
    sc = PoolScenario(demand, duration, dt=0.5, control_start_s=60.0, seed=plant["seed"], slo_ttft_s=2.0,
                      slo_tpot_s=0.155)
    r = simulate_pools(fp, nf, nd, sc, controllers=build_autoscalers("hysteretic", ctx), dynamics=dyn)
    _assert_holds(r, 60.0, duration / 3600.0, plant)


def _request_simulator_holds(plant: dict):
    from tokenfactory.replay import build_replay, run_replay

    duration = 1800.0
    # the small plant's MoE; 1,000-token outputs keep a decode worker near 1 req/s (a cheap run)
    plant_cfg = {"model": str(SMALL_PLANT / "model.toml"), "hardware": "h100-sxm",
                 "parallelism": {"tp": 2, "pp": 1, "ep": 2}}
    dyn = {"startup_s": plant["startup_s"], "warmup_s": plant["warmup_s"], "warmup_factor": 0.5, "gpus_per_worker": 2}

    def requests(rate):
        rng = np.random.default_rng(plant["seed"])
        demand = _demand(rate, plant, duration)
        t, out = 0.0, []
        while True:  # Poisson arrivals at the piecewise-constant rate (thinning at the burst's rate)
            t += rng.exponential(1.0 / (rate * plant["burst_factor"]))
            if t >= duration:
                break
            if rng.random() * rate * plant["burst_factor"] <= demand[demand.index <= t].iloc[-1]:
                out.append(t)
        n = len(out)
        return pd.DataFrame({"arrival_s": out, "input_tokens": np.full(n, 1500), "output_tokens": np.full(n, 1000),
                             "cached_tokens": np.zeros(n, dtype=int)})

    proto = requests(1.0)
    setup = build_replay(proto, plant_cfg)
    from tokenfactory.plant_models.fleet import PoolDynamics as Dyn

    ctx = setup.context(2.0, 0.05, rate_rps=1.0, dynamics=Dyn(**dyn))
    mu_f, mu_d = (c.per_worker_rps for c in build_autoscalers("hysteretic", ctx))
    nf, nd = plant["fill_workers"], plant["decode_workers"]
    trace = requests(plant["load"] * min(nf * mu_f, nd * mu_d))
    cluster = {"fill_workers": nf, "decode_workers": nd, "measurement_delay_s": plant["delay_s"],
               "slo_ttft_s": 2.0, "slo_tpot_s": 0.05, "dynamics": dyn, "seed": plant["seed"], "progress": False}
    _, res = run_replay(trace, build_replay(trace, plant_cfg), "open", 1.0, cluster, autoscaler="hysteretic")
    _assert_holds(res, 0.0, res.metrics["duration_s"] / 3600.0, plant)


@settings(max_examples=POOL_EXAMPLES)
@given(small_plants())
def test_pool_controller_holds_on_random_small_plants_pool_model(plant):
    _pool_model_holds(plant)


@settings(max_examples=DES_EXAMPLES)
@given(small_plants())
def test_pool_controller_holds_on_random_small_plants_request_simulator(plant):
    _request_simulator_holds(plant)


@pytest.mark.slow
@settings(max_examples=SLOW_POOL_EXAMPLES)
@given(small_plants())
def test_pool_controller_holds_on_many_small_plants_pool_model(plant):
    _pool_model_holds(plant)


@pytest.mark.slow
@settings(max_examples=SLOW_DES_EXAMPLES)
@given(small_plants())
def test_pool_controller_holds_on_many_small_plants_request_simulator(plant):
    _request_simulator_holds(plant)
