"""Study `trace-replay` and the `tokenfactory simulate` job: real traces, request by request,
through a disaggregated cluster under naive, threshold and smoothed admission.

Loads are set relative to the cluster's bottleneck capacity at the trace's own request shape
(from the roofline plant), so "load 1.1" means 10 % more than the cluster can serve whatever the
trace; the multiplier applied to the trace's arrival rate is reported next to it.

Run: ``tokenfactory study trace-replay [--quick | --full] [--out DIR]`` or
``tokenfactory simulate --trace NAME|PATH [--scale X] [--admission KIND] [--scenario FILE.toml]``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from tokenfactory.replay import DEFAULT_PLANT, build_replay, run_replay
from tokenfactory.studies.study_config import StudyVariants, resolve_study_config
from tokenfactory.studies.report import StudyReport
from tokenfactory.traces import SyntheticWorkload, generate_requests, load_trace, trace_available

__all__ = ["CONFIG", "run", "PLANT", "ADMISSIONS"]

PLANT = DEFAULT_PLANT
#: admission kinds the study compares
ADMISSIONS = ("naive", "threshold", "smoothed")


def _trace_for(name: str, quick: bool) -> pd.DataFrame | None:
    if name == "synthetic":
        return generate_requests(SyntheticWorkload(mean_rate_rps=5.0, idc=4.0, daily_amplitude=0.0,
                                                   daily_second_harmonic=0.0, weekend_factor=1.0, seed=3),
                                 900.0 if quick else 3600.0)
    if not trace_available(name):
        return None
    df = load_trace(name)
    if quick:  # the first 10 minutes
        df = df[df["arrival_s"] < 600.0].copy()
        df.attrs = load_trace(name).attrs
    return df


def _contrast_lines(table: pd.DataFrame) -> list[str]:
    """Where smoothed and threshold admission tie and where they differ, from the table's rows."""
    if not {"smoothed", "threshold"} <= set(table["admission"]):
        return []
    ties, diffs = [], []
    for (trace, load), g in table.groupby(["trace", "load"]):
        sm = g[g["admission"] == "smoothed"].iloc[0]
        th = g[g["admission"] == "threshold"].iloc[0]
        where = f"{trace} x{load:g}"
        if abs(sm["slo_attainment"] - th["slo_attainment"]) <= 1e-3 and sm["rejected"] == th["rejected"]:
            ties.append(where)
        else:
            diffs.append(f"{where}: smoothed SLO {sm['slo_attainment']:.3f} with {sm['rejected']} rejected and "
                         f"TTFT p99 {sm['ttft_p99'] or float('nan'):.1f} s, threshold {th['slo_attainment']:.3f} with "
                         f"{th['rejected']} rejected and TTFT p99 {th['ttft_p99'] or float('nan'):.1f} s")
    out = []
    if ties:
        out.append(f"Smoothed and threshold admission tie (same SLO attainment and rejections) at {', '.join(ties)}: "
                   "neither rejected more than the other there, so what separates the runs is downstream of "
                   "admission.")
    if diffs:
        out.append("They differ at " + "; ".join(diffs) + ".")
    return out


#: the study's settings: the defaults and its quick and full variants
#: (:mod:`tokenfactory.studies.study_config`)
CONFIG = StudyVariants("trace-replay", {
    "traces": ["azure-conv-2023", "mooncake-conversation"], "loads": [0.9, 1.3], "admissions": list(ADMISSIONS),
    "plant": dict(PLANT), "cluster": {"slo_ttft_s": 2.0, "slo_tpot_s": 0.1, "drain_s": 60.0}},
    quick={"loads": [0.8, 1.2]}, full={"loads": [0.6, 0.9, 1.1, 1.3]})


def run(out_dir: str | Path, quick: bool = False, config: dict[str, Any] | None = None,
        full: bool = False) -> dict[str, Any]:
    cfg = resolve_study_config(CONFIG, config, quick=quick, full=full)
    report = StudyReport("trace-replay", Path(out_dir), cfg)
    traces = {n: _trace_for(n, quick) for n in cfg["traces"]}
    absent = [n for n, t in traces.items() if t is None]
    traces = {n: t for n, t in traces.items() if t is not None} or {"synthetic": _trace_for("synthetic", quick)}
    rows, runs = [], {}
    for name, tr in traces.items():
        setup = build_replay(tr, cfg["plant"])
        rate = len(tr) / max(float(tr["arrival_s"].max()), 1.0)
        for load in cfg["loads"]:
            scale = load * setup.capacity_rps / rate
            for adm in cfg["admissions"]:
                m, res = run_replay(tr, setup, adm, scale, cfg["cluster"])
                rows.append({"trace": name, "load": load, "scale": scale, "admission": adm,
                             "bottleneck": setup.bottleneck, "capacity_rps": setup.capacity_rps,
                             **{k: m[k] for k in ("requests", "completed", "rejected", "in_flight_end", "ttft_p50",
                                                  "ttft_p99", "tpot_p50", "tpot_p99", "slo_attainment",
                                                  "goodput_tokens_per_s", "prefix_hit_ratio", "oscillating",
                                                  "wall_seconds", "sim_requests_per_wall_s")},
                             "thornhill_r": (m["ready_oscillation"] or {}).get("thornhill_r")})
                if load == max(cfg["loads"]):
                    runs[(name, adm)] = res
    table = pd.DataFrame(rows)
    report.save_table(table, "replay_table.csv")
    for name in traces:
        fig = Figure(figsize=(11, 7.5), layout="constrained")
        ax = fig.subplots(3, 1)
        for i, adm in enumerate(cfg["admissions"]):
            res = runs.get((name, adm))
            if res is None:
                continue
            q = res.records.dropna(subset=["first_token_s"]).sort_values("arrival_s")
            roll = q.set_index("arrival_s")["ttft_s"].rolling(200, min_periods=20).quantile(0.9)
            ax[0].plot(roll.index, roll.to_numpy(), lw=1.2, color=f"C{i}", label=adm)
            ax[1].plot(res.series["time_s"], res.series["ready"], lw=0.8, color=f"C{i}", label=adm)
        ax[0].set_ylabel("TTFT p90 (s, rolling)")
        ax[0].set_yscale("log")
        ax[0].set_title(f"{name} at load {max(cfg['loads'])} of the {PLANT['fill_workers']}+{PLANT['decode_workers']} "
                        f"worker cluster's capacity")
        ax[1].set_ylabel("ready buffer")
        ax[1].set_xlabel("time (s)")
        t = table[table["trace"] == name]
        for i, adm in enumerate(cfg["admissions"]):
            tt = t[t["admission"] == adm]
            ax[2].plot(tt["load"], tt["slo_attainment"], "o-", color=f"C{i}", label=f"{adm} SLO attainment")
        ax[2].set_xlabel("load (x bottleneck capacity)")
        ax[2].set_ylabel("SLO attainment")
        ax[2].set_ylim(-0.02, 1.02)
        for a in ax:
            a.grid(True, alpha=0.3)
            a.legend(fontsize=8)
        report.save_figure(fig, f"replay_{name.replace(':', '-')}.png",
                           f"{name}: rolling TTFT p90 and the ready buffer at the highest load, and SLO attainment "
                           "against load, for each admission controller.")
    lines = [f"Cluster: {PLANT['fill_workers']} fill + {PLANT['decode_workers']} decode workers, "
             f"{PLANT['model']} on 8x{PLANT['hardware']} each; SLO TTFT <= {cfg['cluster']['slo_ttft_s']} s and "
             f"TPOT <= {cfg['cluster']['slo_tpot_s']} s. Loads are multiples of the bottleneck capacity at each "
             "trace's own request shape." + (f" Absent traces (synthetic used instead): {', '.join(absent)}." if absent else ""),
             "", "| trace | load | x trace rate | admission | SLO | goodput tok/s | TTFT p99 s | TPOT p99 s | rejected | "
             "oscillating | req/wall-s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['trace']} | {r['load']:g} | {r['scale']:.1f} | {r['admission']} | {r['slo_attainment']:.3f} | "
                     f"{r['goodput_tokens_per_s']:.0f} | {r['ttft_p99'] if r['ttft_p99'] is not None else float('nan'):.2f} | "
                     f"{r['tpot_p99'] if r['tpot_p99'] is not None else float('nan'):.3f} | {r['rejected']} | "
                     f"{r['oscillating']} | {r['sim_requests_per_wall_s']:.0f} |")
    winners = []
    for (trace, load), g in table.groupby(["trace", "load"]):
        top = g["slo_attainment"].max()
        tied = g.loc[(top - g["slo_attainment"]) <= 1e-3, "admission"].tolist()
        winners.append(f"{trace} x{load:g}: {' = '.join(tied)} ({top:.3f})")
    lines += ["", "Highest SLO attainment per trace and load (ties within 0.001 joined by '='): "
              + "; ".join(winners) + ".", "", *_contrast_lines(table)]
    top = table.loc[table["load"] == table["load"].max()]
    for adm in cfg["admissions"]:
        t = top[top["admission"] == adm]
        if len(t):
            report.headline(f"{adm}: SLO at load {table['load'].max():g}", float(t["slo_attainment"].mean()),
                            note="mean over traces")
    metrics = {"rows": rows, "absent_traces": absent}
    return report.finish(metrics, lines)
