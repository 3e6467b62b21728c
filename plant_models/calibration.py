"""Score the service model against measured serving runs and calibrate it on them (issue 24).

Each run (:mod:`tokenfactory.plant_models.measured_runs`) is simulated as it was benchmarked:
``concurrency`` closed-loop clients (:func:`tokenfactory.traces.closed_loop_clients`) with the
run's ISL / OSL through the request simulator on the run's layout - an aggregated worker
(:mod:`tokenfactory.plant_models.des.aggregated`: chunked prefill inside the decode passes) for
aggregated runs, prefill and decode pools with the run's worker counts for disaggregated ones -
and its mean TTFT and TPOT compared with the measured ones (:func:`simulate_run`).

The fit needs each row's prediction many times, so it uses :func:`steady_state_run`, a
closed-loop steady-state solve of the same service model (Little's law over the N clients, the
decode batch and the prefill work per pass, iterated to a fixed point), cross-checked against the
simulator on a sample (:func:`cross_check`; the study and ``calibrate score --method`` report the
agreement). Both run on the same :class:`~tokenfactory.plant_models.service.ServiceModel`.

Errors are signed (predicted - measured) / measured, for TTFT and TPOT apart; the tables split
them by GPU, engine, precision, mode and batch band (:func:`error_metrics`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tokenfactory.plant_models.des.config import ClusterConfig
from tokenfactory.plant_models.des.core import simulate
from tokenfactory.plant_models.des.params import DESParams
from tokenfactory.plant_models.hardware import accelerator_preset
from tokenfactory.plant_models.measured_runs import MeasuredRun, MeasuredRuns
from tokenfactory.plant_models.roofline import Efficiency, Worker
from tokenfactory.plant_models.service import KVLink, RequestShape, ServiceModel
from tokenfactory.plant_models.validation import _model, predict_point, PUBLISHED_POINTS
from tokenfactory.traces.closed_loop import closed_loop_clients
from tokenfactory.validation import ConfigError, check_choice, check_int, check_number

__all__ = [
    "AGG_TOKENS_PER_REPLICA",
    "METHODS",
    "SPLITS",
    "RunSettings",
    "run_service",
    "simulate_run",
    "steady_state_run",
    "predict_runs",
    "error_metrics",
    "cross_check",
]

#: chunked-prefill token budget per attention replica of an aggregated engine: vLLM's
#: ``max_num_batched_tokens``, SGLang's ``chunked_prefill_size`` and TensorRT-LLM's
#: ``max_num_tokens`` are all 8,192 in the engines' serving defaults (ASSUMPTION: the file does
#: not state the engines' settings)
AGG_TOKENS_PER_REPLICA = 8192
#: how a run is predicted: the request simulator, or the closed-loop steady-state solve
METHODS = ("des", "steady-state")
#: the columns the error tables are split by
SPLITS = ("hardware", "engine", "precision", "mode", "batch_band")


@dataclass(frozen=True)
class RunSettings:
    """What a run is predicted with besides its own configuration.

    Parameters
    ----------
    efficiency : Efficiency
        The service model's efficiencies and overheads (default ``Efficiency()``).
    kv_precision : mapping
        KV-cache number format per engine (the file does not state it); engines not named use
        the model preset's (BF16).
    requests_per_client : int
        Requests each simulated client sends (>= 2; default 3).
    first_wave_weight : float
        Weight of the first wave's TTFT (every client's first request, all sent at once) in the
        predicted mean TTFT, in [0, 1] (default 0.5); the rest is the later requests'. The share
        of a benchmark's requests that are first requests is 1 / its requests per client, which
        the file does not state: fitted (:func:`fit_calibration`).
    """

    efficiency: Efficiency = field(default_factory=Efficiency)
    kv_precision: Mapping[str, str] = field(default_factory=dict)
    requests_per_client: int = 3
    first_wave_weight: float = 0.5

    def __post_init__(self) -> None:
        check_int("settings.requests_per_client", self.requests_per_client, low=2)
        check_number("settings.first_wave_weight", self.first_wave_weight, low=0.0, high=1.0)
        for eng, p in self.kv_precision.items():
            check_choice(f"settings.kv_precision.{eng}", p, ("bf16", "fp8"))


def run_service(run: MeasuredRun, settings: RunSettings = RunSettings()) -> ServiceModel:
    """The service model of ``run``: its model (checkpoint precisions, KV format from
    ``settings``), GPU, layouts and request shape (constant output length).

    Raises
    ------
    ConfigError
        When the layout does not hold the model or one request's KV (field ``parallelism`` or
        ``shape``).
    """
    over = dict(run.model_overrides)
    kv = settings.kv_precision.get(run.engine)
    if kv is not None:
        over["kv_precision"] = kv
    model = _model(run.model, tuple(sorted(over.items())))
    acc = accelerator_preset(run.hardware)
    dec = Worker(model, acc, run.parallelism, settings.efficiency)
    if run.fill_parallelism is not None:
        fill = Worker(model, acc, run.fill_parallelism, settings.efficiency)
        per_replica = max(run.fill_batch, 1) * run.input_tokens
    else:
        fill, per_replica = dec, AGG_TOKENS_PER_REPLICA
    shape = RequestShape(prompt_tokens=run.input_tokens, output_tokens=run.output_tokens, output_cv=0.0)
    return ServiceModel(fill, dec, shape, KVLink(), fill_tokens_per_replica=per_replica)


def _cluster(run: MeasuredRun) -> ClusterConfig:
    cap = float(run.max_batch) if run.max_batch > 0 else None
    if run.fill_parallelism is None:
        return ClusterConfig(fill_workers=0, decode_workers=0, aggregated_workers=run.workers,
                             prefix_cache_blocks=0, progress=False, batch_cap=cap, drain_s=3600.0)
    return ClusterConfig(fill_workers=run.fill_workers, decode_workers=run.workers, prefix_cache_blocks=0,
                         progress=False, batch_cap=cap, drain_s=3600.0)


def simulate_run(run: MeasuredRun, settings: RunSettings = RunSettings()) -> dict[str, float]:
    """Simulate the benchmark: ``run.concurrency`` closed-loop clients, each sending
    ``settings.requests_per_client`` requests of the run's ISL / OSL, through the request
    simulator on the run's layout.

    Returns
    -------
    dict
        ``ttft_s`` (the first requests' mean TTFT and the later ones' weighted by
        ``settings.first_wave_weight``), ``tpot_s`` (mean over every completed request),
        ``ttft_wave_s``, ``ttft_steady_s``, ``requests``, ``completed``, ``sim_wall_s``.
    """
    t0 = time.perf_counter()
    service = run_service(run, settings)
    params = DESParams.from_service(service)
    trace = closed_loop_clients(run.concurrency, run.input_tokens, run.output_tokens,
                                settings.requests_per_client)
    res = simulate(trace, params, _cluster(run))
    rec = res.records
    done = rec[rec["completion_s"].notna()]
    turn = trace["turn"].to_numpy()[done["request"].to_numpy()]
    first, later = done[turn == 0], done[turn >= 1]
    w = settings.first_wave_weight
    ttft = w * first["ttft_s"].mean() + (1.0 - w) * later["ttft_s"].mean()
    return {"ttft_s": float(ttft), "tpot_s": float(done["tpot_s"].mean()), "ttft_wave_s": float(first["ttft_s"].mean()),
            "ttft_steady_s": float(later["ttft_s"].mean()), "requests": int(len(done)),
            "completed": int(res.metrics["completed"]), "sim_wall_s": time.perf_counter() - t0}


def _wave_position(n: int, per_step: float) -> float:
    """Mean over n prompts arriving at once of the fill step (1-based) that finishes each, when a
    step finishes ``per_step`` prompts (fractional: a prompt spans steps)."""
    j = np.arange(1, n + 1)
    return float(np.mean(np.ceil(j / per_step - 1e-9)))


def steady_state_run(run: MeasuredRun, settings: RunSettings = RunSettings(), iterations: int = 40) -> dict[str, float]:
    """Closed-loop steady state of the benchmark on the same service model (no simulation).

    N clients cycle through TTFT + (OSL - 1) TPOT; throughput X = N / cycle (Little's law). A
    worker (aggregated, or a decode worker) holds B = min(cap, N_w (OSL - 1) TPOT / cycle)
    decoding sequences at the mean context ISL + OSL / 2, N_w the clients per worker.

    * aggregated: a prompt enters a pass whole (up to the budget, c tokens; more prompts per pass
      when more than one arrives per pass), so a share f = X_w ISL TPOT / c of the passes are
      mixed passes at (B, c) and TPOT = (1 - f) decode pass + f mixed pass; TTFT = the prompt's
      chunks (ceil(ISL / replica budget) mixed passes) plus half a pass of waiting, plus the
      M/D/1 queueing of prompts for mixed passes, f / (2 (1 - f)) x mixed pass;
    * disaggregated: TPOT = the decode pass at B; TTFT = the prefill of one step (one prompt per
      attention replica x prefill batch) plus the KV transfer, plus the M/D/1 wait of the prefill
      pool at utilisation X x fill seconds per request / prefill workers; clients beyond the
      decode slots wait for a slot.

    The benchmark's first wave (all N clients start together, their prompts queue for prefill
    steps) has its own TTFT, the mean finishing step of N prompts times the step; the prediction
    weights it by ``settings.first_wave_weight`` (the share of the benchmark's requests in the
    first wave, 1 / requests per client).

    Returns
    -------
    dict
        ``ttft_s``, ``tpot_s``, ``batch`` (decodes per worker), ``ttft_wave_s``, ``ttft_steady_s``.
    """
    s = run_service(run, settings)
    dec = s.decode_worker
    N, I, O = run.concurrency, run.input_tokens, run.output_tokens
    ctx = I + O / 2.0
    n_w = N / max(run.workers, 1)
    cap = run.max_batch if run.max_batch > 0 else math.inf
    cap = min(cap, max(s.slots(I + O), 1))
    agg = run.fill_parallelism is None
    if agg:
        budget = s.fill_token_budget
        chunks = math.ceil(I / s.replica_chunk_tokens)
        step = s.fill_step_s(min(budget, n_w * I))
        wave = step * _wave_position(int(math.ceil(n_w)), budget / I)
    else:
        fill_s = s.request_fill_s(I)                 # one prompt alone on a prefill worker
        per_fill = s.fill_worker.parallelism.dp_attention * max(run.fill_batch, 1)
        transfer = s.kv_transfer_s(s.kv_bytes(I))
        step = s.fill_step_s(min(per_fill, N / run.fill_workers) * I)
        wave = step * _wave_position(N, per_fill * run.fill_workers) + transfer
    ttft, tpot = 0.0, dec.decode(max(1.0, min(n_w, cap)), ctx, check_memory=False).time_s
    B = 1.0
    for _ in range(iterations):
        cycle = ttft + max(O - 1, 0) * tpot + 1e-9
        x_w = n_w / cycle
        B = max(1.0, min(cap, n_w * max(O - 1, 0) * tpot / cycle))
        if agg:
            # a prompt enters whole (up to the budget) into the next pass: a share f of the passes
            # are mixed passes carrying c tokens, the rest decode only
            c = min(budget, max(min(I, budget), x_w * I * tpot))
            f = min(1.0, x_w * I * tpot / c)
            t_dec = dec.decode(B, ctx, check_memory=False).time_s
            t_mix = s.mixed_step_s(B, ctx, c)
            t_new = (1.0 - f) * t_dec + f * t_mix
            rho = min(f, 0.95)
            f_new = chunks * t_mix + 0.5 * t_new + rho / (2.0 * (1.0 - rho)) * t_mix
        else:
            t_new = dec.decode(B, ctx, check_memory=False).time_s
            rho = min(n_w * run.workers / cycle * fill_s / (run.fill_workers * per_fill), 0.95)
            f_new = fill_s + transfer + rho / (2.0 * (1.0 - rho)) * fill_s
        if n_w > cap:  # clients beyond the decode cap wait for a slot: their share of a cycle
            f_new += (n_w - cap) / n_w * (f_new + max(O - 1, 0) * t_new)
        done = abs(t_new - tpot) <= 1e-5 * tpot and abs(f_new - ttft) <= 1e-5 * max(ttft, 1e-9)
        ttft, tpot = 0.5 * ttft + 0.5 * f_new, 0.5 * tpot + 0.5 * t_new
        if done:
            break
    w = settings.first_wave_weight
    return {"ttft_s": w * max(wave, ttft) + (1.0 - w) * ttft, "tpot_s": tpot, "batch": B,
            "ttft_wave_s": wave, "ttft_steady_s": ttft}


def _single_pass(run: MeasuredRun, settings: RunSettings) -> dict[str, float]:
    """A published point: the roofline's single-pass prediction (what the point measured)."""
    point = next(p for p in PUBLISHED_POINTS if p.key == run.key) if run.engine == "published" else None
    if point is None:
        raise ConfigError("run", f"{run.key} is not a published point")
    pred = predict_point(point, settings.efficiency)
    if point.mode == "decode":
        pred = point.sequences / (pred * run.parallelism.num_gpus)
    key = "ttft_s" if point.mode == "ttft" else "tpot_s"
    return {"ttft_s": pred if key == "ttft_s" else math.nan, "tpot_s": pred if key == "tpot_s" else math.nan}


def predict_runs(runs: MeasuredRuns | Sequence[MeasuredRun], settings: RunSettings = RunSettings(),
                 method: str = "des") -> tuple[pd.DataFrame, dict[str, int]]:
    """Predicted vs measured TTFT and TPOT of every run.

    Parameters
    ----------
    runs : MeasuredRuns or sequence of MeasuredRun
        The mapped runs.
    settings : RunSettings
        Efficiencies and KV formats.
    method : {"des", "steady-state"}
        The request simulator (:func:`simulate_run`) or the steady-state solve.

    Returns
    -------
    (pandas.DataFrame, dict)
        One row per predicted run (the run's fields, ``predicted_ttft_s``, ``predicted_tpot_s``,
        ``ttft_error``, ``tpot_error`` signed relative errors) and the runs that could not be
        predicted, by reason.
    """
    check_choice("method", method, METHODS)
    items = runs.runs if isinstance(runs, MeasuredRuns) else tuple(runs)
    rows, skipped = [], {}
    for r in items:
        try:
            if r.engine == "published":
                pred = _single_pass(r, settings)
            elif method == "des":
                pred = simulate_run(r, settings)
            else:
                pred = steady_state_run(r, settings)
        except ConfigError as exc:
            reason = f"does not fit at prediction ({exc.field})"
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        d = r.to_dict()
        d["predicted_ttft_s"], d["predicted_tpot_s"] = pred["ttft_s"], pred["tpot_s"]
        d["ttft_error"] = pred["ttft_s"] / r.ttft_s - 1.0 if r.ttft_s == r.ttft_s else math.nan
        d["tpot_error"] = pred["tpot_s"] / r.tpot_s - 1.0 if r.tpot_s == r.tpot_s else math.nan
        if "sim_wall_s" in pred:
            d["sim_wall_s"] = pred["sim_wall_s"]
        rows.append(d)
    return pd.DataFrame(rows), skipped


def _summary(err: pd.Series) -> dict[str, float]:
    e = err.dropna().to_numpy(dtype=float)
    if not e.size:
        return {"rows": 0}
    return {"rows": int(e.size), "median_abs_error": float(np.median(np.abs(e))),
            "p10_error": float(np.percentile(e, 10)), "p90_error": float(np.percentile(e, 90)),
            "within_25pct": float(np.mean(np.abs(e) <= 0.25))}


def error_metrics(table: pd.DataFrame, splits: Sequence[str] = SPLITS) -> dict[str, Any]:
    """``median_abs_error``, ``p10_error``, ``p90_error`` and ``within_25pct`` (share of rows
    within +-25 %) of TTFT and TPOT, overall and split by each of ``splits``.

    Returns
    -------
    dict
        ``{"tpot": {...,"by_hardware": {value: {...}}, ...}, "ttft": {...}}``.
    """
    out: dict[str, Any] = {}
    for q in ("tpot", "ttft"):
        col = f"{q}_error"
        m = _summary(table[col]) if len(table) else {"rows": 0}
        for s in splits:
            if len(table) and s in table:
                m[f"by_{s}"] = {str(k): _summary(g[col]) for k, g in table.groupby(s)}
        out[q] = m
    return out


def cross_check(runs: Sequence[MeasuredRun], settings: RunSettings = RunSettings()) -> pd.DataFrame:
    """Steady-state solve against the request simulator on ``runs`` (a sample): one row per run
    with both predictions and their ratio (steady / simulated)."""
    rows = []
    for r in runs:
        try:
            a, b = steady_state_run(r, settings), simulate_run(r, settings)
        except ConfigError:
            continue
        rows.append({"key": r.key, "mode": r.mode, "concurrency": r.concurrency, "steady_ttft_s": a["ttft_s"],
                     "des_ttft_s": b["ttft_s"], "steady_tpot_s": a["tpot_s"], "des_tpot_s": b["tpot_s"],
                     "ttft_ratio": a["ttft_s"] / b["ttft_s"], "tpot_ratio": a["tpot_s"] / b["tpot_s"],
                     "sim_wall_s": b["sim_wall_s"]})
    return pd.DataFrame(rows)
