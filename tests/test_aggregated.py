"""Aggregated serving: the roofline's mixed pass, the service model's and the request simulator's
aggregated workers - interference hand-worked, conservation, KV pressure, the fixed pool's guards."""

import math

import numpy as np
import pandas as pd
import pytest
from conftest import ConstantAdmission, poisson_trace

from tokenfactory import ConfigError
from tokenfactory.plant_models import (
    ClusterConfig,
    DESParams,
    RequestShape,
    ServiceModel,
    WorkerCrash,
    Worker,
    accelerator_preset,
    model_preset,
    simulate,
)
from tokenfactory.testing import assert_conserved


@pytest.fixture(scope="module")
def service():
    w = Worker(model_preset("deepseek-v3"), accelerator_preset("h200"))
    return ServiceModel(w, w, RequestShape(2048, 512))


@pytest.fixture(scope="module")
def params(service):
    return DESParams.from_service(service)


def test_mixed_pass_is_decode_without_a_chunk_and_grows_with_it(service):
    w = service.decode_worker
    for batch, ctx in ((1, 2300), (64, 2300), (256, 100_000), (900, 2300)):
        assert w.mixed(batch, ctx, 0).time_s == w.decode(batch, ctx, check_memory=False).time_s
        times = [w.mixed(batch, ctx, n).time_s for n in (512, 2048, 8192, 16384)]
        assert all(a < b for a, b in zip(times, times[1:])), times
        # interference: the decodes' TPOT grows with the chunk ...
        assert times[-1] > w.decode(batch, ctx, check_memory=False).time_s
        # ... but one pass costs less than a decode pass plus a separate fill step (the expert
        # weights read once serve both: section 19's shared expert set)
        assert times[-1] < w.decode(batch, ctx, check_memory=False).time_s + service.fill_step_s(16384)


def test_mixed_pass_expert_phase_sees_the_combined_tokens(service):
    """Hand-worked pieces of the roofline's mixed pass (pp = 1): its experts phase is the
    experts phase of batch + chunk tokens; its stage time is max(sum busy, sum network) plus the
    fixed per-pass cost, as every pass's."""
    w = service.decode_worker
    p = w.mixed(64, 4096, 2048)
    assert p.phase("experts").time_s == pytest.approx(w._expert_phase(64 + 2048, per_node_dedup=True).time_s)
    busy = sum(ph.busy_s for ph in p.phases)
    net = sum(ph.network_s for ph in p.phases)
    assert p.time_s == pytest.approx(max(busy, net) + w.fixed_stage_s)
    # the attention phase reads the weights once: less than the decode's and the chunk's apart
    a = p.phase("attention").hbm_bytes
    d = w.decode(64, 4096, check_memory=False).phase("attention").hbm_bytes
    f = w.midfill(2048 / 8, 0, sequences=8).phase("attention").hbm_bytes
    weights = w.model.num_layers * w.model.attention_params_per_layer * w.model.weight_bytes_per_param
    assert a == pytest.approx(d + f - weights, rel=1e-9)


def test_service_and_request_simulator_agree_on_the_mixed_pass(service, params):
    assert service.mixed_step_s(0, 1000, 4096) == service.fill_step_s(4096)
    assert service.mixed_step_s(64, 4096, 0) == service.decode_pass_s(64, 4096)
    # at grid points the request simulator's mixed pass is the service model's
    b, c, n = params.mixed_batches[2], params.mixed_contexts[1], params.mixed_tokens[3]
    t_des = params.decode_pass(int(b), c)[0] + params.mixed_extra(b, c, n)
    assert t_des == pytest.approx(service.mixed_step_s(b, c, n), rel=0.02)  # decode table interpolated in c
    assert params.mixed_extra(0, c, n) == pytest.approx(service.fill_step_s(n), rel=1e-12)


def _toy_params():
    """Constant 10 ms decode pass; a chunk of n tokens adds 1 ms per token; no KV limit."""
    ext = tuple(tuple((0.001, 1.0) for _ in range(2)) for _ in range(3))
    return DESParams(fill_token_budget=1000, fill_step_tokens=(1.0, 1000.0), fill_step_s=(0.001, 1.0),
                     fill_s_per_cached_token=0.0, kv_bytes_per_token=0.0, kv_link_bandwidth=math.inf, kv_setup_s=0.0,
                     decode_kv_capacity_bytes=math.inf, decode_batches=(1.0, 2.0), decode_contexts=(1.0, 1e9),
                     decode_table_s=((0.01, 0.01), (0.01, 0.01)), mixed_batches=(0.0, 1.0, 2.0),
                     mixed_contexts=(1.0, 1e9), mixed_tokens=(1.0, 1000.0), mixed_extra_s=ext)


@pytest.mark.parametrize("prompt_b", [50, 500])
def test_interference_hand_worked(prompt_b):
    """One aggregated worker. A (100-token prompt, 11 tokens out) arrives at 0: its prompt alone
    takes 0.1 s, so its first token is at 0.1. B (``prompt_b`` tokens, 2 out) arrives at 0.055,
    during that pass, and is taken at its end: the next pass decodes A's second token and B's
    whole prompt, 0.01 + 0.001 x prompt_b s. Then A's 9 remaining tokens take 9 x 0.01 s (B's one
    decode token rides along in the first). So A completes at 0.2 + 0.001 prompt_b and its TPOT
    is 0.01 + 0.0001 prompt_b: B's prompt slows A's decode."""
    tr = pd.DataFrame({"arrival_s": [0.0, 0.055], "input_tokens": [100, prompt_b], "cached_tokens": [0, 0],
                       "output_tokens": [11, 2]})
    r = simulate(tr, _toy_params(), ClusterConfig(fill_workers=0, decode_workers=0, aggregated_workers=1,
                                                  progress=False, prefix_cache_blocks=0))
    rec = r.records
    assert (rec["state"] == "completed").all()
    assert rec.loc[0, "first_token_s"] == pytest.approx(0.1)
    b_done = 0.1 + 0.01 + 0.001 * prompt_b
    assert rec.loc[1, "first_token_s"] == pytest.approx(b_done)
    assert rec.loc[1, "completion_s"] == pytest.approx(b_done + 0.01)
    assert rec.loc[0, "completion_s"] == pytest.approx(0.2 + 0.001 * prompt_b)
    assert rec.loc[0, "tpot_s"] == pytest.approx(0.01 + 0.0001 * prompt_b)
    # no KV transfer: the KV is ready where decode runs when the prompt is done
    assert (rec["kv_ready_s"] == rec["fill_end_s"]).all()
    assert r.metrics["utilization"]["aggregated"]["busy_fraction"] > 0


def test_conservation_under_overload_and_kv_pressure(params):
    """Overload with a bounded backlog (rejections) and a KV capacity small enough to park
    sequences: every request is completed, rejected with a reason, or in flight."""
    import dataclasses

    small = dataclasses.replace(params, decode_kv_capacity_bytes=params.kv_bytes(2600) * 40)
    tr = poisson_trace(60.0, 30.0, 4, inp=256, out_mean=2000)
    res = simulate(tr, small, ClusterConfig(fill_workers=0, decode_workers=0, aggregated_workers=2, progress=False,
                                            drain_s=20.0), ConstantAdmission(25.0, 200, sample_period=0.5))
    assert_conserved(res)
    m = res.metrics
    assert m["rejected"] > 0 and m["preempted"] > 0 and m["in_flight_end"] > 0
    assert m["requests"] == m["completed"] + m["rejected"] + m["in_flight_end"]
    done = res.records[res.records["state"] == "completed"]
    assert (done["fill_end_s"] <= done["completion_s"]).all()
    assert not (res.records["state"] == "transfer").any()


def test_aggregated_against_disaggregated_on_the_same_gpus(params):
    """Four workers either way; both serve the same light load with every request completed,
    and only the disaggregated cluster moves KV (transfer time between fill end and KV ready)."""
    tr = poisson_trace(8.0, 60.0, 7, inp=2048, out_mean=200)
    agg = simulate(tr, params, ClusterConfig(fill_workers=0, decode_workers=0, aggregated_workers=4, progress=False))
    dis = simulate(tr, params, ClusterConfig(fill_workers=2, decode_workers=2, progress=False))
    for r in (agg, dis):
        assert r.metrics["completed"] == len(tr)
    assert (agg.records["kv_ready_s"] - agg.records["fill_end_s"]).max() == 0.0
    assert (dis.records["kv_ready_s"] - dis.records["fill_end_s"]).min() > 0.0
    assert agg.metrics["gpu_hours"] == pytest.approx(dis.metrics["gpu_hours"])
    assert set(agg.metrics["utilization"]) == {"aggregated"}
    assert set(dis.metrics["utilization"]) == {"fill", "decode"}


def test_aggregated_pool_is_fixed(params):
    with pytest.raises(ConfigError, match="cluster.aggregated_workers"):
        ClusterConfig(fill_workers=1, decode_workers=0, aggregated_workers=2)
    with pytest.raises(ConfigError, match="cluster.events"):
        ClusterConfig(fill_workers=0, decode_workers=0, aggregated_workers=2, events=(WorkerCrash(1.0, "decode"),))
    tr = poisson_trace(5.0, 5.0, 1)
    cl = ClusterConfig(fill_workers=0, decode_workers=0, aggregated_workers=1, progress=False)
    with pytest.raises(ConfigError, match="autoscalers"):
        simulate(tr, params, cl, autoscalers=[object()])
    import dataclasses

    with pytest.raises(ConfigError, match="des.mixed_extra_s"):
        simulate(tr, dataclasses.replace(params, mixed_extra_s=(), mixed_batches=(), mixed_contexts=(),
                                         mixed_tokens=()), cl)


def test_long_prompt_fill_grows_like_the_roofline(service, params):
    """A 262,144-token prompt alone on a fill worker: one sequence takes a replica's 2,048-token
    share of each step, its chunks pay for the context before them and its attention stays on one
    replica, so the request simulator's fill time tracks the roofline's chunked prefill of one
    sequence in 2,048-token chunks (within 5 %; 413 s against 417 s), where the step table alone
    would be 10x too fast."""
    n = 262_144
    tr = pd.DataFrame({"arrival_s": [0.0], "input_tokens": [n], "cached_tokens": [0], "output_tokens": [2]})
    r = simulate(tr, params, ClusterConfig(fill_workers=1, decode_workers=1, progress=False, prefix_cache_blocks=0,
                                           drain_s=3000.0))
    fill_s = r.records.loc[0, "fill_end_s"] - r.records.loc[0, "fill_start_s"]
    chunk = params.replica_chunk_tokens
    assert chunk == 2048
    roofline = service.fill_worker.midfill(n, 0, sequences=1, chunks=n // chunk).time_s
    assert fill_s == pytest.approx(roofline, rel=0.05)
    assert fill_s > 10 * (n / params.fill_token_budget) * params.fill_step_time(params.fill_token_budget)


def test_deterministic_aggregated(params):
    tr = poisson_trace(20.0, 20.0, 3, inp=1500, out_mean=100)
    cl = ClusterConfig(fill_workers=0, decode_workers=0, aggregated_workers=2, progress=False)
    a, b = simulate(tr, params, cl), simulate(tr, params, cl)
    pd.testing.assert_frame_equal(a.records, b.records)
    assert np.isfinite(a.metrics["tpot_p99"])


def test_aggregated_workers_keep_the_per_class_counts(params):
    """Request classes through aggregated workers: prompts go from fill straight into the batch,
    so the per-class series stay non-negative and add up to the totals at every sample."""
    tr = poisson_trace(8.0, 60.0, 11, inp=2048, out_mean=200)
    tr["request_class"] = np.where(np.arange(len(tr)) % 3 == 0, "batch", "interactive")
    r = simulate(tr, params, ClusterConfig(fill_workers=0, decode_workers=0, aggregated_workers=2, progress=False))
    m = r.metrics
    assert m["requests"] == m["completed"] + m["rejected"] + m["in_flight_end"]
    s = r.series
    per_class = [c for c in s.columns if c.endswith(("_interactive", "_batch"))]
    assert per_class and (s[per_class] >= 0).all().all()
    for field in ("active_decodes", "ready", "backlog"):
        cols = [f"{field}_interactive", f"{field}_batch"]
        assert (s[cols].sum(axis=1) == s[field]).all(), field
