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
  model's law, at the warming workers' speed; L x the output factor); ready requests join as
  slots free; when the decode pool shrinks, sequences over the new slot count move back to the
  ready buffer with their KV (live migration, counted as ``preempted``).

Pools are sized by autoscalers (:class:`tokenfactory.core.signals.ScaleAction`: desired workers of
a pool, Kubernetes-deployment semantics, :mod:`tokenfactory.plant_models.fleet`): a new worker is billed from the decision, serves after
``startup_s`` and runs at ``warmup_factor`` of full speed for its first ``warmup_s``; a scale-down
cancels workers still starting first, then drains serving ones (billed ``drain_s`` more).

The request shape may shift over the run (``PoolScenario.prompt_factor`` and ``output_factor``,
constants or series on the demand's time axis, default 1): the fill rate per worker is divided by
the prompt factor (fill work per request relative to the plant's nominal request) and a request
decodes L x output factor tokens. This is a fluid approximation: every request queued or decoding
at t takes the factors of t, not those it arrived with. It is fine when the mix changes over hours
and the queues turn over in seconds (a decode lasts L x pass ~ 10-40 s, a fill queue at the SLO
under 2 s); a sudden mix step would be smeared over one queue turnover in reality and is
instantaneous here. The decode pass time and slots stay those of the nominal context (the roofline
table of :meth:`tokenfactory.plant_models.fluid.FluidParams.from_service`): a longer prompt also
makes each pass read more KV, which this model leaves out. The cohort TTFT estimate takes the fill
pass as fill latency x prompt factor; the fill-to-ready pipeline keeps its nominal delay.

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

from tokenfactory.core.errors import ConservationError
from tokenfactory.core.events import DemandStep, events_from_dicts
from tokenfactory.plant_models.fleet import PoolDynamics, PoolFleet, free_workers
from tokenfactory.plant_models.fluid import FluidParams
from tokenfactory.plant_models.result import SERIES_COLUMNS, SimulationResult
from tokenfactory.core.signals import POOLS, REJECT_REASONS, AdmissionAction, Measurement, count_reversals, sort_actions
from tokenfactory.core.validation import ConfigError, check_choice, check_int, check_number

__all__ = ["PoolScenario", "PoolResponse", "simulate_pools"]

#: the former name of the pool model's result (now every plant's)
PoolResponse = SimulationResult



@dataclass(frozen=True)
class PoolScenario:
    """Demand and run control: ``demand`` is a constant rate (requests/s) or a rate series
    (``pandas.Series`` indexed by seconds, held piecewise constant); ``disturbances`` are
    :class:`tokenfactory.plant_models.fluid.DemandStep`; ``poisson`` draws arrival counts per step (seeded).
    Controllers are first sampled at ``control_start_s`` (the plant fills from empty before that,
    so a controller does not react to the empty start).

    Parameters
    ----------
    demand : float or pandas.Series
        Arrival rate (requests/s, >= 0): a constant, or a series indexed by time (s, increasing,
        non-empty; finite values >= 0) held piecewise constant from each index point (before
        the first point its value applies).
    duration_s : float
        Simulated time (s, > 0).
    dt : float
        Step (s, in [0.01, 10]; default 0.5).
    disturbances : tuple of DemandStep
        Demand steps (demand x ``factor`` from ``at_s``; build them from tables with
        :func:`tokenfactory.core.events.events_from_dicts`). Default none.
    poisson : bool
        Draw Poisson arrival counts per step (default True); False uses the deterministic fluid.
    seed : int
        Seed of the arrival generator (>= 0; default 0).
    slo_ttft_s : float
        Time-to-first-token objective of the cohort SLO estimate (s, > 0; default 2).
    slo_tpot_s : float
        Time-per-output-token objective (s, > 0; default 0.1).
    control_start_s : float
        First controller sample (s, in [0, ``duration_s``]; default 0).
    prompt_factor : float or pandas.Series
        Fill work per request relative to the plant's nominal request (in (0, 100]; a constant or a
        series validated and held like ``demand``; default 1): the fill rate per worker (requests/s)
        is divided by it. Where the roofline fill pass is compute-bound its cost is about linear in
        the prompt's tokens and this is the prompt-length ratio; at short prompts a pass's fixed
        cost (weights read) is amortised over fewer tokens, so map lengths to work through the
        service model (:func:`tokenfactory.traces.rate_workloads.mixed_workload` does).
    output_factor : float or pandas.Series
        Mean output tokens relative to the plant's ``output_tokens`` (in (0, 100]; constant or series;
        default 1): a request decodes that many more passes (completions D / (L x factor x pass)).

    Raises
    ------
    ConfigError
        For a value outside its range, a bad rate series, or a disturbance of another kind (fields
        ``scenario.*``).
    """

    demand: float | pd.Series
    duration_s: float
    dt: float = 0.5
    disturbances: tuple = ()
    poisson: bool = True
    seed: int = 0
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.1
    control_start_s: float = 0.0
    prompt_factor: float | pd.Series = 1.0
    output_factor: float | pd.Series = 1.0

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
        for f in ("prompt_factor", "output_factor"):
            v = getattr(self, f)
            if isinstance(v, pd.Series):
                if v.empty or not v.index.is_monotonic_increasing:
                    raise ConfigError(f"scenario.{f}", "a factor series needs a non-empty increasing time index")
                x = v.to_numpy(dtype=float)
                if not np.all(np.isfinite(x)) or (x <= 0).any() or (x > 100.0).any():
                    raise ConfigError(f"scenario.{f}", "factors must be finite and in (0, 100]")
            else:
                check_number(f"scenario.{f}", v, low=0.0, high=100.0, low_inclusive=False)
        events_from_dicts(self.disturbances, "scenario.disturbances", (DemandStep.kind,))

    def demand_grid(self, t: np.ndarray) -> np.ndarray:
        """Demand (requests/s) at each time of ``t`` (s), demand steps applied."""
        if isinstance(self.demand, pd.Series):
            idx = self.demand.index.to_numpy(dtype=float)
            k = np.clip(np.searchsorted(idx, t, side="right") - 1, 0, len(idx) - 1)
            lam = self.demand.to_numpy(dtype=float)[k]
        else:
            lam = np.full(len(t), float(self.demand))
        for d in self.disturbances:
            lam = np.where(t >= d.at_s, lam * d.factor, lam)
        return lam

    @property
    def constant_shape(self) -> bool:
        """True when both factors are the constant 1 (the request shape never shifts)."""
        return all(not isinstance(v, pd.Series) and float(v) == 1.0 for v in (self.prompt_factor, self.output_factor))

    def factor_grid(self, name: str, t: np.ndarray) -> np.ndarray:
        """``prompt_factor`` or ``output_factor`` at each time of ``t`` (s), held like the demand."""
        return _held(getattr(self, check_choice("factor", name, ("prompt_factor", "output_factor"))), t)


def _held(v: float | pd.Series, t: np.ndarray) -> np.ndarray:
    """A constant or a series held piecewise constant from each index point, on ``t``."""
    if isinstance(v, pd.Series):
        idx = v.index.to_numpy(dtype=float)
        k = np.clip(np.searchsorted(idx, t, side="right") - 1, 0, len(idx) - 1)
        return v.to_numpy(dtype=float)[k]
    return np.full(len(t), float(v))



#: the shared columns, then the pool model's own: the scenario's demand, rejections per second, the
#: exact content of the fill-to-ready pipeline, starting and billed workers, the cohort SLO estimate,
#: the request shape's factors and the role moves so far (cumulative; 0 in an elastic fleet).
#: The step loop writes one tuple per step in exactly this order.
_SERIES = ("time_s", "backlog", "fill_in_progress", "ready", "active_decodes", "decode_slots", "fill_capacity",
           "fill_workers", "decode_workers", "admission_rate", "arrival_rate", "admitted_rate", "completion_rate",
           "arrived", "completed", "rejected", "demand", "rejection_rate", "in_transfer", "fill_workers_starting",
           "decode_workers_starting", "fill_workers_billed", "decode_workers_billed", "ttft_estimate_s",
           "tpot_estimate_s", "in_slo", "decode_pass_s", "decode_batch_cap", "prompt_factor", "output_factor",
           "role_moves")
if set(SERIES_COLUMNS) - set(_SERIES):  # a new shared column must be written by the step loop too
    raise ImportError(f"pool model does not write the shared columns {sorted(set(SERIES_COLUMNS) - set(_SERIES))}")
_COL = {name: i for i, name in enumerate(_SERIES)}
_T, _B, _F, _R, _D, _SLOTS, _FCAP, _NF, _ND, _NFS, _NDS, _PASS, _CAP, _PF = (_COL[c] for c in (
    "time_s", "backlog", "fill_in_progress", "ready", "active_decodes", "decode_slots", "fill_capacity",
    "fill_workers", "decode_workers", "fill_workers_starting", "decode_workers_starting", "decode_pass_s",
    "decode_batch_cap", "prompt_factor"))


def simulate_pools(params: FluidParams, fill_workers: int, decode_workers: int, scenario: PoolScenario, *,
                   controllers: Sequence = (), dynamics: PoolDynamics = PoolDynamics()) -> SimulationResult:
    """Run ``controllers`` (admission controllers, pool autoscalers and decode batch gates, each
    sampled at its own ``sample_period`` with the plant's measurement delay) on the pool-level
    fluid model.

    Without an admission controller every arrival is admitted at once. A
    :class:`tokenfactory.core.signals.BatchCapAction` caps the decode batch per worker (joins stop
    above it; the batch shrinks as sequences complete). Raises
    :class:`tokenfactory.plant_models.fluid.ConservationError` if requests are lost or invented.

    Parameters
    ----------
    params : FluidParams
        Per-worker rates and delays (the same plant the admission-loop fluid model uses).
    fill_workers, decode_workers : int
        Initial serving workers of each pool (>= 1; together at most ``dynamics.fleet_size``).
    scenario : PoolScenario
        Demand, duration, step, seed, SLO objectives and control start.
    controllers : sequence
        Admission controllers, pool autoscalers and decode batch gates (each with
        ``sample_period`` >= ``dt``, ``reset()`` and ``update(t, measurement)`` returning an
        :class:`~tokenfactory.core.signals.AdmissionAction`, a
        :class:`~tokenfactory.core.signals.ScaleAction`, a
        :class:`~tokenfactory.core.signals.BatchCapAction` or a list of them); default none.
    dynamics : PoolDynamics
        How workers join and leave pools: start-up, warm-up, drain, GPUs per worker, a fixed
        fleet size (default: :class:`~tokenfactory.plant_models.fleet.PoolDynamics` defaults).

    Returns
    -------
    SimulationResult
        ``series`` per step (shared columns, then demand, rejection rate, in-transfer, starting
        and billed workers, cohort TTFT/TPOT estimates in s, decode pass time and batch cap),
        ``metrics`` (requests, completed, rejected by reason, in flight at the end, preempted, ``slo_attainment`` as a fraction,
        ``gpu_hours``, ``busy_gpu_hours``, scale actions and reversals per hour, peak and mean
        workers per pool, ...), ``config`` and the scale ``actions``.

    Raises
    ------
    ConfigError
        For worker counts below 1 or over the fleet size, a controller sampling faster than
        ``dt``, or a scale action naming an unknown pool.
    ConservationError
        If requests are lost or invented (checked every step).
    """
    check_int("plant.fill_workers", fill_workers, low=1)
    check_int("plant.decode_workers", decode_workers, low=1)
    if dynamics.fleet_size is not None and fill_workers + decode_workers > dynamics.fleet_size:
        raise ConfigError("pools.fleet_size", f"{dynamics.fleet_size} workers cannot hold the initial "
                          f"{fill_workers} fill + {decode_workers} decode")
    fleets = {"fill": PoolFleet("fill", fill_workers, dynamics), "decode": PoolFleet("decode", decode_workers, dynamics)}
    sampler = _ControllerSampler(controllers, fleets, params, scenario)
    run = _step_pools(params, scenario, dynamics, fleets, sampler)
    return _pool_result(run, params, fill_workers, decode_workers, scenario, controllers, dynamics, sampler.scale_rows)


class _ControllerSampler:
    """The run's controllers: each sampled at its own period from ``control_start_s``, seeing the plant
    ``measurement_delay_s`` old; its admission command and batch cap are held until the next sample and
    its scale actions go to the fleets (logged in ``scale_rows``)."""

    def __init__(self, controllers: Sequence, fleets: dict, p: FluidParams, scenario: PoolScenario):
        dt = scenario.dt
        for c in controllers:
            c.reset()
            if c.sample_period < dt - 1e-12:
                raise ConfigError(f"{type(c).__name__}.sample_period",
                                  f"{c.sample_period} s is shorter than the step {dt} s")
        self.controllers, self.fleets, self.p, self.dt = controllers, fleets, p, dt
        self.next_sample = [scenario.control_start_s] * len(controllers)
        #: the earliest next sample of any controller (the step loop calls :meth:`sample` from then on)
        self.next_due = min(self.next_sample, default=math.inf)
        self.delay_steps = int(round(p.measurement_delay_s / dt))
        self.nominal_ctx = math.nan if p.decode_context_tokens is None else float(p.decode_context_tokens)
        self.action = AdmissionAction(math.inf)
        self.cap = math.inf
        self.scale_rows: list[dict] = []
        #: the plant's record, written by the step loop: one tuple per step in ``_SERIES`` order, and the
        #: cumulative arrived, admitted and completed after each step behind a leading zero (a rate over
        #: any window is one subtraction; controllers sample every few steps)
        self.rows: list[tuple] = []
        self.cum: tuple[list, list, list] = ([0.0], [0.0], [0.0])

    def sample(self, t: float, k: int) -> None:
        """Sample every controller due at step ``k`` (time ``t``) and apply its actions."""
        fleets, rows, cum = self.fleets, self.rows, self.cum
        for j, c in enumerate(self.controllers):
            if t + 1e-9 < self.next_sample[j]:
                continue
            self.next_sample[j] += c.sample_period
            m = _measure(rows, cum, k, self.delay_steps, c.sample_period, self.dt, self.p, self.nominal_ctx) if k \
                else _initial_measurement(self.p, fleets, t)
            acts = sort_actions(c.update(t, m))
            if acts.admission is not None:
                self.action = acts.admission
            if acts.batch_cap is not None:
                self.cap = acts.batch_cap.batch_per_worker
            for a in acts.scales:
                if a.pool not in fleets:
                    raise ConfigError(f"{type(c).__name__}.pool", f"{a.pool!r} is not one of {POOLS}")
                before = fleets[a.pool].provisioned
                if fleets[a.pool].set_target(t, max(int(a.replicas), 0)):
                    self.scale_rows.append({"time_s": t, "kind": "scale", "pool": a.pool, "from": before,
                                            "to": fleets[a.pool].provisioned, "controller": type(c).__name__})
        self.next_due = min(self.next_sample)

    def held(self) -> tuple[float, float, str, float]:
        """The held admission rate, backlog bound and rejection reason, and the decode batch cap per worker."""
        return self.action.rate, self.action.backlog_bound, self.action.reason, self.cap


@dataclass
class _PoolRun:
    """What the step loop of :func:`simulate_pools` leaves: the series rows, the final queues and the totals."""

    rows: list[tuple]
    n: int
    in_system_end: float
    arrived: float
    admitted: float
    completed: float
    rejected_total: float
    preempted: float
    rejected: dict
    in_slo: float
    role_moves: int


def _arrival_grid(scenario: PoolScenario) -> tuple[list, ...]:
    """Per step: time, demand, arrivals (Poisson counts, seeded, or the fluid) and the request shape's factors."""
    dt = scenario.dt
    n = int(round(scenario.duration_s / dt)) + 1
    t_grid = np.arange(n) * dt
    lam = scenario.demand_grid(t_grid)
    rng = np.random.default_rng(scenario.seed)
    arrivals = rng.poisson(lam * dt).astype(float) if scenario.poisson else lam * dt
    # the request shape over the run (all 1.0 by default: x / 1.0 and x * 1.0 are exact, so the
    # default path computes exactly what it did before the factors existed)
    return (t_grid.tolist(), lam.tolist(), arrivals.tolist(), scenario.factor_grid("prompt_factor", t_grid).tolist(),
            scenario.factor_grid("output_factor", t_grid).tolist())


def _step_pools(p: FluidParams, scenario: PoolScenario, dynamics: PoolDynamics, fleets: dict,
                sampler: _ControllerSampler) -> _PoolRun:
    """The step loop (controllers, placement, admission, fill, decode, cohort SLO estimate, conservation);
    it runs ~10^5-10^6 times, so its state lives in locals."""
    dt = scenario.dt
    t_list, lam_list, arr_list, pf_list, of_list = _arrival_grid(scenario)
    transfer_steps = int(round(p.fill_to_ready_s / dt))
    pipeline: deque = deque([0.0] * transfer_steps)  # fill output on its way to the ready buffer
    in_pipe = 0.0  # sum(pipeline), kept as a running total
    rows, cum = sampler.rows, sampler.cum  # the loop writes what the controllers measure
    cum_arr, cum_adm, cum_done = (c.append for c in cum)
    B = F = R = D = 0.0
    arrived = admitted = completed = rejected_total = preempted = in_slo = 0.0
    rejected = {r: 0.0 for r in REJECT_REASONS}
    (rate, bound, reason, cap), next_due = sampler.held(), sampler.next_due
    fill_fleet, dec_fleet = fleets["fill"], fleets["decode"]
    fill_rate_w, fill_lat, ttr, L = p.fill_rate_per_worker, p.fill_latency_s, p.fill_to_ready_s, p.output_tokens
    slo_ttft, slo_tpot, slots_per_worker = scenario.slo_ttft_s, scenario.slo_tpot_s, p.decode_slots_per_worker
    step_s, rate_fn, slots_fn = p.decode_step_s, p.completion_rate, p.decode_slots
    roles, role_moves = _RoleBook(dynamics.fleet_size), 0
    isinf, inf, nan, check_tol = math.isinf, math.inf, math.nan, 1e-6
    for k in range(len(t_list)):
        t = t_list[k]
        fill_fleet.advance(t)
        dec_fleet.advance(t)
        if t + 1e-9 >= next_due:  # a controller is due: sampled with the measurement delay
            sampler.sample(t, k)
            next_due = sampler.next_due
            rate, bound, reason, cap = sampler.held()
        if fill_fleet.waiting or dec_fleet.waiting:
            roles.place(t, fleets, dynamics)
            role_moves = roles.moves
        # -- arrivals, rejection, admission
        a_in = arr_list[k]
        arrived += a_in
        B += a_in
        rej = B - bound if B > bound else 0.0
        if rej:
            B, rejected_total = B - rej, rejected_total + rej
            rejected[reason] += rej
        admit = B if isinf(rate) else min(B, rate * dt)
        B, F, admitted = B - admit, F + admit, admitted + admit
        # -- fill (the prompt factor scales the fill work per request)
        pf, of = pf_list[k], of_list[k]
        fill_cap = fill_fleet.effective(t) * fill_rate_w / pf
        served = min(F, fill_cap * dt)
        F -= served
        if transfer_steps:
            pipeline.append(served)
            r_in = pipeline.popleft()
        else:
            r_in = served
        in_pipe += served - r_in
        R += r_in
        # -- decode
        n_dec = len(dec_fleet.serving)
        slots = slots_fn(n_dec)
        speed = dec_fleet.effective(t) / n_dec if n_dec else 0.0
        if D > slots:  # pool shrank: sequences beyond the new slots migrate back with their KV
            ex = D - slots
            D, R, preempted = D - ex, R + ex, preempted + ex
        rate_d = rate_fn(D, n_dec, speed) / of  # warming workers run at their speed; L x the output factor
        done = min(D, dt * rate_d)
        D -= done
        if D <= 0.0 and R > 0.0 and n_dec:  # every sequence finished within the step
            extra = _joins_after_drain(R, done, rate_d, dt, rate_fn, slots, n_dec, speed, of)
            R, done = R - extra, done + extra
        completed += done
        # a batch cap below the KV slots stops joins (the batch shrinks as sequences complete)
        batch_slots = slots if cap >= slots_per_worker else n_dec * cap
        free_slots = batch_slots - D
        s_in = min(R, free_slots) if free_slots > 0.0 else 0.0
        R, D = R - s_in, D + s_in
        # -- what an arriving request would see (cohort SLO estimate)
        ttft = (F / fill_cap if fill_cap > 0 else inf) + fill_lat * pf  # its own pass takes the factor too
        if B > 0 and not isinf(rate):
            ttft += B / rate if rate > 0 else inf
        ready_wait = R / (done / dt) if R > 0 and done > 0 else (inf if R > 0 else 0.0)
        pass_s = step_s((D if D > 1.0 else 1.0) / (n_dec if n_dec > 1 else 1)) / speed if speed > 0 else inf
        tpot = pass_s + ready_wait / (L * of)
        ok = (a_in - rej) if (ttft <= slo_ttft and tpot <= slo_tpot) else 0.0
        if ok > 0.0:
            in_slo += ok
        # requests in fill or in transfer, as a scrape would count them: the queue plus Little's law
        # for the pipeline (exact whatever dt; the delay line itself rounds to whole steps)
        rows.append((t, B, F + served / dt * ttr, R, D, batch_slots, fill_cap, len(fill_fleet.serving), n_dec,
                     rate, a_in / dt, admit / dt, done / dt, arrived, completed, rejected_total, lam_list[k],
                     rej / dt, in_pipe, fill_fleet.in_transit, dec_fleet.in_transit, fill_fleet.billed,
                     dec_fleet.billed, ttft, tpot, ok, pass_s if D > 0.0 else nan, cap, pf, of, role_moves))
        cum_arr(arrived)
        cum_adm(admitted)
        cum_done(completed)
        # conservation, every step (the delay line itself, not the running total: an independent check)
        in_system = B + F + (sum(pipeline) if transfer_steps else 0.0) + R + D
        resid = arrived - (completed + rejected_total + in_system)
        if abs(resid) > check_tol * (arrived if arrived > 1.0 else 1.0):
            raise ConservationError(f"pool model lost requests at t={t:.1f} s: residual {resid:.3g}")
    return _PoolRun(rows, len(t_list), B + F + in_pipe + R + D, arrived, admitted, completed, rejected_total,
                    preempted, rejected, in_slo, role_moves)


def _pool_result(run: _PoolRun, p: FluidParams, fill_workers: int, decode_workers: int, scenario: PoolScenario,
                 controllers: Sequence, dynamics: PoolDynamics, scale_rows: list[dict]) -> SimulationResult:
    """The series, metrics (counts, SLO attainment, GPU hours, scale actions, role moves, workers) and config."""
    dt, n, rows, rejected, role_moves = scenario.dt, run.n, run.rows, run.rejected, run.role_moves
    counts = {"arrived": run.arrived, "admitted": run.admitted, "completed": run.completed,
              "rejected": run.rejected_total, "preempted": run.preempted}
    S = {name: col for name, col in zip(_SERIES, np.array(rows, dtype=float).T)} if rows else \
        {name: np.zeros(0) for name in _SERIES}
    series = pd.DataFrame(S)
    billed = series["fill_workers_billed"] + series["decode_workers_billed"]
    hours = scenario.duration_s / 3600.0
    # per-pool GPUs (a fixed fleet needs one number, PoolDynamics): each pool's billed worker-hours x its GPUs
    busy_gpu_h = sum(float(series[f"{pool}_workers_billed"].sum() * dt / 3600.0 * dynamics.gpus(pool))
                     for pool in POOLS) if not dynamics.uniform_gpus else math.nan
    metrics = {
        "requests": float(counts["arrived"]), "completed": float(counts["completed"]),
        "rejected": float(sum(rejected.values())), "rejected_by_reason": {k: float(v) for k, v in rejected.items()},
        "in_flight_end": float(run.in_system_end), "preempted": float(counts["preempted"]),
        "slo_attainment": float(run.in_slo / counts["arrived"]) if counts["arrived"] > 0 else 1.0,
        "gpu_hours": float((billed.sum() * dt if dynamics.fleet_size is None else dynamics.fleet_size * n * dt)
                           / 3600.0 * dynamics.gpus_per_worker) if dynamics.uniform_gpus else busy_gpu_h,
        "busy_gpu_hours": float(billed.sum() * dt / 3600.0 * dynamics.gpus_per_worker) if dynamics.uniform_gpus
        else busy_gpu_h,
        "scale_actions": len(scale_rows), "actions_per_hour": float(len(scale_rows) / hours),
        "reversals_per_hour": float(count_reversals(scale_rows) / hours),
        "role_moves": int(role_moves), "role_moves_per_hour": float(role_moves / hours),
        "peak_workers": {pool: int(series[f"{pool}_workers_billed"].max()) for pool in POOLS},
        "mean_workers": {pool: float(series[f"{pool}_workers_billed"].mean()) for pool in POOLS},
        "ttft_estimate_p99_s": float(np.nanpercentile(np.minimum(series["ttft_estimate_s"], 1e6), 99)),
    }
    demand_desc = scenario.demand if not isinstance(scenario.demand, pd.Series) else \
        f"rate series ({len(scenario.demand)} points)"
    shape_desc = {f: (v if not isinstance(v, pd.Series) else f"factor series ({len(v)} points)")
                  for f in ("prompt_factor", "output_factor") for v in (getattr(scenario, f),)}
    config = {"params": {k: v for k, v in dataclasses.asdict(p).items() if k != "provenance"},
              "fill_workers": fill_workers, "decode_workers": decode_workers,
              "dynamics": dataclasses.asdict(dynamics),
              "scenario": {**{f.name: getattr(scenario, f.name) for f in dataclasses.fields(scenario)},
                           "demand": demand_desc, **shape_desc,
                           "disturbances": [dataclasses.asdict(d) for d in scenario.disturbances]},
              "controllers": [{"name": type(c).__name__, **(c.params() if hasattr(c, "params") else {})}
                              for c in controllers]}
    metrics["duration_s"] = scenario.duration_s
    return SimulationResult(series=series, records=None, metrics=metrics, config=config,
                            actions=pd.DataFrame(scale_rows, columns=["time_s", "kind", "pool", "from", "to",
                                                                      "controller"]))


def _joins_after_drain(R: float, done: float, rate_d: float, dt: float, rate_fn, slots: float, n_dec: int,
                       speed: float, of: float) -> float:
    """Ready requests that join in the step after every decoding sequence finished within it (a decode
    shorter than the step): the freed slots take them for the rest of the step."""
    left = dt - (done / rate_d if rate_d > 0.0 else 0.0)
    return min(R, left * rate_fn(R if R < slots else slots, n_dec, speed) / of)


class _RoleBook:
    """Where a fixed fleet places waiting workers: its idle workers by the role they last held (placing
    one in the other role is a role move) and the role moves so far. An elastic fleet
    (``fleet_size`` None) starts every waiting worker at once and moves none."""

    def __init__(self, fleet_size: int | None):
        self.fleet_size = fleet_size
        self.idle = {"fill": 0, "decode": 0}
        self.released_seen = {"fill": 0, "decode": 0}
        self.moves = 0

    def place(self, t: float, fleets: dict, dynamics: PoolDynamics) -> None:
        """Start the waiting workers of both pools that the fleet has room for at ``t``."""
        fill_fleet, dec_fleet = fleets["fill"], fleets["decode"]
        fixed_fleet = self.fleet_size is not None
        free = free_workers(dynamics, fill_fleet.billed + dec_fleet.billed) if fixed_fleet else math.inf
        placed_f = fill_fleet.place(t, free)
        placed_d = dec_fleet.place(t, free - placed_f)
        if fixed_fleet:
            self.moves += _assign_roles(fleets, self.idle, self.released_seen, self.fleet_size, placed_f, placed_d)


def _assign_roles(fleets: dict, idle: dict, released_seen: dict, fleet_size: int, placed_f: int,
                  placed_d: int) -> int:
    """Book the workers just placed against a fixed fleet's idle workers and return the role moves:
    a worker released by one pool (cancelled or drained) and placed in the other. Placement takes a
    worker that last held the same role first, then one that never held a role, then one of the
    other role (workers are fungible; the order counts the fewest moves the placement implies)."""
    for pool, fl in fleets.items():  # releases since the last placement (cumulative counters)
        idle[pool] += fl.released - released_seen[pool]
        released_seen[pool] = fl.released
    billed = sum(fl.billed for fl in fleets.values()) - placed_f - placed_d
    unassigned = max(fleet_size - billed - idle["fill"] - idle["decode"], 0)
    moves = 0
    for pool, other, n in (("fill", "decode", placed_f), ("decode", "fill", placed_d)):
        a = min(n, idle[pool])
        idle[pool] -= a
        b = min(n - a, unassigned)
        unassigned -= b
        c = min(n - a - b, idle[other])
        idle[other] -= c
        moves += c
    return moves


def _initial_measurement(p: FluidParams, fleets, t: float) -> Measurement:
    nf, nd = len(fleets["fill"].serving), len(fleets["decode"].serving)
    return Measurement(time_s=t, backlog=0.0, fill_in_progress=0.0, ready=0.0, active_decodes=0.0,
                       completion_rate=0.0, admitted_rate=0.0, decode_slots=p.decode_slots(nd),
                       fill_capacity=nf * p.fill_rate_per_worker, fill_workers=nf, decode_workers=nd,
                       fill_workers_starting=fleets["fill"].in_transit,
                       decode_workers_starting=fleets["decode"].in_transit, arrival_rate=0.0)


def _measure(rows: list[tuple], cum: tuple[list, list, list], k: int, delay_steps: int, period: float,
             dt: float, p: FluidParams, context_tokens: float) -> Measurement:
    """The sample ``delay_steps`` old; rates averaged over the controller's sample period (what a
    scrape of counters gives), from the cumulative counters."""
    j = max(k - 1 - delay_steps, 0)
    lo = max(0, j - max(1, int(round(period / dt))) + 1)
    span = (j - lo + 1) * dt
    r = rows[j]
    arr, adm, done = cum  # index i + 1 holds the total after step i
    return Measurement(
        time_s=r[_T], backlog=r[_B], fill_in_progress=r[_F], ready=r[_R], active_decodes=r[_D],
        completion_rate=(done[j + 1] - done[lo]) / span, admitted_rate=(adm[j + 1] - adm[lo]) / span,
        decode_slots=float(r[_SLOTS]), fill_capacity=r[_FCAP], fill_workers=float(r[_NF]),
        decode_workers=float(r[_ND]), fill_workers_starting=float(r[_NFS]), decode_workers_starting=float(r[_NDS]),
        arrival_rate=(arr[j + 1] - arr[lo]) / span,
        fill_queued_tokens=r[_F] * p.prompt_tokens * r[_PF] if p.prompt_tokens > 0 else math.nan,
        fill_token_capacity=r[_FCAP] * p.prompt_tokens * r[_PF] if p.prompt_tokens > 0 else math.nan,
        decode_pass_s=r[_PASS], decode_context_tokens=context_tokens, decode_batch_cap=r[_CAP])