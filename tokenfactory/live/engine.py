"""The request simulator run in real time: requests injected as they arrive over HTTP.

:class:`RealtimeEngine` is the request simulator (:class:`tokenfactory.plant_models.des.Simulator`:
fill and decode pools, chunked prefill under the token budget, continuous batching with KV
allocated as tokens are generated, the KV transfer over the fill worker's link, the prefix cache)
with its clock tied to the wall clock: :meth:`RealtimeEngine.advance` runs the simulation up to
now, :meth:`RealtimeEngine.submit` puts a request into it at the current instant. Nothing of the
service model is re-implemented here, so a scenario's timing on the wire is the simulator's.

The simulator leaps over decode passes (one event per completion); the tokens a decoding sequence
has emitted at an instant follow from its worker's leap (pass j of a leap takes t0 + tk B j), so
:meth:`RealtimeEngine.emitted` gives the token count at any time without an event per token.

Requests take slots of a preallocated table (``capacity``; the simulator's per-request arrays);
when they are used up :meth:`submit` raises :class:`EngineFull`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tokenfactory.core.errors import ConfigError
from tokenfactory.plant_models.des import ClusterConfig, DESParams
from tokenfactory.plant_models.des.simulator import Simulator
from tokenfactory.plant_models.des.decode import passes_within
from tokenfactory.plant_models.des.records import Stage
from tokenfactory.core.validation import check_int

__all__ = ["RealtimeEngine", "EngineFull", "RequestTimes", "block_hashes"]


class EngineFull(RuntimeError):
    """Every request slot of the engine is used (restart it with a larger capacity)."""


@dataclass(frozen=True)
class RequestTimes:
    """What the engine recorded of one finished request (s on the engine's clock).

    Parameters
    ----------
    arrival_s, first_token_s, completion_s : float
        Arrival, first token (the prefill's end) and last token.
    fill_start_s, decode_start_s : float
        When its prefill started and when it joined a decode batch.
    input_tokens, cached_tokens, output_tokens : int
        Its prompt, the prefix-cache hit and its output.
    """

    arrival_s: float
    first_token_s: float
    completion_s: float
    fill_start_s: float
    decode_start_s: float
    input_tokens: int
    cached_tokens: int
    output_tokens: int


def block_hashes(token_ids, block_tokens: int) -> list[int]:
    """Chained hashes of a prompt's whole blocks (the prefix-cache key: a block's hash covers
    every token before it, as vLLM's block hashes do); a trailing partial block has none.

    Parameters
    ----------
    token_ids : sequence of int
        The prompt's tokens.
    block_tokens : int
        Tokens per block.

    Returns
    -------
    list of int
    """
    out, h = [], 0
    for k in range(len(token_ids) // block_tokens):
        h = hash((h, tuple(token_ids[k * block_tokens:(k + 1) * block_tokens])))
        out.append(h)
    return out


class RealtimeEngine(Simulator):
    """The request simulator on the wall clock (see the module notes).

    Parameters
    ----------
    params : DESParams
        Service times (from the scenario's service model).
    cluster : ClusterConfig
        Pools, KV watermark, prefix cache, classes, batch cap (its admission fields are unused:
        an engine admits everything it is sent, the gateway in front of it decides).
    nominal_input, nominal_output : int
        The scenario's mean request (the simulator's nominal figures are computed on it).
    capacity : int
        Request slots (>= 1; default 200000).
    clock : callable
        Seconds, monotone (default ``time.monotonic``); the engine's time 0 is its creation.
    """

    def __init__(self, params: DESParams, cluster: ClusterConfig, *, nominal_input: int, nominal_output: int,
                 capacity: int = 200_000, clock=time.monotonic):
        check_int("live.capacity", capacity, low=1)
        check_int("live.nominal_input", nominal_input, low=1)
        check_int("live.nominal_output", nominal_output, low=1)
        names = [c.name for c in cluster.classes] if cluster.classes else ["interactive"]
        trace = pd.DataFrame({"arrival_s": np.full(capacity, 0.0), "input_tokens": np.full(capacity, nominal_input),
                              "output_tokens": np.full(capacity, nominal_output),
                              "request_class": np.full(capacity, names[0], dtype=object)})
        trace["hash_ids"] = pd.Series([None] * capacity, dtype=object)
        super().__init__(trace, params, cluster)
        # writable copies of the per-request arrays (pandas hands out read-only views)
        for name in ("arrival", "inp_arr", "out_arr", "cls", "hashes"):
            setattr(self, name, np.array(getattr(self, name), copy=True))
        self.class_index = {c: k for k, c in enumerate(self.class_names)}
        self.used = 0
        self.clock = clock
        self.t0 = clock()
        for w in (*self.fill_workers, *self.decode_workers, *self.aggregated_workers):
            self.worker_next(w)
        self.prompt_total = self.generation_total = 0

    # -- the clock ----------------------------------------------------------------------------
    def now(self) -> float:
        """Seconds since the engine started (wall clock)."""
        return self.clock() - self.t0

    def advance(self, to: float | None = None) -> float:
        """Run the simulation up to ``to`` (default now); returns the simulated time."""
        to = self.now() if to is None else to
        if to > self.env.now:
            self.env.run(until=to)
        return self.env.now

    def next_event_s(self) -> float:
        """When the next scheduled event falls (inf when none)."""
        return float(self.env.peek())

    # -- requests -----------------------------------------------------------------------------
    def submit(self, input_tokens: int, output_tokens: int, *, blocks=None, request_class: str | None = None,
               cached_tokens: int = 0) -> int:
        """A request arrives now: it enters the simulator's backlog (admitted at once, no
        admission control in an engine) and its index is returned.

        Parameters
        ----------
        input_tokens, output_tokens : int
            Prompt and output length (>= 1).
        blocks : list of int, optional
            Its prompt's block hashes (:func:`block_hashes`) for the prefix cache.
        request_class : str, optional
            One of the scenario's classes (default the first).
        cached_tokens : int
            Tokens the client says are cached (used when there are no block hashes).

        Returns
        -------
        int
            The request's index (for :meth:`emitted`, :meth:`stage`, :meth:`times`).
        """
        if self.used >= self.n:
            raise EngineFull(f"all {self.n} request slots are used")
        cls = self.class_index.get(request_class or self.class_names[0])
        if cls is None:
            raise ConfigError("request_class", f"{request_class!r} is not one of {', '.join(self.class_names)}")
        self.advance()
        i = self.used
        self.used += 1
        inp, out = max(int(input_tokens), 1), max(int(output_tokens), 1)
        self.inp[i] = inp
        self.inp_arr[i] = inp
        self.out[i] = out
        self.out_arr[i] = out
        self.given_cached[i] = min(max(int(cached_tokens), 0), inp)
        self.hashes[i] = blocks
        self.cls[i] = cls
        self.cls_l[i] = cls
        self.level_of[i] = self.class_level[cls]
        self.arrival[i] = self.env.now
        self.arrive(i)
        self.prompt_total += inp
        # zero-delay calls (the idle workers' wake-up) run now rather than at the next tick
        self.env.run(until=self.env.now + 1e-9)
        return i

    def stage(self, i: int) -> Stage:
        """Where request ``i`` is."""
        return Stage(int(self.rec.stage[i]))

    def decode_positions(self) -> dict[int, int]:
        """Tokens emitted now by every decoding sequence (``index -> tokens``)."""
        now = self.env.now
        out: dict[int, int] = {}
        for w in (*self.decode_workers, *self.aggregated_workers):
            if not w.members:
                continue
            n = w.n
            if w.in_leap and w.leap is not None:
                start, t0, tk, B, _ = w.leap
                n += min(passes_within(t0, tk, B, now - start), w.leap_steps)
            inp = self.inp
            for i, (_, off) in w.members.items():
                out[i] = off + n - inp[i]
        return out

    def emitted(self, i: int, positions: dict[int, int] | None = None) -> int:
        """Output tokens request ``i`` has produced by now (the first comes with its prefill).

        Parameters
        ----------
        i : int
            The request.
        positions : dict, optional
            :meth:`decode_positions`, when computed once for many requests.
        """
        st = self.rec.stage[i]
        if st == Stage.COMPLETED:
            return self.out[i]
        if st == Stage.DECODE:
            pos = self.decode_positions() if positions is None else positions
            return max(min(pos.get(i, self.ctx_tok[i] - self.inp[i]), self.out[i]), 1)
        if st in (Stage.TRANSFER, Stage.READY):
            return max(self.ctx_tok[i] - self.inp[i], 1)
        return 0

    def times(self, i: int) -> RequestTimes:
        """Request ``i``'s recorded times and tokens."""
        r = self.rec
        return RequestTimes(float(r.arrival_s[i]), float(r.first_token_s[i]), float(r.completion_s[i]),
                            float(r.fill_start_s[i]), float(r.decode_start_s[i]), int(self.inp[i]),
                            int(r.cached_tokens[i]), int(self.out[i]))

    # -- the state a server reports -----------------------------------------------------------
    def kv_usage(self) -> float:
        """Share of the decode pool's KV memory in use (0-1)."""
        p = self.p
        cap = p.decode_kv_capacity_bytes * max(len(self.decode_workers) + len(self.aggregated_workers), 1)
        if not math.isfinite(cap) or cap <= 0:
            return 0.0
        used = sum(len(w.members) * p.sequence_state_bytes + p.kv_bytes_per_token * w.context_sum()
                   for w in (*self.decode_workers, *self.aggregated_workers))
        return float(min(used / cap, 1.0))

    def decode_pass_now(self) -> float:
        """Mean pass time the busy decode workers' sequences see now (s; NaN when none decodes):
        the quantity the request simulator's measurement reports as ``decode_pass_s``
        (``plant_models/des/measure.py``, ``snapshot``), so the gateway's controller sees what the
        simulator's sees."""
        p = self.p
        total, busy = 0.0, 0
        for w in self.decode_workers:
            B = len(w.members)
            if B and w.online:
                ctx = w.offset_sum + B * w.n
                total += p.decode_pass(B, ctx / B)[0] / (self.rate_factor * self.speed(w))
                busy += 1
        return total / busy if busy else math.nan

    def fill_queued_tokens(self) -> float:
        """Prompt tokens admitted and not yet prefilled (the simulator's ``fill_queued_tokens``: a
        request in its prefill counts only its chunks still to run)."""
        return float(sum(self.tok_fill))

    def counts(self) -> dict[str, int]:
        """Requests by stage: ``fill_queue`` (admitted, waiting for a fill step), ``prefilling``
        (in a step or being chunked), ``transfer``, ``ready`` (waiting for a decode slot),
        ``decoding``, ``completed``, ``arrived``."""
        prefilling = sum(len(w.step) + len(w.current) for w in self.fill_workers)
        return {"fill_queue": len(self.fill_q), "prefilling": prefilling, "transfer": self.in_transfer,
                "ready": len(self.ready), "decoding": self.decoding, "completed": self.completed,
                "arrived": self.arrived, "backlog": len(self.backlog)}
