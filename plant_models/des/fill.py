"""Fill: chunked prefill with continuous batching under a token budget, then the KV transfer.

A fill worker takes work in steps: the requests it was chunking first, then new requests from the
fill queue, until the step's token budget is spent, at most a replica's share of it from one
request (a sequence's attention runs on one attention replica); the first chunk of a request consults the
prefix cache. A finished fill emits the first token and hands its KV blob to the worker's link
(one transfer at a time, striped NICs, plus setup); the blob lands in the ready buffer.

Workers are small state machines driven by scheduled calls (no process per worker or request):
a step's end is a scheduled call carrying the worker's ``token``; a crash bumps the token, so
the pending end is ignored and the step's requests go back to the front of the queue.

A chunk pays for the context before it (cached prefix and the prompt's earlier chunks) on its
attention replica (:meth:`~tokenfactory.plant_models.des.params.DESParams.chunk_context_s`), so
a long prompt's later chunks cost more, as the roofline's chunked prefill does; a prefix that a
tiered cache serves from host memory or SSD stalls the step for its load.
"""

from __future__ import annotations

from tokenfactory.plant_models.des.workers import IdleWorkers, PoolWorker
from tokenfactory.plant_models.des.records import Stage

__all__ = ["FillWorker", "FillStage"]


class FillWorker(PoolWorker):
    """One fill worker's state (:class:`PoolWorker` plus its step, chunked request and link).

    Parameters
    ----------
    index, finished : int, simpy Event
        As for :class:`PoolWorker`.
    """

    __slots__ = ("busy", "step", "current", "link_free_at")

    def __init__(self, index: int, finished):
        super().__init__(index, finished)
        self.busy = False          # inside a step
        self.step: list = []       # (request, tokens left after this step)
        self.current: list = []    # a request it was chunking: [request, tokens left]
        self.link_free_at = 0.0

    def holds_work(self) -> bool:
        return self.busy or bool(self.current)


class FillStage:
    """The fill pool of :class:`tokenfactory.plant_models.des.simulator.Simulator`.

    Owns its workers, their idle queue, the link factor (a :class:`~tokenfactory.core.events.LinkSlowdown`
    scales it), the reserved share of each step (``reserve``, set by a
    :class:`tokenfactory.core.signals.ReserveAction`), the prefix-cache counters and the count of
    KV blobs in transfer. It reads the requests, the fill queue and the ready buffer through
    ``core`` (the simulator: clock, per-request arrays, queues, flow counters, ledger, prefix
    cache) and calls the decode stage's :meth:`~DecodeStage.wake`, the aggregated stage's
    :meth:`wake` and the fleet's ``speed``, ``unidle`` and ``worker_finished``.

    Interface: :meth:`kick` (work entered the fill queue), :meth:`next` (a worker between steps),
    :meth:`crash`, :meth:`prefix_fetch` and :meth:`chunks_attention` (shared with aggregated
    workers); override :meth:`next` or :meth:`finish_fill` in a subclass for another fill policy.

    Parameters
    ----------
    core : Simulator
        The simulator whose requests this pool fills.
    workers : int
        Fill workers at the start.
    """

    def __init__(self, core, workers: int):
        self.core = core
        self.workers = [FillWorker(i, core.env.event()) for i in range(workers)]
        self.idle = IdleWorkers()
        self.reserve = 0.0       # share of each fill step held for the top priority level
        self.link_factor = 1.0
        self.in_transfer = 0     # KV blobs on their way to decode
        self.hit_tokens = self.lookup_tokens = 0

    def kick(self) -> None:
        """Work entered the fill queue: idle workers start a step (requests admitted at the same
        instant share one); aggregated workers take it at their next pass."""
        core = self.core
        self.idle.wake(core, core.fill_q, self.next)
        if core.aggregated.workers:
            core.aggregated.wake()

    def next(self, w: FillWorker) -> None:
        """Between steps: start the next step, go idle, or finish draining."""
        if not w.online or w.busy or w.retired:
            return
        core = self.core
        if w.draining and not w.current:
            core.fleet.worker_finished(w)
            return
        if not w.current and not core.fill_q:
            self.idle.add(w)
            return
        p, rec, q = core.p, core.rec, core.fill_q
        budget = p.fill_token_budget
        per_request = p.replica_chunk_tokens
        step = []
        cached_read = 0
        load_s = 0.0
        chunks = []
        multi, level_of, tok, cls, inp = core.multi, core.level_of, core.tok_fill, core.cls_l, core.inp
        # lower-priority work may take at most (1 - reserve) of the step's budget, counting the
        # tokens higher-priority work took before it (the reserved share is held, not lent:
        # a step cannot be interrupted when an interactive request arrives)
        low_cap = int(budget * (1.0 - self.reserve)) if multi else budget
        used = 0
        # continue the request this worker was chunking, then take new ones (with classes:
        # higher-priority queued work first, a chunked lower-priority request waits)
        while budget > 0:
            if multi:
                cur = level_of[w.current[0][0]] if w.current else None
                if w.current and (cur == 0 or w.draining or not q or q.head_level() >= cur):
                    from_q = False
                elif q and not w.draining:
                    from_q = True
                else:
                    break
                item = q[0] if from_q else w.current[0]
                limit = budget if level_of[item[0]] == 0 else min(budget, low_cap - used)
                if limit <= 0:
                    break
                if from_q:
                    q.popleft()
                else:
                    w.current.pop(0)
            else:
                if not (w.current or (q and not w.draining)):
                    break
                item = w.current.pop(0) if w.current else q.popleft()
                limit = budget
            i, todo = item
            if todo < 0:  # first chunk: consult the prefix cache, record the fill start
                c, load = self.prefix_fetch(i)
                cached_read += c
                load_s += load
                todo = max(inp[i] - c, 1)
                tok[cls[i]] += todo - core.pred_tok[i]  # the measured queue had its expected tokens
            take = min(todo, limit, per_request)
            chunks.append((take, inp[i] - todo))  # context: cached prefix plus chunks already filled
            budget -= take
            used += take
            tok[cls[i]] -= take
            rec.filled_tokens[i] += take
            step.append((i, todo - take))
        w.step = step
        w.busy = True
        w.token += 1
        tokens = p.fill_token_budget - budget
        attention_s, pairs, ctx_tokens = self.chunks_attention(chunks, tokens)
        seconds = (p.fill_step_time(tokens, cached_read) + attention_s + load_s) / core.fleet.speed(w)
        work = p.work
        if work is None:
            core.ledger.add("fill", seconds, 0.0, 0.0)
        else:
            core.ledger.add("fill", seconds, *work.fill(tokens, pairs, ctx_tokens))
        core.call_in(seconds, self._step_end, w, w.token)

    def chunks_attention(self, chunks: list, tokens: float) -> tuple[float, float, float]:
        """What the step's chunks ``(new tokens, context before)`` add to a step of ``tokens``:
        each costs :meth:`~tokenfactory.plant_models.des.params.DESParams.chunk_context_s` on its
        attention replica; spread over the replicas, the step waits for max(sum / replicas,
        largest).

        Parameters
        ----------
        chunks : list of tuple
            ``(new tokens, context tokens before)`` per chunk.
        tokens : float
            New tokens of the step.

        Returns
        -------
        tuple of float
            ``(seconds, new x context token pairs, context tokens)``.
        """
        p = self.core.p
        total = largest = pairs = context = 0.0
        for n, c in chunks:
            x = p.chunk_context_s(n, c, tokens)
            total += x
            largest = x if x > largest else largest
            pairs += n * c
            context += c
        return max(total / p.attention_replicas, largest), pairs, context

    def prefix_fetch(self, i: int) -> tuple[int, float]:
        """Request ``i``'s fill starts: the prefix cache says how many input tokens it holds and
        how long loading them from a lower tier takes; the fill start is recorded.

        Parameters
        ----------
        i : int
            The request.

        Returns
        -------
        tuple
            ``(cached tokens, load seconds)``.
        """
        core = self.core
        inp = core.inp[i]
        now = core.env.now
        c, load = core.cache.fetch(i, core.hashes[i] if core.hashes is not None else None, inp,
                                   core.given_cached[i], now)
        core.rec.cached_tokens[i] = c
        core.rec.fill_start_s[i] = now
        self.hit_tokens += c
        self.lookup_tokens += inp
        return c, load

    def _step_end(self, w: FillWorker, token: int) -> None:
        if token != w.token:
            return  # the worker crashed during this step
        w.busy = False
        for i, left in w.step:
            if left > 0:
                w.current.append([i, left])
            else:
                self.finish_fill(w, i)
        if self.core.multi and len(w.current) > 1:
            level_of = self.core.level_of
            w.current.sort(key=lambda it: level_of[it[0]])
        w.step = []
        self.next(w)

    def finish_fill(self, w: FillWorker, i: int) -> None:
        """Prefill emits the first token; the KV blob queues on the worker's link."""
        core = self.core
        p, rec = core.p, core.rec
        now = core.env.now
        rec.fill_end_s[i] = now
        if rec.first_token_s[i] != rec.first_token_s[i]:  # NaN: the first fill of this request
            rec.first_token_s[i] = now
        inp = core.inp[i]
        core.rem_tok[i] = core.out[i] - 1  # decode generates the rest
        core.ctx_tok[i] = inp + 1
        core.fill_wip -= 1
        self.in_transfer += 1
        rec.stage[i] = Stage.TRANSFER
        start = now if now > w.link_free_at else w.link_free_at
        busy = p.kv_bytes(inp) / (p.kv_link_bandwidth * self.link_factor)
        w.link_free_at = start + busy
        core.call_in(start + busy + p.kv_setup_s - now, self.kv_arrived, i)

    def kv_arrived(self, i: int) -> None:
        """Request ``i``'s KV landed at decode: it joins the ready buffer."""
        core = self.core
        self.in_transfer -= 1
        c = core.cls_l[i]
        core.c_fip[c] -= 1
        core.c_ready[c] += 1
        core.rec.stage[i] = Stage.READY
        core.rec.kv_ready_s[i] = core.env.now
        core.ready.append(i)
        core.decode.wake()

    def crash(self, w: FillWorker) -> None:
        """The worker's step and its chunked request are lost: back to the front of the queue
        (a new fill, prefix cache consulted again)."""
        core = self.core
        lost = [(i, left) for i, left in w.step] + [(i, left) for i, left in w.current]
        for i, left in reversed(lost):
            core.rec.requeues[i] += 1
            core.tok_fill[core.cls_l[i]] += core.pred_tok[i] - left  # its whole fill again (expected)
            core.fill_q.appendleft([i, -1])
        w.step, w.current = [], []
        w.busy = False
        core.fleet.unidle(w)
        w.token += 1
        self.kick()
