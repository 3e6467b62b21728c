"""Study `forecasting` and the `tokenfactory forecast` job: backtest demand forecasters on a rate
series, pick one, and turn its day-ahead forecasts into a capacity plan scored against what the
demand then did (GPU-hours, hours under-provisioned) next to perfect foresight and static peak
provisioning.

Run: ``tokenfactory study forecasting [--quick | --full] [--out DIR]`` (ServeGen m-large and m-small, or
the synthetic workload when the shared traces are absent), or
``tokenfactory forecast --trace NAME|PATH [--horizon 1h|1d] [--models m1,m2] [--out DIR]``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from tokenfactory.controllers import (
    DAY_S,
    FORECASTERS,
    PoolRates,
    backtest,
    hourly_peak,
    make_forecaster,
    pick_best_model,
    plan_capacity,
    score_plan,
)
from tokenfactory.controllers.analysis_plots import capacity_plan_plot, forecast_plot
from tokenfactory.plant_models import RequestShape, ServiceModel, Worker
from tokenfactory.studies.study_config import StudyVariants, resolve_study_config
from tokenfactory.studies.report import StudyReport
from tokenfactory.core.validation import ConfigError
from tokenfactory.traces import load_rate_series, trace_available

__all__ = ["CONFIG", "run", "run_forecast_job", "HORIZONS", "QUICK_MODELS", "rate_series_and_shape"]

HORIZONS = {"1h": 3600.0, "1d": DAY_S}
QUICK_MODELS = ["seasonal-naive-daily", "constant", "kalman", "holt-winters", "fourier", "ucm"]


def rate_series_and_shape(spec: str, interval_s: float = 600.0) -> tuple[pd.DataFrame, RequestShape]:
    """:func:`tokenfactory.traces.load_rate_series` with its mean request as a :class:`RequestShape`."""
    rs = load_rate_series(spec, interval_s)
    return rs.rates, RequestShape(rs.input_tokens, rs.output_tokens)


def _pool_rates(shape: RequestShape, model: str, hardware: str) -> PoolRates:
    w = Worker.from_dict({"model": model, "hardware": hardware})
    return PoolRates.from_service(ServiceModel(w, w, shape))


def _rolling_plan(y: pd.Series, model: str, quantile: str, first: int, steps: int, rates: PoolRates,
                  plan_kw: dict) -> pd.DataFrame:
    """Plan as a planner would run it: every ``steps`` (the horizon) forecast the next horizon from
    the past only (parameters re-estimated daily, state updated in between) and provision each
    hour for the hourly peak of the forecast ``quantile``."""
    dt = float(y.index[1] - y.index[0])
    refit = int(round(DAY_S / dt))
    blocks, f, last_fit, now = [], None, None, None
    for o in range(first, len(y) - steps + 1, steps):
        if f is None or f.cheap or o - last_fit >= refit:
            f, last_fit = make_forecaster(model).fit(y.iloc[:o]), o
        else:
            f.update(y.iloc[:o])
        fc = f.predict(steps)
        block = plan_capacity(hourly_peak(pd.Series(fc.quantile(quantile), index=fc.time_s)), rates,
                              initial=now, **plan_kw)
        now = {"fill": int(block["fill_workers"].iloc[-1]), "decode": int(block["decode_workers"].iloc[-1])}
        blocks.append(block)
    return pd.concat(blocks)


def run_forecast_job(series: pd.DataFrame, name: str, horizon: str, models, report: StudyReport, *,
                     test_days: float = 4.0, origin_every_s: float | None = None, plan: dict | None = None,
                     shape: RequestShape = RequestShape()) -> dict[str, Any]:
    """Backtest ``models`` at ``horizon`` on ``series``, plot, plan capacity; returns metrics."""
    if horizon not in HORIZONS:
        raise ConfigError("horizon", f"{horizon!r} is not one of {', '.join(HORIZONS)}")
    plan = {"model": "deepseek-v3", "hardware": "h200", "quantile": "upper_80", "headroom": 0.2,
            "max_moves_per_hour": 2, **(plan or {})}
    y = series["rate_rps"]
    dt = float(series.attrs.get("interval_s", y.index[1] - y.index[0]))
    steps = int(round(HORIZONS[horizon] / dt))
    every = origin_every_s or (HORIZONS[horizon] if horizon == "1h" else 6 * 3600.0)
    bt = backtest(y, list(models), steps, test_days=test_days, origin_every_s=every)
    best, why = pick_best_model(bt.metrics)
    slug = (Path(name).stem if Path(name).suffix else name).replace(":", "-")
    report.save_table(bt.metrics.reset_index(), f"backtest_{slug}_{horizon}.csv")
    fig = Figure(figsize=(11, 6.5), layout="constrained")
    axes = fig.subplots(2, 1, sharex=True)
    shown = []  # the last few non-overlapping forecasts
    for o in reversed(bt.origins):
        if len(shown) < (12 if horizon == "1h" else 3) and all(abs(o - s) >= HORIZONS[horizon] for s in shown):
            shown.append(o)
    forecast_plot(bt.points, best, origins=shown, ax=axes[0]).set_title(
        f"{name}: {horizon}-ahead backtest, best model {best} (MASE {bt.metrics.loc[best, 'mase']:.2f})")
    baseline = "seasonal-naive-daily" if "seasonal-naive-daily" in bt.metrics.index else bt.metrics.index[0]
    forecast_plot(bt.points, baseline, origins=shown, ax=axes[1], color="C1").set_title(
        f"{baseline} (MASE {bt.metrics.loc[baseline, 'mase']:.2f})")
    report.save_figure(fig, f"forecast_{slug}_{horizon}.png",
                       f"{name}, {horizon}-ahead rolling-origin forecasts with 80/95 % intervals (last origins): "
                       f"best model vs {baseline}.")
    out: dict[str, Any] = {
        "trace": name, "horizon": horizon, "horizon_steps": steps, "interval_s": dt, "test_days": test_days,
        "origins": len(bt.origins), "mase_scale": bt.scale,
        "models": {m: {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
                   for m, row in bt.metrics.to_dict(orient="index").items()},
        "best_model": best, "best_model_reason": why,
    }
    # capacity plan: day-ahead forecasts of the best model vs perfect foresight vs static peak
    rates = _pool_rates(shape, plan["model"], plan["hardware"])
    first = len(y) - int(round(test_days * DAY_S / dt))
    kw = {"headroom": plan["headroom"], "max_moves_per_hour": plan["max_moves_per_hour"]}
    planner = best
    forecast_plan = _rolling_plan(y, planner, plan["quantile"], first, steps, rates, kw)
    actual_peak = hourly_peak(y.iloc[first:]).reindex(forecast_plan.index)
    perfect = plan_capacity(actual_peak.fillna(actual_peak.median()), rates, **kw)
    static = perfect.copy()
    static["fill_workers"] = perfect["fill_workers"].max()
    static["decode_workers"] = perfect["decode_workers"].max()
    plans = {f"forecast ({planner}, {plan['quantile']})": forecast_plan, "perfect foresight": perfect,
             "static peak": static}
    scores = {k: score_plan(v, actual_peak, rates) for k, v in plans.items()}
    pool = "fill" if rates.fill_rps_per_worker < rates.decode_rps_per_worker else "decode"
    per = rates.fill_rps_per_worker if pool == "fill" else rates.decode_rps_per_worker
    ax = capacity_plan_plot(plans, actual_peak, per, pool=pool)
    ax.set_title(f"{name}: {pool} workers ({plan['model']} on 8x{plan['hardware']}), headroom "
                 f"{plan['headroom']:.0%}, at most {plan['max_moves_per_hour']} moves/h")
    report.save_figure(ax.figure, f"capacity_{slug}_{horizon}.png",
                       f"{name}: capacity plans for the {pool} pool (the binding one) against the workers "
                       "the actual hourly peak needed.")
    out["capacity_plan"] = {"request_shape": {"prompt_tokens": shape.prompt_tokens, "output_tokens": shape.output_tokens},
                            "rates": rates.to_dict(), "binding_pool": pool, **plan, "scores": scores}
    return out


def _series_for(name: str):
    if name == "synthetic" or trace_available(name):
        return rate_series_and_shape(name)
    return None


#: the study's settings: the defaults and its quick and full variants
#: (:mod:`tokenfactory.studies.study_config`)
CONFIG = StudyVariants("forecasting", {
    "traces": ["servegen:m-large", "servegen:m-small"], "horizons": ["1h", "1d"], "models": QUICK_MODELS,
    "test_days": 2.0, "origin_every_1h_s": 2 * 3600.0,
    "plan": {"model": "deepseek-v3", "hardware": "h200", "quantile": "upper_80", "headroom": 0.2,
             "max_moves_per_hour": 2}},
    quick={"origin_every_1h_s": 3 * 3600.0},
    full={"models": list(FORECASTERS), "test_days": 4.0, "origin_every_1h_s": 3600.0})


def run(out_dir: str | Path, quick: bool = False, config: dict[str, Any] | None = None,
        full: bool = False) -> dict[str, Any]:
    # Model fits dominate (ARIMA and Fourier-ARX take 5-15 s a fit, refitted daily): the default
    # variant backtests six of the forecasters over 2 days, --full all of them over 4 days.
    cfg = resolve_study_config(CONFIG, config, quick=quick, full=full)
    report = StudyReport("forecasting", Path(out_dir), cfg)
    loaded = {n: _series_for(n) for n in cfg["traces"]}
    absent = [n for n, v in loaded.items() if v is None]
    if absent:  # the embedded default: the project runs without the shared traces
        loaded = {n: v for n, v in loaded.items() if v is not None} or {"synthetic": rate_series_and_shape("synthetic")}
    results: dict[str, Any] = {}
    left_out = [m for m in FORECASTERS if m not in cfg["models"]]
    lines = [f"Traces: {', '.join(loaded)}" + (f" (absent, skipped: {', '.join(absent)})" if absent else "") + ".",
             f"Forecasters: {', '.join(cfg['models'])}"
             + (f" (not run: {', '.join(left_out)}; `tokenfactory study forecasting --full` runs every one over "
                "4 days)" if left_out else "") + ".",
             f"Rolling-origin backtests over the last {cfg['test_days']:g} days; MASE is scaled by the daily "
             "seasonal-naive in-sample error (< 1 beats it). Best model = lowest MASE among models whose 80 % "
             "intervals cover >= 70 % (capacity is sized from the upper quantile, so intervals must be honest).", ""]
    for name, (series, shape) in loaded.items():
        results[name] = {}
        for h in cfg["horizons"]:
            res = run_forecast_job(series, name, h, cfg["models"], report, test_days=cfg["test_days"],
                                   origin_every_s=cfg["origin_every_1h_s"] if h == "1h" else None,
                                   plan=cfg["plan"], shape=shape)
            results[name][h] = res
            lines += [f"### {name}, {h} ahead ({res['origins']} origins)", "",
                      "| model | MASE | sMAPE % | cov 80 | cov 95 | fit s | update s |", "|---|---|---|---|---|---|---|"]
            for m, r in res["models"].items():
                mark = " **best**" if m == res["best_model"] else ""
                upd = f"{r['update_seconds']:.3f}" if r.get("update_seconds") is not None else "-"
                lines.append(f"| {m}{mark} | {r['mase']:.3f} | {r['smape']:.1f} | {r['coverage_80']:.2f} | "
                             f"{r['coverage_95']:.2f} | {r['fit_seconds']:.3f} | {upd} |")
            cp = res["capacity_plan"]
            lines += ["", f"Capacity plan ({cp['model']} on 8x{cp['hardware']}, mean request {cp['request_shape']}, "
                          f"{cp['binding_pool']} pool binding; re-planned every {h} from {res['best_model']} "
                          f"{cp['quantile']}, headroom {cp['headroom']:.0%}, <= {cp['max_moves_per_hour']} moves/h):", "",
                      "| plan | GPU-hours | hours under-provisioned | shortfall worker-h | moves |", "|---|---|---|---|---|"]
            for pn, s in cp["scores"].items():
                lines.append(f"| {pn} | {s['gpu_hours']:.0f} | {s['under_provisioned_hours']} of {s['hours']} | "
                             f"{s['shortfall_worker_hours']:.0f} | {s['moves']} |")
            lines.append("")
    picks = {n: {h: r["best_model"] for h, r in v.items()} for n, v in results.items()}
    lines += ["### Which model to pick, and what planning buys", ""]
    for n, per_h in results.items():
        for h, r in per_h.items():
            best = r["best_model"]
            mb = r["models"][best]
            # a near-tie (MASE within 3 %) that fits at least 3x faster is worth naming
            cheaper = [m for m, row in r["models"].items() if m != best and row["mase"] <= 1.03 * mb["mase"]
                       and row["coverage_80"] >= 0.7 and row["fit_seconds"] * 3 <= mb["fit_seconds"]]
            sc = r["capacity_plan"]["scores"]
            fkey = next(k for k in sc if k.startswith("forecast"))
            f, perfect, static = sc[fkey], sc["perfect foresight"], sc["static peak"]
            save = 1 - f["gpu_hours"] / static["gpu_hours"]
            ideal = 1 - perfect["gpu_hours"] / static["gpu_hours"]
            lines.append(
                f"* {n}, {h} ahead: `{best}` - {r['best_model_reason']}"
                + (f"; `{cheaper[0]}` is within 3 % at a fraction of the fit time" if cheaper else "")
                + f". Re-planning every {h} from it uses {100 * save:+.0f} % GPU-hours vs static peak "
                f"(perfect foresight: {100 * ideal:+.0f} %), with {f['under_provisioned_hours']} of {f['hours']} hours "
                "under-provisioned" + (" - it does not beat static peak here: plan hourly, or use a narrower quantile."
                                       if save <= 0 else "."))
    for n, per_h in results.items():
        for h, r in per_h.items():
            report.headline(f"{n}, {h} ahead", r["best_model"],
                            note=f"MASE {r['models'][r['best_model']]['mase']:.3f}")
    metrics = {"traces": results, "best_models": picks, "synthetic_fallback": bool(absent) and "synthetic" in loaded,
               "absent_traces": absent}
    return report.finish(metrics, lines)
