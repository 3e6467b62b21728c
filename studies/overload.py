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

from tokenfactory.core.classes import BATCH, DEFAULT_CLASSES, INTERACTIVE
from tokenfactory.controllers import assess, batch_gate_loop, margin_separation, predict_batch_cycle
from tokenfactory.plant_models import (
    ClusterConfig,
    FluidLoopPlant,
    FluidParams,
    FluidPlant,
    LoopScenario,
    RequestPlant,
)
from tokenfactory.registry import (
    RECOMMENDED_ADMISSION,
    PlantContext,
    batch_gate_for,
    batch_gate_tuning,
    build_admission,
    margin_tuning,
    slo_admission_tuning,
    static_batch_cap,
)
from tokenfactory.replay import (
    DEFAULT_PLANT,
    build_replay,
    class_outputs,
    infeasible,
    request_costs,
    run_replay,
    service_capacity,
)
from tokenfactory.studies.report import StudyReport, human, vllm_batch_flag
from tokenfactory.traces import (
    SyntheticWorkload,
    generate_requests,
    load_trace,
    scale_trace,
    spread_quantized_arrivals,
    trace_available,
)
from tokenfactory.core.validation import ConfigError
from tokenfactory.studies.study_config import StudyVariants, resolve_study_config

__all__ = ["CONFIG", "run", "POLICIES", "TRACES", "goodput_in_window", "surge_trace", "fault_events", "gate_before_after_fluid",
           "gate_before_after_des", "targets", "miss_causes"]

#: admission policies compared (registry kinds), baselines first
POLICIES = ("open", "vllm-watermark", "mooncake", "mooncake-predictive", "smoothed", RECOMMENDED_ADMISSION)
#: the traces of the load sweep
TRACES = ("mooncake-conversation", "azure-conv-2023", "azure-code-2023", "agentic-coding")
#: traces the no-collapse target is checked on
COLLAPSE_TRACES = ("mooncake-conversation", "azure-conv-2023", "azure-code-2023")
_LABEL = {"open": "open", "vllm-watermark": "vLLM watermark", "mooncake": "Mooncake early rejection",
          "mooncake-predictive": "Mooncake predictive rejection", "smoothed": "smoothed (previous)",
          RECOMMENDED_ADMISSION: "SLO-aware (new)"}
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
        if p not in _LABEL:
            raise ConfigError("overload.policies", f"unknown policy {p!r}; known: {', '.join(_LABEL)}")


def _variant(values: dict[str, Any]) -> dict[str, Any]:
    """The settings of a variant that differ from the default's."""
    default = _defaults(False, False)
    return {k: v for k, v in values.items() if v != default[k]}


#: the study's settings: the defaults and its quick and full variants (:mod:`tokenfactory.studies.study_config`)
CONFIG = StudyVariants("overload", {**_defaults(False, False), "full": False}, quick=_variant(_defaults(True, False)),
                       full=_variant(_defaults(False, True)), check=_check)


# ------------------------------------------------------------------------------------------
# traces


def _synthetic(name: str, span_s: float, seed: int) -> pd.DataFrame:
    """The stand-in when a trace is absent: the synthetic workload (agentic sessions on one clock
    for the agentic trace)."""
    w = SyntheticWorkload(mean_rate_rps=5.0, idc=4.0, daily_amplitude=0.0, daily_second_harmonic=0.0,
                          weekend_factor=1.0, agentic_fraction=0.5 if "agentic" in name else 0.0, seed=seed)
    tr = generate_requests(w, span_s)
    tr.attrs["name"] = f"synthetic stand-in for {name}"
    return tr


def _load(name: str, span_s: float, seed: int) -> tuple[pd.DataFrame, bool]:
    """(trace, synthetic?): the registered trace with quantized arrivals spread over their slot."""
    if trace_available(name):
        return spread_quantized_arrivals(load_trace(name), seed=seed), False
    return _synthetic(name, span_s, seed), True


def _standin_labels(names: list[str]) -> dict[str, str]:
    """Each trace's label should it be absent: ``synthetic stand-in for A, B`` over the absent
    traces that share a stand-in (the agentic one has its own: sessions)."""
    absent = [n for n in names if not trace_available(n)]
    groups = {kind: [n for n in absent if ("agentic" in n) == kind] for kind in (False, True)}
    return {n: f"synthetic stand-in for {', '.join(groups['agentic' in n])}" for n in absent}


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
                      f"the other policies is {_LABEL.get(best['policy'], best['policy'])}'s ({said(best)}), the least "
                      f"{_LABEL.get(worst['policy'], worst['policy'])}'s ({said(worst)}).")


def _window(tr: pd.DataFrame, start_s: float, end_s: float) -> pd.DataFrame:
    out = tr[(tr["arrival_s"] >= start_s) & (tr["arrival_s"] < end_s)].copy()
    out["arrival_s"] -= start_s
    out.attrs = dict(tr.attrs)
    return out


def _capacity(setup, cluster: dict) -> tuple[float, str, float]:
    """(capacity, bottleneck, batch cap) of the cluster the study simulates
    (:meth:`tokenfactory.replay.ReplaySetup.capacity`: its pools, SLOs and classes)."""
    c = setup.capacity(cluster)
    return c.model_rps, c.bottleneck, c.batch_cap


def _for_load(tr: pd.DataFrame, setup, load: float, replay_s: float | None, cluster: dict) -> pd.DataFrame:
    """The part of the trace that replays for about ``replay_s`` seconds at ``load`` (the whole trace
    for ``None`` or when shorter)."""
    if replay_s is None or tr.attrs.get("per_session_clock"):
        return tr
    rate = len(tr) / max(float(tr["arrival_s"].max()), 1e-9)
    scale = load * _capacity(setup, cluster)[0] / rate
    return _window(tr, 0.0, replay_s * scale)


def goodput_in_window(records: pd.DataFrame, slo: np.ndarray, span_s: float) -> float:
    """Output tokens per second of requests that met their SLO, over the arrival window.

    Parameters
    ----------
    records : DataFrame
        The request simulator's records.
    slo : array of bool
        Which requests met their class's SLO.
    span_s : float
        The arrival window (s): goodput per second of offered traffic, so the drain after the
        last arrival does not dilute it.

    Returns
    -------
    float
        Tokens/s.
    """
    return float(records.loc[slo, "output_tokens"].sum() / max(span_s, 1e-9))


def _slo_met(records: pd.DataFrame, classes) -> np.ndarray:
    table = {c.name: c for c in classes}
    ttft = records["request_class"].map(lambda c: table[c].slo_ttft_s).to_numpy(dtype=float)
    tpot = records["request_class"].map(lambda c: table[c].slo_tpot_s).to_numpy(dtype=float)
    return ((records["state"] == "completed").to_numpy() & (records["ttft_s"].to_numpy() <= ttft)
            & (records["tpot_s"].to_numpy() <= tpot))


def miss_causes(records: pd.DataFrame, params, classes) -> dict[str, float]:
    """Why completed requests missed their SLO, as shares of all arrivals: TTFT or TPOT, each
    split into *intrinsic* (the request's own service alone on an empty cluster already misses:
    its chunked fill for TTFT, its KV transfer and batch-1 decode passes for TPOT;
    :func:`tokenfactory.replay.request_costs`) and *queueing* (everything else: waits for fill, for
    a decode slot, shared steps and batches). A request missing both counts in both; the
    ``infeasible`` share counts every arrival whose own service misses (completed or not).

    Parameters
    ----------
    records : DataFrame
        The request simulator's records (the prefix each fill found in the cache is used where
        the request was filled, the trace's own ``cached_tokens`` otherwise); requests that never
        arrived (closed sessions cut short) are left out.
    params : DESParams
        The request simulator's parameters.
    classes : iterable of RequestClass
        The SLOs.

    Returns
    -------
    dict
        ``infeasible``, ``ttft_intrinsic``, ``ttft_queueing``, ``tpot_intrinsic``,
        ``tpot_queueing`` (shares of the arrivals).
    """
    records = records[records["state"] != "not_arrived"]
    n = max(len(records), 1)
    filled = records["fill_start_s"].notna().to_numpy()
    given = records["trace_cached_tokens"] if "trace_cached_tokens" in records else 0
    costs = request_costs(records.assign(cached_tokens=np.where(filled, records["cached_tokens"], given)), params)
    bad = infeasible(costs, classes)
    table = {c.name: c for c in classes}
    first = next(iter(table.values()))
    cl = records["request_class"].map(lambda c: table.get(c, first))
    done = (records["state"] == "completed").to_numpy()
    ttft = done & (records["ttft_s"].to_numpy() > cl.map(lambda c: c.slo_ttft_s).to_numpy(dtype=float))
    tpot = done & (records["tpot_s"].to_numpy() > cl.map(lambda c: c.slo_tpot_s).to_numpy(dtype=float))
    bt, bp = bad["ttft"].to_numpy(), bad["tpot"].to_numpy()
    return {"infeasible": float(bad["any"].mean()), "ttft_intrinsic": float((ttft & bt).sum() / n),
            "ttft_queueing": float((ttft & ~bt).sum() / n), "tpot_intrinsic": float((tpot & bp).sum() / n),
            "tpot_queueing": float((tpot & ~bp).sum() / n)}


def _row(trace: str, load: float, policy: str, m: dict, res, setup, cap: tuple, classes, span_s: float,
         synthetic: bool) -> dict:
    rec = res.records
    met = _slo_met(rec, classes)
    row = {"trace": trace, "synthetic": synthetic, "load": load, "policy": policy, "scale": m["scale"],
           "capacity_rps": cap[0], "bottleneck": cap[1], "batch_cap": cap[2], "kv_capacity_rps": setup.capacity_rps,
           "requests": m["requests"], "admitted": m["admitted"], "completed": m["completed"],
           "rejected": m["rejected"], "deferred": m["deferred"], "in_flight_end": m["in_flight_end"],
           "goodput_tokens_per_s": goodput_in_window(rec, met, span_s), "slo_attainment": m["slo_attainment"],
           "slo_attainment_admitted": m["slo_attainment_admitted"], "ttft_p50": m["ttft_p50"], "ttft_p99": m["ttft_p99"],
           "tpot_p50": m["tpot_p50"], "tpot_p99": m["tpot_p99"], "wasted_prefill_fraction": m["wasted_prefill_fraction"],
           "wasted_prefill_tokens": m["wasted_prefill_tokens"], "prefill_tokens": m["prefill_tokens"],
           "oscillating": m["oscillating"], "batch_cap_changes": m["batch_cap_changes"],
           "preempted": m["preempted"], "wall_seconds": m["wall_seconds"]}
    for k, v in miss_causes(rec, setup.params, classes).items():
        row[f"miss:{k}"] = v
    for r, v in m["rejected_by_reason"].items():
        row[f"rejected:{r}"] = v
    for r, v in m["deferred_by_reason"].items():
        row[f"deferred:{r}"] = v
    for c, cm in m["classes"].items():
        for k in ("requests", "slo_attainment", "slo_attainment_admitted", "ttft_p99", "tpot_p99", "rejected"):
            row[f"{c}:{k}"] = cm[k]
    for sig in ("ready", "fill"):
        o = m[f"{sig}_oscillation"] or {}
        row[f"{sig}_oscillating"] = o.get("oscillating")
        row[f"{sig}_period_s"] = o.get("period_s")
        row[f"{sig}_reason"] = o.get("reason")
    return row


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
    inter = _window(inter, 0.0, total)
    inter["request_class"] = INTERACTIVE
    parts = [inter]
    if surge:
        b = scale_trace(tr, rate_batch / rate)
        mid = float(b["arrival_s"].max()) / 2.0
        b = _window(b, mid, mid + surge_s)
        b["arrival_s"] += before_s
        b["request_class"] = BATCH
        if "session_id" in b:
            b["session_id"] = np.where(b["session_id"].astype(str) != "", b["session_id"].astype(str) + "#batch", "")
        parts.append(b)
    out = pd.concat(parts, ignore_index=True).sort_values("arrival_s", kind="stable").reset_index(drop=True)
    out.attrs = {k: v for k, v in tr.attrs.items() if k not in ("class_mix", "class_seed")}
    return out


def _surge(cfg: dict, quick: bool, report: StudyReport) -> dict:
    sc = cfg["surge"]
    classes = DEFAULT_CLASSES
    tr, synthetic = _load(sc["trace"], 3600.0, cfg["seed"])
    if tr.attrs.get("per_session_clock"):
        raise ConfigError("overload.surge.trace", "the surge needs a trace on one clock")
    setup = build_replay(tr, cfg["plant"])
    cluster = {**cfg["cluster"], "classes": classes}
    cap = _capacity(setup, cluster)
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
            met = _slo_met(during, classes) if len(during) else np.zeros(0, bool)
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
                         "goodput_tokens_per_s": goodput_in_window(rec, _slo_met(rec, classes),
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
                   label=f"{_LABEL[policy]}: batch decoding")
        ax[0].plot(s["time_s"], s["active_decodes_interactive"], color=f"C{i}", lw=1.0,
                   label=f"{_LABEL[policy]}: interactive decoding")
        rec = res.records
        q = rec[(rec["request_class"] == INTERACTIVE) & rec["ttft_s"].notna()].sort_values("arrival_s")
        roll = q.set_index("arrival_s")["ttft_s"].rolling(100, min_periods=10).quantile(0.99)
        ax[1].plot(roll.index, roll.to_numpy(), color=f"C{i}", lw=1.2, label=_LABEL[policy])
        tq = q.set_index("arrival_s")["tpot_s"].dropna().rolling(100, min_periods=10).quantile(0.99)
        ax[2].plot(tq.index, tq.to_numpy(), color=f"C{i}", lw=1.2, label=_LABEL[policy])
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
    lines = _surge_lines(table, sc)
    report.save_figure(fig, "surge.png", "Batch surge to {:g} x capacity for {:.0f} s with interactive load at {:g} x: "
                       "decoding sequences by class, interactive TTFT and TPOT p99 (rolling). ".format(
                           sc["batch_load"], sc["surge_s"], sc["interactive_load"]) + " ".join(lines[:1]))
    return {"rows": rows, "lines": lines}


def _surge_lines(table: pd.DataFrame, sc: dict) -> list[str]:
    out = []
    for policy in sc["policies"]:
        a = table[(table["policy"] == policy) & table["surge"]]
        b = table[(table["policy"] == policy) & ~table["surge"]]
        if not len(a) or not len(b):
            continue
        a, b = a.iloc[0], b.iloc[0]
        ta, tb = a["interactive_ttft_p99"], b["interactive_ttft_p99"]
        growth = (ta / tb - 1.0) if ta and tb else math.nan
        out.append(f"{_LABEL[policy]}: interactive SLO attainment {a['interactive_slo_attainment']:.3f} with the surge "
                   f"({b['interactive_slo_attainment']:.3f} without), TTFT p99 {ta:.2f} s vs {tb:.2f} s "
                   f"({growth:+.0%}); batch SLO attainment {a['batch_slo_attainment'] if a['batch_slo_attainment'] is not None else float('nan'):.3f}, "
                   f"{int(a['batch_rejected'])} batch requests rejected, {int(a['batch_deferred'])} deferred.")
    return out


# ------------------------------------------------------------------------------------------
# (c) the gated batch cap, before and after


def _cap_verdict(series: pd.Series, dt: float) -> dict:
    x = series.to_numpy(dtype=float)
    x = x[np.isfinite(x)]
    return assess(x, dt, min_amplitude=2.0).to_dict() if len(x) >= 16 else {"oscillating": False, "reason": "too short"}


def gate_before_after_fluid(fp: FluidParams, fill_workers: int, decode_workers: int, slo_tpot_s: float,
                            duration_s: float, overload: float = 1.5) -> dict:
    """The batch cap adjusted from the measured pass time every sample (ungated, gain 1) vs gated,
    in the admission-loop fluid plant under ``overload`` x its decode capacity at the cap with
    no admission control (a ready backlog is always there, so the cap binds).

    Parameters
    ----------
    fp : FluidParams
        The plant.
    fill_workers, decode_workers : int
        Pools.
    slo_tpot_s : float
        TPOT SLO.
    duration_s : float
        Simulated time (s).
    overload : float
        Demand over the decode capacity at the static cap.

    Returns
    -------
    dict
        Per variant: the series, the cap's oscillation verdict, the pass time's range and mean.
    """
    ctx = PlantContext(fp, fill_workers, decode_workers, slo_tpot_s=slo_tpot_s)
    cap = static_batch_cap(ctx)
    plant = FluidPlant(fp, fill_workers, decode_workers)
    demand = overload * decode_workers * cap / (fp.output_tokens * fp.decode_step_s(cap))
    out = {}
    for key, params in (("ungated", {"gated": False, "gain": 1.0}), ("gated", {"gated": True})):
        gate = batch_gate_for(ctx, params)
        r = FluidLoopPlant(plant).run(LoopScenario(demand=demand, duration_s=duration_s, dt=0.01), [gate])
        s = r.series
        after = s[s["time_s"] >= 0.2 * duration_s]
        samp = after.iloc[::10]
        out[key] = {"series": s[["time_s", "decode_batch_cap", "active_decodes", "decode_pass_s"]].iloc[::10],
                    "verdict": _cap_verdict(samp["decode_batch_cap"], 0.1),
                    "pass_verdict": assess(samp["decode_pass_s"].to_numpy(), 0.1,
                                           min_amplitude=0.02 * gate.target_s).to_dict(),
                    "cap_min": float(after["decode_batch_cap"].min()), "cap_max": float(after["decode_batch_cap"].max()),
                    "pass_mean_s": float(after["decode_pass_s"].mean()), "pass_max_s": float(after["decode_pass_s"].max()),
                    "target_s": gate.target_s, "changes": int((r.actions["kind"] == "batch_cap").sum())}
    return out


def gate_before_after_des(tr: pd.DataFrame, setup, load: float, cluster: dict, replay_s: float | None,
                          slo_tpot_s: float) -> dict:
    """The same before/after in the request simulator: a trace at ``load`` x the capacity at the SLO
    with no admission control, the batch cap from the ungated or the gated rule.

    Parameters
    ----------
    tr : DataFrame
        The request table.
    setup : ReplaySetup
        From :func:`tokenfactory.replay.build_replay`.
    load : float
        Offered load (x capacity at the SLO).
    cluster : dict
        :class:`ClusterConfig` fields.
    replay_s : float or None
        Replayed seconds (None: the whole trace).
    slo_tpot_s : float
        TPOT SLO.

    Returns
    -------
    dict
        Per variant: series, verdicts, pass time, TPOT p99 and goodput.
    """
    cl = {"slo_tpot_s": slo_tpot_s, **cluster}
    part = _for_load(tr, setup, load, replay_s, cl)
    rate = len(part) / max(float(part["arrival_s"].max()), 1e-9)
    scale = load * _capacity(setup, cl)[0] / rate
    replay = scale_trace(part, scale)
    ctx = setup.context(slo_tpot_s=slo_tpot_s, class_outputs=class_outputs(replay))
    out = {}
    for key, params in (("ungated", {"gated": False, "gain": 1.0}), ("gated", {"gated": True})):
        gate = batch_gate_for(ctx, params)
        cl = ClusterConfig.from_dict({"fill_workers": int(setup.plant.fill_workers),
                                      "decode_workers": int(setup.plant.decode_workers),
                                      "measurement_delay_s": setup.plant.params.measurement_delay_s,
                                      **cluster, "batch_cap": static_batch_cap(ctx)})
        res = RequestPlant(setup.params, cl).run(replay, [gate])
        s = res.series
        after = s[(s["time_s"] >= 0.2 * s["time_s"].iloc[-1]) & (s["time_s"] <= float(replay["arrival_s"].max()))]
        out[key] = {"series": s[["time_s", "decode_batch_cap", "active_decodes", "decode_pass_s", "ready"]],
                    "verdict": _cap_verdict(after["decode_batch_cap"], cl.snapshot_dt),
                    "cap_min": float(after["decode_batch_cap"].min()), "cap_max": float(after["decode_batch_cap"].max()),
                    "pass_mean_s": float(after["decode_pass_s"].mean()),
                    "tpot_p99": res.metrics["tpot_p99"], "preempted": res.metrics["preempted"],
                    "changes": res.metrics["batch_cap_changes"], "target_s": gate.target_s}
    return out


def _gate_figure(fluid: dict, des: dict) -> Figure:
    fig = Figure(figsize=(11, 7), layout="constrained")
    ax = fig.subplots(2, 2, sharex="col")
    for j, (name, d) in enumerate((("fluid plant", fluid), ("request simulator", des))):
        for i, key in enumerate(("ungated", "gated")):
            s = d[key]["series"]
            ax[0, j].plot(s["time_s"], s["decode_batch_cap"], color=f"C{i}", lw=1.0, label=f"{key}: cap")
            ax[0, j].plot(s["time_s"], s["active_decodes"], color=f"C{i}", lw=0.6, alpha=0.6, ls="--",
                          label=f"{key}: batch")
            ax[1, j].plot(s["time_s"], s["decode_pass_s"], color=f"C{i}", lw=0.8, label=key)
        ax[1, j].axhline(d["gated"]["target_s"], color="k", ls=":", lw=1, label="target pass time")
        ax[0, j].set_title(name)
        ax[0, j].set_ylabel("decode batch (per worker)")
        ax[1, j].set_ylabel("decode pass time (s)")
        ax[1, j].set_xlabel("time (s)")
        for a in ax[:, j]:
            a.grid(True, alpha=0.3)
            a.legend(fontsize=7)
    return fig


def _verdict_words(v: dict) -> str:
    if v.get("oscillating"):
        return f"oscillates (period {v['period_s']:.1f} s)"
    return "does not oscillate"


# ------------------------------------------------------------------------------------------
# (d) margins


def _margins(setup, cfg: dict, report: StudyReport) -> dict:
    ctx = setup.context(cfg["cluster"]["slo_ttft_s"], cfg["cluster"]["slo_tpot_s"], classes=DEFAULT_CLASSES,
                        class_outputs=class_outputs(setup.trace))
    ctrl = build_admission(RECOMMENDED_ADMISSION, ctx)
    tuning = slo_admission_tuning(ctrl, setup.plant.params.measurement_delay_s)
    gate = ctrl.batch_gate if ctrl.batch_gate is not None else batch_gate_for(ctx)
    gt = batch_gate_tuning(gate, setup.plant.params.measurement_delay_s)
    rows = []
    for name, t in tuning.items():
        for r in t.envelope:
            rows.append({"loop": f"{name} limit", **{k: r[k] for k in ("delay_factor", "gain_factor", "stable",
                                                                          "gain_margin", "lower_gain_margin",
                                                                          "phase_margin_deg", "delay_margin_s",
                                                                          "meets_floors")}})
    for r in gt.envelope:
        rows.append({"loop": "batch gate", "delay_factor": r["delay_factor"], "gain_factor": r["slope_factor"],
                     **{k: r[k] for k in ("stable", "gain_margin", "lower_gain_margin", "phase_margin_deg",
                                          "delay_margin_s", "meets_floors")}})
    table = pd.DataFrame(rows)
    report.save_table(table, "margins.csv", "Exact-delay Nyquist verdict and margins of the SLO-aware admission's "
                      "fill and decode limit loops and of the gated batch cap at every envelope point.")
    out = {}
    for name, t in tuning.items():
        w = t.worst
        out[name] = {"ki": t.ki, "tau_c_s": t.tau_c_s, "theta_s": t.theta_s, "envelope_ok": t.envelope_ok,
                     "nominal_gm": t.nominal.gain_margin, "nominal_pm_deg": t.nominal.phase_margin_deg,
                     "nominal_dm_s": t.nominal.delay_margin_s, "worst_gm": min(r["gain_margin"] for r in t.envelope),
                     "worst_pm_deg": min(abs(r["phase_margin_deg"]) for r in t.envelope),
                     "worst_dm_s": min(r["delay_margin_s"] for r in t.envelope),
                     "worst_point": {"delay_factor": w["delay_factor"], "gain_factor": w["gain_factor"]},
                     "limit_cycle": t.limit_cycle}
    out["batch_gate"] = {"gain": gt.gain, "hold_s": gt.hold_s, "theta_s": gt.theta_s, "envelope_ok": gt.envelope_ok,
                         "nominal_gm": gt.nominal.gain_margin, "nominal_pm_deg": gt.nominal.phase_margin_deg,
                         "nominal_dm_s": gt.nominal.delay_margin_s,
                         "worst_gm": min(r["gain_margin"] for r in gt.envelope),
                         "worst_pm_deg": min(abs(r["phase_margin_deg"]) for r in gt.envelope),
                         "worst_dm_s": min(r["delay_margin_s"] for r in gt.envelope),
                         "ungated_stable": gt.ungated.stable if gt.ungated else None,
                         "ungated_gm": gt.ungated.gain_margin if gt.ungated else None,
                         "ungated_cycle": gt.ungated_cycle, "gated_cycle": None}
    # the gated loop's saturation check (the ungated one's cycle is in ungated_cycle)
    cyc = predict_batch_cycle(batch_gate_loop(gt.gain, gt.hold_s, gt.theta_s), 1.0)
    out["batch_gate"]["gated_cycle"] = cyc.to_dict() if cyc else None
    # the outer loop on outcomes and its separation from the fast gate (fill-limit loop)
    ot = margin_tuning(ctx, ctrl.outer, ctrl.outcome_delay_s)
    sep = margin_separation(ot, tuning["fill"])
    d = ot.to_dict()
    out["outer"] = {"sample_period_s": ctrl.outer.sample_period_s, "ki": ot.ki, "tau_c_s": ot.tau_c_s, "theta_s": ot.theta_s, "window_s": ot.window_s,
                    "gain": ot.gain, "envelope_ok": ot.envelope_ok, "nominal_gm": ot.nominal.gain_margin,
                    "nominal_pm_deg": ot.nominal.phase_margin_deg, "nominal_dm_s": ot.nominal.delay_margin_s,
                    "worst_gm": d["worst_gm"], "worst_pm_deg": d["worst_pm_deg"], "worst_dm_s": d["worst_dm_s"],
                    "limit_cycle": None, "separation_ratio": sep.ratio, "pm_loss_deg": sep.pm_loss_deg,
                    "inner_bandwidth_rad_s": sep.inner_bandwidth_rad_s,
                    "outer_crossover_rad_s": sep.outer_crossover_rad_s, "with_fast_gate_stable": sep.real.stable}
    return out


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


def _faults(cfg: dict, tr: pd.DataFrame, setup, name: str, synthetic: bool) -> dict:
    """Every policy at the fault loads with :func:`fault_events` inside the replayed window."""
    fc = cfg["faults"]
    classes = DEFAULT_CLASSES
    cluster = {**cfg["cluster"], "classes": classes}
    cap = _capacity(setup, cluster)
    rows = []
    for load in fc["loads"]:
        part = _for_load(tr, setup, load, cfg["replay_s"], cluster)
        closed = bool(part.attrs.get("per_session_clock"))
        rate = len(part) / max(float(part["arrival_s"].max()), 1e-9)
        span = (cfg["replay_s"] or 1800.0) if closed else float(part["arrival_s"].max()) * rate / (load * cap[0])
        events = fault_events(span, fc)
        for policy in cfg["policies"]:
            m, res = run_replay(part, setup, policy, cluster={**cluster, "events": events}, load=load,
                                batch_cap="static", duration_s=(cfg["replay_s"] or 1800.0) if closed else None)
            arr = res.records["arrival_s"]
            window = float(arr.max() - arr.min()) if arr.notna().any() else 1.0
            row = _row(name, load, policy, m, res, setup, cap, classes, window, synthetic)
            row["conserved"] = m["requests"] == m["completed"] + m["rejected"] + m["in_flight_end"]
            row["requeued"] = m.get("requeued")
            row["events"] = len(events)
            rows.append(row)
    return {"rows": rows, "events": fault_events(1.0, fc)}


def _fault_lines(f: dict) -> list[str]:
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
        lines.append(f"| {r['load']:g}x | {_LABEL.get(r['policy'], r['policy'])} | {r['goodput_tokens_per_s']:.0f} | "
                     f"{r['slo_attainment']:.3f} | {_fmt(r['slo_attainment_admitted'])} | {int(r['rejected'])} | "
                     f"{int(r['requeued'] or 0)} | {int(r['in_flight_end'])} |")
    for load, g in t.groupby("load"):
        best = g.loc[g["goodput_tokens_per_s"].idxmax()]
        lines.append("")
        lines.append(f"At {load:g}x with faults the most goodput is {_LABEL.get(best['policy'], best['policy'])}'s "
                     f"({best['goodput_tokens_per_s']:.0f} tokens/s).")
    return lines


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


def _fmt(x, spec=".3f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


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
                          label=_LABEL.get(p, p))
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
                                  lw=2.0 if p == RECOMMENDED_ADMISSION else 1.0, label=_LABEL.get(p, p))
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
    surge = _surge(cfg, quick, report)
    fluid, des = _gate_section(cfg, full, report)
    # (d) margins of the new loops
    margin_setup = sweep.setups.get(COLLAPSE_TRACES[0]) or next(iter(sweep.setups.values()))
    margins = _margins(margin_setup, cfg, report)
    faults = _faults_section(cfg, quick, sweep, report)
    tg = targets(table, surge["rows"], margins)
    metrics = {"rows": sweep.rows, "absent_traces": sweep.absent, "surge": surge["rows"], "margins": margins,
               "targets": tg, "faults": faults,
               "gate": {k: {v: {x: y for x, y in d.items() if x != "series"} for v, d in g.items()}
                        for k, g in (("fluid", fluid), ("des", des))},
               "sweep_wall_seconds": sweep.wall_s}
    lines = _summary_lines(cfg, table, surge, fluid, des, margins, tg, sweep.absent, sweep.setups)
    lines += ["", "## Faults under overload", "", *_fault_lines(faults)]
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
    standins = _standin_labels(cfg["traces"])
    labels = []
    for name in cfg["traces"]:
        tr, synthetic = _load(name, 1800.0 if not quick else 600.0, cfg["seed"])
        if synthetic:
            absent.append(name)
            name = standins[name]
            if name in labels:
                continue
            tr.attrs["name"] = name
        labels.append(name)
        setup = build_replay(tr, cfg["plant"])
        setups[name] = setup
        cap = _capacity(setup, cluster)
        for load in cfg["loads"]:
            part = _for_load(tr, setup, load, cfg["replay_s"], cluster)
            closed = bool(part.attrs.get("per_session_clock"))
            for policy in cfg["policies"]:
                m, res = run_replay(part, setup, policy, cluster=cluster, load=load, batch_cap="static",
                                    duration_s=(cfg["replay_s"] or 1800.0) if closed else None)
                arr = res.records["arrival_s"]
                span = float(arr.max() - arr.min()) if arr.notna().any() else 1.0
                rows.append(_row(name, load, policy, m, res, setup, cap, classes, span, synthetic))
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
    gtr, _ = _load(gcfg["trace"], 1800.0, cfg["seed"])
    gsetup = build_replay(gtr, cfg["plant"])
    fluid = gate_before_after_fluid(gsetup.plant.params, int(gsetup.plant.fill_workers), int(gsetup.plant.decode_workers),
                                    cfg["cluster"]["slo_tpot_s"], gcfg["fluid_s"])
    des = gate_before_after_des(gtr, gsetup, gcfg["load"], {k: v for k, v in cfg["cluster"].items()},
                                gcfg["des_replay_s"] if not full else None, cfg["cluster"]["slo_tpot_s"])
    gate_caption = (f"Decode batch cap adjusted from the measured pass time: ungated (every sample, gain 1) the cap "
                    f"{_verdict_words(fluid['ungated']['verdict'])} in the fluid plant and "
                    f"{_verdict_words(des['ungated']['verdict'])} in the request simulator; gated it "
                    f"{_verdict_words(fluid['gated']['verdict'])} in the fluid plant and "
                    f"{_verdict_words(des['gated']['verdict'])} in the request simulator.")
    report.save_figure(_gate_figure(fluid, des), "gate_before_after.png", gate_caption)
    return fluid, des


def _faults_section(cfg: dict, quick: bool, sweep: _Sweep, report: StudyReport) -> dict:
    """(e) faults under overload, on the sweep's first trace."""
    fname = sweep.labels[0]   # the sweep's first trace, or the stand-in run for it
    ftr, fsyn = _load(cfg["traces"][0], 1800.0 if not quick else 600.0, cfg["seed"])
    if fsyn:
        ftr.attrs["name"] = fname
    faults = _faults(cfg, ftr, sweep.setups[fname], fname, fsyn)
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
        s = (f"{trace}: from {at1['load'].iloc[0]:g}x to {hi['load'].iloc[0]:g}x {_LABEL[worst['policy']]} goes from "
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
        cap = _capacity(s, {**c, "classes": DEFAULT_CLASSES})
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
        lines.append(f"| {trace} | {_LABEL.get(policy, policy)} | " + " | ".join(f"{v:.0f}" for v in r.to_numpy()) + " |")
    lines += ["", "## SLO attainment: all arrivals / admitted", ""]
    a = table.pivot_table(index=["trace", "policy"], columns="load", values="slo_attainment")
    b = table.assign(slo_attainment_admitted=table["slo_attainment_admitted"].astype(float)).pivot_table(
        index=["trace", "policy"], columns="load", values="slo_attainment_admitted", dropna=False).reindex(
        index=a.index, columns=a.columns)
    lines += ["| trace | policy | " + " | ".join(f"{l:g}x" for l in a.columns) + " |", "|---|---|" + "---|" * len(a.columns)]
    for idx in a.index:
        lines.append(f"| {idx[0]} | {_LABEL.get(idx[1], idx[1])} | " + " | ".join(
            f"{a.loc[idx, l]:.3f} / {_fmt(b.loc[idx, l])}" for l in a.columns) + " |")
    lines += ["", "## Why requests miss", "",
              "Shares of the arrivals (`miss_causes`): infeasible requests (own service alone misses), and "
              "completed requests that missed on TTFT or TPOT, intrinsic (own service alone misses) or through "
              "queueing (waits, shared fill steps and decode batches).", "",
              "| trace | load | policy | SLO attainment | infeasible | TTFT miss: intrinsic / queueing | "
              "TPOT miss: intrinsic / queueing |", "|---|---|---|---|---|---|---|"]
    for _, r in table[table["policy"].isin(["open", RECOMMENDED_ADMISSION])].sort_values(
            ["trace", "load", "policy"]).iterrows():
        lines.append(f"| {r['trace']} | {r['load']:g}x | {_LABEL.get(r['policy'], r['policy'])} | "
                     f"{r['slo_attainment']:.3f} | {r['miss:infeasible']:.3f} | {r['miss:ttft_intrinsic']:.3f} / "
                     f"{r['miss:ttft_queueing']:.3f} | {r['miss:tpot_intrinsic']:.3f} / {r['miss:tpot_queueing']:.3f} |")
    lines += ["", "## The class surge", "", *surge["lines"], "",
              "## Gated batch size (section 18: large-batch recovery)", "",
              f"Fluid plant: ungated the cap moves between {fluid['ungated']['cap_min']:.0f} and {fluid['ungated']['cap_max']:.0f} "
              f"and {_verdict_words(fluid['ungated']['verdict'])}; gated between {fluid['gated']['cap_min']:.0f} and "
              f"{fluid['gated']['cap_max']:.0f}, {_verdict_words(fluid['gated']['verdict'])}. Request simulator: ungated "
              f"{des['ungated']['cap_min']:.0f}-{des['ungated']['cap_max']:.0f}, {_verdict_words(des['ungated']['verdict'])}, "
              f"TPOT p99 {_fmt(des['ungated']['tpot_p99'])} s; gated {des['gated']['cap_min']:.0f}-{des['gated']['cap_max']:.0f}, "
              f"{_verdict_words(des['gated']['verdict'])}, TPOT p99 {_fmt(des['gated']['tpot_p99'])} s.",
              "", "## Margins of the new loops", "",
              "| loop | envelope ok | worst GM | worst PM (deg) | worst DM (s) | nominal GM / PM / DM | DF limit cycle |",
              "|---|---|---|---|---|---|---|"]
    for k in ("fill", "decode", "batch_gate", "outer"):
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
    lines.append(f"The ungated batch rule (gain 1 every sample) is {'stable' if bg['ungated_stable'] else 'unstable'} by the "
                 "Nyquist count" + (f"; the describing function of the cap's saturation predicts a cycle of period "
                                    f"{bg['ungated_cycle']['period_s']:.1f} s" if bg["ungated_cycle"] else "") + ".")
    return lines
