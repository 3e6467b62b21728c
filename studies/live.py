"""Study `live`: the gateway and the emulator over real HTTP, driven by a real load generator,
recorded by a real Prometheus, against the request simulator on the same arrivals.

(a) **Identification.** An open gateway (it measures, it does not decide) in front of the emulator,
    a sweep at 0.3x, 0.6x and 0.9x the decode capacity then a step to 2x; Prometheus scrapes both every second;
    ``identify`` (:mod:`tokenfactory.live.identify`) fits the metric delay (on the gateway's
    request log), the per-worker service rate, the pass-time law and the admission gain, next to
    the emulator's true values (the scenario's).
(b) **Live vs simulated.** The Azure 2023 conversation trace's arrivals, scaled to each load
    (x the decode capacity at the scenario's batch cap), sent by locust (headless, one request
    per planned arrival, open loop) through the SLO-aware gateway, and without it (straight to
    the emulator) at the overload; the same arrivals through the request simulator with the same
    scenario and the same registered controller (none without the gateway). TTFT p50 / p99 of
    completed requests and goodput (completed requests meeting the TTFT and TPOT SLO per second of
    arrivals), live over simulated. "The same arrivals" are those the gate actually saw (the
    gateway's log; the emulator's without a gateway): a client that falls behind its schedule
    sends a different load than planned, so the simulator runs both (``simact_*``, the ratios;
    ``sim_*``, the ``*_ratio_planned``). Locust's schedule starts once its users have spawned.
    The client's, the gateway's and the emulator's request logs, joined by ``x-request-id``,
    split each first token into hops (``ttft_decomposition.csv``: client lateness, client to
    gateway, the gateway's decision, gateway to engine, the service model's TTFT, the emulator's
    tick and loop lag before the first write, back to the gateway and the client), and the
    gateway's decisions are tallied against the simulator's on the same arrivals
    (``admission_decisions.csv``).
(c) **Overload.** Goodput at 2x against 0.9x with the gateway, and without it at 2x, live and
    simulated.

Every process (emulator, gateway, Prometheus, locust) runs on loopback and is stopped by the
study. Run: ``tokenfactory study live [--quick]``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tokenfactory.live.identify import identify, read_raw_prometheus
from tokenfactory.live.prometheus_server import PrometheusServer, free_port
from tokenfactory.live.live_scenario import load_live_scenario, saturated_rate
from tokenfactory.plant_models import RequestPlant
from tokenfactory.studies.study_config import StudyVariants, resolve_study_config
from tokenfactory.studies.report import StudyReport
from tokenfactory.traces import load_trace
from tokenfactory.core.validation import ConfigError

__all__ = ["CONFIG", "run", "LOCUSTFILE"]

#: the locustfile the study runs (written next to the arrivals): each user takes the next planned
#: arrival, waits for its time, sends one streaming completion and records what it saw
LOCUSTFILE = r'''
import itertools, json, os, time
from locust import HttpUser, task, events, constant

PLAN = json.load(open(os.environ["TF_PLAN"]))
ARRIVALS = PLAN["arrival_s"]
BODY = PLAN["body"]
NEXT = itertools.count()
RESULTS = []
# the schedule starts once every user has spawned (a loaded machine can take seconds to start them;
# arrivals planned before then would all be sent late, at once)
START = {"t0": None}

@events.spawning_complete.add_listener
def _spawned(user_count, **kw):
    START["t0"] = max(float(PLAN["t0_unix"]), time.time() + 1.0)

@events.quitting.add_listener
def _dump(environment, **kw):
    json.dump(RESULTS, open(os.environ["TF_OUT"], "w"))

class Client(HttpUser):
    wait_time = constant(0)

    @task
    def one(self):
        while START["t0"] is None:
            time.sleep(0.01)
        T0 = START["t0"]
        k = next(NEXT)
        if k >= len(ARRIVALS):
            time.sleep(0.5)
            return
        d = T0 + ARRIVALS[k] - time.time()
        if d > 0:
            time.sleep(d)
        sent = time.time()
        first, n, status = None, 0, 0
        with self.client.post("/v1/completions", json=BODY, stream=True, catch_response=True,
                              name="completions", headers={"x-request-id": str(k)}) as r:
            status = r.status_code
            if status == 200:
                for line in r.iter_lines():
                    if line.startswith(b"data: {"):
                        n += 1
                        if first is None:
                            first = time.time()
                r.success()
            else:
                r.success()  # a 429 is the gateway's answer, recorded below
        RESULTS.append({"k": k, "t0_unix": T0, "planned_unix_s": T0 + ARRIVALS[k], "sent_unix_s": sent, "first_unix_s": first,
                        "end_unix_s": time.time(), "status": status, "tokens": n})
        if len(RESULTS) == len(ARRIVALS):  # every planned arrival answered: stop (run time is a bound)
            self.environment.runner.quit()
'''


#: the study's settings: the defaults and its quick variant (:mod:`tokenfactory.studies.study_config`)
CONFIG = StudyVariants("live", {"scenario": "live_small", "trace": "azure-conv-2023", "loads": [0.5, 0.9, 1.3, 2.0],
                                "overload": 2.0, "window_s": 60.0, "step_s": (45.0, 40.0), "seed": 0, "users": 250},
                       quick={"loads": [0.9, 2.0], "window_s": 15.0, "step_s": (18.0, 8.0)})


def _wait_http(url: str, timeout_s: float = 180.0) -> None:
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end:
        try:
            with urllib.request.urlopen(url, timeout=1.0) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise ConfigError("live", f"{url} did not answer within {timeout_s} s")


class _Servers:
    """Emulator and (optionally) gateway as ``tokenfactory`` CLI processes on loopback."""

    def __init__(self, scenario: Path, gateway: bool, open_gate: bool, log: Path | None,
                 emulator_log: Path | None = None):
        self.procs: list[subprocess.Popen] = []
        self.scenario, self.gateway, self.open_gate, self.log = scenario, gateway, open_gate, log
        self.emulator_log = emulator_log

    def __enter__(self):
        try:
            return self._start()
        except BaseException:
            self.__exit__()  # a server that did not come up: stop what did
            raise

    def _start(self):
        # the installed console script (a separate process per server, as a deployment runs them)
        exe = Path(sys.executable).with_name("tokenfactory")
        cli = [str(exe) if exe.exists() else "tokenfactory"]
        pe = free_port()
        self.emulator = f"http://127.0.0.1:{pe}"
        em = [*cli, "emulate", "--scenario", str(self.scenario), "--port", str(pe)]
        if self.emulator_log is not None:
            em += ["--request-log", str(self.emulator_log)]
        self.procs.append(subprocess.Popen(em, stdout=subprocess.DEVNULL))
        _wait_http(self.emulator + "/health")
        self.front = self.emulator
        if self.gateway:
            pg = free_port()
            args = [*cli, "gateway", "--upstream", self.emulator, "--scenario", str(self.scenario), "--port", str(pg)]
            if self.open_gate:
                args.append("--open")
            if self.log is not None:
                args += ["--request-log", str(self.log)]
            self.procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL))
            self.front = f"http://127.0.0.1:{pg}"
            _wait_http(self.front + "/health")
        return self

    def __exit__(self, *exc):
        for p in reversed(self.procs):
            p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def _locust(url: str, arrivals: np.ndarray, body: dict, users: int, work: Path, tag: str) -> pd.DataFrame:
    """Send one request per planned arrival with locust (headless, bounded run time)."""
    lf = work / "locustfile.py"
    lf.write_text(LOCUSTFILE)
    plan, out = work / f"plan_{tag}.json", work / f"locust_{tag}.json"
    t0 = time.time() + 4.0  # users spawn first (the locustfile starts later if they take longer)
    plan.write_text(json.dumps({"t0_unix": t0, "arrival_s": arrivals.tolist(), "body": body}))
    run_s = int(math.ceil(4.0 + float(arrivals.max()) + 60.0))
    env = {**os.environ, "TF_PLAN": str(plan), "TF_OUT": str(out)}
    locust = Path(sys.executable).with_name("locust")
    cmd = [str(locust) if locust.exists() else "locust", "-f", str(lf), "--headless", "-u", str(users), "-r",
           str(users), "--run-time", f"{run_s}s", "--host", url, "--only-summary", "--loglevel", "ERROR",
           "--stop-timeout", "30"]
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=run_s + 90,
                   check=False)
    if not out.is_file():
        raise ConfigError("live.locust", f"locust wrote no results ({' '.join(cmd)})")
    df = pd.DataFrame(json.loads(out.read_text())).sort_values("k").reset_index(drop=True)
    df["arrival_s"] = df["planned_unix_s"] - df["t0_unix"]
    df["ttft_s"] = df["first_unix_s"] - df["sent_unix_s"]
    df["tpot_s"] = (df["end_unix_s"] - df["first_unix_s"]) / (df["tokens"] - 1).clip(lower=1)
    df["late_s"] = df["sent_unix_s"] - df["planned_unix_s"]
    return df


def _outcomes(ttft: np.ndarray, tpot: np.ndarray, completed: np.ndarray, span_s: float, slo) -> dict:
    ok = completed & np.isfinite(ttft)
    good = ok & (ttft <= slo[0]) & (tpot <= slo[1])
    return {"completed": int(ok.sum()), "ttft_p50_s": float(np.quantile(ttft[ok], 0.5)) if ok.any() else math.nan,
            "ttft_p99_s": float(np.quantile(ttft[ok], 0.99)) if ok.any() else math.nan,
            "tpot_p50_s": float(np.quantile(tpot[ok], 0.5)) if ok.any() else math.nan,
            "goodput_rps": float(good.sum() / span_s)}


def _arrivals(trace: str, rate: float, window_s: float, seed: int) -> np.ndarray:
    """rate x window consecutive arrivals of the trace from a seeded point in its middle half,
    their span stretched onto the window (the trace's burstiness, the load's mean rate)."""
    t = np.sort(load_trace(trace)["arrival_s"].to_numpy(dtype=float))
    n = max(int(round(rate * window_s)), 2)
    if n + 1 > len(t):
        raise ConfigError("live.loads", f"{trace} has {len(t)} arrivals, fewer than the {n} a window needs")
    rng = np.random.default_rng(seed)
    start = int(rng.integers(len(t) // 4, max(len(t) // 4 + 1, 3 * len(t) // 4 - n)))
    seg = t[start:start + n + 1]
    scaled = (seg - seg[0]) * window_s / (seg[-1] - seg[0])
    return scaled[:-1]


#: the hops of a live request's first token, in order from the client's send (they sum to the
#: client's TTFT; without a gateway the gateway hops are 0 and ``gateway_to_engine_s`` /
#: ``gateway_to_client_s`` run from and to the client)
HOPS = ("client_to_gateway_s", "gateway_decision_s", "gateway_to_engine_s", "engine_ttft_s", "engine_to_write_s",
        "write_to_gateway_s", "gateway_to_client_s")


def _read_log(path: Path | None, prefix: str) -> pd.DataFrame | None:
    if path is None or not path.is_file() or not path.stat().st_size:
        return None
    df = pd.DataFrame([json.loads(line) for line in path.read_text().splitlines() if line.strip()])
    df["request_id"] = df["request_id"].astype(str)
    return df.add_prefix(prefix).rename(columns={f"{prefix}request_id": "request_id"})


def _joined(live: pd.DataFrame, gw_log: Path | None, em_log: Path) -> pd.DataFrame:
    """The client's records joined with the gateway's and the emulator's by request id, with each
    hop of :data:`HOPS`, the arrival the gate saw (``gate_arrival_s``, s from the schedule's start)
    and TTFT / TPOT as the gate sees them (``gate_ttft_s``, ``gate_tpot_s``)."""
    df = live.copy()
    df["request_id"] = df["k"].astype(str)
    t0 = df["t0_unix"].to_numpy(float)
    for log, prefix in ((gw_log, "gw_"), (em_log, "em_")):
        other = _read_log(log, prefix)
        if other is not None:
            df = df.merge(other, on="request_id", how="left")
    for c in ("em_arrival_unix_s", "em_first_token_unix_s", "em_first_write_unix_s"):
        if c not in df:
            df[c] = math.nan
    df["engine_ttft_s"] = df["em_first_token_unix_s"] - df["em_arrival_unix_s"]
    df["engine_to_write_s"] = df["em_first_write_unix_s"] - df["em_first_token_unix_s"]
    if "gw_arrived_unix_s" in df:
        df["client_to_gateway_s"] = df["gw_arrived_unix_s"] - df["sent_unix_s"]
        df["gateway_decision_s"] = df["gw_sent_unix_s"] - df["gw_arrived_unix_s"]
        df["gateway_to_engine_s"] = df["em_arrival_unix_s"] - df["gw_sent_unix_s"]
        df["write_to_gateway_s"] = df["gw_first_token_unix_s"] - df["em_first_write_unix_s"]
        df["gateway_to_client_s"] = df["first_unix_s"] - df["gw_first_token_unix_s"]
        gate = df["gw_arrived_unix_s"].fillna(df["sent_unix_s"])
        df["gate_ttft_s"] = df["gw_first_token_unix_s"] - df["gw_arrived_unix_s"]
        tokens = df["gw_chunks"] - 1  # less [DONE]
        df["gate_tpot_s"] = (df["gw_end_unix_s"] - df["gw_first_token_unix_s"]) / (tokens - 1).clip(lower=1)
    else:
        df["client_to_gateway_s"] = df["gateway_decision_s"] = df["write_to_gateway_s"] = 0.0
        df["gateway_to_engine_s"] = df["em_arrival_unix_s"] - df["sent_unix_s"]
        df["gateway_to_client_s"] = df["first_unix_s"] - df["em_first_write_unix_s"]
        gate = df["em_arrival_unix_s"].fillna(df["sent_unix_s"])
        df["gate_ttft_s"] = df["engine_ttft_s"]
        df["gate_tpot_s"] = ((df["em_completion_unix_s"] - df["em_first_token_unix_s"])
                             / (df["em_output_tokens"] - 1).clip(lower=1)) if "em_completion_unix_s" in df else math.nan
    df["gate_arrival_s"] = gate.to_numpy(float) - t0
    return df


def _simulate(sc, arrivals: np.ndarray, span: float, gated: bool) -> pd.DataFrame:
    """The request simulator (through the Plant protocol) on ``arrivals`` with the scenario, and its
    admission controller when gated."""
    trace = pd.DataFrame({"arrival_s": np.maximum(np.asarray(arrivals, dtype=float), 0.0),
                          "input_tokens": int(sc.live["prompt_tokens"]), "output_tokens": int(sc.live["output_tokens"])})
    plant = RequestPlant(sc.setup.params, dataclasses.replace(sc.cluster, duration_s=span + 120.0, progress=False))
    return plant.run(trace, admission=sc.build_admission(trace) if gated else None).records


def _decision_counts(state: pd.Series, reason: pd.Series, deferred: pd.Series) -> dict:
    """Admitted, deferred (then admitted or not) and rejected by reason."""
    state, reason = state.astype(str), reason.fillna("").astype(str)
    if deferred.dtype == bool:
        was_deferred = deferred.to_numpy()
    else:
        was_deferred = np.isfinite(pd.to_numeric(deferred, errors="coerce").to_numpy(float))
    rejected = state.isin(["rejected"]).to_numpy()
    out = {"requests": int(len(state)), "admitted": int((~rejected).sum()), "deferred": int(was_deferred.sum())}
    for r, n in reason[rejected].value_counts().items():
        out[f"rejected_{r or 'unnamed'}"] = int(n)
    return out


def run(out_dir: str | Path, quick: bool = False, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the study (module notes) and write its report.

    Parameters
    ----------
    out_dir : str or Path
        Output folder.
    quick : bool
        Two loads, 15 s windows, a 26 s identification sweep and step (what CI runs).
    config : dict, optional
        Overrides: ``scenario``, ``trace``, ``loads``, ``overload``, ``window_s``, ``step_s``,
        ``seed``, ``users``.

    Returns
    -------
    dict
        The metrics written to ``metrics.json``.
    """
    cfg = resolve_study_config(CONFIG, config, quick=quick)
    report = StudyReport("live", Path(out_dir), {**cfg, "quick": quick})
    sc = load_live_scenario(cfg["scenario"])
    from tokenfactory.scenario import scenario_dir

    path = Path(cfg["scenario"]) if Path(cfg["scenario"]).is_file() else scenario_dir() / f"{cfg['scenario']}.toml"
    slo = (sc.cluster.slo_ttft_s, sc.cluster.slo_tpot_s)
    mu = saturated_rate(sc)
    fill_rps = sc.cluster.fill_workers / sc.setup.params.fill_seconds(float(sc.live["prompt_tokens"]))
    cap = min(mu * sc.cluster.decode_workers, fill_rps)
    # a text prompt of the nominal length by the emulator's estimate (4 characters a token): cheaper
    # to send and parse than a list of token ids, so the load generator keeps its schedule
    body = {"prompt": "x" * (4 * int(sc.live["prompt_tokens"])), "max_tokens": int(sc.live["output_tokens"]),
            "stream": True}
    work = Path(tempfile.mkdtemp(prefix="tf-live-", dir=report.out_dir))
    id_table, ident = _identification(cfg, sc, path, cap, mu, body, work, report)
    table, hop_table, decisions = _live_vs_simulated(cfg, sc, path, cap, slo, body, work, report)
    metrics, lines = _findings(report, cfg, sc, cap, mu, fill_rps, slo, ident, id_table, table, hop_table,
                               decisions)
    return report.finish(metrics, lines)


def _identification(cfg: dict, sc, path: Path, cap: float, mu: float, body: dict, work: Path,
                    report: StudyReport) -> tuple[pd.DataFrame, Any]:
    """(a) identification on an open gateway: a load sweep and step, Prometheus every second; the
    identified parameters against the scenario's."""
    rng = np.random.default_rng(cfg["seed"])
    # a sweep below capacity (the pass-time law) then a step to 2x (saturation: the service rate)
    lo_s, hi_s = cfg["step_s"]
    levels = [(0.3, lo_s / 3), (0.6, lo_s / 3), (0.9, lo_s / 3), (2.0, hi_s)]
    parts, t_at = [], 0.0
    for level, dur in levels:
        a = t_at + np.cumsum(rng.exponential(1 / (level * cap), int(level * cap * dur * 2) + 10))
        parts.append(a[a < t_at + dur])
        t_at += dur
    step = np.concatenate(parts)
    log = work / "requests_identify.jsonl"
    with _Servers(path, gateway=True, open_gate=True, log=log) as srv:
        targets = {"emulator": [srv.emulator.split("//")[1]], "gateway": [srv.front.split("//")[1]]}
        with PrometheusServer(targets, scrape_interval_s=1.0) as prom:
            t_start = time.time()
            _locust(srv.front, step, body, cfg["users"], work, "identify")
            time.sleep(3.0)
            raw = read_raw_prometheus(prom.url, t_start, time.time())
    report.save_table(pd.concat([pd.DataFrame({"series": k, "unix_s": v.index, "value": v.to_numpy()})
                                 for k, v in raw.items()]), "identify_series.csv",
                      "The raw series identify read (each at its scrape times), to re-run it offline.")
    req = pd.read_json(log, lines=True)
    ident = identify(raw, modelled_service_rate=mu, request_log=req[req["status"] == "completed"])
    p = sc.setup.params
    ctx = sc.live["prompt_tokens"] + sc.live["output_tokens"] / 2.0
    truth = {"metric_delay_s": sc.metrics_delay_s, "service_rate_per_worker": mu, "admission_gain": 1.0}
    rows = []
    for k, true in truth.items():
        e = getattr(ident, k)
        rows.append({"parameter": k, "method": e.method if e else "", "true": true,
                     "identified": e.value if e else math.nan, "lo": e.lo if e else
                     math.nan, "hi": e.hi if e else math.nan,
                     "error": (e.value / true - 1.0) if e else math.nan})
    for r in rows:
        r["primary"] = True
    # the pass-time law as fitted, then on the same record from vLLM's metrics alone (prefilling by
    # Little's law on its prefill-time histogram) and without subtracting the prefilling requests
    variants = [("", ident), (" (vLLM's metrics only)", identify({k: v for k, v in raw.items() if k != "prefilling"})),
                (" (prefilling not subtracted)", identify({k: v for k, v in raw.items() if k not in (
                    "prefilling", "prefill_time_sum")}))]
    for suffix, idv in variants:
        if idv.pass_law:
            bm = idv.pass_law["median_batch"]
            e = idv.pass_law["pass_at_median_s"]
            true = p.decode_pass(int(round(bm)), ctx)[0]
            rows.append({"parameter": f"pass_time_s{suffix} at batch {bm:.0f}", "method": idv.pass_law["method"],
                         "true": true, "identified": e.value, "lo": e.lo, "hi": e.hi, "error": e.value / true - 1.0,
                         "primary": suffix == ""})
    id_table = pd.DataFrame(rows)
    report.save_table(id_table, "identified.csv", "Identified vs true parameters of the emulator (95 % intervals).")
    return id_table, ident


def _live_vs_simulated(cfg: dict, sc, path: Path, cap: float, slo: tuple, body: dict, work: Path,
                       report: StudyReport) -> tuple[pd.DataFrame, pd.DataFrame, list]:
    """(b) every load live (gateway or direct) and simulated; the per-run table, the TTFT hops and the
    admission decisions."""
    # (b) live vs simulated on the trace's arrivals; the request logs of client, gateway and emulator
    # joined by request id take each run apart (:func:`_joined`), and the simulator runs both the
    # planned arrivals and the ones the gate actually saw (the client's lateness included)
    runs = [(load, True) for load in cfg["loads"]] + [(cfg["overload"], False)]
    out_rows, hops, decisions = [], [], []
    span = float(cfg["window_s"])
    for load, gated in runs:
        arr = _arrivals(cfg["trace"], load * cap, cfg["window_s"], cfg["seed"])
        tag = f"{load:g}x_{'gateway' if gated else 'direct'}"
        gw_log, em_log = work / f"gateway_{tag}.jsonl", work / f"emulator_{tag}.jsonl"
        with _Servers(path, gateway=gated, open_gate=False, log=gw_log if gated else None,
                      emulator_log=em_log) as srv:
            live = _locust(srv.front, arr, body, cfg["users"], work, tag)
        j = _joined(live, gw_log if gated else None, em_log)
        j.to_csv(work / f"joined_{tag}.csv", index=False)
        lv = _outcomes(j["ttft_s"].to_numpy(float), j["tpot_s"].to_numpy(float), (j["status"] == 200).to_numpy(),
                       span, slo)
        # the same requests timed where the gate sees them (the gateway, or the engine without one)
        gv = _outcomes(j["gate_ttft_s"].to_numpy(float), j["gate_tpot_s"].to_numpy(float),
                       (j["status"] == 200).to_numpy(), span, slo)
        sims = {}
        for name, a_s in (("sim", arr), ("simact", np.sort(j["gate_arrival_s"].to_numpy(float)))):
            rec = _simulate(sc, a_s, span, gated)
            sims[name] = _outcomes(rec["ttft_s"].to_numpy(float), rec["tpot_s"].to_numpy(float),
                                   (rec["state"] == "completed").to_numpy(), span, slo)
            if name == "simact":
                decisions.append({"load": load, "gateway": gated, "side": "simulated (same arrivals)",
                                  **_decision_counts(rec["state"], rec["reject_reason"], rec["deferred_s"])})
        if gated:
            decisions.append({"load": load, "gateway": gated, "side": "live (gateway log)",
                              **_decision_counts(j["gw_status"], j["gw_reason"], j["gw_deferred"])})
        row = {"load": load, "gateway": gated, "requests": len(arr),
               "late_p50_s": float(live["late_s"].quantile(0.5)), "late_p99_s": float(live["late_s"].quantile(0.99)),
               **{f"live_{k}": v for k, v in lv.items()}, **{f"gate_{k}": v for k, v in gv.items()},
               **{f"{n}_{k}": v for n, o in sims.items() for k, v in o.items()}}
        for k in ("ttft_p50_s", "ttft_p99_s", "goodput_rps"):
            # the target's comparison: the same arrivals on both sides (what the gate saw)
            row[f"{k}_ratio"] = lv[k] / sims["simact"][k] if sims["simact"][k] else math.nan
            row[f"{k}_ratio_planned"] = lv[k] / sims["sim"][k] if sims["sim"][k] else math.nan
        out_rows.append(row)
        ok = j["status"] == 200
        for h in ("late_s", *HOPS):
            x = j.loc[ok, h].to_numpy(float)
            x = x[np.isfinite(x)]
            hops.append({"load": load, "gateway": gated, "hop": h, "requests": len(x),
                         "mean_s": float(x.mean()) if len(x) else math.nan,
                         "p50_s": float(np.quantile(x, 0.5)) if len(x) else math.nan,
                         "p99_s": float(np.quantile(x, 0.99)) if len(x) else math.nan})
    hop_table = pd.DataFrame(hops)
    report.save_table(hop_table, "ttft_decomposition.csv", "Per run, each hop of a completed request's first token "
                      "(client lateness, client to gateway, the gateway's decision incl. deferral, gateway to engine, "
                      "the service model's TTFT, the emulator's tick and loop lag before the first write, back to "
                      "the gateway and to the client): mean, p50, p99 (s), from the joined request logs.")
    report.save_table(pd.DataFrame(decisions), "admission_decisions.csv", "Per run, admissions, deferrals and "
                      "rejections by reason: the gateway's log against the simulator on the same arrivals.")
    table = pd.DataFrame(out_rows)
    report.save_table(table, "live_vs_simulated.csv", "Per load: live (locust -> gateway -> emulator) and simulated "
                      "(request simulator, same arrivals, same controller) TTFT, TPOT and goodput.")
    return table, hop_table, decisions


def _findings(report: StudyReport, cfg: dict, sc, cap: float, mu: float, fill_rps: float, slo: tuple, ident,
              id_table: pd.DataFrame, table: pd.DataFrame, hop_table: pd.DataFrame,
              decisions: list) -> tuple[dict, list]:
    """The metrics, the summary's sentences (from the runs' numbers) and the headlines."""
    g = table[table["gateway"]]
    at = lambda x: g[np.isclose(g["load"], x)].iloc[0] if np.isclose(g["load"], x).any() else None  # noqa: E731
    hi_row, base_row = at(cfg["overload"]), at(0.9)
    direct = table[~table["gateway"]].iloc[0]
    metrics = {"identified": id_table.to_dict("records"), "live_vs_simulated": table.to_dict("records"),
               "ttft_decomposition": hop_table.to_dict("records"), "admission_decisions": decisions,
               "capacity_rps": cap, "slo": slo, "identify_notes": ident.notes}
    lines = [f"Capacity: {cap:.2f} requests/s (decode at the scenario's batch cap {mu * sc.cluster.decode_workers:.2f}, "
             f"fill {fill_rps:.2f}; {sc.cluster.fill_workers} + {sc.cluster.decode_workers} worker(s), "
             f"{sc.live['prompt_tokens']}/{sc.live['output_tokens']}-token requests).", ""]
    worst = float(np.nanmax(np.abs(id_table.loc[id_table["primary"], "error"].to_numpy(float))))
    lines.append(f"Identification: the largest error of an identified parameter is {100 * worst:.1f} % "
                 f"({'within' if worst <= 0.10 else 'outside'} the 10 % target).")
    ratios = table[[c for c in table.columns if c.endswith("_ratio")]].to_numpy(float)
    dev = float(np.nanmax(np.abs(ratios - 1.0)))
    planned = table[[c for c in table.columns if c.endswith("_ratio_planned")]].to_numpy(float)
    dev_planned = float(np.nanmax(np.abs(planned - 1.0)))
    lines.append(f"Live vs simulated on the same arrivals (those the gate saw, the client's lateness included): the "
                 f"largest deviation of TTFT p50 / p99 or goodput over the runs is {100 * dev:.1f} % "
                 f"({'within' if dev <= 0.15 else 'outside'} the 15 % target); against the simulator on the planned "
                 f"arrivals {100 * dev_planned:.1f} %.")
    for _, r in table.iterrows():
        hv = hop_table[(hop_table["load"] == r["load"]) & (hop_table["gateway"] == r["gateway"])].set_index("hop")
        rest = [(h, hv.loc[h, "p50_s"]) for h in HOPS if h != "engine_ttft_s" and h in hv.index]
        rest.sort(key=lambda x: -abs(x[1]) if x[1] == x[1] else 0.0)
        lines.append(f"{r['load']:g}x {'with the gateway' if r['gateway'] else 'direct'}: client TTFT p50 "
                     f"{r['live_ttft_p50_s']:.3f} s, of which the service model's {hv.loc['engine_ttft_s', 'p50_s']:.3f} s "
                     f"(the simulator on the same arrivals {r['simact_ttft_p50_s']:.3f} s, on the planned ones "
                     f"{r['sim_ttft_p50_s']:.3f} s); the largest other hops (p50): "
                     + ", ".join(f"{h[:-2].replace('_', ' ')} {1000 * v:.1f} ms" for h, v in rest[:3])
                     + f"; client lateness p50 {1000 * r['late_p50_s']:.1f} ms, p99 {1000 * r['late_p99_s']:.0f} ms.")
    if hi_row is not None and base_row is not None:
        held = hi_row["live_goodput_rps"] / base_row["live_goodput_rps"] if base_row["live_goodput_rps"] else math.nan
        lines.append(f"Overload: with the gateway, goodput at {cfg['overload']:g}x is {hi_row['live_goodput_rps']:.2f} "
                     f"requests/s, {held:.2f} x its 0.9x value ({'meets' if held >= 0.9 else 'misses'} the 0.9 target); "
                     f"without it {direct['live_goodput_rps']:.2f} requests/s live and {direct['sim_goodput_rps']:.2f} "
                     f"simulated.")
        sim_held = (hi_row["simact_goodput_rps"] / base_row["simact_goodput_rps"] if base_row["simact_goodput_rps"]
                    else math.nan)
        lines.append(f"The simulator on the same arrivals holds {sim_held:.2f} x (on the planned arrivals "
                     f"{hi_row['sim_goodput_rps'] / base_row['sim_goodput_rps']:.2f} x); goodput counted where the gate "
                     f"sees it (TTFT from the gateway's arrival): {hi_row['gate_goodput_rps']:.2f} vs "
                     f"{base_row['gate_goodput_rps']:.2f} requests/s.")
        metrics["overload_goodput_held"] = held
        metrics["overload_goodput_held_simulated_same_arrivals"] = sim_held
        report.headline("goodput held at 2x with the gateway", round(held, 3), "x the 0.9x value")
    report.headline("largest identification error", round(100 * worst, 1), "%")
    report.headline("largest live-vs-simulated deviation", round(100 * dev, 1), "%")
    return metrics, lines
