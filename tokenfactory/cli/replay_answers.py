"""The plain answer printed after a replay: the cluster, its capacity at the SLO, the peak's
workers, where the SLO was missed, every oscillation verdict.
"""

from __future__ import annotations

import math

from tokenfactory.controllers.oscillation import CHURN_MIN_REVERSALS, CHURN_REVERSALS_PER_HOUR

__all__ = ["simulate_answer", "oscillation_answer", "misses_answer", "verdicts"]


def verdicts(metrics: dict, prefix: str = "") -> list[tuple[str, bool, str]]:
    """Every oscillation or churn verdict in a run's metrics, whatever produced it: a boolean
    ``*oscillating``/``*churning``/``*flapping`` key, or a dict holding one (a detector report)."""
    kinds = ("oscillating", "churning", "flapping")
    found = []
    for k, v in metrics.items():
        if isinstance(v, dict):
            flags = [f for f in kinds if isinstance(v.get(f), bool)]
            for f in flags:
                more = f"period {v['period_s']:.3g} s" if v[f] and isinstance(v.get("period_s"), float) else ""
                found.append((prefix + k + ("" if f == "oscillating" else f" {f}"), v[f], more))
            if not flags and k not in ("config", "classes"):
                found += verdicts(v, prefix + k + ".")
        elif isinstance(v, bool) and k.endswith(kinds):
            found.append((prefix + k, v, ""))
    return found


def simulate_answer(setup, m: dict, res, trace_label: str) -> None:
    """The plain answer of a replay: the cluster that ran, capacity at the SLO (``m["capacity"]``, of
    the simulated cluster), the workers the trace's peak needs, the batch cap as a vLLM flag, and
    every oscillation or churn verdict."""
    from tokenfactory.studies.report import human, vllm_batch_flag

    cl = res.config["cluster"]
    cap = m["capacity"]
    fw, dw = setup.service.fill_worker, setup.service.decode_worker
    nf = int(cap["cluster"].get("fill_workers", cl["fill_workers"]))
    nd = int(cap["cluster"].get("decode_workers", cl["decode_workers"]))

    def worker(w) -> str:
        p = w.parallelism
        return f"{w.model.name} on {w.num_gpus} x {w.accelerator.name} (tp {p.tp}, pp {p.pp}, ep {p.ep})"

    pools = f"{nf} fill x {worker(fw)} + {nd} decode x {worker(dw)}"
    classes = cl.get("classes") or ()
    slos = "; ".join(f"{c['name']}: TTFT <= {human(c['slo_ttft_s'])} s, TPOT <= {human(c['slo_tpot_s'])} s"
                     for c in classes if isinstance(c, dict)) or \
        f"TTFT <= {human(cl['slo_ttft_s'])} s, TPOT <= {human(cl['slo_tpot_s'])} s"
    print(f"cluster: {pools}; SLOs {slos}")
    batch = float(cap["batch_cap"])
    print(f"capacity at the SLO: {human(cap['rps'])} req/s ({cap['bottleneck']}-bound, {cap['source']}) with the "
          f"decode batch cap at {batch:.0f} sequences per worker - vLLM {vllm_batch_flag(batch)}")
    tpots = [c["slo_tpot_s"] for c in classes if isinstance(c, dict)] or [cl["slo_tpot_s"]]
    svc = setup.service
    one = svc.decode_pass_s(1, svc.decode_context_tokens)
    infeasible = one > min(tpots)
    if infeasible:   # the batch cap is floored at 1: the figures above are at a batch that misses the SLO
        print(f"no decode batch meets the TPOT SLO: one sequence's pass at the nominal {svc.decode_context_tokens:,} "
              f"tokens of context takes {human(one)} s (SLO {human(min(tpots))} s), so the capacity and the "
              "workers below are at batch 1, which misses it; a wider tp, faster GPUs, the engine's own "
              "efficiencies ([plant.efficiency]; `tokenfactory calibrate score`) or a looser TPOT SLO")
    per = {"fill": cap["fill_rps"], "decode": cap["decode_rps"]}
    arr = res.records["arrival_s"].dropna().to_numpy()
    if len(arr):
        window = 60.0 if arr.max() - arr.min() >= 600 else max((arr.max() - arr.min()) / 10, 1.0)
        import numpy as np

        counts = np.bincount(((arr - arr.min()) // window).astype(int))
        peak = float(counts.max()) / window
        need = {p: int(math.ceil(peak / (per[p] / n))) for p, n in (("fill", nf), ("decode", nd))}
        print(f"the trace's peak ({trace_label}, as replayed): {human(peak)} req/s over {window:.0f} s needs "
              f"{need['fill']} fill + {need['decode']} decode workers "
              + ("at batch 1 (no batch meets the TPOT SLO)" if infeasible else "at the SLO")
              + f" (this run has {nf} + {nd})")
        misses_answer(res, arr.min() + float(np.argmax(counts)) * window, window)
    line = oscillation_answer(m)
    if line:
        print(line)


def oscillation_answer(m: dict) -> str:
    """One line for every oscillation and churn verdict of a run: the signals judged (buffers from
    ``*_oscillation``, every actuator from ``oscillation.signals``) and which oscillate, then churn;
    other verdicts a run carries (a detector report elsewhere) follow as ``name yes/no``."""
    buffers = {"fill": "fill_queue"}  # what fill_oscillation judges (the actuator report's name)
    judged = {buffers.get(k[: -len("_oscillation")], k[: -len("_oscillation")]): v for k, v in m.items()
              if k.endswith("_oscillation") and isinstance(v, dict) and isinstance(v.get("oscillating"), bool)}
    report = m.get("oscillation") if isinstance(m.get("oscillation"), dict) else {}
    for k, v in (report.get("signals") or {}).items():
        if isinstance(v, dict):   # one verdict per signal: the actuator report's, when both judge it
            judged[k] = v if not judged.get(k, {}).get("oscillating") else judged[k]
    if not judged:
        verdicts = verdicts(m)
        return ("oscillation: " + "; ".join(f"{k.replace('_', ' ')} {'OSCILLATING' if v else 'no'}"
                                            + (f" ({more})" if v and more else "") for k, v, more in verdicts)
                if verdicts else "")
    label = {"ready": "ready buffer"}
    names = [label.get(k, k.replace("_", " ")) for k in judged]
    bad = [(label.get(k, k.replace("_", " ")), v) for k, v in judged.items() if v.get("oscillating")]
    if bad:
        said = "oscillation: OSCILLATING " + ", ".join(
            n + (f" (period {v['period_s']:.3g} s, amplitude {v['amplitude']:.3g})"
                 if isinstance(v.get("period_s"), float) and isinstance(v.get("amplitude"), float) else "")
            for n, v in bad) + f"; {len(judged) - len(bad)} other signals judged steady"
    else:
        said = f"oscillation: none in the {len(judged)} signals judged ({', '.join(names)})"
    if isinstance(report.get("churning"), bool):
        rev = report.get("reversals", 0)
        plural = "" if rev == 1 else "s"
        pools = report.get("pool_reversals") or {}
        per_pool = ", ".join(f"{p} {n}" for p, n in pools.items()) if len(pools) > 1 else ""
        # the bound is per pool (each follows its own demand): say so, and over which window the rate is
        win = report.get("window_s")
        span = (f" {win[0]:,.0f}-{win[1]:,.0f} s" if isinstance(win, (list, tuple)) and len(win) == 2
                and win[1] > win[0] else "")
        whole = m.get("reversals_per_hour")
        counted = (f"{rev} scale reversal{plural}" + (f" ({per_pool})" if per_pool else "")
                   + f", {report.get('reversals_per_hour', 0.0):.1f}/h over the judged window{span}"
                   + (f" ({whole:.1f}/h over the whole run)" if isinstance(whole, float) and span
                      and f"{whole:.1f}" != f"{report.get('reversals_per_hour', 0.0):.1f}" else ""))
        bound = (f"a pool churns past {CHURN_MIN_REVERSALS} reversals and {CHURN_REVERSALS_PER_HOUR:g}/h")
        said += (f"; CHURNING: {counted}; {bound}" if report["churning"] else f"; churn: no ({counted}; {bound})")
    return said


def misses_answer(res, peak_s: float, window: float) -> None:
    """Where the SLO was missed (:meth:`SimulationResult.slo_misses`), how many of the misses
    arrived in the trace's peak window, and - when pools were resized - whether a worker ordered
    when the peak shows could serve any of it within its TTFT SLO."""
    miss = res.slo_misses()
    missed = miss["requests"] - miss["met"]
    if not missed:
        return
    reasons = ", ".join(f"{k} {v:,}" for k, v in sorted(miss["rejected"].items(), key=lambda kv: -kv[1]))
    rejected = sum(miss["rejected"].values())
    print(f"SLO missed by {missed:,} of {miss['requests']:,} requests: {rejected:,} rejected"
          + (f" ({reasons})" if reasons else "") + f", {miss['late_ttft']:,} completed past their TTFT SLO, "
          f"{miss['late_tpot']:,} past their TPOT SLO only, {miss['unfinished']:,} unfinished")
    cl = res.config["cluster"]
    slo = res.metrics["classes"]
    peak = res.slo_misses((peak_s, peak_s + window))
    in_peak = peak["requests"] - peak["met"]
    line = f"{in_peak:,} of them arrived in the peak {window:.0f} s window (from {peak_s:.0f} s)"
    dyn = cl.get("dynamics") or {}
    # what a new worker can do about the peak matters only when the peak holds most of the misses
    if res.config.get("autoscalers") and dyn.get("startup_s") is not None and in_peak >= 0.5 * missed:
        reach = float(cl["measurement_delay_s"]) + float(dyn["startup_s"])
        longest = max(v["slo_ttft_s"] for v in slo.values())
        if reach >= window + longest:
            line += (f"; a worker ordered when it shows serves {reach:.0f} s later (measurement delay + start-up), "
                     f"after its last request's TTFT deadline ({window:.0f} s + {longest:g} s): only workers "
                     f"serving before it can carry it")
        else:
            line += (f"; a worker ordered when it shows serves {reach:.0f} s later (measurement delay + start-up), "
                     f"within the window + the longest TTFT SLO ({window + longest:g} s)")
    print(line)
