"""Overload study, section (d): the margins of the SLO-aware admission's loops over their envelope,
the describing-function check of their saturations, and its outer loop on outcomes with its
separation from the fast gate.
"""

from __future__ import annotations

import pandas as pd

from tokenfactory.core.classes import DEFAULT_CLASSES
from tokenfactory.controllers import batch_gate_loop, margin_separation, predict_batch_cycle
from tokenfactory.registry import (
    RECOMMENDED_ADMISSION,
    batch_gate_for,
    batch_gate_tuning,
    build_admission,
    flat_margin_tuning,
    margin_tuning,
    slo_admission_tuning,
)
from tokenfactory.replay import class_outputs
from tokenfactory.studies.report import StudyReport

__all__ = ["loop_margins"]


# ------------------------------------------------------------------------------------------
# (d) margins


def loop_margins(setup, cfg: dict, report: StudyReport) -> dict:
    ctx = setup.context(cfg["cluster"]["slo_ttft_s"], cfg["cluster"]["slo_tpot_s"], classes=DEFAULT_CLASSES,
                        class_outputs=class_outputs(setup.trace))
    ctrl = build_admission(RECOMMENDED_ADMISSION, ctx)
    tuning = slo_admission_tuning(ctrl, setup.plant.params.measurement_delay_s)
    gate = ctrl.batch_gate if ctrl.batch_gate is not None else batch_gate_for(ctx)
    gt = batch_gate_tuning(gate, setup.plant.params.measurement_delay_s)
    rows = []
    for name, t in tuning.items():
        for r in t.envelope:
            rows.append({"loop": f"{name} limit", **{k: r[k] for k in ("delay_factor", "gain_factor", "stable",
                                                                          "gain_margin", "lower_gain_margin",
                                                                          "phase_margin_deg", "delay_margin_s",
                                                                          "meets_floors")}})
    for r in gt.envelope:
        rows.append({"loop": "batch gate", "delay_factor": r["delay_factor"], "gain_factor": r["slope_factor"],
                     **{k: r[k] for k in ("stable", "gain_margin", "lower_gain_margin", "phase_margin_deg",
                                          "delay_margin_s", "meets_floors")}})
    table = pd.DataFrame(rows)
    report.save_table(table, "margins.csv", "Exact-delay Nyquist verdict and margins of the SLO-aware admission's "
                      "fill and decode limit loops and of the gated batch cap at every envelope point.")
    out = {}
    for name, t in tuning.items():
        w = t.worst
        out[name] = {"ki": t.ki, "tau_c_s": t.tau_c_s, "theta_s": t.theta_s, "envelope_ok": t.envelope_ok,
                     "nominal_gm": t.nominal.gain_margin, "nominal_pm_deg": t.nominal.phase_margin_deg,
                     "nominal_dm_s": t.nominal.delay_margin_s, "worst_gm": min(r["gain_margin"] for r in t.envelope),
                     "worst_pm_deg": min(abs(r["phase_margin_deg"]) for r in t.envelope),
                     "worst_dm_s": min(r["delay_margin_s"] for r in t.envelope),
                     "worst_point": {"delay_factor": w["delay_factor"], "gain_factor": w["gain_factor"]},
                     "limit_cycle": t.limit_cycle}
    out["batch_gate"] = {"gain": gt.gain, "hold_s": gt.hold_s, "theta_s": gt.theta_s, "envelope_ok": gt.envelope_ok,
                         "nominal_gm": gt.nominal.gain_margin, "nominal_pm_deg": gt.nominal.phase_margin_deg,
                         "nominal_dm_s": gt.nominal.delay_margin_s,
                         "worst_gm": min(r["gain_margin"] for r in gt.envelope),
                         "worst_pm_deg": min(abs(r["phase_margin_deg"]) for r in gt.envelope),
                         "worst_dm_s": min(r["delay_margin_s"] for r in gt.envelope),
                         "ungated_stable": gt.ungated.stable if gt.ungated else None,
                         "ungated_gm": gt.ungated.gain_margin if gt.ungated else None,
                         "ungated_cycle": gt.ungated_cycle, "gated_cycle": None}
    # the gated loop's saturation check (the ungated one's cycle is in ungated_cycle)
    cyc = predict_batch_cycle(batch_gate_loop(gt.gain, gt.hold_s, gt.theta_s), 1.0)
    out["batch_gate"]["gated_cycle"] = cyc.to_dict() if cyc else None
    # the outer loop on outcomes and its separation from the fast gate (fill-limit loop)
    ot = margin_tuning(ctx, ctrl.outer, ctrl.outcome_delay_s)
    sep = margin_separation(ot, tuning["fill"])
    d = ot.to_dict()
    out["outer"] = {"sample_period_s": ctrl.outer.sample_period_s, "ki": ot.ki, "tau_c_s": ot.tau_c_s, "theta_s": ot.theta_s, "window_s": ot.window_s,
                    "gain": ot.gain, "envelope_ok": ot.envelope_ok, "nominal_gm": ot.nominal.gain_margin,
                    "nominal_pm_deg": ot.nominal.phase_margin_deg, "nominal_dm_s": ot.nominal.delay_margin_s,
                    "worst_gm": d["worst_gm"], "worst_pm_deg": d["worst_pm_deg"], "worst_dm_s": d["worst_dm_s"],
                    "limit_cycle": None, "separation_ratio": sep.ratio, "pm_loss_deg": sep.pm_loss_deg,
                    "inner_bandwidth_rad_s": sep.inner_bandwidth_rad_s,
                    "outer_crossover_rad_s": sep.outer_crossover_rad_s, "with_fast_gate_stable": sep.real.stable}
    # its gain-scheduled start: certified at the scheduled gain around the flat region's plant gain
    ft = flat_margin_tuning(ctx, ctrl.outer, ctrl.outcome_delay_s, ctrl.outer.ki)
    fsep = margin_separation(ft, tuning["fill"])
    fd = ft.to_dict()
    out["outer_start"] = {"ki": ft.ki, "gain": ft.gain, "theta_s": ft.theta_s, "window_s": ft.window_s,
                          "envelope_ok": ft.envelope_ok, "nominal_gm": ft.nominal.gain_margin,
                          "nominal_pm_deg": ft.nominal.phase_margin_deg, "nominal_dm_s": ft.nominal.delay_margin_s,
                          "worst_gm": fd["worst_gm"], "worst_pm_deg": fd["worst_pm_deg"],
                          "worst_dm_s": fd["worst_dm_s"], "limit_cycle": None, "separation_ratio": fsep.ratio,
                          "pm_loss_deg": fsep.pm_loss_deg, "outer_crossover_rad_s": fsep.outer_crossover_rad_s,
                          "with_fast_gate_stable": fsep.real.stable}
    return out

