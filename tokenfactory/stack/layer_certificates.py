"""Each stack layer kind's certificate loop: its margins over the envelope, its describing-function
checks and its separation from the layer below.

A loop function is named by its kind's config class in the registry
(:mod:`tokenfactory.registry.stack_layers`, ``certificate``); :func:`tokenfactory.stack.certify`
calls every layer's through that lookup, fastest layer first. A loop function takes the layer's
config and the :class:`CertificateDraft` (the scenario, the gated plant, what is recorded so far and
the :class:`LayerLoops` of the layers below) and returns its own :class:`LayerLoops` for the layers
above.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import control

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
from tokenfactory.stack.layer_builders import slo_aware_admission_controller, smoothed_admission_controller
from tokenfactory.stack.plant import (
    StackPlant,
    gate_fraction,
    gate_sample_period_s,
    gate_tuning,
    planning_lead_s,
    pools_at,
    queue_clear,
    reconfiguration_delay_s,
    target_utilization,
)
from tokenfactory.stack.stack_scenario import StackScenario

__all__ = ["LayerLoops", "CertificateDraft", "certify_slot_limit", "certify_gated_cap", "certify_smoothed_admission",
           "certify_slo_aware_admission", "certify_planned_pools", "certify_control_plane", "certify_seasonal_rise"]


# the Parameters and Returns every layer function shares (numpydoc; tests/test_docstrings.py reads
# them), written once and appended to each one's own summary
_LAYER_CERTIFICATE_DOC = """

    Parameters
    ----------
    cfg : layer config
        The layer's resolved settings (its kind's config class in
        :mod:`tokenfactory.registry.stack_layers`).
    d : CertificateDraft
        The certificate so far; the layer's points, failures and checks are recorded in it.

    Returns
    -------
    LayerLoops
        The layer's loops, for the separation and describing-function checks of the layers above.
"""


def _layer_certificate_doc(f):
    f.__doc__ = f.__doc__.rstrip() + _LAYER_CERTIFICATE_DOC
    return f

_MARGIN_KEYS = ("gain_margin", "phase_margin_deg", "delay_margin_s", "ms", "crossover_rad_s")


@dataclass(frozen=True)
class LayerLoops:
    """What a layer's certificate hands the layers above.

    Parameters
    ----------
    inner : DelayedLoop, optional
        Its loop nearest the band of the layer below (the pair with the layer below).
    outer : DelayedLoop, optional
        Its loop the layer above sees through (its slowest).
    closed : optional
        Its closed loop, which the layer above sees (None: a static element).
    response_s : float
        A static element's response time constant (s).
    """

    inner: DelayedLoop | None = None
    outer: DelayedLoop | None = None
    closed: Any = None
    response_s: float = math.nan


def _score(m, env: StabilityEnvelope) -> float:
    """How close a point is to the floors (< 1 fails): min(GM / GM floor, PM / PM floor)."""
    gm = m["gain_margin"] / env.gm_floor if math.isfinite(m["gain_margin"]) else math.inf
    pm = m["phase_margin_deg"] / env.pm_floor_deg if env.pm_floor_deg > 0 else math.inf
    return min(gm, pm)


def _margin_row(m, **point) -> dict:
    return {**point, "gain_margin": m.gain_margin, "phase_margin_deg": m.phase_margin_deg,
            "delay_margin_s": m.delay_margin_s, "ms": m.ms, "crossover_rad_s": m.crossover_rad_s}


@dataclass
class CertificateDraft:
    """The certificate while its layers are checked: the scenario and its gated plant, what each
    layer recorded (its points, worst point and settings), the failures, separations and
    describing-function checks so far, and the loops of the layers already checked.

    Parameters
    ----------
    sc : StackScenario
        The scenario.
    plant : StackPlant
        The gated plant.
    layers : dict
        What each checked layer recorded: its points, worst point, settings, ``meets_floors``.
    failures : list of dict
        The failed checks so far (``layer``, ``check``, ``detail``; a ``passing_value`` when found).
    separation : list of CascadePair
        The time-scale separations checked between layers.
    describing_function : list of dict
        The describing-function (limit-cycle) checks of the layers' nonlinearities.
    loops : dict
        The loops of the layers already checked, by layer.
    """

    sc: StackScenario
    plant: StackPlant
    layers: dict[str, dict] = field(default_factory=dict)
    failures: list[dict] = field(default_factory=list)
    separation: list[CascadePair] = field(default_factory=list)
    describing_function: list[dict] = field(default_factory=list)
    loops: dict[str, LayerLoops] = field(default_factory=dict)

    def judge(self, layer: str, rows: list[dict]) -> None:
        """Score every envelope point against the floors, record the layer's worst point, and a
        failure when any point is below a floor."""
        env = self.sc.envelope
        for r in rows:
            r["score"] = _score(r, env)
            r["meets_floors"] = r["score"] >= 1.0
        worst = min(rows, key=lambda r: r["score"])
        self.layers[layer] = {"points": rows, "worst": worst, "meets_floors": all(r["meets_floors"] for r in rows)}
        if not self.layers[layer]["meets_floors"]:
            self.failures.append({"layer": layer, "check": "margins",
                                  "detail": f"GM {worst['gain_margin']:.3g}, PM {worst['phase_margin_deg']:.1f} deg at "
                                            + ", ".join(f"{k}={worst[k]}" for k in worst if k.endswith("factor"))
                                            + f" (floors GM >= {env.gm_floor:g}, PM >= {env.pm_floor_deg:g} deg)"})


# -- batch gate --------------------------------------------------------------------------------


@_layer_certificate_doc
def certify_slot_limit(cfg, d: CertificateDraft) -> LayerLoops:
    """``slot-limit``: static; its response is one decode pass."""
    p = d.plant.params
    d.layers["batch_gate"] = {"static": True, "decode_slots_per_worker": p.decode_slots_per_worker,
                              "pass_time_s": p.decode_step_s(p.decode_slots_per_worker),
                              "response_time_constant_s": p.dispatch_s, "meets_floors": True}
    return LayerLoops(response_s=p.dispatch_s)


@_layer_certificate_doc
def certify_gated_cap(cfg, d: CertificateDraft) -> LayerLoops:
    """``gated``: the cap's integral loop over delay x pass-time slope (the envelope's service-rate
    factors), and the describing function of its saturation between one sequence and the KV slots.
    """
    sc = d.sc
    gate_tau = d.plant.params.dispatch_s
    try:
        gt = gate_tuning(sc)
    except ConfigError as e:
        d.failures.append({"layer": "batch_gate", "check": "margins", "detail": str(e)})
        d.layers["batch_gate"] = {"meets_floors": False, "points": []}
        return LayerLoops(response_s=gate_tau)
    rows = [{"delay_factor": r["delay_factor"], "service_rate_factor": r["slope_factor"],
             **{k: r.get(k, math.nan) for k in _MARGIN_KEYS}} for r in gt.envelope]
    d.judge("batch_gate", rows)
    d.layers["batch_gate"].update({"gain": gt.gain, "hold_s": gt.hold_s, "theta_s": gt.theta_s,
                                   "tau_c_s": gt.tau_c_s, "sample_period_s": gate_sample_period_s(sc),
                                   "pass_target_s": pass_target_s(sc.slo_tpot_s, gate_fraction(sc)),
                                   "ungated_gain_margin": gt.ungated.gain_margin if gt.ungated else None})
    gate_loop = batch_gate_loop(gt.gain, gt.hold_s, gt.theta_s)
    # the cap's saturation (between one sequence and the KV slots) in the gated loop
    cyc = predict_batch_cycle(gate_loop, 1.0)
    d.describing_function.append({
        "layer": "batch_gate", "element": "cap saturation [1, KV slots]",
        "loop": "gated integral correction of the pass target", "limit_cycle": cyc is not None,
        "period_s": cyc.period_s if cyc else None,
        "reason": "N(A) of a saturation is real in (0, 1]; the gated loop's gain at its phase "
                  f"crossover is {1.0 / gt.nominal.gain_margin:.2f} < 1: no solution"
                  if cyc is None else "the loop's gain at its phase crossover is >= 1",
        "ungated_limit_cycle": gt.ungated_cycle})
    return LayerLoops(inner=gate_loop, outer=gate_loop, closed=closed_loop(gate_loop), response_s=gate_tau)


# -- admission ---------------------------------------------------------------------------------


def _separate_from_gate(d: CertificateDraft, adm_loop: DelayedLoop) -> None:
    """The admission loop with the decode batch's response (one pass) in its plant vs without."""
    gate = d.loops.get("batch_gate")
    if gate is None:
        return
    if gate.closed is not None:
        # the cap sets the decode consumption admission's loop sees - a plant parameter (the
        # envelope's service-rate factors cover its range) - while what admission releases joins
        # the batch within a pass: the pass lag is in the loop, the gate's bandwidth sets the ratio
        series = cascade_separation("admission", adm_loop, "batch_gate", gate.closed)
        d.separation.append(cascade_separation(
            "admission", adm_loop, "batch_gate", first_order_lag(gate.response_s),
            inner_bandwidth_rad_s=series.inner_bandwidth_rad_s,
            note="the gated cap's closed loop sets admission's decode consumption (a plant parameter within "
                 "the envelope's service-rate factors); admitted work joins the batch within a pass (the lag "
                 f"in the loop); with the gate's closed loop in series instead, the conservative reading, "
                 f"admission would lose {series.pm_loss_deg:.1f} deg"))
    else:
        d.separation.append(cascade_separation(
            "admission", adm_loop, "batch_gate", first_order_lag(gate.response_s),
            note="decode batch responds to a freed or filled slot within one pass (first-order lag)"))


@_layer_certificate_doc
def certify_slo_aware_admission(cfg, d: CertificateDraft) -> LayerLoops:
    """``slo-aware``: the gate's two limit corrections (fill wait, decode wait), SIMC-tuned over
    delay x prediction gain (:func:`tokenfactory.controllers.slo_admission.tune_slo_admission`),
    and the describing function of each limit's clamp.
    """
    p = d.plant.params
    adm = slo_aware_admission_controller(d.sc, d.plant)
    tun = slo_admission_tuning(adm, p.measurement_delay_s)
    rows = [{"loop": n, "delay_factor": r["delay_factor"], "gain_factor": r["gain_factor"],
             **{k: r.get(k, math.nan) for k in _MARGIN_KEYS}} for n, gt in tun.items() for r in gt.envelope]
    d.judge("admission", rows)
    d.layers["admission"]["tuning"] = {**{n: {"ki": gt.ki, "theta_s": gt.theta_s, "gate_time_s": gt.gate_time_s,
                                              "tau_c_s": gt.tau_c_s} for n, gt in tun.items()},
                                       "sample_period_s": adm.sample_period, "kind": cfg.kind}
    loops = {n: slo_gate_loop(gt.ki, gt.theta_s, gt.gate_time_s, name=f"slo gate ({n})") for n, gt in tun.items()}
    by_speed = sorted(loops, key=lambda n: stability_margins(loops[n]).crossover_rad_s)
    for n, gt in tun.items():
        d.describing_function.append({
            "layer": "admission", "element": f"{n}-wait limit clamp (saturation)",
            "loop": f"the {n} limit's integral correction", "limit_cycle": gt.limit_cycle is not None,
            "period_s": (gt.limit_cycle or {}).get("period_s"),
            "reason": "describing function of the clamp over the envelope: "
                      + ("no solution" if gt.limit_cycle is None else "a cycle is predicted")})
    inner, outer = loops[by_speed[-1]], loops[by_speed[0]]
    _separate_from_gate(d, inner)
    return LayerLoops(inner=inner, outer=outer)


@_layer_certificate_doc
def certify_smoothed_admission(cfg, d: CertificateDraft) -> LayerLoops:
    """``smoothed``: margins over demand level x delay x service rate on the fluid plant, and the
    describing function of its rate clip.
    """
    sc, plant, env = d.sc, d.plant, d.sc.envelope
    p = plant.params
    u = target_utilization(sc)
    adm, tuning = smoothed_admission_controller(sc, plant)
    rows = []
    for dem in sc.demand_factors:
        nf, nd = pools_at(p, sc.rate_rps * dem, u)
        pl = FluidPlant(p, nf, nd)
        cache: dict = {}
        for dfac, rfac in env.points():
            m = stability_margins(admission_loop(pl, adm, delay_factor=dfac, service_rate_factor=rfac,
                                                 _plant_model_cache=cache))
            rows.append(_margin_row(m, demand_factor=dem, delay_factor=dfac, service_rate_factor=rfac))
    d.judge("admission", rows)
    d.layers["admission"]["tuning"] = {"tau_c_s": tuning.tau_c_s, "tau_c_over_theta": tuning.tau_c_over_theta,
                                       "effective_delay_s": tuning.effective_delay_s,
                                       "sample_period_s": adm.sample_period}
    adm_loop = admission_loop(FluidPlant(p, plant.fill_workers, plant.decode_workers), adm)
    # describing function: admission's rate clip is a saturation in the loop. With conditional
    # integration (anti-windup) the integral freezes while the output is clipped, so the clip
    # sees the proportional loop kc F(s) P(s) e^{-theta s}. A saturation's N(A) is real in (0, 1],
    # so harmonic balance 1 + N(A) L(jw) = 0 has a solution exactly where the phase crosses -180
    # deg with |L| > 1/N >= 1: a cycle is predicted iff that loop's gain margin is below 1.
    worst_adm = d.layers["admission"]["worst"]
    wl = admission_loop(FluidPlant(p, plant.fill_workers, plant.decode_workers), adm,
                        delay_factor=worst_adm["delay_factor"], service_rate_factor=worst_adm["service_rate_factor"])
    ti = adm.gains.ti
    # C_PI x ti s / (ti s + 1) = kc: cancel the PI's integrator and zero exactly (minreal), so no
    # pole-zero pair is left on the imaginary axis for the Nyquist count to refuse
    p_only = DelayedLoop(control.minreal(wl.rational * control.tf([ti, 0.0], [ti, 1.0]), verbose=False),
                         wl.delay, "admission P part")
    gm_p = stability_margins(p_only).gain_margin
    d.describing_function.append({
        "layer": "admission", "element": "rate clip [0, fill capacity] (saturation, anti-windup)",
        "loop": "admission's proportional loop at its worst envelope point", "limit_cycle": gm_p < 1.0,
        "period_s": None, "gain_margin_seen": gm_p,
        "reason": f"N(A) of a saturation is real in (0, 1]; the loop it sees has GM {gm_p:.2f}"
                  + (" >= 1: no solution" if gm_p >= 1.0 else " < 1: a cycle is predicted")})
    _separate_from_gate(d, adm_loop)
    return LayerLoops(inner=adm_loop, outer=adm_loop)


# -- reconfiguration ---------------------------------------------------------------------------


@_layer_certificate_doc
def certify_planned_pools(cfg, d: CertificateDraft) -> LayerLoops:
    """``planned-hysteretic``: the pools' backlog loop over start-up x service rate, its separation
    from admission's closed loop, and the describing function of each pool's whole-worker
    hysteresis relay.
    """
    sc, plant, env = d.sc, d.plant, d.sc.envelope
    p = plant.params
    T_rc = cfg.sample_period_s
    u = target_utilization(sc)
    qc, tau_c_f = queue_clear(sc, plant)
    rows = []
    theta0 = reconfiguration_delay_s(p, sc.dynamics, T_rc)
    for sf in sc.startup_factors:
        for rfac in env.service_rate_factors:
            theta = reconfiguration_delay_s(p, sc.dynamics, T_rc, sf)
            m = stability_margins(reconfiguration_loop(qc, u, theta, service_rate_factor=rfac))
            rows.append(_margin_row(m, startup_factor=sf, service_rate_factor=rfac, loop_delay_s=theta))
    d.judge("reconfiguration", rows)
    d.layers["reconfiguration"].update({"queue_clear_s": qc, "tau_c_over_theta": tau_c_f, "delay_s": theta0,
                                        "sample_period_s": T_rc, "target_utilization": u})
    rec_loop = reconfiguration_loop(qc, u, theta0)
    adm = d.loops.get("admission")
    if adm is not None:
        d.separation.append(cascade_separation(
            "reconfiguration", rec_loop, "admission", closed_loop(adm.outer),
            note="a worker's capacity reaches the queue through admission's closed loop (complementary sensitivity)"))
    # describing function of the whole-worker hysteresis relay
    nf, nd = plant.fill_workers, plant.decode_workers
    for pool, mu, n in (("fill", p.fill_rate_per_worker, nf), ("decode", p.decode_capacity(1), nd)):
        sigma = need_noise_std(sc.rate_rps, mu, u, cfg.filter_s)
        db = max(cfg.min_dead_band, 3.0 * sigma)
        # the relay switches n-1 <-> n at need n-1 (up) and n-1-db (down); the pool at n-1 then runs
        # at utilisation u (up) or less: the queue the loop feeds back is empty unless u (+3 sigma) >= 1
        u_switch = u * (1.0 + 3.0 * sigma / max(n - 1, 1))
        gain = 1.0 if u_switch >= 1.0 else 0.0
        relay = control.relay_hysteresis_nonlinearity(b=0.5, c=(1.0 + db) / 2.0)
        cyc = predict_limit_cycles(rec_loop.scaled(gain), relay, amplitude_bounds=((1.0 + db) / 2.0 * 1.0001, 1e6)) \
            if gain > 0 else []
        d.describing_function.append({
            "layer": "reconfiguration", "element": f"{pool} pool: whole-worker relay, hysteresis 1 + "
            f"dead band {db:.2f} workers", "loop": "backlog feedback", "limit_cycle": bool(cyc),
            "period_s": cyc[0].period_s if cyc else None, "switch_utilization": u_switch,
            "reason": (f"at the switching points the smaller pool runs at utilisation {u_switch:.2f} < 1: "
                       "the queue is empty on both sides, the loop gain the relay sees is zero")
            if gain == 0 else "utilisation at the switching point >= 1: the relay sees the integrating queue"})
    return LayerLoops(inner=rec_loop, outer=rec_loop)


@_layer_certificate_doc
def certify_control_plane(cfg, d: CertificateDraft) -> LayerLoops:
    """``control-plane``: a control plane run from its own settings file - its loop model at every
    envelope point (demand x start-up x service rate), the cycle and start-up overshoot its rule
    predicts, the separation of its linear part from admission, and - when it fails - the knob of
    the same control plane and the value that passes (:func:`tokenfactory.advise.search_settings`
    on the loop model alone).
    """
    setting = cfg.read()
    planner = hasattr(setting, "registered_autoscaler")   # Dynamo's planner: its own loop model, both pools
    ctl = None if planner else setting.build(cfg.pool)

    def points(s):
        return _control_plane_envelope(s, d, cfg.pool, planner)

    certs = points(setting)
    rows = _control_plane_rows(certs)
    worst = min(rows, key=lambda r: (r["meets_floors"], -(r["predicted_cycle_s"] or 0.0)))
    d.layers["reconfiguration"] = {"points": rows, "worst": worst,
                                   "meets_floors": all(r["meets_floors"] for r in rows),
                                   "control_plane": setting.format,
                                   "controller": "DynamoPlanner" if planner else type(ctl).__name__,
                                   "params": setting.planner_fields() if planner else ctl.params(), "pool": cfg.pool,
                                   "sample_period_s": setting.scale_interval_s() if planner else ctl.sample_period}
    if not d.layers["reconfiguration"]["meets_floors"]:
        d.failures.append(_control_plane_failure(setting, certs, worst, points, cfg.pool))
    for key, c in certs.items():
        if key == (1.0, 1.0, 1.0) or len(certs) == 1:
            cyc = c.predicted_cycle
            d.describing_function.append({
                "layer": "reconfiguration", "element": f"{cfg.pool} pool: the rule's thresholds and whole "
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
    adm = d.loops.get("admission")
    if adm is not None:
        pair = cascade_separation("reconfiguration", acting, "admission", closed_loop(adm.outer))
        # the ratio is the check; a phase-margin loss of this stand-in loop says nothing about a relay
        d.separation.append(dataclasses.replace(
            pair, pm_loss_deg=math.nan,
            note=f"the control plane acts once per loop delay ({theta:.0f} s: metric age, half a sample, its window, "
                 f"the start-up) over admission's closed loop; the ratio is checked, the phase-margin loss of this "
                 f"stand-in for a relay is not (it would read {pair.pm_loss_deg:.1f} deg)"))
    return LayerLoops(inner=acting, outer=acting)


def _control_plane_envelope(s, d: CertificateDraft, pool: str, planner: bool) -> dict:
    """The control plane ``s``'s loop-model certificate at every envelope point, keyed
    ``(demand, start-up, service-rate factor)``: Dynamo's planner on both pools (the layer's pool,
    unless the other fails there), any other rule on ``pool``."""
    sc, p = d.sc, d.plant.params
    out = {}
    if planner:
        from tokenfactory.controllers.dynamo_planner_loop import certify_planner, planner_pool_loops

        for dem in sc.demand_factors:
            for sf in sc.startup_factors:
                for rfac in sc.envelope.service_rate_factors:
                    loops = planner_pool_loops(s, p, demand_rps=sc.rate_rps * dem, metric_delay_s=p.measurement_delay_s,
                                               startup_s=sc.dynamics.startup_s * sf, warmup_s=sc.dynamics.warmup_s * sf,
                                               gpus_per_worker=sc.dynamics.gpus_per_worker, service_rate_factor=rfac)
                    certs = {pl: certify_planner(lp, gm_floor=sc.envelope.gm_floor,
                                                 pm_floor_deg=sc.envelope.pm_floor_deg) for pl, lp in loops.items()}
                    # the layer's pool, unless the other pool (which the planner sizes too) fails there
                    own, other = certs[pool], certs["fill" if pool == "decode" else "decode"]
                    out[(dem, sf, rfac)] = other if own.passed and not other.passed else own
        return out
    from tokenfactory.controllers.autoscaler_loops import PoolOperatingPoint, certify_autoscaler

    mu0 = p.decode_capacity(1) if pool == "decode" else p.fill_rate_per_worker
    startup0 = sc.dynamics.startup_s + sc.dynamics.warmup_s * (1.0 - sc.dynamics.warmup_factor)
    c = s.build(pool)
    for dem in sc.demand_factors:
        for sf in sc.startup_factors:
            for rfac in sc.envelope.service_rate_factors:
                pt = PoolOperatingPoint(mu0 * rfac, sc.rate_rps * dem, p.measurement_delay_s, startup0 * sf,
                                        p.decode_slots_per_worker, p.decode_slots_per_worker / p.decode_capacity(1))
                out[(dem, sf, rfac)] = certify_autoscaler(c, pt, gm_floor=sc.envelope.gm_floor,
                                                         pm_floor_deg=sc.envelope.pm_floor_deg)
    return out


def _control_plane_rows(certs: dict) -> list[dict]:
    """One row per envelope point: margins, loop delay, predicted cycle, start-up peak, verdict."""
    rows = []
    for (dem, sf, rfac), c in certs.items():
        cd = c.to_dict()
        cyc = cd["predicted_cycle"]
        rows.append({"demand_factor": dem, "startup_factor": sf, "service_rate_factor": rfac,
                     "gain_margin": math.inf if cd["gain_margin"] is None else cd["gain_margin"],
                     "phase_margin_deg": math.nan if cd["phase_margin_deg"] is None else cd["phase_margin_deg"],
                     "delay_margin_s": cd["delay_margin_s"], "loop_delay_s": cd["loop_delay_s"],
                     "predicted_cycle_s": cyc["period_s"] if cyc else None,
                     "cascade_peak_replicas": cd["cascade_peak_replicas"], "workers_needed": cd["workers_needed"],
                     "score": 1.0 if c.passed else 0.0, "meets_floors": c.passed})
    return rows


def _control_plane_failure(setting, certs: dict, worst: dict, points, pool: str) -> dict:
    """The failure at the worst point - the predicted cycle, the ceiling or the start-up overshoot
    - and the single knob of the same control plane that passes (:func:`_passing_knob`)."""
    c = certs[(worst["demand_factor"], worst["startup_factor"], worst["service_rate_factor"])]
    why = (f"predicts a {worst['predicted_cycle_s']:.0f} s cycle between {c.predicted_cycle.low_replicas} and "
           f"{c.predicted_cycle.high_replicas} workers" if c.predicted_cycle else
           f"its ceiling of {c.loop.max_replicas} workers cannot carry the {c.workers_needed:.2f} needed"
           if not c.ceiling_carries else
           f"a start-up asks for {c.cascade_peak} workers where {c.workers_needed:.2f} are needed")
    need = max(math.ceil(cc.workers_needed - 1e-9) for cc in certs.values())
    fix = _passing_knob(setting, points, pool, need)
    return {"layer": "reconfiguration", "check": "loop model",
            "detail": f"{setting.format} on {pool}: {why} at demand x{worst['demand_factor']:g}, "
                      f"start-up x{worst['startup_factor']:g}, service rate "
                      f"x{worst['service_rate_factor']:g}"
                      + (f"; {fix} passes" if fix else "; no single knob of its grid passes")}


def _passing_knob(setting, points, pool, need: int) -> str | None:
    """The first single-knob change of the control plane's grid whose every envelope point passes
    (``need``: the workers the highest envelope demand needs)."""
    from tokenfactory.advise import FLOOR_KNOB, KNOB_GRID, current_knobs

    knobs0 = current_knobs(setting, None if setting.format in FLOOR_KNOB else setting.build(pool))
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


# -- planning ----------------------------------------------------------------------------------


@_layer_certificate_doc
def certify_seasonal_rise(cfg, d: CertificateDraft) -> LayerLoops:
    """``seasonal-rise``: feed-forward (the offered rate is exogenous; no loop through the plant):
    its lead against the time a worker takes to serve at full speed, and its correction's margins.
    """
    sc = d.sc
    rec = d.loops.get("reconfiguration")
    if rec is None or rec.outer is None:
        return LayerLoops()
    lead = planning_lead_s(sc)
    needed = sc.dynamics.startup_s + sc.dynamics.warmup_s * (1.0 - sc.dynamics.warmup_factor)
    d.layers["planning"] = {"feed_forward": True, "lead_s": lead, "refit_s": cfg.refit_s, "scale_up_delay_s": needed,
                            "meets_floors": lead >= needed,
                            "correction": correction_certificate(cfg.volatility_window_s, cfg.interval_s)}
    d.separation.append(CascadePair("planning", "reconfiguration", closed_loop_bandwidth(rec.outer), math.nan,
                                    math.nan, None, None, math.nan, math.nan,
                                    note="feed-forward: the planner reads the offered demand, which no layer "
                                    "changes, so it closes no loop and has no crossover; the certificate checks "
                                    f"its lead instead (plan leads by {lead:.0f} s, a worker serves at full speed "
                                    f"{needed:.0f} s after it is asked for)"))
    if lead < needed:
        d.failures.append({"layer": "planning", "check": "lead",
                           "detail": f"plan leads by {lead:g} s, a worker takes {needed:.0f} s to serve at full "
                                     "speed"})
    return LayerLoops()
