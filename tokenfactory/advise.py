"""``tokenfactory advise``: read a control plane's own settings file, certify it on the user's
plant, search the same control plane's knobs for a setting that holds, simulate both, and write
the recommendation back in the user's own format.

The search is two-stage, because the loop model is cheap and the simulator is the judge:

1. every point of the control plane's knob grid (:data:`KNOB_GRID`) is certified with
   :func:`tokenfactory.controllers.autoscaler_loops.certify_autoscaler` at the demand levels the
   trace sustains (the median and the 90th percentile of its 5-minute rates; shorter bursts are
   transients, not operating points) - a candidate passes when no cycle is predicted at any
   level and its start-up overshoot stays within one worker of what the level needs;
2. the floor (``min_replicas``, the format's minScale / min replicas) is searched from the user's
   floor up to the ceiling (a floor above the grid's with the user's other knobs and the few
   nearest combinations passing at the grid's top floor, :data:`EXTRA_FLOOR_COMBOS`): holding
   workers beforehand is the one knob that serves a burst shorter than measurement delay +
   start-up, and no other knob of a measurement-driven rule can. The
   nearest passing candidate of each floor (fewest knobs changed) is replayed through the request
   simulator with the scenario's admission in a bisection on the replayed SLO attainment (which
   rises with the floor, near enough): the highest floor first, then halving, to the lowest floor
   that meets the target; the rest of the replay budget goes to other passing candidates at that
   floor and the one below (fewest knobs changed first);
3. candidates are ranked: meeting the SLO attainment target with a passing certificate, no
   oscillation and at most :data:`MAX_REVERSALS_PER_HOUR` reversals first, then the fewest
   GPU-hours. If none meets the target, the best attainment is recommended and the result says
   so, with where its requests missed (:meth:`SimulationResult.slo_misses` over the whole run and
   the trace's peak window, against measurement delay + start-up).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tokenfactory.controllers.autoscaler_loops import PoolOperatingPoint, certify_autoscaler
from tokenfactory.controllers.formats import read_control_plane, rewrite_control_plane
from tokenfactory.core.errors import ConfigError
from tokenfactory.core.signals import count_reversals
from tokenfactory.core.validation import check_choice, check_number

__all__ = ["advise", "search_settings", "knob_grid", "TARGET_GRIDS", "current_knobs", "scale_churn", "Advice", "KNOB_GRID", "MAX_REVERSALS_PER_HOUR", "operating_points", "DEFAULT_ATTAINMENT",
           "slo_shortfall", "MAX_FLOORS", "EXTRA_FLOOR_COMBOS", "FLOOR_KNOB", "failure_reason", "oscillating_signals"]

#: reversals per hour above which a pool is churning (issue 21's bound for a pool that holds)
MAX_REVERSALS_PER_HOUR = 2.0
#: SLO attainment a recommendation must reach when the scenario states none
DEFAULT_ATTAINMENT = 0.99
#: candidates replayed through the request simulator (the floor bisection takes what it needs)
SIMULATED_CANDIDATES = 6
#: most floors the search certifies and bisects over (evenly spaced between the user's floor and
#: the ceiling when there are more)
MAX_FLOORS = 16
#: other-knob combinations certified at each floor above the grid's own (besides the user's)
EXTRA_FLOOR_COMBOS = 4


def _times(*factors):
    return lambda v, need: sorted({round(v * f, 6) for f in factors})


def _also(*values):
    return lambda v, need: sorted({v, *values})


def _floor_up(v, need):
    return sorted({max(v, 1), max(v, 1) + 1})


def _ceiling(v, need):
    """The user's ceiling, or one worker above what the highest sustained level needs: a ceiling
    bounds the start-up overshoot of a rule that compounds over starting workers."""
    return sorted({v, min(v, need + 1)})


#: format -> knob -> candidate values as a function of (the current value, the workers the highest
#: sustained demand level needs, rounded up); knob names are the model's (each setting's
#: ``with_params``)
KNOB_GRID: dict[str, dict[str, Any]] = {
    "kubernetes-hpa": {"target": _times(0.5, 1.0, 2.0, 4.0), "tolerance": _also(0.2, 0.3),
                       "downscale_stabilization_s": _also(60, 120, 600), "min_replicas": _floor_up,
                       "max_replicas": _ceiling},
    "keda": {"target": _times(0.5, 1.0, 2.0, 4.0), "downscale_stabilization_s": _also(60, 120, 600),
             "min_replicas": _floor_up, "max_replicas": _ceiling},
    "knative": {"target": _times(0.5, 1.0, 2.0), "stable_window_s": _also(30.0, 120.0, 300.0),
                "min_replicas": _floor_up, "max_replicas": _ceiling},
    "ray-serve": {"target": _times(0.5, 1.0, 2.0), "downscale_delay_s": _also(60.0, 300.0, 600.0),
                  "upscale_delay_s": _also(0.0, 30.0), "min_replicas": _floor_up, "max_replicas": _ceiling},
    "aibrix": {"target": _times(0.5, 1.0, 2.0), "up_band": _also(0.2), "down_band": _also(0.3, 0.5),
               "min_replicas": _floor_up, "max_replicas": _ceiling},
    # Dynamo's load target (controllers/dynamo_planner_loop.py): the KV band's levels decide whether
    # a worker's share sits inside it, the prefill levels the same for queued prompt tokens, the
    # tick the period; min_endpoint floors both pools (its ceiling is the GPU budget of both pools)
    "dynamo-planner": {"decode_scale_up_kv_rate": _also(95.0), "decode_scale_down_kv_rate": _also(30.0, 40.0, 50.0),
                       "prefill_scale_up_queue_tokens": _times(1.0, 2.0, 4.0),
                       "prefill_scale_down_queue_tokens": _also(0),
                       "load_adjustment_interval_seconds": _also(5, 30), "min_endpoint": _floor_up},
}
#: format -> {target field value -> its knobs}, where the format's rule depends on a target:
#: Dynamo's sla target (controllers/dynamo_planner_sla_loop.py) has no thresholds - its targets are
#: the user's SLO - so its knobs are the scale-down sensitivity (the band under the target that
#: holds a pool), the two ticks and min_endpoint; the throughput target's levels are Dynamo's fixed ones
TARGET_GRIDS: dict[str, dict[str, dict[str, Any]]] = {
    "dynamo-planner": {
        "sla": {"load_scaling_down_sensitivity": _also(50, 60), "load_adjustment_interval_seconds": _also(5, 30),
                "throughput_adjustment_interval_seconds": _also(60, 300), "min_endpoint": _floor_up},
        "throughput": {"load_adjustment_interval_seconds": _also(5, 30), "min_endpoint": _floor_up},
    },
}
#: format -> its floor knob, when it is not ``min_replicas`` (the floor axis of the search)
FLOOR_KNOB = {"dynamo-planner": "min_endpoint"}


def current_knobs(setting, controller) -> dict:
    """The values of the setting's grid knobs (:data:`KNOB_GRID`), read off the controller it builds.

    Parameters
    ----------
    setting : ControlPlaneSetting
        A parsed pool-autoscaler setting; its ``format`` selects the knobs of :data:`KNOB_GRID`.
    controller : autoscaler
        The controller ``setting.build(pool)`` returns; its ``params()`` give the values.

    Returns
    -------
    dict
        Knob name (the model's, as ``with_params`` takes it) -> current value.
    """
    if setting.format in FLOOR_KNOB:   # a planner config: its own fields are the knobs
        return {knob: setting[knob] for knob in knob_grid(setting)}
    p = controller.params()
    out = {}
    for knob in KNOB_GRID[setting.format]:
        if knob == "target":
            out[knob] = p.get("target", p.get("target_ongoing_requests"))
        elif knob in ("min_replicas", "max_replicas"):
            out[knob] = p.get(knob, getattr(controller, knob, 1))
        else:
            out[knob] = p[knob]
    return out


def operating_points(trace: pd.DataFrame, mu: float, *, metric_delay_s: float, startup_s: float,
                     slots_per_worker: float, service_s: float, window_s: float = 300.0) -> dict[str, PoolOperatingPoint]:
    """The demand levels the trace sustains (median and 90th percentile of its ``window_s`` rates)
    as operating points of a pool whose workers serve ``mu`` requests/s.

    Parameters
    ----------
    trace : DataFrame
        The requests; its ``arrival_s`` column (s) is binned into windows of ``window_s``.
    mu : float
        Requests/s one serving worker sustains (> 0).
    metric_delay_s : float
        Age of the metric when the autoscaler reads it (s, >= 0).
    startup_s : float
        From a scale-up decision to a serving worker (s, >= 0).
    slots_per_worker : float
        Decode slots of one worker (sequences, > 0).
    service_s : float
        Time a request occupies a slot (s, > 0).
    window_s : float
        Width of the windows the rates are counted over (s, > 0; default 300; a shorter trace is one
        window); empty windows are left out.

    Returns
    -------
    dict
        ``"median"`` and ``"p90"`` -> :class:`PoolOperatingPoint` at that demand.
    """
    arr = trace["arrival_s"].to_numpy(dtype=float)
    # a trace shorter than the window is one window of its own length (else its rate reads low)
    window_s = min(window_s, float(arr.max() - arr.min())) if arr.max() > arr.min() else window_s
    span = max(float(arr.max() - arr.min()), window_s)
    bins = np.arange(float(arr.min()), float(arr.min()) + span + window_s, window_s)
    rates = np.histogram(arr, bins=bins)[0] / window_s
    rates = rates[rates > 0] if (rates > 0).any() else np.array([len(arr) / span])
    levels = {"median": float(np.median(rates)), "p90": float(np.percentile(rates, 90))}
    return {k: PoolOperatingPoint(mu, v, metric_delay_s, startup_s, slots_per_worker, service_s) for k, v in levels.items()}


@dataclasses.dataclass
class Advice:
    """The result of :func:`advise`: the current and recommended settings, certified and simulated.

    Parameters
    ----------
    current : ControlPlaneSetting
        The user's setting, as read.
    recommended : ControlPlaneSetting
        The recommended setting (``current`` itself when no candidate does better).
    changes : dict
        Knob -> ``{"from": current value, "to": recommended value}`` of the knobs changed (empty: keep
        the current setting).
    blocks : dict
        ``"current"`` and ``"recommended"`` -> the metrics block: the certificate's verdict and
        margins, the predicted cycle, the start-up peak and the simulated metrics (``"simulated"``).
    candidates : DataFrame
        One row per candidate certified: its knobs, ``passed``, ``reason`` (why it fails, from its
        certificates: :func:`failure_reason`; "" when it passes), ``simulated`` and the simulated
        metrics as ``sim_*`` columns.
    met_target : bool
        Whether the recommendation meets the SLO attainment target (for a pool autoscaler also
        without oscillation and within :data:`MAX_REVERSALS_PER_HOUR`).
    floor_search : list of dict
        The floors the bisection replayed, lowest first: ``min_replicas``, ``slo_attainment``,
        ``gpu_hours``, ``meets_target``, ``oscillating``, ``reversals_per_hour`` of each floor's
        nearest passing candidate (the summary says which of them keeps a floor from the target).
    """

    current: Any
    recommended: Any
    changes: dict
    blocks: dict          # "current" / "recommended" -> the metrics block
    candidates: pd.DataFrame
    met_target: bool
    floor_search: list = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict:
        rec = self.blocks["recommended"]
        return {"current": self.blocks["current"], "recommended": rec,
                "changes": self.changes, "met_slo_target": self.met_target, "floor_search": self.floor_search,
                "shortfall": None if self.met_target else {
                    "slo_target": rec["slo_target"], "best_slo_attainment": rec["simulated"]["slo_attainment"],
                    "why": self.shortfall_text(), "misses": rec["simulated"].get("misses")},
                "candidates_certified": int(len(self.candidates)),
                "candidates_passing": int(self.candidates["passed"].sum()) if len(self.candidates) else 0,
                "candidates_simulated": int(self.candidates["simulated"].sum()) if len(self.candidates) else 0}

    def recommended_text(self, original: str) -> str:
        """The user's file ``original`` with only the recommended knobs changed, each change
        commented with what it buys."""
        cur, rec = self.blocks["current"], self.blocks["recommended"]

        def note(path, old, new):
            if self.recommended.format == "vllm":
                return (f"tokenfactory advise: {'unset' if old is None else old} -> {new}; the largest batch whose "
                        f"pass meets the TPOT SLO (simulated TPOT p99 {cur['simulated']['tpot_p99_s']:.3f} -> "
                        f"{rec['simulated']['tpot_p99_s']:.3f} s, SLO {cur['simulated']['slo_attainment']:.3f} -> "
                        f"{rec['simulated']['slo_attainment']:.3f})")
            why = "no predicted cycle" if rec["predicted_cycle"] is None else "a shorter cycle"
            was = (f"was a {cur['predicted_cycle']['period_s']:.0f} s cycle" if cur["predicted_cycle"] else
                   f"start-up peak {cur['cascade_peak_replicas']} -> {rec['cascade_peak_replicas']} workers")
            floor = self.changes.get(FLOOR_KNOB.get(self.recommended.format, "min_replicas"))
            miss = cur["simulated"].get("misses") or {}
            if floor and (old, new) == (floor["from"], floor["to"]) and miss.get("reach_s") is not None:
                # a floor buys what no rule can: workers serving before a burst that outruns the start-up
                was = (f"{new} workers held before a burst: one ordered when it shows serves "
                       f"{miss['reach_s']:.0f} s later")
            return (f"tokenfactory advise: {old} -> {new}; {why} ({was}); simulated SLO "
                    f"{cur['simulated']['slo_attainment']:.3f} -> {rec['simulated']['slo_attainment']:.3f}")

        return rewrite_control_plane(original, self.recommended, comment=note)

    def shortfall_text(self) -> str:
        """Why no candidate met the target, from the recommended replay's misses (empty when one did)."""
        if self.met_target:
            return ""
        r = self.blocks["recommended"]
        rs = r["simulated"]
        text = (f"No candidate reached the SLO attainment target {r['slo_target']:g}; the best reached is "
                f"{rs['slo_attainment']:.3f} (the recommendation)")
        if rs["slo_attainment"] >= r["slo_target"]:
            text += (f", which reaches the target but {'oscillates' if rs['oscillating'] else 'churns'} "
                     f"({rs['reversals_per_hour']:.1f} reversals/h)")
        miss = rs.get("misses")
        if not miss or not miss["missed"]:
            return text + "."
        text += (f". Of its {miss['missed']:,} misses, {miss['rejected']:,} were rejected, {miss['late_ttft']:,} "
                 f"completed past their TTFT SLO, {miss['late_tpot']:,} past their TPOT SLO only, "
                 f"{miss['unfinished']:,} unfinished; {miss['in_peak']:,} arrived in the peak "
                 f"{miss['peak_window_s']:.0f} s window (from {miss['peak_start_s']:.0f} s)")
        if miss.get("reach_s") is not None:
            if miss["burst_outruns_startup"]:
                text += (f", which ends with its TTFT deadlines before a worker ordered when it shows can serve "
                         f"({miss['reach_s']:.0f} s: measurement delay + start-up): only workers held before it "
                         f"serve it")
                if self.floor_search:
                    top = self.floor_search[-1]
                    text += (f", and the highest floor searched ({top.get('knob', 'min_replicas')} {top['min_replicas']}, the ceiling) "
                             f"reaches {top['slo_attainment']:.3f}")
            else:
                text += f"; a worker ordered when it shows serves {miss['reach_s']:.0f} s later, within the window"
        return text + "."

    def summary(self) -> list[str]:
        """Sentences from the numbers."""
        c, r = self.blocks["current"], self.blocks["recommended"]
        cs, rs = c["simulated"], r["simulated"]

        def cert(b):
            cyc = b["predicted_cycle"]
            return ("passes" if b["passed"] else "fails") + (
                f" (predicts a {cyc['period_s']:.0f} s cycle between {cyc['low_replicas']} and "
                f"{cyc['high_replicas']} workers)" if cyc else "")

        def osc(sim, b) -> str:
            if not sim["oscillating"]:
                return "not oscillating"
            what = ", ".join(sim.get("oscillating_signals") or [])
            # the certificate judges the pool loop's model at the trace's operating points; a
            # simulated cycle elsewhere (a buffer, the admission rate) or a transient's churn is not in it
            return ("oscillating" + (f" ({what})" if what else "")
                    + ("; the certificate judges the pool loop's model at the trace's operating points, "
                       "not this simulated run" if b["passed"] else ""))

        lines = [f"Current setting: certificate {cert(c)}; simulated SLO attainment {cs['slo_attainment']:.3f}, "
                 f"{cs['gpu_hours']:.2f} GPU-hours, {cs['reversals_per_hour']:.1f} reversals/h, {osc(cs, c)}."]
        if not self.changes:
            lines.append("No setting of the grid does better; the recommendation is the current setting.")
        else:
            ch = ", ".join(f"{k} {'unset' if v['from'] is None else format(v['from'], 'g')} -> {v['to']:g}"
                           for k, v in self.changes.items())
            lines.append(f"Recommended ({ch}): certificate {cert(r)}; simulated SLO attainment "
                         f"{rs['slo_attainment']:.3f}, {rs['gpu_hours']:.2f} GPU-hours, "
                         f"{rs['reversals_per_hour']:.1f} reversals/h.")
        if self.floor_search:
            target = r["slo_target"]

            def why(f) -> str:   # what keeps a floor from the target (the ranking's rule, from its numbers)
                if f.get("meets_target", True) or "reversals_per_hour" not in f:
                    return ""
                if f["slo_attainment"] < target:
                    return f" (below {target:g})"
                if f["oscillating"]:
                    return " (oscillates)"
                return f" ({f['reversals_per_hour']:.1f} reversals/h, above {MAX_REVERSALS_PER_HOUR:g})"

            lines.append(f"Floors replayed (bisection on the SLO attainment; the target: >= {target:g}, not "
                         f"oscillating, <= {MAX_REVERSALS_PER_HOUR:g} reversals/h): " + ", ".join(
                f"{f.get('knob', 'min_replicas')} {f['min_replicas']} -> {f['slo_attainment']:.3f} at {f['gpu_hours']:.2f} "
                f"GPU-hours{why(f)}" for f in self.floor_search) + ".")
        if not self.met_target:
            lines.append(self.shortfall_text())
        return lines


def _block(cert_by_level: Mapping[str, Any], sim: dict | None, slo_target: float) -> dict:
    worst = min(cert_by_level.values(), key=lambda c: (c.passed, c.to_dict()["gain_margin"] or math.inf))
    d = worst.to_dict()
    return {"stable": all(c.stable for c in cert_by_level.values()),
            "passed": all(c.passed for c in cert_by_level.values()),
            "gain_margin": d["gain_margin"], "phase_margin_deg": d["phase_margin_deg"],
            "delay_margin_s": d["delay_margin_s"], "loop": d["loop"],
            "predicted_cycle": next((c.to_dict()["predicted_cycle"] for c in cert_by_level.values()
                                     if c.predicted_cycle is not None), None),
            "cascade_peak_replicas": max(c.cascade_peak for c in cert_by_level.values()),
            "levels": {k: {"demand_rps": c.loop.point.demand_rps, **c.to_dict()} for k, c in cert_by_level.items()},
            "slo_target": slo_target, "simulated": sim}


def _floor_axis(floors: list, ceilings: list) -> list:
    """Every floor from the lowest of ``floors`` up to the highest ceiling, at most
    :data:`MAX_FLOORS` of them (evenly spaced, always keeping the grid's own floors and the top)."""
    lo, hi = int(min(floors)), int(max(max(ceilings), max(floors)))
    every = list(range(lo, hi + 1))
    if len(every) > MAX_FLOORS:
        picks = {every[round(i * (len(every) - 1) / (MAX_FLOORS - 1))] for i in range(MAX_FLOORS)}
        every = sorted(picks | {int(f) for f in floors})
    return every


def knob_grid(setting) -> dict[str, Any]:
    """The knobs searched for a setting: its format's (:data:`KNOB_GRID`), or, for a format whose
    rule depends on a target field (:data:`TARGET_GRIDS`), that target's.

    Parameters
    ----------
    setting : ControlPlaneSetting
        The user's control-plane setting as read (its ``format`` and fields).
    """
    targets = TARGET_GRIDS.get(setting.format)
    if targets and setting["optimization_target"] in targets:
        return targets[setting["optimization_target"]]
    return KNOB_GRID[setting.format]


def failure_reason(certs: Mapping[str, Any]) -> str:
    """Why a candidate fails its certificate, from the certificates' own results ("" when every
    one passes): for each failing level, its predicted cycle, its start-up overshoot or its
    ceiling short of the demand (the three terms of ``AutoscalerCertificate.passed``).

    Parameters
    ----------
    certs : mapping
        Level name (e.g. ``"median decode"``) -> ``AutoscalerCertificate``.
    """
    parts = []
    for level, c in certs.items():
        if c.passed:
            continue
        why = []
        cyc = c.predicted_cycle
        if cyc is not None:
            why.append(f"predicts a {cyc.period_s:.0f} s cycle between {cyc.low_replicas} and "
                       f"{cyc.high_replicas} workers" + (" (noise-driven)" if getattr(cyc, "noise_driven", False) else ""))
        if not c.overshoot_bounded:
            why.append(f"start-up asks for {c.cascade_peak} workers, {c.workers_needed:.2f} needed")
        if not c.ceiling_carries:
            why.append(f"ceiling of {c.loop.max_replicas} workers < {c.workers_needed:.2f} needed")
        parts.append(f"{level}: {', '.join(why)}")
    return "; ".join(parts)


def _candidates(setting, certify, knobs0: dict, grid: dict, fk: str) -> tuple[pd.DataFrame, dict]:
    """Every grid point certified, plus the floors above the grid's (up to the ceiling), each with
    the user's other knobs and the nearest other-knob combinations that passed at the grid's top
    floor (a bounded cost: the bisection replays each floor's nearest candidate, the budget's rest a
    few more). Returns the candidate table and the current setting's certificates."""
    current_certs = certify(setting)
    need = max(math.ceil(c.workers_needed - 1e-9) for c in current_certs.values())
    axes = {k: grid[k](knobs0[k], need) for k in grid}
    rows = []

    def add(knobs):
        if knobs.get(fk, 0) > knobs.get("max_replicas", math.inf):
            return   # a floor above the ceiling is no setting
        changed = {k: v for k, v in knobs.items() if v != knobs0[k]}
        try:
            cand = setting.with_params(**changed) if changed else setting
            certs = certify(cand)
        except ConfigError as exc:   # a knob combination the format or model refuses
            rows.append({**knobs, "changed": len(changed), "passed": False, "reason": f"refused: {exc}",
                         "simulated": False, "error": str(exc)})
            return
        rows.append({**knobs, "changed": len(changed), "passed": all(c.passed for c in certs.values()),
                     "reason": failure_reason(certs), "held_workers": knobs.get(fk, 1), "simulated": False, "setting": cand,
                     "certs": certs, "changes": changed})

    for values in itertools.product(*axes.values()):
        add(dict(zip(axes, values)))
    if fk in axes:
        top = max(axes[fk])
        others = [k for k in axes if k not in (fk, "max_replicas")]
        at_top = sorted((r for r in rows if r[fk] == top and r["passed"]), key=lambda r: r["changed"])
        combos = [{k: knobs0[k] for k in others}]
        for r in at_top:
            combo = {k: r[k] for k in others}
            if combo not in combos and len(combos) <= EXTRA_FLOOR_COMBOS:
                combos.append(combo)
        # a format without a ceiling knob (Dynamo's GPU budget spans both pools): the loop model's
        ceilings = axes.get("max_replicas", [knobs0.get("max_replicas", max(top, min(
            c.loop.max_replicas for c in current_certs.values())))])
        for floor in _floor_axis(axes[fk], ceilings):
            if floor in axes[fk]:
                continue
            for ceiling in ceilings:
                for combo in combos:
                    add({**combo, fk: floor, "max_replicas": ceiling} if "max_replicas" in axes
                        else {**combo, fk: floor})
    return pd.DataFrame(rows), current_certs


def search_settings(setting, certify: Callable[[Any], dict], simulate: Callable[[Any], dict], *,
                    slo_target: float = DEFAULT_ATTAINMENT, simulated_candidates: int = SIMULATED_CANDIDATES,
                    pool: str = "decode") -> Advice:
    """The search of the module docstring on any plant: certify the grid, bisect the floor on the
    replayed SLO attainment, spend the rest of the replays near the floor found, rank.

    Parameters
    ----------
    setting : ControlPlaneSetting
        The user's parsed setting.
    certify : callable
        setting -> {level name: AutoscalerCertificate}.
    simulate : callable
        setting -> {"slo_attainment", "gpu_hours", "reversals_per_hour", "oscillating", ...}; a
        ``"misses"`` entry (a dict, :func:`slo_shortfall`) is kept in the blocks, not the table.
    slo_target : float
        SLO attainment the recommendation must reach.
    simulated_candidates : int
        Replays of candidates (>= 1): the floor bisection takes what it needs (about log2 of
        the floors searched + 1), the rest go to candidates near the floor it finds.
    pool : str
        The pool the setting sizes (to read its knobs off the built controller).
    """
    check_number("simulated_candidates", simulated_candidates, low=1)
    knobs0 = current_knobs(setting, None if setting.format in FLOOR_KNOB else setting.build(pool))
    fk = FLOOR_KNOB.get(setting.format, "min_replicas")   # the format's floor (the model's name)
    table, current_certs = _candidates(setting, certify, knobs0, knob_grid(setting), fk)
    current_sim = simulate(setting)
    sims: dict[Any, dict] = {}
    replays = 0

    def meets(sim):
        return (sim["slo_attainment"] >= slo_target and not sim["oscillating"]
                and sim["reversals_per_hour"] <= MAX_REVERSALS_PER_HOUR)

    def replay(idx) -> dict:
        nonlocal replays
        if idx not in sims:
            replays += bool(table.at[idx, "changes"])
            sims[idx] = current_sim if not table.at[idx, "changes"] else simulate(table.at[idx, "setting"])
            table.loc[idx, "simulated"] = True
            for k, v in sims[idx].items():
                if not isinstance(v, (dict, list, tuple)):
                    table.loc[idx, f"sim_{k}"] = v
        return sims[idx]

    passing = table[table["passed"]].sort_values(["changed", "held_workers"], kind="stable") if len(table) \
        else table
    floors = sorted(int(f) for f in passing["held_workers"].unique()) if len(passing) else []
    nearest = {f: passing.index[passing["held_workers"] == f][0] for f in floors}
    if len(passing) and not passing["changes"].iloc[0]:   # the user's setting passes: its replay is known
        replay(passing.index[0])
    # bisection on the floor: the top first (if it falls short, no floor of the grid meets the
    # target), then halving towards the lowest floor that meets it
    floor_found = None
    if floors:
        lo, hi = 0, len(floors) - 1
        if meets(replay(nearest[floors[hi]])):
            while lo < hi:
                mid = (lo + hi) // 2
                if meets(replay(nearest[floors[mid]])):
                    hi = mid
                else:
                    lo = mid + 1
            floor_found = floors[hi]
    # the rest of the budget: other passing candidates at the floor found (or the top) and the one below
    budget = int(simulated_candidates) - replays
    if floors and budget > 0:
        at = floor_found if floor_found is not None else floors[-1]
        near = [f for f in floors if f in (at, floors[max(floors.index(at) - 1, 0)])]
        for idx in passing.index[passing["held_workers"].isin(near)]:
            if budget <= 0:
                break
            if idx not in sims:
                replay(idx)
                budget -= 1
    floor_search = [{"min_replicas": f, "knob": fk, "slo_attainment": sims[nearest[f]]["slo_attainment"],
                     "gpu_hours": sims[nearest[f]]["gpu_hours"], "meets_target": meets(sims[nearest[f]]),
                     "oscillating": bool(sims[nearest[f]]["oscillating"]),
                     "reversals_per_hour": float(sims[nearest[f]]["reversals_per_hour"])}
                    for f in floors if nearest[f] in sims]
    return _recommend(setting, table, sims, knobs0, current_certs, current_sim, meets, slo_target, floor_search)


def _recommend(setting, table, sims, knobs0, current_certs, current_sim, meets, slo_target,
               floor_search) -> Advice:
    """The replayed candidate that meets the target at the least GPU-hours (else the best
    attainment); the user's setting when it passes and meets the target at no more GPU-hours."""
    best, best_key = None, None
    for idx, sim in sims.items():
        ok = meets(sim)
        key = (ok, -sim["gpu_hours"] if ok else sim["slo_attainment"])
        if best_key is None or key > best_key:
            best, best_key = idx, key
    if best is None:   # nothing passes the certificate: keep the user's setting, say so
        rec, rec_certs, rec_sim, changes = setting, current_certs, current_sim, {}
        met = meets(current_sim)
    else:
        rec, rec_certs, rec_sim = table.at[best, "setting"], table.at[best, "certs"], sims[best]
        met = meets(rec_sim)
        changes = {k: {"from": knobs0[k], "to": v} for k, v in table.at[best, "changes"].items()}
        if meets(current_sim) and all(c.passed for c in current_certs.values()) and \
                current_sim["gpu_hours"] <= rec_sim["gpu_hours"]:
            rec, rec_certs, rec_sim, changes, met = setting, current_certs, current_sim, {}, True
    blocks = {"current": _block(current_certs, current_sim, slo_target),
              "recommended": _block(rec_certs, rec_sim, slo_target)}
    shown = table.drop(columns=[c for c in ("setting", "certs", "changes") if c in table])
    return Advice(setting, rec, changes, blocks, shown, met, floor_search)


def advise(control_plane, scenario, trace: pd.DataFrame, *, pool: str = "decode", seed: int = 0,
           slo_target: float | None = None, simulated_candidates: int = SIMULATED_CANDIDATES) -> Advice:
    """Certify, search and simulate a control plane's settings on a scenario and trace, replaying
    the candidates through the request simulator (:func:`search_settings`).

    Parameters
    ----------
    control_plane : path or setting
        The user's settings file (any format of :mod:`tokenfactory.controllers.formats`) or a
        parsed setting.
    scenario : ReplayScenario
        The plant, cluster and admission (:func:`tokenfactory.replay.load_replay_scenario`).
    trace : DataFrame
        The requests to replay.
    pool : str
        The pool the control plane sizes (``"decode"`` or ``"fill"``; the other stays fixed).
    seed : int
        Seed of every replay.
    slo_target : float, optional
        SLO attainment the recommendation must reach (default :data:`DEFAULT_ATTAINMENT`).
    simulated_candidates : int
        How many passing candidates are replayed (>= 1).
    """
    from tokenfactory.replay import build_replay, run_replay, scenario_cluster

    pool = check_choice("pool", pool, ("fill", "decode"))
    slo_target = DEFAULT_ATTAINMENT if slo_target is None else check_number("slo_target", slo_target, low=0.0,
                                                                             high=1.0)
    setting = read_control_plane(control_plane) if isinstance(control_plane, (str, Path)) else control_plane
    cluster = scenario_cluster(scenario, seed)
    setup = build_replay(trace, dict(scenario.plant))
    # formats whose setting is not a pool autoscaler's: each has its own search (by format name,
    # which the formats' table defines; a kind of the same name lives in the registry)
    special = {"vllm": lambda: _advise_batch_cap(setting, scenario, trace, setup, cluster, slo_target),
               "dynamo-planner": lambda: _advise_planner(setting, scenario, trace, setup, cluster, slo_target, seed,
                                                         simulated_candidates)}
    if setting.format in special:
        return special[setting.format]()
    if setting.format not in KNOB_GRID:
        raise ConfigError("control_plane", f"advise has no loop model for a {setting.format} setting")
    p = setup.plant.params
    mu = p.decode_capacity(1) if pool == "decode" else p.fill_rate_per_worker
    dyn = cluster.get("dynamics", {})
    startup = float(dyn.get("startup_s", 0.0)) + float(dyn.get("warmup_s", 0.0)) * (1.0 - float(dyn.get(
        "warmup_factor", 0.5)))
    points = operating_points(trace, mu, metric_delay_s=float(cluster.get("measurement_delay_s", p.measurement_delay_s)),
                              startup_s=startup, slots_per_worker=p.decode_slots_per_worker,
                              service_s=p.decode_slots_per_worker / p.decode_capacity(1))

    def certify(s):
        ctl = s.build(pool)
        return {k: certify_autoscaler(ctl, pt) for k, pt in points.items()}

    def simulate(s) -> dict:
        m, res = run_replay(trace, setup, scenario.admission or "slo-aware", 1.0, cluster,
                            autoscalers=[s.build(pool)], admission_params=dict(scenario.admission_params))
        return {"slo_attainment": float(m["slo_attainment"]), "gpu_hours": float(m["gpu_hours"]),
                **scale_churn(res.actions, float(m["duration_s"])), "oscillating": bool(m["oscillating"]),
                "oscillating_signals": oscillating_signals(m),
                "rejected": int(m["rejected"]), "misses": slo_shortfall(res, reach_s)}

    reach_s = float(cluster.get("measurement_delay_s", p.measurement_delay_s)) + float(dyn.get("startup_s", 0.0))

    return search_settings(setting, certify, simulate, slo_target=slo_target,
                           simulated_candidates=simulated_candidates, pool=pool)


def _advise_planner(setting, scenario, trace, setup, cluster, slo_target, seed, simulated_candidates) -> Advice:
    """A Dynamo planner config: both pools certified by the planner's loop model
    (:func:`tokenfactory.controllers.dynamo_planner_loop.certify_planner`) at the trace's sustained
    levels, its own knobs searched (:data:`KNOB_GRID`), the candidates replayed through the real
    planner (ai-dynamo) sizing both pools of the request simulator."""
    from tokenfactory.controllers.dynamo_planner import DynamoCapabilities
    from tokenfactory.controllers.dynamo_planner_loop import certify_planner, planner_pool_loops
    from tokenfactory.plant_models.fleet import PoolDynamics, pool_gpus
    from tokenfactory.replay import run_replay

    setting.planner_fields()   # NotModelled for a config the planner adapter cannot run
    p = setup.plant.params
    dyn = cluster.get("dynamics", {})
    delay = float(cluster.get("measurement_delay_s", p.measurement_delay_s))
    startup, warmup = float(dyn.get("startup_s", 0.0)), float(dyn.get("warmup_s", 0.0))
    # one number for both pools, or {fill, decode}: pool_gpus checks either (named as the scenario names it),
    # PoolDynamics.gpus gives a pool's
    workers = PoolDynamics(gpus_per_worker=pool_gpus("cluster.dynamics.gpus_per_worker",
                                                     dyn.get("gpus_per_worker", 1)))
    fill_gpus, decode_gpus = workers.gpus("fill"), workers.gpus("decode")
    ctx = setup.context(cluster.get("slo_ttft_s", 2.0), cluster.get("slo_tpot_s", 0.1))
    caps = DynamoCapabilities(p.prompt_tokens if p.prompt_tokens > 0 else 1.0, p.output_tokens,
                              ctx.service.fill_token_budget if ctx.service is not None else p.prompt_tokens,
                              p.decode_slots_per_worker, ctx.service.decode_context_tokens if ctx.service is not None
                              else p.prompt_tokens + p.output_tokens / 2.0, None, None, fill_gpus,
                              decode_gpus_per_worker=decode_gpus)
    levels = operating_points(trace, p.decode_capacity(1), metric_delay_s=delay, startup_s=startup,
                              slots_per_worker=p.decode_slots_per_worker, service_s=1.0)

    def certify(s):
        s.validate()   # Dynamo's own cross-field rules (a scale-down level above the scale-up one ...)
        out = {}
        for name, pt in levels.items():
            loops = planner_pool_loops(s, p, demand_rps=pt.demand_rps, metric_delay_s=delay, startup_s=startup,
                                       warmup_s=warmup, gpus_per_worker=workers.gpus_per_worker, capabilities=caps)
            for pool, loop in loops.items():
                out[f"{name} {pool}"] = certify_planner(loop)
        return out

    reach_s = delay + startup

    def simulate(s) -> dict:
        kind, params = s.registered_autoscaler()
        m, res = run_replay(trace, setup, scenario.admission or "slo-aware", 1.0, cluster, autoscaler=kind,
                            autoscaler_params=params, admission_params=dict(scenario.admission_params))
        return {"slo_attainment": float(m["slo_attainment"]), "gpu_hours": float(m["gpu_hours"]),
                **scale_churn(res.actions, float(m["duration_s"])), "oscillating": bool(m["oscillating"]),
                "oscillating_signals": oscillating_signals(m),
                "rejected": int(m["rejected"]), "misses": slo_shortfall(res, reach_s)}

    return search_settings(setting, certify, simulate, slo_target=slo_target,
                           simulated_candidates=simulated_candidates)


#: vLLM's max-num-seqs when a config does not set it (vllm/engine/arg_utils.py default for most GPUs)
VLLM_DEFAULT_MAX_NUM_SEQS = 256


def _advise_batch_cap(setting, scenario, trace, setup, cluster, slo_target) -> Advice:
    """A vLLM config's batch cap: the largest batch whose pass meets the TPOT SLO at the nominal
    context (:func:`tokenfactory.registry.static_batch_cap`) and the simulator's fill token
    budget, replayed against the file's own cap. A static cap closes no loop: no margins, no cycle."""
    from tokenfactory.registry import static_batch_cap
    from tokenfactory.replay import class_outputs, run_replay

    ctx = setup.context(cluster.get("slo_ttft_s", 2.0), cluster.get("slo_tpot_s", 0.1),
                        class_outputs=class_outputs(trace))
    cap = int(static_batch_cap(ctx))
    budget = int(setup.params.fill_token_budget)
    rec = setting.with_params(max_num_seqs=cap, max_num_batched_tokens=budget)

    def simulate(s):
        m, _ = run_replay(trace, setup, scenario.admission or "slo-aware", 1.0, cluster,
                          batch_cap=float(s.max_num_seqs or VLLM_DEFAULT_MAX_NUM_SEQS),
                          admission_params=dict(scenario.admission_params))
        return {"slo_attainment": float(m["slo_attainment"]), "gpu_hours": float(m["gpu_hours"]),
                "tpot_p99_s": float(m["tpot_p99"]), "goodput_tokens_per_s": float(m["goodput_tokens_per_s"]),
                "scale_actions": 0, "reversals_per_hour": 0.0, "oscillating": bool(m["oscillating"])}

    def block(s, sim):
        return {"stable": True, "passed": True, "gain_margin": None, "phase_margin_deg": None, "delay_margin_s": None,
                "loop": "static batch cap (no loop)", "predicted_cycle": None, "cascade_peak_replicas": None,
                "vllm_flags": s.flags(), "slo_target": slo_target, "simulated": sim}

    cur_sim, rec_sim = simulate(setting), simulate(rec)
    changes = {k: {"from": getattr(setting, k), "to": getattr(rec, k)} for k in ("max_num_seqs", "max_num_batched_tokens")
               if getattr(setting, k) != getattr(rec, k)}
    table = pd.DataFrame([{"max_num_seqs": s.max_num_seqs, "max_num_batched_tokens": s.max_num_batched_tokens,
                           "passed": True, "simulated": True, **{f"sim_{k}": v for k, v in sim.items()}}
                          for s, sim in ((setting, cur_sim), (rec, rec_sim))])
    return Advice(setting, rec, changes, {"current": block(setting, cur_sim), "recommended": block(rec, rec_sim)},
                  table, rec_sim["slo_attainment"] >= slo_target)


def slo_shortfall(res, reach_s: float | None = None, window_s: float = 60.0) -> dict:
    """Where a replay's SLO misses went (:meth:`SimulationResult.slo_misses`), over the run and in
    the trace's busiest ``window_s`` of arrivals, and whether a worker ordered when that peak shows
    (``reach_s`` later: measurement delay + start-up) comes before its requests' TTFT deadlines.

    Parameters
    ----------
    res : SimulationResult
        A request simulator's result (per-request records and per-class SLOs).
    reach_s : float, optional
        From a demand showing to a worker ordered for it serving (s, >= 0); None: not judged.
    window_s : float
        Width of the peak window (s, > 0; default 60).

    Returns
    -------
    dict
        ``missed``, ``rejected`` (all reasons), ``rejected_by_reason``, ``late_ttft``, ``late_tpot``,
        ``unfinished``, ``peak_start_s``, ``peak_window_s``, ``in_peak`` (misses arriving in the
        peak window), ``reach_s``, ``longest_ttft_slo_s`` and ``burst_outruns_startup`` (``reach_s``
        beyond the window plus the longest TTFT SLO; None when not judged).
    """
    check_number("window_s", window_s, low=0.0, low_inclusive=False)
    miss = res.slo_misses()
    arr = res.records["arrival_s"].dropna().to_numpy(dtype=float)
    counts = np.bincount(((arr - arr.min()) // window_s).astype(int)) if len(arr) else np.zeros(1)
    peak_s = (float(arr.min()) if len(arr) else 0.0) + float(np.argmax(counts)) * window_s
    peak = res.slo_misses((peak_s, peak_s + window_s))
    longest = max(float(v["slo_ttft_s"]) for v in res.metrics["classes"].values())
    rejected = sum(miss["rejected"].values())
    return {"missed": miss["requests"] - miss["met"], "rejected": rejected, "rejected_by_reason": miss["rejected"],
            "late_ttft": miss["late_ttft"], "late_tpot": miss["late_tpot"], "unfinished": miss["unfinished"],
            "peak_start_s": peak_s, "peak_window_s": float(window_s), "in_peak": peak["requests"] - peak["met"],
            "reach_s": reach_s, "longest_ttft_slo_s": longest,
            "burst_outruns_startup": None if reach_s is None else bool(reach_s >= window_s + longest)}


def oscillating_signals(metrics: Mapping[str, Any]) -> list[str]:
    """The signals a run's verdict calls oscillating (``metrics["oscillation"]["signals"]``), and
    ``"pool churn"`` when its pools churn: what a simulated "oscillating" is about.

    Parameters
    ----------
    metrics : mapping
        A replay's metrics (its ``oscillation`` report; none: nothing is named).
    """
    rep = metrics.get("oscillation") or {}
    names = sorted(k.replace("_", " ") for k, v in (rep.get("signals") or {}).items()
                   if isinstance(v, Mapping) and v.get("oscillating"))
    return names + (["pool churn"] if rep.get("churning") else [])


def scale_churn(actions: pd.DataFrame, duration_s: float) -> dict:
    """Scale actions and reversals per hour of a result's action table.

    Parameters
    ----------
    actions : DataFrame
        A replay result's actions; the rows of ``kind`` ``"scale"`` (columns ``pool``, ``from``,
        ``to``) are counted.
    duration_s : float
        Length of the run (s, > 0).

    Returns
    -------
    dict
        ``"scale_actions"`` (count) and ``"reversals_per_hour"``.
    """
    scale = actions[actions["kind"] == "scale"] if "kind" in actions else actions.iloc[0:0]
    rows = scale[["pool", "from", "to"]].to_dict("records") if len(scale) else []
    return {"scale_actions": len(rows), "reversals_per_hour": count_reversals(rows) / max(duration_s / 3600.0, 1e-9)}
