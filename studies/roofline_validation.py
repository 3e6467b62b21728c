"""Study `roofline-validation`: the roofline against published MoE serving measurements
(issue 13 part 1).

Thirteen published DeepSeek-V3/R1 measurements (DeepSeek's inference profile on H800, SGLang's
large-scale EP on H100 and GB200, TensorRT-LLM on B200 and H200; sources and conversions in
:data:`tokenfactory.plant_models.published_points.PUBLISHED_POINTS`) are predicted by the roofline;
the compute, memory and network efficiencies and the per-layer overhead are fitted by robust
least squares, and every point's held-out error comes from the leave-one-out fit without it.

Run: ``tokenfactory study roofline-validation [--quick] [--out DIR]``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tokenfactory.plant_models import Efficiency
from tokenfactory.plant_models.plots import validation_plot
from tokenfactory.plant_models.published_points import (
    ASSUMED_EFFICIENCY,
    EXCLUDED_SOURCES,
    FIT_PARAMETERS,
    FITTED_EFFICIENCY,
    PUBLISHED_POINTS,
    cross_validate,
    fit_efficiency,
    predict_point,
    signed_error,
)
from tokenfactory.studies.report import StudyReport
from tokenfactory.studies.study_config import StudyVariants, resolve_study_config
from tokenfactory.core.validation import ConfigError, check_int, check_number

__all__ = ["CONFIG", "DEFAULT_CONFIG", "run"]

DEFAULT_CONFIG: dict[str, Any] = {
    "starts": 4,              # optimiser starts of the fit on all points
    "seed": 0,                # generator of the random starts
    "cv_starts": 1,           # starts of each leave-one-out refit (the first is the full fit)
    "prior_weight": 0.02,     # weak pull towards the old assumptions
    "robust_scale": 0.2,      # soft-L1 scale of the log-ratio residuals
    "target_median": 0.20,    # issue 13 targets on held-out points
    "target_max": 0.40,
    "measured_runs": "",      # silicon-format file ("" = measured_runs.default_measurements_file())
    "cross_check_rows": 16,   # runs the steady-state solve is checked on against the request simulator
    "target_runs_tpot": 0.15, # issue 24 targets (leave-one-GPU-out) on the measured runs
    "target_runs_ttft": 0.20,
    "target_runs_within": 0.70,
}


def _check(cfg: dict[str, Any]) -> None:
    """The ranges of the resolved settings."""
    for k in ("starts", "cv_starts"):
        check_int(f"roofline-validation.{k}", cfg[k], low=1, high=50)
    check_int("roofline-validation.seed", cfg["seed"], low=0)
    for k in ("prior_weight", "robust_scale", "target_median", "target_max", "target_runs_tpot",
              "target_runs_ttft", "target_runs_within"):
        check_number(f"roofline-validation.{k}", cfg[k], low=0.0, low_inclusive=k == "prior_weight")
    check_int("roofline-validation.cross_check_rows", cfg["cross_check_rows"], low=0, high=10_000)
    if not isinstance(cfg["measured_runs"], str):
        raise ConfigError("roofline-validation.measured_runs", "a file path, or \"\" for the shared silicon sample")


#: the study's settings: the defaults and its quick variant (:mod:`tokenfactory.studies.study_config`)
CONFIG = StudyVariants("roofline-validation", DEFAULT_CONFIG, quick={"starts": 1, "cross_check_rows": 3}, check=_check)


def run(out_dir: str | Path, quick: bool = False, config: dict[str, Any] | None = None) -> dict[str, Any]:
    cfg = resolve_study_config(CONFIG, config, quick=quick)
    report = StudyReport("roofline-validation", Path(out_dir), cfg)
    fit, cv = _fit_published_points(cfg)
    table = _points_table(report, fit, cv, cfg)
    metrics = _published_metrics(table, fit, cv, cfg)
    lines = _published_lines(report, table, fit, cv, metrics, cfg)
    _measured_runs_section(report, cfg, quick, metrics, lines)
    return report.finish(metrics, lines)


def _fit_published_points(cfg: dict) -> tuple:
    """The fit on all published points and its leave-one-out refits."""
    kw = dict(prior_weight=cfg["prior_weight"], robust_scale=cfg["robust_scale"])
    fit = fit_efficiency(PUBLISHED_POINTS, starts=cfg["starts"], seed=cfg["seed"], **kw)
    cv = cross_validate(PUBLISHED_POINTS, full_fit=fit, starts=cfg["cv_starts"], seed=cfg["seed"], **kw)
    return fit, cv


def _points_table(report: StudyReport, fit, cv: pd.DataFrame, cfg: dict) -> pd.DataFrame:
    """Each point's in-sample and held-out error (saved with the leave-one-out fits, the excluded
    sources and the error figure)."""
    table = fit.to_pandas().drop(columns=["held_out"])
    table = table.merge(cv[["point", "predicted", "error", "abs_error"]].rename(columns={
        "predicted": "held_out_predicted", "error": "held_out_error", "abs_error": "held_out_abs_error"}),
        on="point")
    report.save_table(table, "validation_points.csv")
    report.save_table(cv, "leave_one_out.csv")
    report.save_table(pd.DataFrame(EXCLUDED_SOURCES), "excluded_sources.csv")
    ax = validation_plot(table, targets=(cfg["target_median"], cfg["target_max"]))
    ax.set_title("Roofline vs 13 published DeepSeek-V3/R1 deployments")
    report.save_figure(ax.figure, "validation_errors.png",
                       "Error of the roofline per published point: held out (leave-one-out fit), "
                       "with all points fitted, and with the old assumed efficiencies; the bands "
                       "are the issue's 20 % median and 40 % worst-case targets.")
    return table


def _published_metrics(table: pd.DataFrame, fit, cv: pd.DataFrame, cfg: dict) -> dict[str, Any]:
    """The fit, its errors held out and in sample, and the old assumptions' errors."""
    held = table["held_out_abs_error"].to_numpy()
    old = table["error_old_assumptions"].abs().to_numpy()
    worst = table.loc[table["held_out_abs_error"] > cfg["target_max"]]
    fitted = fit.params
    stored = dict(FITTED_EFFICIENCY)
    return {
        "points": len(table),
        "fitted": fitted,
        "identified": fit.identified,
        "fit_cost": fit.cost,
        "stored_fit": stored,
        "stored_fit_matches": {k: abs(fitted[k] - stored[k]) <= 0.01 * max(abs(stored[k]), 1e-6) + 1e-6
                               for k in FIT_PARAMETERS},
        "defaults": {k: getattr(Efficiency(), k) for k in FIT_PARAMETERS},
        "old_assumptions": {k: getattr(ASSUMED_EFFICIENCY, k) for k in FIT_PARAMETERS},
        "held_out_median_abs_error": float(np.median(held)),
        "held_out_max_abs_error": float(held.max()),
        "held_out_over_target_max": worst["point"].tolist(),
        "in_sample_median_abs_error": float(table["abs_error"].median()),
        "old_assumptions_median_abs_error": float(np.median(old)),
        "old_assumptions_max_abs_error": float(old.max()),
        "meets_median_target": bool(np.median(held) <= cfg["target_median"]),
        "loo_parameter_range": {k: [float(cv[f"fit_{k}"].min()), float(cv[f"fit_{k}"].max())]
                                for k in FIT_PARAMETERS},
        "table": table[["point", "hardware", "mode", "published", "predicted", "error",
                        "held_out_predicted", "held_out_error", "error_old_assumptions"]].to_dict("records"),
        "excluded_sources": [e["system"] for e in EXCLUDED_SOURCES],
    }


def _published_lines(report: StudyReport, table: pd.DataFrame, fit, cv: pd.DataFrame, metrics: dict,
                     cfg: dict) -> list[str]:
    """The headlines and the summary's lines on the published points."""
    held = table["held_out_abs_error"].to_numpy()
    worst = table.loc[table["held_out_abs_error"] > cfg["target_max"]]
    defaults = metrics["defaults"]
    f = fit.params
    report.headline("held-out median error", 100 * metrics["held_out_median_abs_error"], "%",
                    f"leave-one-out over {len(table)} published points; old assumptions "
                    f"{100 * metrics['old_assumptions_median_abs_error']:.0f} %")
    report.headline("fitted memory efficiency", f["memory"], "",
                    f"compute {f['compute']:.2f}, network {f['network']:.2f}, "
                    f"{f['layer_overhead_s'] * 1e6:.0f} us per layer")
    lines = [
        f"{len(table)} published DeepSeek-V3/R1 measurements on "
        f"{', '.join(sorted(table['hardware'].unique()))} (sources and conversions in "
        "`validation_points.csv`; {0} sources left out with the reason in `excluded_sources.csv`).".format(
            len(EXCLUDED_SOURCES)),
        "",
        f"* **Fitted efficiencies** (robust least squares on all points): compute {f['compute']:.3f}, "
        f"memory {f['memory']:.3f}, network {f['network']:.3f}, per-layer overhead "
        f"{f['layer_overhead_s'] * 1e6:.0f} us; "
        + ("every parameter is bound by the data." if all(fit.identified.values()) else
           "not bound by the data (kept near the old assumption): "
           + ", ".join(k for k, v in fit.identified.items() if not v) + ".")
        + f" The old assumptions were compute {ASSUMED_EFFICIENCY.compute}, memory "
        f"{ASSUMED_EFFICIENCY.memory}, network {ASSUMED_EFFICIENCY.network}, no overhead; "
        f"`Efficiency()` defaults are now {defaults['compute']}, {defaults['memory']}, "
        f"{defaults['network']} and {defaults['layer_overhead_s'] * 1e6:.0f} us.",
        f"* **Held-out error** (each point predicted by the fit without it): median "
        f"{100 * np.median(held):.1f} %, worst {100 * held.max():.0f} %; the target median of "
        f"{100 * cfg['target_median']:.0f} % is {'met' if metrics['meets_median_target'] else 'missed'}. "
        f"With all points fitted the median is {100 * metrics['in_sample_median_abs_error']:.1f} %; with the "
        f"old assumptions it was {100 * metrics['old_assumptions_median_abs_error']:.0f} % "
        f"(worst {100 * metrics['old_assumptions_max_abs_error']:.0f} %).",
    ]
    lines += _worst_point_lines(worst, cv, f, len(table), cfg)
    lines.append(f"* Across the leave-one-out fits compute ranges "
                 f"{metrics['loo_parameter_range']['compute'][0]:.2f}-{metrics['loo_parameter_range']['compute'][1]:.2f}, "
                 f"memory {metrics['loo_parameter_range']['memory'][0]:.2f}-{metrics['loo_parameter_range']['memory'][1]:.2f}, "
                 f"network {metrics['loo_parameter_range']['network'][0]:.2f}-{metrics['loo_parameter_range']['network'][1]:.2f}.")
    if not all(metrics["stored_fit_matches"].values()):
        lines.append("* **The stored fit (`FITTED_EFFICIENCY`) no longer matches this run's fit**: "
                     "refit and update the defaults.")
    return lines


def _worst_point_lines(worst: pd.DataFrame, cv: pd.DataFrame, fitted: dict, points: int, cfg: dict) -> list[str]:
    """The held-out points over the worst-case target, each with what the roofline leaves out."""
    if not len(worst):
        return [f"* No held-out point is worse than {100 * cfg['target_max']:.0f} %."]
    lines = [f"* **Held-out points worse than {100 * cfg['target_max']:.0f} %** "
             f"({len(worst)} of {points}), with what the roofline leaves out:"]
    loo = cv.set_index("point")
    for r in worst.itertuples():
        parts = [r.caveat] if r.caveat else []
        # a parameter the point alone pins down moves when the point is left out
        moves = {k: loo.loc[r.point, f"fit_{k}"] / fitted[k] for k in FIT_PARAMETERS if fitted[k] > 0}
        k, ratio = max(moves.items(), key=lambda kv: abs(np.log(max(kv[1], 1e-9))))
        if abs(np.log(max(ratio, 1e-9))) > np.log(1.5):
            scale = 1e6 if k.endswith("_s") else 1.0
            unit = " us" if k.endswith("_s") else ""
            parts.append(f"without it the fit moves {k} from {fitted[k] * scale:.3g}{unit} to "
                         f"{loo.loc[r.point, f'fit_{k}'] * scale:.3g}{unit}: no other point binds it")
        lines.append(f"  * `{r.point}`: {100 * r.held_out_error:+.0f} % - "
                     f"{'; '.join(parts) or 'no stated reason'}.")
    return lines


def _fmt(m: dict) -> str:
    return (f"median |error| {100 * m['median_abs_error']:.0f} %, p10 / p90 {100 * m['p10_error']:+.0f} / "
            f"{100 * m['p90_error']:+.0f} %, {100 * m['within_25pct']:.0f} % within +-25 %")


def _batch_context_lines(report: StudyReport, table: pd.DataFrame, lines: list, out: dict) -> None:
    """The last parameter set's TPOT error by batch band x context band (what a missing
    large-batch cost grows with), as a table and a sentence from its numbers."""
    from tokenfactory.plant_models import calibration as cal

    res = cal.residual_by_batch_and_context(table)
    if not len(res):
        return
    report.save_table(res, "tpot_by_batch_and_context.csv")
    big = res[res["batch_band"] == ">128"]
    out["tpot_by_batch_and_context"] = res.to_dict(orient="records")
    if len(big) < 2:
        return
    miss = big["missing_us_per_sequence"].to_numpy()
    short, long_ = miss[0], miss[-1]
    flat = short != 0 and 0.5 <= long_ / short <= 2.0
    lines.append(f"* **Above 128 sequences per rank** ({table['params'].iloc[0]} set): decode time missing per "
                 "sequence " + ", ".join(f"{v:+.0f} us at {c} tokens ({n} runs)" for v, c, n in
                                        zip(miss, big["context_band"], big["rows"]))
                 + ("; about flat in the context, the signature of a cost per sequence rather than of KV reads."
                    if flat else "; it changes with the context."))


def _measured_runs_section(report: StudyReport, cfg: dict, quick: bool, metrics: dict, lines: list) -> None:
    """The service model against the measured serving runs (issue 24): every mappable run of the
    file predicted with the pre-calibration efficiencies and with the calibrated set (closed-loop
    steady state),
    the steady-state solve checked against the request simulator on a sample."""
    from tokenfactory.plant_models import calibration as cal
    from tokenfactory.plant_models.measured_runs import default_measurements_file, read_measured_runs

    path = Path(cfg["measured_runs"]) if cfg["measured_runs"] else default_measurements_file()
    lines.append("")
    lines.append("## Measured serving runs")
    if not path.is_file():
        metrics["measured_runs"] = {"file": str(path), "present": False}
        lines.append(f"The measured-runs file `{path}` is not present (set TOKENFACTORY_MEASUREMENTS); "
                     "this section is skipped.")
        return
    runs = read_measured_runs(path)
    items = cal.training_sample(runs.runs, per_group=1, seed=cfg["seed"]) if quick else list(runs.runs)
    sets = {"pre-calibration": cal.BASE_SETTINGS}
    try:
        sets["calibrated"] = cal.calibrated_settings()
    except ImportError:
        pass
    out: dict = {"file": str(path), "present": True, "rows_read": runs.rows_read, "rows_mapped": len(runs.runs),
                 "rows_predicted": len(items), "rows_skipped_by_reason": runs.skipped, "layout_notes": runs.notes}
    tables = []
    for name, st in sets.items():
        tab, failed = cal.predict_runs(items, st, method="steady-state")
        tab["params"] = name
        tables.append(tab)
        out[name] = {**cal.error_metrics(tab), "not_predicted": failed}
    report.save_table(pd.concat(tables, ignore_index=True), "measured_runs.csv")
    split_rows = []
    for name in sets:
        for q in ("tpot", "ttft"):
            m = out[name][q]
            split_rows.append({"params": name, "quantity": q, "split": "all", "value": "all",
                               **{k: v for k, v in m.items() if not k.startswith("by_")}})
            for sp in cal.SPLITS:
                for v, mm in m.get(f"by_{sp}", {}).items():
                    split_rows.append({"params": name, "quantity": q, "split": sp, "value": v, **mm})
    report.save_table(pd.DataFrame(split_rows), "measured_runs_errors.csv")
    _batch_context_lines(report, tables[-1], lines, out)
    chk = cal.cross_check(cal.training_sample(items, per_group=1, seed=cfg["seed"] + 1)[: cfg["cross_check_rows"]],
                          sets.get("calibrated", cal.BASE_SETTINGS)) if cfg["cross_check_rows"] else pd.DataFrame()
    if len(chk):
        report.save_table(chk, "steady_state_vs_simulator.csv")
        out["cross_check"] = {"rows": int(len(chk)),
                              "tpot_ratio_median": float(chk["tpot_ratio"].median()),
                              "tpot_ratio_p90_abs_dev": float(np.percentile(np.abs(chk["tpot_ratio"] - 1), 90)),
                              "ttft_ratio_median": float(chk["ttft_ratio"].median()),
                              "ttft_ratio_p90_abs_dev": float(np.percentile(np.abs(chk["ttft_ratio"] - 1), 90)),
                              "sim_wall_s_per_run": float(chk["sim_wall_s"].mean())}
    try:
        from tokenfactory.plant_models.calibrated import CALIBRATED
        out["calibrated_cross_validated"] = CALIBRATED["cross_validated"]
    except ImportError:
        pass
    metrics["measured_runs"] = out
    best = "calibrated" if "calibrated" in sets else "pre-calibration"
    report.headline("measured runs TPOT median error", 100 * out[best]["tpot"]["median_abs_error"], "%",
                    f"{best} parameters over {len(items)} runs of {path.name}")
    lines.append(f"{runs.rows_read} rows of `{path.name}`: {len(runs.runs)} mapped to a model, GPU, precision and "
                 f"layout; not mapped: " + ", ".join(f"{k} {v}" for k, v in runs.skipped.items())
                 + f". {len(items)} runs predicted (closed-loop steady state of N clients on the run's layout).")
    for name in sets:
        for q in ("tpot", "ttft"):
            lines.append(f"* **{q.upper()}, {name}**: {_fmt(out[name][q])}.")
    cvd = out.get("calibrated_cross_validated")
    if cvd:
        for by, m in cvd.items():
            lines.append(f"* **Leave one {by} out** (calibrated set): TPOT {_fmt(m['tpot'])}; TTFT {_fmt(m['ttft'])}.")
        g = cvd.get("hardware")
        if g:
            met = (g["tpot"]["median_abs_error"] <= cfg["target_runs_tpot"]
                   and g["ttft"]["median_abs_error"] <= cfg["target_runs_ttft"]
                   and min(g["tpot"]["within_25pct"], g["ttft"]["within_25pct"]) >= cfg["target_runs_within"])
            lines.append(f"* The issue's leave-one-GPU-out targets (TPOT <= {100 * cfg['target_runs_tpot']:.0f} %, "
                         f"TTFT <= {100 * cfg['target_runs_ttft']:.0f} %, >= {100 * cfg['target_runs_within']:.0f} % "
                         f"within +-25 % each) are {'met' if met else 'not met'}.")
    if "calibrated" in sets:  # the calibrated set on the 13 published points (why it is not yet the default)
        eff = sets["calibrated"].efficiency
        pub = {p.key: float(signed_error(p, predict_point(p, eff))) for p in PUBLISHED_POINTS}
        worst = sorted(pub, key=lambda k: -abs(pub[k]))[:3]
        out["calibrated_published_points"] = {"signed_error": pub,
                                              "median_abs_error": float(np.median(np.abs(list(pub.values()))))}
        lines.append(f"* **The calibrated set on the 13 published points**: median |error| "
                     f"{100 * out['calibrated_published_points']['median_abs_error']:.1f} %; largest "
                     + ", ".join(f"`{k}` {100 * pub[k]:+.0f} %" for k in worst) + ".")
    if "cross_check" in out:
        c = out["cross_check"]
        lines.append(f"* **Steady state vs the request simulator** on {c['rows']} runs: TPOT ratio median "
                     f"{c['tpot_ratio_median']:.2f} (90 % within +-{100 * c['tpot_ratio_p90_abs_dev']:.0f} %), TTFT ratio "
                     f"median {c['ttft_ratio_median']:.2f} (90 % within +-{100 * c['ttft_ratio_p90_abs_dev']:.0f} %); "
                     f"{c['sim_wall_s_per_run']:.2f} s of simulation per run.")
