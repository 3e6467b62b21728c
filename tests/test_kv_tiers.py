"""The tiered KV store: hits, loads, demotion, retention and rebuild, hand-worked; its tiers from
the hardware descriptors; the request simulator waiting for a load."""

import math

import numpy as np
import pandas as pd
import pytest

from tokenfactory import ConfigError
from tokenfactory.plant_models import (
    ClusterConfig,
    DESParams,
    KVTier,
    TieredKVStore,
    Worker,
    accelerator_preset,
    kv_tiers,
    model_preset,
    replay_store,
    session_chains,
    simulate,
)


def _store(hbm=200.0, dram=200.0, ssd=200.0, retention=(math.inf, math.inf, math.inf), trace=None):
    """1 byte per token, 100-token blocks; DRAM reads 1,000 B/s, SSD 100 B/s."""
    tiers = (KVTier("hbm", hbm, math.inf, retention[0]), KVTier("dram", dram, 1000.0, retention[1]),
             KVTier("ssd", ssd, 100.0, retention[2]))
    return TieredKVStore(tiers, 1.0, block_tokens=100, trace=trace)


def test_capacity_demotes_down_the_tiers_and_hits_cost_the_tiers_bandwidth():
    s = _store()
    # blobs 1, 2, 3 of 100 tokens into a 2-blob HBM: 1 (least recently placed) moves to DRAM
    for t, b in enumerate((1, 2, 3)):
        assert s.fetch(t, [b], 100, 0, float(t)) == (0, 0.0)
    assert s.where[1][0] == 1 and s.where[2][0] == 0 and s.where[3][0] == 0
    # a request whose prefix is blob 1: served from DRAM, 100 B at 1,000 B/s
    hit, load = s.fetch(3, [1, 9], 200, 0, 10.0)
    assert (hit, load) == (100, pytest.approx(0.1))
    # 1 and 9 are back in HBM (9 computed now), pushing 2 then 3 down: 2 into DRAM, 3 too
    assert [s.where[k][0] for k in (1, 9, 2, 3)] == [0, 0, 1, 1]
    # 4 and 5 push 1 and 9 to DRAM, and DRAM's oldest (2, 3) on to SSD
    s.fetch(4, [4, 5], 200, 0, 11.0)
    assert [s.where[k][0] for k in (4, 5, 1, 9, 2, 3)] == [0, 0, 1, 1, 2, 2]
    hit, load = s.fetch(5, [2, 3], 200, 0, 12.0)  # both from SSD: 200 B at 100 B/s
    assert (hit, load) == (200, pytest.approx(2.0))
    rec = s.record_columns(6)
    assert list(rec["prefix_tier"]) == ["none", "none", "none", "dram", "none", "ssd"]
    assert rec["ssd_tokens"][5] == 200 and rec["dram_tokens"][3] == 100
    assert rec["prefix_load_s"][5] == pytest.approx(2.0)


def test_a_dropped_blob_is_rebuilt_and_breaks_the_prefix():
    s = _store(hbm=100.0, dram=100.0, ssd=100.0)
    for t, b in enumerate((1, 2, 3, 4)):  # 1 ends past SSD: dropped
        s.fetch(t, [b], 100, 0, float(t))
    assert 1 not in s.where and 1 in s.dropped
    # prefix [1, 2]: 1 is gone, so 2 (still in SSD) is computed again as well - 200 rebuilt tokens
    hit, load = s.fetch(4, [1, 2], 200, 0, 5.0)
    assert (hit, load) == (0, 0.0)
    rec = s.record_columns(5)
    assert rec["rebuilt_tokens"][4] == 200 and rec["prefix_tier"][4] == "rebuilt"
    m = s.metrics(5.0)["kv_store"]
    assert m["rebuilt_tokens"] == 200 and m["rebuilt_share"] == 1.0


def test_retention_moves_idle_blobs_down_at_their_own_moment_and_hbm_byte_seconds():
    """One 100-token blob; HBM keeps it 10 s idle, DRAM 100 s, SSD 1,000 s (since its last use).
    Used at 0 and 5: in HBM until 15. At 20 it is in DRAM (load 0.1 s). Used at 20, it leaves
    HBM at 30 and DRAM at 120; at 170 it comes from SSD (1 s). Used at 170, it is dropped at
    1,170, so at 1,171 it is rebuilt. HBM held its 100 B over [0, 15], [20, 30], [170, 180] and
    [1171, 1181]: 4,500 byte-seconds by 1,200. A quarter of the reusable tokens came from HBM."""
    s = _store(hbm=1e9, dram=1e9, ssd=1e9, retention=(10.0, 100.0, 1000.0))
    s.fetch(0, [7], 100, 0, 0.0)
    assert s.fetch(1, [7], 100, 0, 5.0) == (100, 0.0)
    assert s.fetch(2, [7], 100, 0, 20.0) == (100, pytest.approx(0.1))
    assert s.fetch(3, [7], 100, 0, 170.0) == (100, pytest.approx(1.0))
    assert s.fetch(4, [7], 100, 0, 1171.0) == (0, 0.0)
    rec = s.record_columns(5)
    assert list(rec["prefix_tier"]) == ["none", "hbm", "dram", "ssd", "rebuilt"]
    m = s.metrics(1200.0)["kv_store"]
    assert m["hbm_idle_byte_seconds"] == pytest.approx(100 * (15 + 10 + 10 + 10))
    # DRAM: [15, 20], [30, 120], [180, 270], [1181, 1200]; SSD: [120, 170], [270, 1170]
    assert m["tiers"]["dram"]["byte_seconds"] == pytest.approx(100 * (5 + 90 + 90 + 19))
    assert m["tiers"]["ssd"]["byte_seconds"] == pytest.approx(100 * (50 + 900))
    assert m["tiers"]["hbm"]["served_tokens"] == 100 and m["rebuilt_tokens"] == 100
    assert m["tiers"]["hbm"]["share"] == pytest.approx(0.25)


def test_retention_must_not_shrink_down_the_tiers():
    with pytest.raises(ConfigError, match=r"tier\[dram\].retention_s"):
        _store(retention=(100.0, 10.0, math.inf))
    with pytest.raises(ConfigError, match=r"tier\[hbm\].capacity_bytes"):
        KVTier("hbm", 0.0, math.inf)


def _sessions():
    # session a: three turns, each continuing the last prompt; b: a turn, then a compaction
    return pd.DataFrame({"arrival_s": [0.0, 10.0, 20.0, 1.0, 11.0], "input_tokens": [1000, 1500, 2200, 300, 400],
                         "cached_tokens": [0, 1000, 1500, 0, 0], "output_tokens": [5] * 5,
                         "session_id": ["a", "a", "a", "b", "b"], "turn": [0, 1, 2, 0, 1]})


def test_session_chains_give_each_turn_its_earlier_turns_as_prefix():
    tr = _sessions()
    assert session_chains(tr).tolist() == [-1, 0, 1, -1, -1]
    s = _store(hbm=1e9, trace=tr)
    rec, m = replay_store(tr, s)
    # turn 1 reads turn 0's blob (1,000 tokens), turn 2 both blobs (1,000 + 500); b's compacted turn nothing
    assert rec["hbm_tokens"].tolist() == [0, 1000, 1500, 0, 0]
    assert rec["prefix_tier"].tolist() == ["none", "hbm", "hbm", "none", "none"]
    assert m["kv_store"]["reusable_tokens"] == 2500


def test_kv_tiers_from_the_hardware_descriptor():
    w = Worker(model_preset("deepseek-v3"), accelerator_preset("h200"))
    hbm, dram, ssd = kv_tiers(w, workers=4, hbm_workers=2, retention_s=(60.0, 3600.0, 86400.0))
    assert hbm.capacity_bytes == pytest.approx(2 * w.kv_capacity_bytes)
    # DGX H200: 2 TB host memory and 8 x 3.84 TB NVMe per node, half of each for KV
    assert dram.capacity_bytes == pytest.approx(0.5 * 4 * 2e12)
    assert ssd.capacity_bytes == pytest.approx(0.5 * 4 * 8 * 3.84e12)
    # pooled DRAM comes back over the NICs (8 x 50 GB/s), below 8 PCIe Gen5 links (8 x 64 GB/s)
    assert dram.read_bandwidth == pytest.approx(8 * 50e9)
    assert ssd.read_bandwidth == pytest.approx(8 * 7e9)
    assert (hbm.retention_s, dram.retention_s, ssd.retention_s) == (60.0, 3600.0, 86400.0)


def test_the_fill_waits_for_a_load_from_a_lower_tier():
    """A degenerate plant (instant steps and transfer, one pass per token): a request whose
    100-token prefix sits in DRAM finishes its fill 0.1 s (100 B at 1,000 B/s) after it starts;
    the same request hitting HBM finishes at once."""
    params = DESParams(fill_token_budget=10 ** 6, fill_step_tokens=(1.0, 1e6), fill_step_s=(1e-9, 1e-9),
                       fill_s_per_cached_token=0.0, kv_bytes_per_token=0.0, kv_link_bandwidth=math.inf,
                       kv_setup_s=0.0, decode_kv_capacity_bytes=math.inf, decode_batches=(1.0, 2.0),
                       decode_contexts=(1.0, 1e9), decode_table_s=((0.01, 0.01), (0.01, 0.01)), block_tokens=100)
    tr = pd.DataFrame({"arrival_s": [0.0, 1.0, 2.0, 3.0], "input_tokens": [100, 100, 100, 200],
                       "cached_tokens": 0, "output_tokens": 2,
                       "hash_ids": [[1], [2], [3], [1, 4]]})
    s = _store(hbm=200.0)
    r = simulate(tr, params, ClusterConfig(fill_workers=1, decode_workers=1, progress=False), prefix_cache=s).records
    fill = (r["fill_end_s"] - r["fill_start_s"]).to_numpy()
    assert fill[3] == pytest.approx(0.1, abs=1e-6)
    assert fill[:3] == pytest.approx([0.0, 0.0, 0.0], abs=1e-6)
    assert r["prefix_tier"].tolist() == ["none", "none", "none", "dram"]
    assert r["cached_tokens"].tolist() == [0, 0, 0, 100]
    assert (r["state"] == "completed").all()


def test_hit_ratio_falls_and_idle_hbm_shrinks_as_hbm_retention_shortens():
    """A replay of sessions: shorter HBM retention serves less from HBM (more from DRAM) and
    holds fewer idle HBM byte-seconds; with DRAM and SSD behind it nothing is rebuilt."""
    from tokenfactory.traces import generate_requests, long_context_workload

    tr = generate_requests(long_context_workload(mean_rate_rps=0.3, seed=2), 1800.0)
    w = Worker(model_preset("k3-like"), accelerator_preset("b300"))
    out = []
    for ret in (5.0, 60.0, math.inf):
        store = TieredKVStore(kv_tiers(w, 4, 2, retention_s=(ret, math.inf, math.inf)), 18432.0, trace=tr)
        _, m = replay_store(tr, store)
        out.append(m["kv_store"])
    hbm = [m["tiers"]["hbm"]["share"] for m in out]
    idle = [m["hbm_idle_byte_seconds"] for m in out]
    assert hbm[0] < hbm[1] < hbm[2] and idle[0] < idle[1] < idle[2]
    assert all(m["rebuilt_tokens"] == 0 for m in out)
    assert out[0]["tiers"]["dram"]["share"] > out[2]["tiers"]["dram"]["share"]
    assert np.isclose(sum(m["share"] for m in out[0]["tiers"].values()) + out[0]["rebuilt_share"], 1.0)
