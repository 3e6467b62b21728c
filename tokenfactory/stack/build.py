"""Building a stack: each layer's controller from the scenario, composed into a
:class:`tokenfactory.controllers.control_stack.ControlStack` for a plant."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import pandas as pd

from tokenfactory.controllers.control_stack import CapacityScaledBound, ControlStack, RoleBalancer, StackLayer
from tokenfactory.controllers.planning import EXCESS_BUDGET_SHARE, DemandPlanner, PlannedPoolController
from tokenfactory.registry import PlantContext, batch_gate_for, slo_aware_admission, smoothed_admission
from tokenfactory.core.errors import ConfigError
from tokenfactory.stack.plant import (
    StackPlant,
    gate_fraction,
    gate_sample_period_s,
    gate_tuning,
    overload_tpot_s,
    planning_lead_s,
    queue_clear,
    stack_plant,
    target_utilization,
)
from tokenfactory.stack.stack_scenario import StackScenario

__all__ = ["admission_controller", "gated_batch_cap", "build_stack"]


def admission_controller(sc: StackScenario, plant: StackPlant, service=None, min_period_s: float = 0.0, class_outputs=None):
    """The admission layer's controller and its tuning report. SLO-aware: built for the gated plant
    (and ``service``, the request simulator's service model, when given), without a batch gate of
    its own; no report. Smoothed: tuned on the gated plant; when the gate could not leave room for
    admission's ready wait (short outputs, :data:`GATE_FLOOR`) the ready target is lowered so that a
    decode overload still meets the TPOT SLO: decode may then starve briefly, which costs
    throughput in an overload, not the SLO of what is admitted.

    Parameters
    ----------
    sc : StackScenario
        The scenario (an admission layer).
    plant : StackPlant
        The gated plant and its pool sizes.
    service : ServiceModel, optional
        The request simulator's service model.
    min_period_s : float
        The plant's step: the layer samples (and is tuned) no faster.
    class_outputs : mapping, optional
        Per request class, (mean, short-quantile) output tokens.

    Returns
    -------
    tuple
        ``(controller, tuning report or None)``.
    """
    cfg = sc.layers["admission"]
    # a plant stepping slower than the layer samples runs it (and tunes it) at its step
    p = {"sample_period_s": max(cfg.sample_period_s, min_period_s), **cfg.builder_params("sample_period_s")}
    ctx = PlantContext(plant.params, plant.fill_workers, plant.decode_workers, slo_ttft_s=sc.slo_ttft_s,
                       slo_tpot_s=sc.slo_tpot_s, envelope=sc.envelope)
    if cfg.bounds_own_ready_wait:
        # the SLO-aware gate: the stack's batch_gate layer is the gate, the admission runs without its own
        ctx = dataclasses.replace(ctx, service=service, dynamics=sc.dynamics, class_outputs=class_outputs)
        return slo_aware_admission(ctx, {**p, "batch_gate": False}, where="layers.admission"), None
    ctrl, rep = smoothed_admission(ctx, p, where="layers.admission")
    if rep is not None and "batch_gate" in sc.layers:
        q = plant.params
        allowed_s = (sc.slo_tpot_s - overload_tpot_s(q, 0.0)) * q.output_tokens  # ready wait within the SLO
        if (rep.target_ready + rep.target_ready_safety) / rep.consumption_rate > allowed_s:
            ctrl.target_ready = max(allowed_s * rep.consumption_rate - rep.target_ready_safety, 0.0)
    return ctrl, rep


def gated_batch_cap(sc: StackScenario, plant: StackPlant, service=None, class_outputs=None):
    """The gated decode batch cap of a ``gated`` layer: the largest batch whose roofline pass time
    at the live context meets the gate's share of the TPOT SLO (:func:`gate_fraction`), its gain
    SIMC-tuned over the envelope (:func:`gate_tuning`), its largest cap the KV slots (the plant's
    slot limit is only where it starts). ``service`` (a ServiceModel) makes it follow the live
    context (the request simulator); without it the pass-time table at the nominal context.

    Parameters
    ----------
    sc : StackScenario
        The scenario (a ``gated`` batch gate layer).
    plant : StackPlant
        The gated plant and its pool sizes.
    service : ServiceModel, optional
        The request simulator's service model.
    class_outputs : mapping, optional
        Per request class, (mean, short-quantile) output tokens.

    Returns
    -------
    BatchGate
    """
    ctx = PlantContext(sc.params, plant.fill_workers, plant.decode_workers, slo_ttft_s=sc.slo_ttft_s,
                       slo_tpot_s=sc.slo_tpot_s, envelope=sc.envelope, service=service, class_outputs=class_outputs)
    return batch_gate_for(ctx, {"tpot_fraction": gate_fraction(sc), "sample_period_s": gate_sample_period_s(sc),
                                "gain": gate_tuning(sc).gain}, where="layers.batch_gate")


def build_stack(sc: StackScenario, *, history: pd.Series | None = None, time_offset_s: float = 0.0,
                fleet_size: int | None = None, name: str | None = None, plant_step_s: float | None = None,
                service=None, class_outputs: Mapping[str, tuple[float, float]] | None = None
                ) -> tuple[ControlStack, StackPlant]:
    """A fresh :class:`ControlStack` for the scenario, and the plant it runs on.

    Parameters
    ----------
    sc : StackScenario
        The scenario.
    history : pandas.Series, optional
        Demand before the run for the planner (absolute time index, its interval).
    time_offset_s : float
        Absolute time of the run's t = 0.
    fleet_size : int, optional
        A fixed fleet (role moves): overrides ``layers.reconfiguration.fleet_size``.
    name : str, optional
        The stack's label.
    plant_step_s : float, optional
        The plant's step (s). A ``gated`` batch cap sampled faster than the plant steps (the pool
        model's seconds) is static there: its cap at the nominal context, which is the slot limit
        the plant already has (a fluid step averages over many decode passes).
    service : ServiceModel, optional
        The request simulator's service model: the gated cap follows the live context through it.
    class_outputs : mapping, optional
        Per request class, (mean, short-quantile) output tokens the orchestrator expects
        (:func:`tokenfactory.replay.class_outputs`): the batch cap's pass target and the SLO-aware
        admission's decode-wait limits leave a short request room for its join wait.

    Returns
    -------
    tuple
        ``(ControlStack, StackPlant)``; run it on ``StackPlant.params``.
    """
    plant = stack_plant(sc)
    p = plant.params
    layers = []
    if "batch_gate" in sc.layers:
        slot_note = (f"slot limit {p.decode_slots_per_worker:.0f} per decode worker "
                     f"(pass {p.decode_step_s(p.decode_slots_per_worker) * 1e3:.1f} ms)")
        gated = sc.layers["batch_gate"].samples_live_pass
        if gated and (plant_step_s is None or plant_step_s <= gate_sample_period_s(sc) + 1e-12):
            gate = gated_batch_cap(sc, plant, service, class_outputs)
            layers.append(StackLayer("batch_gate", [gate], gate.sample_period))
        else:
            layers.append(StackLayer("batch_gate", note=slot_note + (
                f"; the gated cap samples every {gate_sample_period_s(sc):g} s, the plant steps every "
                f"{plant_step_s:g} s: its cap at the nominal context stands" if gated else "")))
    if "admission" in sc.layers:
        ctrl, _ = admission_controller(sc, plant, service, plant_step_s or 0.0, class_outputs)
        if not sc.layers["admission"].bounds_own_ready_wait:  # the SLO-aware gate reads the capacities it has
            ctrl = CapacityScaledBound(ctrl, p.decode_slots(plant.decode_workers))
        layers.append(StackLayer("admission", [ctrl], ctrl.sample_period))
    rc = sc.layers["reconfiguration"]
    if rc.own_settings:   # the user's control plane from its own file, exactly as configured
        ctl = rc.read().build(rc.pool)
        layers.append(StackLayer("reconfiguration", [ctl], ctl.sample_period))
        if "planning" in sc.layers:
            raise ConfigError("layers.planning", "the planning layer drives tokenfactory's planned-hysteretic pools; "
                              "with a control plane's own file as the reconfiguration layer, set kind = \"none\"")
        return ControlStack(layers, name or sc.name), plant
    T = rc.sample_period_s
    u = target_utilization(sc)
    dyn = sc.dynamics
    filter_s = rc.filter_s
    # a released worker takes a start-up + warm-up to get back: hold a scale-down at least that
    # long (and 3 filter constants, so the rate's noise does not trigger it)
    dwell_s = float(rc.dwell_s if rc.dwell_s is not None else max(3.0 * filter_s, dyn.startup_s + dyn.warmup_s))
    planner = None
    if "planning" in sc.layers:
        pl = sc.layers["planning"]
        budget = pl.excess_budget if pl.excess_budget is not None else EXCESS_BUDGET_SHARE * (1.0 - sc.slo_attainment)
        planner = DemandPlanner(lead_s=planning_lead_s(sc), excess_budget=budget, days=pl.days,
                                interval_s=pl.interval_s, refit_s=pl.refit_s, fine_s=pl.fine_s,
                                max_headroom=pl.max_headroom, history=history, time_offset_s=time_offset_s,
                                utilization=u, hold_s=dwell_s, use_profile=pl.use_profile,
                                volatility_window_s=pl.volatility_window_s, profile_smooth_s=pl.profile_smooth_s,
                                residual_ar1=pl.residual_ar1)
    qc, _ = queue_clear(sc, plant)
    fleet = fleet_size if fleet_size is not None else rc.fleet_size
    pools = []
    for pool, mu in (("fill", p.fill_rate_per_worker), ("decode", p.decode_capacity(1))):
        extra = {k: getattr(rc, k) for k in ("cooldown_s", "down_cooldown_s") if getattr(rc, k) is not None}
        extra["dwell_s"] = dwell_s
        pools.append(PlannedPoolController.tuned(
            pool, mu, sc.rate_rps, planner=planner, headroom=rc.headroom,
            min_headroom=rc.headroom if fleet is not None else 0.0,  # a fixed fleet is paid anyway
            measured_fill_rate=(pool == "fill" and fleet is not None),
            measured_decode_rate=(pool == "decode" and fleet is not None),
            output_tokens=p.output_tokens if pool == "decode" else None, startup_s=dyn.startup_s,
            warmup_s=dyn.warmup_s, filter_s=filter_s, target_utilization=u,
            min_dead_band=rc.min_dead_band, queue_clear_s=qc,
            queue_headroom=rc.queue_headroom, max_step_up=rc.max_step_up,
            max_step_down=rc.max_step_down, min_replicas=1,
            max_replicas=fleet if fleet else 5000, sample_period=T, **extra))
    recon = [RoleBalancer(pools, fleet)] if fleet and rc.role_moves else pools
    layers.append(StackLayer("reconfiguration", recon, T))
    if planner is not None:
        layers.append(StackLayer("planning", [planner], planner.sample_period))
    return ControlStack(layers, name or sc.name), plant
