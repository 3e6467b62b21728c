"""The autoscaler kinds (the reconfiguration layer; a builder returns one controller per pool, or
one for both): today's ``hpa``, ``kpa``, ``dynamo-throughput``, ``dynamo-load``, ``dynamo-planner``
(NVIDIA's own planner code, the ``dynamo`` extra), ``apa``, and tokenfactory's ``hysteretic``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from tokenfactory.controllers.autoscaling import (
    AIBrixAPA,
    DynamoLoadPlanner,
    DynamoThroughputPlanner,
    HorizontalPodAutoscaler,
    KnativeAutoscaler,
)
from tokenfactory.controllers.dynamo_planner import PLANNER_MODES, PLANNER_PREDICTORS
from tokenfactory.controllers.reconfiguration import HystereticPoolController, measured_need_noise
from tokenfactory.core.validation import ConfigError, check_choice, check_int, resolve_config, setting
from tokenfactory.registry.admission_kinds import static_batch_cap
from tokenfactory.registry.kinds import TARGET_UTILIZATION, ControllerKind, PlantContext, register, with_defaults

__all__ = ["HystereticParams"]   # the kinds are reached through the registry's tables

#: each kind's parameters (type, unit, range, default, meaning): the one place their defaults are
#: declared; the builders read them through :func:`~tokenfactory.registry.kinds.with_defaults`
_DYNAMO_THROUGHPUT = {
    "predictor": setting("constant", kind=str, choices=("constant", "arima", "kalman"),
                         meaning="the load predictor Dynamo's throughput mode uses"),
    "demand": setting("admitted", kind=str, choices=("admitted", "offered"),
                      meaning="the request count it predicts: admitted, or offered (the frontend's arrivals, "
                              "before an admission layer's rejections)"),
    "warmup": setting(None, kind="list of numbers", unit="requests/s",
                      meaning="interval rates before the run, oldest first (Dynamo's warm-up trace)"),
}
_DYNAMO_LOAD = {
    "target": setting("load", kind=str, choices=("throughput", "load"),
                      meaning="Dynamo's optimisation target: its load thresholds or its throughput ones"),
}
_DYNAMO_PLANNER = {
    "mode": setting("throughput", kind=str, choices=PLANNER_MODES, meaning="Dynamo's optimization_target"),
    "predictor": setting("constant", kind=str, choices=PLANNER_PREDICTORS, meaning="Dynamo's load predictor"),
    "planner_config": setting(None, kind="table",
                              meaning="Dynamo PlannerConfig fields, passed to the real planner (unknown ones "
                                      "rejected by it)"),
}



def _bounds(ctx: PlantContext) -> dict:
    return {"min_replicas": 1, "max_replicas": ctx.max_replicas}


def _rates(ctx: PlantContext) -> tuple[float, float]:
    return ctx.params.fill_rate_per_worker, ctx.params.decode_capacity(1)


def _hpa(ctx: PlantContext, p: dict) -> list:
    return [HorizontalPodAutoscaler("fill", 0.7, "fill_utilization", **_bounds(ctx)),
            HorizontalPodAutoscaler("decode", 0.8, "kv_occupancy", **_bounds(ctx))]


def _kpa(ctx: PlantContext, p: dict) -> list:  # concurrency per replica at the target utilisation (Little's law)
    mu_f, _ = _rates(ctx)
    return [KnativeAutoscaler("fill", 0.7 * mu_f * ctx.params.fill_to_ready_s, "fill_concurrency", **_bounds(ctx)),
            KnativeAutoscaler("decode", 0.8 * ctx.params.decode_slots_per_worker, "decode_concurrency",
                              **_bounds(ctx))]


def _dynamo_throughput(ctx: PlantContext, p: dict) -> list:
    from tokenfactory.controllers.load_predictors import make_load_predictor

    p = with_defaults(_DYNAMO_THROUGHPUT, p)
    mu_f, mu_d = _rates(ctx)
    # Dynamo predicts the request count once per interval for both pools: one shared predictor
    pred = make_load_predictor(check_choice("autoscaler.predictor", p["predictor"],
                                            _DYNAMO_THROUGHPUT["predictor"].metadata["choices"]))
    demand = check_choice("autoscaler.demand", p["demand"], _DYNAMO_THROUGHPUT["demand"].metadata["choices"])
    # "offered": the frontend's request count (arrivals, before an admission layer's rejections)
    metric = (lambda m: m.arrival_rate) if demand == "offered" else None
    warmup = p.get("warmup")

    def isl_scale(m):  # Dynamo predicts ISL too: the prompt length now over the nominal one
        return mu_f * m.fill_workers / m.fill_capacity if m.fill_capacity > 0 and m.fill_workers > 0 else 1.0

    return [DynamoThroughputPlanner("fill", TARGET_UTILIZATION * mu_f, predictor=pred, metric=metric,
                                    demand_scale=isl_scale, warmup=warmup, **_bounds(ctx)),
            DynamoThroughputPlanner("decode", TARGET_UTILIZATION * mu_d, predictor=pred, metric=metric,
                                    warmup=warmup, **_bounds(ctx))]


def _dynamo_load(ctx: PlantContext, p: dict) -> list:
    # Dynamo's load-based rules on the engine the real planner's adapter describes (same thresholds)
    from tokenfactory.controllers.autoscaling import DYNAMO_THROUGHPUT_TARGET, dynamo_load_thresholds
    from tokenfactory.controllers.dynamo_planner import DynamoCapabilities

    caps = DynamoCapabilities.from_context(ctx)
    target = check_choice("autoscaler.target", with_defaults(_DYNAMO_LOAD, p)["target"],
                          _DYNAMO_LOAD["target"].metadata["choices"])
    th = dynamo_load_thresholds(caps.fill_token_budget) if target == "load" else DYNAMO_THROUGHPUT_TARGET
    kw = dict(target=target, prompt_tokens=caps.prompt_tokens, context_tokens=caps.context_tokens,
              output_tokens=caps.output_tokens, fill_step_tokens=caps.fill_token_budget,
              kv_tokens_per_worker=caps.max_kv_tokens, **_bounds(ctx))
    return [DynamoLoadPlanner(pool, *th[pool], **kw) for pool in ("fill", "decode")]


def _dynamo_planner(ctx: PlantContext, p: dict) -> list:
    # the real planner (ai-dynamo), one controller sizing both pools; imported here: it is an extra
    from tokenfactory.controllers.dynamo_planner import DynamoCapabilities, DynamoPlanner

    p = with_defaults(_DYNAMO_PLANNER, p)
    cfg = p.get("planner_config") or {}
    if not isinstance(cfg, Mapping):
        raise ConfigError("autoscaler.planner_config", "must be a table of Dynamo PlannerConfig fields")
    return [DynamoPlanner(DynamoCapabilities.from_context(ctx), p["mode"], p["predictor"], config=cfg, slo_ttft_s=ctx.slo_ttft_s,
                          slo_tpot_s=ctx.slo_tpot_s, max_replicas=ctx.max_replicas)]


def _apa(ctx: PlantContext, p: dict) -> list:
    return [AIBrixAPA("fill", 0.7, "fill_utilization", **_bounds(ctx)),
            AIBrixAPA("decode", 0.8, "kv_occupancy", **_bounds(ctx))]


@dataclass(frozen=True)
class HystereticParams:
    """Parameters of the ``hysteretic`` autoscaler kind (``--autoscaler-param KEY=VALUE``): a
    floor per pool. Holding workers beforehand is the one lever for a burst shorter than
    measurement delay + start-up, which no measurement-driven rule can serve with new workers
    (issue 21's small plant); the rule's dead band, dwell and cooldown stay tuned from the plant.

    Parameters
    ----------
    fill_min_replicas : int
        Fewest fill workers the controller keeps (1 to the plant's max_replicas; default 1).
    decode_min_replicas : int
        Fewest decode workers the controller keeps (1 to the plant's max_replicas; default 1).
    """

    fill_min_replicas: int = setting(1, kind=int, low=1, meaning="fewest fill workers the controller keeps "
                                     "(at most the plant's max_replicas)")
    decode_min_replicas: int = setting(1, kind=int, low=1, meaning="fewest decode workers the controller keeps "
                                       "(at most the plant's max_replicas)")


def _hysteretic(ctx: PlantContext, p: dict) -> list:
    if ctx.rate_rps is None:
        raise ConfigError("autoscaler", "the hysteretic controller needs the mean demand (PlantContext.rate_rps) "
                          "to derive its dead band")
    for key in ("fill_min_replicas", "decode_min_replicas"):   # the range is the plant's: [1, max_replicas]
        if key in p:
            check_int(f"autoscaler.{key}", p[key], low=1, high=ctx.max_replicas)
    cfg = resolve_config(HystereticParams, p, "autoscaler")
    mu_f, mu_d = _rates(ctx)
    # a decode worker carries what its batch at the TPOT SLO completes, not its full KV batch
    # (the small plant of issue 21: 41 of 328 slots at a 50 ms TPOT, 2.7 instead of 11 req/s)
    p = ctx.params
    mu_d = min(mu_d, p.completion_rate(min(static_batch_cap(ctx), p.decode_slots_per_worker), 1))
    kw = dict(startup_s=ctx.dynamics.startup_s, warmup_s=ctx.dynamics.warmup_s,
              target_utilization=TARGET_UTILIZATION, max_replicas=ctx.max_replicas)
    arr = ctx.arrival_times_s
    out = []
    for pool, mu in (("fill", mu_f), ("decode", mu_d)):
        noise = None
        if arr is not None and len(arr) > 1 and float(np.max(arr) - np.min(arr)) >= 2700.0:
            noise = measured_need_noise(arr, mu, TARGET_UTILIZATION, 30.0)
        out.append(HystereticPoolController.tuned(pool, mu, ctx.rate_rps, noise_std=noise,
                                                  min_replicas=getattr(cfg, f"{pool}_min_replicas"), **kw))
    return out


register(ControllerKind("hpa", "reconfiguration", "Kubernetes HPA (tolerance 0.1, scale-down stabilisation "
                        "300 s) on fill utilisation and KV occupancy", _hpa, baseline=True))
register(ControllerKind("kpa", "reconfiguration", "Knative KPA (stable window 60 s, panic window 6 s) on "
                        "concurrency", _kpa, baseline=True))
register(ControllerKind("dynamo-throughput", "reconfiguration", "NVIDIA Dynamo planner, throughput mode "
                        "(ceil(predicted demand / capacity) every 180 s)", _dynamo_throughput,
                        settings=_DYNAMO_THROUGHPUT, baseline=True))
register(ControllerKind("dynamo-load", "reconfiguration", "NVIDIA Dynamo planner's load-based rules "
                        "re-implemented (+-1 per 5 s tick on queued prompt tokens and KV use; target load or "
                        "throughput; agrees with dynamo-planner tick by tick)", _dynamo_load,
                        settings=_DYNAMO_LOAD, baseline=True))
register(ControllerKind("dynamo-planner", "reconfiguration", "NVIDIA Dynamo's own planner (ai-dynamo 1.4.2, "
                        "unchanged; modes throughput, load, sla; Dynamo PlannerConfig fields in planner_config)",
                        _dynamo_planner, settings=_DYNAMO_PLANNER, baseline=True))
register(ControllerKind("apa", "reconfiguration", "AIBrix APA (fluctuation tolerances, 60 s window)", _apa,
                        baseline=True))
register(ControllerKind("hysteretic", "reconfiguration", "tokenfactory: pending-aware hysteretic pool "
                        "controller with a noise-derived dead band, dwell and cooldown (a floor per pool: fill_min_replicas, "
                        "decode_min_replicas)", _hysteretic,
                        settings={f.name: f for f in dataclasses.fields(HystereticParams)}))
