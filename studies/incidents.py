"""Study `incidents`: autoscaling incidents users reported, rebuilt from the configuration each
report gives, predicted before simulating, simulated, and advised.

Each incident is the control plane's own settings file (in its own format,
:mod:`tokenfactory.controllers.formats`) on a plant matching the report (DeepSeek-V3 on 8 x H200
decode workers of the pool model, the report's start-up and demand). For each:

1. **prediction** - :func:`tokenfactory.controllers.autoscaler_loops.certify_autoscaler` at the
   demand the report describes: the cycle the rule settles into (period, the two pool sizes) and
   the start-up overshoot (peak replicas asked for before new workers serve);
2. **simulation** - the pool model (:class:`tokenfactory.plant_models.plant_protocol.PoolPlant`) with
   the same controller object: peak workers, reversals per hour, the measured cycle period,
   SLO attainment and GPU-hours;
3. **advice** - :func:`tokenfactory.advise.search_settings` over the same control plane's knobs,
   judged by the pool model, and the advised setting's prediction and simulation.

Incidents:

* ``aibrix-2670`` - AIBrix RFC #2670 (vllm-project/aibrix, fixed by PR #2671): "ready=2,
  current=2 ... set replicas=4 ... 8 ... 16" while new pods are pending - an APA that multiplies
  the replica count, pending pods included, by a saturated KV metric over its target. Reported:
  2 -> 4 -> 8 -> 16, one doubling per reconciliation.
* ``hpa-startup-cascade`` - a Kubernetes HPA on ``vllm:kv_cache_usage_perc`` with the default
  behaviour (4 pods or 100 % per 15 s) behind a 5-minute start-up. Upstream's replica calculator
  counts the starting pods at 0 on a scale-up, so it does not compound as APA does, but the KV
  metric counts the waiting sequences: the rule keeps asking for ceil(serving x metric / target)
  while the queue grows through the start-up. Reported qualitatively (the AIBrix RFC's "replica
  leakage"; Kubernetes issue discussions of slow-starting pods): no numbers.
* ``queue-length-flapping`` - an HPA on ``vllm:num_requests_waiting`` (the small-plant user's
  setting, ``../shared/cases/small-plant/hpa.yaml``) at a constant demand between one and two
  workers' capacity: an empty queue reads as idle, so the pool releases, the queue regrows, and it
  scales up again (the "need real-world threshold data" of kthena #799). Reported: none numeric.

* ``dynamo-9294`` - ai-dynamo/dynamo PR #9294 ("make SLA-mode scale-down consolidation-aware
  again", merged 2026-05-07): with the flat ``load_scaling_down_sensitivity x SLA`` threshold the
  SLA planner released one of 2 decode workers (KV use about 0.7 each, ITL 23 ms < 32 ms) and "the
  surviving worker would immediately blow SLA, causing 2 <-> 1 oscillation under constant load".
  The settings file is a Dynamo planner config (read by :mod:`tokenfactory.controllers.formats`);
  the rule is :class:`~tokenfactory.controllers.dynamo_sla_scaling.DynamoSLALoadScaling` on the
  plant's pass time, the flat rule the PR replaced and, beside it, the consolidation-aware one it
  shipped (ai-dynamo 1.4.2). No period reported.
* ``dynamo-planner-plateau`` - NVIDIA Dynamo's own planner (ai-dynamo 1.4.2, run unchanged by
  :class:`~tokenfactory.controllers.dynamo_planner.DynamoPlanner`) with the load target's
  thresholds of ``docs/examples/dynamo-planner.yaml`` (KV use 60 / 90 %) at a constant demand of
  1.05 decode workers: one worker reads 100 %, two 52.5 % - no pool size sits in the band, so it
  plateau-cycles 1 <-> 2 (the real planner's version of the 2 <-> 1 reports). Predicted by
  :func:`~tokenfactory.controllers.dynamo_planner_loop.certify_planner`, advised over the
  planner's own knobs with the real planner replaying. Not a reported incident: no numbers.
* ``mooncake-seesaw`` - Mooncake (arXiv 2407.00079, sec. 7.3): early rejection on the decode load
  measured now makes prefill and decode load swing in anti-phase; the reconfiguration study's
  seesaw plant (:func:`tokenfactory.reproduction.run_seesaw`) with the settings
  file's rejection; predicted by :func:`~tokenfactory.controllers.early_rejection.predict_rejection_seesaw`;
  advised to the paper's prediction-based rejection (sec. 7.4). No period reported.

Run: ``tokenfactory study incidents [--quick]``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from tokenfactory.advise import DEFAULT_ATTAINMENT, scale_churn, search_settings
from tokenfactory.controllers.autoscaler_loops import PoolOperatingPoint, certify_autoscaler, predict_startup_cascade
from tokenfactory.controllers.formats import parse_control_plane
from tokenfactory.plant_models import FluidParams, RequestShape, Worker
from tokenfactory.plant_models.fleet import PoolDynamics
from tokenfactory.plant_models.plant_protocol import PoolPlant
from tokenfactory.plant_models.pools import PoolScenario
from tokenfactory.studies.report import StudyReport, markdown_table
from tokenfactory.core.errors import ConfigError
from tokenfactory.core.validation import check_number, reject_unknown_keys
from tokenfactory.studies.study_config import StudyVariants, resolve_study_config

__all__ = ["CONFIG", "INCIDENTS", "DEFAULT_CONFIG", "run", "measured_cycle"]

AIBRIX_2670 = """\
# AIBrix RFC #2670: APA on KV-cache usage; pending pods count in the current replicas
apiVersion: autoscaling.aibrix.ai/v1alpha1
kind: PodAutoscaler
metadata:
  name: decode-apa
spec:
  scalingStrategy: APA
  minReplicas: 2
  maxReplicas: 16
  metricsSources:
    - metricSourceType: pod
      protocolType: http
      port: "8000"
      path: metrics
      targetMetric: gpu_cache_usage_perc
      targetValue: "0.5"
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: decode
"""

def _decode_hpa(metric: str, average_value: str, max_replicas: int, comment: str = "") -> str:
    """An autoscaling/v2 HPA on the decode deployment: one Pods metric, Kubernetes' default behavior."""
    return (f"{comment}apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata:\n  name: decode\nspec:\n"
            "  scaleTargetRef:\n    apiVersion: apps/v1\n    kind: Deployment\n    name: decode\n"
            f"  minReplicas: 1\n  maxReplicas: {max_replicas}\n  metrics:\n    - type: Pods\n      pods:\n"
            f"        metric:\n          name: {metric}\n        target:\n          type: AverageValue\n"
            f'          averageValue: "{average_value}"\n')


HPA_CASCADE = _decode_hpa("vllm:kv_cache_usage_perc", "0.7", 32)
QUEUE_HPA = _decode_hpa("vllm:num_requests_waiting", "2", 4, "# the small-plant user's HPA: queued requests per pod, "
                        "Kubernetes' default behavior\n")

MOONCAKE_EARLY_REJECTION = """\
# Mooncake's conductor (arXiv 2407.00079, sec. 7.2): reject at arrival when the request would break
# its TTFT SLO or the decode load measured now is full
early_rejection:
  slo_ttft_s: 10          # the long-context SLO of the seesaw plant (several 12k-token prefills)
  decode_threshold: 1.0   # every decode slot taken
  predictive: false       # sec. 7.2: the load now; sec. 7.4's fix predicts it at decode arrival
  sample_period: 0.5
"""

DYNAMO_9294 = """\
# Dynamo SLA planner, load-based scaling of a disaggregated deployment (ai-dynamo PR #9294's
# production tier: 2 decode workers at about 0.7 KV use each, ITL 23 ms against a 40 ms SLA)
optimization_target: sla
enable_load_scaling: true
enable_throughput_scaling: false
itl_ms: 190                         # this plant's ITL at 2 workers (110 ms) is the report's 0.575 of the SLA
ttft_ms: 2000
load_scaling_down_sensitivity: 80   # Dynamo's default: scale down under 80 % of the SLA
load_adjustment_interval_seconds: 5
min_endpoint: 1
"""

DYNAMO_PLANNER_PLATEAU = """\
# Dynamo planner, load target with the thresholds of Dynamo's docs (docs/examples/dynamo-planner.yaml)
optimization_target: load
load_adjustment_interval: 10
prefill_scale_up_queue_tokens: 8192
prefill_scale_down_queue_tokens: 819
decode_scale_up_kv_rate: 90
decode_scale_down_kv_rate: 60
max_gpu_budget: 64                  # 8 workers of 8 GPUs over both pools
min_endpoint: 1
"""

#: the fields of an early-rejection settings file (EarlyRejection's own, the plant's fill latency aside)
EARLY_REJECTION_FIELDS = {"slo_ttft_s": 10.0, "decode_threshold": 1.0, "predictive": False, "sample_period": 0.5}


def read_early_rejection(text: str, where: str = "early_rejection") -> dict:
    """The early-rejection settings of a YAML file (one ``early_rejection`` mapping; every unknown
    key an error naming it), defaults filled in."""
    import yaml

    from tokenfactory.core.errors import ConfigError

    doc = yaml.safe_load(text)
    if not isinstance(doc, dict):
        raise ConfigError(where, "expected a mapping with an early_rejection section")
    reject_unknown_keys(where, doc, {"early_rejection": None})
    sec = doc.get("early_rejection") or {}
    reject_unknown_keys(f"{where}.early_rejection", sec, EARLY_REJECTION_FIELDS)
    out = {**EARLY_REJECTION_FIELDS, **sec}
    if not isinstance(out["predictive"], bool):
        raise ConfigError(f"{where}.early_rejection.predictive", f"expected true or false, got {out['predictive']!r}")
    return out


#: name -> the report: its settings file, the plant's start-up, the demand before and after a step
#: (in workers of one decode worker's capacity), when the step comes, and what the report says
INCIDENTS: dict[str, dict[str, Any]] = {
    "aibrix-2670": {"file": AIBRIX_2670, "source": "vllm-project/aibrix#2670", "startup_s": 300.0,
                    "demand_workers": (0.9, 3.0), "step_at_s": 600.0, "start_workers": 2,
                    "reported": {"peak_replicas": 16, "sequence": "2 -> 4 -> 8 -> 16"}},
    "hpa-startup-cascade": {"file": HPA_CASCADE, "source": "Kubernetes HPA default behavior (kubernetes.io)",
                            "startup_s": 300.0, "demand_workers": (1.5, 3.0), "step_at_s": 600.0,
                            "start_workers": 2, "reported": {}},
    "queue-length-flapping": {"file": QUEUE_HPA, "source": "../shared/cases/small-plant/hpa.yaml; kthena#799",
                              "startup_s": 90.0, "demand_workers": (1.45, 1.45), "step_at_s": 0.0,
                              "start_workers": 1, "reported": {}},
    "dynamo-9294": {"kind": "dynamo-sla", "file": DYNAMO_9294, "source": "ai-dynamo/dynamo#9294",
                    "startup_s": 120.0, "demand_workers": (1.4, 1.4), "step_at_s": 0.0, "start_workers": 2,
                    "max_replicas": 8, "sensitivities": (70, 60, 50, 40),
                    "reported": {"sequence": "2 <-> 1 under constant load"}},
    "dynamo-planner-plateau": {"kind": "dynamo-planner", "file": DYNAMO_PLANNER_PLATEAU,
                               "source": "ai-dynamo 1.4.2 planner, docs/examples/dynamo-planner.yaml thresholds",
                               "startup_s": 120.0, "demand_workers": (1.05, 1.05), "step_at_s": 0.0,
                               "start_workers": 1, "reported": {}},
    "mooncake-seesaw": {"kind": "admission", "file": MOONCAKE_EARLY_REJECTION,
                        "source": "Mooncake, arXiv 2407.00079 sec. 7.3 (the reconfiguration study's seesaw plant)",
                        "reported": {"sequence": "prefill and decode load swing in anti-phase"}},
}

#: SLOs of the pool model's cohort estimate: TTFT 2 s, TPOT 0.155 s (the fitted roofline runs a full KV
#: batch of DeepSeek-V3 on 8 x H200 at 0.116 s per token - the aggregation and reconfiguration
#: studies' SLO - so a pool with enough workers meets it and a short one does not)
DEFAULT_CONFIG: dict[str, Any] = {"incidents": list(INCIDENTS), "duration_s": 3 * 3600.0, "dt": 1.0, "seed": 1,
                                  "warmup_s": 30.0, "candidates": 4, "slo_target": 0.99, "slo_ttft_s": 2.0,
                                  "slo_tpot_s": 0.155}
#: the quick variant leaves out the real planner's row: its replays run Dynamo's code (about 2.5 min
#: on a loaded 2-core machine); `tests/test_dynamo_planner_loop.py` checks the same loop model
#: against the real planner in the default test run, the slow test of the study runs the row
QUICK = {"duration_s": 3600.0, "candidates": 2,
         "incidents": [n for n in INCIDENTS if INCIDENTS[n].get("kind") != "dynamo-planner"]}


#: every incident's workers: DeepSeek-V3 on 8 x H200
PLANT = {"model": "deepseek-v3", "hardware": "h200"}


def _check(cfg: dict[str, Any]) -> None:
    """The ranges of the resolved settings."""
    for name in cfg["incidents"]:
        if name not in INCIDENTS:
            raise ConfigError("incidents.incidents", f"{name!r} is not one of {', '.join(INCIDENTS)}")
    check_number("incidents.duration_s", cfg["duration_s"], low=600.0)


#: the study's settings: the defaults and its quick variant (:mod:`tokenfactory.studies.study_config`)
CONFIG = StudyVariants("incidents", DEFAULT_CONFIG, quick=QUICK, check=_check)


def _plant() -> FluidParams:
    w = Worker.from_dict(PLANT)
    return FluidParams.from_workers(w, w, RequestShape(2048, 512))


def measured_cycle(series: pd.DataFrame, pool: str = "decode", after_s: float = 0.0) -> float | None:
    """Mean time between scale-ups from the pool's smallest size after ``after_s`` (s), or None
    with fewer than three such scale-ups."""
    s = series[series["time_s"] >= after_s]
    n = s[f"{pool}_workers"].to_numpy()
    t = s["time_s"].to_numpy()
    if len(n) < 3:
        return None
    ups = t[1:][(np.diff(n) > 0) & (n[:-1] == n.min())]
    return float(np.diff(ups).mean()) if len(ups) >= 3 else None


def _demand(inc: dict, mu: float, duration_s: float) -> pd.Series | float:
    before, after = (w * mu for w in inc["demand_workers"])
    if before == after:
        return before
    return pd.Series([before, after], index=[0.0, inc["step_at_s"]])


def _simulate(setting, inc: dict, params: FluidParams, cfg: dict) -> dict:
    mu = params.decode_capacity(1)
    lam = max(inc["demand_workers"]) * mu
    fill = math.ceil(2.0 * lam / params.fill_rate_per_worker)   # the fill pool never limits
    plant = PoolPlant(params, fill, inc["start_workers"],
                      PoolDynamics(startup_s=inc["startup_s"], warmup_s=cfg["warmup_s"]))
    res = plant.run(PoolScenario(_demand(inc, mu, cfg["duration_s"]), cfg["duration_s"], dt=cfg["dt"],
                                 seed=cfg["seed"], control_start_s=60.0, slo_ttft_s=cfg["slo_ttft_s"],
                                 slo_tpot_s=cfg["slo_tpot_s"]),
                    [setting.build("decode")])
    s = res.series
    after = s[s["time_s"] >= inc["step_at_s"]]
    m = res.metrics
    prov = (after["decode_workers"] + after["decode_workers_starting"]).to_numpy()
    steps = [int(prov[0])] + [int(v) for a, v in zip(prov[:-1], prov[1:]) if v != a]
    return {"peak_replicas": int(prov.max()), "sequence": " -> ".join(map(str, steps[:8])),
            "period_s": measured_cycle(s, after_s=inc["step_at_s"] + inc["startup_s"]),
            "slo_attainment": float(m["slo_attainment"]), "gpu_hours": float(m["gpu_hours"]),
            **scale_churn(res.actions, float(m["duration_s"])), "oscillating": False, "_series": s}


def _point(inc: dict, params: FluidParams, cfg: dict) -> PoolOperatingPoint:
    mu = params.decode_capacity(1)
    return PoolOperatingPoint(mu, max(inc["demand_workers"]) * mu, params.measurement_delay_s,
                              inc["startup_s"] + cfg["warmup_s"] / 2.0, params.decode_slots_per_worker,
                              params.decode_slots_per_worker / mu)


def _autoscaler_incident(name: str, inc: dict, params: FluidParams, cfg: dict, quick: bool):
    """An autoscaler incident: its settings file certified by the loop model, simulated on the pool
    model, advised over the same control plane's knobs."""
    setting = parse_control_plane(inc["file"])
    point = _point(inc, params, cfg)
    cert = certify_autoscaler(setting.build("decode"), point)
    sim = _simulate(setting, inc, params, cfg)
    series = {"current": sim.pop("_series")}

    def simulate(s, inc=inc):
        out = _simulate(s, inc, params, cfg)
        out.pop("_series")
        return out

    adv = search_settings(setting, lambda s, point=point: {"demand": certify_autoscaler(s.build("decode"), point)},
                          simulate, slo_target=cfg["slo_target"], simulated_candidates=cfg["candidates"])
    adv_cert = certify_autoscaler(adv.recommended.build("decode"), point)
    adv_sim = _simulate(adv.recommended, inc, params, cfg)
    series["advised"] = adv_sim.pop("_series")
    # the start-up peak from the pool the report starts at (the certificate's is from the floor)
    peak = predict_startup_cascade(cert.loop, inc["start_workers"])
    row, result = _pool_incident_outcome(name, inc, inc["reported"].get("sequence", "-"), cert, adv, adv_cert, sim,
                                         adv_sim, peak)
    return row, result, series


def _pool_incident_outcome(name: str, inc: dict, reported: str, cert, adv, adv_cert, sim: dict, adv_sim: dict,
                           peak: int, **extra):
    """A pool incident's table row and result block: prediction, simulation, advice, advised run."""
    pred, apred = cert.predicted_cycle, adv_cert.predicted_cycle
    result = {"source": inc["source"], "reported": inc["reported"], **extra,
              "predicted": {**cert.to_dict(), "cascade_peak_replicas": peak,
                            "cascade_from_replicas": inc["start_workers"]},
              "simulated": sim, "advice": adv.to_dict(), "advised_predicted": adv_cert.to_dict(),
              "advised_simulated": adv_sim}
    row = {"incident": name, "reported": reported,
           "predicted": (f"cycle {pred.period_s:.0f} s, {pred.low_replicas}<->{pred.high_replicas}"
                         if pred else "no cycle") + f"; start-up peak {peak}",
           "simulated": (f"cycle {sim['period_s']:.0f} s" if sim["period_s"] else "no cycle")
                        + f"; {sim['sequence']}; peak {sim['peak_replicas']}, {sim['reversals_per_hour']:.1f} rev/h",
           "advised": ", ".join(f"{k} {v['from']:g}->{v['to']:g}" for k, v in adv.changes.items()) or "(unchanged)",
           "advised predicted": ("pass" if adv_cert.passed else "fail")
                                + (f", cycle {apred.period_s:.0f} s" if apred else ", no cycle")
                                + f", peak {adv_cert.cascade_peak}",
           "advised simulated": f"peak {adv_sim['peak_replicas']}, {adv_sim['reversals_per_hour']:.1f} rev/h, "
                                f"SLO {adv_sim['slo_attainment']:.3f}, {adv_sim['gpu_hours']:.1f} GPU-h"}
    return row, result


def _admission_incident(name: str, inc: dict, params: FluidParams, cfg: dict, quick: bool):
    """Mooncake's seesaw: the settings file's early rejection on the seesaw plant the reconfiguration
    study uses (:func:`tokenfactory.reproduction.run_seesaw`); predicted by the relay
    with the prefill's delay (:func:`predict_rejection_seesaw`), advised to the same control
    plane's prediction-based rejection (sec. 7.4)."""
    from tokenfactory.controllers.early_rejection import EarlyRejection, predict_rejection_seesaw
    from tokenfactory.reproduction import SEESAW_DECODE_WORKERS, SEESAW_DEMAND_FACTOR, SEESAW_SHAPE, run_seesaw

    current = read_early_rejection(inc["file"], name)
    advised = {**current, "predictive": True}
    w = Worker.from_dict(PLANT)
    fp = FluidParams.from_workers(w, w, SEESAW_SHAPE, measurement_delay_s=params.measurement_delay_s)
    nd = SEESAW_DECODE_WORKERS
    mu, slots = fp.decode_capacity(nd), nd * fp.decode_slots_per_worker
    lam = SEESAW_DEMAND_FACTOR * mu
    age = fp.measurement_delay_s + current["sample_period"] / 2.0
    # before simulating: the relay acts through the prefill (its own load's age and half a sample
    # on top); the predictive rule sees the load the admitted work will meet, so only the age remains
    pred = predict_rejection_seesaw(lam, mu, slots, fp.fill_latency_s + age)
    adv_pred = predict_rejection_seesaw(lam, mu, slots, age)
    out, runs = run_seesaw(fp, lambda fp, slo, nf, nd: {
        "current": EarlyRejection(fill_latency_s=fp.fill_latency_s, **current),
        "advised": EarlyRejection(fill_latency_s=fp.fill_latency_s, **advised)},
        quick=quick, slo_tpot_s=cfg["slo_tpot_s"])
    # under overload no rule serves every arrival: judge what is admitted (its attainment) and what
    # the plant delivers in the SLO (goodput), against the least share that must be turned away
    must_reject = max(0.0, 1.0 - out["decode_capacity_rps"] / out["demand_rps"])
    sim, adv = ({**out[k], **_admitted_outcome(runs[k].metrics, must_reject)} for k in ("current", "advised"))

    def said(x: dict) -> str:
        return ((f"cycle {x['period_s']:.1f} s, amplitude {x['amplitude']:.3f}, fill vs decode "
                 f"{x['fill_vs_decode_phase_deg']:.0f} deg" if x["oscillating"] else "no cycle")
                + f"; {100 * x['rejected_fraction']:.0f} % rejected")

    def predicted(c) -> str:
        return f"cycle {c.period_s:.1f} s, amplitude {c.amplitude:.3f}" if c else "no cycle"

    row = {"incident": name, "reported": inc["reported"]["sequence"], "predicted": predicted(pred),
           "simulated": said(sim), "advised": "predictive false->true",
           "advised predicted": ("fail" if adv_pred else "pass") + f", {predicted(adv_pred)}",
           "advised simulated": said(adv) + f", SLO {adv['slo_attainment']:.3f} of arrivals, "
                                f"{adv['admitted_slo_attainment']:.3f} of admitted; goodput "
                                f"{sim['goodput_rps']:.2f} -> {adv['goodput_rps']:.2f} req/s"}
    result = {"source": inc["source"], "reported": inc["reported"], "settings": current,
              "plant": {k: out[k] for k in ("demand_rps", "decode_capacity_rps", "fill_workers", "decode_workers",
                                            "fill_latency_s", "slo_ttft_s")},
              "predicted": {"predicted_cycle": pred.to_dict() if pred else None},
              "simulated": {k: v for k, v in sim.items() if k != "hagglund_detections"},
              "advice": {"changes": {"predictive": {"from": False, "to": True}}},
              "advised_predicted": {"predicted_cycle": adv_pred.to_dict() if adv_pred else None,
                                    "passed": adv_pred is None},
              "advised_simulated": {k: v for k, v in adv.items() if k != "hagglund_detections"}}
    return row, result, None


def _admitted_outcome(metrics: dict, must_reject: float) -> dict:
    """An admission run judged on what it admits: the SLO attainment of the admitted requests (the
    pool model judges each arrival's cohort against the SLO when it arrives), the goodput (admitted
    requests within the SLO per second), and the rejected share beyond ``must_reject`` - the share
    the overload forces out whatever the rule (1 - capacity / demand)."""
    met = metrics["slo_attainment"] * metrics["requests"]
    admitted = metrics["requests"] - metrics["rejected"]
    rejected = metrics["rejected"] / max(metrics["requests"], 1.0)
    return {"admitted_slo_attainment": met / admitted if admitted > 0 else 1.0,
            "goodput_rps": met / metrics["duration_s"], "must_reject_fraction": must_reject,
            "rejected_beyond_needed": max(0.0, rejected - must_reject)}


class _Built:
    """A controller factory in the shape ``_simulate`` takes (``build(pool)``)."""

    def __init__(self, make):
        self.make = make

    def build(self, pool: str):
        return self.make()


def _dynamo_sla_incident(name: str, inc: dict, params: FluidParams, cfg: dict, quick: bool):
    """Dynamo PR #9294: the settings file's SLA-mode load scaling with the flat scale-down rule
    the PR replaced (:class:`~tokenfactory.controllers.dynamo_sla_scaling.DynamoSLALoadScaling`
    on the plant's pass time), predicted (:func:`predict_sla_scaling_cycle`), simulated on the pool
    model, advised over the same planner's ``load_scaling_down_sensitivity``; the consolidation-aware
    rule the PR shipped (ai-dynamo 1.4.2) beside it."""
    from tokenfactory.controllers.dynamo_sla_scaling import DynamoSLALoadScaling, predict_sla_scaling_cycle
    from tokenfactory.controllers.formats import NotModelled

    setting = parse_control_plane(inc["file"])
    if not (setting["enable_load_scaling"] and not setting["enable_throughput_scaling"]
            and setting["optimization_target"] == "sla"):
        raise NotModelled("optimization_target", "the incident's model is SLA-mode load scaling alone")
    mu = params.decode_capacity(1)
    lam = max(inc["demand_workers"]) * mu
    startup = inc["startup_s"] + cfg["warmup_s"] / 2.0

    def rule(s, aware: bool = False) -> DynamoSLALoadScaling:
        return DynamoSLALoadScaling(s["itl_ms"] / 1000.0, params.decode_step_s, params.decode_slots_per_worker,
                                    sensitivity=s["load_scaling_down_sensitivity"] / 100.0, consolidation_aware=aware,
                                    min_replicas=s["min_endpoint"], max_replicas=inc["max_replicas"],
                                    sample_period=float(s["load_adjustment_interval_seconds"]))

    n = inc["start_workers"]
    pred = predict_sla_scaling_cycle(rule(setting), n, lam, mu, startup)
    sim = _simulate(_Built(lambda: rule(setting)), inc, params, cfg)
    series = {"current": sim.pop("_series")}
    # the same planner's knob: the largest sensitivity the prediction says holds the pool
    advised, adv_pred = setting, pred
    for v in inc["sensitivities"]:
        cand = setting.with_params(load_scaling_down_sensitivity=v)
        p = predict_sla_scaling_cycle(rule(cand), n, lam, mu, startup)
        if p is None:
            advised, adv_pred = cand, None
            break
    adv_sim = _simulate(_Built(lambda: rule(advised)), inc, params, cfg)
    series["advised"] = adv_sim.pop("_series")
    fix_pred = predict_sla_scaling_cycle(rule(setting, aware=True), n, lam, mu, startup)
    fix_sim = _simulate(_Built(lambda: rule(setting, aware=True)), inc, params, cfg)
    fix_sim.pop("_series")
    sens0, sens1 = setting["load_scaling_down_sensitivity"], advised["load_scaling_down_sensitivity"]

    def said(x: dict) -> str:
        return ((f"cycle {x['period_s']:.0f} s" if x["period_s"] else "no cycle") + f"; {x['sequence']}; "
                f"{x['reversals_per_hour']:.1f} rev/h")

    row = {"incident": name, "reported": inc["reported"]["sequence"],
           "predicted": f"cycle {pred.period_s:.0f} s, {pred.low_replicas}<->{pred.high_replicas}" if pred else
                        "no cycle",
           "simulated": said(sim) + f", SLO {sim['slo_attainment']:.3f}",
           "advised": f"load_scaling_down_sensitivity {sens0}->{sens1}" if sens1 != sens0 else "(unchanged)",
           "advised predicted": "pass, no cycle" if adv_pred is None else f"fail, cycle {adv_pred.period_s:.0f} s",
           "advised simulated": said(adv_sim) + f", SLO {adv_sim['slo_attainment']:.3f}, "
                                f"{adv_sim['gpu_hours']:.1f} GPU-h"}
    result = {"source": inc["source"], "reported": inc["reported"], "settings": setting.planner_fields(),
              "predicted": {"predicted_cycle": pred.to_dict() if pred else None},
              "simulated": sim,
              "advice": {"changes": {"load_scaling_down_sensitivity": {"from": sens0, "to": sens1}}},
              "advised_predicted": {"predicted_cycle": adv_pred.to_dict() if adv_pred else None,
                                    "passed": adv_pred is None},
              "advised_simulated": adv_sim,
              "shipped_fix": {"rule": "consolidation-aware (ai-dynamo 1.4.2)",
                              "predicted_cycle": fix_pred.to_dict() if fix_pred else None, "simulated": fix_sim}}
    return row, result, series


def _planner_incident(name: str, inc: dict, params: FluidParams, cfg: dict, quick: bool):
    """Dynamo's real planner from its config file: both pools certified by the planner's loop model
    (:func:`~tokenfactory.controllers.dynamo_planner_loop.certify_planner`), simulated on the pool
    model with the real planner sizing both pools, advised over its own knobs (replays through the
    real planner)."""
    import types

    from tokenfactory.controllers.dynamo_planner_loop import certify_planner, planner_pool_loops, planner_startup_peak

    setting = parse_control_plane(inc["file"])
    mu = params.decode_capacity(1)
    lam = max(inc["demand_workers"]) * mu
    dyn = PoolDynamics(startup_s=inc["startup_s"], warmup_s=cfg["warmup_s"])

    def loops(s):
        return planner_pool_loops(s, params, demand_rps=lam, metric_delay_s=params.measurement_delay_s,
                                  startup_s=inc["startup_s"], warmup_s=cfg["warmup_s"],
                                  gpus_per_worker=dyn.gpus_per_worker)

    def certs(s):
        return {f"demand {pool}": certify_planner(lp) for pool, lp in loops(s).items()}

    def built(s):
        ctx = types.SimpleNamespace(params=params, service=None, dynamics=dyn, slo_ttft_s=cfg["slo_ttft_s"],
                                    slo_tpot_s=cfg["slo_tpot_s"], max_replicas=64)
        return _Built(lambda: s.build(None, ctx))

    def simulate(s):
        out = _simulate(built(s), inc, params, cfg)
        out.pop("_series")
        return out

    cert = certs(setting)["demand decode"]
    peak = planner_startup_peak(loops(setting)["decode"], inc["start_workers"])
    sim = _simulate(built(setting), inc, params, cfg)
    series = {"current": sim.pop("_series")}
    adv = search_settings(setting, certs, simulate, slo_target=cfg["slo_target"],
                          simulated_candidates=cfg["candidates"])
    adv_cert = certs(adv.recommended)["demand decode"]
    adv_sim = _simulate(built(adv.recommended), inc, params, cfg)
    series["advised"] = adv_sim.pop("_series")
    row, result = _pool_incident_outcome(name, inc, "-", cert, adv, adv_cert, sim, adv_sim, peak,
                                         settings=setting.planner_fields())
    return row, result, series


_RUNNERS = {"autoscaler": _autoscaler_incident, "admission": _admission_incident, "dynamo-sla": _dynamo_sla_incident,
            "dynamo-planner": _planner_incident}


def run(out_dir, quick: bool = False, config: dict | None = None) -> dict:
    """Run the study; returns what ``metrics.json`` holds."""
    cfg = resolve_study_config(CONFIG, config, quick=quick)
    rep = StudyReport("incidents", Path(out_dir), cfg)
    params = _plant()
    rows, results, series = [], {}, {}
    for name in cfg["incidents"]:
        inc = INCIDENTS[name]
        row, result, ss = _RUNNERS[inc.get("kind", "autoscaler")](name, inc, params, cfg, quick)
        rows.append(row)
        results[name] = result
        if ss:
            series[name] = ss
    table = pd.DataFrame(rows)
    rep.save_table(table, "incidents.csv", "each incident: reported, predicted, simulated, advised")
    fig = Figure(figsize=(10, 3.0 * len(series)))
    axes = fig.subplots(len(series), 1, squeeze=False)[:, 0]
    for ax, (name, ss) in zip(axes, series.items()):
        for label, s in ss.items():
            ax.step(s["time_s"] / 60.0, s["decode_workers"] + s["decode_workers_starting"], where="post",
                    label=f"{label}: provisioned")
        ax.set_title(name)
        ax.set_ylabel("decode workers")
        ax.legend(loc="upper right")
    axes[-1].set_xlabel("time (min)")
    fig.tight_layout()
    rep.save_figure(fig, "incidents.png", "provisioned decode workers (serving + starting) per incident, the "
                                          "reported setting and the advised one")
    lines = ["Each incident's own settings file on a matching plant: the loop model's prediction before any "
             "simulation, the pool model's run, and the advised setting of the same control plane.", "",
             *markdown_table(rows, list(rows[0])), ""]
    for name, r in results.items():
        p, s = r["predicted"], r["simulated"]
        pc = p["predicted_cycle"]
        if "peak_replicas" not in s:   # an admission incident: the load cycle, not a pool
            a = r["advised_simulated"]
            if pc and s["oscillating"]:
                lines.append(f"* {name}: predicted cycle {pc['period_s']:.1f} s, simulated {s['period_s']:.1f} s "
                             f"({100 * (pc['period_s'] / s['period_s'] - 1):+.0f} %); amplitude "
                             f"{pc['amplitude']:.3f} predicted, {s['amplitude']:.3f} simulated.")
            lines.append(f"* {name}: advised setting {'passes' if r['advised_predicted']['passed'] else 'fails'} the "
                         f"prediction; simulated {'oscillating' if s['oscillating'] else 'steady'} -> "
                         f"{'oscillating' if a['oscillating'] else 'steady'}, throughput {s['throughput_rps']:.2f} -> "
                         f"{a['throughput_rps']:.2f} req/s, SLO {s['slo_attainment']:.3f} -> {a['slo_attainment']:.3f} "
                         f"of arrivals (demand is {r['plant']['demand_rps'] / r['plant']['decode_capacity_rps']:.2f} x "
                         f"the decode capacity: at least {100 * a['must_reject_fraction']:.0f} % must be turned away, "
                         "and every rejection counts against that figure).")
            meets = a["admitted_slo_attainment"] >= DEFAULT_ATTAINMENT
            lines.append(f"* {name}: on admitted requests the SLO attainment is {s['admitted_slo_attainment']:.3f} -> "
                         f"{a['admitted_slo_attainment']:.3f} ({'meets' if meets else 'misses'} the "
                         f"{DEFAULT_ATTAINMENT:.2f} target), rejecting {100 * s['rejected_fraction']:.1f} -> "
                         f"{100 * a['rejected_fraction']:.1f} % ({100 * a['rejected_beyond_needed']:.1f} % beyond "
                         f"the overload's share); goodput {s['goodput_rps']:.2f} -> {a['goodput_rps']:.2f} req/s.")
            continue
        if pc and s["period_s"]:
            lines.append(f"* {name}: predicted cycle {pc['period_s']:.0f} s, simulated {s['period_s']:.0f} s "
                         f"({100 * (pc['period_s'] / s['period_s'] - 1):+.0f} %).")
        if r["reported"].get("peak_replicas"):
            lines.append(f"* {name}: reported peak {r['reported']['peak_replicas']} replicas, predicted "
                         f"{p['cascade_peak_replicas']}, simulated {s['peak_replicas']}.")
        a = r["advised_simulated"]
        if "shipped_fix" in r:
            f = r["shipped_fix"]["simulated"]
            lines.append(f"* {name}: advised setting {'passes' if r['advised_predicted']['passed'] else 'fails'} the "
                         f"prediction; simulated {s['reversals_per_hour']:.1f} -> {a['reversals_per_hour']:.1f} "
                         f"reversals/h, SLO {s['slo_attainment']:.3f} -> {a['slo_attainment']:.3f}; the rule PR #9294 "
                         f"shipped (consolidation-aware): {'no cycle' if r['shipped_fix']['predicted_cycle'] is None else 'a cycle'} "
                         f"predicted, {f['reversals_per_hour']:.1f} reversals/h and SLO {f['slo_attainment']:.3f} simulated.")
            continue
        met = r["advice"]["met_slo_target"]
        lines.append(f"* {name}: advised setting {'passes' if r['advised_predicted']['passed'] else 'fails'} the "
                     f"certificate; simulated peak {s['peak_replicas']} -> {a['peak_replicas']} workers, "
                     f"{s['reversals_per_hour']:.1f} -> {a['reversals_per_hour']:.1f} reversals/h, SLO "
                     f"{s['slo_attainment']:.3f} -> {a['slo_attainment']:.3f}"
                     + ("." if met else f" (no candidate of the grid reached the {cfg['slo_target']:.2f} target; "
                                        "this is the best attainment found)."))
    return rep.finish({"incidents": results}, lines)
