"""Study `long-context`: quick variant - the workload reaches the article's contexts, the replay
machinery runs on it under admission control."""

import json

import pandas as pd
import pytest

from tokenfactory import ConfigError
from tokenfactory.studies import run_study


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("long-context")
    run_study("long-context", out, quick=True)
    return out, json.loads((out / "metrics.json").read_text())


def test_outputs(report):
    out, m = report
    for f in ("metrics.json", "summary.md", "workload.png", "replay.png", "replay.csv", "shapes.csv"):
        assert (out / f).stat().st_size > 0, f


def test_workload_is_long_and_midfill_heavy(report):
    _, m = report
    w = m["workload"]
    assert w["input_tokens"]["max"] > 500_000 and w["share_over_250k"] > 0.15
    assert w["cached_share"] > 0.9 and w["midfill_share"] > 0.9
    shapes = pd.DataFrame(m["shapes"])
    # the long-context request leaves far fewer decode slots than the control studies' 2k/512
    assert shapes["decode_slots"].iloc[0] * 5 < shapes["decode_slots"].iloc[1]


def test_replays_conserve_and_admission_control_holds_under_overload(report):
    out, _ = report
    t = pd.read_csv(out / "replay.csv")
    assert (t["requests"] == t["completed"] + t["rejected"] + t["in_flight_end"]).all()
    top = t[t["load"] == t["load"].max()].set_index("admission")
    assert top.loc["smoothed", "slo_attainment"] >= top.loc["naive", "slo_attainment"]
    assert (t["midfill_ttft_p50"] < t["prefill_ttft_p50"]).all()


def test_rejects_bad_config(tmp_path):
    from tokenfactory.studies.long_context import run

    with pytest.raises(ConfigError, match="long-context.loads"):
        run(tmp_path, quick=True, config={"loads": [-1.0]})
