"""Reading, deduplicating and mapping measured serving runs (plant_models/measured_runs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenfactory.plant_models.measured_runs import (
    SKIP_REASONS,
    batch_band,
    read_measured_runs,
)
from tokenfactory.plant_models.moe_model import model_preset
from tokenfactory.core.validation import ConfigError

SUBSET = Path(__file__).parent / "data" / "silicon_subset.csv"


@pytest.fixture(scope="module")
def runs():
    return read_measured_runs(SUBSET)


def test_every_row_is_scored_or_counted(runs):
    assert runs.rows_read == 11
    assert len(runs.runs) + sum(runs.skipped.values()) == runs.rows_read
    assert set(runs.skipped) <= set(SKIP_REASONS)


@pytest.mark.parametrize("reason, count", [
    ("duplicate run (same TTFT and TPOT to 1e-4 ms)", 1),
    ("concurrency not stated", 1),
    ("prefill / decode worker counts not stated", 1),
])
def test_skip_counts(runs, reason, count):
    assert runs.skipped[reason] == count


def test_layout_encoding_is_decoded(runs):
    # tp = 64 with MoE 8 x 8 is TP8 / EP8 on 8 GPUs (SOURCE.md)
    (r,) = [r for r in runs.runs if "tp64-moe8x8-encoding-as-tp8" in r.notes]
    assert (r.parallelism.tp, r.parallelism.num_gpus) == (8, 8)
    assert runs.notes["tp64-moe8x8-encoding"] == 1


def test_disaggregated_pools(runs):
    (r,) = [r for r in runs.runs if r.mode == "disagg"]
    assert r.fill_parallelism is not None and r.fill_workers >= 1 and r.workers >= 1
    assert r.concurrency == 128 and r.max_batch == r.concurrency  # decode batch 16 x DP 8


@pytest.mark.parametrize("key_part, model, hardware, weights, experts", [
    # labelled nvfp4 for GEMM and MoE, but the checkpoint quantises only its experts (config.json
    # quantization_config.modules_to_not_convert: self_attn, router, embed_tokens, lm_head)
    ("gpt_oss_120b_b200", "gpt-oss-120b", "b200", "bf16", "fp4"),
    ("minimaxm2_5_b200_vllm_fp8", "minimax-m2.5", "b200", "fp8", "fp8"),
    ("qwen_qwen3_32b_qwen_qwen3_32b_h100", "qwen3-32b", "h100-sxm", "bf16", "bf16"),  # from the checkpoint
    ("llama_3_1_70b_h200", "llama-3.1-70b", "h200", "fp8", "fp8"),
])
def test_mapping(runs, key_part, model, hardware, weights, experts):
    (r,) = [r for r in runs.runs if key_part in r.key]
    assert (r.model, r.hardware) == (model, hardware)
    assert (r.model_overrides["weight_precision"], r.model_overrides["expert_precision"]) == (weights, experts)
    assert r.ttft_s > 0 and r.tpot_s > 0 and r.concurrency >= 1


@pytest.mark.parametrize("batch, band", [(1, "1-8"), (8, "1-8"), (9, "9-32"), (128, "33-128"), (129, ">128")])
def test_batch_band(batch, band):
    assert batch_band(batch) == band


@pytest.mark.parametrize("name, total_b, active_b", [
    # published totals / activated parameters (model cards), within 3 %
    ("qwen3-235b-a22b", 235, 22), ("gpt-oss-120b", 117, 5.1), ("minimax-m2.5", 230, 10),
    ("glm-5", 744, 40), ("llama-3.1-70b", 70.6, 70.6), ("qwen3-32b", 32.8, 32.8),
])
def test_new_descriptors_match_published_sizes(name, total_b, active_b):
    m = model_preset(name)
    assert m.total_params / 1e9 == pytest.approx(total_b, rel=0.03)
    assert m.active_params / 1e9 == pytest.approx(active_b, rel=0.12)
    assert m.source


def test_published_points():
    runs = read_measured_runs("published")
    assert runs.rows_read == 13
    assert len(runs.runs) + runs.skipped["published point measures throughput, not TTFT or TPOT"] == 13
    assert {r.published_mode for r in runs.runs} <= {"tpot", "ttft", "decode"}


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        read_measured_runs(tmp_path / "none.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="not a silicon-format file"):
        read_measured_runs(bad)


def test_an_unstated_engine_version_is_empty_not_nan(runs):
    """The file leaves some backend versions empty: the run says '' (rows.csv then shows an empty
    cell), never the text 'nan'."""
    versions = {r.engine_version for r in runs.runs}
    assert "" in versions and "nan" not in versions
