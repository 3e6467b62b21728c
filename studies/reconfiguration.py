"""Study `reconfiguration`: today's pool autoscalers and admission policies flap, cascade and
seesaw; tokenfactory's pending-aware hysteretic controller and smoothed admission do not.

(a) flapping: Kubernetes HPA on vLLM's waiting-request count (a common KEDA/HPA set-up) under a
    constant demand between one and two decode workers alternates 2 -> 1 -> 2 forever;
(b) cascade: HPA on KV occupancy (waiting sequences counted, so the metric grows with the queue;
    starting pods at 0 on a scale-up, as upstream's replica calculator counts them) keeps asking
    for more while the queue grows during a 5-minute start-up, about twice the workers the demand
    needs (the loop model's start-up peak predicts it);
(c) seesaw: Mooncake's early rejection on the current decode load makes prefill and decode load
    swing in anti-phase; the prediction-based variant is shown too;
(d) describing function of the reconfiguration loop (queue relay with hysteresis, whole-worker
    quantisation, start-up delay, decode-slot jump): predicted vs simulated flapping;
(e) one comparison table, every baseline and tokenfactory's controllers, on the Azure
    conversation trace through the request simulator and a day of ServeGen rates through the
    pool-level fluid model.

Run: ``tokenfactory study reconfiguration [--quick | --full] [--out DIR]``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from tokenfactory.controllers import (
    CHURN_MIN_REVERSALS,
    CHURN_REVERSALS_PER_HOUR,
    EarlyRejection,
    HorizontalPodAutoscaler,
    HystereticPoolController,
    QueueRelayScaler,
    assess,
    first_harmonic_amplitude,
    judge_actuators,
    predict_pool_flapping,
)
from tokenfactory.plant_models import (
    ClusterConfig,
    DemandStep,
    FluidParams,
    PoolDynamics,
    PoolPlant,
    PoolScenario,
    RequestPlant,
    RequestShape,
    Worker,
)
from tokenfactory.registry import CONTROL_PLANES, TARGET_UTILIZATION, PlantContext, build_admission, control_plane
from tokenfactory.core.classes import INTERACTIVE, RequestClass
from tokenfactory.replay import build_replay
from tokenfactory.reproduction import SEESAW_SHAPE, SEESAW_SLO_TTFT_S, outcome_record, run_seesaw
from tokenfactory.studies.report import StudyReport, human, markdown_table
from tokenfactory.sweep import SweepBackend, map_points
from tokenfactory.traces import (
    SyntheticWorkload,
    generate_requests,
    load_rate_series,
    load_trace,
    superpose_trace,
    trace_available,
)
from tokenfactory.core.validation import ConfigError
from tokenfactory.studies.study_config import StudyVariants, resolve_study_config

__all__ = ["CONFIG", "run", "DEFAULT_PLANES", "fluid_params", "reproduce_flapping", "reproduce_cascade", "reproduce_seesaw",
           "describing_function_check", "compare_servegen_day", "compare_azure_replay", "measured_worker_rps", "SHAPE",
           "SEESAW_SHAPE"]

PLANT = {"model": "deepseek-v3", "hardware": "h200"}
#: the nominal request of the flapping and cascade reproductions (tokens)
SHAPE = RequestShape(2048, 512)
#: TPOT SLO 0.15 s: with the fitted roofline efficiencies a DeepSeek-V3 decode worker on 8 x H200
#: runs its full KV batch (933 sequences at 2.3k tokens) at 0.116 s per token (0.035 s at the
#: pre-fit assumptions, when this SLO was 0.1 s), so 0.1 s would fail every request
SLO_TTFT_S, SLO_TPOT_S = 2.0, 0.155
MIN_AMPLITUDE_WORKERS = 0.25   # pool-size swings below a quarter worker are not flapping



def fluid_params(shape: RequestShape, measurement_delay_s: float = 0.5,
                 efficiency: dict | None = None) -> FluidParams:
    w = Worker.from_dict({**PLANT, **({"efficiency": efficiency} if efficiency else {})})
    return FluidParams.from_workers(w, w, shape, measurement_delay_s=measurement_delay_s)


#: The describing-function check's cases (queue bands, start-up delays) and its 10 % accuracy were
#: established on the plant at the pre-fit roofline efficiencies; it keeps that plant as its test
#: bed. At the fitted efficiencies (per-worker decode capacity 15.7 instead of 52.5 requests/s,
#: while the slot jump stays 933 sequences) the same cases give -18 % and -10 % period errors
#: and no predicted cycle for the 30 s start-up; re-tuning them is left to the plant
#: restructuring (issue 13 parts 3-5).
DF_EFFICIENCY = {"compute": 0.6, "memory": 0.8, "network": 0.7, "layer_overhead_s": 0.0,
                 "scale_up_latency_s": 0.0, "scale_out_latency_s": 0.0}


#: the reproductions' variants, as the report's loop table names them
_VARIANT_WORDS = {"baseline": "today's rule", "predictive": "predictive variant", "fixed": "tokenfactory"}


def _verdict(resp_series: pd.DataFrame, column: str, dt: float, start_s: float) -> dict:
    x = resp_series.loc[resp_series["time_s"] >= start_s, column].to_numpy(dtype=float)
    rep = assess(x, dt, min_amplitude=MIN_AMPLITUDE_WORKERS)
    return rep.to_dict()


_outcome = outcome_record



def _pool_behaviour(x: dict) -> str:
    """A pool's behaviour in words, from its outcome figures."""
    lo, hi = x.get("min_provisioned"), x.get("max_provisioned")
    if x["oscillating"]:
        return (f"flaps {hi} -> {lo} -> {hi} (period {x['period_s']:.0f} s, {x['reversals_per_hour']:.1f} "
                "reversals/h)")
    if x["reversals_per_hour"] > 0:
        return f"moves between {lo} and {hi} workers irregularly ({x['reversals_per_hour']:.1f} reversals/h)"
    return f"holds {hi} workers" if lo == hi else f"settles between {lo} and {hi} workers without reversing"


def _peak_against_justified(peak: int, casc: dict) -> str:
    """A run's peak pool against the demand-justified count, in words from the numbers: that count
    is the most the demand after the step justifies (its workers' capacity with the pool
    controller's queue headroom, at its utilization target), an upper bound, not a goal."""
    j = casc["demand_justified_workers"]
    demand = casc.get("demand_workers")
    where = ("equal to" if peak == j else f"{j - peak} below" if peak < j else f"{peak - j} above ({peak / j:.1f}x)")
    out = f"peak {peak} workers provisioned, {where} the most the demand after the step justifies, {j}"
    if demand is not None:
        h, u = casc["queue_headroom"], casc["target_utilization"]
        out += (f" ({demand:.2f} workers' capacity x {1 + h:g} queue headroom / {u:g} utilization target = "
                f"{demand * (1 + h) / u:.2f}, rounded up); {peak} run it at {demand / peak:.2f} utilization")
    return out


def _cascade_sentence(casc: dict) -> str:
    b, f = casc["baseline"], casc["fixed"]
    return (f"HPA goes from {b['provisioned_at_step']} to {b['peak_provisioned']} provisioned workers within "
            f"{b['seconds_to_peak']:.0f} s of the demand step, while new workers take {casc['startup_s']:.0f} s to "
            f"load ({_peak_against_justified(b['peak_provisioned'], casc)}); the pending-aware controller: "
            f"{_peak_against_justified(f['peak_provisioned'], casc)}. SLO attainment {b['slo_attainment']:.3f} "
            f"(HPA) and {f['slo_attainment']:.3f} (pending-aware).")


def _seesaw_behaviour(x: dict) -> str:
    if x["oscillating"]:
        return f"oscillates (period {x['period_s']:.1f} s, r = {x['thornhill_r']:.1f})"
    return "does not oscillate"


def _provisioned(series: pd.DataFrame, pool: str) -> pd.Series:
    return series[f"{pool}_workers"] + series[f"{pool}_workers_starting"]


# ------------------------------------------------------------------------------------------
# (a) flapping


def reproduce_flapping(quick: bool = False, dynamics: PoolDynamics = PoolDynamics()) -> tuple[dict, dict]:
    """HPA on decode waiting requests (target 2 per replica, 1-2 replicas) vs the hysteretic
    controller, constant demand of 1.3 decode workers' capacity."""
    fp = fluid_params(SHAPE)
    mu = fp.decode_capacity(1)
    lam = 1.3 * mu
    sc = PoolScenario(lam, 3600.0 if quick else 7200.0, dt=0.5, control_start_s=60.0, seed=1,
                      slo_ttft_s=SLO_TTFT_S, slo_tpot_s=SLO_TPOT_S)
    runs = {
        "baseline": HorizontalPodAutoscaler("decode", target=2.0, metric="decode_waiting", min_replicas=1,
                                            max_replicas=2),
        "fixed": HystereticPoolController.tuned("decode", mu, lam, startup_s=dynamics.startup_s,
                                                warmup_s=dynamics.warmup_s, min_replicas=1, max_replicas=2),
    }
    out, resps = {}, {}
    for key, ctrl in runs.items():
        r = PoolPlant(fp, 4, 2, dynamics).run(sc, [ctrl])
        rep = _verdict(r.series, "decode_workers", sc.dt, 600.0)
        after = _provisioned(r.series[r.series["time_s"] >= 600.0], "decode")
        out[key] = _outcome(r.metrics, rep, controller=type(ctrl).__name__, params=ctrl.params(),
                            min_provisioned=int(after.min()), max_provisioned=int(after.max()))
        resps[key] = r
    out["demand_rps"], out["decode_worker_rps"] = lam, mu
    return out, resps


# ------------------------------------------------------------------------------------------
# (b) cascade


def reproduce_cascade(quick: bool = False, startup_s: float = 300.0) -> tuple[dict, dict]:
    """Demand doubles (1.5 -> 3 decode workers' capacity) with a start-up delay of minutes: HPA on
    KV occupancy (target 0.8) vs the pending-aware hysteretic controller."""
    dyn = PoolDynamics(startup_s=startup_s)
    fp = fluid_params(SHAPE)
    mu = fp.decode_capacity(1)
    lam0, step_at = 1.5 * mu, 600.0
    sc = PoolScenario(lam0, 2400.0 if quick else 3600.0, dt=0.5, control_start_s=60.0, seed=2,
                      disturbances=(DemandStep(step_at, 2.0),), slo_ttft_s=SLO_TTFT_S, slo_tpot_s=SLO_TPOT_S)
    fixed = HystereticPoolController.tuned("decode", mu, 2 * lam0, startup_s=dyn.startup_s, warmup_s=dyn.warmup_s,
                                           max_replicas=32)
    runs = {"baseline": HorizontalPodAutoscaler("decode", target=0.8, metric="kv_occupancy", max_replicas=32),
            "fixed": fixed}
    justified = fixed.demand_justified(2 * lam0)
    out, resps = {}, {}
    for key, ctrl in runs.items():
        r = PoolPlant(fp, 8, 2, dyn).run(sc, [ctrl])
        prov = _provisioned(r.series, "decode")
        r.series["decode_provisioned"] = prov
        rep = _verdict(r.series, "decode_provisioned", sc.dt, 0.0)
        during = r.series[(r.series["time_s"] >= step_at) & (r.series["time_s"] < step_at + startup_s + 60)]
        after_step = r.series["time_s"] >= step_at
        t_peak = float(r.series.loc[after_step & (prov >= prov.max()), "time_s"].iloc[0]) - step_at
        out[key] = _outcome(r.metrics, rep, controller=type(ctrl).__name__,
                            peak_provisioned=int(prov.max()), seconds_to_peak=t_peak,
                            provisioned_at_step=int(prov[r.series["time_s"] <= step_at].iloc[-1]),
                            peak_provisioned_during_startup=int(_provisioned(during, "decode").max()),
                            overscale_vs_justified=float(prov.max() / justified))
        resps[key] = r
    out["demand_justified_workers"] = justified
    # what the count is made of: the demand after the step in workers' capacity, sized with the
    # controller's queue headroom at its utilization target (HystereticPoolController.demand_justified)
    out["demand_workers"] = 2 * lam0 / mu
    out["queue_headroom"], out["target_utilization"] = fixed.queue_headroom, fixed.target_utilization
    out["startup_s"] = startup_s
    # the loop model's start-up peak, before simulating: from the 2 workers at the step to the demand after it
    from tokenfactory.controllers.autoscaler_loops import PoolOperatingPoint, autoscaler_loop, predict_startup_cascade

    point = PoolOperatingPoint(mu, 2 * lam0, fp.measurement_delay_s, dyn.startup_s + dyn.warmup_s / 2.0,
                               fp.decode_slots_per_worker, fp.decode_slots_per_worker / mu)
    out["baseline"]["predicted_peak_during_startup"] = predict_startup_cascade(autoscaler_loop(runs["baseline"], point), 2)
    return out, resps


# ------------------------------------------------------------------------------------------
# (c) seesaw


def _smoothed_for(fp: FluidParams, fill_workers: int, decode_workers: int, slo_ttft_s: float = SLO_TTFT_S):
    """tokenfactory's admission at these pool sizes (the registry's ``smoothed`` kind)."""
    return build_admission("smoothed", PlantContext(fp, fill_workers, decode_workers, slo_ttft_s=slo_ttft_s))


def reproduce_seesaw(quick: bool = False) -> tuple[dict, dict]:
    """Long prompts, demand 1.3 x decode capacity, prefill sized to carry it: Mooncake early
    rejection on the current decode load, its prediction-based variant, and tokenfactory's
    smoothed admission (:func:`tokenfactory.reproduction.run_seesaw`)."""
    fp = fluid_params(SEESAW_SHAPE)

    def runs(fp, slo, fill_workers, decode_workers):
        return {"baseline": EarlyRejection(fill_latency_s=fp.fill_latency_s, slo_ttft_s=slo),
                "predictive": EarlyRejection(fill_latency_s=fp.fill_latency_s, slo_ttft_s=slo, predictive=True),
                "fixed": _smoothed_for(fp, fill_workers, decode_workers, slo)}

    return run_seesaw(fp, runs, quick=quick, slo_tpot_s=SLO_TPOT_S)


# ------------------------------------------------------------------------------------------
# (d) describing function vs simulation


def describing_function_check(quick: bool = False) -> tuple[list[dict], dict]:
    """A queue relay between 1 and 2 decode workers at a demand of 1.5 workers' capacity (the
    midpoint the describing function assumes), several start-up delays and hysteresis widths:
    predicted vs simulated period and first-harmonic amplitude of the ready queue (on the
    pre-fit plant, :data:`DF_EFFICIENCY`)."""
    fp = fluid_params(SHAPE, efficiency=DF_EFFICIENCY)
    mu = fp.decode_capacity(1)
    sample = 5.0
    cases = [(30.0, (1000.0, 3000.0)), (120.0, (500.0, 1500.0)), (300.0, (1000.0, 3000.0))]
    if not quick:
        cases += [(120.0, (1000.0, 3000.0)), (300.0, (500.0, 1500.0)), (600.0, (1000.0, 3000.0))]
    rows, resps = [], {}
    for startup, (lo, hi) in cases:
        dyn = PoolDynamics(startup_s=startup, warmup_s=0.0, drain_s=0.0)
        dur = max(4 * 3600.0 if not quick else 2 * 3600.0, 30 * startup)
        r = PoolPlant(fp, 4, 2, dyn).run(PoolScenario(1.5 * mu, dur, dt=0.5, poisson=False, control_start_s=60.0),
                                         [QueueRelayScaler("decode", 1, 2, lo, hi, sample_period=sample)])
        q = r.series.loc[r.series["time_s"] >= dur / 4, "ready"].to_numpy()
        rep = assess(q, 0.5)
        # the loop's dead time: scale-up waits for start-up, scale-down does not; the describing
        # function takes the mean of the two (+ half a sample period + the measurement delay)
        tau_up = startup + sample / 2 + fp.measurement_delay_s
        tau_down = sample / 2 + fp.measurement_delay_s
        pred = predict_pool_flapping(mu, (tau_up + tau_down) / 2, lo, hi, slots_per_worker=fp.decode_slots_per_worker)
        row = {"startup_s": startup, "queue_low": lo, "queue_high": hi,
               "predicted_period_s": pred.period_s if pred else None,
               "predicted_amplitude": pred.amplitude if pred else None,
               "simulated_period_s": rep.period_s, "simulated_amplitude": rep.harmonic_amplitude,
               "simulated_oscillating": rep.oscillating}
        if pred:
            row["period_error"] = pred.period_s / rep.period_s - 1.0
            row["amplitude_error"] = pred.amplitude / rep.harmonic_amplitude - 1.0
        rows.append(row)
        resps[(startup, lo, hi)] = r
    return rows, resps


# ------------------------------------------------------------------------------------------
# (e) the comparison


def _ctx(fp: FluidParams, rate: float, dynamics: PoolDynamics, nf: int, nd: int, arrival_times_s=None) -> PlantContext:
    return PlantContext(fp, nf, nd, slo_ttft_s=SLO_TTFT_S, slo_tpot_s=SLO_TPOT_S, rate_rps=rate, dynamics=dynamics,
                        arrival_times_s=arrival_times_s)


def _pools_for(fp: FluidParams, rate: float, measured: dict | None = None) -> tuple[int, int]:
    """Workers per pool that carry ``rate`` at the target utilisation (of the per-worker rates
    ``measured`` in the request simulator when given, else the fluid plant's)."""
    mu_f, mu_d = (measured["fill"], measured["decode"]) if measured else (fp.fill_rate_per_worker,
                                                                         fp.decode_capacity(1))
    return (max(1, math.ceil(rate / (TARGET_UTILIZATION * mu_f))),
            max(1, math.ceil(rate / (TARGET_UTILIZATION * mu_d))))


def measured_worker_rps(trace: pd.DataFrame, setup, dynamics: PoolDynamics, seconds: float = 120.0) -> dict:
    """Requests/s one fill worker and one decode worker deliver in the request simulator on
    ``trace``'s requests: each pool alone saturated (one worker of it, four of the other, an
    offered load of twice its nominal rate, open admission), its completions over the second half
    of ``seconds``."""
    fp = setup.plant.params
    rate = len(trace) / float(trace["arrival_s"].max())
    out = {}
    for pool, nominal in (("fill", fp.fill_rate_per_worker), ("decode", fp.decode_capacity(1))):
        replay = superpose_trace(trace, 2.0 * nominal / rate, seed=11)
        replay = replay[replay["arrival_s"] < seconds].reset_index(drop=True)
        replay.attrs = dict(trace.attrs)
        nf, nd = (1, 4) if pool == "fill" else (4, 1)
        cl = ClusterConfig(fill_workers=nf, decode_workers=nd, measurement_delay_s=fp.measurement_delay_s,
                           slo_ttft_s=SLO_TTFT_S, slo_tpot_s=SLO_TPOT_S, drain_s=0.0, dynamics=dynamics,
                           snapshot_dt=0.5, seed=6, progress=False)
        rec = RequestPlant(setup.params, cl).run(replay).records
        done = rec["kv_ready_s"] if pool == "fill" else rec["completion_s"]
        half = (done >= seconds / 2) & (done < seconds)
        out[pool] = float(half.sum() / (seconds / 2))
    return out


def _pool_oscillation(result, start_s: float) -> tuple[bool, dict]:
    """The run's verdict (:func:`judge_actuators`: every actuator and the pools' churn) and the
    pools' reports."""
    v = judge_actuators(result.series, result.actions, start_s=start_s)
    return v.oscillating, {pool: v.signals.get(f"{pool}_pool", {}) for pool in ("fill", "decode")}


def _row(name: str, workload: str, m: dict, osc: bool, reports: dict) -> dict:
    return {"workload": workload, "controller": name, "gpu_hours": m["gpu_hours"], "slo_attainment": m["slo_attainment"],
            "rejected": m["rejected"], "actions_per_hour": m["actions_per_hour"],
            "reversals_per_hour": m["reversals_per_hour"], "oscillating": osc,
            "ttft_p99_s": m.get("ttft_p99", m.get("ttft_estimate_p99_s")),
            "decode_r": reports["decode"].get("thornhill_r", math.nan),
            "fill_r": reports["fill"].get("thornhill_r", math.nan)}


def _servegen_plane(pt: dict):
    """One control plane over the ServeGen day (a sweep point): (comparison row, result)."""
    fp, sc, dynamics, name = pt["fp"], pt["scenario"], pt["dynamics"], pt["plane"]
    scaler, _ = CONTROL_PLANES[name]
    nf, nd = _pools_for(fp, pt["mean_rate"] if scaler is None else pt["first_rate"])
    scalers, adm = control_plane(name, _ctx(fp, pt["mean_rate"], dynamics, nf, nd))
    r = PoolPlant(fp, nf, nd, dynamics).run(sc, [*scalers, *([adm] if adm else [])])
    osc, reps = _pool_oscillation(r, 600.0)
    return _row(name, pt["workload"], r.metrics, osc, reps), r


def compare_servegen_day(quick: bool, planes=tuple(CONTROL_PLANES), dynamics: PoolDynamics = PoolDynamics(),
                         scale: float = 5.0, hours: float | None = None, dt: float = 0.25,
                         sweep: SweepBackend | None = None):
    """A day of ServeGen m-large rates x ``scale`` (a tenant population ``scale`` times larger, so
    pools hold several workers) through the pool model; synthetic rates without the trace data."""
    spec = "servegen:m-large" if trace_available("servegen:m-large") else "synthetic"
    rs = load_rate_series(spec)
    rates, shape = rs.rates, RequestShape(rs.input_tokens, rs.output_tokens)
    day = 86400.0
    first = rates.index[0]
    y = rates["rate_rps"].loc[first + 6 * day: first + 7 * day - 1].interpolate(limit_direction="both")
    y.index = y.index - y.index[0]
    hours = hours or (6.0 if quick else 24.0)
    y = y.loc[: hours * 3600.0]
    fine = np.arange(0.0, y.index[-1] + 600.0, 60.0)  # linear between the 10-min rates
    demand = pd.Series(scale * np.interp(fine, y.index.to_numpy(dtype=float), y.to_numpy()), index=fine)
    fp = fluid_params(shape)
    duration = float(fine[-1])
    sc = PoolScenario(demand, duration, dt=dt, control_start_s=300.0, seed=4, slo_ttft_s=SLO_TTFT_S,
                      slo_tpot_s=SLO_TPOT_S)
    mean_rate, peak_rate = float(demand.mean()), float(demand.max())
    workload = f"{spec} day 7 x{scale:g} (pool model)"
    # one point per control plane: serial, or on a Dask cluster (tokenfactory study --workers/--scheduler)
    mapper = sweep.map if sweep is not None else map_points  # the backend is an argument
    runs = mapper(_servegen_plane, [{"plane": name, "fp": fp, "scenario": sc, "dynamics": dynamics,
                                         "mean_rate": mean_rate, "first_rate": float(demand.iloc[0]),
                                         "workload": workload} for name in planes])
    rows = [row for row, _ in runs]
    resps = {name: r for name, (_, r) in zip(planes, runs)}
    info = {"trace": spec, "workload": workload, "scale": scale, "shape": shape.__dict__, "mean_rate_rps": mean_rate, "peak_rate_rps": peak_rate,
            "duration_s": duration, "static_pools_at_mean": _pools_for(fp, mean_rate)}
    return rows, resps, info


def _azure_plane(pt: dict):
    """One control plane over the Azure replay (a sweep point): (comparison row, result)."""
    fp, dynamics, plane = pt["fp"], pt["dynamics"], pt["plane"]
    nf, nd = _pools_for(fp, pt["mean_rate"], pt["measured"])
    # the hysteretic controller's dead band from the noise measured on the hour it is tuned for
    scalers, adm = control_plane(plane, _ctx(fp, pt["mean_rate"], dynamics, nf, nd, pt["arrivals"]))
    cl = ClusterConfig(fill_workers=nf, decode_workers=nd, measurement_delay_s=fp.measurement_delay_s,
                       slo_ttft_s=SLO_TTFT_S, slo_tpot_s=SLO_TPOT_S, drain_s=60.0, dynamics=dynamics,
                       autoscale_start_s=60.0, snapshot_dt=0.5, seed=6)
    r = RequestPlant(pt["params"], cl).run(pt["replay"], scalers, admission=adm)
    osc, reps = _pool_oscillation(r, 120.0)
    return _row(plane, pt["workload"], r.metrics, osc, reps), r


def compare_azure_replay(quick: bool, planes=tuple(CONTROL_PLANES), dynamics: PoolDynamics = PoolDynamics(),
                         load: float = 2.0, minutes: float | None = None, sweep: SweepBackend | None = None):
    """Azure conversation through the request simulator at a load multiplier: superposed, randomly
    shifted copies of the hour (:func:`tokenfactory.traces.superpose_trace`) so the mean demand is
    ``load`` workers' capacity of the bottleneck pool, as a worker of it delivers in the request
    simulator on this trace (:func:`measured_worker_rps`); static pools are sized from the same
    measured rates; synthetic requests without the trace data."""
    minutes = minutes or (10.0 if quick else 20.0)
    if trace_available("azure-conv-2023"):
        name, trace = "azure-conv-2023", load_trace("azure-conv-2023")
    else:
        name = "synthetic"
        trace = generate_requests(SyntheticWorkload(mean_rate_rps=5.0, idc=4.0, daily_amplitude=0.0,
                                                    daily_second_harmonic=0.0, weekend_factor=1.0, seed=5), 3600.0)
    setup = build_replay(trace, {"fill_workers": 1, "decode_workers": 1})
    fp = setup.plant.params
    # the load is a multiple of what a worker of the bottleneck pool delivers in this simulator on
    # this trace (measured), not of the roofline's nominal rate: on the synthetic trace a fill
    # worker completes ~0.6 x its nominal 51 req/s, so a load of 2.5 nominal workers overloaded
    # every control plane that sizes from the model (SLO attainment 0.009 for 6 of 8)
    measured = measured_worker_rps(trace, setup, dynamics)
    per_worker = min(measured.values())
    rate = len(trace) / float(trace["arrival_s"].max())
    multiplier = load * per_worker / rate
    full_hour = superpose_trace(trace, multiplier, seed=7)
    replay = full_hour[full_hour["arrival_s"] < minutes * 60.0].reset_index(drop=True)
    replay.attrs = dict(trace.attrs)
    mean_rate = len(replay) / (minutes * 60.0)
    workload = f"{name} x{multiplier:.0f} ({minutes:.0f} min, request simulator)"
    arrivals = full_hour["arrival_s"].to_numpy()
    mapper = sweep.map if sweep is not None else map_points
    runs = mapper(_azure_plane, [{"plane": plane, "fp": fp, "params": setup.params, "replay": replay,
                                      "arrivals": arrivals, "dynamics": dynamics, "mean_rate": mean_rate,
                                      "measured": measured, "workload": workload} for plane in planes])
    rows = [row for row, _ in runs]
    resps = {plane: r for plane, (_, r) in zip(planes, runs)}
    info = {"trace": name, "workload": workload, "multiplier": multiplier, "minutes": minutes, "requests": len(replay),
            "mean_rate_rps": mean_rate, "load_workers": load, "decode_worker_rps": fp.decode_capacity(1),
            "fill_worker_rps": fp.fill_rate_per_worker, "measured_fill_worker_rps": measured["fill"],
            "measured_decode_worker_rps": measured["decode"], "static_pools": _pools_for(fp, mean_rate, measured),
            "infeasible_share": setup.infeasible_share(
                (RequestClass(INTERACTIVE, SLO_TTFT_S, SLO_TPOT_S, 0),))["any"]}
    return rows, resps, info


# ------------------------------------------------------------------------------------------
# plots and the report


def _reproduction_figure(title: str, resps: dict, pools: list[str], justified: float | None = None) -> Figure:
    fig = Figure(figsize=(10, 7.5), layout="constrained")
    axes = fig.subplots(3, 1, sharex=True)
    for key, r in resps.items():
        s = r.series
        t = s["time_s"] / 60.0
        for pool in pools:
            line, = axes[0].step(t, _provisioned(s, pool), where="post", label=f"{key}: {pool} workers (provisioned)")
            axes[0].step(t, s[f"{pool}_workers"], where="post", ls="--", lw=0.9, color=line.get_color(),
                         label=f"{key}: {pool} workers (serving)")
        if len(r.actions):
            a = r.actions
            axes[0].plot(a["time_s"] / 60.0, a["to"], "o", ms=3, alpha=0.6, label=f"{key}: actions")
        arrivals = s["arrival_rate"] * (s["time_s"].iloc[1] - s["time_s"].iloc[0])  # per step
        slo = (s["in_slo"].rolling(120, min_periods=1).sum() / arrivals.rolling(120, min_periods=1).sum())
        axes[1].plot(t, slo.clip(0, 1), label=key)
        axes[2].plot(t, s["ready"] + s["backlog"], lw=0.8, label=f"{key}: queued requests")
    if justified is not None:
        axes[0].axhline(justified, color="k", ls=":", lw=1, label="demand-justified count")
    axes[0].set_ylabel("workers")
    axes[1].set_ylabel("SLO attainment\n(rolling)")
    axes[2].set_ylabel("requests")
    axes[2].set_xlabel("time (min)")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper right")
        ax.grid(alpha=0.3)
    axes[0].set_title(title)
    return fig


def _seesaw_figure(resps: dict, window_min: tuple[float, float] = (5.0, 7.0)) -> Figure:
    """Decode and prefill load of each admission policy over a two-minute window (the swings are
    ~10 s long), and the rolling SLO attainment over the whole run."""
    keys = list(resps)
    fig = Figure(figsize=(10, 2.2 * (len(keys) + 1)), layout="constrained")
    axes = fig.subplots(len(keys) + 1, 1)
    lo, hi = window_min
    for ax, key in zip(axes, keys):
        s = resps[key].series
        w = s[(s["time_s"] >= lo * 60) & (s["time_s"] <= hi * 60)]
        ax.plot(w["time_s"] / 60.0, w["decode_load"], color="tab:blue", lw=1, label="decode load (sequences / slot)")
        ax.plot(w["time_s"] / 60.0, w["fill_load"], color="tab:orange", lw=1, label="prefill load (work / capacity)")
        ax.set_title(f"{key}: {resps[key].config['controllers'][0]['name']}", fontsize=9)
        ax.set_ylabel("load")
        ax.set_ylim(0.0, 1.7)  # one scale for every policy
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    ax = axes[-1]
    for key in keys:
        s = resps[key].series
        arrivals = s["arrival_rate"] * (s["time_s"].iloc[1] - s["time_s"].iloc[0])  # per step
        slo = s["in_slo"].rolling(600, min_periods=1).sum() / arrivals.rolling(600, min_periods=1).sum()
        ax.plot(s["time_s"] / 60.0, slo.clip(0, 1), lw=1, label=key)
    ax.set_ylabel("SLO attainment\n(rolling 60 s)")
    ax.set_xlabel("time (min)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return fig


def _df_figure(rows: list[dict]) -> Figure:
    fig = Figure(figsize=(9, 4), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    ok = [r for r in rows if r["predicted_period_s"]]
    for ax, sim, pred, label in ((ax1, "simulated_period_s", "predicted_period_s", "period (s)"),
                                 (ax2, "simulated_amplitude", "predicted_amplitude", "queue amplitude (requests)")):
        xs = [r[sim] for r in ok]
        ys = [r[pred] for r in ok]
        ax.plot(xs, ys, "o")
        lim = [0, 1.1 * max(xs + ys)] if xs else [0, 1]
        ax.plot(lim, lim, "k:", lw=1)
        ax.set_xlabel(f"simulated {label}")
        ax.set_ylabel(f"describing function {label}")
        ax.grid(alpha=0.3)
    fig.suptitle("Queue relay between 1 and 2 decode workers: describing function vs simulation")
    return fig


def _none_meets(rs: list[dict], info: dict | None) -> str:
    """Why no control plane met the SLO on a workload, from the run's figures."""
    best = max(rs, key=lambda r: r["slo_attainment"])
    text = (f"no control plane meets SLO attainment >= 0.99: the best, {best['controller']}, reaches "
            f"{best['slo_attainment']:.3f} at {best['gpu_hours']:.3g} GPU-h")
    if best.get("ttft_p99_s") is not None and math.isfinite(best["ttft_p99_s"]):
        text += f" with TTFT p99 {best['ttft_p99_s']:.1f} s against {SLO_TTFT_S:g} s"
    if info and "measured_fill_worker_rps" in info:
        nf, nd = info["static_pools"]
        text += (f"; the load is {info['load_workers']:g} workers of the bottleneck pool as measured in the request "
                 f"simulator (a fill worker delivers {info['measured_fill_worker_rps']:.1f} req/s against the "
                 f"roofline's {info['fill_worker_rps']:.1f}, a decode worker {info['measured_decode_worker_rps']:.1f} "
                 f"against {info['decode_worker_rps']:.1f}), the static pools ({nf} fill, {nd} decode) run at "
                 f"{info['mean_rate_rps'] / (nf * info['measured_fill_worker_rps']):.0%} and "
                 f"{info['mean_rate_rps'] / (nd * info['measured_decode_worker_rps']):.0%} of their measured rates, and "
                 f"{info['infeasible_share']:.2%} of the requests miss the SLO even on an empty cluster; the control "
                 "planes that size pools from the roofline's rates or the plant's nominal fill capacity see "
                 "spare capacity that is not there")
    return text


def _winners(rows: list[dict], infos: dict | None = None) -> list[str]:
    """Best row per column, every tie named. Static control planes take no actions by
    construction, so the actions column is judged among the autoscaling ones."""
    cols = [("GPU-hours (lowest)", "gpu_hours", min, False), ("SLO attainment (highest)", "slo_attainment", max, False),
            ("rejected (fewest)", "rejected", min, False),
            ("actions per hour (fewest, autoscalers)", "actions_per_hour", min, True),
            ("reversals per hour (fewest, autoscalers)", "reversals_per_hour", min, True)]
    lines = []
    for workload in dict.fromkeys(r["workload"] for r in rows):
        rs = [r for r in rows if r["workload"] == workload]
        parts = []
        for label, key, pick, scaling_only in cols:
            pool = [r for r in rs if not (scaling_only and CONTROL_PLANES[r["controller"]][0] is None)]
            if not pool:
                continue
            best = pick(r[key] for r in pool)
            tied = [r["controller"] for r in pool if math.isclose(r[key], best, rel_tol=1e-3, abs_tol=1e-9)]
            parts.append(f"{label}: {', '.join(tied)} ({human(best)})")
        ok = [r for r in rs if r["slo_attainment"] >= 0.99]
        if ok:
            c = min(ok, key=lambda r: r["gpu_hours"])
            parts.append(f"cheapest with SLO attainment >= 0.99: {c['controller']} ({human(c['gpu_hours'])} GPU-h)")
        else:
            parts.append(_none_meets(rs, (infos or {}).get(workload)))
        calm = [r["controller"] for r in rs if not r["oscillating"]]
        osc = [r["controller"] for r in rs if r["oscillating"]]
        parts.append(f"not oscillating: {len(calm)} of {len(rs)}" + (f" (oscillating: {', '.join(osc)})" if osc else ""))
        lines.append(f"- **{workload}**: " + "; ".join(parts))
    return lines


#: the control planes of the default and quick comparisons: every autoscaler, and static pools
#: under Mooncake's early rejection and under smoothed admission. ``--full`` adds static pools
#: under vLLM's watermark and predictive early rejection, and the hysteretic controller without
#: smoothed admission (which matches it with smoothed admission when no overload reaches it).
DEFAULT_PLANES = ("static + mooncake-early-rejection", "static + tokenfactory-smoothed", "kubernetes-hpa",
                  "knative-kpa", "dynamo-throughput", "dynamo-load", "aibrix-apa",
                  "tokenfactory-hysteretic + smoothed")


def _check(cfg: dict[str, Any]) -> None:
    """The resolved settings' control planes are known ones."""
    for p in cfg["planes"]:
        if p not in CONTROL_PLANES:
            raise ConfigError("reconfiguration.planes", f"unknown control plane {p!r}; known: {', '.join(CONTROL_PLANES)}")


#: the study's settings: the defaults and its full variant (:mod:`tokenfactory.studies.study_config`);
#: ``servegen_hours`` None replays the whole ServeGen day
CONFIG = StudyVariants("reconfiguration", {"reproductions": True, "describing_function": True,
                                           "comparison": ["azure", "servegen"], "azure_minutes": 10.0,
                                           "planes": list(DEFAULT_PLANES), "servegen_hours": None},
                       full={"azure_minutes": 20.0, "planes": list(CONTROL_PLANES)}, check=_check)


def run(out_dir: str | Path, quick: bool = False, config: dict[str, Any] | None = None,
        full: bool = False, sweep: SweepBackend | None = None) -> dict[str, Any]:
    # the Azure replay is the request simulator's: 10 minutes of it in the default and quick
    # variants (each control plane replays it), the 20-minute replay with --full
    cfg = resolve_study_config(CONFIG, config, quick=quick, full=full)
    planes = tuple(cfg["planes"])
    report = StudyReport("reconfiguration", Path(out_dir), {**cfg, "quick": quick, "full": full, "plant": PLANT,
                                                            "dynamics": PoolDynamics().__dict__,
                                                            "slo": {"ttft_s": SLO_TTFT_S, "tpot_s": SLO_TPOT_S}})
    metrics: dict[str, Any] = {}
    lines = ["Pools of DeepSeek-V3 workers on 8 x H200 (roofline rates); start-up 120 s unless stated, "
             f"warm-up 30 s at half speed; SLO TTFT <= {SLO_TTFT_S} s, TPOT <= {SLO_TPOT_S} s. Oscillation verdicts "
             f"come from the detectors (`tokenfactory.controllers.oscillation.assess`) on the pool sizes, swings under "
             f"{MIN_AMPLITUDE_WORKERS} workers ignored.", ""]
    if cfg["reproductions"]:
        lines += _reproductions_section(report, quick, metrics)
    if cfg["describing_function"]:
        lines += _describing_function_section(report, quick, metrics)
    comparison = _comparison_section(report, quick, cfg, planes, sweep, metrics, lines)
    _reproduction_verdicts(report, metrics)
    _cheapest_answers(report, comparison)
    return report.finish(metrics, lines)


def _reproductions_section(report: StudyReport, quick: bool, metrics: dict[str, Any]) -> list[str]:
    """(a)-(c): flapping, cascade and seesaw reproduced on the pool model, their figures and table."""
    lines: list[str] = []
    flap, flap_r = reproduce_flapping(quick)
    casc, casc_r = reproduce_cascade(quick)
    see, see_r = reproduce_seesaw(quick)
    metrics["reproductions"] = {"flapping": flap, "cascade": casc, "seesaw": see}
    report.save_figure(_reproduction_figure(
        f"(a) flapping: constant demand {flap['demand_rps']:.0f} req/s = 1.3 decode workers", flap_r,
        ["decode"]), "flapping.png",
        f"HPA on waiting requests (baseline) {_pool_behaviour(flap['baseline'])}; the hysteretic controller "
        f"{_pool_behaviour(flap['fixed'])}.")
    report.save_figure(_reproduction_figure(
        "(b) cascade: demand doubles at 10 min, start-up 300 s", casc_r, ["decode"],
        justified=casc["demand_justified_workers"]), "cascade.png",
        "HPA counts starting pods in its replica count but averages the metric over serving ones: "
        + _cascade_sentence(casc))
    report.save_figure(_seesaw_figure(see_r, (2.0, 4.0) if quick else (5.0, 7.0)), "seesaw.png",
        "Decode load (sequences per slot) and prefill load (work in fill per fill capacity x latency): "
        + "; ".join(f"{label} {_seesaw_behaviour(see[k])}" for k, label in
                    (("baseline", "early rejection on the current decode load"),
                     ("predictive", "prediction-based early rejection"), ("fixed", "smoothed admission"))
                    if k in see) + ".")
    lines += ["## Reproductions (pool-level fluid model)", ""]
    rep_rows = []
    for k, d in metrics["reproductions"].items():
        for v in ("baseline", "predictive", "fixed"):
            if v in d:
                x = d[v]
                rep_rows.append({"case": k, "variant": v, "controller": x["controller"],
                                 "oscillating": x["oscillating"], "actions_per_hour": x["actions_per_hour"],
                                 "slo_attainment": x["slo_attainment"], "gpu_hours": x["gpu_hours"],
                                 "reversals_per_hour": x["reversals_per_hour"],
                                 "rejected": x["rejected"], "thornhill_r": x["thornhill_r"],
                                 "period_s": x["period_s"] if x["oscillating"] else None})
    lines += markdown_table(rep_rows, ["case", "variant", "controller", "oscillating", "actions_per_hour",
                                  "reversals_per_hour", "slo_attainment", "gpu_hours", "rejected", "thornhill_r", "period_s"])
    b, f = casc["baseline"], casc["fixed"]
    lines += ["", f"Cascade: HPA {_peak_against_justified(b['peak_provisioned'], casc)}; hysteretic "
                  f"{_peak_against_justified(f['peak_provisioned'], casc)}.",
              f"Seesaw: decode-load swing (first harmonic) {see['baseline']['decode_load_harmonic_amplitude']:.3f} of the "
              f"slots, prefill load {see['baseline']['fill_vs_decode_phase_deg']:.0f} deg out of phase with decode "
              f"load; throughput {see['baseline']['throughput_rps']:.1f} (early rejection) / "
              f"{see['predictive']['throughput_rps']:.1f} (predictive) / {see['fixed']['throughput_rps']:.1f} "
              f"(smoothed) req/s of a decode capacity of {see['decode_capacity_rps']:.1f}.", ""]
    return lines


def _describing_function_section(report: StudyReport, quick: bool, metrics: dict[str, Any]) -> list[str]:
    """(d): the reconfiguration loop's describing function against simulated limit cycles."""
    lines: list[str] = []
    rows, _ = describing_function_check(quick)
    metrics["describing_function"] = rows
    report.save_table(pd.DataFrame(rows), "describing_function.csv")
    report.save_figure(_df_figure(rows), "describing_function.png",
                       "Predicted (relay with hysteresis, whole-worker step, start-up delay, decode-slot jump) "
                       "vs simulated period and first-harmonic amplitude of the ready queue.")
    lines += ["## Describing function of the reconfiguration loop", "",
              "Queue relay between 1 and 2 decode workers at 1.5 workers' demand; L(s) = (mu + S s) e^{-tau s} / s "
              "(mu per-worker completions, S slots per worker), tau the mean of the up (start-up) and down delays. "
              "Test bed: the plant at the pre-fit roofline constants (compute 0.6, memory 0.8, network 0.7, "
              "no per-layer or collective latency), on which these cases were chosen.", ""]
    lines += markdown_table(rows, ["startup_s", "queue_low", "queue_high", "predicted_period_s", "simulated_period_s",
                              "period_error", "predicted_amplitude", "simulated_amplitude", "amplitude_error"])
    lines += [""]
    return lines


def _comparison_section(report: StudyReport, quick: bool, cfg, planes: tuple, sweep, metrics: dict[str, Any],
                        lines: list[str]) -> list[dict]:
    """(e): the control planes on the Azure replay and the ServeGen day; its rows (lines appended)."""
    comparison: list[dict] = []
    infos = {}
    if "azure" in cfg["comparison"]:
        rows, _, info = compare_azure_replay(quick, planes, minutes=cfg["azure_minutes"], sweep=sweep)
        comparison += rows
        infos["azure"] = info
    if "servegen" in cfg["comparison"]:
        rows, resps, info = compare_servegen_day(quick, planes, hours=cfg["servegen_hours"], sweep=sweep)
        comparison += rows
        infos["servegen"] = info
        ours = "tokenfactory-hysteretic" if "tokenfactory-hysteretic" in resps else "tokenfactory-hysteretic + smoothed"
        show = {k: v for k, v in resps.items() if k in ("kubernetes-hpa", "dynamo-load", ours)}
        if show:
            report.save_figure(_reproduction_figure(f"{info['trace']}: a day through the pool model", show,
                                                    ["decode", "fill"]), "servegen_day.png",
                               "Pool sizes, rolling SLO attainment and queues over the day for three control planes.")
    wanted = {"azure": "azure-conv-2023", "servegen": "servegen:m-large"}
    metrics["absent_traces"] = [wanted[k] for k, info in infos.items() if info["trace"] == "synthetic"]
    if comparison:
        metrics["comparison"] = comparison
        metrics["comparison_workloads"] = infos
        report.save_table(pd.DataFrame(comparison), "comparison.csv")
        lines += ["## Comparison", ""]
        lines += markdown_table(comparison, ["workload", "controller", "gpu_hours", "slo_attainment", "rejected",
                                        "actions_per_hour", "reversals_per_hour", "oscillating"])
        lines += ["", "`oscillating` is the run's verdict (`judge_actuators`): the detectors on every actuator "
                      "(provisioned pool sizes, batch cap, reservation, admission rate; a regular cycle), or churn "
                      f"(more than {CHURN_MIN_REVERSALS} pool reversals and more than {CHURN_REVERSALS_PER_HOUR:g} "
                      "per hour); `reversals_per_hour` counts scale actions that undo the previous one's direction."]
        lines += ["", "Winners per column (ties all named):", ""] + _winners(
            comparison, {i["workload"]: i for i in infos.values() if "workload" in i})
    return comparison


def _reproduction_verdicts(report: StudyReport, metrics: dict[str, Any]) -> None:
    """The reproductions' headlines and one loop verdict per run."""
    if "reproductions" in metrics:
        rp = metrics["reproductions"]
        report.headline("HPA flapping", f"{rp['flapping']['baseline']['reversals_per_hour']:.1f}", "reversals/h",
                        f"hysteretic: {rp['flapping']['fixed']['reversals_per_hour']:.1f}/h")
        report.headline("cascade peak", rp["cascade"]["baseline"]["peak_provisioned"], "workers",
                        f"hysteretic {rp['cascade']['fixed']['peak_provisioned']}, justified "
                        f"{rp['cascade']['demand_justified_workers']}")
    if "reproductions" in metrics:
        for case, d in metrics["reproductions"].items():
            for v in ("baseline", "predictive", "fixed"):
                if v in d:
                    x = d[v]
                    report.loop(f"{case}: {x['controller']} ({_VARIANT_WORDS[v]})", x["oscillating"],
                                detail=f"{human(x['reversals_per_hour'])} reversals/h, {human(x['actions_per_hour'])} "
                                       f"actions/h" + (f", period {x['period_s']:.0f} s" if x["oscillating"]
                                                       and x.get("period_s") else "")
                                       + (f", {_peak_against_justified(x['peak_provisioned'], d)}"
                                          if "peak_provisioned" in x and "demand_justified_workers" in d else ""))


def _cheapest_answers(report: StudyReport, comparison: list[dict]) -> None:
    """Per workload, the cheapest control plane holding SLO attainment >= 0.99."""
    for workload in dict.fromkeys(r["workload"] for r in comparison):
        ok = [r for r in comparison if r["workload"] == workload and r["slo_attainment"] >= 0.99]
        if ok:
            c = min(ok, key=lambda r: r["gpu_hours"])
            report.answer("change", f"Size pools with {c['controller']}: on {workload} it is the cheapest control "
                          f"plane holding SLO attainment >= 0.99 ({human(c['gpu_hours'])} GPU-hours, "
                          f"{human(c['reversals_per_hour'])} reversals/h).")
            report.headline("cheapest at SLO >= 0.99", c["controller"],
                            note=f"{workload.split(' (')[0]}: {human(c['gpu_hours'])} GPU-h")
