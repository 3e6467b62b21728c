"""Study `overload` (article section 18): does useful output hold at capacity past overload, or
collapse? SLO-aware admission against today's admission policies, request classes, a batch
surge, and the gated decode batch cap.

(a) **Collapse curve.** Loads 0.6-2.0 x the cluster's bottleneck capacity *at the SLO* on the
    Mooncake conversation, Azure 2023 conversation and code traces and the agentic-coding
    sessions (closed sessions replayed with their think times), each through the request
    simulator under six admission policies: open, vLLM's KV watermark, Mooncake early rejection
    on the current and on the predicted decode load, the previous smoothed admission and the
    SLO-aware admission (:mod:`tokenfactory.controllers.slo_admission`). Goodput (output tokens/s
    of requests meeting their class's SLO), SLO attainment over all arrivals and over admitted
    requests, per class, TTFT/TPOT percentiles, rejections and deferrals with reasons, prefill
    spent on requests that then missed, oscillation verdicts.
(b) **Class surge.** Interactive load at 0.5 x capacity throughout; the batch class surges to
    2 x capacity for ten minutes: interactive SLO attainment and TTFT p99 with and without it.
(c) **Gated batch size.** The decode batch cap adjusted from the measured pass time every sample
    (ungated) against the same rule gated until its effect is observed, in the fluid plant and
    the request simulator: oscillation verdicts and margins before and after.
(d) **Margins** of the SLO-aware admission's loops over their envelope and the describing-function
    check of their saturations, and of its outer loop on outcomes with its separation from the
    fast gate.
(e) **Faults under overload** (issue 27): the load sweep's first trace at 1.3x and 2x with a fill
    worker crash, a decode worker crash and a KV-link slowdown inside the replayed window, every
    policy: conservation (completed + rejected + in flight = arrivals) and goodput per policy.

Capacity. With the fitted roofline a DeepSeek-V3 decode worker on 8xH200 runs its full KV batch
slower than a 0.1 s TPOT, so the capacity loads are multiples of is the model's bottleneck
capacity at the SLO of the simulated cluster (:meth:`tokenfactory.replay.ReplaySetup.capacity`:
the decode pool at the batch whose pass time meets the SLO for the trace's short requests; the
one place ``simulate --load`` takes it from too, which by default measures it); the KV capacity
the trace-replay study uses is reported next to it. Every policy runs with that batch cap (what an operator would
configure; the SLO-aware admission's gate then moves it with the live context). The Mooncake
trace's 3 s arrival slots are spread uniformly over the slot (the recording hides what is below).

Run: ``tokenfactory study overload [--quick | --full] [--out DIR]``; ``--full`` is the heavy grid
(six loads, whole traces, a ten-minute surge).
"""

from __future__ import annotations

import math
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from tokenfactory.core.classes import DEFAULT_CLASSES, INTERACTIVE
from tokenfactory.controllers import FLAT_OVERSHOOT
from tokenfactory.registry import RECOMMENDED_ADMISSION
from tokenfactory.replay import DEFAULT_PLANT, build_replay, infeasible, run_replay, service_capacity
from tokenfactory.studies.report import StudyReport, human, vllm_batch_flag
from tokenfactory.core.validation import ConfigError
from tokenfactory.studies.study_config import StudyVariants, resolve_study_config
from tokenfactory.studies.overload.common import (
    COLLAPSE_TRACES,
    POLICIES,
    TRACES,
    POLICY_LABELS,
    load_capacity,
    trace_for_load,
    fmt_number,
    load_named_trace,
    sweep_row,
    standin_labels,
    goodput_in_window,
    miss_causes,
)
from tokenfactory.studies.overload.faults import fault_lines, run_faults, fault_events
from tokenfactory.studies.overload.gate import (
    gate_figure,
    verdict_words,
    gate_before_after_des,
    gate_before_after_fluid,
)
from tokenfactory.studies.overload.margins import loop_margins
from tokenfactory.studies.overload.surge import run_surge, surge_trace

__all__ = ["CONFIG", "run", "POLICIES", "TRACES", "goodput_in_window", "surge_trace", "fault_events",
           "gate_before_after_fluid", "gate_before_after_des", "targets", "miss_causes"]


def _defaults(quick: bool, full: bool) -> dict[str, Any]:
    loads = [0.6, 0.9, 1.1, 1.3, 1.6, 2.0] if full else ([0.9, 1.3, 2.0] if quick else [0.6, 0.9, 1.3, 2.0])
    return {
        "traces": list(TRACES[:2]) if quick else list(TRACES), "loads": loads, "policies": list(POLICIES),
        # replayed seconds per run (None: the whole trace)
        "replay_s": None if full else (60.0 if quick else 120.0),
        "plant": dict(DEFAULT_PLANT),
        # a long drain: requests admitted near the end finish (Mooncake outputs run to 2,000 tokens)
        "cluster": {"slo_ttft_s": 2.0, "slo_tpot_s": 0.1, "drain_s": 200.0},
        "surge": {"trace": "azure-conv-2023", "interactive_load": 0.5, "batch_load": 2.0,
                  "before_s": 60.0 if quick else 120.0, "surge_s": 600.0 if full else (90.0 if quick else 180.0),
                  "after_s": 60.0 if quick else 120.0, "policies": ["open", "mooncake", RECOMMENDED_ADMISSION]},
        "gate": {"trace": "mooncake-conversation", "load": 1.6, "fluid_s": 300.0 if quick else 600.0,
                 "des_replay_s": 120.0 if quick else 240.0},
        # (e) faults inside the replayed window, at these shares of it: a fill crash, a decode crash
        # (back after restart_share of the window), a KV-link slowdown to link_factor x bandwidth
        "faults": {"loads": [1.3, 2.0], "fill_crash_at": 0.2, "decode_crash_at": 0.5, "restart_share": 0.1,
                   "link_at": 0.6, "link_share": 0.2, "link_factor": 0.5},
        "seed": 0,
    }


def _check(cfg: dict[str, Any]) -> None:
    """The resolved settings' policies are known ones."""
    for p in cfg["policies"]:
        if p not in POLICY_LABELS:
            raise ConfigError("overload.policies", f"unknown policy {p!r}; known: {', '.join(POLICY_LABELS)}")


def _variant(values: dict[str, Any]) -> dict[str, Any]:
    """The settings of a variant that differ from the default's."""
    default = _defaults(False, False)
    return {k: v for k, v in values.items() if v != default[k]}


#: the study's settings: the defaults and its quick and full variants (:mod:`tokenfactory.studies.study_config`)
CONFIG = StudyVariants("overload", {**_defaults(False, False), "full": False}, quick=_variant(_defaults(True, False)),
                       full=_variant(_defaults(False, True)), check=_check)



def _answers(report, table: pd.DataFrame, margins: dict, setups: dict, cfg: dict) -> None:
    """The report's opening answers from this run: the new loops' verdicts and margins, what limits
    capacity on each trace, and what the recommended admission changes at the highest load."""
    words = {"fill": "SLO-aware admission: fill-wait limit", "decode": "SLO-aware admission: decode-wait limit",
             "batch_gate": "decode batch cap (gated)"}
    for k, label in words.items():
        mg = margins[k]
        cyc = mg.get("limit_cycle") if k != "batch_gate" else mg.get("gated_cycle")
        report.loop(label, bool(cyc), gain_margin=mg["worst_gm"], phase_margin_deg=mg["worst_pm_deg"],
                    delay_margin_s=mg["worst_dm_s"],
                    detail=f"worst over the delay x gain envelope ({'meets' if mg['envelope_ok'] else 'MISSES'} the "
                           f"floors); describing function: {'a limit cycle' if cyc else 'no limit cycle'}")
    bg = margins["batch_gate"]
    if bg.get("ungated_stable") is not None:
        report.loop("decode batch cap, ungated (gain 1 every sample)", bool(bg["ungated_cycle"]) or not bg["ungated_stable"],
                    gain_margin=bg.get("ungated_gm"),
                    detail=("unstable by the Nyquist count" if not bg["ungated_stable"] else "stable")
                           + (f"; a cycle of period {bg['ungated_cycle']['period_s']:.1f} s predicted"
                              if bg["ungated_cycle"] else ""))
    for name, s in setups.items():
        cap, bottleneck, batch = s.slo_capacity(cfg["cluster"]["slo_tpot_s"])
        p = cfg["plant"]
        report.answer("capacity", f"{name}: {p['fill_workers']} fill + {p['decode_workers']} decode workers serve "
                      f"{human(cap)} req/s at the TPOT SLO of {cfg['cluster']['slo_tpot_s']:g} s; the {bottleneck} "
                      f"pool limits it, at a decode batch cap of {batch:.0f} per worker (vLLM "
                      f"{vllm_batch_flag(batch)}).")
    hi = table["load"].max()
    top = table[np.isclose(table["load"], hi)]
    inter = f"{INTERACTIVE}:slo_attainment"
    for trace, t in top.groupby("trace", sort=False):
        mine = t[t["policy"] == RECOMMENDED_ADMISSION]
        others = t[t["policy"] != RECOMMENDED_ADMISSION]
        if not len(mine) or not len(others):
            continue
        me = mine.iloc[0]
        best = others.loc[others["goodput_tokens_per_s"].idxmax()]
        worst = others.loc[others["goodput_tokens_per_s"].idxmin()]

        def said(r) -> str:
            return (f"{human(float(r['goodput_tokens_per_s']))} tokens/s, SLO attainment {float(r['slo_attainment']):.2f}"
                    f", interactive {float(r[inter]):.2f}")

        leads_goodput = me["goodput_tokens_per_s"] >= best["goodput_tokens_per_s"]
        leads_interactive = me[inter] >= others[inter].max()
        head = ("Admit with the SLO-aware gate" if leads_goodput else
                "To protect interactive traffic, admit with the SLO-aware gate" if leads_interactive else
                "The SLO-aware gate does not lead here")
        report.answer("change", f"{head}: on {trace} at {hi:g}x capacity it gives {said(me)}; the most goodput of "
                      f"the other policies is {POLICY_LABELS.get(best['policy'], best['policy'])}'s ({said(best)}), the least "
                      f"{POLICY_LABELS.get(worst['policy'], worst['policy'])}'s ({said(worst)}).")


# ------------------------------------------------------------------------------------------
# targets and the report


def targets(table: pd.DataFrame, surge_rows: list, margins: dict, new: str = RECOMMENDED_ADMISSION) -> list[dict]:
    """The issue's targets checked against the run's numbers, one row each with the evidence.

    Parameters
    ----------
    table : DataFrame
        The load-sweep rows.
    surge_rows : list of dict
        The surge rows.
    margins : dict
        From the margins step.
    new : str
        The policy under test.

    Returns
    -------
    list of dict
        ``target``, ``met`` (bool or None when the run has no data for it) and ``evidence``.
    """
    out = []
    mine = table[table["policy"] == new]

    def good(trace, load):
        r = mine[(mine["trace"] == trace) & (np.isclose(mine["load"], load))]
        return float(r["goodput_tokens_per_s"].iloc[0]) if len(r) else None

    ev, ok = [], []
    for trace in sorted(set(mine["trace"])):
        if not any(trace.startswith(t) or t in trace for t in COLLAPSE_TRACES):
            continue
        g9 = good(trace, 0.9)
        for hi in (1.3, 2.0):
            gh = good(trace, hi)
            if g9 is None or gh is None:
                continue
            ok.append(gh >= 0.9 * g9)
            ev.append(f"{trace}: {gh:.0f} at {hi:g}x vs {g9:.0f} at 0.9x ({gh / g9:.2f})" if g9 > 0 else
                      f"{trace}: {gh:.0f} at {hi:g}x, 0 at 0.9x")
    out.append({"target": "no collapse: goodput at 1.3x and 2.0x >= 0.9 x at 0.9x", "met": all(ok) if ok else None,
                "evidence": "; ".join(ev)})
    adm = mine.dropna(subset=["slo_attainment_admitted"])
    worst = adm.loc[adm["slo_attainment_admitted"].idxmin()] if len(adm) else None
    out.append({"target": "admitted requests meet their SLO: slo_attainment_admitted >= 0.99 at every load",
                "met": bool((adm["slo_attainment_admitted"] >= 0.99).all()) if len(adm) else None,
                "evidence": (f"lowest {worst['slo_attainment_admitted']:.3f} ({worst['trace']} at {worst['load']:g}x); "
                             f"{int((adm['slo_attainment_admitted'] >= 0.99).sum())} of {len(adm)} runs >= 0.99")
                if worst is not None else ""})
    losses, ties = [], []
    for (trace, load), g in table.groupby(["trace", "load"]):
        base = g[g["policy"] != new]
        me = g[g["policy"] == new]
        if not len(base) or not len(me):
            continue
        me = me.iloc[0]
        if load >= 1.0:
            best = base.loc[base["goodput_tokens_per_s"].idxmax()]
            if me["goodput_tokens_per_s"] < best["goodput_tokens_per_s"]:
                losses.append(f"{trace} {load:g}x: {me['goodput_tokens_per_s']:.0f} < {best['policy']} "
                              f"{best['goodput_tokens_per_s']:.0f}")
        else:
            best = base["slo_attainment"].max()
            if me["slo_attainment"] < best - 0.005:
                ties.append(f"{trace} {load:g}x: {me['slo_attainment']:.3f} vs best baseline {best:.3f}")
    out.append({"target": "goodput >= every baseline's at every load >= 1.0x", "met": not losses,
                "evidence": "; ".join(losses) if losses else "no baseline has more goodput at any load >= 1.0x"})
    out.append({"target": "at 0.6x and 0.9x, SLO attainment within 0.005 of the best baseline", "met": not ties,
                "evidence": "; ".join(ties) if ties else "within 0.005 everywhere"})
    srows = [r for r in surge_rows if r["policy"] == new]
    if len(srows) == 2:
        a = next(r for r in srows if r["surge"])
        b = next(r for r in srows if not r["surge"])
        grow = a["interactive_ttft_p99"] / b["interactive_ttft_p99"] - 1.0 if b["interactive_ttft_p99"] else math.nan
        out.append({"target": "class surge: interactive SLO attainment >= 0.99 and TTFT p99 within 10 % of no-surge",
                    "met": bool(a["interactive_slo_attainment"] >= 0.99 and grow <= 0.10),
                    "evidence": f"interactive SLO {a['interactive_slo_attainment']:.3f}, TTFT p99 {a['interactive_ttft_p99']:.3f} s "
                                f"vs {b['interactive_ttft_p99']:.3f} s ({grow:+.1%})"})
    w13 = mine[np.isclose(mine["load"], 1.3)]
    out.append({"target": "wasted prefill <= 2 % of prefill tokens at 1.3x",
                "met": bool((w13["wasted_prefill_fraction"] <= 0.02).all()) if len(w13) else None,
                "evidence": "; ".join(f"{r.trace}: {r.wasted_prefill_fraction:.1%}" for r in w13.itertuples())})
    osc = mine[mine["oscillating"]]
    out.append({"target": "no oscillation by the detectors at any load", "met": not len(osc),
                "evidence": "; ".join(f"{r.trace} {r.load:g}x: ready {r.ready_reason}, fill {r.fill_reason}"
                                      for r in osc.itertuples()) or f"none of {len(mine)} runs"})
    mg = [margins[k] for k in ("fill", "decode", "batch_gate")]
    cyc = [margins["fill"]["limit_cycle"], margins["decode"]["limit_cycle"], margins["batch_gate"]["gated_cycle"]]
    out.append({"target": "margins GM >= 2, PM >= 45 deg over the envelope; no describing-function limit cycle",
                "met": all(x["envelope_ok"] for x in mg) and not any(cyc),
                "evidence": "; ".join(f"{k}: worst GM {margins[k]['worst_gm']:.2f}, PM {margins[k]['worst_pm_deg']:.0f} deg, "
                                      f"DM {margins[k]['worst_dm_s']:.2f} s" for k in ("fill", "decode", "batch_gate"))
                            + ("; a limit cycle is predicted" if any(cyc) else "; no limit cycle predicted")})
    return out


def _collapse_figure(table: pd.DataFrame, policies: list, traces: list) -> Figure:
    n = len(traces)
    fig = Figure(figsize=(4.2 * n, 7.2), layout="constrained")
    ax = fig.subplots(2, n, squeeze=False)
    for j, trace in enumerate(traces):
        t = table[table["trace"] == trace]
        for i, p in enumerate(policies):
            tp = t[t["policy"] == p].sort_values("load")
            lw, ls = (2.2, "-") if p == RECOMMENDED_ADMISSION else (1.1, "--")
            ax[0, j].plot(tp["load"], tp["goodput_tokens_per_s"], marker="o", ms=3, lw=lw, ls=ls, color=f"C{i}",
                          label=POLICY_LABELS.get(p, p))
            ax[1, j].plot(tp["load"], tp["slo_attainment"], marker="o", ms=3, lw=lw, ls=ls, color=f"C{i}")
        ax[0, j].set_title("\n".join(textwrap.wrap(trace, 42)), fontsize=9)
        ax[1, j].set_xlabel("offered load (x capacity at the SLO)")
        ax[1, j].set_ylim(-0.02, 1.02)
        for a in ax[:, j]:
            a.grid(True, alpha=0.3)
            a.axvline(1.0, color="0.6", lw=0.8)
    ax[0, 0].set_ylabel("goodput (SLO-meeting output tokens/s)")
    ax[1, 0].set_ylabel("SLO attainment (all arrivals)")
    ax[0, 0].legend(fontsize=7)
    return fig


def _cdf_figure(cdfs: dict, traces: list, policies: list, load: float) -> Figure:
    n = len(traces)
    fig = Figure(figsize=(4.2 * n, 6.5), layout="constrained")
    ax = fig.subplots(2, n, squeeze=False)
    for j, trace in enumerate(traces):
        for i, p in enumerate(policies):
            d = cdfs.get((trace, p))
            if d is None:
                continue
            for k, key in enumerate(("ttft_s", "tpot_s")):
                x = np.sort(d[key][np.isfinite(d[key])])
                if len(x):
                    ax[k, j].plot(x, np.arange(1, len(x) + 1) / len(x), color=f"C{i}",
                                  lw=2.0 if p == RECOMMENDED_ADMISSION else 1.0, label=POLICY_LABELS.get(p, p))
        ax[0, j].set_title("\n".join(textwrap.wrap(f"{trace} at {load:g}x", 42)), fontsize=9)
        ax[0, j].set_xscale("log")
        ax[1, j].set_xscale("log")
        ax[0, j].set_xlabel("TTFT (s)")
        ax[1, j].set_xlabel("TPOT (s)")
        ax[0, j].axvline(2.0, color="r", ls=":", lw=1)
        ax[1, j].axvline(0.1, color="r", ls=":", lw=1)
        for a in ax[:, j]:
            a.grid(True, alpha=0.3)
    ax[0, 0].set_ylabel("share of completed requests")
    ax[1, 0].set_ylabel("share of completed requests")
    ax[0, 0].legend(fontsize=7)
    return fig


def run(out_dir: str | Path, quick: bool = False, config: dict[str, Any] | None = None,
        full: bool = False) -> dict[str, Any]:
    """Run the study (see the module notes) and write its report.

    Parameters
    ----------
    out_dir : str or Path
        Output folder.
    quick : bool
        Two traces, three loads, one-minute replays (what CI runs).
    config : dict, optional
        Overrides: ``full`` (as the argument), ``traces``, ``loads``, ``policies``, ``replay_s``,
        ``plant``, ``cluster``, ``surge``, ``gate``, ``seed``.
    full : bool
        The heavy grid (``tokenfactory study overload --full``): six loads, whole traces, a
        ten-minute surge.

    Returns
    -------
    dict
        The metrics written to ``metrics.json``.
    """
    cfg = resolve_study_config(CONFIG, config, quick=quick, full=full)
    report = StudyReport("overload", Path(out_dir), {**cfg, "quick": quick})
    classes = DEFAULT_CLASSES
    cluster = {**cfg["cluster"], "classes": classes}
    sweep = _sweep(cfg, quick, cluster, classes)
    table = _save_sweep(report, sweep, cfg)
    surge = run_surge(cfg, quick, report)
    fluid, des = _gate_section(cfg, full, report)
    # (d) margins of the new loops
    margin_setup = sweep.setups.get(COLLAPSE_TRACES[0]) or next(iter(sweep.setups.values()))
    margins = loop_margins(margin_setup, cfg, report)
    faults = _faults_section(cfg, quick, sweep, report)
    tg = targets(table, surge["rows"], margins)
    metrics = {"rows": sweep.rows, "absent_traces": sweep.absent, "surge": surge["rows"], "margins": margins,
               "targets": tg, "faults": faults,
               "gate": {k: {v: {x: y for x, y in d.items() if x != "series"} for v, d in g.items()}
                        for k, g in (("fluid", fluid), ("des", des))},
               "sweep_wall_seconds": sweep.wall_s}
    lines = _summary_lines(cfg, table, surge, fluid, des, margins, tg, sweep.absent, sweep.setups)
    lines += ["", "## Faults under overload", "", *fault_lines(faults)]
    _headlines(report, table, sweep.labels, margins, sweep.setups, cfg, tg)
    return report.finish(metrics, lines)


@dataclass
class _Sweep:
    """What the collapse sweep (a) produced: one row per trace, load and policy, and what later sections read."""

    rows: list
    cdfs: dict            # (trace, policy) -> completed requests' TTFT and TPOT at ``cdf_load``
    absent: list          # traces replaced by a synthetic stand-in
    setups: dict          # trace label -> its replay setup
    labels: list          # trace labels in run order (stand-ins labelled with what they stand in for)
    cdf_load: float
    wall_s: float


def _sweep(cfg: dict, quick: bool, cluster: dict, classes) -> _Sweep:
    """(a) every trace at every load under every admission policy."""
    rows, cdfs, absent, setups = [], {}, [], {}
    t0 = time.perf_counter()
    cdf_load = 1.3 if 1.3 in cfg["loads"] else max(cfg["loads"])
    # an absent trace is replaced by the synthetic workload; the absent traces of one kind share one
    # stand-in, run once and labelled with every trace it stands in for (never under a real name)
    standins = standin_labels(cfg["traces"])
    labels = []
    for name in cfg["traces"]:
        tr, synthetic = load_named_trace(name, 1800.0 if not quick else 600.0, cfg["seed"])
        if synthetic:
            absent.append(name)
            name = standins[name]
            if name in labels:
                continue
            tr.attrs["name"] = name
        labels.append(name)
        setup = build_replay(tr, cfg["plant"])
        setups[name] = setup
        cap = load_capacity(setup, cluster)
        for load in cfg["loads"]:
            part = trace_for_load(tr, setup, load, cfg["replay_s"], cluster)
            closed = bool(part.attrs.get("per_session_clock"))
            for policy in cfg["policies"]:
                m, res = run_replay(part, setup, policy, cluster=cluster, load=load, batch_cap="static",
                                    duration_s=(cfg["replay_s"] or 1800.0) if closed else None)
                arr = res.records["arrival_s"]
                span = float(arr.max() - arr.min()) if arr.notna().any() else 1.0
                rows.append(sweep_row(name, load, policy, m, res, setup, cap, classes, span, synthetic))
                if np.isclose(load, cdf_load):
                    done = res.records[res.records["state"] == "completed"]
                    cdfs[(name, policy)] = {"ttft_s": done["ttft_s"].to_numpy(), "tpot_s": done["tpot_s"].to_numpy()}
    return _Sweep(rows, cdfs, absent, setups, labels, cdf_load, time.perf_counter() - t0)


def _save_sweep(report: StudyReport, sweep: _Sweep, cfg: dict) -> pd.DataFrame:
    """The sweep's table, collapse curve and latency CDFs."""
    table = pd.DataFrame(sweep.rows)
    report.save_table(table, "overload_table.csv", "One row per trace, load and admission policy: goodput, SLO "
                      "attainment (all arrivals, admitted, per class), latency percentiles, rejections and deferrals by "
                      "reason, wasted prefill, oscillation verdicts.")
    report.save_figure(_collapse_figure(table, cfg["policies"], sweep.labels), "goodput_vs_load.png",
                       "Goodput and SLO attainment against offered load for every admission policy (the collapse "
                       "curve). " + _collapse_sentence(table))
    report.save_figure(_cdf_figure(sweep.cdfs, sweep.labels, cfg["policies"], sweep.cdf_load), "latency_cdfs.png",
                       f"TTFT and TPOT of completed requests at {sweep.cdf_load:g}x capacity (red: the interactive SLO).")
    return table


def _gate_section(cfg: dict, full: bool, report: StudyReport) -> tuple[dict, dict]:
    """(c) the decode batch gate before/after, in the fluid plant and the request simulator."""
    gcfg = cfg["gate"]
    gtr, _ = load_named_trace(gcfg["trace"], 1800.0, cfg["seed"])
    gsetup = build_replay(gtr, cfg["plant"])
    fluid = gate_before_after_fluid(gsetup.plant.params, int(gsetup.plant.fill_workers), int(gsetup.plant.decode_workers),
                                    cfg["cluster"]["slo_tpot_s"], gcfg["fluid_s"])
    des = gate_before_after_des(gtr, gsetup, gcfg["load"], {k: v for k, v in cfg["cluster"].items()},
                                gcfg["des_replay_s"] if not full else None, cfg["cluster"]["slo_tpot_s"])
    gate_caption = (f"Decode batch cap adjusted from the measured pass time: ungated (every sample, gain 1) the cap "
                    f"{verdict_words(fluid['ungated']['verdict'])} in the fluid plant and "
                    f"{verdict_words(des['ungated']['verdict'])} in the request simulator; gated it "
                    f"{verdict_words(fluid['gated']['verdict'])} in the fluid plant and "
                    f"{verdict_words(des['gated']['verdict'])} in the request simulator.")
    report.save_figure(gate_figure(fluid, des), "gate_before_after.png", gate_caption)
    return fluid, des


def _faults_section(cfg: dict, quick: bool, sweep: _Sweep, report: StudyReport) -> dict:
    """(e) faults under overload, on the sweep's first trace."""
    fname = sweep.labels[0]   # the sweep's first trace, or the stand-in run for it
    ftr, fsyn = load_named_trace(cfg["traces"][0], 1800.0 if not quick else 600.0, cfg["seed"])
    if fsyn:
        ftr.attrs["name"] = fname
    faults = run_faults(cfg, ftr, sweep.setups[fname], fname, fsyn)
    report.save_table(pd.DataFrame(faults["rows"]), "faults_table.csv", "Faults under overload: every policy at the "
                      "fault loads with a fill and a decode worker crash and a KV-link slowdown in the window.")
    return faults


def _headlines(report: StudyReport, table: pd.DataFrame, labels: list, margins, setups: dict, cfg: dict,
               tg: list) -> None:
    """The headline numbers: SLO-aware goodput per trace at its top load, the answers, the targets met."""
    mine = table[table["policy"] == RECOMMENDED_ADMISSION]
    for trace in labels:
        t = mine[mine["trace"] == trace]
        if len(t):
            top = t.loc[t["load"].idxmax()]
            report.headline(f"SLO-aware goodput at {top['load']:g}x, {trace}", float(top["goodput_tokens_per_s"]),
                            "tokens/s", note="output tokens/s of requests meeting their SLO")
    _answers(report, table, margins, setups, cfg)
    report.headline("targets met", f"{sum(1 for t in tg if t['met'])} of {len(tg)}",
                    note="see the targets table in the summary")


def _collapse_sentence(table: pd.DataFrame) -> str:
    out = []
    for trace, t in table.groupby("trace"):
        if t["load"].max() <= 1.0:
            continue
        at1 = t[np.isclose(t["load"], max(l for l in t["load"] if l <= 1.0))] if (t["load"] <= 1.0).any() else None
        hi = t[np.isclose(t["load"], t["load"].max())]
        if at1 is None or not len(at1):
            continue
        worst = hi.loc[hi["goodput_tokens_per_s"].idxmin()]
        base = at1[at1["policy"] == worst["policy"]]["goodput_tokens_per_s"].iloc[0]
        me_hi = hi[hi["policy"] == RECOMMENDED_ADMISSION]["goodput_tokens_per_s"]
        me_lo = at1[at1["policy"] == RECOMMENDED_ADMISSION]["goodput_tokens_per_s"]
        s = (f"{trace}: from {at1['load'].iloc[0]:g}x to {hi['load'].iloc[0]:g}x {POLICY_LABELS[worst['policy']]} goes from "
             f"{base:.0f} to {worst['goodput_tokens_per_s']:.0f} tokens/s")
        if len(me_hi) and len(me_lo):
            s += f", SLO-aware from {me_lo.iloc[0]:.0f} to {me_hi.iloc[0]:.0f}"
        out.append(s)
    return "; ".join(out) + "." if out else ""


def _summary_lines(cfg, table, surge, fluid, des, margins, tg, absent, setups) -> list[str]:
    c = cfg["cluster"]
    p = cfg["plant"]
    replayed = "whole traces" if cfg["replay_s"] is None else f"about {cfg['replay_s']:.0f} s per run"
    lines = [f"Cluster: {p['fill_workers']} fill + {p['decode_workers']} decode workers, {p['model']} on 8x{p['hardware']}; "
             f"classes: interactive (TTFT <= {c['slo_ttft_s']} s, TPOT <= {c['slo_tpot_s']} s, priority 0) and batch "
             "(TTFT <= 30 s, TPOT <= 0.2 s, deferrable 20 s); traces without classes get 80 % interactive, 20 % batch. "
             f"Replayed {replayed}."
             + (f" Absent traces, replaced by the synthetic workload (rows labelled `synthetic stand-in for ...`; "
                f"`tokenfactory traces fetch all` gets the real ones): {', '.join(absent)}." if absent else ""), ""]
    lines += ["## Capacity at the SLO", "",
              "Each pool's capacity is its workers over the mean of each request's own service cost as the request "
              "simulator computes it (fill: the request's chunked-prefill share of full steps, its chunks' attention "
              "over their context included; decode: its passes at the batch cap and the token-weighted context), not "
              "the cost of the mean request. Infeasible: the trace's requests whose own service alone on an empty "
              "cluster already misses their class's SLO (chunked fill > TTFT SLO, or transfer and batch-1 decode "
              "passes > TPOT SLO); they miss under every policy, and the SLO-aware gate rejects them at arrival "
              "(`infeasible_slo`).", "",
              "| trace | capacity at SLO (req/s) | bottleneck | batch cap | fill capacity (req/s) | at the mean request "
              "(req/s, fill / decode) | KV capacity (req/s) | infeasible: TTFT / TPOT / any |",
              "|---|---|---|---|---|---|---|---|"]
    for name, s in setups.items():
        cap = load_capacity(s, {**c, "classes": DEFAULT_CLASSES})
        own = service_capacity(s.costs, s.params, int(s.plant.fill_workers), int(s.plant.decode_workers), cap[2])
        svc = s.service
        mean_dec = s.plant.decode_workers * cap[2] / (svc.shape.output_tokens * svc.decode_pass_s(cap[2], svc.decode_context_tokens))
        bad = s.infeasible_share(DEFAULT_CLASSES)
        lines.append(f"| {name} | {cap[0]:.2f} | {cap[1]} | {cap[2]:.0f} | {own['fill']:.2f} | "
                     f"{s.plant.fill_capacity:.2f} / {mean_dec:.2f} | {s.capacity_rps:.2f} | "
                     f"{bad['ttft']:.1%} / {bad['tpot']:.1%} / {bad['any']:.1%} |")
    lines += ["", "## Targets", "", "| target | met | evidence |", "|---|---|---|"]
    for t in tg:
        lines.append(f"| {t['target']} | {'yes' if t['met'] else ('n/a' if t['met'] is None else 'no')} | {t['evidence']} |")
    lines += ["", "## Goodput vs load (SLO-meeting output tokens/s)", ""]
    piv = table.pivot_table(index=["trace", "policy"], columns="load", values="goodput_tokens_per_s")
    lines += ["| trace | policy | " + " | ".join(f"{l:g}x" for l in piv.columns) + " |",
              "|---|---|" + "---|" * len(piv.columns)]
    for (trace, policy), r in piv.iterrows():
        lines.append(f"| {trace} | {POLICY_LABELS.get(policy, policy)} | " + " | ".join(f"{v:.0f}" for v in r.to_numpy()) + " |")
    lines += ["", "## SLO attainment: all arrivals / admitted", ""]
    a = table.pivot_table(index=["trace", "policy"], columns="load", values="slo_attainment")
    b = table.assign(slo_attainment_admitted=table["slo_attainment_admitted"].astype(float)).pivot_table(
        index=["trace", "policy"], columns="load", values="slo_attainment_admitted", dropna=False).reindex(
        index=a.index, columns=a.columns)
    lines += ["| trace | policy | " + " | ".join(f"{l:g}x" for l in a.columns) + " |", "|---|---|" + "---|" * len(a.columns)]
    for idx in a.index:
        lines.append(f"| {idx[0]} | {POLICY_LABELS.get(idx[1], idx[1])} | " + " | ".join(
            f"{a.loc[idx, l]:.3f} / {fmt_number(b.loc[idx, l])}" for l in a.columns) + " |")
    lines += ["", "## Why requests miss", "",
              "Shares of the arrivals (`miss_causes`): infeasible requests (own service alone misses), and "
              "completed requests that missed on TTFT or TPOT, intrinsic (own service alone misses) or through "
              "queueing (waits, shared fill steps and decode batches).", "",
              "| trace | load | policy | SLO attainment | infeasible | TTFT miss: intrinsic / queueing | "
              "TPOT miss: intrinsic / queueing |", "|---|---|---|---|---|---|---|"]
    for _, r in table[table["policy"].isin(["open", RECOMMENDED_ADMISSION])].sort_values(
            ["trace", "load", "policy"]).iterrows():
        lines.append(f"| {r['trace']} | {r['load']:g}x | {POLICY_LABELS.get(r['policy'], r['policy'])} | "
                     f"{r['slo_attainment']:.3f} | {r['miss:infeasible']:.3f} | {r['miss:ttft_intrinsic']:.3f} / "
                     f"{r['miss:ttft_queueing']:.3f} | {r['miss:tpot_intrinsic']:.3f} / {r['miss:tpot_queueing']:.3f} |")
    lines += ["", "## The class surge", "", *surge["lines"], "",
              "## Gated batch size (section 18: large-batch recovery)", "",
              f"Fluid plant: ungated the cap moves between {fluid['ungated']['cap_min']:.0f} and {fluid['ungated']['cap_max']:.0f} "
              f"and {verdict_words(fluid['ungated']['verdict'])}; gated between {fluid['gated']['cap_min']:.0f} and "
              f"{fluid['gated']['cap_max']:.0f}, {verdict_words(fluid['gated']['verdict'])}. Request simulator: ungated "
              f"{des['ungated']['cap_min']:.0f}-{des['ungated']['cap_max']:.0f}, {verdict_words(des['ungated']['verdict'])}, "
              f"TPOT p99 {fmt_number(des['ungated']['tpot_p99'])} s; gated {des['gated']['cap_min']:.0f}-{des['gated']['cap_max']:.0f}, "
              f"{verdict_words(des['gated']['verdict'])}, TPOT p99 {fmt_number(des['gated']['tpot_p99'])} s.",
              "", "## Margins of the new loops", "",
              "| loop | envelope ok | worst GM | worst PM (deg) | worst DM (s) | nominal GM / PM / DM | DF limit cycle |",
              "|---|---|---|---|---|---|---|"]
    for k in ("fill", "decode", "batch_gate", "outer", "outer_start"):
        mg = margins[k]
        cyc = mg.get("limit_cycle") if k != "batch_gate" else mg.get("gated_cycle")
        lines.append(f"| {k} | {mg['envelope_ok']} | {mg['worst_gm']:.2f} | {mg['worst_pm_deg']:.0f} | {mg['worst_dm_s']:.2f} | "
                     f"{mg['nominal_gm']:.2f} / {mg['nominal_pm_deg']:.0f} / {mg['nominal_dm_s']:.2f} | "
                     f"{'none' if not cyc else 'period %.1f s' % cyc['period_s']} |")
    bg = margins["batch_gate"]
    og = margins["outer"]
    lines.append("")
    lines.append(f"The outer loop on outcomes (margin, every {og['sample_period_s']:g} s; ki {og['ki']:.4f}/s, theta "
                 f"{og['theta_s']:.0f} s, window {og['window_s']:.0f} s) crosses over at {og['outer_crossover_rad_s']:.4f} "
                 f"rad/s, {og['separation_ratio']:.0f} x below the fast gate's closed-loop bandwidth "
                 f"({og['inner_bandwidth_rad_s']:.2f} rad/s); the fast gate in series costs it "
                 f"{og['pm_loss_deg']:.1f} deg of phase margin and it stays "
                 f"{'stable' if og['with_fast_gate_stable'] else 'UNSTABLE'}.")
    os_ = margins["outer_start"]
    lines.append(f"Its start is gain-scheduled: until the first window over the setpoint, a window without a miss "
                 f"integrates at ki {os_['ki']:.4f}/s (SIMC at the flat region's gain {os_['gain']:g}, at most "
                 f"{FLAT_OVERSHOOT:g} of margin per delay), certified at that gain: worst GM {os_['worst_gm']:.2f}, PM "
                 f"{os_['worst_pm_deg']:.0f} deg over the envelope, {os_['separation_ratio']:.0f} x below the fast "
                 f"gate and {'stable' if os_['with_fast_gate_stable'] else 'UNSTABLE'} with it in series.")
    lines.append(f"The ungated batch rule (gain 1 every sample) is {'stable' if bg['ungated_stable'] else 'unstable'} by the "
                 "Nyquist count" + (f"; the describing function of the cap's saturation predicts a cycle of period "
                                    f"{bg['ungated_cycle']['period_s']:.1f} s" if bg["ungated_cycle"] else "") + ".")
    return lines
