"""What a stack is built for: the plant with the batch gate applied, the pool sizes at the nominal
demand and target utilisation, the gate's share of the TPOT SLO, and the loop delays and tunings
the builder and the certificate share."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np

from tokenfactory.controllers.autotune import StabilityEnvelope
from tokenfactory.controllers.batch_gate import BatchGateTuning, pass_target_s
from tokenfactory.controllers.separation import simc_queue_clear_s
from tokenfactory.core.validation import ConfigError
from tokenfactory.plant_models.fluid import FluidParams
from tokenfactory.plant_models.pools import PoolDynamics
from tokenfactory.registry import cached_gate_tuning
from tokenfactory.registry import DEFAULT_TPOT_FRACTION, PlantContext, smoothed_admission
from tokenfactory.registry.stack_layers import GatedBatchCap
from tokenfactory.scenario import build_plant
from tokenfactory.stack.stack_scenario import StackScenario

__all__ = ["StackPlant", "stack_plant", "slot_limit", "reconfiguration_delay_s", "target_utilization", "pools_at",
           "GATE_FLOOR", "gate_fraction", "overload_tpot_s", "GATE_SAMPLE_PERIOD_S", "gate_sample_period_s",
           "gate_tuning", "queue_clear", "scale_down_dwell_s", "planning_lead_s", "plant_for"]


def slot_limit(params: FluidParams, slo_tpot_s: float, tpot_fraction: float = 0.8) -> FluidParams:
    """The batch gate until the gated decode batch controller lands: decode slots per worker
    capped at the largest batch whose pass time is within ``tpot_fraction`` of the TPOT SLO
    (the rest of the SLO is left for the ready-buffer wait), never above the KV-memory limit.

    Parameters
    ----------
    params : FluidParams
        The plant.
    slo_tpot_s : float
        The TPOT SLO.
    tpot_fraction : float
        Share of the SLO a decode pass may take.

    Returns
    -------
    FluidParams
        ``params`` with ``decode_slots_per_worker`` capped (unchanged when the pass at full KV is fast enough).
    """
    limit = tpot_fraction * slo_tpot_s
    b, ts = np.asarray(params.decode_step_batches), np.asarray(params.decode_step_times_s)
    if params.decode_step_s(params.decode_slots_per_worker) <= limit:
        return params
    if ts[0] > limit:
        raise ConfigError("layers.batch_gate", f"even a batch of {b[0]:g} takes {ts[0]:.3f} s per pass, over "
                          f"{tpot_fraction:g} x the TPOT SLO {slo_tpot_s:g} s")
    # pass time is increasing in the batch: invert the table piecewise linearly
    cap = float(np.interp(limit, ts, b))
    return dataclasses.replace(params, decode_slots_per_worker=min(cap, params.decode_slots_per_worker))


def reconfiguration_delay_s(params: FluidParams, dynamics: PoolDynamics, sample_period_s: float,
                            startup_factor: float = 1.0) -> float:
    """The reconfiguration loop's dead time: start-up + the warm-up's lost capacity (warm-up x
    (1 - warm-up factor), the equivalent delay of a half-speed start) + half a sample + the
    measurement delay.

    Parameters
    ----------
    params : FluidParams
        The plant (its measurement delay).
    dynamics : PoolDynamics
        Start-up, warm-up and warm-up speed.
    sample_period_s : float
        The reconfiguration layer's period (s).
    startup_factor : float
        Multiplier of the start-up (the envelope's).

    Returns
    -------
    float
        The dead time (s).
    """
    return (dynamics.startup_s * startup_factor + dynamics.warmup_s * (1.0 - dynamics.warmup_factor)
            + sample_period_s / 2.0 + params.measurement_delay_s)


@dataclass
class StackPlant:
    """What a stack is built for: the plant (slot limit applied), pool sizes it is tuned at, and
    the admission tuning report.

    Parameters
    ----------
    params : FluidParams
        The plant with the batch gate applied.
    fill_workers, decode_workers : int
        Pool sizes at the nominal demand and the target utilisation.
    """

    params: FluidParams
    fill_workers: int
    decode_workers: int


def target_utilization(sc: StackScenario) -> float:
    """The utilisation the reconfiguration layer sizes pools for (``layers.reconfiguration.
    target_utilization``); the planner's headroom comes on top of it.

    Parameters
    ----------
    sc : StackScenario
        The scenario.

    Returns
    -------
    float
    """
    return float(sc.layers["reconfiguration"].target_utilization)


def pools_at(params: FluidParams, rate: float, u: float, prompt_factor: float = 1.0,
             output_factor: float = 1.0) -> tuple[int, int]:
    """Pool sizes that serve ``rate`` at utilisation ``u`` (at least one worker each).

    Parameters
    ----------
    params : FluidParams
        The plant.
    rate : float
        Demand (requests/s).
    u : float
        Target utilisation.
    prompt_factor, output_factor : float
        Fill work and output tokens per request relative to the plant's request.

    Returns
    -------
    tuple
        ``(fill_workers, decode_workers)``.
    """
    return (max(1, math.ceil(rate * prompt_factor / (u * params.fill_rate_per_worker) - 1e-9)),
            max(1, math.ceil(rate * output_factor / (u * params.decode_capacity(1)) - 1e-9)))


#: the smallest share of the TPOT SLO the derived batch gate gives the decode pass
GATE_FLOOR = 0.5


def gate_fraction(sc: StackScenario) -> float:
    """The share of the TPOT SLO a decode pass may take under the batch gate.

    ``layers.batch_gate.tpot_fraction = "auto"`` (the default) derives it from the admission layer:
    in a decode overload admission holds the ready buffer at its target R* = c theta_eff + z
    sqrt(c theta_eff) (what decode consumes over admission's loop delay, :func:`tokenfactory.
    controllers.autotune.tune_smoothed_admission`), plus fluctuations of about its safety term
    z sqrt(c theta_eff), so a request waits W = (R* + safety) / c for a slot and one pass to join
    the batch, spread over its L output tokens: TPOT = pass (1 + 1/L) + W / L. The pass may take
    fraction = (1 - W / (L x SLO)) / (1 + 1/L) of the SLO. Admission is tuned for this on the plant gated at the SLO itself (R* / c does not
    depend on the slots: theta_eff is delays only). Without an admission layer the ready wait is
    unbounded and the fraction defaults to 1 - 1 / L (one pass of slack). With SLO-aware admission,
    which bounds each request's ready wait itself, it is that admission's ``tpot_fraction``.

    Parameters
    ----------
    sc : StackScenario
        The scenario.

    Returns
    -------
    float
        The share, in (0, 1].
    """
    gate = sc.layers.get("batch_gate")
    frac = gate.tpot_fraction if gate is not None else "auto"
    if frac != "auto":
        return float(frac)
    L = sc.params.output_tokens
    if "admission" not in sc.layers:
        return 1.0 - 1.0 / L
    adm = sc.layers["admission"]
    if adm.bounds_own_ready_wait:
        # an admission that bounds each request's ready wait itself: the cap aims at its pass target
        return float(adm.tpot_fraction if adm.tpot_fraction is not None else DEFAULT_TPOT_FRACTION)
    return _auto_gate_fraction(sc.params.model_inputs(), sc.slo_ttft_s, sc.slo_tpot_s, sc.rate_rps,
                               target_utilization(sc), tuple(sorted(adm.builder_params().items())), sc.envelope)


@functools.lru_cache(maxsize=32)
def _auto_gate_fraction(params: FluidParams, slo_ttft_s: float, slo_tpot_s: float, rate_rps: float, u: float,
                        admission: tuple, envelope: StabilityEnvelope) -> float:
    at_slo = slot_limit(params, slo_tpot_s, 1.0)
    nf, nd = pools_at(at_slo, rate_rps, u)
    a = dict(admission)
    ctx = PlantContext(at_slo, nf, nd, slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s, envelope=envelope)
    _, rep = smoothed_admission(ctx, {"sample_period_s": a.pop("sample_period_s", 1.0), **a}, where="layers.admission")
    # the ready level fluctuates around its target by about the target's own Poisson safety term
    wait_s = (rep.target_ready + rep.target_ready_safety) / rep.consumption_rate
    L = params.output_tokens
    # a ready request also waits up to one pass to join the batch: TPOT = pass (1 + 1/L) + wait / L
    frac = (1.0 - wait_s / (L * slo_tpot_s)) / (1.0 + 1.0 / L)
    # short outputs cannot absorb admission's wait (15 tokens x 0.1 s is 1.5 s): the gate then keeps
    # half the SLO for the pass and a decode overload breaks TPOT (the certificate says so)
    return float(max(frac, GATE_FLOOR))


def stack_plant(sc: StackScenario) -> StackPlant:
    """The plant the stack runs on (the batch gate applied) and the pool sizes at nominal demand.

    Parameters
    ----------
    sc : StackScenario
        The scenario.

    Returns
    -------
    StackPlant
    """
    p = sc.params
    if "batch_gate" in sc.layers:
        p = slot_limit(p, sc.slo_tpot_s, gate_fraction(sc))
    nf, nd = pools_at(p, sc.rate_rps, target_utilization(sc))
    return StackPlant(p, nf, nd)


def overload_tpot_s(params: FluidParams, ready_wait_s: float) -> float:
    """TPOT of a request admitted into a saturated decode pool: the gated pass, one pass to join the
    batch, and the ready buffer's wait spread over its output tokens.

    Parameters
    ----------
    params : FluidParams
        The gated plant.
    ready_wait_s : float
        Time the request waits in the ready buffer (s).

    Returns
    -------
    float
        Seconds per output token.
    """
    L = params.output_tokens
    return params.decode_step_s(params.decode_slots_per_worker) * (1.0 + 1.0 / L) + ready_wait_s / L


#: the gated batch cap's default period (s): the overload study's gate (tokenfactory.registry.batch_gate_for)
GATE_SAMPLE_PERIOD_S = GatedBatchCap.sample_period_s


def gate_sample_period_s(sc: StackScenario) -> float:
    """The gated batch cap's sample period (``layers.batch_gate.sample_period_s``, default
    :data:`GATE_SAMPLE_PERIOD_S`).

    Parameters
    ----------
    sc : StackScenario
        The scenario.

    Returns
    -------
    float
        Seconds.
    """
    return float(getattr(sc.layers.get("batch_gate"), "sample_period_s", GATE_SAMPLE_PERIOD_S))


def gate_tuning(sc: StackScenario, snapshot_s: float = 0.1) -> BatchGateTuning:
    """The gated batch cap's SIMC tuning over the scenario's envelope (delay factors x the
    service-rate factors as the true/modelled pass-time slope) at its pass target.

    Parameters
    ----------
    sc : StackScenario
        The scenario (a ``gated`` batch gate layer).
    snapshot_s : float
        The plant's snapshot period (s; the request simulator's 0.1 by default).

    Returns
    -------
    BatchGateTuning

    Raises
    ------
    ConfigError
        When no gain meets the margin floors over the envelope.
    """
    env = sc.envelope
    target = pass_target_s(sc.slo_tpot_s, gate_fraction(sc))
    return cached_gate_tuning(sc.params.measurement_delay_s, target, snapshot_s, gate_sample_period_s(sc), True,
                        tuple(env.delay_factors), tuple(env.service_rate_factors), env.gm_floor, env.pm_floor_deg)


def queue_clear(sc: StackScenario, plant: StackPlant) -> tuple[float, float | None]:
    """The reconfiguration layer's backlog-clearance time: ``layers.reconfiguration.queue_clear_s``
    when given, else SIMC over the start-up envelope (:func:`tokenfactory.controllers.separation.
    simc_queue_clear_s`).

    Parameters
    ----------
    sc : StackScenario
        The scenario.
    plant : StackPlant
        The gated plant.

    Returns
    -------
    tuple
        ``(queue_clear_s, tau_c / theta or None when given)``.
    """
    rc = sc.layers["reconfiguration"]
    if rc.queue_clear_s is not None:
        return float(rc.queue_clear_s), None
    T = rc.sample_period_s
    theta = reconfiguration_delay_s(plant.params, sc.dynamics, T)
    u = target_utilization(sc)
    # the envelope's start-up factors scale the start-up, not the whole dead time
    factors = tuple(reconfiguration_delay_s(plant.params, sc.dynamics, T, f) / theta for f in sc.startup_factors)
    return simc_queue_clear_s(theta, u, delay_factors=factors,
                              service_rate_factors=sc.envelope.service_rate_factors,
                              gm_floor=sc.envelope.gm_floor, pm_floor_deg=sc.envelope.pm_floor_deg)


def scale_down_dwell_s(sc: StackScenario) -> float:
    """How long the pools hold a scale-down (and the planner its plan): ``layers.reconfiguration.
    dwell_s`` when given, else max(3 filter constants, start-up + warm-up) - a released worker
    takes a start-up and warm-up to get back, and 3 filter constants keep the rate's noise from
    triggering it.

    Parameters
    ----------
    sc : StackScenario
        The scenario (its dynamics and reconfiguration layer).

    Returns
    -------
    float
        The hold (s).
    """
    rc, dyn = sc.layers["reconfiguration"], sc.dynamics
    dwell = getattr(rc, "dwell_s", None)  # a control plane's own file has no such setting: its windows hold
    return float(dwell if dwell is not None else max(3.0 * rc.filter_s, dyn.startup_s + dyn.warmup_s))


def planning_lead_s(sc: StackScenario) -> float:
    """How far ahead the pools are sized: start-up + warm-up + a reconfiguration sample + the rate
    filter's time constant (the measured rate lags the demand by about that).

    Parameters
    ----------
    sc : StackScenario
        The scenario (its dynamics and reconfiguration layer).

    Returns
    -------
    float
        The lead (s).
    """
    rc = sc.layers["reconfiguration"]
    return sc.dynamics.startup_s + sc.dynamics.warmup_s + rc.sample_period_s + rc.filter_s


def plant_for(sc: StackScenario, prompt_tokens: int, output_tokens: int) -> FluidParams:
    """The scenario's plant at another request shape (a trace's mean request).

    Parameters
    ----------
    sc : StackScenario
        The scenario (its ``[plant]`` table).
    prompt_tokens, output_tokens : int
        The request shape.

    Returns
    -------
    FluidParams
    """
    plant_d = {**dict(sc.config.get("plant", {})), "prompt_tokens": int(prompt_tokens),
               "output_tokens": int(output_tokens), "fill_workers": 1, "decode_workers": 1}
    return build_plant(plant_d).params
