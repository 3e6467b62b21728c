"""Replaying a request table through the request simulator with named controllers.

:func:`build_replay` derives the request simulator's and the fluid plant's parameters from the
roofline at the trace's own request shape (so a "load" is a multiple of the cluster's bottleneck
capacity whatever the trace); :func:`run_replay` runs one replay with an admission kind and an
optional autoscaler kind from :mod:`tokenfactory.registry` and adds the ready buffer's oscillation
verdict to the metrics. Used by ``tokenfactory simulate`` and the studies.

The scenario file a replay reads is :mod:`tokenfactory.replay_scenario`, each request's own
service cost :mod:`tokenfactory.replay_costs`; their public names are importable from here too.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tokenfactory.controllers.oscillation import judge_actuators
from tokenfactory.plant_models.des import ClusterConfig, DESParams
from tokenfactory.plant_models.fluid import FluidParams, FluidPlant
from tokenfactory.plant_models.plant_protocol import RequestPlant
from tokenfactory.plant_models.roofline import Worker
from tokenfactory.plant_models.service import KVLink, RequestShape, ServiceModel
from tokenfactory.registry import DEFAULT_TPOT_FRACTION, PlantContext, build_admission, build_autoscalers, static_batch_cap
from tokenfactory.replay_costs import infeasible, request_costs, service_capacity
from tokenfactory.replay_scenario import (DEFAULT_PLANT, REPLAY_PLANT_SCHEMA, ReplayScenario, load_replay_scenario,
                                          parameter_set_used, plant_efficiency, replay_scenario_from_dict,
                                          scenario_cluster)
from tokenfactory.traces.transforms import place_sessions, scale_trace
from tokenfactory.core.validation import ConfigError, check_choice, check_number, reject_unknown_keys

__all__ = ["scenario_cluster", "DEFAULT_PLANT", "ReplaySetup", "ClusterCapacity", "KNEE_ATTAINMENT",
           "request_shape_of", "build_replay", "run_replay", "result_verdict", "class_outputs", "request_costs",
           "service_capacity", "infeasible",
           "replay_trace", "ReplayScenario", "replay_scenario_from_dict", "load_replay_scenario"]

#: the knee the measured capacity sits at: open admission's SLO attainment over the requests that
#: can meet their SLO at all (the middle of issue 27's knee band, 0.95-0.995 of the arrivals)
KNEE_ATTAINMENT = 0.98
#: bumped when the request simulator changes what a capacity measurement finds (invalidates disk caches)
_CAPACITY_CACHE_VERSION = 2
#: the nearly idle load (x the model's capacity) open admission's attainment ceiling is measured at
_IDLE_LOAD = 0.25


@dataclasses.dataclass(frozen=True)
class ClusterCapacity:
    """The capacity at the SLO of one simulated cluster - the one figure ``--load``,
    ``slo_capacity_rps``, the static batch cap and the studies' "x capacity" all come from
    (:meth:`ReplaySetup.capacity`).

    Parameters
    ----------
    model_rps : float
        The model's estimate (requests/s): the smaller of the fill pool's and the decode pool's
        capacity from each request's own service cost (:func:`service_capacity`), the decode pool
        at ``batch_cap``. Linear in each pool's workers by construction (no shared resource between
        workers in the model: the KV link is per worker pair), so doubling both pools doubles it.
    bottleneck : str
        The pool that sets ``model_rps``.
    batch_cap : float
        The static decode batch cap at the TPOT SLO (sequences per worker;
        :func:`tokenfactory.registry.static_batch_cap`).
    fill_rps, decode_rps : float
        Each pool's capacity (requests/s).
    kv_rps : float
        The bottleneck capacity with every KV slot busy at the mean request (the fluid plant's; the
        trace-replay study's load axis).
    cluster : dict
        What it was computed for: pools, models, hardware, parallelism, SLOs, classes, the batch
        cap the run uses; events are excluded (named in ``events_excluded``).
    measured_rps : float or None
        The capacity found by bisection in the request simulator under open admission (None: not
        measured): the largest offered rate at which open admission meets the SLO for
        ``measured["target_attainment"]`` of the arrivals.
    measured : dict or None
        The bisection: target, tolerance, every point tried (rate, attainment), runs, wall time,
        ``cached`` (read from the disk cache).
    """

    model_rps: float
    bottleneck: str
    batch_cap: float
    fill_rps: float
    decode_rps: float
    kv_rps: float
    cluster: dict
    measured_rps: float | None = None
    measured: dict | None = None

    @property
    def rps(self) -> float:
        """The capacity a load is a multiple of: the measured one when there is one, else the model's."""
        return self.measured_rps if self.measured_rps is not None else self.model_rps

    @property
    def source(self) -> str:
        """``"measured"`` or ``"model"``."""
        return "measured" if self.measured_rps is not None else "model"

    def to_dict(self) -> dict:
        """Plain figures (what ``metrics.json`` records as ``capacity``)."""
        d = dataclasses.asdict(self)
        d["rps"], d["source"] = self.rps, self.source
        d["measured_over_model"] = self.measured_rps / self.model_rps if self.measured_rps else None
        return d


@dataclasses.dataclass
class ReplaySetup:
    """Everything a replay needs, derived once from a trace and a plant description.

    Parameters
    ----------
    trace : DataFrame
        The request table (:mod:`tokenfactory.traces.schema`) the setup was derived from.
    params : DESParams
        Request-simulator parameters: tables sampled from ``service`` (pass times by batch and
        context, the KV law, KV-transfer stripes and set-up time).
    plant : FluidPlant
        The fluid plant at the trace's mean request shape and the plant's pool sizes (what
        admission is tuned on).
    shape : RequestShape
        The trace's mean request (:func:`request_shape_of`).
    service : ServiceModel
        The service model both plants are sampled from.
    capacity_rps : float
        The cluster's bottleneck capacity at that shape (requests/s): the smaller of the fill
        pool's prefill throughput and the decode pool's completion rate with every KV slot busy
        (the trace-replay study's loads are multiples of this).
    bottleneck : str
        The pool that sets ``capacity_rps``: ``"fill"`` or ``"decode"``.
    plant_config : dict
        The resolved plant description (:data:`DEFAULT_PLANT` and overrides) the setup was built
        from (recorded with every capacity).

    Capacities for a cluster (:meth:`capacity`) are cached on the object, so a setup measures
    each cluster's capacity once.
    """

    trace: pd.DataFrame
    params: DESParams
    plant: FluidPlant
    shape: RequestShape
    service: ServiceModel
    capacity_rps: float
    bottleneck: str
    plant_config: dict = dataclasses.field(default_factory=lambda: dict(DEFAULT_PLANT))
    _capacities: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def context(self, slo_ttft_s: float = 2.0, slo_tpot_s: float = 0.1, **kw: Any) -> PlantContext:
        """The :class:`PlantContext` controllers of this replay are built for.

        Parameters
        ----------
        slo_ttft_s : float
            Time-to-first-token SLO (s; default 2.0).
        slo_tpot_s : float
            Time-per-output-token SLO (s; default 0.1).
        **kw
            Further :class:`PlantContext` fields (``rate_rps``, ``dynamics``,
            ``arrival_times_s``, ...).

        Returns
        -------
        PlantContext
            At this setup's fluid parameters and pool sizes.
        """
        kw.setdefault("service", self.service)
        fill = kw.pop("fill_workers", None)
        dec = kw.pop("decode_workers", None)
        return PlantContext(self.plant.params, int(self.plant.fill_workers if fill is None else fill),
                            int(self.plant.decode_workers if dec is None else dec),
                            slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s, **kw)

    def cluster_config(self, cluster: "dict | ClusterConfig | None" = None) -> ClusterConfig:
        """The cluster a replay simulates: the setup's pools and measurement delay, overridden by
        ``cluster`` (:class:`ClusterConfig` fields, or a resolved one, returned as is).

        Parameters
        ----------
        cluster : dict or ClusterConfig, optional
            The overrides.

        Returns
        -------
        ClusterConfig
        """
        if isinstance(cluster, ClusterConfig):
            return cluster
        base = {"fill_workers": int(self.plant.fill_workers), "decode_workers": int(self.plant.decode_workers),
                "measurement_delay_s": self.plant.params.measurement_delay_s, **(cluster or {})}
        return ClusterConfig.from_dict(base)

    def capacity(self, cluster: "dict | ClusterConfig | None" = None, *, measure: bool = False,
                 tpot_fraction: float = DEFAULT_TPOT_FRACTION, target: float = KNEE_ATTAINMENT,
                 rel_tol: float = 0.03, duration_s: float | None = None, cache_dir=None) -> ClusterCapacity:
        """The capacity at the SLO of the cluster actually simulated: its pools, the setup's models,
        hardware and parallelism, its SLOs and classes (events excluded) - the one place the load
        axis, ``slo_capacity_rps`` and the static batch cap come from.

        The model's estimate always; with ``measure`` also the capacity found by bisection in the
        request simulator under open admission (the same cluster without its events, the batch cap
        the run uses: ``cluster.batch_cap``, KV memory only when unset): the offered rate at which
        open admission's SLO attainment over the arrivals crosses ``target`` x what it attains on a
        nearly idle cluster (a quarter of the model's capacity: infeasible requests, :func:`infeasible`,
        and arrivals the trace stamps with the same instant miss at any rate), interpolated between
        the last passing and failing rates once they are within ``rel_tol``. Cached on this setup, and in
        ``cache_dir`` (a JSON file per trace, plant, cluster and settings) when given.

        Parameters
        ----------
        cluster : dict or ClusterConfig, optional
            The cluster (:meth:`cluster_config`).
        measure : bool
            Also measure it (default False).
        tpot_fraction : float
            Share of the TPOT SLO a decode pass may take under the static cap.
        target : float
            Open admission's attainment at the knee, over the feasible share (default
            :data:`KNEE_ATTAINMENT`).
        rel_tol : float
            Relative width of the last bracket (default 0.03).
        duration_s : float, optional
            Window of a closed-session trace (default 3600 s).
        cache_dir : str or Path, optional
            Folder of the disk cache.

        Returns
        -------
        ClusterCapacity
        """
        cl = self.cluster_config(cluster)
        desc = self._cluster_description(cl, tpot_fraction)
        key = json.dumps(desc, sort_keys=True, default=str)
        hit = self._capacities.get(key)
        if hit is None:
            ctx = self.context(cl.slo_ttft_s, cl.slo_tpot_s, classes=cl.classes, class_outputs=class_outputs(self.trace),
                               fill_workers=cl.fill_workers, decode_workers=cl.decode_workers)
            cap = static_batch_cap(ctx, tpot_fraction)
            caps = service_capacity(self.costs, self.params, cl.fill_workers, cl.decode_workers, cap)
            neck = min(caps, key=caps.get)
            kv = FluidPlant(self.plant.params, cl.fill_workers, cl.decode_workers)
            hit = self._capacities[key] = ClusterCapacity(
                caps[neck], neck, cap, caps["fill"], caps["decode"], min(kv.fill_capacity, kv.decode_capacity),
                {**desc, "batch_cap_run": cl.batch_cap if cl.batch_cap is not None else cap})
        if not measure or hit.measured_rps is not None:
            return hit
        mkey = (key, target, rel_tol, duration_s, cl.seed, cl.batch_cap, cl.drain_s)
        done = self._capacities.get(mkey)
        if done is None:
            done = self._capacities[mkey] = _measure_capacity(self, cl, hit, target, rel_tol, duration_s, cache_dir)
        return done

    def _cluster_description(self, cl: ClusterConfig, tpot_fraction: float) -> dict:
        p = self.plant_config
        return {"fill_workers": int(cl.fill_workers), "decode_workers": int(cl.decode_workers),
                "aggregated_workers": int(cl.aggregated_workers),
                "model": p.get("model"), "hardware": p.get("hardware"),
                "decode_model": p.get("decode_model", p.get("model")),
                "decode_hardware": p.get("decode_hardware", p.get("hardware")),
                "parallelism": p.get("parallelism"), "params": p.get("params"), "efficiency": p.get("efficiency"),
                "kv_stripes": p.get("kv_stripes"), "kv_setup_s": p.get("kv_setup_s"),
                "slo_ttft_s": cl.slo_ttft_s, "slo_tpot_s": cl.slo_tpot_s,
                "classes": [dataclasses.asdict(c) for c in cl.classes] or None,
                "tpot_fraction": tpot_fraction, "events_excluded": len(cl.events)}

    def slo_capacity(self, slo_tpot_s: float = 0.1, tpot_fraction: float = DEFAULT_TPOT_FRACTION,
                     cluster: "dict | ClusterConfig | None" = None) -> tuple[float, str, float]:
        """The model's bottleneck capacity at the TPOT SLO of ``cluster`` (default: the setup's
        pools at ``slo_tpot_s``): ``(capacity_rps, bottleneck, batch_cap)`` of :meth:`capacity`
        (the decode pool at the largest batch whose roofline pass time meets the SLO for the
        trace's short requests - with the fitted roofline a DeepSeek-V3 decode worker on 8xH200
        at its full KV batch runs slower than a 0.1 s TPOT).

        Parameters
        ----------
        slo_tpot_s : float
            The TPOT SLO when ``cluster`` does not give one (s; default 0.1).
        tpot_fraction : float
            Share of it a pass may take (default :data:`tokenfactory.registry.DEFAULT_TPOT_FRACTION`).
        cluster : dict or ClusterConfig, optional
            The simulated cluster.

        Returns
        -------
        tuple
            ``(capacity_rps, bottleneck, batch_cap)``.
        """
        if not isinstance(cluster, ClusterConfig):
            cluster = {"slo_tpot_s": slo_tpot_s, **(cluster or {})}
        c = self.capacity(cluster, tpot_fraction=tpot_fraction)
        return c.model_rps, c.bottleneck, c.batch_cap

    @functools.cached_property
    def costs(self) -> pd.DataFrame:
        """Each request's own service cost (:func:`request_costs` of :attr:`trace` on
        :attr:`params`), computed once."""
        return request_costs(self.trace, self.params)

    def infeasible_share(self, classes=None) -> dict[str, float]:
        """Share of the trace's requests whose own service on an empty cluster already misses
        their class's SLO (:func:`infeasible`): ``{"ttft", "tpot", "any"}``.

        Parameters
        ----------
        classes : iterable of RequestClass, optional
            The SLOs (default :data:`tokenfactory.core.classes.DEFAULT_CLASSES`).

        Returns
        -------
        dict
        """
        bad = infeasible(self.costs, classes)
        return {k: float(bad[k].mean()) for k in ("ttft", "tpot", "any")}


def _trace_digest(trace: pd.DataFrame) -> str:
    h = hashlib.sha256()
    for col in ("arrival_s", "input_tokens", "output_tokens", "cached_tokens", "request_class", "session_id"):
        if col in trace:
            h.update(col.encode())
            h.update(pd.util.hash_pandas_object(trace[col], index=False).to_numpy().tobytes())
    h.update(repr(sorted((k, str(v)) for k, v in trace.attrs.items())).encode())
    return h.hexdigest()[:16]


def _replay_at_rate(trace: pd.DataFrame, rate_rps: float, duration_s: float | None, seed: int) -> tuple[pd.DataFrame, float]:
    """The trace at ``rate_rps`` requests/s: sped up (open traces) or its sessions placed at that
    rate over ``duration_s`` (closed sessions; the speed-up is then NaN)."""
    if trace.attrs.get("per_session_clock"):
        return place_sessions(trace, rate_rps, duration_s or 3600.0, seed=seed), math.nan
    rate = len(trace) / max(float(trace["arrival_s"].max()), 1e-9)
    scale = rate_rps / rate
    return (scale_trace(trace, scale) if scale != 1 else trace), scale


def _run_cluster(replay: pd.DataFrame, cl: ClusterConfig, duration_s: float | None) -> ClusterConfig:
    if replay.attrs.get("per_session_clock"):
        return dataclasses.replace(cl, duration_s=cl.duration_s or (duration_s or 3600.0) + cl.drain_s)
    return cl


def _measure_capacity(setup: ReplaySetup, cl: ClusterConfig, model: ClusterCapacity, target: float, rel_tol: float,
                      duration_s: float | None, cache_dir) -> ClusterCapacity:
    """Bisection of open admission's SLO attainment over the offered rate (see :meth:`ReplaySetup.capacity`)."""
    from tokenfactory.core.classes import INTERACTIVE, RequestClass

    check_number("capacity.target", target, low=0.0, high=1.0, low_inclusive=False)
    check_number("capacity.rel_tol", rel_tol, low=0.0, low_inclusive=False)
    run = dataclasses.replace(cl, events=(), progress=False)
    classes = cl.classes or (RequestClass(INTERACTIVE, cl.slo_ttft_s, cl.slo_tpot_s, 0),)
    feasible = 1.0 - float(infeasible(setup.costs, classes)["any"].mean())
    if feasible <= 0.0:
        raise ConfigError("capacity", "no request of the trace can meet its SLO even alone on an empty cluster: "
                          "there is no capacity at this SLO to measure (use the model's, --capacity model)")
    path = None
    if cache_dir is not None:
        ident = json.dumps({"version": _CAPACITY_CACHE_VERSION, "trace": _trace_digest(setup.trace),
                            "plant": setup.plant_config, "cluster": repr(run),
                            "efficiency": dataclasses.asdict(setup.service.fill_worker.efficiency), "target": target, "rel_tol": rel_tol,
                            "duration_s": duration_s}, sort_keys=True, default=str)
        path = Path(cache_dir) / f"capacity-{hashlib.sha256(ident.encode()).hexdigest()[:20]}.json"
        if path.exists():
            d = json.loads(path.read_text())
            return dataclasses.replace(model, measured_rps=d["measured_rps"], measured={**d["measured"], "cached": True})
    t0 = time.perf_counter()
    points: list[tuple[float, float]] = []

    def attained(rate: float) -> float:
        replay, _ = _replay_at_rate(setup.trace, rate, duration_s, run.seed)
        res = RequestPlant(setup.params, _run_cluster(replay, run, duration_s)).run(replay)
        a = float(res.metrics["slo_attainment"])
        points.append((rate, a))
        return a

    # the ceiling: what open admission attains on a nearly idle cluster (infeasible requests, and
    # arrivals the trace puts at the same instant, miss at any rate)
    ceiling = attained(_IDLE_LOAD * model.model_rps)
    goal = target * ceiling
    if ceiling <= 0.0:
        raise ConfigError("capacity", f"open admission meets no request's SLO even at {_IDLE_LOAD:g} x the model's "
                          "capacity: there is no capacity at this SLO to measure (use --capacity model)")
    x = model.model_rps
    a = attained(x)
    lo = hi = None
    if a >= goal:
        lo = (x, a)
        while hi is None and len(points) < 9:
            x *= 1.5
            a = attained(x)
            lo, hi = ((x, a), None) if a >= goal else (lo, (x, a))
    else:
        hi = (x, a)
        while lo is None and len(points) < 9:
            x /= 1.5
            if x <= _IDLE_LOAD * model.model_rps:
                lo = points[0]
                break
            a = attained(x)
            lo, hi = ((x, a), hi) if a >= goal else (None, (x, a))
    if lo is None or hi is None:
        raise ConfigError("capacity", f"open admission's SLO attainment did not cross {goal:.3f} between "
                          f"{min(p[0] for p in points):.3g} and {max(p[0] for p in points):.3g} req/s "
                          f"(points: {points})")
    while hi[0] / lo[0] > 1.0 + rel_tol and len(points) < 16:
        mid = math.sqrt(lo[0] * hi[0])
        a = attained(mid)
        lo, hi = ((mid, a), hi) if a >= goal else (lo, (mid, a))
    # the crossing, linear between the last passing and failing rates
    frac = (lo[1] - goal) / (lo[1] - hi[1]) if lo[1] > hi[1] else 0.0
    rps = lo[0] + min(max(frac, 0.0), 1.0) * (hi[0] - lo[0])
    measured = {"target_attainment": goal, "knee": target, "idle_attainment": ceiling, "feasible_share": feasible,
                "rel_tol": rel_tol,
                "points": [{"rate_rps": r, "slo_attainment": v} for r, v in points], "runs": len(points),
                "batch_cap": run.batch_cap, "wall_seconds": time.perf_counter() - t0, "cached": False}
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"measured_rps": rps, "measured": measured}, indent=2) + "\n")
    return dataclasses.replace(model, measured_rps=rps, measured=measured)


def request_shape_of(trace: pd.DataFrame) -> RequestShape:
    """The mean request of a request table (:meth:`RequestShape.from_requests`): new (uncached)
    prompt tokens, output tokens, cached tokens and the output length's coefficient of variation.

    Parameters
    ----------
    trace : DataFrame
        A request table with ``input_tokens`` and ``output_tokens`` columns (``cached_tokens``
        optional, 0 when absent).

    Returns
    -------
    RequestShape
        ``prompt_tokens`` = mean of (input - cached) tokens and ``output_tokens`` = mean output
        tokens, each request counted as at least 1 token and the means rounded to >= 1;
        ``cached_tokens`` = mean cached tokens; ``output_cv`` = sample standard deviation / mean
        of the output lengths (0 for a single request), capped at 10.
    """
    return RequestShape.from_requests(trace)


def build_replay(trace: pd.DataFrame, plant: dict | None = None) -> ReplaySetup:
    """The service model at the trace's shape, and the request simulator's and the fluid plant's
    parameters sampled from it.

    Parameters
    ----------
    trace : DataFrame
        A request table.
    plant : dict, optional
        Overrides of :data:`DEFAULT_PLANT` (plus ``parallelism``, ``efficiency``,
        ``decode_model``, ``decode_hardware``); unknown keys raise :class:`ConfigError`.

    Returns
    -------
    ReplaySetup
        The request-simulator parameters, the fluid plant at the trace's mean request and pool
        sizes, the service model, and the bottleneck capacity (requests/s) with the pool that
        sets it.

    Raises
    ------
    ConfigError
        For an unknown key of ``plant`` or an unknown model or hardware preset.
    """
    cfg = {**DEFAULT_PLANT, **(plant or {})}
    reject_unknown_keys("plant", cfg, set(REPLAY_PLANT_SCHEMA))  # the defaults and the optional keys
    common = {k: cfg[k] for k in ("parallelism",) if k in cfg}
    efficiency = plant_efficiency(cfg)   # plant.params' named set with plant.efficiency over it
    if efficiency is not None:
        common["efficiency"] = efficiency
    fill = Worker.from_dict({"model": cfg["model"], "hardware": cfg["hardware"], **common})
    dec = Worker.from_dict({"model": cfg.get("decode_model", cfg["model"]),
                            "hardware": cfg.get("decode_hardware", cfg["hardware"]), **common})
    shape = request_shape_of(trace)
    service = ServiceModel(fill, dec, shape, KVLink(cfg["kv_stripes"], cfg["kv_setup_s"]))
    fp = FluidParams.from_service(service, measurement_delay_s=cfg["measurement_delay_s"])
    plant_model = FluidPlant(fp, cfg["fill_workers"], cfg["decode_workers"])
    params = DESParams.from_service(service)
    caps = {"fill": plant_model.fill_capacity, "decode": plant_model.decode_capacity}
    neck = min(caps, key=caps.get)
    return ReplaySetup(trace, params, plant_model, shape, service, caps[neck], neck, cfg)


def class_outputs(trace: pd.DataFrame, quantile: float = 0.05) -> dict[str, tuple[float, float]]:
    """Per request class, the mean and the ``quantile`` of its output tokens (what the SLO-aware
    admission expects of a request of the class; the trace's history stands in for the
    orchestrator's).

    Parameters
    ----------
    trace : DataFrame
        A request table (``request_class`` optional: one class ``interactive`` without it).
    quantile : float
        The short-request quantile (default 0.05).

    Returns
    -------
    dict
        ``class -> (mean output tokens, quantile output tokens)``, at least 2 tokens each.
    """
    cls = trace["request_class"].astype(str) if "request_class" in trace else pd.Series("interactive", index=trace.index)
    out = {}
    for name, g in trace["output_tokens"].groupby(cls):
        v = np.maximum(g.to_numpy(dtype=float), 1.0)
        out[str(name)] = (max(float(v.mean()), 2.0), max(float(np.quantile(v, quantile)), 2.0))
    return out


def replay_trace(trace: pd.DataFrame, setup: ReplaySetup, *, scale: float = 1.0, load: float | None = None,
                 slo_tpot_s: float = 0.1, duration_s: float | None = None, seed: int = 0,
                 capacity_rps: float | None = None) -> tuple[pd.DataFrame, float]:
    """The trace as replayed: sped up by ``scale``, or to ``load`` x the capacity at the SLO
    (``capacity_rps``; default the model's for the setup's pools, :meth:`ReplaySetup.slo_capacity`);
    a trace of closed sessions (per-session clocks) has its sessions placed on one clock at that
    request rate over ``duration_s`` (:func:`tokenfactory.traces.place_sessions`).

    Parameters
    ----------
    trace : DataFrame
        The request table.
    setup : ReplaySetup
        From :func:`build_replay`.
    scale : float
        Speed-up when ``load`` is None (default 1).
    load : float, optional
        Multiple of the capacity at the SLO (> 0).
    slo_tpot_s : float
        TPOT SLO of the default capacity (default 0.1).
    duration_s : float, optional
        Window for closed sessions (default 3600 s).
    seed : int
        Seed of the session placement.
    capacity_rps : float, optional
        The capacity ``load`` multiplies (:meth:`ReplaySetup.capacity` of the simulated cluster).

    Returns
    -------
    tuple
        ``(replayed table, speed-up applied)`` (the speed-up is NaN for placed sessions).
    """
    if load is not None:
        check_number("load", load, low=0.0, low_inclusive=False)
    closed = bool(trace.attrs.get("per_session_clock"))
    if closed and load is None:
        raise ConfigError("load", "a trace of closed sessions is replayed at a load (x capacity), not a speed-up")
    if load is not None:
        cap = capacity_rps if capacity_rps is not None else setup.slo_capacity(slo_tpot_s)[0]
        if closed:
            return _replay_at_rate(trace, load * cap, duration_s, seed)
        rate = len(trace) / max(float(trace["arrival_s"].max()), 1e-9)
        scale = load * cap / rate
    return (scale_trace(trace, scale) if scale != 1 else trace), scale


def result_verdict(res, fill_token_budget: float):
    """The request simulator's verdict (:func:`~tokenfactory.controllers.oscillation.judge_actuators`)
    on a run: every pool, the batch cap, the reservation, the admission rate, the ready buffer (1
    request) and the fill queue (one fill step's token budget), after the first 10 % of the run
    (the start-up transient); a window of fewer than 16 snapshots judges no cycle, only churn.

    Parameters
    ----------
    res : SimulationResult
        A request-simulator run.
    fill_token_budget : float
        Tokens one fill step takes (the fill queue's minimum amplitude).

    Returns
    -------
    ActuatorVerdict
        The verdict.
    """
    s = res.series
    end = float(s["time_s"].iloc[-1]) if len(s) else 0.0
    return judge_actuators(s, res.actions, start_s=0.1 * end,
                           buffer_amplitudes={"ready": 1.0, "fill_queued_tokens": fill_token_budget})


def run_replay(trace: pd.DataFrame, setup: ReplaySetup, admission: str, scale: float = 1.0,
               cluster: dict | None = None, autoscaler: str | None = None, *, load: float | None = None,
               admission_params: dict | None = None, batch_cap: str | float | None = None,
               envelope=None, duration_s: float | None = None,
               admission_where: str = "admission", autoscalers=None, capacity: str = "model",
               capacity_cache=None, autoscaler_params: dict | None = None) -> tuple[dict, Any]:
    """One replay through the request simulator.

    The controllers are built for the replayed stream: its mean rate (requests over the last
    arrival time, after ``scale``) and its arrival times go into the :class:`PlantContext`, with
    the service model, the cluster's request classes and the classes' output tokens
    (:func:`class_outputs`). The oscillation verdict is :func:`result_verdict`: every actuator
    (pool sizes, batch cap, reservation, admission rate) and buffer, and the pools' churn.

    Parameters
    ----------
    trace : DataFrame
        The request table.
    setup : ReplaySetup
        From :func:`build_replay`.
    admission : str
        A registered admission kind (:func:`tokenfactory.registry.admission_kinds`; ``open``
        for none).
    scale : float
        Replay speed-up (> 0; default 1): arrival times are divided by ``scale``, so the
        offered load is ``scale`` times the trace's. Ignored when ``load`` is given.
    cluster : dict, optional
        :class:`ClusterConfig` fields (pool sizes and measurement delay default to the
        setup's).
    autoscaler : str, optional
        A registered autoscaler kind sizing both pools (default: none, fixed pools).
    load : float, optional
        Offered load as a multiple of the bottleneck capacity at the TPOT SLO
        (:func:`replay_trace`); closed-session traces need it.
    admission_params : dict, optional
        Parameters of the admission kind (its registered keys).
    batch_cap : "static", float or None
        The decode batch cap the run starts with: ``"static"`` the operator's cap at the TPOT SLO
        (:func:`tokenfactory.registry.static_batch_cap`), a number of sequences, or None (the
        cluster's ``batch_cap``; KV memory only by default). A batch gate changes it during the run.
    envelope : StabilityEnvelope, optional
        The envelope the admission is tuned over (default the registry's).
    duration_s : float, optional
        Window for closed sessions (default 3600 s; the run lasts this plus ``drain_s``); an open
        trace replays only its arrivals before it (on the replayed clock, after ``scale`` or
        ``load``; default all of them).
    admission_where : str
        Field path of the admission parameters in error messages (default ``"admission"``).
    capacity : str
        What ``load`` multiplies: ``"model"`` (default; the model's capacity at the SLO of the
        simulated cluster) or ``"measured"`` (found by bisection under open admission,
        :meth:`ReplaySetup.capacity`; cached on ``setup`` and in ``capacity_cache``).
    capacity_cache : str or Path, optional
        Folder of the measured capacity's disk cache.
    autoscalers : sequence, optional
        Pool autoscaler objects to run instead of a registered ``autoscaler`` kind (e.g. a
        control plane built from its own settings file, :mod:`tokenfactory.controllers.formats`).
    autoscaler_params : dict, optional
        Parameters of the autoscaler kind (its registered keys; e.g. ``planner_config`` of
        ``dynamo-planner``).

    Returns
    -------
    tuple
        ``(metrics, SimulationResult)``. ``metrics`` is the simulator's metrics plus ``admission``,
        ``autoscaler``, ``scale``, ``load``, ``capacity`` (:meth:`ClusterCapacity.to_dict` of the
        simulated cluster), ``batch_cap``, ``ready_oscillation`` and
        ``fill_oscillation`` (the buffers' :class:`~tokenfactory.controllers.oscillation.OscillationReport`
        as dicts, or None), ``oscillation`` (the whole :class:`~tokenfactory.controllers.oscillation.ActuatorVerdict`),
        ``oscillating`` (its verdict: any signal cycling, or churn), ``churning`` and
        ``parameter_set`` (the service model's parameter set the workers ran with:
        :func:`~tokenfactory.replay_scenario.parameter_set_used`).
    """
    check_choice("capacity", capacity, ("model", "measured"))
    cl = setup.cluster_config(cluster)
    if batch_cap == "static":  # the cap is part of the cluster the capacity is measured on
        cl = dataclasses.replace(cl, batch_cap=setup.capacity(cl).batch_cap)
    elif batch_cap is not None:
        cl = dataclasses.replace(cl, batch_cap=float(check_number("batch_cap", batch_cap, low=1.0)))
    cap = setup.capacity(cl, measure=capacity == "measured" and load is not None, duration_s=duration_s,
                         cache_dir=capacity_cache)
    replay, scale = replay_trace(trace, setup, scale=scale, load=load, slo_tpot_s=cl.slo_tpot_s,
                                 duration_s=duration_s, seed=cl.seed, capacity_rps=cap.rps)
    if duration_s is not None and not replay.attrs.get("per_session_clock"):   # an open trace: its first duration_s
        check_number("duration_s", duration_s, low=0.0, low_inclusive=False)
        kept = replay.loc[replay["arrival_s"] < duration_s].copy()
        kept.attrs = dict(replay.attrs)
        replay = kept
    cl = _run_cluster(replay, cl, duration_s)
    ctx = _controller_context(setup, replay, cl, envelope)
    if autoscalers is not None and autoscaler:
        raise ConfigError("autoscaler", "give a registered kind or autoscaler objects, not both")
    if autoscaler_params and not autoscaler:
        raise ConfigError("autoscaler", "autoscaler parameters were given without an autoscaler kind")
    scalers = list(autoscalers) if autoscalers is not None else (
        build_autoscalers(autoscaler, ctx, autoscaler_params) if autoscaler else [])
    res = RequestPlant(setup.params, cl).run(
        replay, scalers, admission=build_admission(admission, ctx, admission_params, where=admission_where))
    verdict = result_verdict(res, float(setup.params.fill_token_budget))
    sig = verdict.signals
    m = {**res.metrics, "admission": admission, "autoscaler": autoscaler, "scale": scale, "load": load,
         "capacity": cap.to_dict(), "batch_cap": cl.batch_cap, "ready_oscillation": sig.get("ready"),
         "fill_oscillation": sig.get("fill_queue"), "oscillating": verdict.oscillating, "churning": verdict.churning,
         "oscillation": verdict.to_dict(),
         "parameter_set": parameter_set_used(setup.plant_config, setup.service.fill_worker.efficiency)}
    return m, res


def _controller_context(setup: ReplaySetup, replay: pd.DataFrame, cl: ClusterConfig, envelope) -> PlantContext:
    """What a replay's controllers are built and tuned for: the simulated cluster's pools, SLOs and
    classes, the replayed stream's mean rate and arrival times, the classes' output tokens."""
    rate = len(replay) / max(float(replay["arrival_s"].max()), 1e-9)
    kw = {} if envelope is None else {"envelope": envelope}
    return setup.context(cl.slo_ttft_s, cl.slo_tpot_s, rate_rps=rate, dynamics=cl.dynamics,
                         arrival_times_s=replay["arrival_s"].to_numpy(), classes=cl.classes,
                         class_outputs=class_outputs(replay), snapshot_dt=cl.snapshot_dt,
                         fill_workers=max(int(cl.fill_workers), 1), decode_workers=max(int(cl.decode_workers), 1), **kw)
