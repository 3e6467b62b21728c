"""Study `aggregation` (reference article section 19): aggregated against disaggregated serving on
the same GPUs and the same traces.

Section 19 argues both ways. For aggregation: one worker takes a turn through prefill, midfill and
decode, so there is no scheduling gap at the hand-off, no KV moved from fill to decode, and one
copy of the wide expert set serves both; the orchestrator decides once and steps back. Against
it: the one worker must be strong at compute (fill) and at memory bandwidth (decode), and "always
strands some compute or memory transfer" whichever phase it runs; a disaggregated cluster can
spend on what each pool actually uses - if its prefill:decode ratio matches the work.

Here a cluster of ``workers`` nodes (8 GPUs each) serves each trace either as that many aggregated
workers (:mod:`tokenfactory.plant_models.des.aggregated`: chunked prefill sharing the decode
passes, the decodes' TPOT growing with the chunk) or as disaggregated fill and decode pools at
several P:D ratios with the KV link between them, at loads that are multiples of the balanced
disaggregated capacity at the trace's request shape (fluid model: N f d / (f + d) for per-worker
fill and decode rates f, d). For each (trace, configuration) the study finds the largest load at
which ``attainment_target`` of the requests meet the TTFT and TPOT SLOs (goodput at SLO, as
DistServe defines it) and reports TTFT/TPOT p99 and the compute and bandwidth each pool leaves
stranded (:mod:`tokenfactory.plant_models.des.work`). Traces: Azure conversation (short prompts),
Mooncake conversation (12k-token prompts with prefix reuse), and the long-context agentic
synthetic (:func:`tokenfactory.traces.long_context_workload`, closed sessions, 100k-1M contexts)
on a K3-like model on B300; a missing trace is replaced by the synthetic workload.

The fluid and pool models have no aggregated variant: the request simulator is where the
interference of a chunk with the decodes of the same pass can be seen.

Run: ``tokenfactory study aggregation [--quick | --full] [--out DIR]``; ``config={"full": True}`` runs
the larger grid (five loads, 60-second-longer replays).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from tokenfactory.plant_models import ClusterConfig, RequestPlant, UnboundedPrefixCache
from tokenfactory.replay import build_replay
from tokenfactory.studies.report import StudyReport
from tokenfactory.traces import (
    SyntheticWorkload,
    generate_requests,
    load_trace,
    long_context_workload,
    scale_trace,
    trace_available,
)
from tokenfactory.studies.study_config import StudyVariants, resolve_study_config
from tokenfactory.core.validation import ConfigError, check_int, check_number

__all__ = ["CONFIG", "DEFAULT_CONFIG", "run", "goodput_at_slo", "cluster_configs"]

#: plants, SLOs and load grids (x the reference capacity) per workload. DeepSeek-V3 on 8 x H200
#: with the reconfiguration study's SLOs (TPOT 0.155 s: the fitted roofline runs a full KV batch at
#: 0.116 s). Mooncake's prompts reach 40k tokens at the 95th percentile and 85k at the 99th, and
#: one sequence's attention runs on one replica (TP1 DP attention), so a 32k prompt alone takes
#: 8 s: its TTFT SLO is 10 s (the reconfiguration study's long-prompt ASSUMPTION) and its grid
#: starts low. The long-context turns (100k-1M contexts) run on the K3-like model on 8 x B300 with
#: a 20 s TTFT SLO - a 1M-token first call cannot be filled faster - and 0.1 s TPOT (ASSUMPTIONS).
WORKLOADS: dict[str, dict[str, Any]] = {
    "azure-conv-2023": {"plant": {"model": "deepseek-v3", "hardware": "h200"}, "slo_ttft_s": 2.0, "slo_tpot_s": 0.155,
                        "loads": [0.4, 0.7, 1.0, 1.3]},
    "mooncake-conversation": {"plant": {"model": "deepseek-v3", "hardware": "h200"}, "slo_ttft_s": 10.0,
                              "slo_tpot_s": 0.155, "loads": [0.15, 0.3, 0.45, 0.6], "replay_scale": 4.0},
    "long-context": {"plant": {"model": "k3-like", "hardware": "b300"}, "slo_ttft_s": 20.0, "slo_tpot_s": 0.1,
                     "loads": [0.4, 0.7, 1.0, 1.3]},
    "synthetic": {"plant": {"model": "deepseek-v3", "hardware": "h200"}, "slo_ttft_s": 2.0, "slo_tpot_s": 0.155,
                  "loads": [0.4, 0.7, 1.0, 1.3]},
}

DEFAULT_CONFIG: dict[str, Any] = {
    "traces": ["azure-conv-2023", "mooncake-conversation", "long-context"],
    "workers": 4,
    "fill_shares": [1, 2, 3],          # disaggregated P:(N-P) ratios by fill workers
    "loads": None,                     # x the balanced disaggregated capacity (None: each workload's grid)
    "replay_s": 60.0,                  # simulated seconds of arrivals per run
    "attainment_target": 0.9,
    "tie_fraction": 0.05,              # goodputs within this share of the reference capacity tie
    "relaxed_tpot": 1.5,               # the verdict again with the TPOT SLO this much looser
    "warm_start_s": 3600.0,            # long-context sessions begin this long before the replay
    "trace_offset_s": 1800.0,          # a trace's replay window starts here (its prefix cache primed before)
    "seed": 3,
    "full": False,
}
QUICK: dict[str, Any] = {"traces": ["azure-conv-2023", "long-context"], "fill_shares": [2, 3], "loads": [0.6, 1.2],
                         "replay_s": 30.0}
FULL: dict[str, Any] = {"replay_s": 120.0}


def _check(cfg: dict[str, Any]) -> None:
    """The ranges of the resolved settings."""
    for i, t in enumerate(cfg["traces"]):
        if t not in WORKLOADS:
            raise ConfigError(f"aggregation.traces[{i}]", f"{t!r} is not one of {', '.join(WORKLOADS)}")
    check_int("aggregation.workers", cfg["workers"], low=2)
    for i, p in enumerate(cfg["fill_shares"]):
        check_int(f"aggregation.fill_shares[{i}]", p, low=1, high=cfg["workers"] - 1)
    if cfg["loads"] is not None:
        if len(cfg["loads"]) < 2 or any(b <= a for a, b in zip(cfg["loads"], cfg["loads"][1:])):
            raise ConfigError("aggregation.loads", "needs >= 2 increasing loads")
        for i, x in enumerate(cfg["loads"]):
            check_number(f"aggregation.loads[{i}]", x, low=0.0, low_inclusive=False)
    check_number("aggregation.replay_s", cfg["replay_s"], low=5.0)
    check_number("aggregation.warm_start_s", cfg["warm_start_s"], low=0.0)
    check_number("aggregation.trace_offset_s", cfg["trace_offset_s"], low=0.0)
    check_number("aggregation.attainment_target", cfg["attainment_target"], low=0.0, high=1.0, low_inclusive=False)
    check_number("aggregation.tie_fraction", cfg["tie_fraction"], low=0.0, high=1.0)
    check_number("aggregation.relaxed_tpot", cfg["relaxed_tpot"], low=1.0)


#: the study's settings: the defaults and its quick and full variants (:mod:`tokenfactory.studies.study_config`)
CONFIG = StudyVariants("aggregation", DEFAULT_CONFIG, quick=QUICK, full=FULL, check=_check)


def cluster_configs(workers: int, fill_shares) -> list[tuple[str, int, int, int]]:
    """The configurations compared on ``workers`` nodes: ``(label, fill, decode, aggregated)``.

    Parameters
    ----------
    workers : int
        Nodes in the cluster.
    fill_shares : sequence of int
        Fill workers of each disaggregated split.

    Returns
    -------
    list of tuple
        Aggregated first, then ``P:D`` splits.
    """
    return [("aggregated", 0, 0, workers)] + [(f"{p}:{workers - p}", p, workers - p, 0) for p in fill_shares]


def goodput_at_slo(loads, attainment, target: float) -> tuple[float, str]:
    """The largest load at which ``attainment`` stays at or above ``target``, interpolated on
    the first crossing below it.

    Parameters
    ----------
    loads : sequence of float
        Increasing loads.
    attainment : sequence of float
        SLO attainment at each load.
    target : float
        The attainment required.

    Returns
    -------
    tuple
        ``(load, bound)``: ``bound`` is ``"interpolated"``, ``"below grid"`` (missed at the
        lowest load: 0 returned) or ``"at least"`` (met at the highest load).
    """
    x, y = np.asarray(loads, dtype=float), np.asarray(attainment, dtype=float)
    if y[0] < target:
        return 0.0, "below grid"
    for k in range(1, len(x)):
        if y[k] < target:
            return float(x[k - 1] + (y[k - 1] - target) / (y[k - 1] - y[k]) * (x[k] - x[k - 1])), "interpolated"
    return float(x[-1]), "at least"


def _long_context(rate: float, cfg: dict) -> pd.DataFrame:
    """``replay_s`` of long-context sessions at ``rate`` calls/s, opening with the sessions of the
    ``warm_start_s`` before in progress (sessions last hours: think times are heavy-tailed)."""
    return generate_requests(long_context_workload(mean_rate_rps=rate, seed=cfg["seed"]), cfg["replay_s"],
                             warm_start_s=cfg["warm_start_s"])


def _thin_sessions(table: pd.DataFrame, keep: float, seed: int) -> pd.DataFrame:
    """Whole sessions kept with probability ``keep`` (a lower load of the same workload)."""
    if keep >= 1.0:
        return table
    ids = table["session_id"].unique()
    kept = set(ids[np.random.default_rng(seed).random(len(ids)) < keep])
    out = table[table["session_id"].isin(kept)].reset_index(drop=True)
    out.attrs = dict(table.attrs)
    return out


def _base_trace(name: str, cfg: dict) -> tuple[str, pd.DataFrame]:
    if name == "long-context":
        return name, _long_context(1.0, cfg)
    if trace_available(name):
        return name, load_trace(name)
    return "synthetic", generate_requests(SyntheticWorkload(mean_rate_rps=5.0, daily_amplitude=0.0,
                                                            daily_second_harmonic=0.0, weekend_factor=1.0,
                                                            seed=cfg["seed"]), 3600.0)


def _replay(name: str, base: pd.DataFrame, rate: float, cfg: dict, top: pd.DataFrame | None,
            block_tokens: int) -> tuple[pd.DataFrame, UnboundedPrefixCache | None]:
    """``replay_s`` seconds of arrivals at ``rate`` requests/s, and the prefix cache it starts
    with: the long-context sessions generated at the top load and thinned to this one (the
    trace's own cached prefixes); a trace's window from ``trace_offset_s`` replayed faster, with an
    unbounded prefix cache that has seen every block before the window (a replay that started
    cold would find a fraction of the trace's prefix reuse)."""
    if name == "long-context":
        return _thin_sessions(top, rate / top.attrs["rate_rps"], cfg["seed"]), None
    trace_rate = len(base) / max(float(base["arrival_s"].max()), 1e-9)
    scale = rate / trace_rate
    t0 = min(cfg["trace_offset_s"], 0.5 * float(base["arrival_s"].max()))
    t = base["arrival_s"]
    length = cfg["replay_s"] * WORKLOADS[name].get("replay_scale", 1.0)
    window = base[(t >= t0) & (t < t0 + length * scale)].copy()
    window["arrival_s"] -= t0
    window.attrs = dict(base.attrs)
    cache = None
    if "hash_ids" in base:
        cache = UnboundedPrefixCache(block_tokens)
        for h, n in zip(base.loc[t < t0, "hash_ids"], base.loc[t < t0, "input_tokens"]):
            cache.lookup(h, int(n), 0)
    return scale_trace(window.reset_index(drop=True), scale), cache


def _pool_util(util: dict, pools_workers: dict) -> dict:
    """Compute and bandwidth utilisation of the cluster: pools weighted by their workers."""
    n = sum(pools_workers.values())
    cu = sum(util[p].get("compute_utilization", 0.0) * k for p, k in pools_workers.items() if p in util) / n
    bu = sum(util[p].get("bandwidth_utilization", 0.0) * k for p, k in pools_workers.items() if p in util) / n
    return {"compute_utilization": cu, "bandwidth_utilization": bu, "stranded_compute": 1.0 - cu,
            "stranded_bandwidth": 1.0 - bu}


def _winner(best: pd.DataFrame, column: str, tie_fraction: float) -> tuple[str, pd.Series, pd.Series]:
    """("aggregated", "tie" or the best P:D split, the aggregated row, the best split's row) by ``column``."""
    agg = best[best["config"] == "aggregated"].iloc[0]
    dis = best[best["config"] != "aggregated"].sort_values(column, ascending=False).iloc[0]
    if abs(agg[column] - dis[column]) <= tie_fraction:
        return "tie", agg, dis
    return ("aggregated" if agg[column] > dis[column] else dis["config"]), agg, dis


def _verdict_lines(trace: str, best: pd.DataFrame, rows: pd.DataFrame, cfg: dict) -> tuple[str, dict]:
    """The verdict for one workload and why, from the run's numbers."""
    winner, agg, dis = _winner(best, "max_load", cfg["tie_fraction"])
    tie = winner == "tie"
    if tie:
        head = (f"**{trace}: a tie** - aggregated workers sustain {agg['max_load']:.2f} and the best disaggregated "
                f"split ({dis['config']}) {dis['max_load']:.2f} x the reference capacity at "
                f"{cfg['attainment_target']:.0%} SLO attainment")
    elif winner == "aggregated":
        head = (f"**{trace}: aggregation wins** - {agg['max_load']:.2f} against {dis['max_load']:.2f} x the reference "
                f"capacity for the best disaggregated split ({dis['config']})")
    else:
        head = (f"**{trace}: disaggregation ({dis['config']}) wins** - {dis['max_load']:.2f} against "
                f"{agg['max_load']:.2f} x the reference capacity for aggregated workers")
    # why: at the highest load where both were run, the tails and the stranded capacity
    r = rows[rows["trace"] == trace]
    top = r["load"].max()
    a = r[(r["config"] == "aggregated") & (r["load"] == top)].iloc[0]
    d = r[(r["config"] == dis["config"]) & (r["load"] == top)].iloc[0]
    why = [f"at load {top:g} aggregated workers miss {_misses(a)}, {dis['config']} misses {_misses(d)} "
           f"(TPOT p99 {a['tpot_p99']:.3f} s against {d['tpot_p99']:.3f} s, TTFT p99 {a['ttft_p99']:.2f} s against "
           f"{d['ttft_p99']:.2f} s)",
           f"stranded compute {a['stranded_compute']:.0%} against {d['stranded_compute']:.0%}, stranded bandwidth "
           f"{a['stranded_bandwidth']:.0%} against {d['stranded_bandwidth']:.0%}"]
    worst = best[best["config"] != "aggregated"].sort_values("max_load").iloc[0]
    if worst["max_load"] < dis["max_load"] - cfg["tie_fraction"]:
        lowest = r["load"].min()
        why.append(f"the ratio matters: {worst['config']} " + (
            f"misses the target already at load {lowest:g}" if worst["bound"] == "below grid"
            else f"sustains only {worst['max_load']:.2f}"))
    relaxed, ragg, rdis = _winner(best, "max_load_relaxed_tpot", cfg["tie_fraction"])
    why.append(f"with the TPOT SLO {cfg['relaxed_tpot']:g}x looser the verdict is "
               + (f"{relaxed} too" if relaxed == winner else f"{relaxed}")
               + f" (aggregated {ragg['max_load_relaxed_tpot']:.2f}, {rdis['config']} {rdis['max_load_relaxed_tpot']:.2f})")
    if d["mean_kv_transfer_s"] > 0:
        why.append(f"disaggregation moves each KV blob in {d['mean_kv_transfer_s'] * 1e3:.0f} ms on average")
    return head + "; " + "; ".join(why) + ".", {"winner": winner, "aggregated_max_load": float(agg["max_load"]),
                                                   "best_disaggregated": dis["config"],
                                                   "best_disaggregated_max_load": float(dis["max_load"]),
                                                   "winner_relaxed_tpot": relaxed}


def _misses(r) -> str:
    """What a run's SLO misses were, in words."""
    t, p, u = r["ttft_miss_share"], r["tpot_miss_share"], r["unfinished_share"]
    if t < 0.005 and p < 0.005 and u < 0.005:
        return "almost nothing"
    main = "TTFT (first tokens late: fill-bound)" if t >= p else "TPOT (decodes too slow)"
    out = f"{max(t, p):.0%} on {main} and {min(t, p):.0%} on the other"
    return out + (f", and {u:.0%} were still decoding when the run ended" if u >= 0.005 else "")


def _run_grid(cfg, configs: list) -> tuple[list[dict], list[str], dict[str, dict]]:
    """Every (trace, configuration, load) run in the request simulator: one row each, the traces
    replaced by the synthetic workload, and each trace's reference capacity."""
    rows, substituted = [], []
    refs = {}
    for requested in cfg["traces"]:
        name, base = _base_trace(requested, cfg)
        if name != requested:
            substituted.append(requested)
            if name in refs:
                continue
        w = WORKLOADS[name]
        one = build_replay(base, {**w["plant"], "fill_workers": 1, "decode_workers": 1})
        f, d = one.plant.fill_capacity, one.plant.decode_capacity
        ref = cfg["workers"] * f * d / (f + d)
        refs[name] = {"reference_rps": ref, "fill_rps_per_worker": f, "decode_rps_per_worker": d,
                      "shape": {"prompt_tokens": one.shape.prompt_tokens, "cached_tokens": one.shape.cached_tokens,
                                "output_tokens": one.shape.output_tokens}}
        loads = cfg["loads"] or w["loads"]
        top = None
        if name == "long-context":
            top = _long_context(max(loads) * ref, cfg)
            top.attrs["rate_rps"] = max(loads) * ref
        for load in loads:
            replay, primed = _replay(name, base, load * ref, cfg, top, one.params.block_tokens)
            for label, nf, nd, na in configs:
                cl = ClusterConfig(fill_workers=nf, decode_workers=nd, aggregated_workers=na, progress=False,
                                   slo_ttft_s=w["slo_ttft_s"], slo_tpot_s=w["slo_tpot_s"], drain_s=60.0,
                                   seed=cfg["seed"])
                cache = None
                if primed is not None:  # each run starts from the same primed cache
                    cache = UnboundedPrefixCache(primed.block_tokens)
                    cache.blocks = set(primed.blocks)
                res = RequestPlant(one.params, cl, prefix_cache=cache).run(replay)
                m = res.metrics
                pools = {"aggregated": na} if na else {"fill": nf, "decode": nd}
                rec = res.records
                rec = rec[rec["state"] != "not_arrived"]
                transfer = (rec["kv_ready_s"] - rec["fill_end_s"]).dropna()
                n_arr = max(len(rec), 1)
                rows.append({"trace": name, "config": label, "fill_workers": nf, "decode_workers": nd,
                             "aggregated_workers": na, "load": load, "offered_rps": load * ref,
                             **{k: m[k] for k in ("requests", "completed", "rejected", "in_flight_end", "slo_attainment",
                                                  "goodput_tokens_per_s", "ttft_p50", "ttft_p99", "tpot_p50",
                                                  "tpot_p99", "preempted")},
                             **_pool_util(m["utilization"], pools),
                             **{f"{p}_busy": v["busy_fraction"] for p, v in m["utilization"].items()},
                             "mean_kv_transfer_s": float(transfer.mean()) if len(transfer) else 0.0,
                             # why requests miss: no first token in time, or too slow a decode
                             "ttft_miss_share": float((~(rec["ttft_s"] <= w["slo_ttft_s"])).sum() / n_arr),
                             # ... or a first token in time and too slow a decode (the shares with the
                             # unfinished and the attainment partition the arrived requests)
                             "tpot_miss_share": float(((rec["state"] == "completed") & (rec["ttft_s"] <= w["slo_ttft_s"])
                                                       & ~(rec["tpot_s"] <= w["slo_tpot_s"])).sum() / n_arr),
                             # first token in time but not finished when the run ended (a miss too)
                             "unfinished_share": float(((rec["state"] != "completed")
                                                        & (rec["ttft_s"] <= w["slo_ttft_s"])).sum() / n_arr),
                             "slo_attainment_relaxed": float(((rec["state"] == "completed")
                                                              & (rec["ttft_s"] <= w["slo_ttft_s"])
                                                              & (rec["tpot_s"] <= cfg["relaxed_tpot"] * w["slo_tpot_s"])
                                                              ).sum() / n_arr),
                             "wall_seconds": m["wall_seconds"]})
    return rows, substituted, refs


def _figures(cfg, report: StudyReport, configs: list, table: pd.DataFrame, refs: dict, verdicts: dict) -> None:
    """Attainment and tails against load per configuration, and the stranded resources."""
    fig = Figure(figsize=(13, 3.6 * len(refs)), layout="constrained")
    axes = np.atleast_2d(fig.subplots(len(refs), 3))
    for row, trace in zip(axes, refs):
        t = table[table["trace"] == trace]
        for k, c in enumerate(configs):
            g = t[t["config"] == c[0]].sort_values("load")
            style = dict(color=f"C{k}", marker="o", lw=2.2 if c[0] == "aggregated" else 1.2, label=c[0])
            row[0].plot(g["load"], g["slo_attainment"], **style)
            row[1].plot(g["load"], g["tpot_p99"], **style)
            row[2].plot(g["load"], g["ttft_p99"], **style)
        row[0].axhline(cfg["attainment_target"], color="k", lw=0.8, ls=":")
        row[1].axhline(WORKLOADS[trace]["slo_tpot_s"], color="k", lw=0.8, ls=":")
        row[2].axhline(WORKLOADS[trace]["slo_ttft_s"], color="k", lw=0.8, ls=":")
        row[2].set_yscale("log")
        row[0].set_ylabel(f"{trace}\nSLO attainment")
        row[1].set_ylabel("TPOT p99 (s)")
        row[2].set_ylabel("TTFT p99 (s)")
        for a in row:
            a.set_xlabel("load (x reference capacity)")
            a.grid(True, alpha=0.3)
        row[0].legend(fontsize=8)
    report.save_figure(fig, "aggregation.png", "SLO attainment, TPOT p99 and TTFT p99 against load for aggregated "
                       "workers and each fill:decode split (dotted: the target and the SLOs). " + " ".join(
                           f"{t}: {v['winner']}." for t, v in verdicts.items()))

    fig = Figure(figsize=(11, 3.8), layout="constrained")
    ax = fig.subplots(1, 2)
    top = table[table.groupby("trace")["load"].transform("max") == table["load"]]
    labels = [f"{r.trace}\n{r.config} x{r.load:g}" for r in top.itertuples()]
    xs = np.arange(len(top))
    ax[0].bar(xs, top["stranded_compute"], color=["C0" if c == "aggregated" else "C1" for c in top["config"]])
    ax[1].bar(xs, top["stranded_bandwidth"], color=["C0" if c == "aggregated" else "C1" for c in top["config"]])
    for a, what in zip(ax, ("compute", "HBM bandwidth")):
        a.set_xticks(xs, labels, rotation=90, fontsize=7)
        a.set_ylabel(f"stranded {what} (share of attainable)")
        a.set_ylim(0, 1.02)
        a.grid(True, axis="y", alpha=0.3)
    report.save_figure(fig, "stranded.png", "Compute and HBM bandwidth left unused at each workload's highest load "
                       "(blue: aggregated workers), against the roofline's attainable rates.")


def run(out_dir: str | Path, quick: bool = False, config: dict[str, Any] | None = None,
        full: bool = False) -> dict[str, Any]:
    """Run the study into ``out_dir`` (``quick``: the test variant; ``full``, or ``config={"full": True}``:
    the heavier grid; ``config``: overrides of :data:`DEFAULT_CONFIG`); returns its metrics."""
    cfg = resolve_study_config(CONFIG, config, quick=quick, full=full)
    report = StudyReport("aggregation", Path(out_dir), cfg)
    configs = cluster_configs(cfg["workers"], cfg["fill_shares"])
    rows, substituted, refs = _run_grid(cfg, configs)
    table = pd.DataFrame(rows)
    for c in ("ttft_p99", "tpot_p99", "ttft_p50", "tpot_p50"):
        table[c] = table[c].astype(float)
    report.save_table(table, "aggregation_runs.csv", "One row per (trace, configuration, load) run.")
    best_rows = []
    for (trace, label), g in table.groupby(["trace", "config"], sort=False):
        g = g.sort_values("load")
        x, bound = goodput_at_slo(g["load"], g["slo_attainment"], cfg["attainment_target"])
        xr, bound_r = goodput_at_slo(g["load"], g["slo_attainment_relaxed"], cfg["attainment_target"])
        best_rows.append({"trace": trace, "config": label, "max_load": x, "bound": bound,
                          "max_load_relaxed_tpot": xr, "bound_relaxed_tpot": bound_r,
                          "max_rps": x * refs[trace]["reference_rps"],
                          "goodput_tokens_per_s_at_max": float(np.interp(x, g["load"], g["goodput_tokens_per_s"]))})
    best = pd.DataFrame(best_rows)
    report.save_table(best, "goodput_at_slo.csv", f"Largest load (x reference capacity) with >= "
                      f"{cfg['attainment_target']:.0%} SLO attainment per trace and configuration.")

    lines = [f"Cluster: {cfg['workers']} nodes of 8 GPUs, either {cfg['workers']} aggregated workers or disaggregated "
             f"fill:decode pools ({', '.join(c[0] for c in configs[1:])}). Loads are multiples of the balanced "
             "disaggregated capacity at each trace's mean request (fluid model); goodput at SLO is the largest load "
             f"with >= {cfg['attainment_target']:.0%} of the requests within both SLOs."
             + (f" Absent traces replaced by the synthetic workload: {', '.join(substituted)}." if substituted else ""),
             "", "| workload | plant | reference req/s | " + " | ".join(c[0] for c in configs)
             + f" | verdict | verdict, TPOT SLO x{cfg['relaxed_tpot']:g} |",
             "|---|---|---|" + "---|" * len(configs) + "---|---|"]
    verdicts, why_lines = {}, []
    for trace in best["trace"].unique():
        b = best[best["trace"] == trace]
        line, v = _verdict_lines(trace, b, table, cfg)
        verdicts[trace] = v
        why_lines.append(line)
        cells = []
        for c in configs:
            r = b[b["config"] == c[0]].iloc[0]
            cells.append(("<" if r["bound"] == "below grid" else ">=" if r["bound"] == "at least" else "")
                         + f"{r['max_load']:.2f}")
        p = WORKLOADS[trace]["plant"]
        lines.append(f"| {trace} | {p['model']} @ 8x{p['hardware']} | {refs[trace]['reference_rps']:.1f} | "
                     + " | ".join(cells) + f" | {v['winner']} | {v['winner_relaxed_tpot']} |")
        report.headline(f"{trace}: aggregation verdict", v["winner"],
                        note=f"aggregated {v['aggregated_max_load']:.2f} vs {v['best_disaggregated']} "
                             f"{v['best_disaggregated_max_load']:.2f} x reference capacity at SLO")
    lines += ["", "Cells: goodput at SLO as a multiple of the reference capacity ('<x' missed at the lowest load, "
              "'>=x' met at the highest).", "", *[f"- {s}" for s in why_lines], "",
              _article_line(verdicts, table)]

    _figures(cfg, report, configs, table, refs, verdicts)
    return report.finish({"rows": rows, "goodput_at_slo": best_rows, "verdicts": verdicts, "references": refs,
                          "substituted_traces": substituted, "absent_traces": substituted}, lines)


def _article_line(verdicts: dict, table: pd.DataFrame) -> str:
    """Where the article's section-19 argument holds, from the verdicts."""
    agg = [t for t, v in verdicts.items() if v["winner"] == "aggregated"]
    dis = [t for t, v in verdicts.items() if v["winner"] not in ("aggregated", "tie")]
    ties = [t for t, v in verdicts.items() if v["winner"] == "tie"]
    parts = []
    if agg:
        parts.append(f"aggregation wins on {', '.join(agg)}: no hand-off, no KV transfer and no fill:decode ratio to "
                     "get wrong outweigh the chunks' interference with the decodes")
    if dis:
        why = []
        for t in dis:  # what aggregated workers missed on at the trace's highest load
            r = table[(table["trace"] == t) & (table["config"] == "aggregated")]
            r = r[r["load"] == r["load"].max()].iloc[0]
            why.append(f"{t} mostly on " + ("TPOT (the chunks' interference with the decodes)"
                                             if r["tpot_miss_share"] > r["ttft_miss_share"] else
                                             "TTFT (too little fill capacity beside the decodes)"))
        parts.append(f"disaggregation wins on {', '.join(dis)}; aggregated workers miss the SLOs on " + ", ".join(why))
    if ties:
        parts.append(f"{', '.join(ties)} is a tie")
    flipped = [t for t, v in verdicts.items() if v["winner_relaxed_tpot"] != v["winner"]]
    for t in flipped:
        v = verdicts[t]
        parts.append(f"on {t} the verdict turns from {v['winner']} to {v['winner_relaxed_tpot']} when the TPOT SLO is "
                     "loosened, so there the decodes' TPOT budget decides it")
    return ("Against the article's section 19: " + "; ".join(parts) + ".") if parts else ""
