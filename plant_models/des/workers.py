"""What every worker of the request simulator has, and the queue of idle ones."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import deque

__all__ = ["PoolWorker", "IdleWorkers"]


class PoolWorker(ABC):
    """A worker's life in its pool: online or crashed, draining, idle, retired; ``token``
    invalidates its pending scheduled call (a crash or a re-timed pass bumps it).

    Parameters
    ----------
    index : int
        Its position in the pool when it joined.
    finished : simpy Event
        Triggered when it has drained (or left).
    """

    __slots__ = ("index", "online", "draining", "idle", "token", "warm_until", "finished", "retired")

    def __init__(self, index: int, finished):
        self.index = index
        self.online = True
        self.draining = False
        self.idle = False          # waiting in its pool's IdleWorkers
        self.token = 0
        self.warm_until = -math.inf
        self.finished = finished   # event: drained (finished its work) or retired
        self.retired = False

    @abstractmethod
    def holds_work(self) -> bool:
        """Whether the worker still has requests to finish (a draining worker retires when not);
        each kind of worker (fill, decode, aggregated) says what it holds."""


class IdleWorkers:
    """The idle workers of one pool, longest idle first.

    A wake-up runs after everything else that happens at the same instant (a zero-delay call), so
    work that arrives together - a burst of admissions, several KV blobs landing at once - is taken
    together, and at most one wake-up is pending at a time.
    """

    __slots__ = ("workers", "pending")

    def __init__(self):
        self.workers: deque = deque()
        self.pending = False

    def __len__(self) -> int:
        return len(self.workers)

    def add(self, w) -> None:
        if not w.idle:
            w.idle = True
            self.workers.append(w)

    def discard(self, w) -> None:
        """``w`` stops waiting (it crashed, drains or leaves)."""
        if w.idle:
            w.idle = False
            self.workers.remove(w)

    def wake(self, sim, work, start, then=None) -> None:
        """While ``work`` (a queue) is not empty, the longest idle worker runs ``start(worker)``;
        then ``then()`` if work is left."""
        if work and self.workers and not self.pending:
            self.pending = True
            sim.call_in(0.0, self._run, work, start, then)

    def _run(self, work, start, then) -> None:
        self.pending = False
        workers = self.workers
        while work and workers:
            w = workers.popleft()
            w.idle = False
            start(w)
        if work and then is not None:
            then()
