"""Published MoE serving measurements, the roofline's prediction of each, and the efficiencies
fitted to them by least squares (issue 13 part 1; study ``roofline-validation``).

Every point carries its public source, date and the full configuration the roofline needs
(model, GPU, parallel layout, batch or concurrency, context lengths, precision) plus the
conversion from the published figure to the compared one (per node -> per GPU, tokens/s/user ->
TPOT). Sources whose configuration is incomplete or ambiguous are listed in
:data:`EXCLUDED_SOURCES` with the reason, not guessed.

The fit minimises a robust sum of log-ratios (predicted / published) over the points for the
compute, memory and network efficiencies and the per-layer overhead. Held-out error is measured
by leave-one-out cross-validation: each point is predicted by the fit on all the others.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tokenfactory.plant_models.hardware import accelerator_preset
from tokenfactory.plant_models.moe_model import model_from_dict
from tokenfactory.plant_models.roofline import Efficiency, Parallelism, Worker
from tokenfactory.core.validation import ConfigError, check_choice

__all__ = [
    "PublishedPoint",
    "PUBLISHED_POINTS",
    "EXCLUDED_SOURCES",
    "FIT_PARAMETERS",
    "ASSUMED_EFFICIENCY",
    "PRE_FIT_EFFICIENCY",
    "FITTED_EFFICIENCY",
    "EfficiencyFit",
    "point_worker",
    "predict_point",
    "signed_error",
    "fit_efficiency",
    "cross_validate",
    "error_table",
]

MODES = ("prefill", "decode", "aggregated", "ttft", "tpot")


@dataclass(frozen=True)
class PublishedPoint:
    """One published measurement with the configuration it was taken at.

    Parameters
    ----------
    key : str
        Short unique id.
    system : str
        Who measured what.
    source : str
        Public URL(s) of the figure and of the configuration.
    date : str
        Publication date (or commit).
    model : str
        Model preset the measurement is of.
    hardware : str
        Accelerator preset.
    parallelism : mapping
        ``tp``, ``pp``, ``ep`` of one worker.
    mode : str
        What is compared: ``"prefill"`` input tokens/s per GPU of prefill passes of ``sequences``
        prompts of ``prompt_tokens``; ``"decode"`` output tokens/s per GPU at a batch of
        ``sequences`` per worker and mean context ``context_tokens``; ``"aggregated"`` output
        tokens/s per GPU of one engine doing both (each request's ``prompt_tokens`` prefill shares
        the worker with its ``output_tokens`` decode steps); ``"ttft"`` the latency of one prefill
        pass; ``"tpot"`` the latency of one decode pass.
    published : float
        The published figure in the compared unit (tokens/s per GPU, or seconds).
    sequences : int
        Prompts per prefill pass, or decode batch per worker.
    prompt_tokens, context_tokens, output_tokens : int
        Request shape (tokens; those the mode uses).
    chunks : int
        Pipeline chunks of a prefill (``"ttft"``; default 1).
    model_overrides : mapping
        Fields changed from the model preset (precisions of the checkpoint served).
    conversion : str
        How the published figure became ``published``.
    caveat : str
        What the roofline leaves out for this point.
    """

    key: str
    system: str
    source: str
    date: str
    model: str
    hardware: str
    parallelism: Mapping[str, int]
    mode: str
    published: float
    sequences: int
    prompt_tokens: int = 0
    context_tokens: int = 0
    output_tokens: int = 0
    chunks: int = 1
    model_overrides: Mapping[str, Any] = field(default_factory=dict)
    conversion: str = ""
    caveat: str = ""

    def __post_init__(self) -> None:
        check_choice(f"point[{self.key}].mode", self.mode, MODES)

    @property
    def unit(self) -> str:
        return "s" if self.mode in ("ttft", "tpot") else "tokens/s/GPU"


_DS_PROFILE = "https://github.com/deepseek-ai/profile-data (README, inference section)"
_SGL_EP = "https://lmsys.org/blog/2025-05-05-large-scale-ep/"
_TRT_PERF = ("https://github.com/NVIDIA/TensorRT-LLM/blob/main/docs/source/blogs/"
             "Best_perf_practice_on_DeepSeek-R1_in_TensorRT-LLM.md")
_TRT_LAT = ("https://github.com/NVIDIA/TensorRT-LLM/blob/main/docs/source/blogs/tech_blog/"
            "blog1_Pushing_Latency_Boundaries_Optimizing_DeepSeek-R1_Performance_on_NVIDIA_B200_GPUs.md")
_FP4 = {"expert_precision": "fp4"}  # nvidia/DeepSeek-R1-FP4: only the MoE experts are FP4

#: The published points. Per-node figures are divided by the node's 8 GPUs (GB200 figures are
#: published per GPU). Every point is fitted; its held-out error comes from the leave-one-out fit
#: without it (:func:`cross_validate`).
PUBLISHED_POINTS: tuple[PublishedPoint, ...] = (
    PublishedPoint(
        "ds-profile-prefill", "DeepSeek V3/R1 inference profile, prefill", _DS_PROFILE + "; " + _SGL_EP,
        "2025-03 (profile) / 2025-05-05 (throughput)", "deepseek-v3", "h800", {"tp": 1, "ep": 32},
        "prefill", 62_713 / 8, sequences=32 * 4, prompt_tokens=4096,
        conversion="EP32/TP1, 4K prompts, 16,384 tokens per GPU per batch (4 prompts x 32 GPUs); "
                   "62,713 input tokens/s per 8-GPU node (SGLang's reading of DeepSeek's profile, "
                   "balanced routing) / 8",
        caveat="derived from a kernel profile with perfectly balanced routing and no scheduler "
               "gaps"),
    PublishedPoint(
        "ds-profile-decode", "DeepSeek V3/R1 inference profile, decode", _DS_PROFILE + "; " + _SGL_EP,
        "2025-03 (profile) / 2025-05-05 (throughput)", "deepseek-v3", "h800", {"tp": 1, "ep": 128},
        "decode", 18_598 / 8, sequences=128 * 128, context_tokens=4096,
        conversion="EP128/TP1, 128 requests per GPU at 4K KV; 18,598 output tokens/s per node / 8",
        caveat="derived from a kernel profile with perfectly balanced routing and no scheduler "
               "gaps, while the lumped efficiencies are fitted mostly to end-to-end runs that "
               "include both (DeepSeek's own production decode reached 14,800 per node)"),
    PublishedPoint(
        "sglang-h100-prefill-1k", "SGLang PD + large-scale EP, prefill 1K", _SGL_EP, "2025-05-05",
        "deepseek-v3", "h100-sxm", {"tp": 1, "ep": 32}, "prefill", 57_674 / 8, sequences=32 * 16,
        prompt_tokens=1024,
        conversion="4 nodes EP32, 16,384 tokens per GPU (16 prompts of 1K); 57,674 tok/s/node / 8",
        caveat="default (imbalanced) expert distribution; the roofline assumes balanced routing"),
    PublishedPoint(
        "sglang-h100-prefill-2k", "SGLang PD + large-scale EP, prefill 2K", _SGL_EP, "2025-05-05",
        "deepseek-v3", "h100-sxm", {"tp": 1, "ep": 32}, "prefill", 54_543 / 8, sequences=32 * 8,
        prompt_tokens=2048,
        conversion="4 nodes EP32, 16,384 tokens per GPU (8 prompts of 2K); 54,543 tok/s/node / 8",
        caveat="default (imbalanced) expert distribution; the roofline assumes balanced routing"),
    PublishedPoint(
        "sglang-h100-prefill-4k", "SGLang PD + large-scale EP, prefill 4K", _SGL_EP, "2025-05-05",
        "deepseek-v3", "h100-sxm", {"tp": 1, "ep": 32}, "prefill", 50_302 / 8, sequences=32 * 4,
        prompt_tokens=4096,
        conversion="4 nodes EP32, 16,384 tokens per GPU (4 prompts of 4K), default EPLB; "
                   "50,302 tok/s/node / 8",
        caveat="routing is imbalanced (SGLang's default expert distribution): the same run with "
               "simulated perfect balance gave 59,337 tok/s/node; the roofline assumes balance"),
    PublishedPoint(
        "sglang-h100-prefill-4k-balanced", "SGLang PD + large-scale EP, prefill 4K, perfect EPLB",
        _SGL_EP, "2025-05-05", "deepseek-v3", "h100-sxm", {"tp": 1, "ep": 32}, "prefill",
        59_337 / 8, sequences=32 * 4, prompt_tokens=4096,
        conversion="4 nodes EP32, 16,384 tokens per GPU (4 prompts of 4K), routing simulated as "
                   "perfectly balanced (the roofline's assumption); 59,337 tok/s/node / 8"),
    PublishedPoint(
        "sglang-h100-decode-2k", "SGLang PD + large-scale EP, decode", _SGL_EP, "2025-05-05",
        "deepseek-v3", "h100-sxm", {"tp": 1, "ep": 72}, "decode", 22_282 / 8, sequences=72 * 256,
        context_tokens=2000,
        conversion="9 nodes EP72, 256 sequences per GPU at 2,000-token KV; 22,282 tok/s/node / 8"),
    PublishedPoint(
        "trtllm-b200-throughput-bf16kv", "TensorRT-LLM DeepSeek-R1 FP4 max throughput (BF16 KV)",
        _TRT_PERF, "2025 (commit b6261862)", "deepseek-v3", "b200", {"tp": 1, "ep": 8}, "aggregated",
        4548.0105, sequences=3072, prompt_tokens=1024, output_tokens=2048, context_tokens=2048,
        model_overrides=_FP4,
        conversion="8xB200 attention DP8 + MoE EP8, concurrency 3,072, ISL 1K / OSL 2K in one "
                   "engine; 'Per GPU Output Throughput 4548.0 tps/gpu' as printed; decode timed at "
                   "the mean context 1K + 2K/2",
        caveat="aggregated in-flight batching: attention-DP ranks wait for the one running a "
               "context chunk (TensorRT-LLM's ADP-balance blog measured a 54 % mean balance "
               "ratio for DP8 in-flight batching); the conversion time-shares prefill and decode"),
    PublishedPoint(
        "trtllm-b200-throughput-fp8kv", "TensorRT-LLM DeepSeek-R1-0528 FP4 max throughput (FP8 KV)",
        _TRT_PERF, "2025 (commit b6261862)", "deepseek-v3", "b200", {"tp": 1, "ep": 8}, "aggregated",
        5393.2755, sequences=7168, prompt_tokens=1024, output_tokens=2048, context_tokens=2048,
        model_overrides={**_FP4, "kv_precision": "fp8"},
        conversion="8xB200 DP8 + EP8, FP8 KV cache, concurrency 7,168, ISL 1K / OSL 2K; "
                   "5393.3 tps/gpu as printed",
        caveat="aggregated in-flight batching at 896 sequences per rank: rank imbalance and "
               "per-sequence runtime work are not modelled; the roofline credits FP8 KV with "
               "half the KV bytes and twice the attention rate, the published gain over the "
               "BF16-KV run at 2.3x its concurrency is 19 %"),
    PublishedPoint(
        "trtllm-h200-throughput", "TensorRT-LLM DeepSeek-R1 FP8 max throughput on H200", _TRT_PERF,
        "2025", "deepseek-v3", "h200", {"tp": 1, "ep": 8}, "aggregated", 1436.1584, sequences=1024,
        prompt_tokens=1024, output_tokens=2048, context_tokens=2048,
        conversion="8xH200 DP8 + EP8, concurrency 1,024, ISL 1K / OSL 2K; 1436.2 tps/gpu as printed",
        caveat="aggregated in-flight batching (rank imbalance not modelled)"),
    PublishedPoint(
        "trtllm-b200-batch1", "TensorRT-LLM DeepSeek-R1 min latency without MTP", _TRT_LAT, "2025",
        "deepseek-v3", "b200", {"tp": 8, "ep": 8}, "tpot", 1.0 / 111, sequences=1,
        context_tokens=2048, model_overrides={**_FP4, "weight_precision": "bf16"},
        conversion="8xB200, attention TP8, batch 1, ISL 1K / OSL 2K, 'Without MTP: 111 TPS/User' "
                   "-> TPOT 1/111 s; BF16 attention and NVFP4 experts as published; the "
                   "published MoE layout EP4 x TP2 is modelled as EP8 (same expert bytes per GPU)"),
    PublishedPoint(
        "sglang-gb200-decode-fp4", "SGLang GB200 NVL72 part II, decode FP8 attention + NVFP4 MoE",
        "https://lmsys.org/blog/2025-09-25-gb200-part-2/", "2025-09-25", "deepseek-v3", "gb200",
        {"tp": 1, "ep": 48}, "decode", 13_386, sequences=48 * 1408, context_tokens=2050,
        model_overrides={**_FP4, "kv_precision": "fp8"},
        conversion="48 decode ranks (EP48 inside one NVL72), batch 1,408 per rank for 2K ISL "
                   "('chosen to make KV cache roughly full'), 100 output tokens -> mean context "
                   "2,050; 13,386 output tokens/s per GPU as published",
        caveat="the authors state many GB200 kernels did not yet saturate its bandwidth or "
               "compute; one set of efficiencies is fitted across Hopper and Blackwell"),
    PublishedPoint(
        "sglang-gb200-prefill-128k-pp4", "SGLang + Dynamo GB200 NVL72, 128K prefill with PP4",
        "https://lmsys.org/blog/2026-02-19-gb300-longctx/", "2026-02-19", "deepseek-v3", "gb200",
        {"tp": 1, "pp": 4, "ep": 1}, "ttft", 18.6, sequences=1, prompt_tokens=131_072,
        model_overrides={**_FP4, "kv_precision": "fp8"},
        conversion="DeepSeek-R1-NVFP4, FP8 attention/KV, prefill worker of 4 GPUs with PP4 (the "
                   "1P/1D 8-GPU setup), one 128K prompt (taken as 131,072 tokens) without "
                   "chunking: mean TTFT 18.6 s as published",
        caveat="one compute efficiency for every kernel: the fitted value is set by EP prefill, "
               "whose GEMMs share the GPU with all-to-all traffic; a 128K FP8 attention kernel "
               "runs nearer its peak"),
)

#: Sources looked at and left out, with the reason (never a guessed number).
EXCLUDED_SOURCES: tuple[dict[str, str], ...] = (
    {"system": "DeepSeek online service statistics (73.7k input / 14.8k output tok/s per H800 node)",
     "source": "https://github.com/deepseek-ai/open-infra-index (202502OpenSourceWeek day 6)",
     "reason": "24-hour averages over a load that varies day to night; prefill counts cache hits "
               "(56.3 %); decode runs MTP speculation; no batch or per-node load is stated"},
    {"system": "Kimi K2 on 128 H200 (SGLang + Mooncake, 4P/12D nodes)",
     "source": "https://lmsys.org/blog/2025-07-17-k2-large-scale-ep/",
     "reason": "the per-node figures (56k / 24k) are the cluster totals divided by all 16 nodes, "
               "so per decode GPU is 3,000 or 4,000 tok/s depending on the reading; ambiguous"},
    {"system": "SGLang GB200 NVL72 part I (7,583 decode tok/s/GPU)",
     "source": "https://lmsys.org/blog/2025-06-16-gb200-part-1/",
     "reason": "decode batch size is not stated in the text (only in a chart)"},
    {"system": "SGLang GB200 NVL72 part II, BF16 attention + FP8 MoE (18,471 / 9,087 tok/s/GPU)",
     "source": "https://lmsys.org/blog/2025-09-25-gb200-part-2/",
     "reason": "batch size for the BF16 run is not stated; prefill offloads weights to host "
               "memory, which the roofline does not model"},
    {"system": "SGLang GB300/GB200 long context 128K/8K (226 / 148 TPS/GPU; GB300 TTFT 15.2 s)",
     "source": "https://lmsys.org/blog/2026-02-19-gb300-longctx/",
     "reason": "throughput is per GPU over prefill and decode pools whose sizes are only in charts; "
               "no GB300 preset and its faster softmax unit is not modelled"},
    {"system": "TensorRT-LLM min latency with MTP (253 / 368 TPS/user) and SGLang simulated MTP",
     "source": _TRT_LAT,
     "reason": "speculative decoding (MTP) is not modelled; the non-MTP point of the same "
               "experiment is used instead"},
)

#: Parameters the fit adjusts, with their bounds.
FIT_PARAMETERS: dict[str, tuple[float, float]] = {
    "compute": (0.05, 1.0), "memory": (0.05, 1.0), "network": (0.05, 1.0),
    "layer_overhead_s": (0.0, 1e-3),
}

#: The efficiencies assumed before the fit (the prior and the "old assumptions" column).
ASSUMED_EFFICIENCY = Efficiency(compute=0.6, memory=0.8, network=0.7, layer_overhead_s=0.0, pass_overhead_s=0.0,
                                scale_up_latency_s=2e-6, scale_out_latency_s=5e-6,
                                routing_locality=1.0, network_scale_out=None, collective_latency_s=0.0,
                                sequence_overhead_s=0.0, attention_memory=None)

#: The roofline's constants before issue 13: the assumed efficiencies and no collective latency.
#: Test beds tuned on that plant (the DES-vs-fluid agreement tests, the describing-function check
#: of study ``reconfiguration``) keep it explicitly.
PRE_FIT_EFFICIENCY = Efficiency(compute=0.6, memory=0.8, network=0.7, layer_overhead_s=0.0,
                                scale_up_latency_s=0.0, scale_out_latency_s=0.0, pass_overhead_s=0.0,
                                routing_locality=1.0, network_scale_out=None, collective_latency_s=0.0,
                                sequence_overhead_s=0.0, attention_memory=None)

#: The fit on all points (``fit_efficiency()``, 3 significant digits; study
#: ``roofline-validation`` recomputes and checks it). :class:`Efficiency`'s defaults are these
#: values to two decimals (the overhead to 1 us).
FITTED_EFFICIENCY: dict[str, float] = {
    "compute": 0.524, "memory": 0.227, "network": 0.490, "layer_overhead_s": 84e-6,
}


@functools.lru_cache(maxsize=None)
def model_of(base: str, overrides: tuple) -> Any:
    """The model descriptor ``base`` with ``overrides`` (sorted key/value pairs), built once per pair."""
    return model_from_dict({"base": base, **dict(overrides)})


def point_worker(point: PublishedPoint, efficiency: Efficiency | None = None) -> Worker:
    """The worker a point was measured on (with the default efficiencies unless given).

    Parameters
    ----------
    point : PublishedPoint
        The measurement.
    efficiency : Efficiency, optional
        Efficiencies of the worker (default ``Efficiency()``).

    Returns
    -------
    Worker
    """
    model = model_of(point.model, tuple(sorted(point.model_overrides.items())))
    return Worker(model, accelerator_preset(point.hardware), Parallelism(**point.parallelism),
                  efficiency or Efficiency())


def predict_point(point: PublishedPoint, efficiency: Efficiency | None = None) -> float:
    """The roofline's value of ``point.mode``'s quantity (tokens/s per GPU or seconds).

    Parameters
    ----------
    point : PublishedPoint
        The measurement to predict.
    efficiency : Efficiency, optional
        Efficiencies to predict with (default ``Efficiency()``).

    Returns
    -------
    float
    """
    w = point_worker(point, efficiency)
    if point.mode == "prefill":
        return w.prefill(point.prompt_tokens, sequences=point.sequences).tokens_per_s_per_gpu
    if point.mode == "ttft":
        return w.prefill(point.prompt_tokens, sequences=point.sequences, chunks=point.chunks).time_s
    if point.mode == "decode":
        return w.decode(point.sequences, point.context_tokens).tokens_per_s_per_gpu
    if point.mode == "tpot":
        return w.decode(point.sequences, point.context_tokens).time_s
    # aggregated: a request's prefill and its decode steps time-share the worker; with attention-DP
    # imbalance (Efficiency.attention_dp_imbalance) the prompt enters a pass on the replica holding
    # it and the other replicas wait: the pass it enters is longer than with the prompt spread
    # evenly by that much (0.0 exactly when the imbalance is 0, so the defaults' form is kept)
    fill = w.prefill(point.prompt_tokens, sequences=w.parallelism.dp_attention).tokens_per_s
    dec = w.decode(point.sequences, point.context_tokens).tokens_per_s
    wait = 0.0
    if w.efficiency.attention_dp_imbalance and w.parallelism.dp_attention > 1:
        even = dataclasses.replace(w, efficiency=dataclasses.replace(w.efficiency, attention_dp_imbalance=0.0))
        wait = (w.mixed(point.sequences, point.context_tokens, point.prompt_tokens).time_s
                - even.mixed(point.sequences, point.context_tokens, point.prompt_tokens).time_s)
    seconds_per_request = point.prompt_tokens / fill + point.output_tokens / dec + wait
    return point.output_tokens / seconds_per_request / w.num_gpus


def signed_error(point: PublishedPoint, predicted: float) -> float:
    """(predicted - published) / published, in the direction of throughput (a latency that is
    predicted too short is an over-prediction of speed).

    Parameters
    ----------
    point : PublishedPoint
        The measurement.
    predicted : float
        The roofline's value of ``point.mode``'s quantity (:func:`predict_point`).

    Returns
    -------
    float
        The signed relative error (positive: the roofline is too fast).
    """
    if point.unit == "s":
        return point.published / predicted - 1.0
    return predicted / point.published - 1.0


@dataclass(frozen=True)
class EfficiencyFit:
    """Fitted efficiencies and the prediction error at every point.

    Parameters
    ----------
    efficiency : Efficiency
        The fitted efficiencies.
    table : pandas.DataFrame
        :func:`error_table` of every point at the fit.
    cost : float
        Robust data cost at the optimum (sum of soft-L1 log-ratio terms).
    starts : int
        Optimiser starts used.
    identified : dict
        Per fitted parameter, whether moving it +-20 % changes the data cost.
    """

    efficiency: Efficiency
    table: pd.DataFrame
    cost: float
    starts: int
    identified: dict[str, bool] = field(default_factory=dict)

    def to_pandas(self) -> pd.DataFrame:
        return self.table.copy()

    @property
    def params(self) -> dict[str, float]:
        return {k: getattr(self.efficiency, k) for k in FIT_PARAMETERS}


def error_table(points: Sequence[PublishedPoint], efficiency: Efficiency,
                train_keys: set[str] | None = None,
                reference: Efficiency | None = None) -> pd.DataFrame:
    """Predicted vs published per point (and with ``reference`` efficiencies if given);
    ``held_out`` marks points outside ``train_keys``.

    Parameters
    ----------
    points : sequence of PublishedPoint
        The measurements.
    efficiency : Efficiency
        Efficiencies to predict with.
    train_keys : set of str, optional
        Keys of the points a fit used (default: none marked held out).
    reference : Efficiency, optional
        Second set of efficiencies whose errors are added as ``error_old_assumptions``.

    Returns
    -------
    pandas.DataFrame
        One row per point; ``error`` is signed (+ = the roofline predicts more throughput).
    """
    rows = []
    for p in points:
        pred = predict_point(p, efficiency)
        err = signed_error(p, pred)
        held = train_keys is not None and p.key not in train_keys
        row = {"point": p.key, "system": p.system, "source": p.source, "date": p.date,
               "model": p.model, "hardware": p.hardware,
               "parallelism": " ".join(f"{k}{v}" for k, v in p.parallelism.items()),
               "mode": p.mode, "unit": p.unit, "published": p.published, "predicted": pred,
               "error": err, "abs_error": abs(err), "held_out": held,
               "conversion": p.conversion, "caveat": p.caveat}
        if reference is not None:
            row["error_old_assumptions"] = signed_error(p, predict_point(p, reference))
        rows.append(row)
    return pd.DataFrame(rows)


def _names_bounds():
    names = list(FIT_PARAMETERS)
    # the layer overhead in microseconds, so every parameter is O(0.1-1) for the optimiser
    scale = np.array([1e-6 if n.endswith("_s") else 1.0 for n in names])
    lo = np.array([FIT_PARAMETERS[n][0] for n in names]) / scale
    hi = np.array([FIT_PARAMETERS[n][1] for n in names]) / scale
    return names, scale, lo, hi


def _soft_l1(r: np.ndarray, robust_scale: float) -> float:
    """Soft-L1 cost of the log-ratio residuals ``r`` at scale ``robust_scale``."""
    z = (r / robust_scale) ** 2
    return float(np.sum(robust_scale ** 2 * 2.0 * (np.sqrt(1.0 + z) - 1.0)))


def _identified(x: np.ndarray, names: Sequence[str], lo: np.ndarray, hi: np.ndarray, cost) -> dict[str, bool]:
    """Which parameters the data binds: moving one by +-20 % of its value (an overhead: +-20 us)
    from the optimum ``x`` changes ``cost(x)`` by more than 1e-3."""
    cost0 = cost(x)
    out = {}
    for i, n in enumerate(names):
        step = 0.2 * x[i] if not n.endswith("_s") else 20.0
        costs = []
        for sgn in (-1.0, 1.0):
            y = x.copy()
            y[i] = np.clip(y[i] + sgn * step, lo[i], hi[i])
            costs.append(cost(y))
        out[n] = max(costs) - cost0 > 1e-3
    return out


def fit_efficiency(points: Sequence[PublishedPoint] = PUBLISHED_POINTS, *,
                   train_keys: Sequence[str] | None = None, base: Efficiency | None = None,
                   starts: int = 4, seed: int = 0, prior_weight: float = 0.02,
                   robust_scale: float = 0.2, x0: Efficiency | None = None) -> EfficiencyFit:
    """Least-squares fit of :data:`FIT_PARAMETERS` to the ``train_keys`` points (default: all).

    Residuals are log(predicted / published) under a soft-L1 loss of scale ``robust_scale``
    (a point off by far more than 20 % pulls linearly, not quadratically: published systems
    differ in ways no roofline captures), plus a weak prior, ``prior_weight`` x
    log(value / base value) per efficiency and ``prior_weight`` x overhead / 100 us. Bounded
    trust-region reflective least squares runs from ``starts`` starting points (``x0`` or the base
    values, then random draws inside the bounds from a generator seeded with ``seed``); the best
    is kept. The roofline is piecewise smooth (maxima of rooflines), so a parameter no training
    point is bound by leaves the data term flat: the prior then keeps it at the base assumption
    instead of wherever the optimiser stopped (:attr:`EfficiencyFit.identified` says which are
    bound).

    Parameters
    ----------
    points : sequence of PublishedPoint
        The measurements (default :data:`PUBLISHED_POINTS`).
    train_keys : sequence of str, optional
        Keys of the points to fit (default all); at least as many as fitted parameters.
    base : Efficiency, optional
        Prior and non-fitted values (default :data:`ASSUMED_EFFICIENCY`).
    starts : int
        Optimiser starts (default 4).
    seed : int
        Seed of the random starts (default 0).
    prior_weight : float
        Weight of the prior residuals (default 0.02).
    robust_scale : float
        Soft-L1 scale of the log-ratio residuals (default 0.2).
    x0 : Efficiency, optional
        First starting point (default ``base``).

    Returns
    -------
    EfficiencyFit

    Raises
    ------
    ConfigError
        ``train_keys`` names an unknown point or too few points.
    """
    from scipy.optimize import least_squares

    keys = {p.key for p in points} if train_keys is None else set(train_keys)
    unknown = keys - {p.key for p in points}
    if unknown:
        raise ConfigError("train_keys", f"unknown points {sorted(unknown)}")
    train = [p for p in points if p.key in keys]
    if len(train) < len(FIT_PARAMETERS):
        raise ConfigError("train_keys", f"{len(train)} training points cannot fit "
                          f"{len(FIT_PARAMETERS)} parameters")
    base = base or ASSUMED_EFFICIENCY
    names, scale, lo, hi = _names_bounds()
    prior = np.array([getattr(base, n) for n in names])

    def eff(x) -> Efficiency:
        return dataclasses.replace(base, **{n: float(v) for n, v in zip(names, x * scale)})

    def data_residuals(x) -> np.ndarray:
        e = eff(x)
        return np.array([math.log(predict_point(p, e) / p.published) for p in train])

    def residuals(x):
        v = x * scale
        r = data_residuals(x)
        # soft-L1 applied here (not via least_squares' loss) so the prior stays quadratic
        rho = np.sign(r) * np.sqrt(robust_scale ** 2 * 2.0 * (np.sqrt(1.0 + (r / robust_scale) ** 2) - 1.0))
        reg = [prior_weight * (math.log(v[i] / prior[i]) if prior[i] > 0 else v[i] / 1e-4)
               for i in range(len(names))]
        return np.concatenate([rho, reg])

    rng = np.random.default_rng(seed)
    start = x0 or base
    x0s = [np.clip(np.array([getattr(start, n) for n in names]) / scale, lo, hi)]
    x0s += [rng.uniform(lo, hi) for _ in range(max(starts - 1, 0))]
    best = None
    for x in x0s:
        r = least_squares(residuals, x, bounds=(lo, hi), diff_step=1e-3)
        if best is None or r.cost < best.cost:
            best = r
    fitted = eff(best.x)

    def data_cost(x):
        return _soft_l1(data_residuals(x), robust_scale)

    return EfficiencyFit(fitted, error_table(points, fitted, keys, reference=base), data_cost(best.x), len(x0s),
                         _identified(best.x, names, lo, hi, data_cost))


def cross_validate(points: Sequence[PublishedPoint] = PUBLISHED_POINTS, *,
                   full_fit: EfficiencyFit | None = None, base: Efficiency | None = None,
                   **kw) -> pd.DataFrame:
    """Leave-one-out: for each point, fit on all the others and predict it.

    Each refit starts from ``full_fit`` (the fit on all points; computed when not given) and from
    the random starts of :func:`fit_efficiency` ``**kw``. One row per point with its held-out
    prediction, error and the efficiencies fitted without it.

    Parameters
    ----------
    points : sequence of PublishedPoint
        The measurements (default :data:`PUBLISHED_POINTS`).
    full_fit : EfficiencyFit, optional
        The fit on all points, the refits' first start (computed when omitted).
    base : Efficiency, optional
        Prior of every refit (default :data:`ASSUMED_EFFICIENCY`).

    Returns
    -------
    pandas.DataFrame
    """
    keys = [p.key for p in points]
    if full_fit is None:
        full_fit = fit_efficiency(points, train_keys=keys, base=base, **kw)
    rows = []
    for p in points:
        f = fit_efficiency(points, train_keys=[k for k in keys if k != p.key], base=base,
                           x0=full_fit.efficiency, **kw)
        pred = predict_point(p, f.efficiency)
        err = signed_error(p, pred)
        rows.append({"point": p.key, "hardware": p.hardware, "mode": p.mode,
                     "published": p.published, "predicted": pred, "error": err,
                     "abs_error": abs(err), **{f"fit_{k}": v for k, v in f.params.items()},
                     "caveat": p.caveat})
    return pd.DataFrame(rows)
