"""Reported misbehaviours rebuilt on the pool model, shared by the studies that show them (the
``reconfiguration`` and ``incidents`` studies): the outcome record of a run, and Mooncake's
early-rejection seesaw plant and run.

The seesaw (Mooncake, arXiv 2407.00079 sec. 7.3): long prompts, a decode pool of 2 workers offered
1.3 x its capacity, prefill sized to carry the demand; an admission rule runs at arrival and the
decode load it reads swings while the prefill delays what it admits.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from tokenfactory.controllers import assess, first_harmonic_amplitude
from tokenfactory.plant_models import FluidParams, PoolPlant, PoolScenario, RequestShape

__all__ = ["outcome_record", "phase_deg", "run_seesaw", "SEESAW_SHAPE", "SEESAW_SLO_TTFT_S", "SEESAW_DECODE_WORKERS",
           "SEESAW_DEMAND_FACTOR", "SEESAW_MIN_AMPLITUDE"]

#: long prompts, as in Mooncake's conversation trace: its measured means (../shared/traces/
#: mooncake_fast25/conversation_trace.jsonl: 12,035 input and 343 output tokens over 12,031 requests)
SEESAW_SHAPE = RequestShape(12035, 343)
#: the seesaw's long prompts take ~1.5 s to prefill alone; its TTFT SLO is 10 s (ASSUMPTION:
#: a long-context SLO of several prefill times, the regime where Mooncake's early rejection acts)
SEESAW_SLO_TTFT_S = 10.0
#: the seesaw's plant: 2 decode workers, demand 1.3 x their capacity, prefill sized to carry it
SEESAW_DECODE_WORKERS, SEESAW_DEMAND_FACTOR = 2, 1.3
#: decode-load swings (sqrt(2) x RMS, load units) below this are ripple, not a seesaw
SEESAW_MIN_AMPLITUDE = 0.02


def outcome_record(metrics: dict, report: dict, **extra) -> dict:
    """One run's outcome: the oscillation verdict and figures of ``report``
    (:meth:`~tokenfactory.controllers.oscillation.OscillationReport.to_dict`), the run's actions,
    SLO attainment, GPU-hours and rejections from ``metrics``, and ``extra``.

    Parameters
    ----------
    metrics : dict
        The run's metrics (``actions_per_hour``, ``slo_attainment``, ``gpu_hours``, ...).
    report : dict
        The run's oscillation report as a dict.
    **extra
        Further fields of the record.

    Returns
    -------
    dict
    """
    return {"oscillating": bool(report["oscillating"]), "actions_per_hour": metrics["actions_per_hour"],
            "reversals_per_hour": metrics.get("reversals_per_hour", 0.0),
            "slo_attainment": metrics["slo_attainment"], "gpu_hours": metrics["gpu_hours"],
            "rejected": metrics["rejected"], **{k: report[k] for k in (
                "thornhill_r", "decay_ratio", "forsman_h", "spectral_peak_fraction", "hagglund_detections",
                "period_s", "amplitude", "reason")}, **extra}


def phase_deg(x: np.ndarray, y: np.ndarray, dt: float, period_s: float) -> float:
    """Phase of y's fundamental relative to x's at ``period_s`` (180 = anti-phase; NaN without a period).

    Parameters
    ----------
    x, y : array
        Two signals on the same uniform grid.
    dt : float
        Their sample interval (s).
    period_s : float
        The period whose fundamental is compared (s).

    Returns
    -------
    float
        Degrees.
    """
    if not (math.isfinite(period_s) and period_s > 0):
        return math.nan
    t = np.arange(len(x)) * dt
    w = 2 * math.pi / period_s
    basis = np.column_stack([np.sin(w * t), np.cos(w * t)])

    def angle(s):
        (a, b), *_ = np.linalg.lstsq(basis, s - s.mean(), rcond=None)
        return math.atan2(b, a)

    d = math.degrees(angle(y) - angle(x)) % 360.0
    return d if d <= 180.0 else 360.0 - d


def run_seesaw(fp: FluidParams, runs: Callable[..., dict], *, quick: bool = False,
               slo_tpot_s: float = 0.155) -> tuple[dict, dict]:
    """Each admission rule of ``runs(fp, slo_ttft_s, fill_workers, decode_workers) -> {label: controller}``
    on the seesaw plant of ``fp`` (its workers at :data:`SEESAW_SHAPE`): the decode load's
    oscillation, its first harmonic, the fill load's phase against it, throughput and rejections.

    Parameters
    ----------
    fp : FluidParams
        The workers at the seesaw's request shape.
    runs : callable
        The rules to run, built for the plant.
    quick : bool
        600 s instead of 1800 s.
    slo_tpot_s : float
        TPOT SLO of the run (s).

    Returns
    -------
    tuple
        ``(outcomes by label plus the plant's figures, pool-model results by label)``.
    """
    nd = SEESAW_DECODE_WORKERS
    mu_d, mu_f = fp.decode_capacity(nd), fp.fill_rate_per_worker
    lam = SEESAW_DEMAND_FACTOR * mu_d
    nf = math.ceil(lam / mu_f)
    dt = 0.1
    slo = SEESAW_SLO_TTFT_S
    sc = PoolScenario(lam, 600.0 if quick else 1800.0, dt=dt, control_start_s=10.0, seed=3,
                      slo_ttft_s=slo, slo_tpot_s=slo_tpot_s)
    out, resps = {}, {}
    for key, ctrl in runs(fp, slo, nf, nd).items():
        r = PoolPlant(fp, nf, nd).run(sc, [ctrl])
        s = r.series
        s["decode_load"] = (s["active_decodes"] + s["ready"]) / s["decode_slots"]
        s["fill_load"] = s["fill_in_progress"] / (nf * mu_f * fp.fill_latency_s)
        after = s[s["time_s"] >= 60.0]
        rep = assess(after["decode_load"].to_numpy(), dt, min_amplitude=SEESAW_MIN_AMPLITUDE)
        phase = phase_deg(after["decode_load"].to_numpy(), after["fill_load"].to_numpy(), dt, rep.period_s) \
            if rep.oscillating else math.nan
        amp = first_harmonic_amplitude(after["decode_load"].to_numpy(), dt, rep.period_s) \
            if math.isfinite(rep.period_s) else 0.0
        out[key] = outcome_record(r.metrics, rep.to_dict(), controller=type(ctrl).__name__,
                                  throughput_rps=float(after["completion_rate"].mean()),
                                  decode_load_harmonic_amplitude=amp, fill_vs_decode_phase_deg=phase,
                                  rejected_fraction=r.metrics["rejected"] / max(r.metrics["requests"], 1.0))
        resps[key] = r
    out["demand_rps"], out["decode_capacity_rps"], out["fill_workers"], out["decode_workers"] = lam, mu_d, nf, nd
    out["fill_latency_s"], out["slo_ttft_s"] = fp.fill_latency_s, slo
    return out, resps
