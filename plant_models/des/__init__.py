"""Request-level discrete-event model of the token factory (the request simulator).

Requests from a request table arrive at the orchestrator's admission queue (the backlog); an
admission controller - the same objects the fluid model runs - releases them into fill at its
commanded rate, sampled at its own period with the plant's measurement delay. Fill workers run
chunked prefill/midfill with continuous batching under a per-step token budget; each finished
request's KV blob moves to decode over the fill worker's striped links; it waits in the ready
buffer; decode workers join ready sequences between passes while their KV memory has room and
generate one token per sequence per pass. Agentic sessions return for a midfill after a think time.

Speed comes from events per worker pass, not per token: a decode worker whose batch does not
change *leaps* over every pass up to the next completion in one scheduled call, with the exact
pass time of each pass; a ready arrival, a rate change or a fault cuts the leap at the next pass
boundary. Records are flat preallocated arrays, one row per request.

Nothing is lost: every arrival ends completed, rejected with a reason, or in flight, and
:func:`simulate` raises :class:`tokenfactory.core.errors.ConservationError` otherwise. Worker crashes
re-queue their requests (counted) - their KV is gone and must be rebuilt by a new fill.

Modules, one concern each:

* :mod:`~tokenfactory.plant_models.des.params` - :class:`DESParams`, service-time tables sampled
  from the service model;
* :mod:`~tokenfactory.plant_models.des.config` - :class:`ClusterConfig`;
* :mod:`~tokenfactory.plant_models.des.cache` - prefix-cache policies;
* :mod:`~tokenfactory.plant_models.des.fill`, :mod:`~tokenfactory.plant_models.des.decode` - the
  two stages; :mod:`~tokenfactory.plant_models.des.aggregated` - workers that run both in one
  pass (aggregated serving);
* :mod:`~tokenfactory.plant_models.des.tiers` - the tiered KV store (HBM, host DRAM, SSD;
  retention; rebuild from text), a prefix-cache policy;
* :mod:`~tokenfactory.plant_models.des.work` - FLOPs and bytes per pass, utilisation;
* :mod:`~tokenfactory.plant_models.des.pool_changes` - autoscaling, moves, crashes, slowdowns (the pool
  model's fleet rules);
* :mod:`~tokenfactory.plant_models.des.measure` - snapshots, measurements, the control loop;
* :mod:`~tokenfactory.plant_models.des.records` - :class:`Stage`, :class:`Snapshot`, per-request records;
* :mod:`~tokenfactory.plant_models.des.workers` - what every worker has, and idle workers woken
  together once per instant;
* :mod:`~tokenfactory.plant_models.des.simulator` - :class:`Simulator` and :func:`simulate`.
"""

# events and reject reasons were importable from here before they moved to the core layer
from tokenfactory.core.events import DecodeRateDip, LinkSlowdown, Reconfiguration, WorkerCrash  # noqa: F401
from tokenfactory.plant_models.des.cache import (
    LRUPrefixCache,
    NoPrefixCache,
    PrefixCache,
    UnboundedPrefixCache,
    prefix_cache_for,
)
from tokenfactory.plant_models.des.aggregated import AggregatedStage, AggregatedWorker
from tokenfactory.plant_models.des.config import ClusterConfig
from tokenfactory.plant_models.des.simulator import OpenAdmission, Simulator, simulate
from tokenfactory.plant_models.des.params import DESParams
from tokenfactory.plant_models.des.records import Snapshot, Stage
from tokenfactory.plant_models.des.tiers import TIER_SOURCES, KVTier, TieredKVStore, kv_tiers, replay_store, session_chains
from tokenfactory.plant_models.des.work import PassWork, WorkLedger
from tokenfactory.plant_models.result import SimulationResult
from tokenfactory.core.signals import REJECT_REASONS  # noqa: F401

#: the former name of the request simulator's result (now every plant's)
DESResult = SimulationResult

__all__ = ["DESParams", "ClusterConfig", "Simulator", "OpenAdmission", "simulate", "Stage", "Snapshot",
           "PrefixCache", "NoPrefixCache", "UnboundedPrefixCache", "LRUPrefixCache", "prefix_cache_for",
           "DESResult", "AggregatedWorker", "AggregatedStage", "KVTier", "TieredKVStore", "kv_tiers", "replay_store",
           "session_chains", "TIER_SOURCES", "PassWork", "WorkLedger"]
