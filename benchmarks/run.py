"""Benchmarks: wall time of the hot paths, written as JSON (``make bench``).

Not tests: numbers depend on the machine. Each entry records what was measured and how often.
``python -m benchmarks.run des`` runs only the request simulator's entry and prints it (nothing
written), for before/after comparisons of a change.
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
    from tokenfactory.controllers import make_forecaster

    t0 = time.perf_counter()
    f = make_forecaster(name).fit(y)
    t1 = time.perf_counter()
    f.predict(steps)
    queue.put((t1 - t0, time.perf_counter() - t1))


def _forecasting(budget_s: float = 120.0) -> dict:
    """Fit + predict time per model on a 14-day 10-min series and a 3-week 1-min series, each
    model in a child process killed after ``budget_s`` (a model over budget is not a default)."""
    import multiprocessing as mp

    from tokenfactory.controllers import FORECASTERS
    from tokenfactory.traces import SyntheticWorkload, generate_rates

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


def _des_child(queue) -> None:
    from tokenfactory.plant_models import ClusterConfig, DESParams, Worker, accelerator_preset, model_preset, simulate
    from tokenfactory.registry import build_admission
    from tokenfactory.replay import build_replay
    from tokenfactory.traces import SyntheticWorkload, generate_requests, load_trace, scale_trace, trace_available

    if trace_available("azure-conv-2023"):
        name, tr = "azure-conv-2023 x4", scale_trace(load_trace("azure-conv-2023"), 4.0)
    else:
        name, tr = "synthetic (azure-conv-like) x4", generate_requests(SyntheticWorkload(mean_rate_rps=22.0, seed=1), 900)
    w = Worker(model_preset("deepseek-v3"), accelerator_preset("h200"))
    p = DESParams.from_workers(w, w)
    out = {"trace": name, "workers": "8 fill + 8 decode"}
    for label, ctrl in (("open", None), ("smoothed", "smoothed")):
        c = build_admission(ctrl, build_replay(tr, {"fill_workers": 8, "decode_workers": 8}).context()) if ctrl else None
        t0 = time.perf_counter()
        r = simulate(tr, p, ClusterConfig(fill_workers=8, decode_workers=8, progress=False), c)
        wall = time.perf_counter() - t0
        out[label] = {"requests": r.metrics["requests"], "wall_seconds": wall,
                      "sim_requests_per_wall_s": r.metrics["requests"] / wall}
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # the peer, measured in the same process right after: raw simpy on an M/M/c queue, the floor
    # cost of a process-per-customer simpy model (DistServe's simulator is built this way)
    out["simpy_mmc"] = _simpy_mmc()
    out["open"]["ratio_to_simpy_mmc"] = out["open"]["sim_requests_per_wall_s"] / out["simpy_mmc"]["customers_per_wall_s"]
    out["smoothed"]["ratio_to_simpy_mmc"] = (out["smoothed"]["sim_requests_per_wall_s"]
                                             / out["simpy_mmc"]["customers_per_wall_s"])
    queue.put(out)


def _simpy_mmc(customers: int = 50_000, servers: int = 8, load: float = 0.8, seed: int = 1) -> dict:
    """Raw simpy: Poisson arrivals, a ``simpy.Resource`` of ``servers``, exponential service, one
    process per customer - the least a simpy queueing model can do per customer."""
    import numpy as np
    import simpy

    rng = np.random.default_rng(seed)
    inter = rng.exponential(1.0 / (load * servers), customers)
    service = rng.exponential(1.0, customers)
    env = simpy.Environment()
    res = simpy.Resource(env, capacity=servers)
    done = [0]

    def customer(i):
        with res.request() as req:
            yield req
            yield env.timeout(service[i])
        done[0] += 1

    def source():
        for i in range(customers):
            yield env.timeout(inter[i])
            env.process(customer(i))

    env.process(source())
    t0 = time.perf_counter()
    env.run()
    wall = time.perf_counter() - t0
    return {"customers": done[0], "servers": servers, "load": load, "wall_seconds": wall,
            "customers_per_wall_s": done[0] / wall}


def _des() -> dict:
    """Request simulator speed on the Azure conversation trace at 4x, 8 fill + 8 decode workers
    (issue floors: 5,000, then 20,000 simulated requests per wall-second), in a child process for
    its own peak RSS."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_des_child, args=(q,))
    p.start()
    p.join()
    return q.get()


def _pool_day() -> dict:
    """A day of a two-pool cluster under the hysteretic controllers at dt = 0.25 s (the
    reconfiguration study's ServeGen setting)."""
    from tokenfactory.controllers import HystereticPoolController
    from tokenfactory.plant_models import FluidParams, PoolScenario, RequestShape, Worker, simulate_pools

    w = Worker.from_dict({"model": "deepseek-v3", "hardware": "h200"})
    fp = FluidParams.from_workers(w, w, RequestShape(914, 155))
    rate = 1000.0
    ctrls = [HystereticPoolController.tuned(p, mu, rate, startup_s=120.0)
             for p, mu in (("fill", fp.fill_rate_per_worker), ("decode", fp.decode_capacity(1)))]
    sc = PoolScenario(rate, 86400.0, dt=0.25, seed=1)
    t0 = time.perf_counter()
    simulate_pools(fp, 10, 4, sc, controllers=ctrls)
    t = time.perf_counter() - t0
    steps = int(sc.duration_s / sc.dt) + 1
    return {"seconds": t, "steps": steps, "steps_per_s": steps / t, "simulated_s_per_wall_s": sc.duration_s / t}


def _pool_fortnight() -> dict:
    """14 days of the pool model at dt = 1 s under the hysteretic controllers (issue 14: < 10 s)."""
    from tokenfactory.controllers import HystereticPoolController
    from tokenfactory.plant_models import FluidParams, PoolScenario, RequestShape, Worker, simulate_pools

    w = Worker.from_dict({"model": "deepseek-v3", "hardware": "h200"})
    fp = FluidParams.from_workers(w, w, RequestShape(914, 155))
    rate = 1000.0
    ctrls = [HystereticPoolController.tuned(p, mu, rate, startup_s=120.0)
             for p, mu in (("fill", fp.fill_rate_per_worker), ("decode", fp.decode_capacity(1)))]
    sc = PoolScenario(rate, 14 * 86400.0, dt=1.0, seed=1)
    t0 = time.perf_counter()
    simulate_pools(fp, 10, 4, sc, controllers=ctrls)
    t = time.perf_counter() - t0
    steps = int(sc.duration_s / sc.dt) + 1
    return {"seconds": t, "steps": steps, "steps_per_s": steps / t, "simulated_s_per_wall_s": sc.duration_s / t}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["des"]:
        json.dump(_des(), sys.stdout, indent=2)
        print()
        return 0
    from tokenfactory.controllers import admission_loop, stability_margins
    from tokenfactory.plant_models import Worker, accelerator_preset, model_preset, simulate_loop
    from tokenfactory.studies.feedback_oscillation import scenario_path
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
    results["pool_model_day"] = _pool_day()
    print(f"  pool model: {results['pool_model_day']}", file=sys.stderr)
    results["pool_model_14_days_1s"] = _pool_fortnight()
    print(f"  pool model, 14 days: {results['pool_model_14_days_1s']}", file=sys.stderr)
    results["request_simulator"] = _des()
    print(f"  request simulator: {results['request_simulator']}", file=sys.stderr)
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
