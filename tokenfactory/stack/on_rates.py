"""Running a stack (or a baseline deployment) over a rate series in the pool model, scored
against the oracle plan at the SLO's utilisation ceiling."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pandas as pd

from tokenfactory.controllers.capacity import utilization_ceiling
from tokenfactory.controllers.control_stack import ControlStack
from tokenfactory.core.validation import ConfigError
from tokenfactory.registry import PlantContext
from tokenfactory.stack.build import build_stack
from tokenfactory.stack.plant import plant_for, pools_at, stack_plant, target_utilization
from tokenfactory.stack.stack_scenario import StackScenario
from tokenfactory.traces.rate_workloads import RateWorkload, mixed_workload

__all__ = ["STATIC_SPLIT", "OSCILLATION_HIGHPASS_S", "run_on_rates", "mixed_workload_for"]


#: the label of a fixed fleet run with the stack's admission but no reconfiguration: the pools stay
#: at the best fixed split for the whole run (:func:`tokenfactory.controllers.capacity.static_split`)
STATIC_SPLIT = "static-split"


#: the oscillation detectors in :func:`run_on_rates` judge periods shorter than this (s): a pool loop's
#: limit cycle has a period of a few loop delays (start-up + warm-up + the scale-down dwell: 5-30
#: minutes at the study's start-ups), the demand's day 24 h and its harmonics >= 6 h
OSCILLATION_HIGHPASS_S = 7200.0


def _first(v: float | pd.Series) -> float:
    """A factor's value at the run's start."""
    return float(v.iloc[0]) if isinstance(v, pd.Series) else float(v)


def run_on_rates(sc: StackScenario, wl: RateWorkload, *, startup_s: float | None = None, stack: str = "stack",
                 dt: float = 2.0, seed: int = 0, control_start_s: float = 300.0,
                 ceiling: dict[str, float] | None = None) -> tuple[dict, Any, Any]:
    """Run the scenario's stack (``"stack"``), the stack without its planning layer
    (``"stack-no-planning"``) or a baseline deployment (a :data:`tokenfactory.registry.BASELINE_STACKS`
    name) over ``wl`` in the pool model, and score it against the oracle.

    Every contender runs on the same plant: the scenario's plant at the workload's mean request
    with the stack's batch gate applied (a deployment caps its decode batch too - vLLM's
    ``max_num_seqs`` - and with DeepSeek-V3's full-KV pass over the TPOT SLO no deployment meets
    it uncapped), the same SLO, start-up and seed. The oracle
    (:func:`tokenfactory.controllers.capacity.oracle_plan`) provisions that plant at its measured
    utilisation ceiling (:func:`utilization_ceiling`, at the pool sizes of the mean demand) with
    perfect knowledge of the demand at the demand's own resolution.

    Oscillation is judged on what the controller adds to the demand: the provisioned pool minus the
    demand-justified pool (demand x the pool's work factor / (per-worker rate x ceiling)), sampled
    every 10 s after the first 10 minutes, with its components slower than
    :data:`OSCILLATION_HIGHPASS_S` removed; the daily cycle of the demand is not the controller's
    oscillation (against a cycling demand a static pool's residual cycles daily too, and the
    detectors called it regular and persistent on the synthetic week). A cycle that remains is
    tested against the demand and against the pool the plan asks for with the loop through the
    plant opened (the offered demand x the planner's rise x (1 + its headroom in force), at the
    target utilisation): coherent with either at its period, it is the plan's forced response
    (:func:`tokenfactory.controllers.oscillation.forced_response`), reported and not counted.

    Parameters
    ----------
    sc : StackScenario
        The stack scenario (plant, SLO, layers).
    wl : RateWorkload
        The demand (:func:`rate_workload`).
    startup_s : float, optional
        Worker start-up (s); default the scenario's.
    stack : str
        ``"stack"``, ``"stack-no-planning"`` or a baseline name.
    dt : float
        The pool model's step (s).
    seed : int
        Seed of the Poisson arrivals.
    control_start_s : float
        Controllers are first sampled here (the plant fills from empty before).
    ceiling : dict, optional
        The utilisation ceilings (computed when omitted).

    Returns
    -------
    tuple
        ``(metrics row, SimulationResult, ControlStack)``.
    """
    from tokenfactory.controllers.capacity import oracle_plan, static_split
    from tokenfactory.plant_models.plant_protocol import PoolPlant
    from tokenfactory.plant_models.pools import PoolScenario

    params = plant_for(sc, wl.prompt_tokens, wl.output_tokens)
    dyn = sc.dynamics if startup_s is None else dataclasses.replace(sc.dynamics, startup_s=float(startup_s))
    if wl.fleet_size is not None:
        dyn = dataclasses.replace(dyn, fleet_size=wl.fleet_size)
    mean = float(wl.demand.mean())
    s = sc.with_overrides(params=params, rate_rps=mean, dynamics=dyn, planning=(stack == "stack"))
    run_params = stack_plant(s).params  # the same gated plant for every contender
    mu = {"fill": run_params.fill_rate_per_worker, "decode": run_params.decode_capacity(1)}
    factors = {"fill": wl.prompt_factor, "decode": wl.output_factor}
    ceil_ = ceiling or utilization_ceiling(run_params, s.slo_ttft_s, s.slo_tpot_s,
                                           workers={p: math.ceil(mean / mu[p]) for p in mu})
    step_s = float(np.median(np.diff(wl.demand.index.to_numpy(dtype=float))))
    oracle, oracle_gpu_h = oracle_plan(wl.demand, mu, ceil_, startup_s=dyn.startup_s, interval_s=step_s,
                                       gpus_per_worker=dyn.gpus_per_worker, fleet_size=wl.fleet_size,
                                       work_factors=factors)
    split = static_split(oracle, wl.fleet_size) if wl.fleet_size is not None else None
    nf, nd = pools_at(run_params, float(wl.demand.iloc[0]), target_utilization(s),
                       _first(wl.prompt_factor), _first(wl.output_factor))
    ctrl = _contender(s, wl, stack, run_params, dyn, dt, split)
    if stack == STATIC_SPLIT:
        nf, nd = split["fill_workers"], split["decode_workers"]
    if wl.fleet_size is not None and nf + nd > wl.fleet_size:
        raise ConfigError("fleet_size", f"{wl.fleet_size} workers cannot hold the initial {nf} + {nd}")
    psc = PoolScenario(wl.demand, wl.duration_s, dt=dt, control_start_s=control_start_s, seed=seed,
                       slo_ttft_s=s.slo_ttft_s, slo_tpot_s=s.slo_tpot_s, prompt_factor=wl.prompt_factor,
                       output_factor=wl.output_factor)
    r = PoolPlant(run_params, nf, nd, dyn).run(psc, [ctrl])
    verdict = _judge_oscillation(r, dt, control_start_s, mu, ceil_, ctrl, target_utilization(s))
    row = _score_row(stack, wl, dyn, r, verdict, oracle_gpu_h, ceil_, mu)
    if split is not None:
        row.update({"static_fill_workers": split["fill_workers"], "static_decode_workers": split["decode_workers"],
                    "static_worst_load": split["worst_load"], "static_split_needs": split["needs_workers"],
                    "oracle_fleet_needed": float((oracle["fill_billed"] + oracle["decode_billed"]).max())})
    return row, r, ctrl


def _contender(s: StackScenario, wl: RateWorkload, stack: str, run_params, dyn, dt: float, split) -> ControlStack:
    """The contender's controllers: the scenario's stack (with or without planning), its fast layers
    alone on the static split, or a baseline deployment."""
    from tokenfactory.registry import BASELINE_STACKS, baseline_stack

    if stack in ("stack", "stack-no-planning"):
        ctrl, _ = build_stack(s, history=wl.history, time_offset_s=wl.time_offset_s, fleet_size=wl.fleet_size,
                              name=stack, plant_step_s=dt)
        return ctrl
    if stack == STATIC_SPLIT:
        if split is None:
            raise ConfigError("stack", f"{STATIC_SPLIT!r} needs a fixed fleet (workload.fleet_size)")
        full, _ = build_stack(s.with_overrides(planning=False), name=stack, plant_step_s=dt)
        # the stack's fast layers (batch gate, admission); no reconfiguration: the pools never move
        return ControlStack([la for la in full.layers if la.name in ("batch_gate", "admission")], name=stack)
    if stack in BASELINE_STACKS:
        mean = float(wl.demand.mean())
        return baseline_stack(stack, PlantContext(run_params, 1, 1, slo_ttft_s=s.slo_ttft_s, slo_tpot_s=s.slo_tpot_s,
                                                  rate_rps=mean, dynamics=dyn,
                                                  max_replicas=wl.fleet_size or 5000), dt=dt, history=wl.history)
    raise ConfigError("stack", f"{stack!r} is not 'stack', 'stack-no-planning', {STATIC_SPLIT!r} or one of "
                      f"{', '.join(BASELINE_STACKS)}")


def _judge_oscillation(r, dt: float, control_start_s: float, mu: dict, ceil_: dict, ctrl=None,
                       utilization: float = 1.0):
    """The actuators' verdict on 10-s samples after the first 10 minutes of control (the first
    quarter of a shorter run): each pool
    judged on its deviation from the demand-justified count (its load in nominal requests/s, demand
    x the pool's work factor, over the pool's rate at its ceiling); what is slower than
    :data:`OSCILLATION_HIGHPASS_S` is the demand's cycle against the pool's headroom. With a
    planning layer in ``ctrl``, each pool's open-loop plan is the forced-response test's second input."""
    from tokenfactory.controllers.oscillation import judge_actuators

    step = max(1, int(round(10.0 / dt)))  # the detectors on 10-s samples
    # the first 10 minutes of control settle; a run shorter than 40 minutes of control skips its
    # first quarter instead, so a short trace is judged on what it has rather than on nothing
    t_end = float(r.series["time_s"].iloc[-1])
    judged_from = control_start_s + min(600.0, max(0.0, t_end - control_start_s) / 4.0)
    after = r.series[r.series["time_s"] >= judged_from].iloc[::step]
    work = {pool: after["demand"] * after["prompt_factor" if pool == "fill" else "output_factor"]
            for pool in ("fill", "decode")}
    justified = {f"{pool}_pool": (work[pool] / (mu[pool] * ceil_[pool])).to_numpy(dtype=float) for pool in work}
    open_loop = None
    planning = ctrl.layer("planning") if ctrl is not None else None
    if planning is not None and planning.controllers and planning.controllers[0].trace:
        planner = planning.controllers[0]
        plan = pd.DataFrame(planner.trace)
        t = after["time_s"].to_numpy(dtype=float)
        # what the planner's feed-forward asks for at t: the rise of the fit in force, the headroom
        # held from its last sample (it changes once per planning interval)
        idx = np.searchsorted(plan["time_s"].to_numpy(dtype=float), t, side="right") - 1
        head = np.nan_to_num(plan["headroom"].to_numpy(dtype=float), nan=0.0)[np.maximum(idx, 0)]
        rise = np.nan_to_num(planner.rise_in_force(t), nan=1.0)
        factor = np.where(idx >= 0, rise * (1.0 + head), 1.0) / utilization
        open_loop = {f"{pool}_pool": work[pool].to_numpy(dtype=float) / mu[pool] * factor for pool in work}
    return judge_actuators(after, r.actions, start_s=judged_from, references=justified,
                           highpass_s=OSCILLATION_HIGHPASS_S, open_loop=open_loop)


def _score_row(stack: str, wl: RateWorkload, dyn, r, verdict, oracle_gpu_h: float, ceil_: dict, mu: dict) -> dict:
    """One contender's metrics row: cost against the oracle, SLO, rejections, actions, the
    oscillation verdict and conservation counts."""
    osc = {pool: verdict.signals.get(f"{pool}_pool", {}) for pool in ("fill", "decode")}
    m = r.metrics
    return {"stack": stack, "workload": wl.name, "startup_s": dyn.startup_s, "gpu_hours": m["gpu_hours"],
            "busy_gpu_hours": m["busy_gpu_hours"], "oracle_gpu_hours": oracle_gpu_h,
            "gpu_hours_over_oracle": m["gpu_hours"] / oracle_gpu_h if oracle_gpu_h > 0 else math.nan,
            "slo_attainment": m["slo_attainment"], "rejected": m["rejected"],
            "rejected_fraction": m["rejected"] / m["requests"] if m["requests"] else 0.0,
            "actions_per_hour": m["actions_per_hour"], "reversals_per_hour": m["reversals_per_hour"],
            "oscillating": verdict.oscillating, "churning": verdict.churning, "oscillation": verdict.to_dict(),
            "fill_thornhill_r": osc["fill"].get("thornhill_r", math.nan),
            "decode_thornhill_r": osc["decode"].get("thornhill_r", math.nan),
            "requests": m["requests"], "completed": m["completed"], "in_flight_end": m["in_flight_end"],
            "utilization_ceiling": ceil_, "per_worker_rps": mu, "fleet_size": wl.fleet_size,
            "role_moves": m["role_moves"], "role_moves_per_hour": m["role_moves_per_hour"],
            "fill_workers_mean": m["mean_workers"]["fill"], "decode_workers_mean": m["mean_workers"]["decode"]}


def mixed_workload_for(sc: StackScenario, **kwargs) -> RateWorkload:
    """The mixed week (:func:`tokenfactory.traces.rate_workloads.mixed_workload`) on the scenario's
    plant: each class's fill rate from the roofline at its request (:func:`plant_for`), the pools
    sized on the plant :func:`run_on_rates` runs (the batch gate applied at the mean demand) at the
    reconfiguration layer's target utilisation.

    Parameters
    ----------
    sc : StackScenario
        The stack scenario (its plant, SLO, batch gate and target utilisation).
    **kwargs
        The week's other arguments (``days``, ``seed``, ``chat_rps``, ...).

    Returns
    -------
    RateWorkload
    """
    def run_rates(prompt_tokens: int, output_tokens: int, rate_rps: float) -> tuple[float, float]:
        s = sc.with_overrides(params=plant_for(sc, prompt_tokens, output_tokens), rate_rps=rate_rps)
        p = stack_plant(s).params
        return p.fill_rate_per_worker, p.decode_capacity(1)

    return mixed_workload(lambda prompt, output: plant_for(sc, prompt, output).fill_rate_per_worker, run_rates,
                          target_utilization=target_utilization(sc), **kwargs)
