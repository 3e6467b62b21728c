"""Each stack layer kind's builder: its controllers from the resolved layer config.

A builder is named by its kind's config class in the registry
(:mod:`tokenfactory.registry.stack_layers`, ``builder``); :func:`tokenfactory.stack.build.build_stack`
calls every layer's builder through that lookup, slowest layer first, so a builder sees what the
layers above it built (the pools take the planner). A builder takes the layer's config and a
:class:`LayerBuild` and returns the layer's :class:`~tokenfactory.controllers.control_stack.StackLayer`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pandas as pd

from tokenfactory.controllers.control_stack import CapacityScaledBound, RoleBalancer, StackLayer
from tokenfactory.controllers.planning import (EXCESS_BUDGET_SHARE, DemandPlanner, DemandPlannerConfig,
                                               PlannedPoolController)
from tokenfactory.core.errors import ConfigError
from tokenfactory.registry import PlantContext, batch_gate_for, slo_aware_admission, smoothed_admission
from tokenfactory.stack.plant import (
    StackPlant,
    gate_fraction,
    gate_sample_period_s,
    gate_tuning,
    overload_tpot_s,
    planning_lead_s,
    queue_clear,
    scale_down_dwell_s,
    target_utilization,
)
from tokenfactory.stack.stack_scenario import StackScenario

__all__ = ["LayerBuild", "smoothed_admission_controller", "slo_aware_admission_controller", "gated_batch_cap",
           "build_slot_limit", "build_gated_cap", "build_smoothed_admission", "build_slo_aware_admission",
           "build_planned_pools", "build_control_plane", "build_seasonal_rise"]


# the Parameters and Returns every layer function shares (numpydoc; tests/test_docstrings.py reads
# them), written once and appended to each one's own summary
_LAYER_BUILDER_DOC = """

    Parameters
    ----------
    cfg : layer config
        The layer's resolved settings (its kind's config class in
        :mod:`tokenfactory.registry.stack_layers`).
    b : LayerBuild
        What the stack is built from: the scenario, its plant and the layers built so far.

    Returns
    -------
    StackLayer
"""


def _layer_builder_doc(f):
    f.__doc__ = f.__doc__.rstrip() + _LAYER_BUILDER_DOC
    return f


@dataclass
class LayerBuild:
    """What a layer's builder is given besides its config: the scenario, the gated plant, the
    run's settings (see :func:`tokenfactory.stack.build.build_stack`) and the layers built so far
    (the ones above it).

    Parameters
    ----------
    sc : StackScenario
        The scenario.
    plant : StackPlant
        The gated plant and its pool sizes.
    history : pandas.Series, optional
        Demand before the run for the planner.
    time_offset_s : float
        Absolute time of the run's t = 0.
    fleet_size : int, optional
        A fixed fleet overriding the reconfiguration layer's.
    plant_step_s : float, optional
        The plant's step (s).
    service : ServiceModel, optional
        The request simulator's service model.
    class_outputs : mapping, optional
        Per request class, (mean, short-quantile) output tokens.
    built : dict
        The layers built so far, by layer name.
    """

    sc: StackScenario
    plant: StackPlant
    history: pd.Series | None = None
    time_offset_s: float = 0.0
    fleet_size: int | None = None
    plant_step_s: float | None = None
    service: object = None
    class_outputs: Mapping[str, tuple[float, float]] | None = None
    built: dict[str, StackLayer] = field(default_factory=dict)


def _context(sc: StackScenario, plant: StackPlant, params=None, **extra) -> PlantContext:
    return PlantContext(params if params is not None else plant.params, plant.fill_workers, plant.decode_workers,
                        slo_ttft_s=sc.slo_ttft_s, slo_tpot_s=sc.slo_tpot_s, envelope=sc.envelope, **extra)


def _admission_params(cfg, min_period_s: float) -> dict:
    # a plant stepping slower than the layer samples runs it (and tunes it) at its step
    return {"sample_period_s": max(cfg.sample_period_s, min_period_s), **cfg.builder_params("sample_period_s")}


def smoothed_admission_controller(sc: StackScenario, plant: StackPlant, min_period_s: float = 0.0):
    """The ``smoothed`` admission layer's controller, tuned on the gated plant, and its tuning
    report. When the gate could not leave room for admission's ready wait (short outputs,
    :data:`tokenfactory.stack.GATE_FLOOR`) the ready target is lowered so that a decode overload
    still meets the TPOT SLO: decode may then starve briefly, which costs throughput in an
    overload, not the SLO of what is admitted.

    Parameters
    ----------
    sc : StackScenario
        The scenario (a ``smoothed`` admission layer).
    plant : StackPlant
        The gated plant and its pool sizes.
    min_period_s : float
        The plant's step: the layer samples (and is tuned) no faster.

    Returns
    -------
    tuple
        ``(SmoothedAdmission, TuningReport or None)``.
    """
    ctrl, rep = smoothed_admission(_context(sc, plant), _admission_params(sc.layers["admission"], min_period_s),
                                   where="layers.admission")
    if rep is not None and "batch_gate" in sc.layers:
        q = plant.params
        allowed_s = (sc.slo_tpot_s - overload_tpot_s(q, 0.0)) * q.output_tokens  # ready wait within the SLO
        if (rep.target_ready + rep.target_ready_safety) / rep.consumption_rate > allowed_s:
            ctrl.target_ready = max(allowed_s * rep.consumption_rate - rep.target_ready_safety, 0.0)
    return ctrl, rep


def slo_aware_admission_controller(sc: StackScenario, plant: StackPlant, service=None, min_period_s: float = 0.0,
                                   class_outputs=None):
    """The ``slo-aware`` admission layer's controller, built for the gated plant (and ``service``,
    the request simulator's service model, when given) without a batch gate of its own: the
    stack's batch_gate layer is the gate.

    Parameters
    ----------
    sc : StackScenario
        The scenario (an ``slo-aware`` admission layer).
    plant : StackPlant
        The gated plant and its pool sizes.
    service : ServiceModel, optional
        The request simulator's service model.
    min_period_s : float
        The plant's step: the layer samples no faster.
    class_outputs : mapping, optional
        Per request class, (mean, short-quantile) output tokens.

    Returns
    -------
    SLOAwareAdmission
    """
    ctx = _context(sc, plant, service=service, dynamics=sc.dynamics, class_outputs=class_outputs)
    return slo_aware_admission(ctx, {**_admission_params(sc.layers["admission"], min_period_s), "batch_gate": False},
                               where="layers.admission")


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
    ctx = _context(sc, plant, sc.params, service=service, class_outputs=class_outputs)
    return batch_gate_for(ctx, {"tpot_fraction": gate_fraction(sc), "sample_period_s": gate_sample_period_s(sc),
                                "gain": gate_tuning(sc).gain}, where="layers.batch_gate")


def _slot_note(p) -> str:
    return (f"slot limit {p.decode_slots_per_worker:.0f} per decode worker "
            f"(pass {p.decode_step_s(p.decode_slots_per_worker) * 1e3:.1f} ms)")


@_layer_builder_doc
def build_slot_limit(cfg, b: LayerBuild) -> StackLayer:
    """``slot-limit``: no controller; the plant's slot limit is the cap."""
    return StackLayer("batch_gate", note=_slot_note(b.plant.params))


@_layer_builder_doc
def build_gated_cap(cfg, b: LayerBuild) -> StackLayer:
    """``gated``: the gated cap, or - on a plant stepping slower than the cap samples (the pool
    model's seconds) - its cap at the nominal context, which is the slot limit the plant has.
    """
    T = gate_sample_period_s(b.sc)
    if b.plant_step_s is None or b.plant_step_s <= T + 1e-12:
        gate = gated_batch_cap(b.sc, b.plant, b.service, b.class_outputs)
        return StackLayer("batch_gate", [gate], gate.sample_period)
    return StackLayer("batch_gate", note=_slot_note(b.plant.params) + (
        f"; the gated cap samples every {T:g} s, the plant steps every {b.plant_step_s:g} s: its cap at the "
        "nominal context stands"))


@_layer_builder_doc
def build_smoothed_admission(cfg, b: LayerBuild) -> StackLayer:
    """``smoothed``: its backlog bound scaled with the decode pool's capacity."""
    ctrl, _ = smoothed_admission_controller(b.sc, b.plant, b.plant_step_s or 0.0)
    ctrl = CapacityScaledBound(ctrl, b.plant.params.decode_slots(b.plant.decode_workers))
    return StackLayer("admission", [ctrl], ctrl.sample_period)


@_layer_builder_doc
def build_slo_aware_admission(cfg, b: LayerBuild) -> StackLayer:
    """``slo-aware``: as built (it reads the capacities it has)."""
    ctrl = slo_aware_admission_controller(b.sc, b.plant, b.service, b.plant_step_s or 0.0, b.class_outputs)
    return StackLayer("admission", [ctrl], ctrl.sample_period)


@_layer_builder_doc
def build_control_plane(cfg, b: LayerBuild) -> StackLayer:
    """``control-plane``: the user's control plane from its own file, exactly as configured."""
    if "planning" in b.sc.layers:
        raise ConfigError("layers.planning", "the planning layer drives tokenfactory's planned-hysteretic pools; "
                          "with a control plane's own file as the reconfiguration layer, set kind = \"none\"")
    setting = cfg.read()
    if hasattr(setting, "registered_autoscaler"):   # Dynamo's real planner: both pools, the plant's engines
        ctx = _context(b.sc, b.plant, service=b.service, dynamics=b.sc.dynamics)
        ctl = setting.build(cfg.pool, ctx)
    else:
        ctl = setting.build(cfg.pool)
    return StackLayer("reconfiguration", [ctl], ctl.sample_period)


@_layer_builder_doc
def build_seasonal_rise(cfg, b: LayerBuild) -> StackLayer:
    """``seasonal-rise``: the demand planner, holding a scale-down as long as the pools do."""
    sc = b.sc
    budget = cfg.excess_budget if cfg.excess_budget is not None else EXCESS_BUDGET_SHARE * (1.0 - sc.slo_attainment)
    planner = DemandPlanner(DemandPlannerConfig(
        lead_s=planning_lead_s(sc), excess_budget=budget, days=cfg.days, interval_s=cfg.interval_s,
        refit_s=cfg.refit_s, fine_s=cfg.fine_s, max_headroom=cfg.max_headroom, time_offset_s=b.time_offset_s,
        utilization=target_utilization(sc), hold_s=scale_down_dwell_s(sc), use_profile=cfg.use_profile,
        volatility_window_s=cfg.volatility_window_s, profile_smooth_s=cfg.profile_smooth_s,
        residual_ar1=cfg.residual_ar1, trend_s=cfg.trend_s, hour_phase=cfg.hour_phase,
        error_state=cfg.error_state, fall_dwell_s=cfg.fall_dwell_s), history=b.history)
    return StackLayer("planning", [planner], planner.sample_period)


@_layer_builder_doc
def build_planned_pools(cfg, b: LayerBuild) -> StackLayer:
    """``planned-hysteretic``: both pools' planned hysteretic controllers (with the planner of the
    layer above, when there is one), role moves in a fixed fleet.
    """
    sc, p = b.sc, b.plant.params
    dyn = sc.dynamics
    planning = b.built.get("planning")
    planner = planning.controllers[0] if planning is not None else None
    qc, _ = queue_clear(sc, b.plant)
    fleet = b.fleet_size if b.fleet_size is not None else cfg.fleet_size
    pools = []
    for pool, mu in (("fill", p.fill_rate_per_worker), ("decode", p.decode_capacity(1))):
        extra = {k: getattr(cfg, k) for k in ("cooldown_s", "down_cooldown_s") if getattr(cfg, k) is not None}
        extra["dwell_s"] = scale_down_dwell_s(sc)
        pools.append(PlannedPoolController.tuned(
            pool, mu, sc.rate_rps, planner=planner, headroom=cfg.headroom,
            min_headroom=cfg.headroom if fleet is not None else 0.0,  # a fixed fleet is paid anyway
            measured_fill_rate=(pool == "fill" and fleet is not None),
            measured_decode_rate=(pool == "decode" and fleet is not None),
            output_tokens=p.output_tokens if pool == "decode" else None, startup_s=dyn.startup_s,
            warmup_s=dyn.warmup_s, filter_s=cfg.filter_s, target_utilization=target_utilization(sc),
            min_dead_band=cfg.min_dead_band, queue_clear_s=qc,
            queue_headroom=cfg.queue_headroom, max_step_up=cfg.max_step_up,
            max_step_down=cfg.max_step_down, min_replicas=1,
            max_replicas=fleet if fleet else 5000, sample_period=cfg.sample_period_s, **extra))
    recon = [RoleBalancer(pools, fleet)] if fleet and cfg.role_moves else pools
    return StackLayer("reconfiguration", recon, cfg.sample_period_s)
