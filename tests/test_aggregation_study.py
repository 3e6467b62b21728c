"""Study `aggregation`: quick variant (Azure conversation and the long-context synthetic, aggregated
against 2:2 and 3:1 at two loads) - outputs, conservation, the verdict read off its own numbers."""

import json

import pandas as pd
import pytest
from conftest import run_study_without_traces

from tokenfactory import ConfigError
from tokenfactory.studies import run_study
from tokenfactory.studies.aggregation import cluster_configs, goodput_at_slo


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("aggregation")
    run_study("aggregation", out, quick=True)
    return out, json.loads((out / "metrics.json").read_text())


def test_outputs(report):
    out, m = report
    for f in ("metrics.json", "summary.md", "aggregation.png", "stranded.png", "aggregation_runs.csv",
              "goodput_at_slo.csv"):
        assert (out / f).stat().st_size > 0, f
    assert {h["label"] for h in m["report"]["headlines"]} >= {f"{t}: aggregation verdict" for t in m["verdicts"]}


def test_runs_conserve_requests_and_only_disaggregation_moves_kv(report):
    out, _ = report
    t = pd.read_csv(out / "aggregation_runs.csv")
    assert (t["requests"] == t["completed"] + t["rejected"] + t["in_flight_end"]).all()
    agg = t[t["config"] == "aggregated"]
    assert (agg["mean_kv_transfer_s"] == 0).all() and (t.loc[t["config"] != "aggregated", "mean_kv_transfer_s"] > 0).all()
    for c in ("stranded_compute", "stranded_bandwidth"):
        assert t[c].between(0.0, 1.0).all()
    # every arrived request met the SLOs, missed TTFT, missed TPOT, or had not finished
    parts = t["slo_attainment"] + t["ttft_miss_share"] + t["tpot_miss_share"] + t["unfinished_share"]
    assert parts.to_numpy() == pytest.approx(1.0, abs=1e-9)


def test_chunks_slow_the_decodes_of_aggregated_workers(report):
    """At each trace's lowest load the aggregated decodes' median TPOT exceeds the 2:2 cluster's,
    whose decode workers prefill nothing."""
    out, _ = report
    t = pd.read_csv(out / "aggregation_runs.csv")
    for trace, g in t.groupby("trace"):
        low = g[g["load"] == g["load"].min()].set_index("config")
        assert low.loc["aggregated", "tpot_p50"] > low.loc["2:2", "tpot_p50"], trace


def test_verdict_follows_the_goodput_table(report):
    out, m = report
    best = pd.read_csv(out / "goodput_at_slo.csv")
    for trace, v in m["verdicts"].items():
        b = best[best["trace"] == trace].set_index("config")
        agg, dis = b.loc["aggregated", "max_load"], b.drop("aggregated")["max_load"].max()
        if abs(agg - dis) <= m["config"]["tie_fraction"]:
            assert v["winner"] == "tie"
        else:
            assert (v["winner"] == "aggregated") == (agg > dis)
    text = (out / "summary.md").read_text()
    assert all(trace in text for trace in m["verdicts"])


def test_goodput_at_slo_interpolates_the_first_crossing():
    assert goodput_at_slo([0.5, 1.0, 1.5], [0.99, 0.95, 0.5], 0.9) == (pytest.approx(1.0 + 0.05 / 0.45 * 0.5), "interpolated")
    assert goodput_at_slo([0.5, 1.0], [0.8, 0.5], 0.9) == (0.0, "below grid")
    assert goodput_at_slo([0.5, 1.0], [0.99, 0.95], 0.9) == (1.0, "at least")
    assert [c[0] for c in cluster_configs(4, [1, 3])] == ["aggregated", "1:3", "3:1"]


def test_rejects_bad_config(tmp_path):
    with pytest.raises(ConfigError, match="aggregation.fill_shares"):
        from tokenfactory.studies.aggregation import run

        run(tmp_path, quick=True, config={"fill_shares": [4]})
    with pytest.raises(ConfigError, match="aggregation.traces"):
        run(tmp_path, quick=True, config={"traces": ["nope"]})


def test_runs_without_trace_data(tmp_path_factory):
    _, m = run_study_without_traces("aggregation", tmp_path_factory)
    assert "azure-conv-2023" in m["substituted_traces"] and "synthetic" in m["verdicts"]
