"""The published-point table, its conversions, and the efficiency fit (issue 13 part 1)."""

import dataclasses

import numpy as np
import pytest

from tokenfactory import ConfigError
from tokenfactory.plant_models import Efficiency
from tokenfactory.plant_models.published_points import (
    ASSUMED_EFFICIENCY,
    EXCLUDED_SOURCES,
    FIT_PARAMETERS,
    FITTED_EFFICIENCY,
    PUBLISHED_POINTS,
    cross_validate,
    fit_efficiency,
    point_worker,
    predict_point,
)

POINTS = {p.key: p for p in PUBLISHED_POINTS}


def test_points_carry_sources_configuration_and_conversion():
    assert len(POINTS) == len(PUBLISHED_POINTS) >= 6
    for p in PUBLISHED_POINTS:
        assert "https://" in p.source and p.date and p.conversion, p.key
        assert p.published > 0 and p.sequences >= 1
        w = point_worker(p)  # the configuration builds a worker that fits
        assert w.num_gpus == p.parallelism.get("pp", 1) * p.parallelism["ep"]
    assert {p.hardware for p in PUBLISHED_POINTS} >= {"h800", "h100-sxm", "h200", "b200", "gb200"}
    assert all(e["reason"] and "https://" in e["source"] for e in EXCLUDED_SOURCES)


def test_per_node_conversions():
    # per-node figures are divided by the node's 8 GPUs
    assert POINTS["ds-profile-decode"].published == pytest.approx(18_598 / 8)
    assert POINTS["sglang-h100-prefill-4k"].published == pytest.approx(50_302 / 8)
    # 111 tokens/s per user at batch 1 is a TPOT of 9.0 ms
    assert POINTS["trtllm-b200-batch1"].published == pytest.approx(9.009e-3, rel=1e-3)


def test_predictions_follow_the_stated_conversion():
    e = ASSUMED_EFFICIENCY
    p = POINTS["trtllm-h200-throughput"]
    w = point_worker(p, e)
    fill = w.prefill(1024, sequences=8).tokens_per_s
    dec = w.decode(1024, 2048).tokens_per_s
    assert predict_point(p, e) == pytest.approx(2048 / (1024 / fill + 2048 / dec) / 8)
    q = POINTS["trtllm-b200-batch1"]
    assert predict_point(q, e) == pytest.approx(point_worker(q, e).decode(1, 2048).time_s)
    r = POINTS["sglang-h100-decode-2k"]
    assert predict_point(r, e) == pytest.approx(point_worker(r, e).decode(72 * 256, 2000).tokens_per_s / 72)


def test_fit_recovers_known_efficiencies():
    """Points whose 'published' values come from known efficiencies are fitted back to them."""
    true = Efficiency(compute=0.45, memory=0.35, network=0.55, layer_overhead_s=60e-6)
    keys = ["ds-profile-prefill", "ds-profile-decode", "sglang-h100-decode-2k", "trtllm-b200-batch1",
            "sglang-gb200-prefill-128k-pp4", "trtllm-h200-throughput"]
    synth = [dataclasses.replace(POINTS[k], published=predict_point(POINTS[k], true)) for k in keys]
    fit = fit_efficiency(synth, starts=2, prior_weight=1e-4)
    for name in FIT_PARAMETERS:
        assert getattr(fit.efficiency, name) == pytest.approx(getattr(true, name), rel=0.03), name
    assert fit.table["abs_error"].max() < 0.01
    # leave-one-out on noise-free points predicts each held-out point almost exactly
    cv = cross_validate(synth, full_fit=fit, starts=1, prior_weight=1e-4)
    assert list(cv["point"]) == keys
    assert cv["abs_error"].max() < 0.05


def test_fit_flags_a_parameter_no_point_binds():
    """Single-node points (all-to-all on NVLink, hidden behind compute) cannot see the network
    efficiency: the fit says so and the prior keeps it at the old assumption."""
    keys = ["trtllm-b200-batch1", "sglang-gb200-prefill-128k-pp4", "trtllm-h200-throughput",
            "trtllm-b200-throughput-bf16kv"]
    fit = fit_efficiency(PUBLISHED_POINTS, train_keys=keys, starts=1)
    assert fit.identified == {"compute": True, "memory": True, "network": False, "layer_overhead_s": True}
    assert fit.efficiency.network == pytest.approx(ASSUMED_EFFICIENCY.network, rel=0.02)
    assert set(fit.table.loc[fit.table["held_out"], "point"]) == set(POINTS) - set(keys)


def test_fit_rejects_too_few_or_unknown_points():
    with pytest.raises(ConfigError, match="train_keys"):
        fit_efficiency(PUBLISHED_POINTS, train_keys=["ds-profile-decode"])
    with pytest.raises(ConfigError, match="train_keys"):
        fit_efficiency(PUBLISHED_POINTS, train_keys=["nope", "ds-profile-decode", "a", "b"])


def test_defaults_are_the_stored_fit_rounded():
    d = Efficiency()
    for name in ("compute", "memory", "network"):
        assert getattr(d, name) == pytest.approx(round(FITTED_EFFICIENCY[name], 2))
    assert d.layer_overhead_s == pytest.approx(round(FITTED_EFFICIENCY["layer_overhead_s"], 6))
    assert np.all([lo <= FITTED_EFFICIENCY[k] <= hi for k, (lo, hi) in FIT_PARAMETERS.items()])


@pytest.mark.parametrize("key", ["trtllm-b200-throughput-fp8kv", "trtllm-h200-throughput"])
def test_aggregated_point_pays_the_attention_dp_wait(key):
    """An aggregated point with attention-DP imbalance spends, per request, the time its prompt's
    pass takes beyond the even spread (hand form: O / per-GPU throughput rises by that wait)."""
    point = next(p for p in PUBLISHED_POINTS if p.key == key)
    eff = dataclasses.replace(Efficiency(), attention_dp_imbalance=1.0)
    w, even = point_worker(point, eff), point_worker(point)
    wait = (w.mixed(point.sequences, point.context_tokens, point.prompt_tokens).time_s
            - even.mixed(point.sequences, point.context_tokens, point.prompt_tokens).time_s)
    assert wait > 0
    base, imb = predict_point(point), predict_point(point, eff)
    # tokens/s per GPU = O / (seconds per request x GPUs): the seconds grow by exactly the wait
    n = w.num_gpus
    assert point.output_tokens / (imb * n) - point.output_tokens / (base * n) == pytest.approx(wait, rel=1e-9)
    # no imbalance: the defaults' value exactly
    zero = dataclasses.replace(Efficiency(), attention_dp_imbalance=0.0)
    assert predict_point(point, zero) == base
