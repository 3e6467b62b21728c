"""Benchmarks: wall time of the hot paths, written as JSON (``make bench``).

Not tests: numbers depend on the machine. Each entry records what was measured and how often.
``python -m benchmarks.run des`` runs only the request simulator's entry and prints it (nothing
written), for before/after comparisons of a change; ``python -m benchmarks.run whole-trace
[--traces ...] [--loads ...] [--policies ...]`` runs issue 21's whole-trace grid (or a piece of it)
into ``results/whole_trace.json``; ``python -m benchmarks.run margins envelope
sweeps overload gateway cross-simulator`` runs only those sections and merges them into the existing results.
"""

from __future__ import annotations

import json
import os
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


def _overload(loads=(0.9, 1.3, 2.0), replay_s: float = 120.0) -> dict:
    """Issue 11's targets on one trace in the request simulator: azure-conv-2023 (the synthetic
    stand-in without trace data) at ``loads`` x the capacity at the SLO, about ``replay_s`` s of
    arrivals per run, the SLO-aware gate next to Mooncake's early rejection (current and predicted
    load) and open admission - goodput (SLO-meeting output tokens per second of the arrival window,
    as the overload study counts it), admitted SLO and wasted prefill per policy, the new gate's
    goodput as a ratio to the best baseline's at the same load, and the wall time of each run (the
    first run of a policy includes building and tuning its controller)."""
    from tokenfactory.core.classes import DEFAULT_CLASSES
    from tokenfactory.registry import DEFAULT_TPOT_FRACTION, RECOMMENDED_ADMISSION
    from tokenfactory.replay import build_replay, run_replay
    from tokenfactory.traces import (
        SyntheticWorkload,
        generate_requests,
        load_trace,
        spread_quantized_arrivals,
        trace_available,
    )

    if trace_available("azure-conv-2023"):
        name, tr = "azure-conv-2023", spread_quantized_arrivals(load_trace("azure-conv-2023"), seed=0)
    else:
        name, tr = "synthetic (azure-conv-like)", generate_requests(SyntheticWorkload(mean_rate_rps=5.0, seed=1), 1800)
    setup = build_replay(tr)
    cap = setup.slo_capacity(0.1, DEFAULT_TPOT_FRACTION)[0]
    rate = len(tr) / max(float(tr["arrival_s"].max()), 1e-9)
    policies = ("open", "mooncake", "mooncake-predictive", RECOMMENDED_ADMISSION)
    out: dict = {"trace": name, "capacity_rps": cap, "replay_s": replay_s, "loads": {}}
    for load in loads:
        window = tr[tr["arrival_s"] < replay_s * load * cap / rate]
        row = {}
        for pol in policies:
            t0 = time.perf_counter()
            m, res = run_replay(window, setup, pol, load=load, batch_cap="static",
                                cluster={"slo_ttft_s": 2.0, "slo_tpot_s": 0.1, "drain_s": 200.0,
                                         "classes": DEFAULT_CLASSES})
            # the simulator divides by the whole run (drain included); the study by the arrival window
            arr = res.records["arrival_s"]
            goodput = m["goodput_tokens_per_s"] * m["duration_s"] / max(float(arr.max() - arr.min()), 1.0)
            row[pol] = {"goodput_tokens_per_s": goodput, "slo_attainment": m["slo_attainment"],
                        "slo_attainment_admitted": m["slo_attainment_admitted"],
                        "wasted_prefill_fraction": m["wasted_prefill_fraction"], "requests": m["requests"],
                        "wall_seconds": time.perf_counter() - t0}
        best = max((row[p]["goodput_tokens_per_s"], p) for p in policies if p != RECOMMENDED_ADMISSION)
        row["new_over_best_baseline_goodput"] = row[RECOMMENDED_ADMISSION]["goodput_tokens_per_s"] / best[0] \
            if best[0] > 0 else None
        row["best_baseline"] = best[1]
        row["new_wall_over_mooncake_wall"] = row[RECOMMENDED_ADMISSION]["wall_seconds"] / row["mooncake"]["wall_seconds"]
        out["loads"][str(load)] = row
    base = out["loads"][str(loads[0])][RECOMMENDED_ADMISSION]["goodput_tokens_per_s"]
    out["no_collapse_ratio"] = {str(x): out["loads"][str(x)][RECOMMENDED_ADMISSION]["goodput_tokens_per_s"] / base
                                for x in loads[1:]} if base > 0 else None
    return out


def _pool_day() -> dict:
    """A day of a two-pool cluster under the hysteretic controllers at dt = 0.25 s (the
    reconfiguration study's ServeGen setting)."""
    from tokenfactory.controllers import HystereticPoolController
    from tokenfactory.plant_models import FluidParams, PoolPlant, PoolScenario, RequestShape, Worker

    w = Worker.from_dict({"model": "deepseek-v3", "hardware": "h200"})
    fp = FluidParams.from_workers(w, w, RequestShape(914, 155))
    rate = 1000.0
    ctrls = [HystereticPoolController.tuned(p, mu, rate, startup_s=120.0)
             for p, mu in (("fill", fp.fill_rate_per_worker), ("decode", fp.decode_capacity(1)))]
    sc = PoolScenario(rate, 86400.0, dt=0.25, seed=1)
    t0 = time.perf_counter()
    PoolPlant(fp, 10, 4).run(sc, ctrls)
    t = time.perf_counter() - t0
    steps = int(sc.duration_s / sc.dt) + 1
    return {"seconds": t, "steps": steps, "steps_per_s": steps / t, "simulated_s_per_wall_s": sc.duration_s / t}


def _pool_fortnight() -> dict:
    """14 days of the pool model at dt = 1 s under the hysteretic controllers (issue 14: < 10 s)."""
    from tokenfactory.controllers import HystereticPoolController
    from tokenfactory.plant_models import FluidParams, PoolPlant, PoolScenario, RequestShape, Worker

    w = Worker.from_dict({"model": "deepseek-v3", "hardware": "h200"})
    fp = FluidParams.from_workers(w, w, RequestShape(914, 155))
    rate = 1000.0
    ctrls = [HystereticPoolController.tuned(p, mu, rate, startup_s=120.0)
             for p, mu in (("fill", fp.fill_rate_per_worker), ("decode", fp.decode_capacity(1)))]
    sc = PoolScenario(rate, 14 * 86400.0, dt=1.0, seed=1)
    t0 = time.perf_counter()
    PoolPlant(fp, 10, 4).run(sc, ctrls)
    t = time.perf_counter() - t0
    steps = int(sc.duration_s / sc.dt) + 1
    return {"seconds": t, "steps": steps, "steps_per_s": steps / t, "simulated_s_per_wall_s": sc.duration_s / t}


def _admission_like_loops(n: int, seed: int):
    """``n`` admission loops of the shipped smoothed scenario with random gain (x0.5..2, log-uniform)
    and delay (x0.5..2) factors: (base loop, gains, delays, DelayedLoopBatch)."""
    import numpy as np

    from tokenfactory.controllers import DelayedLoopBatch, admission_loop
    from tokenfactory.scenario import load_scenario
    from tokenfactory.studies.feedback_oscillation import scenario_path

    sc = load_scenario(scenario_path("smoothed"))
    base = admission_loop(sc.plant, sc.controller)
    rng = np.random.default_rng(seed)
    gains = np.exp(rng.uniform(np.log(0.5), np.log(2.0), n))
    delays = base.delay * rng.uniform(0.5, 2.0, n)
    num, den = base._polys
    return base, gains, delays, DelayedLoopBatch(num[None, :] * gains[:, None], den, delays)


def _batch_half(args):
    from tokenfactory.controllers import DelayedLoopBatch, stability_margins_batch

    num, den, delay = args
    mb = stability_margins_batch(DelayedLoopBatch(num, den, delay))
    return mb.fallback_count


def _margins(rounds: int = 5, n_batch: int = 8192, n_scalar: int = 40, n_pade: int = 400, n_frd: int = 5) -> dict:
    """Loops/s of the batch kernel (one process, and two processes on the two cores), the scalar
    path and python-control's stability_margins on Pade-5 models and on FRDs of the exact delay,
    all on the same random admission-like loops, in ``rounds`` interleaved rounds: each round
    times every contender once, its ratios are taken within the round, and the medians are
    reported (the machine is shared: absolute rates swing with other jobs, same-round ratios
    much less)."""
    import multiprocessing as mp
    import statistics
    import warnings

    import control
    import numpy as np

    from tokenfactory.controllers import DelayedLoop, DelayedLoopBatch, stability_margins, stability_margins_batch

    n_all = 2 * n_batch
    base, gains, delays, batch = _admission_like_loops(n_all, seed=14)
    one = DelayedLoopBatch(batch.num[:n_batch], batch.den[:n_batch], batch.delay[:n_batch])
    halves = [(batch.num[i::2], batch.den[i::2], batch.delay[i::2]) for i in range(2)]
    k_s = rounds * n_scalar
    loops = [DelayedLoop(base.rational * g, d) for g, d in zip(gains[:k_s], delays[:k_s])]
    pade = [DelayedLoop(base.rational * g, d).pade(5) for g, d in zip(gains[:n_pade], delays[:n_pade])]
    omega = np.logspace(-3, 2, 1000)
    frds = [control.frd(DelayedLoop(base.rational * g, d).response(omega), omega)
            for g, d in zip(gains[:n_frd], delays[:n_frd])]
    stability_margins_batch(DelayedLoopBatch(batch.num[:256], batch.den[:256], batch.delay[:256]))  # warm-up
    rates: dict[str, list[float]] = {k: [] for k in ("batch_1_process", "batch_2_processes", "scalar",
                                                     "python_control_pade5", "python_control_frd")}
    fallbacks = 0
    scalar = []
    with mp.get_context("fork").Pool(2) as pool, warnings.catch_warnings():
        warnings.simplefilter("ignore")   # python-control on an FRD warns about its interpolation
        pool.map(_batch_half, [(h[0][:64], h[1][:64], h[2][:64]) for h in halves])  # warm the workers
        for r in range(rounds):
            t0 = time.perf_counter()
            mb = stability_margins_batch(one)
            rates["batch_1_process"].append(n_batch / (time.perf_counter() - t0))
            fallbacks += mb.fallback_count
            t0 = time.perf_counter()
            fallbacks += sum(pool.map(_batch_half, halves))
            rates["batch_2_processes"].append(n_all / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            scalar += [stability_margins(lp) for lp in loops[r * n_scalar:(r + 1) * n_scalar]]
            rates["scalar"].append(n_scalar / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            pc = [control.stability_margins(p) for p in pade]
            rates["python_control_pade5"].append(n_pade / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            for f in frds:
                control.stability_margins(f)
            rates["python_control_frd"].append(n_frd / (time.perf_counter() - t0))
    ratio = {
        "batch_1_process_over_scalar": ("batch_1_process", "scalar"),
        "batch_1_process_over_pade5": ("batch_1_process", "python_control_pade5"),
        "batch_2_processes_over_pade5": ("batch_2_processes", "python_control_pade5"),
        "batch_2_processes_over_frd": ("batch_2_processes", "python_control_frd"),
        "batch_2_processes_over_scalar": ("batch_2_processes", "scalar"),
        "scalar_over_pade5": ("scalar", "python_control_pade5"),
        "two_processes_over_one": ("batch_2_processes", "batch_1_process")}
    out: dict = {
        "loops": f"admission loop of the smoothed scenario (k (s + z) / (s^2 (s + p)) e^(-theta s)), gain x "
                 f"U(0.5, 2) log-uniform, delay x U(0.5, 2); batch {n_batch} loops in one process and "
                 f"{n_all} over two; scalar {n_scalar}, Pade-5 {n_pade}, FRD {n_frd} per round",
        "rounds": rounds,
        "loops_per_s_median": {k: statistics.median(v) for k, v in rates.items()},
        "loops_per_s_by_round": rates,
        "ratios_median": {k: statistics.median([x / y for x, y in zip(rates[a], rates[b])])
                          for k, (a, b) in ratio.items()},
        "ratios_range": {k: [min(x / y for x, y in zip(rates[a], rates[b])),
                             max(x / y for x, y in zip(rates[a], rates[b]))] for k, (a, b) in ratio.items()},
        "batch_fallbacks": fallbacks,
        "notes": "python-control on prebuilt Pade-5 models and on prebuilt FRDs (1000 log-spaced points over "
                 "1e-3..1e2 rad/s); building them is not timed. Shared machine: rates are per round, ratios "
                 "within a round."}
    # agreement on the loops the scalar path ran (the property test checks every kind of loop)
    mb = stability_margins_batch(loops)
    fields = ("gain_margin", "lower_gain_margin", "phase_margin_deg", "delay_margin_s", "ms")
    worst = 0.0
    for f in fields:
        a, b = getattr(mb, f), np.array([getattr(m, f) for m in scalar])
        fin = np.isfinite(b)
        diff = np.abs(a[fin] - b[fin])
        worst = max(worst, float(np.max(np.where(diff == 0, 0.0, diff / np.maximum(np.abs(b[fin]), 1e-300)),
                                        initial=0.0)))
        assert (a[~fin] == b[~fin]).all(), f
    out["batch_vs_scalar_max_relative_difference"] = worst
    out["batch_vs_scalar_verdicts_equal"] = bool((mb.stable == [m.stable for m in scalar]).all())
    out["pade5_pm_max_difference_deg_vs_exact"] = float(np.max(np.abs(
        np.array([r[1] for r in pc]) - stability_margins_batch(DelayedLoopBatch(
            batch.num[:n_pade], batch.den[:n_pade], batch.delay[:n_pade])).phase_margin_deg)))
    med = out["loops_per_s_median"]
    out["targets"] = {"batch_2_processes >= 20000 loops/s": med["batch_2_processes"] >= 20_000,
                      "batch_2_processes >= 15 x python-control Pade-5 (same round)":
                          out["ratios_median"]["batch_2_processes_over_pade5"] >= 15}
    print(f"  margins: {med}\n  ratios: {out['ratios_median']}", file=sys.stderr)
    return out


def _envelope(side: int = 100) -> dict:
    """A side x side-point stability envelope (delay x service-rate factors) of the smoothed
    scenario: envelope_margins cold (each perturbed plant linearised) and warm (the tuner's
    case from its second tau_c on: plant models cached), and the batch margins alone."""
    import numpy as np

    from tokenfactory.controllers import envelope_loops, envelope_margins, stability_margins_batch
    from tokenfactory.controllers.autotune import StabilityEnvelope
    from tokenfactory.scenario import load_scenario
    from tokenfactory.studies.feedback_oscillation import scenario_path

    sc = load_scenario(scenario_path("smoothed"))
    env = StabilityEnvelope(delay_factors=tuple(np.geomspace(0.25, 4.0, side)),
                            service_rate_factors=tuple(np.geomspace(0.5, 2.0, side)))
    cache: dict = {}
    t0 = time.perf_counter()
    rows = envelope_margins(sc.plant, sc.controller, env, cache)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    envelope_margins(sc.plant, sc.controller, env, cache)
    warm = time.perf_counter() - t0
    loops = envelope_loops(sc.plant, sc.controller, env, cache)
    t0 = time.perf_counter()
    mb = stability_margins_batch(loops)
    kernel = time.perf_counter() - t0
    return {"points": side * side, "cold_seconds": cold, "warm_seconds": warm, "margins_only_seconds": kernel,
            "fallbacks": mb.fallback_count, "meets_floors_fraction": float(np.mean([r["meets_floors"] for r in rows])),
            "note": "cold = linearise every perturbed plant (python-control, ~4 ms a point) + margins; warm = "
                    "loops from cached plant models + margins + row dicts; margins_only = stability_margins_batch"}


def _sweeps(sizes=(10_000, 100_000)) -> dict:
    """run_sweep of stability-map points (gain factor x extra delay on the smoothed scenario's
    admission loop, gain_delay_margins batched) serially and on a 2-worker Dask LocalCluster
    (wall time including the cluster's start and stop)."""
    import functools
    import math

    import numpy as np

    from tokenfactory.controllers import gain_delay_margins
    from tokenfactory.sweep import Sweep, run_sweep

    base, *_ = _admission_like_loops(1, seed=0)
    num, den = base._polys
    fn = functools.partial(gain_delay_margins, num=num, den=den, delay=base.delay)
    out: dict = {"point": "gain_delay_margins on the admission loop: gain x geomspace(0.25, 16), extra delay "
                          "linspace(0, 5 s)"}
    for n in sizes:
        side = int(round(math.sqrt(n)))
        sw = Sweep({}, grid={"gain_factor": list(np.geomspace(0.25, 16.0, side)),
                             "delay_s": list(np.linspace(0.0, 5.0, side))})
        row = {"points": len(sw)}
        if n <= 10_000:
            t0 = time.perf_counter()
            serial = run_sweep(fn, sw, batched=True)
            row["serial_seconds"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        df = run_sweep(fn, sw, backend="dask", workers=2, batched=True)
        row["dask_2_workers_seconds"] = time.perf_counter() - t0
        row["stable_fraction"] = float(df["stable"].mean())
        row["fallbacks"] = int(df["fallback"].sum())
        if n <= 10_000:
            row["dask_equals_serial"] = bool(df.equals(serial))
        out[str(len(sw))] = row
        print(f"  sweep {len(sw)}: {row}", file=sys.stderr)
    return out


def _cross_simulator(requests: int = 20_000, rate_rps: float = 20.0) -> dict:
    """Dynamo's replay (its Rust mocker) and the request simulator on the same Poisson trace (ISL
    3,000 / OSL 150 at ``rate_rps``), the same 2 prefill + 2 decode workers and the same pass times
    (the service model's, exported as a mocker profile), one after the other in this process:
    simulated requests per wall-second of each and their ratio, with the TTFT / ITL medians."""
    import numpy as np
    import pandas as pd

    from tokenfactory.plant_models import RequestShape, ServiceModel, Worker
    from tokenfactory.plant_models.dynamo_mocker import cross_simulate

    w = Worker.from_dict({"model": "deepseek-v3", "hardware": "h200"})
    svc = ServiceModel(w, w, RequestShape(3000, 150))
    rng = np.random.default_rng(1)
    t = np.cumsum(rng.exponential(1.0 / rate_rps, requests))
    trace = pd.DataFrame({"arrival_s": t, "input_tokens": 3000, "cached_tokens": 0, "output_tokens": 150})
    res = cross_simulate(trace, svc, 2, 2)
    return {"trace": f"{requests} Poisson requests at {rate_rps:g} req/s, ISL 3000 / OSL 150",
            "workers": "2 prefill + 2 decode", "simulators": res.rows, "median_gaps": res.median_gaps(),
            "ratio_tokenfactory_to_dynamo_replay": res.speed_ratio, "ai_dynamo": res.config["ai-dynamo"]}


#: issue 21's whole-trace grid: traces (``synthetic``: the CLI's default workload, one hour), loads
#: (multiples of the measured capacity at the SLO) and policies (registry kinds: every baseline
#: the overload study compares and the recommended gate)
WHOLE_TRACES = ("azure-conv-2023", "azure-code-2023", "mooncake-conversation", "agentic-coding", "synthetic")
WHOLE_LOADS = (0.9, 1.1, 1.3, 2.0)
WHOLE_POLICIES = ("open", "vllm-watermark", "mooncake", "mooncake-predictive", "slo-aware")


def _whole_trace(argv: list[str]) -> dict:
    """Issue 21's whole-trace targets: ``tokenfactory simulate --trace T --load X --admission P
    --seed 0`` (the CLI's cluster: 2 fill + 1 decode DeepSeek-V3 on 8xH200, interactive 2 s /
    0.1 s and batch classes, KV-only batch cap, ``--load`` a multiple of the measured capacity)
    over the grid, one row per run. Pieces: ``--traces a,b --loads 0.9,1.3 --policies open,...``
    (defaults: the whole grid); rows already in ``results/whole_trace.json`` are kept and not run
    again unless ``--force``. Each trace's capacity (model and measured, cached under
    ``results/capacity-cache``) is recorded; every run checks conservation (the simulator raises
    otherwise) and records goodput (the CLI's, over the run, and over the arrival window), SLO
    attainment over all and admitted requests per class, rejections and wall time."""
    import argparse

    from tokenfactory.core.classes import DEFAULT_CLASSES
    from tokenfactory.replay import build_replay, run_replay
    from tokenfactory.traces import SyntheticWorkload, generate_requests, load_trace

    ap = argparse.ArgumentParser(prog="benchmarks.run whole-trace")
    ap.add_argument("--traces", default=",".join(WHOLE_TRACES))
    ap.add_argument("--loads", default=",".join(map(str, WHOLE_LOADS)))
    ap.add_argument("--policies", default=",".join(WHOLE_POLICIES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--out", default="whole_trace.json", help="file under results/ (pieces run in parallel write "
                    "their own and are merged with --merge)")
    ap.add_argument("--merge", default=None, help="comma-separated files under results/ to merge into --out")
    ap.add_argument("--params", default=None, help="JSON table of admission parameters given to every policy (e.g. "
                    "'{\"outer\": {\"decode_past_model\": true}}'; recorded in each row as admission_params; "
                    "write such rows to their own --out)")
    a = ap.parse_args(argv)
    params = json.loads(a.params) if a.params else None
    path = OUT / a.out
    if a.merge:
        data = json.loads(path.read_text()) if path.exists() else {"rows": [], "capacity": {}}
        for f in a.merge.split(","):
            part = json.loads((OUT / f).read_text())
            keys = {(r["trace"], r["policy"], r["load"]) for r in part["rows"]}
            data["rows"] = [r for r in data["rows"] if (r["trace"], r["policy"], r["load"]) not in keys] + part["rows"]
            data["capacity"].update(part["capacity"])
        path.write_text(json.dumps(data, indent=1, default=str) + "\n")
        return data
    data = json.loads(path.read_text()) if path.exists() else {"rows": [], "capacity": {}}
    have = {(r["trace"], r["policy"], r["load"]) for r in data["rows"]}
    for name in a.traces.split(","):
        trace = generate_requests(SyntheticWorkload(seed=a.seed), 3600.0) if name == "synthetic" else load_trace(name)
        setup = build_replay(trace)
        cluster = {"seed": a.seed, "classes": DEFAULT_CLASSES, "progress": False}
        t0 = time.perf_counter()
        cap = setup.capacity(cluster, measure=True, cache_dir=OUT / "capacity-cache")
        data["capacity"][name] = {**cap.to_dict(), "bisection_wall_s": time.perf_counter() - t0}
        print(f"  {name}: capacity model {cap.model_rps:.3f}, measured {cap.measured_rps:.3f} req/s", file=sys.stderr)
        for load in (float(x) for x in a.loads.split(",")):
            for pol in a.policies.split(","):
                if (name, pol, load) in have and not a.force:
                    continue
                t0 = time.perf_counter()
                m, res = run_replay(trace, setup, pol, cluster=cluster, load=load, capacity="measured",
                                    capacity_cache=OUT / "capacity-cache", admission_params=params)
                arr = res.records["arrival_s"].dropna()
                span = max(float(arr.max() - arr.min()), 1.0)
                row = {"trace": name, "policy": pol, "load": load, "admission_params": params,
                       "offered_rps": load * cap.rps,
                       "requests": m["requests"], "completed": m["completed"], "rejected": m["rejected"],
                       "deferred": m["deferred"], "in_flight_end": m["in_flight_end"],
                       "conserved": m["requests"] == m["completed"] + m["rejected"] + m["in_flight_end"],
                       "goodput_tokens_per_s": m["goodput_tokens_per_s"],
                       "goodput_window_tokens_per_s": m["goodput_tokens_per_s"] * m["duration_s"] / span,
                       "slo_attainment": m["slo_attainment"], "slo_attainment_admitted": m["slo_attainment_admitted"],
                       "rejected_share": m["rejected"] / max(m["requests"], 1),
                       "rejected_by_reason": m["rejected_by_reason"], "preempted": m.get("preempted"),
                       "classes": {c: {k: cm[k] for k in ("requests", "slo_attainment", "slo_attainment_admitted",
                                                          "rejected", "deferred")} for c, cm in m["classes"].items()},
                       "wall_seconds": time.perf_counter() - t0}
                data["rows"] = [r for r in data["rows"] if (r["trace"], r["policy"], r["load"]) != (name, pol, load)]
                data["rows"].append(row)
                have.add((name, pol, load))
                OUT.mkdir(exist_ok=True)
                path.write_text(json.dumps(data, indent=1, default=str) + "\n")
                print(f"  {name} {load:g}x {pol}: goodput {row['goodput_tokens_per_s']:.0f} tok/s, SLO "
                      f"{row['slo_attainment']:.3f} (admitted {row['slo_attainment_admitted']}), rejected "
                      f"{row['rejected']}, {row['wall_seconds']:.0f} s", file=sys.stderr)
    data["_meta"] = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": platform.platform(),
                     "load_average_1min": os.getloadavg()[0]}
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    return data


SECTIONS = ("margins", "envelope", "sweeps", "overload", "gateway", "cross-simulator")


def _gateway_overhead() -> dict:
    """The admission gateway's added latency and CPU per request next to a bare aiohttp proxy
    (:mod:`benchmarks.gateway`)."""
    from benchmarks.gateway import gateway_overhead

    return gateway_overhead()


def _run_sections(names: list[str]) -> dict:
    """Run only ``names`` (of SECTIONS) and merge them into the existing latest.json."""
    unknown = sorted(set(names) - set(SECTIONS))
    if unknown:
        raise SystemExit(f"unknown benchmark section(s) {unknown}; choose from {list(SECTIONS)}")
    path = OUT / "latest.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    for name in names:
        # the machine is shared: the 1-minute load average before and after says how contended the run was
        load_before = os.getloadavg()[0]
        entry = {"margins": _margins, "envelope": _envelope, "sweeps": _sweeps, "overload": _overload,
                 "gateway": _gateway_overhead, "cross-simulator": _cross_simulator}[name]()
        entry["load_average_1min_before_after"] = [load_before, os.getloadavg()[0]]
        key = {"margins": "batched_margins", "overload": "overload", "gateway": "gateway_overhead",
               "cross-simulator": "cross_simulator"}.get(
            name, f"margins_{name}")
        results[key] = entry
    return results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["des"]:
        json.dump(_des(), sys.stdout, indent=2)
        print()
        return 0
    if argv and argv[0] == "whole-trace":  # issue 21's grid, resumable in pieces (its own JSON file)
        _whole_trace(argv[1:])
        print(f"wrote the whole-trace results under {OUT}")
        return 0
    if argv:
        results = _run_sections(argv)
        results.setdefault("_meta", {})["sections_time"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        OUT.mkdir(exist_ok=True)
        path = OUT / "latest.json"
        path.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {path}")
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
    results["batched_margins"] = _margins()
    results["margins_envelope"] = _envelope()
    print(f"  envelope: {results['margins_envelope']}", file=sys.stderr)
    results["margins_sweeps"] = _sweeps()
    results["forecasting"] = _forecasting()
    results["overload"] = _overload()
    print(f"  overload: {results['overload']['loads']}", file=sys.stderr)
    results["gateway_overhead"] = _gateway_overhead()
    print(f"  gateway: {results['gateway_overhead']['gateway']}", file=sys.stderr)
    results["cross_simulator"] = _cross_simulator()
    print(f"  cross-simulator: {results['cross_simulator']['ratio_tokenfactory_to_dynamo_replay']:.2f} x", file=sys.stderr)
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
