"""``tokenfactory advise``: read a control plane's own settings file, certify it on the user's
plant, search the same control plane's knobs for a setting that holds, simulate both, and write
the recommendation back in the user's own format.

The search is two-stage, because the loop model is cheap and the simulator is the judge:

1. every point of the control plane's knob grid (:data:`KNOB_GRID`) is certified with
   :func:`tokenfactory.controllers.autoscaler_loops.certify_autoscaler` at the demand levels the
   trace sustains (the median and the 90th percentile of its 5-minute rates; shorter bursts are
   transients, not operating points) - a candidate passes when no cycle is predicted at any
   level and its start-up overshoot stays within one worker of what the level needs;
2. the passing candidates nearest the user's setting (fewest knobs changed, then fewest
   workers held) are replayed through the request simulator with the scenario's admission, and
   the one meeting the SLO attainment target with the fewest GPU-hours, no oscillation and at
   most :data:`MAX_REVERSALS_PER_HOUR` reversals is recommended. If none meets the target, the one
   with the best attainment is, and the result says so.
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

__all__ = ["advise", "search_settings", "current_knobs", "scale_churn", "Advice", "KNOB_GRID", "MAX_REVERSALS_PER_HOUR", "operating_points", "DEFAULT_ATTAINMENT"]

#: reversals per hour above which a pool is churning (issue 21's bound for a pool that holds)
MAX_REVERSALS_PER_HOUR = 2.0
#: SLO attainment a recommendation must reach when the scenario states none
DEFAULT_ATTAINMENT = 0.99
#: candidates replayed through the request simulator
SIMULATED_CANDIDATES = 6


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
}


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
        Width of the windows the rates are counted over (s, > 0; default 300); empty windows are left out.

    Returns
    -------
    dict
        ``"median"`` and ``"p90"`` -> :class:`PoolOperatingPoint` at that demand.
    """
    arr = trace["arrival_s"].to_numpy(dtype=float)
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
        One row per candidate certified: its knobs, ``passed``, ``simulated`` and the simulated
        metrics as ``sim_*`` columns.
    met_target : bool
        Whether the recommendation meets the SLO attainment target (for a pool autoscaler also
        without oscillation and within :data:`MAX_REVERSALS_PER_HOUR`).
    """

    current: Any
    recommended: Any
    changes: dict
    blocks: dict          # "current" / "recommended" -> the metrics block
    candidates: pd.DataFrame
    met_target: bool

    def to_dict(self) -> dict:
        return {"current": self.blocks["current"], "recommended": self.blocks["recommended"],
                "changes": self.changes, "met_slo_target": self.met_target,
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
            return (f"tokenfactory advise: {old} -> {new}; {why} ({was}); simulated SLO "
                    f"{cur['simulated']['slo_attainment']:.3f} -> {rec['simulated']['slo_attainment']:.3f}")

        return rewrite_control_plane(original, self.recommended, comment=note)

    def summary(self) -> list[str]:
        """Sentences from the numbers."""
        c, r = self.blocks["current"], self.blocks["recommended"]
        cs, rs = c["simulated"], r["simulated"]

        def cert(b):
            cyc = b["predicted_cycle"]
            return ("passes" if b["passed"] else "fails") + (
                f" (predicts a {cyc['period_s']:.0f} s cycle between {cyc['low_replicas']} and "
                f"{cyc['high_replicas']} workers)" if cyc else "")

        lines = [f"Current setting: certificate {cert(c)}; simulated SLO attainment {cs['slo_attainment']:.3f}, "
                 f"{cs['gpu_hours']:.2f} GPU-hours, {cs['reversals_per_hour']:.1f} reversals/h, "
                 f"{'oscillating' if cs['oscillating'] else 'not oscillating'}."]
        if not self.changes:
            lines.append("No setting of the grid does better; the recommendation is the current setting.")
        else:
            ch = ", ".join(f"{k} {'unset' if v['from'] is None else format(v['from'], 'g')} -> {v['to']:g}"
                           for k, v in self.changes.items())
            lines.append(f"Recommended ({ch}): certificate {cert(r)}; simulated SLO attainment "
                         f"{rs['slo_attainment']:.3f}, {rs['gpu_hours']:.2f} GPU-hours, "
                         f"{rs['reversals_per_hour']:.1f} reversals/h.")
        if not self.met_target:
            lines.append(f"No candidate reached the SLO attainment target {r['slo_target']:.3f}; the recommendation "
                         "is the best attainment found.")
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


def search_settings(setting, certify: Callable[[Any], dict], simulate: Callable[[Any], dict], *,
                    slo_target: float = DEFAULT_ATTAINMENT, simulated_candidates: int = SIMULATED_CANDIDATES,
                    pool: str = "decode") -> Advice:
    """The two-stage search of the module docstring on any plant.

    Parameters
    ----------
    setting : ControlPlaneSetting
        The user's parsed setting.
    certify : callable
        setting -> {level name: AutoscalerCertificate}.
    simulate : callable
        setting -> {"slo_attainment", "gpu_hours", "reversals_per_hour", "oscillating", ...}.
    slo_target : float
        SLO attainment the recommendation must reach.
    simulated_candidates : int
        How many passing candidates are simulated (>= 1).
    pool : str
        The pool the setting sizes (to read its knobs off the built controller).
    """
    check_number("simulated_candidates", simulated_candidates, low=1)
    knobs0 = current_knobs(setting, setting.build(pool))
    grid = KNOB_GRID[setting.format]
    current_certs = certify(setting)
    need = max(math.ceil(c.workers_needed - 1e-9) for c in current_certs.values())
    axes = {k: grid[k](knobs0[k], need) for k in grid}
    rows = []
    for values in itertools.product(*axes.values()):
        knobs = dict(zip(axes, values))
        changed = {k: v for k, v in knobs.items() if v != knobs0[k]}
        try:
            cand = setting.with_params(**changed) if changed else setting
            certs = certify(cand)
        except ConfigError as exc:   # a knob combination the format or model refuses
            rows.append({**knobs, "changed": len(changed), "passed": False, "simulated": False, "error": str(exc)})
            continue
        rows.append({**knobs, "changed": len(changed), "passed": all(c.passed for c in certs.values()),
                     "held_workers": knobs.get("min_replicas", 1), "simulated": False, "setting": cand,
                     "certs": certs, "changes": changed})
    table = pd.DataFrame(rows)
    current_sim = simulate(setting)

    def meets(sim):
        return (sim["slo_attainment"] >= slo_target and not sim["oscillating"]
                and sim["reversals_per_hour"] <= MAX_REVERSALS_PER_HOUR)

    passing = table[table["passed"]].sort_values(["changed", "held_workers"], kind="stable")
    # the nearest candidates of each floor: holding more workers is the one knob a start-up of
    # minutes leaves for bursts shorter than it, so every floor gets its share of the replays
    floors = sorted(passing["held_workers"].unique()) if len(passing) else []
    share = max(1, int(simulated_candidates) // max(1, len(floors)))
    chosen = [i for f in floors for i in passing.index[passing["held_workers"] == f][:share]]
    best, best_key, best_sim, met = None, None, None, False
    for idx in chosen:
        cand = table.at[idx, "setting"]
        sim = current_sim if not table.at[idx, "changes"] else simulate(cand)
        table.loc[idx, "simulated"] = True
        for k, v in sim.items():
            table.loc[idx, f"sim_{k}"] = v
        ok = meets(sim)
        key = (ok, -sim["gpu_hours"] if ok else sim["slo_attainment"])
        if best_key is None or key > best_key:
            best, best_key, best_sim, met = idx, key, sim, ok
    if best is None:   # nothing passes the certificate: keep the user's setting, say so
        rec, rec_certs, rec_sim, changes = setting, current_certs, current_sim, {}
        met = meets(current_sim)
    else:
        rec, rec_certs, rec_sim = table.at[best, "setting"], table.at[best, "certs"], best_sim
        changes = {k: {"from": knobs0[k], "to": v} for k, v in table.at[best, "changes"].items()}
        if meets(current_sim) and all(c.passed for c in current_certs.values()) and \
                current_sim["gpu_hours"] <= rec_sim["gpu_hours"]:
            rec, rec_certs, rec_sim, changes, met = setting, current_certs, current_sim, {}, True
    blocks = {"current": _block(current_certs, current_sim, slo_target),
              "recommended": _block(rec_certs, rec_sim, slo_target)}
    shown = table.drop(columns=[c for c in ("setting", "certs", "changes") if c in table])
    return Advice(setting, rec, changes, blocks, shown, met)


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
    if setting.format == "vllm":
        return _advise_batch_cap(setting, scenario, trace, setup, cluster, slo_target)
    if setting.format not in KNOB_GRID:
        raise ConfigError("control_plane", f"advise has no loop model for a {setting.format} setting (Dynamo's "
                          "planner decides from its own perf model); run it with `simulate --control-plane FILE`")
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
                "rejected": int(m["rejected"])}

    return search_settings(setting, certify, simulate, slo_target=slo_target,
                           simulated_candidates=simulated_candidates, pool=pool)


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
