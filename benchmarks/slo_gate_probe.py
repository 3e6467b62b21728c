"""Probe the SLO-aware gate on one whole-trace cell (issue 21 item 3 diagnosis).

``python -m benchmarks.slo_gate_probe --trace azure-conv-2023 --load 0.9 [--params JSON]`` runs
``slo-aware`` as ``benchmarks.run whole-trace`` does (measured capacity, seed 0) with the gate's
``predict``/``decide``/``update`` wrapped from outside (the library is not changed), and prints a
JSON summary: decisions per class, verdict and reason with the predicted ready wait, the decode
limit and the margin at each; the predicted against the realised ready wait (decode start - KV
ready, from the request records) of the admitted requests; the gate's sampled state (slots = the
cap its batch gate commanded, measured active decodes, the top class's reservation, the margins)
and the outer loop's log. ``--params '{"outer": {"initial_margin": 0.1, "enabled": false}}'``
holds the margin fixed (a point of the gate's goodput / attainment frontier).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd

OUT = Path(__file__).resolve().parent / "results"


def _q(s: pd.Series, qs=(0.1, 0.5, 0.9, 0.99)) -> dict:
    s = s.dropna()
    return {f"q{int(q * 100)}": float(s.quantile(q)) for q in qs} if len(s) else {}


def probe(trace_name: str, load: float, params: dict | None = None) -> dict:
    """Run the cell and summarise what the gate predicted, decided and what then happened."""
    import tokenfactory.plant_models.des.simulator as simmod
    import tokenfactory.replay as rp
    from tokenfactory.core.classes import DEFAULT_CLASSES
    from tokenfactory.traces import SyntheticWorkload, generate_requests, load_trace

    current = {"i": -1}
    offer = simmod.Simulator.offer

    def offer_probe(self, i):
        current["i"] = i
        return offer(self, i)

    decisions, samples, held = [], [], {}
    build = rp.build_admission

    def build_probe(kind, ctx, p=None, where="admission"):
        ctrl = build(kind, ctx, p, where=where)
        held["ctrl"] = ctrl
        predict, decide, update = ctrl.predict, ctrl.decide, ctrl.update
        last = {}

        def predict_probe(t, a):
            last["p"] = predict(t, a)
            return last["p"]

        def decide_probe(t, a):
            name = a.request_class if a.request_class in ctrl.classes else ctrl.top
            d = decide(t, a)
            ttft, wait = last.pop("p", (math.nan, math.nan))
            limit = ctrl.decode_limit() if name == ctrl.top else ctrl.decode_limit_max[name]
            decisions.append((current["i"], t, name, ttft, wait, ctrl._decode_margin(name, limit), ctrl.margin[name],
                              d.verdict, d.reason))
            return d

        def update_probe(t, m):
            out = update(t, m)
            samples.append({"t": t, "slots": ctrl._slots(), "active_decodes": m.active_decodes, "ready": m.ready,
                            "decode_reserve": ctrl.decode_reserve, "decode_limit": ctrl.decode_limit(),
                            "decode_wait_f": ctrl.decode_wait_f, "pass_s": ctrl._pass_s(),
                            **{f"margin_{n}": ctrl.margin[n] for n in ctrl.classes}})
            return out

        ctrl.predict, ctrl.decide, ctrl.update = predict_probe, decide_probe, update_probe
        return ctrl

    simmod.Simulator.offer, rp.build_admission = offer_probe, build_probe
    try:
        trace = generate_requests(SyntheticWorkload(seed=0), 3600.0) if trace_name == "synthetic" \
            else load_trace(trace_name)
        setup = rp.build_replay(trace)
        m, res = rp.run_replay(trace, setup, "slo-aware", cluster={"seed": 0, "classes": DEFAULT_CLASSES,
                                                                    "progress": False},
                               load=load, capacity="measured", capacity_cache=OUT / "capacity-cache",
                               admission_params=params)
    finally:
        simmod.Simulator.offer, rp.build_admission = offer, build
    ctrl = held["ctrl"]
    D = pd.DataFrame(decisions, columns=["i", "t", "cls", "ttft_p", "wait_p", "decode_limit", "margin", "verdict",
                                         "reason"])
    rec = res.records.reset_index(drop=True)
    D["ready_wait"] = (rec.decode_start_s - rec.kv_ready_s).to_numpy()[D.i.to_numpy()]
    out = {"trace": trace_name, "load": load, "params": params, "goodput_tokens_per_s": m["goodput_tokens_per_s"],
           "rejected_by_reason": m["rejected_by_reason"],
           "classes": {c: {k: v[k] for k in ("requests", "rejected", "deferred", "slo_attainment_admitted")}
                       for c, v in m["classes"].items()},
           "limits": {"decode_limit_max": ctrl.decode_limit_max, "decode_limit_mean": ctrl.decode_limit_mean},
           "decisions": {}, "state": {}, "outer_log": ctrl.outer_log[::max(len(ctrl.outer_log) // 12, 1)]}
    for (c, verdict, reason), g in D.groupby(["cls", "verdict", "reason"]):
        out["decisions"][f"{c}:{verdict}:{reason or '-'}"] = {
            "n": len(g), "predicted_wait_s": _q(g.wait_p), "decode_limit_s": _q(g.decode_limit), "margin": _q(g.margin),
            **({"realised_ready_wait_s": _q(g.ready_wait)} if verdict == "admit" else {})}
    S = pd.DataFrame(samples)
    out["state"] = {k: _q(S[k], (0.1, 0.5, 0.9)) for k in S.columns if k != "t"}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks.slo_gate_probe")
    ap.add_argument("--trace", default="azure-conv-2023")
    ap.add_argument("--load", type=float, default=0.9)
    ap.add_argument("--params", default=None, help="JSON table of slo-aware parameters")
    a = ap.parse_args(argv)
    print(json.dumps(probe(a.trace, a.load, json.loads(a.params) if a.params else None), indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
