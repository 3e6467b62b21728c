"""The loop model of Dynamo's planner at its ``sla`` target (and the throughput target's static
levels) against the real planner (ai-dynamo 1.4.2, the ``dev`` extra) on the pool model: the pool
size it holds, the floor's rounding flip, and the consolidation-aware rule's lack of a mean cycle."""

import types

import numpy as np
import pytest

from tokenfactory.controllers.dynamo_planner_loop import certify_planner, planner_pool_loops, predict_planner_cycle
from tokenfactory.controllers.formats import parse_control_plane
from tokenfactory.plant_models import FluidParams, PoolDynamics, RequestShape, ServiceModel, Worker
from tokenfactory.plant_models.pools import PoolScenario, simulate_pools
from tokenfactory.testing import assert_conserved

STARTUP = 60.0


def sla_config(itl_ms=150, load="true", sensitivity=80):
    return (f"optimization_target: sla\nitl_ms: {itl_ms}\nttft_ms: 2000\nfpm_sample_bucket_size: 1\n"
            f"enable_load_scaling: {load}\nthroughput_adjustment_interval_seconds: 60\n"
            f"load_adjustment_interval_seconds: 10\nload_scaling_down_sensitivity: {sensitivity}\n"
            "max_gpu_budget: 256\nload_predictor: constant\n")


@pytest.fixture(scope="module")
def plant():
    """DeepSeek-V3 on 8 x H200 at a 2048/512 request: a decode pass of 116 ms at its 933 slots."""
    w = Worker.from_dict({"model": "deepseek-v3", "hardware": "h200"})
    svc = ServiceModel(w, w, RequestShape(2048, 512))
    return FluidParams.from_service(svc), svc


def decode_loop(setting, p, workers):
    return planner_pool_loops(setting, p, demand_rps=workers * p.decode_capacity(1), metric_delay_s=p.measurement_delay_s,
                              startup_s=STARTUP, gpus_per_worker=8)["decode"]


def real_planner(setting, plant, workers, duration=1200.0):
    p, svc = plant
    dyn = PoolDynamics(startup_s=STARTUP)
    ctx = types.SimpleNamespace(params=p, service=svc, dynamics=dyn, slo_ttft_s=2.0, slo_tpot_s=0.15, max_replicas=32)
    res = simulate_pools(p, 1, 1, PoolScenario(workers * p.decode_capacity(1), duration, dt=1.0, seed=1,
                                               control_start_s=30.0), controllers=[setting.build(None, ctx)], dynamics=dyn)
    assert_conserved(res)
    return res


def late_decode(res, after):
    return res.series[res.series["time_s"] >= after]["decode_workers"]


@pytest.mark.parametrize("sensitivity", [50, 80, 100])
@pytest.mark.parametrize("workers", [0.4, 0.9, 1.5, 2.5, 3.4, 5.2])
def test_consolidation_aware_rule_has_no_mean_cycle(plant, workers, sensitivity):
    """Up from n needs ITL(n) > target and down from n + 1 needs ITL(n) < s x target: never both
    for s <= 1, so with load scaling on the model never predicts a mean cycle, and some pool size holds."""
    d = decode_loop(parse_control_plane(sla_config(sensitivity=sensitivity)), plant[0], workers)
    assert any(d.rule(n) == 0 for n in range(1, 33))
    cyc = predict_planner_cycle(d)
    assert cyc is None or cyc.noise_driven   # only the floor's rounding noise can move it


def test_floor_and_held_size_follow_the_plant(plant):
    """150 ms ITL target above the full-batch pass (116 ms): one worker's rate at the target is its
    full rate, so the floor is ceil(demand / rate) and the rule holds it."""
    p = plant[0]
    d = decode_loop(parse_control_plane(sla_config()), p, 2.5)
    assert d.engine_rps == pytest.approx(p.decode_capacity(1), rel=1e-6)
    assert d.floor_replicas == 3 and d.rule(3) == 0 and d.rule(2) == 1 and d.rule(4) == -1
    c = certify_planner(d)
    assert c.passed and c.margins is not None and c.margins.stable
    # a 100 ms target sits on the pass curve's flat part: fewer sequences per worker, more workers
    d100 = decode_loop(parse_control_plane(sla_config(itl_ms=100)), p, 2.5)
    assert d100.engine_rps < 0.5 * d.engine_rps and d100.floor_replicas > 2 * d.floor_replicas


def test_held_size_matches_the_real_planner(plant):
    """The prediction against the real planner's decisions: 2.5 workers' demand holds 3."""
    s = parse_control_plane(sla_config())
    d = decode_loop(s, plant[0], 2.5)
    held = next(n for n in range(1, 33) if d.rule(n) == 0)
    late = late_decode(real_planner(s, plant, 2.5, duration=900.0), 600.0)
    assert late.nunique() == 1 and late.iloc[0] == held == 3


@pytest.mark.slow
@pytest.mark.parametrize("load,workers,expected", [("true", 0.5, 1), ("true", 1.5, 2), ("true", 3.4, 4),
                                                   ("false", 1.5, 2), ("false", 3.4, 4)])
def test_held_sizes_at_several_demands(plant, load, workers, expected):
    s = parse_control_plane(sla_config(load=load))
    d = decode_loop(s, plant[0], workers)
    assert predict_planner_cycle(d) is None
    assert next(n for n in range(1, 33) if d.rule(n) == 0) == expected
    late = late_decode(real_planner(s, plant, workers, duration=1800.0), 900.0)
    assert late.nunique() == 1 and late.iloc[0] == expected


@pytest.mark.parametrize("load,sensitivity,cycles", [("false", 80, True),
                                                     pytest.param("true", 80, True, marks=pytest.mark.slow),
                                                     pytest.param("true", 50, False, marks=pytest.mark.slow)])
def test_floor_rounding_flip(plant, load, sensitivity, cycles):
    """2.97 workers' demand: the predicted demand's noise over a 60 s window (sigma 0.9 req/s)
    straddles 3 workers' rate, so the floor flips 3 <-> 4. Without load scaling nothing holds 4;
    with it, 3 workers' ITL (116 ms) is under 80 % of the 150 ms target, so the rule lets the 4th go
    too - a noise-driven cycle the certificate fails. At 50 % the refused scale-down holds 4 (a
    ratchet of one worker). The real planner does each."""
    s = parse_control_plane(sla_config(load=load, sensitivity=sensitivity))
    d = decode_loop(s, plant[0], 2.97)
    assert d.floor_flip
    cert = certify_planner(d)
    if cycles:
        cyc = cert.predicted_cycle
        assert cyc is not None and cyc.noise_driven and (cyc.low_replicas, cyc.high_replicas) == (3, 4)
        assert not cert.passed
    else:
        assert cert.predicted_cycle is None and cert.passed
    late = late_decode(real_planner(s, plant, 2.97, duration=1500.0), 600.0)
    assert (late.min(), late.max()) == ((3, 4) if cycles else (4, 4))


def test_throughput_target_uses_dynamos_static_levels(plant):
    """The throughput target is the load relay at Dynamo's fixed levels (KV 60-100 %, prefill 0.1-1 x
    the context): 1.5 workers' demand holds 2 decode workers, as the real planner does (slow test)."""
    s = parse_control_plane("optimization_target: throughput\nload_adjustment_interval: 10\nmax_gpu_budget: 256\n")
    loops = planner_pool_loops(s, plant[0], demand_rps=1.5 * plant[0].decode_capacity(1),
                               metric_delay_s=plant[0].measurement_delay_s, startup_s=STARTUP, gpus_per_worker=8)
    d, f = loops["decode"], loops["fill"]
    assert (d.up, d.down) == (1.0, 0.6)
    assert (f.up, f.down) == pytest.approx((2560.0, 256.0))
    assert predict_planner_cycle(d) is None and d.rule(2) == 0


@pytest.mark.slow
def test_throughput_target_decode_matches_the_real_planner(plant):
    s = parse_control_plane("optimization_target: throughput\nload_adjustment_interval: 10\nmax_gpu_budget: 256\n")
    for workers, expected in ((0.5, 1), (1.5, 2), (2.5, 3)):
        d = planner_pool_loops(s, plant[0], demand_rps=workers * plant[0].decode_capacity(1),
                               metric_delay_s=plant[0].measurement_delay_s, startup_s=STARTUP,
                               gpus_per_worker=8)["decode"]
        assert next(n for n in range(1, 33) if d.rule(n) == 0) == expected
        late = late_decode(real_planner(s, plant, workers, duration=1500.0), 700.0)
        assert late.nunique() == 1 and late.iloc[0] == expected
    assert np.isfinite(d.gain)


@pytest.mark.parametrize("min_endpoint,flips", [(1, True), (3, True), (4, False), (6, False)])
def test_floor_flip_needs_the_noise_to_straddle_above_min_endpoint(plant, min_endpoint, flips):
    """2.97 workers' demand: the predicted demand's +-2 sigma (60 s window) puts the floor's ceil at
    3 or 4 (``max(ceil(demand / engine_rps), min_endpoint)``, throughput_scaling.py). Without load
    scaling nothing holds 4, so a floor of 1 or 3 cycles 3 <-> 4; a min_endpoint of 4 or more pins
    both sides of the noise to it: no flip, no cycle, the certificate passes."""
    s = parse_control_plane(sla_config(load="false") + f"min_endpoint: {min_endpoint}\n")
    d = decode_loop(s, plant[0], 2.97)
    assert d.floor_steps() == (max(3, min_endpoint), max(4, min_endpoint))
    assert d.floor_flip is flips
    cert = certify_planner(d)
    if flips:
        cyc = cert.predicted_cycle
        assert cyc is not None and cyc.noise_driven and (cyc.low_replicas, cyc.high_replicas) == (3, 4)
        assert not cert.passed
    else:
        assert d.floor_cycle() is None and cert.predicted_cycle is None and cert.passed


def test_failure_reason_comes_from_the_certificate(plant):
    """advise's candidates.csv ``reason``: the failing level's predicted cycle, "" when all pass."""
    from tokenfactory.advise import failure_reason

    flip = certify_planner(decode_loop(parse_control_plane(sla_config(load="false")), plant[0], 2.97))
    held = certify_planner(decode_loop(parse_control_plane(sla_config(load="false") + "min_endpoint: 4\n"),
                                       plant[0], 2.97))
    c = flip.predicted_cycle
    assert failure_reason({"median decode": flip, "p90 decode": held}) == (
        f"median decode: predicts a {c.period_s:.0f} s cycle between 3 and 4 workers (noise-driven)")
    assert failure_reason({"median decode": held}) == ""


def test_sla_gpu_budget_gives_each_pool_its_own_ceiling(plant):
    """The sla loops get each pool's own ceiling from max_gpu_budget, as the load loops do: with
    4-GPU prefill and 8-GPU decode workers and min_endpoint 1 the prefill pool may grow to
    (256 - 8) // 4 and the decode pool to (256 - 4) // 8 (it was the smaller of the two for both)."""
    p, _ = plant
    s = parse_control_plane(sla_config())
    loops = planner_pool_loops(s, p, demand_rps=2 * p.decode_capacity(1), metric_delay_s=p.measurement_delay_s,
                               startup_s=STARTUP, gpus_per_worker={"fill": 4, "decode": 8})
    assert loops["fill"].max_replicas == (256 - 1 * 8) // 4 == 62
    assert loops["decode"].max_replicas == (256 - 1 * 4) // 8 == 31
    scalar = planner_pool_loops(s, p, demand_rps=2 * p.decode_capacity(1), metric_delay_s=p.measurement_delay_s,
                                startup_s=STARTUP, gpus_per_worker=8)
    assert scalar["fill"].max_replicas == scalar["decode"].max_replicas == 256 // 8 - 1
