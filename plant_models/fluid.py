"""The fluid model of the token factory: a python-control ``NonlinearIOSystem`` plus exact delays.

States (requests): admission ``backlog`` Q, ``fill_in_progress`` W (admitted, not yet KV-ready),
``ready`` buffer R, ``active_decodes`` D, and cumulative counters (arrived, admitted, completed,
rejected, requeued) that make the conservation law checkable::

    arrived = completed + rejected + Q + W + R + D

Flows (requests/s), with ``f(t, x, u, params)`` as in python-control:

* admission  a = min(command, fill capacity, Q / admit_tau)          (backlog -> fill)
* rejection  max(Q - bound, 0) / shed_tau, reason "backlog_over_bound" (shedding)
* KV ready   a(t - theta), theta = fill latency + KV transfer time    (fill -> ready; exact delay)
* dispatch   s = max(0, min(R / dispatch_s, completions + (slots_cap - D) / dispatch_s))   (ready -> decode;
  slots_cap = decode workers x min(slots per worker, batch cap): a lower batch cap stops joins and
  the batch shrinks as sequences complete)
* completion c = rate_factor * D / (output_tokens * (t0 + t1 * D / n_decode))  (roofline pass time)
* eviction   max(D - slots, 0) / evict_tau back to the backlog when decode workers are lost
  (their KV is gone with the worker and must be rebuilt by a new fill; the KV slots, not the cap).

The fill-to-ready delay is not a state of the ``NonlinearIOSystem``: its delayed output enters as
the input ``ready_inflow``, and :func:`simulate_loop` feeds it from a :class:`DelayLine`, so pure
delays are exact in simulation. Linear analysis (``ready_buffer_tf``) returns the delay-free
transfer function and the delay separately; Pade approximations are made only there.
"""

from __future__ import annotations

import dataclasses
import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import control
import numpy as np
import pandas as pd

from tokenfactory.core.events import DecodeRateDip, DecodeWorkersLost, DemandStep, events_from_dicts
from tokenfactory.plant_models.delay import DelayLine
from tokenfactory.plant_models.result import SERIES_COLUMNS, SimulationResult
from tokenfactory.plant_models.roofline import Worker
from tokenfactory.plant_models.service import DEFAULT_KV_SETUP_S, DEFAULT_KV_STRIPES, KVLink, RequestShape, ServiceModel
from tokenfactory.core.signals import AdmissionAction, Measurement, sort_actions
from tokenfactory.core.errors import ConservationError
from tokenfactory.core.validation import REQUIRED, ConfigError, check_fields, check_number, reject_unknown_keys, setting

__all__ = [
    "LOOP_SIMULATION_SCHEMA",
    "FluidParams",
    "FluidPlant",
    "LoopScenario",
    "LoopResponse",
    "ConservationError",
    "simulate_loop",
    "STATES",
    "INPUTS",
    "OUTPUTS",
]

STATES = ("backlog", "fill_in_progress", "ready", "active_decodes", "arrived", "admitted", "completed", "rejected",
          "requeued")
INPUTS = ("demand", "admission_command", "backlog_bound", "ready_inflow", "fill_workers",
          "decode_workers", "decode_rate_factor", "decode_batch_cap")
OUTPUTS = ("backlog", "fill_in_progress", "ready", "active_decodes", "admitted_rate", "completion_rate",
           "dispatch_rate", "rejection_rate", "decode_slots", "fill_capacity", "decode_utilization", "decode_pass_s")


@dataclass(frozen=True)
class FluidParams:
    """Per-worker rates and the loop's delays (SI units, requests). Build with :meth:`from_workers`.

    :meth:`from_service` samples every figure from the roofline service model (nothing typed by
    hand) and records where they came from in ``provenance``.

    Parameters
    ----------
    fill_rate_per_worker : float
        Prefill throughput of one fill worker at the request shape (requests/s, > 0).
    fill_latency_s : float
        Time of one fill pass, admission to KV written on the fill worker (s, >= 0).
    kv_transfer_s : float
        Time to move one request's KV blob from fill to decode (s, >= 0).
    decode_slots_per_worker : float
        Sequences one decode worker holds at once at the request's mean active context (> 0).
    decode_step_batches : tuple of float
        Batch sizes per decode worker (sequences, strictly increasing, at least one) at which the
        decode pass time is tabulated.
    decode_step_times_s : tuple of float
        Decode pass time (s, > 0; the time per output token, TPOT) at each of
        ``decode_step_batches``; interpolated linearly in between, clamped at the ends.
    output_tokens : float
        Mean output tokens per request (tokens, > 0); a request decodes for
        ``output_tokens`` passes.
    dispatch_s : float
        Time constant of moving a ready request into a free decode slot (s, > 0; from the
        service model: one decode pass at full batch).
    measurement_delay_s : float
        Age of the orchestrator's measurement when a controller reads it (s, >= 0).
    admit_tau_s : float
        Time constant with which a backlog drains into fill when admission allows (s, > 0;
        default 0.05).
    shed_tau_s : float
        Time constant of shedding backlog above the controller's bound (s, > 0; default 0.5).
    evict_tau_s : float
        Time constant of evicting decodes over the slots when decode workers are lost (s, > 0;
        default 0.1).
    prompt_tokens : float
        New prompt tokens of the nominal request (>= 0; default 0: unknown): converts queued
        requests to queued prompt tokens in the plants' measurements (0 leaves them NaN).
    decode_context_tokens : float, optional
        The mean context an active decode holds at the shape (tokens, > 0): the context the
        pass-time table is taken at, which the plants report to a batch gate. ``None``: unknown.
        Compared (two plants at different contexts are different plants).
    provenance : mapping
        Where the figures came from (models, hardware, shape, link); not compared and read by
        nothing but reports.

    Raises
    ------
    ConfigError
        For a value outside its range, or batches not increasing or not matching the pass times
        (fields ``plant.*``).
    """

    fill_rate_per_worker: float
    fill_latency_s: float
    kv_transfer_s: float
    decode_slots_per_worker: float
    decode_step_batches: tuple[float, ...]
    decode_step_times_s: tuple[float, ...]
    output_tokens: float
    dispatch_s: float
    measurement_delay_s: float
    admit_tau_s: float = 0.05
    shed_tau_s: float = 0.5
    evict_tau_s: float = 0.1
    prompt_tokens: float = 0.0
    decode_context_tokens: float | None = None
    provenance: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for f in ("fill_rate_per_worker", "decode_slots_per_worker", "output_tokens",
                  "dispatch_s", "admit_tau_s", "shed_tau_s", "evict_tau_s"):
            check_number(f"plant.{f}", getattr(self, f), low=0.0, low_inclusive=False)
        for f in ("fill_latency_s", "kv_transfer_s", "measurement_delay_s", "prompt_tokens"):
            check_number(f"plant.{f}", getattr(self, f), low=0.0)
        if self.decode_context_tokens is not None:
            check_number("plant.decode_context_tokens", self.decode_context_tokens, low=0.0, low_inclusive=False)
        b, ts = tuple(map(float, self.decode_step_batches)), tuple(map(float, self.decode_step_times_s))
        if len(b) < 1 or len(b) != len(ts) or any(x >= y for x, y in zip(b, b[1:])):
            raise ConfigError("plant.decode_step_batches", "needs increasing batch sizes, one pass time each")
        for i, v in enumerate(ts):
            check_number(f"plant.decode_step_times_s[{i}]", v, low=0.0, low_inclusive=False)
        object.__setattr__(self, "decode_step_batches", b)
        object.__setattr__(self, "decode_step_times_s", ts)

    @property
    def fill_to_ready_s(self) -> float:
        """Admission to KV ready: fill latency + KV blob transfer (the loop's plant delay)."""
        return self.fill_latency_s + self.kv_transfer_s

    def decode_step_s(self, batch_per_worker: float) -> float:
        """Decode pass time (TPOT) at a batch, interpolated in the roofline table (clamped at its ends,
        as ``numpy.interp``; scalars take a pure-Python path - the pool model calls this twice a step)."""
        if not isinstance(batch_per_worker, (float, int)):
            return float(np.interp(batch_per_worker, self.decode_step_batches, self.decode_step_times_s))
        xs, ys = self.decode_step_batches, self.decode_step_times_s
        if batch_per_worker <= xs[0]:
            return ys[0]
        if batch_per_worker >= xs[-1]:
            return ys[-1]
        i = bisect_right(xs, batch_per_worker)
        x0, y0 = xs[i - 1], ys[i - 1]
        return y0 + (ys[i] - y0) * (batch_per_worker - x0) / (xs[i] - x0)

    def decode_slots(self, decode_workers: float) -> float:
        return decode_workers * self.decode_slots_per_worker

    def completion_rate(self, decoding: float, decode_workers: float, rate_factor: float = 1.0) -> float:
        if decode_workers <= 0 or decoding <= 0:
            return 0.0
        return rate_factor * decoding / (self.output_tokens * self.decode_step_s(decoding / decode_workers))

    def decode_capacity(self, decode_workers: float, rate_factor: float = 1.0) -> float:
        """Completions/s with every slot busy."""
        return self.completion_rate(self.decode_slots(decode_workers), decode_workers, rate_factor)

    def mean_decode_s(self, decode_workers: float = 1.0) -> float:
        """Decode duration of one request at full batch."""
        return self.output_tokens * self.decode_step_s(self.decode_slots_per_worker)

    def model_inputs(self) -> "FluidParams":
        """These params without ``provenance``: exactly what the plants read and what equality and
        the hash compare. A cache keyed by params computes on this copy, so its result cannot
        depend on a field its key does not hold."""
        return dataclasses.replace(self, provenance={}) if self.provenance else self

    def scaled(self, *, delay_factor: float = 1.0, service_rate_factor: float = 1.0) -> "FluidParams":
        """A perturbed plant: fill-to-ready and measurement delays x ``delay_factor``; fill and
        decode service rates x ``service_rate_factor`` (fill latency scales inversely)."""
        check_number("delay_factor", delay_factor, low=0.0, low_inclusive=False)
        check_number("service_rate_factor", service_rate_factor, low=0.0, low_inclusive=False)
        return dataclasses.replace(
            self,
            fill_rate_per_worker=self.fill_rate_per_worker * service_rate_factor,
            fill_latency_s=self.fill_latency_s * delay_factor / service_rate_factor,
            kv_transfer_s=self.kv_transfer_s * delay_factor,
            measurement_delay_s=self.measurement_delay_s * delay_factor,
            decode_step_times_s=tuple(t / service_rate_factor for t in self.decode_step_times_s),
        )

    @classmethod
    def from_service(cls, service: ServiceModel, *, measurement_delay_s: float = 0.5, **kw) -> "FluidParams":
        """Sample the plant from the service model (nothing typed by hand).

        Fill: the nominal fill pass (one prompt per attention replica) - its time is the fill
        latency, its throughput the fill rate. KV transfer: the nominal blob over the KV link.
        Decode: slots at the mean context an active decode holds; pass time tabulated over 16
        batches up to the slots at that context (interpolated in between, exact at full batch).
        """
        s = service
        slots = s.decode_slots
        ctx = s.decode_context_tokens
        batches = np.unique(np.geomspace(1, slots, 16).round().astype(int))
        times = tuple(s.decode_pass_s(int(b), ctx) for b in batches)
        dispatch = times[-1]  # a ready request joins the batch at the next decode pass
        prov = {"fill_model": s.fill_worker.model.name, "fill_hardware": s.fill_worker.accelerator.name,
                "decode_model": s.decode_worker.model.name, "decode_hardware": s.decode_worker.accelerator.name,
                "shape": dataclasses.asdict(s.shape), "link": dataclasses.asdict(s.link),
                "kv_blob_bytes": s.kv_blob_bytes, "decode_context_tokens": ctx}
        return cls(fill_rate_per_worker=s.fill_rate_rps, fill_latency_s=s.fill_latency_s,
                   prompt_tokens=float(s.shape.prompt_tokens), decode_context_tokens=float(ctx),
                   kv_transfer_s=s.kv_transfer_s(s.kv_blob_bytes), decode_slots_per_worker=float(slots),
                   decode_step_batches=tuple(map(float, batches)), decode_step_times_s=times,
                   output_tokens=float(s.shape.output_tokens), dispatch_s=float(dispatch),
                   measurement_delay_s=measurement_delay_s, provenance=prov, **kw)

    @classmethod
    def from_workers(cls, fill_worker: Worker, decode_worker: Worker, shape: RequestShape = RequestShape(),
                     *, measurement_delay_s: float = 0.5, kv_stripes: int = DEFAULT_KV_STRIPES,
                     kv_setup_s: float = DEFAULT_KV_SETUP_S, **kw) -> "FluidParams":
        """:meth:`from_service` of ``ServiceModel(fill_worker, decode_worker, shape, KVLink(kv_stripes,
        kv_setup_s))``."""
        return cls.from_service(ServiceModel(fill_worker, decode_worker, shape, KVLink(kv_stripes, kv_setup_s)),
                                measurement_delay_s=measurement_delay_s, **kw)


def _flows(x, u, p: FluidParams):
    """The plant's flows (requests/s) and pool figures at state x, input u."""
    q, r, d = x[0], x[2], x[3]
    lam, cmd, bound, r_in, nf, nd, rf, cap = u
    fill_cap = nf * p.fill_rate_per_worker
    a = max(0.0, min(cmd, fill_cap, q / p.admit_tau_s))
    shed = max(q - bound, 0.0) / p.shed_tau_s
    slots = nd * p.decode_slots_per_worker
    batch_slots = nd * min(p.decode_slots_per_worker, cap)
    c = p.completion_rate(d, nd, rf)
    evict = max(d - slots, 0.0) / p.evict_tau_s
    s = max(0.0, min(r / p.dispatch_s, c + (batch_slots - d) / p.dispatch_s))
    return lam, r_in, a, shed, c, evict, s, batch_slots, fill_cap


def _dynamics(t, x, u, params: FluidParams):
    lam, r_in, a, shed, c, evict, s, _, _ = _flows(x, u, params)
    return np.array([lam - a - shed + evict, a - r_in, r_in - s, s - c - evict,
                     lam, a, c, shed, evict])


def _outputs(t, x, u, params: FluidParams):
    _, _, a, shed, c, _, s, slots, fill_cap = _flows(x, u, params)
    d, nd, rf = x[3], u[5], u[6]
    pass_s = params.decode_step_s(d / nd) / rf if d > 0 and nd > 0 and rf > 0 else math.nan
    return np.array([x[0], x[1], x[2], d, a, c, s, shed, slots, fill_cap, d / slots if slots > 0 else 0.0, pass_s])


class FluidPlant:
    """The fluid token factory with its pools: ``system`` is the python-control NonlinearIOSystem.

    States, inputs and outputs are :data:`STATES`, :data:`INPUTS` and :data:`OUTPUTS` (flows in
    the module docstring). :func:`simulate_loop` closes an admission loop around it; the
    linearisation (:meth:`ready_buffer_tf`) feeds the stability analysis.

    Parameters
    ----------
    params : FluidParams
        Per-worker rates and the loop's delays.
    fill_workers : float
        Serving fill (prefill) workers (> 0; may be fractional in the fluid model).
    decode_workers : float
        Serving decode workers (> 0; may be fractional).

    Raises
    ------
    ConfigError
        For a non-positive worker count (fields ``plant.fill_workers``, ``plant.decode_workers``).
    """

    def __init__(self, params: FluidParams, fill_workers: float, decode_workers: float):
        self.params = params
        self.fill_workers = check_number("plant.fill_workers", fill_workers, low=0.0, low_inclusive=False)
        self.decode_workers = check_number("plant.decode_workers", decode_workers, low=0.0,
                                           low_inclusive=False)
        self.system = control.NonlinearIOSystem(
            _dynamics, _outputs, params={"params": params}, inputs=list(INPUTS),
            outputs=list(OUTPUTS), states=list(STATES), name="token_factory")

    # python-control passes params as a dict; unwrap so f(t, x, u, params) sees FluidParams.
    @staticmethod
    def dynamics(t, x, u, params: FluidParams):
        return _dynamics(t, x, u, params)

    @staticmethod
    def outputs(t, x, u, params: FluidParams):
        return _outputs(t, x, u, params)

    @property
    def decode_capacity(self) -> float:
        return self.params.decode_capacity(self.decode_workers)

    @property
    def fill_capacity(self) -> float:
        return self.fill_workers * self.params.fill_rate_per_worker

    def operating_point(self, ready: float, demand: float | None = None):
        """Regulated equilibrium: decode slots full, ``ready`` requests buffered, admission =
        completions = ``demand`` (default: decode capacity). Returns (x_eq, u_eq)."""
        p = self.params
        c = self.decode_capacity if demand is None else demand
        slots = p.decode_slots(self.decode_workers)
        x = np.array([2.0 * c * p.admit_tau_s, c * p.fill_to_ready_s, ready, slots, 0, 0, 0, 0, 0])
        u = np.array([c, c, math.inf, c, self.fill_workers, self.decode_workers, 1.0, math.inf])
        return x, u

    def initial_state(self, ready: float, backlog: float = 0.0) -> np.ndarray:
        """A loaded factory: decode slots full, ``ready`` buffered, fill pipeline at decode capacity,
        ``backlog`` waiting; cumulative counters consistent (arrived = everything in the system)."""
        x, _ = self.operating_point(ready)
        x[0] = backlog
        x[STATES.index("arrived")] = x[0] + x[1] + x[2] + x[3]
        return x

    def linearize(self, ready: float, demand: float | None = None) -> control.StateSpace:
        """python-control ``linearize`` of the delay-free system at :meth:`operating_point`."""
        x, u = self.operating_point(ready, demand)
        u = u.copy()
        u[2] = 1e12  # a finite stand-in for "no backlog bound" (finite differences need finite inputs)
        u[7] = 1e12  # and for "no batch cap"
        wrapped = control.NonlinearIOSystem(
            lambda t, x, u, params: _dynamics(t, x, u, self.params),
            lambda t, x, u, params: _outputs(t, x, u, self.params),
            inputs=list(INPUTS), outputs=list(OUTPUTS), states=list(STATES))
        return control.linearize(wrapped, x, u)

    def ready_buffer_tf(self, ready: float | None = None) -> tuple[control.TransferFunction, float]:
        """Delay-free transfer function from KV-ready inflow to the ready buffer at the regulated
        operating point, and the fill-to-ready delay theta. With decode slots full the ready buffer
        is an integrator: R(s)/A(s) = e^{-theta s} / s."""
        if ready is None:
            ready = self.decode_capacity * self.params.dispatch_s * 20.0
        lin = self.linearize(ready)
        i, o = INPUTS.index("ready_inflow"), OUTPUTS.index("ready")
        sub = control.ss(lin.A, lin.B[:, [i]], lin.C[[o], :], lin.D[[o], [i]])
        tf = control.minreal(control.ss2tf(sub), tol=1e-7, verbose=False)
        return tf, self.params.fill_to_ready_s


# --------------------------------------------------------------------------------------------
# Scenarios and the closed-loop simulator


#: the disturbances the admission-loop plant accepts (:mod:`tokenfactory.core.events`)
DISTURBANCE_KINDS = (DemandStep.kind, DecodeRateDip.kind, DecodeWorkersLost.kind)


@dataclass(frozen=True)
class LoopScenario:
    """What happens to the plant: demand (requests/s) with optional seeded noise and disturbances.

    Parameters
    ----------
    demand : float
        Base arrival rate (requests/s, >= 0).
    duration_s : float
        Simulated time (s, > 0; default 300).
    dt : float
        Integration step (s, in [1e-5, 1]; default 0.01); also the grid of the delay lines.
    disturbances : tuple of events
        :class:`~tokenfactory.core.events.DemandStep` (demand x ``factor`` from ``at_s``),
        :class:`~tokenfactory.core.events.DecodeRateDip` (decode rate x ``factor`` for ``duration_s``
        from ``start_s``) and :class:`~tokenfactory.core.events.DecodeWorkersLost` (``fraction`` of the
        decode workers gone from ``at_s``); dicts with a ``kind`` are accepted by
        :meth:`from_dict`. Default none.
    demand_noise_cv : float
        Coefficient of variation of multiplicative Gaussian demand noise, in [0, 5] (default 0:
        none); the rate is clipped at 0.
    noise_interval_s : float
        How long each noise draw holds (s, >= ``dt``; default 1).
    seed : int
        Seed of the noise generator (>= 0; default 0).

    Raises
    ------
    ConfigError
        For a value outside its range or a disturbance of another kind (fields ``scenario.*``).
    """

    demand: float = setting(REQUIRED, unit="requests/s", low=0.0, meaning="arrival rate (a file gives "
                                                                          "demand_factor instead)")
    duration_s: float = setting(300.0, unit="s", low=0.0, low_inclusive=False, meaning="simulated time")
    dt: float = setting(0.01, unit="s", low=1e-5, high=1.0, meaning="integration step, also the grid of the delay "
                                                                     "lines")
    disturbances: tuple = setting((), kind="list of tables",
                                  meaning="events, each a table with a kind: demand_step, decode_rate_dip, "
                                          "decode_workers_lost ([[simulation.disturbances]])")
    demand_noise_cv: float = setting(0.0, low=0.0, high=5.0,
                                     meaning="coefficient of variation of multiplicative Gaussian demand noise")
    noise_interval_s: float = setting(1.0, unit="s", meaning="how long each noise draw holds (at least dt)")
    seed: int = setting(0, kind=int, low=0, meaning="seed of the noise generator")

    def __post_init__(self) -> None:
        check_fields(self, "scenario", names=("demand", "duration_s", "dt", "demand_noise_cv", "noise_interval_s",
                                              "seed"), bounds={"noise_interval_s": {"low": self.dt}}, hold=False)
        events_from_dicts(self.disturbances, "scenario.disturbances", DISTURBANCE_KINDS)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, demand: float, where: str = "scenario") -> "LoopScenario":
        """``demand`` is resolved by the caller (absolute rate); disturbances are tables with a
        ``kind`` among demand_step, decode_rate_dip, decode_workers_lost."""
        d = dict(d)
        reject_unknown_keys(where, d, LOOP_SIMULATION_SCHEMA)
        d.pop("demand_factor", None)
        dist = events_from_dicts(d.pop("disturbances", []), f"{where}.disturbances", DISTURBANCE_KINDS)
        return cls(demand=demand, disturbances=dist, **d)

    def demand_at(self, t: float, noise: np.ndarray) -> float:
        """Arrival rate at time ``t`` (requests/s): demand steps applied, times the noise draw
        (standard normal samples, one per ``noise_interval_s``) scaled by ``demand_noise_cv``."""
        lam = self.demand
        for d in self.disturbances:
            if isinstance(d, DemandStep) and t >= d.at_s:
                lam *= d.factor
        if self.demand_noise_cv > 0:
            lam *= max(0.0, 1.0 + self.demand_noise_cv * noise[min(int(t / self.noise_interval_s), len(noise) - 1)])
        return lam

    def decode_rate_factor(self, t: float) -> float:
        """Product of the decode-rate dips active at ``t`` (1 = nominal)."""
        f = 1.0
        for d in self.disturbances:
            if isinstance(d, DecodeRateDip) and d.start_s <= t < d.start_s + d.duration_s:
                f *= d.factor
        return f

    def decode_worker_factor(self, t: float) -> float:
        """Fraction of the decode workers still serving at ``t`` after worker losses."""
        f = 1.0
        for d in self.disturbances:
            if isinstance(d, DecodeWorkersLost) and t >= d.at_s:
                f *= 1.0 - d.fraction
        return f


#: the former name of the fluid plant's result (now every plant's)
LoopResponse = SimulationResult


def simulate_loop(plant: FluidPlant, controller, scenario: LoopScenario, *,
                  x0: Sequence[float] | None = None, conservation_rtol: float = 1e-6) -> SimulationResult:
    """Simulate ``controller`` closing the admission loop around ``plant`` under ``scenario``.

    Fixed-step explicit integration on a grid of ``scenario.dt``; the fill-to-ready delay and the
    measurement delay are exact delay lines on that grid. Each controller is sampled every
    ``sample_period`` seconds, sees a :class:`Measurement` ``measurement_delay_s`` old, and its
    action is held until the next sample (zero-order hold): an admission command, or a decode
    batch cap (:class:`tokenfactory.core.signals.BatchCapAction`, per worker; joins stop above it and
    the batch shrinks as sequences complete). Raises :class:`ConservationError` if requests are
    lost or invented.

    Parameters
    ----------
    plant : FluidPlant
        The plant and its pools.
    controller : Controller or sequence of Controller
        Sampled controllers, each with ``sample_period`` (s, >= ``scenario.dt``), ``reset()`` and
        ``update(t, measurement)`` returning an :class:`~tokenfactory.core.signals.AdmissionAction`, a
        :class:`~tokenfactory.core.signals.BatchCapAction`, a list of them or a bare admission rate
        (requests/s), e.g. an admission controller and a batch gate (actions sorted by type,
        :func:`tokenfactory.core.signals.sort_actions`); reset before the run.
    scenario : LoopScenario
        Demand, duration, step, noise and disturbances.
    x0 : sequence of float, optional
        Initial state, one value per :data:`STATES` entry (requests; e.g.
        :meth:`FluidPlant.initial_state`); ``None`` (default) starts empty.
    conservation_rtol : float
        Largest allowed |arrived - (completed + rejected + in system)|, relative to the arrivals
        (at least 1 request; default 1e-6).

    Returns
    -------
    SimulationResult
        ``series`` on the time grid (:data:`~tokenfactory.plant_models.result.SERIES_COLUMNS`
        first, then the fluid plant's flows and counters, ``decode_pass_s`` and
        ``decode_batch_cap``), ``metrics`` (requests, completed,
        rejected, in flight at the end, conservation residual, ...), ``config`` and the
        controllers' ``actions``; no per-request ``records``.

    Raises
    ------
    ConfigError
        For an ``x0`` of the wrong length or a controller sample period shorter than
        ``scenario.dt``.
    ConservationError
        If requests are lost or invented beyond ``conservation_rtol``, or a queue goes negative
        (reduce ``scenario.dt``).
    """
    controllers = list(controller) if isinstance(controller, (list, tuple)) else [controller]
    p = plant.params
    dt = scenario.dt
    n = int(round(scenario.duration_s / dt)) + 1
    t_grid = np.arange(n) * dt
    x = np.zeros(len(STATES)) if x0 is None else np.array(x0, dtype=float)
    if x.shape != (len(STATES),):
        raise ConfigError("x0", f"expected {len(STATES)} states {STATES}")
    rng = np.random.default_rng(scenario.seed)
    noise = rng.standard_normal(int(scenario.duration_s / scenario.noise_interval_s) + 2)
    sample_every = _reset_controllers(controllers, dt)
    run = _integrate_loop(plant, controllers, sample_every, scenario, t_grid, x, noise)
    return _loop_result(plant, controllers, scenario, t_grid, run, conservation_rtol)


def _reset_controllers(controllers: list, dt: float) -> list[int]:
    """Reset every controller and return its sample period in steps (a period under ``dt`` is an error)."""
    sample_every = []
    for c in controllers:
        c.reset()
        period = float(c.sample_period)
        if period < dt:
            raise ConfigError("controller.sample_period", f"{period} s is shorter than the step {dt} s")
        sample_every.append(max(1, int(round(period / dt))))
    return sample_every


@dataclass
class _LoopRun:
    """What the step loop of :func:`simulate_loop` recorded, one row per grid point."""

    outs: np.ndarray
    sts: np.ndarray
    demand: np.ndarray
    command: np.ndarray
    caps: np.ndarray
    workers: np.ndarray
    actions: list


def _integrate_loop(plant: FluidPlant, controllers: list, sample_every: list[int], scenario: LoopScenario,
                    t_grid: np.ndarray, x: np.ndarray, noise: np.ndarray) -> _LoopRun:
    """The fixed-step loop: plant outputs, the delayed measurement and controller samples, one Euler step."""
    p = plant.params
    dt = scenario.dt
    n = len(t_grid)
    theta, tau_m = p.fill_to_ready_s, p.measurement_delay_s
    admitted_line = DelayLine(dt, theta + dt, initial=0.0)
    out_lines = {k: DelayLine(dt, tau_m + dt) for k in OUTPUTS}
    action = AdmissionAction(0.0 if controllers else math.inf)
    admission_seen = False  # without an admission controller every arrival is admitted
    cap = math.inf
    nominal_ctx = math.nan if p.decode_context_tokens is None else float(p.decode_context_tokens)
    outs = np.empty((n, len(OUTPUTS)))
    sts = np.empty((n, len(STATES)))
    demand = np.empty(n)
    command = np.empty(n)
    caps = np.empty(n)
    workers = np.empty((n, 2))
    actions = []
    first = True
    for k in range(n):
        t = t_grid[k]
        lam = scenario.demand_at(t, noise)
        nd = plant.decode_workers * scenario.decode_worker_factor(t)
        rf = scenario.decode_rate_factor(t)
        # the KV-ready inflow is what was admitted theta seconds ago (exact delay)
        # (the newest sample in the line is from t - dt, hence theta - dt)
        r_in = admitted_line.read(max(theta - dt, 0.0)) if k else 0.0
        u = (lam, action.rate, action.backlog_bound, r_in, plant.fill_workers, nd, rf, cap)
        y = _outputs(t, x, u, p)
        if first:  # history before t=0 equals the initial outputs
            for j, name in enumerate(OUTPUTS):
                out_lines[name] = DelayLine(dt, tau_m + dt, initial=float(y[j]))
            first = False
        for j, name in enumerate(OUTPUTS):
            out_lines[name].push(float(y[j]))
        due = [c for c, every in zip(controllers, sample_every) if k % every == 0]
        if due:
            m = _delayed_measurement(out_lines, t, tau_m, plant, scenario, nominal_ctx, cap)
            for c in due:
                acts = sort_actions(c.update(t, m))
                if acts.admission is not None:
                    action = acts.admission
                    admission_seen = True
                    actions.append({"time_s": t, "kind": "admission", "rate": action.rate,
                                    "backlog_bound": action.backlog_bound})
                if acts.batch_cap is not None and acts.batch_cap.batch_per_worker != cap:
                    actions.append({"time_s": t, "kind": "batch_cap", "from": cap,
                                    "to": acts.batch_cap.batch_per_worker})
                    cap = acts.batch_cap.batch_per_worker
            if not admission_seen:
                action = AdmissionAction(math.inf)
            u = (lam, action.rate, action.backlog_bound, r_in, plant.fill_workers, nd, rf, cap)
            y = _outputs(t, x, u, p)
        outs[k] = y
        sts[k] = x
        demand[k] = lam
        command[k] = action.rate
        caps[k] = cap
        workers[k] = plant.fill_workers, nd
        admitted_line.push(float(y[OUTPUTS.index("admitted_rate")]))
        if k < n - 1:
            x = x + dt * _dynamics(t, x, u, p)
    return _LoopRun(outs, sts, demand, command, caps, workers, actions)


def _delayed_measurement(out_lines: dict, t: float, tau_m: float, plant: FluidPlant, scenario: LoopScenario,
                         nominal_ctx: float, cap: float) -> Measurement:
    """What a controller sampling at ``t`` sees: the plant's outputs ``tau_m`` old."""
    p = plant.params
    fip = out_lines["fill_in_progress"].read(tau_m)
    fcap = out_lines["fill_capacity"].read(tau_m)
    return Measurement(
        time_s=max(t - tau_m, 0.0),
        backlog=out_lines["backlog"].read(tau_m),
        fill_in_progress=fip,
        ready=out_lines["ready"].read(tau_m),
        active_decodes=out_lines["active_decodes"].read(tau_m),
        completion_rate=out_lines["completion_rate"].read(tau_m),
        admitted_rate=out_lines["admitted_rate"].read(tau_m),
        decode_slots=out_lines["decode_slots"].read(tau_m),
        fill_capacity=fcap,
        fill_workers=plant.fill_workers,
        decode_workers=plant.decode_workers * scenario.decode_worker_factor(max(t - tau_m, 0.0)),
        fill_queued_tokens=fip * p.prompt_tokens if p.prompt_tokens > 0 else math.nan,
        fill_token_capacity=fcap * p.prompt_tokens if p.prompt_tokens > 0 else math.nan,
        decode_pass_s=out_lines["decode_pass_s"].read(tau_m),
        decode_context_tokens=nominal_ctx,
        decode_batch_cap=cap,
    )


def _loop_result(plant: FluidPlant, controllers: list, scenario: LoopScenario, t_grid: np.ndarray, run: _LoopRun,
                 conservation_rtol: float) -> SimulationResult:
    """Check conservation over the whole run and assemble the series, metrics, config and actions."""
    p = plant.params
    outs, sts, demand, command, caps, workers, actions = (run.outs, run.sts, run.demand, run.command, run.caps,
                                                          run.workers, run.actions)
    states = {s: sts[:, i] for i, s in enumerate(STATES)}
    in_system = states["backlog"] + states["fill_in_progress"] + states["ready"] + states["active_decodes"]
    residual = states["arrived"] - (states["completed"] + states["rejected"] + in_system)
    worst = float(np.max(np.abs(residual)))
    scale = max(1.0, float(states["arrived"][-1]))
    if worst > conservation_rtol * scale:
        raise ConservationError(
            f"fluid model lost requests: max |arrived - (completed + rejected + in system)| = {worst:.3g} "
            f"of {scale:.3g} arrivals")
    if np.min(in_system) < -1e-9 * scale or min(states[s].min() for s in ("backlog", "ready", "active_decodes")) \
            < -1e-6 * scale:
        raise ConservationError("a fluid queue went negative; reduce scenario.dt")
    o = {name: outs[:, i] for i, name in enumerate(OUTPUTS)}
    series = pd.DataFrame({
        "time_s": t_grid, "backlog": o["backlog"], "fill_in_progress": o["fill_in_progress"], "ready": o["ready"],
        "active_decodes": o["active_decodes"], "decode_slots": o["decode_slots"], "fill_capacity": o["fill_capacity"],
        "fill_workers": workers[:, 0], "decode_workers": workers[:, 1], "admission_rate": command,
        "arrival_rate": demand, "admitted_rate": o["admitted_rate"], "completion_rate": o["completion_rate"],
        "arrived": states["arrived"], "completed": states["completed"], "rejected": states["rejected"],
        # the fluid plant's own: flows, utilisation and the other counters
        "dispatch_rate": o["dispatch_rate"], "rejection_rate": o["rejection_rate"],
        "decode_utilization": o["decode_utilization"], "admitted": states["admitted"],
        "requeued": states["requeued"], "decode_pass_s": o["decode_pass_s"], "decode_batch_cap": caps})
    assert tuple(series.columns[:len(SERIES_COLUMNS)]) == tuple(SERIES_COLUMNS)
    metrics = {"requests": float(states["arrived"][-1]), "completed": float(states["completed"][-1]),
               "rejected": float(states["rejected"][-1]), "in_flight_end": float(in_system[-1]),
               "requeued": float(states["requeued"][-1]), "conservation_residual": worst,
               "duration_s": float(t_grid[-1]), "controller_samples": sum(1 for a in actions if a["kind"] == "admission")}
    config = {"params": {k: v for k, v in dataclasses.asdict(p).items() if k != "provenance"},
              "fill_workers": plant.fill_workers, "decode_workers": plant.decode_workers,
              "scenario": {**{f.name: getattr(scenario, f.name) for f in dataclasses.fields(scenario)},
                           "disturbances": [{"kind": d.kind, **dataclasses.asdict(d)} for d in scenario.disturbances]},
              "controller": ", ".join(type(c).__name__ for c in controllers),
              "controller_params": [c.params() if hasattr(c, "params") else {} for c in controllers]
              if len(controllers) != 1 else (controllers[0].params() if hasattr(controllers[0], "params") else {})}
    cols = ["time_s", "kind", "rate", "backlog_bound", "from", "to"]
    return SimulationResult(series=series, records=None, metrics=metrics, config=config,
                            actions=pd.DataFrame(actions, columns=cols))


#: the keys of a margins scenario's ``[simulation]`` table (:meth:`LoopScenario.from_dict`)
LOOP_SIMULATION_SCHEMA = {
    "demand_factor": setting(1.0, low=0.0, high=10.0, meaning="the demand as a multiple of the plant's decode "
                                                              "capacity"),
    **{f.name: f for f in dataclasses.fields(LoopScenario) if f.name != "demand"},
}
