"""The stack certificate (``tokenfactory certify``): every layer's gain, phase and delay margins
over the envelope (delays, service rates, demand level; start-up times for the reconfiguration
layer) with the binding point named; the separation of each adjacent pair of layers
(:mod:`tokenfactory.controllers.separation`: inner closed-loop bandwidth, outer crossover, ratio,
the outer loop's PM with the real inner loop); the describing-function check of every relay or
saturation in a loop (admission's rate clip, the reconfiguration layer's whole-worker hysteresis
relay); a verdict: passed when every floor holds."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import control
import pandas as pd

from tokenfactory.controllers.autotune import StabilityEnvelope, admission_loop
from tokenfactory.controllers.batch_gate import batch_gate_loop, pass_target_s, predict_batch_cycle
from tokenfactory.controllers.describing import predict_limit_cycles
from tokenfactory.controllers.planning import correction_certificate
from tokenfactory.controllers.reconfiguration import need_noise_std
from tokenfactory.controllers.separation import (
    CascadePair,
    cascade_separation,
    closed_loop,
    closed_loop_bandwidth,
    first_order_lag,
    reconfiguration_loop,
)
from tokenfactory.controllers.slo_admission import slo_gate_loop
from tokenfactory.controllers.stability import DelayedLoop, stability_margins
from tokenfactory.core.validation import ConfigError
from tokenfactory.plant_models.fluid import FluidPlant
from tokenfactory.registry import slo_admission_tuning
from tokenfactory.stack.build import admission_controller
from tokenfactory.stack.plant import (
    gate_fraction,
    gate_sample_period_s,
    gate_tuning,
    planning_lead_s,
    pools_at,
    queue_clear,
    reconfiguration_delay_s,
    stack_plant,
    target_utilization,
)
from tokenfactory.stack.stack_scenario import StackScenario

__all__ = ["Certificate", "certify"]


@dataclass
class Certificate:
    """The stack certificate: per-layer margins over the envelope, separations, describing-function
    checks, failures (each naming its layer) and the verdict.

    Parameters
    ----------
    scenario : str
        The scenario's name.
    layers : dict
        Per layer: its worst point over the envelope (margins) and every point, or what a static
        or feed-forward layer is.
    separation : list of CascadePair
        Each adjacent pair of layers, outer first.
    describing_function : list of dict
        The describing-function check of every relay or saturation.
    failures : list of dict
        ``{"layer", "check", "detail"}`` for every floor that fails (empty: passed).
    binding : dict
        The layer and envelope point with the least margin.
    """

    scenario: str
    layers: dict[str, dict]
    separation: list[CascadePair]
    describing_function: list[dict]
    failures: list[dict]
    binding: dict

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict:
        return {"scenario": self.scenario, "passed": self.passed, "layers": self.layers,
                "separation": [s.to_dict() for s in self.separation],
                "separation_rows": self.separation_rows(),
                "describing_function": self.describing_function, "failures": self.failures,
                "binding": self.binding}

    def separation_rows(self) -> list[dict]:
        return [{"outer": s.outer, "inner": s.inner, "inner_bandwidth_rad_s": s.inner_bandwidth_rad_s,
                 "outer_crossover_rad_s": s.outer_crossover_rad_s, "ratio": s.ratio,
                 "pm_ideal_deg": s.ideal.phase_margin_deg if s.ideal else None,
                 "pm_real_deg": s.real.phase_margin_deg if s.real else None,
                 "pm_loss_deg": s.pm_loss_deg if s.ideal else None,
                 "first_order_pm_loss_deg": s.first_order_pm_loss_deg, "note": s.note} for s in self.separation]

    def to_pandas(self) -> pd.DataFrame:
        rows = []
        for layer, d in self.layers.items():
            for r in d.get("points", []):
                rows.append({"layer": layer, **r})
        return pd.DataFrame(rows)


def _score(m, env: StabilityEnvelope) -> float:
    """How close a point is to the floors (< 1 fails): min(GM / GM floor, PM / PM floor)."""
    gm = m["gain_margin"] / env.gm_floor if math.isfinite(m["gain_margin"]) else math.inf
    pm = m["phase_margin_deg"] / env.pm_floor_deg if env.pm_floor_deg > 0 else math.inf
    return min(gm, pm)


def _margin_row(m, **point) -> dict:
    return {**point, "gain_margin": m.gain_margin, "phase_margin_deg": m.phase_margin_deg,
            "delay_margin_s": m.delay_margin_s, "ms": m.ms, "crossover_rad_s": m.crossover_rad_s}


def _control_plane_layer(sc: StackScenario, plant, rc, adm_rec_loop, layers, failures, dfs, separation):
    """The certificate of a control plane run from its own settings file: its loop model at every
    envelope point (demand x start-up x service rate), the cycle and start-up overshoot its rule
    predicts, the separation of its linear part from admission, and - when it fails - the knob of
    the same control plane and the value that passes (:func:`tokenfactory.advise.search_settings`
    on the loop model alone)."""
    from tokenfactory.controllers.autoscaler_loops import PoolOperatingPoint, certify_autoscaler

    p = plant.params
    setting = rc.read()
    ctl = setting.build(rc.pool)
    mu0 = p.decode_capacity(1) if rc.pool == "decode" else p.fill_rate_per_worker
    startup0 = sc.dynamics.startup_s + sc.dynamics.warmup_s * (1.0 - sc.dynamics.warmup_factor)

    def points(s):
        out = {}
        c = s.build(rc.pool)
        for dem in sc.demand_factors:
            for sf in sc.startup_factors:
                for rfac in sc.envelope.service_rate_factors:
                    pt = PoolOperatingPoint(mu0 * rfac, sc.rate_rps * dem, p.measurement_delay_s, startup0 * sf,
                                            p.decode_slots_per_worker, p.decode_slots_per_worker / p.decode_capacity(1))
                    out[(dem, sf, rfac)] = certify_autoscaler(c, pt, gm_floor=sc.envelope.gm_floor,
                                                             pm_floor_deg=sc.envelope.pm_floor_deg)
        return out

    certs = points(setting)
    rows = []
    for (dem, sf, rfac), c in certs.items():
        d = c.to_dict()
        cyc = d["predicted_cycle"]
        rows.append({"demand_factor": dem, "startup_factor": sf, "service_rate_factor": rfac,
                     "gain_margin": math.inf if d["gain_margin"] is None else d["gain_margin"],
                     "phase_margin_deg": math.nan if d["phase_margin_deg"] is None else d["phase_margin_deg"],
                     "delay_margin_s": d["delay_margin_s"], "loop_delay_s": d["loop_delay_s"],
                     "predicted_cycle_s": cyc["period_s"] if cyc else None,
                     "cascade_peak_replicas": d["cascade_peak_replicas"], "workers_needed": d["workers_needed"],
                     "score": 1.0 if c.passed else 0.0, "meets_floors": c.passed})
    worst = min(rows, key=lambda r: (r["meets_floors"], -(r["predicted_cycle_s"] or 0.0)))
    layers["reconfiguration"] = {"points": rows, "worst": worst, "meets_floors": all(r["meets_floors"] for r in rows),
                                 "control_plane": setting.format, "controller": type(ctl).__name__,
                                 "params": ctl.params(), "pool": rc.pool, "sample_period_s": ctl.sample_period}
    if not layers["reconfiguration"]["meets_floors"]:
        c = certs[(worst["demand_factor"], worst["startup_factor"], worst["service_rate_factor"])]
        why = (f"predicts a {worst['predicted_cycle_s']:.0f} s cycle between {c.predicted_cycle.low_replicas} and "
               f"{c.predicted_cycle.high_replicas} workers" if c.predicted_cycle else
               f"its ceiling of {c.loop.max_replicas} workers cannot carry the {c.workers_needed:.2f} needed"
               if not c.ceiling_carries else
               f"a start-up asks for {c.cascade_peak} workers where {c.workers_needed:.2f} are needed")
        need = max(math.ceil(cc.workers_needed - 1e-9) for cc in certs.values())
        fix = _passing_knob(setting, points, rc.pool, need)
        failures.append({"layer": "reconfiguration", "check": "loop model",
                         "detail": f"{setting.format} on {rc.pool}: {why} at demand x{worst['demand_factor']:g}, "
                                   f"start-up x{worst['startup_factor']:g}, service rate x{worst['service_rate_factor']:g}"
                                   + (f"; {fix} passes" if fix else "; no single knob of its grid passes")})
    for (dem, sf, rfac), c in certs.items():
        if (dem, sf, rfac) == (1.0, 1.0, 1.0) or len(certs) == 1:
            cyc = c.predicted_cycle
            dfs.append({"layer": "reconfiguration", "element": f"{rc.pool} pool: the rule's thresholds and whole "
                        "replicas (relay)", "loop": c.to_dict()["loop"], "limit_cycle": cyc is not None,
                        "period_s": cyc.period_s if cyc else None,
                        "reason": "piecewise relay cycle of the loop model" if cyc else
                        "the rule holds a pool at the nominal demand"})
    nominal = certs.get((1.0, 1.0, 1.0), certs[next(iter(certs))])
    theta = nominal.loop.delay_s
    # a replica change reaches the queue one loop delay after the metric moved (metric age, half a
    # sample, its window, the start-up): the control plane acts at most once per delay, so its loop
    # is read as an integrator crossing over at 1 / delay behind that delay
    acting = DelayedLoop(control.tf([1.0 / theta], [1.0, 0.0]), theta, f"{setting.format} (one action per loop delay)")
    if adm_rec_loop is not None:
        pair = cascade_separation("reconfiguration", acting, "admission", closed_loop(adm_rec_loop))
        # the ratio is the check; a phase-margin loss of this stand-in loop says nothing about a relay
        separation.append(dataclasses.replace(
            pair, pm_loss_deg=math.nan,
            note=f"the control plane acts once per loop delay ({theta:.0f} s: metric age, half a sample, its window, "
                 f"the start-up) over admission's closed loop; the ratio is checked, the phase-margin loss of this "
                 f"stand-in for a relay is not (it would read {pair.pm_loss_deg:.1f} deg)"))
    return acting


def _passing_knob(setting, points, pool, need: int) -> str | None:
    """The first single-knob change of the control plane's grid whose every envelope point passes
    (``need``: the workers the highest envelope demand needs)."""
    from tokenfactory.advise import KNOB_GRID, current_knobs

    knobs0 = current_knobs(setting, setting.build(pool))
    for key, values in KNOB_GRID.get(setting.format, {}).items():
        for v in list(values(knobs0[key], need)) + ([need + 1] if key == "max_replicas" else []):
            if v == knobs0[key]:
                continue
            try:
                cand = setting.with_params(**{key: v})
                if all(c.passed for c in points(cand).values()):
                    return f"{key} {knobs0[key]:g} -> {v:g}"
            except ConfigError:
                continue
    return None


def certify(sc: StackScenario) -> Certificate:
    """Margins, separations, describing-function checks and the verdict of a stack scenario.

    Parameters
    ----------
    sc : StackScenario
        The scenario (its envelope and certificate floors).

    Returns
    -------
    Certificate
        ``passed`` is True when every floor holds; each failure names its layer and the binding point.
    """
    env = sc.envelope
    plant = stack_plant(sc)
    p = plant.params
    rc = sc.layers["reconfiguration"]
    T_rc = rc.sample_period_s
    u = target_utilization(sc)
    layers: dict[str, dict] = {}
    failures: list[dict] = []
    separation: list[CascadePair] = []
    dfs: list[dict] = []

    def judge(layer: str, rows: list[dict]) -> None:
        for r in rows:
            r["score"] = _score(r, env)
            r["meets_floors"] = r["score"] >= 1.0
        worst = min(rows, key=lambda r: r["score"])
        layers[layer] = {"points": rows, "worst": worst, "meets_floors": all(r["meets_floors"] for r in rows)}
        if not layers[layer]["meets_floors"]:
            failures.append({"layer": layer, "check": "margins",
                             "detail": f"GM {worst['gain_margin']:.3g}, PM {worst['phase_margin_deg']:.1f} deg at "
                                       + ", ".join(f"{k}={worst[k]}" for k in worst if k.endswith("factor"))
                                       + f" (floors GM >= {env.gm_floor:g}, PM >= {env.pm_floor_deg:g} deg)"})

    # -- batch gate: static (the slot limit; its response is one decode pass) or the gated cap's
    # integral loop over delay x pass-time slope (the envelope's service-rate factors)
    gate_tau = p.dispatch_s
    gate_closed = None
    if getattr(sc.layers.get("batch_gate"), "samples_live_pass", False):
        try:
            gt = gate_tuning(sc)
        except ConfigError as e:
            failures.append({"layer": "batch_gate", "check": "margins", "detail": str(e)})
            layers["batch_gate"] = {"meets_floors": False, "points": []}
        else:
            keys = ("gain_margin", "phase_margin_deg", "delay_margin_s", "ms", "crossover_rad_s")
            rows = [{"delay_factor": r["delay_factor"], "service_rate_factor": r["slope_factor"],
                     **{k: r.get(k, math.nan) for k in keys}} for r in gt.envelope]
            judge("batch_gate", rows)
            layers["batch_gate"].update({"gain": gt.gain, "hold_s": gt.hold_s, "theta_s": gt.theta_s,
                                         "tau_c_s": gt.tau_c_s, "sample_period_s": gate_sample_period_s(sc),
                                         "pass_target_s": pass_target_s(sc.slo_tpot_s, gate_fraction(sc)),
                                         "ungated_gain_margin": gt.ungated.gain_margin if gt.ungated else None})
            gate_loop = batch_gate_loop(gt.gain, gt.hold_s, gt.theta_s)
            gate_closed = closed_loop(gate_loop)
            # the cap's saturation (between one sequence and the KV slots) in the gated loop
            cyc = predict_batch_cycle(gate_loop, 1.0)
            dfs.append({"layer": "batch_gate", "element": "cap saturation [1, KV slots]",
                        "loop": "gated integral correction of the pass target", "limit_cycle": cyc is not None,
                        "period_s": cyc.period_s if cyc else None,
                        "reason": "N(A) of a saturation is real in (0, 1]; the gated loop's gain at its phase "
                                  f"crossover is {1.0 / gt.nominal.gain_margin:.2f} < 1: no solution"
                                  if cyc is None else "the loop's gain at its phase crossover is >= 1",
                        "ungated_limit_cycle": gt.ungated_cycle})
    elif "batch_gate" in sc.layers:
        layers["batch_gate"] = {"static": True, "decode_slots_per_worker": p.decode_slots_per_worker,
                                "pass_time_s": p.decode_step_s(p.decode_slots_per_worker),
                                "response_time_constant_s": gate_tau, "meets_floors": True}
    # -- admission over delay x service rate x demand level
    adm = None
    adm_loop = None       # admission's loop nearest the gate's band (the admission -> batch_gate pair)
    adm_rec_loop = None   # admission's loop the reconfiguration layer sees through (its slowest)
    adm_cfg = sc.layers.get("admission")
    if adm_cfg is not None and adm_cfg.bounds_own_ready_wait:
        adm, _ = admission_controller(sc, plant)
        # the gate's two limit corrections (fill wait, decode wait), SIMC-tuned over delay x
        # prediction gain (tokenfactory.controllers.slo_admission.tune_slo_admission)
        tun = slo_admission_tuning(adm, p.measurement_delay_s)
        keys = ("gain_margin", "phase_margin_deg", "delay_margin_s", "ms", "crossover_rad_s")
        rows = [{"loop": n, "delay_factor": r["delay_factor"], "gain_factor": r["gain_factor"],
                 **{k: r.get(k, math.nan) for k in keys}} for n, gt in tun.items() for r in gt.envelope]
        judge("admission", rows)
        layers["admission"]["tuning"] = {**{n: {"ki": gt.ki, "theta_s": gt.theta_s, "gate_time_s": gt.gate_time_s,
                                                "tau_c_s": gt.tau_c_s} for n, gt in tun.items()},
                                         "sample_period_s": adm.sample_period, "kind": adm_cfg.kind}
        loops = {n: slo_gate_loop(gt.ki, gt.theta_s, gt.gate_time_s, name=f"slo gate ({n})") for n, gt in tun.items()}
        by_speed = sorted(loops, key=lambda n: stability_margins(loops[n]).crossover_rad_s)
        adm_loop, adm_rec_loop = loops[by_speed[-1]], loops[by_speed[0]]
        for n, gt in tun.items():
            dfs.append({"layer": "admission", "element": f"{n}-wait limit clamp (saturation)",
                        "loop": f"the {n} limit's integral correction", "limit_cycle": gt.limit_cycle is not None,
                        "period_s": (gt.limit_cycle or {}).get("period_s"),
                        "reason": "describing function of the clamp over the envelope: "
                                  + ("no solution" if gt.limit_cycle is None else "a cycle is predicted")})
    elif "admission" in sc.layers:
        adm, tuning = admission_controller(sc, plant)
        rows = []
        for dem in sc.demand_factors:
            nf, nd = pools_at(p, sc.rate_rps * dem, u)
            pl = FluidPlant(p, nf, nd)
            cache: dict = {}
            for dfac, rfac in env.points():
                m = stability_margins(admission_loop(pl, adm, delay_factor=dfac, service_rate_factor=rfac,
                                                     _plant_model_cache=cache))
                rows.append(_margin_row(m, demand_factor=dem, delay_factor=dfac, service_rate_factor=rfac))
        judge("admission", rows)
        layers["admission"]["tuning"] = {"tau_c_s": tuning.tau_c_s, "tau_c_over_theta": tuning.tau_c_over_theta,
                                         "effective_delay_s": tuning.effective_delay_s,
                                         "sample_period_s": adm.sample_period}
        adm_loop = admission_loop(FluidPlant(p, plant.fill_workers, plant.decode_workers), adm)
        adm_rec_loop = adm_loop
    if adm_loop is not None and not adm_cfg.bounds_own_ready_wait:
        # describing function: admission's rate clip is a saturation in the loop. With conditional
        # integration (anti-windup) the integral freezes while the output is clipped, so the clip
        # sees the proportional loop kc F(s) P(s) e^{-theta s}. A saturation's N(A) is real in (0, 1],
        # so harmonic balance 1 + N(A) L(jw) = 0 has a solution exactly where the phase crosses -180
        # deg with |L| > 1/N >= 1: a cycle is predicted iff that loop's gain margin is below 1.
        worst_adm = layers["admission"]["worst"]
        wl = admission_loop(FluidPlant(p, plant.fill_workers, plant.decode_workers), adm,
                            delay_factor=worst_adm["delay_factor"], service_rate_factor=worst_adm["service_rate_factor"])
        ti = adm.gains.ti
        # C_PI x ti s / (ti s + 1) = kc: cancel the PI's integrator and zero exactly (minreal), so no
        # pole-zero pair is left on the imaginary axis for the Nyquist count to refuse
        p_only = DelayedLoop(control.minreal(wl.rational * control.tf([ti, 0.0], [ti, 1.0]), verbose=False),
                             wl.delay, "admission P part")
        gm_p = stability_margins(p_only).gain_margin
        dfs.append({"layer": "admission", "element": "rate clip [0, fill capacity] (saturation, anti-windup)",
                    "loop": "admission's proportional loop at its worst envelope point", "limit_cycle": gm_p < 1.0,
                    "period_s": None, "gain_margin_seen": gm_p,
                    "reason": f"N(A) of a saturation is real in (0, 1]; the loop it sees has GM {gm_p:.2f}"
                              + (" >= 1: no solution" if gm_p >= 1.0 else " < 1: a cycle is predicted")})
    if adm_loop is not None:
        # the admission loop with the decode batch's response (one pass) in its plant vs without
        if gate_closed is not None:
            # the cap sets the decode consumption admission's loop sees - a plant parameter (the
            # envelope's service-rate factors cover its range) - while what admission releases joins
            # the batch within a pass: the pass lag is in the loop, the gate's bandwidth sets the ratio
            series = cascade_separation("admission", adm_loop, "batch_gate", gate_closed)
            separation.append(cascade_separation(
                "admission", adm_loop, "batch_gate", first_order_lag(gate_tau),
                inner_bandwidth_rad_s=series.inner_bandwidth_rad_s,
                note="the gated cap's closed loop sets admission's decode consumption (a plant parameter within "
                     "the envelope's service-rate factors); admitted work joins the batch within a pass (the lag "
                     f"in the loop); with the gate's closed loop in series instead, the conservative reading, "
                     f"admission would lose {series.pm_loss_deg:.1f} deg"))
        elif "batch_gate" in sc.layers:
            separation.append(cascade_separation(
                "admission", adm_loop, "batch_gate", first_order_lag(gate_tau),
                note="decode batch responds to a freed or filled slot within one pass (first-order lag)"))
    # -- reconfiguration: a control plane's own settings file, judged by its loop model, or
    # tokenfactory's hysteretic pools over start-up x service rate
    rec_loop = None
    if rc.own_settings:
        rec_loop = _control_plane_layer(sc, plant, rc, adm_rec_loop, layers, failures, dfs, separation)
    else:
        # -- reconfiguration over start-up x service rate
        qc, tau_c_f = queue_clear(sc, plant)
        rows = []
        theta0 = reconfiguration_delay_s(p, sc.dynamics, T_rc)
        for sf in sc.startup_factors:
            for rfac in env.service_rate_factors:
                theta = reconfiguration_delay_s(p, sc.dynamics, T_rc, sf)
                m = stability_margins(reconfiguration_loop(qc, u, theta, service_rate_factor=rfac))
                rows.append(_margin_row(m, startup_factor=sf, service_rate_factor=rfac, loop_delay_s=theta))
        judge("reconfiguration", rows)
        layers["reconfiguration"].update({"queue_clear_s": qc, "tau_c_over_theta": tau_c_f, "delay_s": theta0,
                                          "sample_period_s": T_rc, "target_utilization": u})
        rec_loop = reconfiguration_loop(qc, u, theta0)
        if adm_rec_loop is not None:
            separation.append(cascade_separation(
                "reconfiguration", rec_loop, "admission", closed_loop(adm_rec_loop),
                note="a worker's capacity reaches the queue through admission's closed loop (complementary sensitivity)"))
        # describing function of the whole-worker hysteresis relay
        nf, nd = plant.fill_workers, plant.decode_workers
        for pool, mu, n in (("fill", p.fill_rate_per_worker, nf), ("decode", p.decode_capacity(1), nd)):
            sigma = need_noise_std(sc.rate_rps, mu, u, rc.filter_s)
            db = max(rc.min_dead_band, 3.0 * sigma)
            # the relay switches n-1 <-> n at need n-1 (up) and n-1-db (down); the pool at n-1 then runs
            # at utilisation u (up) or less: the queue the loop feeds back is empty unless u (+3 sigma) >= 1
            u_switch = u * (1.0 + 3.0 * sigma / max(n - 1, 1))
            gain = 1.0 if u_switch >= 1.0 else 0.0
            relay = control.relay_hysteresis_nonlinearity(b=0.5, c=(1.0 + db) / 2.0)
            cyc = predict_limit_cycles(rec_loop.scaled(gain), relay, amplitude_bounds=((1.0 + db) / 2.0 * 1.0001, 1e6)) \
                if gain > 0 else []
            dfs.append({"layer": "reconfiguration", "element": f"{pool} pool: whole-worker relay, hysteresis 1 + "
                        f"dead band {db:.2f} workers", "loop": "backlog feedback", "limit_cycle": bool(cyc),
                        "period_s": cyc[0].period_s if cyc else None, "switch_utilization": u_switch,
                        "reason": (f"at the switching points the smaller pool runs at utilisation {u_switch:.2f} < 1: "
                                   "the queue is empty on both sides, the loop gain the relay sees is zero")
                        if gain == 0 else "utilisation at the switching point >= 1: the relay sees the integrating queue"})
    # -- planning: feed-forward (the offered rate is exogenous; no loop through the plant)
    if "planning" in sc.layers and rec_loop is not None:
        lead = planning_lead_s(sc)
        needed = sc.dynamics.startup_s + sc.dynamics.warmup_s * (1.0 - sc.dynamics.warmup_factor)
        refit_s = sc.layers["planning"].refit_s
        layers["planning"] = {"feed_forward": True, "lead_s": lead, "refit_s": refit_s, "scale_up_delay_s": needed,
                              "meets_floors": lead >= needed,
                              "correction": correction_certificate(sc.layers["planning"].volatility_window_s,
                                                                   sc.layers["planning"].interval_s)}
        separation.append(CascadePair("planning", "reconfiguration", closed_loop_bandwidth(rec_loop), math.nan,
                                      math.nan, None, None, math.nan, math.nan,
                                      note="feed-forward: the planner reads the offered demand, which no layer "
                                      "changes, so it closes no loop and has no crossover; the certificate checks "
                                      f"its lead instead (plan leads by {lead:.0f} s, a worker serves at full speed "
                                      f"{needed:.0f} s after it is asked for)"))
        if lead < needed:
            failures.append({"layer": "planning", "check": "lead",
                             "detail": f"plan leads by {lead:g} s, a worker takes {needed:.0f} s to serve at full "
                                       "speed"})
    # -- separation floors (feedback pairs)
    for s in separation:
        if s.ideal is None:
            continue
        if s.ratio < sc.min_separation:
            failures.append({"layer": s.outer, "check": "separation",
                             "detail": f"{s.outer} crossover {s.outer_crossover_rad_s:.3g} rad/s is only "
                                       f"{s.ratio:.2f} x below {s.inner}'s bandwidth {s.inner_bandwidth_rad_s:.3g} "
                                       f"rad/s (needs >= {sc.min_separation:g})"})
        if s.pm_loss_deg > sc.max_pm_loss_deg:
            failures.append({"layer": s.outer, "check": "pm_loss",
                             "detail": f"{s.inner}'s closed loop costs {s.outer} {s.pm_loss_deg:.1f} deg of phase "
                                       f"margin (allowed {sc.max_pm_loss_deg:g})"})
    for d in dfs:
        if d["limit_cycle"]:
            failures.append({"layer": d["layer"], "check": "describing_function",
                             "detail": f"{d['element']}: limit cycle predicted (period {d['period_s']:.0f} s)"})
    scored = [(name, d["worst"]) for name, d in layers.items() if "worst" in d]
    bname, bpoint = min(scored, key=lambda x: x[1]["score"])
    binding = {"layer": bname, **bpoint}
    return Certificate(sc.name, layers, separation, dfs, failures, binding)
