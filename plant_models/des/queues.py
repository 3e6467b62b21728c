"""Queues ordered by request-class priority: the request simulator's replaceable queue seam.

:class:`PriorityQueues` keeps one FIFO per priority level and pops the highest priority (level 0)
first; it has the deque methods the simulator uses (``append``, ``appendleft``, ``popleft``,
``len``, ``[0]``), so it replaces a deque where classes matter: the admission backlog, the fill
queue (items ``[request, tokens left]``) and the ready buffer. With one class the simulator keeps
plain deques.
"""

from __future__ import annotations

from collections import deque

__all__ = ["PriorityQueues"]


class PriorityQueues:
    """FIFO queues by priority level; the lowest level number is served first.

    Parameters
    ----------
    levels : int
        Number of priority levels (>= 1).
    level_of : sequence of int
        Priority level of each request (indexed by request).
    keyed : bool
        True when items are ``[request, ...]`` lists (the fill queue), False when they are
        request indices.
    """

    __slots__ = ("queues", "level_of", "keyed", "n")

    def __init__(self, levels: int, level_of, keyed: bool = False):
        self.queues = [deque() for _ in range(max(int(levels), 1))]
        self.level_of = level_of
        self.keyed = keyed
        self.n = 0

    def level(self, item) -> int:
        """The priority level of ``item``."""
        return self.level_of[item[0] if self.keyed else item]

    def append(self, item) -> None:
        """Queue ``item`` at the back of its level."""
        self.queues[self.level(item)].append(item)
        self.n += 1

    def appendleft(self, item) -> None:
        """Queue ``item`` at the front of its level (a re-queued or preempted request)."""
        self.queues[self.level(item)].appendleft(item)
        self.n += 1

    def popleft(self):
        """Remove and return the oldest item of the highest non-empty level."""
        for q in self.queues:
            if q:
                self.n -= 1
                return q.popleft()
        raise IndexError("pop from empty PriorityQueues")

    def head_level(self) -> int:
        """Level of the item :meth:`popleft` would return (``len(levels)`` when empty)."""
        for k, q in enumerate(self.queues):
            if q:
                return k
        return len(self.queues)

    def count(self, level: int) -> int:
        """Items waiting at ``level``."""
        return len(self.queues[level])

    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:
        return self.n > 0

    def __getitem__(self, k: int):
        if k != 0:
            raise IndexError("PriorityQueues only exposes its head ([0])")
        for q in self.queues:
            if q:
                return q[0]
        raise IndexError("PriorityQueues is empty")

    def __iter__(self):
        for q in self.queues:
            yield from q
