"""``tokenfactory margins``, ``certify`` and ``advise``: a scenario's margins, a stack's
certificate, a control plane's file judged and tuned.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tokenfactory.cli.console import parse_duration

__all__ = ["cmd_margins", "cmd_certify", "cmd_advise"]


def cmd_margins(args) -> int:
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
    from tokenfactory.studies.report import human

    print(f"scenario {sc.name}: {type(sc.controller).__name__} ("
          + ", ".join(f"{k} {human(v)}" for k, v in sc.controller.params().items()) + ")")
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


def cmd_certify(args) -> int:
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


def cmd_advise(args) -> int:
    from pathlib import Path

    from tokenfactory.advise import advise
    from tokenfactory.replay import load_replay_scenario
    from tokenfactory.studies.report import to_jsonable
    from tokenfactory.traces import SyntheticWorkload, generate_requests, load_trace

    sc = load_replay_scenario(args.scenario)
    trace = (generate_requests(SyntheticWorkload(seed=args.seed), parse_duration(args.duration))
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
