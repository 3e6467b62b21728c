import json

import pytest

from conftest import run_study_without_traces
from tokenfactory.cli import main


@pytest.fixture(scope="module")
def metrics(tmp_path_factory):
    return run_study_without_traces("trace-replay", tmp_path_factory)


def test_runs_on_synthetic_when_traces_absent(metrics):
    out, m = metrics
    assert set(m["absent_traces"]) == {"azure-conv-2023", "mooncake-conversation"}
    rows = m["rows"]
    assert {r["admission"] for r in rows} == {"naive", "threshold", "smoothed"}
    for r in rows:
        assert r["requests"] == r["completed"] + r["rejected"] + r["in_flight_end"]
        assert 0.0 <= r["slo_attainment"] <= 1.0
    assert (out / "replay_synthetic.png").stat().st_size > 0


def test_smoothed_is_not_worse_than_naive(metrics):
    _, m = metrics
    by = {(r["load"], r["admission"]): r for r in m["rows"]}
    for load in {r["load"] for r in m["rows"]}:
        assert by[(load, "smoothed")]["slo_attainment"] >= by[(load, "naive")]["slo_attainment"]


def test_simulate_cli(tmp_path, capsys):
    assert main(["simulate", "--trace", "synthetic", "--duration", "5m", "--scale", "2", "--admission", "smoothed",
                 "--no-progress", "--out", str(tmp_path)]) == 0
    m = json.loads((tmp_path / "metrics.json").read_text())
    for k in ("requests", "completed", "rejected", "in_flight_end", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99",
              "slo_attainment", "goodput_tokens_per_s", "prefix_hit_ratio", "wall_seconds", "sim_requests_per_wall_s",
              "ready_oscillation"):
        assert k in m, k
    assert (tmp_path / "requests.csv").stat().st_size > 0 and (tmp_path / "series.csv").stat().st_size > 0
    assert main(["simulate", "--trace", "synthetic", "--admission", "pid"]) == 2
