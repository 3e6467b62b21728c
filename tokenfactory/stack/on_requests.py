"""The layered stack in the request simulator (article section 22): the same scenario, the same
layer objects, run on individual requests for hours instead of the pool model's fluid for days.

In the pool model (a 2 s step) the stack's gated batch cap cannot act - a step averages over
many decode passes - so it stands at its cap at the nominal context. Here every layer runs: the
batch gate every 0.25 s on the live context of the decoding sequences, admission every few
seconds, the planned pool controllers every 10 s with workers that start, warm up and drain
(:class:`tokenfactory.plant_models.fleet.PoolDynamics`). The simulator samples admission and
autoscalers separately, so the stack is split into two views of the same layers
(:meth:`tokenfactory.controllers.control_stack.ControlStack.split`).

:func:`morning_ramp` is the workload: the embedded synthetic generator's daily cycle from early
morning (demand rising towards its afternoon peak), requests drawn around the scenario's mean
request. The planning layer is left out: a few hours hold no daily history to fit.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from tokenfactory.controllers.oscillation import judge_actuators
from tokenfactory.plant_models.des import ClusterConfig, simulate
from tokenfactory.replay import build_replay, class_outputs
from tokenfactory.stack.build import build_stack
from tokenfactory.stack.on_rates import run_on_rates
from tokenfactory.stack.plant import pools_at, target_utilization  # the runner's own pool sizing
from tokenfactory.stack.stack_scenario import StackScenario
from tokenfactory.traces.rate_workloads import RateWorkload
from tokenfactory.traces.synthetic import SyntheticWorkload, generate_requests
from tokenfactory.core.validation import ConfigError, check_number

__all__ = ["morning_ramp", "run_stack_on_requests", "requests_as_rates", "run_stack_on_both_plants"]

#: sigma of the log-normal prompt and output lengths (the synthetic generator's defaults)
_SIGMA_IN, _SIGMA_OUT = 1.0, 0.9


def morning_ramp(rate_rps: float, hours: float, *, prompt_tokens: float, output_tokens: float,
                 start_hour: float = 6.0, daily_amplitude: float = 0.5, step_at_s: float | None = None,
                 step_factor: float = 1.0, seed: int = 0) -> pd.DataFrame:
    """A request table from the synthetic generator starting at ``start_hour`` on a Monday: its
    daily cycle (peak at 14:00) makes the demand rise through the morning, with bursts (index of
    dispersion 4 over 10 s windows) and log-normal prompt and output lengths whose means are the
    given ones.

    Parameters
    ----------
    rate_rps : float
        The generator's mean rate over the day (requests/s, > 0); the morning runs below it,
        rising.
    hours : float
        Length (h, > 0).
    prompt_tokens, output_tokens : float
        Mean prompt and output tokens (> 1).
    start_hour : float
        Hour of the day the table starts at (default 6).
    daily_amplitude : float
        Relative amplitude of the daily cycle (default 0.5).
    step_at_s, step_factor : float, optional
        A demand step: from ``step_at_s`` the demand is ``step_factor`` (>= 1) times the ramp's
        (a second, independently seeded stream of the same requests superposed on it).
    seed : int
        Seed of every draw.

    Returns
    -------
    DataFrame
        The request table (:mod:`tokenfactory.traces.schema`), arrivals from 0.
    """
    check_number("rate_rps", rate_rps, low=0.0, low_inclusive=False)
    check_number("hours", hours, low=0.0, low_inclusive=False)
    check_number("prompt_tokens", prompt_tokens, low=1.0)
    check_number("output_tokens", output_tokens, low=1.0)
    # a log-normal's mean is its median x exp(sigma^2 / 2)
    w = SyntheticWorkload(mean_rate_rps=rate_rps, daily_amplitude=daily_amplitude, weekend_factor=1.0,
                          input_median=prompt_tokens / math.exp(_SIGMA_IN ** 2 / 2), input_sigma=_SIGMA_IN,
                          output_median=output_tokens / math.exp(_SIGMA_OUT ** 2 / 2), output_sigma=_SIGMA_OUT,
                          seed=seed)
    check_number("step_factor", step_factor, low=1.0)
    base = generate_requests(w, hours * 3600.0, start_s=start_hour * 3600.0)
    if step_at_s is None or step_factor == 1.0:
        return base
    check_number("step_at_s", step_at_s, low=0.0, high=hours * 3600.0)
    extra = generate_requests(dataclasses.replace(w, mean_rate_rps=rate_rps * (step_factor - 1.0), seed=seed + 1),
                              hours * 3600.0, start_s=start_hour * 3600.0)
    out = pd.concat([base, extra[extra["arrival_s"] >= step_at_s]], ignore_index=True)
    out = out.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    out.attrs = dict(base.attrs)
    return out


def run_stack_on_requests(sc: StackScenario, trace: pd.DataFrame, *, startup_s: float | None = None, seed: int = 0,
                          control_start_s: float = 300.0, name: str = "stack") -> tuple[dict, object, object]:
    """Run the scenario's stack (without its planning layer) over ``trace`` in the request
    simulator: the plant at the trace's own mean request, pools sized for the first ten
    minutes' demand, every layer sampled at its own period.

    Parameters
    ----------
    sc : StackScenario
        The stack scenario (its plant's model, hardware and delays; SLO; dynamics; layers).
    trace : DataFrame
        A request table.
    startup_s : float, optional
        Worker start-up (s); default the scenario's.
    seed : int
        Seed of the simulator's draws.
    control_start_s : float
        First autoscaler sample (s): the plant fills from empty before.
    name : str
        The stack's label.

    Returns
    -------
    tuple
        ``(metrics row, SimulationResult, ControlStack)``.

    Raises
    ------
    ConfigError
        For a trace without requests over a time span.
    """
    plant_cfg = {k: v for k, v in sc.config.get("plant", {}).items()
                 if k in ("model", "hardware", "measurement_delay_s", "kv_stripes", "kv_setup_s", "parallelism",
                          "efficiency", "decode_model", "decode_hardware")}
    setup = build_replay(trace, plant_cfg)
    dyn = sc.dynamics if startup_s is None else dataclasses.replace(sc.dynamics, startup_s=float(startup_s))
    t = trace["arrival_s"].to_numpy(dtype=float)
    if not len(t) or t[-1] <= 0:
        raise ConfigError("trace", "needs requests arriving over a time span (> 0 s)")
    duration = float(t[-1])
    first = max(float((t < 600.0).sum()) / min(600.0, max(duration, 1.0)), 1e-6)
    s = sc.with_overrides(params=setup.plant.params, rate_rps=len(t) / max(duration, 1.0), dynamics=dyn,
                          planning=False)
    # the orchestrator knows its requests' output lengths by class from history (as a replay does)
    ctrl, plant = build_stack(s, service=setup.service, class_outputs=class_outputs(trace), name=name)
    run_params = plant.params  # the gated plant the stack was built for
    # pools for the first ten minutes at the reconfiguration layer's target, as run_on_rates starts them
    nf, nd = pools_at(run_params, first, target_utilization(s))
    cluster = ClusterConfig(fill_workers=nf, decode_workers=nd, measurement_delay_s=run_params.measurement_delay_s,
                            slo_ttft_s=s.slo_ttft_s, slo_tpot_s=s.slo_tpot_s, dynamics=dyn,
                            autoscale_start_s=control_start_s, batch_cap=run_params.decode_slots_per_worker,
                            duration_s=duration, seed=seed)
    adm, scalers = ctrl.split()
    r = simulate(trace, setup.params, cluster, adm, scalers)
    m = r.metrics
    gate = ctrl.layer("batch_gate")
    # the verdict every result reports: every actuator and buffer after the first control sample
    verdict = judge_actuators(r.series, r.actions, start_s=control_start_s,
                              buffer_amplitudes={"ready": 1.0, "fill_queued_tokens": float(setup.params.fill_token_budget)})
    caps = r.series["decode_batch_cap"].to_numpy(dtype=float) if "decode_batch_cap" in r.series else np.array([])
    row = {"stack": name, "requests": m["requests"], "completed": m["completed"], "rejected": m["rejected"],
           "in_flight_end": m["in_flight_end"], "slo_attainment": m["slo_attainment"],
           "goodput_tokens_per_s": m.get("goodput_tokens_per_s"), "gpu_hours": m["gpu_hours"],
           "actions_per_hour": m["actions_per_hour"], "reversals_per_hour": m["reversals_per_hour"],
           "oscillating": verdict.oscillating, "churning": verdict.churning, "oscillation": verdict.to_dict(),
           "batch_cap_changes": m["batch_cap_changes"],
           "batch_cap_range": [float(np.nanmin(caps)), float(np.nanmax(caps))] if caps.size else None,
           "gate_sampled": bool(gate is not None and gate.sampled), "initial_pools": [nf, nd],
           "startup_s": dyn.startup_s, "duration_s": duration, "wall_seconds": m["wall_seconds"]}
    return row, r, ctrl


def requests_as_rates(trace: pd.DataFrame, bin_s: float = 60.0, name: str = "requests") -> RateWorkload:
    """A request table as the pool model's demand: arrivals counted per ``bin_s``, the mean request.

    Parameters
    ----------
    trace : DataFrame
        A request table.
    bin_s : float
        Bin width (s, > 0).
    name : str
        The workload's label.

    Returns
    -------
    RateWorkload
        No planner history; prompt tokens are the new (uncached) ones.
    """
    check_number("bin_s", bin_s, low=0.0, low_inclusive=False)
    t = trace["arrival_s"].to_numpy(dtype=float)
    edges = np.arange(0.0, max(float(t.max()) if len(t) else 0.0, bin_s) + bin_s, bin_s)
    counts, _ = np.histogram(t, edges)
    demand = pd.Series(counts / bin_s, index=edges[:-1])
    cached = trace["cached_tokens"].to_numpy(dtype=float) if "cached_tokens" in trace else 0.0
    prompt = max(1, round(float(np.mean(trace["input_tokens"].to_numpy(dtype=float) - cached))))
    return RateWorkload(name, demand, None, 0.0, prompt, max(1, round(float(trace["output_tokens"].mean()))))


def run_stack_on_both_plants(sc: StackScenario, trace: pd.DataFrame, *, startup_s: float | None = None,
                             seed: int = 0, dt: float = 2.0) -> tuple[list[dict], object, object]:
    """The same stack scenario on the same demand in the request simulator (every layer sampled)
    and in the pool model (the arrivals binned per minute; the gated cap static there): one row
    per plant with SLO attainment, GPU-hours and the reconfiguration layer's activity.

    Parameters
    ----------
    sc : StackScenario
        The scenario (run without its planning layer in both).
    trace : DataFrame
        A request table.
    startup_s : float, optional
        Worker start-up (s).
    seed : int
        Seed of both runs.
    dt : float
        The pool model's step (s).

    Returns
    -------
    tuple
        ``(rows, request-simulator result, its ControlStack)``.
    """
    row, r, ctrl = run_stack_on_requests(sc, trace, startup_s=startup_s, seed=seed)
    wl = requests_as_rates(trace, name="requests")
    prow, _, _ = run_on_rates(sc, wl, startup_s=startup_s, stack="stack-no-planning", dt=dt, seed=seed)
    keys = ("slo_attainment", "gpu_hours", "actions_per_hour", "reversals_per_hour", "requests", "rejected",
            "oscillating")
    rows = [{"plant": "request simulator", **{k: row[k] for k in keys}, "batch_cap_changes": row["batch_cap_changes"],
             "gate": "sampled every %g s" % ctrl.layer("batch_gate").sample_period if row["gate_sampled"] else "static"},
            {"plant": "pool model", **{k: prow[k] for k in keys}, "batch_cap_changes": 0,
             "gate": "static (nominal-context cap)", "oracle_gpu_hours": prow["oracle_gpu_hours"]}]
    return rows, r, ctrl
