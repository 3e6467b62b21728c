"""The pool-level fluid model: the token factory on the reconfiguration time scale (seconds to days).

The admission-loop fluid model (:mod:`tokenfactory.plant_models.fluid`) resolves the ready buffer's sub-second
dynamics on a 10 ms grid; pool reconfiguration happens over seconds to hours, where that grid is
too fine to run a day of traffic. This model keeps the same flows and rates (one
:class:`tokenfactory.plant_models.fluid.FluidParams`, derived from the roofline) on a coarse grid (``dt`` of
0.1-2 s), written as a discrete-time fluid queue network so every step is exact for the queues
(no flow can take more than a queue holds, whatever ``dt``):

* arrivals: Poisson counts per step from the demand (seeded), or the deterministic fluid;
* admission: the backlog is released at the admission command's rate; whatever exceeds its
  ``backlog_bound`` is rejected with the action's reason (``backlog_bound = 0`` is early
  rejection at arrival);
* fill: the fill queue is served at (effective fill workers x fill rate); served requests become
  KV-ready ``fill_to_ready_s`` later;
* decode: completions ``FluidParams.completion_rate`` x dt (D / (L x pass time(D / n)), the fluid
  model's law, at the warming workers' speed); ready requests join as
  slots free; when the decode pool shrinks, sequences over the new slot count move back to the
  ready buffer with their KV (live migration, counted as ``preempted``).

Pools are sized by autoscalers (:class:`tokenfactory.signals.ScaleAction`: desired workers of
a pool, Kubernetes-deployment semantics, :mod:`tokenfactory.plant_models.fleet`): a new worker is billed from the decision, serves after
``startup_s`` and runs at ``warmup_factor`` of full speed for its first ``warmup_s``; a scale-down
cancels workers still starting first, then drains serving ones (billed ``drain_s`` more).

Conservation: arrived = completed + rejected + backlog + fill + in transfer + ready + decoding,
checked every step. The result is a :class:`tokenfactory.plant_models.result.SimulationResult`
(shared series columns; ``arrived``/``completed``/``rejected`` cumulative). SLO attainment is a cohort estimate: a request arriving at t meets the SLO if
the queues it finds, divided by the service rates at t, give TTFT <= ``slo_ttft_s`` and TPOT
(pass time plus its ready-buffer wait spread over its tokens, as the request simulator measures
it) <= ``slo_tpot_s``; rejected requests miss it.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tokenfactory.errors import ConservationError
from tokenfactory.events import DemandStep, events_from_dicts
from tokenfactory.plant_models.fleet import PoolDynamics, PoolFleet, free_workers
from tokenfactory.plant_models.fluid import FluidParams
from tokenfactory.plant_models.result import SERIES_COLUMNS, SimulationResult
from tokenfactory.signals import POOLS, REJECT_REASONS, AdmissionAction, Measurement, count_reversals, split_action
from tokenfactory.validation import ConfigError, check_int, check_number

__all__ = ["PoolScenario", "PoolResponse", "simulate_pools"]

#: the former name of the pool model's result (now every plant's)
PoolResponse = SimulationResult



@dataclass(frozen=True)
class PoolScenario:
    """Demand and run control: ``demand`` is a constant rate (requests/s) or a rate series
    (``pandas.Series`` indexed by seconds, held piecewise constant); ``disturbances`` are
    :class:`tokenfactory.plant_models.fluid.DemandStep`; ``poisson`` draws arrival counts per step (seeded).
    Controllers are first sampled at ``control_start_s`` (the plant fills from empty before that,
    so a controller does not react to the empty start)."""

    demand: float | pd.Series
    duration_s: float
    dt: float = 0.5
    disturbances: tuple = ()
    poisson: bool = True
    seed: int = 0
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.1
    control_start_s: float = 0.0

    def __post_init__(self) -> None:
        check_number("scenario.duration_s", self.duration_s, low=0.0, low_inclusive=False)
        check_number("scenario.control_start_s", self.control_start_s, low=0.0, high=self.duration_s)
        check_number("scenario.dt", self.dt, low=0.01, high=10.0)
        check_int("scenario.seed", self.seed, low=0)
        check_number("scenario.slo_ttft_s", self.slo_ttft_s, low=0.0, low_inclusive=False)
        check_number("scenario.slo_tpot_s", self.slo_tpot_s, low=0.0, low_inclusive=False)
        if isinstance(self.demand, pd.Series):
            if self.demand.empty or not self.demand.index.is_monotonic_increasing:
                raise ConfigError("scenario.demand", "a rate series needs a non-empty increasing time index")
            v = self.demand.to_numpy(dtype=float)
            if not np.all(np.isfinite(v)) or (v < 0).any():
                raise ConfigError("scenario.demand", "rates must be finite and >= 0 (fill gaps first)")
        else:
            check_number("scenario.demand", self.demand, low=0.0)
        events_from_dicts(self.disturbances, "scenario.disturbances", (DemandStep.kind,))

    def demand_grid(self, t: np.ndarray) -> np.ndarray:
        if isinstance(self.demand, pd.Series):
            idx = self.demand.index.to_numpy(dtype=float)
            k = np.clip(np.searchsorted(idx, t, side="right") - 1, 0, len(idx) - 1)
            lam = self.demand.to_numpy(dtype=float)[k]
        else:
            lam = np.full(len(t), float(self.demand))
        for d in self.disturbances:
            lam = np.where(t >= d.at_s, lam * d.factor, lam)
        return lam



#: the shared columns, then the pool model's own: the scenario's demand, rejections per second, the
#: exact content of the fill-to-ready pipeline, starting and billed workers, the cohort SLO estimate
_SERIES = (*SERIES_COLUMNS, "demand", "rejection_rate", "in_transfer", "fill_workers_starting",
           "decode_workers_starting", "fill_workers_billed", "decode_workers_billed", "ttft_estimate_s",
           "tpot_estimate_s", "in_slo")


def simulate_pools(params: FluidParams, fill_workers: int, decode_workers: int, scenario: PoolScenario, *,
                   controllers: Sequence = (), dynamics: PoolDynamics = PoolDynamics()) -> SimulationResult:
    """Run ``controllers`` (admission controllers and/or pool autoscalers, each sampled at its own
    ``sample_period`` with the plant's measurement delay) on the pool-level fluid model.

    Without an admission controller every arrival is admitted at once. Raises
    :class:`tokenfactory.plant_models.fluid.ConservationError` if requests are lost or invented.
    """
    check_int("plant.fill_workers", fill_workers, low=1)
    check_int("plant.decode_workers", decode_workers, low=1)
    if dynamics.fleet_size is not None and fill_workers + decode_workers > dynamics.fleet_size:
        raise ConfigError("pools.fleet_size", f"{dynamics.fleet_size} workers cannot hold the initial "
                          f"{fill_workers} fill + {decode_workers} decode")
    p, dt = params, scenario.dt
    n = int(round(scenario.duration_s / dt)) + 1
    t_grid = np.arange(n) * dt
    lam = scenario.demand_grid(t_grid)
    rng = np.random.default_rng(scenario.seed)
    arrivals = rng.poisson(lam * dt).astype(float) if scenario.poisson else lam * dt
    fleets = {"fill": PoolFleet("fill", fill_workers, dynamics), "decode": PoolFleet("decode", decode_workers, dynamics)}
    for c in controllers:
        c.reset()
        if c.sample_period < dt - 1e-12:
            raise ConfigError(f"{type(c).__name__}.sample_period",
                              f"{c.sample_period} s is shorter than the step {dt} s")
    next_sample = [scenario.control_start_s] * len(controllers)
    delay_steps = int(round(p.measurement_delay_s / dt))
    transfer_steps = int(round(p.fill_to_ready_s / dt))
    pipeline: deque = deque([0.0] * transfer_steps)  # fill output on its way to the ready buffer
    in_pipe = 0.0  # sum(pipeline), kept as a running total (this loop runs ~10^5 times a day)
    S = {k: np.zeros(n) for k in _SERIES}
    B = F = R = D = 0.0
    counts = dict(arrived=0.0, admitted=0.0, completed=0.0, rejected=0.0, preempted=0.0)
    rejected = {r: 0.0 for r in REJECT_REASONS}
    action = AdmissionAction(math.inf)
    scale_rows: list[dict] = []
    L = p.output_tokens
    in_slo = 0.0
    for k in range(n):
        t = t_grid[k]
        for f in fleets.values():
            f.advance(t)
        # -- controllers: sampled with the measurement delay, actions held until the next sample
        for j, c in enumerate(controllers):
            if t + 1e-9 < next_sample[j]:
                continue
            next_sample[j] += c.sample_period
            m = _measure(S, k, delay_steps, c.sample_period, dt) if k else _initial_measurement(
                p, fleets, t)
            adm, scales = split_action(c.update(t, m))
            if adm is not None:
                action = adm
            for a in scales:
                if a.pool not in fleets:
                    raise ConfigError(f"{type(c).__name__}.pool", f"{a.pool!r} is not one of {POOLS}")
                before = fleets[a.pool].provisioned
                if fleets[a.pool].set_target(t, max(int(a.replicas), 0)):
                    scale_rows.append({"time_s": t, "kind": "scale", "pool": a.pool, "from": before,
                                       "to": fleets[a.pool].provisioned, "controller": type(c).__name__})
        # -- placement: elastic fleets start every request at once; a fixed fleet waits for free workers
        free = free_workers(dynamics, sum(f.billed for f in fleets.values()))
        for pool in POOLS:
            free -= fleets[pool].place(t, free)
        # -- arrivals, rejection, admission
        a_in = arrivals[k]
        counts["arrived"] += a_in
        B += a_in
        rej = max(B - action.backlog_bound, 0.0)
        B -= rej
        rejected[action.reason] += rej
        counts["rejected"] += rej
        admit = B if math.isinf(action.rate) else min(B, action.rate * dt)
        B -= admit
        F += admit
        counts["admitted"] += admit
        # -- fill
        fill_eff = fleets["fill"].effective(t)
        fill_cap = fill_eff * p.fill_rate_per_worker
        served = min(F, fill_cap * dt)
        F -= served
        pipeline.append(served)
        r_in = pipeline.popleft()
        in_pipe += served - r_in
        R += r_in
        # -- decode
        n_dec = len(fleets["decode"].serving)
        slots = p.decode_slots(n_dec)
        speed = fleets["decode"].effective(t) / n_dec if n_dec else 0.0
        if D > slots:  # pool shrank: sequences beyond the new slots migrate back with their KV
            ex = D - slots
            D -= ex
            R += ex
            counts["preempted"] += ex
        done = min(D, dt * p.completion_rate(D, n_dec, speed))  # warming workers run at their speed
        D -= done
        counts["completed"] += done
        s = min(R, max(slots - D, 0.0))
        R -= s
        D += s
        # -- what an arriving request would see (cohort SLO estimate)
        ttft = (F / fill_cap if fill_cap > 0 else math.inf) + p.fill_latency_s
        if B > 0 and not math.isinf(action.rate):
            ttft += B / action.rate if action.rate > 0 else math.inf
        ready_wait = R / (done / dt) if R > 0 and done > 0 else (math.inf if R > 0 else 0.0)
        pass_s = p.decode_step_s(max(D, 1.0) / max(n_dec, 1)) / speed if speed > 0 else math.inf
        tpot = pass_s + ready_wait / L
        ok = (a_in - rej) if (ttft <= scenario.slo_ttft_s and tpot <= scenario.slo_tpot_s) else 0.0
        in_slo += max(ok, 0.0)
        row = S
        row["time_s"][k], row["demand"][k] = t, lam[k]
        row["arrival_rate"][k], row["admitted_rate"][k] = a_in / dt, admit / dt
        row["completion_rate"][k], row["rejection_rate"][k] = done / dt, rej / dt
        row["arrived"][k], row["completed"][k], row["rejected"][k] = \
            counts["arrived"], counts["completed"], counts["rejected"]
        # requests in fill or in transfer, as a scrape would count them: the queue plus Little's law
        # for the pipeline (exact whatever dt; the delay line itself rounds to whole steps)
        row["backlog"][k], row["in_transfer"][k] = B, in_pipe
        row["fill_in_progress"][k] = F + served / dt * p.fill_to_ready_s
        row["ready"][k], row["active_decodes"][k] = R, D
        row["decode_slots"][k], row["fill_capacity"][k] = slots, fill_cap
        for pool in POOLS:
            fl = fleets[pool]
            row[f"{pool}_workers"][k] = len(fl.serving)
            row[f"{pool}_workers_starting"][k] = fl.in_transit
            row[f"{pool}_workers_billed"][k] = fl.billed
        row["ttft_estimate_s"][k], row["tpot_estimate_s"][k], row["in_slo"][k] = ttft, tpot, ok
        row["admission_rate"][k] = action.rate
        # conservation, every step
        in_system = B + F + sum(pipeline) + R + D  # the deque itself, not the running total: an independent check
        resid = counts["arrived"] - (counts["completed"] + counts["rejected"] + in_system)
        if abs(resid) > 1e-6 * max(1.0, counts["arrived"]):
            raise ConservationError(f"pool model lost requests at t={t:.1f} s: residual {resid:.3g}")
    series = pd.DataFrame(S)
    billed = series["fill_workers_billed"] + series["decode_workers_billed"]
    hours = scenario.duration_s / 3600.0
    metrics = {
        "requests": float(counts["arrived"]), "completed": float(counts["completed"]),
        "rejected": float(sum(rejected.values())), "rejected_by_reason": {k: float(v) for k, v in rejected.items()},
        "in_flight_end": float(B + F + in_pipe + R + D), "preempted": float(counts["preempted"]),
        "slo_attainment": float(in_slo / counts["arrived"]) if counts["arrived"] > 0 else 1.0,
        "gpu_hours": float((billed.sum() * dt if dynamics.fleet_size is None else dynamics.fleet_size * n * dt)
                           / 3600.0 * dynamics.gpus_per_worker),
        "busy_gpu_hours": float(billed.sum() * dt / 3600.0 * dynamics.gpus_per_worker),
        "scale_actions": len(scale_rows), "actions_per_hour": float(len(scale_rows) / hours),
        "reversals_per_hour": float(count_reversals(scale_rows) / hours),
        "peak_workers": {pool: int(series[f"{pool}_workers_billed"].max()) for pool in POOLS},
        "mean_workers": {pool: float(series[f"{pool}_workers_billed"].mean()) for pool in POOLS},
        "ttft_estimate_p99_s": float(np.nanpercentile(np.minimum(series["ttft_estimate_s"], 1e6), 99)),
    }
    demand_desc = scenario.demand if not isinstance(scenario.demand, pd.Series) else \
        f"rate series ({len(scenario.demand)} points)"
    config = {"params": {k: v for k, v in dataclasses.asdict(p).items() if k != "provenance"},
              "fill_workers": fill_workers, "decode_workers": decode_workers,
              "dynamics": dataclasses.asdict(dynamics),
              "scenario": {**{f.name: getattr(scenario, f.name) for f in dataclasses.fields(scenario)},
                           "demand": demand_desc,
                           "disturbances": [dataclasses.asdict(d) for d in scenario.disturbances]},
              "controllers": [{"name": type(c).__name__, **(c.params() if hasattr(c, "params") else {})}
                              for c in controllers]}
    metrics["duration_s"] = scenario.duration_s
    return SimulationResult(series=series, records=None, metrics=metrics, config=config,
                            actions=pd.DataFrame(scale_rows, columns=["time_s", "kind", "pool", "from", "to",
                                                                      "controller"]))


def _initial_measurement(p: FluidParams, fleets, t: float) -> Measurement:
    nf, nd = len(fleets["fill"].serving), len(fleets["decode"].serving)
    return Measurement(time_s=t, backlog=0.0, fill_in_progress=0.0, ready=0.0, active_decodes=0.0,
                       completion_rate=0.0, admitted_rate=0.0, decode_slots=p.decode_slots(nd),
                       fill_capacity=nf * p.fill_rate_per_worker, fill_workers=nf, decode_workers=nd,
                       fill_workers_starting=fleets["fill"].in_transit,
                       decode_workers_starting=fleets["decode"].in_transit, arrival_rate=0.0)


def _measure(S: dict, k: int, delay_steps: int, period: float, dt: float) -> Measurement:
    """The sample ``delay_steps`` old; rates averaged over the controller's sample period (what a
    scrape of counters gives)."""
    j = max(k - 1 - delay_steps, 0)
    lo = max(0, j - max(1, int(round(period / dt))) + 1)
    span = (j - lo + 1) * dt
    return Measurement(
        time_s=float(S["time_s"][j]), backlog=float(S["backlog"][j]), fill_in_progress=float(S["fill_in_progress"][j]),
        ready=float(S["ready"][j]), active_decodes=float(S["active_decodes"][j]),
        completion_rate=float(S["completion_rate"][lo:j + 1].sum() * dt / span),
        admitted_rate=float(S["admitted_rate"][lo:j + 1].sum() * dt / span),
        decode_slots=float(S["decode_slots"][j]), fill_capacity=float(S["fill_capacity"][j]),
        fill_workers=float(S["fill_workers"][j]), decode_workers=float(S["decode_workers"][j]),
        fill_workers_starting=float(S["fill_workers_starting"][j]),
        decode_workers_starting=float(S["decode_workers_starting"][j]),
        arrival_rate=float(S["arrival_rate"][lo:j + 1].sum() * dt / span))
