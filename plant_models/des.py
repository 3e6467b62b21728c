"""Request-level discrete-event model of the token factory (simpy).

Requests from a request table arrive at the orchestrator's admission queue (the backlog); an
admission controller - the same objects the fluid model runs - releases them into fill at its
commanded rate, sampled at its own period with the plant's measurement delay. Fill workers run
chunked prefill/midfill with continuous batching under a per-step token budget; each finished
request's KV blob moves to decode over the fill worker's striped links; it waits in the ready
buffer; decode workers join ready sequences at step boundaries while their KV memory has room and
generate one token per sequence per step. Agentic sessions return for a midfill after a think time.

Speed comes from events per worker step, not per token: a decode worker whose batch does not
change *leaps* over every step up to the next completion in one event, with the exact pass time
of each step (t0(B) + t_kv x sum of contexts, which grows by B per step, summed in closed form);
a ready arrival, a rate change or a fault interrupts the leap at the next step boundary. Batch
state is numpy arrays; records are preallocated arrays, one row per request.

Nothing is lost: every arrival ends completed, rejected with a reason, or in flight, and
``simulate`` raises :class:`tokenfactory.plant_models.fluid.ConservationError` otherwise. Worker crashes
re-queue their requests (reason recorded) - their KV is gone and must be rebuilt by a new fill.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from bisect import bisect_right
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import simpy

from tokenfactory.plant_models.fluid import ConservationError, DecodeRateDip
from tokenfactory.plant_models.pools import PoolDynamics
from tokenfactory.plant_models.roofline import Worker
from tokenfactory.signals import POOLS, REJECT_REASONS, AdmissionAction, Measurement, count_reversals, split_action
from tokenfactory.validation import ConfigError, check_int, check_number, reject_unknown_keys

__all__ = ["DESParams", "ClusterConfig", "WorkerCrash", "LinkSlowdown", "Reconfiguration",
           "DESResult", "simulate", "REJECT_REASONS"]

_STAGES = ("backlog", "fill", "transfer", "ready", "decode", "done", "rejected")


# ------------------------------------------------------------------------------------------
# parameters


@dataclass(frozen=True)
class DESParams:
    """Service-time model of one fill and one decode worker (seconds, tokens, bytes).

    * fill pass time = interp(tokens in the step; ``fill_step_tokens``, ``fill_step_s``)
      + ``fill_s_per_cached_token`` x cached tokens read by requests starting in the step
    * KV transfer = blob bytes / ``kv_link_bandwidth`` (the fill worker's striped links, one
      transfer at a time) + ``kv_setup_s``
    * decode pass time = T(batch, mean context), bilinear in the roofline table
      (``decode_batches`` x ``decode_contexts`` -> ``decode_table_s``); within a leap the context
      grows by one token per step and T is extended linearly with its local slope in context
    * a decode worker holds at most ``decode_kv_capacity_tokens`` of KV, allocated as tokens are
      generated (paged, as vLLM and SGLang do); see :class:`ClusterConfig` ``kv_watermark``
    """

    fill_token_budget: int
    fill_step_tokens: tuple[float, ...]
    fill_step_s: tuple[float, ...]
    fill_s_per_cached_token: float
    kv_bytes_per_token: float
    kv_link_bandwidth: float
    kv_setup_s: float
    decode_kv_capacity_tokens: float
    decode_batches: tuple[float, ...]
    decode_contexts: tuple[float, ...]
    decode_table_s: tuple[tuple[float, ...], ...]
    decode_max_batch: int = 1_000_000
    block_tokens: int = 512
    provenance: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        check_int("des.fill_token_budget", self.fill_token_budget, low=1)
        for f in ("fill_s_per_cached_token", "kv_bytes_per_token", "kv_setup_s"):
            check_number(f"des.{f}", getattr(self, f), low=0.0)
        for f in ("kv_link_bandwidth", "decode_kv_capacity_tokens"):
            check_number(f"des.{f}", getattr(self, f), low=0.0, low_inclusive=False, allow_inf=True)
        check_int("des.decode_max_batch", self.decode_max_batch, low=1)
        check_int("des.block_tokens", self.block_tokens, low=1)
        for xs, ys, name in ((self.fill_step_tokens, self.fill_step_s, "fill_step"),
                             (self.decode_batches, [r[0] for r in self.decode_table_s], "decode_table_s")):
            if len(xs) < 1 or len(xs) != len(ys) or any(a >= b for a, b in zip(xs, xs[1:])):
                raise ConfigError(f"des.{name}", "needs increasing x values and one time per x")
            if any(v <= 0 for v in ys):
                raise ConfigError(f"des.{name}", "times must be > 0")
        c = self.decode_contexts
        if len(c) < 2 or any(a >= b for a, b in zip(c, c[1:])) or any(len(r) != len(c) for r in self.decode_table_s):
            raise ConfigError("des.decode_contexts", "needs >= 2 increasing contexts and one time per (batch, context)")
        object.__setattr__(self, "_tl", [list(map(float, r)) for r in self.decode_table_s])
        object.__setattr__(self, "_bl", list(map(float, self.decode_batches)))
        object.__setattr__(self, "_cl", list(map(float, c)))
        object.__setattr__(self, "_ft", list(map(float, self.fill_step_tokens)))
        object.__setattr__(self, "_fs", list(map(float, self.fill_step_s)))

    def fill_step_time(self, tokens: float, cached_read: float = 0.0) -> float:
        x, y = self._ft, self._fs
        if tokens <= x[0]:
            base = y[0]
        elif tokens >= x[-1]:
            base = y[-1]
        else:
            k = bisect_right(x, tokens) - 1
            base = y[k] + (y[k + 1] - y[k]) * (tokens - x[k]) / (x[k + 1] - x[k])
        return base + self.fill_s_per_cached_token * cached_read

    def decode_pass(self, batch: int, mean_context: float) -> tuple[float, float]:
        """(pass time, d pass time / d mean context) at a batch and mean context, bilinear.

        Pure Python on lists: called once per leap, where numpy's per-call overhead dominates."""
        b, c, T = self._bl, self._cl, self._tl
        nb, nc = len(b), len(c)
        i = min(max(bisect_right(b, batch) - 1, 0), nb - 2) if nb > 1 else 0
        j = min(max(bisect_right(c, mean_context) - 1, 0), nc - 2)
        if nb > 1:
            u = min(max((batch - b[i]) / (b[i + 1] - b[i]), 0.0), 1.0)
            lo = T[i][j] + u * (T[i + 1][j] - T[i][j])
            hi = T[i][j + 1] + u * (T[i + 1][j + 1] - T[i][j + 1])
        else:
            lo, hi = T[0][j], T[0][j + 1]
        slope = (hi - lo) / (c[j + 1] - c[j])
        return lo + slope * (mean_context - c[j]), max(slope, 0.0)

    @classmethod
    def from_workers(cls, fill_worker: Worker, decode_worker: Worker, *, kv_stripes: int = 8,
                     kv_setup_s: float = 0.005, fill_token_budget: int | None = None) -> "DESParams":
        """Derive every service time from the roofline model (the same source as the fluid plant)."""
        check_int("des.kv_stripes", kv_stripes, low=1)
        dp = fill_worker.parallelism.dp_attention
        budget = fill_token_budget or dp * 2048
        grid = np.unique(np.geomspace(dp, max(budget, dp), 10).round().astype(int))
        fill_s = tuple(fill_worker.midfill(max(1, int(n // dp)), 0, sequences=dp).time_s for n in grid)
        # marginal cost of reading (and, for MLA, expanding) cached prefix tokens in a fill pass
        ref = fill_worker.midfill(512, 0, sequences=1).time_s
        cached = (fill_worker.midfill(512, 32768, sequences=1).time_s - ref) / 32768
        max_batch = max(2, decode_worker.decode_slots(64))
        batches = np.unique(np.geomspace(1, max_batch, 16).round().astype(int))
        contexts = np.unique(np.geomspace(64, max(decode_worker.model.kv_bytes_per_token and 262144, 1024), 12).round())
        table = tuple(tuple(decode_worker.decode(int(bb), int(cc), check_memory=False).time_s for cc in contexts)
                      for bb in batches)
        m = decode_worker.model
        return cls(fill_token_budget=int(budget), fill_step_tokens=tuple(map(float, grid)), fill_step_s=fill_s,
                   fill_s_per_cached_token=max(cached, 0.0), kv_bytes_per_token=m.kv_bytes_per_token,
                   kv_link_bandwidth=kv_stripes * fill_worker.accelerator.scale_out_bandwidth, kv_setup_s=kv_setup_s,
                   decode_kv_capacity_tokens=decode_worker.kv_capacity_tokens,
                   decode_batches=tuple(map(float, batches)), decode_contexts=tuple(map(float, contexts)),
                   decode_table_s=table,
                   provenance={"fill": f"{fill_worker.model.name}@{fill_worker.accelerator.name}",
                               "decode": f"{m.name}@{decode_worker.accelerator.name}"})


# ------------------------------------------------------------------------------------------
# faults and reconfiguration


@dataclass(frozen=True)
class WorkerCrash:
    """A worker of ``pool`` ("fill" or "decode") crashes at ``at_s`` and restarts after ``restart_s``."""

    at_s: float
    pool: str = "decode"
    index: int = 0
    restart_s: float = 30.0


@dataclass(frozen=True)
class LinkSlowdown:
    """KV links run at ``factor`` x bandwidth in [start_s, start_s + duration_s)."""

    start_s: float
    duration_s: float
    factor: float


@dataclass(frozen=True)
class Reconfiguration:
    """At ``at_s`` move ``count`` workers from pool ``source`` to ``target``: each drains its
    work, is offline for ``downtime_s``, then serves the other pool."""

    at_s: float
    source: str
    target: str
    count: int = 1
    downtime_s: float = 60.0


# decode speed dips are the fluid model's DecodeRateDip: one disturbance type for both plants
_EVENTS = {"worker_crash": WorkerCrash, "link_slowdown": LinkSlowdown, "decode_rate_dip": DecodeRateDip,
           "reconfiguration": Reconfiguration}


@dataclass(frozen=True)
class ClusterConfig:
    """Pools, delays, SLOs and run control of one simulation (validated up front)."""

    fill_workers: int = 8
    decode_workers: int = 8
    measurement_delay_s: float = 0.5
    snapshot_dt: float = 0.1
    prefix_cache_blocks: int | None = None
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.1
    kv_watermark: float = 0.01
    duration_s: float | None = None
    drain_s: float = 120.0
    dynamics: PoolDynamics = PoolDynamics()
    autoscale_start_s: float = 0.0
    events: tuple = ()
    seed: int = 0
    progress: bool | None = None

    def __post_init__(self) -> None:
        check_int("cluster.fill_workers", self.fill_workers, low=0)
        check_int("cluster.decode_workers", self.decode_workers, low=0)
        check_number("cluster.measurement_delay_s", self.measurement_delay_s, low=0.0)
        check_number("cluster.snapshot_dt", self.snapshot_dt, low=0.001, high=60.0)
        if self.prefix_cache_blocks is not None:
            check_int("cluster.prefix_cache_blocks", self.prefix_cache_blocks, low=0)
        check_number("cluster.slo_ttft_s", self.slo_ttft_s, low=0.0, low_inclusive=False)
        check_number("cluster.slo_tpot_s", self.slo_tpot_s, low=0.0, low_inclusive=False)
        # vLLM's default watermark: a new sequence joins only if 1 % of KV stays free for growth
        check_number("cluster.kv_watermark", self.kv_watermark, low=0.0, high=0.5)
        if self.duration_s is not None:
            check_number("cluster.duration_s", self.duration_s, low=0.0, low_inclusive=False)
        check_number("cluster.drain_s", self.drain_s, low=0.0)
        check_number("cluster.autoscale_start_s", self.autoscale_start_s, low=0.0)
        if self.dynamics.fleet_size is not None and self.fill_workers + self.decode_workers > self.dynamics.fleet_size:
            raise ConfigError("cluster.dynamics.fleet_size", f"{self.dynamics.fleet_size} workers cannot hold the "
                              f"initial {self.fill_workers} fill + {self.decode_workers} decode")
        check_int("cluster.seed", self.seed, low=0)
        for i, e in enumerate(self.events):
            if not isinstance(e, tuple(_EVENTS.values())):
                raise ConfigError(f"cluster.events[{i}]", f"unknown event {e!r}")
            if isinstance(e, (WorkerCrash,)) and e.pool not in ("fill", "decode"):
                raise ConfigError(f"cluster.events[{i}].pool", f"{e.pool!r} is not 'fill' or 'decode'")
            if isinstance(e, Reconfiguration) and {e.source, e.target} != {"fill", "decode"}:
                raise ConfigError(f"cluster.events[{i}]", "moves go between 'fill' and 'decode'")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "cluster") -> "ClusterConfig":
        d = dict(d)
        reject_unknown_keys(where, d, {f.name for f in dataclasses.fields(cls)})
        if isinstance(d.get("dynamics"), Mapping):
            reject_unknown_keys(f"{where}.dynamics", d["dynamics"], {f.name for f in dataclasses.fields(PoolDynamics)})
            d["dynamics"] = PoolDynamics(**d["dynamics"])
        evs = []
        for i, item in enumerate(d.pop("events", [])):
            item = dict(item)
            kind = item.pop("kind", None)
            if kind not in _EVENTS:
                raise ConfigError(f"{where}.events[{i}].kind", f"{kind!r} is not one of {', '.join(_EVENTS)}")
            reject_unknown_keys(f"{where}.events[{i}]", item, {f.name for f in dataclasses.fields(_EVENTS[kind])})
            evs.append(_EVENTS[kind](**item))
        return cls(events=tuple(evs), **d)


# ------------------------------------------------------------------------------------------
# the result


@dataclass
class DESResult:
    """Per-request records (``requests``: one flat row each), sampled time series (``series``),
    controller actions, headline metrics, and the configuration that produced them."""

    requests: pd.DataFrame
    series: pd.DataFrame
    actions: pd.DataFrame
    metrics: dict
    config: dict

    def to_pandas(self) -> pd.DataFrame:
        return self.requests


# ------------------------------------------------------------------------------------------
# the model


class _Open:
    """No admission control: admit everything at once."""

    sample_period = 1.0

    def reset(self):
        pass

    def update(self, t, m):
        return AdmissionAction(math.inf)


class _DecodeWorker:
    __slots__ = ("index", "ids", "rem", "ctx", "proc", "listening", "online", "draining", "pool_change", "in_leap",
                 "warm_until")

    def __init__(self, index):
        self.index = index
        self.ids = np.empty(0, dtype=np.int64)
        self.rem = np.empty(0, dtype=np.int64)
        self.ctx = np.empty(0, dtype=np.float64)
        self.proc = None
        self.in_leap = False  # only a worker inside a leap is ever interrupted
        self.listening = False
        self.online = True
        self.draining = False
        self.pool_change = None
        self.warm_until = -math.inf


class _FillWorker:
    __slots__ = ("index", "proc", "online", "draining", "current", "link_free_at", "pool_change", "in_step",
                 "warm_until")

    def __init__(self, index):
        self.index = index
        self.proc = None
        self.in_step = False  # only a worker inside a pass is ever interrupted
        self.online = True
        self.draining = False
        self.current: list = []
        self.link_free_at = 0.0
        self.pool_change = None
        self.warm_until = -math.inf


class _Sim:
    def __init__(self, trace: pd.DataFrame, params: DESParams, cfg: ClusterConfig, controller, autoscalers=()):
        self.p, self.cfg = params, cfg
        self.ctrl = controller or _Open()
        self.autoscalers = list(autoscalers)
        self.starting: dict[str, list] = {pool: [] for pool in POOLS}  # start tickets still loading
        self.arrived_since = 0
        self.env = simpy.Environment()
        self.rng = np.random.default_rng(cfg.seed)
        n = len(trace)
        self.n = n
        self.arrival = trace["arrival_s"].to_numpy(dtype=float)
        self.inp = trace["input_tokens"].to_numpy(dtype=np.int64)
        self.given_cached = trace["cached_tokens"].to_numpy(dtype=np.int64) if "cached_tokens" in trace else np.zeros(n, np.int64)
        self.out = np.maximum(trace["output_tokens"].to_numpy(dtype=np.int64), 1)
        self.hashes = trace["hash_ids"].to_numpy() if "hash_ids" in trace else None
        self.closed_sessions = bool(trace.attrs.get("per_session_clock")) and "session_id" in trace
        self.next_turn = np.full(n, -1, dtype=np.int64)
        self.think = np.zeros(n)
        if self.closed_sessions:
            self._link_sessions(trace)
        # records
        f = np.full
        self.r = {k: f(n, np.nan) for k in ("arrival_s", "admitted_s", "fill_start_s", "fill_end_s", "kv_ready_s",
                                               "decode_start_s", "first_token_s", "completion_s", "rejected_s")}
        self.cached = np.zeros(n, dtype=np.int64)
        self.requeues = np.zeros(n, dtype=np.int64)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.rem_tok = np.zeros(n, dtype=np.int64)      # decode tokens still to generate
        self.ctx_tok = np.zeros(n, dtype=np.float64)    # KV tokens held (prompt + generated)
        self.reason = np.full(n, "", dtype=object)
        self.stage = np.zeros(n, dtype=np.int8)  # 0 not arrived, 1 backlog, 2 fill, 3 transfer, 4 ready, 5 decode, 6 done, 7 rejected
        # queues
        self.backlog: deque = deque()
        self.fill_q: deque = deque()  # (id, new tokens still to fill)
        self.ready: deque = deque()
        self.counts = {"arrived": 0, "completed": 0, "rejected": 0, "admitted": 0}
        self.fill_wip = 0
        self.in_transfer = 0
        self.decoding = 0
        self.completed_since = 0
        self.admitted_since = 0
        self.rate_factor = 1.0
        self.link_factor = 1.0
        self.action = AdmissionAction(0.0 if controller is not None else math.inf)
        self.kick = self.env.event()
        self.fill_kick = self.env.event()
        self.ready_kick = self.env.event()
        self.fleet_kick = self.env.event()
        self.fill_workers = [_FillWorker(i) for i in range(cfg.fill_workers)]
        self.decode_workers = [_DecodeWorker(i) for i in range(cfg.decode_workers)]
        self.cache: OrderedDict | set | None
        if cfg.prefix_cache_blocks is None:
            self.cache = set()
        elif cfg.prefix_cache_blocks == 0:
            self.cache = None
        else:
            self.cache = OrderedDict()
        self.hit_tokens = 0
        self.lookup_tokens = 0
        # nominal shape for measurements: slots = KV / mean active context (length-biased, see
        # RequestShape.mean_active_context_tokens), fill capacity in requests/s
        cv2 = float(np.var(self.out) / np.mean(self.out) ** 2) if n else 1.0
        self.nominal_ctx = float(np.mean(self.inp) + np.mean(self.out) * (1 + cv2) / 2) if n else 1.0
        self.kv_limit = params.decode_kv_capacity_tokens * (1.0 - cfg.kv_watermark)
        self.nominal_fill_rps = params.fill_token_budget / params.fill_step_time(params.fill_token_budget) / max(
            float(np.mean(self.inp)) if n else 1.0, 1.0)
        self.snap_rows: list = []
        self.actions: list = []

    # -- sessions ---------------------------------------------------------------------------
    def _link_sessions(self, trace):
        sid = trace["session_id"].to_numpy()
        turn = trace["turn"].to_numpy()
        order = np.lexsort((turn, sid))
        for a, b in zip(order[:-1], order[1:]):
            if sid[a] == sid[b] and sid[a] != "":
                self.next_turn[a] = b
        think = trace["think_time_s"].to_numpy(dtype=float) if "think_time_s" in trace else np.zeros(len(trace))
        self.think = np.nan_to_num(think, nan=0.0)
        # first turns start at their session's clock offset, spread over the trace as given
        first = np.ones(len(trace), dtype=bool)
        first[self.next_turn[self.next_turn >= 0]] = False
        self.is_first = first

    # -- helpers ----------------------------------------------------------------------------
    def _kick(self, name):
        ev = getattr(self, name)
        if not ev.triggered:
            ev.succeed()
        setattr(self, name, self.env.event())

    def in_system(self) -> int:
        return len(self.backlog) + self.fill_wip + self.in_transfer + len(self.ready) + self.decoding

    # -- arrivals and admission ----------------------------------------------------------
    def arrivals(self):
        env = self.env
        idx = np.nonzero(self.is_first)[0] if self.closed_sessions else np.arange(self.n)
        idx = idx[np.argsort(self.arrival[idx], kind="stable")]
        for i in idx:
            dt = self.arrival[i] - env.now
            if dt > 0:
                yield env.timeout(dt)
            self.arrive(int(i))

    def arrive(self, i: int):
        self.counts["arrived"] += 1
        self.arrived_since += 1
        self.r["arrival_s"][i] = self.env.now
        if len(self.backlog) >= self.action.backlog_bound:
            self.reject(i, self.action.reason)
            return
        self.stage[i] = 1
        self.backlog.append(i)
        self._kick("kick")

    def reject(self, i, why):
        self.stage[i] = 7
        self.reason[i] = why
        self.r["rejected_s"][i] = self.env.now
        self.counts["rejected"] += 1

    def admitter(self):
        env = self.env
        tokens = 0.0
        last = env.now
        while True:
            rate = self.action.rate
            if not self.backlog or rate <= 0:
                tokens = 0.0
                yield self.kick
                last = env.now
                continue
            if math.isinf(rate):
                while self.backlog:
                    self.admit(self.backlog.popleft())
                continue
            tokens = min(tokens + rate * (env.now - last), max(1.0, rate * self.ctrl.sample_period))
            last = env.now
            if tokens >= 1.0:
                tokens -= 1.0
                self.admit(self.backlog.popleft())
                continue
            need = (1.0 - tokens) / rate
            if need <= self.ctrl.sample_period:
                yield env.timeout(need)
                tokens, last = 1.0, env.now  # exactly one token accrued (no round-off stall)
            else:
                yield env.timeout(self.ctrl.sample_period)  # re-read the commanded rate

    def admit(self, i):
        self.r["admitted_s"][i] = self.env.now
        self.counts["admitted"] += 1
        self.admitted_since += 1
        self.stage[i] = 2
        self.fill_wip += 1
        self.fill_q.append([i, -1])  # new tokens decided at fill start (prefix cache lookup)
        self._kick("fill_kick")

    # -- prefix cache -----------------------------------------------------------------------
    def cached_tokens_for(self, i) -> int:
        inp = int(self.inp[i])
        if self.cache is None:
            return 0
        if self.hashes is None:
            return int(min(self.given_cached[i], inp)) if isinstance(self.cache, set) else 0
        blocks = self.hashes[i]
        hit = 0
        for h in blocks:
            if h in self.cache:
                hit += 1
                if isinstance(self.cache, OrderedDict):
                    self.cache.move_to_end(h)
            else:
                break
        if isinstance(self.cache, set):
            self.cache.update(blocks)
        else:
            for h in blocks[hit:]:
                self.cache[h] = None
            while len(self.cache) > self.cfg.prefix_cache_blocks:
                self.cache.popitem(last=False)
        return int(min(hit * self.p.block_tokens, inp))

    # -- fill -------------------------------------------------------------------------------
    def fill_worker(self, w: _FillWorker):
        env, p = self.env, self.p
        while True:
            if not w.online:
                yield w.pool_change
                continue
            if w.draining and not w.current:
                return  # a draining worker finishes what it holds and takes nothing new
            if not self.fill_q and not w.current:
                yield self.fill_kick
                continue
            budget = p.fill_token_budget
            step = []  # [id, tokens this step]
            cached_read = 0
            # continue the request this worker was chunking, then take new ones
            while budget > 0 and (w.current or (self.fill_q and not w.draining)):
                item = w.current.pop(0) if w.current else self.fill_q.popleft()
                i, todo = item
                if todo < 0:  # first chunk: consult the prefix cache, record fill start
                    c = self.cached_tokens_for(i)
                    self.cached[i] = c
                    self.hit_tokens += c
                    self.lookup_tokens += int(self.inp[i])
                    cached_read += c
                    todo = max(int(self.inp[i]) - c, 1)
                    self.r["fill_start_s"][i] = env.now
                take = min(todo, budget)
                budget -= take
                step.append((i, take, todo - take))
            tokens = p.fill_token_budget - budget
            w.in_step = True
            try:
                yield env.timeout(p.fill_step_time(tokens, cached_read) / self.speed(w))
            except simpy.Interrupt:  # crash: this step's requests go back to the front of the fill queue
                w.in_step = False
                for i, take, left in reversed(step):
                    self.requeues[i] += 1
                    self.fill_q.appendleft([i, -1])
                w.current = []
                continue
            w.in_step = False
            for i, take, left in step:
                if left > 0:
                    w.current.append([i, left])
                else:
                    self.finish_fill(w, i)

    def finish_fill(self, w: _FillWorker, i):
        env, p = self.env, self.p
        self.r["fill_end_s"][i] = env.now
        if np.isnan(self.r["first_token_s"][i]):
            self.r["first_token_s"][i] = env.now  # prefill emits the first token
        self.rem_tok[i] = max(int(self.out[i]) - 1, 0)  # decode generates the rest
        self.ctx_tok[i] = float(self.inp[i] + 1)
        self.fill_wip -= 1
        self.in_transfer += 1
        self.stage[i] = 3
        bytes_ = (int(self.inp[i])) * p.kv_bytes_per_token
        start = max(env.now, w.link_free_at)
        busy = bytes_ / (p.kv_link_bandwidth * self.link_factor)
        w.link_free_at = start + busy
        env.process(self.kv_transfer(i, start + busy + p.kv_setup_s - env.now))

    def kv_transfer(self, i, delay):
        yield self.env.timeout(delay)
        self.in_transfer -= 1
        self.stage[i] = 4
        self.r["kv_ready_s"][i] = self.env.now
        self.ready.append(i)
        self.wake_decode()

    # -- decode -----------------------------------------------------------------------------
    def wake_decode(self):
        self._kick("ready_kick")
        me = self.env.active_process
        for w in self.decode_workers:  # interrupt one leaping worker that has room
            if w.listening and w.proc is not me and w.online and not w.draining and self.has_room(w, self.ready[0]):
                w.listening = False
                w.proc.interrupt("join")
                break

    def has_room(self, w: _DecodeWorker, i) -> bool:
        """Join if the KV (plus one step of growth for the whole batch) stays under the watermark;
        an empty worker always takes one sequence."""
        if not len(w.ids):
            return True
        return len(w.ids) < self.p.decode_max_batch and \
            float(w.ctx.sum()) + self.ctx_tok[i] + len(w.ids) + 1 <= self.kv_limit

    def join(self, w: _DecodeWorker):
        joined = []
        while self.ready and self.has_room(w, self.ready[0]):
            i = self.ready.popleft()
            joined.append(i)
            # has_room looks at the batch before this join: add each joined context as we go
            w.ctx = np.append(w.ctx, self.ctx_tok[i])
            w.ids = np.append(w.ids, i)
            w.rem = np.append(w.rem, self.rem_tok[i])
        if joined:
            j = np.array(joined, dtype=np.int64)
            first = np.isnan(self.r["decode_start_s"][j])
            self.r["decode_start_s"][j[first]] = self.env.now
            self.stage[j] = 5
            self.decoding += len(j)
        return len(joined)

    def preempt(self, w: _DecodeWorker, count: int):
        """KV full: the newest ``count`` sequences go back to the front of the ready buffer with
        their state (their KV is swapped out, not lost) and rejoin when memory frees."""
        for _ in range(count):
            i = int(w.ids[-1])
            self.rem_tok[i], self.ctx_tok[i] = int(w.rem[-1]), float(w.ctx[-1])
            self.preemptions[i] += 1
            self.stage[i] = 4
            self.ready.appendleft(i)
            w.ids, w.rem, w.ctx = w.ids[:-1], w.rem[:-1], w.ctx[:-1]
        self.decoding -= count

    def complete(self, w: _DecodeWorker, mask):
        env = self.env
        done = w.ids[mask]
        self.r["completion_s"][done] = env.now
        self.stage[done] = 6
        self.counts["completed"] += len(done)
        self.completed_since += len(done)
        self.decoding -= len(done)
        keep = ~mask
        w.ids, w.rem, w.ctx = w.ids[keep], w.rem[keep], w.ctx[keep]
        if self.closed_sessions:
            for i in done:
                nxt = self.next_turn[i]
                if nxt >= 0:
                    env.process(self.return_after_think(int(nxt)))
        if self.ready:
            self.wake_decode()

    def return_after_think(self, i):
        yield self.env.timeout(self.think[i])
        self.arrive(i)

    @staticmethod
    def _steps_within(t0, tk, B, elapsed) -> int:
        """Whole passes completed in ``elapsed`` when pass j takes t0 + tk B j."""
        a = tk * B / 2.0
        b = t0 - tk * B / 2.0
        if a <= 0:
            return int(elapsed // b) if b > 0 else 0
        return int((-b + math.sqrt(b * b + 4 * a * elapsed)) / (2 * a) + 1e-12)

    def decode_worker(self, w: _DecodeWorker):
        env, p = self.env, self.p
        while True:
            if not w.online:
                yield w.pool_change
                continue
            if not w.draining:
                self.join(w)
            B = len(w.ids)
            if B == 0:
                if w.draining:
                    return
                w.listening = False
                yield self.ready_kick
                continue
            # zero-token sequences (output of 1 token) complete immediately
            if (w.rem == 0).any():
                self.complete(w, w.rem == 0)
                continue
            S = float(w.ctx.sum())
            # leap to the next completion, but not past the step that would overflow KV
            k_kv = int((p.decode_kv_capacity_tokens - S) // B)
            if k_kv < 1:
                drop = 1
                while B - drop > 1 and float(w.ctx[:B - drop].sum()) + (B - drop) > p.decode_kv_capacity_tokens:
                    drop += 1
                self.preempt(w, min(drop, B - 1) if B > 1 else 0)
                if B == 1:  # a single sequence larger than the worker: let it run (empty worker rule)
                    k_kv = int(w.rem.min())
                else:
                    continue
            B = len(w.ids)
            k = max(1, min(int(w.rem.min()), k_kv))
            f = self.rate_factor * self.speed(w)  # (a leap keeps its speed if warm-up ends inside it)
            # pass j of the leap: T(B, S/B) + slope x (j tokens of growth per sequence)
            t_now, slope = p.decode_pass(B, S / B)
            t0 = t_now / f
            tk = slope / B / f  # per token of growth of the batch's context sum
            # pass j (0-based) takes t0 + tk x B j: the context sum grows by B per pass
            total = k * t0 + tk * (B * k * (k - 1) / 2.0)
            w.listening = not self.ready and not w.draining and B < p.decode_max_batch and \
                S + B * k < self.kv_limit
            start = env.now
            w.in_leap = True
            crashed = False
            try:
                yield env.timeout(total)
                steps = k
            except simpy.Interrupt as intr:
                w.listening = False
                if intr.cause == "crash":
                    crashed = True
                else:  # finish the pass in progress (at this pass's timing), then re-plan
                    elapsed = env.now - start
                    steps = min(self._steps_within(t0, tk, B, elapsed), k)
                    if steps < k:
                        end = start + (steps + 1) * t0 + tk * B * (steps + 1) * steps / 2.0
                        while env.now < end - 1e-12:
                            try:
                                yield env.timeout(end - env.now)
                            except simpy.Interrupt as again:
                                if again.cause == "crash":
                                    crashed = True
                                    break
                        steps += 1
            w.in_leap = False
            w.listening = False
            if crashed:
                self.crash_decode(w)
                continue
            w.rem -= steps
            w.ctx += steps
            if (w.rem == 0).any():
                self.complete(w, w.rem == 0)

    def crash_decode(self, w: _DecodeWorker):
        for i in w.ids[::-1]:  # KV lost with the worker: back to the front of the backlog, fill again
            self.requeues[i] += 1
            self.stage[i] = 1
            self.backlog.appendleft(int(i))
        self.decoding -= len(w.ids)
        w.ids = np.empty(0, dtype=np.int64)
        w.rem = np.empty(0, dtype=np.int64)
        w.ctx = np.empty(0, dtype=np.float64)
        self._kick("kick")

    # -- events -----------------------------------------------------------------------------
    def event_process(self, e):
        env = self.env
        start = getattr(e, "at_s", getattr(e, "start_s", 0.0))
        yield env.timeout(start)
        if isinstance(e, WorkerCrash):
            pool = self.decode_workers if e.pool == "decode" else self.fill_workers
            if e.index >= len(pool):
                return
            w = pool[e.index]
            if not w.online:
                return
            if e.pool == "decode":
                if w.in_leap:
                    w.proc.interrupt("crash")
                else:
                    self.crash_decode(w)
            elif w.in_step:
                w.proc.interrupt("crash")
            else:  # idle between passes: a chunked request it held goes back to the queue
                for i, left in reversed(w.current):
                    self.requeues[i] += 1
                    self.fill_q.appendleft([i, -1])
                w.current = []
            w.online = False
            w.pool_change = env.event()
            yield env.timeout(e.restart_s)
            w.online = True
            w.pool_change.succeed()
        elif isinstance(e, LinkSlowdown):
            self.link_factor *= e.factor
            yield env.timeout(e.duration_s)
            self.link_factor /= e.factor
        elif isinstance(e, DecodeRateDip):
            self.set_rate_factor(self.rate_factor * e.factor)
            yield env.timeout(e.duration_s)
            self.set_rate_factor(self.rate_factor / e.factor)
        elif isinstance(e, Reconfiguration):
            for _ in range(e.count):
                env.process(self.move_worker(e.source, e.target, e.downtime_s))

    def set_rate_factor(self, f):
        self.rate_factor = f
        me = self.env.active_process
        for w in self.decode_workers:  # re-time leaps at the new speed from the next step
            if w.in_leap and w.proc is not me:
                w.listening = False
                w.proc.interrupt("rate")

    def move_worker(self, source, target, downtime):
        env = self.env
        pool = self.fill_workers if source == "fill" else self.decode_workers
        active = [w for w in pool if w.online and not w.draining]
        if not active:
            return
        w = active[-1]
        w.draining = True
        if source == "decode" and w.listening:
            w.listening = False
        self._kick("fill_kick")
        self._kick("ready_kick")
        yield w.proc  # drains: finishes its current work, then exits
        pool.remove(w)
        yield env.timeout(downtime)
        if target == "fill":
            nw = _FillWorker(len(self.fill_workers))
            self.fill_workers.append(nw)
            nw.proc = env.process(self.fill_worker(nw))
        else:
            nw = _DecodeWorker(len(self.decode_workers))
            self.decode_workers.append(nw)
            nw.proc = env.process(self.decode_worker(nw))
        self.actions.append({"time_s": env.now, "kind": "reconfigured", "source": source, "target": target})

    # -- measurement and control -------------------------------------------------------
    def snapshot(self):
        env, dt = self.env, self.cfg.snapshot_dt
        while True:
            n_dec = sum(1 for w in self.decode_workers if w.online)
            n_fill = sum(1 for w in self.fill_workers if w.online)
            serving = {pool: sum(1 for w in self._pool(pool) if not w.draining) for pool in POOLS}
            starting = {pool: sum(1 for tk in self.starting[pool] if not tk["cancelled"]) for pool in POOLS}
            placed = {pool: sum(1 for tk in self.starting[pool] if tk.get("placed") and not tk["cancelled"])
                      for pool in POOLS}
            # slots as an orchestrator would estimate them: KV capacity / the mean context of the
            # sequences decoding now (the nominal shape's when nothing decodes)
            held = sum(float(w.ctx.sum()) for w in self.decode_workers)
            mean_ctx = held / self.decoding if self.decoding > 0 else self.nominal_ctx
            self.snap_rows.append((env.now, len(self.backlog), self.fill_wip + self.in_transfer, len(self.ready),
                                   self.decoding, self.completed_since / dt, self.admitted_since / dt,
                                   n_dec * self.kv_limit / mean_ctx,
                                   n_fill * self.nominal_fill_rps, serving["fill"], serving["decode"], self.action.rate,
                                   starting["fill"], starting["decode"], self.arrived_since / dt,
                                   len(self.fill_workers) + placed["fill"], len(self.decode_workers) + placed["decode"]))
            self.completed_since = 0
            self.admitted_since = 0
            self.arrived_since = 0
            yield env.timeout(dt)

    def measure(self, t, period: float) -> Measurement:
        k = int(round((t - self.cfg.measurement_delay_s) / self.cfg.snapshot_dt))
        k = min(max(k, 0), len(self.snap_rows) - 1)
        row = self.snap_rows[k]
        # rates are averaged over the sample period (what a scrape of counters gives)
        span = max(1, int(round(period / self.cfg.snapshot_dt)))
        rows = self.snap_rows[max(0, k - span + 1):k + 1]
        comp, adm, arr = (float(np.mean([r[j] for r in rows])) for j in (5, 6, 14))
        return Measurement(time_s=row[0], backlog=row[1], fill_in_progress=row[2], ready=row[3],
                           active_decodes=row[4], completion_rate=comp, admitted_rate=adm,
                           decode_slots=row[7], fill_capacity=row[8], fill_workers=row[9], decode_workers=row[10],
                           fill_workers_starting=row[12], decode_workers_starting=row[13], arrival_rate=arr)

    def control(self):
        env = self.env
        self.ctrl.reset()
        yield env.timeout(self.cfg.snapshot_dt / 2)  # after the first snapshot
        while True:
            a = self.ctrl.update(env.now, self.measure(env.now, self.ctrl.sample_period))
            self.action = a if isinstance(a, AdmissionAction) else AdmissionAction(float(a))
            self.actions.append({"time_s": env.now, "kind": "admission", "rate": self.action.rate,
                                 "backlog_bound": self.action.backlog_bound})
            self._kick("kick")
            yield env.timeout(self.ctrl.sample_period)

    # -- pool autoscaling ------------------------------------------------------------------
    def _pool(self, pool):
        return self.fill_workers if pool == "fill" else self.decode_workers

    def speed(self, w) -> float:
        """A worker in its first ``warmup_s`` runs at ``warmup_factor`` of full speed."""
        return self.cfg.dynamics.warmup_factor if self.env.now < w.warm_until else 1.0

    def autoscale(self, scaler):
        env = self.env
        yield env.timeout(self.cfg.autoscale_start_s + self.cfg.snapshot_dt / 2)
        while True:
            _, scales = split_action(scaler.update(env.now, self.measure(env.now, scaler.sample_period)))
            for a in scales:
                if a.pool not in POOLS:
                    raise ConfigError(f"{type(scaler).__name__}.pool", f"{a.pool!r} is not one of {POOLS}")
                self.reconcile(a.pool, max(int(a.replicas), 0), type(scaler).__name__)
            yield env.timeout(scaler.sample_period)

    def reconcile(self, pool: str, target: int, who: str):
        """Deployment semantics: start workers up to ``target`` provisioned (serving + starting);
        above it cancel starting ones first (newest first), then drain the newest serving ones."""
        serving = [w for w in self._pool(pool) if not w.draining]
        starting = [tk for tk in self.starting[pool] if not tk["cancelled"]]
        before = len(serving) + len(starting)
        diff = target - before
        if diff == 0:
            return
        if diff > 0:
            for _ in range(diff):
                ticket = {"cancelled": False}
                self.starting[pool].append(ticket)
                self.env.process(self.start_worker(pool, ticket))
        else:
            for tk in starting[::-1][:-diff]:
                tk["cancelled"] = True
            self._kick("fleet_kick")
            for w in serving[::-1][:max(-diff - len(starting), 0)]:
                self.env.process(self.retire(pool, w))
        self.actions.append({"time_s": self.env.now, "kind": "scale", "pool": pool, "from": before, "to": target,
                             "controller": who})

    def _in_use(self) -> int:
        """Workers holding a slot of a fixed fleet: in a pool (serving or draining) or starting."""
        placed = sum(1 for pool in POOLS for tk in self.starting[pool] if tk.get("placed") and not tk["cancelled"])
        return len(self.fill_workers) + len(self.decode_workers) + placed

    def start_worker(self, pool: str, ticket: dict):
        env, dyn = self.env, self.cfg.dynamics
        # a fixed fleet: wait (as a pending pod, counted in transit) until a worker is free
        while dyn.fleet_size is not None and self._in_use() >= dyn.fleet_size and not ticket["cancelled"]:
            yield self.fleet_kick
        ticket["placed"] = True
        if not ticket["cancelled"]:
            yield env.timeout(dyn.startup_s)
        self.starting[pool].remove(ticket)
        if ticket["cancelled"]:
            return
        workers = self._pool(pool)
        w = (_FillWorker if pool == "fill" else _DecodeWorker)(len(workers))
        w.warm_until = env.now + dyn.warmup_s
        workers.append(w)
        w.proc = env.process(self.fill_worker(w) if pool == "fill" else self.decode_worker(w))
        if pool == "decode" and self.ready:
            self.wake_decode()

    def retire(self, pool: str, w):
        w.draining = True
        if pool == "decode":
            w.listening = False
        self._kick("fill_kick")
        self._kick("ready_kick")
        if w.proc is not None and w.proc.is_alive:
            yield w.proc  # finishes its current work (billed until then), then leaves
        if w in self._pool(pool):
            self._pool(pool).remove(w)
        self._kick("fleet_kick")  # a worker of a fixed fleet is free for another role

    def progress(self, horizon):
        env = self.env
        t0 = time.perf_counter()
        for k in range(1, 21):
            yield env.timeout(horizon / 20)
            print(f"\rsimulating: {5 * k:3d} % of {horizon:.0f} s simulated, {self.counts['arrived']} arrivals, "
                  f"{time.perf_counter() - t0:.1f} s wall", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)

    # -- run --------------------------------------------------------------------------------
    def run(self, duration):
        env = self.env
        env.process(self.arrivals())
        env.process(self.admitter())
        env.process(self.snapshot())
        if not isinstance(self.ctrl, _Open):
            env.process(self.control())
        for w in self.fill_workers:
            w.proc = env.process(self.fill_worker(w))
        for w in self.decode_workers:
            w.proc = env.process(self.decode_worker(w))
        for e in self.cfg.events:
            env.process(self.event_process(e))
        for scaler in self.autoscalers:
            scaler.reset()
            env.process(self.autoscale(scaler))
        show = self.cfg.progress if self.cfg.progress is not None else sys.stderr.isatty()
        if show:
            env.process(self.progress(duration))
        env.run(until=duration)


def _percentile(x, q):
    x = x[np.isfinite(x)]
    return float(np.percentile(x, q)) if len(x) else None


def simulate(trace: pd.DataFrame, params: DESParams, cluster: ClusterConfig = ClusterConfig(),
             controller=None, autoscalers=()) -> DESResult:
    """Replay ``trace`` (a request table) through the cluster with ``controller`` (None: admit all)
    and pool ``autoscalers`` (each returns :class:`tokenfactory.signals.ScaleAction`; workers
    start, warm up and drain as ``cluster.dynamics`` says).

    Runs until ``cluster.duration_s`` (default: the last arrival + ``drain_s``). Raises
    :class:`ConservationError` if any request is unaccounted for."""
    if not len(trace):
        raise ConfigError("trace", "the request table is empty")
    for col in ("arrival_s", "input_tokens", "output_tokens"):
        if col not in trace:
            raise ConfigError("trace", f"missing column {col!r}")
    sim = _Sim(trace, params, cluster, controller, autoscalers)
    last = float(np.max(sim.arrival)) if not sim.closed_sessions else float(np.max(sim.arrival[sim.is_first]))
    duration = cluster.duration_s or last + cluster.drain_s
    wall0 = time.perf_counter()
    sim.run(duration)
    wall = time.perf_counter() - wall0
    # conservation: every arrival is completed, rejected with a reason, or in flight
    arrived = sim.counts["arrived"]
    done, rej = sim.counts["completed"], sim.counts["rejected"]
    in_flight = sim.in_system()
    by_stage = np.bincount(sim.stage, minlength=8)
    if arrived != done + rej + in_flight or by_stage[6] != done or by_stage[7] != rej \
            or by_stage[1:6].sum() != in_flight or (sim.reason[sim.stage == 7] == "").any():
        raise ConservationError(f"request simulator lost requests: arrived {arrived} != completed {done} + "
                                f"rejected {rej} + in flight {in_flight} (stages {by_stage.tolist()})")
    rec = pd.DataFrame(sim.r)
    rec.insert(0, "request", np.arange(sim.n))
    rec["input_tokens"] = sim.inp
    rec["cached_tokens"] = sim.cached
    rec["output_tokens"] = sim.out
    rec["requeues"] = sim.requeues
    rec["preemptions"] = sim.preemptions
    rec["state"] = pd.Categorical.from_codes(np.clip(sim.stage, 0, 7).astype(int),
                                             ["not_arrived", "backlog", "fill", "transfer", "ready", "decode",
                                              "completed", "rejected"])
    rec["reject_reason"] = sim.reason
    ttft = rec["first_token_s"] - rec["arrival_s"]
    tpot = (rec["completion_s"] - rec["first_token_s"]) / np.maximum(rec["output_tokens"] - 1, 1)
    rec["ttft_s"], rec["tpot_s"] = ttft, tpot
    series = pd.DataFrame(sim.snap_rows, columns=["time_s", "backlog", "fill_in_progress", "ready", "decoding",
                                                  "completion_rate", "admitted_rate", "decode_slots",
                                                  "fill_capacity", "fill_workers", "decode_workers", "command",
                                                  "fill_workers_starting", "decode_workers_starting", "arrival_rate",
                                                  "fill_workers_billed", "decode_workers_billed"])
    scale_rows = [a for a in sim.actions if a.get("kind") == "scale"]
    n_scale = len(scale_rows)
    ok = (rec["state"] == "completed") & (ttft <= cluster.slo_ttft_s) & (tpot <= cluster.slo_tpot_s)
    arrived_mask = rec["state"] != "not_arrived"
    metrics = {
        "requests": int(arrived), "completed": int(done), "rejected": int(rej), "in_flight_end": int(in_flight),
        "rejected_by_reason": {r: int((rec["reject_reason"] == r).sum()) for r in REJECT_REASONS},
        "requeued": int(sim.requeues.sum()), "preempted": int(sim.preemptions.sum()),
        "ttft_p50": _percentile(ttft.to_numpy(), 50), "ttft_p99": _percentile(ttft.to_numpy(), 99),
        "tpot_p50": _percentile(tpot.to_numpy(), 50), "tpot_p99": _percentile(tpot.to_numpy(), 99),
        "slo_attainment": float(ok.sum() / max(arrived_mask.sum(), 1)),
        "goodput_tokens_per_s": float(rec.loc[ok, "output_tokens"].sum() / duration),
        "throughput_requests_per_s": float(done / duration),
        "prefix_hit_ratio": float(sim.hit_tokens / sim.lookup_tokens) if sim.lookup_tokens else 0.0,
        "gpu_hours": float(((series["fill_workers_billed"] + series["decode_workers_billed"]).sum()
                            * cluster.snapshot_dt if cluster.dynamics.fleet_size is None
                            else cluster.dynamics.fleet_size * duration) / 3600.0 * cluster.dynamics.gpus_per_worker),
        "busy_gpu_hours": float((series["fill_workers_billed"] + series["decode_workers_billed"]).sum()
                                * cluster.snapshot_dt / 3600.0 * cluster.dynamics.gpus_per_worker),
        "scale_actions": n_scale, "actions_per_hour": float(n_scale / (duration / 3600.0)),
        "reversals_per_hour": float(count_reversals(scale_rows) / (duration / 3600.0)),
        "duration_s": duration, "wall_seconds": wall, "sim_requests_per_wall_s": float(arrived / wall) if wall > 0 else None,
    }
    cfg = {"cluster": dataclasses.asdict(cluster), "params": {k: v for k, v in dataclasses.asdict(params).items()},
           "controller": type(controller).__name__ if controller is not None else "open",
           "controller_params": controller.params() if hasattr(controller, "params") else {},
           "autoscalers": [{"name": type(a).__name__, **(a.params() if hasattr(a, "params") else {})}
                           for a in autoscalers]}
    return DESResult(rec, series, pd.DataFrame(sim.actions), metrics, cfg)
