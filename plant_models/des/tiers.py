"""A tiered KV store: HBM, host DRAM and SSD tiers with retention, and rebuild from text.

The article's section 2 keeps reusable context as immutable KV blobs in a shared store: HBM is the
hot tier for blobs about to be used, recently idle blobs move to host DRAM, longer-lived ones to
SSD, and a blob may be dropped and rebuilt from its (much smaller) text when it is needed again;
section 22 puts this lifecycle on the minutes-to-days time scale. :class:`TieredKVStore` is that
store as a prefix-cache policy of the request simulator (``simulate(..., prefix_cache=store)``):

* **blobs** - with ``hash_ids`` in the trace (Mooncake) each block is a blob of ``block_tokens``;
  without them, an agentic session's context is one blob that each turn extends (``cached_tokens
  > 0`` continues the chain of the session's previous turn; 0 starts a new one, as after a
  compaction): a turn's prefix is the blob as the previous turn left it, and the turn's new input
  is appended to it. A chain's pieces are always read together, so they would move between tiers
  together; one blob per chain keeps a lookup O(1). A blob holds ``bytes_per_token`` x its tokens.
* **lookup** - when a fill starts, its blobs are walked in order; the prefix served is the blobs
  present in some tier up to the first absent one (at most the trace's ``cached_tokens`` in
  session mode). A blob in a lower tier costs a load of its bytes at that tier's
  ``read_bandwidth`` (the fill step waits for it, :mod:`tokenfactory.plant_models.des.fill`); the
  rest of the input is computed - for blobs the store once held and dropped, and for the blobs
  after them, that is the rebuild from text.
* **placement** - every blob the fill reads or writes is (back) in HBM, last used now. A tier over
  its ``capacity_bytes`` demotes its least recently placed blobs to the next tier; a blob idle
  for longer than a tier's ``retention_s`` (since its last use) moves down at that moment; past the
  last tier a blob is dropped. Retention does not shrink down the tiers.
* **accounting** - bytes held per tier integrate into byte-seconds: the store's HBM copies are
  idle between uses (a fill's working copy is the worker's, not the store's), so HBM
  byte-seconds are the idle HBM the retention policy buys hit ratio with.

:func:`kv_tiers` builds the three tiers from a worker's hardware descriptor (the presets' host
memory and SSD are documented in :mod:`tokenfactory.plant_models.hardware`); :func:`replay_store`
runs a request table through a store alone (arrival times as fill starts), which is how
retention is swept over days without the request simulator.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tokenfactory.plant_models.des.cache import PrefixCache
from tokenfactory.plant_models.roofline import Worker
from tokenfactory.core.validation import ConfigError, check_int, check_number

__all__ = ["KVTier", "TieredKVStore", "kv_tiers", "session_chains", "replay_store", "TIER_SOURCES"]

#: the ``prefix_tier`` labels of the records, shallow to deep (``none``: no reusable prefix)
TIER_SOURCES = ("hbm", "dram", "ssd", "rebuilt", "none")


@dataclass(frozen=True)
class KVTier:
    """One tier of the store.

    Parameters
    ----------
    name : str
        Its label (``"hbm"``, ``"dram"``, ``"ssd"``).
    capacity_bytes : float
        Bytes it holds (> 0, inf allowed).
    read_bandwidth : float
        Bytes/s a blob comes back into HBM from it (> 0; inf: no load time, as for HBM).
    retention_s : float
        Longest a blob may stay idle (since its last use) in this tier (s, > 0; inf: only
        capacity evicts).
    """

    name: str
    capacity_bytes: float
    read_bandwidth: float
    retention_s: float = math.inf

    def __post_init__(self) -> None:
        check_number(f"tier[{self.name}].capacity_bytes", self.capacity_bytes, low=0.0, low_inclusive=False,
                     allow_inf=True)
        check_number(f"tier[{self.name}].read_bandwidth", self.read_bandwidth, low=0.0, low_inclusive=False,
                     allow_inf=True)
        check_number(f"tier[{self.name}].retention_s", self.retention_s, low=0.0, low_inclusive=False,
                     allow_inf=True)


def kv_tiers(worker: Worker, workers: int, hbm_workers: int, *, hbm_fraction: float = 1.0,
             host_fraction: float = 0.5, ssd_fraction: float = 0.5,
             retention_s: tuple[float, float, float] = (math.inf, math.inf, math.inf)) -> tuple[KVTier, ...]:
    """HBM, host-DRAM and SSD tiers of a cluster of ``workers`` nodes like ``worker``.

    * HBM: ``hbm_fraction`` of the KV capacity of the ``hbm_workers`` whose HBM holds the store
      (a disaggregated cluster's fill workers, which keep no decode KV); no load time.
    * DRAM: ``host_fraction`` of every worker's host memory (ASSUMPTION: half, the rest for the
      OS, the runtime and transfer staging), pooled across nodes as Mooncake's store is, so a blob
      comes back over min(host link, scale-out NIC) per GPU of the reading worker.
    * SSD: ``ssd_fraction`` of every worker's local NVMe (ASSUMPTION: half), read at the drives'
      bandwidth per GPU of the reading worker (capped by its NICs, the blob may sit on another node).

    Parameters
    ----------
    worker : Worker
        A node's model, hardware and layout (host memory and SSD from its accelerator).
    workers : int
        Nodes whose host memory and SSD the store pools (>= 1).
    hbm_workers : int
        Nodes whose HBM holds the store's hot tier (>= 0; 0 leaves a token HBM tier of 1 byte).
    hbm_fraction, host_fraction, ssd_fraction : float
        Shares of each medium the store may use, in (0, 1].
    retention_s : tuple of float
        Retention of the HBM, DRAM and SSD tiers (s; inf: none).

    Returns
    -------
    tuple of KVTier

    Raises
    ------
    ConfigError
        For a bad share or count, or hardware without host memory or SSD figures.
    """
    check_int("workers", workers, low=1)
    check_int("hbm_workers", hbm_workers, low=0)
    for name, v in (("hbm_fraction", hbm_fraction), ("host_fraction", host_fraction), ("ssd_fraction", ssd_fraction)):
        check_number(name, v, low=0.0, high=1.0, low_inclusive=False)
    a, g = worker.accelerator, worker.num_gpus
    if a.host_memory_bytes is None or a.ssd_bytes is None:
        raise ConfigError("hardware", f"{a.name} has no host memory or SSD figures (host_memory_bytes, "
                          "host_memory_bandwidth, ssd_bytes, ssd_bandwidth)")
    nic = g * a.scale_out_bandwidth
    hbm = max(hbm_fraction * hbm_workers * worker.kv_capacity_bytes, 1.0)
    return (KVTier("hbm", hbm, math.inf, retention_s[0]),
            KVTier("dram", host_fraction * workers * g * a.host_memory_bytes,
                   min(g * a.host_memory_bandwidth, nic), retention_s[1]),
            KVTier("ssd", ssd_fraction * workers * g * a.ssd_bytes, min(g * a.ssd_bandwidth, nic), retention_s[2]))


def session_chains(trace: pd.DataFrame) -> np.ndarray:
    """Each request's previous turn in its session's chain of blobs (-1: none).

    A turn with ``cached_tokens > 0`` continues the chain of the session's previous turn (by
    ``turn``); one with 0 starts a new chain (a session's first turn, or after a compaction).

    Parameters
    ----------
    trace : DataFrame
        A request table; without ``session_id`` every request is its own chain.

    Returns
    -------
    ndarray of int
    """
    n = len(trace)
    prev = np.full(n, -1, dtype=np.int64)
    if "session_id" not in trace or "turn" not in trace:
        return prev
    sid = trace["session_id"].astype(str).to_numpy()
    cached = trace["cached_tokens"].to_numpy() if "cached_tokens" in trace else np.zeros(n)
    order = np.lexsort((trace["turn"].to_numpy(), sid))
    for a, b in zip(order[:-1], order[1:]):
        if sid[a] == sid[b] and sid[a] != "" and cached[b] > 0:
            prev[b] = a
    return prev


class TieredKVStore(PrefixCache):
    """The tiered store as a prefix-cache policy (see the module notes).

    Parameters
    ----------
    tiers : sequence of KVTier
        Shallow to deep (HBM first); retention must not shrink down the tiers.
    bytes_per_token : float
        KV bytes per token of a blob (> 0).
    block_tokens : int
        Tokens per ``hash_ids`` block (>= 1).
    trace : DataFrame, optional
        The request table the store serves; its sessions give the blob chains when it has no
        ``hash_ids``.
    """

    def __init__(self, tiers: Sequence[KVTier], bytes_per_token: float, block_tokens: int = 512,
                 trace: pd.DataFrame | None = None):
        if not tiers:
            raise ConfigError("tiers", "needs at least one tier")
        self.tiers = tuple(tiers)
        for up, down in zip(self.tiers, self.tiers[1:]):
            if down.retention_s < up.retention_s:
                raise ConfigError(f"tier[{down.name}].retention_s", f"{down.retention_s} is below the "
                                  f"{up.name} tier's {up.retention_s}: retention must not shrink down the tiers")
        check_number("bytes_per_token", bytes_per_token, low=0.0, low_inclusive=False)
        check_int("block_tokens", block_tokens, low=1)
        self.bytes_per_token = float(bytes_per_token)
        self.block_tokens = block_tokens
        if trace is not None:
            self.prev = session_chains(trace).tolist()
            root = list(range(len(self.prev)))
            for i in range(len(root)):  # a turn's chain is named by its first turn
                j = i
                while self.prev[j] >= 0 and root[j] == j:
                    j = self.prev[j]
                root[i] = root[j]
            self.root = root
        else:
            self.prev = self.root = None
        T = len(self.tiers)
        self.where: dict = {}                 # key -> [tier, tokens, bytes, last use, version]
        self.lru = [OrderedDict() for _ in range(T)]
        self.used = [0.0] * T
        self.byte_s = [0.0] * T
        self.clock = 0.0
        self.expiry: list = []                # (time, seq, key, version)
        self._seq = 0
        self.dropped: set = set()
        self.served = [0] * T                 # tokens served per tier
        self.load_s = [0.0] * T
        self.rebuilt = 0
        self.blobs_dropped = 0
        self.log: dict = {}                   # request -> (tokens per tier..., rebuilt, load s, source)
        self.rows = None                      # request -> row of the store's trace (bind)

    def bind(self, rows) -> None:
        """Requests numbered from 0 are rows ``rows`` of the store's trace from now on: a run on
        part of the table (a window after a warm-up replayed into the store) keeps its sessions'
        chains.

        Parameters
        ----------
        rows : sequence of int or None
            Row of the store's trace of each request (None: the requests are the rows).
        """
        self.rows = None if rows is None else list(map(int, rows))

    def reset_counts(self) -> None:
        """Forget what was served, loaded and rebuilt so far (the blobs stay where they are): the
        end of a warm-up. Byte-seconds count from simulated time 0 anyway (a warm-up replayed at
        negative times adds none)."""
        T = len(self.tiers)
        self.served, self.load_s = [0] * T, [0.0] * T
        self.rebuilt = self.blobs_dropped = 0
        self.log = {}

    # -- time ---------------------------------------------------------------------------------
    def _integrate(self, t: float) -> None:
        dt = t - self.clock
        if dt > 0:
            for k, u in enumerate(self.used):
                self.byte_s[k] += u * dt
            self.clock = t

    def advance(self, now: float) -> None:
        """Move every blob whose retention ran out by ``now`` down, at its own moment.

        Parameters
        ----------
        now : float
            Simulated time (s).
        """
        heap = self.expiry
        while heap and heap[0][0] <= now:
            t, _, key, version = heapq.heappop(heap)
            e = self.where.get(key)
            if e is None or e[4] != version:
                continue  # used or moved since
            self._integrate(t)
            self._remove(key, e)
            self._place(e[0] + 1, key, e)
        self._integrate(now)

    # -- placement ----------------------------------------------------------------------------
    def _remove(self, key, e) -> None:
        del self.lru[e[0]][key]
        self.used[e[0]] -= e[2]

    def _place(self, k: int, key, e) -> None:
        """Put blob ``key`` in tier ``k`` (dropped past the last), demoting to make room."""
        T = len(self.tiers)
        while k < T and e[2] > self.tiers[k].capacity_bytes:
            k += 1  # larger than the whole tier
        e[4] += 1
        if k >= T:
            del self.where[key]
            self.dropped.add(key)
            self.blobs_dropped += 1
            return
        e[0] = k
        self.lru[k][key] = None
        self.used[k] += e[2]
        tier = self.tiers[k]
        if tier.retention_s < math.inf:
            self._seq += 1
            heapq.heappush(self.expiry, (max(e[3] + tier.retention_s, self.clock), self._seq, key, e[4]))
        lru = self.lru[k]
        while self.used[k] > tier.capacity_bytes:
            old = next(iter(lru))
            oe = self.where[old]
            self._remove(old, oe)
            self._place(k + 1, old, oe)

    def _blocks(self, blocks, input_tokens: int) -> list:
        """The (key, tokens) blocks covering a request's input, in order."""
        bt = self.block_tokens
        out, left = [], input_tokens
        for h in blocks:
            out.append((h, min(bt, max(left, 0))))
            left -= bt
        return out

    # -- the policy ---------------------------------------------------------------------------
    def fetch(self, request, blocks, input_tokens, given_cached, now):
        self.advance(now)
        if blocks is None:
            return self._fetch_chain(request, input_tokens, given_cached, now)
        blobs = self._blocks(blocks, input_tokens)
        T = len(self.tiers)
        by_tier = [0] * T
        load = 0.0
        hit = rebuilt = 0
        deepest = -1
        walking = True
        for key, tok in blobs:
            e = self.where.get(key)
            if walking and e is not None and hit < input_tokens:
                take = min(tok, input_tokens - hit)
                hit += take
                by_tier[e[0]] += take
                deepest = max(deepest, e[0])
                load += self._load(e)
                continue
            walking = False
            if e is not None or key in self.dropped:
                rebuilt += tok  # stored once, computed again: its chain broke before it
        # every blob the fill reads or writes is in HBM now, last used now; the chain's head is
        # placed last, so capacity demotes a chain from its tail first
        for key, tok in reversed(blobs):
            self._use(key, tok, now)
        return self._book(request, by_tier, rebuilt, load, hit, deepest)

    def _load(self, e) -> float:
        bw = self.tiers[e[0]].read_bandwidth
        if bw == math.inf:
            return 0.0
        self.load_s[e[0]] += e[2] / bw
        return e[2] / bw

    def _use(self, key, tokens: int, now: float) -> None:
        """Blob ``key`` (now ``tokens`` long) is read or written by a fill: into HBM, last used now."""
        e = self.where.get(key)
        if e is None:
            self.dropped.discard(key)
            e = self.where[key] = [0, tokens, tokens * self.bytes_per_token, now, 0]
        else:
            self._remove(key, e)
            e[1], e[2] = tokens, tokens * self.bytes_per_token
        e[3] = now
        self._place(0, key, e)

    def _fetch_chain(self, request, input_tokens, given_cached, now):
        """Session mode: the prefix is the chain's blob; the turn's input extends it."""
        T = len(self.tiers)
        by_tier = [0] * T
        load, hit, rebuilt, deepest = 0.0, 0, 0, -1
        if self.prev is None:
            key = ("r", request)
        else:
            row = self.rows[request] if self.rows is not None else request
            key = ("s", self.root[row])
            if self.prev[row] >= 0:  # a continuation: its prefix is the chain so far
                e = self.where.get(key)
                if e is not None:
                    hit = min(e[1], given_cached)
                    by_tier[e[0]] = hit
                    deepest = e[0]
                    load = self._load(e)
                elif key in self.dropped:
                    rebuilt = given_cached
        self._use(key, input_tokens, now)
        return self._book(request, by_tier, rebuilt, load, hit, deepest)

    def _book(self, request, by_tier, rebuilt, load, hit, deepest):
        T = len(self.tiers)
        for k in range(T):
            self.served[k] += by_tier[k]
        self.rebuilt += rebuilt
        # the deepest source of the prefix: a tier, "rebuilt" when part of it was computed again,
        # "none" when nothing was reusable
        source = T if rebuilt else (deepest if deepest >= 0 else T + 1)
        self.log[request] = (*by_tier, rebuilt, load, source)
        return hit, load

    def record_columns(self, n: int) -> dict:
        """``prefix_tier`` (:data:`TIER_SOURCES`), ``prefix_load_s``, ``rebuilt_tokens`` and
        tokens served per tier (``<tier>_tokens``) for each of the ``n`` requests (NaN / ``none``
        where a fill never started)."""
        T = len(self.tiers)
        names = [t.name for t in self.tiers]
        labels = names + ["rebuilt", "none"]
        tokens = np.zeros((n, T), dtype=np.int64)
        rebuilt = np.zeros(n, dtype=np.int64)
        load = np.full(n, np.nan)
        source = np.full(n, "none", dtype=object)
        for i, row in self.log.items():
            tokens[i] = row[:T]
            rebuilt[i], load[i] = row[T], row[T + 1]
            source[i] = labels[row[T + 2]]
        cols = {"prefix_tier": source, "prefix_load_s": load, "rebuilt_tokens": rebuilt}
        for k, name in enumerate(names):
            cols[f"{name}_tokens"] = tokens[:, k]
        return cols

    def metrics(self, now: float) -> dict:
        """``{"kv_store": {...}}`` at the run's end ``now``: tokens served per tier and rebuilt,
        their shares of the reusable prefix tokens (served + rebuilt), load seconds, byte-seconds
        held per tier (HBM's are idle HBM) and the mean bytes held."""
        self.advance(now)
        reusable = sum(self.served) + self.rebuilt
        out = {"reusable_tokens": reusable, "rebuilt_tokens": self.rebuilt,
               "rebuilt_share": self.rebuilt / reusable if reusable else 0.0,
               "blobs_dropped": self.blobs_dropped, "tiers": {}}
        for k, t in enumerate(self.tiers):
            out["tiers"][t.name] = {
                "served_tokens": self.served[k], "share": self.served[k] / reusable if reusable else 0.0,
                "load_seconds": self.load_s[k],
                "byte_seconds": self.byte_s[k], "mean_bytes": self.byte_s[k] / now if now > 0 else 0.0,
                "capacity_bytes": t.capacity_bytes, "retention_s": t.retention_s}
        out["load_seconds"] = float(sum(self.load_s))
        out["hbm_idle_byte_seconds"] = self.byte_s[0]
        return {"kv_store": out}

    def params(self) -> dict:
        return {**super().params(), "bytes_per_token": self.bytes_per_token,
                "tiers": [{"name": t.name, "capacity_bytes": t.capacity_bytes, "read_bandwidth": t.read_bandwidth,
                           "retention_s": t.retention_s} for t in self.tiers]}


def replay_store(trace: pd.DataFrame, store: TieredKVStore, end_s: float | None = None,
                 rows=None) -> tuple[pd.DataFrame, dict]:
    """Run a request table through ``store`` alone: each request's fill starts at its arrival.

    Queueing and service times are left out, which is what retention on the minutes-to-days
    scale may ignore (a fill waits seconds); it makes a days-long sweep cheap.

    Parameters
    ----------
    trace : DataFrame
        A request table on one clock (``arrival_s``, ``input_tokens``, optional
        ``cached_tokens`` and ``hash_ids``).
    store : TieredKVStore
        The store (built with ``trace`` when it has no ``hash_ids``).
    end_s : float, optional
        Where the accounting stops (default: the last arrival).
    rows : sequence of int, optional
        Rows of the store's trace that ``trace``'s rows are (:meth:`TieredKVStore.bind`).

    Returns
    -------
    tuple
        ``(records, metrics)``: one row per request with the store's record columns, and
        :meth:`TieredKVStore.metrics`.
    """
    n = len(trace)
    order = np.argsort(trace["arrival_s"].to_numpy(), kind="stable")
    t = trace["arrival_s"].to_numpy(dtype=float)
    inp = trace["input_tokens"].to_numpy(dtype=np.int64)
    cached = trace["cached_tokens"].to_numpy(dtype=np.int64) if "cached_tokens" in trace else np.zeros(n, np.int64)
    hashes = trace["hash_ids"].to_numpy() if "hash_ids" in trace else None
    store.bind(rows)
    for i in order.tolist():
        store.fetch(i, hashes[i] if hashes is not None else None, int(inp[i]), int(cached[i]), float(t[i]))
    end = float(t.max()) if end_s is None else end_s
    rec = pd.DataFrame({"arrival_s": t, "input_tokens": inp, "cached_tokens": cached, **store.record_columns(n)})
    return rec, store.metrics(end)
