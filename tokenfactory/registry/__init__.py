"""The registry: every controller kind by name, in one place.

Scenario files, studies and the CLI's choices all build controllers through this module, so a new
policy is added by one :func:`register` call (its builder, its accepted parameters and a line of
description) and appears everywhere - ``tokenfactory simulate --admission``, scenario TOML
``[controller] kind = ...``, the study comparisons.

A builder takes a :class:`PlantContext` (the roofline rates of the plant the controller will run on,
the pool sizes, SLOs and demand it is tuned for) and a mapping of parameters; unknown parameters
are rejected with their name.

* admission kinds (the seconds layer): ``open``, ``naive``, ``threshold``, ``smoothed``,
  ``slo-aware`` (the recommended one, :data:`RECOMMENDED_ADMISSION`: per-request SLO-aware
  admission with request classes, reserved interactive capacity and the gated decode batch cap)
  and today's baselines ``vllm-watermark``, ``mooncake``, ``mooncake-predictive``;
* autoscaler kinds (the reconfiguration layer, a builder returns one controller per pool, or one
  for both): ``hpa``, ``kpa``, ``dynamo-throughput``, ``dynamo-load``, ``dynamo-planner`` (NVIDIA's
  own planner code, the ``dynamo`` extra), ``apa`` and ``hysteretic``;
* :data:`CONTROL_PLANES`: the combinations deployments run (an autoscaler kind and an admission
  kind), used by the comparisons.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenfactory.core.classes import DEFAULT_CLASSES, INTERACTIVE, RequestClass, class_table
from tokenfactory.controllers.admission import CompletionTriggeredAdmission, SmoothedAdmission, ThresholdAdmission
from tokenfactory.controllers.autoscaling import (
    AIBrixAPA,
    DynamoLoadPlanner,
    DynamoThroughputPlanner,
    HorizontalPodAutoscaler,
    KnativeAutoscaler,
)
from tokenfactory.controllers.autotune import StabilityEnvelope, TuningReport, tune_smoothed_admission
from tokenfactory.controllers.batch_gate import BatchGate, largest_batch, pass_target_s, tune_batch_gate
from tokenfactory.controllers.early_rejection import EarlyRejection, WatermarkAdmission
from tokenfactory.controllers.slo_admission import (
    DEFAULT_TTFT_FRACTION,
    MarginLoopConfig,
    MarginLoopTuning,
    SLOAdmissionConfig,
    SLOAwareAdmission,
    tune_margin_loop,
    tune_slo_admission,
)
from tokenfactory.controllers.reconfiguration import HystereticPoolController, measured_need_noise
from tokenfactory.controllers.control_stack import ControlStack, StackLayer
from tokenfactory.controllers.tuning import PIGains, simc_pi
from tokenfactory.plant_models.des import DESParams
from tokenfactory.plant_models.fluid import FluidParams, FluidPlant
from tokenfactory.plant_models.fleet import PoolDynamics
from tokenfactory.core.validation import ConfigError, check_choice, check_number, check_settings, reject_unknown_keys

__all__ = ["PlantContext", "ControllerKind", "register", "ADMISSION_KINDS", "AUTOSCALER_KINDS",
           "CONTROL_PLANES", "build_admission", "build_autoscalers", "control_plane", "admission_kinds",
           "autoscaler_kinds", "smoothed_admission", "TARGET_UTILIZATION", "BASELINE_STACKS", "baseline_stack",
           "slo_aware_admission", "slo_admission_tuning", "margin_tuning", "batch_gate_for", "static_batch_cap", "batch_gate_tuning",
           "RECOMMENDED_ADMISSION", "DEFAULT_TPOT_FRACTION"]

#: the admission kind tokenfactory recommends (``simulate`` uses it when ``--admission`` is omitted)
RECOMMENDED_ADMISSION = "slo-aware"
#: share of the TPOT SLO a decode pass may take under the batch cap (the rest: ready-buffer waits
#: carried over a request's tokens and the spread of contexts in a batch)
DEFAULT_TPOT_FRACTION = 0.95

#: the utilisation every capacity-based autoscaler targets (15 % headroom for bursts)
TARGET_UTILIZATION = 0.85


@dataclass(frozen=True)
class PlantContext:
    """What a controller builder may know about the plant it will run on.

    Parameters
    ----------
    params : FluidParams
        Roofline rates and delays of one fill and one decode worker at the request shape.
    fill_workers, decode_workers : int
        Pool sizes the controller is tuned for (admission tunes at these; default 1 each).
    slo_ttft_s, slo_tpot_s : float
        The SLO the controller protects: time to first token and time per output token (s;
        defaults 2.0 and 0.1). Smoothed admission sheds what would wait longer than half the
        TTFT SLO; Mooncake early rejection rejects on the TTFT SLO.
    rate_rps : float or None
        Mean demand (requests/s); the hysteretic autoscaler derives its dead band from it and
        refuses to build without it. Default None.
    dynamics : PoolDynamics
        Start-up, warm-up and drain of workers; the hysteretic autoscaler's dwell and cooldown
        follow from start-up and warm-up (the baselines keep their documented timings).
    max_replicas : int
        Upper bound of every autoscaler (workers per pool; default 64); the lower bound is 1.
    arrival_times_s : array or None
        Arrival times of the replayed stream (s); the hysteretic controller measures its need
        noise on them when they span at least 45 minutes (else it uses a Poisson estimate).
    envelope : StabilityEnvelope
        Errors the admission tuning must tolerate (delay and service-rate factors, margin floors).
    service : ServiceModel, optional
        The service model ``params`` was sampled from: the roofline pass time at any batch and
        context and the fill step (the SLO-aware admission and the batch gate use it when given).
    classes : tuple of RequestClass
        Request classes (default empty: an ``interactive`` class with ``slo_ttft_s`` /
        ``slo_tpot_s`` and the default ``batch`` class).
    class_outputs : mapping, optional
        Per class name, ``(mean, short)`` output tokens of its requests (``short`` a low quantile:
        a short request's TPOT carries its ready wait over few tokens); default the plant's mean
        output for every class and a quarter of it.
    snapshot_dt : float
        The plant's sample period of its measurements (s; default 0.1).
    """

    params: FluidParams
    fill_workers: int = 1
    decode_workers: int = 1
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.1
    rate_rps: float | None = None
    dynamics: PoolDynamics = field(default_factory=PoolDynamics)
    max_replicas: int = 64
    arrival_times_s: Any = None
    envelope: StabilityEnvelope = field(default_factory=StabilityEnvelope)
    service: Any = None
    classes: tuple = ()
    class_outputs: Mapping[str, tuple[float, float]] | None = None
    snapshot_dt: float = 0.1

    def class_table(self) -> dict[str, RequestClass]:
        """The classes the controllers protect, highest priority first (:attr:`classes`, or an
        ``interactive`` class at this context's SLO plus the default ``batch`` class).

        Returns
        -------
        dict
            ``name -> RequestClass``.
        """
        if self.classes:
            return class_table(self.classes)
        batch = [c for c in DEFAULT_CLASSES if c.name != INTERACTIVE]
        return class_table([RequestClass(INTERACTIVE, self.slo_ttft_s, self.slo_tpot_s, 0), *batch])

    @property
    def plant(self) -> FluidPlant:
        """The admission-loop fluid plant at these pool sizes (what admission is tuned on)."""
        return FluidPlant(self.params, self.fill_workers, self.decode_workers)


@dataclass(frozen=True)
class ControllerKind:
    """One registered controller kind.

    Parameters
    ----------
    name : str
        The name users type (``--admission NAME``, ``kind = "NAME"``).
    layer : str
        ``"admission"`` or ``"reconfiguration"``.
    summary : str
        One line: what it is and whose it is.
    build : callable
        ``build(ctx, params) -> controller`` (admission; ``None`` for no controller) or a list of
        controllers, one per pool (reconfiguration).
    keys : tuple of str
        Parameters the builder accepts; anything else is rejected.
    baseline : bool
        True for today's systems, False for tokenfactory's own controllers.
    build_tuned : callable, optional
        ``build_tuned(ctx, params, where=...) -> (controller, tuning report)`` for a kind tuned
        from the plant (scenario files report the tuning).
    scenario_defaults : mapping
        Parameters a scenario file's ``[controller]`` table gets unless it sets them.
    """

    name: str
    layer: str
    summary: str
    build: Callable[[PlantContext, dict], Any]
    keys: tuple[str, ...] = ()
    baseline: bool = False
    build_tuned: Callable[..., tuple[Any, Any]] | None = None
    scenario_defaults: Mapping[str, Any] = field(default_factory=dict)


ADMISSION_KINDS: dict[str, ControllerKind] = {}
AUTOSCALER_KINDS: dict[str, ControllerKind] = {}


def register(kind: ControllerKind) -> ControllerKind:
    """Add ``kind`` to the registry of its layer (a name may be registered once).

    Parameters
    ----------
    kind : ControllerKind
        The kind to add.

    Returns
    -------
    ControllerKind
        ``kind``, so the call can be used as an expression.
    """
    table = {"admission": ADMISSION_KINDS, "reconfiguration": AUTOSCALER_KINDS}.get(kind.layer)
    if table is None:
        raise ConfigError("kind.layer", f"{kind.layer!r} is not one of 'admission', 'reconfiguration'")
    if kind.name in table:
        raise ConfigError("kind.name", f"{kind.name!r} is already registered in the {kind.layer} layer")
    table[kind.name] = kind
    return kind


def admission_kinds() -> tuple[str, ...]:
    """Names of the registered admission kinds, in registration order.

    Returns
    -------
    tuple of str
        What ``tokenfactory simulate --admission`` and a scenario's ``[controller] kind`` accept.
    """
    return tuple(ADMISSION_KINDS)


def autoscaler_kinds() -> tuple[str, ...]:
    """Names of the registered autoscaler kinds, in registration order.

    Returns
    -------
    tuple of str
        The kinds :func:`build_autoscalers` accepts.
    """
    return tuple(AUTOSCALER_KINDS)


def _lookup(table: Mapping[str, ControllerKind], kind: str, where: str) -> ControllerKind:
    if kind not in table:
        raise ConfigError(where, f"{kind!r} is not one of {', '.join(table)}")
    return table[kind]


def build_admission(kind: str, ctx: PlantContext, params: Mapping[str, Any] | None = None,
                    where: str = "admission") -> Any:
    """A fresh admission controller of ``kind`` for the plant in ``ctx``.

    Parameters
    ----------
    kind : str
        A registered admission kind (:func:`admission_kinds`).
    ctx : PlantContext
        The plant it will run on.
    params : mapping, optional
        The kind's parameters (its ``keys``; a ``kind`` entry is ignored, so a scenario's
        ``[controller]`` table can be passed whole); unknown ones raise :class:`ConfigError`.
    where : str
        Field path used in error messages (default ``"admission"``).

    Returns
    -------
    controller or None
        ``None`` for ``open`` (admit everything).
    """
    k = _lookup(ADMISSION_KINDS, kind, f"{where}.kind" if params else where)
    p = dict(params or {})
    p.pop("kind", None)
    reject_unknown_keys(where, p, k.keys)
    _check_documented(where, k, p)
    return k.build(ctx, p)


def build_autoscalers(kind: str, ctx: PlantContext, params: Mapping[str, Any] | None = None,
                      where: str = "autoscaler") -> list:
    """Fresh autoscalers of ``kind``, one per pool, with their documented defaults.

    The capacity-based kinds (``dynamo-throughput``, ``hysteretic``) size pools to the roofline
    per-worker capacity x :data:`TARGET_UTILIZATION`. The metric-target kinds keep their own
    targets: ``hpa`` and ``apa`` 0.7 fill utilisation and 0.8 KV occupancy, ``kpa`` 0.7 and
    0.8 of a replica's concurrency at full rate (Little's law), ``dynamo-load`` Dynamo's
    ``load`` target (:func:`~tokenfactory.controllers.autoscaling.dynamo_load_thresholds`). Every kind is bounded to [1, ``ctx.max_replicas``].

    Parameters
    ----------
    kind : str
        A registered autoscaler kind (:func:`autoscaler_kinds`).
    ctx : PlantContext
        The plant and demand they size.
    params : mapping, optional
        The kind's parameters (a ``kind`` entry is ignored); unknown ones raise
        :class:`ConfigError`.
    where : str
        Field path used in error messages (default ``"autoscaler"``).

    Returns
    -------
    list
        One controller per pool (fill, decode).
    """
    k = _lookup(AUTOSCALER_KINDS, kind, where)
    p = dict(params or {})
    p.pop("kind", None)
    reject_unknown_keys(where, p, k.keys)
    _check_documented(where, k, p)
    return k.build(ctx, p)


def _check_documented(where: str, k: ControllerKind, p: Mapping[str, Any]) -> None:
    """Check a kind's parameters against their documented types and ranges
    (:data:`tokenfactory.registry.kind_settings.KIND_SETTINGS`), naming the key the user wrote."""
    from tokenfactory.registry.kind_settings import KIND_SETTINGS  # it reads this module's defaults

    if k.name in KIND_SETTINGS.get(k.layer, {}):
        check_settings(where, p, KIND_SETTINGS[k.layer][k.name])


# ------------------------------------------------------------------------------------------
# admission kinds


def _open(ctx: PlantContext, p: dict) -> None:
    return None


def _naive(ctx: PlantContext, p: dict) -> CompletionTriggeredAdmission:
    return CompletionTriggeredAdmission(open_gain=p.get("open_gain", 0.5), low_water=p.get("low_water", 50.0),
                                        open_floor=p.get("open_floor", 1.0),
                                        sample_period=p.get("sample_period_s", 0.05))


def _threshold(ctx: PlantContext, p: dict) -> ThresholdAdmission:
    return ThresholdAdmission(threshold=p.get("threshold", 1.05), hysteresis=p.get("hysteresis", 0.0),
                              signal=p.get("signal", "kv_occupancy"), open_rate=p.get("open_rate"),
                              sample_period=p.get("sample_period_s", 0.1))


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
    p = dict(p or {})
    T = p.get("sample_period_s", 0.25)
    ctrl, report = tune_smoothed_admission(
        ctx.plant, sample_period=T, filter_tau=p.get("filter_tau_s"),
        service_filter_tau=p.get("service_filter_tau_s", 5.0), envelope=ctx.envelope,
        safety_z=p.get("safety_z", 2.0), backlog_bound_s=p.get("backlog_bound_s", 0.5 * ctx.slo_ttft_s))
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
def _gate_tuning(delay: float, pass_s: float, snapshot: float, period: float, check_ungated: bool = False,
                 delay_factors: tuple = (0.5, 1.0, 2.0), slope_factors: tuple = (0.7, 1.0, 1.3),
                 gm_floor: float = 2.0, pm_floor_deg: float = 45.0):
    """:func:`tune_batch_gate`, cached (its arguments are plain numbers and tuples)."""
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
    return _gate_tuning(round(measurement_delay_s, 6), round(gate.target_s, 6), round(snapshot_dt, 6),
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
    reject_unknown_keys(where, p, ("tpot_fraction", "sample_period_s", "gated", "gain"))
    fn, slots, nominal = _pass_model(ctx)
    top, short = _top_short_output(ctx)
    frac = check_number(f"{where}.tpot_fraction", p.get("tpot_fraction", DEFAULT_TPOT_FRACTION), low=0.0, high=1.0,
                        low_inclusive=False)
    T = check_number(f"{where}.sample_period_s", p.get("sample_period_s", 0.25), low=0.0, low_inclusive=False)
    gain = p.get("gain")
    if gain is None:
        gain = _gate_tuning(round(ctx.params.measurement_delay_s, 6), round(_pass_target(ctx, frac), 6),
                            round(ctx.snapshot_dt, 6), round(T, 6)).gain
    return BatchGate(fn, slo_tpot_s=top.slo_tpot_s, max_batch=max(slots, 1.0), nominal_context_tokens=nominal,
                     tpot_fraction=frac, gain=gain, gated=bool(p.get("gated", True)), short_output_tokens=short,
                     kv_transfer_s=_transfer_s(ctx), sample_period=T)


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
    reject_unknown_keys(where, p, _SLO_KEYS)
    fp, svc = ctx.params, ctx.service
    T = check_number(f"{where}.sample_period_s", p.get("sample_period_s", 0.25), low=0.0, low_inclusive=False)
    frac = check_number(f"{where}.tpot_fraction", p.get("tpot_fraction", DEFAULT_TPOT_FRACTION), low=0.0, high=1.0,
                        low_inclusive=False)
    ttft_fraction = p.get("ttft_fraction", DEFAULT_TTFT_FRACTION)
    wait_fraction = p.get("wait_target_fraction", 0.5)
    filt = p.get("filter_tau_s", 0.5)
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
        prompt = float((fp.provenance or {}).get("shape", {}).get("prompt_tokens", 1.0))
        token_rate, step, cached_cost, transfer = fp.fill_rate_per_worker * prompt, fp.fill_latency_s, 0.0, \
            fp.kv_transfer_s
        chunk = math.inf
    outs = ctx.class_outputs or {}
    mean_out = {n: float(outs[n][0]) if n in outs else fp.output_tokens for n in classes}
    short_out = {n: float(outs[n][1]) if n in outs else 0.25 * mean_out[n] for n in classes}
    theta_fill, theta_decode = _gate_delays(fp.measurement_delay_s, T, filt, wait_fraction * max(
        ttft_fraction * top.slo_ttft_s - step, 0.0), step, transfer)
    tuning = _slo_tuning(round(theta_fill, 6), round(theta_decode, 6), round(T, 6))
    gate = batch_gate_for(ctx, {"tpot_fraction": frac, "sample_period_s": T}) if p.get("batch_gate", True) else None
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
        reserve_z=p.get("reserve_z", 2.33), completion_z=p.get("completion_z", 2.0),
        decode_reserve_z=p.get("decode_reserve_z", 0.0), preempt_z=p.get("preempt_z", 1.0), sample_period=T,
        fill_workers=float(max(ctx.fill_workers, 1)), decode_slots=float(slots), outer=outer)
    return SLOAwareAdmission(cfg, batch_gate=gate, fill_time_s=svc.request_fill_s if svc is not None else None)


_MARGIN_KEYS = ("sample_period_s", "ki", "quantile", "slack_target", "window", "min_samples", "initial_margin",
                "enabled")


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
    base = MarginLoopConfig(**{k: v for k, v in p.items() if k != "ki"})
    ki = p.get("ki", margin_tuning(ctx, base, outcome_delay_s).ki)
    return dataclasses.replace(base, ki=ki)


def _watermark(ctx: PlantContext, p: dict) -> WatermarkAdmission:
    return WatermarkAdmission(sample_period=p.get("sample_period_s", 0.25))  # the orchestrator samples every 250 ms


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


_SMOOTHED_KEYS = ("sample_period_s", "filter_tau_s", "service_filter_tau_s", "safety_z", "backlog_bound_s",
                  "kc", "ti", "target_ready")
_SLO_KEYS = ("sample_period_s", "ttft_fraction", "wait_target_fraction", "tpot_fraction", "filter_tau_s",
             "reserve_horizon_s", "reserve_z", "completion_z", "decode_reserve_z", "preempt_z", "batch_gate", "fill_ki",
             "decode_ki", "outer")
register(ControllerKind("open", "admission", "no admission control: every arrival enters the fill queue",
                        _open, baseline=True))
register(ControllerKind("naive", "admission", "completion-triggered admission (section 18's naive loop)", _naive,
                        ("sample_period_s", "open_gain", "low_water", "open_floor"), baseline=True))
register(ControllerKind("threshold", "admission", "on/off admission on a busy signal (503 on busy, Dynamo "
                        "frontend style)", _threshold,
                        ("sample_period_s", "threshold", "hysteresis", "signal", "open_rate"), baseline=True))
register(ControllerKind("smoothed", "admission", "tokenfactory: feed-forward + PI on the filtered ready buffer, "
                        "SIMC-tuned over a stability envelope",
                        lambda ctx, p: smoothed_admission(ctx, p)[0], _SMOOTHED_KEYS,
                        build_tuned=smoothed_admission,
                        # a scenario's loop sheds above 30 s of backlog (the feedback-oscillation study's bound)
                        scenario_defaults={"backlog_bound_s": 30.0}))
register(ControllerKind("slo-aware", "admission", "tokenfactory (recommended): admit, defer or reject each request "
                        "on its predicted TTFT and decode wait, per class, interactive capacity reserved, gated "
                        "decode batch cap", lambda ctx, p: slo_aware_admission(ctx, p), _SLO_KEYS))
register(ControllerKind("vllm-watermark", "admission", "vLLM's 1 % KV watermark: admit while KV has room",
                        _watermark, ("sample_period_s",), baseline=True))
register(ControllerKind("mooncake", "admission", "Mooncake early rejection on the current decode load "
                        "(FAST'25 sec. 7.2-7.3)", _mooncake(False), baseline=True))
register(ControllerKind("mooncake-predictive", "admission", "Mooncake prediction-based early rejection "
                        "(FAST'25 sec. 7.4)", _mooncake(True), baseline=True))


# ------------------------------------------------------------------------------------------
# autoscaler kinds


def _bounds(ctx: PlantContext) -> dict:
    return {"min_replicas": 1, "max_replicas": ctx.max_replicas}


def _rates(ctx: PlantContext) -> tuple[float, float]:
    return ctx.params.fill_rate_per_worker, ctx.params.decode_capacity(1)


def _hpa(ctx: PlantContext, p: dict) -> list:
    return [HorizontalPodAutoscaler("fill", 0.7, "fill_utilization", **_bounds(ctx)),
            HorizontalPodAutoscaler("decode", 0.8, "kv_occupancy", **_bounds(ctx))]


def _kpa(ctx: PlantContext, p: dict) -> list:  # concurrency per replica at the target utilisation (Little's law)
    mu_f, _ = _rates(ctx)
    return [KnativeAutoscaler("fill", 0.7 * mu_f * ctx.params.fill_to_ready_s, "fill_concurrency", **_bounds(ctx)),
            KnativeAutoscaler("decode", 0.8 * ctx.params.decode_slots_per_worker, "decode_concurrency",
                              **_bounds(ctx))]


def _dynamo_throughput(ctx: PlantContext, p: dict) -> list:
    from tokenfactory.controllers.load_predictors import make_load_predictor

    mu_f, mu_d = _rates(ctx)
    # Dynamo predicts the request count once per interval for both pools: one shared predictor
    pred = make_load_predictor(check_choice("autoscaler.predictor", p.get("predictor", "constant"),
                                            ("constant", "arima", "kalman")))
    demand = check_choice("autoscaler.demand", p.get("demand", "admitted"), ("admitted", "offered"))
    # "offered": the frontend's request count (arrivals, before an admission layer's rejections)
    metric = (lambda m: m.arrival_rate) if demand == "offered" else None
    warmup = p.get("warmup")

    def isl_scale(m):  # Dynamo predicts ISL too: the prompt length now over the nominal one
        return mu_f * m.fill_workers / m.fill_capacity if m.fill_capacity > 0 and m.fill_workers > 0 else 1.0

    return [DynamoThroughputPlanner("fill", TARGET_UTILIZATION * mu_f, predictor=pred, metric=metric,
                                    demand_scale=isl_scale, warmup=warmup, **_bounds(ctx)),
            DynamoThroughputPlanner("decode", TARGET_UTILIZATION * mu_d, predictor=pred, metric=metric,
                                    warmup=warmup, **_bounds(ctx))]


def _dynamo_load(ctx: PlantContext, p: dict) -> list:
    # Dynamo's load-based rules on the engine the real planner's adapter describes (same thresholds)
    from tokenfactory.controllers.autoscaling import DYNAMO_THROUGHPUT_TARGET, dynamo_load_thresholds
    from tokenfactory.controllers.dynamo_planner import DynamoCapabilities

    caps = DynamoCapabilities.from_context(ctx)
    target = check_choice("autoscaler.target", p.get("target", "load"), ("throughput", "load"))
    th = dynamo_load_thresholds(caps.fill_token_budget) if target == "load" else DYNAMO_THROUGHPUT_TARGET
    kw = dict(target=target, prompt_tokens=caps.prompt_tokens, context_tokens=caps.context_tokens,
              output_tokens=caps.output_tokens, fill_step_tokens=caps.fill_token_budget,
              kv_tokens_per_worker=caps.max_kv_tokens, **_bounds(ctx))
    return [DynamoLoadPlanner(pool, *th[pool], **kw) for pool in ("fill", "decode")]


def _dynamo_planner(ctx: PlantContext, p: dict) -> list:
    # the real planner (ai-dynamo), one controller sizing both pools; imported here: it is an extra
    from tokenfactory.controllers.dynamo_planner import DynamoCapabilities, DynamoPlanner

    cfg = p.get("planner_config") or {}
    if not isinstance(cfg, Mapping):
        raise ConfigError("autoscaler.planner_config", "must be a table of Dynamo PlannerConfig fields")
    return [DynamoPlanner(DynamoCapabilities.from_context(ctx), p.get("mode", "throughput"),
                          p.get("predictor", "constant"), config=cfg, slo_ttft_s=ctx.slo_ttft_s,
                          slo_tpot_s=ctx.slo_tpot_s, max_replicas=ctx.max_replicas)]


def _apa(ctx: PlantContext, p: dict) -> list:
    return [AIBrixAPA("fill", 0.7, "fill_utilization", **_bounds(ctx)),
            AIBrixAPA("decode", 0.8, "kv_occupancy", **_bounds(ctx))]


def _hysteretic(ctx: PlantContext, p: dict) -> list:
    if ctx.rate_rps is None:
        raise ConfigError("autoscaler", "the hysteretic controller needs the mean demand (PlantContext.rate_rps) "
                          "to derive its dead band")
    mu_f, mu_d = _rates(ctx)
    # a decode worker carries what its batch at the TPOT SLO completes, not its full KV batch
    # (the small plant of issue 21: 41 of 328 slots at a 50 ms TPOT, 2.7 instead of 11 req/s)
    p = ctx.params
    mu_d = min(mu_d, p.completion_rate(min(static_batch_cap(ctx), p.decode_slots_per_worker), 1))
    kw = dict(startup_s=ctx.dynamics.startup_s, warmup_s=ctx.dynamics.warmup_s,
              target_utilization=TARGET_UTILIZATION, **_bounds(ctx))
    arr = ctx.arrival_times_s
    out = []
    for pool, mu in (("fill", mu_f), ("decode", mu_d)):
        noise = None
        if arr is not None and len(arr) > 1 and float(np.max(arr) - np.min(arr)) >= 2700.0:
            noise = measured_need_noise(arr, mu, TARGET_UTILIZATION, 30.0)
        out.append(HystereticPoolController.tuned(pool, mu, ctx.rate_rps, noise_std=noise, **kw))
    return out


register(ControllerKind("hpa", "reconfiguration", "Kubernetes HPA (tolerance 0.1, scale-down stabilisation "
                        "300 s) on fill utilisation and KV occupancy", _hpa, baseline=True))
register(ControllerKind("kpa", "reconfiguration", "Knative KPA (stable window 60 s, panic window 6 s) on "
                        "concurrency", _kpa, baseline=True))
register(ControllerKind("dynamo-throughput", "reconfiguration", "NVIDIA Dynamo planner, throughput mode "
                        "(ceil(predicted demand / capacity) every 180 s)", _dynamo_throughput,
                        ("predictor", "demand", "warmup"), baseline=True))
register(ControllerKind("dynamo-load", "reconfiguration", "NVIDIA Dynamo planner's load-based rules "
                        "re-implemented (+-1 per 5 s tick on queued prompt tokens and KV use; target load or "
                        "throughput; agrees with dynamo-planner tick by tick)", _dynamo_load, ("target",),
                        baseline=True))
register(ControllerKind("dynamo-planner", "reconfiguration", "NVIDIA Dynamo's own planner (ai-dynamo 1.4.2, "
                        "unchanged; modes throughput, load, sla; Dynamo PlannerConfig fields in planner_config)",
                        _dynamo_planner, ("mode", "predictor", "planner_config"), baseline=True))
register(ControllerKind("apa", "reconfiguration", "AIBrix APA (fluctuation tolerances, 60 s window)", _apa,
                        baseline=True))
register(ControllerKind("hysteretic", "reconfiguration", "tokenfactory: pending-aware hysteretic pool "
                        "controller with a noise-derived dead band, dwell and cooldown", _hysteretic))


#: every control plane of the comparisons: (autoscaler kind or None, admission kind or None)
CONTROL_PLANES: dict[str, tuple[str | None, str | None]] = {
    "static + vllm-watermark": (None, "vllm-watermark"),
    "static + mooncake-early-rejection": (None, "mooncake"),
    "static + mooncake-predictive-rejection": (None, "mooncake-predictive"),
    "static + tokenfactory-smoothed": (None, "smoothed"),
    "kubernetes-hpa": ("hpa", None),
    "knative-kpa": ("kpa", None),
    "dynamo-throughput": ("dynamo-throughput", None),
    "dynamo-load": ("dynamo-load", None),
    # NVIDIA's own planner code (ai-dynamo), its default throughput target, in place of the rules above
    "dynamo-planner": ("dynamo-planner", None),
    "aibrix-apa": ("apa", None),
    "tokenfactory-hysteretic": ("hysteretic", None),
    "tokenfactory-hysteretic + smoothed": ("hysteretic", "smoothed"),
}


def control_plane(name: str, ctx: PlantContext) -> tuple[list, Any]:
    """Fresh controller objects for control plane ``name``.

    Parameters
    ----------
    name : str
        A key of :data:`CONTROL_PLANES`.
    ctx : PlantContext
        The plant, demand and pool sizes.

    Returns
    -------
    tuple
        ``(pool autoscalers, admission controller or None)``.
    """
    if name not in CONTROL_PLANES:
        raise ConfigError("control_plane", f"{name!r} is not one of {', '.join(CONTROL_PLANES)}")
    scaler, admission = CONTROL_PLANES[name]
    scalers = build_autoscalers(scaler, ctx) if scaler else []
    adm = build_admission(admission, ctx) if admission else None
    return scalers, adm


#: today's deployments as layered stacks (autoscaler kind, its parameters, admission kind or None):
#: the baselines of the layered-stack comparison, assembled as real deployments use them
BASELINE_STACKS: dict[str, tuple[str, dict, str | None]] = {
    "hpa + vllm-watermark": ("hpa", {}, "vllm-watermark"),
    "knative-kpa": ("kpa", {}, None),
    # Dynamo's planner counts requests at its frontend (before Mooncake's rejections); ARIMA is its default
    "dynamo-throughput (arima) + mooncake": ("dynamo-throughput", {"predictor": "arima", "demand": "offered"},
                                             "mooncake"),
    "dynamo-throughput (kalman) + mooncake": ("dynamo-throughput", {"predictor": "kalman", "demand": "offered"},
                                              "mooncake"),
    "dynamo-load + mooncake": ("dynamo-load", {}, "mooncake"),
    "aibrix-apa": ("apa", {}, None),
}


def baseline_stack(name: str, ctx: PlantContext, dt: float = 0.0, history=None) -> ControlStack:
    """A baseline deployment of :data:`BASELINE_STACKS` as a :class:`ControlStack` (admission and
    reconfiguration layers at their documented periods).

    Parameters
    ----------
    name : str
        A key of :data:`BASELINE_STACKS`.
    ctx : PlantContext
        The plant, demand and worker dynamics.
    dt : float
        The plant's step: an admission sampled faster than it is sampled every step (0.25 s
        orchestrator ticks on a 1 s grid are recorded as 1 s in the stack's params).
    history : pandas.Series, optional
        Demand before the run (requests/s, time index in s): Dynamo's predictors warm up on it
        (``load_predictor_warmup_trace``), resampled to their adjustment interval.

    Returns
    -------
    ControlStack
    """
    if name not in BASELINE_STACKS:
        raise ConfigError("baseline", f"{name!r} is not one of {', '.join(BASELINE_STACKS)}")
    scaler, params, admission = BASELINE_STACKS[name]
    params = dict(params)
    if history is not None and "warmup" in AUTOSCALER_KINDS[scaler].keys and len(history) > 1:
        t = history.index.to_numpy(dtype=float)
        grid = np.arange(t[0], t[-1] + 1e-9, 180.0)  # Dynamo's adjustment interval
        params["warmup"] = np.interp(grid, t, history.interpolate(limit_direction="both").to_numpy(dtype=float))
    scalers = build_autoscalers(scaler, ctx, params)
    layers = []
    if admission is not None:
        adm = build_admission(admission, ctx)
        adm.sample_period = max(adm.sample_period, dt)
        layers.append(StackLayer("admission", [adm], adm.sample_period))
        base = adm.sample_period
        for c in scalers:  # a layer's period is a multiple of the fastest one's
            c.sample_period = max(base, round(c.sample_period / base) * base)
    layers.append(StackLayer("reconfiguration", scalers, scalers[0].sample_period))
    return ControlStack(layers, name)
