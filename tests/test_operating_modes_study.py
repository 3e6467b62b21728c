import json

import pytest

from tokenfactory.studies import run_study


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("om")
    run_study("operating-modes", out, quick=True)
    return out


def test_writes_figures_metrics_summary(report):
    for f in ("metrics.json", "summary.md", "expert_intensity.png", "decode_batching.png",
              "stage_memory.png", "operating_modes_roofline.png"):
        assert (report / f).stat().st_size > 0, f


def test_metrics_reproduce_the_article(report):
    m = json.loads((report / "metrics.json").read_text())
    assert m["stage_memory"]["kv_bytes"] == pytest.approx(140e9)
    assert m["stage_memory"]["kv_bytes_double_buffered"] == pytest.approx(280e9)
    assert 4 in m["stage_memory"]["models"]["deepseek-v3"]["depths_in_target_band"]
    d = m["decode"]["h200"]
    assert d["131072"]["batching_gain"] < d["8192"]["batching_gain"]
    assert m["roofline"]["prefill 8k"]["bound"] == "compute"
    assert m["roofline"]["decode experts b=1"]["bound"] == "memory"
    assert m["config"]["model"] == "deepseek-v3"
