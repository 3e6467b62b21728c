"""Replaying a request table through the request simulator with named controllers.

:func:`build_replay` derives the request simulator's and the fluid plant's parameters from the
roofline at the trace's own request shape (so a "load" is a multiple of the cluster's bottleneck
capacity whatever the trace); :func:`run_replay` runs one replay with an admission kind and an
optional autoscaler kind from :mod:`tokenfactory.registry` and adds the ready buffer's oscillation
verdict to the metrics. Used by ``tokenfactory simulate`` and the studies.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pandas as pd

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
from tokenfactory.registry import PlantContext, build_admission, build_autoscalers
from tokenfactory.traces.transforms import scale_trace
from tokenfactory.validation import reject_unknown_keys

__all__ = ["DEFAULT_PLANT", "ReplaySetup", "request_shape_of", "build_replay", "run_replay"]

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
        pool's prefill throughput and the decode pool's completion rate with every slot busy.
        A replay "load" of x means x times this.
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
        return PlantContext(self.plant.params, int(self.plant.fill_workers), int(self.plant.decode_workers),
                            slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s, **kw)


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


def run_replay(trace: pd.DataFrame, setup: ReplaySetup, admission: str, scale: float = 1.0,
               cluster: dict | None = None, autoscaler: str | None = None) -> tuple[dict, Any]:
    """One replay through the request simulator.

    The controllers are built for the replayed stream: its mean rate (requests over the last
    arrival time, after ``scale``) and its arrival times go into the :class:`PlantContext`.
    The oscillation verdict is :func:`~tokenfactory.controllers.oscillation.assess` on the
    ready buffer's snapshots after the first 10 % of the run (the start-up transient), with a
    1-request minimum amplitude; with fewer than 16 snapshots there is no verdict.

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
        offered load is ``scale`` times the trace's.
    cluster : dict, optional
        :class:`ClusterConfig` fields (pool sizes and measurement delay default to the
        setup's).
    autoscaler : str, optional
        A registered autoscaler kind sizing both pools (default: none, fixed pools).

    Returns
    -------
    tuple
        ``(metrics, SimulationResult)``. ``metrics`` is the simulator's metrics plus ``admission``,
        ``autoscaler``, ``scale``, ``ready_oscillation`` (the
        :class:`~tokenfactory.controllers.oscillation.OscillationReport` as a dict, or None)
        and ``oscillating`` (bool; False without a verdict).
    """
    cl = ClusterConfig.from_dict({"fill_workers": int(setup.plant.fill_workers),
                                  "decode_workers": int(setup.plant.decode_workers),
                                  "measurement_delay_s": setup.plant.params.measurement_delay_s, **(cluster or {})})
    replay = scale_trace(trace, scale) if scale != 1 else trace
    rate = len(replay) / max(float(replay["arrival_s"].max()), 1e-9)
    ctx = setup.context(cl.slo_ttft_s, cl.slo_tpot_s, rate_rps=rate, dynamics=cl.dynamics,
                        arrival_times_s=replay["arrival_s"].to_numpy())
    scalers = build_autoscalers(autoscaler, ctx) if autoscaler else []
    res = simulate(replay, setup.params, cl, build_admission(admission, ctx), scalers)
    s = res.series
    after = s[s["time_s"] > 0.1 * s["time_s"].iloc[-1]]
    rep = assess(after["ready"].to_numpy(), cl.snapshot_dt, min_amplitude=1.0) if len(after) >= 16 else None
    m = {**res.metrics, "admission": admission, "autoscaler": autoscaler, "scale": scale,
         "ready_oscillation": rep.to_dict() if rep else None, "oscillating": bool(rep.oscillating) if rep else False}
    return m, res
