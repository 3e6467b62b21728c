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
