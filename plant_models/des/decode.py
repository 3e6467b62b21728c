"""Decode: continuous batching with KV allocated as tokens are generated, simulated in leaps.

A decode worker joins ready sequences between passes while :meth:`DecodeStage.can_join` allows
(KV watermark and batch cap: the policy seam for batching rules), then *leaps*: one scheduled
call covers every pass up to the next completion or the pass that would overflow KV, each pass
timed exactly under the linear-in-context pass-time model (pass j takes t0 + tk B j; the batch's
context grows by B tokens per pass). A ready arrival (if the worker has room), a speed change or
a crash cuts a leap short at the next pass boundary.

Per-worker state is O(1) per pass: the pass counter ``n``; for each sequence its finishing pass
and its context offset (context at pass n = offset + n), so the batch's context sum is
``offset_sum + B n`` and the next completion is the top of a heap. Joining, completing and
preempting a sequence cost O(log B); nothing is re-summed per leap.
"""

from __future__ import annotations

import math
from heapq import heappop, heappush

from tokenfactory.plant_models.des.workers import IdleWorkers, PoolWorker
from tokenfactory.plant_models.des.records import Stage

__all__ = ["DecodeWorker", "DecodeStage"]

_NO_LIMIT = 1 << 62  # passes: "KV never overflows"


class DecodeWorker(PoolWorker):
    """One decode worker's state (:class:`PoolWorker` plus its batch and leap; see the module
    notes for the bookkeeping).

    Parameters
    ----------
    index, finished : int, simpy Event
        As for :class:`PoolWorker`.
    """

    __slots__ = ("listening", "in_leap", "interrupted", "n", "members", "heap", "offset_sum", "leap", "leap_steps",
                 "low")
    #: its pool's name (work ledger) and whether it keeps preempted sequences itself
    pool = "decode"
    parks = False

    def __init__(self, index: int, finished):
        super().__init__(index, finished)
        self.listening = False     # in a leap that a ready arrival may cut short
        self.in_leap = False
        self.interrupted = False   # its leap already ends at the next pass boundary
        self.n = 0                 # passes done
        self.members: dict = {}    # request -> (finishing pass, context offset), oldest first
        self.heap: list = []       # (finishing pass, request); stale entries skipped
        self.offset_sum = 0        # sum of context offsets
        self.leap = None           # (start time, t0, tk, batch, passes)
        self.leap_steps = 0
        self.low = 0               # members below the top priority level (preempted first)

    @property
    def batch(self) -> int:
        return len(self.members)

    def context_sum(self) -> float:
        """Tokens of context the batch holds (at the last pass boundary)."""
        return self.offset_sum + len(self.members) * self.n

    def holds_work(self) -> bool:
        return bool(self.members)


def passes_within(t0: float, tk: float, B: int, elapsed: float) -> int:
    """Whole passes completed in ``elapsed`` when pass j takes t0 + tk B j."""
    a = tk * B / 2.0
    b = t0 - tk * B / 2.0
    if a <= 0:
        return int(elapsed // b) if b > 0 else 0
    return int((-b + math.sqrt(b * b + 4 * a * elapsed)) / (2 * a) + 1e-12)


class DecodeStage:
    """The decode pool of :class:`tokenfactory.plant_models.des.simulator.Simulator`.

    Owns its workers and their idle queue, the batch cap (a
    :class:`tokenfactory.core.signals.BatchCapAction` sets it), the KV watermark limit and the
    decode rate factor (a :class:`~tokenfactory.core.events.DecodeRateDip` scales it). It reads
    the requests and the ready buffer through ``core`` and hands completions to
    ``core.complete``; aggregated workers reuse its batch bookkeeping and leaps.

    Interface: :meth:`wake` (ready sequences wait), :meth:`next` (a worker between passes),
    :meth:`crash`, :meth:`set_batch_cap`, :meth:`set_rate_factor`, and for aggregated workers
    :meth:`settle`, :meth:`start_leap`, :meth:`overflow`, :meth:`take_newest`, :meth:`cut_leap`,
    :meth:`complete_due`. The batching policy is :meth:`can_join`: override it in a subclass
    (passed as ``Simulator(..., stages={"decode": MyDecode})``) to try another rule.

    Parameters
    ----------
    core : Simulator
        The simulator whose requests this pool decodes.
    workers : int
        Decode workers at the start.
    batch_cap : float
        Sequences per worker at most (``inf``: KV memory only).
    kv_limit : float
        KV bytes a worker admits sequences up to (capacity less the watermark).
    """

    def __init__(self, core, workers: int, batch_cap: float, kv_limit: float):
        self.core = core
        self.workers = [DecodeWorker(i, core.env.event()) for i in range(workers)]
        self.idle = IdleWorkers()
        self.batch_cap = batch_cap
        self.kv_limit = kv_limit
        self.rate_factor = 1.0

    # -- the batching policy ---------------------------------------------------------------
    def can_join(self, w: DecodeWorker, i: int) -> bool:
        """May ready request ``i`` join ``w``'s batch now? The KV of the batch after the join,
        plus one pass of growth, must stay under the watermark, and the batch under the cap
        (``batch_cap``, set by :class:`tokenfactory.core.signals.BatchCapAction`); an empty worker
        always takes one sequence. Override to try another batching rule."""
        B = len(w.members)
        if not B:
            return True
        core = self.core
        p = core.p
        return B < self.batch_cap and (
            (B + 1) * p.sequence_state_bytes
            + p.kv_bytes_per_token * (w.offset_sum + B * w.n + core.ctx_tok[i] + B + 1)) <= self.kv_limit

    # -- sequences in and out --------------------------------------------------------------
    def join(self, w: DecodeWorker) -> int:
        """Ready sequences join ``w`` (highest priority, then oldest first) while :meth:`can_join`
        allows; a top-priority sequence that cannot join preempts the newest lower-priority member
        (lower-priority work borrows idle slots and gives them back first)."""
        core = self.core
        ready, rec = core.ready, core.rec
        joined = 0
        n = w.n
        level_of = core.level_of
        while ready:
            i = ready[0]
            if not self.can_join(w, i):
                if core.multi and level_of[i] == 0 and w.low > 0:
                    self.preempt_low(w)
                    continue
                break
            ready.popleft()
            c = core.cls_l[i]
            core.c_ready[c] -= 1
            core.c_dec[c] += 1
            if level_of[i]:
                w.low += 1
            fin = n + core.rem_tok[i]
            off = core.ctx_tok[i] - n
            w.members[i] = (fin, off)
            heappush(w.heap, (fin, i))
            w.offset_sum += off
            if rec.decode_start_s[i] != rec.decode_start_s[i]:  # NaN: its first decode
                rec.decode_start_s[i] = core.env.now
            rec.stage[i] = Stage.DECODE
            joined += 1
        core.decoding += joined
        return joined

    def complete_due(self, w: DecodeWorker) -> None:
        """Sequences whose last pass is done leave the batch."""
        heap, members, n = w.heap, w.members, w.n
        level_of = self.core.level_of
        done = []
        while heap and heap[0][0] <= n:
            fin, i = heappop(heap)
            m = members.get(i)
            if m is None or m[0] != fin:
                continue  # preempted or re-joined since: a stale entry
            del members[i]
            w.offset_sum -= m[1]
            if level_of[i]:
                w.low -= 1
            done.append(i)
        if done:
            self.core.complete(done)

    def preempt(self, w: DecodeWorker, count: int) -> None:
        """KV full: the newest ``count`` sequences go back to the front of the ready buffer with
        their state (their KV is swapped out, not lost) and rejoin when memory frees (an
        aggregated worker parks them on itself instead)."""
        if w.parks:
            self.core.aggregated.park(w, count)
            return
        for _ in range(count):
            self._evict(w, next(reversed(w.members)))

    def preempt_low(self, w: DecodeWorker) -> None:
        """The newest member below the top priority level goes back to the ready buffer (its KV
        swapped out, not lost): a top-priority sequence needs its slot."""
        level_of = self.core.level_of
        for i in reversed(w.members):
            if level_of[i]:
                self._evict(w, i)
                return

    def take_newest(self, w: DecodeWorker, count: int) -> list:
        """The newest ``count`` sequences leave ``w``'s batch, their remaining tokens and context
        kept (their KV swapped out, not lost) and the preemption counted; newest first."""
        return [self._detach(w, next(reversed(w.members))) for _ in range(count)]

    def _detach(self, w: DecodeWorker, i: int) -> int:
        """Sequence ``i`` leaves ``w``'s batch with its remaining tokens and context kept."""
        core = self.core
        n = w.n
        fin, off = w.members.pop(i)
        w.offset_sum -= off
        if core.level_of[i] and w.low > 0:  # (aggregated workers do not count their low members)
            w.low -= 1
        core.rem_tok[i] = fin - n
        core.ctx_tok[i] = off + n
        core.rec.preemptions[i] += 1
        return i

    def _evict(self, w: DecodeWorker, i: int) -> None:
        """Sequence ``i`` leaves ``w`` for the front of the ready buffer."""
        core = self.core
        self._detach(w, i)
        core.rec.stage[i] = Stage.READY
        c = core.cls_l[i]
        core.c_dec[c] -= 1
        core.c_ready[c] += 1
        core.ready.appendleft(i)
        core.decoding -= 1

    def crash(self, w: DecodeWorker) -> None:
        """KV is lost with the worker: its sequences go back to the front of the backlog (oldest
        first) and are filled again."""
        core = self.core
        ids = list(w.members)
        for i in reversed(ids):
            core.rec.requeues[i] += 1
            core.rec.stage[i] = Stage.BACKLOG
            c = core.cls_l[i]
            core.c_dec[c] -= 1
            core.c_backlog[c] += 1
            core.backlog.appendleft(i)
        core.decoding -= len(ids)
        w.members, w.heap, w.offset_sum, w.low = {}, [], 0, 0
        w.token += 1
        w.in_leap = w.listening = w.interrupted = False
        core.fleet.unidle(w)
        core.kick_admission()

    # -- the worker's cycle ----------------------------------------------------------------
    def next(self, w: DecodeWorker) -> None:
        """Between passes: join, complete, preempt, then leap - or go idle, or finish draining."""
        if not w.online or w.in_leap or w.retired:
            return
        while True:
            if not w.draining:
                self.join(w)
            if not w.members:
                if w.draining:
                    self.core.fleet.worker_finished(w)
                else:
                    self.idle.add(w)
                return
            if self.settle(w):
                continue
            if self.start_leap(w, self.core.ready):
                return

    def settle(self, w: DecodeWorker) -> bool:
        """Drop stale heap tops; complete sequences due without a pass (one-token outputs).
        True when some completed (the batch changed)."""
        heap, members, n = w.heap, w.members, w.n
        while members.get(heap[0][1], (None,))[0] != heap[0][0]:
            heappop(heap)  # drop stale tops
        if heap[0][0] <= n:
            self.complete_due(w)
            return True
        return False

    def start_leap(self, w: DecodeWorker, waiting) -> bool:
        """Leap ``w``'s batch to its next completion, but not past the pass that would overflow
        KV; False (nothing scheduled) when KV is already full and the newest sequences were
        preempted instead. The leap listens - a new item in ``waiting`` (the ready buffer, or an
        aggregated worker's fill queue) cuts it at the next pass boundary - while the worker has
        room for one more."""
        core = self.core
        p = core.p
        B, n = len(w.members), w.n
        S = w.offset_sum + B * n
        free = p.decode_kv_capacity_bytes - B * p.sequence_state_bytes - p.kv_bytes_per_token * S
        growth = B * p.kv_bytes_per_token
        k_kv = (int(free // growth) if free < math.inf else _NO_LIMIT) if growth > 0 else \
            (_NO_LIMIT if free >= 0 else 0)
        if k_kv < 1:
            if B > 1:
                self.preempt(w, self.overflow(w, S))
                return False
            k_kv = _NO_LIMIT  # a single sequence larger than the worker runs (empty-worker rule)
        k = max(1, min(w.heap[0][0] - n, k_kv))
        f = self.rate_factor * core.fleet.speed(w)  # (a leap keeps its speed if warm-up ends inside it)
        t_now, slope = p.decode_pass(B, S / B)
        t0 = t_now / f
        tk = slope / B / f  # per token of growth of the batch's context sum
        total = k * t0 + tk * (B * k * (k - 1) / 2.0)
        w.listening = not waiting and not w.draining and B < self.batch_cap and (
            B * p.sequence_state_bytes + p.kv_bytes_per_token * (S + B * k)) < self.kv_limit
        w.leap = (core.env.now, t0, tk, B, k)
        w.leap_steps = k
        w.in_leap = True
        w.interrupted = False
        w.token += 1
        core.call_in(total, self._leap_end, w, w.token)
        return True

    def overflow(self, w: DecodeWorker, S: float) -> int:
        """How many of the newest sequences must leave so the rest fit one more pass (keeps one)."""
        p, n = self.core.p, w.n
        keep_B, keep_S, drop = len(w.members), S, 0
        for fin, off in reversed(w.members.values()):
            drop += 1
            keep_B -= 1
            keep_S -= off + n
            if keep_B <= 1 or keep_B * p.sequence_state_bytes + p.kv_bytes_per_token * (keep_S + keep_B) \
                    <= p.decode_kv_capacity_bytes:
                break
        return drop

    def _leap_end(self, w: DecodeWorker, token: int) -> None:
        if token != w.token:
            return  # crashed, or re-timed by an interruption
        w.in_leap = w.listening = w.interrupted = False
        self.account_leap(w)
        w.n += w.leap_steps
        self.complete_due(w)
        core = self.core
        core.fleet.worker_next(w)
        if core.ready:
            self.wake()

    def cut_leap(self, w: DecodeWorker) -> None:
        """End ``w``'s leap at the next pass boundary (the pass in progress finishes at its timing)."""
        if not w.in_leap or w.interrupted:
            return
        start, t0, tk, B, k = w.leap
        core = self.core
        now = core.env.now
        s = min(passes_within(t0, tk, B, now - start), k)
        w.listening = False
        if s >= k:
            return  # the leap ends now anyway
        end = start + (s + 1) * t0 + tk * B * (s + 1) * s / 2.0
        w.interrupted = True
        w.leap_steps = s + 1
        w.token += 1
        core.call_in(max(end - now, 0.0), self._leap_end, w, w.token)

    def wake(self) -> None:
        """Ready sequences wait: idle workers take them (after everything else that happens at
        this instant, so sequences ready together join together); without an idle worker, one
        leaping worker with room stops at its next pass boundary to let them join."""
        core = self.core
        if not core.ready:
            return
        if self.idle:
            self.idle.wake(core, core.ready, self.next, then=self._cut_one_leap)
        else:
            self._cut_one_leap()

    def _cut_one_leap(self) -> None:
        core = self.core
        head = core.ready[0]
        for w in self.workers:
            if w.listening and self.can_join(w, head):
                self.cut_leap(w)
                return
        if core.multi and core.level_of[head] == 0:  # a top-priority sequence reclaims a borrowed slot
            for w in self.workers:
                if w.in_leap and w.low > 0 and not w.draining:
                    if not w.interrupted:
                        self.cut_leap(w)
                    return

    def set_batch_cap(self, cap: float) -> None:
        """The decode batch cap per worker changes (:class:`tokenfactory.core.signals.BatchCapAction`).
        A lower cap takes effect as sequences complete; a higher one lets ready sequences join at
        the next pass boundary."""
        core = self.core
        cap = float(min(cap, core.p.decode_max_batch))
        if cap == self.batch_cap:
            return
        raised = cap > self.batch_cap
        core.actions.append({"time_s": core.env.now, "kind": "batch_cap", "from": self.batch_cap, "to": cap})
        self.batch_cap = cap
        if raised and core.ready:
            for w in self.workers:
                if w.in_leap and not w.draining and len(w.members) < cap:
                    self.cut_leap(w)
            self.wake()

    def account_leap(self, w: DecodeWorker) -> None:
        """Book the passes of ``w``'s ending leap (seconds, FLOPs, HBM bytes) on its pool."""
        _, t0, tk, B, _ = w.leap
        s = w.leap_steps
        seconds = s * t0 + tk * B * s * (s - 1) / 2.0
        core = self.core
        work = core.p.work
        if work is None:
            core.ledger.add(w.pool, seconds, 0.0, 0.0)
            return
        flops, nbytes = work.decode(B, (w.offset_sum + B * w.n) / B + (s - 1) / 2.0)
        core.ledger.add(w.pool, seconds, s * flops, s * nbytes)

    def set_rate_factor(self, f: float) -> None:
        """Decode speed changes: every leap is re-timed from its next pass boundary."""
        self.rate_factor = f
        for w in self.workers:
            if w.in_leap:
                self.cut_leap(w)
