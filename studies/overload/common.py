"""What the overload study's sections share: the policies and traces compared, the traces' loading
(a synthetic stand-in when one is absent), the load axis's capacity, one sweep row and its
goodput and miss causes.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from tokenfactory.registry import RECOMMENDED_ADMISSION
from tokenfactory.replay import infeasible, request_costs
from tokenfactory.traces import (
    SyntheticWorkload,
    generate_requests,
    load_trace,
    spread_quantized_arrivals,
    trace_available,
)

__all__ = ["POLICIES", "TRACES", "COLLAPSE_TRACES", "goodput_in_window", "miss_causes"]


#: admission policies compared (registry kinds), baselines first
POLICIES = ("open", "vllm-watermark", "mooncake", "mooncake-predictive", "smoothed", RECOMMENDED_ADMISSION)
#: the traces of the load sweep
TRACES = ("mooncake-conversation", "azure-conv-2023", "azure-code-2023", "agentic-coding")
#: traces the no-collapse target is checked on
COLLAPSE_TRACES = ("mooncake-conversation", "azure-conv-2023", "azure-code-2023")
POLICY_LABELS = {"open": "open", "vllm-watermark": "vLLM watermark", "mooncake": "Mooncake early rejection",
          "mooncake-predictive": "Mooncake predictive rejection", "smoothed": "smoothed (previous)",
          RECOMMENDED_ADMISSION: "SLO-aware (new)"}


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


def load_named_trace(name: str, span_s: float, seed: int) -> tuple[pd.DataFrame, bool]:
    """(trace, synthetic?): the registered trace with quantized arrivals spread over their slot."""
    if trace_available(name):
        return spread_quantized_arrivals(load_trace(name), seed=seed), False
    return _synthetic(name, span_s, seed), True


def standin_labels(names: list[str]) -> dict[str, str]:
    """Each trace's label should it be absent: ``synthetic stand-in for A, B`` over the absent
    traces that share a stand-in (the agentic one has its own: sessions)."""
    absent = [n for n in names if not trace_available(n)]
    groups = {kind: [n for n in absent if ("agentic" in n) == kind] for kind in (False, True)}
    return {n: f"synthetic stand-in for {', '.join(groups['agentic' in n])}" for n in absent}


def trace_window(tr: pd.DataFrame, start_s: float, end_s: float) -> pd.DataFrame:
    out = tr[(tr["arrival_s"] >= start_s) & (tr["arrival_s"] < end_s)].copy()
    out["arrival_s"] -= start_s
    out.attrs = dict(tr.attrs)
    return out


def load_capacity(setup, cluster: dict) -> tuple[float, str, float]:
    """(capacity, bottleneck, batch cap) of the cluster the study simulates
    (:meth:`tokenfactory.replay.ReplaySetup.capacity`: its pools, SLOs and classes)."""
    c = setup.capacity(cluster)
    return c.model_rps, c.bottleneck, c.batch_cap


def trace_for_load(tr: pd.DataFrame, setup, load: float, replay_s: float | None, cluster: dict) -> pd.DataFrame:
    """The part of the trace that replays for about ``replay_s`` seconds at ``load`` (the whole trace
    for ``None`` or when shorter)."""
    if replay_s is None or tr.attrs.get("per_session_clock"):
        return tr
    rate = len(tr) / max(float(tr["arrival_s"].max()), 1e-9)
    scale = load * load_capacity(setup, cluster)[0] / rate
    return trace_window(tr, 0.0, replay_s * scale)


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


def slo_met(records: pd.DataFrame, classes) -> np.ndarray:
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


def sweep_row(trace: str, load: float, policy: str, m: dict, res, setup, cap: tuple, classes, span_s: float,
         synthetic: bool) -> dict:
    rec = res.records
    met = slo_met(rec, classes)
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



def fmt_number(x, spec=".3f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)

