"""Replaying a request table through the request simulator with named controllers.

:func:`build_replay` derives the request simulator's and the fluid plant's parameters from the
roofline at the trace's own request shape (so a "load" is a multiple of the cluster's bottleneck
capacity whatever the trace); :func:`run_replay` runs one replay with an admission kind and an
optional autoscaler kind from :mod:`tokenfactory.registry` and adds the ready buffer's oscillation
verdict to the metrics. Used by ``tokenfactory simulate`` and the studies.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import numpy as np
import pandas as pd

from tokenfactory.core.classes import DEFAULT_CLASSES, class_table
from tokenfactory.controllers.oscillation import assess
from tokenfactory.plant_models.des import ClusterConfig, DESParams, simulate
from tokenfactory.plant_models.fluid import FluidParams, FluidPlant
from tokenfactory.plant_models.roofline import Worker
from tokenfactory.plant_models.service import (
    DEFAULT_KV_SETUP_S,
    DEFAULT_KV_STRIPES,
    KVLink,
    RequestShape,
    ServiceModel,
)
from tokenfactory.registry import DEFAULT_TPOT_FRACTION, PlantContext, build_admission, build_autoscalers, static_batch_cap
from tokenfactory.traces.transforms import place_sessions, scale_trace
from tokenfactory.core.validation import ConfigError, check_number, load_toml, reject_unknown_keys

__all__ = ["scenario_cluster", "DEFAULT_PLANT", "ReplaySetup", "request_shape_of", "build_replay", "run_replay", "class_outputs",
           "request_costs", "service_capacity", "infeasible",
           "replay_trace", "ReplayScenario", "replay_scenario_from_dict", "load_replay_scenario"]

#: the preset disaggregated cluster: DeepSeek-V3 on 8xH200 workers, 2 fill + 1 decode
DEFAULT_PLANT = {"model": "deepseek-v3", "hardware": "h200", "fill_workers": 2, "decode_workers": 1,
                 "measurement_delay_s": 0.5, "kv_stripes": DEFAULT_KV_STRIPES, "kv_setup_s": DEFAULT_KV_SETUP_S}
_PLANT_EXTRA_KEYS = {"parallelism", "efficiency", "decode_model", "decode_hardware"}


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
    """

    trace: pd.DataFrame
    params: DESParams
    plant: FluidPlant
    shape: RequestShape
    service: ServiceModel
    capacity_rps: float
    bottleneck: str

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
        return PlantContext(self.plant.params, int(self.plant.fill_workers), int(self.plant.decode_workers),
                            slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s, **kw)

    def slo_capacity(self, slo_tpot_s: float = 0.1, tpot_fraction: float = DEFAULT_TPOT_FRACTION
                     ) -> tuple[float, str, float]:
        """The bottleneck capacity at the TPOT SLO: as :attr:`capacity_rps`, but the decode pool
        runs the largest batch whose roofline pass time at the nominal context is within
        ``tpot_fraction`` of the SLO, and short enough for the trace's short requests
        (:func:`tokenfactory.registry.static_batch_cap` with :func:`class_outputs`) instead of
        every KV slot - with the fitted roofline a DeepSeek-V3 decode worker on 8xH200 at its full
        KV batch runs slower than a 0.1 s TPOT, so only this rate can be served within the SLO.
        The overload study's and ``simulate --load``'s loads are multiples of it.

        Parameters
        ----------
        slo_tpot_s : float
            The TPOT SLO (s; default 0.1).
        tpot_fraction : float
            Share of it a pass may take (default :data:`tokenfactory.registry.DEFAULT_TPOT_FRACTION`).

        Returns
        -------
        tuple
            ``(capacity_rps, bottleneck, batch_cap)``: requests/s, ``"fill"`` or ``"decode"``, and
            the cap (sequences per decode worker).
        """
        cap = static_batch_cap(self.context(slo_tpot_s=slo_tpot_s, class_outputs=class_outputs(self.trace)),
                               tpot_fraction)
        caps = service_capacity(self.costs, self.params, int(self.plant.fill_workers), int(self.plant.decode_workers),
                                cap)
        neck = min(caps, key=caps.get)
        return caps[neck], neck, cap

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


def request_costs(trace: pd.DataFrame, params: DESParams) -> pd.DataFrame:
    """Each request's own service cost, as the request simulator computes it (its prefix as the
    trace's ``cached_tokens`` say).

    Parameters
    ----------
    trace : DataFrame
        A request table (``cached_tokens`` and ``request_class`` optional).
    params : DESParams
        The request simulator's parameters.

    Returns
    -------
    DataFrame
        One row per request: ``new_tokens``, ``cached_tokens``, ``output_tokens``,
        ``request_class``; ``fill_s`` - fill-worker seconds it takes from full steps
        (:meth:`DESParams.fill_seconds`, the throughput share); ``solo_fill_s`` - its chunked fill
        alone on a worker (:meth:`DESParams.request_fill_s`, its TTFT on an empty cluster);
        ``kv_transfer_s``; ``decode_passes`` - output tokens after the first (the first comes
        from fill); ``decode_context`` - its mean context while decoding (input + half its
        output); ``solo_tpot_s`` - its TPOT alone on a decode worker: (transfer + passes at batch
        1 and its context) / passes.
    """
    inp = np.maximum(trace["input_tokens"].to_numpy(dtype=float), 1.0)
    cached = np.minimum(trace["cached_tokens"].to_numpy(dtype=float), inp) if "cached_tokens" in trace \
        else np.zeros(len(inp))
    new = np.maximum(inp - cached, 1.0)
    out = np.maximum(trace["output_tokens"].to_numpy(dtype=float), 1.0)
    passes = out - 1.0
    ctx = inp + out / 2.0
    xfer = params.kv_bytes(inp) / params.kv_link_bandwidth + params.kv_setup_s
    solo_fill = np.fromiter((params.request_fill_s(n, c) for n, c in zip(new, cached)), float, len(new))
    pass1 = np.fromiter((params.decode_pass(1, c)[0] for c in ctx), float, len(ctx))
    cls = trace["request_class"].astype(str).to_numpy() if "request_class" in trace else np.full(len(inp), "")
    return pd.DataFrame({"new_tokens": new, "cached_tokens": cached, "output_tokens": out, "request_class": cls,
                         "fill_s": params.fill_seconds(new, cached), "solo_fill_s": solo_fill, "kv_transfer_s": xfer,
                         "decode_passes": passes, "decode_context": ctx,
                         "solo_tpot_s": (xfer + passes * pass1) / np.maximum(passes, 1.0)}, index=trace.index)


def service_capacity(costs: pd.DataFrame, params: DESParams, fill_workers: int, decode_workers: int,
                     batch_cap: float) -> dict[str, float]:
    """Requests/s each pool serves of a stream of these requests, from their mean own cost (not
    the cost of the mean request: a long prompt's attention grows with its length, so the mean of
    the costs is what a pool spends): fill, workers over the mean fill-worker seconds per request;
    decode, ``batch_cap`` slots per worker over the mean slot time per request, its decode passes
    at the pass time of a full batch at the token-weighted mean context (the context a decoding
    sequence holds, averaged over the passes).

    Parameters
    ----------
    costs : DataFrame
        :func:`request_costs`.
    params : DESParams
        The request simulator's parameters (the decode pass table).
    fill_workers, decode_workers : int
        Pool sizes.
    batch_cap : float
        Sequences per decode worker.

    Returns
    -------
    dict
        ``{"fill": requests/s, "decode": requests/s}``.
    """
    passes = costs["decode_passes"].to_numpy()
    weight = max(float(passes.sum()), 1e-9)
    ctx = float((passes * costs["decode_context"].to_numpy()).sum() / weight) if passes.sum() > 0 \
        else float(costs["decode_context"].mean())
    pass_s = params.decode_pass(int(batch_cap), ctx)[0]
    slot_s = max(float(passes.mean()), 1e-9) * pass_s
    return {"fill": fill_workers / float(costs["fill_s"].mean()), "decode": decode_workers * batch_cap / slot_s}


def infeasible(costs: pd.DataFrame, classes=None) -> pd.DataFrame:
    """Which requests miss their class's SLO whatever the policy: their own fill alone on an
    empty cluster is past the TTFT SLO, or their own decode alone (transfer and batch-1 passes)
    past the TPOT SLO.

    Parameters
    ----------
    costs : DataFrame
        :func:`request_costs`.
    classes : iterable of RequestClass, optional
        The SLOs (default :data:`tokenfactory.core.classes.DEFAULT_CLASSES`; a request of a class not
        among them gets the first class's).

    Returns
    -------
    DataFrame
        Boolean columns ``ttft``, ``tpot`` and ``any``, one row per request.
    """
    table = class_table(DEFAULT_CLASSES if classes is None else classes)
    first = next(iter(table.values()))
    cls = costs["request_class"].map(lambda c: table.get(c, first))
    ttft = costs["solo_fill_s"].to_numpy() > cls.map(lambda c: c.slo_ttft_s).to_numpy(dtype=float)
    tpot = costs["solo_tpot_s"].to_numpy() > cls.map(lambda c: c.slo_tpot_s).to_numpy(dtype=float)
    return pd.DataFrame({"ttft": ttft, "tpot": tpot, "any": ttft | tpot}, index=costs.index)


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
    reject_unknown_keys("plant", cfg, set(DEFAULT_PLANT) | _PLANT_EXTRA_KEYS)
    common = {k: cfg[k] for k in ("parallelism", "efficiency") if k in cfg}
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
    return ReplaySetup(trace, params, plant_model, shape, service, caps[neck], neck)


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
                 slo_tpot_s: float = 0.1, duration_s: float | None = None, seed: int = 0) -> tuple[pd.DataFrame, float]:
    """The trace as replayed: sped up by ``scale``, or to ``load`` x the bottleneck capacity at
    the TPOT SLO (:meth:`ReplaySetup.slo_capacity`); a trace of closed sessions (per-session
    clocks) has its sessions placed on one clock at that request rate over ``duration_s``
    (:func:`tokenfactory.traces.place_sessions`).

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
        TPOT SLO of the capacity (default 0.1).
    duration_s : float, optional
        Window for closed sessions (default 3600 s).
    seed : int
        Seed of the session placement.

    Returns
    -------
    tuple
        ``(replayed table, speed-up applied)`` (the speed-up is NaN for placed sessions).
    """
    if load is not None:
        check_number("load", load, low=0.0, low_inclusive=False)
    closed = bool(trace.attrs.get("per_session_clock"))
    if closed:
        if load is None:
            raise ConfigError("load", "a trace of closed sessions is replayed at a load (x capacity), not a speed-up")
        rate = load * setup.slo_capacity(slo_tpot_s)[0]
        return place_sessions(trace, rate, duration_s or 3600.0, seed=seed), math.nan
    if load is not None:
        rate = len(trace) / max(float(trace["arrival_s"].max()), 1e-9)
        scale = load * setup.slo_capacity(slo_tpot_s)[0] / rate
    return (scale_trace(trace, scale) if scale != 1 else trace), scale


def run_replay(trace: pd.DataFrame, setup: ReplaySetup, admission: str, scale: float = 1.0,
               cluster: dict | None = None, autoscaler: str | None = None, *, load: float | None = None,
               admission_params: dict | None = None, batch_cap: str | float | None = None,
               envelope=None, duration_s: float | None = None,
               admission_where: str = "admission", autoscalers=None) -> tuple[dict, Any]:
    """One replay through the request simulator.

    The controllers are built for the replayed stream: its mean rate (requests over the last
    arrival time, after ``scale``) and its arrival times go into the :class:`PlantContext`, with
    the service model, the cluster's request classes and the classes' output tokens
    (:func:`class_outputs`). Oscillation verdicts are
    :func:`~tokenfactory.controllers.oscillation.assess` on the ready buffer's and the fill
    queue's (queued prompt tokens) snapshots after the first 10 % of the run (the start-up
    transient), with minimum amplitudes of 1 request and one fill step's token budget; with
    fewer than 16 snapshots there is no verdict.

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
        Window for closed sessions (default 3600 s; the run lasts this plus ``drain_s``).
    admission_where : str
        Field path of the admission parameters in error messages (default ``"admission"``).
    autoscalers : sequence, optional
        Pool autoscaler objects to run instead of a registered ``autoscaler`` kind (e.g. a
        control plane built from its own settings file, :mod:`tokenfactory.controllers.formats`).

    Returns
    -------
    tuple
        ``(metrics, SimulationResult)``. ``metrics`` is the simulator's metrics plus ``admission``,
        ``autoscaler``, ``scale``, ``load``, ``batch_cap``, ``ready_oscillation`` and
        ``fill_oscillation`` (:class:`~tokenfactory.controllers.oscillation.OscillationReport` as
        dicts, or None) and ``oscillating`` (either verdict; False without one).
    """
    base = {"fill_workers": int(setup.plant.fill_workers), "decode_workers": int(setup.plant.decode_workers),
            "measurement_delay_s": setup.plant.params.measurement_delay_s, **(cluster or {})}
    cl = ClusterConfig.from_dict(base)
    replay, scale = replay_trace(trace, setup, scale=scale, load=load, slo_tpot_s=cl.slo_tpot_s,
                                 duration_s=duration_s, seed=cl.seed)
    if replay.attrs.get("per_session_clock"):
        cl = dataclasses.replace(cl, duration_s=cl.duration_s or (duration_s or 3600.0) + cl.drain_s)
    rate = len(replay) / max(float(replay["arrival_s"].max()), 1e-9)
    kw = {} if envelope is None else {"envelope": envelope}
    ctx = setup.context(cl.slo_ttft_s, cl.slo_tpot_s, rate_rps=rate, dynamics=cl.dynamics,
                        arrival_times_s=replay["arrival_s"].to_numpy(), classes=cl.classes,
                        class_outputs=class_outputs(replay), snapshot_dt=cl.snapshot_dt, **kw)
    if batch_cap == "static":
        cl = dataclasses.replace(cl, batch_cap=static_batch_cap(ctx))
    elif batch_cap is not None:
        cl = dataclasses.replace(cl, batch_cap=float(check_number("batch_cap", batch_cap, low=1.0)))
    if autoscalers is not None and autoscaler:
        raise ConfigError("autoscaler", "give a registered kind or autoscaler objects, not both")
    scalers = list(autoscalers) if autoscalers is not None else (build_autoscalers(autoscaler, ctx) if autoscaler
                                                                  else [])
    res = simulate(replay, setup.params, cl, build_admission(admission, ctx, admission_params, where=admission_where),
                   scalers)
    s = res.series
    after = s[s["time_s"] > 0.1 * s["time_s"].iloc[-1]]
    enough = len(after) >= 16
    rep = assess(after["ready"].to_numpy(), cl.snapshot_dt, min_amplitude=1.0) if enough else None
    frep = assess(after["fill_queued_tokens"].to_numpy(), cl.snapshot_dt,
                  min_amplitude=float(setup.params.fill_token_budget)) if enough else None
    m = {**res.metrics, "admission": admission, "autoscaler": autoscaler, "scale": scale, "load": load,
         "batch_cap": cl.batch_cap, "ready_oscillation": rep.to_dict() if rep else None,
         "fill_oscillation": frep.to_dict() if frep else None,
         "oscillating": bool((rep and rep.oscillating) or (frep and frep.oscillating))}
    return m, res


def scenario_cluster(scenario: "ReplayScenario | None", seed: int = 0) -> dict:
    """The cluster fields a replay of ``scenario`` runs with: its ``[cluster]`` table, the seed,
    and - unless it lists classes - the interactive class at the cluster's SLO with the default
    batch class (what ``tokenfactory simulate`` runs).

    Parameters
    ----------
    scenario : ReplayScenario or None
        The resolved scenario (:func:`load_replay_scenario`); None: an empty ``[cluster]`` table.
    seed : int
        Seed of the replay, used when the ``[cluster]`` table sets none (default 0).

    Returns
    -------
    dict
        A copy of the cluster fields with ``seed`` and ``classes`` filled in.
    """
    from tokenfactory.core.classes import DEFAULT_CLASSES, INTERACTIVE, RequestClass

    cluster = dict(scenario.cluster) if scenario else {}
    cluster.setdefault("seed", seed)
    if "classes" not in cluster:
        ttft, tpot = cluster.get("slo_ttft_s", 2.0), cluster.get("slo_tpot_s", 0.1)
        cluster["classes"] = (RequestClass(INTERACTIVE, ttft, tpot, 0),
                              *(c for c in DEFAULT_CLASSES if c.name != INTERACTIVE))
    return cluster


_SIMULATION_KEYS = ("load", "scale", "duration_s", "batch_cap")
#: plant keys of a margins scenario that a replay cannot honour, and why
_PLANT_NOT_IN_REPLAY = {
    "prompt_tokens": "the trace sets the request shape in a replay",
    "output_tokens": "the trace sets the request shape in a replay",
    "cached_tokens": "the trace sets the request shape in a replay",
    "decode_parallelism": "a replay's fill and decode workers share one parallelism (set plant.parallelism)",
}
_SIMULATION_NOT_IN_REPLAY = {
    "demand_factor": "a replay's demand is the trace's (use simulation.load or simulation.scale)",
    "dt": "the request simulator is event-driven (cluster.snapshot_dt sets the sample period)",
    "demand_noise_cv": "a replay's demand is the trace's",
    "noise_interval_s": "a replay's demand is the trace's",
    "disturbances": "the request simulator's events are cluster.events",
    "seed": "set cluster.seed",
}


@dataclasses.dataclass
class ReplayScenario:
    """A scenario file resolved for a replay (``tokenfactory simulate --scenario``): every field
    reaches the simulation, or the file is rejected naming the field.

    Parameters
    ----------
    name : str
        The scenario's name.
    plant : dict
        Overrides of :data:`DEFAULT_PLANT` for :func:`build_replay`.
    cluster : dict
        :class:`ClusterConfig` fields (``classes`` from the ``[classes]`` section included).
    admission : str or None
        The admission kind (``[controller] kind``).
    admission_params : dict
        Its parameters.
    envelope : StabilityEnvelope or None
        The envelope the admission is tuned over.
    simulation : dict
        ``load``, ``scale``, ``duration_s``, ``batch_cap`` (each optional).
    """

    name: str
    plant: dict
    cluster: dict
    admission: str | None
    admission_params: dict
    envelope: Any
    simulation: dict


def replay_scenario_from_dict(d: dict, name: str = "scenario") -> ReplayScenario:
    """Validate a scenario table for a replay, field by field.

    Sections: ``plant`` (:data:`DEFAULT_PLANT` keys, ``parallelism``, ``efficiency``,
    ``decode_model``, ``decode_hardware``), ``cluster`` (:class:`ClusterConfig` fields),
    ``classes`` (request classes, :func:`tokenfactory.core.classes.classes_from_dict`), ``controller``
    (``kind`` and that kind's parameters), ``envelope`` (:class:`StabilityEnvelope` fields) and
    ``simulation`` (``load``, ``scale``, ``duration_s``, ``batch_cap``); ``name`` and
    ``description``.

    Parameters
    ----------
    d : dict
        The parsed TOML.
    name : str
        Name when the file has none.

    Returns
    -------
    ReplayScenario

    Raises
    ------
    ConfigError
        Naming the first field that is unknown, out of range, or meaningless in a replay (a
        margins scenario's ``plant.prompt_tokens``, ``simulation.demand_factor``, ...).
    """
    from tokenfactory.core.classes import classes_from_dict
    from tokenfactory.controllers.autotune import StabilityEnvelope
    from tokenfactory.registry import ADMISSION_KINDS

    d = dict(d)
    reject_unknown_keys("", d, {"name", "description", "plant", "cluster", "classes", "controller", "envelope",
                                "simulation"})
    plant = dict(d.get("plant", {}))
    for k in plant:
        if k in _PLANT_NOT_IN_REPLAY:
            raise ConfigError(f"plant.{k}", _PLANT_NOT_IN_REPLAY[k])
    reject_unknown_keys("plant", plant, set(DEFAULT_PLANT) | _PLANT_EXTRA_KEYS)
    cluster = dict(d.get("cluster", {}))
    if "classes" in d:
        if "classes" in cluster:
            raise ConfigError("classes", "give the classes once: [classes] or cluster.classes")
        cluster["classes"] = classes_from_dict(d["classes"], "classes")
    ClusterConfig.from_dict(cluster)  # every field checked now, named
    ctrl = dict(d.get("controller", {}))
    kind = ctrl.pop("kind", None)
    if kind is not None:
        if kind not in ADMISSION_KINDS:
            raise ConfigError("controller.kind", f"{kind!r} is not one of {', '.join(ADMISSION_KINDS)}")
        reject_unknown_keys("controller", ctrl, ADMISSION_KINDS[kind].keys)
    elif ctrl:
        raise ConfigError(f"controller.{next(iter(ctrl))}", "controller parameters need a controller.kind")
    envelope = None
    if "envelope" in d:
        env = dict(d["envelope"])
        reject_unknown_keys("envelope", env, {"delay_factors", "service_rate_factors", "gm_floor", "pm_floor_deg"})
        for k in ("delay_factors", "service_rate_factors"):
            if k in env:
                env[k] = tuple(env[k])
        envelope = StabilityEnvelope(**env)
    sim = dict(d.get("simulation", {}))
    for k in sim:
        if k in _SIMULATION_NOT_IN_REPLAY:
            raise ConfigError(f"simulation.{k}", _SIMULATION_NOT_IN_REPLAY[k])
    reject_unknown_keys("simulation", sim, _SIMULATION_KEYS)
    if "load" in sim and "scale" in sim:
        raise ConfigError("simulation.load", "give simulation.load or simulation.scale, not both")
    for k in ("load", "scale", "duration_s"):
        if k in sim:
            check_number(f"simulation.{k}", sim[k], low=0.0, low_inclusive=False)
    if "batch_cap" in sim and sim["batch_cap"] != "static":
        check_number("simulation.batch_cap", sim["batch_cap"], low=1.0)
    return ReplayScenario(str(d.get("name", name)), plant, cluster, kind, ctrl, envelope, sim)


def load_replay_scenario(path) -> ReplayScenario:
    """:func:`replay_scenario_from_dict` of a TOML file.

    Parameters
    ----------
    path : str or Path
        The file.

    Returns
    -------
    ReplayScenario

    Raises
    ------
    ConfigError
        For a missing or unreadable file, bad TOML, or a bad field.
    """
    from pathlib import Path

    return replay_scenario_from_dict(load_toml(path), name=Path(path).stem)
