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
from tokenfactory.plant_models.fluid import FluidParams, FluidPlant, RequestShape
from tokenfactory.plant_models.roofline import Worker
from tokenfactory.registry import PlantContext, build_admission, build_autoscalers
from tokenfactory.traces.transforms import scale_trace
from tokenfactory.validation import reject_unknown_keys

__all__ = ["DEFAULT_PLANT", "ReplaySetup", "request_shape_of", "build_replay", "run_replay"]

#: the preset disaggregated cluster: DeepSeek-V3 on 8xH200 workers, 2 fill + 1 decode
DEFAULT_PLANT = {"model": "deepseek-v3", "hardware": "h200", "fill_workers": 2, "decode_workers": 1,
                 "measurement_delay_s": 0.5, "kv_stripes": 8, "kv_setup_s": 0.005}
_PLANT_EXTRA_KEYS = {"parallelism", "efficiency", "decode_model", "decode_hardware"}


@dataclasses.dataclass
class ReplaySetup:
    """Everything a replay needs, derived once from a trace and a plant description.

    Parameters
    ----------
    trace : DataFrame
        The request table.
    params : DESParams
        Request-simulator parameters (roofline tables).
    plant : FluidPlant
        The fluid plant at the trace's mean request shape (what admission is tuned on).
    shape : RequestShape
        The trace's mean request.
    capacity_rps : float
        The cluster's bottleneck capacity at that shape (requests/s).
    bottleneck : str
        ``"fill"`` or ``"decode"``.
    """

    trace: pd.DataFrame
    params: DESParams
    plant: FluidPlant
    shape: RequestShape
    capacity_rps: float
    bottleneck: str

    def context(self, slo_ttft_s: float = 2.0, slo_tpot_s: float = 0.1, **kw: Any) -> PlantContext:
        """The :class:`PlantContext` controllers of this replay are built for."""
        return PlantContext(self.plant.params, int(self.plant.fill_workers), int(self.plant.decode_workers),
                            slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s, **kw)


def request_shape_of(trace: pd.DataFrame) -> RequestShape:
    """The mean request of a request table: new (uncached) prompt tokens, output tokens, cached
    tokens and the output length's coefficient of variation."""
    new = (trace["input_tokens"] - trace["cached_tokens"]).clip(lower=1)
    out = trace["output_tokens"].clip(lower=1)
    cv = float(out.std() / out.mean()) if len(out) > 1 else 0.0
    return RequestShape(max(1, int(round(new.mean()))), max(1, int(round(out.mean()))),
                        cached_tokens=int(round(trace["cached_tokens"].mean())), output_cv=min(cv, 10.0))


def build_replay(trace: pd.DataFrame, plant: dict | None = None) -> ReplaySetup:
    """Roofline parameters for the request simulator and the fluid plant at the trace's shape.

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
    """
    cfg = {**DEFAULT_PLANT, **(plant or {})}
    reject_unknown_keys("plant", cfg, set(DEFAULT_PLANT) | _PLANT_EXTRA_KEYS)
    common = {k: cfg[k] for k in ("parallelism", "efficiency") if k in cfg}
    fill = Worker.from_dict({"model": cfg["model"], "hardware": cfg["hardware"], **common})
    dec = Worker.from_dict({"model": cfg.get("decode_model", cfg["model"]),
                            "hardware": cfg.get("decode_hardware", cfg["hardware"]), **common})
    shape = request_shape_of(trace)
    fp = FluidParams.from_workers(fill, dec, shape, measurement_delay_s=cfg["measurement_delay_s"],
                                  kv_stripes=cfg["kv_stripes"], kv_setup_s=cfg["kv_setup_s"])
    plant_model = FluidPlant(fp, cfg["fill_workers"], cfg["decode_workers"])
    params = DESParams.from_workers(fill, dec, kv_stripes=cfg["kv_stripes"], kv_setup_s=cfg["kv_setup_s"])
    caps = {"fill": plant_model.fill_capacity, "decode": plant_model.decode_capacity}
    neck = min(caps, key=caps.get)
    return ReplaySetup(trace, params, plant_model, shape, caps[neck], neck)


def run_replay(trace: pd.DataFrame, setup: ReplaySetup, admission: str, scale: float = 1.0,
               cluster: dict | None = None, autoscaler: str | None = None) -> tuple[dict, Any]:
    """One replay through the request simulator.

    Parameters
    ----------
    trace : DataFrame
        The request table.
    setup : ReplaySetup
        From :func:`build_replay`.
    admission : str
        A registered admission kind (``open`` for none).
    scale : float
        Replay speed-up (arrival times divided by ``scale``).
    cluster : dict, optional
        :class:`ClusterConfig` fields (pool sizes default to the setup's).
    autoscaler : str, optional
        A registered autoscaler kind sizing both pools.

    Returns
    -------
    tuple
        ``(metrics, DESResult)``; metrics add the ready buffer's oscillation report.
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
