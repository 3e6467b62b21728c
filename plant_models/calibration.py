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
from tokenfactory.plant_models.des.simulator import simulate
from tokenfactory.plant_models.des.params import DESParams
from tokenfactory.plant_models.hardware import accelerator_preset
from tokenfactory.plant_models.measured_runs import MeasuredRun, MeasuredRuns
from tokenfactory.plant_models.roofline import Efficiency, Worker
from tokenfactory.plant_models.service import KVLink, RequestShape, ServiceModel
from tokenfactory.plant_models.published_points import model_of, predict_point, PUBLISHED_POINTS
from tokenfactory.traces.closed_loop import closed_loop_clients
from tokenfactory.core.validation import ConfigError, check_choice, check_int, check_number

__all__ = [
    "AGG_TOKENS_PER_REPLICA",
    "METHODS",
    "SPLITS",
    "RunSettings",
    "PARAMETER_SETS",
    "parameter_set",
    "first_wave_share",
    "predicted_ttft_s",
    "run_service",
    "simulate_run",
    "steady_state_run",
    "predict_runs",
    "error_metrics",
    "CONTEXT_BANDS",
    "residual_by_batch_and_context",
    "cross_check",
    "CALIBRATION_PARAMETERS",
    "TTFT_RESIDUAL_WEIGHT",
    "BASE_SETTINGS",
    "PRE_CALIBRATION_EFFICIENCY",
    "FIT_START",
    "settings_from",
    "params_of",
    "training_sample",
    "CalibrationFit",
    "fit_calibration",
    "TTFT_TERMS",
    "EFFICIENCY_TERMS",
    "TTFT_ROBUST_SCALE",
    "ttft_components",
    "fit_ttft_terms",
    "fit_two_stage",
    "cross_validate_runs",
    "calibrate",
    "calibrated_settings",
    "write_calibrated",
]

#: chunked-prefill token budget per attention replica of an aggregated engine: vLLM's
#: ``max_num_batched_tokens``, SGLang's ``chunked_prefill_size`` and TensorRT-LLM's
#: ``max_num_tokens`` are all 8,192 in the engines' serving defaults (ASSUMPTION: the file does
#: not state the engines' settings). vLLM: ``EngineArgs._set_default_args`` in
#: ``vllm/engine/arg_utils.py``, 8,192 for the OpenAI server on GPUs of >= 70 GiB (not A100),
#: with ``max_num_seqs`` 1,024; SGLang: ``ServerArgs._handle_chunked_prefill_size`` in
#: ``python/sglang/srt/server_args.py``, 8,192 below 160 GB of HBM (H100, H200) and 16,384 in
#: some versions on B200 (kept at 8,192 here)
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
    ttft_overhead_s, ttft_s_per_input_token : float
        What a request's TTFT carries besides the passes: the serving front end (HTTP, detokenised
        streaming, scheduler admission) per request and tokenisation per input token (s, >= 0;
        default 0; fitted).
    engine_ttft_factor : mapping
        TTFT multiplier per engine (default: none, 1): the engines schedule prefill differently
        (chunk sizes, prefill priority, DP-attention balancing) in ways the file does not state;
        fitted, and 1 for an engine the fit has not seen.
    client_request_share : float
        One client's share of the requests the benchmark sends in all, 1 / R (in [0, 1];
        default 0: R unstated, the first wave's weight is ``first_wave_weight`` alone; fitted,
        as 1 / R so that the fit's gradient at the default is not flat). A benchmark of N
        clients that sends R requests in all has N of them in the first wave, all sent at t = 0,
        so the wave's share of the mean TTFT is s = min(1, N / R) and the later requests' TTFT is
        ``first_wave_weight`` of the way from the steady state to the wave's (the clients of a
        constant-OSL benchmark stay partly in step after the first wave): weight
        s + (1 - s) ``first_wave_weight`` on the wave (:func:`predicted_ttft_s`). Why: on the
        measured runs, with the first-wave weight constant, TTFT is over-predicted at low
        concurrency (+13 to +25 % median at N <= 4) and under-predicted at high (-25 to -74 % at
        N > 256) for every engine (issue 24, calib5's diagnosis).
    """

    efficiency: Efficiency = field(default_factory=Efficiency)
    kv_precision: Mapping[str, str] = field(default_factory=dict)
    requests_per_client: int = 3
    first_wave_weight: float = 0.5
    ttft_overhead_s: float = 0.0
    ttft_s_per_input_token: float = 0.0
    engine_ttft_factor: Mapping[str, float] = field(default_factory=dict)
    client_request_share: float = 0.0

    def __post_init__(self) -> None:
        check_number("settings.client_request_share", self.client_request_share, low=0.0, high=1.0)
        for eng, v in self.engine_ttft_factor.items():
            check_number(f"settings.engine_ttft_factor.{eng}", v, low=0.0, low_inclusive=False)
        check_number("settings.ttft_overhead_s", self.ttft_overhead_s, low=0.0, high=10.0)
        check_number("settings.ttft_s_per_input_token", self.ttft_s_per_input_token, low=0.0, high=1e-3)
        check_int("settings.requests_per_client", self.requests_per_client, low=2)
        check_number("settings.first_wave_weight", self.first_wave_weight, low=0.0, high=1.0)
        for eng, p in self.kv_precision.items():
            check_choice(f"settings.kv_precision.{eng}", p, ("bf16", "fp8"))


def first_wave_share(run: MeasuredRun, settings: RunSettings) -> float:
    """Weight of the first wave's TTFT in the benchmark's mean TTFT: s + (1 - s) w with
    s = min(1, N x ``settings.client_request_share``) (N / R) and w = ``settings.first_wave_weight``
    (:class:`RunSettings`' notes; w alone when the request count is unstated).

    Parameters
    ----------
    run : MeasuredRun
        The benchmark run (its client ``concurrency`` N).
    settings : RunSettings
        The fitted run settings (``client_request_share`` 1/R and ``first_wave_weight``).
    """
    return float(_wave_weight(run.concurrency, settings.client_request_share, settings.first_wave_weight))


def _wave_weight(concurrency, share, weight):
    """s + (1 - s) w with s = min(1, N share), on numbers or arrays (:func:`first_wave_share`)."""
    s = np.minimum(1.0, concurrency * share)
    return s + (1.0 - s) * weight


def _ttft_formula(concurrency, input_tokens, factor, wave_s, steady_s, values: Mapping[str, float]):
    """The one TTFT formula (:func:`predicted_ttft_s`), on numbers or arrays over runs; ``values``
    holds the settings' ``client_request_share``, ``first_wave_weight``, ``ttft_overhead_s`` and
    ``ttft_s_per_input_token``."""
    w = _wave_weight(concurrency, values["client_request_share"], values["first_wave_weight"])
    front = values["ttft_overhead_s"] + values["ttft_s_per_input_token"] * input_tokens
    return factor * (w * wave_s + (1.0 - w) * steady_s + front)


def predicted_ttft_s(run: MeasuredRun, settings: RunSettings, wave_s: float, steady_s: float) -> float:
    """The benchmark's mean TTFT from the simulated first wave's (``wave_s``) and the later
    requests' (``steady_s``) pass-and-queue TTFT: weighted by :func:`first_wave_share`, plus the
    front end (``ttft_overhead_s`` + ``ttft_s_per_input_token`` x ISL), all times the engine's
    ``engine_ttft_factor``.

    Parameters
    ----------
    run : MeasuredRun
        The measured run (its engine, concurrency and ISL).
    settings : RunSettings
        The benchmark's unstated settings.
    wave_s, steady_s : float
        Mean TTFT (s) of the first wave and of the later requests, without the front end.
    """
    values = {k: getattr(settings, k) for k in ("client_request_share", "first_wave_weight", "ttft_overhead_s",
                                                 "ttft_s_per_input_token")}
    return float(_ttft_formula(run.concurrency, run.input_tokens, settings.engine_ttft_factor.get(run.engine, 1.0),
                               wave_s, steady_s, values))


def run_service(run: MeasuredRun, settings: RunSettings = RunSettings()) -> ServiceModel:
    """The service model of ``run``: its model (checkpoint precisions, KV format from
    ``settings``), GPU, layouts and request shape (constant output length).

    Parameters
    ----------
    run : MeasuredRun
        The measured run.
    settings : RunSettings
        Efficiencies, KV formats and the benchmark's unstated settings.

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
    model = model_of(run.model, tuple(sorted(over.items())))
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

    Parameters
    ----------
    run : MeasuredRun
        The measured run.
    settings : RunSettings
        Efficiencies, KV formats and the benchmark's unstated settings.

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
    ttft = predicted_ttft_s(run, settings, first["ttft_s"].mean(), later["ttft_s"].mean())
    return {"ttft_s": float(ttft), "tpot_s": float(done["tpot_s"].mean()), "ttft_wave_s": float(first["ttft_s"].mean()),
            "ttft_steady_s": float(later["ttft_s"].mean()), "requests": int(len(done)),
            "completed": int(res.metrics["completed"]), "sim_wall_s": time.perf_counter() - t0}


def _wave_position(n: int, per_step: float) -> float:
    """Mean over n prompts arriving at once of the fill step (1-based) that finishes each, when a
    step finishes ``per_step`` prompts (fractional: a prompt spans steps)."""
    if per_step >= n:
        return 1.0
    j = np.arange(1, n + 1)
    return float(np.mean(np.ceil(j / per_step - 1e-9)))


def steady_state_run(run: MeasuredRun, settings: RunSettings = RunSettings(), iterations: int = 40,
                     tol: float = 1e-4) -> dict[str, float]:
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

    Parameters
    ----------
    run : MeasuredRun
        The measured run.
    settings : RunSettings
        Efficiencies, KV formats and the benchmark's unstated settings.
    iterations : int
        Most fixed-point iterations (default 40).
    tol : float
        Relative change of TTFT and TPOT at which the iteration stops (default 1e-4).

    Returns
    -------
    dict
        ``ttft_s``, ``tpot_s``, ``batch`` (decodes per worker), ``ttft_wave_s``, ``ttft_steady_s``,
        ``ttft_queue_s`` (the queueing part of the last iteration's pass-and-queue TTFT: the M/D/1
        wait for a mixed pass or a prefill worker, plus the wait for a decode slot).
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
    B, queue = 1.0, 0.0
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
            queue = rho / (2.0 * (1.0 - rho)) * t_mix
            f_new = chunks * t_mix + 0.5 * t_new + queue
        else:
            t_new = dec.decode(B, ctx, check_memory=False).time_s
            rho = min(n_w * run.workers / cycle * fill_s / (run.fill_workers * per_fill), 0.95)
            queue = rho / (2.0 * (1.0 - rho)) * fill_s
            f_new = fill_s + transfer + queue
        if n_w > cap:  # clients beyond the decode cap wait for a slot: their share of a cycle
            slot = (n_w - cap) / n_w * (f_new + max(O - 1, 0) * t_new)
            f_new, queue = f_new + slot, queue + slot
        done = abs(t_new - tpot) <= tol * tpot and abs(f_new - ttft) <= tol * max(ttft, 1e-9)
        ttft, tpot = 0.3 * ttft + 0.7 * f_new, 0.3 * tpot + 0.7 * t_new
        if done:
            break
    return {"ttft_s": predicted_ttft_s(run, settings, max(wave, ttft), ttft), "tpot_s": tpot, "batch": B,
            "ttft_wave_s": wave, "ttft_steady_s": ttft, "ttft_queue_s": queue}


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
        # decodes per worker the steady-state solve settled on (NaN for the simulator and the points)
        d["predicted_batch"] = float(pred.get("batch", math.nan))
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

    Parameters
    ----------
    table : pandas.DataFrame
        :func:`predict_runs` rows (``tpot_error``, ``ttft_error`` and the split columns).
    splits : sequence of str
        Columns to split by (default :data:`SPLITS`).

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


#: mean-context bands (tokens, ISL + OSL / 2) of :func:`residual_by_batch_and_context`
CONTEXT_BANDS = (0.0, 1500.0, 3000.0, 6000.0, math.inf)


def residual_by_batch_and_context(table: pd.DataFrame) -> pd.DataFrame:
    """What the TPOT error grows with: signed median error and the decode time missing per
    sequence, by batch band (sequences per attention rank) x mean-context band (issue 24).

    A cost that grows with batch x context (KV reads charged too cheaply) leaves a missing time
    per sequence that grows with the context; a cost per sequence (per-request runtime work) one
    that does not.

    Parameters
    ----------
    table : pandas.DataFrame
        :func:`predict_runs` rows of the steady-state solve (``predicted_batch`` set).

    Returns
    -------
    pandas.DataFrame
        One row per (``batch_band``, ``context_band``) with runs: ``rows``, ``tpot_signed_median``
        (predicted / measured - 1) and ``missing_us_per_sequence`` (median of (measured - predicted
        TPOT) / sequences per attention rank, microseconds; negative: over-predicted).
    """
    t = table.dropna(subset=["tpot_error", "predicted_batch"]).copy()
    if not len(t):
        return pd.DataFrame(columns=["batch_band", "context_band", "rows", "tpot_signed_median",
                                     "missing_us_per_sequence"])
    ctx = t["isl"] + t["osl"] / 2.0
    edges = list(CONTEXT_BANDS)
    labels = [f"{int(a)}-{int(b)}" if math.isfinite(b) else f">{int(a)}" for a, b in zip(edges, edges[1:])]
    t["context_band"] = pd.cut(ctx, edges, labels=labels, right=True).astype(str)
    replicas = (t["gpus_per_worker"] / (t["pp"] * t["tp"])).clip(lower=1.0)
    per_rank = (t["predicted_batch"] / replicas).clip(lower=1.0)
    t["missing_us"] = (t["measured_tpot_s"] - t["predicted_tpot_s"]) / per_rank * 1e6
    g = t.groupby(["batch_band", "context_band"])
    return pd.DataFrame({"rows": g.size(), "tpot_signed_median": g["tpot_error"].median(),
                         "missing_us_per_sequence": g["missing_us"].median()}).reset_index()


def cross_check(runs: Sequence[MeasuredRun], settings: RunSettings = RunSettings()) -> pd.DataFrame:
    """Steady-state solve against the request simulator on ``runs`` (a sample): one row per run
    with both predictions and their ratio (steady / simulated).

    Parameters
    ----------
    runs : sequence of MeasuredRun
        The sample.
    settings : RunSettings
        Efficiencies, KV formats and the benchmark's unstated settings.
    """
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


# -- the fit ---------------------------------------------------------------------------------
#: free parameters of the fit: (lower, upper, scale to the optimiser's units, where it lives)
CALIBRATION_PARAMETERS: dict[str, tuple[float, float, float, str]] = {
    "compute": (0.05, 1.0, 1.0, "efficiency"),
    "memory": (0.05, 1.0, 1.0, "efficiency"),
    # NVLink's bandwidth efficiency ("network") is not fitted: with the collectives' latency a
    # term of its own it is the links' documented bus-bandwidth efficiency (FIT_START); fitted
    # freely it fell to 0.13-0.16, standing in for latency-bound decode all-reduces and for TTFT
    # queueing, and made in-node EP8 prefill NVLink-bound against the article (issue 24)
    "network_scale_out": (0.05, 1.0, 1.0, "efficiency"),
    "layer_overhead_s": (0.0, 300e-6, 1e-6, "efficiency"),
    # the collectives' latency (alpha of the alpha-beta model, Efficiency's notes): a fixed part
    # per collective and a part per round on NVLink
    "collective_latency_s": (0.0, 100e-6, 1e-6, "efficiency"),
    "scale_up_latency_s": (0.0, 20e-6, 1e-6, "efficiency"),
    "pass_overhead_s": (0.0, 20e-3, 1e-3, "efficiency"),
    "routing_locality": (0.02, 1.0, 1.0, "efficiency"),
    # the large-batch costs (Efficiency's notes): runtime work per sequence on its attention rank,
    # and the decode attention kernel's own HBM efficiency on KV traffic. The per-sequence cost in
    # units of 100 us: the fit's difference step (5 % of a unit) is then 5 us, whose effect on a
    # pass stands above the steady-state solve's 1e-3 tolerance; at 1 us units the step was 0.05 us,
    # inside that noise, and the fit never moved the cost off its start
    "sequence_overhead_s": (0.0, 200e-6, 1e-4, "efficiency"),
    "attention_memory": (0.05, 1.0, 1.0, "efficiency"),
    # attention-DP imbalance of mixed passes (Efficiency's notes): the part of a prompt chunk beyond
    # an even share that the busiest attention replica prefills (the others wait for it)
    "attention_dp_imbalance": (0.0, 1.0, 1.0, "efficiency"),
    "first_wave_weight": (0.0, 1.0, 1.0, "settings"),
    "ttft_overhead_s": (0.0, 1.0, 1e-3, "settings"),
    "ttft_s_per_input_token": (0.0, 1e-4, 1e-6, "settings"),
    # relative to TensorRT-LLM's (1: the reference, so the factors do not trade against the
    # front-end terms and the first-wave weight)
    "ttft_factor_sglang": (0.2, 5.0, 1.0, "engine_ttft_factor"),
    "ttft_factor_vllm": (0.2, 5.0, 1.0, "engine_ttft_factor"),
    # one client's share of the benchmark's requests, 1 / R (RunSettings' notes), in units of
    # 1/1,000 requests; 0 (R unstated) at the start, up to 1/10 (a benchmark of 10 requests)
    "client_request_share": (0.0, 0.1, 1e-3, "settings"),
}
#: the efficiencies before the calibration: the fit to the 13 published points
#: (:data:`~tokenfactory.plant_models.published_points.FITTED_EFFICIENCY`, rounded as the
#: defaults were), uniform routing, one network efficiency
PRE_CALIBRATION_EFFICIENCY = Efficiency(compute=0.52, memory=0.23, network=0.49, layer_overhead_s=84e-6,
                                        scale_up_latency_s=2e-6, scale_out_latency_s=5e-6,
                                        pass_overhead_s=0.0, routing_locality=1.0, network_scale_out=None,
                                        collective_latency_s=0.0, sequence_overhead_s=0.0,
                                        attention_memory=None, attention_dp_imbalance=0.0)
#: the pre-calibration settings (the "before" tables): those efficiencies, no front-end TTFT,
#: half the TTFT weight on the first wave
BASE_SETTINGS = RunSettings(efficiency=PRE_CALIBRATION_EFFICIENCY)
#: the fit's start and (weak) prior: the pre-calibration settings with the collectives' latency
#: at NCCL's own tuning model (``src/graph/tuning.cc`` of NVIDIA/nccl: base latency 6.6 us of a
#: ring in the LL protocol, 0.6 us per NVLink step) and the NVLink bandwidth efficiency at the
#: large-message bus bandwidth nccl-tests reaches on 8 x H100 SXM (about 370-480 GB/s of the
#: 450 GB/s per direction, ring to NVLink SHARP: 0.8), and the per-sequence runtime cost at what
#: vLLM's ``Scheduler.update_from_output`` alone takes per decode (0.29 ms for 256: 1.1 us,
#: vllm-project/vllm pull request 46112)
FIT_START = dataclasses.replace(BASE_SETTINGS, efficiency=dataclasses.replace(
    PRE_CALIBRATION_EFFICIENCY, collective_latency_s=6.6e-6, scale_up_latency_s=0.6e-6, network=0.8,
    sequence_overhead_s=1.1e-6))


def settings_from(params: Mapping[str, float], kv_precision: Mapping[str, str] | None = None,
                  base: RunSettings | None = None) -> RunSettings:
    """A :class:`RunSettings` with ``params`` (names of :data:`CALIBRATION_PARAMETERS`) replaced.

    Parameters
    ----------
    params : mapping
        Values by name.
    kv_precision : mapping, optional
        KV format per engine (default: ``base``'s).
    base : RunSettings, optional
        What is not replaced (default :data:`FIT_START`: the fixed NVLink efficiency and NIC
        round latency the fit runs with).
    """
    base = FIT_START if base is None else base
    eff = dataclasses.replace(base.efficiency, **{k: float(v) for k, v in params.items()
                                                  if CALIBRATION_PARAMETERS[k][3] == "efficiency"})
    rest = {k: float(v) for k, v in params.items() if CALIBRATION_PARAMETERS[k][3] == "settings"}
    factors = {**base.engine_ttft_factor, **{k.removeprefix("ttft_factor_"): float(v) for k, v in params.items()
                                             if CALIBRATION_PARAMETERS[k][3] == "engine_ttft_factor"}}
    return dataclasses.replace(base, efficiency=eff, kv_precision=dict(kv_precision if kv_precision is not None
                                                                        else base.kv_precision),
                               engine_ttft_factor=factors, **rest)


def params_of(settings: RunSettings) -> dict[str, float]:
    """The :data:`CALIBRATION_PARAMETERS` values of ``settings``.

    Parameters
    ----------
    settings : RunSettings
        Efficiencies, KV formats and the benchmark's unstated settings.
    """
    out = {}
    for k, (_, _, _, where) in CALIBRATION_PARAMETERS.items():
        if where == "engine_ttft_factor":
            out[k] = float(settings.engine_ttft_factor.get(k.removeprefix("ttft_factor_"), 1.0))
        elif k == "network_scale_out":
            out[k] = float(settings.efficiency.scale_out_network)
        elif k == "attention_memory":
            out[k] = float(settings.efficiency.kv_memory)
        else:
            out[k] = float(getattr(settings.efficiency if where == "efficiency" else settings, k))
    return out


def training_sample(runs: Sequence[MeasuredRun], per_group: int = 6, seed: int = 0) -> list[MeasuredRun]:
    """A stratified sample: up to ``per_group`` runs of every (GPU, engine, model, mode, batch
    band), drawn with a generator seeded by ``seed`` (the fit's cost is linear in its rows).

    Parameters
    ----------
    runs : sequence of MeasuredRun
        All runs.
    per_group : int
        Runs per group (default 6).
    seed : int
        Seed of the draw.
    """
    rng = np.random.default_rng(seed)
    groups: dict[tuple, list] = {}
    for r in runs:
        groups.setdefault((r.hardware, r.engine, r.model, r.mode, r.batch_band), []).append(r)
    out = []
    for key in sorted(groups):
        g = groups[key]
        idx = rng.choice(len(g), size=min(per_group, len(g)), replace=False)
        out += [g[i] for i in sorted(idx)]
    return out


#: weight of a run's TTFT residual against its TPOT residual in the fit: the ratio of the two
#: residual scales (median |error| 19 % TPOT / 34 % TTFT with the first calibrated set, 0.56).
#: A TTFT carries the benchmark's queueing, first wave and engine scheduling, which the
#: steady-state solve only approximates; at full weight that error pulled the shared hardware
#: parameters (compute efficiency to its bound 1.0 with NVLink at 0.8)
TTFT_RESIDUAL_WEIGHT = 0.5


def _log_residuals(runs: Sequence[MeasuredRun], settings: RunSettings, ttft_weight: float = 1.0) -> np.ndarray:
    res = []
    for r in runs:
        try:
            p = steady_state_run(r, settings, tol=1e-3)  # well inside the fit's 5 % difference steps
            a, b = math.log(p["tpot_s"] / r.tpot_s), math.log(p["ttft_s"] / r.ttft_s)
        except (ConfigError, ValueError, ZeroDivisionError):
            a = b = 3.0  # a run the parameters cannot serve counts as far off
        res += [a, ttft_weight * b]
    return np.nan_to_num(np.asarray(res), nan=3.0, posinf=3.0, neginf=-3.0)


@dataclass(frozen=True)
class CalibrationFit:
    """Fitted parameters, their uncertainty and the fit's bookkeeping.

    Parameters
    ----------
    params : dict
        Fitted values of :data:`CALIBRATION_PARAMETERS`.
    std_error : dict
        Their standard errors (Gauss-Newton, from the Jacobian of the log residuals at the optimum).
    kv_precision : dict
        KV format chosen per engine.
    cost : float
        Robust cost at the optimum.
    train_rows : int
        Runs fitted.
    evaluations : int
        Residual evaluations spent.
    """

    params: dict
    std_error: dict
    kv_precision: dict
    cost: float
    train_rows: int
    evaluations: int

    @property
    def settings(self) -> RunSettings:
        """The fitted set (what is not fitted from :data:`FIT_START`)."""
        return settings_from(self.params, self.kv_precision)

    def to_dict(self) -> dict[str, Any]:
        return {"params": self.params, "std_error": self.std_error, "kv_precision": self.kv_precision,
                "cost": self.cost, "train_rows": self.train_rows, "evaluations": self.evaluations}


def _published_residuals(points, settings: RunSettings) -> np.ndarray:
    return np.array([math.log(predict_point(p, settings.efficiency) / p.published) for p in points])


def _soft_l1_cost(r: np.ndarray, robust_scale: float) -> float:
    """``least_squares``' soft-L1 cost of residuals ``r`` at scale ``robust_scale``."""
    z = (r / robust_scale) ** 2
    return float(np.sum(robust_scale ** 2 * 2.0 * (np.sqrt(1.0 + z) - 1.0)))


def _parameter_box(names: Sequence[str], x0: RunSettings) -> tuple[np.ndarray, ...]:
    """The optimiser's units, bounds (in those units) and start (``x0``'s values, clipped)."""
    scale = np.array([CALIBRATION_PARAMETERS[n][2] for n in names])
    lo = np.array([CALIBRATION_PARAMETERS[n][0] for n in names]) / scale
    hi = np.array([CALIBRATION_PARAMETERS[n][1] for n in names]) / scale
    return scale, lo, hi, np.clip(np.array([params_of(x0)[n] for n in names]) / scale, lo, hi)


def _gauss_newton_std_error(best, n_data: int, scale: np.ndarray) -> np.ndarray:
    """Standard errors of the parameters: the Gauss-Newton covariance of the first ``n_data``
    (data, not prior) residuals of the ``least_squares`` result ``best``, in physical units."""
    J, r = best.jac[:n_data], best.fun[:n_data]
    s2 = float(np.sum(r ** 2) / max(J.shape[0] - J.shape[1], 1))
    try:
        return np.sqrt(np.clip(np.diag(np.linalg.pinv(J.T @ J) * s2), 0.0, None)) * scale
    except np.linalg.LinAlgError:
        return np.full(len(scale), math.nan)


def fit_calibration(runs: Sequence[MeasuredRun], *, x0: RunSettings = FIT_START, robust_scale: float = 0.2,
                    prior_weight: float = 0.01, max_nfev: int = 60, choose_kv: bool = True,
                    engines: Sequence[str] | None = None, published: Sequence = PUBLISHED_POINTS,
                    published_weight: float = 3.0, ttft_weight: float = TTFT_RESIDUAL_WEIGHT,
                    free: Sequence[str] | None = None) -> CalibrationFit:
    """Robust least squares of :data:`CALIBRATION_PARAMETERS` on the runs' TTFT and TPOT.

    Residuals are log(predicted / measured) of TPOT and TTFT per run (the steady-state solve,
    :func:`steady_state_run`; TTFT's weighted by ``ttft_weight``) under a soft-L1 loss of scale ``robust_scale``, plus a weak prior
    ``prior_weight`` x (x - x0) in the optimiser's units. Bounded trust-region reflective; then,
    with ``choose_kv``, each engine's KV format is switched to FP8 where that lowers the cost
    (the file does not state it), chosen at the start and checked again at the optimum (the
    continuous parameters are refitted only when a format changes).

    The published points (``published``, the 13 of
    :data:`~tokenfactory.plant_models.published_points.PUBLISHED_POINTS` by default) enter as further
    log residuals weighted by ``published_weight``: the measured runs are single-node (NVLink)
    benchmarks and cannot bind the network efficiency of scale-out expert parallelism, which the
    published large-EP deployments do.

    Parameters
    ----------
    runs : sequence of MeasuredRun
        The training runs (a :func:`training_sample`).
    x0 : RunSettings
        Start and prior.
    robust_scale, prior_weight : float
        Loss scale and prior weight.
    max_nfev : int
        Residual evaluations per optimisation (>= 1).
    choose_kv : bool
        Choose the KV format per engine.
    engines : sequence of str, optional
        Engines whose KV format may be chosen (default: those in ``runs``).
    published : sequence of PublishedPoint
        Published points fitted with the runs (empty: none).
    published_weight : float
        Weight of each published point's residual (default 3).
    ttft_weight : float
        Weight of each TTFT residual (default :data:`TTFT_RESIDUAL_WEIGHT`).
    free : sequence of str, optional
        The parameters fitted (default: all of :data:`CALIBRATION_PARAMETERS`); the others stay at
        ``x0``'s values (standard error 0).

    Returns
    -------
    CalibrationFit
    """
    from scipy.optimize import least_squares

    check_int("max_nfev", max_nfev, low=1)
    runs = list(runs)
    names = list(CALIBRATION_PARAMETERS) if free is None else list(free)
    for n in names:
        check_choice("free", n, tuple(CALIBRATION_PARAMETERS))
    if 2 * len(runs) < len(names):  # a TTFT and a TPOT residual per run
        raise ConfigError("runs", f"{len(runs)} runs cannot fit {len(names)} parameters")
    scale, lo, hi, start = _parameter_box(names, x0)
    prior = start.copy()
    nfev = [0]

    def run_fit(x_init, kv):
        def residuals(x):
            nfev[0] += 1
            st = settings_from(dict(zip(names, x * scale)), kv, x0)
            r = _log_residuals(runs, st, ttft_weight)
            pub = published_weight * _published_residuals(published, st) if len(published) else np.empty(0)
            return np.concatenate([r, pub, prior_weight * (x - prior)])
        return least_squares(residuals, x_init, bounds=(lo, hi), loss="soft_l1", f_scale=robust_scale,
                             diff_step=0.05, max_nfev=max_nfev, x_scale="jac")

    def cost_of(x, kv) -> float:
        return _soft_l1_cost(_log_residuals(runs, settings_from(dict(zip(names, x * scale)), kv, x0), ttft_weight),
                             robust_scale)

    def choose(x, kv):
        c0 = cost_of(x, kv)
        for eng in sorted(set(engines or [r.engine for r in runs])):
            trial = {**kv, eng: "fp8" if kv.get(eng, "bf16") == "bf16" else "bf16"}
            c = cost_of(x, trial)
            if c < c0:
                kv, c0 = trial, c
        return kv

    kv = dict(x0.kv_precision)
    if choose_kv:  # at the start, then once more at the optimum (refitting only if one changes)
        kv = choose(start, kv)
    best = run_fit(start, kv)
    if choose_kv:
        again = choose(best.x, kv)
        if again != kv:
            kv, best = again, run_fit(best.x, again)
    se = _gauss_newton_std_error(best, 2 * len(runs) + len(published), scale)
    params = {**params_of(x0), **{n: float(v) for n, v in zip(names, best.x * scale)}}
    errors = {**{n: 0.0 for n in CALIBRATION_PARAMETERS}, **{n: float(v) for n, v in zip(names, se)}}
    return CalibrationFit(params, errors, kv, float(best.cost), len(runs), nfev[0])


# -- the two-stage fit -----------------------------------------------------------------------
#: the parameters that act on TTFT alone: :func:`predicted_ttft_s` applies them after
#: :func:`steady_state_run`'s fixed point, so they never feed back into TPOT, the batch or the
#: pass-and-queue TTFT (the cycle the fixed point solves holds the unscaled TTFT); for given
#: efficiencies they are a cheap function of each run's (wave, steady, N, ISL, engine), which
#: :func:`ttft_components` computes once and :func:`fit_ttft_terms` fits on every run
TTFT_TERMS = tuple(k for k, v in CALIBRATION_PARAMETERS.items() if v[3] != "efficiency")
#: the parameters that shape the passes (everything but :data:`TTFT_TERMS`), fitted on a training
#: sample in the second stage of :func:`fit_two_stage`
EFFICIENCY_TERMS = tuple(k for k in CALIBRATION_PARAMETERS if k not in TTFT_TERMS)
#: soft-L1 scale of :func:`fit_ttft_terms` on log(predicted / measured) TTFT: the joint fit's 0.2
#: on a residual weighted by :data:`TTFT_RESIDUAL_WEIGHT` (0.5), i.e. 0.4 on the log ratio
TTFT_ROBUST_SCALE = 0.4


def ttft_components(runs: Sequence[MeasuredRun], settings: RunSettings) -> dict[str, np.ndarray]:
    """What :func:`predicted_ttft_s` needs of each run, from one :func:`steady_state_run` per run
    at ``settings``' efficiencies and KV formats (its TTFT terms do not enter them).

    Parameters
    ----------
    runs : sequence of MeasuredRun
        The runs.
    settings : RunSettings
        Efficiencies and KV formats.

    Returns
    -------
    dict
        Arrays over the runs: ``wave_s`` (the first wave's TTFT as the solve weighs it, at least
        the steady state's), ``steady_s``, ``concurrency``, ``input_tokens``, ``measured_ttft_s``,
        ``engine`` (object array) and ``ok`` (False where the run cannot be served or has no
        measured TTFT; its other entries are then NaN).
    """
    n = len(runs)
    out = {k: np.full(n, math.nan) for k in ("wave_s", "steady_s", "concurrency", "input_tokens", "measured_ttft_s")}
    out["engine"] = np.array([r.engine for r in runs], dtype=object)
    for i, r in enumerate(runs):
        out["concurrency"][i], out["input_tokens"][i], out["measured_ttft_s"][i] = r.concurrency, r.input_tokens, r.ttft_s
        try:
            p = steady_state_run(r, settings)
        except (ConfigError, ValueError, ZeroDivisionError):
            continue
        out["wave_s"][i], out["steady_s"][i] = max(p["ttft_wave_s"], p["ttft_steady_s"]), p["ttft_steady_s"]
    with np.errstate(invalid="ignore"):
        out["ok"] = (np.isfinite(out["wave_s"]) & np.isfinite(out["steady_s"]) & (out["measured_ttft_s"] > 0)
                     & np.isfinite(out["measured_ttft_s"]))
    return out


def _ttft_from_components(comp: Mapping[str, np.ndarray], values: Mapping[str, float]) -> np.ndarray:
    """:func:`predicted_ttft_s` over the arrays of :func:`ttft_components` (vectorised; the
    :data:`TTFT_TERMS` by name in ``values``; an engine without a factor gets 1)."""
    k = np.ones(len(comp["wave_s"]))
    for name, v in values.items():
        if name.startswith("ttft_factor_"):
            k[comp["engine"] == name.removeprefix("ttft_factor_")] = v
    return _ttft_formula(comp["concurrency"], comp["input_tokens"], k, comp["wave_s"], comp["steady_s"], values)


def fit_ttft_terms(runs: Sequence[MeasuredRun], settings: RunSettings, *, robust_scale: float = TTFT_ROBUST_SCALE,
                   prior_weight: float = 0.01, components: Mapping[str, np.ndarray] | None = None,
                   names: Sequence[str] | None = None) -> CalibrationFit:
    """Stage 1 of :func:`fit_two_stage`: the :data:`TTFT_TERMS` on every run of ``runs`` with
    ``settings``' efficiencies held.

    Robust least squares (soft-L1 of scale ``robust_scale``, bounded trust-region reflective, the
    Jacobian by finite differences of the vectorised prediction) of
    log(predicted / measured) TTFT, plus the weak prior ``prior_weight`` x (x - x0) toward
    ``settings``' values in the optimiser's units (:data:`CALIBRATION_PARAMETERS`), as in
    :func:`fit_calibration`. The engine factors of engines not in ``runs`` are not fitted (they
    keep ``settings``' value). Runs the efficiencies cannot serve are left out.

    Parameters
    ----------
    runs : sequence of MeasuredRun
        The runs (all a fold's training runs; not a sample: the fit is cheap).
    settings : RunSettings
        The efficiencies and KV formats held, and the start and prior of the TTFT terms.
    robust_scale, prior_weight : float
        Loss scale (on the log ratio) and prior weight.
    components : mapping, optional
        :func:`ttft_components` of ``runs`` at ``settings`` (computed when not given).
    names : sequence of str, optional
        The terms fitted (default: every :data:`TTFT_TERMS` whose engine is in ``runs``).

    Returns
    -------
    CalibrationFit
        All :data:`CALIBRATION_PARAMETERS` (the efficiencies as in ``settings``, standard error 0),
        ``train_rows`` the runs fitted.
    """
    from scipy.optimize import least_squares

    check_number("robust_scale", robust_scale, low=0.0, low_inclusive=False)
    check_number("prior_weight", prior_weight, low=0.0)
    runs = list(runs)
    comp = ttft_components(runs, settings) if components is None else components
    if len(comp["ok"]) != len(runs):
        raise ConfigError("components", f"{len(comp['ok'])} rows for {len(runs)} runs")
    engines = set(comp["engine"][comp["ok"]])
    if names is None:
        names = [n for n in TTFT_TERMS if not n.startswith("ttft_factor_") or n.removeprefix("ttft_factor_") in engines]
    names = list(names)
    for n in names:
        check_choice("names", n, TTFT_TERMS)
    ok = comp["ok"]
    if int(ok.sum()) < len(names):
        raise ConfigError("runs", f"{int(ok.sum())} servable runs cannot fit {len(names)} TTFT terms")
    sub = {k: v[ok] for k, v in comp.items() if k != "ok"}
    log_meas = np.log(sub["measured_ttft_s"])
    base = params_of(settings)
    scale, lo, hi, start = _parameter_box(names, settings)
    prior = start.copy()
    nfev = [0]

    def residuals(x):
        nfev[0] += 1
        pred = _ttft_from_components(sub, {**base, **dict(zip(names, x * scale))})
        r = np.log(np.maximum(pred, 1e-12)) - log_meas
        return np.concatenate([r, prior_weight * (x - prior)])

    best = least_squares(residuals, start, bounds=(lo, hi), loss="soft_l1", f_scale=robust_scale,
                         x_scale="jac", max_nfev=2000)
    se = _gauss_newton_std_error(best, int(ok.sum()), scale)
    params = {**base, **{n: float(v) for n, v in zip(names, best.x * scale)}}
    errors = {**{n: 0.0 for n in CALIBRATION_PARAMETERS}, **{n: float(v) for n, v in zip(names, se)}}
    return CalibrationFit(params, errors, dict(settings.kv_precision), float(best.cost), int(ok.sum()), nfev[0])


def fit_two_stage(runs: Sequence[MeasuredRun], *, per_group: int = 3, seed: int = 0, alternations: int = 1,
                  x0: RunSettings = FIT_START, ttft_robust_scale: float = TTFT_ROBUST_SCALE,
                  free: Sequence[str] | None = None, joint_first: bool = False, **kw) -> CalibrationFit:
    """The fit in two stages that alternate: the :data:`TTFT_TERMS` on every run of ``runs``
    (:func:`fit_ttft_terms`, cheap: they act after the steady-state solve), then the
    :data:`EFFICIENCY_TERMS` on a training sample of them with those terms held
    (:func:`fit_calibration`, TPOT- and TTFT-driven), then the TTFT terms again on the new
    efficiencies; ``alternations`` rounds of the last two. With ``joint_first`` the start is
    the joint fit (:func:`fit_calibration` of every parameter on the sample) followed by
    stage 1, instead of stage 1 at ``x0``'s efficiencies.

    Why: the joint fit sees the TTFT terms only through the ~100 runs of its sample; fitted on
    every run at fixed efficiencies they are cheap and bound by 20 times the rows (issue 24).

    Parameters
    ----------
    runs : sequence of MeasuredRun
        Every training run (all runs, or all runs of a cross-validation fold's other GPUs or
        engines): stage 1 fits on all of them, stage 2 on their :func:`training_sample`.
    per_group, seed : int
        Stage 2's training sample.
    alternations : int
        Rounds of stage 2 followed by stage 1 (>= 1, or >= 0 with ``joint_first``; default 1).
    x0 : RunSettings
        Start and prior (default :data:`FIT_START`).
    ttft_robust_scale : float
        Stage 1's loss scale on the log ratio (default :data:`TTFT_ROBUST_SCALE`).
    free : sequence of str, optional
        The parameters fitted (default all); the others stay at ``x0``'s values.
    joint_first : bool
        Start from the joint fit (default False).
    **kw
        Passed to :func:`fit_calibration` (stage 2, and the joint fit).

    Returns
    -------
    CalibrationFit
        The efficiencies and KV formats of the last stage 2 (or joint fit) with their standard
        errors (given the TTFT terms), the TTFT terms of the last stage 1 with theirs (given the
        efficiencies); ``cost`` is stage 2's (or the joint fit's), ``train_rows`` its sample,
        ``evaluations`` the sum over the stages.
    """
    check_int("alternations", alternations, low=0 if joint_first else 1)
    runs = list(runs)
    names = list(CALIBRATION_PARAMETERS) if free is None else list(free)
    for n in names:
        check_choice("free", n, tuple(CALIBRATION_PARAMETERS))
    engines = {r.engine for r in runs}
    t_names = [n for n in TTFT_TERMS if n in names
               and (not n.startswith("ttft_factor_") or n.removeprefix("ttft_factor_") in engines)]
    e_names = [n for n in EFFICIENCY_TERMS if n in names]
    sample = training_sample(runs, per_group, seed)
    evals, current, eff, ttft = 0, x0, None, None
    if joint_first:
        eff = fit_calibration(sample, x0=x0, free=names, **kw)
        evals += eff.evaluations
        current = settings_from({n: eff.params[n] for n in names}, eff.kv_precision, x0)

    def stage1(settings):
        fit = fit_ttft_terms(runs, settings, robust_scale=ttft_robust_scale, names=t_names)
        return fit, settings_from({n: fit.params[n] for n in t_names}, None, settings)

    if t_names:
        ttft, current = stage1(current)
        evals += ttft.evaluations
    for _ in range(alternations):
        if e_names:
            eff = fit_calibration(sample, x0=current, free=e_names, **kw)
            evals += eff.evaluations
            current = settings_from({n: eff.params[n] for n in e_names}, eff.kv_precision, current)
        if t_names:
            ttft, current = stage1(current)
            evals += ttft.evaluations
    errors = {n: 0.0 for n in CALIBRATION_PARAMETERS}
    for part, part_names in ((eff, e_names), (ttft, t_names)):
        if part is not None:
            errors.update({n: part.std_error[n] for n in part_names})
    return CalibrationFit(params_of(current), errors, dict(current.kv_precision),
                          float(eff.cost) if eff is not None else float(ttft.cost), len(sample), evals)

def _fold(runs: Sequence[MeasuredRun], by: str, v: str, per_group: int, seed: int, kw: dict,
          two_stage: bool = False):
    """One fold of :func:`cross_validate_runs`: (held-out table, the fold's fit). With
    ``two_stage`` the fold is fitted by :func:`fit_two_stage` on the other values' runs (stage 1
    on all of them, stage 2 on their sample): no held-out run enters either stage."""
    others = [r for r in runs if getattr(r, by) != v]
    fold_kw = dict(kw)
    if by == "hardware":  # nor do the published points of the held-out GPU enter the fold's fit
        fold_kw["published"] = [p for p in kw.get("published", PUBLISHED_POINTS) if p.hardware != v]
    if two_stage:
        fit = fit_two_stage(others, per_group=per_group, seed=seed, x0=FIT_START, **fold_kw)
    else:
        fit = fit_calibration(training_sample(others, per_group, seed), x0=FIT_START, **fold_kw)
    held = fit.settings
    if by == "engine":  # the held-out engine is one the fit has not seen: its own factor is 1
        held = dataclasses.replace(held, engine_ttft_factor={**held.engine_ttft_factor, v: 1.0},
                                   kv_precision={k: p for k, p in held.kv_precision.items() if k != v})
    tab, _ = predict_runs([r for r in runs if getattr(r, by) == v], held, method="steady-state")
    tab["held_out"] = v
    return tab, fit.to_dict()


def _map(fn, args: list, jobs: int) -> list:
    """``[fn(*a) for a in args]``, in ``jobs`` processes when more than one (same results)."""
    if jobs <= 1 or len(args) <= 1:
        return [fn(*a) for a in args]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=min(jobs, len(args))) as ex:
        return list(ex.map(fn, *zip(*args)))


def cross_validate_runs(runs: Sequence[MeasuredRun], by: str, *, per_group: int = 6, seed: int = 0,
                        jobs: int = 1, two_stage: bool = False, **kw) -> tuple[pd.DataFrame, dict[str, dict]]:
    """Leave one value of ``by`` (``"hardware"`` or ``"engine"``) out: fit on the other values'
    runs (a training sample, starting from :data:`FIT_START`, so nothing of the held-out runs
    enters a fold) and predict every run of the held-out one.

    Parameters
    ----------
    runs : sequence of MeasuredRun
        All runs.
    by : {"hardware", "engine"}
        What a fold leaves out.
    per_group, seed : int
        The folds' training samples (:func:`training_sample`).
    jobs : int
        Folds fitted at once in separate processes (default 1; the results do not depend on it).
    two_stage : bool
        Fit each fold by :func:`fit_two_stage` (default False: :func:`fit_calibration`).
    **kw
        Passed to :func:`fit_calibration` (or :func:`fit_two_stage`).

    Returns
    -------
    (pandas.DataFrame, dict)
        The held-out predictions (as :func:`predict_runs`, plus ``held_out``) and each fold's
        fitted parameters.
    """
    check_choice("by", by, ("hardware", "engine"))
    check_int("jobs", jobs, low=1)
    values = sorted({getattr(r, by) for r in runs})
    out = _map(_fold, [(list(runs), by, v, per_group, seed, kw, two_stage) for v in values], jobs)
    return pd.concat([t for t, _ in out], ignore_index=True), {v: f for v, (_, f) in zip(values, out)}


def _calibration_task(runs: list, by: str | None, v: str | None, per_group: int, seed: int, max_nfev: int,
                      free: list | None = None, two_stage: bool = False, alternations: int = 1,
                      joint_first: bool = False):
    """The full fit (``by`` None) or one cross-validation fold, for :func:`calibrate`'s pool."""
    kw = {"max_nfev": max_nfev, "free": free,
          **({"alternations": alternations, "joint_first": joint_first} if two_stage else {})}
    if by is None:
        if two_stage:
            return fit_two_stage(runs, per_group=per_group, seed=seed, **kw)
        return fit_calibration(training_sample(runs, per_group, seed), **kw)
    return _fold(runs, by, v, per_group, seed, kw, two_stage)


def calibrate(runs: Sequence[MeasuredRun], *, per_group: int = 3, max_nfev: int = 40, cv: bool = True,
              seed: int = 0, source: str = "", jobs: int = 1, fixed: Sequence[str] = (), two_stage: bool = False,
              alternations: int = 1, joint_first: bool = False) -> dict[str, Any]:
    """The whole calibration: the fit on a training sample of every run, the error tables before
    (:data:`BASE_SETTINGS`) and after it on every run (steady-state solve), and the
    leave-one-GPU-out and leave-one-engine-out cross-validation.

    Parameters
    ----------
    runs : sequence of MeasuredRun
        Every mapped run.
    per_group : int
        Training runs per group (:func:`training_sample`; default 3).
    max_nfev : int
        Residual evaluations per optimisation, of the full fit and of each fold (every fold starts
        from :data:`FIT_START`, as the full fit does).
    cv : bool
        Run the cross-validation.
    seed : int
        Seed of the training samples.
    source : str
        The file, for the provenance.
    jobs : int
        The full fit and the folds run in up to ``jobs`` processes (default 1; same results).
    fixed : sequence of str
        Parameters of :data:`CALIBRATION_PARAMETERS` held at their start (:data:`FIT_START`) in the
        fit and every fold: a small file cannot fit them all (two residuals per run).
    two_stage : bool
        Fit (the full fit and every fold) by :func:`fit_two_stage`: the TTFT terms on every
        training run, the efficiencies on the sample (default False: :func:`fit_calibration`,
        every parameter on the sample at once).
    alternations : int
        :func:`fit_two_stage`'s rounds (>= 1, >= 0 with ``joint_first``; default 1; only with
        ``two_stage``).
    joint_first : bool
        :func:`fit_two_stage` starts from the joint fit (default False; only with ``two_stage``).

    Returns
    -------
    dict
        ``fit`` (:meth:`CalibrationFit.to_dict`), ``before`` and ``after`` (:func:`error_metrics`),
        ``cv`` (``{"hardware": metrics, "engine": metrics}`` of the held-out predictions),
        ``cv_folds`` (each fold's parameters), ``provenance``.
    """
    t0 = time.perf_counter()
    check_int("jobs", jobs, low=1)
    check_int("alternations", alternations, low=0 if joint_first else 1)
    unknown = sorted(set(fixed) - set(CALIBRATION_PARAMETERS))
    if unknown:
        raise ConfigError("fixed", f"{', '.join(unknown)} is not a calibration parameter; allowed: "
                          f"{', '.join(CALIBRATION_PARAMETERS)}")
    free = [n for n in CALIBRATION_PARAMETERS if n not in set(fixed)] if fixed else None
    runs = list(runs)
    train = training_sample(runs, per_group, seed)
    tasks = [(None, None)]
    if cv:
        tasks += [(by, v) for by in ("hardware", "engine") for v in sorted({getattr(r, by) for r in runs})]
    done = _map(_calibration_task, [(runs, by, v, per_group, seed, max_nfev, free, two_stage, alternations,
                                     joint_first) for by, v in tasks], jobs)
    fit = done[0]
    before, _ = predict_runs(runs, BASE_SETTINGS, method="steady-state")
    after, _ = predict_runs(runs, fit.settings, method="steady-state")
    report: dict[str, Any] = {"fit": fit.to_dict(), "before": error_metrics(before), "after": error_metrics(after)}
    if cv:
        report["cv"], report["cv_folds"] = {}, {}
        for by in ("hardware", "engine"):
            got = [(v, d) for (b, v), d in zip(tasks, done) if b == by]
            report["cv"][by] = error_metrics(pd.concat([t for _, (t, _) in got], ignore_index=True))
            report["cv_folds"][by] = {v: f for v, (_, f) in got}
    report["provenance"] = {"source": source, "runs": len(runs), "train_rows": len(train), "per_group": per_group,
                            "max_nfev": max_nfev, "seed": seed, "method": "steady-state", "fixed": sorted(fixed),
                            "ttft_weight": TTFT_RESIDUAL_WEIGHT, "folds_start": "FIT_START",
                            "two_stage": bool(two_stage),
                            **({"alternations": alternations, "joint_first": bool(joint_first), "ttft_rows": len(runs),
                                "ttft_robust_scale": TTFT_ROBUST_SCALE} if two_stage else {}),
                            "wall_s": time.perf_counter() - t0}
    return report


def calibrated_settings() -> RunSettings:
    """The calibrated parameter set (:mod:`tokenfactory.plant_models.calibrated`, written by
    ``tokenfactory calibrate fit FILE --write``)."""
    from tokenfactory.plant_models.calibrated import CALIBRATED

    base = dataclasses.replace(FIT_START, efficiency=dataclasses.replace(FIT_START.efficiency,
                                                                         **CALIBRATED.get("fixed", {})))
    return settings_from(CALIBRATED["params"], CALIBRATED["kv_precision"], base)


#: the named service-model parameter sets, name -> what it is: ``calibrate score --params``,
#: ``simulate --params`` and a replay scenario's ``plant.params`` take these names
#: (:func:`parameter_set`)
PARAMETER_SETS = {
    "defaults": "Efficiency() defaults",
    "pre-calibration": "the efficiencies before issue 24 (the 13-point fit)",
    "calibrated": "the calibrated set with its TTFT terms (plant_models/calibrated.py)",
}


def parameter_set(name: str, field: str = "params") -> RunSettings:
    """The named parameter set (:data:`PARAMETER_SETS`): its efficiencies, KV formats per engine
    and the measured benchmarks' TTFT terms.

    Parameters
    ----------
    name : str
        ``"defaults"``, ``"pre-calibration"`` or ``"calibrated"``.
    field : str
        The name a bad value is reported under (default ``"params"``).

    Returns
    -------
    RunSettings

    Raises
    ------
    ConfigError
        For a name not in :data:`PARAMETER_SETS`, naming ``field`` and the allowed names.
    """
    check_choice(field, name, tuple(PARAMETER_SETS))
    return {"calibrated": calibrated_settings, "pre-calibration": lambda: BASE_SETTINGS,
            "defaults": RunSettings}[name]()


def write_calibrated(report: Mapping[str, Any], path=None):
    """Write the fitted set as :mod:`tokenfactory.plant_models.calibrated` (values, standard
    errors, KV formats, the cross-validated errors and the provenance), deterministically.

    Parameters
    ----------
    report : mapping
        :func:`calibrate`'s result.
    path : path-like, optional
        Where (default: ``calibrated.py`` beside this module).

    Returns
    -------
    pathlib.Path
        The module written.
    """
    import pprint
    from pathlib import Path

    if path is None:
        path = Path(__file__).with_name("calibrated.py")
    fit = report["fit"]
    summary = {q: {k: round(float(v), 4) for k, v in report["after"][q].items() if not k.startswith("by_")}
               for q in ("tpot", "ttft")}
    cv = {by: {q: {k: round(float(v), 4) for k, v in m[q].items() if not k.startswith("by_")} for q in ("tpot", "ttft")}
          for by, m in report.get("cv", {}).items()}
    prov = {k: v for k, v in report["provenance"].items() if k != "wall_s"}
    src = str(prov.get("source", ""))
    if "measurements/" in src:  # the shared copy's path, not this machine's
        prov["source"] = src[src.index("measurements/"):]
    fixed = {k: getattr(FIT_START.efficiency, k) for k in ("network", "scale_out_latency_s")}
    data = {"params": {k: float(f"{v:.4g}") for k, v in fit["params"].items()},
            "fixed": fixed,
            "std_error": {k: float(f"{v:.2g}") for k, v in fit["std_error"].items()},
            "kv_precision": dict(sorted(fit["kv_precision"].items())),
            "in_sample": summary, "cross_validated": cv, "provenance": prov}
    text = ('"""The calibrated service-model parameters (issue 24), written by\n'
            '``tokenfactory calibrate fit FILE --write`` - do not edit by hand; refit instead.\n\n'
            'Fitted by robust least squares on the measured serving runs of NVIDIA AIConfigurator\'s silicon\n'
            'sample (``measurements/aiconfigurator-silicon``, H100/H200/B200, trtllm/sglang/vllm), each run\n'
            'predicted by the closed-loop steady-state solve of :mod:`tokenfactory.plant_models.calibration`,\n'
            'together with the 13 published DeepSeek-V3/R1 deployments (which bind the scale-out network).\n'
            'Collectives cost a latency (``collective_latency_s`` per collective plus ``scale_up_latency_s``\n'
            'per NVLink round, fitted) plus bytes over the link; a pass pays ``sequence_overhead_s`` per\n'
            'sequence on its attention rank and reads KV at ``attention_memory`` of HBM bandwidth (both\n'
            'fitted); ``fixed`` holds what is not fitted: the\n'
            'NVLink bandwidth efficiency at its documented bus bandwidth and the NIC round latency.\n'
            '``std_error`` is the Gauss-Newton standard error at the optimum; ``cross_validated`` the\n'
            'held-out errors leaving one GPU / one engine out; ``in_sample`` the errors on every run.\n"""\n\n'
            '__all__ = ["CALIBRATED"]\n\n'
            f"CALIBRATED = {pprint.pformat(data, width=100, sort_dicts=False)}\n")
    Path(path).write_text(text)
    return Path(path)
