"""Overload study, section (b): the class surge - interactive load at half capacity throughout, the
batch class surging to twice capacity, interactive SLO attainment with and without it.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from tokenfactory.core.classes import BATCH, DEFAULT_CLASSES, INTERACTIVE
from tokenfactory.registry import RECOMMENDED_ADMISSION
from tokenfactory.replay import build_replay, run_replay
from tokenfactory.studies.report import StudyReport
from tokenfactory.traces import scale_trace
from tokenfactory.core.validation import ConfigError
from tokenfactory.studies.overload.common import POLICY_LABELS, load_capacity, load_named_trace, slo_met, trace_window, goodput_in_window

__all__ = ["surge_trace"]


# ------------------------------------------------------------------------------------------
# (b) the class surge


def surge_trace(tr: pd.DataFrame, rate_interactive: float, rate_batch: float, before_s: float, surge_s: float,
                after_s: float, surge: bool = True, seed: int = 0) -> pd.DataFrame:
    """Interactive requests at ``rate_interactive`` over before + surge + after, and (``surge``)
    batch requests at ``rate_batch`` during the surge: both drawn from the trace's own requests
    (the interactive stream from its start, the batch stream from its middle), replayed at the
    rate by speeding the trace up.

    Parameters
    ----------
    tr : DataFrame
        A request table on one clock.
    rate_interactive, rate_batch : float
        Requests/s of each class.
    before_s, surge_s, after_s : float
        The three phases (s).
    surge : bool
        Add the batch surge (default True; False gives the no-surge reference).
    seed : int
        Unused draws are seeded from it (default 0).

    Returns
    -------
    DataFrame
        The request table, ``request_class`` set, sorted by arrival.
    """
    span = float(tr["arrival_s"].max())
    rate = len(tr) / max(span, 1e-9)
    total = before_s + surge_s + after_s
    inter = scale_trace(tr, rate_interactive / rate)
    inter = trace_window(inter, 0.0, total)
    inter["request_class"] = INTERACTIVE
    parts = [inter]
    if surge:
        b = scale_trace(tr, rate_batch / rate)
        mid = float(b["arrival_s"].max()) / 2.0
        b = trace_window(b, mid, mid + surge_s)
        b["arrival_s"] += before_s
        b["request_class"] = BATCH
        if "session_id" in b:
            b["session_id"] = np.where(b["session_id"].astype(str) != "", b["session_id"].astype(str) + "#batch", "")
        parts.append(b)
    out = pd.concat(parts, ignore_index=True).sort_values("arrival_s", kind="stable").reset_index(drop=True)
    out.attrs = {k: v for k, v in tr.attrs.items() if k not in ("class_mix", "class_seed")}
    return out


def run_surge(cfg: dict, quick: bool, report: StudyReport) -> dict:
    sc = cfg["surge"]
    classes = DEFAULT_CLASSES
    tr, synthetic = load_named_trace(sc["trace"], 3600.0, cfg["seed"])
    if tr.attrs.get("per_session_clock"):
        raise ConfigError("overload.surge.trace", "the surge needs a trace on one clock")
    setup = build_replay(tr, cfg["plant"])
    cluster = {**cfg["cluster"], "classes": classes}
    cap = load_capacity(setup, cluster)
    runs, rows = {}, []
    for surge in (False, True):
        st = surge_trace(tr, sc["interactive_load"] * cap[0], sc["batch_load"] * cap[0], sc["before_s"], sc["surge_s"],
                         sc["after_s"], surge=surge, seed=cfg["seed"])
        for policy in sc["policies"]:
            m, res = run_replay(st, setup, policy, 1.0, cluster, batch_cap="static")
            rec = res.records
            ci = m["classes"].get(INTERACTIVE, {})
            inter = rec[rec["request_class"] == INTERACTIVE]
            during = inter[(inter["arrival_s"] >= sc["before_s"]) & (inter["arrival_s"] < sc["before_s"] + sc["surge_s"])]
            met = slo_met(during, classes) if len(during) else np.zeros(0, bool)
            rows.append({"surge": surge, "policy": policy,
                         "trace": tr.attrs["name"] if synthetic else sc["trace"], "synthetic": synthetic,
                         "interactive_requests": ci.get("requests", 0),
                         "interactive_slo_attainment": ci.get("slo_attainment"),
                         "interactive_slo_attainment_admitted": ci.get("slo_attainment_admitted"),
                         "interactive_ttft_p99": ci.get("ttft_p99"), "interactive_tpot_p99": ci.get("tpot_p99"),
                         "interactive_slo_during_surge": float(met.mean()) if len(met) else None,
                         "interactive_ttft_p99_during_surge": float(np.nanpercentile(during["ttft_s"], 99))
                         if during["ttft_s"].notna().any() else None,
                         "batch_requests": m["classes"].get(BATCH, {}).get("requests", 0),
                         "batch_slo_attainment": m["classes"].get(BATCH, {}).get("slo_attainment"),
                         "batch_rejected": m["classes"].get(BATCH, {}).get("rejected", 0),
                         "batch_deferred": m["classes"].get(BATCH, {}).get("deferred", 0),
                         "goodput_tokens_per_s": goodput_in_window(rec, slo_met(rec, classes),
                                                                   float(st["arrival_s"].max())),
                         "oscillating": m["oscillating"], "capacity_rps": cap[0]})
            runs[(surge, policy)] = res
    table = pd.DataFrame(rows)
    report.save_table(table, "surge_table.csv", "Class surge: interactive and batch outcomes with and without the "
                      "batch surge, per policy.")
    fig = Figure(figsize=(11, 8), layout="constrained")
    ax = fig.subplots(3, 1, sharex=True)
    for i, policy in enumerate(sc["policies"]):
        res = runs[(True, policy)]
        s = res.series
        ax[0].plot(s["time_s"], s["active_decodes_batch"], color=f"C{i}", lw=1.0, ls="--",
                   label=f"{POLICY_LABELS[policy]}: batch decoding")
        ax[0].plot(s["time_s"], s["active_decodes_interactive"], color=f"C{i}", lw=1.0,
                   label=f"{POLICY_LABELS[policy]}: interactive decoding")
        rec = res.records
        q = rec[(rec["request_class"] == INTERACTIVE) & rec["ttft_s"].notna()].sort_values("arrival_s")
        roll = q.set_index("arrival_s")["ttft_s"].rolling(100, min_periods=10).quantile(0.99)
        ax[1].plot(roll.index, roll.to_numpy(), color=f"C{i}", lw=1.2, label=POLICY_LABELS[policy])
        tq = q.set_index("arrival_s")["tpot_s"].dropna().rolling(100, min_periods=10).quantile(0.99)
        ax[2].plot(tq.index, tq.to_numpy(), color=f"C{i}", lw=1.2, label=POLICY_LABELS[policy])
    ref = runs[(False, RECOMMENDED_ADMISSION)] if (False, RECOMMENDED_ADMISSION) in runs else None
    if ref is not None:
        q = ref.records[(ref.records["request_class"] == INTERACTIVE) & ref.records["ttft_s"].notna()]
        ax[1].axhline(float(np.percentile(q["ttft_s"], 99)), color="k", ls=":", lw=1,
                      label="SLO-aware without surge: TTFT p99")
    for a in ax:
        a.axvspan(sc["before_s"], sc["before_s"] + sc["surge_s"], color="0.9", zorder=0)
        a.grid(True, alpha=0.3)
        a.legend(fontsize=7, ncol=2)
    ax[0].set_ylabel("sequences decoding")
    ax[1].set_ylabel("interactive TTFT p99 (s, rolling)")
    ax[2].set_ylabel("interactive TPOT p99 (s, rolling)")
    ax[2].axhline(cfg["cluster"]["slo_tpot_s"], color="r", ls=":", lw=1)
    ax[2].set_xlabel("time (s); shaded: batch surge")
    lines = surge_lines(table, sc)
    report.save_figure(fig, "surge.png", "Batch surge to {:g} x capacity for {:.0f} s with interactive load at {:g} x: "
                       "decoding sequences by class, interactive TTFT and TPOT p99 (rolling). ".format(
                           sc["batch_load"], sc["surge_s"], sc["interactive_load"]) + " ".join(lines[:1]))
    return {"rows": rows, "lines": lines}


def surge_lines(table: pd.DataFrame, sc: dict) -> list[str]:
    out = []
    for policy in sc["policies"]:
        a = table[(table["policy"] == policy) & table["surge"]]
        b = table[(table["policy"] == policy) & ~table["surge"]]
        if not len(a) or not len(b):
            continue
        a, b = a.iloc[0], b.iloc[0]
        ta, tb = a["interactive_ttft_p99"], b["interactive_ttft_p99"]
        growth = (ta / tb - 1.0) if ta and tb else math.nan
        out.append(f"{POLICY_LABELS[policy]}: interactive SLO attainment {a['interactive_slo_attainment']:.3f} with the surge "
                   f"({b['interactive_slo_attainment']:.3f} without), TTFT p99 {ta:.2f} s vs {tb:.2f} s "
                   f"({growth:+.0%}); batch SLO attainment {a['batch_slo_attainment'] if a['batch_slo_attainment'] is not None else float('nan'):.3f}, "
                   f"{int(a['batch_rejected'])} batch requests rejected, {int(a['batch_deferred'])} deferred.")
    return out

