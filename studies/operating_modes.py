"""Study `operating-modes`: why prefill, midfill, decode attention and decode experts are different
workloads (reference article sections 3, 14, 15, 16), computed from the descriptors.

Run: ``tokenfactory study operating-modes [--out DIR]``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from tokenfactory.plant_models import (
    ACCELERATOR_PRESETS,
    MODEL_PRESETS,
    TokenValue,
    Worker,
    accelerator_preset,
    best_decode_batch,
    decode_value_sweep,
    decode_sweep,
    expert_arithmetic_intensity,
    kv_crossover_depth,
    model_preset,
    stage_memory,
    stage_memory_sweep,
)
from tokenfactory.plant_models.plots import decode_sweep_plot, expert_intensity_plot, roofline_plot, stage_memory_plot
from tokenfactory.studies.study_config import StudyVariants, resolve_study_config
from tokenfactory.studies.report import StudyReport

__all__ = ["CONFIG", "DEFAULT_CONFIG", "run"]

GB = 1e9

DEFAULT_CONFIG: dict[str, Any] = {
    "model": "deepseek-v3",
    "decode_hardware": ["h200", "b200"],
    "parallelism": {"tp": 1, "pp": 1, "ep": 8},
    "decode_contexts": [8192, 32768, 131072],
    "decode_batches": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024],
    # Article section 14 example: 70 kB/token x 2M active tokens, double-buffered.
    # Decode batch optimum by value (issue 13 part 8): tokens/s weighted by the interactivity
    # price curve and the TPOT SLO of TokenValue (fields overridable here).
    "value_contexts": [8192, 131072, 1048576],
    "token_value": {},
    "stage_example": {"kv_bytes_per_token": 70e3, "active_context_tokens": 2e6,
                      "double_buffer": True, "working_bytes": 20e9, "slack_fraction": 0.0,
                      "target_band_bytes": [400e9, 500e9], "depths": list(range(1, 13))},
}

#: the study's settings: the defaults and its quick variant (:mod:`tokenfactory.studies.study_config`)
CONFIG = StudyVariants("operating-modes", DEFAULT_CONFIG, quick={"decode_batches": [1, 4, 16, 64, 256, 1024]})


def _expert_intensity(model, report: StudyReport) -> dict[str, Any]:
    n = np.unique(np.logspace(0, 4, 60).round())
    act = model.activation_bytes_per_element * model.hidden_size
    ai = expert_arithmetic_intensity(n, model.expert_params, model.expert_weight_bytes, act, act)
    asymptote = 2.0 * model.expert_params / (2 * act)
    prec = model.weight_precision
    ridges = {name: accelerator_preset(name).ridge_point(prec) for name in ("h200", "b200")}
    # tokens per expert needed to reach each ridge point (where the expert becomes compute-bound)
    needed = {name: float(n[np.argmax(ai >= r)]) if (ai >= r).any() else None for name, r in ridges.items()}
    ax = expert_intensity_plot(n, ai, ridges={f"{k} {prec}": v for k, v in ridges.items()},
                               asymptote=asymptote)
    ax.set_title(f"{model.name}: one routed expert, {prec} weights")
    report.save_figure(ax.figure, "expert_intensity.png",
                       "Expert arithmetic intensity vs tokens per expert: weight reuse lifts it "
                       "quickly, then activation traffic flattens it (section 15).")
    report.save_table(pd.DataFrame({"tokens_per_expert": n, "intensity": ai}), "expert_intensity.csv")
    return {"intensity_at_1": float(ai[0]), "intensity_at_128": float(np.interp(128, n, ai)),
            "intensity_at_10000": float(ai[-1]), "asymptote": asymptote,
            "ridge_points": ridges, "tokens_per_expert_to_reach_ridge": needed}


def _gather_sentence(model, needed: float | None, decode_batch: int, prompt_tokens: int) -> str:
    """Whether a prefill pass of one ``prompt_tokens`` prompt and a full decode batch give each
    routed expert the tokens it needs to be compute-bound (uniform routing: B k / E per expert)."""
    per = model.active_experts / model.routed_experts
    fill, dec = prompt_tokens * per, decode_batch * per
    if needed is None:
        return "No batch reaches the ridge."

    def share(n: float) -> str:
        return f"{100 * n / needed:.0f} % of it"

    bound = " - decode's experts stay memory-bound" if dec < needed else ""
    return (f"One {prompt_tokens // 1024}k-token prefill pass routes ~{fill:.0f} tokens to each expert "
            f"({share(fill)}); a full decode batch of {decode_batch} routes ~{dec:.0f} ({share(dec)}){bound}.")


def _decode(model, cfg, report: StudyReport) -> dict[str, Any]:
    fig = Figure(figsize=(11, 8), layout="constrained")
    axes = fig.subplots(2, len(cfg["decode_hardware"]), squeeze=False)
    out: dict[str, Any] = {}
    frames = []
    for j, hw in enumerate(cfg["decode_hardware"]):
        w = Worker(model, accelerator_preset(hw), parallelism=_par(cfg))
        df = decode_sweep(w, cfg["decode_batches"], cfg["decode_contexts"])
        frames.append(df)
        decode_sweep_plot(df, ax=axes[0, j]).set_title(f"{model.name} on 8x {hw}: throughput")
        decode_sweep_plot(df, y="step_s", ax=axes[1, j]).set_title(f"{model.name} on 8x {hw}: TPOT")
        per_ctx = {}
        for c, g in df.groupby("context_tokens"):
            b1 = g.loc[g["batch"] == g["batch"].min()].iloc[0]
            best = g.loc[g["tokens_per_s_per_gpu"].idxmax()]
            per_ctx[str(int(c))] = {
                "decode_slots": int(b1["decode_slots"]),
                "tokens_per_s_per_gpu_batch1": float(b1["tokens_per_s_per_gpu"]),
                "tpot_s_batch1": float(b1["step_s"]),
                "best_batch": int(best["batch"]),
                "tokens_per_s_per_gpu_best": float(best["tokens_per_s_per_gpu"]),
                "tpot_s_best": float(best["step_s"]),
                "batching_gain": float(best["tokens_per_s_per_gpu"] / b1["tokens_per_s_per_gpu"]),
                "attention_share_at_best": float(best["attention_s"] / best["step_s"]),
            }
        out[hw] = per_ctx
    report.save_figure(fig, "decode_batching.png",
                       "Decode tokens/s per GPU and TPOT vs batch at 8k/32k/128k context. Lines stop "
                       "where KV no longer fits: at long context the batch is capped early and each "
                       "added sequence brings its own KV scan, so batching buys little (section 16).")
    report.save_table(pd.concat(frames), "decode_sweep.csv")
    return out


def _decode_value(model, cfg, report: StudyReport) -> dict[str, Any]:
    """Batch that maximises revenue (tokens/s x price at that TPOT) vs raw tokens/s (section 16)."""
    value = TokenValue.from_dict(cfg["token_value"])
    fig = Figure(figsize=(11, 4.4), layout="constrained")
    axes = fig.subplots(1, len(cfg["decode_hardware"]), squeeze=False)[0]
    out: dict[str, Any] = {"token_value": value.to_dict()}
    frames = []
    for ax, hw in zip(axes, cfg["decode_hardware"]):
        w = Worker(model, accelerator_preset(hw), parallelism=_par(cfg))
        out[hw] = {}
        for c in cfg["value_contexts"]:
            best = best_decode_batch(w, c, value)
            best["dp_attention"] = w.parallelism.dp_attention
            out[hw][str(int(c))] = best
            df = decode_value_sweep(w, c, value)
            if df.empty:
                continue
            frames.append(df.assign(hardware=hw, context_tokens=c))
            ax.plot(df["batch"], df["revenue_per_gpu_hour"], marker="o", ms=2, label=f"{_ctx(c)} context")
            ax.plot([best["value_batch"]], [best["value_revenue_per_gpu_hour"]], "k*", ms=9)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("decode batch (sequences per worker)")
        ax.set_ylabel("revenue (USD per GPU-hour)")
        ax.set_title(f"{model.name} on 8x {hw}: value of a decode batch")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    report.save_figure(fig, "decode_value.png",
                       "Revenue per GPU-hour vs decode batch at 8k, 128k and 1M context: output "
                       "tokens/s priced by the user's speed (interactive above batch, nothing past "
                       "the TPOT SLO); stars mark the value-maximising batch (section 16).")
    if frames:
        report.save_table(pd.concat(frames), "decode_value.csv")
    return out


def _stage(model_names, cfg, report: StudyReport) -> dict[str, Any]:
    ex = cfg["stage_example"]
    kv_only = stage_memory(0.0, 1, ex["active_context_tokens"], ex["kv_bytes_per_token"],
                           double_buffer=False).kv
    kv_double = stage_memory(0.0, 1, ex["active_context_tokens"], ex["kv_bytes_per_token"],
                             double_buffer=True).kv
    kw = dict(double_buffer=ex["double_buffer"], working_bytes=ex["working_bytes"])
    lo, hi = ex["target_band_bytes"]
    fig = Figure(figsize=(11, 4.4), layout="constrained")
    axes = fig.subplots(1, len(model_names))
    out: dict[str, Any] = {"kv_bytes": kv_only, "kv_bytes_double_buffered": kv_double,
                           "target_band_bytes": [lo, hi], "models": {}}
    for ax, name in zip(axes, model_names):
        m = model_preset(name)
        df = stage_memory_sweep(m.weight_bytes, ex["active_context_tokens"], ex["kv_bytes_per_token"],
                                depths=ex["depths"], slack_fraction=ex["slack_fraction"], **kw)
        p_x = kv_crossover_depth(m.weight_bytes, ex["active_context_tokens"], ex["kv_bytes_per_token"], **kw)
        stage_memory_plot(df, crossover=p_x, target_band=(lo, hi), ax=ax)
        ax.set_title(f"{name} ({m.weight_bytes / GB:.0f} GB {m.weight_precision} weights)")
        in_band = df.loc[(df["total"] >= lo) & (df["total"] <= hi), "pipeline_depth"].tolist()
        out["models"][name] = {"weight_bytes": m.weight_bytes, "crossover_depth": p_x,
                               "stage_bytes_at_crossover": float(df.set_index("pipeline_depth").loc[p_x, "total"]),
                               "depths_in_target_band": in_band}
    report.save_figure(fig, "stage_memory.png",
                       "Memory per pipeline stage vs depth P for 2M active tokens at 70 kB/token, "
                       "double-buffered (280 GB of KV): weights shrink as W/P but KV does not, so past "
                       "the crossover deeper pipelines buy little; the 400-500 GB band is the "
                       "article's stage target (section 14).")
    return out


def _roofline_points(model, report: StudyReport) -> dict[str, Any]:
    w = Worker(model, accelerator_preset("h200"))
    dp = w.parallelism.dp_attention
    cases = {
        "prefill 8k": w.prefill(8192, sequences=dp).phases,
        "midfill 1k on 127k": w.midfill(1024, 127 * 1024, sequences=dp).phases,
        "decode attention 8k, b=64": (w.decode_attention(64, 8192),),
        "decode attention 128k, b=8": (w.decode_attention(8, 131072),),
        "decode experts b=1": (w.decode_experts(1),),
        "decode experts b=64": (w.decode_experts(64),),
        "decode experts b=512": (w.decode_experts(512),),
    }
    rows = []
    for name, phases in cases.items():
        flops = sum(p.flops for p in phases)
        byts = sum(p.hbm_bytes for p in phases)
        t = sum(p.time_s for p in phases)
        gpus = w.parallelism.tp if phases[0].phase == "attention" and len(phases) == 1 else w.num_gpus
        rows.append({"name": name, "intensity": flops / byts, "flops_per_s": flops / t / gpus,
                     "bound": max(phases, key=lambda p: p.time_s).bound, "time_s": t})
    df = pd.DataFrame(rows)
    a = w.accelerator
    ax = roofline_plot(df, peak_flops=a.peak_flops(model.weight_precision) * w.efficiency.compute,
                       bandwidth=a.hbm_bandwidth * w.efficiency.memory,
                       label=f"h200 {model.weight_precision} roof (x efficiency)")
    ax.set_title(f"The four operating modes of {model.name} on h200")
    report.save_figure(ax.figure, "operating_modes_roofline.png",
                       "Each operating mode on the H200 roofline: prefill and midfill sit near the "
                       "compute roof, decode attention stays memory-bound at any batch, decode "
                       "experts climb slowly with batch (sections 3, 15, 16).")
    report.save_table(df, "operating_modes_roofline.csv")
    return {r["name"]: {"intensity": r["intensity"], "bound": r["bound"], "time_s": r["time_s"]}
            for r in rows}


def _par(cfg):
    from tokenfactory.plant_models import Parallelism

    return Parallelism(**cfg["parallelism"])


def run(out_dir: str | Path, quick: bool = False, config: dict[str, Any] | None = None) -> dict[str, Any]:
    cfg = resolve_study_config(CONFIG, config, quick=quick)
    report = StudyReport("operating-modes", Path(out_dir), cfg)
    model = model_preset(cfg["model"])
    metrics = {
        "models": {n: m.summary() for n, m in MODEL_PRESETS.items()},
        "hardware": {n: a.to_dict() for n, a in ACCELERATOR_PRESETS.items()},
        "roofline": _roofline_points(model, report),
        "expert_intensity": _expert_intensity(model, report),
        "decode": _decode(model, cfg, report),
        "stage_memory": _stage(["deepseek-v3", "kimi-k2"], cfg, report),
        "decode_value": _decode_value(model, cfg, report),
    }
    ei, dec, st = metrics["expert_intensity"], metrics["decode"], metrics["stage_memory"]
    hw0 = cfg["decode_hardware"][0]
    short, long_ = (str(c) for c in (cfg["decode_contexts"][0], cfg["decode_contexts"][-1]))
    lines = [
        f"Model `{model.name}`: {model.total_params / 1e9:.0f}B total, {model.active_params / 1e9:.1f}B "
        f"active, {model.kv_bytes_per_token:,.0f} bytes of KV per token.",
        "",
        f"* **Expert intensity** rises from {ei['intensity_at_1']:.1f} FLOP/B at one token per expert to "
        f"{ei['intensity_at_10000']:.0f} at 10,000 and flattens toward {ei['asymptote']:.0f}; an expert "
        f"needs ~{ei['tokens_per_expert_to_reach_ridge']['h200']:.0f} tokens to reach the H200 ridge. "
        + _gather_sentence(model, ei["tokens_per_expert_to_reach_ridge"]["h200"],
                           int(dec[hw0][short]["decode_slots"]), int(short)),
        f"* **Decode batching** on {hw0}: at {int(short) // 1024}k context the best batch gives "
        f"{dec[hw0][short]['batching_gain']:.0f}x the per-GPU throughput of batch 1; at "
        f"{int(long_) // 1024}k only {dec[hw0][long_]['batching_gain']:.1f}x, because KV caps the batch at "
        f"{dec[hw0][long_]['decode_slots']} sequences and attention takes "
        f"{100 * dec[hw0][long_]['attention_share_at_best']:.0f} % of the pass.",
        f"* **Stage memory**: 70 kB/token x 2M tokens = {st['kv_bytes'] / GB:.0f} GB of KV, "
        f"{st['kv_bytes_double_buffered'] / GB:.0f} GB double-buffered. DeepSeek-V3's KV crossover is at "
        f"P={st['models']['deepseek-v3']['crossover_depth']}; stage totals fall in the 400-500 GB target at "
        f"P={st['models']['deepseek-v3']['depths_in_target_band']} (DeepSeek-V3) and "
        f"P={st['models']['kimi-k2']['depths_in_target_band']} (Kimi K2).",
    ]
    dv = metrics["decode_value"]
    lines.append("* **Decode batch optimum by value** (tokens/s priced by the user's speed: "
                 f"USD {dv['token_value']['interactive_price_per_mtok']}/M at "
                 f">= {dv['token_value']['interactive_tps']:g} tok/s per user, "
                 f"{dv['token_value']['batch_price_per_mtok']}/M at {dv['token_value']['batch_tps']:g}, "
                 f"falling to nothing at a {dv['token_value']['slo_tpot_s']:g} s TPOT):")
    for hw in cfg["decode_hardware"]:
        parts = []
        for c in cfg["value_contexts"]:
            b = dv[hw][str(int(c))]
            if b["value_batch"] is None:
                parts.append(f"{_ctx(c)}: no sequence fits")
                continue
            same = b["value_batch"] == b["throughput_batch"]
            capped = b["value_batch"] == b["decode_slots"]
            parts.append(
                f"{_ctx(c)}: batch {b['value_batch']} ({b['value_batch'] / b['dp_attention']:.3g} per "
                f"attention replica, TPOT {1e3 * b['value_tpot_s']:.0f} ms, "
                f"USD {b['value_revenue_per_gpu_hour']:.3g}/GPU-h)"
                + (", also the throughput optimum" if same else
                   f" vs throughput optimum {b['throughput_batch']} at "
                   f"{1e3 * b['throughput_tpot_s']:.0f} ms worth USD {b['throughput_revenue_per_gpu_hour']:.3g}")
                + (", capped by KV" if capped else ""))
        lines.append(f"  * {hw}: " + "; ".join(parts) + ".")
    long_ctx = [(hw, c, dv[hw][str(int(c))]) for hw in cfg["decode_hardware"] for c in cfg["value_contexts"]
                if c >= 131072 and dv[hw][str(int(c))]["value_batch"] is not None]
    if long_ctx:
        per_rep = [b["value_batch"] / b["dp_attention"] for _, _, b in long_ctx]
        moved = sum(b["value_batch"] < b["throughput_batch"] for _, _, b in long_ctx)
        capped = sum(b["value_batch"] == b["decode_slots"] for _, _, b in long_ctx)
        lines.append(
            f"  * At 128k context and beyond the value-maximising batch is {min(per_rep):.2g}-{max(per_rep):.2g} "
            "sequences per attention replica, "
            + ("within" if max(per_rep) <= 5 else "above")
            + " the article's 'closer to 1 or 5'; "
            + (f"the price of speed lowers it below the throughput optimum in {moved} of {len(long_ctx)} cases"
               if moved else "the price of speed never moves it below the throughput optimum")
            + f", and KV capacity caps it in {capped} of {len(long_ctx)}.")
    d_short, d_long = dec[hw0][short], dec[hw0][long_]
    report.answer("capacity", f"Decode on {hw0} is limited by memory: at {int(short) // 1024}k context batching "
                  f"buys {d_short['batching_gain']:.0f}x the throughput of batch 1, at {int(long_) // 1024}k only "
                  f"{d_long['batching_gain']:.1f}x, because KV caps the batch at {d_long['decode_slots']} sequences "
                  f"and attention takes {100 * d_long['attention_share_at_best']:.0f} % of the pass.")
    return report.finish(metrics, lines)


def _ctx(c: int) -> str:
    return f"{c // 1048576}M" if c >= 1048576 else f"{c // 1024}k"
