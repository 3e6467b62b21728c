"""Study `long-context`: the article's workload - 250k-1M-token contexts, midfill-heavy agentic
sessions - through the trace-replay and overload machinery.

The reference article centres 250k-1M-token contexts and midfills of 127k-500k cached tokens
(sections 1-3: "five hundred thousand of context may receive only a few hundred or thousand new
tokens"); the control studies elsewhere run 2k/512 or 12k/343 requests. Here the synthetic
long-context workload (:func:`tokenfactory.traces.long_context_workload`: a 1M-token window,
agentic sessions whose cached prefix grows turn by turn until compaction, calibrated to the shared
Claude Code sessions) is

(a) described - context and new-token quantiles, the cached share, sessions' context against
    their turns - next to the shapes the other studies use, with what each costs the service
    model (decode slots, TPOT at full batch, fill latency);
(b) replayed, closed-loop (a turn comes its think time after the previous one completes), through
    :func:`tokenfactory.replay.run_replay` on a disaggregated K3-like cluster on B300 at loads
    around its capacity under the admission controllers, as study ``trace-replay`` does for the
    public traces; TTFT of first calls (full prefills) and of midfills are reported apart.

Run: ``tokenfactory study long-context [--quick | --full] [--out DIR]``; ``config={"full": True}`` describes a
day and replays 15 minutes at five loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from tokenfactory.plant_models import RequestShape, ServiceModel
from tokenfactory.replay import build_replay, run_replay
from tokenfactory.studies.report import StudyReport
from tokenfactory.traces import generate_requests, long_context_workload
from tokenfactory.studies.study_config import StudyVariants, resolve_study_config
from tokenfactory.core.validation import ConfigError, check_number

__all__ = ["CONFIG", "DEFAULT_CONFIG", "run", "workload_statistics"]

DEFAULT_CONFIG: dict[str, Any] = {
    "plant": {"model": "k3-like", "hardware": "b300", "fill_workers": 2, "decode_workers": 2},
    "rate_rps": 6.0,                 # calls/s of the generated sessions (replays scale it to each load)
    "statistics_hours": 6.0,         # (a): hours of sessions described
    "replay_s": 300.0,               # (b): seconds of arrivals replayed (before scaling)
    "warm_start_s": 3600.0,          # sessions begin this long before the replay
    "loads": [0.7, 1.4, 2.5],        # sessions generated at this x the cluster's capacity (calls/s)
    "admissions": ["naive", "threshold", "smoothed"],
    "slo_ttft_s": 20.0,              # ASSUMPTION: a 1M-token first call cannot be filled faster
    "slo_tpot_s": 0.1,
    "seed": 7,
    "full": False,
}
QUICK: dict[str, Any] = {"statistics_hours": 2.0, "replay_s": 90.0, "warm_start_s": 1800.0, "loads": [2.5],
                         "admissions": ["naive", "smoothed"]}
FULL: dict[str, Any] = {"statistics_hours": 24.0, "replay_s": 900.0, "loads": [0.5, 1.0, 1.5, 2.5, 4.0]}
#: the other studies' request shapes, for comparison
CONTROL_SHAPES = {"2k/512 (feedback, reconfiguration)": RequestShape(2048, 512),
                  "12k/343 (Mooncake conversation)": RequestShape(12035, 343)}


def _check(cfg: dict[str, Any]) -> None:
    """The ranges of the resolved settings."""
    for k in ("rate_rps", "statistics_hours", "replay_s", "slo_ttft_s", "slo_tpot_s"):
        check_number(f"long-context.{k}", cfg[k], low=0.0, low_inclusive=False)
    check_number("long-context.warm_start_s", cfg["warm_start_s"], low=0.0)
    if not cfg["loads"] or not cfg["admissions"]:
        raise ConfigError("long-context.loads", "needs at least one load and one admission kind")
    for i, x in enumerate(cfg["loads"]):
        check_number(f"long-context.loads[{i}]", x, low=0.0, low_inclusive=False)


#: the study's settings: the defaults and its quick and full variants (:mod:`tokenfactory.studies.study_config`)
CONFIG = StudyVariants("long-context", DEFAULT_CONFIG, quick=QUICK, full=FULL, check=_check)


def workload_statistics(table: pd.DataFrame) -> dict[str, Any]:
    """What a request table of agentic sessions looks like: input and new-token quantiles, the
    cached share of input tokens, the share of calls that are midfills, turns per session.

    Parameters
    ----------
    table : DataFrame
        A request table with ``cached_tokens`` and ``session_id``.

    Returns
    -------
    dict
    """
    inp = table["input_tokens"]
    new = inp - table["cached_tokens"]
    q = (0.5, 0.9, 0.99)
    return {"requests": len(table), "sessions": int(table["session_id"].nunique()),
            "input_tokens": {f"p{int(x * 100)}": float(inp.quantile(x)) for x in q} | {"max": int(inp.max())},
            "new_tokens": {f"p{int(x * 100)}": float(new.quantile(x)) for x in q},
            "output_tokens_mean": float(table["output_tokens"].mean()),
            "cached_share": float(table["cached_tokens"].sum() / inp.sum()),
            "midfill_share": float((table["cached_tokens"] > 0).mean()),
            "share_over_250k": float((inp > 250_000).mean()), "share_over_500k": float((inp > 500_000).mean())}


def _cdf(ax, values, xlabel: str, color: str) -> None:
    """The empirical CDF of ``values`` on a log x axis (101 quantiles)."""
    q = np.linspace(0.0, 1.0, 101)
    ax.plot(np.quantile(values, q), q, color=color, drawstyle="steps-post")
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of calls")


def _shape_costs(setup, shapes: dict) -> pd.DataFrame:
    w = setup.service.fill_worker
    rows = []
    for label, shape in shapes.items():
        s = ServiceModel(w, w, shape)
        rows.append({"shape": label, "prompt_tokens": shape.prompt_tokens, "cached_tokens": shape.cached_tokens,
                     "output_tokens": shape.output_tokens, "decode_context": s.decode_context_tokens,
                     "decode_slots": s.decode_slots, "tpot_full_batch_s": s.decode_pass_s(s.decode_slots,
                                                                                          s.decode_context_tokens),
                     "fill_latency_s": s.fill_latency_s, "fill_rps_per_worker": s.fill_rate_rps,
                     "decode_rps_per_worker": s.decode_rate_rps()})
    return pd.DataFrame(rows)


def run(out_dir: str | Path, quick: bool = False, config: dict[str, Any] | None = None,
        full: bool = False) -> dict[str, Any]:
    """Run the study into ``out_dir`` (``quick``: the test variant; ``full``, or ``config={"full": True}``:
    the heavier grid; ``config``: overrides of :data:`DEFAULT_CONFIG`); returns its metrics."""
    cfg = resolve_study_config(CONFIG, config, quick=quick, full=full)
    report = StudyReport("long-context", Path(out_dir), cfg)
    workload = long_context_workload(mean_rate_rps=cfg["rate_rps"], seed=cfg["seed"])

    # (a) the workload ---------------------------------------------------------------------------
    day = generate_requests(workload, cfg["statistics_hours"] * 3600.0)
    stats = workload_statistics(day)
    replay_trace = generate_requests(workload, cfg["replay_s"], warm_start_s=cfg["warm_start_s"])
    setup = build_replay(replay_trace, cfg["plant"])
    shapes = {f"long-context ({setup.shape.prompt_tokens // 1000}k new + {setup.shape.cached_tokens // 1000}k cached"
              f"/{setup.shape.output_tokens})": setup.shape, **CONTROL_SHAPES}
    costs = _shape_costs(setup, shapes)
    report.save_table(costs, "shapes.csv", "What each study's nominal request costs one worker of this plant.")
    _workload_figure(report, cfg, day, stats)

    # (b) replay under admission control ----------------------------------------------------------
    rows, runs = _replays(cfg, setup)
    table = pd.DataFrame(rows)
    report.save_table(table, "replay.csv", "One row per (load, admission) replay.")
    _replay_figure(report, cfg, setup, runs)

    # summary ---------------------------------------------------------------------------------------
    lines = _summary_lines(cfg, stats, costs, setup, table)
    best = table.loc[table.groupby("load")["slo_attainment"].idxmax()]
    lines += ["", "Best SLO attainment per load: " + "; ".join(
        f"x{r.load:g}: {r.admission} ({r.slo_attainment:.3f})" for r in best.itertuples()) + ".",
              _first_vs_mid(table), _closed_loop(table, setup.capacity_rps), *_ties(table)]
    for r in best.itertuples():
        report.headline(f"best SLO attainment at load {r.load:g}", round(float(r.slo_attainment), 3),
                        note=f"{r.admission} admission")
    report.headline("calls above 250k tokens", round(stats["share_over_250k"], 3), note=f"max {stats['input_tokens']['max']}")
    return report.finish({"workload": stats, "shapes": costs.to_dict("records"), "rows": rows,
                          "capacity_rps": setup.capacity_rps, "bottleneck": setup.bottleneck}, lines)


def _workload_figure(report: StudyReport, cfg, day: pd.DataFrame, stats: dict) -> None:
    """(a)'s figure: the contexts, the five longest sessions, the new tokens per call."""
    fig = Figure(figsize=(13, 4), layout="constrained")
    ax = fig.subplots(1, 3)
    _cdf(ax[0], day["input_tokens"].to_numpy() / 1e3, "context of a call (k tokens)", "C0")
    for x in (250, 500, 1000):
        ax[0].axvline(x, color="k", lw=0.6, ls=":")
    ax[0].set_title(f"{stats['share_over_250k']:.0%} of calls above 250k, max {stats['input_tokens']['max'] / 1e3:.0f}k")
    longest = day.groupby("session_id")["input_tokens"].max().sort_values().index[-5:]
    for k, sid in enumerate(longest):
        s = day[day["session_id"] == sid].sort_values("turn")
        ax[1].plot(s["turn"], s["input_tokens"] / 1e3, color=f"C{k}", lw=1)
        ax[1].plot(s["turn"], s["cached_tokens"] / 1e3, color=f"C{k}", lw=0.6, ls="--")
    ax[1].set_xlabel("turn")
    ax[1].set_ylabel("k tokens (solid: context, dashed: cached prefix)")
    ax[1].set_title("the five longest sessions")
    _cdf(ax[2], np.maximum((day["input_tokens"] - day["cached_tokens"]).to_numpy(), 1),
         "new (uncached) tokens of a call", "C2")
    ax[2].set_title(f"cached share of input tokens {stats['cached_share']:.1%}")
    for a in ax:
        a.grid(True, alpha=0.3)
    report.save_figure(fig, "workload.png", f"The long-context workload over {cfg['statistics_hours']:g} h: contexts "
                       f"(median {stats['input_tokens']['p50'] / 1e3:.0f}k, 99th percentile "
                       f"{stats['input_tokens']['p99'] / 1e3:.0f}k), sessions growing turn by turn and compacting at "
                       f"the window, and new tokens per call (median {stats['new_tokens']['p50']:.0f}).")



def _replays(cfg, setup) -> tuple[list[dict], dict]:
    """(b): one row per (load, admission) replay of the closed sessions, and the runs by key."""
    rows, runs = [], {}
    cluster = {"slo_ttft_s": cfg["slo_ttft_s"], "slo_tpot_s": cfg["slo_tpot_s"], "drain_s": 120.0, "seed": cfg["seed"]}
    # closed sessions: a load is a population of sessions (generated at load x capacity calls/s,
    # thinned whole for the lower loads), not a faster clock - scaling a closed table compresses
    # its think times but adds no sessions
    top_load = max(cfg["loads"])
    top = generate_requests(long_context_workload(mean_rate_rps=top_load * setup.capacity_rps, seed=cfg["seed"]),
                            cfg["replay_s"], warm_start_s=cfg["warm_start_s"])
    sessions = top["session_id"].unique()
    draw = np.random.default_rng(cfg["seed"]).random(len(sessions))
    for load in cfg["loads"]:
        trace = top[top["session_id"].isin(set(sessions[draw < load / top_load]))].reset_index(drop=True)
        trace.attrs = dict(top.attrs)
        first = (trace["cached_tokens"] == 0).to_numpy()
        for adm in cfg["admissions"]:
            m, res = run_replay(trace, setup, adm, 1.0, cluster)
            rec = res.records
            arrived = rec["state"] != "not_arrived"
            ttft = rec["ttft_s"]
            rows.append({"load": load, "generated_rps": load * setup.capacity_rps, "admission": adm,
                         "offered_rps": float(arrived.sum() / max(float(rec.loc[arrived, "arrival_s"].max()), 1e-9)),
                         "bottleneck": setup.bottleneck,
                         **{k: m[k] for k in ("requests", "completed", "rejected", "in_flight_end", "slo_attainment",
                                              "goodput_tokens_per_s", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99",
                                              "preempted", "oscillating", "wall_seconds")},
                         "prefill_ttft_p50": float(ttft[first & arrived].median()),
                         "prefill_ttft_p99": float(ttft[first & arrived].quantile(0.99)),
                         "midfill_ttft_p50": float(ttft[~first & arrived].median()),
                         "midfill_ttft_p99": float(ttft[~first & arrived].quantile(0.99)),
                         "backlog_wait_p99": float((rec["admitted_s"] - rec["arrival_s"])[arrived].quantile(0.99)),
                         "fill_busy": m["utilization"].get("fill", {}).get("busy_fraction", 0.0),
                         "decode_busy": m["utilization"].get("decode", {}).get("busy_fraction", 0.0)})
            runs[(load, adm)] = res
    return rows, runs


def _replay_figure(report: StudyReport, cfg, setup, runs: dict) -> None:
    """(b)'s figure: backlog and active decodes at the highest load."""
    fig = Figure(figsize=(12, 6), layout="constrained")
    ax = fig.subplots(2, 1)
    top = max(cfg["loads"])
    for k, adm in enumerate(cfg["admissions"]):
        res = runs[(top, adm)]
        ax[0].plot(res.series["time_s"], res.series["backlog"], color=f"C{k}", label=adm, lw=0.9)
        ax[1].plot(res.series["time_s"], res.series["active_decodes"], color=f"C{k}", label=adm, lw=0.9)
    ax[0].set_ylabel("backlog (requests)")
    ax[1].set_ylabel("active decodes")
    ax[1].set_xlabel("time (s)")
    ax[0].set_title(f"long-context sessions at {top:g} x the cluster's capacity ({setup.bottleneck}-bound)")
    for a in ax:
        a.grid(True, alpha=0.3)
        a.legend(fontsize=8)
    report.save_figure(fig, "replay.png", "Backlog and active decodes at the highest load for each admission "
                       "controller (closed sessions: a rejected or late turn delays its session's next one).")



def _summary_lines(cfg, stats: dict, costs: pd.DataFrame, setup, table: pd.DataFrame) -> list[str]:
    """The summary's workload, shape-cost and replay tables (sentences from the run's numbers)."""
    p = cfg["plant"]
    lines = [f"Workload over {cfg['statistics_hours']:g} h at {cfg['rate_rps']:g} calls/s: {stats['requests']} calls in "
             f"{stats['sessions']} sessions; context median {stats['input_tokens']['p50'] / 1e3:.0f}k, 90th percentile "
             f"{stats['input_tokens']['p90'] / 1e3:.0f}k, 99th {stats['input_tokens']['p99'] / 1e3:.0f}k, max "
             f"{stats['input_tokens']['max'] / 1e3:.0f}k; {stats['share_over_250k']:.0%} of calls above 250k and "
             f"{stats['share_over_500k']:.0%} above 500k; {stats['midfill_share']:.0%} of calls are midfills and "
             f"{stats['cached_share']:.1%} of input tokens are cached (new tokens per call: median "
             f"{stats['new_tokens']['p50']:.0f}, 99th percentile {stats['new_tokens']['p99']:.0f}).", "",
             f"What each nominal request costs one {p['model']} worker on 8x{p['hardware']}:", "",
             "| shape | decode context | slots | TPOT at full batch s | fill latency s | fill req/s | decode req/s |",
             "|---|---|---|---|---|---|---|"]
    for r in costs.itertuples():
        lines.append(f"| {r.shape} | {r.decode_context} | {r.decode_slots} | {r.tpot_full_batch_s:.3f} | "
                     f"{r.fill_latency_s:.2f} | {r.fill_rps_per_worker:.1f} | {r.decode_rps_per_worker:.1f} |")
    lc, ctl = costs.iloc[0], costs.iloc[1]
    lines += ["", f"At the long-context shape a worker holds {lc.decode_slots} sequences against {ctl.decode_slots} at "
                  f"2k/512 ({ctl.decode_slots / max(lc.decode_slots, 1):.0f}x fewer), so the decode slots that the "
                  "control studies treat as plentiful are the scarce resource here.", "",
              f"Replays ({p['fill_workers']} fill + {p['decode_workers']} decode workers, capacity "
              f"{setup.capacity_rps:.1f} calls/s, {setup.bottleneck}-bound; SLO TTFT <= {cfg['slo_ttft_s']:g} s, "
              f"TPOT <= {cfg['slo_tpot_s']:g} s; {cfg['replay_s']:g} s of arrivals after a "
              f"{cfg['warm_start_s'] / 60:g}-minute warm start):", "",
              "| load | offered calls/s | admission | SLO | rejected | TTFT p99 s | first-call TTFT p50/p99 s | "
              "midfill TTFT p50/p99 s | TPOT p99 s | oscillating |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in table.itertuples():
        lines.append(f"| {r.load:g} | {r.offered_rps:.1f} | {r.admission} | {r.slo_attainment:.3f} | {r.rejected} | "
                     f"{r.ttft_p99:.1f} | "
                     f"{r.prefill_ttft_p50:.1f} / {r.prefill_ttft_p99:.1f} | {r.midfill_ttft_p50:.2f} / "
                     f"{r.midfill_ttft_p99:.1f} | {r.tpot_p99:.3f} | {r.oscillating} |")
    return lines


def _ties(table: pd.DataFrame) -> list[str]:
    """Admission kinds whose runs came out the same, and whether they ever held requests back."""
    out = []
    for load, g in table.groupby("load"):
        same = g.groupby(["slo_attainment", "ttft_p99", "rejected"])["admission"].apply(list)
        for kinds in same:
            if len(kinds) > 1:
                wait = g[g["admission"].isin(kinds)]["backlog_wait_p99"].max()
                others = g[~g["admission"].isin(kinds)]
                held = "; " + ", ".join(f"{r.admission} held requests back (backlog wait p99 {r.backlog_wait_p99:.1f} s, "
                                        f"SLO attainment {r.slo_attainment:.3f})" for r in others.itertuples()) \
                    if len(others) else ""
                out.append(f"At load {load:g}, {' and '.join(kinds)} admission give the same run "
                           + (f"(neither held a request back: backlog wait p99 {wait:.2f} s - the closed sessions never "
                              f"offered more than their admission cap){held}." if wait < 1.0 else
                              f"(backlog wait p99 {wait:.1f} s){held}."))
    return out


def _closed_loop(table: pd.DataFrame, capacity_rps: float) -> str:
    """What closing the sessions' loop does to the offered load at the highest load."""
    g = table[table["load"] == table["load"].max()]
    r = g.loc[g["offered_rps"].idxmax()]
    if r["offered_rps"] < 0.9 * r["generated_rps"]:
        return (f"Closed sessions throttle themselves: generated at {r['generated_rps']:.1f} calls/s (x{r['load']:g} "
                f"the nominal capacity), they offer at most {r['offered_rps']:.1f} calls/s, since a turn waits for the "
                f"previous one - {r['offered_rps'] / capacity_rps:.0%} of the nominal capacity ({capacity_rps:.1f} calls/s) "
                f"with the fill pool {r['fill_busy']:.0%} and the decode pool {r['decode_busy']:.0%} busy.")
    return (f"At the highest load the sessions offer {r['offered_rps']:.1f} calls/s, close to the "
            f"{r['generated_rps']:.1f} calls/s they were generated at: the cluster keeps up with the turns.")


def _first_vs_mid(table: pd.DataFrame) -> str:
    """First calls against midfills, at the lowest load under its best admission."""
    g = table[table["load"] == table["load"].min()]
    r = g.loc[g["slo_attainment"].idxmax()]
    ratio = r["prefill_ttft_p50"] / max(r["midfill_ttft_p50"], 1e-9)
    tail = ("the cached prefix is what keeps long-context turns interactive." if ratio >= 3 else
            "queueing, not the prefill of the context, sets both.")
    return (f"At load {r['load']:g} under {r['admission']} admission a session's first call (a full prefill of its "
            f"context) waits {r['prefill_ttft_p50']:.1f} s for its first token at the median against "
            f"{r['midfill_ttft_p50']:.2f} s for a midfill ({ratio:.0f}x): {tail}")
