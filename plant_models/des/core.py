"""The request simulator's core: the clock, arrivals, admission, and the run.

:class:`Simulator` composes the stages (:class:`~tokenfactory.plant_models.des.fill.FillStage`,
:class:`~tokenfactory.plant_models.des.decode.DecodeStage`,
:class:`~tokenfactory.plant_models.des.fleet.FleetControl`,
:class:`~tokenfactory.plant_models.des.measure.Monitor`) around one simpy ``Environment``.
Hot paths - arrivals, admissions, fill steps, KV transfers, decode leaps - are scheduled calls
(:meth:`Simulator.call_in`: one heap entry, no generator, no exception); control loops, pool
changes and events are simpy processes. Policies are small overrides: the admission controller
object, :meth:`~tokenfactory.plant_models.des.decode.DecodeStage.can_join` (batching), the
prefix cache (:mod:`tokenfactory.plant_models.des.cache`) and the queues (``backlog``,
``fill_q``, ``ready`` are deques; any object with ``append``, ``appendleft``, ``popleft``,
``len`` and ``[0]`` can replace one in a subclass).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections import deque

import numpy as np
import pandas as pd
import simpy

from tokenfactory.errors import ConservationError
from tokenfactory.plant_models.des.aggregated import AggregatedStage, AggregatedWorker
from tokenfactory.plant_models.des.cache import PrefixCache, prefix_cache_for
from tokenfactory.plant_models.des.config import ClusterConfig
from tokenfactory.plant_models.des.decode import DecodeStage, DecodeWorker
from tokenfactory.plant_models.des.fill import FillStage, FillWorker
from tokenfactory.plant_models.des.fleet import FleetControl
from tokenfactory.plant_models.des.workers import IdleWorkers
from tokenfactory.plant_models.des.measure import Monitor
from tokenfactory.plant_models.des.params import DESParams
from tokenfactory.plant_models.des.records import RequestRecords, Stage
from tokenfactory.plant_models.des.work import WorkLedger
from tokenfactory.plant_models.result import SimulationResult
from tokenfactory.plant_models.service import mean_active_context
from tokenfactory.signals import REJECT_REASONS, AdmissionAction, count_reversals
from tokenfactory.validation import ConfigError

__all__ = ["Simulator", "OpenAdmission", "simulate"]

_NORMAL = 1  # simpy's priority of ordinary events


class _Call:
    """A scheduled call: the least simpy's event loop needs (``callbacks`` and ``_ok``)."""

    __slots__ = ("callbacks", "_ok", "_value", "fn", "args")

    def __init__(self, fn, args):
        self.callbacks = [self]
        self._ok = True
        self._value = None
        self.fn = fn
        self.args = args

    def __call__(self, _event) -> None:
        self.fn(*self.args)


class OpenAdmission:
    """No admission control: admit everything at once."""

    sample_period = 1.0

    def reset(self) -> None:
        pass

    def update(self, t, m):
        return AdmissionAction(math.inf)


class Simulator(FillStage, DecodeStage, AggregatedStage, FleetControl, Monitor):
    """One replay of a request table through the cluster.

    Parameters
    ----------
    trace : DataFrame
        Request table: ``arrival_s``, ``input_tokens``, ``output_tokens``; optional
        ``cached_tokens``, ``hash_ids``, and ``session_id``/``turn``/``think_time_s`` (closed
        agentic sessions - a turn arrives its think time after the previous one completes - when
        ``trace.attrs["per_session_clock"]`` or ``trace.attrs["closed_sessions"]``).
    params : DESParams
        Service times.
    cluster : ClusterConfig
        Pools, delays, SLOs, events, run control.
    controller : object, optional
        Admission controller (``sample_period``, ``reset()``, ``update(t, m)``); None admits all.
    autoscalers : sequence, optional
        Pool autoscalers returning :class:`tokenfactory.signals.ScaleAction`.
    prefix_cache : PrefixCache, optional
        Replaces the policy ``cluster.prefix_cache_blocks`` names.
    """

    def __init__(self, trace: pd.DataFrame, params: DESParams, cluster: ClusterConfig = ClusterConfig(),
                 controller=None, autoscalers=(), *, prefix_cache: PrefixCache | None = None):
        if not len(trace):
            raise ConfigError("trace", "the request table is empty")
        for col in ("arrival_s", "input_tokens", "output_tokens"):
            if col not in trace:
                raise ConfigError("trace", f"missing column {col!r}")
        self.p, self.cfg = params, cluster
        self.controller = controller
        self.ctrl = controller or OpenAdmission()
        self.autoscalers = list(autoscalers)
        self.env = simpy.Environment()
        self.rng = np.random.default_rng(cluster.seed)
        # -- the requests: inputs as Python lists (hot scalar reads), records as flat arrays
        n = self.n = len(trace)
        self.arrival = trace["arrival_s"].to_numpy(dtype=float)
        self.inp_arr = trace["input_tokens"].to_numpy(dtype=np.int64)
        self.out_arr = np.maximum(trace["output_tokens"].to_numpy(dtype=np.int64), 1)
        self.inp, self.out = self.inp_arr.tolist(), self.out_arr.tolist()
        self.given_cached = (trace["cached_tokens"].to_numpy(dtype=np.int64).tolist() if "cached_tokens" in trace
                             else [0] * n)
        self.hashes = trace["hash_ids"].to_numpy() if "hash_ids" in trace else None
        self.rem_tok = [0] * n     # decode tokens still to generate
        self.ctx_tok = [0] * n     # KV tokens held (prompt + generated)
        self.closed_sessions = bool(trace.attrs.get("per_session_clock") or trace.attrs.get("closed_sessions")) \
            and "session_id" in trace
        self.next_turn, self.think = [-1] * n, [0.0] * n
        self.is_first = np.ones(n, dtype=bool)
        if self.closed_sessions:
            self._link_sessions(trace)
        self.rec = RequestRecords(n)
        # -- queues and counters
        self.backlog: deque = deque()
        self.fill_q: deque = deque()  # [request, new tokens still to fill] (-1: not started)
        self.ready: deque = deque()
        self.idle_fill = IdleWorkers()
        self.idle_decode = IdleWorkers()
        self.idle_agg = IdleWorkers()
        self.ledger = WorkLedger()
        self.arrived = self.completed = self.rejected = self.admitted = 0
        self.arrived_since = self.completed_since = self.admitted_since = 0
        self.fill_wip = self.in_transfer = self.decoding = 0
        self.rate_factor = 1.0
        self.link_factor = 1.0
        self.action = AdmissionAction(0.0 if controller is not None else math.inf)
        self._adm_idle, self._adm_tokens, self._adm_last = True, 0.0, 0.0
        # -- workers and fleet
        self.fill_workers = [FillWorker(i, self.env.event()) for i in range(cluster.fill_workers)]
        self.decode_workers = [DecodeWorker(i, self.env.event()) for i in range(cluster.decode_workers)]
        self.aggregated_workers = [AggregatedWorker(i, self.env.event()) for i in range(cluster.aggregated_workers)]
        if self.aggregated_workers:
            if self.autoscalers:
                raise ConfigError("autoscalers", "the aggregated pool is fixed: no autoscalers")
            params.mixed_extra(1, 1.0, 1.0)  # raises ConfigError without a mixed-pass table
        self.tickets: list = []
        self.fleet_changed = self.env.event()
        self.cache = prefix_cache if prefix_cache is not None else prefix_cache_for(cluster.prefix_cache_blocks,
                                                                                   params.block_tokens)
        self.hit_tokens = self.lookup_tokens = 0
        # nominal figures for measurements: the trace's mean active context (length-biased, as the
        # fluid model's) and the fill rate of full-budget steps at the trace's mean new and cached tokens
        mean_in, mean_out = float(self.inp_arr.mean()), float(self.out_arr.mean())
        self.nominal_ctx = mean_active_context(mean_in, mean_out, float(self.out_arr.std()) / mean_out)
        self.kv_limit = params.decode_kv_capacity_bytes * (1.0 - cluster.kv_watermark)
        cached = np.minimum(np.asarray(self.given_cached, dtype=float), self.inp_arr)
        self.nominal_fill_rps = 1.0 / params.fill_seconds(float(np.maximum(self.inp_arr - cached, 1).mean()),
                                                          float(cached.mean()))
        self.actions: list[dict] = []

    def _link_sessions(self, trace: pd.DataFrame) -> None:
        sid = trace["session_id"].to_numpy()
        order = np.lexsort((trace["turn"].to_numpy(), sid))
        for a, b in zip(order[:-1], order[1:]):
            if sid[a] == sid[b] and sid[a] != "":
                self.next_turn[a] = int(b)
                self.is_first[b] = False
        if "think_time_s" in trace:
            self.think = np.nan_to_num(trace["think_time_s"].to_numpy(dtype=float), nan=0.0).tolist()

    # -- the clock --------------------------------------------------------------------------
    def call_in(self, delay: float, fn, *args) -> None:
        """Call ``fn(*args)`` after ``delay`` simulated seconds."""
        self.env.schedule(_Call(fn, args), _NORMAL, delay)

    def in_system(self) -> int:
        return len(self.backlog) + self.fill_wip + self.in_transfer + len(self.ready) + self.decoding

    # -- arrivals and admission -------------------------------------------------------------
    def _start_arrivals(self) -> None:
        idx = np.nonzero(self.is_first)[0]
        self._arrival_order = idx[np.argsort(self.arrival[idx], kind="stable")].tolist()
        self._arrival_times = self.arrival[self._arrival_order].tolist()
        self._next_arrival = 0
        if self._arrival_order:
            self.call_in(max(self._arrival_times[0], 0.0), self._arrivals)

    def _arrivals(self) -> None:
        order, times, k = self._arrival_order, self._arrival_times, self._next_arrival
        now = self.env.now
        self.arrive(order[k])  # the one this call was scheduled for
        k += 1
        while k < len(order) and times[k] <= now:
            self.arrive(order[k])
            k += 1
        self._next_arrival = k
        if k < len(order):
            self.call_in(times[k] - now, self._arrivals)

    def arrive(self, i: int) -> None:
        self.arrived += 1
        self.arrived_since += 1
        self.rec.arrival_s[i] = self.env.now
        if len(self.backlog) >= self.action.backlog_bound:
            self.reject(i, self.action.reason)
            return
        self.rec.stage[i] = Stage.BACKLOG
        self.backlog.append(i)
        self.kick_admission()

    def reject(self, i: int, why: str) -> None:
        rec = self.rec
        rec.stage[i] = Stage.REJECTED
        rec.reason[i] = why
        rec.rejected_s[i] = self.env.now
        self.rejected += 1

    def kick_admission(self) -> None:
        """The backlog or the command changed: wake the admitter if it waits for either."""
        if self._adm_idle:
            self._adm_idle = False
            self._adm_last = self.env.now
            self._admit()

    def _admit(self) -> None:
        """Release the backlog at the commanded rate: a token bucket of depth one sample period."""
        backlog, env = self.backlog, self.env
        period = self.ctrl.sample_period
        while True:
            rate = self.action.rate
            if not backlog or rate <= 0:
                self._adm_tokens = 0.0
                self._adm_idle = True
                return
            if rate == math.inf:
                while backlog:
                    self.admit(backlog.popleft())
                continue
            now = env.now
            tokens = min(self._adm_tokens + rate * (now - self._adm_last), max(1.0, rate * period))
            self._adm_last = now
            if tokens >= 1.0:
                self._adm_tokens = tokens - 1.0
                self.admit(backlog.popleft())
                continue
            self._adm_tokens = tokens
            need = (1.0 - tokens) / rate
            if need <= period:
                self.call_in(need, self._admit_one_token_later)
            else:
                self.call_in(period, self._admit)  # re-read the commanded rate
            return

    def _admit_one_token_later(self) -> None:
        self._adm_tokens, self._adm_last = 1.0, self.env.now  # exactly one token accrued (no round-off stall)
        self._admit()

    def admit(self, i: int) -> None:
        rec = self.rec
        rec.admitted_s[i] = self.env.now
        self.admitted += 1
        self.admitted_since += 1
        rec.stage[i] = Stage.FILL
        self.fill_wip += 1
        self.fill_q.append([i, -1])  # new tokens decided at fill start (prefix cache lookup)
        self.kick_fill()

    # -- the run ----------------------------------------------------------------------------
    @property
    def duration_s(self) -> float:
        last = float(np.max(self.arrival[self.is_first]))
        return self.cfg.duration_s or last + self.cfg.drain_s

    def run(self) -> SimulationResult:
        """Run to ``cluster.duration_s`` (default: the last arrival + ``drain_s``).

        Raises
        ------
        ConservationError
            If any request is unaccounted for.
        """
        env, cfg = self.env, self.cfg
        duration = self.duration_s
        self._start_arrivals()
        self.start_snapshots(duration)
        if self.controller is not None:
            env.process(self.control())
        for w in (*self.fill_workers, *self.decode_workers, *self.aggregated_workers):
            self.worker_next(w)
        for e in cfg.events:
            env.process(self.event_process(e))
        for scaler in self.autoscalers:
            scaler.reset()
            env.process(self.autoscale(scaler))
        if cfg.progress if cfg.progress is not None else sys.stderr.isatty():
            env.process(self.progress(duration))
        wall0 = time.perf_counter()
        env.run(until=duration)
        wall = time.perf_counter() - wall0
        self.check_conservation()
        return self.result(duration, wall)

    def check_conservation(self) -> None:
        """Every arrival is completed, rejected with a reason, or in flight."""
        arrived, done, rej, in_flight = self.arrived, self.completed, self.rejected, self.in_system()
        by_stage = self.rec.by_stage()
        in_stages = sum(int(by_stage[s]) for s in Stage.in_system())
        if arrived != done + rej + in_flight or by_stage[Stage.COMPLETED] != done \
                or by_stage[Stage.REJECTED] != rej or in_stages != in_flight \
                or (self.rec.reason[self.rec.stage == Stage.REJECTED] == "").any():
            raise ConservationError(f"request simulator lost requests: arrived {arrived} != completed {done} + "
                                    f"rejected {rej} + in flight {in_flight} (stages {by_stage.tolist()})")

    def result(self, duration: float, wall: float) -> SimulationResult:
        """Records, series, actions, metrics and config of the finished run."""
        cfg = self.cfg
        rec = self.rec.frame(self.inp_arr, self.out_arr)
        for name, col in self.cache.record_columns(self.n).items():
            rec[name] = col
        series = self.snap.frame()
        scale_rows = [a for a in self.actions if a["kind"] == "scale"]
        ttft, tpot = rec["ttft_s"].to_numpy(), rec["tpot_s"].to_numpy()
        completed = rec["state"] == "completed"
        ok = completed & (rec["ttft_s"] <= cfg.slo_ttft_s) & (rec["tpot_s"] <= cfg.slo_tpot_s)
        hours = duration / 3600.0
        billed = series["fill_workers_billed"] + series["decode_workers_billed"] + series["aggregated_workers"]
        gpus = cfg.dynamics.gpus_per_worker
        metrics = {
            "requests": self.arrived, "completed": self.completed, "rejected": self.rejected,
            "in_flight_end": self.in_system(),
            "rejected_by_reason": {r: int((self.rec.reason == r).sum()) for r in REJECT_REASONS},
            "requeued": int(self.rec.requeues.sum()), "preempted": int(self.rec.preemptions.sum()),
            "ttft_p50": _percentile(ttft, 50), "ttft_p99": _percentile(ttft, 99),
            "tpot_p50": _percentile(tpot, 50), "tpot_p99": _percentile(tpot, 99),
            "slo_attainment": float(ok.sum() / max(self.arrived, 1)),
            "goodput_tokens_per_s": float(rec.loc[ok, "output_tokens"].sum() / duration),
            "throughput_requests_per_s": float(self.completed / duration),
            "prefix_hit_ratio": float(self.hit_tokens / self.lookup_tokens) if self.lookup_tokens else 0.0,
            "gpu_hours": float((billed.sum() * cfg.snapshot_dt if cfg.dynamics.fleet_size is None
                                else cfg.dynamics.fleet_size * duration) / 3600.0 * gpus),
            "busy_gpu_hours": float(billed.sum() * cfg.snapshot_dt / 3600.0 * gpus),
            "scale_actions": len(scale_rows), "actions_per_hour": float(len(scale_rows) / hours),
            "reversals_per_hour": float(count_reversals(scale_rows) / hours),
            "duration_s": duration, "wall_seconds": wall,
            "sim_requests_per_wall_s": float(self.arrived / wall) if wall > 0 else None,
            "utilization": self.ledger.metrics(
                {pool: float(series[col].sum() * cfg.snapshot_dt) for pool, col in (
                    ("fill", "fill_workers_billed"), ("decode", "decode_workers_billed"),
                    ("aggregated", "aggregated_workers"))}, self.p.work),
            **self.cache.metrics(duration),
        }
        config = {"cluster": dataclasses.asdict(cfg), "params": dataclasses.asdict(self.p),
                  "controller": type(self.controller).__name__ if self.controller is not None else "open",
                  "controller_params": self.controller.params() if hasattr(self.controller, "params") else {},
                  "autoscalers": [{"name": type(a).__name__, **(a.params() if hasattr(a, "params") else {})}
                                  for a in self.autoscalers],
                  "prefix_cache": self.cache.params()}
        actions = pd.DataFrame(self.actions, columns=_action_columns(self.actions))
        return SimulationResult(series=series, records=rec, actions=actions, metrics=metrics, config=config)


def _action_columns(actions: list[dict]) -> list[str]:
    cols = ["time_s", "kind"]
    for a in actions:
        cols += [k for k in a if k not in cols]
    return cols


def _percentile(x: np.ndarray, q: float):
    x = x[np.isfinite(x)]
    return float(np.percentile(x, q)) if len(x) else None


def simulate(trace: pd.DataFrame, params: DESParams, cluster: ClusterConfig = ClusterConfig(),
             controller=None, autoscalers=(), *, prefix_cache: PrefixCache | None = None) -> SimulationResult:
    """Replay ``trace`` (a request table) through the cluster.

    Parameters
    ----------
    trace : DataFrame
        The request table (see :class:`Simulator`).
    params : DESParams
        Service times (:meth:`DESParams.from_service`).
    cluster : ClusterConfig
        Pools, delays, SLOs, events, run control.
    controller : object, optional
        Admission controller; None admits everything at once.
    autoscalers : sequence, optional
        Pool autoscalers (each returns :class:`tokenfactory.signals.ScaleAction`; workers start,
        warm up and drain as ``cluster.dynamics`` says).
    prefix_cache : PrefixCache, optional
        A prefix-cache policy replacing the one ``cluster.prefix_cache_blocks`` names.

    Returns
    -------
    SimulationResult
        ``records`` one row per request, ``series`` one row per ``snapshot_dt``, ``actions``,
        ``metrics``, ``config``.

    Raises
    ------
    ConservationError
        If any request is unaccounted for.
    """
    return Simulator(trace, params, cluster, controller, autoscalers, prefix_cache=prefix_cache).run()

