"""Measured serving runs: read a file of benchmark runs, deduplicate, and map each row to the
project's model, hardware, precision and layout (issue 24).

Two formats:

* NVIDIA AIConfigurator's silicon sample (``silicon_ttft_ms`` / ``silicon_tpot_ms`` columns; the
  shared copy is ``measurements/aiconfigurator-silicon/``): one row per benchmark of a serving
  engine with N closed-loop clients (``silicon_concurrency=N`` in ``silicon_data_source``), an
  ISL / OSL, GEMM and MoE quantisation, and an aggregated layout (TP, PP, attention DP, MoE TP x
  EP, max batch per rank) or a disaggregated one (prefill and decode layouts and worker counts);
* the project's own published points (:mod:`tokenfactory.plant_models.published_points`), a TOML file
  of ``[[points]]`` tables with :class:`~tokenfactory.plant_models.published_points.PublishedPoint`
  fields, or the word ``published`` for the built-in 13.

Every row either maps to a :class:`MeasuredRun` or is counted under a skip reason
(:data:`SKIP_REASONS`); none is dropped silently. Layout encodings that are not layouts (SOURCE.md:
aggregated rows with ``tp = 64`` and MoE 8 x 8 for TP8 / EP8 on 8 GPUs) are decoded and counted in
``notes``.
"""

from __future__ import annotations

import functools
import math
import re
import tomllib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tokenfactory.plant_models.hardware import accelerator_preset
from tokenfactory.plant_models.moe_model import MODEL_PRESETS
from tokenfactory.plant_models.roofline import Parallelism
from tokenfactory.core.validation import ConfigError

__all__ = [
    "MODEL_PATHS",
    "CHECKPOINT_PRECISION",
    "SYSTEMS",
    "QUANT_MODES",
    "EXPERT_ONLY_QUANTISATION",
    "SKIP_REASONS",
    "BATCH_BANDS",
    "MeasuredRun",
    "MeasuredRuns",
    "read_measured_runs",
    "default_measurements_file",
    "batch_band",
]

#: Hugging Face model paths of the silicon file -> model preset (its config.json is cited there)
MODEL_PATHS: dict[str, str] = {
    "deepseek-ai/DeepSeek-R1": "deepseek-v3", "deepseek-ai/DeepSeek-V3": "deepseek-v3",
    "nvidia/DeepSeek-R1-NVFP4": "deepseek-v3", "nvidia/DeepSeek-V3.1-NVFP4": "deepseek-v3",
    "meta-llama/Llama-3.1-70B": "llama-3.1-70b", "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "llama-3.1-8b", "openai/gpt-oss-120b": "gpt-oss-120b",
    "MiniMaxAI/MiniMax-M2.5": "minimax-m2.5", "Qwen/Qwen3-32B": "qwen3-32b",
    "nvidia/Qwen3-32B-NVFP4": "qwen3-32b", "Qwen/Qwen3.5-397B-A17B": "qwen3.5-397b-a17b",
    "Qwen/Qwen3-235B-A22B-FP8": "qwen3-235b-a22b", "zhipuai/GLM-5": "glm-5",
}
#: the checkpoint's own (GEMM, MoE) number format, for rows that state no quantisation: the
#: un-suffixed Hugging Face checkpoints are BF16 (their config.json torch_dtype), DeepSeek-V3/R1
#: ship FP8 (DeepSeek-V3 Technical Report), "-FP8" / "-NVFP4" checkpoints say so in their name
CHECKPOINT_PRECISION: dict[str, tuple[str, str]] = {
    "deepseek-ai/DeepSeek-R1": ("fp8", "fp8"), "deepseek-ai/DeepSeek-V3": ("fp8", "fp8"),
    "nvidia/DeepSeek-R1-NVFP4": ("fp8", "fp4"), "nvidia/DeepSeek-V3.1-NVFP4": ("fp8", "fp4"),
    "meta-llama/Llama-3.1-70B": ("bf16", "bf16"), "meta-llama/Llama-3.1-8B-Instruct": ("bf16", "bf16"),
    "nvidia/Llama-3.1-8B-Instruct-FP8": ("fp8", "fp8"), "openai/gpt-oss-120b": ("bf16", "fp4"),
    "MiniMaxAI/MiniMax-M2.5": ("fp8", "fp8"), "Qwen/Qwen3-32B": ("bf16", "bf16"),
    "nvidia/Qwen3-32B-NVFP4": ("fp4", "fp4"), "Qwen/Qwen3.5-397B-A17B": ("bf16", "bf16"),
    "Qwen/Qwen3-235B-A22B-FP8": ("fp8", "fp8"), "zhipuai/GLM-5": ("bf16", "bf16"),
}
#: checkpoints that quantise only their experts, whatever the row's GEMM label says: the number
#: format of their other weights. openai/gpt-oss-120b's config.json ``quantization_config`` (mxfp4)
#: lists ``modules_to_not_convert``: every layer's self_attn and router, embed_tokens and lm_head
#: (BF16; TensorRT-LLM examples/models/core/gpt_oss/README.md: "All the other weights are in bf16");
#: the file labels its runs' GEMMs nvfp4 as well as its MoE
EXPERT_ONLY_QUANTISATION: dict[str, str] = {"openai/gpt-oss-120b": "bf16"}
#: the file's GPU systems -> accelerator presets
SYSTEMS: dict[str, str] = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200"}
#: the file's GEMM / MoE quantisation modes -> number formats of :data:`PRECISIONS`
#: (block-scaled FP8 and NVFP4 are FP8 and FP4 with their scales' overhead ignored)
QUANT_MODES: dict[str, str] = {"fp8": "fp8", "fp8_block": "fp8", "nvfp4": "fp4", "mxfp4": "fp4",
                               "fp4": "fp4", "bf16": "bf16", "float16": "bf16", "fp16": "bf16"}
#: why a row is not scored (every reason that can occur)
SKIP_REASONS = ("duplicate run (same TTFT and TPOT to 1e-4 ms)", "unknown model", "unknown GPU system",
                "quantisation not stated or unknown", "concurrency not stated", "layout not stated",
                "prefill / decode worker counts not stated",
                "model does not fit the layout's HBM", "no TTFT or TPOT measured",
                "published point measures throughput, not TTFT or TPOT")
#: decode batch bands (sequences per attention rank) the error tables are split by
BATCH_BANDS = ((1, 8), (9, 32), (33, 128), (129, math.inf))


def batch_band(batch: float) -> str:
    """The band of a per-rank decode batch: ``"1-8"``, ``"9-32"``, ``"33-128"`` or ``">128"``.

    Parameters
    ----------
    batch : float
        Sequences per attention rank.

    Returns
    -------
    str
    """
    for lo, hi in BATCH_BANDS:
        if batch <= hi:
            return f"{lo}-{hi}" if math.isfinite(hi) else f">{lo - 1}"
    return f">{BATCH_BANDS[-1][0] - 1}"


@dataclass(frozen=True)
class MeasuredRun:
    """One benchmark run mapped to the project's objects.

    Parameters
    ----------
    key : str
        The row's id.
    engine, engine_version : str
        Serving engine (``trtllm``, ``sglang``, ``vllm``; ``published`` for published points).
    model : str
        Model preset.
    model_overrides : mapping
        The checkpoint's precisions (``weight_precision``, ``expert_precision``).
    hardware : str
        Accelerator preset.
    precision : str
        The file's precision label (split tables).
    mode : str
        ``"agg"`` (one engine fills and decodes) or ``"disagg"`` (prefill and decode pools).
    input_tokens, output_tokens : int
        ISL and OSL.
    concurrency : int
        Closed-loop clients N.
    parallelism : Parallelism
        The aggregated worker's layout, or the decode workers' for ``disagg``.
    workers : int
        Aggregated or decode workers.
    fill_parallelism : Parallelism or None
        The prefill workers' layout (``disagg``).
    fill_workers : int
        Prefill workers (``disagg``; 0 otherwise).
    max_batch : int
        The engine's decode batch limit per worker (sequences; 0 = not stated).
    fill_batch : int
        Prompts per prefill step per attention rank (``disagg``; 1 if not stated).
    ttft_s, tpot_s : float
        Measured mean TTFT and TPOT (s; NaN if not measured).
    published_mode : str
        For published points, what they measure (otherwise "").
    notes : tuple of str
        Decodings applied to the row's layout.
    """

    key: str
    engine: str
    engine_version: str
    model: str
    model_overrides: Mapping[str, Any]
    hardware: str
    precision: str
    mode: str
    input_tokens: int
    output_tokens: int
    concurrency: int
    parallelism: Parallelism
    workers: int = 1
    fill_parallelism: Parallelism | None = None
    fill_workers: int = 0
    max_batch: int = 0
    fill_batch: int = 1
    ttft_s: float = math.nan
    tpot_s: float = math.nan
    published_mode: str = ""
    notes: tuple = ()

    @property
    def num_gpus(self) -> int:
        fill = self.fill_workers * self.fill_parallelism.num_gpus if self.fill_parallelism else 0
        return self.workers * self.parallelism.num_gpus + fill

    @property
    def batch_per_rank(self) -> float:
        """Decode sequences per attention rank when every client decodes."""
        ranks = self.workers * self.parallelism.dp_attention * self.parallelism.pp
        return self.concurrency / max(ranks, 1)

    @property
    def batch_band(self) -> str:
        return batch_band(self.batch_per_rank)

    def to_dict(self) -> dict[str, Any]:
        p, f = self.parallelism, self.fill_parallelism
        return {"key": self.key, "engine": self.engine, "engine_version": self.engine_version,
                "model": self.model, "hardware": self.hardware, "precision": self.precision,
                "mode": self.mode, "isl": self.input_tokens, "osl": self.output_tokens,
                "concurrency": self.concurrency, "tp": p.tp, "pp": p.pp, "gpus_per_worker": p.num_gpus,
                "workers": self.workers, "fill_tp": f.tp if f else 0, "fill_gpus_per_worker": f.num_gpus if f else 0,
                "fill_workers": self.fill_workers, "max_batch": self.max_batch, "num_gpus": self.num_gpus,
                "batch_per_rank": self.batch_per_rank, "batch_band": self.batch_band,
                "measured_ttft_s": self.ttft_s, "measured_tpot_s": self.tpot_s, "notes": ";".join(self.notes)}


@dataclass(frozen=True)
class MeasuredRuns:
    """The mapped runs of a file and what was not mapped.

    Parameters
    ----------
    runs : tuple of MeasuredRun
        Every row that maps (duplicates removed).
    skipped : dict
        Rows not scored, by reason (keys among :data:`SKIP_REASONS`).
    notes : dict
        Layout decodings applied, by kind (rows).
    rows_read : int
        Rows in the file.
    source : str
        The file.
    """

    runs: tuple
    skipped: dict = field(default_factory=dict)
    notes: dict = field(default_factory=dict)
    rows_read: int = 0
    source: str = ""

    def to_pandas(self) -> pd.DataFrame:
        return pd.DataFrame([r.to_dict() for r in self.runs])

    def subset(self, runs) -> "MeasuredRuns":
        return MeasuredRuns(tuple(runs), self.skipped, self.notes, self.rows_read, self.source)


def _num(v, default=0.0) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return default
    return default if math.isnan(x) else x


def _layout(tp, pp, dp, moe_tp, moe_ep, dense: bool, notes: list) -> tuple[Parallelism, int] | None:
    """(Parallelism of one worker, its GPUs) from the file's layout columns, or None if not stated."""
    tp, pp, dp = int(_num(tp)), max(int(_num(pp, 1)), 1), max(int(_num(dp, 1)), 1)
    moe_tp, moe_ep = max(int(_num(moe_tp, 1)), 1), max(int(_num(moe_ep, 1)), 1)
    if tp < 1:
        return None
    moe_gpus = moe_tp * moe_ep
    if not dense and dp == 1 and tp == moe_gpus and moe_tp == moe_ep and moe_tp > 1 and tp > 8:
        # SOURCE.md: "tp = 64 with MoE 8 x 8" encodes TP8 / EP8 on 8 GPUs (GB200-style encodings)
        notes.append(f"tp{tp}-moe{moe_tp}x{moe_ep}-encoding-as-tp{moe_tp}")
        tp = moe_tp
    gpus = tp * dp
    return Parallelism(tp=tp, pp=pp, ep=gpus), gpus * pp


_CONC = re.compile(r"silicon_concurrency=(\d+)")


def _silicon(df: pd.DataFrame, source: str) -> MeasuredRuns:
    skipped, notes, runs = Counter(), Counter(), []
    seen = set()
    for row in df.itertuples(index=False):
        r = row._asdict()
        ttft, tpot = _num(r.get("silicon_ttft_ms"), math.nan), _num(r.get("silicon_tpot_ms"), math.nan)
        if math.isnan(ttft) and math.isnan(tpot):
            skipped[SKIP_REASONS[8]] += 1
            continue
        dup = (round(ttft, 4), round(tpot, 4))
        if dup in seen:
            skipped[SKIP_REASONS[0]] += 1
            continue
        seen.add(dup)
        model = MODEL_PATHS.get(str(r.get("model_path")))
        if model is None:
            skipped[SKIP_REASONS[1]] += 1
            continue
        hw = SYSTEMS.get(str(r.get("system")))
        if hw is None:
            skipped[SKIP_REASONS[2]] += 1
            continue
        gq, mq = QUANT_MODES.get(str(r.get("gemm_quant_mode"))), QUANT_MODES.get(str(r.get("moe_quant_mode")))
        if gq is None and pd.isna(r.get("gemm_quant_mode")):
            # not stated: the row's precision label, else the checkpoint's own format
            label = QUANT_MODES.get(str(r.get("precision")))
            gq = label or CHECKPOINT_PRECISION.get(str(r.get("model_path")), (None, None))[0]
            mq = mq or (label or CHECKPOINT_PRECISION.get(str(r.get("model_path")), (None, None))[1])
            if gq is not None:
                notes["quantisation from the " + ("precision column" if label else "checkpoint")] += 1
        if gq is None or (mq is None and MODEL_PRESETS[model].moe_layers):
            skipped[SKIP_REASONS[3]] += 1
            continue
        m = _CONC.search(str(r.get("silicon_data_source", "")))
        if not m:
            skipped[SKIP_REASONS[4]] += 1
            continue
        dense = not MODEL_PRESETS[model].moe_layers
        row_notes: list = []
        mode = str(r.get("mode"))
        if mode == "disagg":
            dec = _layout(r.get("decode_tp_size"), r.get("decode_pp_size"), r.get("decode_attention_dp_size"),
                          r.get("decode_moe_tp_size"), r.get("decode_moe_ep_size"), dense, row_notes)
            fil = _layout(r.get("prefill_tp_size"), r.get("prefill_pp_size"), r.get("prefill_attention_dp_size"),
                          r.get("prefill_moe_tp_size"), r.get("prefill_moe_ep_size"), dense, row_notes)
            nd, nf = int(_num(r.get("decode_num_workers"))), int(_num(r.get("prefill_num_workers")))
            if dec is None or fil is None:
                skipped[SKIP_REASONS[5]] += 1
                continue
            if nd < 1 or nf < 1:
                skipped[SKIP_REASONS[6]] += 1
                continue
            par, fpar = dec[0], fil[0]
            batch = int(_num(r.get("decode_batch_size"))) * par.dp_attention
            fill_batch = max(int(_num(r.get("prefill_batch_size"), 1)), 1)
        else:
            lay = _layout(r.get("tp_size"), r.get("pp_size"), r.get("attention_dp_size"), r.get("moe_tp_size"),
                          r.get("moe_ep_size"), dense, row_notes)
            if lay is None:
                skipped[SKIP_REASONS[5]] += 1
                continue
            par, fpar, nd, nf, fill_batch = lay[0], None, 1, 0, 1
            batch = int(_num(r.get("batch_size"))) * par.dp_attention
        overrides = {"weight_precision": EXPERT_ONLY_QUANTISATION.get(str(r.get("model_path")), gq),
                     "expert_precision": mq or gq}
        if not _fits(model, overrides, hw, par) or (fpar is not None and not _fits(model, overrides, hw, fpar)):
            skipped[SKIP_REASONS[7]] += 1
            continue
        for n in row_notes:
            notes[n.split("-as-")[0]] += 1
        runs.append(MeasuredRun(
            key=str(r.get("id")), engine=str(r.get("backend")), engine_version=_text(r.get("backend_version")),
            model=model, model_overrides=overrides, hardware=hw, precision=str(r.get("precision")), mode=mode,
            input_tokens=int(r.get("isl")), output_tokens=int(r.get("osl")), concurrency=int(m.group(1)),
            parallelism=par, workers=nd, fill_parallelism=fpar, fill_workers=nf, max_batch=batch,
            fill_batch=fill_batch, ttft_s=ttft / 1e3, tpot_s=tpot / 1e3, notes=tuple(row_notes)))
    return MeasuredRuns(tuple(runs), dict(skipped), dict(notes), len(df), source)


@functools.lru_cache(maxsize=None)
def _fits_cached(model: str, overrides: tuple, hw: str, par: Parallelism) -> bool:
    from tokenfactory.plant_models.roofline import Worker
    from tokenfactory.plant_models.published_points import model_of
    try:
        Worker(model_of(model, overrides), accelerator_preset(hw), par)
    except ConfigError:
        return False
    return True


def _fits(model: str, overrides: Mapping, hw: str, par: Parallelism) -> bool:
    return _fits_cached(model, tuple(sorted(overrides.items())), hw, par)


def _published(points, source: str) -> MeasuredRuns:
    """Published points: ``tpot`` / ``ttft`` points compare as they are; ``decode`` points give
    TPOT = sequences / (tokens/s/GPU x GPUs); prefill and aggregated throughput points are
    counted as not comparable."""
    skipped, runs = Counter(), []
    for p in points:
        par = Parallelism(**p.parallelism)
        if p.mode in ("prefill", "aggregated"):
            skipped[SKIP_REASONS[9]] += 1
            continue
        tpot = ttft = math.nan
        if p.mode == "tpot":
            tpot = p.published
        elif p.mode == "ttft":
            ttft = p.published
        else:
            tpot = p.sequences / (p.published * par.num_gpus)
        runs.append(MeasuredRun(
            key=p.key, engine="published", engine_version=p.date, model=p.model,
            model_overrides=dict(p.model_overrides), hardware=p.hardware,
            precision=p.model_overrides.get("expert_precision", "fp8"), mode="single-pass",
            input_tokens=max(p.prompt_tokens, 1), output_tokens=max(p.output_tokens, 1),
            concurrency=max(p.sequences, 1), parallelism=par, ttft_s=ttft, tpot_s=tpot,
            published_mode=p.mode))
    return MeasuredRuns(tuple(runs), dict(skipped), {}, len(points), source)


def default_measurements_file() -> Path:
    """The silicon sample: ``$TOKENFACTORY_MEASUREMENTS`` (a file, or a folder holding
    ``aiconfigurator-silicon/silicon_calibration.csv``) if set, else
    ``../shared/measurements/aiconfigurator-silicon/silicon_calibration.csv`` beside the checkout."""
    import os

    env = os.environ.get("TOKENFACTORY_MEASUREMENTS")
    base = Path(env) if env else Path(__file__).resolve().parents[1].parent / "shared" / "measurements"
    return base if base.is_file() else base / "aiconfigurator-silicon" / "silicon_calibration.csv"


def _text(v) -> str:
    """A text cell: '' where the file leaves it empty (pandas reads that as NaN, 'nan' as text)."""
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def read_measured_runs(path: str | Path) -> MeasuredRuns:
    """Read, deduplicate and map a file of measured runs.

    Parameters
    ----------
    path : str or pathlib.Path
        A silicon-format CSV, a TOML file of ``[[points]]`` (published-point fields), or
        ``"published"`` for :data:`~tokenfactory.plant_models.published_points.PUBLISHED_POINTS`.

    Returns
    -------
    MeasuredRuns

    Raises
    ------
    ConfigError
        For a missing file or one in neither format (field ``file``).
    """
    from tokenfactory.plant_models.published_points import PUBLISHED_POINTS, PublishedPoint
    if str(path) == "published":
        return _published(PUBLISHED_POINTS, "published")
    path = Path(path)
    if not path.is_file():
        raise ConfigError("file", f"{str(path)!r} does not exist")
    if path.suffix == ".toml":
        with path.open("rb") as fh:
            data = tomllib.load(fh)
        if "points" not in data or not isinstance(data["points"], list):
            raise ConfigError("file", f"{path.name}: expected [[points]] tables of published-point fields")
        try:
            points = [PublishedPoint(**p) for p in data["points"]]
        except TypeError as exc:
            raise ConfigError("file", f"{path.name}: {exc}") from None
        return _published(points, str(path))
    df = pd.read_csv(path)
    need = {"silicon_ttft_ms", "silicon_tpot_ms", "model_path", "system", "mode", "isl", "osl"}
    missing = sorted(need - set(df.columns))
    if missing:
        raise ConfigError("file", f"{path.name}: not a silicon-format file (missing columns {missing})")
    return _silicon(df, str(path))
