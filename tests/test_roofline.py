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


def test_service_rates_consistent(dsv3_h200):
    r = dsv3_h200.service_rates(prompt_tokens=2048, context_tokens=8192)
    assert r.decode_batch == r.decode_slots == dsv3_h200.decode_slots(8192)
    assert r.decode_tokens_per_s == pytest.approx(r.decode_batch / r.decode_step_s)
    assert r.fill_tokens_per_s == pytest.approx(8 * 2048 / r.fill_seconds)
    assert r.kv_bytes_per_request == pytest.approx(2048 * 70_272)


def test_decode_sweep_stops_at_kv_capacity(dsv3_h200):
    df = decode_sweep(dsv3_h200, [1, 16, 64, 4096], [8192, 131072])
    assert (df["batch"] <= df["decode_slots"]).all()
    assert set(df.loc[df.context_tokens == 131072, "batch"]) == {1, 16}
