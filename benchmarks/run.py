"""Benchmarks: wall time of the hot paths, written as JSON (``make bench``).

Not tests: numbers depend on the machine. Each entry records what was measured and how often.
"""

from __future__ import annotations

import json
import platform
import resource
import sys
import time
from pathlib import Path

OUT = Path(__file__).parent / "results"


def _time(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _fit_predict(name: str, y, steps: int, queue) -> None:
    from controllers import make_forecaster

    t0 = time.perf_counter()
    f = make_forecaster(name).fit(y)
    t1 = time.perf_counter()
    f.predict(steps)
    queue.put((t1 - t0, time.perf_counter() - t1))


def _forecasting(budget_s: float = 120.0) -> dict:
    """Fit + predict time per model on a 14-day 10-min series and a 3-week 1-min series, each
    model in a child process killed after ``budget_s`` (a model over budget is not a default)."""
    import multiprocessing as mp

    from controllers import FORECASTERS
    from traces import SyntheticWorkload, generate_rates

    w = SyntheticWorkload(mean_rate_rps=200.0, rate_noise_cv=0.15, seed=1)
    series = {"14d_10min": (generate_rates(w, 14 * 86400.0, 600.0)["rate_rps"], 144),
              "21d_1min": (generate_rates(w, 21 * 86400.0, 60.0)["rate_rps"], 1440)}
    out: dict = {}
    ctx = mp.get_context("fork")
    for label, (y, steps) in series.items():
        out[label] = {"points": len(y), "predict_steps": steps}
        for name in FORECASTERS:
            q = ctx.Queue()
            p = ctx.Process(target=_fit_predict, args=(name, y, steps, q))
            p.start()
            p.join(budget_s)
            if p.is_alive():
                p.terminate()
                p.join()
                out[label][name] = {"over_budget_s": budget_s}
            else:
                fit_s, pred_s = q.get() if not q.empty() else (float("nan"), float("nan"))
                out[label][name] = {"fit_seconds": fit_s, "predict_seconds": pred_s}
            print(f"  {label} {name}: {out[label][name]}", file=sys.stderr)
    return out


def main() -> int:
    from controllers import admission_loop, stability_margins
    from plant_models import Worker, accelerator_preset, model_preset, simulate_loop
    from studies.feedback_oscillation import scenario_path
    from tokenfactory.scenario import load_scenario

    results = {}
    w = Worker(model_preset("deepseek-v3"), accelerator_preset("h200"))
    n = 2000
    t = _time(lambda: [w.decode(64, 8192) for _ in range(n)], 3)
    results["roofline_decode_pass"] = {"calls_per_s": n / t, "calls": n}

    t = _time(lambda: load_scenario(scenario_path("smoothed")), 3)
    results["load_and_autotune_scenario"] = {"seconds": t, "note": "roofline -> fluid params -> SIMC over 9-point envelope"}
    sc = load_scenario(scenario_path("smoothed"))
    loop = admission_loop(sc.plant, sc.controller)
    t = _time(lambda: stability_margins(loop), 5)
    results["exact_delay_margins"] = {"seconds": t}

    sim = sc.simulation
    t = _time(lambda: simulate_loop(sc.plant, sc.controller, sim, x0=sc.plant.initial_state(sc.controller.target_ready, 1000.0)), 3)
    steps = int(sim.duration_s / sim.dt) + 1
    results["fluid_closed_loop"] = {"seconds": t, "steps": steps, "steps_per_s": steps / t,
                                    "simulated_s_per_wall_s": sim.duration_s / t}
    results["forecasting"] = _forecasting()
    results["_meta"] = {"python": platform.python_version(), "machine": platform.machine(),
                        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                        "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    OUT.mkdir(exist_ok=True)
    path = OUT / "latest.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    json.dump(results, sys.stdout, indent=2)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
