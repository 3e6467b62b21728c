"""Overload study, section (c): the decode batch cap adjusted from the measured pass time every
sample (ungated) against the same rule gated until its effect is observed, in the fluid plant and
the request simulator.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from tokenfactory.controllers import assess
from tokenfactory.plant_models import ClusterConfig, FluidLoopPlant, FluidParams, FluidPlant, LoopScenario, RequestPlant
from tokenfactory.registry import PlantContext, batch_gate_for, static_batch_cap
from tokenfactory.replay import build_replay, class_outputs
from tokenfactory.traces import scale_trace
from tokenfactory.studies.overload.common import load_capacity, trace_for_load

__all__ = ["gate_before_after_fluid", "gate_before_after_des"]


# ------------------------------------------------------------------------------------------
# (c) the gated batch cap, before and after


def cap_verdict(series: pd.Series, dt: float) -> dict:
    x = series.to_numpy(dtype=float)
    x = x[np.isfinite(x)]
    return assess(x, dt, min_amplitude=2.0).to_dict() if len(x) >= 16 else {"oscillating": False, "reason": "too short"}


def gate_before_after_fluid(fp: FluidParams, fill_workers: int, decode_workers: int, slo_tpot_s: float,
                            duration_s: float, overload: float = 1.5) -> dict:
    """The batch cap adjusted from the measured pass time every sample (ungated, gain 1) vs gated,
    in the admission-loop fluid plant under ``overload`` x its decode capacity at the cap with
    no admission control (a ready backlog is always there, so the cap binds).

    Parameters
    ----------
    fp : FluidParams
        The plant.
    fill_workers, decode_workers : int
        Pools.
    slo_tpot_s : float
        TPOT SLO.
    duration_s : float
        Simulated time (s).
    overload : float
        Demand over the decode capacity at the static cap.

    Returns
    -------
    dict
        Per variant: the series, the cap's oscillation verdict, the pass time's range and mean.
    """
    ctx = PlantContext(fp, fill_workers, decode_workers, slo_tpot_s=slo_tpot_s)
    cap = static_batch_cap(ctx)
    plant = FluidPlant(fp, fill_workers, decode_workers)
    demand = overload * decode_workers * cap / (fp.output_tokens * fp.decode_step_s(cap))
    out = {}
    for key, params in (("ungated", {"gated": False, "gain": 1.0}), ("gated", {"gated": True})):
        gate = batch_gate_for(ctx, params)
        r = FluidLoopPlant(plant).run(LoopScenario(demand=demand, duration_s=duration_s, dt=0.01), [gate])
        s = r.series
        after = s[s["time_s"] >= 0.2 * duration_s]
        samp = after.iloc[::10]
        out[key] = {"series": s[["time_s", "decode_batch_cap", "active_decodes", "decode_pass_s"]].iloc[::10],
                    "verdict": cap_verdict(samp["decode_batch_cap"], 0.1),
                    "pass_verdict": assess(samp["decode_pass_s"].to_numpy(), 0.1,
                                           min_amplitude=0.02 * gate.target_s).to_dict(),
                    "cap_min": float(after["decode_batch_cap"].min()), "cap_max": float(after["decode_batch_cap"].max()),
                    "pass_mean_s": float(after["decode_pass_s"].mean()), "pass_max_s": float(after["decode_pass_s"].max()),
                    "target_s": gate.target_s, "changes": int((r.actions["kind"] == "batch_cap").sum())}
    return out


def gate_before_after_des(tr: pd.DataFrame, setup, load: float, cluster: dict, replay_s: float | None,
                          slo_tpot_s: float) -> dict:
    """The same before/after in the request simulator: a trace at ``load`` x the capacity at the SLO
    with no admission control, the batch cap from the ungated or the gated rule.

    Parameters
    ----------
    tr : DataFrame
        The request table.
    setup : ReplaySetup
        From :func:`tokenfactory.replay.build_replay`.
    load : float
        Offered load (x capacity at the SLO).
    cluster : dict
        :class:`ClusterConfig` fields.
    replay_s : float or None
        Replayed seconds (None: the whole trace).
    slo_tpot_s : float
        TPOT SLO.

    Returns
    -------
    dict
        Per variant: series, verdicts, pass time, TPOT p99 and goodput.
    """
    cl = {"slo_tpot_s": slo_tpot_s, **cluster}
    part = trace_for_load(tr, setup, load, replay_s, cl)
    rate = len(part) / max(float(part["arrival_s"].max()), 1e-9)
    scale = load * load_capacity(setup, cl)[0] / rate
    replay = scale_trace(part, scale)
    ctx = setup.context(slo_tpot_s=slo_tpot_s, class_outputs=class_outputs(replay))
    out = {}
    for key, params in (("ungated", {"gated": False, "gain": 1.0}), ("gated", {"gated": True})):
        gate = batch_gate_for(ctx, params)
        cl = ClusterConfig.from_dict({"fill_workers": int(setup.plant.fill_workers),
                                      "decode_workers": int(setup.plant.decode_workers),
                                      "measurement_delay_s": setup.plant.params.measurement_delay_s,
                                      **cluster, "batch_cap": static_batch_cap(ctx)})
        res = RequestPlant(setup.params, cl).run(replay, [gate])
        s = res.series
        after = s[(s["time_s"] >= 0.2 * s["time_s"].iloc[-1]) & (s["time_s"] <= float(replay["arrival_s"].max()))]
        out[key] = {"series": s[["time_s", "decode_batch_cap", "active_decodes", "decode_pass_s", "ready"]],
                    "verdict": cap_verdict(after["decode_batch_cap"], cl.snapshot_dt),
                    "cap_min": float(after["decode_batch_cap"].min()), "cap_max": float(after["decode_batch_cap"].max()),
                    "pass_mean_s": float(after["decode_pass_s"].mean()),
                    "tpot_p99": res.metrics["tpot_p99"], "preempted": res.metrics["preempted"],
                    "changes": res.metrics["batch_cap_changes"], "target_s": gate.target_s}
    return out


def gate_figure(fluid: dict, des: dict) -> Figure:
    fig = Figure(figsize=(11, 7), layout="constrained")
    ax = fig.subplots(2, 2, sharex="col")
    for j, (name, d) in enumerate((("fluid plant", fluid), ("request simulator", des))):
        for i, key in enumerate(("ungated", "gated")):
            s = d[key]["series"]
            ax[0, j].plot(s["time_s"], s["decode_batch_cap"], color=f"C{i}", lw=1.0, label=f"{key}: cap")
            ax[0, j].plot(s["time_s"], s["active_decodes"], color=f"C{i}", lw=0.6, alpha=0.6, ls="--",
                          label=f"{key}: batch")
            ax[1, j].plot(s["time_s"], s["decode_pass_s"], color=f"C{i}", lw=0.8, label=key)
        ax[1, j].axhline(d["gated"]["target_s"], color="k", ls=":", lw=1, label="target pass time")
        ax[0, j].set_title(name)
        ax[0, j].set_ylabel("decode batch (per worker)")
        ax[1, j].set_ylabel("decode pass time (s)")
        ax[1, j].set_xlabel("time (s)")
        for a in ax[:, j]:
            a.grid(True, alpha=0.3)
            a.legend(fontsize=7)
    return fig


def verdict_words(v: dict) -> str:
    if v.get("oscillating"):
        return f"oscillates (period {v['period_s']:.1f} s)"
    return "does not oscillate"

