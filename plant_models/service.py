"""The service model: the one derivation of service times and memory every plant samples.

The fluid plant, the pool model, the request simulator and the capacity planner are all built
from a :class:`ServiceModel` - a fill worker, a decode worker, a request shape and the KV link -
so they agree on what a request costs (``tests/test_service.py`` checks them against it for every
model preset). It is a thin layer over the roofline (:class:`tokenfactory.plant_models.roofline.Worker`):

* **fill** - ``fill_pass``: one prompt per attention replica (every GPU works), its time is the
  fill latency and its throughput the fill rate; ``fill_step_s``: a chunked-prefill step of a token
  budget, the request simulator's unit of fill work, plus the marginal cost of cached prefix tokens
  read in the step.
  ``fill_context_costs``: what a fill chunk pays for the context before it (cached prefix and
  the prompt's own earlier chunks) on its attention replica, per context token and per (new
  token x context token) pair.
* **decode** - ``decode_pass_s(batch, context)``: the roofline pass time (TPOT) of a batch at a
  context; ``decode_context_tokens``: the mean context an active decode holds at the shape.
* **aggregated** - ``mixed_step_s(batch, context, chunk)``: a pass of a worker that decodes and
  prefills a chunk in the same pass (no KV transfer; the decodes' TPOT grows with the chunk).
* **KV** - one affine law for what a sequence holds: ``kv_bytes(context) = sequence_state_bytes +
  kv_bytes_per_token x context``, the tangent of :meth:`MoEModel.kv_bytes` at the shape's mean
  active context. For full- and linear-attention models that is the model's law itself (the
  fixed state is what linear-attention layers keep per sequence). A model's KV is concave in
  context (a local-attention window stops growing), so for local attention the tangent is exact
  on the nominal side of the window and an upper bound on the other. ``slots(context)`` = KV
  capacity // kv_bytes(context), the roofline's own count at the nominal context.
* **KV link** - :class:`KVLink`: a blob moves over ``stripes`` of the fill worker's scale-out NICs
  plus a fixed ``setup_s``.

Defaults live here and nowhere else: :data:`DEFAULT_KV_STRIPES`, :data:`DEFAULT_KV_SETUP_S`,
:data:`DEFAULT_FILL_TOKENS_PER_REPLICA`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenfactory.plant_models.roofline import PassTime, Worker
from tokenfactory.core.validation import ConfigError, check_int, check_number

__all__ = ["DEFAULT_KV_STRIPES", "DEFAULT_KV_SETUP_S", "DEFAULT_FILL_TOKENS_PER_REPLICA", "RequestShape",
           "KVLink", "ServiceModel", "mean_active_context", "chunk_context_s", "chunked_fill_s"]

#: NICs a KV blob is striped over: one per GPU of an 8-GPU fill worker (an ASSUMPTION: transfer
#: engines such as Mooncake's and NIXL stripe one transfer over the node's RDMA NICs)
DEFAULT_KV_STRIPES = 8
#: fixed cost of one KV transfer (connection/registration and completion signalling), seconds;
#: an ASSUMPTION of the order of a few RDMA round trips plus the scheduler's hand-off
DEFAULT_KV_SETUP_S = 0.005
#: chunked-prefill budget: new tokens per attention replica per fill step (an ASSUMPTION, the
#: order of vLLM's ``max_num_batched_tokens`` and SGLang's ``chunked_prefill_size`` settings)
DEFAULT_FILL_TOKENS_PER_REPLICA = 2048


def mean_active_context(input_tokens: float, output_tokens: float, output_cv: float) -> float:
    """Mean context an active decode holds when KV is allocated as tokens are generated.

    Sequences that generate longer stay longer, so the active population's mean age is
    E[L^2] / (2 E[L]) = L (1 + cv^2) / 2 (renewal theory's length-biased sampling); the context is
    the input (prompt + cached prefix) plus that age.

    Parameters
    ----------
    input_tokens : float
        Prompt plus cached prefix tokens of the mean request.
    output_tokens : float
        Mean output tokens.
    output_cv : float
        Coefficient of variation of output lengths (1 for exponential, 0 for constant).

    Returns
    -------
    float
        Mean context in tokens.
    """
    return input_tokens + output_tokens * (1.0 + output_cv ** 2) / 2.0


def chunk_context_s(pair_s: float, context_s: float, replicas: int, tokens: float, context: float,
                    step_tokens: float = 0.0) -> float:
    """What a fill chunk of ``tokens`` new tokens costs on its attention replica beyond the fill
    step's table time: ``a n c + b c`` for the ``context`` c before it (cached prefix and the
    prompt's earlier chunks; ``(a, b)`` = :attr:`ServiceModel.fill_context_costs`), plus its own
    causal attention past the uniform piece p = ``step_tokens`` / ``replicas`` the step's table
    time assumes, a (n^2 - p^2) / 2 (only when n > p). The one formula the request simulator's
    fill steps and the per-request fill time (:func:`chunked_fill_s`) use.

    Parameters
    ----------
    pair_s, context_s : float
        a (s per new x context token pair) and b (s per context token).
    replicas : int
        Attention replicas the step's tokens spread over.
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
    piece = step_tokens / replicas
    own = pair_s * (tokens * tokens - piece * piece) / 2.0 if step_tokens and tokens > piece else 0.0
    return (pair_s * tokens + context_s) * context + own


def chunked_fill_s(new_tokens: float, cached_tokens: float, chunk_tokens: float, step_s, pair_s: float,
                   context_s: float, replicas: int, step_floor_s: float = 0.0,
                   step_tokens: float | None = None) -> float:
    """Seconds from one request's first fill step to its last: ceil(new / chunk) chunks of at
    most ``chunk_tokens`` (its attention replica's share of a step), chunk j after the cached
    prefix and the j earlier chunks; each chunk's step lasts ``step_s(step tokens)`` plus the
    chunk's :func:`chunk_context_s` (the request simulator's step when the chunk is the step's
    largest), and at least ``step_floor_s``. Alone on a worker a step holds just the chunk
    (``step_tokens`` None); on a busy worker it holds ``step_tokens`` (the budget) and lasts at
    least the busy step's mean (``step_floor_s``). Closed form: the full chunks' step times are
    affine in j.

    Parameters
    ----------
    new_tokens : float
        New tokens to compute (at least 1 is computed).
    cached_tokens : float
        Cached prefix before them (>= 0).
    chunk_tokens : float
        Most new tokens of one request per step (>= 1).
    step_s : callable
        ``step_s(tokens) -> s``: a step of that many new tokens without context.
    pair_s, context_s : float
        The context costs (:attr:`ServiceModel.fill_context_costs`).
    replicas : int
        Attention replicas.
    step_floor_s : float
        Least time of each of its steps (s; default 0).
    step_tokens : float, optional
        New tokens of each of its steps (default None: the chunk alone).

    Returns
    -------
    float
        Seconds.
    """
    n = float(chunk_tokens)
    new = max(float(new_tokens), 1.0)
    c0 = max(float(cached_tokens), 0.0)
    k_full = int(new // n)
    rest = new - k_full * n
    total = 0.0
    if k_full:
        # x_j = A + B j: a full chunk after c0 + j n tokens
        full = n if step_tokens is None else step_tokens
        A = step_s(full) + chunk_context_s(pair_s, context_s, replicas, n, c0, full)
        B = (pair_s * n + context_s) * n
        below = 0
        if step_floor_s > A:
            below = k_full if B <= 0 else min(k_full, int(math.ceil((step_floor_s - A) / B)))
        total += below * step_floor_s + (k_full - below) * A + B * (k_full * (k_full - 1) - below * (below - 1)) / 2.0
    if rest > 0:
        full = rest if step_tokens is None else step_tokens
        x = step_s(full) + chunk_context_s(pair_s, context_s, replicas, rest, c0 + k_full * n, full)
        total += max(x, step_floor_s)
    return total


@dataclass(frozen=True)
class RequestShape:
    """The nominal request a plant is parameterised at (tokens).

    ``prompt_tokens`` are the new (uncached) tokens a fill computes, ``cached_tokens`` the prefix
    it reads from cache. ``output_cv`` is the coefficient of variation of output lengths (1 =
    exponential, the fluid model's memoryless completion assumption; 0 = constant); it sets the
    mean context an active decode holds (:func:`mean_active_context`).

    Parameters
    ----------
    prompt_tokens : int
        New prompt tokens a fill computes (>= 1).
    output_tokens : int
        Mean output tokens (>= 1).
    cached_tokens : int
        Prefix tokens read from cache (>= 0).
    output_cv : float
        Coefficient of variation of output lengths, in [0, 10].
    """

    prompt_tokens: int = 2048
    output_tokens: int = 512
    cached_tokens: int = 0
    output_cv: float = 1.0

    def __post_init__(self) -> None:
        check_int("shape.prompt_tokens", self.prompt_tokens, low=1)
        check_int("shape.output_tokens", self.output_tokens, low=1)
        check_int("shape.cached_tokens", self.cached_tokens, low=0)
        check_number("shape.output_cv", self.output_cv, low=0.0, high=10.0)

    @property
    def input_tokens(self) -> int:
        """Prompt plus cached prefix: the context a fill leaves behind."""
        return self.cached_tokens + self.prompt_tokens

    @property
    def decode_context_tokens(self) -> int:
        """Context at the end of decode: what KV slots must hold."""
        return self.input_tokens + self.output_tokens

    @property
    def mean_active_context_tokens(self) -> int:
        """Mean context held by an active decode (KV is allocated as tokens are generated)."""
        return int(round(mean_active_context(self.input_tokens, self.output_tokens, self.output_cv)))

    @classmethod
    def from_requests(cls, table) -> "RequestShape":
        """The mean request of a request table (columns ``input_tokens``, ``output_tokens`` and
        optionally ``cached_tokens``): new prompt tokens, output tokens (at least one each), cached
        tokens and the output length's coefficient of variation (capped at 10).

        Parameters
        ----------
        table : DataFrame
            A request table.

        Returns
        -------
        RequestShape
        """
        if not len(table):
            raise ConfigError("trace", "the request table is empty")
        inp = np.asarray(table["input_tokens"], dtype=float)
        cached = np.asarray(table["cached_tokens"], dtype=float) if "cached_tokens" in table else np.zeros(len(inp))
        new = np.maximum(inp - cached, 1.0)
        out = np.maximum(np.asarray(table["output_tokens"], dtype=float), 1.0)
        cv = float(out.std(ddof=1) / out.mean()) if len(out) > 1 else 0.0
        return cls(max(1, int(round(new.mean()))), max(1, int(round(out.mean()))),
                   cached_tokens=int(round(cached.mean())), output_cv=min(cv, 10.0))


@dataclass(frozen=True)
class KVLink:
    """How a finished fill's KV blob reaches decode: striped over ``stripes`` of the fill worker's
    scale-out NICs, one transfer at a time per fill worker, plus ``setup_s`` per transfer.

    Parameters
    ----------
    stripes : int
        NICs a transfer is striped over (>= 1; default :data:`DEFAULT_KV_STRIPES`).
    setup_s : float
        Fixed cost per transfer (s, >= 0; default :data:`DEFAULT_KV_SETUP_S`).
    """

    stripes: int = DEFAULT_KV_STRIPES
    setup_s: float = DEFAULT_KV_SETUP_S

    def __post_init__(self) -> None:
        check_int("kv_link.stripes", self.stripes, low=1)
        check_number("kv_link.setup_s", self.setup_s, low=0.0)

    def bandwidth(self, fill_worker: Worker) -> float:
        """Bytes/s of one transfer from ``fill_worker``.

        Parameters
        ----------
        fill_worker : Worker
            The sending worker (its accelerator's scale-out bandwidth per GPU).

        Returns
        -------
        float
            ``stripes`` x scale-out bandwidth.
        """
        return self.stripes * fill_worker.accelerator.scale_out_bandwidth


def _stream_step_s(p: PassTime) -> float:
    """Worker time per pass when passes stream back to back (pipeline stages all busy): the
    pass's tokens over the worker's throughput (the pass time itself without pipelining)."""
    return p.tokens / p.tokens_per_s


@dataclass(frozen=True)
class ServiceModel:
    """Service times and KV memory of one fill and one decode worker at a request shape.

    Parameters
    ----------
    fill_worker, decode_worker : Worker
        The roofline workers of the two pools.
    shape : RequestShape
        The nominal request (fill latency and rate, decode context and slots are taken there).
    link : KVLink
        The KV transfer path.
    fill_tokens_per_replica : int
        Chunked-prefill budget per attention replica (the request simulator's fill step).
    """

    fill_worker: Worker
    decode_worker: Worker
    shape: RequestShape = RequestShape()
    link: KVLink = KVLink()
    fill_tokens_per_replica: int = DEFAULT_FILL_TOKENS_PER_REPLICA

    def __post_init__(self) -> None:
        check_int("service.fill_tokens_per_replica", self.fill_tokens_per_replica, low=1)
        if self.slots(self.shape.decode_context_tokens) < 1:
            raise ConfigError("shape", f"a {self.shape.decode_context_tokens}-token context does not fit in a "
                              f"decode worker ({self.kv_capacity_bytes / 1e9:.1f} GB of KV)")

    # -- KV memory ------------------------------------------------------------------------
    @property
    def kv_bytes_per_token(self) -> float:
        """KV bytes each token of context adds at the nominal context (full-attention layers,
        plus local-attention layers while the context is inside their window)."""
        m, c = self.decode_worker.model, self.decode_context_tokens
        return m.kv_bytes(c + 1) - m.kv_bytes(c)

    @property
    def sequence_state_bytes(self) -> float:
        """KV one sequence holds whatever its context: linear-attention states, or a full
        local-attention window when the nominal context is past it."""
        m, c = self.decode_worker.model, self.decode_context_tokens
        return m.kv_bytes(c) - self.kv_bytes_per_token * c

    def kv_bytes(self, context_tokens: float) -> float:
        """KV bytes one sequence of ``context_tokens`` holds (state + per-token KV)."""
        return self.sequence_state_bytes + self.kv_bytes_per_token * context_tokens

    @property
    def kv_capacity_bytes(self) -> float:
        """KV bytes a decode worker holds (HBM after weights and working memory)."""
        return self.decode_worker.kv_capacity_bytes

    def slots(self, context_tokens: float) -> int:
        """Most sequences of ``context_tokens`` whose KV fits in a decode worker."""
        check_number("context_tokens", context_tokens, low=0.0)
        return int(self.kv_capacity_bytes // self.kv_bytes(context_tokens))

    @property
    def kv_blob_bytes(self) -> float:
        """KV a fill of the nominal request hands to decode (its input's KV and state)."""
        return self.kv_bytes(self.shape.input_tokens)

    @property
    def kv_link_bandwidth(self) -> float:
        return self.link.bandwidth(self.fill_worker)

    def kv_transfer_s(self, nbytes: float) -> float:
        """Time to move ``nbytes`` over an idle link, setup included."""
        return nbytes / self.kv_link_bandwidth + self.link.setup_s

    # -- fill -----------------------------------------------------------------------------
    @property
    def dp_attention(self) -> int:
        return self.fill_worker.parallelism.dp_attention

    def fill_pass(self, prompt_tokens: int | None = None, cached_tokens: int | None = None) -> PassTime:
        """A fill pass of one prompt per attention replica (so every GPU works), at the shape by default."""
        s = self.shape
        return self.fill_worker.midfill(s.prompt_tokens if prompt_tokens is None else prompt_tokens,
                                        s.cached_tokens if cached_tokens is None else cached_tokens,
                                        sequences=self.dp_attention)

    @property
    def fill_latency_s(self) -> float:
        """Time of the nominal fill pass (admission to last prompt token, without queueing)."""
        return self.fill_pass().time_s

    @property
    def fill_rate_rps(self) -> float:
        """Requests/s one fill worker completes at the shape."""
        return self.fill_pass().tokens_per_s / self.shape.prompt_tokens

    @property
    def fill_token_budget(self) -> int:
        """New tokens a fill worker takes per chunked-prefill step."""
        return self.dp_attention * self.fill_tokens_per_replica

    def fill_step_s(self, tokens: float) -> float:
        """Worker time of a chunked-prefill step of ``tokens`` new tokens (no cached prefix),
        spread over the attention replicas, with steps streaming back to back."""
        check_number("tokens", tokens, low=1.0)
        dp = self.dp_attention
        return _stream_step_s(self.fill_worker.midfill(max(1.0, tokens / dp), 0, sequences=dp))

    @property
    def replica_chunk_tokens(self) -> int:
        """Most new tokens one request takes in a fill step: its attention replica's share of the
        step's budget (:attr:`fill_tokens_per_replica`)."""
        return max(1, self.fill_token_budget // self.dp_attention)

    def request_fill_s(self, new_tokens: float, cached_tokens: float = 0.0, step_floor_s: float = 0.0,
                       step_tokens: float | None = None) -> float:
        """Seconds of one request's chunked fill (:func:`chunked_fill_s` with :meth:`fill_step_s`
        and :attr:`fill_context_costs`): its zero-queue fill time alone on a worker by default, or
        in steps of ``step_tokens`` lasting at least ``step_floor_s`` (steps shared with other
        requests).
        The request simulator's :meth:`~tokenfactory.plant_models.des.params.DESParams.request_fill_s`
        is the same function on its sampled tables.

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
        a, b = self.fill_context_costs
        return chunked_fill_s(new_tokens, cached_tokens, self.replica_chunk_tokens, self._chunk_step_s, a, b,
                              self.dp_attention, step_floor_s, step_tokens)

    def _chunk_step_s(self, tokens: float) -> float:
        # memoised per model: a roofline pass per call, and chunk sizes are at most a replica's share
        memo = self._step_memo
        k = max(int(round(tokens)), 1)
        if k not in memo:
            memo[k] = self.fill_step_s(k)
        return memo[k]

    @functools.cached_property
    def _step_memo(self) -> dict:
        return {}

    @functools.cached_property
    def _derived(self) -> dict:
        return {}

    def derived(self, name: str, build):
        """A table derived from this (frozen) model by a layer above it, built once and kept on the
        model (the request simulator's pass tables: ``derived("des_params", DESParams.from_service)``),
        so the cache lives and dies with the object it belongs to.

        Parameters
        ----------
        name : str
            The table's name.
        build : callable
            ``build(model)``, called the first time.

        Returns
        -------
        object
        """
        memo = self._derived
        if name not in memo:
            memo[name] = build(self)
        return memo[name]

    @property
    def fill_s_per_cached_token(self) -> float:
        """Marginal fill time per cached prefix token read (and, for MLA, expanded) in a step,
        measured on one 512-token chunk after a 32k-token prefix."""
        w = self.fill_worker
        base = _stream_step_s(w.midfill(512, 0, sequences=1))
        return max((_stream_step_s(w.midfill(512, 32768, sequences=1)) - base) / 32768, 0.0)

    @functools.cached_property  # a frozen model: computed once
    def fill_context_costs(self) -> tuple[float, float]:
        """What a fill chunk pays for the context before it, on its attention replica (one
        sequence's attention runs on one replica): ``(s per new x context token pair, s per
        context token)``. A chunk of n new tokens after c context tokens (cached prefix plus the
        prompt's earlier chunks) adds ``a n c + b c`` to its step: the attention FLOPs over the
        context (and, for MLA, its latent up-projection) and the KV read. Fitted as the secant of
        the roofline from 0 to C = max(32,768, the shape's input tokens) at n = 512 and 2,048,
        so it is exact for full attention there and an upper bound past C for local windows.

        Returns
        -------
        tuple of float
            ``(a, b)``, both >= 0.
        """
        return self.chunk_context_fit(_stream_step_s)

    def chunk_context_fit(self, measure) -> tuple[float, float]:
        """``(a, b)`` such that what the context c before a chunk of n new tokens adds to
        ``measure`` of the fill worker's one-sequence pass is about a n c + b c: the secant from 0
        to C = max(32,768, the shape's input tokens) at n = 512 and 2,048 (both clipped at 0).

        Parameters
        ----------
        measure : callable
            ``PassTime -> float`` (its time, FLOPs, HBM bytes, ...).

        Returns
        -------
        tuple of float
        """
        w, c = self.fill_worker, float(max(32768, self.shape.input_tokens))

        def extra(n: int) -> float:
            return measure(w.midfill(n, c, sequences=1)) - measure(w.midfill(n, 0, sequences=1))

        lo, hi = extra(512), extra(2048)
        a = max((hi - lo) / ((2048 - 512) * c), 0.0)
        return a, max(lo / c - 512 * a, 0.0)

    # -- aggregated -----------------------------------------------------------------------
    def mixed_step_s(self, batch: float, context_tokens: float, chunk_tokens: float) -> float:
        """Pass time of an aggregated worker (the decode worker's hardware and layout) that
        decodes ``batch`` sequences at ``context_tokens`` and prefills ``chunk_tokens`` new tokens
        in the same pass (:meth:`Worker.mixed`): the decodes' TPOT. ``chunk_tokens = 0`` is
        :meth:`decode_pass_s`; ``batch = 0`` is a fill step (:meth:`fill_step_s`).

        Parameters
        ----------
        batch : float
            Decoding sequences (>= 0).
        context_tokens : float
            Their context (tokens, >= 0).
        chunk_tokens : float
            New prompt tokens in the pass (>= 0; > 0 when ``batch`` is 0).

        Returns
        -------
        float
            Seconds.
        """
        check_number("batch", batch, low=0.0)
        if batch < 1:
            return self.fill_step_s(chunk_tokens)
        return self.decode_worker.mixed(batch, context_tokens, chunk_tokens).time_s

    # -- decode ---------------------------------------------------------------------------
    @property
    def decode_context_tokens(self) -> int:
        """Mean context an active decode holds at the shape."""
        return self.shape.mean_active_context_tokens

    @property
    def decode_slots(self) -> int:
        """Decode slots per worker at the mean active context."""
        return self.slots(self.decode_context_tokens)

    def decode_pass_s(self, batch: float, context_tokens: float) -> float:
        """Decode pass time (TPOT) of ``batch`` sequences at ``context_tokens`` (KV fit not checked)."""
        return self.decode_worker.decode(batch, context_tokens, check_memory=False).time_s

    def decode_rate_rps(self, batch: int | None = None) -> float:
        """Completions/s of one decode worker holding ``batch`` sequences (default: every slot)
        at the mean active context, each generating the shape's output tokens."""
        b = self.decode_slots if batch is None else batch
        return b / (self.shape.output_tokens * self.decode_pass_s(b, self.decode_context_tokens))

    # -- summaries ------------------------------------------------------------------------
    def summary(self, context_tokens: int | None = None) -> dict[str, Any]:
        """The figures at the shape (what ``tokenfactory describe worker`` prints); decode slots
        and pass time at ``context_tokens`` instead of the mean active context when given."""
        fill = self.fill_pass()
        ctx = self.decode_context_tokens if context_tokens is None else context_tokens
        slots = self.slots(ctx)
        if slots < 1:
            raise ConfigError("context_tokens", f"one sequence of {ctx} tokens does not fit in a decode worker")
        dec = self.decode_worker.decode(slots, ctx)
        return {"prompt_tokens": self.shape.prompt_tokens, "output_tokens": self.shape.output_tokens,
                "fill_seconds": fill.time_s, "fill_tokens_per_s": fill.tokens_per_s,
                "fill_requests_per_s": self.fill_rate_rps, "decode_context_tokens": ctx,
                "decode_slots": slots, "decode_step_s": dec.time_s, "decode_tokens_per_s": dec.tokens_per_s,
                "kv_bytes_per_token": self.kv_bytes_per_token, "sequence_state_bytes": self.sequence_state_bytes,
                "kv_bytes_per_request": self.kv_blob_bytes, "kv_transfer_s": self.kv_transfer_s(self.kv_blob_bytes)}

    def to_dict(self) -> dict[str, Any]:
        """Names of what it was built from (for configs and provenance)."""
        return {"fill": f"{self.fill_worker.model.name}@{self.fill_worker.accelerator.name}",
                "decode": f"{self.decode_worker.model.name}@{self.decode_worker.accelerator.name}",
                "shape": dataclasses.asdict(self.shape), "link": dataclasses.asdict(self.link),
                "fill_tokens_per_replica": self.fill_tokens_per_replica}

