"""Prometheus text exposition: what is written parses back, histograms are cumulative."""

import math

import pytest

from tokenfactory.core.errors import ConfigError
from tokenfactory.live.exposition import Registry, parse_text, sample_value


def test_written_metrics_parse_back():
    r = Registry()
    c = r.counter("vllm:prompt_tokens", "prompt tokens", ("model_name",))
    g = r.gauge("vllm:num_requests_running", "running", ("model_name",))
    h = r.histogram("vllm:time_to_first_token_seconds", "ttft", (0.1, 0.5, 1.0), ("model_name",))
    L = {"model_name": 'm"1'}
    c.inc(5, L)
    c.inc(2, L)
    g.set(3, L)
    for v in (0.05, 0.2, 0.7, 3.0):
        h.observe(v, L)
    h.observe(0.3, L, count=2)
    s = parse_text(r.render())
    assert sample_value(s, "vllm:prompt_tokens_total", model_name='m"1') == 7
    assert sample_value(s, "vllm:num_requests_running") == 3
    buckets = [(x.labels["le"], x.value) for x in s if x.name == "vllm:time_to_first_token_seconds_bucket"]
    assert buckets == [("0.1", 1), ("0.5", 4), ("1", 5), ("+Inf", 6)]
    assert sample_value(s, "vllm:time_to_first_token_seconds_count") == 6
    assert sample_value(s, "vllm:time_to_first_token_seconds_sum") == pytest.approx(0.05 + 0.2 + 0.7 + 3.0 + 0.6)
    assert "# TYPE vllm:prompt_tokens counter" in r.render()
    assert "# TYPE vllm:time_to_first_token_seconds histogram" in r.render()


def test_bad_input_is_named():
    with pytest.raises(ConfigError, match="metrics.line"):
        parse_text("ok 1\nnot a sample line at all\n")
    with pytest.raises(ConfigError, match="counter only increases"):
        Registry().counter("x", "x").inc(-1)
    with pytest.raises(ConfigError, match="labels"):
        Registry().gauge("x", "x", ("a",)).set(1, {"b": "1"})
    assert math.isnan(sample_value([], "missing"))
