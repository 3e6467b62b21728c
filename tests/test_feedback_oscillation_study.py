import json

import pytest

from tokenfactory.studies import run_study


@pytest.fixture(scope="module")
def metrics(tmp_path_factory):
    out = tmp_path_factory.mktemp("fo")
    run_study("feedback-oscillation", out, quick=True)
    for f in ("limit_cycle.png", "delay_robustness.png", "step_and_disturbances.png", "nyquist.png",
              "stability_map.png", "summary.md", "stability_map.csv"):
        assert (out / f).stat().st_size > 0, f
    return json.loads((out / "metrics.json").read_text())


def test_required_keys(metrics):
    for k in ("oscillating", "thornhill_r", "decay_ratio", "period_s", "amplitude", "decode_utilization",
              "backlog_p99"):
        assert k in metrics["naive"] and k in metrics["smoothed"], k
    for k in ("gain_margin", "phase_margin_deg", "delay_margin_s", "ms"):
        assert k in metrics["smoothed"], k
    for k in ("predicted_period_s", "predicted_amplitude"):
        assert k in metrics["naive"], k


def test_naive_oscillates_as_predicted(metrics):
    n = metrics["naive"]
    assert n["oscillating"] and n["thornhill_r"] > 1
    assert n["period_s"] == pytest.approx(n["predicted_period_s"], rel=0.10)
    assert n["harmonic_amplitude"] == pytest.approx(n["predicted_amplitude"], rel=0.30)


def test_smoothed_is_quiet_with_margins(metrics):
    s = metrics["smoothed"]
    assert not s["oscillating"]
    assert s["gain_margin"] >= 2 and s["phase_margin_deg"] >= 45 and s["delay_margin_s"] > 0
    assert all(not v["oscillating"] for v in metrics["delay_robustness"].values())
    assert s["decode_utilization"] >= metrics["naive"]["decode_utilization"] - 1e-6


def test_responses_and_map(metrics):
    assert metrics["step"]["smoothed"]["overshoot_pct"] < 20
    assert not metrics["step"]["smoothed"]["oscillating"]
    for d in metrics["disturbances"].values():
        assert d["settling_time_s"] == d["settling_time_s"]  # settled (not NaN) before the end
    conf = metrics["stability_map"]["confirmation"]
    assert conf["unstable_point"]["oscillating"] and not conf["design_point"]["oscillating"]
