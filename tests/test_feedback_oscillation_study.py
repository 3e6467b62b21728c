import json

import pytest


@pytest.fixture(scope="module")
def study(quick_study):
    out = quick_study("feedback-oscillation")  # the same run the HTML report's tests read
    return out, json.loads((out / "metrics.json").read_text())


@pytest.fixture(scope="module")
def metrics(study):
    return study[1]


def test_plant_figures_are_physical(metrics):
    for name in ("naive", "smoothed", "threshold"):
        m = metrics[name]
        assert 0.5 < m["decode_utilization"] <= 1.0 + 1e-9, name
        assert m["backlog_p99"] >= 0 and abs(m["conservation_residual"]) < 1e-3, name
    # the smoothed loop keeps decode at least as busy as the naive one with a smaller backlog
    assert metrics["smoothed"]["backlog_p99"] <= metrics["naive"]["backlog_p99"]


def test_summary_sentences_come_from_the_numbers(study):
    out, m = study
    text = (out / "summary.md").read_text()
    n, s = m["naive"], m["smoothed"]
    assert f"GM {s['gain_margin']:.2f}, PM {s['phase_margin_deg']:.1f} deg" in text
    assert f"T = {n['predicted_period_s']:.2f} s" in text
    assert f"period error {100 * (n['predicted_period_s'] / n['period_s'] - 1):+.1f} %" in text
    starving = n["decode_utilization"] < s["decode_utilization"] - 0.005
    assert ("decode starves" in text) == starving and ("decode does not starve" in text) == (not starving)
    for f in ("limit_cycle.png", "delay_robustness.png", "step_and_disturbances.png", "nyquist.png",
              "stability_map.png"):
        assert f"![{f}]({f})" in text and (out / f).stat().st_size > 10_000, f


def test_naive_oscillates_as_predicted(metrics):
    n = metrics["naive"]
    assert n["oscillating"] and n["thornhill_r"] > 1
    assert n["period_s"] == pytest.approx(n["predicted_period_s"], rel=0.10)
    assert n["harmonic_amplitude"] == pytest.approx(n["predicted_amplitude"], rel=0.30)


def test_smoothed_is_quiet_with_margins(metrics):
    s = metrics["smoothed"]
    assert not s["oscillating"]
    assert s["stable"] and s["closed_loop_rhp_poles"] == 0
    assert s["gain_margin"] >= 2 and s["phase_margin_deg"] >= 45 and s["delay_margin_s"] > 0
    assert all(not v["oscillating"] for v in metrics["delay_robustness"].values())
    assert s["decode_utilization"] >= metrics["naive"]["decode_utilization"] - 1e-6


def test_responses_and_map(metrics):
    assert metrics["step"]["smoothed"]["overshoot_pct"] < 20
    assert not metrics["step"]["smoothed"]["oscillating"]
    for name, d in metrics["disturbances"].items():
        # settled (JSON null if it never did) within two minutes of the disturbance's end
        assert d["settling_time_s"] is not None and 0.0 < d["settling_time_s"] < 120.0, name
        assert not d["oscillating"], name
    conf = metrics["stability_map"]["confirmation"]
    assert conf["unstable_point"]["oscillating"] and not conf["design_point"]["oscillating"]
