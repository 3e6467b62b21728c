"""Workers waiting for work, woken together once per instant."""

from __future__ import annotations

from collections import deque

__all__ = ["IdleWorkers"]


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
