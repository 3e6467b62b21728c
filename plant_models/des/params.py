"""The request simulator's service times: tables sampled from the service model."""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenfactory.plant_models.des.work import PassWork, trilinear
from tokenfactory.plant_models.roofline import PassTime, Worker
from tokenfactory.plant_models.service import (
    DEFAULT_KV_SETUP_S,
    DEFAULT_KV_STRIPES,
    KVLink,
    RequestShape,
    ServiceModel,
    chunk_context_s,
    chunked_fill_s,
)
from tokenfactory.core.validation import ConfigError, check_int, check_number

__all__ = ["DESParams"]


@dataclass(frozen=True)
class DESParams:
    """Service-time model of one fill and one decode worker (seconds, tokens, bytes).

    * a fill step takes up to ``fill_token_budget`` new tokens, at most
      :attr:`replica_chunk_tokens` of them from one request (one sequence, one replica)
    * fill pass time = interp(tokens in the step; ``fill_step_tokens``, ``fill_step_s``)
      + the context term: each chunk of n new tokens after c context tokens (cached prefix plus
      the prompt's earlier chunks) costs x = ``fill_s_per_token_pair`` (n c + (n^2 - p^2) / 2)
      + ``fill_s_per_context_token`` c on its attention replica, p being the uniform piece per
      replica the table assumes (step tokens / ``attention_replicas``; the n^2 term only when
      n > p), and a step takes max(sum x / ``attention_replicas``, max x) for them (chunks spread
      over the replicas, one sequence on one replica), plus the legacy ``fill_s_per_cached_token`` x cached tokens read by requests
      starting in the step (0 from :meth:`from_service`)
    * KV of a sequence of c tokens = ``sequence_state_bytes`` + ``kv_bytes_per_token`` x c (the
      service model's law: fixed state of linear/local-attention layers plus per-token KV)
    * KV transfer = blob bytes / ``kv_link_bandwidth`` (the fill worker's striped links, one
      transfer at a time) + ``kv_setup_s``
    * decode pass time = T(batch, mean context), bilinear in the roofline table
      (``decode_batches`` x ``decode_contexts`` -> ``decode_table_s``); within a leap the context
      grows by one token per step and T is extended linearly with its local slope in context
    * a decode worker holds at most ``decode_kv_capacity_bytes`` of KV, allocated as tokens are
      generated (paged, as vLLM and SGLang do); see ``ClusterConfig.kv_watermark``
    * a mixed pass of an aggregated worker (decodes and a prefill chunk in one pass) = the decode
      pass + ``mixed_extra_s`` (B, mean context, chunk tokens), trilinear; the extra is the
      service model's :meth:`~tokenfactory.plant_models.service.ServiceModel.mixed_step_s` minus
      the decode pass at the grid points (a fill step for B = 0), plus the chunks' context term

    Build with :meth:`from_service` (every table sampled from one
    :class:`tokenfactory.plant_models.service.ServiceModel`, exact at its nominal request).

    Parameters
    ----------
    fill_token_budget : int
        New tokens a fill worker takes per step (>= 1).
    fill_step_tokens, fill_step_s : tuple of float
        Fill step time (s) by tokens in the step (increasing tokens, times > 0).
    fill_s_per_cached_token : float
        Extra fill time per cached prefix token read (s, >= 0).
    kv_bytes_per_token : float
        KV bytes each context token adds (>= 0).
    kv_link_bandwidth : float
        Bytes/s of one KV transfer (> 0, inf allowed).
    kv_setup_s : float
        Fixed cost per KV transfer (s, >= 0).
    decode_kv_capacity_bytes : float
        KV bytes a decode worker holds (> 0, inf allowed).
    decode_batches, decode_contexts : tuple of float
        Grid of the decode table (increasing; at least two contexts).
    decode_table_s : tuple of tuple of float
        Decode pass time (s) by batch (rows) and mean context (columns).
    sequence_state_bytes : float
        Fixed KV state of one sequence (bytes, >= 0).
    decode_max_batch : int
        Most sequences a decode worker batches (>= 1).
    block_tokens : int
        Tokens per prefix-cache block (>= 1).
    attention_replicas : int
        Attention replicas a fill step's chunks spread over (>= 1).
    fill_s_per_context_token : float
        Fill time per context token before a chunk, on its replica (s, >= 0).
    fill_s_per_token_pair : float
        Fill time per (new token x context token) pair of a chunk, on its replica (s, >= 0).
    mixed_batches, mixed_contexts, mixed_tokens : tuple of float
        Grid of ``mixed_extra_s`` (empty: no aggregated workers).
    mixed_extra_s : nested tuple of float
        What a chunk adds to a decode pass (s), by batch (0 included), context and chunk tokens.
    work : PassWork or None
        FLOPs and HBM bytes per pass, for utilisation (not compared).
    provenance : mapping
        What the tables were sampled from (not compared).
    """

    fill_token_budget: int
    fill_step_tokens: tuple[float, ...]
    fill_step_s: tuple[float, ...]
    fill_s_per_cached_token: float
    kv_bytes_per_token: float
    kv_link_bandwidth: float
    kv_setup_s: float
    decode_kv_capacity_bytes: float
    decode_batches: tuple[float, ...]
    decode_contexts: tuple[float, ...]
    decode_table_s: tuple[tuple[float, ...], ...]
    sequence_state_bytes: float = 0.0
    decode_max_batch: int = 1_000_000
    block_tokens: int = 512
    attention_replicas: int = 1
    fill_s_per_context_token: float = 0.0
    fill_s_per_token_pair: float = 0.0
    mixed_batches: tuple[float, ...] = ()
    mixed_contexts: tuple[float, ...] = ()
    mixed_tokens: tuple[float, ...] = ()
    mixed_extra_s: tuple = ()
    work: PassWork | None = field(default=None, compare=False)
    provenance: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        check_int("des.fill_token_budget", self.fill_token_budget, low=1)
        for f in ("fill_s_per_cached_token", "kv_bytes_per_token", "kv_setup_s", "sequence_state_bytes",
                  "fill_s_per_context_token", "fill_s_per_token_pair"):
            check_number(f"des.{f}", getattr(self, f), low=0.0)
        for f in ("kv_link_bandwidth", "decode_kv_capacity_bytes"):
            check_number(f"des.{f}", getattr(self, f), low=0.0, low_inclusive=False, allow_inf=True)
        check_int("des.decode_max_batch", self.decode_max_batch, low=1)
        check_int("des.block_tokens", self.block_tokens, low=1)
        check_int("des.attention_replicas", self.attention_replicas, low=1)
        if self.mixed_extra_s:
            grids = (self.mixed_batches, self.mixed_contexts, self.mixed_tokens)
            if any(len(g) < 2 or any(a >= b for a, b in zip(g, g[1:])) for g in grids) or \
                    np.shape(self.mixed_extra_s) != tuple(len(g) for g in grids) or self.mixed_batches[0] != 0:
                raise ConfigError("des.mixed_extra_s", "needs increasing grids of >= 2 batches (from 0), contexts "
                                  "and chunk tokens, and one time per point")
        for xs, ys, name in ((self.fill_step_tokens, self.fill_step_s, "fill_step"),
                             (self.decode_batches, [r[0] for r in self.decode_table_s], "decode_table_s")):
            if len(xs) < 1 or len(xs) != len(ys) or any(a >= b for a, b in zip(xs, xs[1:])):
                raise ConfigError(f"des.{name}", "needs increasing x values and one time per x")
            if any(v <= 0 for v in ys):
                raise ConfigError(f"des.{name}", "times must be > 0")
        c = self.decode_contexts
        if len(c) < 2 or any(a >= b for a, b in zip(c, c[1:])) or any(len(r) != len(c) for r in self.decode_table_s):
            raise ConfigError("des.decode_contexts", "needs >= 2 increasing contexts and one time per (batch, context)")
        # pure-Python copies for the hot paths (numpy's per-call overhead dominates at this size)
        object.__setattr__(self, "_tl", [list(map(float, r)) for r in self.decode_table_s])
        object.__setattr__(self, "_bl", list(map(float, self.decode_batches)))
        object.__setattr__(self, "_cl", list(map(float, c)))
        object.__setattr__(self, "_ft", list(map(float, self.fill_step_tokens)))
        object.__setattr__(self, "_fs", list(map(float, self.fill_step_s)))

    # -- fill and transfer ----------------------------------------------------------------
    def fill_step_time(self, tokens: float, cached_read: float = 0.0) -> float:
        """Time of a fill step of ``tokens`` new tokens that reads ``cached_read`` cached tokens."""
        x, y = self._ft, self._fs
        if tokens <= x[0]:
            base = y[0]
        elif tokens >= x[-1]:
            base = y[-1]
        else:
            k = bisect_right(x, tokens) - 1
            base = y[k] + (y[k + 1] - y[k]) * (tokens - x[k]) / (x[k + 1] - x[k])
        return base + self.fill_s_per_cached_token * cached_read

    @property
    def replica_chunk_tokens(self) -> int:
        """Most new tokens one request takes in a step: a sequence's attention runs on one
        replica, whose share of the step's budget is ``fill_token_budget / attention_replicas``
        (DP attention schedules its own chunks per replica, as SGLang's does)."""
        return max(1, self.fill_token_budget // self.attention_replicas)

    def chunk_context_s(self, tokens: float, context: float, step_tokens: float = 0.0) -> float:
        """What a chunk of ``tokens`` costs on its attention replica beyond the fill table: the
        ``context`` tokens before it (cached prefix plus the prompt's earlier chunks), and its own
        causal attention past the uniform piece (``step_tokens`` / replicas) the table assumes.

        Parameters
        ----------
        tokens : float
            The chunk's new tokens.
        context : float
            Tokens before it.
        step_tokens : float
            New tokens of the whole step (0: no own-attention term).

        Returns
        -------
        float
            Seconds.
        """
        return chunk_context_s(self.fill_s_per_token_pair, self.fill_s_per_context_token, self.attention_replicas,
                               tokens, context, step_tokens)

    def request_fill_s(self, new_tokens: float, cached_tokens: float = 0.0, step_floor_s: float = 0.0,
                       step_tokens: float | None = None) -> float:
        """Seconds of one request's chunked fill on these tables
        (:func:`tokenfactory.plant_models.service.chunked_fill_s`, the function
        :meth:`ServiceModel.request_fill_s` evaluates on the roofline): alone on a worker by
        default - what the simulator's fill steps take for a request with no other work - or with
        every step lasting at least ``step_floor_s``. A tiered cache's load stall is not included.

        Parameters
        ----------
        new_tokens : float
            New tokens to compute.
        cached_tokens : float
            Cached prefix (>= 0).
        step_floor_s : float
            Least time of each step (s, >= 0).
        step_tokens : float, optional
            New tokens of each of its steps (default: its chunk alone).

        Returns
        -------
        float
            Seconds.
        """
        return chunked_fill_s(new_tokens, cached_tokens, self.replica_chunk_tokens, self.fill_step_time,
                              self.fill_s_per_token_pair, self.fill_s_per_context_token, self.attention_replicas,
                              step_floor_s, step_tokens) + self.fill_s_per_cached_token * cached_tokens

    def fill_seconds(self, new_tokens: float, cached_tokens: float = 0.0) -> float:
        """Worker seconds one request of ``new_tokens`` after ``cached_tokens`` takes from a fill
        worker streaming full steps: its share of the steps, and its chunks' context on their
        replica spread over the replicas (what the orchestrator's fill capacity figure assumes).

        Parameters
        ----------
        new_tokens : float or array
            Tokens to compute (>= 1).
        cached_tokens : float or array
            Cached prefix (>= 0).

        Returns
        -------
        float or ndarray
            One figure per request for arrays.
        """
        budget = self.fill_token_budget
        n = self.replica_chunk_tokens
        k = np.maximum(np.divide(new_tokens, n), 1.0)
        ctx = (self.fill_s_per_token_pair * np.minimum(n, new_tokens) + self.fill_s_per_context_token) * (
            k * cached_tokens + n * k * (k - 1) / 2.0)
        out = (np.divide(new_tokens, budget) * self.fill_step_time(budget) + ctx / self.attention_replicas
               + self.fill_s_per_cached_token * np.asarray(cached_tokens))
        return float(out) if np.ndim(out) == 0 else out

    def mixed_extra(self, batch: float, mean_context: float, tokens: float) -> float:
        """What a chunk of ``tokens`` new tokens (no context before it) adds to a decode pass of
        ``batch`` at ``mean_context`` (a fill step when ``batch`` is 0).

        Parameters
        ----------
        batch : float
            Decodes in the pass (>= 0).
        mean_context : float
            Their mean context.
        tokens : float
            The chunk's new tokens.

        Returns
        -------
        float
            Seconds.
        """
        if not self.mixed_extra_s:
            raise ConfigError("des.mixed_extra_s", "these parameters have no mixed-pass table (aggregated "
                              "workers need DESParams.from_service)")
        return trilinear(self.mixed_batches, self.mixed_contexts, self.mixed_tokens, self.mixed_extra_s,
                         min(batch, self.mixed_batches[-1]), mean_context,
                         min(max(tokens, self.mixed_tokens[0]), self.mixed_tokens[-1]))

    def kv_bytes(self, context_tokens: float) -> float:
        """KV bytes one sequence of ``context_tokens`` holds."""
        return self.sequence_state_bytes + self.kv_bytes_per_token * context_tokens

    def kv_transfer_s(self, input_tokens: float) -> float:
        """Time to move the KV of an ``input_tokens`` fill over an idle link."""
        return self.kv_bytes(input_tokens) / self.kv_link_bandwidth + self.kv_setup_s

    # -- decode ---------------------------------------------------------------------------
    def slots(self, context_tokens: float) -> int | float:
        """Most sequences of ``context_tokens`` a decode worker's KV holds (inf without a limit)."""
        per = self.kv_bytes(context_tokens)
        if math.isinf(self.decode_kv_capacity_bytes) or per <= 0:
            return math.inf
        return int(self.decode_kv_capacity_bytes // per)

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

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def from_service(cls, service: ServiceModel, *, fill_token_budget: int | None = None) -> "DESParams":
        """Sample every table from the service model (the same source as the fluid plant).

        The fill table has 10 step sizes up to the token budget plus the nominal fill step (one
        prompt per attention replica, when it fits the budget); the decode table 16 batches up to
        the slots at a 64-token context plus the nominal slots, by 12 contexts from 64 to 262,144
        tokens, 524,288 to 2,097,152 for long contexts, and the nominal mean active context - so the
        nominal request's pass times equal the service model's exactly. The context term of fill
        chunks is the service model's ``fill_context_costs``; the mixed-pass table (aggregated
        workers) has 7 batches from 0, 4 contexts from 64 to 2,097,152 and 5 chunk sizes up to the
        budget; FLOPs and bytes per pass (:class:`PassWork`) are read off the same roofline passes.

        Parameters
        ----------
        service : ServiceModel
            Workers, nominal request and KV link.
        fill_token_budget : int, optional
            New tokens per fill step (default: the service model's budget).

        Returns
        -------
        DESParams
        """
        s = service
        dp = s.dp_attention
        budget = int(fill_token_budget or s.fill_token_budget)
        check_int("des.fill_token_budget", budget, low=1)
        grid = set(np.geomspace(dp, max(budget, dp), 10).round().astype(int).tolist())
        nominal_step = dp * s.shape.prompt_tokens
        if nominal_step <= budget:
            grid.add(nominal_step)
        grid = sorted(grid)
        fill_passes = [s.fill_worker.midfill(max(1.0, n / dp), 0, sequences=dp) for n in grid]
        fill_s = tuple(s.fill_step_s(n) for n in grid)
        nominal_slots, nominal_ctx = s.decode_slots, s.decode_context_tokens
        batches = sorted(set(np.geomspace(1, max(2, s.slots(64)), 16).round().astype(int).tolist()) | {nominal_slots})
        contexts = sorted(set(np.geomspace(64, 262144, 12).round().astype(int).tolist())
                          | {524288, 1048576, 2097152, nominal_ctx})
        dw = s.decode_worker
        dec = [[dw.decode(int(b), int(c), check_memory=False) for c in contexts] for b in batches]
        table = tuple(tuple(p.time_s for p in row) for row in dec)
        pair_s, ctx_s = s.fill_context_costs
        # the mixed (aggregated) pass: what a chunk adds to a decode pass
        m_batches = sorted({0, *np.geomspace(1, max(2, s.slots(64)), 6).round().astype(int).tolist()})
        m_contexts = np.geomspace(64, 2097152, 4).round().tolist()
        m_tokens = sorted({1, *np.geomspace(dp, max(budget, dp + 1), 4).round().astype(int).tolist()})
        mixed_s, mixed_f, mixed_b = [], [], []
        for b in m_batches:
            rs, rf, rb = [], [], []
            for c in m_contexts:
                base = dw.decode(b, c, check_memory=False) if b else None
                ts, fs, bs = [], [], []
                for n in m_tokens:
                    if b:
                        mp = dw.mixed(b, c, n)
                        ts.append(mp.time_s - base.time_s)
                        fs.append(_flops(mp) - _flops(base))
                        bs.append(_bytes(mp) - _bytes(base))
                    else:
                        fp = s.fill_worker.midfill(max(1.0, n / dp), 0, sequences=dp)
                        ts.append(s.fill_step_s(n))
                        fs.append(_flops(fp))
                        bs.append(_bytes(fp))
                rs.append(tuple(ts))
                rf.append(tuple(fs))
                rb.append(tuple(bs))
            mixed_s.append(tuple(rs))
            mixed_f.append(tuple(rf))
            mixed_b.append(tuple(rb))
        work = PassWork(
            attainable_flops=dw.accelerator.peak_flops(dw.model.weight_precision) * dw.num_gpus * dw.efficiency.compute,
            attainable_bandwidth=dw.accelerator.hbm_bandwidth * dw.num_gpus * dw.efficiency.memory,
            fill_tokens=tuple(map(float, grid)), fill_flops=tuple(_flops(p) for p in fill_passes),
            fill_bytes=tuple(_bytes(p) for p in fill_passes),
            context_flops=s.chunk_context_fit(_flops), context_bytes=s.chunk_context_fit(_bytes),
            decode_batches=tuple(map(float, batches)), decode_contexts=tuple(map(float, contexts)),
            decode_flops=tuple(tuple(_flops(p) for p in row) for row in dec),
            decode_bytes=tuple(tuple(_bytes(p) for p in row) for row in dec),
            mixed_batches=tuple(map(float, m_batches)), mixed_contexts=tuple(m_contexts),
            mixed_tokens=tuple(map(float, m_tokens)), mixed_flops=tuple(mixed_f), mixed_bytes=tuple(mixed_b))
        return cls(fill_token_budget=budget, fill_step_tokens=tuple(map(float, grid)), fill_step_s=fill_s,
                   fill_s_per_cached_token=0.0, kv_bytes_per_token=s.kv_bytes_per_token,
                   sequence_state_bytes=s.sequence_state_bytes, kv_link_bandwidth=s.kv_link_bandwidth,
                   kv_setup_s=s.link.setup_s, decode_kv_capacity_bytes=s.kv_capacity_bytes,
                   decode_batches=tuple(map(float, batches)), decode_contexts=tuple(map(float, contexts)),
                   decode_table_s=table, attention_replicas=dp, fill_s_per_context_token=ctx_s,
                   fill_s_per_token_pair=pair_s, mixed_batches=tuple(map(float, m_batches)),
                   mixed_contexts=tuple(m_contexts), mixed_tokens=tuple(map(float, m_tokens)),
                   mixed_extra_s=tuple(mixed_s), work=work, provenance=s.to_dict())

    @classmethod
    def from_workers(cls, fill_worker: Worker, decode_worker: Worker, *, kv_stripes: int = DEFAULT_KV_STRIPES,
                     kv_setup_s: float = DEFAULT_KV_SETUP_S, fill_token_budget: int | None = None,
                     shape: RequestShape = RequestShape()) -> "DESParams":
        """:meth:`from_service` of ``ServiceModel(fill_worker, decode_worker, shape, KVLink(kv_stripes,
        kv_setup_s))``."""
        return cls.from_service(ServiceModel(fill_worker, decode_worker, shape, KVLink(kv_stripes, kv_setup_s)),
                                fill_token_budget=fill_token_budget)


def _flops(p: PassTime) -> float:
    """FLOPs of a whole pass (every micro-batch)."""
    return p.microbatches * sum(ph.flops for ph in p.phases) if p.mode != "prefill" and p.mode != "midfill" \
        else sum(ph.flops for ph in p.phases)


def _bytes(p: PassTime) -> float:
    """HBM bytes of a whole pass (every micro-batch)."""
    return p.microbatches * sum(ph.hbm_bytes for ph in p.phases) if p.mode != "prefill" and p.mode != "midfill" \
        else sum(ph.hbm_bytes for ph in p.phases)
