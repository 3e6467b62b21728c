import json

import pytest

from conftest import run_study_without_traces
from tokenfactory.cli import main


@pytest.fixture(scope="module")
def synthetic_metrics(tmp_path_factory):
    """The study without shared traces falls back to the embedded synthetic workload."""
    return run_study_without_traces("forecasting", tmp_path_factory)


def test_study_runs_without_trace_data(synthetic_metrics):
    out, m = synthetic_metrics
    assert m["synthetic_fallback"] and list(m["traces"]) == ["synthetic"]
    for h in ("1h", "1d"):
        r = m["traces"]["synthetic"][h]
        for model, row in r["models"].items():
            for k in ("mase", "smape", "coverage_80", "coverage_95", "fit_seconds"):
                assert row[k] is not None, (model, k)
        assert r["best_model"] in r["models"]
        sc = r["capacity_plan"]["scores"]
        assert sc["perfect foresight"]["under_provisioned_hours"] == 0
        assert sc["perfect foresight"]["gpu_hours"] <= sc["static peak"]["gpu_hours"]
    assert (out / "forecast_synthetic_1d.png").stat().st_size > 0


def test_forecast_cli(tmp_path, capsys):
    assert main(["traces", "synth", "--kind", "rates", "--duration", "12d", "--rate", "50", "--seed", "2",
                 "--out", str(tmp_path / "r.csv")]) == 0
    assert main(["forecast", "--trace", str(tmp_path / "r.csv"), "--horizon", "1d", "--models",
                 "seasonal-naive-daily,fourier", "--test-days", "3", "--out", str(tmp_path / "job")]) == 0
    m = json.loads((tmp_path / "job" / "metrics.json").read_text())
    assert set(m["models"]) == {"seasonal-naive-daily", "fourier"} and m["best_model"] in m["models"]
    assert "capacity_plan" in m and "<- best" in capsys.readouterr().out
    assert main(["forecast", "--trace", str(tmp_path / "r.csv"), "--models", "prophet"]) == 2


def test_traces_cli(tmp_path, capsys):
    assert main(["traces", "list"]) == 0
    assert "servegen:m-large" in capsys.readouterr().out
    assert main(["traces", "synth", "--duration", "10m", "--out", str(tmp_path / "q.csv"), "--agentic", "0.5"]) == 0
    assert main(["traces", "info", str(tmp_path / "q.csv"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert info["kind"] == "requests" and info["rows"] > 0
    assert main(["traces", "synth", "--duration", "soon"]) == 2
