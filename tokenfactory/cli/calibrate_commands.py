"""``tokenfactory calibrate``: score the service model against measured runs, or fit it to them."""

from __future__ import annotations

import json
from pathlib import Path

from tokenfactory.core.validation import ConfigError
from tokenfactory.cli.console import write_json

__all__ = ["cmd_calibrate"]


def cmd_calibrate(args) -> int:
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
        settings = cal.parameter_set(args.params, "--params")
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
        write_json(out / "metrics.json", metrics)
        for q in ("tpot", "ttft"):
            m = metrics[q]
            if m.get("rows"):
                print(f"{q}: {m['rows']} rows, median |error| {m['median_abs_error']:.1%}, p10 "
                      f"{m['p10_error']:+.1%}, p90 {m['p90_error']:+.1%}, within 25 % {m['within_25pct']:.1%}")
        print(f"{len(table)} rows scored, skipped {sum(skipped.values())} ({', '.join(f'{k}: {v}' for k, v in skipped.items())}); "
              f"{metrics['wall_s']:.1f} s -> {out}")
        return 0
    report = cal.calibrate(items, per_group=args.per_group, max_nfev=args.max_nfev, cv=not args.no_cv,
                           seed=args.seed, source=str(args.file), jobs=args.jobs, fixed=args.fix or (),
                           two_stage=args.fit_mode != "joint", alternations=args.alternations,
                           joint_first=args.fit_mode == "joint-two-stage")
    report["provenance"]["command"] = (f"tokenfactory calibrate fit FILE --per-group {args.per_group} --max-nfev "
                                       f"{args.max_nfev} --fit-mode {args.fit_mode}"
                                       + (f" --alternations {args.alternations}" if args.fit_mode != "joint" else "")
                                       + (" --no-cv" if args.no_cv else "")
                                       + "".join(f" --fix {n}" for n in args.fix or ()) + " --write")
    if out is not None:
        write_json(out / "fit.json", report)
    if args.write:
        path = cal.write_calibrated(report)
        print(f"wrote {path}")
    print(json.dumps({"params": report["fit"]["params"], "std_error": report["fit"]["std_error"],
                      "kv_precision": report["fit"]["kv_precision"],
                      "cv": {k: {q: {m: v[q][m] for m in ("median_abs_error", "within_25pct")} for q in ("tpot", "ttft")}
                             for k, v in report.get("cv", {}).items()}}, indent=2, default=float))
    return 0
