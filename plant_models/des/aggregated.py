"""Aggregated serving: workers that fill and decode with chunked prefill sharing their passes.

An aggregated worker (article section 19: one worker takes a turn through prefill, midfill and
decode; no hand-off, no KV transfer) runs passes that carry its decode batch - one token per
sequence - and, while prompts wait, a prefill chunk under the pass's token budget
(``fill_token_budget`` minus the decodes: Sarathi-Serve's stall-free batching, vLLM's
``max_num_batched_tokens``). The pass time is the service model's at the combined work
(:meth:`~tokenfactory.plant_models.des.params.DESParams.mixed_extra`): the decode pass plus what
the chunk adds, so the decodes' TPOT grows with the chunk - the interference aggregation pays -
while the expert weights one pass reads serve both. A decode's TPOT (its mean time per token)
carries the prefill work that passes through its worker while it decodes, however finely that
work is chunked; smaller chunks (Sarathi-Serve's TPOT-derived budget) only spread it over more
passes, which evens the gaps between tokens - not measured here - at the cost of more passes. A
finished prompt emits its first token and joins the worker's own batch with its KV in place.

Admission into a worker: prompts are taken from the shared fill queue at a pass boundary while
the worker's KV holds the batch, the prompts in progress (their whole input is reserved when
taken) and one pass of growth under the watermark; an empty worker always takes one. Without
prompts the worker leaps over decode passes exactly as a decode worker does, and a new prompt in
the fill queue cuts the leap at the next pass boundary. KV overflow parks the newest sequences on
the worker (swapped to host, still counted as decoding) until completions free room.

The aggregated pool is fixed: no autoscaling, moves, crashes or rate events (the simulator
rejects them with aggregated workers).
"""

from __future__ import annotations

from collections import deque
from heapq import heappush

from tokenfactory.plant_models.des.decode import DecodeWorker
from tokenfactory.plant_models.des.records import Stage
from tokenfactory.plant_models.des.workers import IdleWorkers

__all__ = ["AggregatedWorker", "AggregatedStage"]


class AggregatedWorker(DecodeWorker):
    """One aggregated worker: a decode worker's batch and leaps, plus the prompts it is filling.

    Parameters
    ----------
    index, finished : int, simpy Event
        As for :class:`~tokenfactory.plant_models.des.workers.PoolWorker`.
    """

    __slots__ = ("busy", "current", "parked", "reserved", "pass_fill", "load_s")
    pool = "aggregated"
    parks = True

    def __init__(self, index: int, finished):
        super().__init__(index, finished)
        self.busy = False          # inside a mixed pass
        self.current: list = []    # [request, new tokens left], oldest first
        self.parked: deque = deque()  # preempted sequences waiting on this worker
        self.reserved = 0.0        # KV bytes reserved for the prompts in `current`
        self.pass_fill: list = []  # (entry of `current`, tokens it takes this pass)
        self.load_s = 0.0          # prefix loads (tiered cache) the next pass waits for

    def holds_work(self) -> bool:
        return bool(self.members or self.current or self.parked) or self.busy


class AggregatedStage:
    """The aggregated pool of :class:`tokenfactory.plant_models.des.simulator.Simulator`.

    Owns its workers and their idle queue. It takes prompts from ``core.fill_q``, reuses the fill
    stage's :meth:`~tokenfactory.plant_models.des.fill.FillStage.prefix_fetch` and
    :meth:`~tokenfactory.plant_models.des.fill.FillStage.chunks_attention`, and the decode
    stage's batch bookkeeping and leaps (``settle``, ``start_leap``, ``overflow``,
    ``take_newest``, ``cut_leap``, ``complete_due``).

    Interface: :meth:`wake` (prompts wait), :meth:`next` (a worker between passes),
    :meth:`fits` (the admission rule into a worker: override it for another), :meth:`park`.

    Parameters
    ----------
    core : Simulator
        The simulator whose requests this pool serves.
    workers : int
        Aggregated workers (a fixed pool).
    """

    def __init__(self, core, workers: int):
        self.core = core
        self.workers = [AggregatedWorker(i, core.env.event()) for i in range(workers)]
        self.idle = IdleWorkers()

    # -- KV ---------------------------------------------------------------------------------
    def fits(self, w: AggregatedWorker, context_tokens: float) -> bool:
        """Room on ``w`` for one more sequence of ``context_tokens``: its batch, the prompts it
        is filling and one pass of growth stay under the KV watermark, and the batch under the
        cap. An empty worker always takes one."""
        B = len(w.members)
        if not B and not w.current:
            return True
        p = self.core.p
        return B < p.decode_max_batch and (
            (B + 1) * p.sequence_state_bytes + w.reserved
            + p.kv_bytes_per_token * (w.offset_sum + B * w.n + context_tokens + B + 1)) <= self.core.decode.kv_limit

    def park(self, w: AggregatedWorker, count: int) -> None:
        """KV full: the newest ``count`` sequences leave the batch and wait on ``w`` (swapped
        to host; still decoding as far as the counts go) until completions free room."""
        for i in self.core.decode.take_newest(w, count):
            w.parked.appendleft(i)

    def _enter_batch(self, w: AggregatedWorker, i: int) -> None:
        core = self.core
        n = w.n
        fin = n + core.rem_tok[i]
        off = core.ctx_tok[i] - n
        w.members[i] = (fin, off)
        heappush(w.heap, (fin, i))
        w.offset_sum += off

    # -- the worker's cycle -----------------------------------------------------------------
    def next(self, w: AggregatedWorker) -> None:
        """Between passes: rejoin parked sequences, complete, take prompts, then a mixed pass,
        a decode leap, or idle."""
        if not w.online or w.in_leap or w.busy or w.retired:
            return
        core = self.core
        decode, fill = core.decode, core.fill
        p, q = core.p, core.fill_q
        while True:
            while w.parked and self.fits(w, core.ctx_tok[w.parked[0]] + 1):
                self._enter_batch(w, w.parked.popleft())
            B = len(w.members)
            if B and decode.settle(w):
                continue
            budget = p.fill_token_budget - B
            if not w.parked and budget > 0:
                per_request = p.replica_chunk_tokens
                pending = sum(min(e[1], per_request) for e in w.current)  # what the next pass could take
                while q and pending < budget and self.fits(w, core.inp[q[0][0]] + 1):
                    i, todo = q.popleft()
                    if todo < 0:
                        c, load = fill.prefix_fetch(i)
                        w.load_s += load
                        todo = max(core.inp[i] - c, 1)
                        # the measured fill queue had its expected tokens (request classes)
                        core.tok_fill[core.cls_l[i]] += todo - core.pred_tok[i]
                    w.reserved += p.kv_bytes(core.inp[i] + 1)
                    w.current.append([i, todo])
                    pending += min(todo, per_request)
            if w.current and budget > 0:
                S = w.offset_sum + B * w.n
                if B > 1 and B * p.sequence_state_bytes + w.reserved + p.kv_bytes_per_token * (S + B) \
                        > p.decode_kv_capacity_bytes:
                    self.park(w, decode.overflow(w, S))  # decodes would outgrow KV in this pass
                    continue
                self._mixed_pass(w, budget)
                return
            if not B:
                if not w.parked:  # (parked sequences always fit an empty worker)
                    self.idle.add(w)
                return
            if decode.start_leap(w, q):
                return

    def _mixed_pass(self, w: AggregatedWorker, budget: int) -> None:
        """One pass: every decode of ``w`` generates a token while a chunk of its prompts (oldest
        first, up to ``budget`` tokens) is prefilled."""
        core = self.core
        p = core.p
        B = len(w.members)
        ctx = (w.offset_sum + B * w.n) / B if B else 0.0
        per_request = p.replica_chunk_tokens
        take_all, chunks, plan = 0, [], []
        for e in w.current:
            if budget <= 0:
                break
            i, todo = e
            take = min(todo, budget, per_request)
            chunks.append((take, core.inp[i] - todo))
            budget -= take
            take_all += take
            core.tok_fill[core.cls_l[i]] -= take
            core.rec.filled_tokens[i] += take
            plan.append((e, take))
        attention_s, pairs, ctx_tokens = core.fill.chunks_attention(chunks, take_all)
        decode_s = p.decode_pass(B, ctx)[0] if B else 0.0
        seconds = decode_s + p.mixed_extra(B, ctx, take_all) + attention_s + w.load_s
        w.pass_fill = plan
        seconds /= core.decode.rate_factor * core.fleet.speed(w)
        w.load_s = 0.0
        work = p.work
        if work is None:
            core.ledger.add("aggregated", seconds, 0.0, 0.0)
        else:
            f0, b0 = work.decode(B, ctx) if B else (0.0, 0.0)
            f1, b1 = work.mixed_extra(B, ctx, take_all)
            f2, b2 = work.context(pairs, ctx_tokens)
            core.ledger.add("aggregated", seconds, f0 + f1 + f2, b0 + b1 + b2)
        w.busy = True
        w.token += 1
        core.call_in(seconds, self._mixed_end, w, w.token)

    def _mixed_end(self, w: AggregatedWorker, token: int) -> None:
        if token != w.token:
            return
        w.busy = False
        w.n += 1  # every sequence in the batch generated a token
        self.core.decode.complete_due(w)
        done = []
        for e, take in w.pass_fill:
            e[1] -= take
            if e[1] <= 0:
                done.append(e)
        w.pass_fill = []
        for e in done:
            w.current.remove(e)
            self._prompt_done(w, e[0])
        self.next(w)

    def _prompt_done(self, w: AggregatedWorker, i: int) -> None:
        """A prompt is filled: its first token is out and it joins ``w``'s batch in place."""
        core = self.core
        p, rec, now = core.p, core.rec, core.env.now
        inp = core.inp[i]
        rec.fill_end_s[i] = now
        rec.kv_ready_s[i] = now  # no transfer: the KV is where decode runs
        if rec.first_token_s[i] != rec.first_token_s[i]:  # NaN: its first fill
            rec.first_token_s[i] = now
        w.reserved -= p.kv_bytes(inp + 1)
        if not w.current:
            w.reserved = 0.0  # no float residue once nothing is reserved
        core.rem_tok[i] = core.out[i] - 1
        core.ctx_tok[i] = inp + 1
        core.fill_wip -= 1
        core.decoding += 1
        c = core.cls_l[i]  # per-class counts: from fill straight into decode
        core.c_fip[c] -= 1
        core.c_dec[c] += 1
        if rec.decode_start_s[i] != rec.decode_start_s[i]:
            rec.decode_start_s[i] = now
        rec.stage[i] = Stage.DECODE
        self._enter_batch(w, i)

    # -- waking -----------------------------------------------------------------------------
    def wake(self) -> None:
        """Prompts wait: idle aggregated workers take them; otherwise one leaping worker with room
        stops at its next pass boundary."""
        if self.idle:
            self.idle.wake(self.core, self.core.fill_q, self.next, then=self._cut_one_leap)
        else:
            self._cut_one_leap()

    def _cut_one_leap(self) -> None:
        q = self.core.fill_q
        if not q:
            return
        head = q[0][0]
        inp = self.core.inp
        for w in self.workers:
            if w.listening and self.fits(w, inp[head] + 1):
                self.core.decode.cut_leap(w)
                return
