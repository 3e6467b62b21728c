"""One service model: the fluid plant, the pool model, the request simulator and the capacity
planner are all sampled from it and agree on slots, KV bytes and pass times for every model preset
(hybrid-25k, whose linear-attention layers hold a fixed state per sequence, included)."""

import math

import numpy as np
import pandas as pd
import pytest

from tokenfactory import ConfigError
from tokenfactory.controllers import PoolRates
from tokenfactory.plant_models import (
    ACCELERATOR_PRESETS,
    MODEL_PRESETS,
    AttentionSpec,
    ClusterConfig,
    DESParams,
    FluidParams,
    KVLink,
    PoolScenario,
    RequestShape,
    ServiceModel,
    Worker,
    accelerator_preset,
    model_preset,
    simulate,
    simulate_pools,
)

SHAPE = RequestShape(2048, 512, cached_tokens=0, output_cv=1.0)


def _fitting_worker(model: str) -> Worker:
    """The model on the first accelerator preset that holds it at the default layout."""
    for hw in ACCELERATOR_PRESETS:
        try:
            return Worker(model_preset(model), accelerator_preset(hw))
        except ConfigError:
            continue
    raise AssertionError(f"{model} fits no accelerator preset")


@pytest.fixture(scope="module", params=sorted(MODEL_PRESETS))
def plants(request):
    """The service model of one preset and the three plants' parameters sampled from it."""
    w = _fitting_worker(request.param)
    service = ServiceModel(w, w, SHAPE)
    return service, FluidParams.from_service(service), DESParams.from_service(service)


def test_slots_agree(plants):
    s, fluid, des = plants
    ctx = s.decode_context_tokens
    slots = s.decode_slots
    assert slots >= 1
    assert fluid.decode_slots_per_worker == slots
    assert des.slots(ctx) == slots
    # the pool model reports the fluid slots of its decode pool
    pool = simulate_pools(fluid, 1, 3, PoolScenario(0.0, 2.0, dt=1.0))
    assert (pool.series["decode_slots"] == 3 * slots).all()
    # KV capacity / KV of one sequence at the mean active context, the roofline's own count
    assert slots == int(s.kv_capacity_bytes // s.kv_bytes(ctx)) == s.decode_worker.decode_slots(ctx)


def test_kv_bytes_agree(plants):
    s, fluid, des = plants
    m = s.decode_worker.model
    inp = SHAPE.input_tokens
    assert s.kv_bytes(s.decode_context_tokens) == pytest.approx(m.kv_bytes(s.decode_context_tokens), rel=1e-12)
    for ctx in (1, inp, s.decode_context_tokens, 100_000):
        assert des.kv_bytes(ctx) == pytest.approx(s.kv_bytes(ctx), rel=1e-12)
        if m.attention.efficient_kind == "local" and m.efficient_attention_layers:
            assert s.kv_bytes(ctx) >= m.kv_bytes(ctx) * (1 - 1e-12)  # the tangent of a concave law
        else:  # full or linear attention: the model's own affine law
            assert s.kv_bytes(ctx) == pytest.approx(m.kv_bytes(ctx), rel=1e-12)
    assert fluid.provenance["kv_blob_bytes"] == pytest.approx(s.kv_blob_bytes, rel=1e-12)
    assert des.kv_bytes(inp) == pytest.approx(s.kv_blob_bytes, rel=1e-12)
    assert fluid.kv_transfer_s == pytest.approx(des.kv_transfer_s(inp), rel=1e-12)
    assert fluid.kv_transfer_s == pytest.approx(s.kv_blob_bytes / (8 * s.fill_worker.accelerator.scale_out_bandwidth)
                                                + 0.005, rel=1e-12)


def test_pass_times_agree(plants):
    s, fluid, des = plants
    ctx, slots = s.decode_context_tokens, s.decode_slots
    full = s.decode_pass_s(slots, ctx)
    assert fluid.decode_step_s(slots) == pytest.approx(full, rel=1e-12)
    assert des.decode_pass(slots, ctx)[0] == pytest.approx(full, rel=1e-12)
    # between table points the two plants interpolate different grids of the same function; a
    # dense model's FFN turns compute-bound inside the batch range (a kink of the roofline's max
    # between two grid points), so its linear interpolation is looser
    tol = 0.05 if s.decode_worker.model.moe_layers else 0.10
    for b in fluid.decode_step_batches:
        exact = s.decode_pass_s(b, ctx)
        assert fluid.decode_step_s(b) == pytest.approx(exact, rel=1e-12)
        assert des.decode_pass(b, ctx)[0] == pytest.approx(exact, rel=tol)
    # fill: the nominal pass (one prompt per attention replica) is a step of the simulator's table
    dp = s.dp_attention
    assert fluid.fill_latency_s == pytest.approx(s.fill_latency_s, rel=1e-12)
    step = dp * SHAPE.prompt_tokens
    assert des.fill_step_time(step) == pytest.approx(s.fill_step_s(step), rel=1e-12)
    assert step / des.fill_step_time(step) / SHAPE.prompt_tokens == pytest.approx(fluid.fill_rate_per_worker,
                                                                                rel=1e-9)


def test_capacity_planner_agrees(plants):
    s, fluid, _ = plants
    a, b = PoolRates.from_service(s), PoolRates.from_params(fluid, s.fill_worker.num_gpus, s.decode_worker.num_gpus)
    assert a.fill_rps_per_worker == pytest.approx(b.fill_rps_per_worker, rel=1e-12)
    assert a.decode_rps_per_worker == pytest.approx(b.decode_rps_per_worker, rel=1e-12)
    assert a.decode_rps_per_worker == pytest.approx(
        s.decode_slots / (SHAPE.output_tokens * s.decode_pass_s(s.decode_slots, s.decode_context_tokens)))


def test_hybrid_state_counts_in_the_request_simulator():
    """hybrid-25k holds 36 linear-attention states of 2 MiB per sequence, about as much as 3,000
    tokens of its full-attention KV: the request simulator's decode batch is bounded by the same
    slots as the fluid plant's, not by twice as many."""
    w = Worker(model_preset("hybrid-25k"), accelerator_preset("h200"))
    s = ServiceModel(w, w, RequestShape(2048, 64, output_cv=0.0))
    state_tokens = s.sequence_state_bytes / s.kv_bytes_per_token
    assert 2500 < state_tokens < 3500
    slots = s.slots(2048 + 64)
    tokens_only = int(s.kv_capacity_bytes / s.kv_bytes_per_token // (2048 + 64))
    assert tokens_only > 1.8 * slots  # what the simulator allowed when it left the state out
    n = 3 * slots
    trace = pd.DataFrame({"arrival_s": np.zeros(n), "input_tokens": 2048, "cached_tokens": 0, "output_tokens": 64})
    r = simulate(trace, DESParams.from_service(s), ClusterConfig(fill_workers=4, decode_workers=1, progress=False,
                                                                 prefix_cache_blocks=0))
    peak = r.series["active_decodes"].max()
    assert 0.9 * slots <= peak <= s.slots(2048 + 1)
    assert r.metrics["completed"] == n


def test_kv_law_for_local_attention():
    """Local (sliding-window) attention: the law is the tangent at the nominal context - exact on
    its side of the window, an upper bound on the other, and the roofline's slots at it."""
    from dataclasses import replace

    att = AttentionSpec(kind="gqa", num_heads=64, head_dim=128, kv_heads=4, full_attention_layers=12,
                        efficient_kind="local", local_window=4096)
    m = replace(model_preset("hybrid-25k"), name="hybrid-local", attention=att)
    w = Worker(m, accelerator_preset("h200"))
    inside = ServiceModel(w, w, RequestShape(2048, 512))       # mean context 2560 < window
    beyond = ServiceModel(w, w, RequestShape(8192, 1024))      # mean context 9216 > window
    assert inside.sequence_state_bytes == pytest.approx(0.0) and beyond.sequence_state_bytes > 0
    for s, near, far in ((inside, 1_000, 10_000), (beyond, 10_000, 1_000)):
        assert s.kv_bytes(near) == pytest.approx(m.kv_bytes(near))
        assert s.kv_bytes(far) > m.kv_bytes(far)
        assert s.decode_slots == w.decode_slots(s.decode_context_tokens)


def test_defaults_live_in_one_place():
    s = ServiceModel(*(2 * [Worker(model_preset("deepseek-v3"), accelerator_preset("h200"))]))
    assert (s.link.stripes, s.link.setup_s) == (8, 0.005)
    with pytest.raises(ConfigError, match="kv_link.stripes"):
        KVLink(0)
    with pytest.raises(ConfigError, match="shape"):
        ServiceModel(s.fill_worker, s.decode_worker, RequestShape(10_000_000, 512))


def test_request_shape_of_a_table():
    t = pd.DataFrame({"input_tokens": [1000, 3000], "cached_tokens": [0, 1000], "output_tokens": [100, 300]})
    shape = RequestShape.from_requests(t)
    assert (shape.prompt_tokens, shape.cached_tokens, shape.output_tokens) == (1500, 500, 200)
    assert shape.output_cv == pytest.approx(np.std([100, 300], ddof=1) / 200)
    assert shape.mean_active_context_tokens == round(2000 + 200 * (1 + shape.output_cv ** 2) / 2)
    assert RequestShape.from_requests(t.drop(columns="cached_tokens")).cached_tokens == 0
    assert math.isclose(RequestShape(2048, 512, output_cv=0.0).mean_active_context_tokens, 2048 + 256)


# -- one request's chunked fill: the closed form, the service model, the request simulator -----


def _loop_fill(new, cached, chunk, step_s, a, b, replicas, floor=0.0, step_tokens=None):
    """The chunked fill step by step (what the closed form must equal)."""
    from tokenfactory.plant_models.service import chunk_context_s

    total, todo, ctx = 0.0, max(new, 1), cached
    while todo > 0:
        take = min(todo, chunk)
        st = take if step_tokens is None else step_tokens
        total += max(step_s(st) + chunk_context_s(a, b, replicas, take, ctx, st), floor)
        ctx += take
        todo -= take
    return total


@pytest.mark.parametrize("new,cached,floor,step_tokens", [(1, 0, 0.0, None), (2048, 0, 0.0, None),
                                                          (5000, 30000, 0.0, None), (70000, 4096, 0.3, 16384),
                                                          (9000, 0, 2.0, 16384)])
def test_chunked_fill_closed_form_equals_the_step_loop(new, cached, floor, step_tokens):
    from tokenfactory.plant_models.service import chunked_fill_s

    def step_s(n):
        return 0.01 + 5e-6 * n

    a, b = 1e-8, 4e-6
    exact = _loop_fill(new, cached, 2048, step_s, a, b, 8, floor, step_tokens)
    assert chunked_fill_s(new, cached, 2048, step_s, a, b, 8, floor, step_tokens) == pytest.approx(exact, rel=1e-12)


def test_request_fill_is_one_function_for_the_service_model_and_the_simulator():
    """The service model's per-request fill (exact roofline) and the request simulator's (its
    sampled tables) agree, and a lone request in the simulator takes exactly the latter; a long
    prompt's chunks pay attention over their growing context (superlinear in its length)."""
    fw = Worker(model_preset("deepseek-v3"), accelerator_preset("h200"))
    svc = ServiceModel(fw, fw, SHAPE)
    p = DESParams.from_service(svc)
    for new, cached in ((300, 0), (2048, 0), (6000, 1000), (60000, 0)):
        assert p.request_fill_s(new, cached) == pytest.approx(svc.request_fill_s(new, cached), rel=0.02)
    short, long = svc.request_fill_s(2048), svc.request_fill_s(20 * 2048)
    assert long > 25 * short  # 20 chunks, the later ones attending over up to 39k tokens
    for inp, cached in ((7000, 0), (30000, 12000)):
        tr = pd.DataFrame({"arrival_s": [0.0], "input_tokens": [inp], "cached_tokens": [cached],
                           "output_tokens": [4]})
        res = simulate(tr, p, ClusterConfig(fill_workers=1, decode_workers=1, progress=False))
        assert res.records["ttft_s"].iloc[0] == pytest.approx(p.request_fill_s(inp - cached, cached), rel=1e-9)
