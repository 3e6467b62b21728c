"""The parameters of every registered admission and autoscaler kind, with their type, unit, range,
default and meaning (what ``tokenfactory describe schema kinds`` prints).

A kind's builder (:mod:`tokenfactory.registry.admission_kinds`, :mod:`~tokenfactory.registry.autoscaler_kinds`)
accepts exactly the keys listed here, and :func:`tokenfactory.registry.build_admission` /
:func:`~tokenfactory.registry.build_autoscalers` check their values against them;
``tests/test_reference.py`` reads the accepted keys off the builder's own rejection of an unknown key
and fails when a kind accepts a key this table does not document, or documents one it does not
accept. Defaults are the builders' (a default of ``None``: derived from the plant, as the meaning
says); ranges are those the controllers check.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tokenfactory.controllers.dynamo_planner import PLANNER_MODES, PLANNER_PREDICTORS
from tokenfactory.controllers.admission import ThresholdAdmission
from tokenfactory.controllers.slo_admission import DEFAULT_TTFT_FRACTION, MarginLoopConfig
from tokenfactory.core.validation import config_schema, setting
from tokenfactory.registry.autoscaler_kinds import HystereticParams
from tokenfactory.registry.kinds import DEFAULT_TPOT_FRACTION

__all__ = ["KIND_SETTINGS", "OUTER_LOOP_SCHEMA", "kind_schema"]

_POS = dict(low=0.0, low_inclusive=False)

#: the keys of the ``slo-aware`` kind's ``outer`` table (the loop on outcomes)
OUTER_LOOP_SCHEMA = {f.name: f for f in dataclasses.fields(MarginLoopConfig)}

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
_WATERMARK = {
    "sample_period_s": setting(0.25, unit="s", **_POS, source="the orchestrator samples every 250 ms",
                               meaning="seconds between samples"),
}
_DYNAMO_THROUGHPUT = {
    "predictor": setting("constant", kind=str, choices=("constant", "arima", "kalman"),
                         meaning="the load predictor Dynamo's throughput mode uses"),
    "demand": setting("admitted", kind=str, choices=("admitted", "offered"),
                      meaning="the request count it predicts: admitted, or offered (the frontend's arrivals, "
                              "before an admission layer's rejections)"),
    "warmup": setting(None, kind="list of numbers", unit="requests/s",
                      meaning="interval rates before the run, oldest first (Dynamo's warm-up trace)"),
}
_DYNAMO_LOAD = {
    "target": setting("load", kind=str, choices=("throughput", "load"),
                      meaning="Dynamo's optimisation target: its load thresholds or its throughput ones"),
}
_DYNAMO_PLANNER = {
    "mode": setting("throughput", kind=str, choices=PLANNER_MODES, meaning="Dynamo's optimization_target"),
    "predictor": setting("constant", kind=str, choices=PLANNER_PREDICTORS, meaning="Dynamo's load predictor"),
    "planner_config": setting(None, kind="table",
                              meaning="Dynamo PlannerConfig fields, passed to the real planner (unknown ones "
                                      "rejected by it)"),
}

#: layer -> kind -> {key: setting}; a kind without parameters has an empty table
KIND_SETTINGS: dict[str, dict[str, dict[str, Any]]] = {
    "admission": {"open": {}, "naive": _NAIVE, "threshold": _THRESHOLD, "smoothed": _SMOOTHED,
                  "slo-aware": _SLO_AWARE, "vllm-watermark": _WATERMARK, "mooncake": {}, "mooncake-predictive": {}},
    "reconfiguration": {"hpa": {}, "kpa": {}, "dynamo-throughput": _DYNAMO_THROUGHPUT, "dynamo-load": _DYNAMO_LOAD,
                        "dynamo-planner": _DYNAMO_PLANNER, "apa": {}, "hysteretic": {f.name: f for f in dataclasses.fields(HystereticParams)}},
}


def kind_schema(layer: str, kind: str) -> list[dict[str, Any]]:
    """The documented parameters of one kind (:func:`tokenfactory.core.validation.config_schema` rows).

    Parameters
    ----------
    layer : str
        ``"admission"`` or ``"reconfiguration"``.
    kind : str
        A registered kind of that layer.

    Returns
    -------
    list of dict
    """
    return config_schema(KIND_SETTINGS[layer][kind])
