import json

import numpy as np
import pandas as pd
import pytest

from tokenfactory import ConfigError
from tokenfactory.studies import run_study


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bc")
    run_study("bandwidth-capacity", out, quick=True)
    return out


def test_outputs(report):
    for f in ("metrics.json", "summary.md", "bandwidth_capacity.png", "capacity_sweep.csv"):
        assert (report / f).stat().st_size > 0, f


def test_capacity_curve_shape(report):
    df = pd.read_csv(report / "capacity_sweep.csv")
    m = json.loads((report / "metrics.json").read_text())
    for bw, g in df.groupby("hbm_bandwidth_tbs"):
        fill = g[g.policy == "fill"].sort_values("hbm_capacity_gb")
        val = g[g.policy == "value"].sort_values("hbm_capacity_gb")
        # nothing until weights fit, then throughput never falls as capacity grows
        assert (fill["tokens_per_s_per_gpu"].diff().dropna() >= -1e-9).all()
        assert (fill.loc[fill.decode_slots == 0, "tokens_per_s_per_gpu"] == 0).all()
        # the value-optimal batch earns at least what filling every slot earns, at every capacity
        assert (val["revenue_per_gpu_hour"].to_numpy() >= fill["revenue_per_gpu_hour"].to_numpy() - 1e-9).all()
        assert (val["batch"].to_numpy() <= fill["batch"].to_numpy()).all()
    ref = m["per_bandwidth"]["8"]
    assert ref["rise_tokens_per_s_per_gb"] > 3 * ref["plateau_tokens_per_s_per_gb"]
    # the article's decline: filling spare capacity with slow batches loses revenue
    assert ref["fill_revenue_decline_fraction"] > 0.1
    assert ref["fill_tpot_at_max_capacity_s"] > ref["fill_tpot_at_peak_s"]
    # more bandwidth, higher plateau
    plateaus = [m["per_bandwidth"][k]["plateau_tokens_per_s_per_gpu"] for k in ("4", "8", "12")]
    assert np.all(np.diff(plateaus) > 0)
    bvc = m["bandwidth_vs_capacity"]
    assert bvc["fast_small"]["revenue_per_gpu_hour"] > bvc["slow_big"]["revenue_per_gpu_hour"]


def test_rejects_bad_config(tmp_path):
    with pytest.raises(ConfigError, match="reference_bandwidth_tbs"):
        run_study_cfg(tmp_path, {"reference_bandwidth_tbs": 5.0})
    with pytest.raises(ConfigError, match="bandwidth-capacity.capacity"):
        run_study_cfg(tmp_path, {"capacity": 3})


def run_study_cfg(tmp_path, cfg):
    from tokenfactory.studies import bandwidth_capacity

    return bandwidth_capacity.run(tmp_path, quick=True, config=cfg)
