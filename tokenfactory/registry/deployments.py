"""Today's deployments assembled from registered kinds: :data:`CONTROL_PLANES` (an autoscaler
kind and an admission kind, the comparisons' rows) and :data:`BASELINE_STACKS` (the layered-stack
comparison's baselines as :class:`~tokenfactory.controllers.control_stack.ControlStack` s)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenfactory.controllers.control_stack import ControlStack, StackLayer
from tokenfactory.core.validation import ConfigError
from tokenfactory.registry.kinds import AUTOSCALER_KINDS, PlantContext, build_admission, build_autoscalers

__all__ = ["CONTROL_PLANES", "control_plane", "BASELINE_STACKS", "baseline_stack"]

#: every control plane of the comparisons: (autoscaler kind or None, admission kind or None)
CONTROL_PLANES: dict[str, tuple[str | None, str | None]] = {
    "static + vllm-watermark": (None, "vllm-watermark"),
    "static + mooncake-early-rejection": (None, "mooncake"),
    "static + mooncake-predictive-rejection": (None, "mooncake-predictive"),
    "static + tokenfactory-smoothed": (None, "smoothed"),
    "kubernetes-hpa": ("hpa", None),
    "knative-kpa": ("kpa", None),
    "dynamo-throughput": ("dynamo-throughput", None),
    "dynamo-load": ("dynamo-load", None),
    # NVIDIA's own planner code (ai-dynamo), its default throughput target, in place of the rules above
    "dynamo-planner": ("dynamo-planner", None),
    "aibrix-apa": ("apa", None),
    "tokenfactory-hysteretic": ("hysteretic", None),
    "tokenfactory-hysteretic + smoothed": ("hysteretic", "smoothed"),
}


def control_plane(name: str, ctx: PlantContext) -> tuple[list, Any]:
    """Fresh controller objects for control plane ``name``.

    Parameters
    ----------
    name : str
        A key of :data:`CONTROL_PLANES`.
    ctx : PlantContext
        The plant, demand and pool sizes.

    Returns
    -------
    tuple
        ``(pool autoscalers, admission controller or None)``.
    """
    if name not in CONTROL_PLANES:
        raise ConfigError("control_plane", f"{name!r} is not one of {', '.join(CONTROL_PLANES)}")
    scaler, admission = CONTROL_PLANES[name]
    scalers = build_autoscalers(scaler, ctx) if scaler else []
    adm = build_admission(admission, ctx) if admission else None
    return scalers, adm


#: today's deployments as layered stacks (autoscaler kind, its parameters, admission kind or None):
#: the baselines of the layered-stack comparison, assembled as real deployments use them
BASELINE_STACKS: dict[str, tuple[str, dict, str | None]] = {
    "hpa + vllm-watermark": ("hpa", {}, "vllm-watermark"),
    "knative-kpa": ("kpa", {}, None),
    # Dynamo's planner counts requests at its frontend (before Mooncake's rejections); ARIMA is its default
    "dynamo-throughput (arima) + mooncake": ("dynamo-throughput", {"predictor": "arima", "demand": "offered"},
                                             "mooncake"),
    "dynamo-throughput (kalman) + mooncake": ("dynamo-throughput", {"predictor": "kalman", "demand": "offered"},
                                              "mooncake"),
    "dynamo-load + mooncake": ("dynamo-load", {}, "mooncake"),
    "aibrix-apa": ("apa", {}, None),
}


def baseline_stack(name: str, ctx: PlantContext, dt: float = 0.0, history=None) -> ControlStack:
    """A baseline deployment of :data:`BASELINE_STACKS` as a :class:`ControlStack` (admission and
    reconfiguration layers at their documented periods).

    Parameters
    ----------
    name : str
        A key of :data:`BASELINE_STACKS`.
    ctx : PlantContext
        The plant, demand and worker dynamics.
    dt : float
        The plant's step: an admission sampled faster than it is sampled every step (0.25 s
        orchestrator ticks on a 1 s grid are recorded as 1 s in the stack's params).
    history : pandas.Series, optional
        Demand before the run (requests/s, time index in s): Dynamo's predictors warm up on it
        (``load_predictor_warmup_trace``), resampled to their adjustment interval.

    Returns
    -------
    ControlStack
    """
    if name not in BASELINE_STACKS:
        raise ConfigError("baseline", f"{name!r} is not one of {', '.join(BASELINE_STACKS)}")
    scaler, params, admission = BASELINE_STACKS[name]
    params = dict(params)
    if history is not None and "warmup" in AUTOSCALER_KINDS[scaler].keys and len(history) > 1:
        t = history.index.to_numpy(dtype=float)
        grid = np.arange(t[0], t[-1] + 1e-9, 180.0)  # Dynamo's adjustment interval
        params["warmup"] = np.interp(grid, t, history.interpolate(limit_direction="both").to_numpy(dtype=float))
    scalers = build_autoscalers(scaler, ctx, params)
    layers = []
    if admission is not None:
        adm = build_admission(admission, ctx)
        adm.sample_period = max(adm.sample_period, dt)
        layers.append(StackLayer("admission", [adm], adm.sample_period))
        base = adm.sample_period
        for c in scalers:  # a layer's period is a multiple of the fastest one's
            c.sample_period = max(base, round(c.sample_period / base) * base)
    layers.append(StackLayer("reconfiguration", scalers, scalers[0].sample_period))
    return ControlStack(layers, name)
