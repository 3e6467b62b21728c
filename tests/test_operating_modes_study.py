import json

import pytest


@pytest.fixture(scope="module")
def report(quick_study):
    return quick_study("operating-modes")  # the same run the HTML report's tests read


def test_writes_figures_metrics_summary(report):
    for f in ("metrics.json", "summary.md", "expert_intensity.png", "decode_batching.png",
              "stage_memory.png", "operating_modes_roofline.png", "decode_value.png", "decode_value.csv"):
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


def test_decode_batch_optimum_by_value(report):
    import pandas as pd

    m = json.loads((report / "metrics.json").read_text())
    dv = m["decode_value"]
    df = pd.read_csv(report / "decode_value.csv")
    for hw in ("h200", "b200"):
        for ctx in ("8192", "131072", "1048576"):
            b = dv[hw][ctx]
            g = df[(df.hardware == hw) & (df.context_tokens == int(ctx))]
            # the reported optima are the maxima of the swept table
            assert b["value_revenue_per_gpu_hour"] == pytest.approx(g.revenue_per_gpu_hour.max())
            assert b["throughput_tokens_per_s_per_gpu"] == pytest.approx(g.tokens_per_s_per_gpu.max())
            assert b["value_revenue_per_gpu_hour"] >= b["throughput_revenue_per_gpu_hour"] - 1e-12
            assert 1 <= b["value_batch"] <= b["decode_slots"]
        # a 1M-token context leaves room for a handful of sequences on 8 GPUs
        assert dv[hw]["1048576"]["decode_slots"] <= 8
        assert dv[hw]["1048576"]["value_batch"] < dv[hw]["131072"]["value_batch"] < dv[hw]["8192"]["value_batch"]


def test_expert_gathering_sentence_follows_the_numbers(report):
    import re

    from tokenfactory.plant_models import model_preset

    m = json.loads((report / "metrics.json").read_text())
    model = model_preset(m["config"]["model"])
    slots = m["decode"]["h200"]["8192"]["decode_slots"]
    needed = m["expert_intensity"]["tokens_per_expert_to_reach_ridge"]["h200"]
    text = (report / "summary.md").read_text()
    fill, dec = (int(x) for x in re.findall(r"routes ~(\d+)", text))
    assert fill == round(8192 * model.active_experts / model.routed_experts)
    assert dec == round(slots * model.active_experts / model.routed_experts)
    assert ("stay memory-bound" in text) == (dec < needed)
