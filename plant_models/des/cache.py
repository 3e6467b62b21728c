"""Prefix caches: how many of a request's input tokens a fill reads from cache instead of computing.

A policy object with :meth:`PrefixCache.lookup`, called once when a request's fill starts (again
after a crash re-queues it), and :meth:`PrefixCache.peek`, the orchestrator's look at the cache
index when a request arrives (what it expects to hit; nothing is recorded). Traces with ``hash_ids`` (Mooncake's block hashes)
are looked up block by block: the hit is the longest cached prefix of whole blocks. Write a
subclass to try another policy and pass it as ``simulate(..., prefix_cache=...)``.

The simulator calls :meth:`PrefixCache.fetch`, which by default is ``lookup`` with no load
time; a policy whose hits cost time to bring into HBM (the tiered store of
:mod:`tokenfactory.plant_models.des.tiers`) overrides it, and may add per-request columns to
the records (:meth:`PrefixCache.record_columns`) and figures to the metrics
(:meth:`PrefixCache.metrics`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["PrefixCache", "NoPrefixCache", "UnboundedPrefixCache", "LRUPrefixCache", "prefix_cache_for"]


class PrefixCache:
    """The policy interface (and the no-cache policy)."""

    def lookup(self, blocks: Sequence | None, input_tokens: int, given_cached: int) -> int:
        """Cached tokens of a request whose fill starts now (and record its blocks).

        Parameters
        ----------
        blocks : sequence or None
            The request's block hashes (None when the trace has none).
        input_tokens : int
            Its input tokens.
        given_cached : int
            The trace's own ``cached_tokens`` for it.

        Returns
        -------
        int
            Tokens served from cache, at most ``input_tokens``.
        """
        return 0

    def peek(self, blocks: Sequence | None, input_tokens: int, given_cached: int) -> int:
        """Cached tokens a request arriving now would hit, without recording anything (what an
        orchestrator's cache index tells an admission gate). The base policy promises none.

        Parameters
        ----------
        blocks : sequence or None
            The request's block hashes (None when the trace has none).
        input_tokens : int
            Its input tokens.
        given_cached : int
            The trace's own ``cached_tokens`` for it.

        Returns
        -------
        int
            Tokens expected from cache, at most ``input_tokens``.
        """
        return 0
    def fetch(self, request: int, blocks: Sequence | None, input_tokens: int, given_cached: int,
              now: float) -> tuple[int, float]:
        """Cached tokens of request ``request`` whose fill starts at ``now``, and the seconds
        loading them into HBM takes (0 here: a hit is in HBM already).

        Parameters
        ----------
        request : int
            The request's row.
        blocks, input_tokens, given_cached
            As for :meth:`lookup`.
        now : float
            Simulated time (s).

        Returns
        -------
        tuple
            ``(tokens served from cache, load seconds)``.
        """
        return self.lookup(blocks, input_tokens, given_cached), 0.0

    def record_columns(self, n: int) -> dict:
        """Per-request columns this policy adds to the records (none here).

        Parameters
        ----------
        n : int
            Requests in the run.

        Returns
        -------
        dict
            Column name -> array of ``n`` values.
        """
        return {}

    def metrics(self, now: float) -> dict:
        """Figures this policy adds to the run's metrics at its end ``now`` (none here).

        Parameters
        ----------
        now : float
            The run's end (s).

        Returns
        -------
        dict
        """
        return {}

    def params(self) -> dict:
        """The policy's name and settings (recorded in a result's config).

        Returns
        -------
        dict
        """
        return {"policy": type(self).__name__}


class NoPrefixCache(PrefixCache):
    """Every fill computes its whole input."""


class UnboundedPrefixCache(PrefixCache):
    """Every block ever filled stays cached; without block hashes the trace's ``cached_tokens``
    are taken as given.

    Parameters
    ----------
    block_tokens : int
        Tokens per cached block.
    """

    def __init__(self, block_tokens: int):
        self.block_tokens = block_tokens
        self.blocks: set = set()

    def lookup(self, blocks, input_tokens, given_cached):
        if blocks is None:
            return int(min(given_cached, input_tokens))
        hit = 0
        for h in blocks:
            if h not in self.blocks:
                break
            hit += 1
        self.blocks.update(blocks)
        return int(min(hit * self.block_tokens, input_tokens))

    def peek(self, blocks, input_tokens, given_cached):
        if blocks is None:
            return int(min(given_cached, input_tokens))
        hit = 0
        cache = self.blocks
        for h in blocks:
            if h not in cache:
                break
            hit += 1
        return int(min(hit * self.block_tokens, input_tokens))


class LRUPrefixCache(PrefixCache):
    """``capacity_blocks`` blocks, least recently used evicted first; without block hashes
    nothing is known to be cached (a bounded cache cannot take the trace's word for it).

    Parameters
    ----------
    capacity_blocks : int
        Blocks the cache holds.
    block_tokens : int
        Tokens per cached block.
    """

    def __init__(self, capacity_blocks: int, block_tokens: int):
        self.capacity_blocks = capacity_blocks
        self.block_tokens = block_tokens
        self.blocks: OrderedDict = OrderedDict()

    def lookup(self, blocks, input_tokens, given_cached):
        if blocks is None:
            return 0
        cache = self.blocks
        hit = 0
        for h in blocks:
            if h not in cache:
                break
            cache.move_to_end(h)
            hit += 1
        for h in blocks[hit:]:
            cache[h] = None
        while len(cache) > self.capacity_blocks:
            cache.popitem(last=False)
        return int(min(hit * self.block_tokens, input_tokens))

    def peek(self, blocks, input_tokens, given_cached):
        if blocks is None:
            return 0
        hit = 0
        cache = self.blocks
        for h in blocks:
            if h not in cache:
                break
            hit += 1
        return int(min(hit * self.block_tokens, input_tokens))

    def params(self) -> dict:
        return {**super().params(), "capacity_blocks": self.capacity_blocks}


def prefix_cache_for(blocks: int | None, block_tokens: int) -> PrefixCache:
    """The policy ``ClusterConfig.prefix_cache_blocks`` names.

    Parameters
    ----------
    blocks : int or None
        None: unbounded; 0: no cache; n: LRU of n blocks.
    block_tokens : int
        Tokens per cached block.

    Returns
    -------
    PrefixCache
    """
    if blocks is None:
        return UnboundedPrefixCache(block_tokens)
    if blocks == 0:
        return NoPrefixCache()
    return LRUPrefixCache(blocks, block_tokens)
