"""The loop model of Dynamo's planner against the real planner (ai-dynamo 1.4.2, the ``dev``
extra) on the pool model: a plateau that cycles, one that holds, and what is not modelled."""

import types

import numpy as np
import pytest

from tokenfactory.controllers.dynamo_planner_loop import (certify_planner, planner_pool_loops, planner_startup_peak,
                                                          predict_planner_cycle)
from tokenfactory.controllers.formats import parse_control_plane
from tokenfactory.controllers.formats.common import NotModelled
from tokenfactory.plant_models import FluidParams, RequestShape, Worker
from tokenfactory.plant_models.fleet import PoolDynamics
from tokenfactory.plant_models.pools import PoolScenario, simulate_pools

CONFIG = """\
optimization_target: load
load_adjustment_interval: 10
prefill_scale_up_queue_tokens: 8192
prefill_scale_down_queue_tokens: 819
decode_scale_up_kv_rate: 90   # a comment kept
decode_scale_down_kv_rate: 60
max_gpu_budget: 256
min_endpoint: 1
"""
STARTUP, WARMUP = 120.0, 30.0


@pytest.fixture(scope="module")
def plant():
    w = Worker.from_dict({"model": "deepseek-v3", "hardware": "h200"})
    return FluidParams.from_workers(w, w, RequestShape(2048, 512))


def loops(setting, p, workers):
    return planner_pool_loops(setting, p, demand_rps=workers * p.decode_capacity(1), metric_delay_s=p.measurement_delay_s,
                              startup_s=STARTUP, warmup_s=WARMUP, gpus_per_worker=8)


def real_planner(setting, p, workers, duration=1200.0):
    """The real planner on the pool model at a constant demand from 1 + 1 workers."""
    dyn = PoolDynamics(startup_s=STARTUP, warmup_s=WARMUP)
    ctx = types.SimpleNamespace(params=p, service=None, dynamics=dyn, slo_ttft_s=2.0, slo_tpot_s=0.155,
                                max_replicas=16)
    res = simulate_pools(p, 1, 1, PoolScenario(workers * p.decode_capacity(1), duration, dt=1.0, seed=1,
                                               control_start_s=60.0, slo_ttft_s=2.0, slo_tpot_s=0.155),
                         controllers=[setting.build(None, ctx)], dynamics=dyn)
    return res


def ups(res, pool="decode", after=300.0):
    a = res.actions
    a = a[(a["kind"] == "scale") & (a["pool"] == pool) & (a["time_s"] >= after)]
    return a[a["to"] > a["from"]]["time_s"].to_numpy()


def test_plateau_cycle_predicted_and_simulated(plant):
    """1.05 decode workers' demand: no pool size sits inside the 60-90 % KV band (1 worker reads
    100 %, 2 read 52.5 %), so the model predicts a 1 <-> 2 cycle; the real planner cycles, at the
    predicted period within 20 %."""
    s = parse_control_plane(CONFIG)
    cyc = predict_planner_cycle(loops(s, plant, 1.05)["decode"])
    assert cyc is not None and (cyc.low_replicas, cyc.high_replicas) == (1, 2)
    res = real_planner(s, plant, 1.05)
    t = ups(res)
    assert len(t) >= 3
    simulated = float(np.diff(t).mean())
    assert simulated == pytest.approx(cyc.period_s, rel=0.2)
    n = res.series[res.series["time_s"] >= 300]["decode_workers"]
    assert (n.min(), n.max()) == (1, 2)


def test_holding_plateau_and_startup_peak(plant):
    """1.5 workers' demand: 2 workers read 75 %, inside the band - no decode cycle predicted, and the
    start-up from 1 worker peaks at 3 (the backlog of the start-up keeps 2 workers above 90 %);
    the real planner does both."""
    s = parse_control_plane(CONFIG)
    d = loops(s, plant, 1.5)["decode"]
    assert predict_planner_cycle(d) is None
    assert planner_startup_peak(d, 1) == 3
    res = real_planner(s, plant, 1.5, duration=900.0)
    a = res.actions[(res.actions["kind"] == "scale") & (res.actions["pool"] == "decode")]
    assert int(a["to"].max()) == 3
    late = res.series[res.series["time_s"] >= 500]["decode_workers"]
    assert late.nunique() == 1 and late.iloc[0] == 2


def test_narrower_band_holds_where_default_cycles(plant):
    """The knob the model says matters: a scale-down level under 52.5 % (what 2 workers read at 1.05)
    holds 2 workers where 60 % cycles, and the certificate passes."""
    s = parse_control_plane(CONFIG).with_params(decode_scale_down_kv_rate=50.0)
    c = certify_planner(loops(s, plant, 1.05)["decode"])
    assert c.predicted_cycle is None and c.passed
    assert not certify_planner(loops(parse_control_plane(CONFIG), plant, 1.05)["decode"]).passed


def test_targets_the_loop_model_covers_and_the_one_it_names(plant):
    """load, throughput and sla have loop models (the sla one in dynamo_planner_sla_loop); the
    latency target, which the adapter does not run, is NotModelled naming the field."""
    sla = parse_control_plane(CONFIG.replace("optimization_target: load", "optimization_target: sla")
                              + "fpm_sample_bucket_size: 1\n")
    assert loops(sla, plant, 1.0)["decode"].signal == "ITL estimate"
    latency = parse_control_plane(CONFIG.replace("optimization_target: load", "optimization_target: latency"))
    with pytest.raises(NotModelled, match="optimization_target"):
        loops(latency, plant, 1.0)


def test_gpu_budget_counts_each_pool_at_its_own_gpus(plant):
    """max_gpu_budget counts GPUs across pools: with 4-GPU prefill and 8-GPU decode workers and
    min_endpoint 1, a pool's ceiling is what the budget leaves after the other pool's floor, at its
    own GPUs; the scalar 8 gives 256 // 8 - 1 to both; the adapter tells Dynamo each pool's GPUs."""
    s = parse_control_plane(CONFIG)
    kw = dict(demand_rps=4 * plant.decode_capacity(1), metric_delay_s=plant.measurement_delay_s, startup_s=STARTUP,
              warmup_s=WARMUP)
    per_pool = planner_pool_loops(s, plant, gpus_per_worker={"fill": 4, "decode": 8}, **kw)
    assert per_pool["fill"].max_replicas == (256 - 1 * 8) // 4 == 62
    assert per_pool["decode"].max_replicas == (256 - 1 * 4) // 8 == 31
    scalar = planner_pool_loops(s, plant, gpus_per_worker=8, **kw)
    assert scalar["fill"].max_replicas == scalar["decode"].max_replicas == 256 // 8 - 1
    from tokenfactory.controllers.dynamo_planner import DynamoCapabilities

    ctx = types.SimpleNamespace(params=plant, service=None,
                                dynamics=PoolDynamics(gpus_per_worker={"fill": 4, "decode": 8}))
    caps = DynamoCapabilities.from_context(ctx)
    assert (caps.gpus_per_worker, caps.decode_gpus_per_worker) == (4, 8)
