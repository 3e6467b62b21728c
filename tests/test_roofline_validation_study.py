import json

import numpy as np
import pandas as pd
import pytest

from tokenfactory.plant_models import Efficiency
from tokenfactory.plant_models.published_points import FIT_PARAMETERS, FITTED_EFFICIENCY, PUBLISHED_POINTS
from tokenfactory.studies import run_study


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("rv")
    run_study("roofline-validation", out, quick=True)
    return out


def test_writes_outputs(report):
    for f in ("metrics.json", "summary.md", "validation_errors.png", "validation_points.csv",
              "leave_one_out.csv", "excluded_sources.csv"):
        assert (report / f).stat().st_size > 0, f


def test_fit_is_bound_and_matches_the_defaults(report):
    m = json.loads((report / "metrics.json").read_text())
    for k, (lo, hi) in FIT_PARAMETERS.items():
        assert lo <= m["fitted"][k] <= hi
        assert m["fitted"][k] == pytest.approx(FITTED_EFFICIENCY[k], rel=0.01), k
    assert all(m["identified"].values())
    assert all(m["stored_fit_matches"].values())
    assert m["defaults"]["memory"] == Efficiency().memory


def test_error_table_values(report):
    m = json.loads((report / "metrics.json").read_text())
    t = pd.read_csv(report / "validation_points.csv")
    assert len(t) == len(PUBLISHED_POINTS) == m["points"]
    # signed errors recomputed from the table's own columns (latencies invert)
    lat = t["unit"] == "s"
    err = np.where(lat, t["published"] / t["held_out_predicted"], t["held_out_predicted"] / t["published"]) - 1
    assert np.allclose(err, t["held_out_error"])
    held = np.abs(t["held_out_error"])
    assert m["held_out_median_abs_error"] == pytest.approx(np.median(held))
    assert m["meets_median_target"] == (np.median(held) <= 0.20)
    assert set(m["held_out_over_target_max"]) == set(t.loc[held > 0.40, "point"])
    # the fit beats the old assumptions by a wide margin, and held-out error exceeds in-sample
    assert m["held_out_median_abs_error"] < m["old_assumptions_median_abs_error"] / 2
    assert m["held_out_median_abs_error"] >= m["in_sample_median_abs_error"]
    # every point worse than 40 % held out is named in the summary with a reason
    summary = (report / "summary.md").read_text()
    for p in m["held_out_over_target_max"]:
        line = next(x for x in summary.splitlines() if f"`{p}`" in x)
        assert "no stated reason" not in line


def test_measured_runs_section(report):
    m = json.loads((report / "metrics.json").read_text())["measured_runs"]
    text = (report / "summary.md").read_text()
    assert "## Measured serving runs" in text
    if not m["present"]:  # a checkout without the shared measurements says so
        assert "not present" in text
        return
    assert m["rows_mapped"] + sum(m["rows_skipped_by_reason"].values()) == m["rows_read"]
    assert m["pre-calibration"]["tpot"]["rows"] == m["rows_predicted"] > 0
    t = pd.read_csv(report / "measured_runs_errors.csv")
    assert set(t["split"]) >= {"all", "hardware", "engine", "precision", "mode", "batch_band"}
    if "cross_check" in m:
        assert 0.5 < m["cross_check"]["tpot_ratio_median"] < 2.0
    if "calibrated_published_points" in m:  # the calibrated set on the 13 points, stated from its numbers
        cp = m["calibrated_published_points"]
        assert set(cp["signed_error"]) == {p.key for p in PUBLISHED_POINTS}
        assert cp["median_abs_error"] == pytest.approx(np.median(np.abs(list(cp["signed_error"].values()))))
        assert f"median |error| {100 * cp['median_abs_error']:.1f} %" in text
    if "tpot_by_batch_and_context" in m:  # what the large-batch error grows with, from the table
        res = pd.read_csv(report / "tpot_by_batch_and_context.csv")
        assert res["rows"].sum() == m["calibrated"]["tpot"]["rows"]
        if (res["batch_band"] == ">128").sum() >= 2:
            assert "Above 128 sequences per rank" in text
