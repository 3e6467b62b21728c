import json

import numpy as np
import pandas as pd
import pytest

from tokenfactory.studies import run_study
from tokenfactory.studies.k3_projection import pareto_front


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("k3")
    run_study("k3-projection", out, quick=True)
    return out


def test_pareto_front_by_hand():
    lat = [1.0, 2.0, 2.0, 3.0, 0.5, 4.0]
    thr = [10.0, 20.0, 15.0, 18.0, 5.0, 30.0]
    assert pareto_front(lat, thr).tolist() == [True, True, False, False, True, True]


def test_outputs(report):
    for f in ("metrics.json", "summary.md", "k3_fronts.png", "k3_points.csv", "k3_claims.csv"):
        assert (report / f).stat().st_size > 0, f


def test_fronts_are_non_dominated_and_complete(report):
    df = pd.read_csv(report / "k3_points.csv")
    assert set(df["workload"]) == {"decode-8k", "decode-32k", "midfill-127k+1k", "prefill-8k", "prefill-32k"}
    assert set(df["hardware"]) == {"b200", "b300", "gb200"}
    for _, g in df.groupby(["workload", "hardware"]):
        f = g[g.on_front]
        for r in f.itertuples():
            dominated = (g.latency_s < r.latency_s) & (g.tokens_per_s_per_gpu > r.tokens_per_s_per_gpu)
            assert not dominated.any()
        off = g[~g.on_front]
        for r in off.head(20).itertuples():  # every other point is beaten by a front point
            assert ((f.latency_s <= r.latency_s) & (f.tokens_per_s_per_gpu >= r.tokens_per_s_per_gpu)).any()
    # layouts respect the hardware: an NVL72 layout never leaves its rack
    assert (df.gpus == df.pp * df.ep).all()
    assert (df.ep % df.tp == 0).all()


def test_claims_are_computed_from_the_points(report):
    m = json.loads((report / "metrics.json").read_text())
    df = pd.read_csv(report / "k3_points.csv")
    claims = {c["id"]: c for c in m["claims"]}
    assert len(claims) >= 10
    assert {c["verdict"] for c in claims.values()} <= {"reproduced", "partly", "not reproduced", "not checkable"}
    fr = df[df.on_front]
    under = (fr.hbm_per_gpu_gb < 80).mean()
    assert claims["C11"]["verdict"] == ("reproduced" if under > 0.5 else "not reproduced")
    assert f"{100 * under:.0f} %" in claims["C11"]["evidence"]
    med = {w: fr[fr.workload == w].energy_per_query_j.median() for w in fr.workload.unique()}
    ordered = med["midfill-127k+1k"] < med["prefill-8k"] < med["prefill-32k"] < min(med["decode-8k"], med["decode-32k"])
    assert (claims["C10"]["verdict"] == "reproduced") == ordered
    # C1 recomputed: the lowest-TPOT decode point of each GPU type and context
    lows = [g.loc[g.latency_s.idxmin()] for (w, _), g in df[df.workload.str.startswith("decode")].groupby(["workload", "hardware"])]
    hits = sum(int(r.pp > 1 and r.tp > 1) for r in lows)
    assert claims["C1"]["verdict"] == ("reproduced" if hits > len(lows) / 2 else "partly" if hits else "not reproduced")
    # energy per query = board power x GPUs x time share; decode queries are 1,000 tokens
    d = df[df.workload == "decode-8k"].iloc[0]
    power = {"b200": 1000.0, "b300": 1100.0, "gb200": 1200.0}[d.hardware]
    assert d.energy_per_query_j == pytest.approx(1000 * power / d.tokens_per_s_per_gpu)
    assert np.isfinite(df.network_peak_gbs_per_gpu).all()
