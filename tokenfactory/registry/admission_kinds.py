"""The admission kinds (the seconds layer) and the decode batch gate they share: tokenfactory's
``smoothed`` and ``slo-aware`` (with their tunings), the ``naive`` and ``threshold`` loops, and
today's baselines (``open``, ``vllm-watermark``, ``mooncake``, ``mooncake-predictive``), each
registered by one :func:`~tokenfactory.registry.kinds.register` call."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from tokenfactory.controllers.admission import CompletionTriggeredAdmission, SmoothedAdmission, ThresholdAdmission
from tokenfactory.controllers.autotune import TuningReport, tune_smoothed_admission
from tokenfactory.controllers.batch_gate import (
    BatchGate,
    BatchGateConfig,
    largest_batch,
    pass_target_s,
    tune_batch_gate,
)
from tokenfactory.controllers.early_rejection import EarlyRejection, WatermarkAdmission
from tokenfactory.controllers.slo_admission import (
    DEFAULT_TTFT_FRACTION,
    MarginLoopConfig,
    MarginLoopTuning,
    SLOAdmissionConfig,
    SLOAwareAdmission,
    tune_flat_margin_gain,
    tune_margin_loop,
    tune_slo_admission,
)
from tokenfactory.controllers.tuning import PIGains, simc_pi
from tokenfactory.core.classes import RequestClass
from tokenfactory.core.validation import check_number, reject_unknown_keys, setting
from tokenfactory.plant_models.des import DESParams
from tokenfactory.registry.kinds import DEFAULT_TPOT_FRACTION, ControllerKind, PlantContext, register, with_defaults
from tokenfactory.registry.stack_layers import GatedBatchCap

__all__ = ["smoothed_admission", "slo_aware_admission", "slo_admission_tuning", "margin_tuning", "flat_margin_tuning",
           "batch_gate_for", "static_batch_cap", "batch_gate_tuning", "cached_gate_tuning"]

#: each kind's parameters (type, unit, range, default, meaning): the one place their defaults are
#: declared; the builders read them through :func:`~tokenfactory.registry.kinds.with_defaults`
_POS = dict(low=0.0, low_inclusive=False)


_NAIVE = {
    "sample_period_s": setting(0.05, unit="s", **_POS, meaning="seconds between samples"),
    "open_gain": setting(0.5, low=0.0, high=1.0, low_inclusive=False,
                         meaning="fractional swing of admission around the observed completion rate"),
    "low_water": setting(50.0, unit="requests", low=0.0, meaning="ready-queue level below which admission opens"),
    "open_floor": setting(1.0, unit="requests/s", low=0.0,
                          meaning="least admission rate while open, so an empty plant still starts"),
}
_THRESHOLD = {
    "sample_period_s": setting(0.1, unit="s", **_POS, meaning="seconds between samples"),
    "threshold": setting(1.05, low=0.0, meaning="level of the busy signal at or above which admission closes (a "
                                                "fraction for kv_occupancy and decode_utilization, requests for "
                                                "ready)"),
    "hysteresis": setting(0.0, low=0.0, meaning="width of the dead band below threshold (at most threshold): "
                                                "re-open below threshold - hysteresis"),
    "signal": setting("kv_occupancy", kind=str, choices=ThresholdAdmission.SIGNALS, meaning="the busy signal"),
    "open_rate": setting(None, unit="requests/s", low=0.0,
                         meaning="admission rate while open (absent: the measured fill capacity)"),
}
_SMOOTHED = {
    "sample_period_s": setting(0.25, unit="s", **_POS, meaning="admission's sample period"),
    "filter_tau_s": setting(None, unit="s", low=0.0, meaning="ready-buffer filter time constant (absent: the "
                                                             "sample period)"),
    "service_filter_tau_s": setting(5.0, unit="s", low=0.0, meaning="service-rate filter time constant"),
    "safety_z": setting(2.0, low=0.0, meaning="Poisson safety factor of the ready target: safety_z sqrt(c x "
                                              "theta_eff) requests over c x theta_eff"),
    "backlog_bound_s": setting(None, unit="s", **_POS,
                               meaning="shed what would wait longer than this, in seconds of decode capacity "
                                       "(absent: half the TTFT SLO; a scenario file's default: 30)"),
    "kc": setting(None, **_POS, meaning="hand-tuned PI gain (absent: SIMC-tuned over the envelope)"),
    "ti": setting(None, unit="s", **_POS, meaning="hand-tuned PI integral time (absent: SIMC-tuned)"),
    "target_ready": setting(None, unit="requests", low=0.0,
                            meaning="hand-set ready-buffer target (absent: tuned from the loop delay)"),
}
_SLO_AWARE = {
    "sample_period_s": setting(0.25, unit="s", **_POS, meaning="admission's sample period"),
    "ttft_fraction": setting(DEFAULT_TTFT_FRACTION, low=0.0, high=1.0, low_inclusive=False,
                             source="overload study, mooncake-conversation (controllers.slo_admission)",
                             meaning="share of the TTFT SLO a request's predicted fill wait may take"),
    "wait_target_fraction": setting(0.5, low=0.0, high=1.0, low_inclusive=False,
                                    meaning="share of that limit the fill wait correction aims at"),
    "tpot_fraction": setting(DEFAULT_TPOT_FRACTION, low=0.0, high=1.0, low_inclusive=False,
                             meaning="share of the TPOT SLO a decode pass may take (the batch gate's target)"),
    "filter_tau_s": setting(0.5, unit="s", low=0.0, meaning="rate filter time constant"),
    "reserve_horizon_s": setting(None, unit="s", **_POS,
                                 meaning="horizon of the interactive reservation (absent: start-up + warm-up of "
                                         "the cluster's dynamics)"),
    "reserve_z": setting(2.33, low=0.0, meaning="quantile (z) of the top class's reservation (2.33: 99 %)"),
    "completion_z": setting(2.0, low=0.0, meaning="quantile (z) of the completions the gate counts on"),
    "decode_reserve_z": setting(0.0, low=0.0, meaning="quantile (z) of decode slots held for the top class"),
    "preempt_z": setting(1.0, low=0.0, meaning="quantile (z) of the occupancy a lower class may be preempted at"),
    "batch_gate": setting(True, kind=bool, meaning="run the gated decode batch cap with it"),
    "fill_ki": setting(None, low=0.0, meaning="integral gain of the fill limit correction (absent: SIMC-tuned)"),
    "decode_ki": setting(None, low=0.0, meaning="integral gain of the decode limit correction (absent: "
                                                "SIMC-tuned)"),
    "outer": setting(None, kind="table", meaning="the slow loop on admitted slack (admission.slo-aware.outer; its "
                                                 "ki absent: tuned for the plant)"),
}
_BATCH_GATE = {
    "tpot_fraction": setting(DEFAULT_TPOT_FRACTION, low=0.0, high=1.0, low_inclusive=False,
                             meaning="share of the top class's TPOT SLO a decode pass may take"),
    "sample_period_s": setting(GatedBatchCap.sample_period_s, unit="s", **_POS,
                               meaning="the cap's sample period (the stack's gated layer's)"),
    "gated": setting(None, kind=bool, meaning="hold every change until observed (absent: BatchGateConfig's "
                                              "default, gated)"),
    "gain": setting(None, **_POS, meaning="correction per change (absent: SIMC-tuned for the plant)"),
}
_WATERMARK = {
    "sample_period_s": setting(0.25, unit="s", **_POS, source="the orchestrator samples every 250 ms",
                               meaning="seconds between samples"),
}

def _open(ctx: PlantContext, p: dict) -> None:
    return None


def _naive(ctx: PlantContext, p: dict) -> CompletionTriggeredAdmission:
    p = with_defaults(_NAIVE, p)
    return CompletionTriggeredAdmission(open_gain=p["open_gain"], low_water=p["low_water"],
                                        open_floor=p["open_floor"], sample_period=p["sample_period_s"])


def _threshold(ctx: PlantContext, p: dict) -> ThresholdAdmission:
    p = with_defaults(_THRESHOLD, p)
    return ThresholdAdmission(threshold=p["threshold"], hysteresis=p["hysteresis"], signal=p["signal"],
                              open_rate=p.get("open_rate"), sample_period=p["sample_period_s"])


def smoothed_admission(ctx: PlantContext, p: Mapping[str, Any] | None = None,
                       where: str = "controller") -> tuple[SmoothedAdmission, TuningReport | None]:
    """tokenfactory's smoothed admission, SIMC-tuned on the fluid plant over ``ctx.envelope``.

    Without ``backlog_bound_s`` it sheds what would wait longer than half the TTFT SLO (the bound
    follows from the SLO, not from a guess). ``kc``/``ti``/``target_ready`` override the tuner
    (hand tuning; the report is then ``None``).

    Parameters
    ----------
    ctx : PlantContext
        The plant to tune on.
    p : mapping, optional
        ``sample_period_s``, ``filter_tau_s``, ``service_filter_tau_s``, ``safety_z``,
        ``backlog_bound_s``, ``kc``, ``ti``, ``target_ready``.
    where : str
        Field path used in error messages.

    Returns
    -------
    tuple
        ``(SmoothedAdmission, TuningReport or None)``.
    """
    p = with_defaults(_SMOOTHED, dict(p or {}))
    T = p["sample_period_s"]
    ctrl, report = tune_smoothed_admission(
        ctx.plant, sample_period=T, filter_tau=p.get("filter_tau_s"),
        service_filter_tau=p["service_filter_tau_s"], envelope=ctx.envelope,
        safety_z=p["safety_z"], backlog_bound_s=p.get("backlog_bound_s", 0.5 * ctx.slo_ttft_s))
    if "kc" in p or "ti" in p or "target_ready" in p:  # hand tuning overrides the auto-tuner
        gains = simc_pi(1.0, report.effective_delay_s, tau_c=report.tau_c_s)
        kc = check_number(f"{where}.kc", p.get("kc", gains.kc), low=0.0, low_inclusive=False)
        ti = check_number(f"{where}.ti", p.get("ti", gains.ti), low=0.0, low_inclusive=False)
        ctrl = SmoothedAdmission(p.get("target_ready", ctrl.target_ready),
                                 PIGains(kc, ti, report.tau_c_s, report.effective_delay_s),
                                 filter_tau=ctrl.filter_tau, service_filter_tau=ctrl.service_filter_tau,
                                 sample_period=T, rate_limit=ctrl.rate_limit, backlog_bound=ctrl.backlog_bound)
        report = None
    return ctrl, report


def _pass_table(svc) -> DESParams:
    """The service model's pass times sampled over (batch, context) (the request simulator's own
    tables), built once per service model and kept on it (not in a table keyed by its id)."""
    return svc.derived("des_params", DESParams.from_service)


def _pass_model(ctx: PlantContext) -> tuple[Callable[[float, float], float], float, float]:
    """(pass_time_s(batch, context), KV slots per worker, nominal context) of the decode worker:
    the service model's roofline over batch and context (sampled into the request simulator's
    table) when known, else the fluid plant's table over batch."""
    if ctx.service is not None:
        svc = ctx.service
        table = _pass_table(svc)
        return (lambda b, c: table.decode_pass(b, c)[0], float(svc.decode_slots), float(svc.decode_context_tokens))
    fp = ctx.params
    ctx_tokens = 1.0 if fp.decode_context_tokens is None else float(fp.decode_context_tokens)
    return (lambda b, c: fp.decode_step_s(b)), float(fp.decode_slots_per_worker), max(ctx_tokens, 1.0)


def static_batch_cap(ctx: PlantContext, tpot_fraction: float = DEFAULT_TPOT_FRACTION) -> float:
    """The decode batch cap an operator would configure once: the largest batch whose roofline
    pass time at the nominal context is within ``tpot_fraction`` of the TPOT SLO (whole
    sequences; what the baselines run with in the overload study).

    Parameters
    ----------
    ctx : PlantContext
        The plant.
    tpot_fraction : float
        Share of the top class's TPOT SLO a pass may take (default :data:`DEFAULT_TPOT_FRACTION`).

    Returns
    -------
    float
        Sequences per decode worker (at least 1, at most the KV slots). With the top class's
        short output tokens in ``ctx.class_outputs`` the target pass time is also bounded so
        that a short request can meet the SLO
        (:func:`tokenfactory.controllers.batch_gate.pass_target_s`).
    """
    check_number("tpot_fraction", tpot_fraction, low=0.0, high=1.0, low_inclusive=False)
    fn, slots, nominal = _pass_model(ctx)
    target = _pass_target(ctx, tpot_fraction)
    return float(max(1.0, np.floor(largest_batch(fn, target, nominal, max(slots, 1.0)))))


def _top_short_output(ctx: PlantContext) -> tuple[RequestClass, float | None]:
    top = next(iter(ctx.class_table().values()))
    outs = ctx.class_outputs or {}
    return top, (float(outs[top.name][1]) if top.name in outs else None)


def _transfer_s(ctx: PlantContext) -> float:
    svc = ctx.service
    return svc.kv_transfer_s(svc.kv_blob_bytes) if svc is not None else ctx.params.kv_transfer_s


def _pass_target(ctx: PlantContext, tpot_fraction: float) -> float:
    """The pass time the batch cap aims at for the top class (its short requests included)."""
    top, short = _top_short_output(ctx)
    return pass_target_s(top.slo_tpot_s, tpot_fraction, short, _transfer_s(ctx))


@functools.lru_cache(maxsize=64)
def cached_gate_tuning(delay: float, pass_s: float, snapshot: float, period: float, check_ungated: bool = False,
                       delay_factors: tuple = (0.5, 1.0, 2.0), slope_factors: tuple = (0.7, 1.0, 1.3),
                       gm_floor: float = 2.0, pm_floor_deg: float = 45.0):
    """:func:`tokenfactory.controllers.batch_gate.tune_batch_gate`, cached (its arguments are plain
    numbers and tuples; the stack's gate tuning shares the cache)."""
    return tune_batch_gate(delay, pass_s, snapshot_s=snapshot, sample_period_s=period, check_ungated=check_ungated,
                           delay_factors=delay_factors, slope_factors=slope_factors, gm_floor=gm_floor,
                           pm_floor_deg=pm_floor_deg)


def batch_gate_tuning(gate: BatchGate, measurement_delay_s: float, snapshot_dt: float = 0.1):
    """The gated batch controller's tuning and margins over the envelope, and the ungated rule's
    margins and describing-function cycle (:func:`tokenfactory.controllers.batch_gate.tune_batch_gate`
    with ``check_ungated``) for a gate built by :func:`batch_gate_for`.

    Parameters
    ----------
    gate : BatchGate
        The gate.
    measurement_delay_s : float
        The plant's measurement delay (s).
    snapshot_dt : float
        The plant's snapshot period (s; default 0.1).

    Returns
    -------
    BatchGateTuning
    """
    return cached_gate_tuning(round(measurement_delay_s, 6), round(gate.target_s, 6), round(snapshot_dt, 6),
                        round(gate.sample_period, 6), True)


def batch_gate_for(ctx: PlantContext, p: Mapping[str, Any] | None = None, where: str = "batch_gate") -> BatchGate:
    """The gated decode batch controller for the plant in ``ctx``, its correction gain
    SIMC-tuned (:func:`tokenfactory.controllers.batch_gate.tune_batch_gate`) for the plant's
    measurement delay and the pass time at the target.

    Parameters
    ----------
    ctx : PlantContext
        The plant.
    p : mapping, optional
        ``tpot_fraction`` (default :data:`DEFAULT_TPOT_FRACTION`), ``sample_period_s`` (0.25),
        ``gated`` (True), ``gain`` (default: tuned).
    where : str
        Field path for error messages.

    Returns
    -------
    BatchGate
    """
    p = dict(p or {})
    reject_unknown_keys(where, p, _BATCH_GATE)
    p = with_defaults(_BATCH_GATE, p)
    fn, slots, nominal = _pass_model(ctx)
    top, short = _top_short_output(ctx)
    frac = check_number(f"{where}.tpot_fraction", p["tpot_fraction"], low=0.0, high=1.0, low_inclusive=False)
    T = check_number(f"{where}.sample_period_s", p["sample_period_s"], low=0.0, low_inclusive=False)
    gain = p.get("gain")
    if gain is None:
        gain = cached_gate_tuning(round(ctx.params.measurement_delay_s, 6), round(_pass_target(ctx, frac), 6),
                            round(ctx.snapshot_dt, 6), round(T, 6)).gain
    given = {"gated": bool(p["gated"])} if "gated" in p else {}
    return BatchGate(fn, BatchGateConfig(slo_tpot_s=top.slo_tpot_s, max_batch=max(slots, 1.0),
                                         nominal_context_tokens=nominal, tpot_fraction=frac, gain=gain,
                                         short_output_tokens=short, kv_transfer_s=_transfer_s(ctx), sample_period=T,
                                         **given))


@functools.lru_cache(maxsize=64)
def _slo_tuning(theta_fill: float, theta_decode: float, h: float):
    return tune_slo_admission(theta_fill, theta_decode, h)


def _gate_delays(measurement_delay_s: float, T: float, filt: float, fill_target_s: float, step_s: float,
                 transfer_s: float) -> tuple[float, float]:
    """(theta_fill, theta_decode): measurement delay + T/2 (hold) + filter + h (= T, the gate's
    time in the rate form); decode adds the fill wait at its setpoint, one step and the transfer."""
    theta_fill = measurement_delay_s + T / 2 + filt + T
    return theta_fill, theta_fill + fill_target_s + step_s + transfer_s


def slo_admission_tuning(ctrl: SLOAwareAdmission, measurement_delay_s: float) -> dict:
    """The loop model, SIMC tuning and checks behind an SLO-aware admission controller: the fill
    and decode limit corrections' :class:`~tokenfactory.controllers.slo_admission.GateLoopTuning`
    over the envelope (delay x 0.5-2, prediction gain x 0.7-1.3; GM >= 2, PM >= 45 deg) with the
    describing-function check of the limits' clamps.

    Parameters
    ----------
    ctrl : SLOAwareAdmission
        A controller built by :func:`slo_aware_admission`.
    measurement_delay_s : float
        The plant's measurement delay (s).

    Returns
    -------
    dict
        ``{"fill": GateLoopTuning, "decode": GateLoopTuning}``.
    """
    T = ctrl.sample_period
    theta_fill, theta_decode = _gate_delays(measurement_delay_s, T, ctrl.filter_tau_s, ctrl.fill_target,
                                            ctrl.fill_step_s, ctrl.kv_transfer_s)
    return _slo_tuning(round(theta_fill, 6), round(theta_decode, 6), round(T, 6))


def slo_aware_admission(ctx: PlantContext, p: Mapping[str, Any] | None = None,
                        where: str = "controller") -> SLOAwareAdmission:
    """tokenfactory's SLO-aware admission for the plant in ``ctx``, with its decode batch gate.

    The fill rate and step come from the service model (chunked steps of the fill worker's
    token budget) or, without one, from the fluid plant; the limit corrections are SIMC-tuned
    over the envelope (:func:`tokenfactory.controllers.slo_admission.tune_slo_admission`) for
    delays theta_fill = measurement delay + T/2 + filter + h and theta_decode = theta_fill + the
    fill wait at its setpoint + one step + the KV transfer.

    Parameters
    ----------
    ctx : PlantContext
        The plant, its classes and their outputs.
    p : mapping, optional
        ``sample_period_s`` (0.25), ``ttft_fraction`` (0.9), ``wait_target_fraction`` (0.5),
        ``tpot_fraction`` (:data:`DEFAULT_TPOT_FRACTION`), ``filter_tau_s`` (0.5),
        ``reserve_horizon_s`` (start-up + warm-up of ``ctx.dynamics``), ``reserve_z`` (2.33),
        ``completion_z`` (2), ``decode_reserve_z`` (0), ``preempt_z`` (1),
        ``batch_gate`` (True), ``fill_ki``, ``decode_ki`` (default: tuned), ``outer`` (a table of
        :class:`~tokenfactory.controllers.slo_admission.MarginLoopConfig` fields; its ``ki``
        default: :func:`margin_tuning`). The prior sample (no fail-open) has ``ctx.fill_workers``
        and ``ctx.decode_workers`` x the static cap's slots.
    where : str
        Field path for error messages.

    Returns
    -------
    SLOAwareAdmission
    """
    p = dict(p or {})
    reject_unknown_keys(where, p, _SLO_AWARE)
    p = with_defaults(_SLO_AWARE, p)
    fp, svc = ctx.params, ctx.service
    T = check_number(f"{where}.sample_period_s", p["sample_period_s"], low=0.0, low_inclusive=False)
    frac = check_number(f"{where}.tpot_fraction", p["tpot_fraction"], low=0.0, high=1.0, low_inclusive=False)
    ttft_fraction = p["ttft_fraction"]
    wait_fraction = p["wait_target_fraction"]
    filt = p["filter_tau_s"]
    classes = ctx.class_table()
    top = next(iter(classes.values()))
    if svc is not None:
        prompt = float(svc.shape.prompt_tokens)
        budget = svc.fill_token_budget
        step = svc.fill_step_s(budget)
        token_rate = budget / step
        chunk = float(max(1, budget // max(int(svc.dp_attention), 1)))  # a replica's share of a step
        cached_cost = svc.fill_s_per_cached_token * token_rate
        transfer = svc.kv_transfer_s(svc.kv_blob_bytes)
    else:
        prompt = fp.prompt_tokens if fp.prompt_tokens > 0 else 1.0  # a compared field, not the provenance
        token_rate, step, cached_cost, transfer = fp.fill_rate_per_worker * prompt, fp.fill_latency_s, 0.0, \
            fp.kv_transfer_s
        chunk = math.inf
    outs = ctx.class_outputs or {}
    mean_out = {n: float(outs[n][0]) if n in outs else fp.output_tokens for n in classes}
    short_out = {n: float(outs[n][1]) if n in outs else 0.25 * mean_out[n] for n in classes}
    theta_fill, theta_decode = _gate_delays(fp.measurement_delay_s, T, filt, wait_fraction * max(
        ttft_fraction * top.slo_ttft_s - step, 0.0), step, transfer)
    tuning = _slo_tuning(round(theta_fill, 6), round(theta_decode, 6), round(T, 6))
    gate = batch_gate_for(ctx, {"tpot_fraction": frac, "sample_period_s": T}) if p["batch_gate"] else None
    # no fail-open: the prior sample's pools (decode slots at the static cap of the nominal context)
    kv_slots = float(svc.decode_slots) if svc is not None else float(fp.decode_slots_per_worker)
    slots = ctx.decode_workers * min(kv_slots, static_batch_cap(ctx, frac))
    outer = _margin_config(ctx, p.get("outer"), mean_out[top.name] * _pass_target(ctx, frac) + top.slo_ttft_s,
                           f"{where}.outer")
    cfg = SLOAdmissionConfig(
        fill_token_rate=token_rate, fill_step_s=step, kv_transfer_s=transfer, decode_pass_s=_pass_target(ctx, frac),
        prompt_tokens=prompt, output_tokens=mean_out, short_output_tokens=short_out, classes=tuple(classes.values()),
        ttft_fraction=ttft_fraction, wait_target_fraction=wait_fraction,
        fill_ki=p.get("fill_ki", tuning["fill"].ki), decode_ki=p.get("decode_ki", tuning["decode"].ki),
        filter_tau_s=filt, cached_token_cost=cached_cost, fill_chunk_tokens=chunk,
        reserve_horizon_s=p.get("reserve_horizon_s", ctx.dynamics.startup_s + ctx.dynamics.warmup_s),
        reserve_z=p["reserve_z"], completion_z=p["completion_z"],
        decode_reserve_z=p["decode_reserve_z"], preempt_z=p["preempt_z"], sample_period=T,
        fill_workers=float(max(ctx.fill_workers, 1)), decode_slots=float(slots), outer=outer)
    return SLOAwareAdmission(cfg, batch_gate=gate, fill_time_s=svc.request_fill_s if svc is not None else None)


#: the outer table's keys: every MarginLoopConfig field (a field added there is settable from a file)
_MARGIN_KEYS = tuple(f.name for f in dataclasses.fields(MarginLoopConfig))


def _margin_window_s(ctx: PlantContext, window: int) -> float:
    """Span of the outer loop's window: ``window`` completions at the plant's demand (or its
    fill capacity when the demand is unknown)."""
    rate = ctx.rate_rps if ctx.rate_rps else ctx.plant.fill_capacity
    return window / max(float(rate), 1e-3)


def margin_tuning(ctx: PlantContext, outer: MarginLoopConfig, outcome_delay_s: float) -> MarginLoopTuning:
    """The outer loop's SIMC tuning and margins (:func:`tokenfactory.controllers.slo_admission.tune_margin_loop`)
    for a plant: theta = half an outer sample + the top class's TTFT SLO and decode time of its
    mean request (admission to outcome), the window's span at the plant's demand.

    Parameters
    ----------
    ctx : PlantContext
        The plant.
    outer : MarginLoopConfig
        The loop's configuration.
    outcome_delay_s : float
        Admission to outcome of the top class's mean request (s).

    Returns
    -------
    MarginLoopTuning
    """
    return _margin_tuning(round(0.5 * outer.sample_period_s + outcome_delay_s, 3),
                          round(_margin_window_s(ctx, outer.window), 3))


@functools.lru_cache(maxsize=64)
def _margin_tuning(theta: float, window_s: float) -> MarginLoopTuning:
    return tune_margin_loop(theta, window_s)


def _margin_config(ctx: PlantContext, p, outcome_delay_s: float, where: str) -> MarginLoopConfig:
    p = dict(p or {})
    reject_unknown_keys(where, p, _MARGIN_KEYS)
    base = MarginLoopConfig(**{k: v for k, v in p.items() if k not in ("ki", "ki_flat")})
    ki = p.get("ki", margin_tuning(ctx, base, outcome_delay_s).ki)
    # the flat region's scheduled gain, on request (fast_start): SIMC at its measured gain, capped by
    # the start's overshoot
    ki_flat = p.get("ki_flat", flat_margin_tuning(ctx, base, outcome_delay_s, ki).ki if base.fast_start else None)
    return dataclasses.replace(base, ki=ki, ki_flat=ki_flat)


def flat_margin_tuning(ctx: PlantContext, outer: MarginLoopConfig, outcome_delay_s: float,
                       ki: float) -> MarginLoopTuning:
    """The outer loop's scheduled gain for the flat region and its certificate
    (:func:`tokenfactory.controllers.slo_admission.tune_flat_margin_gain`), at the delay and
    window :func:`margin_tuning` uses.

    Parameters
    ----------
    ctx : PlantContext
        The plant.
    outer : MarginLoopConfig
        The loop's configuration.
    outcome_delay_s : float
        Admission to outcome of the top class's mean request (s).
    ki : float
        The nominal gain.

    Returns
    -------
    MarginLoopTuning
    """
    return _flat_tuning(round(0.5 * outer.sample_period_s + outcome_delay_s, 3),
                        round(_margin_window_s(ctx, outer.window), 3), float(ki), float(outer.sample_period_s),
                        float(outer.miss_setpoint))


@functools.lru_cache(maxsize=64)
def _flat_tuning(theta: float, window_s: float, ki: float, sample_period_s: float,
                 miss_setpoint: float) -> MarginLoopTuning:
    return tune_flat_margin_gain(ki, theta, window_s, sample_period_s=sample_period_s, miss_setpoint=miss_setpoint)


def _watermark(ctx: PlantContext, p: dict) -> WatermarkAdmission:
    return WatermarkAdmission(sample_period=with_defaults(_WATERMARK, p)["sample_period_s"])


def _one_fill_s(ctx: PlantContext) -> float:
    """Prefill time of one nominal request with no queue: the service model's chunked step of its
    new tokens plus its cached prefix read (what the request simulator spends), else the fluid
    plant's fill latency (a pass of one prompt per attention replica)."""
    svc = ctx.service
    if svc is None:
        return ctx.params.fill_latency_s
    return svc.fill_step_s(min(svc.shape.prompt_tokens, svc.fill_token_budget)) \
        * max(1.0, svc.shape.prompt_tokens / svc.fill_token_budget) + svc.fill_s_per_cached_token * svc.shape.cached_tokens


def _mooncake(predictive: bool) -> Callable[[PlantContext, dict], EarlyRejection]:
    def build(ctx: PlantContext, p: dict) -> EarlyRejection:
        return EarlyRejection(fill_latency_s=_one_fill_s(ctx), slo_ttft_s=ctx.slo_ttft_s,
                              predictive=predictive)
    return build


register(ControllerKind("open", "admission", "no admission control: every arrival enters the fill queue",
                        _open, baseline=True))
register(ControllerKind("naive", "admission", "completion-triggered admission (section 18's naive loop)", _naive,
                        settings=_NAIVE, baseline=True))
register(ControllerKind("threshold", "admission", "on/off admission on a busy signal (503 on busy, Dynamo "
                        "frontend style)", _threshold,
                        settings=_THRESHOLD, baseline=True))
register(ControllerKind("smoothed", "admission", "tokenfactory: feed-forward + PI on the filtered ready buffer, "
                        "SIMC-tuned over a stability envelope",
                        lambda ctx, p: smoothed_admission(ctx, p)[0], settings=_SMOOTHED,
                        build_tuned=smoothed_admission,
                        # a scenario's loop sheds above 30 s of backlog (the feedback-oscillation study's bound)
                        scenario_defaults={"backlog_bound_s": 30.0}))
register(ControllerKind("slo-aware", "admission", "tokenfactory (recommended): admit, defer or reject each request "
                        "on its predicted TTFT and decode wait, per class, interactive capacity reserved, gated "
                        "decode batch cap", lambda ctx, p: slo_aware_admission(ctx, p), settings=_SLO_AWARE))
register(ControllerKind("vllm-watermark", "admission", "vLLM's 1 % KV watermark: admit while KV has room",
                        _watermark, settings=_WATERMARK, baseline=True))
register(ControllerKind("mooncake", "admission", "Mooncake early rejection on the current decode load "
                        "(FAST'25 sec. 7.2-7.3)", _mooncake(False), baseline=True))
register(ControllerKind("mooncake-predictive", "admission", "Mooncake prediction-based early rejection "
                        "(FAST'25 sec. 7.4)", _mooncake(True), baseline=True))
