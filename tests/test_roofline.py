import dataclasses

import numpy as np
import pytest

from tokenfactory.plant_models import (
    Efficiency,
    Parallelism,
    Worker,
    accelerator_preset,
    decode_sweep,
    distinct_experts,
    expert_arithmetic_intensity,
    model_preset,
    roofline_time,
)
from tokenfactory import ConfigError


@pytest.fixture(scope="module")
def dsv3_h200():
    return Worker(model_preset("deepseek-v3"), accelerator_preset("h200"))


@pytest.mark.parametrize("E,k,B", [(256, 8, 1), (256, 8, 16), (256, 8, 64), (384, 8, 32), (64, 6, 8)])
def test_distinct_experts_matches_monte_carlo(E, k, B):
    rng = np.random.default_rng(1234)
    trials = 4000
    # each token picks k distinct experts uniformly (top-k of random scores)
    picks = np.argsort(rng.random((trials, B, E)), axis=2)[:, :, :k]
    distinct = np.array([np.unique(p).size for p in picks])
    assert distinct_experts(E, k, B) == pytest.approx(distinct.mean(), rel=0.02)


def test_distinct_experts_limits():
    assert distinct_experts(256, 8, 0) == 0
    assert distinct_experts(256, 8, 1) == pytest.approx(8)
    assert distinct_experts(256, 8, 10_000) == pytest.approx(256)
    with pytest.raises(ConfigError, match="active_experts"):
        distinct_experts(8, 9, 4)


def test_expert_intensity_rises_then_flattens():
    W, bw, act = 44e6, 44e6, 14336.0
    n = np.array([1, 10, 100, 1000, 10000, 100000, 1000000])
    ai = expert_arithmetic_intensity(n, W, bw, act, act)
    assert np.all(np.diff(ai) > 0)
    limit = 2 * W / (2 * act)
    assert ai[-1] == pytest.approx(limit, rel=0.02)
    # gain per decade collapses: ~x10 from 1->10 tokens, <1.2x from 10^4 -> 10^5
    assert ai[1] / ai[0] > 9 and ai[5] / ai[4] < 1.2


def test_roofline_time():
    assert roofline_time(1e12, 1e9, 1e15, 1e12) == pytest.approx(1e-3)
    assert roofline_time(1e13, 1e9, 1e15, 1e12) == pytest.approx(1e-2)


def test_decode_batch1_is_memory_bound(dsv3_h200):
    r = dsv3_h200.decode(1, 8192)
    assert r.bound == "memory"
    assert all(p.bound == "memory" for p in r.phases)


def test_prefill_8k_is_compute_bound(dsv3_h200):
    r = dsv3_h200.prefill(8192, sequences=8)
    assert r.bound == "compute"
    assert r.phase("attention").bound == "compute"


def test_prefill_8k_stays_compute_bound_at_the_calibrated_set(dsv3_h200):
    """With the collectives' latency a term of its own and NVLink at its documented bandwidth
    efficiency, the calibrated set keeps the article's compute-bound 8k prefill on 8 H200s: the
    EP8 all-to-all's bytes stay under the experts' compute (the first calibration's NVLink
    efficiency 0.13 made this pass network-bound, issue 24)."""
    from tokenfactory.plant_models.calibration import calibrated_settings

    w = dataclasses.replace(dsv3_h200, efficiency=calibrated_settings().efficiency)
    r = w.prefill(8192, sequences=8)
    assert r.bound == "compute"
    ex = r.phase("experts")
    assert ex.bound == "compute" and ex.network_s < ex.compute_s
    assert sum(p.network_s for p in r.phases) < sum(p.busy_s for p in r.phases) / 2


def test_decode_attention_intensity_does_not_grow_with_batch(dsv3_h200):
    # Each query brings its own KV: bytes grow with the batch as fast as FLOPs (section 16).
    kv_read = [dsv3_h200.decode_attention(b, 32768).hbm_bytes for b in (8, 16, 32, 64)]
    ratios = np.diff(kv_read)  # KV bytes added per 8/16/32 sequences
    assert ratios[1] / ratios[0] == pytest.approx(2, rel=1e-6)
    # the marginal intensity of added sequences is the same at any batch size
    def marginal(b0, b1):
        p0, p1 = dsv3_h200.decode_attention(b0, 32768), dsv3_h200.decode_attention(b1, 32768)
        return (p1.flops - p0.flops) / (p1.hbm_bytes - p0.hbm_bytes)

    assert marginal(8, 16) == pytest.approx(marginal(32, 64), rel=1e-6)


def test_decode_experts_touch_distinct_experts(dsv3_h200):
    m = dsv3_h200.model
    small, big = dsv3_h200.decode_experts(1), dsv3_h200.decode_experts(512)
    # at batch 512 nearly all 256 experts per layer are read: ~ all routed expert bytes
    assert big.hbm_bytes == pytest.approx(m.routed_expert_weight_bytes, rel=0.1)
    assert big.arithmetic_intensity > 20 * small.arithmetic_intensity


def test_batching_helps_decode_less_at_long_context(dsv3_h200):
    gain = {}
    for c in (8192, 131072):
        slots = dsv3_h200.decode_slots(c)
        b = min(slots, 256)
        gain[c] = dsv3_h200.decode(b, c).tokens_per_s_per_gpu / dsv3_h200.decode(1, c).tokens_per_s_per_gpu
    assert gain[131072] < gain[8192] / 3


def test_midfill_reads_cached_kv(dsv3_h200):
    pre = dsv3_h200.prefill(1024)
    mid = dsv3_h200.midfill(1024, 100_000)
    extra = mid.phase("attention").hbm_bytes - pre.phase("attention").hbm_bytes
    assert extra == pytest.approx(dsv3_h200.model.kv_bytes(100_000), rel=1e-6)
    assert mid.time_s > pre.time_s


def test_pipeline_splits_weights_and_keeps_pp_microbatches_in_flight():
    m, a = model_preset("kimi-k2"), accelerator_preset("b200")
    w1 = Worker(m, a, Parallelism(ep=8, pp=1))
    w2 = Worker(m, a, Parallelism(ep=8, pp=2))
    assert w2.weight_bytes_per_gpu == pytest.approx(w1.weight_bytes_per_gpu / 2)
    assert w2.decode(64, 8192).microbatches == 2


def test_does_not_fit_names_parallelism():
    with pytest.raises(ConfigError, match="parallelism") as err:
        Worker(model_preset("deepseek-v3"), accelerator_preset("h100-sxm"))
    assert "does not fit" in str(err.value)
    # 16 GPUs fit
    Worker(model_preset("deepseek-v3"), accelerator_preset("h100-sxm"), Parallelism(ep=16))


def test_does_not_fit_names_the_knob_that_shrinks_the_larger_part():
    """A dense model's weights are non-expert: raising ep adds attention replicas, each with a copy,
    so the hint is tp; a MoE model's are mostly routed experts: ep."""
    llama, h100 = model_preset("llama-3.1-70b"), accelerator_preset("h100-sxm")
    for ep in (8, 16):   # ep does not help the dense model: the advice must not say it
        with pytest.raises(ConfigError) as err:
            Worker(llama, h100, Parallelism(tp=1, ep=ep))
        assert "raise tp" in err.value.message and "raise ep" not in err.value.message
    Worker(llama, h100, Parallelism(tp=4, ep=4))   # what the hint leads to fits
    with pytest.raises(ConfigError) as err:
        Worker(model_preset("deepseek-v3"), h100, Parallelism(tp=1, ep=8))
    assert "raise ep or pp" in err.value.message and "routed experts" in err.value.message


def test_tp_not_dividing_ep_suggests_real_layouts():
    """tp = 3, ep = 4: the suggestions are ep = 6 (smallest multiple of tp at least ep) and, for no
    expert parallelism beyond TP, ep = tp = 3 (not ep = 6, which has two attention replicas)."""
    with pytest.raises(ConfigError) as err:
        Parallelism(tp=3, ep=4)
    msg = err.value.message
    assert "tp = 3, ep = 6 (--tp 3 --ep 6)" in msg
    assert "no further expert parallelism is tp = 3, ep = 3" in msg
    Parallelism(tp=3, ep=6), Parallelism(tp=3, ep=3)   # both suggestions are layouts


@pytest.mark.parametrize("kw,field", [
    ({"tp": 3, "ep": 8}, "parallelism.tp"),
    ({"ep": 0}, "parallelism.ep"),
    ({"pp": 2, "ep": 8, "num_gpus": 8}, "parallelism.num_gpus"),
])
def test_bad_parallelism(kw, field):
    with pytest.raises(ConfigError, match=field):
        Parallelism(**kw)


def test_bad_efficiency_and_batch(dsv3_h200):
    with pytest.raises(ConfigError, match="efficiency.compute"):
        Efficiency(compute=1.5)
    with pytest.raises(ConfigError, match="batch"):
        dsv3_h200.decode(10_000, 131072)
    with pytest.raises(ConfigError, match="new_tokens"):
        dsv3_h200.prefill(-3)


def test_worker_from_dict_rejects_unknown_keys():
    with pytest.raises(ConfigError, match="worker.gpus"):
        Worker.from_dict({"model": "deepseek-v3", "hardware": "h200", "gpus": 8})
    with pytest.raises(ConfigError, match="worker.parallelism.dp"):
        Worker.from_dict({"model": "deepseek-v3", "hardware": "h200", "parallelism": {"dp": 2}})


def test_decode_sweep_stops_at_kv_capacity(dsv3_h200):
    df = decode_sweep(dsv3_h200, [1, 16, 64, 4096], [8192, 131072])
    assert (df["batch"] <= df["decode_slots"]).all()
    assert set(df.loc[df.context_tokens == 131072, "batch"]) == {1, 16}


# -- pipeline, all-to-all and fixed costs: hand-worked cases on a toy model ---------------------
from tokenfactory.plant_models import AttentionSpec, MoEModel, accelerator_from_dict  # noqa: E402
from tokenfactory.plant_models.roofline import collective_rounds  # noqa: E402


@pytest.fixture(scope="module")
def toy():
    """4 layers of 16 experts (k=2), hidden 1024, GQA 8x128; a GPU with round numbers."""
    model = MoEModel(name="toy", num_layers=4, num_dense_layers=0, hidden_size=1024, vocab_size=1000,
                     dense_intermediate_size=0, expert_intermediate_size=512, routed_experts=16,
                     active_experts=2, shared_experts=0,
                     attention=AttentionSpec(kind="gqa", num_heads=8, head_dim=128, kv_heads=8),
                     weight_precision="fp8", kv_precision="bf16")
    gpu = accelerator_from_dict({"name": "toy-gpu", "hbm_bytes": 100e9, "hbm_bandwidth": 1e12,
                                 "dense_flops": {"bf16": 5e14, "fp8": 1e15},
                                 "scale_up_bandwidth": 100e9, "scale_out_bandwidth": 10e9,
                                 "scale_up_domain": 8, "power_watts": 1000.0})
    eff = Efficiency(compute=1.0, memory=1.0, network=1.0, layer_overhead_s=1e-4,
                     scale_up_latency_s=2e-6, scale_out_latency_s=5e-6, pass_overhead_s=0.0,
                     routing_locality=1.0, network_scale_out=None, collective_latency_s=0.0)
    return model, gpu, eff


def test_collective_rounds():
    assert [collective_rounds(n) for n in (1, 2, 3, 8, 9, 16, 64)] == [0, 1, 2, 3, 4, 4, 6]


def test_fixed_costs_by_hand(toy):
    model, gpu, eff = toy
    # ep=16 spans two 8-GPU domains: two all-to-alls per MoE layer, 4 rounds each at 5 us
    w = Worker(model, gpu, Parallelism(tp=1, pp=1, ep=16), eff)
    assert w.collective_latency_s == pytest.approx(4 * 2 * 4 * 5e-6)
    assert w.fixed_stage_s == pytest.approx(4 * 1e-4 + 160e-6)
    # pp=2 x ep=8: NVLink all-to-alls of 3 rounds, tp=4 adds one 2-round all-reduce per layer;
    # each stage pays half of the layers' costs
    w2 = Worker(model, gpu, Parallelism(tp=4, pp=2, ep=8), eff)
    assert w2.collective_latency_s == pytest.approx(4 * 2 * 3 * 2e-6 + 4 * 2 * 2e-6)
    assert w2.fixed_stage_s == pytest.approx((4 * 1e-4 + 48e-6 + 16e-6) / 2)


def test_collective_alpha_beta_by_hand(toy):
    """A collective costs alpha = collective_latency_s + rounds x link latency (Thakur et al.
    2005; NCCL's base + per-step latency) on the pass's critical path, plus its bytes over the
    link at the bandwidth efficiency; one GPU has no collectives."""
    model, gpu, eff = toy
    e = dataclasses.replace(eff, collective_latency_s=10e-6, layer_overhead_s=0.0)
    w = Worker(model, gpu, Parallelism(tp=4, pp=1, ep=8), e)
    # all-to-all over 8 GPUs: 10 + 3 x 2 us, twice per MoE layer; all-reduce over 4: 10 + 2 x 2 us
    assert w.collective_latency_s == pytest.approx(4 * 2 * 16e-6 + 4 * 14e-6)
    assert Worker(model, gpu, Parallelism(tp=1, ep=1), e).collective_latency_s == 0.0
    base = dataclasses.replace(e, collective_latency_s=0.0)
    d0 = Worker(model, gpu, Parallelism(tp=4, ep=8), base).decode(1, 100)
    d1 = w.decode(1, 100)
    assert d1.time_s - d0.time_s == pytest.approx(4 * 2 * 10e-6 + 4 * 10e-6)
    # the latency does not touch the bandwidth term, and the bandwidth efficiency only that term
    assert [p.network_s for p in d1.phases] == [p.network_s for p in d0.phases]
    slow = Worker(model, gpu, Parallelism(tp=4, ep=8), dataclasses.replace(e, network=0.5)).decode(1, 100)
    assert slow.fixed_s == d1.fixed_s
    for a, b in zip(slow.phases, d1.phases):
        assert a.network_s == pytest.approx(2 * b.network_s)


def test_dense_ffn_all_reduce_under_tensor_parallelism(toy):
    """A dense FFN layer sharded over tp GPUs all-reduces its output like attention does: its
    bytes 2 (tp - 1) x tokens x hidden x activation bytes per layer, and one more collective."""
    model, gpu, eff = toy
    m2 = dataclasses.replace(model, num_layers=6, num_dense_layers=2, dense_intermediate_size=2048)
    e = dataclasses.replace(eff, collective_latency_s=10e-6)
    w = Worker(m2, gpu, Parallelism(tp=4, ep=4), e)
    dense = w.decode(8, 100).phase("dense")
    assert dense.network_bytes == pytest.approx(2 * 3 * 8 * 1024 * m2.activation_bytes_per_element * 2)
    # 6 attention + 2 dense all-reduces over 4 GPUs, 2 all-to-alls per MoE layer over 4 GPUs
    assert w.collective_latency_s == pytest.approx((6 + 2) * 14e-6 + 2 * 4 * 14e-6)
    assert Worker(m2, gpu, Parallelism(tp=1, ep=4), e).decode(8, 100).phase("dense").network_bytes == 0.0


def test_all_to_all_bytes_by_hand(toy):
    model, gpu, eff = toy
    per_copy = 4 * 1024 * (1 + 2)  # 4 MoE layers x hidden x (FP8 dispatch + BF16 combine)
    w = Worker(model, gpu, Parallelism(ep=8), eff)
    assert w._all_to_all_bytes(100, False) == pytest.approx((100 * 2 * 7 / 8 * per_copy, 0.0))
    w16 = Worker(model, gpu, Parallelism(ep=16), eff)
    # decode: one copy per remote expert (half the experts sit on the other node)
    up, out = w16._all_to_all_bytes(100, False)
    assert out == pytest.approx(100 * 2 * 8 / 16 * per_copy)
    assert up == pytest.approx(100 * 2 * 7 / 16 * per_copy)
    # fill: one copy per destination node, P(node hit) = 1 - (1/2)^2, then forwarded over NVLink
    up, out = w16._all_to_all_bytes(100, True)
    assert out == pytest.approx(100 * 0.75 * per_copy)
    assert up == pytest.approx(100 * (2 * 7 / 16 + 2 * 8 / 16 * 7 / 8) * per_copy)


def test_decode_pipeline_by_hand(toy):
    """TPOT = pp (t_stage + h); a stage does 1/pp of the pass a one-stage worker of the same
    width does, so TPOT(pp=2, 2b) = TPOT(pp=1, b) + 2 h, and throughput = batch / TPOT."""
    model, gpu, eff = toy
    one = Worker(model, gpu, Parallelism(tp=1, pp=1, ep=4), eff)
    two = Worker(model, gpu, Parallelism(tp=1, pp=2, ep=4), eff)  # 8 GPUs: one NVLink domain
    b, ctx = 16, 1000
    r1, r2 = one.decode(b, ctx), two.decode(2 * b, ctx)
    h = 2e-6 + b * 1024 * 2 / (4 * 100e9)  # one NVLink round + the micro-batch's activations
    assert r2.handoff_s == pytest.approx(h)
    assert r2.stage_times_s[0] == pytest.approx(r1.stage_times_s[0] / 2)
    assert r2.time_s == pytest.approx(r1.time_s + 2 * h)
    assert r2.tokens_per_s == pytest.approx(2 * b / r2.time_s)
    assert r2.microbatches == 2 and r2.bubble_fraction == pytest.approx(0.0, abs=1e-12)


def test_pipeline_bubble_lowers_throughput_not_tpot(toy):
    model, gpu, eff = toy
    w = Worker(model, gpu, Parallelism(tp=1, pp=4, ep=4), eff)
    r1, r4 = w.decode(1, 1000), w.decode(4, 1000)
    assert r1.microbatches == 1 and r1.bubble_fraction == pytest.approx(0.75)
    # same micro-batch size (1 sequence): same TPOT, a quarter of the throughput
    assert r1.time_s == pytest.approx(r4.time_s)
    assert r1.tokens_per_s == pytest.approx(r4.tokens_per_s / 4)


def test_handoff_crosses_the_scale_out_network(toy):
    model, gpu, eff = toy
    w = Worker(model, gpu, Parallelism(tp=1, pp=2, ep=8), eff)   # 16 GPUs: stages on two nodes
    w_in = Worker(model, gpu, Parallelism(tp=1, pp=2, ep=4), eff)  # 8 GPUs: one node
    assert w.handoff_s(100) == pytest.approx(5e-6 + 100 * 1024 * 2 / (8 * 10e9))
    assert w_in.handoff_s(100) == pytest.approx(2e-6 + 100 * 1024 * 2 / (4 * 100e9))


def test_chunked_prefill_makespan_matches_a_flow_shop_simulation(toy):
    model, gpu, eff = toy
    w = Worker(model, gpu, Parallelism(tp=1, pp=4, ep=2), eff)
    r = w.prefill(4096, sequences=2, chunks=4)
    slots = [t + r.handoff_s for t in r.stage_times_s]
    # later chunks attend more cached tokens, so they take longer
    assert all(b > a for a, b in zip(r.stage_times_s, r.stage_times_s[1:]))
    done = [[0.0] * 4 for _ in slots]  # completion of chunk j on stage s
    for j, t in enumerate(slots):
        for s in range(4):
            done[j][s] = max(done[j - 1][s] if j else 0.0, done[j][s - 1] if s else 0.0) + t
    assert r.time_s == pytest.approx(done[-1][-1])
    assert r.time_s == pytest.approx(sum(slots) + 3 * max(slots))
    assert r.tokens_per_s == pytest.approx(2 * 4096 / sum(slots))


def test_pp_can_lower_tpot_at_a_fixed_gpu_count(toy):
    """16 GPUs: PP1 x EP16 runs its all-to-alls over the scale-out network (4 rounds of 5 us);
    PP2 x EP8 keeps them on NVLink (3 rounds of 2 us) for two hand-offs of ~2 us - with the
    per-round latency dominant, the pipelined layout has the lower TPOT."""
    model, gpu, _ = toy
    eff = Efficiency(compute=1.0, memory=1.0, network=1.0, layer_overhead_s=0.0,
                     scale_up_latency_s=2e-6, scale_out_latency_s=50e-6, pass_overhead_s=0.0,
                     routing_locality=1.0, network_scale_out=None, collective_latency_s=0.0)
    flat = Worker(model, gpu, Parallelism(tp=1, pp=1, ep=16), eff).decode(2, 100)
    piped = Worker(model, gpu, Parallelism(tp=1, pp=2, ep=8), eff).decode(2, 100)
    assert flat.fixed_s == pytest.approx(4 * 2 * 4 * 50e-6)
    assert piped.time_s < flat.time_s
    # with negligible link latency the wide flat layout wins again
    fast = dataclasses.replace(eff, scale_up_latency_s=0.0, scale_out_latency_s=0.0)
    flat0 = Worker(model, gpu, Parallelism(tp=1, pp=1, ep=16), fast).decode(2, 100)
    piped0 = Worker(model, gpu, Parallelism(tp=1, pp=2, ep=8), fast).decode(2, 100)
    assert flat0.time_s < piped0.time_s


def test_overlap_hides_network_behind_compute(toy):
    model, gpu, eff = toy
    par = Parallelism(tp=1, pp=1, ep=16)
    on = Worker(model, gpu, par, eff, overlap_communication=True).prefill(2048, sequences=16)
    off = Worker(model, gpu, par, eff, overlap_communication=False).prefill(2048, sequences=16)
    busy = sum(p.busy_s for p in on.phases)
    net = sum(p.network_s for p in on.phases)
    fixed = on.fixed_s
    assert on.stage_times_s[0] == pytest.approx(max(busy, net) + fixed)
    assert off.stage_times_s[0] == pytest.approx(sum(p.time_s for p in on.phases) + fixed)
    assert on.time_s < off.time_s


def test_expert_precision_sets_expert_bytes_and_rate():
    m8 = model_preset("deepseek-v3")
    m4 = dataclasses.replace(m8, name="dsv3-fp4-experts", expert_precision="fp4")
    assert m4.expert_weight_bytes == pytest.approx(m8.expert_weight_bytes / 2)
    a = accelerator_preset("b200")
    e8 = Worker(m8, a).decode_experts(512)
    e4 = Worker(m4, a).decode_experts(512)
    assert e4.hbm_bytes < e8.hbm_bytes
    assert e4.compute_s == pytest.approx(e8.compute_s / 2)  # FP4 tensor rate is twice FP8 on B200


def test_energy_and_residency(toy):
    model, gpu, eff = toy
    w = Worker(model, gpu, Parallelism(tp=1, pp=1, ep=8), eff)
    r = w.decode(8, 1000)
    assert w.energy_per_token_j(r) == pytest.approx(1000.0 * 8 / r.tokens_per_s)
    base = w.resident_bytes_per_gpu(0, 1000)
    assert base == pytest.approx(w.weight_bytes_per_gpu)
    assert w.resident_bytes_per_gpu(8, 1000) - base == pytest.approx(8 * model.kv_bytes(1000) / 8)


# -- the large-batch terms (issue 24): per-sequence runtime cost, KV-read bandwidth efficiency ----
@pytest.mark.parametrize("model, hw, tp, pp, ep, batch, cost_s, added_s", [
    # added TPOT = cost x ceil((batch / min(pp, batch)) / (ep / tp)), worked by hand
    ("deepseek-v3", "h200", 1, 1, 8, 256, 20e-6, 20e-6 * 32),     # 8 DP-attention ranks: 32 each
    ("deepseek-v3", "h200", 8, 1, 8, 256, 20e-6, 20e-6 * 256),    # attention TP8: one rank holds all 256
    ("deepseek-v3", "h200", 1, 2, 8, 100, 10e-6, 10e-6 * 7),      # 2 micro-batches of 50 over 8 ranks: 7
    ("deepseek-v3", "h200", 1, 1, 8, 3, 10e-6, 10e-6 * 1),        # fewer sequences than ranks: 1 each
    ("llama-3.1-70b", "h200", 4, 1, 4, 33, 5e-6, 5e-6 * 33),
])
def test_sequence_overhead_closed_form(model, hw, tp, pp, ep, batch, cost_s, added_s):
    par = Parallelism(tp=tp, pp=pp, ep=ep)
    base = Worker(model_preset(model), accelerator_preset(hw), par)
    with_cost = Worker(model_preset(model), accelerator_preset(hw), par,
                       dataclasses.replace(Efficiency(), sequence_overhead_s=cost_s))
    got = with_cost.decode(batch, 2048, check_memory=False).time_s - base.decode(batch, 2048, check_memory=False).time_s
    assert got == pytest.approx(added_s, rel=1e-9, abs=1e-12)
    mixed = (with_cost.mixed(batch, 2048, 512).time_s - base.mixed(batch, 2048, 512).time_s)
    assert mixed == pytest.approx(added_s, rel=1e-9, abs=1e-12)  # a mixed pass's decodes pay it too


@pytest.mark.parametrize("batch, context, kv_eff, delta_s", [
    # DeepSeek-V3 on H200, DP8 attention (tp 1): a rank reads ceil(B / 8) sequences' latent KV,
    # 61 layers x 576 x 2 bytes = 70,272 bytes per token, plus the new token's write; at 4.8 TB/s
    # the memory time moves by KV / bw x (1 / kv_eff - 1 / 0.23)
    (64, 4096, 0.5, 8 * 4097 * 70272 / 4.8e12 * (1 / 0.5 - 1 / 0.23)),
    (256, 1024, 0.1, 32 * 1025 * 70272 / 4.8e12 * (1 / 0.1 - 1 / 0.23)),
    (8, 8192, 0.23, 0.0),
])
def test_attention_memory_closed_form(dsv3_h200, batch, context, kv_eff, delta_s):
    w = dataclasses.replace(dsv3_h200, efficiency=dataclasses.replace(Efficiency(), attention_memory=kv_eff))
    a = w.decode(batch, context).phase("attention")
    b = dsv3_h200.decode(batch, context).phase("attention")
    assert a.memory_s - b.memory_s == pytest.approx(delta_s, rel=1e-6, abs=1e-12)
    assert a.hbm_bytes == b.hbm_bytes and a.compute_s == b.compute_s
    # expert weights keep the weight-read efficiency
    assert w.decode(batch, context).phase("experts").memory_s == pytest.approx(
        dsv3_h200.decode(batch, context).phase("experts").memory_s, rel=1e-12)


def test_large_batch_terms_leave_the_defaults_unchanged(dsv3_h200):
    e = Efficiency()
    assert e.sequence_overhead_s == 0.0 and e.attention_memory is None and e.kv_memory == e.memory
    explicit = dataclasses.replace(dsv3_h200, efficiency=dataclasses.replace(e, sequence_overhead_s=0.0,
                                                                             attention_memory=None))
    for b, c in ((1, 1024), (64, 4096), (256, 2048)):
        assert explicit.decode(b, c).time_s == dsv3_h200.decode(b, c).time_s
    # attention_memory equal to memory is the same time up to rounding
    same = dataclasses.replace(dsv3_h200, efficiency=dataclasses.replace(e, attention_memory=e.memory))
    assert same.decode(64, 4096).time_s == pytest.approx(dsv3_h200.decode(64, 4096).time_s, rel=1e-12)
    with pytest.raises(ConfigError, match="efficiency.sequence_overhead_s"):
        Efficiency(sequence_overhead_s=-1e-6)
    with pytest.raises(ConfigError, match="efficiency.attention_memory"):
        Efficiency(attention_memory=0.0)


# -- attention-DP imbalance of mixed passes (issue 24): the chunk lands on the busiest replica ------
@pytest.mark.parametrize("tp, ep, chunk, u, busiest", [
    # C / D + u C (1 - 1 / D), worked by hand
    (1, 8, 2048, 0.0, 256.0),       # DP8, even spread (the default)
    (1, 8, 2048, 1.0, 2048.0),      # DP8, the whole chunk on one replica
    (1, 8, 2048, 0.5, 1152.0),      # 256 + 0.5 x 1792
    (2, 8, 1000, 0.25, 437.5),      # DP4: 250 + 0.25 x 750
    (8, 8, 2048, 1.0, 2048.0),      # attention TP8 (one replica): no imbalance to have
])
def test_busiest_chunk_tokens_closed_form(tp, ep, chunk, u, busiest):
    w = Worker(model_preset("deepseek-v3"), accelerator_preset("h200"), Parallelism(tp=tp, ep=ep),
               dataclasses.replace(Efficiency(), attention_dp_imbalance=u))
    assert w.busiest_chunk_tokens(chunk) == pytest.approx(busiest, rel=1e-12)


@pytest.mark.parametrize("batch, context, chunk, u", [(64, 2048, 2048, 1.0), (256, 1024, 4096, 0.5),
                                                      (8, 4096, 512, 0.2)])
def test_attention_dp_imbalance_moves_the_chunk_onto_one_replica(dsv3_h200, batch, context, chunk, u):
    """DP8 attention: the imbalanced pass's attention is the even pass's attention for a chunk
    whose even share is the busiest replica's piece; its bytes grow by that piece's KV writes and
    activations, worked by hand (DeepSeek-V3: 70,272 KV bytes per token over 61 layers, BF16
    activations of 7,168 read and written per layer)."""
    w = dataclasses.replace(dsv3_h200, efficiency=dataclasses.replace(Efficiency(), attention_dp_imbalance=u))
    piece = chunk / 8 + u * chunk * 7 / 8
    a = w.mixed(batch, context, chunk).phase("attention")
    even = dsv3_h200.mixed(batch, context, 8 * piece).phase("attention")
    assert (a.flops, a.hbm_bytes, a.time_s) == pytest.approx((even.flops, even.hbm_bytes, even.time_s), rel=1e-12)
    b = dsv3_h200.mixed(batch, context, chunk).phase("attention")
    extra = (piece - chunk / 8) * (70272 + 2 * 61 * 7168 * 2)
    assert a.hbm_bytes - b.hbm_bytes == pytest.approx(extra, rel=1e-9)
    # the dense layers (replica-local) are timed for the busiest replica's piece as well; the
    # experts see the pass's tokens unchanged
    d = w.mixed(batch, context, chunk).phase("dense")
    d_even = dsv3_h200.mixed(batch, context, 8 * piece).phase("dense")
    assert (d.flops, d.time_s) == pytest.approx((d_even.flops, d_even.time_s), rel=1e-12)
    assert w.mixed(batch, context, chunk).phase("experts") == dsv3_h200.mixed(batch, context, chunk).phase("experts")
    assert w.mixed(batch, context, chunk).time_s > dsv3_h200.mixed(batch, context, chunk).time_s


def test_attention_dp_imbalance_leaves_the_defaults_and_other_passes_unchanged(dsv3_h200):
    e = Efficiency()
    assert e.attention_dp_imbalance == 0.0
    on = dataclasses.replace(dsv3_h200, efficiency=dataclasses.replace(e, attention_dp_imbalance=1.0))
    zero = dataclasses.replace(dsv3_h200, efficiency=dataclasses.replace(e, attention_dp_imbalance=0.0))
    assert zero.mixed(64, 2048, 2048).time_s == dsv3_h200.mixed(64, 2048, 2048).time_s
    # decode and fill passes have no chunk to concentrate
    assert on.decode(64, 2048).time_s == dsv3_h200.decode(64, 2048).time_s
    assert on.mixed(64, 2048, 0).time_s == dsv3_h200.mixed(64, 2048, 0).time_s
    assert on.prefill(2048, sequences=8).time_s == dsv3_h200.prefill(2048, sequences=8).time_s
    # without attention DP (TP8: one replica) it has no effect
    tp8 = dataclasses.replace(dsv3_h200, parallelism=Parallelism(tp=8, ep=8))
    tp8_on = dataclasses.replace(tp8, efficiency=on.efficiency)
    assert tp8_on.mixed(64, 2048, 2048).time_s == tp8.mixed(64, 2048, 2048).time_s
    for bad in (-0.1, 1.5):
        with pytest.raises(ConfigError, match="efficiency.attention_dp_imbalance"):
            Efficiency(attention_dp_imbalance=bad)


# -- the format expert GEMMs multiply in (issue 24: gpt-oss's MXFP4 experts) -------------------------
def test_mma_precision_is_the_wider_format_and_hopper_dequantises_fp4():
    b200 = Worker(model_preset("gpt-oss-120b"), accelerator_preset("b200"), Parallelism(tp=1, ep=1))
    h200 = Worker(model_preset("gpt-oss-120b"), accelerator_preset("h200"), Parallelism(tp=1, ep=1))
    # W8A8 / W4A4: the weights' format
    assert b200.mma_precision("fp8") == "fp8" and b200.mma_precision("fp4", "fp4") == "fp4"
    # MXFP4 weights x MXFP8 activations: Blackwell multiplies at FP8 (UTCQMMA)
    assert b200.mma_precision("fp4", "fp8") == "fp8" == b200.expert_mma_precision
    # Hopper has no FP4 MMA and FP8 x MXFP4 is not enabled: BF16 (HGMMA), TensorRT-LLM's gpt-oss matrix
    assert h200.mma_precision("fp4", "fp8") == "bf16" == h200.expert_mma_precision
    # narrower activations than the weights do not speed the GEMM up
    assert b200.mma_precision("bf16", "fp8") == "bf16"


def test_gpt_oss_prefill_experts_run_at_the_activation_formats_rate():
    # the expert phase's compute time is FLOPs / (GPUs x peak x compute efficiency) at the MMA format
    eff = Efficiency(compute=0.5)
    for hw, rate in (("b200", 4.5e15), ("h200", 0.989e15)):
        w = Worker(model_preset("gpt-oss-120b"), accelerator_preset(hw), Parallelism(tp=1, ep=1), eff)
        ph = w.prefill(8192).phase("experts")
        m = w.model
        flops = 2.0 * m.moe_layers * m.expert_params * 8192 * m.active_experts
        assert ph.flops == pytest.approx(flops)
        assert ph.compute_s == pytest.approx(flops / (rate * 0.5), rel=1e-3)
    # a model without expert_activation_precision keeps its experts' own rate (DeepSeek-R1 NVFP4: W4A4)
    fp4 = dataclasses.replace(model_preset("deepseek-v3"), expert_precision="fp4")
    w = Worker(fp4, accelerator_preset("b200"), Parallelism(tp=8, ep=8), eff)
    assert w.expert_mma_precision == "fp4"
