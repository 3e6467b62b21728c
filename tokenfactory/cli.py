"""The ``tokenfactory`` command line.

Subcommands: ``describe`` (model, hardware, worker, controller kinds), ``margins`` (a scenario's stability
margins), ``certify`` (a stack scenario's certificate), ``forecast`` (backtests and a capacity plan), ``simulate`` (request-level replay),
``traces`` (list, info, fit, synth), ``calibrate`` (score or fit the service model against measured runs),
``study`` (runnable studies), ``report`` (the HTML report). Every error that
comes from a bad value is a :class:`ConfigError` and is printed as one line, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from collections.abc import Sequence

from tokenfactory.core.validation import ConfigError

__all__ = ["main", "build_parser"]


def _print_table(d: dict) -> None:
    width = max(len(k) for k in d)
    for k, v in d.items():
        if isinstance(v, float):
            v = f"{v:,.6g}" if abs(v) < 1e6 else f"{v:,.4e}"
        elif isinstance(v, int) and not isinstance(v, bool):
            v = f"{v:,}"
        elif isinstance(v, dict):
            v = ", ".join(f"{a}={b:.4g}" if isinstance(b, float) else f"{a}={b}" for a, b in v.items())
        print(f"{k:<{width}}  {v}")


def _cmd_describe(args) -> int:
    from tokenfactory.studies.report import to_jsonable

    if args.what == "kinds":
        from tokenfactory.registry import ADMISSION_KINDS, AUTOSCALER_KINDS

        rows = [{"layer": k.layer, "kind": k.name, "baseline": k.baseline, "parameters": list(k.keys),
                 "summary": k.summary} for k in (*ADMISSION_KINDS.values(), *AUTOSCALER_KINDS.values())]
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            width = max(len(r["kind"]) for r in rows)
            for r in rows:
                tag = "baseline" if r["baseline"] else "tokenfactory"
                print(f"{r['layer']:<15} {r['kind']:<{width}}  [{tag}] {r['summary']}")
        return 0
    if args.name is None:
        raise ConfigError("name", f"describe {args.what} needs a preset name or a TOML file")
    if args.what == "model":
        from tokenfactory.plant_models import load_model

        d = load_model(args.name).summary()
    elif args.what == "hardware":
        from tokenfactory.plant_models import load_accelerator

        d = load_accelerator(args.name).to_dict()
    else:
        from tokenfactory.plant_models import RequestShape, ServiceModel, Worker

        w = Worker.from_dict({
            "model": args.name, "hardware": args.hardware,
            "parallelism": {"tp": args.tp, "pp": args.pp, "ep": args.ep}})
        service = ServiceModel(w, w, RequestShape(args.prompt_tokens, args.output_tokens))
        rates = service.summary(args.context_tokens)
        d = {"model": w.model.name, "hardware": w.accelerator.name, "num_gpus": w.num_gpus,
             "weight_bytes_per_gpu": w.weight_bytes_per_gpu, "kv_bytes_per_gpu": w.kv_bytes_per_gpu,
             "kv_capacity_bytes": w.kv_capacity_bytes, **rates,
             "decode_tokens_per_s_per_gpu": rates["decode_tokens_per_s"] / w.num_gpus,
             "fill_tokens_per_s_per_gpu": rates["fill_tokens_per_s"] / w.num_gpus}
    if args.json:
        print(json.dumps(to_jsonable(d), indent=2))
    else:
        _print_table(d)
    return 0


def _run_one_study(name: str, out, quick: bool, full: bool) -> tuple[str, float]:
    """One study of ``study all`` (a process of the pool): its name and wall seconds."""
    from tokenfactory.studies import run_study

    result = run_study(name, out, quick=quick, full=full)
    return name, float(result["provenance"]["wall_seconds"])


def _cmd_study(args) -> int:
    import time
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from pathlib import Path

    from tokenfactory.studies import STUDIES, default_suite, suite_order
    from tokenfactory.studies.html import write_index
    from tokenfactory.sweep import SCHEDULER_ENV, WORKERS_ENV
    from tokenfactory.core.validation import ConfigError, check_int

    if args.quick and args.full:
        raise ConfigError("study", "--quick and --full are exclusive: pick one variant")
    if args.workers is not None:
        os.environ[WORKERS_ENV] = str(check_int("workers", args.workers, low=1))
    if args.scheduler:
        os.environ[SCHEDULER_ENV] = args.scheduler
    suite = args.name == "all"
    root = Path(args.out or "reports")
    names = suite_order(default_suite(), root) if suite else [args.name]
    jobs = check_int("jobs", args.jobs if args.jobs is not None else min(2, os.cpu_count() or 1), low=1)
    jobs = min(jobs, len(names))
    outs = {n: (root / n if suite else (Path(args.out) if args.out else Path("reports") / n)) for n in names}
    variant = "quick" if args.quick else "full" if args.full else "default"
    t0 = time.perf_counter()
    if len(names) > 1:
        print(f"{len(names)} studies ({variant} variant) on {jobs} process{'es' if jobs > 1 else ''}, "
              f"longest first: {', '.join(names)}", flush=True)

    def done(i: int, name: str, wall: float) -> None:
        prefix = f"[{i}/{len(names)}] " if len(names) > 1 else ""
        print(f"{prefix}{name}: wrote {outs[name]}/ ({wall:.1f} s, {time.perf_counter() - t0:.0f} s elapsed)",
              flush=True)

    if jobs == 1:
        for i, name in enumerate(names, 1):
            if len(names) > 1:
                print(f"  {name} ...", flush=True)
            done(i, *_run_one_study(name, outs[name], args.quick, args.full))
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(_run_one_study, n, outs[n], args.quick, args.full) for n in names]
            for i, fut in enumerate(as_completed(futures), 1):
                done(i, *fut.result())
    if suite or not args.out:  # the reports folder holds every study: refresh its page
        print(f"report: {write_index(root if suite else outs[names[0]].parent, order=list(STUDIES))}")
    return 0


def _cmd_report(args) -> int:
    from pathlib import Path

    from tokenfactory.studies import STUDIES
    from tokenfactory.studies.html import write_index

    root = Path(args.dir)
    if not root.is_dir():
        raise ConfigError("dir", f"{str(root)!r} is not a folder of study reports")
    print(f"report: {write_index(root, order=list(STUDIES))}")
    return 0


def _cmd_margins(args) -> int:
    import pandas as pd

    from tokenfactory.studies.report import to_jsonable
    from tokenfactory.scenario import load_scenario, margins_table

    sc = load_scenario(args.scenario)
    table = margins_table(sc)
    if args.json:
        out = {"scenario": sc.name, "controller": type(sc.controller).__name__,
               "controller_params": sc.controller.params(), "rows": table.to_dict(orient="records")}
        if sc.tuning is not None:
            out["tuning"] = sc.tuning.to_dict()
        print(json.dumps(to_jsonable(out), indent=2))
        return 0
    p = sc.plant
    print(f"scenario {sc.name}: {type(sc.controller).__name__} {sc.controller.params()}")
    print(f"plant: decode capacity {p.decode_capacity:.1f} req/s, fill capacity {p.fill_capacity:.1f} req/s, "
          f"fill-to-ready {p.params.fill_to_ready_s * 1e3:.0f} ms, measurement delay {p.params.measurement_delay_s:g} s")
    if sc.tuning is not None:
        t = sc.tuning
        print(f"tuning: SIMC on integrator + {t.effective_delay_s:.3f} s delay, tau_c = {t.tau_c_over_theta:g} theta, "
              f"kc = {t.gains.kc:.4g} /s, ti = {t.gains.ti:.3g} s, ready target {t.target_ready:.0f}")
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(table.round(3).to_string(index=False))
    ok = bool(table["meets_floors"].all())
    unstable = int((~table["stable"]).sum()) if "stable" in table else 0
    print(f"{'all envelope points meet' if ok else 'NOT all envelope points meet'} the floors "
          f"GM >= {sc.envelope.gm_floor:g}, PM >= {sc.envelope.pm_floor_deg:g} deg"
          + ("" if ok or "limit_cycle" not in table else " (a limit cycle is predicted)")
          + (f" ({unstable} of {len(table)} points unstable by the Nyquist count)" if unstable else ""))
    return 0 if ok or not args.check else 1


def _cmd_forecast(args) -> int:
    from pathlib import Path

    from tokenfactory.controllers import FORECASTERS
    from tokenfactory.studies.forecasting import rate_series_and_shape, run_forecast_job
    from tokenfactory.studies.report import StudyReport

    models = args.models.split(",") if args.models else list(FORECASTERS)
    for m in models:
        if m not in FORECASTERS:
            raise ConfigError("models", f"unknown model {m!r}; models are {', '.join(FORECASTERS)}")
    series, shape = rate_series_and_shape(args.trace, args.interval)
    out = Path(args.out or Path("reports") / "forecast" / args.trace.replace(":", "-").replace("/", "_"))
    cfg = {"trace": args.trace, "horizon": args.horizon, "models": models, "test_days": args.test_days,
           "plan": {"model": args.model, "hardware": args.hardware, "headroom": args.headroom,
                    "max_moves_per_hour": args.max_moves, "quantile": args.quantile}}
    report = StudyReport("forecast", out, cfg)
    res = run_forecast_job(series, args.trace, args.horizon, models, report, test_days=args.test_days,
                           plan=cfg["plan"], shape=shape)
    report.finish(res, [f"Forecast job on `{args.trace}`, {args.horizon} ahead; best model `{res['best_model']}` "
                        f"({res['best_model_reason']})."])
    print(f"{'model':24s} {'MASE':>7s} {'sMAPE%':>7s} {'cov80':>6s} {'cov95':>6s} {'fit s':>7s}")
    for m, r in res["models"].items():
        print(f"{m:24s} {r['mase']:7.3f} {r['smape']:7.1f} {r['coverage_80']:6.2f} {r['coverage_95']:6.2f} "
              f"{r['fit_seconds']:7.3f}{'  <- best' if m == res['best_model'] else ''}")
    for name, sc in res["capacity_plan"]["scores"].items():
        print(f"plan {name:34s} {sc['gpu_hours']:8.0f} GPU-h  under-provisioned {sc['under_provisioned_hours']}/{sc['hours']} h")
    print(f"wrote {out}/")
    return 0


def _cmd_traces(args) -> int:
    from pathlib import Path

    from tokenfactory.studies.report import to_jsonable
    from tokenfactory.traces import TRACES, data_dir, trace_available

    if args.action == "list":
        print(f"data folder: {data_dir()} ({'found' if data_dir().is_dir() else 'absent'}; set TOKENFACTORY_TRACES)")
        for name, spec in TRACES.items():
            print(f"  {name:24s} {spec.kind:8s} {'yes' if trace_available(name) else 'no ':3s}  {spec.description}")
        print("  synthetic               (embedded; tokenfactory traces synth)")
        return 0
    if args.action == "info":
        from tokenfactory.traces import load_trace, trace_info

        if not args.name:
            raise ConfigError("name", "traces info needs a trace name or path")
        info = trace_info(load_trace(args.name))
        print(json.dumps(to_jsonable(info), indent=2) if args.json else "")
        if not args.json:
            _print_table({k: v for k, v in info.items()})
        return 0
    if args.action == "fit":
        from tokenfactory.traces import compare_to_trace, fit_workload, generate_rates, generate_requests, load_trace

        tr = load_trace(args.name)
        w = fit_workload(tr, seed=args.seed)
        span = float(tr.index[-1] + tr.attrs.get("interval_s", 0)) if tr.attrs["kind"] == "rates" else float(tr["arrival_s"].max())
        syn = (generate_rates(w, span, tr.attrs["interval_s"]) if tr.attrs["kind"] == "rates"
               else generate_requests(w, max(span, 60.0)))
        import dataclasses

        print(json.dumps(dataclasses.asdict(w), indent=2))
        print(compare_to_trace(tr, syn).round(4).to_string(index=False))
        return 0
    # synth
    import dataclasses

    from tokenfactory.traces import SyntheticWorkload, generate_rates, generate_requests

    kw = {"seed": args.seed}
    if args.rate is not None:
        kw["mean_rate_rps"] = args.rate
    if args.agentic is not None:
        kw["agentic_fraction"] = args.agentic
    w = SyntheticWorkload(**kw)
    dur = _duration(args.duration)
    out = Path(args.out)
    if args.kind == "rates":
        df = generate_rates(w, dur, args.interval)
        df.reset_index().to_csv(out, index=False)
    else:
        df = generate_requests(w, dur)
        df.to_csv(out, index=False)
    print(f"wrote {len(df)} rows to {out} ({args.kind}, {dur:g} s, seed {args.seed})")
    return 0


def _cmd_certify(args) -> int:
    from tokenfactory.stack import certify, load_stack_scenario
    from tokenfactory.studies.report import to_jsonable

    cert = certify(load_stack_scenario(args.scenario))
    if args.json:
        print(json.dumps(to_jsonable(cert.to_dict()), indent=2))
    else:
        print(f"stack certificate: {cert.scenario}")
        for name, d in cert.layers.items():
            w = d.get("worst")
            if w is None:
                print(f"  {name:<16} " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                  for k, v in d.items() if k != "meets_floors"
                                                  and not isinstance(v, dict)))
                for k, v in d.items():  # a sub-table (the planner's correction): one line, without its note
                    if isinstance(v, dict):
                        print(f"  {'':<16}   {k}: " + ", ".join(f"{kk}={vv}" for kk, vv in v.items() if kk != "note"))
                continue
            pt = ", ".join(f"{k}={w[k]:g}" for k in w if k.endswith("factor"))
            if "control_plane" in d:   # a control plane's own file, judged by its loop model
                cyc = w["predicted_cycle_s"]
                print(f"  {name:<16} {d['control_plane']} ({d['controller']}) worst point ({pt}): "
                      + (f"predicted cycle {cyc:.0f} s" if cyc else "no predicted cycle")
                      + f", start-up peak {w['cascade_peak_replicas']} workers for {w['workers_needed']:.2f} needed "
                      f"-> {'ok' if d['meets_floors'] else 'FAILS'}")
                continue
            print(f"  {name:<16} worst point ({pt}): GM {w['gain_margin']:.3g}, PM {w['phase_margin_deg']:.1f} deg, "
                  f"delay margin {w['delay_margin_s']:.3g} s -> {'ok' if d['meets_floors'] else 'FAILS'}")
        print("  separation (outer <- inner): ratio, PM loss")
        for r in cert.separation_rows():
            loss = "feed-forward" if r["pm_loss_deg"] is None else f"{r['pm_loss_deg']:.3g} deg"
            ratio = f"{r['ratio']:10.3g}" if r["ratio"] is not None and math.isfinite(r["ratio"]) else f"{'-':>10}"
            print(f"    {r['outer']:<16} <- {r['inner']:<16} {ratio}  {loss}")
        print("  describing function:")
        for d in cert.describing_function:
            print(f"    {d['layer']}: {d['element']}: {'LIMIT CYCLE' if d['limit_cycle'] else 'no limit cycle'}")
        b = cert.binding
        print(f"  binding: {b['layer']} at " + ", ".join(f"{k}={b[k]:g}" for k in b if k.endswith("factor")))
        for f in cert.failures:
            print(f"  FAIL {f['layer']} ({f['check']}): {f['detail']}")
        print(f"verdict: {'PASSED' if cert.passed else 'FAILED'}")
    return 0 if cert.passed or not args.check else 1


def _write_json(path, data) -> None:
    from tokenfactory.studies.report import to_jsonable

    path.write_text(json.dumps(to_jsonable(data), indent=2) + "\n")


def _calibrate_settings(which: str):
    from tokenfactory.plant_models.calibration import BASE_SETTINGS, RunSettings, calibrated_settings

    return {"calibrated": calibrated_settings, "pre-calibration": lambda: BASE_SETTINGS,
            "defaults": RunSettings}[which]()


def _cmd_calibrate(args) -> int:
    """``calibrate score`` / ``calibrate fit``: the service model against a file of measured runs."""
    import time
    from pathlib import Path

    from tokenfactory.plant_models import calibration as cal
    from tokenfactory.plant_models.measured_runs import read_measured_runs
    from tokenfactory.core.validation import check_int

    t0 = time.perf_counter()
    runs = read_measured_runs(args.file)
    items = list(runs.runs)
    if args.limit is not None:
        check_int("--limit", args.limit, low=1)
        items = cal.training_sample(items, per_group=1, seed=args.seed)[: args.limit] if args.stratified \
            else items[: args.limit]
    out = Path(args.out) if args.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    if args.action == "score":
        settings = _calibrate_settings(args.params)
        table, failed = cal.predict_runs(items, settings, method=args.method)
        skipped = {**runs.skipped, **failed}
        metrics = {"file": str(args.file), "method": args.method, "params": args.params,
                   "rows_read": runs.rows_read, "rows_mapped": len(runs.runs), "rows_scored": int(len(table)),
                   "rows_not_scored_by_limit": len(runs.runs) - len(items),
                   "rows_skipped_by_reason": skipped, "layout_notes": runs.notes,
                   **cal.error_metrics(table), "settings": cal.params_of(settings),
                   "kv_precision": dict(settings.kv_precision), "wall_s": time.perf_counter() - t0}
        if out is None:
            raise ConfigError("--out", "calibrate score needs --out DIR")
        table.to_csv(out / "rows.csv", index=False)
        _write_json(out / "metrics.json", metrics)
        for q in ("tpot", "ttft"):
            m = metrics[q]
            if m.get("rows"):
                print(f"{q}: {m['rows']} rows, median |error| {m['median_abs_error']:.1%}, p10 "
                      f"{m['p10_error']:+.1%}, p90 {m['p90_error']:+.1%}, within 25 % {m['within_25pct']:.1%}")
        print(f"{len(table)} rows scored, skipped {sum(skipped.values())} ({', '.join(f'{k}: {v}' for k, v in skipped.items())}); "
              f"{metrics['wall_s']:.1f} s -> {out}")
        return 0
    report = cal.calibrate(items, per_group=args.per_group, max_nfev=args.max_nfev, cv=not args.no_cv,
                           seed=args.seed, source=str(args.file))
    if out is not None:
        _write_json(out / "fit.json", report)
    if args.write:
        path = cal.write_calibrated(report)
        print(f"wrote {path}")
    print(json.dumps({"params": report["fit"]["params"], "std_error": report["fit"]["std_error"],
                      "kv_precision": report["fit"]["kv_precision"],
                      "cv": {k: {q: {m: v[q][m] for m in ("median_abs_error", "within_25pct")} for q in ("tpot", "ttft")}
                             for k, v in report.get("cv", {}).items()}}, indent=2, default=float))
    return 0


def _cmd_simulate_pools(args) -> int:
    from pathlib import Path

    from tokenfactory.scenario import scenario_dir
    from tokenfactory.stack import load_stack_scenario, run_on_rates
    from tokenfactory.traces.rate_workloads import rate_workload
    from tokenfactory.studies.report import to_jsonable

    from tokenfactory.registry import BASELINE_STACKS

    if args.baseline and args.baseline not in BASELINE_STACKS:  # before the stack's run, not after it
        raise ConfigError("baseline", f"{args.baseline!r} is not one of {', '.join(BASELINE_STACKS)}")
    sc = load_stack_scenario(args.stack or scenario_dir() / "stack_default.toml")
    wl = rate_workload(args.trace, scale=args.rate_scale, last_days=args.last_days,
                       hours=None if args.hours is None else float(args.hours))
    keys = ("gpu_hours", "oracle_gpu_hours", "slo_attainment", "actions_per_hour", "reversals_per_hour",
            "oscillating")
    out = Path(args.out or Path("reports") / "simulate" / f"{Path(args.trace).stem.replace(':', '-')}-pools")
    out.mkdir(parents=True, exist_ok=True)
    row, res, ctrl = run_on_rates(sc, wl, startup_s=args.startup, stack="stack", seed=args.seed)
    metrics = {**{k: row[k] for k in keys}, "stack": row, "trace": args.trace, "scenario": sc.name,
               "startup_s": row["startup_s"], "config": {"stack": ctrl.params(), "pool_model": res.config}}
    res.series.to_csv(out / "series.csv", index=False)
    res.actions.to_csv(out / "actions.csv", index=False)
    if args.baseline:
        brow, bres, _ = run_on_rates(sc, wl, startup_s=args.startup, stack=args.baseline, seed=args.seed,
                                     ceiling=row["utilization_ceiling"])
        metrics["baseline"] = {"name": args.baseline, **{k: brow[k] for k in keys}, "row": brow}
        bres.series.to_csv(out / "baseline_series.csv", index=False)
    (out / "metrics.json").write_text(json.dumps(to_jsonable(metrics), indent=2) + "\n")
    _print_table({k: row[k] for k in keys})
    if args.baseline:
        print(f"baseline {args.baseline}:")
        _print_table({k: metrics["baseline"][k] for k in keys})
    print(f"wrote {out}/ (metrics.json, series.csv, actions.csv)")
    return 0


def _cmd_simulate(args) -> int:
    if args.planner_config is not None and args.plant == "pools":
        raise ConfigError("planner_config", "needs --plant des (the pools plant runs a stack scenario)")
    if args.plant == "pools":
        return _cmd_simulate_pools(args)
    for flag in ("stack", "baseline", "last_days", "startup"):
        if getattr(args, flag) is not None:
            raise ConfigError(flag, "needs --plant pools")
    from pathlib import Path

    from tokenfactory.core.classes import DEFAULT_CLASSES, INTERACTIVE, RequestClass
    from tokenfactory.registry import ADMISSION_KINDS, AUTOSCALER_KINDS, RECOMMENDED_ADMISSION
    from tokenfactory.replay import build_replay, load_replay_scenario, run_replay
    from tokenfactory.studies.report import to_jsonable
    from tokenfactory.traces import SyntheticWorkload, generate_requests, load_trace
    from tokenfactory.core.validation import check_choice, check_number

    sc = load_replay_scenario(args.scenario) if args.scenario else None
    plant = dict(sc.plant) if sc else {}
    cluster = dict(sc.cluster) if sc else {}
    sim = dict(sc.simulation) if sc else {}
    admission = args.admission or (sc.admission if sc else None) or RECOMMENDED_ADMISSION
    params = dict(sc.admission_params) if sc and admission == sc.admission else {}
    check_choice("admission", admission, ADMISSION_KINDS)
    if args.autoscaler is not None:
        check_choice("autoscaler", args.autoscaler, AUTOSCALER_KINDS)
    if args.load is not None and args.scale is not None:
        raise ConfigError("load", "give --load or --scale, not both")
    load = args.load if args.load is not None else (None if args.scale is not None else sim.get("load"))
    scale = args.scale if args.scale is not None else sim.get("scale", 1.0)
    if load is not None:
        check_number("load", load, low=0.0, low_inclusive=False)
    check_number("scale", scale, low=0.0, low_inclusive=False)
    batch_cap = args.batch_cap if args.batch_cap is not None else sim.get("batch_cap")
    if batch_cap not in (None, "static", "none"):
        batch_cap = check_number("batch_cap", float(batch_cap), low=1.0)
    cluster.setdefault("seed", args.seed)
    if "classes" not in cluster:  # the trace's classes, the interactive one at the cluster's SLO
        ttft, tpot = cluster.get("slo_ttft_s", 2.0), cluster.get("slo_tpot_s", 0.1)
        cluster["classes"] = (RequestClass(INTERACTIVE, ttft, tpot, 0),
                              *(c for c in DEFAULT_CLASSES if c.name != INTERACTIVE))
    if args.progress is not None:
        cluster["progress"] = args.progress
    trace = (generate_requests(SyntheticWorkload(seed=args.seed), _duration(args.duration))
             if args.trace == "synthetic" else load_trace(args.trace))
    setup = build_replay(trace, plant)
    scaler_params = None
    if args.planner_config is not None:
        if args.autoscaler is None:
            raise ConfigError("planner_config", "needs --autoscaler dynamo-planner")
        # the registry rejects it for a kind that takes no planner_config
        scaler_params = {"planner_config": _planner_config_file(args.planner_config)}
    scalers = None
    if args.control_plane:
        from tokenfactory.controllers.formats import read_control_plane

        if args.autoscaler:
            raise ConfigError("control_plane", "give --control-plane or --autoscaler, not both")
        scalers = [read_control_plane(args.control_plane).build(args.pool)]
    m, res = run_replay(trace, setup, admission, scale, cluster, autoscaler=args.autoscaler, load=load,
                        autoscalers=scalers, autoscaler_params=scaler_params,
                        admission_params=params, batch_cap=None if batch_cap == "none" else batch_cap,
                        envelope=sc.envelope if sc else None, duration_s=sim.get("duration_s"),
                        admission_where="controller", capacity=args.capacity, capacity_cache=args.capacity_cache)
    tag = admission + (f"-{args.autoscaler}" if args.autoscaler else "") + (
        f"-{Path(args.control_plane).stem}" if args.control_plane else "")
    out = Path(args.out or Path("reports") / "simulate" / f"{Path(args.trace).stem.replace(':', '-')}-{tag}")
    out.mkdir(parents=True, exist_ok=True)
    cap = m["capacity"]  # of the simulated cluster (its pools, SLOs, classes; events excluded)
    (out / "metrics.json").write_text(json.dumps(to_jsonable({
        **m, "config": res.config, "trace": args.trace, "scenario": sc.name if sc else None,
        "bottleneck": cap["bottleneck"], "capacity_rps": cap["kv_rps"],
        "slo_capacity_rps": cap["rps"], "slo_capacity_source": cap["source"],
        "model_capacity_rps": cap["model_rps"], "measured_capacity_rps": cap["measured_rps"],
        "slo_bottleneck": cap["bottleneck"], "slo_batch_cap": cap["batch_cap"]}), indent=2) + "\n")
    res.records.to_csv(out / "requests.csv", index=False)
    res.series.to_csv(out / "series.csv", index=False)
    res.actions.to_csv(out / "actions.csv", index=False)
    keys = ("requests", "completed", "rejected", "deferred", "in_flight_end", "ttft_p50", "ttft_p99", "tpot_p50",
            "tpot_p99", "slo_attainment", "slo_attainment_admitted", "goodput_tokens_per_s", "wasted_prefill_tokens",
            "prefix_hit_ratio", "oscillating", "churning", "gpu_hours", "actions_per_hour", "reversals_per_hour",
            "wall_seconds",
            "sim_requests_per_wall_s")
    _print_table({k: m[k] for k in keys if m.get(k) is not None})
    print(f"capacity at the SLO of {cap['cluster']['fill_workers']} fill + {cap['cluster']['decode_workers']} decode: "
          f"model {cap['model_rps']:.3f} req/s ({cap['bottleneck']}-bound, batch cap {cap['batch_cap']:.0f})"
          + (f", measured {cap['measured_rps']:.3f} req/s (open admission at {cap['measured']['target_attainment']:.3f} "
             f"SLO attainment)" if cap["measured_rps"] is not None else "")
          + (f"; --load {m['load']:g} = {m['load'] * cap['rps']:.3f} req/s" if m["load"] is not None else ""))
    for name, cm in m["classes"].items():
        print(f"class {name}: {cm['requests']} requests, SLO attainment {cm['slo_attainment']:.3f} "
              f"(admitted {cm['slo_attainment_admitted'] if cm['slo_attainment_admitted'] is not None else float('nan'):.3f}), "
              f"{cm['rejected']} rejected, {cm['deferred']} deferred")
    print(f"wrote {out}/ (metrics.json, requests.csv, series.csv, actions.csv)")
    return 0


def _planner_config_file(path: str) -> dict:
    """A Dynamo planner config file (YAML or JSON, Dynamo's own ``PlannerConfig`` fields; TOML too)."""
    from pathlib import Path

    from tokenfactory.core.validation import load_toml

    f = Path(path)
    if not f.is_file():
        raise ConfigError("planner_config", f"{path} is not a file")
    if f.suffix == ".toml":
        data = load_toml(f)
    else:
        import yaml  # JSON is YAML; PyYAML comes with the dynamo extra (Dynamo reads its configs with it)

        try:
            data = yaml.safe_load(f.read_text())
        except yaml.YAMLError as e:
            raise ConfigError("planner_config", f"{path}: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError("planner_config", f"{path} holds no table of PlannerConfig fields")
    return data


def _cmd_advise(args) -> int:
    from pathlib import Path

    from tokenfactory.advise import advise
    from tokenfactory.replay import load_replay_scenario
    from tokenfactory.studies.report import to_jsonable
    from tokenfactory.traces import SyntheticWorkload, generate_requests, load_trace

    sc = load_replay_scenario(args.scenario)
    trace = (generate_requests(SyntheticWorkload(seed=args.seed), _duration(args.duration))
             if args.trace in (None, "synthetic") else load_trace(args.trace))
    adv = advise(args.control_plane, sc, trace, pool=args.pool, seed=args.seed, slo_target=args.slo_target,
                 simulated_candidates=args.candidates)
    src = Path(args.control_plane)
    out = Path(args.out or Path("reports") / "advise" / src.stem)
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"recommended{src.suffix or '.yaml'}"
    target.write_text(adv.recommended_text(src.read_text()))
    (out / "metrics.json").write_text(json.dumps(to_jsonable(adv.to_dict()), indent=2) + "\n")
    adv.candidates.to_csv(out / "candidates.csv", index=False)
    (out / "summary.md").write_text("# Advice\n\n" + "\n\n".join(adv.summary()) + "\n")
    for line in adv.summary():
        print(line)
    print(f"wrote {target} and {out}/ (metrics.json, candidates.csv, summary.md)")
    return 0


def _duration(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        return float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)
    except (ValueError, IndexError):
        raise ConfigError("duration", f"{text!r} is not a duration like 3600, 90m, 1h or 14d") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tokenfactory", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("describe", help="derived figures of a model, an accelerator or a worker; the "
                                        "registered controller kinds")
    d.add_argument("what", choices=["model", "hardware", "worker", "kinds"])
    d.add_argument("name", nargs="?", default=None, help="preset name or TOML file (for worker: the model)")
    d.add_argument("--json", action="store_true", help="machine-readable output")
    d.add_argument("--hardware", default="h200", help="worker: accelerator preset or TOML")
    d.add_argument("--tp", type=int, default=1)
    d.add_argument("--pp", type=int, default=1)
    d.add_argument("--ep", type=int, default=8)
    d.add_argument("--prompt-tokens", type=int, default=2048, help="worker: nominal prompt")
    d.add_argument("--output-tokens", type=int, default=512, help="worker: nominal output")
    d.add_argument("--context-tokens", type=int, default=None,
                   help="worker: decode context for slots and pass time (default: the mean active context "
                        "of the prompt and output)")
    d.set_defaults(func=_cmd_describe)

    m = sub.add_parser("margins", help="stability margins (or predicted limit cycles) of a scenario file")
    m.add_argument("scenario", help="scenario TOML (see tokenfactory/scenarios/)")
    m.add_argument("--json", action="store_true")
    m.add_argument("--check", action="store_true",
                   help="exit 1 if any envelope point is unstable (Nyquist count) or misses the floors")
    m.set_defaults(func=_cmd_margins)

    f = sub.add_parser("forecast", help="backtest forecasters on a trace and plan capacity from the best")
    f.add_argument("--trace", required=True, help="registered name (tokenfactory traces list), path, or 'synthetic'")
    f.add_argument("--horizon", choices=["1h", "1d"], default="1d")
    f.add_argument("--models", default=None, help="comma-separated (default: all)")
    f.add_argument("--out", default=None)
    f.add_argument("--interval", type=float, default=600.0, help="bin width (s) for request traces")
    f.add_argument("--test-days", type=float, default=4.0)
    f.add_argument("--model", default="deepseek-v3", help="served model for the capacity plan")
    f.add_argument("--hardware", default="h200", help="worker hardware for the capacity plan")
    f.add_argument("--headroom", type=float, default=0.2)
    f.add_argument("--max-moves", type=int, default=2, help="worker moves per pool per hour")
    f.add_argument("--quantile", default="upper_80", help="mean, upper_80 or upper_95")
    f.set_defaults(func=_cmd_forecast)

    sm = sub.add_parser("simulate", help="replay a trace request by request through the cluster")
    sm.add_argument("--trace", required=True, help="registered name, path, or 'synthetic'")
    sm.add_argument("--scale", type=float, default=None, help="replay x times faster (default 1)")
    sm.add_argument("--load", type=float, default=None,
                    help="offered load as a multiple of the simulated cluster's capacity at the SLO (instead of "
                         "--scale; closed sessions need it): by default the capacity measured by bisection under "
                         "open admission (cached in --capacity-cache), see --capacity")
    sm.add_argument("--capacity", choices=["measured", "model"], default="measured",
                    help="what --load multiplies: 'measured' (open admission at the knee, bisection in the request "
                         "simulator on the cluster without its events) or 'model' (the model's estimate, no runs); "
                         "both are recorded in metrics.json")
    sm.add_argument("--capacity-cache", dest="capacity_cache", default=str(Path("reports") / "cache"),
                    help="folder of the measured capacities (one JSON per trace, plant and cluster; default "
                         "reports/cache)")
    sm.add_argument("--scenario", default=None,
                    help="TOML with [plant], [cluster], [classes], [controller], [envelope], [simulation]; every "
                         "field is used or rejected by name")
    sm.add_argument("--admission", default=None,
                    help="an admission kind (tokenfactory describe kinds); default the scenario's, else the "
                         "recommended slo-aware")
    sm.add_argument("--batch-cap", dest="batch_cap", default=None,
                    help="decode batch cap per worker at the start: 'static' (the largest batch meeting the TPOT "
                         "SLO at the nominal context), 'none' (KV memory only; default) or a number")
    sm.add_argument("--autoscaler", default=None,
                    help="an autoscaler kind sizing both pools (tokenfactory describe kinds); start-up/warm-up "
                         "from the scenario's [cluster.dynamics]")
    sm.add_argument("--planner-config", dest="planner_config", default=None,
                    help="with --autoscaler dynamo-planner: a Dynamo planner config file (YAML/JSON, Dynamo's "
                    "own PlannerConfig fields: optimization_target, load_predictor, ttft_ms, ...)")
    sm.add_argument("--control-plane", dest="control_plane", default=None,
                    help="a control plane's own settings file (Kubernetes HPA, KEDA ScaledObject, Knative Service, "
                         "Ray Serve config, AIBrix PodAutoscaler) sizing --pool with exactly its parameters")
    sm.add_argument("--pool", choices=["decode", "fill"], default="decode",
                    help="the pool --control-plane sizes (the other stays fixed)")
    sm.add_argument("--seed", type=int, default=0)
    sm.add_argument("--duration", default="1h", help="synthetic trace length")
    sm.add_argument("--out", default=None)
    sm.add_argument("--progress", dest="progress", action="store_true", default=None, help="force the progress bar")
    sm.add_argument("--no-progress", dest="progress", action="store_false")
    sm.add_argument("--plant", choices=["des", "pools"], default="des",
                    help="des: request simulator on a request trace; pools: the pool model on a rate series "
                         "(ServeGen aggregate format included) run by a control stack")
    sm.add_argument("--stack", default=None, help="pools: stack scenario TOML (default tokenfactory/scenarios/"
                                                  "stack_default.toml)")
    sm.add_argument("--startup", type=float, default=None, help="pools: worker start-up (s), overrides the scenario")
    sm.add_argument("--last-days", type=float, default=None, help="pools: run the last N days (the days before "
                                                                  "are the planner's history)")
    sm.add_argument("--hours", type=float, default=None, help="pools: run only the first N hours")
    sm.add_argument("--rate-scale", type=float, default=1.0, help="pools: multiply the rates")
    sm.add_argument("--baseline", default=None, help="pools: also run a baseline deployment (tokenfactory.registry."
                                                     "BASELINE_STACKS)")
    sm.set_defaults(func=_cmd_simulate)

    ce = sub.add_parser("certify", help="the stack certificate of a stack scenario: margins, separation, "
                                        "describing functions, verdict")
    ce.add_argument("scenario", help="stack scenario TOML or a shipped name (stack_default)")
    ce.add_argument("--json", action="store_true")
    ce.add_argument("--check", action="store_true", help="exit 1 if any floor fails")
    ce.set_defaults(func=_cmd_certify)

    ad = sub.add_parser("advise", help="certify a control plane's own settings file (Kubernetes HPA, KEDA, Knative, "
                                       "Ray Serve, AIBrix) on a scenario, search its knobs, simulate, and write the "
                                       "recommended file in the same format")
    ad.add_argument("--control-plane", dest="control_plane", required=True, help="the settings file (YAML)")
    ad.add_argument("--scenario", required=True, help="the plant and cluster (the simulate scenario TOML)")
    ad.add_argument("--trace", default=None, help="requests to replay: registered name, path, or 'synthetic' "
                                                  "(default)")
    ad.add_argument("--pool", choices=["decode", "fill"], default="decode", help="the pool the control plane sizes")
    ad.add_argument("--slo-target", dest="slo_target", type=float, default=None,
                    help="SLO attainment the recommendation must reach (default 0.99)")
    ad.add_argument("--candidates", type=int, default=6, help="certified candidates replayed (default 6)")
    ad.add_argument("--duration", default="1h", help="synthetic trace length")
    ad.add_argument("--seed", type=int, default=0)
    ad.add_argument("--out", default=None, help="output folder (default reports/advise/<file>)")
    ad.set_defaults(func=_cmd_advise)

    t = sub.add_parser("traces", help="list, describe, fit or synthesise traces")
    t.add_argument("action", choices=["list", "info", "fit", "synth"])
    t.add_argument("name", nargs="?", help="info/fit: registered name or path")
    t.add_argument("--json", action="store_true")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--kind", choices=["requests", "rates"], default="requests", help="synth: what to write")
    t.add_argument("--duration", default="1h", help="synth: e.g. 3600, 1h, 14d")
    t.add_argument("--interval", type=float, default=600.0, help="synth rates: window (s)")
    t.add_argument("--rate", type=float, default=None, help="synth: mean requests/s")
    t.add_argument("--agentic", type=float, default=None, help="synth: fraction of traffic in agentic sessions")
    t.add_argument("--out", default="synthetic.csv", help="synth: output CSV")
    t.set_defaults(func=_cmd_traces)

    ca = sub.add_parser("calibrate", help="score the service model against measured serving runs, or fit it to them")
    ca.add_argument("action", choices=["score", "fit"])
    ca.add_argument("file", help="silicon-format CSV, a TOML of [[points]], or `published`")
    ca.add_argument("--out", default=None, help="score: folder for metrics.json and rows.csv; fit: for fit.json")
    ca.add_argument("--method", choices=["des", "steady-state"], default="des",
                    help="score: the request simulator (default) or the closed-loop steady-state solve")
    ca.add_argument("--params", choices=["defaults", "pre-calibration", "calibrated"], default="defaults",
                    help="score: Efficiency() defaults, the efficiencies before issue 24 (the 13-point fit), "
                         "or the calibrated set with its TTFT terms (plant_models/calibrated.py)")
    ca.add_argument("--limit", type=int, default=None, help="only the first N mapped runs (a quick subset)")
    ca.add_argument("--stratified", action="store_true", help="--limit: one run per group first (GPU, engine, "
                                                               "model, mode, batch band)")
    ca.add_argument("--seed", type=int, default=0)
    ca.add_argument("--per-group", type=int, default=3, help="fit: training runs per group")
    ca.add_argument("--max-nfev", type=int, default=40, help="fit: residual evaluations per optimisation")
    ca.add_argument("--no-cv", action="store_true", help="fit: skip the cross-validation")
    ca.add_argument("--write", action="store_true", help="fit: write the calibrated set (plant_models/calibrated.py)")
    ca.set_defaults(func=_cmd_calibrate)

    from tokenfactory.studies import STUDIES

    s = sub.add_parser("study", help="run a study (or `all`) and write its report")
    s.add_argument("name", choices=[*STUDIES, "all"])
    s.add_argument("--out", default=None, help="output folder (default reports/<study>)")
    s.add_argument("--quick", action="store_true", help="the quick variant (fewest points; what the tests run)")
    s.add_argument("--full", action="store_true",
                   help="the heavy grids (more models, longer runs); the default is what `make run` runs")
    s.add_argument("--jobs", type=int, default=None,
                   help="`study all`: studies run in N processes at once (default min(2, CPUs))")
    s.add_argument("--workers", type=int, default=None,
                   help="run the studies' grids on a local Dask cluster of N worker processes")
    s.add_argument("--scheduler", default=None,
                   help="run the studies' grids on an existing Dask cluster (scheduler address, e.g. "
                        "tcp://10.0.0.5:8786; or set TOKENFACTORY_DASK_SCHEDULER)")
    s.set_defaults(func=_cmd_study)

    em = sub.add_parser("emulate", help="serve an OpenAI-compatible engine emulator timed by the request simulator")
    em.add_argument("--scenario", required=True, help="live scenario TOML (studies/scenarios/live_small.toml)")
    em.add_argument("--port", type=int, default=8000)
    em.add_argument("--host", default="127.0.0.1")
    em.set_defaults(func=_cmd_emulate)

    gw = sub.add_parser("gateway", help="an admission gateway (reverse proxy) running the scenario's controller")
    gw.add_argument("--upstream", action="append", required=True, help="engine base URL (repeatable)")
    gw.add_argument("--scenario", required=True, help="live scenario TOML")
    gw.add_argument("--port", type=int, default=8080)
    gw.add_argument("--host", default="127.0.0.1")
    gw.add_argument("--request-log", default=None, help="append one JSON line per finished request to this file")
    gw.add_argument("--open", action="store_true", help="admit everything (measure and log only: identification runs)")
    gw.set_defaults(func=_cmd_gateway)

    for name, helptext in (("diagnose", "oscillation diagnosis of a deployment's metrics (Prometheus or a file)"),
                           ("identify", "fit delays, service rates and the admission gain from recorded metrics")):
        q = sub.add_parser(name, help=helptext)
        q.add_argument("--prometheus", default=None, help="Prometheus base URL")
        q.add_argument("--start", type=float, default=None, help="unix seconds")
        q.add_argument("--end", type=float, default=None, help="unix seconds")
        q.add_argument("--step", type=float, default=1.0, help="query resolution (s)")
        q.add_argument("--metrics", default=None, help="saved query_range JSON or CSV instead of --prometheus")
        q.add_argument("--engine", default="vllm", choices=["vllm", "sglang", "dynamo"])
        q.add_argument("--out", default=None, help="folder for the report / scenario files")
        q.add_argument("--json", action="store_true")
        if name == "diagnose":
            q.add_argument("--skip", type=float, default=0.0, help="seconds of start-up transient to leave out")
            q.set_defaults(func=_cmd_diagnose)
        else:
            q.add_argument("--scenario", default=None, help="the live scenario the data came from (modelled rates, "
                           "the plant written into the identified scenario)")
            q.add_argument("--requests", default=None, help="the gateway's request log (--request-log): the metric "
                           "delay is fitted on its exact in-flight count")
            q.set_defaults(func=_cmd_identify)

    r = sub.add_parser("report", help="(re)build the HTML report index.html over a folder of study reports")
    r.add_argument("dir", nargs="?", default="reports", help="folder with one sub-folder per study")
    r.set_defaults(func=_cmd_report)
    return p


def _cmd_emulate(args) -> int:
    from aiohttp import web

    from tokenfactory.live.emulator import emulator_app
    from tokenfactory.live.live_scenario import load_live_scenario

    sc = load_live_scenario(args.scenario)
    print(f"emulating {sc.name} ({sc.live['model_name']}) on http://{args.host}:{args.port}", flush=True)
    web.run_app(emulator_app(sc), host=args.host, port=args.port, print=None, access_log=None)
    return 0


def _cmd_gateway(args) -> int:
    from aiohttp import web

    from tokenfactory.live.gateway import gateway_app
    from tokenfactory.live.live_scenario import load_live_scenario

    sc = load_live_scenario(args.scenario)
    kind = sc.replay.admission or "open"
    print(f"gateway {sc.name} ({kind}) on http://{args.host}:{args.port} -> {', '.join(args.upstream)}", flush=True)
    web.run_app(gateway_app(sc, args.upstream, request_log=args.request_log, open_gate=args.open), host=args.host,
                port=args.port,
                print=None, access_log=None)
    return 0


def _live_signals(args, queries=None):
    from tokenfactory.live.diagnose import read_metrics_file, read_prometheus

    if (args.prometheus is None) == (args.metrics is None):
        raise ConfigError("prometheus", "give --prometheus URL (with --start and --end) or --metrics FILE")
    if args.metrics is not None:
        return read_metrics_file(args.metrics, engine=args.engine)
    if args.start is None or args.end is None:
        raise ConfigError("start", "--prometheus needs --start and --end (unix seconds)")
    return read_prometheus(args.prometheus, args.start, args.end, step=args.step, engine=args.engine, queries=queries)


def _cmd_diagnose(args) -> int:
    from pathlib import Path

    from tokenfactory.live.diagnose import diagnose

    d = diagnose(_live_signals(args), skip_start_s=args.skip)
    text = d.to_markdown()
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "diagnosis.md").write_text(text)
        (out / "diagnosis.json").write_text(json.dumps(d.to_dict(), indent=2, default=float))
    print(json.dumps(d.to_dict(), indent=2, default=float) if args.json else text)
    return 0


def _cmd_identify(args) -> int:
    from tokenfactory.live.diagnose import read_metrics_file
    from tokenfactory.live.identify import identify, read_raw_prometheus, write_scenarios
    from tokenfactory.live.live_scenario import load_live_scenario, saturated_rate

    sc = load_live_scenario(args.scenario) if args.scenario else None
    modelled = saturated_rate(sc) if sc is not None else None
    if (args.prometheus is None) == (args.metrics is None):
        raise ConfigError("prometheus", "give --prometheus URL (with --start and --end) or --metrics FILE")
    if args.metrics is not None:
        data = read_metrics_file(args.metrics, engine=args.engine)
    elif args.start is None or args.end is None:
        raise ConfigError("start", "--prometheus needs --start and --end (unix seconds)")
    else:
        data = read_raw_prometheus(args.prometheus, args.start, args.end)
    log = None
    if args.requests:
        import pandas as pd

        try:
            log = pd.read_json(args.requests, lines=True)
        except ValueError as e:
            raise ConfigError("requests", f"{args.requests}: not a JSON-lines request log ({e})") from None
        log = log[log["status"] == "completed"]
    ident = identify(data, modelled_service_rate=modelled, request_log=log)
    if args.out:
        plant = dict(sc.replay.plant) if sc is not None else {"model": "deepseek-v3", "hardware": "h200"}
        if sc is not None:
            plant.update(fill_workers=sc.cluster.fill_workers, decode_workers=sc.cluster.decode_workers,
                         prompt_tokens=sc.live["prompt_tokens"], output_tokens=sc.live["output_tokens"])
        paths = write_scenarios(ident, plant, args.out, slo=(sc.cluster.slo_ttft_s, sc.cluster.slo_tpot_s) if sc
                                else (2.0, 0.1))
        print("wrote " + ", ".join(str(p) for p in paths.values()), file=sys.stderr)
    print(json.dumps(ident.to_dict(), indent=2, default=float) if args.json else ident.to_pandas().to_string(index=False))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"tokenfactory: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
