"""The ``tokenfactory`` command line.

Subcommands: ``describe`` (model, hardware, worker, controller kinds), ``margins`` (a scenario's stability
margins), ``certify`` (a stack scenario's certificate), ``forecast`` (backtests and a capacity plan), ``simulate`` (request-level replay),
``traces`` (list, info, fit, synth, fetch),
``study`` (runnable studies), ``report`` (the HTML report). Every error that
comes from a bad value is a :class:`ConfigError` and is printed as one line, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence

from tokenfactory.validation import ConfigError

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

    from tokenfactory.studies import STUDIES, suite_order
    from tokenfactory.studies.html import write_index
    from tokenfactory.sweep import SCHEDULER_ENV, WORKERS_ENV
    from tokenfactory.validation import ConfigError, check_int

    if args.quick and args.full:
        raise ConfigError("study", "--quick and --full are exclusive: pick one variant")
    if args.workers is not None:
        os.environ[WORKERS_ENV] = str(check_int("workers", args.workers, low=1))
    if args.scheduler:
        os.environ[SCHEDULER_ENV] = args.scheduler
    suite = args.name == "all"
    root = Path(args.out or "reports")
    names = suite_order(list(STUDIES), root) if suite else [args.name]
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
                                                  for k, v in d.items() if k != "meets_floors"))
                continue
            pt = ", ".join(f"{k}={w[k]:g}" for k in w if k.endswith("factor"))
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


def _cmd_simulate_pools(args) -> int:
    from pathlib import Path

    from tokenfactory.stack import load_stack_scenario, rate_workload, run_on_rates, scenario_dir
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
    if args.plant == "pools":
        return _cmd_simulate_pools(args)
    for flag in ("stack", "baseline", "last_days", "startup"):
        if getattr(args, flag) is not None:
            raise ConfigError(flag, "needs --plant pools")
    from pathlib import Path

    from tokenfactory.classes import DEFAULT_CLASSES, INTERACTIVE, RequestClass
    from tokenfactory.registry import ADMISSION_KINDS, AUTOSCALER_KINDS, RECOMMENDED_ADMISSION
    from tokenfactory.replay import build_replay, load_replay_scenario, run_replay
    from tokenfactory.studies.report import to_jsonable
    from tokenfactory.traces import SyntheticWorkload, generate_requests, load_trace
    from tokenfactory.validation import check_choice, check_number

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
    m, res = run_replay(trace, setup, admission, scale, cluster, autoscaler=args.autoscaler, load=load,
                        admission_params=params, batch_cap=None if batch_cap == "none" else batch_cap,
                        envelope=sc.envelope if sc else None, duration_s=sim.get("duration_s"),
                        admission_where="controller")
    tag = admission + (f"-{args.autoscaler}" if args.autoscaler else "")
    out = Path(args.out or Path("reports") / "simulate" / f"{Path(args.trace).stem.replace(':', '-')}-{tag}")
    out.mkdir(parents=True, exist_ok=True)
    slo_cap = setup.slo_capacity(res.config["cluster"]["slo_tpot_s"])
    (out / "metrics.json").write_text(json.dumps(to_jsonable({
        **m, "config": res.config, "trace": args.trace, "scenario": sc.name if sc else None,
        "bottleneck": setup.bottleneck, "capacity_rps": setup.capacity_rps,
        "slo_capacity_rps": slo_cap[0], "slo_bottleneck": slo_cap[1], "slo_batch_cap": slo_cap[2]}), indent=2) + "\n")
    res.records.to_csv(out / "requests.csv", index=False)
    res.series.to_csv(out / "series.csv", index=False)
    res.actions.to_csv(out / "actions.csv", index=False)
    keys = ("requests", "completed", "rejected", "deferred", "in_flight_end", "ttft_p50", "ttft_p99", "tpot_p50",
            "tpot_p99", "slo_attainment", "slo_attainment_admitted", "goodput_tokens_per_s", "wasted_prefill_tokens",
            "prefix_hit_ratio", "oscillating", "gpu_hours", "actions_per_hour", "wall_seconds",
            "sim_requests_per_wall_s")
    _print_table({k: m[k] for k in keys if m.get(k) is not None})
    for name, cm in m["classes"].items():
        print(f"class {name}: {cm['requests']} requests, SLO attainment {cm['slo_attainment']:.3f} "
              f"(admitted {cm['slo_attainment_admitted'] if cm['slo_attainment_admitted'] is not None else float('nan'):.3f}), "
              f"{cm['rejected']} rejected, {cm['deferred']} deferred")
    print(f"wrote {out}/ (metrics.json, requests.csv, series.csv, actions.csv)")
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
    m.add_argument("scenario", help="scenario TOML (see studies/scenarios/)")
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
                    help="offered load as a multiple of the cluster's bottleneck capacity at the TPOT SLO at the "
                         "trace's own request shape (instead of --scale; closed sessions need it)")
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
    sm.add_argument("--seed", type=int, default=0)
    sm.add_argument("--duration", default="1h", help="synthetic trace length")
    sm.add_argument("--out", default=None)
    sm.add_argument("--progress", dest="progress", action="store_true", default=None, help="force the progress bar")
    sm.add_argument("--no-progress", dest="progress", action="store_false")
    sm.add_argument("--plant", choices=["des", "pools"], default="des",
                    help="des: request simulator on a request trace; pools: the pool model on a rate series "
                         "(ServeGen aggregate format included) run by a control stack")
    sm.add_argument("--stack", default=None, help="pools: stack scenario TOML (default studies/scenarios/"
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

    t = sub.add_parser("traces", help="list, fetch, describe, fit or synthesise traces")
    t.add_argument("action", choices=["list", "info", "fit", "synth", "fetch"])
    t.add_argument("name", nargs="?", help="info/fit: registered name or path; fetch: registered name or all")
    t.add_argument("--dir", default=None, help="fetch: trace folder to store into (default $TOKENFACTORY_TRACES, "
                                               "else ~/.local/share/tokenfactory/traces)")
    t.add_argument("--mirror", default=None, help="fetch: base URL holding the files under their upstream names, "
                                                  "instead of the upstream URLs")
    t.add_argument("--json", action="store_true")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--kind", choices=["requests", "rates"], default="requests", help="synth: what to write")
    t.add_argument("--duration", default="1h", help="synth: e.g. 3600, 1h, 14d")
    t.add_argument("--interval", type=float, default=600.0, help="synth rates: window (s)")
    t.add_argument("--rate", type=float, default=None, help="synth: mean requests/s")
    t.add_argument("--agentic", type=float, default=None, help="synth: fraction of traffic in agentic sessions")
    t.add_argument("--out", default="synthetic.csv", help="synth: output CSV")
    t.set_defaults(func=_cmd_traces)

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

    r = sub.add_parser("report", help="(re)build the HTML report index.html over a folder of study reports")
    r.add_argument("dir", nargs="?", default="reports", help="folder with one sub-folder per study")
    r.set_defaults(func=_cmd_report)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"tokenfactory: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
