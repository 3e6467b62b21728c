"""The request simulator's core: the clock, arrivals, admission, and the run.

:class:`Simulator` is the core (clock, requests, queues, flow counters, admission) and holds
its stages as objects around one simpy ``Environment``: ``fill``
(:class:`~tokenfactory.plant_models.des.fill.FillStage`), ``decode``
(:class:`~tokenfactory.plant_models.des.decode.DecodeStage`), ``aggregated``
(:class:`~tokenfactory.plant_models.des.aggregated.AggregatedStage`), ``fleet``
(:class:`~tokenfactory.plant_models.des.pool_changes.FleetControl`) and ``monitor``
(:class:`~tokenfactory.plant_models.des.measure.Monitor`). Each owns its own state and calls the
others through their documented methods; each takes the core as its context.
Hot paths - arrivals, admissions, fill steps, KV transfers, decode leaps - are scheduled calls
(:meth:`Simulator.call_in`: one heap entry, no generator, no exception); control loops, pool
changes and events are simpy processes. Policies are small overrides: the admission controller
object, a stage subclass passed in ``stages`` (e.g. a
:class:`~tokenfactory.plant_models.des.decode.DecodeStage` overriding ``can_join``, the batching
rule), the prefix cache (:mod:`tokenfactory.plant_models.des.cache`) and the queues (``backlog``,
``fill_q``, ``ready`` are deques; any object with ``append``, ``appendleft``, ``popleft``,
``len`` and ``[0]`` can replace one in a subclass).

Request classes (``ClusterConfig.classes``): each request's class sets its SLO and priority;
with more than one priority the three queues become
:class:`~tokenfactory.plant_models.des.queues.PriorityQueues` (higher priority served first),
lower-priority work may take at most ``1 - reserve`` of each fill step's token budget (a
:class:`tokenfactory.core.signals.ReserveAction` sets the share) and a higher-priority ready sequence
preempts the newest lower-priority one when its worker is at the batch cap or out of KV.

Admission: a controller with a ``decide(t, arrival)`` method is an *arrival gate*: each arrival
is admitted into fill at once, deferred (held in the holding queue, offered again at every
controller sample until its class's ``max_defer_s``, then rejected with ``deferral_expired``)
or rejected with the gate's reason. Other controllers release the backlog at their commanded
rate. A :class:`tokenfactory.core.signals.BatchCapAction` from any controller sets the decode batch cap.
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

from tokenfactory.core.errors import ConservationError
from tokenfactory.plant_models.des.aggregated import AggregatedStage
from tokenfactory.plant_models.des.cache import PrefixCache, prefix_cache_for
from tokenfactory.plant_models.des.config import ClusterConfig
from tokenfactory.plant_models.des.decode import DecodeStage
from tokenfactory.plant_models.des.fill import FillStage
from tokenfactory.plant_models.des.pool_changes import FleetControl
from tokenfactory.plant_models.des.measure import Monitor
from tokenfactory.plant_models.des.params import DESParams
from tokenfactory.plant_models.des.queues import PriorityQueues
from tokenfactory.plant_models.des.records import RequestRecords, Stage
from tokenfactory.plant_models.des.work import WorkLedger
from tokenfactory.plant_models.result import SimulationResult
from tokenfactory.plant_models.service import mean_active_context
from tokenfactory.core.signals import DEFER_REASONS, REJECT_REASONS, AdmissionAction, Arrival, count_reversals
from tokenfactory.core.validation import ConfigError

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


class Simulator:
    """One replay of a request table through the cluster.

    The simulator is the core - the clock, the requests (per-request arrays and records, their
    classes), the queues (``backlog``, ``fill_q``, ``ready``, ``held``), the flow counters, the
    work ledger, the prefix cache, arrivals, admission and completions - and holds its stages as
    objects, each owning its own state and calling the others through a small interface:
    ``fill`` (:class:`~tokenfactory.plant_models.des.fill.FillStage`), ``decode``
    (:class:`~tokenfactory.plant_models.des.decode.DecodeStage`), ``aggregated``
    (:class:`~tokenfactory.plant_models.des.aggregated.AggregatedStage`), ``fleet``
    (:class:`~tokenfactory.plant_models.des.pool_changes.FleetControl`) and ``monitor``
    (:class:`~tokenfactory.plant_models.des.measure.Monitor`). A policy is a stage subclass
    passed in ``stages`` (simpy's way: override the method, keep the rest).

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
        Pool autoscalers returning :class:`tokenfactory.core.signals.ScaleAction`.
    prefix_cache : PrefixCache, optional
        Replaces the policy ``cluster.prefix_cache_blocks`` names.
    stages : dict, optional
        Stage classes replacing the defaults (:attr:`STAGES`), by name: ``"fill"``, ``"decode"``,
        ``"aggregated"``, ``"fleet"``, ``"monitor"``; each a subclass of the default (e.g. a
        :class:`~tokenfactory.plant_models.des.decode.DecodeStage` overriding ``can_join``).
    """

    #: the default stage classes, by name (``stages=`` replaces any of them)
    STAGES = {"fill": FillStage, "decode": DecodeStage, "aggregated": AggregatedStage, "fleet": FleetControl,
              "monitor": Monitor}

    def __init__(self, trace: pd.DataFrame, params: DESParams, cluster: ClusterConfig = ClusterConfig(),
                 controller=None, autoscalers=(), *, prefix_cache: PrefixCache | None = None,
                 stages: dict | None = None):
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
        self._setup_classes(trace)
        # -- queues and counters
        if self.multi:  # classes of more than one priority: the queues serve higher priority first
            L = len(self.level_names)
            self.backlog = PriorityQueues(L, self.level_of)
            self.fill_q = PriorityQueues(L, self.level_of, keyed=True)
            self.ready = PriorityQueues(L, self.level_of)
        else:
            self.backlog: deque = deque()
            self.fill_q: deque = deque()  # [request, new tokens still to fill] (-1: not started)
            self.ready: deque = deque()
        self.held: deque = deque()  # deferred requests (stale entries skipped: stage tells)
        self.gate = getattr(controller, "decide", None) if controller is not None else None
        # an arrival gate may also hear the outcomes of the requests it admitted (the orchestrator
        # streams their tokens): ``observe(t, [(class, ttft_s, tpot_s), ...])`` at completion
        self.observer = getattr(controller, "observe", None) if controller is not None else None
        self.ledger = WorkLedger()
        self.arrived = self.completed = self.rejected = self.admitted = 0
        self.arrived_since = self.completed_since = self.admitted_since = 0
        self.fill_wip = self.decoding = 0  # requests in fill (a step, queued or in transfer) and decoding
        self.action = AdmissionAction(0.0 if controller is not None else math.inf)
        self._adm_idle, self._adm_tokens, self._adm_last = True, 0.0, 0.0
        self.cache = prefix_cache if prefix_cache is not None else prefix_cache_for(cluster.prefix_cache_blocks,
                                                                                   params.block_tokens)
        # nominal figures for measurements: the trace's mean active context (length-biased, as the
        # fluid model's) and the fill rate of full-budget steps at the trace's mean new and cached tokens
        mean_in, mean_out = float(self.inp_arr.mean()), float(self.out_arr.mean())
        self.nominal_ctx = mean_active_context(mean_in, mean_out, float(self.out_arr.std()) / mean_out)
        cached = np.minimum(np.asarray(self.given_cached, dtype=float), self.inp_arr)
        mean_new = float(np.maximum(self.inp_arr - cached, 1).mean())
        self.nominal_fill_rps = 1.0 / params.fill_seconds(mean_new, float(cached.mean()))
        # new prompt tokens/s of one fill worker over the trace's own requests: full steps plus each
        # chunk's attention over the context before it, summed request by request (what the TTFT
        # predictor divides by; at the mean shape it is 1.65x too fast on the Mooncake trace, whose
        # long prompts pay attention quadratic in their length)
        new = np.maximum(self.inp_arr - cached, 1.0)
        self.fill_token_rate = float(new.sum() / np.sum(params.fill_seconds(new, cached)))
        self.actions: list[dict] = []
        # -- the stages (each owns its workers and its own state)
        kinds = _stage_classes(self.STAGES, stages)
        for name in _STAGE_POLICIES:  # a policy overridden here would never be called
            if hasattr(type(self), name):
                raise ConfigError(f"{type(self).__name__}.{name}", "a stage's policy: override it in a subclass of "
                                  f"the stage and pass it in stages= (e.g. stages={{'decode': MyDecodeStage}})")
        self.fill = kinds["fill"](self, cluster.fill_workers)
        self.decode = kinds["decode"](
            self, cluster.decode_workers,
            batch_cap=float(min(cluster.batch_cap if cluster.batch_cap is not None else math.inf,
                                params.decode_max_batch)),
            kv_limit=params.decode_kv_capacity_bytes * (1.0 - cluster.kv_watermark))
        self.aggregated = kinds["aggregated"](self, cluster.aggregated_workers)
        if self.aggregated.workers:
            if self.autoscalers:
                raise ConfigError("autoscalers", "the aggregated pool is fixed: no autoscalers")
            params.mixed_extra(1, 1.0, 1.0)  # raises ConfigError without a mixed-pass table
        self.fleet = kinds["fleet"](self)
        self.monitor = kinds["monitor"](self)

    def _setup_classes(self, trace: pd.DataFrame) -> None:
        """Each request's class index, priority level and SLO; per-class counters."""
        n, cfg = self.n, self.cfg
        raw = (trace["request_class"].fillna("").astype(str).to_numpy() if "request_class" in trace
               else np.full(n, "", dtype=object))
        table = cfg.class_table()
        if table is None:  # no classes configured: one SLO, first come first served
            names = sorted(set(raw.tolist()) - {""}) or ["interactive"]
            if (raw == "").any() and "interactive" not in names:
                names = ["interactive", *names]
            slo = {c: (cfg.slo_ttft_s, cfg.slo_tpot_s) for c in names}
            level = {c: 0 for c in names}
            defer = {c: (False, 0.0) for c in names}
        else:
            names = list(table)
            unknown = sorted(set(raw.tolist()) - set(names) - {""})
            if unknown:
                raise ConfigError("trace.request_class", f"{unknown[0]!r} is not a configured class "
                                  f"({', '.join(names)})")
            prios = sorted({c.priority for c in table.values()})
            slo = {c: (table[c].slo_ttft_s, table[c].slo_tpot_s) for c in names}
            level = {c: prios.index(table[c].priority) for c in names}
            defer = {c: (table[c].deferrable, table[c].max_defer_s) for c in names}
        raw = np.where(raw == "", names[0], raw)
        self.class_names = names
        index = {c: k for k, c in enumerate(names)}
        self.cls = np.array([index[c] for c in raw.tolist()], dtype=np.int64)
        self.cls_l = self.cls.tolist()
        self.level_names = sorted(set(level.values()))
        self.class_level = [level[c] for c in names]
        self.level_of = [self.class_level[c] for c in self.cls_l]
        self.multi = len(self.level_names) > 1
        self.slo_ttft = np.array([slo[c][0] for c in names])
        self.slo_tpot = np.array([slo[c][1] for c in names])
        self.deferrable = [defer[c][0] for c in names]
        self.max_defer = [defer[c][1] for c in names]
        C = len(names)
        self.c_backlog, self.c_deferred, self.c_fip = [0] * C, [0] * C, [0] * C
        self.c_ready, self.c_dec, self.c_arr_since = [0] * C, [0] * C, [0] * C
        self.tok_fill = [0.0] * C
        self.pred_tok = [0] * n
        out = self.out_arr
        self.mean_out = [float(out[self.cls == c].mean()) if (self.cls == c).any() else float(out.mean())
                         for c in range(C)]

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
        """Requests arrived and neither completed nor rejected (deferred ones included)."""
        return (len(self.backlog) + self.fill_wip + self.fill.in_transfer + len(self.ready) + self.decoding
                + sum(self.c_deferred))

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
        """Request ``i`` reaches the orchestrator: offered to the arrival gate, or queued in the
        backlog (rejected at once when the backlog is at the commanded bound)."""
        self.arrived += 1
        self.arrived_since += 1
        self.c_arr_since[self.cls_l[i]] += 1
        self.rec.arrival_s[i] = self.env.now
        if self.gate is not None:
            self.offer(i)
            return
        if len(self.backlog) >= self.action.backlog_bound:
            self.reject(i, self.action.reason)
            return
        self.rec.stage[i] = Stage.BACKLOG
        self.c_backlog[self.cls_l[i]] += 1
        self.backlog.append(i)
        self.kick_admission()

    def arrival_view(self, i: int) -> Arrival:
        """What the gate sees of request ``i``: class, tokens, a peek at the prefix cache (the
        hit it expects; nothing is recorded), the class's mean output and its arrival time."""
        c = self.cls_l[i]
        inp = self.inp[i]
        hit = self.cache.peek(self.hashes[i] if self.hashes is not None else None, inp, self.given_cached[i])
        self.pred_tok[i] = max(inp - hit, 1)
        return Arrival(self.class_names[c], inp, hit, self.mean_out[c], float(self.rec.arrival_s[i]))

    def offer(self, i: int) -> bool:
        """Offer request ``i`` (arriving, or deferred) to the gate; True when it was admitted."""
        d = self.gate(self.env.now, self.arrival_view(i))
        verdict = d.verdict
        if verdict == "admit":
            self.admit(i, predicted=True)
            return True
        c = self.cls_l[i]
        rec = self.rec
        if verdict == "defer" and self.deferrable[c]:
            if rec.stage[i] != Stage.DEFERRED:  # first deferral: into the holding queue, with its deadline
                if d.reason not in DEFER_REASONS:
                    raise ConfigError("decision.reason", f"{d.reason!r} is not one of {DEFER_REASONS}")
                rec.stage[i] = Stage.DEFERRED
                rec.deferred_s[i] = self.env.now
                rec.defer_reason[i] = d.reason
                self.c_deferred[c] += 1
                self.held.append(i)
                left = rec.arrival_s[i] + self.max_defer[c] - self.env.now
                self.call_in(max(left, 0.0), self._defer_expired, i)
            return False
        if verdict not in ("reject", "defer"):
            raise ConfigError("decision.verdict", f"{verdict!r} is not one of admit, defer, reject")
        if rec.stage[i] == Stage.DEFERRED:
            self.c_deferred[c] -= 1
        reason = d.reason if d.reason in REJECT_REASONS else "predicted_slo_violation"
        self.reject(i, reason)
        return False

    def _defer_expired(self, i: int) -> None:
        if self.rec.stage[i] == Stage.DEFERRED:
            self.c_deferred[self.cls_l[i]] -= 1
            self.reject(i, "deferral_expired")

    def offer_held(self) -> None:
        """Offer the deferred requests again, oldest first, until the gate refuses one."""
        held, rec = self.held, self.rec
        while held:
            i = held[0]
            if rec.stage[i] != Stage.DEFERRED:
                held.popleft()  # admitted or expired since
                continue
            if self.offer(i):
                held.popleft()
                continue
            if rec.stage[i] == Stage.DEFERRED:
                return  # still no room: the rest wait too (first in, first out)
            held.popleft()

    def reject(self, i: int, why: str) -> None:
        """Request ``i`` is rejected with reason ``why`` (one of ``REJECT_REASONS``)."""
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

    def admit(self, i: int, predicted: bool = False) -> None:
        """Request ``i`` enters the fill queue (``predicted``: its expected new tokens were just
        computed by :meth:`arrival_view`)."""
        rec = self.rec
        c = self.cls_l[i]
        st = rec.stage[i]
        if st == Stage.BACKLOG:
            self.c_backlog[c] -= 1
        elif st == Stage.DEFERRED:
            self.c_deferred[c] -= 1
        if not predicted:
            self.arrival_view(i)
        rec.admitted_s[i] = self.env.now
        self.admitted += 1
        self.admitted_since += 1
        rec.stage[i] = Stage.FILL
        self.fill_wip += 1
        self.c_fip[c] += 1
        self.tok_fill[c] += self.pred_tok[i]
        self.fill_q.append([i, -1])  # new tokens decided at fill start (prefix cache lookup)
        self.fill.kick()

    def complete(self, done: list) -> None:
        """Requests ``done`` generated their last token (a decode stage calls this): recorded; a
        closed session's next turn returns after its think time."""
        rec, now = self.rec, self.env.now
        c_dec, cls = self.c_dec, self.cls_l
        for i in done:
            rec.completion_s[i] = now
            rec.stage[i] = Stage.COMPLETED
            c_dec[cls[i]] -= 1
        if self.observer is not None:
            arr, first, names, out = rec.arrival_s, rec.first_token_s, self.class_names, self.out
            self.observer(now, [(names[cls[i]], first[i] - arr[i], (now - first[i]) / max(out[i] - 1, 1))
                                for i in done])
        k = len(done)
        self.completed += k
        self.completed_since += k
        self.decoding -= k
        if self.closed_sessions:
            for i in done:
                nxt = self.next_turn[i]
                if nxt >= 0:  # the next turn's think time runs from this turn's completion
                    self.call_in(self.think[nxt], self.arrive, nxt)

    # -- what the stages own, readable here (controllers, the live engine, tests) ----------
    @property
    def fill_workers(self) -> list:
        """The fill pool's workers (``fill.workers``)."""
        return self.fill.workers

    @property
    def decode_workers(self) -> list:
        """The decode pool's workers (``decode.workers``)."""
        return self.decode.workers

    @property
    def aggregated_workers(self) -> list:
        """The aggregated pool's workers (``aggregated.workers``)."""
        return self.aggregated.workers

    @property
    def batch_cap(self) -> float:
        """Decode batch cap per worker now (``decode.batch_cap``)."""
        return self.decode.batch_cap

    def set_batch_cap(self, cap: float) -> None:
        """Change the decode batch cap (:meth:`DecodeStage.set_batch_cap`)."""
        self.decode.set_batch_cap(cap)

    @property
    def rate_factor(self) -> float:
        """Decode speed factor now (``decode.rate_factor``; a rate dip scales it)."""
        return self.decode.rate_factor

    @property
    def kv_limit(self) -> float:
        """KV bytes a decode worker admits sequences up to (``decode.kv_limit``)."""
        return self.decode.kv_limit

    @property
    def in_transfer(self) -> int:
        """KV blobs on their way from fill to decode (``fill.in_transfer``)."""
        return self.fill.in_transfer

    @property
    def hit_tokens(self) -> int:
        """Input tokens the prefix cache served (``fill.hit_tokens``)."""
        return self.fill.hit_tokens

    @property
    def lookup_tokens(self) -> int:
        """Input tokens looked up in the prefix cache (``fill.lookup_tokens``)."""
        return self.fill.lookup_tokens

    def speed(self, w) -> float:
        """Worker ``w``'s speed factor now (:meth:`FleetControl.speed`)."""
        return self.fleet.speed(w)

    def worker_next(self, w) -> None:
        """Worker ``w`` may take work (:meth:`FleetControl.worker_next`)."""
        self.fleet.worker_next(w)

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
        fleet, monitor = self.fleet, self.monitor
        self._start_arrivals()
        monitor.start_snapshots(duration)
        if self.controller is not None:
            env.process(monitor.control())
        for w in (*self.fill.workers, *self.decode.workers, *self.aggregated.workers):
            fleet.worker_next(w)
        for e in cfg.events:
            env.process(fleet.event_process(e))
        for scaler in self.autoscalers:
            scaler.reset()
            env.process(fleet.autoscale(scaler))
        if cfg.progress if cfg.progress is not None else sys.stderr.isatty():
            env.process(monitor.progress(duration))
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
        if by_stage[Stage.DEFERRED] != sum(self.c_deferred) or min(self.c_deferred) < 0:
            raise ConservationError(f"request simulator: {int(by_stage[Stage.DEFERRED])} requests deferred by "
                                    f"their records, {sum(self.c_deferred)} by the counters")
        if arrived != done + rej + in_flight or by_stage[Stage.COMPLETED] != done \
                or by_stage[Stage.REJECTED] != rej or in_stages != in_flight \
                or (self.rec.reason[self.rec.stage == Stage.REJECTED] == "").any():
            raise ConservationError(f"request simulator lost requests: arrived {arrived} != completed {done} + "
                                    f"rejected {rej} + in flight {in_flight} (stages {by_stage.tolist()})")

    def result(self, duration: float, wall: float) -> SimulationResult:
        """Records, series, actions, metrics and config of the finished run."""
        cfg = self.cfg
        names = np.asarray(self.class_names, dtype=object)
        rec = self.rec.frame(self.inp_arr, self.out_arr, names[self.cls], np.asarray(self.given_cached, dtype=np.int64))
        for name, col in self.cache.record_columns(self.n).items():
            rec[name] = col
        snap, class_snap = self.monitor.snap, self.monitor.class_snap
        series = pd.concat([snap.frame(), class_snap.frame(len(snap))], axis=1)
        scale_rows = [a for a in self.actions if a["kind"] == "scale"]
        hours = duration / 3600.0
        billed = series["fill_workers_billed"] + series["decode_workers_billed"] + series["aggregated_workers"]
        gpus = cfg.dynamics.gpus_per_worker
        if not cfg.dynamics.uniform_gpus:   # each pool's billed workers at its GPUs (a fixed fleet needs one number)
            billed = (series["fill_workers_billed"] * cfg.dynamics.gpus("fill")
                      + series["decode_workers_billed"] * cfg.dynamics.gpus("decode")
                      + series["aggregated_workers"] * cfg.dynamics.gpus("aggregated"))
            gpus = 1
        slo = self.request_slo_met(rec, duration)
        metrics = {
            "requests": self.arrived, "completed": self.completed, "rejected": self.rejected,
            "in_flight_end": self.in_system(), "deferred_end": int(sum(self.c_deferred)),
            "rejected_by_reason": {r: int((self.rec.reason == r).sum()) for r in REJECT_REASONS},
            "deferred": int(np.isfinite(self.rec.deferred_s).sum()),
            "deferred_by_reason": {r: int((self.rec.defer_reason == r).sum()) for r in DEFER_REASONS},
            "requeued": int(self.rec.requeues.sum()), "preempted": int(self.rec.preemptions.sum()),
            **_outcome_metrics(rec, slo, duration, self.arrived),
            "throughput_requests_per_s": float(self.completed / duration),
            "prefix_hit_ratio": (float(self.fill.hit_tokens / self.fill.lookup_tokens) if self.fill.lookup_tokens
                                 else 0.0),
            "gpu_hours": float((billed.sum() * cfg.snapshot_dt if cfg.dynamics.fleet_size is None
                                else cfg.dynamics.fleet_size * duration) / 3600.0 * gpus),
            "busy_gpu_hours": float(billed.sum() * cfg.snapshot_dt / 3600.0 * gpus),
            # over the whole run, start-up included (window_s; an oscillation verdict states its own window)
            "scale_actions": len(scale_rows), "actions_per_hour": float(len(scale_rows) / hours),
            "reversals_per_hour": float(count_reversals(scale_rows) / hours), "window_s": (0.0, float(duration)),
            "batch_cap_changes": sum(1 for a in self.actions if a["kind"] == "batch_cap"),
            "duration_s": duration, "wall_seconds": wall,
            "sim_requests_per_wall_s": float(self.arrived / wall) if wall > 0 else None,
            "utilization": self.ledger.metrics(
                {pool: float(series[col].sum() * cfg.snapshot_dt) for pool, col in (
                    ("fill", "fill_workers_billed"), ("decode", "decode_workers_billed"),
                    ("aggregated", "aggregated_workers"))}, self.p.work),
            **self.cache.metrics(duration),
        }
        arrived_cls = np.isfinite(rec["arrival_s"].to_numpy())
        metrics["classes"] = {}
        for c, name in enumerate(self.class_names):
            sel = self.cls == c
            n_arr = int((sel & arrived_cls).sum())
            sub = rec[sel]
            metrics["classes"][name] = {
                "requests": n_arr, "completed": int((sub["state"] == "completed").sum()),
                "rejected": int((sub["state"] == "rejected").sum()),
                "deferred": int(np.isfinite(sub["deferred_s"].to_numpy()).sum()),
                "in_flight_end": int(sub["state"].isin([st.name.lower() for st in Stage.in_system()]).sum()),
                "rejected_by_reason": {r: int((sub["reject_reason"] == r).sum()) for r in REJECT_REASONS},
                "slo_ttft_s": float(self.slo_ttft[c]), "slo_tpot_s": float(self.slo_tpot[c]),
                **_outcome_metrics(sub, slo[sel], duration, n_arr)}
        config = {"cluster": dataclasses.asdict(cfg), "params": dataclasses.asdict(self.p),
                  "controller": type(self.controller).__name__ if self.controller is not None else "open",
                  "controller_params": self.controller.params() if hasattr(self.controller, "params") else {},
                  "autoscalers": [{"name": type(a).__name__, **(a.params() if hasattr(a, "params") else {})}
                                  for a in self.autoscalers],
                  "prefix_cache": self.cache.params(), "classes": list(self.class_names)}
        actions = pd.DataFrame(self.actions, columns=_action_columns(self.actions))
        return SimulationResult(series=series, records=rec, actions=actions, metrics=metrics, config=config)

    def request_slo_met(self, rec: pd.DataFrame, duration: float) -> np.ndarray:
        """Per request: +1 met its class's SLO (completed within both), -1 missed it (completed
        late, or still in flight with its TTFT, or its wait for a first token, already past the
        SLO), 0 undecided (rejected, never arrived, or in flight and still able to make it)."""
        ttft_slo = self.slo_ttft[self.cls]
        tpot_slo = self.slo_tpot[self.cls]
        ttft, tpot = rec["ttft_s"].to_numpy(), rec["tpot_s"].to_numpy()
        completed = (rec["state"] == "completed").to_numpy()
        ok = completed & (ttft <= ttft_slo) & (tpot <= tpot_slo)
        in_flight = rec["state"].isin([st.name.lower() for st in Stage.in_system()]).to_numpy()
        waited = np.where(np.isfinite(ttft), ttft, duration - rec["arrival_s"].to_numpy())
        late = (completed & ~ok) | (in_flight & (waited > ttft_slo))
        return np.where(ok, 1, np.where(late, -1, 0))


#: the stages' policy methods a Simulator subclass overrode before the stages were objects
_STAGE_POLICIES = ("can_join", "agg_fits", "fits", "fill_next", "decode_next", "agg_next", "prefix_fetch",
                   "chunks_attention", "finish_fill")


def _stage_classes(defaults: dict, given: dict | None) -> dict:
    """The stage classes of a run: the defaults, with ``given`` replacing some by name (each a
    subclass of the default it replaces)."""
    kinds = dict(defaults)
    for name, cls in (given or {}).items():
        if name not in defaults:
            raise ConfigError("stages", f"{name!r} is not a stage ({', '.join(defaults)})")
        if not (isinstance(cls, type) and issubclass(cls, defaults[name])):
            raise ConfigError(f"stages.{name}", f"{cls!r} is not a subclass of {defaults[name].__name__}")
        kinds[name] = cls
    return kinds


def _outcome_metrics(rec: pd.DataFrame, slo: np.ndarray, duration: float, arrived: int) -> dict:
    """SLO attainment (over arrivals, and over admitted requests whose outcome is known: met, or
    missed - completed late or already late in flight), goodput, latency percentiles and wasted
    prefill of a set of requests (``slo`` from :meth:`Simulator.request_slo_met`)."""
    ok = slo == 1
    admitted = np.isfinite(rec["admitted_s"].to_numpy())
    decided = admitted & (slo != 0)  # an admitted request still in flight and able to make it is undecided
    filled = rec["filled_tokens"].to_numpy()
    wasted = filled[slo == -1].sum()
    ttft, tpot = rec["ttft_s"].to_numpy(), rec["tpot_s"].to_numpy()
    return {"ttft_p50": _percentile(ttft, 50), "ttft_p99": _percentile(ttft, 99),
            "tpot_p50": _percentile(tpot, 50), "tpot_p99": _percentile(tpot, 99),
            "slo_attainment": float(ok.sum() / max(arrived, 1)),
            "slo_attainment_admitted": float(ok.sum() / decided.sum()) if decided.any() else None,
            "admitted": int(admitted.sum()),
            "goodput_tokens_per_s": float(rec["output_tokens"].to_numpy()[ok].sum() / duration),
            "prefill_tokens": int(filled.sum()), "wasted_prefill_tokens": int(wasted),
            "wasted_prefill_fraction": float(wasted / filled.sum()) if filled.sum() > 0 else 0.0}


def _action_columns(actions: list[dict]) -> list[str]:
    cols = ["time_s", "kind"]
    for a in actions:
        cols += [k for k in a if k not in cols]
    return cols


def _percentile(x: np.ndarray, q: float):
    x = x[np.isfinite(x)]
    return float(np.percentile(x, q)) if len(x) else None


def simulate(trace: pd.DataFrame, params: DESParams, cluster: ClusterConfig = ClusterConfig(),
             controller=None, autoscalers=(), *, prefix_cache: PrefixCache | None = None,
             stages: dict | None = None) -> SimulationResult:
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
        Pool autoscalers (each returns :class:`tokenfactory.core.signals.ScaleAction`; workers start,
        warm up and drain as ``cluster.dynamics`` says).
    prefix_cache : PrefixCache, optional
        A prefix-cache policy replacing the one ``cluster.prefix_cache_blocks`` names.
    stages : dict, optional
        Stage classes replacing the defaults by name (see :class:`Simulator`).

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
    return Simulator(trace, params, cluster, controller, autoscalers, prefix_cache=prefix_cache,
                     stages=stages).run()

