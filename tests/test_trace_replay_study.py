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
    assert m["requests"] == m["completed"] + m["rejected"] + m["in_flight_end"] and m["requests"] > 100
    assert 0 < m["ttft_p50"] <= m["ttft_p99"] and 0 < m["tpot_p50"] <= m["tpot_p99"]
    assert 0.0 <= m["slo_attainment"] <= 1.0 and m["goodput_tokens_per_s"] >= 0
    assert m["oscillating"] == m["oscillation"]["oscillating"]  # the verdict on every actuator and buffer
    assert m["oscillating"] >= m["ready_oscillation"]["oscillating"]
    assert m["admission"] == "smoothed" and m["scale"] == 2
    assert (tmp_path / "requests.csv").stat().st_size > 0 and (tmp_path / "series.csv").stat().st_size > 0
    assert main(["simulate", "--trace", "synthetic", "--admission", "pid"]) == 2
