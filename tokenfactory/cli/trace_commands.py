"""``tokenfactory traces`` and ``forecast``: list, fetch, describe, fit, synthesise traces;
backtest forecasters on one.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenfactory.core.validation import ConfigError
from tokenfactory.cli.console import print_table, parse_duration

__all__ = ["cmd_forecast", "cmd_traces"]


def cmd_forecast(args) -> int:
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


def cmd_traces(args) -> int:
    from pathlib import Path

    from tokenfactory.studies.report import to_jsonable
    from tokenfactory.traces import TRACES, trace_dirs, trace_path

    if args.action == "list":
        dirs = trace_dirs()
        print("trace folders searched: " + "; ".join(f"{d} ({'found' if d.is_dir() else 'absent'})" for d in dirs)
              + " (set TOKENFACTORY_TRACES to use another)")
        missing = []
        for name, spec in TRACES.items():
            here = trace_path(name)
            missing += [name] if here is None else []
            print(f"  {name:24s} {spec.kind:8s} {'yes' if here else 'no ':3s}  {spec.description}")
        print("  synthetic                requests yes  embedded generator (tokenfactory traces synth)")
        if missing:
            print(f"{len(missing)} of {len(TRACES)} absent: `tokenfactory traces fetch all` downloads the public ones")
        return 0
    if args.action == "fetch":
        return _traces_fetch(args)
    if args.action == "info":
        from tokenfactory.traces import load_trace, trace_info

        if not args.name:
            raise ConfigError("name", "traces info needs a trace name or path")
        info = trace_info(load_trace(args.name))
        print(json.dumps(to_jsonable(info), indent=2) if args.json else "")
        if not args.json:
            print_table({k: v for k, v in info.items()})
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
    dur = parse_duration(args.duration)
    out = Path(args.out)
    if args.kind == "rates":
        df = generate_rates(w, dur, args.interval)
        df.reset_index().to_csv(out, index=False)
    else:
        df = generate_requests(w, dur)
        df.to_csv(out, index=False)
    print(f"wrote {len(df)} rows to {out} ({args.kind}, {dur:g} s, seed {args.seed})")
    return 0


def _traces_fetch(args) -> int:
    from pathlib import Path

    from tokenfactory.traces import TRACES
    from tokenfactory.traces.fetch import TRACE_SOURCES, FetchError, fetch_dir, fetch_trace

    if not args.name:
        raise ConfigError("name", f"traces fetch needs a trace name or 'all' ({', '.join(TRACES)})")
    names = list(TRACES) if args.name == "all" else [args.name]
    if args.name != "all" and args.name not in TRACES:
        raise ConfigError("name", f"{args.name!r} is not a registered trace ({', '.join(TRACES)}, or all)")
    dest = Path(args.dir) if args.dir else fetch_dir()
    failed = derived = 0
    for name in names:
        src, rel = TRACE_SOURCES[name], TRACES[name].relative_path
        url = f"{args.mirror.rstrip('/')}/{Path(rel).name}" if args.mirror and src.url else None
        try:
            path, downloaded = fetch_trace(name, rel, dest, url=url)
        except FetchError as exc:
            if args.name != "all":
                raise
            if src.url is None:
                derived += 1
            else:
                failed += 1
            print(f"  {name}: not fetched - {str(exc).split(': ', 1)[1]}")
            continue
        print(f"  {name}: {'downloaded' if downloaded else 'already there'}, sha256 verified: {path}"
              f" (licence {src.licence})")
    if args.name == "all":
        print(f"{len(names) - failed - derived} of {len(names)} traces in {dest}"
              + (f"; {failed} failed to download (fetch them by hand, see above)" if failed else "")
              + (f"; {derived} are derived files with no upstream copy (see above)" if derived else ""))
    return 1 if failed else 0
