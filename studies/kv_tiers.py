"""Study `kv-tiers` (reference article sections 2, 20 and 22): KV blobs in a tiered store - HBM,
host DRAM, SSD, dropped and rebuilt from text - and what HBM retention buys.

Section 2: HBM is the hot tier, "too expensive and supply-constrained to be the default for
passive context"; recently idle blobs move to shared DRAM, longer-lived ones to SSD, and a blob
may be dropped and rebuilt from its much smaller text. Section 20: "accelerator HBM is too
expensive to leave data idle in it without immediate use". Section 22 puts the KV lifecycle on the
minutes-to-days scale. The study measures, on long-context agentic sessions (100k-1M contexts,
:func:`tokenfactory.traces.long_context_workload`) served by a K3-like model on 8 x B300 nodes:

(a) **retention sweep** (the store alone, :func:`tokenfactory.plant_models.replay_store`, hours
    of sessions after a warm-up): the share of reusable prefix tokens served from HBM, DRAM and
    SSD and rebuilt, against the HBM tier's retention - and the HBM byte-seconds held idle for
    it; then the whole store's retention (SSD): what is dropped, rebuilt, and what rebuilding
    costs (node-seconds of chunked prefill) against loading;
(b) **midfill latency** (the request simulator, a disaggregated 2 + 2 cluster whose fill
    workers' HBM is the hot tier): TTFT and fill time of midfills by the tier that served their
    prefix, under an HBM-only store with unbounded capacity (the ideal), the tiered store at two
    HBM retentions, and an HBM-only store that must drop what it cannot keep.

Tiers come from the hardware descriptor (:func:`tokenfactory.plant_models.kv_tiers`: the fill
workers' KV capacity; half of every node's host DRAM, pooled, read over min(PCIe, NIC); half of
its local NVMe). Sessions are replayed with their real think times (heavy-tailed: median ~10 s,
minutes to hours in the tail), so retention meets the gaps between turns.

Run: ``tokenfactory study kv-tiers [--quick | --full] [--out DIR]``; ``config={"full": True}`` replays a
day and sweeps more points.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from tokenfactory.plant_models import ClusterConfig, KVTier, RequestPlant, TieredKVStore, kv_tiers, replay_store
from tokenfactory.replay import build_replay
from tokenfactory.studies.report import StudyReport
from tokenfactory.traces import generate_requests, long_context_workload
from tokenfactory.studies.study_config import StudyVariants, resolve_study_config
from tokenfactory.core.validation import ConfigError, check_int, check_number

__all__ = ["CONFIG", "DEFAULT_CONFIG", "run", "rebuild_seconds", "split_warm_up"]

DEFAULT_CONFIG: dict[str, Any] = {
    "plant": {"model": "k3-like", "hardware": "b300"},
    "nodes": 4,                              # nodes whose DRAM and SSD the store pools
    "fill_workers": 2,                       # their HBM is the hot tier; as many decode workers
    "rate_rps": 8.0,                         # calls/s of the long-context sessions
    "warm_up_s": 3600.0,                     # replayed into the store before anything is counted
    "store_hours": 4.0,                      # (a): hours of sessions through the store alone
    "hbm_retention_s": [5.0, 30.0, 120.0, 600.0, 3600.0, math.inf],
    "dram_retention_s": 3600.0,              # (a) HBM sweep: DRAM keeps an idle blob an hour ...
    "ssd_retention_s": [1800.0, 7200.0, 86400.0],  # (a) whole-store sweep (HBM 30 s, DRAM 10 min)
    "des_window_s": 300.0,                   # (b): simulated seconds of arrivals
    "des_hbm_retention_s": [30.0, 600.0],    # (b): the tiered store at these HBM retentions
    "seed": 5,
    "full": False,
}
QUICK: dict[str, Any] = {"rate_rps": 4.0, "warm_up_s": 1800.0, "store_hours": 1.0,
                         "hbm_retention_s": [5.0, 120.0, math.inf], "ssd_retention_s": [600.0, 86400.0],
                         "des_window_s": 120.0, "des_hbm_retention_s": [30.0]}
FULL: dict[str, Any] = {"store_hours": 24.0, "warm_up_s": 7200.0,
                        "hbm_retention_s": [2.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, math.inf],
                        "ssd_retention_s": [600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0], "des_window_s": 600.0}


def _check(cfg: dict[str, Any]) -> None:
    """The ranges of the resolved settings."""
    check_int("kv-tiers.nodes", cfg["nodes"], low=2)
    check_int("kv-tiers.fill_workers", cfg["fill_workers"], low=1, high=cfg["nodes"] - 1)
    for k in ("rate_rps", "store_hours", "des_window_s"):
        check_number(f"kv-tiers.{k}", cfg[k], low=0.0, low_inclusive=False)
    check_number("kv-tiers.warm_up_s", cfg["warm_up_s"], low=0.0)
    for k in ("hbm_retention_s", "ssd_retention_s", "des_hbm_retention_s"):
        if not cfg[k]:
            raise ConfigError(f"kv-tiers.{k}", "needs at least one retention")
        for i, v in enumerate(cfg[k]):
            check_number(f"kv-tiers.{k}[{i}]", v, low=0.0, low_inclusive=False, allow_inf=True)
    check_number("kv-tiers.dram_retention_s", cfg["dram_retention_s"], low=0.0, low_inclusive=False, allow_inf=True)


#: the study's settings: the defaults and its quick and full variants (:mod:`tokenfactory.studies.study_config`)
CONFIG = StudyVariants("kv-tiers", DEFAULT_CONFIG, quick=QUICK, full=FULL, check=_check)


def split_warm_up(table: pd.DataFrame, warm_up_s: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The rows before ``warm_up_s`` (shifted to negative times) and the rest (shifted to start
    at 0), each keeping its row numbers of ``table`` in the ``row`` column.

    Parameters
    ----------
    table : DataFrame
        A request table on one clock.
    warm_up_s : float
        Where measurement starts (s).

    Returns
    -------
    tuple of DataFrame
        ``(warm-up, measured)``.
    """
    t = table.assign(row=np.arange(len(table)))
    t["arrival_s"] = t["arrival_s"] - warm_up_s
    warm, rest = t[t["arrival_s"] < 0].reset_index(drop=True), t[t["arrival_s"] >= 0].reset_index(drop=True)
    warm.attrs = rest.attrs = dict(table.attrs)
    return warm, rest


def rebuild_seconds(params, tokens: float) -> float:
    """Worker seconds to rebuild ``tokens`` of context from text: one sequence's chunked prefill
    in the request simulator's model (replica-sized chunks, each paying for the context before it).

    Parameters
    ----------
    params : DESParams
        The fill worker's service times.
    tokens : float
        Context to rebuild.

    Returns
    -------
    float
    """
    n = params.replica_chunk_tokens
    k = math.ceil(tokens / n)
    steps = k * params.fill_step_time(n)
    # chunk j (0-based) attends j n tokens before it: sum over j of (a n + b) j n, and its own
    # causal attention past the table's uniform piece, which is n / replicas for a lone chunk
    ctx = (params.fill_s_per_token_pair * n + params.fill_s_per_context_token) * n * k * (k - 1) / 2.0
    own = k * params.chunk_context_s(n, 0.0, n)
    return steps + ctx + own


def _tiers(worker, cfg, hbm_ret, dram_ret, ssd_ret, lower=True):
    t = kv_tiers(worker, cfg["nodes"], cfg["fill_workers"], retention_s=(hbm_ret, dram_ret, ssd_ret))
    return t if lower else (KVTier("hbm", t[0].capacity_bytes, math.inf, hbm_ret),)


def _store_row(m: dict, label: str, **extra) -> dict:
    s = m["kv_store"]
    tiers = s["tiers"]
    return {"policy": label, **extra,
            **{f"{k}_share": v["share"] for k, v in tiers.items()}, "rebuilt_share": s["rebuilt_share"],
            "rebuilt_tokens": s["rebuilt_tokens"], "reusable_tokens": s["reusable_tokens"],
            "hbm_idle_byte_seconds": s["hbm_idle_byte_seconds"],
            "hbm_mean_gb": tiers["hbm"]["mean_bytes"] / 1e9,
            **{f"{k}_mean_gb": v["mean_bytes"] / 1e9 for k, v in tiers.items() if k != "hbm"},
            "load_seconds": s["load_seconds"], "blobs_dropped": s["blobs_dropped"]}


def _for(x: float) -> str:
    """A retention in words: "for 5 min" or "without a time limit"."""
    return "without a time limit" if math.isinf(x) else f"for {_fmt_s(x)}"


def _cell(x: float, fmt: str = ".3f") -> str:
    """A table cell: "-" for a tier the policy does not have."""
    return "-" if x != x else format(x, fmt)


def _fmt_s(x: float) -> str:
    if math.isinf(x):
        return "inf"
    return f"{x / 3600:g} h" if x >= 3600 else f"{x / 60:g} min" if x >= 60 else f"{x:g} s"


def _store_section(cfg, plant: dict, workload, report: StudyReport) -> dict[str, Any]:
    """(a) The store alone over hours: HBM retention and whole-store retention sweeps."""
    horizon = cfg["store_hours"] * 3600.0
    trace = generate_requests(workload, cfg["warm_up_s"] + horizon)
    warm, measured = split_warm_up(trace, cfg["warm_up_s"])
    setup = build_replay(measured, plant)
    worker, params = setup.service.fill_worker, setup.params
    bpt = params.kv_bytes_per_token

    def store_run(tiers):
        store = TieredKVStore(tiers, bpt, params.block_tokens, trace=trace)
        replay_store(warm, store, end_s=0.0, rows=warm["row"])
        store.reset_counts()
        rec, m = replay_store(measured, store, end_s=horizon, rows=measured["row"])
        return rec, m

    sweep = []
    for ret in cfg["hbm_retention_s"]:
        rec, m = store_run(_tiers(worker, cfg, ret, max(cfg["dram_retention_s"], ret), math.inf))
        lower = rec[rec["prefix_tier"].isin(["dram", "ssd"])]
        sweep.append(_store_row(m, "tiered", hbm_retention_s=ret, dram_retention_s=max(cfg["dram_retention_s"], ret),
                                requests=len(rec), requests_loading=len(lower),
                                mean_load_s=float(lower["prefix_load_s"].mean()) if len(lower) else 0.0))
    sweep = pd.DataFrame(sweep)
    report.save_table(sweep, "hbm_retention_sweep.csv", "Store alone: prefix shares per tier, HBM idle "
                      "byte-seconds and mean HBM held against the HBM tier's retention.")
    life = []
    for ret in cfg["ssd_retention_s"]:
        rec, m = store_run(_tiers(worker, cfg, 30.0, min(600.0, ret), ret))
        rebuilt = rec.loc[rec["rebuilt_tokens"] > 0, "rebuilt_tokens"].to_numpy()
        life.append({**_store_row(m, "tiered", ssd_retention_s=ret),
                     "rebuild_node_seconds": float(sum(rebuild_seconds(params, x) for x in rebuilt)),
                     "requests_rebuilding": int(len(rebuilt))})
    life = pd.DataFrame(life)
    report.save_table(life, "store_retention_sweep.csv", "Store alone: what the whole store's retention (SSD) "
                      "drops and what rebuilding it costs.")

    return {"measured": measured, "worker": worker, "params": params, "bpt": bpt, "sweep": sweep, "life": life}


def _midfill_section(cfg, plant: dict, workload, st: dict[str, Any], report: StudyReport) -> dict[str, Any]:
    """(b) Midfill latency in the request simulator, per store policy."""
    worker, params, bpt = st["worker"], st["params"], st["bpt"]
    des_full = generate_requests(workload, cfg["warm_up_s"] + cfg["des_window_s"])
    des_warm, window = split_warm_up(des_full, cfg["warm_up_s"])
    des_setup = build_replay(window, plant)
    policies = [("HBM only, unbounded", None)]
    policies += [(f"tiered, HBM {_fmt_s(r)}", _tiers(worker, cfg, r, max(cfg["dram_retention_s"], r), math.inf))
                 for r in cfg["des_hbm_retention_s"]]
    policies.append((f"HBM only, {_fmt_s(cfg['des_hbm_retention_s'][0])}, drop",
                     _tiers(worker, cfg, cfg["des_hbm_retention_s"][0], math.inf, math.inf, lower=False)))
    des_rows, by_source, recs = [], [], {}
    cl = ClusterConfig(fill_workers=cfg["fill_workers"], decode_workers=cfg["nodes"] - cfg["fill_workers"],
                       progress=False, slo_ttft_s=20.0, slo_tpot_s=0.1, drain_s=300.0, seed=cfg["seed"])
    for label, tiers in policies:
        big = tiers is None
        store = TieredKVStore(tiers or (KVTier("hbm", math.inf, math.inf),), bpt, params.block_tokens, trace=des_full)
        replay_store(des_warm, store, end_s=0.0, rows=des_warm["row"])
        store.reset_counts()
        store.bind(window["row"])
        res = RequestPlant(des_setup.params, cl, prefix_cache=store).run(window.drop(columns=["row"]))
        r = res.records
        is_mid = (window["cached_tokens"] > 0).to_numpy() & (r["state"] != "not_arrived").to_numpy()
        mid = r[is_mid & (r["state"] == "completed").to_numpy()]
        fill = mid["fill_end_s"] - mid["fill_start_s"]
        m = res.metrics
        des_rows.append({**_store_row(m, label), "unbounded": big, "requests": m["requests"],
                         "completed": m["completed"], "midfills": len(mid), "midfills_arrived": int(is_mid.sum()),
                         "midfill_ttft_p50": float(mid["ttft_s"].median()), "midfill_ttft_p99": float(mid["ttft_s"].quantile(0.99)),
                         "midfill_fill_p50": float(fill.median()), "midfill_fill_p99": float(fill.quantile(0.99)),
                         "ttft_p99": m["ttft_p99"], "tpot_p99": m["tpot_p99"], "slo_attainment": m["slo_attainment"]})
        for src, g in mid.groupby("prefix_tier"):
            f = g["fill_end_s"] - g["fill_start_s"]
            by_source.append({"policy": label, "source": src, "midfills": len(g),
                              "ttft_p50": float(g["ttft_s"].median()), "ttft_p99": float(g["ttft_s"].quantile(0.99)),
                              "fill_p50": float(f.median()), "fill_p99": float(f.quantile(0.99)),
                              "load_p50": float(g["prefix_load_s"].median())})
        recs[label] = mid
    des_table = pd.DataFrame(des_rows)
    src_table = pd.DataFrame(by_source)
    report.save_table(des_table, "midfill_latency.csv", "Request simulator: midfill TTFT and fill time per store policy.")
    report.save_table(src_table, "midfill_by_source.csv", "Request simulator: midfills by the tier that served "
                      "their prefix.")

    return {"rows": des_rows, "by_source": by_source, "recs": recs, "table": des_table, "by_source_table": src_table}


def _figures(cfg, report: StudyReport, sweep: pd.DataFrame, life: pd.DataFrame, recs: dict) -> None:
    """The store sweeps' figure and the midfill latency CDFs."""
    fig = Figure(figsize=(13, 4.2), layout="constrained")
    ax = fig.subplots(1, 3)
    xs = np.arange(len(sweep))
    labels = [_fmt_s(r) for r in sweep["hbm_retention_s"]]
    bottom = np.zeros(len(sweep))
    for k, (col, name) in enumerate((("hbm_share", "HBM"), ("dram_share", "DRAM"), ("ssd_share", "SSD"),
                                     ("rebuilt_share", "rebuilt"))):
        ax[0].bar(xs, sweep[col], bottom=bottom, color=f"C{k}", label=name)
        bottom += sweep[col].to_numpy()
    ax[0].set_xticks(xs, labels)
    ax[0].set_xlabel("HBM retention")
    ax[0].set_ylabel("share of reusable prefix tokens")
    ax[0].legend(fontsize=8)
    ax[0].set_title("where prefixes come from")
    ax[1].plot(xs, sweep["hbm_mean_gb"], "o-", color="C3")
    ax[1].set_xticks(xs, labels)
    ax[1].set_xlabel("HBM retention")
    ax[1].set_ylabel("idle KV held in HBM (GB, mean)")
    ax[1].set_title("what the hit ratio costs in HBM")
    ax[1].grid(True, alpha=0.3)
    ax[2].plot([_fmt_s(r) for r in life["ssd_retention_s"]], life["rebuilt_share"], "o-", color="C3", label="rebuilt share")
    ax2 = ax[2].twinx()
    ax2.plot([_fmt_s(r) for r in life["ssd_retention_s"]], life["rebuild_node_seconds"] / 3600.0, "s--", color="C4",
             label="rebuild node-hours")
    ax[2].set_xlabel("store retention (SSD)")
    ax[2].set_ylabel("rebuilt share of reusable tokens")
    ax2.set_ylabel("rebuild cost (node-hours)")
    ax[2].set_title("drop and rebuild")
    ax[2].grid(True, alpha=0.3)
    report.save_figure(fig, "kv_tiers.png", _sweep_caption(sweep, life, cfg))

    fig = Figure(figsize=(11, 4), layout="constrained")
    ax = fig.subplots(1, 2)
    q = np.linspace(0.0, 1.0, 101)
    for k, (label, mid) in enumerate(recs.items()):
        if len(mid):  # the CDF at 101 quantiles
            f = np.quantile((mid["fill_end_s"] - mid["fill_start_s"]).to_numpy(), q)
            ax[0].plot(np.maximum(f, 1e-3), q, color=f"C{k}", label=label, drawstyle="steps-post")
            ax[1].plot(np.maximum(np.quantile(mid["ttft_s"].to_numpy(), q), 1e-3), q, color=f"C{k}", label=label,
                       drawstyle="steps-post")
    for a, what in zip(ax, ("midfill fill time (s)", "midfill TTFT (s)")):
        a.set_xscale("log")
        a.set_xlabel(what)
        a.set_ylabel("fraction of midfills")
        a.grid(True, alpha=0.3)
    ax[0].legend(fontsize=8)
    report.save_figure(fig, "midfill_latency.png", "Midfill fill time and TTFT (CDF) per store policy in the "
                       f"request simulator ({cfg['fill_workers']} fill + {cfg['nodes'] - cfg['fill_workers']} decode "
                       f"{cfg['plant']['model']} workers on 8x{cfg['plant']['hardware']}).")



def run(out_dir: str | Path, quick: bool = False, config: dict[str, Any] | None = None,
        full: bool = False) -> dict[str, Any]:
    """Run the study into ``out_dir`` (``quick``: the test variant; ``full``, or ``config={"full": True}``:
    the heavier grid; ``config``: overrides of :data:`DEFAULT_CONFIG`); returns its metrics."""
    cfg = resolve_study_config(CONFIG, config, quick=quick, full=full)
    report = StudyReport("kv-tiers", Path(out_dir), cfg)
    plant = {**cfg["plant"], "fill_workers": cfg["fill_workers"], "decode_workers": cfg["nodes"] - cfg["fill_workers"]}
    workload = long_context_workload(mean_rate_rps=cfg["rate_rps"], seed=cfg["seed"])
    st = _store_section(cfg, plant, workload, report)
    measured, worker, params, bpt, sweep, life = (st[k] for k in ("measured", "worker", "params", "bpt", "sweep",
                                                                    "life"))
    mf = _midfill_section(cfg, plant, workload, st, report)
    des_rows, by_source, recs, des_table, src_table = (mf[k] for k in ("rows", "by_source", "recs", "table",
                                                                        "by_source_table"))
    _figures(cfg, report, sweep, life, recs)

    # summary -------------------------------------------------------------------------------------
    # rebuild against load for the median midfill's prefix
    prefix = float(measured.loc[measured["cached_tokens"] > 0, "cached_tokens"].median())
    lower = {t.name: prefix * bpt / t.read_bandwidth for t in _tiers(worker, cfg, 1.0, 1.0, 1.0)[1:]}
    rebuild_vs_load = {"prefix_tokens": prefix, "rebuild_s": rebuild_seconds(params, prefix),
                       **{f"load_{k}_s": v for k, v in lower.items()}}
    lines = _summary_lines(sweep, life, des_table, src_table, cfg, worker, rebuild_vs_load)
    ref = sweep.iloc[int(np.argmin(np.abs(np.log(np.where(np.isinf(sweep["hbm_retention_s"]), 1e12,
                                                          sweep["hbm_retention_s"])) - np.log(120.0))))]
    report.headline(f"HBM hit share at {_fmt_s(ref['hbm_retention_s'])} HBM retention", round(float(ref["hbm_share"]), 3),
                    note=f"DRAM {ref['dram_share']:.3f}, SSD {ref['ssd_share']:.3f}, rebuilt {ref['rebuilt_share']:.3f}")
    inf_row = sweep.iloc[-1]
    report.headline(f"idle HBM at {_fmt_s(inf_row['hbm_retention_s'])} retention", round(float(inf_row["hbm_mean_gb"]), 1),
                    "GB", note=f"{ref['hbm_mean_gb']:.1f} GB at {_fmt_s(ref['hbm_retention_s'])}")
    hb = src_table[(src_table["source"] == "hbm")]
    if len(hb):
        report.headline("midfill TTFT p50, prefix in HBM", round(float(hb["ttft_p50"].median()), 2), "s")
    return report.finish({"hbm_retention_sweep": sweep.to_dict("records"), "store_retention_sweep": life.to_dict("records"),
                          "midfill_latency": des_rows, "midfill_by_source": by_source, "rebuild_vs_load": rebuild_vs_load, "kv_bytes_per_token": bpt,
                          "tiers": [t.__dict__ for t in _tiers(worker, cfg, math.inf, math.inf, math.inf)]}, lines)


def _sweep_caption(sweep: pd.DataFrame, life: pd.DataFrame, cfg: dict) -> str:
    lo, hi = sweep.iloc[0], sweep.iloc[-1]
    more = "more" if hi["hbm_share"] > lo["hbm_share"] else "no more"
    return (f"Left: shares of reusable prefix tokens by tier as HBM retention grows from {_fmt_s(lo['hbm_retention_s'])} "
            f"to {_fmt_s(hi['hbm_retention_s'])}: HBM serves {lo['hbm_share']:.0%} -> {hi['hbm_share']:.0%} ({more} hits), "
            f"at {lo['hbm_mean_gb']:.0f} -> {hi['hbm_mean_gb']:.0f} GB of idle KV held in HBM on average (middle). Right: "
            f"the store's retention from {_fmt_s(life.iloc[0]['ssd_retention_s'])} to "
            f"{_fmt_s(life.iloc[-1]['ssd_retention_s'])}: rebuilt share {life.iloc[0]['rebuilt_share']:.2%} -> "
            f"{life.iloc[-1]['rebuilt_share']:.2%}, rebuild {life.iloc[0]['rebuild_node_seconds'] / 3600:.2f} -> "
            f"{life.iloc[-1]['rebuild_node_seconds'] / 3600:.2f} node-hours over {cfg['store_hours']:g} h.")


def _summary_lines(sweep, life, des, src, cfg, worker, rvl) -> list[str]:
    tiers = _tiers(worker, cfg, math.inf, math.inf, math.inf)
    lines = [f"Long-context sessions at {cfg['rate_rps']:g} calls/s on {cfg['nodes']} nodes of 8x{cfg['plant']['hardware']} "
             f"({cfg['plant']['model']}); store tiers: " + ", ".join(
                 f"{t.name} {t.capacity_bytes / 1e12:.1f} TB" + (f" read at {t.read_bandwidth / 1e9:.0f} GB/s"
                                                                 if t.read_bandwidth < math.inf else "")
                 for t in tiers) + f". A {_fmt_s(cfg['warm_up_s'])} warm-up is replayed into the store first.", "",
             f"(a) The store alone over {cfg['store_hours']:g} h (DRAM retention {_fmt_s(cfg['dram_retention_s'])}, "
             "SSD unlimited):", "",
             "| HBM retention | HBM | DRAM | SSD | rebuilt | idle HBM mean GB | HBM idle TB-s | load s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in sweep.itertuples():
        lines.append(f"| {_fmt_s(r.hbm_retention_s)} | {r.hbm_share:.3f} | {r.dram_share:.3f} | {r.ssd_share:.3f} | "
                     f"{r.rebuilt_share:.4f} | {r.hbm_mean_gb:.0f} | {r.hbm_idle_byte_seconds / 1e12:.0f} | "
                     f"{r.load_seconds:.0f} |")
    lo, hi = sweep.iloc[0], sweep.iloc[-1]
    gain = hi["hbm_share"] - lo["hbm_share"]
    cost = hi["hbm_mean_gb"] - lo["hbm_mean_gb"]
    fill = float(des["midfill_fill_p50"].iloc[0])  # the ideal store's median midfill fill time
    ms = lo["mean_load_s"] * 1e3
    cheap = lo["mean_load_s"] < 0.1 * fill
    moved = (f"moves {gain:.1%} of the reusable prefix tokens from the lower tiers to HBM" if gain > 0.001 else
             "moves no reusable prefix tokens to HBM")
    held = f"holds {cost:.0f} GB more" if cost >= 0 else f"holds {-cost:.0f} GB less"
    lines += ["", (f"Keeping idle blobs in HBM {_for(hi['hbm_retention_s'])} instead of "
                   f"{_for(lo['hbm_retention_s'])} {moved} and {held} idle KV in HBM on average. What it saves is the loads: at "
                   f"{_fmt_s(lo['hbm_retention_s'])}, {lo['requests_loading']} of {lo['requests']} requests load their "
                   f"prefix from DRAM or SSD, {ms:.0f} ms each on average, against a median midfill fill time of "
                   f"{fill:.2f} s - " + (
                       "so HBM retention beyond the gaps between turns buys little that DRAM does not give back at a "
                       "fraction of HBM's cost (section 20: HBM is too expensive to hold idle data)." if cheap else
                       f"a load costs {lo['mean_load_s'] / fill:.0%} of a midfill, so HBM retention pays for itself "
                       "here.")), "",
              "The store's lifetime (HBM 30 s, DRAM up to 10 min, SSD as given):", "",
              "| SSD retention | rebuilt share | requests rebuilding | rebuild node-hours | blobs dropped |",
              "|---|---|---|---|---|"]
    for r in life.itertuples():
        lines.append(f"| {_fmt_s(r.ssd_retention_s)} | {r.rebuilt_share:.4f} | {r.requests_rebuilding} | "
                     f"{r.rebuild_node_seconds / 3600:.2f} | {r.blobs_dropped} |")
    slowest = max(v for k, v in rvl.items() if k.startswith("load_"))
    lines += ["", f"Rebuilding the median midfill's prefix ({rvl['prefix_tokens'] / 1e3:.0f}k tokens) from text takes "
                  f"{rvl['rebuild_s']:.1f} s of a fill worker (chunked prefill, each chunk paying for the context before "
                  "it); loading it takes " + ", ".join(f"{v * 1e3:.0f} ms from {k[5:-2].upper()}" for k, v in rvl.items()
                                                        if k.startswith("load_"))
              + (f" - {rvl['rebuild_s'] / slowest:.0f}x less than the rebuild even from the slowest tier, so every "
                 "blob the store drops that a session comes back to costs far more than keeping it on SSD." if
                 rvl["rebuild_s"] > slowest else " - a rebuild is no slower than a load here.")]
    lines += ["", f"(b) Midfills in the request simulator ({_fmt_s(cfg['des_window_s'])} of arrivals):", "",
              "| store | midfills completed of arrived | HBM | DRAM | SSD | rebuilt | fill p50 s | fill p99 s | TTFT p50 s | TTFT p99 s |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in des.itertuples():
        lines.append(f"| {r.policy} | {r.midfills} of {r.midfills_arrived} | {r.hbm_share:.3f} | {_cell(r.dram_share)} | "
                     f"{_cell(r.ssd_share)} | {r.rebuilt_share:.3f} | {r.midfill_fill_p50:.2f} | "
                     f"{r.midfill_fill_p99:.2f} | {r.midfill_ttft_p50:.2f} | {r.midfill_ttft_p99:.2f} |")
    lines += ["", "By the tier that served the prefix:", "", "| store | source | midfills | load p50 s | fill p50 s | "
              "fill p99 s | TTFT p50 s |", "|---|---|---|---|---|---|---|"]
    for r in src.itertuples():
        lines.append(f"| {r.policy} | {r.source} | {r.midfills} | {r.load_p50:.3f} | {r.fill_p50:.2f} | {r.fill_p99:.2f} "
                     f"| {r.ttft_p50:.2f} |")
    reb = src[src["source"] == "rebuilt"]
    hbm = src[src["source"] == "hbm"]
    low = src[src["source"].isin(["dram", "ssd"])]
    if len(hbm) and len(low):
        lines += ["", f"A prefix loaded from DRAM or SSD adds {low['load_p50'].median() * 1e3:.0f} ms (median) to a "
                      f"midfill whose fill takes {hbm['fill_p50'].median():.2f} s from HBM"
                  + (f"; a rebuilt one takes {reb['fill_p50'].median():.1f} s." if len(reb) else ".")]
    elif len(reb) and len(hbm):
        lines += ["", f"A rebuilt prefix makes a midfill take {reb['fill_p50'].median():.1f} s against "
                      f"{hbm['fill_p50'].median():.2f} s from HBM."]
    return lines
