"""Study `layered-stack`: the layered control stack (article section 22) on one plant.

(a) the stack certificate of the shipped scenario (margins over the envelope, separation of every
    adjacent pair of layers, describing-function checks) and of a deliberately mis-tuned one;
(b) separation in simulation: a demand disturbance in the admission band (tens of seconds) must
    not make the reconfiguration layer act (actions, coherence of pool sizes with admission);
(c) the comparison on ServeGen rates through the pool model (the 10-minute rates disaggregated to
    Poisson arrivals as in the reconfiguration study): the full stack, the stack without its
    planning layer, today's deployments (:data:`tokenfactory.registry.BASELINE_STACKS`) and the
    oracle (the least GPU-hours any plan could use with perfect knowledge of the demand, the same
    start-up and SLO), with a figure of each layer's activity on one time axis;
(d) the mixed week on a fixed fleet (:func:`tokenfactory.stack.mixed_workload_for`: chat by day,
    long-prompt batch by night, so the fill:decode need ratio swings ~15 x a day): the stack (role
    moves between the pools), the best static split for the run (no moves, chosen by the oracle)
    and the stack without planning; GPU-hours are the fleet's whatever the policy, so the rows
    compare SLO attainment, role moves/h, reversals/h and oscillation. The baselines (HPA, KPA,
    Dynamo, APA) run in the full variant with the fleet as their replica limit: the fleet is a
    cluster's node quota, each pool's deployment takes free workers from it and a worker one pool
    releases is placed in the other (the plant's fixed-fleet rule), so they move roles too, blindly.
(e) the same stack on requests (:mod:`tokenfactory.stack.on_requests`): a morning ramp through the
    request simulator with every layer sampled - the gated batch cap every 0.25 s on the live
    context - next to the same arrivals in the pool model, for the shipped stack (smoothed
    admission) and ``stack_slo_aware`` (SLO-aware admission).

Run: ``tokenfactory study layered-stack [--quick] [--out DIR]``. The default run is the first 12 h
of m-large's last 4 days at start-ups of 2 and 10 minutes (``--quick``: 3 h at 10 minutes) against
Dynamo's throughput planner (Kalman) + Mooncake and HPA + vLLM's watermark; ``config={"full":
True}`` runs the last 4 days of m-large and m-small at start-ups of 2, 5 and 10 minutes against
every baseline (the slow test; Dynamo's ARIMA predictor makes it tens of minutes). The mixed week:
7 days at 2, 5 and 10 minutes in the full variant; 1 day at 10 minutes (stack, static split, stack
without planning) by default; 6 hours (stack, static split) with ``--quick``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from scipy import signal as sps

from tokenfactory.controllers.separation import required_ratio
from tokenfactory.plant_models import PoolPlant, PoolScenario
from tokenfactory.registry import BASELINE_STACKS
from tokenfactory.stack import (
    STATIC_SPLIT,
    gate_fraction,
    build_stack,
    certify,
    load_stack_scenario,
    mixed_workload_for,
    morning_ramp,
    plant_for,
    run_on_rates,
    run_stack_on_both_plants,
    stack_scenario_from_dict,
)
from tokenfactory.studies.study_config import StudyVariants, resolve_study_config
from tokenfactory.studies.report import StudyReport, human, markdown_table
from tokenfactory.traces import trace_available
from tokenfactory.traces.rate_workloads import rate_workload
from tokenfactory.core.validation import ConfigError, reject_unknown_keys

__all__ = ["CONFIG", "run", "separation_in_simulation", "MISTUNED"]

#: the mis-tuned variant: reconfiguration faster than admission (a 10 s start-up, a 10 s backlog
#: clearance and a slow 20 s admission) - the certificate must fail and name the layer
MISTUNED = {"dynamics": {"startup_s": 10.0, "warmup_s": 0.0},
            "layers": {"admission": {"kind": "smoothed", "sample_period_s": 20.0},
                       "reconfiguration": {"kind": "planned-hysteretic", "sample_period_s": 20.0,
                                           "queue_clear_s": 10.0}}}


def _mistuned(base: dict) -> dict:
    d = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    d["name"] = "stack_mistuned"
    d["dynamics"] = {**d.get("dynamics", {}), **MISTUNED["dynamics"]}
    d["layers"] = {k: dict(v) for k, v in MISTUNED["layers"].items()}
    return d


def separation_in_simulation(sc, *, period_s: float = 20.0, depth: float = 0.15, duration_s: float = 1800.0,
                             seed: int = 5) -> dict:
    """Inject a demand oscillation in the admission band and check that the reconfiguration layer
    does not act on it: scale actions with and without the disturbance, and the coherence between
    the admission rate (the inner layer's signal) and the provisioned workers (the outer layer's
    action) at the disturbance frequency."""
    params = plant_for(sc, int(sc.config["plant"].get("prompt_tokens", 2048)),
                       int(sc.config["plant"].get("output_tokens", 512)))
    s = sc.with_overrides(params=params, planning=False)
    dt = 1.0
    t = np.arange(0.0, duration_s + dt, dt)
    out = {"period_s": period_s, "depth": depth}
    for key, amp in (("quiet", 0.0), ("disturbed", depth)):
        ctrl, plant = build_stack(s, name=key, plant_step_s=dt)
        demand = pd.Series(s.rate_rps * (1.0 + amp * np.sin(2 * np.pi * t / period_s)), index=t)
        r = PoolPlant(plant.params, plant.fill_workers, plant.decode_workers, s.dynamics).run(
            PoolScenario(demand, duration_s, dt=dt, control_start_s=60.0, seed=seed,
                         slo_ttft_s=s.slo_ttft_s, slo_tpot_s=s.slo_tpot_s), [ctrl])
        after = r.series[r.series["time_s"] >= 300.0]
        prov = (after["fill_workers"] + after["fill_workers_starting"] + after["decode_workers"]
                + after["decode_workers_starting"]).to_numpy(dtype=float)
        adm = np.minimum(after["admission_rate"].to_numpy(dtype=float), 1e9)
        coh = math.nan
        if np.std(prov) > 0 and np.std(adm) > 0:
            f, c = sps.coherence(adm, prov, fs=1.0 / dt, nperseg=256)
            coh = float(c[np.argmin(np.abs(f - 1.0 / period_s))])
        out[key] = {"scale_actions": int(len(r.actions)), "provisioned_std": float(np.std(prov)),
                    "admission_rate_std": float(np.std(adm)), "coherence_at_disturbance": coh,
                    "slo_attainment": r.metrics["slo_attainment"]}
    out["outer_acted_on_inner_band"] = out["disturbed"]["scale_actions"] > out["quiet"]["scale_actions"]
    return out


def _layer_figure(r, ctrl, title: str) -> Figure:
    """Each layer's activity on one time axis: demand and plan, pool sizes and floors, admission."""
    s = r.series
    th = s["time_s"] / 3600.0
    fig = Figure(figsize=(11, 9), layout="constrained")
    ax = fig.subplots(4, 1, sharex=True)
    ax[0].plot(th, s["demand"], lw=0.8, label="demand (req/s)")
    planning = ctrl.layer("planning")
    tr = pd.DataFrame(planning.controllers[0].trace) if planning is not None else pd.DataFrame()
    if len(tr):
        planned = tr["observed_rps"] * tr["rise"].fillna(1.0) * (1.0 + tr["headroom"].fillna(0.0))
        ax[0].step(tr["time_s"] / 3600.0, planned, where="post", lw=1.2,
                   label="planning: observed x rise x (1 + headroom)")
    ax[0].set_ylabel("req/s")
    ax[0].set_title(title)
    for i, pool in enumerate(("fill", "decode")):
        a = ax[1 + i]
        a.step(th, s[f"{pool}_workers"] + s[f"{pool}_workers_starting"], where="post", lw=1.0,
               label=f"reconfiguration: {pool} provisioned")
        a.step(th, s[f"{pool}_workers"], where="post", lw=0.8, ls="--", label=f"{pool} serving")
        a.set_ylabel("workers")
    ax[3].plot(th, np.minimum(s["admission_rate"], s["demand"].max() * 3), lw=0.6, label="admission: rate")
    # `rejected` is the cumulative count (a shared series column): its rate is the step difference over dt
    dt = max(float(r.config["scenario"]["dt"]), 1e-9)
    rejected_rps = np.diff(s["rejected"].to_numpy(), prepend=float(s["rejected"].iloc[0])) / dt
    ax[3].plot(th, rejected_rps, lw=0.6, label="rejected (req/s)")
    ax[3].set_ylabel("req/s")
    ax[3].set_xlabel("time (h)")
    for a in ax:
        a.grid(alpha=0.3)
        a.legend(fontsize=7, loc="upper right")
    return fig


def _requests_figure(r, ctrl, startup_s: float, admission: str = "smoothed") -> Figure:
    """The stack in the request simulator: arrivals and admissions, provisioned workers, the gated
    batch cap and the decode pass time against the gate's target."""
    s = r.series
    tm = s["time_s"] / 60.0
    fig = Figure(figsize=(11, 8), layout="constrained")
    ax = fig.subplots(3, 1, sharex=True)
    ax[0].plot(tm, s["arrival_rate"].rolling(50, min_periods=1).mean(), lw=0.8, label="arrivals (5 s mean, req/s)")
    ax[0].plot(tm, s["admitted_rate"].rolling(50, min_periods=1).mean(), lw=0.8, label="admitted (5 s mean)")
    ax[0].set_ylabel("req/s")
    ax[0].set_title(f"the stack on requests ({admission} admission, start-up {startup_s:.0f} s)")
    for pool in ("fill", "decode"):
        ax[1].step(tm, s[f"{pool}_workers"] + s[f"{pool}_workers_starting"], where="post", lw=1.0,
                   label=f"{pool} provisioned")
    ax[1].set_ylabel("workers")
    ax[2].step(tm, s["decode_batch_cap"], where="post", lw=1.0, color="C3", label="batch cap (per worker)")
    ax[2].set_ylabel("sequences")
    a2 = ax[2].twinx()
    a2.plot(tm, s["decode_pass_s"] * 1e3, lw=0.5, color="C4", alpha=0.7, label="decode pass (ms)")
    gate = ctrl.layer("batch_gate")
    if gate is not None and gate.sampled:
        a2.axhline(gate.controllers[0].target_s * 1e3, color="C4", ls="--", lw=0.8, label="gate target")
    a2.set_ylabel("ms")
    a2.legend(fontsize=7, loc="lower right")
    ax[2].set_xlabel("time (min)")
    for a in ax:
        a.grid(alpha=0.3)
        a.legend(fontsize=7, loc="upper left")
    return fig


def _mix_figure(runs: dict, split: dict, title: str) -> Figure:
    """The mixed workload on one time axis: the mix (prompt and output factors, the fill pool's
    share of the need), each pool's provisioned workers under the stack and the static split next
    to the need, and the stack's role moves."""
    s = runs["stack"].series
    th = s["time_s"] / 3600.0
    mu = runs["mu"]
    fig = Figure(figsize=(11, 10), layout="constrained")
    ax = fig.subplots(5, 1, sharex=True)
    ax[0].plot(th, s["demand"], lw=0.8, label="demand (req/s)")
    ax[0].set_ylabel("req/s")
    ax[0].set_title(title)
    ax0 = ax[0].twinx()
    ax0.plot(th, s["prompt_factor"], lw=0.8, color="C1", label="prompt (fill work) factor")
    ax0.plot(th, s["output_factor"], lw=0.8, color="C2", label="output factor")
    ax0.set_ylabel("x mean request")
    ax0.legend(fontsize=7, loc="upper left")
    need = {p: s["demand"] * s["prompt_factor" if p == "fill" else "output_factor"] / mu[p] for p in ("fill", "decode")}
    ax[1].plot(th, need["fill"] / (need["fill"] + need["decode"]), lw=0.8, label="fill share of the worker need")
    ax[1].set_ylabel("share")
    for i, pool in enumerate(("fill", "decode")):
        a = ax[2 + i]
        a.plot(th, need[pool], lw=0.7, color="0.5", label=f"{pool} need (workers at full speed)")
        a.step(th, s[f"{pool}_workers"] + s[f"{pool}_workers_starting"], where="post", lw=1.0,
               label=f"stack: {pool} provisioned")
        a.axhline(split[f"static_{pool}_workers"], color="C3", ls="--", lw=1.0, label=f"static split: {pool}")
        a.set_ylabel("workers")
    ax[4].step(th, s["role_moves"], where="post", lw=1.0, label="stack: role moves (cumulative)")
    ax[4].set_ylabel("moves")
    ax[4].set_xlabel("time (h)")
    for a in ax:
        a.grid(alpha=0.3)
        a.legend(fontsize=7, loc="upper right")
    return fig


def _mix_verdicts(rows: list[dict]) -> list[str]:
    """Per start-up on the fixed-fleet mixed workload: the stack vs the static split and the stack
    without planning - SLO, role moves, reversals - sentences from the numbers."""
    lines = []
    for key in dict.fromkeys((r["workload"], r["startup_s"]) for r in rows):
        rs = {r["stack"]: r for r in rows if (r["workload"], r["startup_s"]) == key}
        st, ss, nop = rs.get("stack"), rs.get(STATIC_SPLIT), rs.get("stack-no-planning")
        if st is None:
            continue
        parts = [f"stack SLO {st['slo_attainment']:.4f} ({'meets' if st['slo_attainment'] >= 0.99 else 'misses'} "
                 f"0.99) with {st['role_moves_per_hour']:.2f} role moves/h, {st['reversals_per_hour']:.2f} reversals/h, "
                 f"{'OSCILLATING' if st['oscillating'] else 'not oscillating'}"]
        if ss is not None:
            d = st["slo_attainment"] - ss["slo_attainment"]
            verdict = "better than" if d > 1e-4 else ("worse than" if d < -1e-4 else "as good as")
            parts.append(f"static split {ss['static_fill_workers']} fill / {ss['static_decode_workers']} decode (the oracle's best "
                         f"fixed split: its worst interval runs at {ss['static_worst_load']:.2f} x the SLO's utilisation "
                         f"ceiling; holding both peaks at the ceiling needs {ss['static_split_needs']} workers, the fleet "
                         f"has {ss['fleet_size']}) reaches SLO "
                         f"{ss['slo_attainment']:.4f}: the stack is {verdict} the static split ({d:+.4f})")
        if nop is not None:
            parts.append(f"without planning SLO {nop['slo_attainment']:.4f}, {nop['role_moves_per_hour']:.2f} role "
                         f"moves/h, {nop['reversals_per_hour']:.2f} reversals/h")
        base = [r for n, r in rs.items() if n not in ("stack", STATIC_SPLIT, "stack-no-planning")]
        if base:
            best = max(base, key=lambda r: r["slo_attainment"])
            parts.append(f"best baseline {best['stack']} SLO {best['slo_attainment']:.4f}")
        lines.append(f"- **{key[0]}, start-up {key[1]:.0f} s**: " + "; ".join(parts))
    return lines


def _verdicts(rows: list[dict]) -> list[str]:
    """Per workload and start-up: the stack vs the oracle, the baselines that reach SLO >= 0.99 and
    the fewest reversals - sentences from the numbers."""
    lines = []
    for key in dict.fromkeys((r["workload"], r["startup_s"]) for r in rows):
        rs = [r for r in rows if (r["workload"], r["startup_s"]) == key]
        st = next((r for r in rs if r["stack"] == "stack"), None)
        if st is None:
            continue
        ok_base = [r for r in rs if r["stack"] not in ("stack", "stack-no-planning") and r["slo_attainment"] >= 0.99]
        cheaper = [r["stack"] for r in ok_base if r["gpu_hours"] < st["gpu_hours"] * (1 - 1e-3)]
        fewest = min(rs, key=lambda r: r["reversals_per_hour"])
        ok_all = [r for r in rs if r["slo_attainment"] >= 0.99]
        fewest_ok = min(ok_all, key=lambda r: r["reversals_per_hour"]) if ok_all else None
        nop = next((r for r in rs if r["stack"] == "stack-no-planning"), None)
        parts = [f"stack {st['gpu_hours_over_oracle']:.3f} x oracle, SLO {st['slo_attainment']:.4f} "
                 f"({'meets' if st['slo_attainment'] >= 0.99 else 'misses'} 0.99, "
                 f"{'within' if st['gpu_hours_over_oracle'] <= 1.10 else 'over'} 1.10 x oracle)"]
        parts.append("cheaper baselines at SLO >= 0.99: " + (", ".join(cheaper) if cheaper else "none"))
        parts.append("fewest reversals/h among runs at SLO >= 0.99: " + (
            f"{fewest_ok['stack']} ({fewest_ok['reversals_per_hour']:.2f})" if fewest_ok else "none")
            + f", among all: {fewest['stack']} ({fewest['reversals_per_hour']:.2f}, SLO "
              f"{fewest['slo_attainment']:.3f})")
        if nop is not None:
            d = st["gpu_hours"] / nop["gpu_hours"] - 1.0
            parts.append(f"planning layer {'adds' if d > 0 else 'saves'} {abs(d) * 100:.1f} % GPU-hours and moves SLO "
                         f"attainment by {st['slo_attainment'] - nop['slo_attainment']:+.4f}")
        lines.append(f"- **{key[0]}, start-up {key[1]:.0f} s**: " + "; ".join(parts))
    return lines


#: the request-level runs (e) of each variant; a ``requests`` table given in ``config`` is merged
#: over its variant's key by key
_REQUESTS = {"default": {"rate_rps": 12.0, "hours": 0.4, "startups_s": [120.0]},
             "quick": {"rate_rps": 8.0, "hours": 0.35, "startups_s": [120.0]},
             "full": {"rate_rps": 20.0, "hours": 2.0, "startups_s": [120.0, 600.0]}}


def _check(cfg: dict[str, Any]) -> None:
    """The resolved settings name known stacks and known request-run keys."""
    for s in cfg["stacks"]:
        if s not in ("stack", "stack-no-planning", *BASELINE_STACKS):
            raise ConfigError("layered-stack.stacks", f"unknown stack {s!r}")
    for s in cfg["mixed_stacks"]:
        if s not in ("stack", "stack-no-planning", STATIC_SPLIT, *BASELINE_STACKS):
            raise ConfigError("layered-stack.mixed_stacks", f"unknown stack {s!r}")
    reject_unknown_keys("layered-stack.requests", cfg["requests"], _REQUESTS["default"])


#: the study's settings: the defaults and its quick and full variants (:mod:`tokenfactory.studies.study_config`)
CONFIG = StudyVariants("layered-stack", {
    "full": False, "workloads": [["servegen:m-large", 5.0]], "startups_s": [120.0, 600.0],
    "stacks": ["stack", "stack-no-planning", "dynamo-throughput (kalman) + mooncake", "hpa + vllm-watermark"],
    "last_days": 4.0, "hours": 12.0, "dt": 2.0, "mixed_days": 1.0, "mixed_hours": None, "mixed_startups_s": [600.0],
    "mixed_stacks": ["stack", STATIC_SPLIT, "stack-no-planning"], "mixed_seed": 0, "requests": _REQUESTS["default"]},
    quick={"startups_s": [600.0], "hours": 3.0, "mixed_hours": 6.0, "mixed_stacks": ["stack", STATIC_SPLIT],
           "requests": _REQUESTS["quick"]},
    full={"workloads": [["servegen:m-large", 5.0], ["servegen:m-small", 1.0]], "startups_s": [120.0, 300.0, 600.0],
          "stacks": ["stack", "stack-no-planning", *BASELINE_STACKS], "hours": None, "mixed_days": 7.0,
          "mixed_startups_s": [120.0, 300.0, 600.0],
          "mixed_stacks": ["stack", STATIC_SPLIT, "stack-no-planning", *BASELINE_STACKS],
          "requests": _REQUESTS["full"]},
    check=_check, merge_tables=("requests",))


def _forced_sentence(rows: list[dict]) -> str:
    """The runs whose cycles the verdict calls the input's forced response, with their figures
    (empty when there are none)."""
    forced = [(r, k, v) for r in rows for k, v in r.get("oscillation", {}).get("signals", {}).items()
              if v.get("forced")]
    if not forced:
        return ""
    return (" Forced responses, not counted (a cycle coherent with the demand or the open-loop plan at its "
            "period): " + "; ".join(f"{r['stack']} on {r['workload']} at {r['startup_s']:.0f} s, {k} "
                                    f"{v['period_s']:.0f} s (coherence {v['coherence']:.2f} with {v['forced_by']})"
                                    for r, k, v in forced) + ".")


@dataclass
class _Sections:
    """What the study's sections computed, for the figures, answers and summary after them."""

    cert: Any = None
    bad: Any = None
    sim: dict | None = None
    rows: list = field(default_factory=list)
    shown: dict = field(default_factory=dict)
    mix_rows: list = field(default_factory=list)
    mix_shown: Any = None
    mwl: Any = None
    req_rows: list = field(default_factory=list)
    rq: dict = field(default_factory=dict)


def _certificate_section(sc, report: StudyReport, metrics: dict, timings: dict, out: _Sections) -> None:
    """(a) The certificate of the shipped and the mis-tuned scenario."""
    t0 = time.perf_counter()
    cert = certify(sc)
    bad = certify(stack_scenario_from_dict(_mistuned(sc.config), "stack_mistuned"))
    timings["certificate_s"] = time.perf_counter() - t0
    metrics["certificate"] = {"passed": cert.passed, "binding": cert.binding, "failures": cert.failures,
                              "layers": {k: {kk: vv for kk, vv in v.items() if kk != "points"}
                                         for k, v in cert.layers.items()},
                              "describing_function": cert.describing_function}
    metrics["certificate_mistuned"] = {"passed": bad.passed, "failures": bad.failures,
                                       "failed_layers": sorted({f["layer"] for f in bad.failures})}
    metrics["separation"] = [{"outer": r["outer"], "inner": r["inner"], "ratio": r["ratio"],
                              "pm_loss_deg": r["pm_loss_deg"], "inner_bandwidth_rad_s": r["inner_bandwidth_rad_s"],
                              "outer_crossover_rad_s": r["outer_crossover_rad_s"], "pm_ideal_deg": r["pm_ideal_deg"],
                              "pm_real_deg": r["pm_real_deg"], "first_order_pm_loss_deg": r["first_order_pm_loss_deg"],
                              "note": r["note"]} for r in cert.separation_rows()]
    report.save_table(cert.to_pandas(), "certificate_points.csv")
    out.cert, out.bad = cert, bad


def _separation_section(sc, quick: bool, metrics: dict, timings: dict, out: _Sections) -> None:
    """(b) Separation in simulation: does the outer layer act on the inner layer's band?"""
    t0 = time.perf_counter()
    sim = separation_in_simulation(sc, duration_s=900.0 if quick else 1800.0)
    timings["separation_simulation_s"] = time.perf_counter() - t0
    metrics["separation_simulation"] = sim
    out.sim = sim


def _comparison_section(sc, cfg, timings: dict, out: _Sections) -> None:
    """(c) The stack against today's deployments on each workload and start-up (pool model)."""
    workloads, startups, stacks = cfg["workloads"], cfg["startups_s"], cfg["stacks"]
    last_days, hours, dt = cfg["last_days"], cfg["hours"], cfg["dt"]
    rows, shown = [], {}
    t0 = time.perf_counter()
    for spec, scale in workloads:
        if spec.startswith("servegen:") and not trace_available(spec):
            spec, scale = "synthetic", 3.0  # the project runs without trace data: the embedded fortnight
        wl = rate_workload(spec, scale=scale, last_days=last_days, hours=hours)
        for su in startups:
            for st in stacks:
                # the oracle's SLO ceiling is measured once per plant (cached) at the workload's pool sizes
                row, r, ctrl = run_on_rates(sc, wl, startup_s=su, stack=st, dt=dt)
                conserved = abs(row["requests"] - row["completed"] - row["rejected"] - row["in_flight_end"])
                row["conservation_residual"] = conserved
                rows.append(row)
                if st == "stack" and su == max(startups):
                    shown[wl.name] = (r, ctrl)
    timings["comparison_s"] = time.perf_counter() - t0
    out.rows, out.shown = rows, shown


def _mixed_section(sc, cfg, metrics: dict, timings: dict, out: _Sections) -> None:
    """(d) The mixed week on a fixed fleet: the stack moving workers between roles."""
    mixed_days, mixed_hours, mixed_startups = cfg["mixed_days"], cfg["mixed_hours"], cfg["mixed_startups_s"]
    mixed_stacks, mixed_seed, dt = cfg["mixed_stacks"], cfg["mixed_seed"], cfg["dt"]
    t0 = time.perf_counter()
    mix_rows, mix_shown = [], None
    mwl = mixed_workload_for(sc, days=mixed_days, seed=mixed_seed, hours=mixed_hours) if mixed_stacks else None
    for su in mixed_startups if mwl is not None else []:
        runs = {}
        for st in mixed_stacks:
            row, r, _ = run_on_rates(sc, mwl, startup_s=su, stack=st, dt=dt)
            row["conservation_residual"] = abs(row["requests"] - row["completed"] - row["rejected"]
                                               - row["in_flight_end"])
            mix_rows.append(row)
            runs[st] = r
        if su == max(mixed_startups) and "stack" in runs:
            srow = next(x for x in mix_rows if x["startup_s"] == su and x["stack"] == "stack")
            mix_shown = ({"stack": runs["stack"], "mu": srow["per_worker_rps"]}, srow, su)
    timings["mixed_s"] = time.perf_counter() - t0
    if mwl is not None:
        metrics["mixed_workload"] = {"name": mwl.name, **mwl.notes}
    out.mix_rows, out.mix_shown, out.mwl = mix_rows, mix_shown, mwl


def _requests_section(sc, cfg, report: StudyReport, metrics: dict, timings: dict, out: _Sections) -> None:
    """(e) The same stack on requests: every layer sampled (the gated cap on the live context)."""
    dt = cfg["dt"]
    t0 = time.perf_counter()
    rq = cfg["requests"]
    # a +60 % step a third of the way in: the pools must grow through a start-up while admission
    # and the gate hold the SLO
    trace = morning_ramp(float(rq["rate_rps"]), float(rq["hours"]), prompt_tokens=sc.params.prompt_tokens,
                         output_tokens=sc.params.output_tokens, step_at_s=float(rq["hours"]) * 1200.0,
                         step_factor=1.6, seed=11)
    req_rows, req_shown = [], {}
    # the shipped stack (smoothed admission) and the same stack with SLO-aware admission
    for adm_kind, scn in (("smoothed", sc), ("slo-aware", load_stack_scenario("stack_slo_aware"))):
        for su in rq["startups_s"]:
            both, rr, rctrl = run_stack_on_both_plants(scn, trace, startup_s=float(su), dt=dt)
            req_rows += [{"admission": adm_kind, "startup_s": float(su), **b,
                          "slo_attainment_admitted": rr.metrics["slo_attainment_admitted"]
                          if b["plant"] == "request simulator" else None} for b in both]
            req_shown[adm_kind] = (rr, rctrl, float(su))
    timings["requests_s"] = time.perf_counter() - t0
    metrics["request_simulator"] = {"workload": {**rq, "requests": len(trace)}, "rows": req_rows}
    report.save_table(pd.DataFrame(req_rows), "request_simulator.csv")
    for adm_kind, shown_run in req_shown.items():
        report.save_figure(_requests_figure(*shown_run, adm_kind), f"stack_on_requests_{adm_kind}.png",
                           f"The stack on requests ({adm_kind} admission): arrivals and admissions, provisioned "
                           "workers, the gated decode batch cap and the pass time it holds.")
    out.req_rows, out.rq = req_rows, rq


def _answers(report: StudyReport, metrics: dict, out: _Sections) -> None:
    """The report's opening answers (each certified layer's verdict and worst margins) and headlines."""
    cert, rows, mix_rows = out.cert, out.rows, out.mix_rows
    for layer, d in cert.layers.items():
        w = d.get("worst")
        if w is None:
            continue
        cycles = [x for x in cert.describing_function if x["layer"] == layer]
        pt = ", ".join(f"{k.replace('_factor', '')} x{w[k]:g}" for k in w if k.endswith("factor"))
        report.loop(f"stack layer: {layer.replace('_', ' ')}", any(x["limit_cycle"] for x in cycles),
                    gain_margin=w["gain_margin"], phase_margin_deg=w["phase_margin_deg"],
                    delay_margin_s=w["delay_margin_s"],
                    detail=f"worst envelope point ({pt}); {'meets' if d['meets_floors'] else 'MISSES'} the floors; "
                           + (f"describing function: {'a limit cycle' if any(x['limit_cycle'] for x in cycles) else 'no limit cycle'}"
                              if cycles else "no relay or saturation to check"))
    stack_runs = [r for r in rows if r["stack"] == "stack"]
    if stack_runs:
        osc = sum(bool(r["oscillating"]) for r in stack_runs)
        report.loop("stack: pool sizes in the pool model", osc > 0,
                    detail=f"{osc} of {len(stack_runs)} runs oscillating (detectors on the provisioned pool sizes)")
    for r in rows:
        if r["stack"] == "stack" and r.get("fleet_size") is None:
            report.answer("change", f"Run the layered stack (planning ahead of the daily rise): on {r['workload']} "
                          f"(start-up {r['startup_s']:.0f} s) it uses {human(r['gpu_hours_over_oracle'])} x the "
                          f"oracle's GPU-hours at SLO attainment {r['slo_attainment']:.4f}.")
            break
    # -- headline figures
    report.headline("certificate (default scenario)", "passed" if cert.passed else "failed", "",
                    f"binding layer {cert.binding['layer']}")
    fbk = [r for r in metrics["separation"] if r["pm_loss_deg"] is not None]
    if fbk:
        report.headline("smallest feedback separation ratio", min(r["ratio"] for r in fbk), "",
                        f"largest PM loss {max(r['pm_loss_deg'] for r in fbk):.2g} deg")
    for r in mix_rows:
        if r["stack"] == "stack":
            report.headline(f"stack SLO attainment ({r['workload']}, fixed fleet, start-up {r['startup_s']:.0f} s)",
                            r["slo_attainment"], "", f"{r['role_moves_per_hour']:.2f} role moves/h")
        if r["stack"] == STATIC_SPLIT:
            report.headline(f"static split SLO attainment ({r['workload']}, start-up {r['startup_s']:.0f} s)",
                            r["slo_attainment"], "", f"{r['static_fill_workers']} fill / {r['static_decode_workers']} decode")
    for r in rows:
        if r["stack"] == "stack" and r.get("fleet_size") is None:
            report.headline(f"stack GPU-hours / oracle ({r['workload']}, start-up {r['startup_s']:.0f} s)",
                            r["gpu_hours_over_oracle"], "x", f"SLO attainment {r['slo_attainment']:.4f}")


def _summary_certificate(sc, metrics: dict, out: _Sections) -> list[str]:
    """The summary's stack description, certificate and separation paragraphs."""
    cert, bad, sim = out.cert, out.bad, out.sim
    planner = build_stack(sc)[0].layer("planning").controllers[0]  # as the scenario resolves it
    budget, vol_w = planner.excess_budget, planner.volatility_window_s
    gate_l = sc.layers.get("batch_gate")
    gate_txt = (f"the gated decode batch cap every {gate_l.sample_period_s:g} s (static at its "
                "nominal-context cap in the pool model, whose step averages over many passes)"
                if getattr(gate_l, "samples_live_pass", False) else "the decode slot limit")
    lines = ["The layered stack (`tokenfactory/scenarios/stack_default.toml`): " + gate_txt + ", smoothed admission every "
             f"{sc.layers['admission'].sample_period_s:g} s, planned hysteretic pools every "
             f"{sc.layers['reconfiguration'].sample_period_s:g} s, and a planning layer refit every "
             f"{sc.layers['planning'].refit_s / 3600:g} h on the last "
             f"{sc.layers['planning'].days} days (the median daily rise over the next lead and the "
             f"headroom whose replay leaves at most {budget * 100:.2g} % of the demand above capacity"
             + (f", scaled by the offered rate's volatility over the last hours (EWMA of the 10-minute log changes, "
                f"time constant {vol_w / 60:g} min, relative to its mean over the replayed days)" if vol_w else "")
             + "), fed forward into the pools' target one lead (start-up + warm-up + a sample + the rate filter) "
             "ahead.", "",
             "## Certificate", "",
             f"Default scenario: **{'passed' if cert.passed else 'FAILED'}**; binding point: layer "
             f"{cert.binding['layer']} at " + ", ".join(f"{k}={v}" for k, v in cert.binding.items()
                                                         if k.endswith("factor"))
             + f" (GM {cert.binding['gain_margin']:.2f}, PM {cert.binding['phase_margin_deg']:.1f} deg).",
             f"Mis-tuned scenario (reconfiguration faster than admission): **{'passed' if bad.passed else 'failed'}**"
             + (f", failing layers: {', '.join(metrics['certificate_mistuned']['failed_layers'])}" if not bad.passed
                else "") + ".", ""]
    for f in bad.failures:
        lines.append(f"- {f['layer']} ({f['check']}): {f['detail']}")
    lines += ["", "## Separation", ""]
    lines += markdown_table(metrics["separation"], ["outer", "inner", "inner_bandwidth_rad_s", "outer_crossover_rad_s",
                                               "ratio", "pm_ideal_deg", "pm_real_deg", "pm_loss_deg",
                                               "first_order_pm_loss_deg"])
    fb = [r for r in metrics["separation"] if r["pm_loss_deg"] is not None]
    ff = [r for r in metrics["separation"] if r["pm_loss_deg"] is None]
    lines += ["", f"Feedback pairs: smallest ratio {min(r['ratio'] for r in fb):.3g}, largest phase-margin loss "
                  f"{max(r['pm_loss_deg'] for r in fb):.3g} deg (required: ratio >= {sc.min_separation:g}, loss <= "
                  f"{sc.max_pm_loss_deg:g} deg; a first-order inner loop costs atan(1/ratio), so a {sc.max_pm_loss_deg:g} deg loss "
                  f"needs a ratio of {required_ratio(sc.max_pm_loss_deg):.3g})." if fb else ""]
    for r in ff:
        lines.append(f"{r['outer']} -> {r['inner']}: {r['note']}.")
    q, d = sim["quiet"], sim["disturbed"]
    lines += ["", f"In simulation, a +-{sim['depth'] * 100:.0f} % demand oscillation of period {sim['period_s']:g} s "
                  f"(admission band): reconfiguration took {d['scale_actions']} actions vs {q['scale_actions']} without "
                  f"it; coherence of pool sizes with the admission rate at that period "
                  f"{human(d['coherence_at_disturbance'] if math.isfinite(d['coherence_at_disturbance']) else 0.0)} (0: unrelated, 1: locked) - the "
                  f"outer layer {'ACTED' if sim['outer_acted_on_inner_band'] else 'did not act'} on the inner band.", ""]
    return lines


def _summary_runs(sc, metrics: dict, timings: dict, out: _Sections) -> list[str]:
    """The summary's comparison, mixed-week and on-requests paragraphs."""
    rows, mix_rows, mwl, req_rows, rq = out.rows, out.mix_rows, out.mwl, out.req_rows, out.rq
    lines: list[str] = []
    elastic = [r for r in rows if r.get("fleet_size") is None]
    lines += ["## Comparison (pool model)", ""]
    lines += markdown_table([r for r in metrics["comparison"] if r.get("fleet_size") is None],
                            ["workload", "startup_s", "stack", "gpu_hours", "oracle_gpu_hours", "gpu_hours_over_oracle",
                             "slo_attainment", "actions_per_hour", "reversals_per_hour", "oscillating"])
    lines += ["", *_verdicts(elastic), ""]
    if mix_rows:
        n = metrics["mixed_workload"]
        lines += ["## Mixed week on a fixed fleet (pool model)", "",
                  f"{mwl.name}: chat ({n['classes']['chat']['prompt_tokens']} prompt / "
                  f"{n['classes']['chat']['output_tokens']} output tokens, weekday mean {n['chat_rps']:g} req/s, peak "
                  f"14:00) plus batch ({n['classes']['batch']['prompt_tokens']} / {n['classes']['batch']['output_tokens']}"
                  f", {n['batch_rps']:g} req/s, peak 02:00); mean request {n['mean_request'][0]} / "
                  f"{n['mean_request'][1]} tokens. The fill:decode worker-need ratio ranges "
                  f"{n['need_ratio_range'][0]:.3f}-{n['need_ratio_range'][1]:.3f}, a swing of "
                  f"{min(n['need_ratio_swing_per_day']):.1f}-{max(n['need_ratio_swing_per_day']):.1f} x within a day. "
                  f"Fixed fleet {n['fleet_size']} workers = peak total need {n['peak_need']['total']:.0f} x "
                  f"(1 + {n['fleet_headroom']:g}), needs at the reconfiguration layer's target utilisation "
                  f"{n['target_utilization']:g}; a static split holding both pools' peaks there would need "
                  f"{n['static_split_needs']}. GPU-hours are the fleet's for every policy "
                  f"({human(mix_rows[0]['gpu_hours'])}; the oracle's smallest fleet for the run: "
                  f"{mix_rows[0]['oracle_fleet_needed']:.0f} workers).", ""]
        lines += markdown_table([{k: v for k, v in r.items() if k not in ("utilization_ceiling", "per_worker_rps")} for r in mix_rows],
                                ["startup_s", "stack", "slo_attainment", "rejected_fraction", "role_moves_per_hour",
                                 "actions_per_hour", "reversals_per_hour", "oscillating", "fill_workers_mean",
                                 "decode_workers_mean", "fleet_size"])
        lines += ["", *_mix_verdicts(mix_rows), ""]
    lines += ["## The same stack on requests", ""]
    w = metrics["request_simulator"]["workload"]
    lines += [f"A morning ramp from the synthetic generator ({w['requests']} requests over {w['hours']:g} h, "
              f"mean {w['rate_rps']:g} req/s over the day, the scenario's mean request, demand x1.6 from a third of "
              "the way in) through the request simulator "
              "with every layer sampled, and the same arrivals binned per minute through the pool model - the "
              "shipped stack (smoothed admission) and `stack_slo_aware` (SLO-aware admission; the same layers "
              "otherwise, its batch gate's pass target 0.75 of the TPOT SLO against the default's derived "
              f"{gate_fraction(sc):.3f}):", ""]
    lines += markdown_table(req_rows, ["admission", "startup_s", "plant", "gate", "slo_attainment",
                                       "slo_attainment_admitted", "gpu_hours", "actions_per_hour",
                                       "reversals_per_hour", "batch_cap_changes", "rejected"])
    for key in dict.fromkeys((r["admission"], r["startup_s"]) for r in req_rows):
        a, b = (next(r for r in req_rows if (r["admission"], r["startup_s"]) == key and r["plant"] == pl)
                for pl in ("request simulator", "pool model"))
        lines.append(f"- {key[0]} admission, start-up {key[1]:.0f} s: SLO attainment {a['slo_attainment']:.4f} on "
                     f"requests (admitted {a['slo_attainment_admitted']:.4f}) vs {b['slo_attainment']:.4f} in the "
                     f"pool model; GPU-hours {a['gpu_hours']:.1f} vs {b['gpu_hours']:.1f} "
                     f"({(a['gpu_hours'] / b['gpu_hours'] - 1) * 100:+.1f} %); the gated cap changed "
                     f"{a['batch_cap_changes']} times.")
    on_req = {r["admission"]: r for r in req_rows if r["plant"] == "request simulator"
              and r["startup_s"] == rq["startups_s"][-1]}
    if {"smoothed", "slo-aware"} <= set(on_req):
        sm, sa = on_req["smoothed"], on_req["slo-aware"]
        lines.append(f"- On requests the SLO-aware stack {'holds more' if sa['slo_attainment'] > sm['slo_attainment'] else 'holds no more'} "
                     f"of the SLO through the step ({sa['slo_attainment']:.4f} vs {sm['slo_attainment']:.4f}) at "
                     f"{sa['gpu_hours'] / sm['gpu_hours']:.2f} x its GPU-hours.")
    lines += [""]
    lines += [
              f"Oscillation (detectors on the provisioned pool sizes): "
              f"{sum(r['oscillating'] for r in rows)} of {len(rows)} runs oscillating"
              + (f" ({sum(r['oscillating'] for r in mix_rows)} of {len(mix_rows)} on the mixed week)." if mix_rows
                 else ".") + _forced_sentence(rows),
              "Utilisation ceilings at the SLO (pool model, Poisson): "
              + "; ".join(f"{k} {human(v)}" for k, v in metrics["utilization_ceiling"].items()) + ".",
              "Dynamo's throughput planner runs its ARIMA (default) or Kalman load predictor "
              "(`tokenfactory.controllers.load_predictors`), warmed up on the days before the run.",
              "", f"Timings: {', '.join(f'{k} {v:.1f}' for k, v in timings.items())}."]
    return lines


def run(out_dir: str | Path, quick: bool = False, config: dict[str, Any] | None = None,
        full: bool = False) -> dict[str, Any]:
    """Run the study (see the module docstring).

    Parameters
    ----------
    out_dir : str or Path
        Folder for figures, tables, ``metrics.json`` and ``summary.md``.
    quick : bool
        3 h of m-large at a 10-minute start-up (the test suite's variant).
    config : dict, optional
        Overrides: ``full``, ``workloads`` ([[spec, scale], ...]), ``startups_s``, ``stacks``,
        ``last_days``, ``hours``, ``dt``; unknown keys are errors.
    full : bool
        The heavy grid (``tokenfactory study layered-stack --full``; same as ``config={"full": True}``).

    Returns
    -------
    dict
        The metrics written to ``metrics.json``.
    """
    cfg = resolve_study_config(CONFIG, config, quick=quick, full=full)
    sc = load_stack_scenario("stack_default")
    report = StudyReport("layered-stack", Path(out_dir), {**cfg, "quick": quick, "scenario": sc.config})
    metrics: dict[str, Any] = {}
    timings: dict[str, float] = {}
    out = _Sections()
    _certificate_section(sc, report, metrics, timings, out)
    _separation_section(sc, quick, metrics, timings, out)
    _comparison_section(sc, cfg, timings, out)
    _mixed_section(sc, cfg, metrics, timings, out)
    rows, mix_shown, mwl, startups = out.rows + out.mix_rows, out.mix_shown, out.mwl, cfg["startups_s"]
    out.rows = rows
    metrics["comparison"] = [{k: v for k, v in r.items() if k not in ("utilization_ceiling", "per_worker_rps")} for r in rows]
    _requests_section(sc, cfg, report, metrics, timings, out)
    metrics["utilization_ceiling"] = {r["workload"]: r["utilization_ceiling"] for r in rows}
    metrics["timings_s"] = timings
    report.save_table(pd.DataFrame(metrics["comparison"]), "comparison.csv")
    if mix_shown is not None:
        runs, srow, su = mix_shown
        report.save_figure(_mix_figure(runs, srow, f"{mwl.name}: fixed fleet of {mwl.fleet_size}, start-up {su:.0f} s"),
                           "mixed_week.png", "The mixed workload on one time axis: demand and the mix (prompt and "
                           "output factors), the fill pool's share of the worker need, each pool's provisioned "
                           "workers under the stack next to its need and the static split, and the stack's role moves.")
    for name, (r, ctrl) in out.shown.items():
        report.save_figure(_layer_figure(r, ctrl, f"the stack at work: {name}, start-up {max(startups):.0f} s"),
                           f"stack_{name.replace(':', '-').replace(' ', '_')}.png",
                           "Each layer on one time axis: demand and the planner's forecast; provisioned and serving "
                           "workers of each pool; admission rate and rejections.")
    _answers(report, metrics, out)
    lines = _summary_certificate(sc, metrics, out) + _summary_runs(sc, metrics, timings, out)
    return report.finish(metrics, lines)
