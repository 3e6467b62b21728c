"""Study `bandwidth-capacity`: memory bandwidth and memory capacity are different targets
(reference article section 20; issue 13 part 6).

One model and one workload (DeepSeek-V3 decoding at 32k context on an 8-GPU worker), with the
GPU's HBM capacity and HBM bandwidth swept independently (compute, links and power held at the
base GPU's). For each point the decode batch is chosen two ways: *fill* - every KV slot the
capacity allows is used, the operator filling spare memory with large slow batches - and
*value* - the batch that maximises revenue under the interactivity price curve
(:class:`tokenfactory.plant_models.TokenValue`). The article predicts a steep rise of the
revenue-capacity curve once weights and KV fit, a rounded plateau set by bandwidth and compute,
and a decline when spare capacity is filled with slow, lower-value batches.

Run: ``tokenfactory study bandwidth-capacity [--quick] [--out DIR]``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from tokenfactory.plant_models import (
    Parallelism,
    TokenValue,
    Worker,
    accelerator_preset,
    decode_value_sweep,
    model_preset,
)
from tokenfactory.plant_models.plots import capacity_curve_plot
from tokenfactory.studies.report import StudyReport
from tokenfactory.studies.study_config import StudyVariants, resolve_study_config
from tokenfactory.core.validation import ConfigError, check_int, check_number

__all__ = ["CONFIG", "DEFAULT_CONFIG", "run", "capacity_sweep"]

GB, TB = 1e9, 1e12

DEFAULT_CONFIG: dict[str, Any] = {
    "model": "deepseek-v3",
    "base_hardware": "b200",
    "parallelism": {"tp": 1, "ep": 8},
    "context_tokens": 32768,
    "capacities_gb": [float(c) for c in range(100, 601, 20)],
    "bandwidths_tbs": [4.0, 8.0, 12.0],
    "reference_bandwidth_tbs": 8.0,   # the curve the headline numbers describe
    "heatmap_bandwidths_tbs": [2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 16.0],
    "plateau_fraction": 0.9,          # the knee: first capacity within this of the plateau
    "token_value": {},
}


def _check(cfg: dict[str, Any]) -> None:
    """The ranges of the resolved settings."""
    check_int("bandwidth-capacity.context_tokens", cfg["context_tokens"], low=1)
    for k in ("capacities_gb", "bandwidths_tbs", "heatmap_bandwidths_tbs"):
        if not cfg[k]:
            raise ConfigError(f"bandwidth-capacity.{k}", "needs at least one value")
        for i, v in enumerate(cfg[k]):
            check_number(f"bandwidth-capacity.{k}[{i}]", v, low=0.0, low_inclusive=False)
    if cfg["reference_bandwidth_tbs"] not in cfg["bandwidths_tbs"]:
        raise ConfigError("bandwidth-capacity.reference_bandwidth_tbs",
                          f"{cfg['reference_bandwidth_tbs']} must be one of bandwidths_tbs {cfg['bandwidths_tbs']}")
    check_number("bandwidth-capacity.plateau_fraction", cfg["plateau_fraction"], low=0.0, high=1.0,
                 low_inclusive=False)


#: the study's settings: the defaults and its quick variant (:mod:`tokenfactory.studies.study_config`)
CONFIG = StudyVariants("bandwidth-capacity", DEFAULT_CONFIG, quick={"capacities_gb": [float(c) for c in range(100, 601, 50)], "heatmap_bandwidths_tbs": [4.0, 8.0, 12.0]}, check=_check)


def capacity_sweep(model, base, parallelism: Parallelism, context_tokens: int,
                   capacities_gb, bandwidths_tbs, value: TokenValue) -> pd.DataFrame:
    """One row per (capacity, bandwidth, policy): decode batch, TPOT, tokens/s and revenue per
    GPU. Capacities where weights and working memory leave no KV room give zero throughput."""
    rows = []
    for bw in bandwidths_tbs:
        for cap in capacities_gb:
            acc = dataclasses.replace(base, name=f"{base.name}-{cap:g}GB-{bw:g}TBs",
                                      hbm_bytes=cap * GB, hbm_bandwidth=bw * TB)
            base_row = {"hbm_capacity_gb": cap, "hbm_bandwidth_tbs": bw}
            try:
                w = Worker(model, acc, parallelism)
                df = decode_value_sweep(w, context_tokens, value)
            except ConfigError:
                df = pd.DataFrame()
            if df.empty:
                for policy in ("fill", "value"):
                    rows.append({**base_row, "policy": policy, "batch": 0, "decode_slots": 0,
                                 "tpot_s": np.nan, "tokens_per_s_per_gpu": 0.0,
                                 "revenue_per_gpu_hour": 0.0, "price_per_mtok": 0.0})
                continue
            fill = df.iloc[-1]  # the grid ends at the KV-limited slots
            best = df.loc[df["revenue_per_gpu_hour"].idxmax()]
            for policy, r in (("fill", fill), ("value", best)):
                rows.append({**base_row, "policy": policy, "batch": int(r["batch"]),
                             "decode_slots": int(r["decode_slots"]), "tpot_s": float(r["tpot_s"]),
                             "tokens_per_s_per_gpu": float(r["tokens_per_s_per_gpu"]),
                             "revenue_per_gpu_hour": float(r["revenue_per_gpu_hour"]),
                             "price_per_mtok": float(r["price_per_mtok"])})
    return pd.DataFrame(rows)


def _headline(df: pd.DataFrame, frac: float) -> dict[str, Any]:
    """Numbers of one bandwidth's curves (fill and value policies)."""
    fill = df[df["policy"] == "fill"].sort_values("hbm_capacity_gb")
    val = df[df["policy"] == "value"].sort_values("hbm_capacity_gb")
    feasible = fill[fill["decode_slots"] > 0]
    if feasible.empty:
        return {"feasible": False}
    caps = fill["hbm_capacity_gb"].to_numpy()
    tps = fill["tokens_per_s_per_gpu"].to_numpy()
    plateau = float(tps.max())
    knee = float(caps[np.argmax(tps >= frac * plateau)])
    first = float(feasible["hbm_capacity_gb"].iloc[0])
    t_first = float(feasible["tokens_per_s_per_gpu"].iloc[0])
    rev = fill["revenue_per_gpu_hour"].to_numpy()
    i_peak = int(np.argmax(rev))
    rev_v = val["revenue_per_gpu_hour"].to_numpy()
    above = caps >= knee
    slope_rise = (frac * plateau - t_first) / max(knee - first, 1e-9)
    slope_plateau = (tps[-1] - tps[above][0]) / max(caps[-1] - caps[above][0], 1e-9)
    return {
        "feasible": True,
        "min_feasible_capacity_gb": first,
        "tokens_per_s_at_min_capacity": t_first,
        "plateau_tokens_per_s_per_gpu": plateau,
        "knee_capacity_gb": knee,
        "rise_tokens_per_s_per_gb": slope_rise,
        "plateau_tokens_per_s_per_gb": float(slope_plateau),
        "fill_revenue_peak_per_gpu_hour": float(rev[i_peak]),
        "fill_revenue_peak_capacity_gb": float(caps[i_peak]),
        "fill_revenue_at_max_capacity": float(rev[-1]),
        "fill_revenue_decline_fraction": float(1.0 - rev[-1] / rev[i_peak]) if rev[i_peak] > 0 else 0.0,
        "fill_tpot_at_peak_s": float(fill["tpot_s"].iloc[i_peak]),
        "fill_tpot_at_max_capacity_s": float(fill["tpot_s"].iloc[-1]),
        "fill_price_at_max_capacity": float(fill["price_per_mtok"].iloc[-1]),
        "value_revenue_at_max_capacity": float(rev_v[-1]),
        "value_revenue_peak": float(rev_v.max()),
        "value_revenue_peak_capacity_gb": float(caps[int(np.argmax(rev_v))]),
        "value_batch_at_max_capacity": int(val["batch"].iloc[-1]),
        "fill_batch_at_max_capacity": int(fill["batch"].iloc[-1]),
    }


def run(out_dir: str | Path, quick: bool = False, config: dict[str, Any] | None = None) -> dict[str, Any]:
    cfg = resolve_study_config(CONFIG, config, quick=quick)
    report = StudyReport("bandwidth-capacity", Path(out_dir), cfg)
    model = model_preset(cfg["model"])
    base = accelerator_preset(cfg["base_hardware"])
    par = Parallelism(**cfg["parallelism"])
    value = TokenValue.from_dict(cfg["token_value"])
    ctx = int(cfg["context_tokens"])

    df = capacity_sweep(model, base, par, ctx, cfg["capacities_gb"], cfg["bandwidths_tbs"], value)
    report.save_table(df, "capacity_sweep.csv")
    heat_bw = sorted(set(cfg["heatmap_bandwidths_tbs"]) - set(cfg["bandwidths_tbs"]))
    heat = pd.concat([df, capacity_sweep(model, base, par, ctx, cfg["capacities_gb"], heat_bw, value)])
    report.save_table(heat, "capacity_bandwidth_grid.csv")

    fig = Figure(figsize=(12, 4.6), layout="constrained")
    ax1, ax2, ax3 = fig.subplots(1, 3)
    capacity_curve_plot(df, y="tokens_per_s_per_gpu", style="policy", ax=ax1)
    ax1.set_ylabel("decode tokens/s per GPU")
    ax1.set_title(f"{model.name}, {ctx // 1024}k context, {par.num_gpus} GPUs")
    capacity_curve_plot(df, y="revenue_per_gpu_hour", style="policy", ax=ax2)
    ax2.set_ylabel("revenue (USD per GPU-hour)")
    ax2.set_title("revenue: fill every KV slot vs value-optimal batch")
    v = heat[heat["policy"] == "value"].pivot_table(index="hbm_bandwidth_tbs", columns="hbm_capacity_gb",
                                                    values="revenue_per_gpu_hour")
    im = ax3.imshow(v.to_numpy(), origin="lower", aspect="auto", cmap="viridis",
                    extent=(v.columns.min(), v.columns.max(), -0.5, len(v.index) - 0.5))
    ax3.set_yticks(range(len(v.index)), [f"{b:g}" for b in v.index])
    ax3.set_xlabel("HBM capacity per GPU (GB)")
    ax3.set_ylabel("HBM bandwidth per GPU (TB/s)")
    ax3.set_title("value-optimal revenue (USD/GPU-h)")
    fig.colorbar(im, ax=ax3)
    report.save_figure(fig, "bandwidth_capacity.png",
                       "Decode throughput and revenue against HBM capacity per GPU at fixed "
                       "bandwidths (solid: every KV slot filled; dashed: value-optimal batch), and "
                       "revenue over capacity x bandwidth (section 20).")

    frac = cfg["plateau_fraction"]
    per_bw = {f"{bw:g}": _headline(df[df["hbm_bandwidth_tbs"] == bw], frac) for bw in cfg["bandwidths_tbs"]}
    ref = per_bw[f"{cfg['reference_bandwidth_tbs']:g}"]
    # Bandwidth vs capacity: the value-optimal revenue of the fastest memory at the reference
    # knee against the slowest memory at the largest capacity.
    hv = heat[heat["policy"] == "value"]
    bw_lo, bw_hi = min(cfg["bandwidths_tbs"]), max(cfg["bandwidths_tbs"])
    cap_max = max(cfg["capacities_gb"])
    knee = ref.get("knee_capacity_gb", cap_max)
    fast_small = float(hv[(hv.hbm_bandwidth_tbs == bw_hi) & (hv.hbm_capacity_gb == knee)]["revenue_per_gpu_hour"].iloc[0])
    slow_big = float(hv[(hv.hbm_bandwidth_tbs == bw_lo) & (hv.hbm_capacity_gb == cap_max)]["revenue_per_gpu_hour"].iloc[0])
    metrics = {"model": model.name, "base_hardware": base.name, "context_tokens": ctx,
               "num_gpus": par.num_gpus, "token_value": value.to_dict(), "per_bandwidth": per_bw,
               "bandwidth_vs_capacity": {"fast_small": {"bandwidth_tbs": bw_hi, "capacity_gb": knee,
                                                        "revenue_per_gpu_hour": fast_small},
                                         "slow_big": {"bandwidth_tbs": bw_lo, "capacity_gb": cap_max,
                                                      "revenue_per_gpu_hour": slow_big}}}

    rb = cfg["reference_bandwidth_tbs"]
    lines = [f"{model.name} decoding {ctx // 1024}k-token contexts on {par.num_gpus} GPUs shaped like "
             f"{base.name} (compute and links fixed), HBM capacity {min(cfg['capacities_gb']):g}-{cap_max:g} GB "
             f"and bandwidth {', '.join(f'{b:g}' for b in cfg['bandwidths_tbs'])} TB/s per GPU.", ""]
    if not ref["feasible"]:
        lines.append(f"* The model never fits at {rb:g} TB/s in the swept capacities.")
        return report.finish(metrics, lines)
    rises = ref["rise_tokens_per_s_per_gb"] > 3 * max(ref["plateau_tokens_per_s_per_gb"], 0.0)
    report.headline("knee of the capacity curve", ref["knee_capacity_gb"], "GB per GPU",
                    f"{100 * frac:.0f} % of the {rb:g} TB/s plateau")
    report.headline("revenue lost filling spare capacity", 100 * ref["fill_revenue_decline_fraction"], "%",
                    f"peak at {ref['fill_revenue_peak_capacity_gb']:g} GB to {cap_max:g} GB, every KV slot used")
    lines += [
        f"* **Steep rise, then plateau** (at {rb:g} TB/s): below {ref['min_feasible_capacity_gb']:g} GB "
        f"per GPU weights and working memory leave no KV room; from there throughput climbs "
        f"{ref['rise_tokens_per_s_per_gb']:.1f} tokens/s per GPU for every added GB to "
        f"{100 * frac:.0f} % of its plateau at {ref['knee_capacity_gb']:g} GB, then gains only "
        f"{ref['plateau_tokens_per_s_per_gb']:.2f} tokens/s per GB up to "
        f"{ref['plateau_tokens_per_s_per_gpu']:.0f} tokens/s per GPU"
        + (" - the rise is steep and the top flat, as the article predicts." if rises else
           " - the curve does not show the predicted steep rise and flat top."),
        f"* **Revenue declines when spare capacity is filled**: with every KV slot in use, revenue "
        f"peaks at {ref['fill_revenue_peak_capacity_gb']:g} GB (USD {ref['fill_revenue_peak_per_gpu_hour']:.2f} "
        f"per GPU-hour, TPOT {1e3 * ref['fill_tpot_at_peak_s']:.0f} ms) and "
        + (f"falls {100 * ref['fill_revenue_decline_fraction']:.0f} % by {cap_max:g} GB, where "
           f"{ref['fill_batch_at_max_capacity']} sequences run at {1e3 * ref['fill_tpot_at_max_capacity_s']:.0f} ms "
           f"TPOT and earn USD {ref['fill_price_at_max_capacity']:.2f} per million tokens"
           if ref["fill_revenue_decline_fraction"] > 0.01 else "does not fall by the largest capacity")
        + f"; choosing the value-optimal batch instead earns USD {ref['value_revenue_at_max_capacity']:.2f} "
        f"there (batch {ref['value_batch_at_max_capacity']}, peak USD {ref['value_revenue_peak']:.2f} from "
        f"{ref['value_revenue_peak_capacity_gb']:g} GB)"
        + (", so capacity past that point earns nothing."
           if ref["value_revenue_at_max_capacity"] <= 1.01 * ref["value_revenue_peak"]
           and ref["value_revenue_peak_capacity_gb"] < cap_max else "."),
        f"* **Bandwidth vs capacity**: {bw_hi:g} TB/s with {knee:g} GB earns USD {fast_small:.2f} per "
        f"GPU-hour, {bw_lo:g} TB/s with {cap_max:g} GB earns USD {slow_big:.2f}"
        + (" - the faster, smaller memory wins." if fast_small > slow_big else " - the larger, slower memory wins."),
    ]
    for bw, h in per_bw.items():
        if bw == f"{rb:g}" or not h["feasible"]:
            continue
        lines.append(f"* At {bw} TB/s: plateau {h['plateau_tokens_per_s_per_gpu']:.0f} tokens/s per GPU from "
                     f"{h['knee_capacity_gb']:g} GB; filling every slot loses "
                     f"{100 * h['fill_revenue_decline_fraction']:.0f} % of peak revenue by {cap_max:g} GB.")
    return report.finish(metrics, lines)
