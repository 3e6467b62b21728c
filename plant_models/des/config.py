"""One run's cluster: pools, delays, SLOs, prefix cache, KV watermark, events and run control."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokenfactory.core.classes import RequestClass, class_table, classes_from_dict
from tokenfactory.core.events import DecodeRateDip, LinkSlowdown, Reconfiguration, WorkerCrash, events_from_dicts
from tokenfactory.plant_models.fleet import PoolDynamics
from tokenfactory.core.validation import ConfigError, check_fields, check_number, reject_unknown_keys, setting

__all__ = ["ClusterConfig", "EVENT_KINDS"]

#: the events the request simulator accepts (:mod:`tokenfactory.core.events`)
EVENT_KINDS = (WorkerCrash.kind, LinkSlowdown.kind, DecodeRateDip.kind, Reconfiguration.kind)


@dataclass(frozen=True)
class ClusterConfig:
    """Pools, delays, SLOs and run control of one simulation (validated up front).

    ``prefix_cache_blocks``: None = an unbounded prefix cache (or, without ``hash_ids`` in the
    trace, the trace's own ``cached_tokens``), 0 = none, n = LRU of n blocks
    (:mod:`tokenfactory.plant_models.des.cache`). ``kv_watermark``: a new sequence joins a decode
    batch only if this fraction of KV stays free for growth (vLLM's default, 1 %).
    ``snapshot_dt`` is the period of the recorded time series, which is also what controllers
    sample (with ``measurement_delay_s``).

    ``aggregated_workers`` > 0 makes an aggregated cluster: workers that fill and decode in the
    same passes (:mod:`tokenfactory.plant_models.des.aggregated`); it then needs
    ``fill_workers = decode_workers = 0``, no autoscalers and no events.

    Parameters
    ----------
    fill_workers, decode_workers : int
        Workers serving at the start (>= 0).
    aggregated_workers : int
        Aggregated workers (>= 0; default 0: a disaggregated cluster).
    measurement_delay_s : float
        Age of what controllers see (s, >= 0).
    snapshot_dt : float
        Sample period of the time series (s, [0.001, 60]).
    prefix_cache_blocks : int or None
        Prefix-cache policy (see above).
    slo_ttft_s, slo_tpot_s : float
        The SLO ``slo_attainment`` counts against (s, > 0).
    kv_watermark : float
        KV fraction kept free when a sequence joins, in [0, 0.5].
    duration_s : float or None
        Simulated time (s); None: the last arrival + ``drain_s``.
    drain_s : float
        Time after the last arrival when ``duration_s`` is None (s, >= 0).
    dynamics : PoolDynamics
        Start-up, warm-up, drain and fleet size of autoscaled workers.
    autoscale_start_s : float
        First autoscaler sample (s, >= 0).
    events : tuple
        Events of the kinds in :data:`EVENT_KINDS` (objects or tables with a ``kind``).
    seed : int
        Seed of the run's random generator (>= 0).
    progress : bool or None
        Print progress to stderr (None: when stderr is a terminal).
    classes : tuple of RequestClass
        Request classes with their own SLOs and priorities (the trace's ``request_class`` column
        names them); empty (default): every request is judged by ``slo_ttft_s``/``slo_tpot_s``
        and served first come first served, whatever its class (per-class metrics are still
        reported). Given as objects, or (``from_dict``) as a table ``{name: {fields}}`` applied
        to :data:`tokenfactory.core.classes.DEFAULT_CLASSES`.
    batch_cap : float or None
        Largest decode batch per worker at the start (sequences, >= 1); None (default): the
        service tables' ``decode_max_batch``. A :class:`tokenfactory.core.signals.BatchCapAction`
        changes it during the run.
    """

    fill_workers: int = setting(8, kind=int, low=0, unit="workers", meaning="fill (prefill) workers serving at the "
                                                                           "start")
    decode_workers: int = setting(8, kind=int, low=0, unit="workers", meaning="decode workers serving at the start")
    aggregated_workers: int = setting(0, kind=int, low=0, unit="workers",
                                      meaning="workers that fill and decode in the same passes (> 0: an aggregated "
                                              "cluster, with fill_workers = decode_workers = 0, no autoscalers, no "
                                              "events)")
    measurement_delay_s: float = setting(0.5, unit="s", low=0.0, meaning="age of what controllers see")
    snapshot_dt: float = setting(0.1, unit="s", low=0.001, high=60.0,
                                 meaning="sample period of the recorded time series, also what controllers sample")
    prefix_cache_blocks: int | None = setting(None, kind=int, low=0, unit="blocks",
                                              meaning="prefix cache: absent = unbounded (or the trace's own "
                                                      "cached_tokens without hash_ids), 0 = none, n = LRU of n blocks")
    slo_ttft_s: float = setting(2.0, unit="s", low=0.0, low_inclusive=False,
                                meaning="time-to-first-token SLO that slo_attainment counts against")
    slo_tpot_s: float = setting(0.1, unit="s", low=0.0, low_inclusive=False,
                                meaning="time-per-output-token SLO that slo_attainment counts against")
    kv_watermark: float = setting(0.01, low=0.0, high=0.5, source="vLLM's default (1 %)",
                                  meaning="KV fraction kept free for growth when a sequence joins a decode batch")
    duration_s: float | None = setting(None, unit="s", low=0.0, low_inclusive=False,
                                       meaning="simulated time (absent: the last arrival + drain_s)")
    drain_s: float = setting(120.0, unit="s", low=0.0,
                             meaning="time simulated after the last arrival when duration_s is absent")
    dynamics: PoolDynamics = setting(PoolDynamics(), kind="table",
                                     meaning="start-up, warm-up, drain and fleet size of autoscaled workers (the "
                                             "cluster.dynamics table)")
    autoscale_start_s: float = setting(0.0, unit="s", low=0.0, meaning="first autoscaler sample")
    events: tuple = setting((), kind="list of tables",
                            meaning="events during the run, each a table with a kind ([[cluster.events]]; see "
                                    "cluster.events.KIND)")
    seed: int = setting(0, kind=int, low=0, meaning="seed of the run's random generator")
    progress: bool | None = setting(None, kind=bool, meaning="print progress to stderr (absent: when stderr is a "
                                                             "terminal)")
    classes: tuple = setting((), kind="table",
                             meaning="request classes with their own SLOs and priorities, {name = {fields}} over "
                                     "the default classes (also the top-level [classes] table; see classes.NAME)")
    batch_cap: float | None = setting(None, low=1.0, unit="sequences",
                                      meaning="largest decode batch per worker at the start (inf: no cap; absent: "
                                              "the service tables' decode_max_batch)")

    def __post_init__(self) -> None:
        check_fields(self, "cluster", names=("fill_workers", "decode_workers", "aggregated_workers"), hold=False)
        if self.aggregated_workers and (self.fill_workers or self.decode_workers):
            raise ConfigError("cluster.aggregated_workers", f"an aggregated cluster has no fill or decode pool: give "
                              f"fill_workers = decode_workers = 0, not {self.fill_workers} and {self.decode_workers}")
        check_fields(self, "cluster", names=("measurement_delay_s", "snapshot_dt", "prefix_cache_blocks",
                                             "slo_ttft_s", "slo_tpot_s", "kv_watermark", "duration_s", "drain_s",
                                             "autoscale_start_s"), hold=False)
        if self.dynamics.fleet_size is not None and self.fill_workers + self.decode_workers > self.dynamics.fleet_size:
            raise ConfigError("cluster.dynamics.fleet_size", f"{self.dynamics.fleet_size} workers cannot hold the "
                              f"initial {self.fill_workers} fill + {self.decode_workers} decode")
        check_fields(self, "cluster", names=("seed",), hold=False)
        object.__setattr__(self, "events", events_from_dicts(self.events, "cluster.events", EVENT_KINDS))
        if self.aggregated_workers and self.events:
            raise ConfigError("cluster.events", "the aggregated pool is fixed: it takes no events")
        classes = tuple(self.classes)
        for k, c in enumerate(classes):
            if not isinstance(c, RequestClass):
                raise ConfigError(f"cluster.classes[{k}]", f"expected a RequestClass, got {type(c).__name__}")
        if classes:
            class_table(classes)  # names unique
        object.__setattr__(self, "classes", classes)
        if self.batch_cap is not None:
            check_number("cluster.batch_cap", self.batch_cap, low=1.0, allow_inf=True)

    def class_table(self) -> dict[str, RequestClass] | None:
        """The classes by name, highest priority first, or None when none are configured.

        Returns
        -------
        dict or None
            ``name -> RequestClass``.
        """
        return class_table(self.classes) if self.classes else None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "cluster") -> "ClusterConfig":
        """From a mapping (a scenario file's ``[cluster]``); ``dynamics`` is a table of
        :class:`PoolDynamics` fields, ``events`` a list of tables with a ``kind``, ``classes`` a
        table of classes (:func:`tokenfactory.core.classes.classes_from_dict`).

        Parameters
        ----------
        d : mapping
            The fields; unknown keys raise :class:`ConfigError` naming them.
        where : str
            Field path for error messages (default ``"cluster"``).

        Returns
        -------
        ClusterConfig
        """
        d = dict(d)
        reject_unknown_keys(where, d, {f.name for f in dataclasses.fields(cls)})
        if isinstance(d.get("dynamics"), Mapping):
            d["dynamics"] = PoolDynamics.from_dict(d["dynamics"], f"{where}.dynamics")
        evs = events_from_dicts(d.pop("events", []), f"{where}.events", EVENT_KINDS)
        if "classes" in d and isinstance(d["classes"], Mapping):
            d["classes"] = classes_from_dict(d["classes"], f"{where}.classes")
        return cls(events=evs, **d)
