"""The ``tokenfactory`` command line.

Subcommands: ``describe`` (model, hardware, worker), ``margins`` (a scenario's stability
margins), ``study`` (runnable studies). Every error that
comes from a bad value is a :class:`ConfigError` and is printed as one line, exit status 2.
"""

from __future__ import annotations

import argparse
import json
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
    from studies.report import to_jsonable

    if args.what == "model":
        from plant_models import load_model

        d = load_model(args.name).summary()
    elif args.what == "hardware":
        from plant_models import load_accelerator

        d = load_accelerator(args.name).to_dict()
    else:
        from plant_models import Worker

        w = Worker.from_dict({
            "model": args.name, "hardware": args.hardware,
            "parallelism": {"tp": args.tp, "pp": args.pp, "ep": args.ep}})
        rates = w.service_rates(args.prompt_tokens, args.context_tokens)
        d = {"model": w.model.name, "hardware": w.accelerator.name, "num_gpus": w.num_gpus,
             "weight_bytes_per_gpu": w.weight_bytes_per_gpu, "kv_bytes_per_gpu": w.kv_bytes_per_gpu,
             "kv_capacity_tokens": w.kv_capacity_tokens, **rates.to_dict(),
             "decode_tokens_per_s_per_gpu": rates.decode_tokens_per_s / w.num_gpus,
             "fill_tokens_per_s_per_gpu": rates.fill_tokens_per_s / w.num_gpus}
    if args.json:
        print(json.dumps(to_jsonable(d), indent=2))
    else:
        _print_table(d)
    return 0


def _cmd_study(args) -> int:
    from pathlib import Path

    from studies import STUDIES, run_study

    names = list(STUDIES) if args.name == "all" else [args.name]
    for name in names:
        out = Path(args.out) / name if (args.name == "all" and args.out) else args.out
        result = run_study(name, out, quick=args.quick)
        where = out or Path("reports") / name
        print(f"{name}: wrote {where}/ ({result['provenance']['wall_seconds']:.1f} s)")
    return 0


def _cmd_margins(args) -> int:
    import pandas as pd

    from studies.report import to_jsonable
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
    print(f"{'all envelope points meet' if ok else 'NOT all envelope points meet'} the floors "
          f"GM >= {sc.envelope.gm_floor:g}, PM >= {sc.envelope.pm_floor_deg:g} deg"
          + ("" if ok or "limit_cycle" not in table else " (a limit cycle is predicted)"))
    return 0 if ok or not args.check else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tokenfactory", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("describe", help="derived figures of a model, an accelerator or a worker")
    d.add_argument("what", choices=["model", "hardware", "worker"])
    d.add_argument("name", help="preset name or TOML file (for worker: the model)")
    d.add_argument("--json", action="store_true", help="machine-readable output")
    d.add_argument("--hardware", default="h200", help="worker: accelerator preset or TOML")
    d.add_argument("--tp", type=int, default=1)
    d.add_argument("--pp", type=int, default=1)
    d.add_argument("--ep", type=int, default=8)
    d.add_argument("--prompt-tokens", type=int, default=2048, help="worker: nominal prompt")
    d.add_argument("--context-tokens", type=int, default=8192, help="worker: nominal decode context")
    d.set_defaults(func=_cmd_describe)

    m = sub.add_parser("margins", help="stability margins (or predicted limit cycles) of a scenario file")
    m.add_argument("scenario", help="scenario TOML (see studies/scenarios/)")
    m.add_argument("--json", action="store_true")
    m.add_argument("--check", action="store_true", help="exit 1 if any envelope point misses the floors")
    m.set_defaults(func=_cmd_margins)

    from studies import STUDIES

    s = sub.add_parser("study", help="run a study (or `all`) and write its report")
    s.add_argument("name", choices=[*STUDIES, "all"])
    s.add_argument("--out", default=None, help="output folder (default reports/<study>)")
    s.add_argument("--quick", action="store_true", help="the quick variant (fewer points)")
    s.set_defaults(func=_cmd_study)
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
