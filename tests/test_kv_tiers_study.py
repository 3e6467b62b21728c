"""Study `kv-tiers`: quick variant - the retention sweeps and the midfill latency by tier."""

import json
import math

import pandas as pd
import pytest

from tokenfactory import ConfigError
from tokenfactory.studies import run_study


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("kv-tiers")
    run_study("kv-tiers", out, quick=True)
    return out, json.loads((out / "metrics.json").read_text())


def test_outputs(report):
    out, m = report
    for f in ("metrics.json", "summary.md", "kv_tiers.png", "midfill_latency.png", "hbm_retention_sweep.csv",
              "store_retention_sweep.csv", "midfill_latency.csv", "midfill_by_source.csv"):
        assert (out / f).stat().st_size > 0, f
    assert len(m["report"]["headlines"]) >= 2


def test_hbm_retention_trades_idle_hbm_for_hits(report):
    out, _ = report
    s = pd.read_csv(out / "hbm_retention_sweep.csv").sort_values("hbm_retention_s")
    assert s["hbm_share"].is_monotonic_increasing and s["hbm_idle_byte_seconds"].is_monotonic_increasing
    assert s["hbm_share"].iloc[-1] > s["hbm_share"].iloc[0] + 0.5
    shares = s[["hbm_share", "dram_share", "ssd_share", "rebuilt_share"]].sum(axis=1)
    assert shares.to_numpy() == pytest.approx(1.0)
    # the hits HBM gives up come back from DRAM at its bandwidth
    assert s["load_seconds"].iloc[0] > s["load_seconds"].iloc[-1]


def test_store_retention_sets_what_is_rebuilt(report):
    out, _ = report
    life = pd.read_csv(out / "store_retention_sweep.csv").sort_values("ssd_retention_s")
    assert life["rebuilt_share"].is_monotonic_decreasing and life["rebuilt_share"].iloc[0] > 0
    assert (life["rebuild_node_seconds"] > 0).iloc[0] and life["rebuild_node_seconds"].iloc[-1] == 0


def test_midfills_by_source(report):
    out, _ = report
    d = pd.read_csv(out / "midfill_latency.csv").set_index("policy")
    ideal = d.loc["HBM only, unbounded"]
    drop = d[d.index.str.endswith("drop")].iloc[0]
    assert ideal["hbm_share"] == 1.0 and ideal["rebuilt_share"] == 0.0
    assert drop["rebuilt_share"] > 0.1 and drop["midfill_fill_p50"] > 5 * ideal["midfill_fill_p50"]
    src = pd.read_csv(out / "midfill_by_source.csv")
    dram = src[src["source"] == "dram"]
    assert len(dram) and (dram["load_p50"] < 0.05).all()  # a few GB at hundreds of GB/s


def test_rejects_bad_config(tmp_path):
    from tokenfactory.studies.kv_tiers import run

    with pytest.raises(ConfigError, match="kv-tiers.fill_workers"):
        run(tmp_path, quick=True, config={"fill_workers": 4})
    with pytest.raises(ConfigError, match=r"kv-tiers.hbm_retention_s\[0\]"):
        run(tmp_path, quick=True, config={"hbm_retention_s": [-1.0, math.inf]})


def test_rebuild_costs_what_the_simulator_charges_a_lone_prompt():
    """rebuild_seconds is the request simulator's fill time of one prompt alone on a fill worker
    (the cost the study books for each rebuilt prefix), and far above loading the same KV."""
    from tokenfactory.plant_models import (ClusterConfig, DESParams, RequestShape, ServiceModel, Worker,
                                           accelerator_preset, model_preset, simulate)
    from tokenfactory.studies.kv_tiers import rebuild_seconds

    w = Worker(model_preset("deepseek-v3"), accelerator_preset("h200"))
    params = DESParams.from_service(ServiceModel(w, w, RequestShape(2048, 512)))
    n = 65_536
    tr = pd.DataFrame({"arrival_s": [0.0], "input_tokens": [n], "cached_tokens": [0], "output_tokens": [2]})
    r = simulate(tr, params, ClusterConfig(fill_workers=1, decode_workers=1, progress=False, prefix_cache_blocks=0,
                                           drain_s=600.0))
    fill_s = r.records.loc[0, "fill_end_s"] - r.records.loc[0, "fill_start_s"]
    assert rebuild_seconds(params, n) == pytest.approx(fill_s, rel=0.02)
    assert rebuild_seconds(params, 2 * n) > 2.5 * rebuild_seconds(params, n)  # context grows each chunk's cost


def test_rebuild_against_load_figures(report):
    _, m = report
    r = m["rebuild_vs_load"]
    for t in m["tiers"]:
        if t["name"] == "dram":
            assert r["load_dram_s"] * t["read_bandwidth"] == pytest.approx(r["prefix_tokens"] * m["kv_bytes_per_token"])
    assert r["rebuild_s"] > 10 * max(r["load_dram_s"], r["load_ssd_s"]) and r["load_ssd_s"] > r["load_dram_s"]
