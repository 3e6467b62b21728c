"""Overload study, section (e): a fill worker crash, a decode worker crash and a KV-link slowdown
inside the replayed window, every policy: conservation and goodput per policy.
"""

from __future__ import annotations

import pandas as pd

from tokenfactory.core.classes import DEFAULT_CLASSES
from tokenfactory.replay import run_replay
from tokenfactory.studies.overload.common import POLICY_LABELS, load_capacity, fmt_number, trace_for_load, sweep_row

__all__ = ["fault_events"]


# ------------------------------------------------------------------------------------------
# (e) faults under overload


def fault_events(span_s: float, fc: dict) -> list[dict]:
    """The fault case's events inside a replayed window of ``span_s`` seconds: fill worker 1 and
    decode worker 0 crash (each back after ``restart_share`` of the window), then the KV links
    slow down to ``link_factor`` x bandwidth.

    Parameters
    ----------
    span_s : float
        The replayed window (s).
    fc : dict
        ``fill_crash_at``, ``decode_crash_at``, ``restart_share``, ``link_at``, ``link_share``,
        ``link_factor`` (shares of the window, and the bandwidth factor).

    Returns
    -------
    list of dict
        ``cluster.events`` tables.
    """
    restart = fc["restart_share"] * span_s
    return [{"kind": "worker_crash", "at_s": fc["fill_crash_at"] * span_s, "pool": "fill", "index": 1,
             "restart_s": restart},
            {"kind": "worker_crash", "at_s": fc["decode_crash_at"] * span_s, "pool": "decode", "index": 0,
             "restart_s": restart},
            {"kind": "link_slowdown", "start_s": fc["link_at"] * span_s, "duration_s": fc["link_share"] * span_s,
             "factor": fc["link_factor"]}]


def run_faults(cfg: dict, tr: pd.DataFrame, setup, name: str, synthetic: bool) -> dict:
    """Every policy at the fault loads with :func:`fault_events` inside the replayed window."""
    fc = cfg["faults"]
    classes = DEFAULT_CLASSES
    cluster = {**cfg["cluster"], "classes": classes}
    cap = load_capacity(setup, cluster)
    rows = []
    for load in fc["loads"]:
        part = trace_for_load(tr, setup, load, cfg["replay_s"], cluster)
        closed = bool(part.attrs.get("per_session_clock"))
        rate = len(part) / max(float(part["arrival_s"].max()), 1e-9)
        span = (cfg["replay_s"] or 1800.0) if closed else float(part["arrival_s"].max()) * rate / (load * cap[0])
        events = fault_events(span, fc)
        for policy in cfg["policies"]:
            m, res = run_replay(part, setup, policy, cluster={**cluster, "events": events}, load=load,
                                batch_cap="static", duration_s=(cfg["replay_s"] or 1800.0) if closed else None)
            arr = res.records["arrival_s"]
            window = float(arr.max() - arr.min()) if arr.notna().any() else 1.0
            row = sweep_row(name, load, policy, m, res, setup, cap, classes, window, synthetic)
            row["conserved"] = m["requests"] == m["completed"] + m["rejected"] + m["in_flight_end"]
            row["requeued"] = m.get("requeued")
            row["events"] = len(events)
            rows.append(row)
    return {"rows": rows, "events": fault_events(1.0, fc)}


def fault_lines(f: dict) -> list[str]:
    t = pd.DataFrame(f["rows"])
    if not len(t):
        return []
    ok = bool(t["conserved"].all())
    lines = [f"A fill worker crash, a decode worker crash and a KV-link slowdown inside each replayed window "
             f"({t['trace'].iloc[0]}): every request ended completed, rejected with a reason or in flight in "
             f"{int(t['conserved'].sum())} of {len(t)} runs" + ("." if ok else " - CONSERVATION FAILED."), "",
             "| load | policy | goodput (tok/s) | SLO attainment | admitted | rejected | requeued | in flight |",
             "|---|---|---|---|---|---|---|---|"]
    for _, r in t.sort_values(["load", "policy"]).iterrows():
        lines.append(f"| {r['load']:g}x | {POLICY_LABELS.get(r['policy'], r['policy'])} | {r['goodput_tokens_per_s']:.0f} | "
                     f"{r['slo_attainment']:.3f} | {fmt_number(r['slo_attainment_admitted'])} | {int(r['rejected'])} | "
                     f"{int(r['requeued'] or 0)} | {int(r['in_flight_end'])} |")
    for load, g in t.groupby("load"):
        best = g.loc[g["goodput_tokens_per_s"].idxmax()]
        lines.append("")
        lines.append(f"At {load:g}x with faults the most goodput is {POLICY_LABELS.get(best['policy'], best['policy'])}'s "
                     f"({best['goodput_tokens_per_s']:.0f} tokens/s).")
    return lines

