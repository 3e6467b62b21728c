"""NVIDIA Dynamo's own planner (ai-dynamo 1.4.2, the ``dynamo`` extra) in the pool model and the
request simulator: the adapter's inputs reach the real planner's rules, its decisions are applied
with the plant's start-up, they are reproducible, and bad configs are clear errors.

The package is part of ``.[dev]``: these tests run, never skip, wherever the project's tests run."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from tokenfactory import ConfigError
from tokenfactory.controllers.dynamo_planner import DynamoCapabilities, DynamoPlanner, dynamo_versions, planner_config
from tokenfactory.plant_models import FluidParams, PoolDynamics, RequestShape, ServiceModel, Worker
from tokenfactory.plant_models.pools import PoolScenario, simulate_pools
from tokenfactory.registry import PlantContext, build_autoscalers
from tokenfactory.core.signals import Measurement, ScaleAction
from tokenfactory.testing import assert_conserved

STARTUP_S = 60.0


@pytest.fixture(scope="module")
def plant():
    """DeepSeek-V3 on 8 x H200 fill and decode workers at a 2048/512 request, 60 s start-up."""
    w = Worker.from_dict({"model": "deepseek-v3", "hardware": "h200"})
    svc = ServiceModel(w, w, RequestShape(2048, 512))
    fp = FluidParams.from_service(svc)
    dyn = PoolDynamics(startup_s=STARTUP_S)
    return fp, dyn, PlantContext(fp, 1, 1, dynamics=dyn, service=svc, max_replicas=16)


def ramp(fp, peak_decode_workers=6.0, duration=1800.0):
    """A ramp over the first third to a plateau needing ``peak_decode_workers`` decode workers."""
    t = np.arange(0.0, duration, 30.0)
    return pd.Series(np.clip(t / (duration / 3), 0.05, 1.0) * peak_decode_workers * fp.decode_capacity(1), index=t)


def run(plant, mode, predictor="constant", duration=1800.0, seed=1, config=None):
    fp, dyn, ctx = plant
    [c] = build_autoscalers("dynamo-planner", ctx, {"mode": mode, "predictor": predictor,
                                                     "planner_config": config or {}})
    res = simulate_pools(fp, 1, 1, PoolScenario(ramp(fp, duration=duration), duration, dt=1.0, seed=seed),
                         controllers=[c], dynamics=dyn)
    return c, res


def test_the_extra_is_installed_at_the_pinned_version():
    v = dynamo_versions()
    assert v == {"ai-dynamo": "1.4.2", "ai-dynamo-runtime": "1.4.2"}
    import dynamo.planner  # noqa: F401 - imports its predictors' libraries (pmdarima, prophet, ...) at top


def test_capabilities_come_from_the_service_model(plant):
    fp, dyn, ctx = plant
    caps = DynamoCapabilities.from_context(ctx)
    svc = ctx.service
    wc = caps.worker_capabilities()
    assert wc.prefill.max_num_batched_tokens == svc.fill_token_budget
    assert wc.decode.max_num_seqs == int(fp.decode_slots_per_worker)
    assert wc.decode.max_kv_tokens == int(fp.decode_slots_per_worker * svc.decode_context_tokens)
    assert wc.decode.context_length == 2048 + 512 and wc.decode.num_gpu == dyn.gpus_per_worker
    pre, dec = caps.profile_fpms()
    # the bootstrap profile is the service model's pass times
    assert pre[-1].wall_time == pytest.approx(svc.fill_step_s(svc.fill_token_budget))
    b, kv = dec[-1].scheduled_requests.num_decode_requests, dec[-1].scheduled_requests.sum_decode_kv_tokens
    assert dec[-1].wall_time == pytest.approx(svc.decode_pass_s(b, kv / b), rel=1e-3)


def _m(nf, nd, *, queued_tokens=0.0, active=0.0, ready=0.0, starting=(0, 0), slots=933.0):
    return Measurement(time_s=0.0, backlog=0.0, fill_in_progress=queued_tokens / 2048, ready=ready,
                       active_decodes=active, completion_rate=0.0, admitted_rate=0.0, decode_slots=nd * slots,
                       fill_capacity=45.0 * nf, fill_workers=nf, decode_workers=nd, fill_workers_starting=starting[0],
                       decode_workers_starting=starting[1], arrival_rate=10.0, fill_queued_tokens=queued_tokens,
                       decode_context_tokens=2560.0)


def test_throughput_target_rules_reach_the_real_planner(plant):
    """Dynamo's default target: +1 prefill when a worker's queue holds a context's worth of tokens
    (load_scaling.py _PREFILL_THROUGHPUT_SCALE_UP = 1.0), +1 decode above 100 % KV, -1 below 60 %."""
    caps = DynamoCapabilities.from_context(plant[2])
    p = DynamoPlanner(caps, "throughput")
    ctx_len = 2048 + 512
    kv_per_worker = caps.max_kv_tokens
    # 2 fill workers with 1.5 contexts queued each; 2 decode workers at 110 % KV (active + ready)
    full = 1.1 * kv_per_worker / 2560.0
    out = p.update(5.0, _m(2, 2, queued_tokens=2 * (1.5 * ctx_len + caps.fill_token_budget), active=2 * full))
    assert out == [ScaleAction("fill", 3), ScaleAction("decode", 3)]
    # while the new workers start, Dynamo observes only (disagg: both pools frozen)
    assert p.update(10.0, _m(2, 2, starting=(1, 1))) == []
    assert p.decisions[-1]["load_reason"] == "scaling_in_progress"
    # once serving, a quiet plant (< 10 % of a context queued, < 60 % KV) scales each pool down by one
    out = p.update(15.0, _m(3, 3, queued_tokens=0.0, active=3 * 0.3 * kv_per_worker / 2560.0))
    assert out == [ScaleAction("fill", 2), ScaleAction("decode", 2)]


@pytest.mark.parametrize("mode,predictor", [("throughput", "constant"), ("load", "constant"), ("sla", "constant"),
                                            ("sla", "kalman")])
def test_modes_follow_a_ramp_in_the_pool_model(plant, mode, predictor):
    c, res = run(plant, mode, predictor)
    assert_conserved(res)
    peak = res.metrics["peak_workers"]
    assert peak["decode"] >= 3, (mode, peak)  # the ramp needs ~6 decode workers
    assert res.metrics["scale_actions"] > 0
    # decisions are applied with the plant's start-up: a worker asked for at t serves at t + start-up
    ups = res.actions[(res.actions["pool"] == "decode") & (res.actions["to"] > res.actions["from"])]
    s = res.series.set_index("time_s")
    t0 = float(ups["time_s"].iloc[0])
    assert s.loc[t0 + STARTUP_S - 2.0, "decode_workers"] == ups["from"].iloc[0]
    assert s.loc[t0 + STARTUP_S + 2.0, "decode_workers"] > ups["from"].iloc[0]
    assert res.config["controllers"][0]["versions"]["ai-dynamo"] == "1.4.2"
    assert res.config["controllers"][0]["mode"] == mode


def test_sla_throughput_scaling_sets_the_lower_bound_with_arima(plant):
    """sla with load + throughput scaling: every 180 s the ARIMA-predicted demand sets a lower bound
    under the load rule."""
    c, res = run(plant, "sla", "arima", duration=600.0)
    assert_conserved(res)
    thr = [d for d in c.decisions if d["throughput"]]
    assert len(thr) == 3 and {d["throughput_reason"] for d in thr} <= {"set_lower_bound", "model_not_ready",
                                                                          "predict_failed", "no_traffic_data"}
    assert any(d["throughput_reason"] == "set_lower_bound" for d in thr)
    assert c.predictor == "arima"


def test_decisions_are_reproducible(plant):
    a, ra = run(plant, "sla", "kalman", duration=900.0, seed=3)
    b, rb = run(plant, "sla", "kalman", duration=900.0, seed=3)
    pd.testing.assert_frame_equal(ra.actions, rb.actions)
    assert a.decisions == b.decisions and len(ra.actions) > 0
    # a controller object runs again from reset(): same decisions a third time
    res = simulate_pools(plant[0], 1, 1, PoolScenario(ramp(plant[0], duration=900.0), 900.0, dt=1.0, seed=3),
                         controllers=[a], dynamics=plant[1])
    pd.testing.assert_frame_equal(res.actions, ra.actions)


def test_in_the_request_simulator(des_params):
    from conftest import poisson_trace
    from tokenfactory.plant_models import ClusterConfig, simulate

    w = Worker.from_dict({"model": "deepseek-v3", "hardware": "h200"})
    svc = ServiceModel(w, w, RequestShape(2048, 256))
    fp = FluidParams.from_service(svc)
    dyn = PoolDynamics(startup_s=30.0)
    ctx = PlantContext(fp, 1, 1, dynamics=dyn, service=svc, max_replicas=8)
    [c] = build_autoscalers("dynamo-planner", ctx, {"mode": "throughput"})
    trace = poisson_trace(3.0 * fp.decode_capacity(1), 240.0, 5, out_mean=256)
    cl = ClusterConfig(fill_workers=1, decode_workers=1, dynamics=dyn, duration_s=300.0, snapshot_dt=0.5)
    res = simulate(trace, des_params, cl, autoscalers=[c])
    m = res.metrics
    assert m["requests"] == m["completed"] + m["rejected"] + m["in_flight_end"]
    assert len(c.decisions) >= 50 and res.metrics["scale_actions"] >= 1
    assert res.config["autoscalers"][0]["versions"]["ai-dynamo"] == "1.4.2"


@pytest.mark.parametrize("cfg,field", [({"no_such_field": 1}, "planner_config.no_such_field"),
                                       ({"environment": "kubernetes"}, "planner_config.environment"),
                                       ({"ttft_ms": -5.0, "optimization_target": "sla"}, "planner_config"),
                                       ({"load_predictor": "crystal-ball"}, "planner_config.load_predictor"),
                                       ({"optimization_target": "speed"}, "planner.mode")])
def test_bad_planner_config(plant, cfg, field):
    with pytest.raises(ConfigError, match=field):
        build_autoscalers("dynamo-planner", plant[2], {"planner_config": cfg})


def test_config_fields_are_dynamos_own(plant):
    """The config's optimization_target and load_predictor pick the mode and predictor; every other
    field goes to Dynamo's PlannerConfig unchanged."""
    [c] = build_autoscalers("dynamo-planner", plant[2], {"planner_config": {
        "optimization_target": "sla", "load_predictor": "kalman", "throughput_adjustment_interval_seconds": 60,
        "load_adjustment_interval_seconds": 10}})
    assert c.mode == "sla" and c.predictor == "kalman"
    assert c.config.throughput_adjustment_interval_seconds == 60 and c.sample_period == 10.0
    cfg = planner_config("throughput")
    assert cfg.optimization_target == "throughput" and cfg.enable_load_scaling and not cfg.enable_throughput_scaling


def test_cli_planner_config_file(tmp_path):
    from tokenfactory.cli import main

    f = tmp_path / "planner.yaml"
    f.write_text("optimization_target: load\nprefill_scale_up_queue_tokens: 20000\n"
                 "prefill_scale_down_queue_tokens: 2000\ndecode_scale_up_kv_rate: 85\ndecode_scale_down_kv_rate: 50\n")
    out = tmp_path / "out"
    assert main(["simulate", "--trace", "synthetic", "--duration", "3m", "--scale", "5", "--autoscaler",
                 "dynamo-planner", "--planner-config", str(f), "--admission", "open", "--no-progress",
                 "--out", str(out)]) == 0
    m = json.loads((out / "metrics.json").read_text())
    a = m["config"]["autoscalers"][0]
    assert a["mode"] == "load" and a["versions"] == {"ai-dynamo": "1.4.2", "ai-dynamo-runtime": "1.4.2"}
    assert a["planner_config_overrides"]["decode_scale_up_kv_rate"] == 85
    assert m["requests"] == m["completed"] + m["rejected"] + m["in_flight_end"]
    assert main(["simulate", "--trace", "synthetic", "--planner-config", str(f)]) == 2  # needs the kind


def _decode_fpm_stream(svc, n=120, seed=0):
    from dynamo.common.forward_pass_metrics import ForwardPassMetrics, QueuedRequestMetrics, ScheduledRequestMetrics

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        b, c, q = int(rng.integers(1, 900)), int(rng.integers(500, 2560)), int(rng.integers(0, 300))
        wall = float(svc.decode_pass_s(b, c)) * (1 + 0.05 * rng.standard_normal())
        out.append({(f"d{j}", 0): ForwardPassMetrics(
            worker_id=f"d{j}", wall_time=wall,
            scheduled_requests=ScheduledRequestMetrics(num_decode_requests=b, sum_decode_kv_tokens=b * c),
            queued_requests=QueuedRequestMetrics(num_decode_requests=q, sum_decode_kv_tokens=q * 2048))
            for j in range(2)})
    return out


@pytest.mark.parametrize("buckets,reproducible", [(1, True), (16, False)])
def test_why_sla_mode_keeps_one_fpm_bucket(plant, buckets, reproducible):
    """Dynamo's Rust perf model, fed identical FPMs, gives identical capacity estimates across
    instances only with one retention bucket (Dynamo's default 16 evicts in a per-instance order).
    If a later ai-dynamo fixes this, the 16-bucket case fails: drop the adapter's override then."""
    caps = DynamoCapabilities.from_context(plant[2])
    stream = _decode_fpm_stream(plant[2].service)
    runs = []
    for _ in range(3):
        p = DynamoPlanner(caps, "sla", config={"fpm_sample_bucket_size": buckets})
        reg = p._engine._scaling_state._decode_regression
        est = []
        for obs in stream:
            reg.add_observations(obs)
            est.append(reg.find_engine_capacity_rps(isl=2048, osl=512, itl_sla_ms=100.0).rps)
        runs.append(est)
    assert (runs[0] == runs[1] == runs[2]) is reproducible


def test_cli_planner_config_needs_a_kind_that_takes_it(tmp_path, capsys):
    from tokenfactory.cli import main

    f = tmp_path / "planner.json"
    f.write_text('{"optimization_target": "throughput"}')
    assert main(["simulate", "--trace", "synthetic", "--duration", "1m", "--autoscaler", "hpa",
                 "--planner-config", str(f), "--no-progress", "--out", str(tmp_path / "o")]) == 2
    assert "planner_config" in capsys.readouterr().err
