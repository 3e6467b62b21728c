"""Study `incidents`: autoscaling incidents users reported, rebuilt from the configuration each
report gives, predicted before simulating, simulated, and advised.

Each incident is the control plane's own settings file (in its own format,
:mod:`tokenfactory.controllers.formats`) on a plant matching the report (DeepSeek-V3 on 8 x H200
decode workers of the pool model, the report's start-up and demand). For each:

1. **prediction** - :func:`tokenfactory.controllers.autoscaler_loops.certify_autoscaler` at the
   demand the report describes: the cycle the rule settles into (period, the two pool sizes) and
   the start-up overshoot (peak replicas asked for before new workers serve);
2. **simulation** - the pool model (:func:`tokenfactory.plant_models.pools.simulate_pools`) with
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
  behaviour (4 pods or 100 % per 15 s) behind a 5-minute start-up: the same compounding through
  ``currentReplicas`` (the deployment's, starting pods included). Reported qualitatively (the
  AIBrix RFC's "replica leakage"; Kubernetes issue discussions of slow-starting pods): no numbers.
* ``queue-length-flapping`` - an HPA on ``vllm:num_requests_waiting`` (the small-plant user's
  setting, ``../shared/cases/small-plant/hpa.yaml``) at a constant demand between one and two
  workers' capacity: an empty queue reads as idle, so the pool releases, the queue regrows, and it
  scales up again (the "need real-world threshold data" of kthena #799). Reported: none numeric.

Run: ``tokenfactory study incidents [--quick]``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from tokenfactory.advise import scale_churn, search_settings
from tokenfactory.controllers.autoscaler_loops import PoolOperatingPoint, certify_autoscaler, predict_startup_cascade
from tokenfactory.controllers.formats import parse_control_plane
from tokenfactory.plant_models import FluidParams, RequestShape, Worker
from tokenfactory.plant_models.fleet import PoolDynamics
from tokenfactory.plant_models.pools import PoolScenario, simulate_pools
from tokenfactory.studies.report import StudyReport, markdown_table
from tokenfactory.core.validation import check_number, reject_unknown_keys

__all__ = ["INCIDENTS", "DEFAULT_CONFIG", "run", "measured_cycle"]

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
}

#: SLOs of the pool model's cohort estimate: TTFT 2 s, TPOT 0.155 s (the fitted roofline runs a full KV
#: batch of DeepSeek-V3 on 8 x H200 at 0.116 s per token - the aggregation and reconfiguration
#: studies' SLO - so a pool with enough workers meets it and a short one does not)
DEFAULT_CONFIG: dict[str, Any] = {"incidents": list(INCIDENTS), "duration_s": 3 * 3600.0, "dt": 1.0, "seed": 1,
                                  "warmup_s": 30.0, "candidates": 4, "slo_target": 0.99, "slo_ttft_s": 2.0,
                                  "slo_tpot_s": 0.155}
QUICK = {"duration_s": 3600.0, "candidates": 2}


def _plant() -> FluidParams:
    w = Worker.from_dict({"model": "deepseek-v3", "hardware": "h200"})
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
    res = simulate_pools(params, fill, inc["start_workers"],
                         PoolScenario(_demand(inc, mu, cfg["duration_s"]), cfg["duration_s"], dt=cfg["dt"],
                                      seed=cfg["seed"], control_start_s=60.0, slo_ttft_s=cfg["slo_ttft_s"],
                                      slo_tpot_s=cfg["slo_tpot_s"]),
                         controllers=[setting.build("decode")],
                         dynamics=PoolDynamics(startup_s=inc["startup_s"], warmup_s=cfg["warmup_s"]))
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


def run(out_dir, quick: bool = False, config: dict | None = None) -> dict:
    """Run the study; returns what ``metrics.json`` holds."""
    config = dict(config or {})
    reject_unknown_keys("incidents", config, DEFAULT_CONFIG)
    cfg = {**DEFAULT_CONFIG, **(QUICK if quick else {}), **config}
    for name in cfg["incidents"]:
        if name not in INCIDENTS:
            from tokenfactory.core.errors import ConfigError

            raise ConfigError("incidents.incidents", f"{name!r} is not one of {', '.join(INCIDENTS)}")
    check_number("incidents.duration_s", cfg["duration_s"], low=600.0)
    rep = StudyReport("incidents", Path(out_dir), cfg)
    params = _plant()
    rows, results, series = [], {}, {}
    for name in cfg["incidents"]:
        inc = INCIDENTS[name]
        setting = parse_control_plane(inc["file"])
        point = _point(inc, params, cfg)
        cert = certify_autoscaler(setting.build("decode"), point)
        sim = _simulate(setting, inc, params, cfg)
        series[name] = {"current": sim.pop("_series")}

        def simulate(s, inc=inc):
            out = _simulate(s, inc, params, cfg)
            out.pop("_series")
            return out

        adv = search_settings(setting, lambda s, point=point: {"demand": certify_autoscaler(s.build("decode"), point)},
                              simulate, slo_target=cfg["slo_target"], simulated_candidates=cfg["candidates"])
        adv_cert = certify_autoscaler(adv.recommended.build("decode"), point)
        adv_sim = _simulate(adv.recommended, inc, params, cfg)
        series[name]["advised"] = adv_sim.pop("_series")
        pred = cert.predicted_cycle
        apred = adv_cert.predicted_cycle
        # the start-up peak from the pool the report starts at (the certificate's is from the floor)
        peak = predict_startup_cascade(cert.loop, inc["start_workers"])
        results[name] = {"source": inc["source"], "reported": inc["reported"],
                         "predicted": {**cert.to_dict(), "cascade_peak_replicas": peak,
                                       "cascade_from_replicas": inc["start_workers"]},
                         "simulated": sim, "advice": adv.to_dict(), "advised_predicted": adv_cert.to_dict(),
                         "advised_simulated": adv_sim}
        rows.append({"incident": name, "reported": inc["reported"].get("sequence", "-"),
                     "predicted": (f"cycle {pred.period_s:.0f} s, {pred.low_replicas}<->{pred.high_replicas}"
                                   if pred else "no cycle") + f"; start-up peak {peak}",
                     "simulated": (f"cycle {sim['period_s']:.0f} s" if sim["period_s"] else "no cycle")
                                  + f"; {sim['sequence']}; peak {sim['peak_replicas']}, "
                                    f"{sim['reversals_per_hour']:.1f} rev/h",
                     "advised": ", ".join(f"{k} {v['from']:g}->{v['to']:g}" for k, v in adv.changes.items()) or
                                "(unchanged)",
                     "advised predicted": ("pass" if adv_cert.passed else "fail") + (
                         f", cycle {apred.period_s:.0f} s" if apred else ", no cycle") +
                         f", peak {adv_cert.cascade_peak}",
                     "advised simulated": f"peak {adv_sim['peak_replicas']}, {adv_sim['reversals_per_hour']:.1f} rev/h, "
                                          f"SLO {adv_sim['slo_attainment']:.3f}, {adv_sim['gpu_hours']:.1f} GPU-h"})
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
        if pc and s["period_s"]:
            lines.append(f"* {name}: predicted cycle {pc['period_s']:.0f} s, simulated {s['period_s']:.0f} s "
                         f"({100 * (pc['period_s'] / s['period_s'] - 1):+.0f} %).")
        if r["reported"].get("peak_replicas"):
            lines.append(f"* {name}: reported peak {r['reported']['peak_replicas']} replicas, predicted "
                         f"{p['cascade_peak_replicas']}, simulated {s['peak_replicas']}.")
        a = r["advised_simulated"]
        met = r["advice"]["met_slo_target"]
        lines.append(f"* {name}: advised setting {'passes' if r['advised_predicted']['passed'] else 'fails'} the "
                     f"certificate; simulated peak {s['peak_replicas']} -> {a['peak_replicas']} workers, "
                     f"{s['reversals_per_hour']:.1f} -> {a['reversals_per_hour']:.1f} reversals/h, SLO "
                     f"{s['slo_attainment']:.3f} -> {a['slo_attainment']:.3f}"
                     + ("." if met else f" (no candidate of the grid reached the {cfg['slo_target']:.2f} target; "
                                        "this is the best attainment found)."))
    return rep.finish({"incidents": results}, lines)
