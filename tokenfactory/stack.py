"""Stack scenarios: the whole layered control stack in one TOML, built and certified.

A stack scenario names the plant, the SLO, the nominal demand, the worker dynamics, each layer
(batch gate, admission, reconfiguration, planning) and the envelope the stack must hold over.
:func:`load_stack_scenario` validates it up front (unknown keys are errors naming the field),
:func:`build_stack` turns it into a :class:`tokenfactory.controllers.stack.ControlStack` for a
plant, and :func:`certify` computes the stack certificate (``tokenfactory certify``):

* every layer's gain, phase and delay margins over the envelope (delays, service rates, demand
  level; start-up times for the reconfiguration layer), with the binding point named;
* the separation of each adjacent pair of layers (:mod:`tokenfactory.controllers.separation`):
  inner closed-loop bandwidth, outer crossover, ratio, the outer loop's PM with the real inner loop;
* the describing-function check of every relay or saturation in a loop (admission's rate clip,
  the reconfiguration layer's whole-worker hysteresis relay);
* a verdict: passed when every floor holds.

.. code-block:: toml

    name = "default"
    [plant]                       # as in scenario files, without pool sizes
    model = "deepseek-v3"
    hardware = "h200"
    prompt_tokens = 914
    output_tokens = 155
    [slo]
    ttft_s = 2.0
    tpot_s = 0.1
    [workload]
    rate_rps = 760.0              # nominal demand the stack is tuned for
    [dynamics]
    startup_s = 600
    [layers.batch_gate]
    kind = "slot-limit"
    [layers.admission]
    kind = "smoothed"
    sample_period_s = 1.0
    [layers.reconfiguration]
    kind = "planned-hysteretic"
    sample_period_s = 10.0
    [layers.planning]
    kind = "forecast"
    forecaster = "holt-winters"
    [envelope]
    delay_factors = [0.5, 1.0, 2.0]
    service_rate_factors = [0.7, 1.0, 1.3]
    demand_factors = [0.5, 1.0, 1.5]
    startup_factors = [0.75, 1.0, 1.5]
    [certificate]
    min_separation = 5.0
    max_pm_loss_deg = 5.0
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import control
import numpy as np
import pandas as pd

from tokenfactory.controllers.autotune import StabilityEnvelope, admission_loop
from tokenfactory.controllers.batch_gate import (
    BatchGateTuning,
    batch_gate_loop,
    pass_target_s,
    predict_batch_cycle,
)
from tokenfactory.controllers.describing import predict_limit_cycles
from tokenfactory.controllers.planning import (
    HEADROOM_GRID,
    DemandPlanner,
    PlannedPoolController,
)
from tokenfactory.controllers.reconfiguration import need_noise_std
from tokenfactory.controllers.separation import (
    CascadePair,
    cascade_separation,
    closed_loop,
    closed_loop_bandwidth,
    first_order_lag,
    reconfiguration_loop,
    simc_queue_clear_s,
)
from tokenfactory.controllers.slo_admission import slo_gate_loop
from tokenfactory.controllers.stability import DelayedLoop, stability_margins
from tokenfactory.controllers.stack import (
    CapacityScaledBound,
    ControlStack,
    RoleBalancer,
    StackLayer,
)
from tokenfactory.plant_models.fluid import FluidParams, FluidPlant
from tokenfactory.plant_models.pools import PoolDynamics
from tokenfactory.registry import _gate_tuning  # the registry's cached tune_batch_gate
from tokenfactory.registry import (
    DEFAULT_TPOT_FRACTION,
    PlantContext,
    batch_gate_for,
    slo_admission_tuning,
    slo_aware_admission,
    smoothed_admission,
)
from tokenfactory.scenario import build_plant
from tokenfactory.validation import (
    ConfigError,
    check_choice,
    check_int,
    check_number,
    load_toml,
    reject_unknown_keys,
)

__all__ = ["StackScenario", "StackPlant", "load_stack_scenario", "stack_scenario_from_dict", "slot_limit",
           "build_stack", "reconfiguration_delay_s", "Certificate", "certify", "scenario_dir", "RateWorkload",
           "rate_workload", "plant_for", "utilization_ceiling", "run_on_rates", "stack_plant", "mixed_workload",
           "MIX_CLASSES", "STATIC_SPLIT", "gate_fraction", "gate_tuning", "GATE_SAMPLE_PERIOD_S",
           "gate_sample_period_s"]

_TOP = {"name", "description", "plant", "slo", "workload", "dynamics", "layers", "envelope", "certificate"}
_PLANT = {"model", "hardware", "parallelism", "efficiency", "decode_model", "decode_hardware", "decode_parallelism",
          "prompt_tokens", "output_tokens", "cached_tokens", "measurement_delay_s", "kv_stripes", "kv_setup_s"}
_LAYERS = {"batch_gate", "admission", "reconfiguration", "planning"}
_GATE = {"kind", "tpot_fraction", "sample_period_s"}
_ADMISSION = {"kind", "sample_period_s", "filter_tau_s", "service_filter_tau_s", "safety_z", "backlog_bound_s",
              "ttft_fraction", "wait_target_fraction", "tpot_fraction", "reserve_z", "completion_z"}
#: the keys each admission kind takes (the rest of ``_ADMISSION`` belongs to the other kind)
_ADMISSION_BY_KIND = {"smoothed": {"kind", "sample_period_s", "filter_tau_s", "service_filter_tau_s", "safety_z",
                                   "backlog_bound_s"},
                      "slo-aware": {"kind", "sample_period_s", "filter_tau_s", "ttft_fraction", "wait_target_fraction",
                                    "tpot_fraction", "reserve_z", "completion_z"}}
_RECONF = {"kind", "sample_period_s", "target_utilization", "queue_clear_s", "filter_s", "min_dead_band",
           "max_step_up", "max_step_down", "queue_headroom", "role_moves", "fleet_size", "headroom", "dwell_s",
           "cooldown_s", "down_cooldown_s"}
_PLANNING = {"kind", "days", "excess_budget", "interval_s", "refit_s", "fine_s", "max_headroom", "use_profile"}
_ENVELOPE = {"delay_factors", "service_rate_factors", "demand_factors", "startup_factors", "gm_floor", "pm_floor_deg"}
_CERT = {"min_separation", "max_pm_loss_deg"}


def scenario_dir() -> Path:
    """The folder of the shipped scenarios (``studies/scenarios``), located as package data without
    importing the studies (a layer above this one)."""
    import importlib.util

    spec = importlib.util.find_spec("tokenfactory.studies")
    return Path(list(spec.submodule_search_locations)[0]) / "scenarios"


@dataclass
class StackScenario:
    """A resolved stack scenario (validated; built lazily by :func:`build_stack`).

    Parameters
    ----------
    name : str
        The scenario's name.
    params : FluidParams
        Roofline rates at the scenario's request shape (no slot limit yet).
    slo_ttft_s, slo_tpot_s : float
        The SLO (s, s per output token).
    rate_rps : float
        Nominal demand the stack is tuned at (requests/s).
    dynamics : PoolDynamics
        Worker start-up, warm-up and drain.
    layers : dict
        Each layer's validated table (``batch_gate``, ``admission``, ``reconfiguration``, ``planning``).
    envelope : StabilityEnvelope
        Delay and service-rate factors and the margin floors.
    demand_factors, startup_factors : tuple of float
        The rest of the envelope.
    min_separation, max_pm_loss_deg : float
        The certificate's separation floors.
    config : dict
        The parsed TOML (reported, and re-read for another request shape).
    slo_attainment : float
        Share of requests that must meet the SLO.
    """

    name: str
    params: FluidParams              # roofline rates at the scenario's request shape (no slot limit yet)
    slo_ttft_s: float
    slo_tpot_s: float
    rate_rps: float
    dynamics: PoolDynamics
    layers: dict[str, dict]
    envelope: StabilityEnvelope
    demand_factors: tuple[float, ...]
    startup_factors: tuple[float, ...]
    min_separation: float = 5.0
    max_pm_loss_deg: float = 5.0
    config: dict = field(default_factory=dict)
    slo_attainment: float = 0.99

    def with_overrides(self, *, params: FluidParams | None = None, rate_rps: float | None = None,
                       dynamics: PoolDynamics | None = None, planning: bool | None = None,
                       slo: tuple[float, float] | None = None) -> "StackScenario":
        """A copy for another plant, demand or start-up (the study and ``simulate`` reuse one file)."""
        layers = {k: dict(v) for k, v in self.layers.items()}
        if planning is False:
            layers.pop("planning", None)
        s = dataclasses.replace(self, layers=layers)
        if params is not None:
            s.params = params
        if rate_rps is not None:
            s.rate_rps = check_number("workload.rate_rps", rate_rps, low=0.0, low_inclusive=False)
        if dynamics is not None:
            s.dynamics = dynamics
        if slo is not None:
            s.slo_ttft_s, s.slo_tpot_s = slo
        return s


def _factors(d: Mapping, key: str, default: tuple[float, ...]) -> tuple[float, ...]:
    v = d.get(key, default)
    if not isinstance(v, (list, tuple)) or not v:
        raise ConfigError(f"envelope.{key}", f"expected a non-empty list of factors, got {v!r}")
    return tuple(check_number(f"envelope.{key}[{i}]", x, low=0.0, low_inclusive=False) for i, x in enumerate(v))


def stack_scenario_from_dict(d: Mapping[str, Any], name: str = "stack") -> StackScenario:
    """Validate and resolve a stack scenario (see the module docstring for the layout).

    Parameters
    ----------
    d : mapping
        The parsed TOML.
    name : str
        Default name.

    Returns
    -------
    StackScenario
    """
    d = dict(d)
    reject_unknown_keys("", d, _TOP)
    for req in ("plant", "workload", "layers"):
        if req not in d:
            raise ConfigError(req, "missing section")
    plant_d = dict(d["plant"])
    reject_unknown_keys("plant", plant_d, _PLANT)
    params = build_plant({**plant_d, "fill_workers": 1, "decode_workers": 1}).params
    slo = dict(d.get("slo", {}))
    reject_unknown_keys("slo", slo, {"ttft_s", "tpot_s", "attainment"})
    ttft = check_number("slo.ttft_s", slo.get("ttft_s", 2.0), low=0.0, low_inclusive=False)
    tpot = check_number("slo.tpot_s", slo.get("tpot_s", 0.1), low=0.0, low_inclusive=False)
    attainment = check_number("slo.attainment", slo.get("attainment", 0.99), low=0.5, high=1.0, high_inclusive=False)
    wl = dict(d["workload"])
    reject_unknown_keys("workload", wl, {"rate_rps"})
    if "rate_rps" not in wl:
        raise ConfigError("workload.rate_rps", "missing")
    rate = check_number("workload.rate_rps", wl["rate_rps"], low=0.0, low_inclusive=False)
    dyn_d = dict(d.get("dynamics", {}))
    reject_unknown_keys("dynamics", dyn_d, {f.name for f in dataclasses.fields(PoolDynamics)})
    dynamics = PoolDynamics(**dyn_d)
    layers_d = d["layers"]
    if not isinstance(layers_d, Mapping):
        raise ConfigError("layers", "expected a table of layers")
    reject_unknown_keys("layers", layers_d, _LAYERS)
    layers: dict[str, dict] = {}
    for lname, keys, kinds in (("batch_gate", _GATE, ("slot-limit", "gated", "none")),
                               ("admission", _ADMISSION, ("smoothed", "slo-aware", "none")),
                               ("reconfiguration", _RECONF, ("planned-hysteretic",)),
                               ("planning", _PLANNING, ("seasonal-rise", "none"))):
        if lname not in layers_d:
            continue
        ld = dict(layers_d[lname])
        reject_unknown_keys(f"layers.{lname}", ld, keys)
        kind = check_choice(f"layers.{lname}.kind", ld.get("kind", kinds[0]), kinds)
        if kind == "none":
            continue
        ld["kind"] = kind
        layers[lname] = ld
    if "reconfiguration" not in layers:
        raise ConfigError("layers.reconfiguration", "a stack needs a reconfiguration layer")
    rc = layers["reconfiguration"]
    check_number("layers.reconfiguration.sample_period_s", rc.get("sample_period_s", 10.0), low=0.1, high=3600.0)
    check_number("layers.reconfiguration.target_utilization", rc.get("target_utilization", 0.85), low=0.1, high=1.0)
    check_number("layers.reconfiguration.headroom", rc.get("headroom", 0.0), low=0.0, high=2.0)
    for k in ("dwell_s", "cooldown_s", "down_cooldown_s", "filter_s"):
        if k in rc:
            check_number(f"layers.reconfiguration.{k}", rc[k], low=0.0)
    if "queue_clear_s" in rc:
        check_number("layers.reconfiguration.queue_clear_s", rc["queue_clear_s"], low=0.0, low_inclusive=False)
    if "fleet_size" in rc:
        check_int("layers.reconfiguration.fleet_size", rc["fleet_size"], low=2)
    if "admission" in layers:
        adm_l = layers["admission"]
        reject_unknown_keys(f"layers.admission (kind {adm_l['kind']})", adm_l, _ADMISSION_BY_KIND[adm_l["kind"]])
        check_number("layers.admission.sample_period_s", adm_l.get("sample_period_s", 1.0), low=0.01, high=60.0)
    if "batch_gate" in layers:
        frac = layers["batch_gate"].get("tpot_fraction", "auto")
        if frac != "auto":
            check_number("layers.batch_gate.tpot_fraction", frac, low=0.1, high=1.0)
        if "sample_period_s" in layers["batch_gate"]:
            if layers["batch_gate"]["kind"] != "gated":
                raise ConfigError("layers.batch_gate.sample_period_s", "only a gated batch cap is sampled")
            check_number("layers.batch_gate.sample_period_s", layers["batch_gate"]["sample_period_s"], low=0.01,
                         high=60.0)
    if "planning" in layers:
        pl = layers["planning"]
        check_int("layers.planning.days", pl.get("days", 3), low=1, high=14)
        check_number("layers.planning.excess_budget", pl.get("excess_budget", 0.75 * (1.0 - attainment)), low=0.0,
                     high=0.5, low_inclusive=False, high_inclusive=False)
        for k in ("interval_s", "refit_s", "fine_s", "max_headroom"):
            if k in pl:
                check_number(f"layers.planning.{k}", pl[k], low=0.0)
    env = dict(d.get("envelope", {}))
    reject_unknown_keys("envelope", env, _ENVELOPE)
    envelope = StabilityEnvelope(_factors(env, "delay_factors", (0.5, 1.0, 2.0)),
                                 _factors(env, "service_rate_factors", (0.7, 1.0, 1.3)),
                                 gm_floor=env.get("gm_floor", 2.0), pm_floor_deg=env.get("pm_floor_deg", 45.0))
    cert = dict(d.get("certificate", {}))
    reject_unknown_keys("certificate", cert, _CERT)
    return StackScenario(
        d.get("name", name), params, ttft, tpot, rate, dynamics, layers, envelope,
        _factors(env, "demand_factors", (0.5, 1.0, 1.5)), _factors(env, "startup_factors", (0.75, 1.0, 1.5)),
        check_number("certificate.min_separation", cert.get("min_separation", 5.0), low=1.0),
        check_number("certificate.max_pm_loss_deg", cert.get("max_pm_loss_deg", 5.0), low=0.0, high=90.0), dict(d),
        attainment)


def load_stack_scenario(path: str | Path) -> StackScenario:
    """Read and validate a stack scenario TOML (a path, or a shipped scenario's name).

    Parameters
    ----------
    path : str or Path
        A TOML file, or the name of one in :func:`scenario_dir` (``"stack_default"``).

    Returns
    -------
    StackScenario

    Raises
    ------
    ConfigError
        When the file does not exist, is not TOML, or a field is invalid (named).
    """
    path = Path(path)
    if not path.is_file() and (scenario_dir() / f"{path.name}.toml").is_file():
        path = scenario_dir() / f"{path.name}.toml"
    return stack_scenario_from_dict(load_toml(path), name=path.stem)


# ------------------------------------------------------------------------------------------
# building


def slot_limit(params: FluidParams, slo_tpot_s: float, tpot_fraction: float = 0.8) -> FluidParams:
    """The batch gate until the gated decode batch controller lands: decode slots per worker
    capped at the largest batch whose pass time is within ``tpot_fraction`` of the TPOT SLO
    (the rest of the SLO is left for the ready-buffer wait), never above the KV-memory limit.

    Parameters
    ----------
    params : FluidParams
        The plant.
    slo_tpot_s : float
        The TPOT SLO.
    tpot_fraction : float
        Share of the SLO a decode pass may take.

    Returns
    -------
    FluidParams
        ``params`` with ``decode_slots_per_worker`` capped (unchanged when the pass at full KV is fast enough).
    """
    limit = tpot_fraction * slo_tpot_s
    b, ts = np.asarray(params.decode_step_batches), np.asarray(params.decode_step_times_s)
    if params.decode_step_s(params.decode_slots_per_worker) <= limit:
        return params
    if ts[0] > limit:
        raise ConfigError("layers.batch_gate", f"even a batch of {b[0]:g} takes {ts[0]:.3f} s per pass, over "
                          f"{tpot_fraction:g} x the TPOT SLO {slo_tpot_s:g} s")
    # pass time is increasing in the batch: invert the table piecewise linearly
    cap = float(np.interp(limit, ts, b))
    return dataclasses.replace(params, decode_slots_per_worker=min(cap, params.decode_slots_per_worker))


def reconfiguration_delay_s(params: FluidParams, dynamics: PoolDynamics, sample_period_s: float,
                            startup_factor: float = 1.0) -> float:
    """The reconfiguration loop's dead time: start-up + the warm-up's lost capacity (warm-up x
    (1 - warm-up factor), the equivalent delay of a half-speed start) + half a sample + the
    measurement delay.

    Parameters
    ----------
    params : FluidParams
        The plant (its measurement delay).
    dynamics : PoolDynamics
        Start-up, warm-up and warm-up speed.
    sample_period_s : float
        The reconfiguration layer's period (s).
    startup_factor : float
        Multiplier of the start-up (the envelope's).

    Returns
    -------
    float
        The dead time (s).
    """
    return (dynamics.startup_s * startup_factor + dynamics.warmup_s * (1.0 - dynamics.warmup_factor)
            + sample_period_s / 2.0 + params.measurement_delay_s)


@dataclass
class StackPlant:
    """What a stack is built for: the plant (slot limit applied), pool sizes it is tuned at, and
    the admission tuning report.

    Parameters
    ----------
    params : FluidParams
        The plant with the batch gate applied.
    fill_workers, decode_workers : int
        Pool sizes at the nominal demand and the target utilisation.
    """

    params: FluidParams
    fill_workers: int
    decode_workers: int


def _feedback_utilization(sc: StackScenario) -> float:
    """The utilisation the reconfiguration layer sizes pools for (``layers.reconfiguration.
    target_utilization``); the planner's headroom comes on top of it."""
    return float(sc.layers["reconfiguration"].get("target_utilization", 0.85))


def _pools_at(params: FluidParams, rate: float, u: float, prompt_factor: float = 1.0,
             output_factor: float = 1.0) -> tuple[int, int]:
    return (max(1, math.ceil(rate * prompt_factor / (u * params.fill_rate_per_worker) - 1e-9)),
            max(1, math.ceil(rate * output_factor / (u * params.decode_capacity(1)) - 1e-9)))


def _first(v: float | pd.Series) -> float:
    """A factor's value at the run's start."""
    return float(v.iloc[0]) if isinstance(v, pd.Series) else float(v)


#: the smallest share of the TPOT SLO the derived batch gate gives the decode pass
GATE_FLOOR = 0.5


def gate_fraction(sc: StackScenario) -> float:
    """The share of the TPOT SLO a decode pass may take under the batch gate.

    ``layers.batch_gate.tpot_fraction = "auto"`` (the default) derives it from the admission layer:
    in a decode overload admission holds the ready buffer at its target R* = c theta_eff + z
    sqrt(c theta_eff) (what decode consumes over admission's loop delay, :func:`tokenfactory.
    controllers.autotune.tune_smoothed_admission`), plus fluctuations of about its safety term
    z sqrt(c theta_eff), so a request waits W = (R* + safety) / c for a slot and one pass to join
    the batch, spread over its L output tokens: TPOT = pass (1 + 1/L) + W / L. The pass may take
    fraction = (1 - W / (L x SLO)) / (1 + 1/L) of the SLO. Admission is tuned for this on the plant gated at the SLO itself (R* / c does not
    depend on the slots: theta_eff is delays only). Without an admission layer the ready wait is
    unbounded and the fraction defaults to 1 - 1 / L (one pass of slack). With SLO-aware admission,
    which bounds each request's ready wait itself, it is that admission's ``tpot_fraction``.

    Parameters
    ----------
    sc : StackScenario
        The scenario.

    Returns
    -------
    float
        The share, in (0, 1].
    """
    frac = sc.layers.get("batch_gate", {}).get("tpot_fraction", "auto")
    if frac != "auto":
        return float(frac)
    L = sc.params.output_tokens
    if "admission" not in sc.layers:
        return 1.0 - 1.0 / L
    if sc.layers["admission"]["kind"] == "slo-aware":
        # the SLO-aware gate bounds each request's ready wait itself: the cap aims at its pass target
        return float(sc.layers["admission"].get("tpot_fraction", DEFAULT_TPOT_FRACTION))
    return _auto_gate_fraction(sc.params, sc.slo_ttft_s, sc.slo_tpot_s, sc.rate_rps, _feedback_utilization(sc),
                               tuple(sorted((k, v) for k, v in sc.layers["admission"].items())), sc.envelope)


@functools.lru_cache(maxsize=32)
def _auto_gate_fraction(params: FluidParams, slo_ttft_s: float, slo_tpot_s: float, rate_rps: float, u: float,
                        admission: tuple, envelope: StabilityEnvelope) -> float:
    at_slo = slot_limit(params, slo_tpot_s, 1.0)
    nf, nd = _pools_at(at_slo, rate_rps, u)
    a = dict(admission)
    a.pop("kind", None)
    ctx = PlantContext(at_slo, nf, nd, slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s, envelope=envelope)
    _, rep = smoothed_admission(ctx, {"sample_period_s": a.pop("sample_period_s", 1.0), **a}, where="layers.admission")
    # the ready level fluctuates around its target by about the target's own Poisson safety term
    wait_s = (rep.target_ready + rep.target_ready_safety) / rep.consumption_rate
    L = params.output_tokens
    # a ready request also waits up to one pass to join the batch: TPOT = pass (1 + 1/L) + wait / L
    frac = (1.0 - wait_s / (L * slo_tpot_s)) / (1.0 + 1.0 / L)
    # short outputs cannot absorb admission's wait (15 tokens x 0.1 s is 1.5 s): the gate then keeps
    # half the SLO for the pass and a decode overload breaks TPOT (the certificate says so)
    return float(max(frac, GATE_FLOOR))


def stack_plant(sc: StackScenario) -> StackPlant:
    """The plant the stack runs on (the batch gate applied) and the pool sizes at nominal demand.

    Parameters
    ----------
    sc : StackScenario
        The scenario.

    Returns
    -------
    StackPlant
    """
    p = sc.params
    if "batch_gate" in sc.layers:
        p = slot_limit(p, sc.slo_tpot_s, gate_fraction(sc))
    nf, nd = _pools_at(p, sc.rate_rps, _feedback_utilization(sc))
    return StackPlant(p, nf, nd)


def overload_tpot_s(params: FluidParams, ready_wait_s: float) -> float:
    """TPOT of a request admitted into a saturated decode pool: the gated pass, one pass to join the
    batch, and the ready buffer's wait spread over its output tokens.

    Parameters
    ----------
    params : FluidParams
        The gated plant.
    ready_wait_s : float
        Time the request waits in the ready buffer (s).

    Returns
    -------
    float
        Seconds per output token.
    """
    L = params.output_tokens
    return params.decode_step_s(params.decode_slots_per_worker) * (1.0 + 1.0 / L) + ready_wait_s / L


def _admission(sc: StackScenario, plant: StackPlant, service=None, min_period_s: float = 0.0, class_outputs=None):
    """The admission layer's controller and its tuning report. SLO-aware: built for the gated plant
    (and ``service``, the request simulator's service model, when given), without a batch gate of
    its own; no report. Smoothed: tuned on the gated plant; when the gate could not leave room for
    admission's ready wait (short outputs, :data:`GATE_FLOOR`) the ready target is lowered so that a
    decode overload still meets the TPOT SLO: decode may then starve briefly, which costs
    throughput in an overload, not the SLO of what is admitted."""
    a = dict(sc.layers["admission"])
    kind = a.pop("kind")
    # a plant stepping slower than the layer samples runs it (and tunes it) at its step
    p = {"sample_period_s": max(a.pop("sample_period_s", 1.0), min_period_s), **a}
    ctx = PlantContext(plant.params, plant.fill_workers, plant.decode_workers, slo_ttft_s=sc.slo_ttft_s,
                       slo_tpot_s=sc.slo_tpot_s, envelope=sc.envelope)
    if kind == "slo-aware":
        # the stack's batch_gate layer is the gate: the admission runs without its own
        ctx = dataclasses.replace(ctx, service=service, dynamics=sc.dynamics, class_outputs=class_outputs)
        return slo_aware_admission(ctx, {**p, "batch_gate": False}, where="layers.admission"), None
    ctrl, rep = smoothed_admission(ctx, p, where="layers.admission")
    if rep is not None and "batch_gate" in sc.layers:
        q = plant.params
        allowed_s = (sc.slo_tpot_s - overload_tpot_s(q, 0.0)) * q.output_tokens  # ready wait within the SLO
        if (rep.target_ready + rep.target_ready_safety) / rep.consumption_rate > allowed_s:
            ctrl.target_ready = max(allowed_s * rep.consumption_rate - rep.target_ready_safety, 0.0)
    return ctrl, rep


#: the gated batch cap's default period (s): the overload study's gate (tokenfactory.registry.batch_gate_for)
GATE_SAMPLE_PERIOD_S = 0.25


def gate_sample_period_s(sc: StackScenario) -> float:
    """The gated batch cap's sample period (``layers.batch_gate.sample_period_s``, default
    :data:`GATE_SAMPLE_PERIOD_S`).

    Parameters
    ----------
    sc : StackScenario
        The scenario.

    Returns
    -------
    float
        Seconds.
    """
    return float(sc.layers.get("batch_gate", {}).get("sample_period_s", GATE_SAMPLE_PERIOD_S))


def gate_tuning(sc: StackScenario, snapshot_s: float = 0.1) -> BatchGateTuning:
    """The gated batch cap's SIMC tuning over the scenario's envelope (delay factors x the
    service-rate factors as the true/modelled pass-time slope) at its pass target.

    Parameters
    ----------
    sc : StackScenario
        The scenario (a ``gated`` batch gate layer).
    snapshot_s : float
        The plant's snapshot period (s; the request simulator's 0.1 by default).

    Returns
    -------
    BatchGateTuning

    Raises
    ------
    ConfigError
        When no gain meets the margin floors over the envelope.
    """
    env = sc.envelope
    target = pass_target_s(sc.slo_tpot_s, gate_fraction(sc))
    return _gate_tuning(sc.params.measurement_delay_s, target, snapshot_s, gate_sample_period_s(sc), True,
                        tuple(env.delay_factors), tuple(env.service_rate_factors), env.gm_floor, env.pm_floor_deg)


def _batch_gate(sc: StackScenario, plant: StackPlant, service=None, class_outputs=None):
    """The gated decode batch cap of a ``gated`` layer: the largest batch whose roofline pass time
    at the live context meets the gate's share of the TPOT SLO (:func:`gate_fraction`), its gain
    SIMC-tuned over the envelope (:func:`gate_tuning`), its largest cap the KV slots (the plant's
    slot limit is only where it starts). ``service`` (a ServiceModel) makes it follow the live
    context (the request simulator); without it the pass-time table at the nominal context."""
    ctx = PlantContext(sc.params, plant.fill_workers, plant.decode_workers, slo_ttft_s=sc.slo_ttft_s,
                       slo_tpot_s=sc.slo_tpot_s, envelope=sc.envelope, service=service, class_outputs=class_outputs)
    return batch_gate_for(ctx, {"tpot_fraction": gate_fraction(sc), "sample_period_s": gate_sample_period_s(sc),
                                "gain": gate_tuning(sc).gain}, where="layers.batch_gate")


def _queue_clear(sc: StackScenario, plant: StackPlant) -> tuple[float, float | None]:
    rc = sc.layers["reconfiguration"]
    if "queue_clear_s" in rc:
        return float(rc["queue_clear_s"]), None
    T = rc.get("sample_period_s", 10.0)
    theta = reconfiguration_delay_s(plant.params, sc.dynamics, T)
    u = _feedback_utilization(sc)
    # the envelope's start-up factors scale the start-up, not the whole dead time
    factors = tuple(reconfiguration_delay_s(plant.params, sc.dynamics, T, f) / theta for f in sc.startup_factors)
    return simc_queue_clear_s(theta, u, delay_factors=factors,
                              service_rate_factors=sc.envelope.service_rate_factors,
                              gm_floor=sc.envelope.gm_floor, pm_floor_deg=sc.envelope.pm_floor_deg)


def planning_lead_s(sc: StackScenario) -> float:
    """How far ahead the pools are sized: start-up + warm-up + a reconfiguration sample + the rate
    filter's time constant (the measured rate lags the demand by about that).

    Parameters
    ----------
    sc : StackScenario
        The scenario (its dynamics and reconfiguration layer).

    Returns
    -------
    float
        The lead (s).
    """
    rc = sc.layers["reconfiguration"]
    return (sc.dynamics.startup_s + sc.dynamics.warmup_s + rc.get("sample_period_s", 10.0)
            + rc.get("filter_s", 30.0))


def build_stack(sc: StackScenario, *, history: pd.Series | None = None, time_offset_s: float = 0.0,
                fleet_size: int | None = None, name: str | None = None, plant_step_s: float | None = None,
                service=None, class_outputs: Mapping[str, tuple[float, float]] | None = None
                ) -> tuple[ControlStack, StackPlant]:
    """A fresh :class:`ControlStack` for the scenario, and the plant it runs on.

    Parameters
    ----------
    sc : StackScenario
        The scenario.
    history : pandas.Series, optional
        Demand before the run for the planner (absolute time index, its interval).
    time_offset_s : float
        Absolute time of the run's t = 0.
    fleet_size : int, optional
        A fixed fleet (role moves): overrides ``layers.reconfiguration.fleet_size``.
    name : str, optional
        The stack's label.
    plant_step_s : float, optional
        The plant's step (s). A ``gated`` batch cap sampled faster than the plant steps (the pool
        model's seconds) is static there: its cap at the nominal context, which is the slot limit
        the plant already has (a fluid step averages over many decode passes).
    service : ServiceModel, optional
        The request simulator's service model: the gated cap follows the live context through it.
    class_outputs : mapping, optional
        Per request class, (mean, short-quantile) output tokens the orchestrator expects
        (:func:`tokenfactory.replay.class_outputs`): the batch cap's pass target and the SLO-aware
        admission's decode-wait limits leave a short request room for its join wait.

    Returns
    -------
    tuple
        ``(ControlStack, StackPlant)``; run it on ``StackPlant.params``.
    """
    plant = stack_plant(sc)
    p = plant.params
    layers = []
    if "batch_gate" in sc.layers:
        slot_note = (f"slot limit {p.decode_slots_per_worker:.0f} per decode worker "
                     f"(pass {p.decode_step_s(p.decode_slots_per_worker) * 1e3:.1f} ms)")
        gated = sc.layers["batch_gate"]["kind"] == "gated"
        if gated and (plant_step_s is None or plant_step_s <= gate_sample_period_s(sc) + 1e-12):
            gate = _batch_gate(sc, plant, service, class_outputs)
            layers.append(StackLayer("batch_gate", [gate], gate.sample_period))
        else:
            layers.append(StackLayer("batch_gate", note=slot_note + (
                f"; the gated cap samples every {gate_sample_period_s(sc):g} s, the plant steps every "
                f"{plant_step_s:g} s: its cap at the nominal context stands" if gated else "")))
    if "admission" in sc.layers:
        ctrl, _ = _admission(sc, plant, service, plant_step_s or 0.0, class_outputs)
        if sc.layers["admission"]["kind"] == "smoothed":  # the SLO-aware gate reads the capacities it has
            ctrl = CapacityScaledBound(ctrl, p.decode_slots(plant.decode_workers))
        layers.append(StackLayer("admission", [ctrl], ctrl.sample_period))
    rc = sc.layers["reconfiguration"]
    T = rc.get("sample_period_s", 10.0)
    u = _feedback_utilization(sc)
    dyn = sc.dynamics
    filter_s = rc.get("filter_s", 30.0)
    # a released worker takes a start-up + warm-up to get back: hold a scale-down at least that
    # long (and 3 filter constants, so the rate's noise does not trigger it)
    dwell_s = float(rc.get("dwell_s", max(3.0 * filter_s, dyn.startup_s + dyn.warmup_s)))
    planner = None
    if "planning" in sc.layers:
        pl = sc.layers["planning"]
        planner = DemandPlanner(lead_s=planning_lead_s(sc), excess_budget=pl.get("excess_budget",
                                                                                   0.75 * (1.0 - sc.slo_attainment)),
                                days=pl.get("days", 3), interval_s=pl.get("interval_s", 600.0),
                                refit_s=pl.get("refit_s", 86400.0), fine_s=pl.get("fine_s", 60.0),
                                max_headroom=pl.get("max_headroom", HEADROOM_GRID[-1]), history=history,
                                time_offset_s=time_offset_s, utilization=u,
                                hold_s=dwell_s, use_profile=pl.get("use_profile", True))
    qc, _ = _queue_clear(sc, plant)
    fleet = fleet_size if fleet_size is not None else rc.get("fleet_size")
    pools = []
    for pool, mu in (("fill", p.fill_rate_per_worker), ("decode", p.decode_capacity(1))):
        extra = {k: rc[k] for k in ("cooldown_s", "down_cooldown_s") if k in rc}
        extra["dwell_s"] = dwell_s
        pools.append(PlannedPoolController.tuned(
            pool, mu, sc.rate_rps, planner=planner, headroom=rc.get("headroom", 0.0),
            min_headroom=rc.get("headroom", 0.0) if fleet is not None else 0.0,  # a fixed fleet is paid anyway
            measured_fill_rate=(pool == "fill" and fleet is not None),
            measured_decode_rate=(pool == "decode" and fleet is not None),
            output_tokens=p.output_tokens if pool == "decode" else None, startup_s=dyn.startup_s,
            warmup_s=dyn.warmup_s, filter_s=filter_s, target_utilization=u,
            min_dead_band=rc.get("min_dead_band", 0.25), queue_clear_s=qc,
            queue_headroom=rc.get("queue_headroom", 0.25), max_step_up=rc.get("max_step_up", 1000),
            max_step_down=rc.get("max_step_down", 1000), min_replicas=1,
            max_replicas=fleet if fleet else 5000, sample_period=T, **extra))
    recon = [RoleBalancer(pools, fleet)] if fleet and rc.get("role_moves", True) else pools
    layers.append(StackLayer("reconfiguration", recon, T))
    if planner is not None:
        layers.append(StackLayer("planning", [planner], planner.sample_period))
    return ControlStack(layers, name or sc.name), plant


# ------------------------------------------------------------------------------------------
# the certificate


@dataclass
class Certificate:
    """The stack certificate: per-layer margins over the envelope, separations, describing-function
    checks, failures (each naming its layer) and the verdict.

    Parameters
    ----------
    scenario : str
        The scenario's name.
    layers : dict
        Per layer: its worst point over the envelope (margins) and every point, or what a static
        or feed-forward layer is.
    separation : list of CascadePair
        Each adjacent pair of layers, outer first.
    describing_function : list of dict
        The describing-function check of every relay or saturation.
    failures : list of dict
        ``{"layer", "check", "detail"}`` for every floor that fails (empty: passed).
    binding : dict
        The layer and envelope point with the least margin.
    """

    scenario: str
    layers: dict[str, dict]
    separation: list[CascadePair]
    describing_function: list[dict]
    failures: list[dict]
    binding: dict

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict:
        return {"scenario": self.scenario, "passed": self.passed, "layers": self.layers,
                "separation": [s.to_dict() for s in self.separation],
                "separation_rows": self.separation_rows(),
                "describing_function": self.describing_function, "failures": self.failures,
                "binding": self.binding}

    def separation_rows(self) -> list[dict]:
        return [{"outer": s.outer, "inner": s.inner, "inner_bandwidth_rad_s": s.inner_bandwidth_rad_s,
                 "outer_crossover_rad_s": s.outer_crossover_rad_s, "ratio": s.ratio,
                 "pm_ideal_deg": s.ideal.phase_margin_deg if s.ideal else None,
                 "pm_real_deg": s.real.phase_margin_deg if s.real else None,
                 "pm_loss_deg": s.pm_loss_deg if s.ideal else None,
                 "first_order_pm_loss_deg": s.first_order_pm_loss_deg, "note": s.note} for s in self.separation]

    def to_pandas(self) -> pd.DataFrame:
        rows = []
        for layer, d in self.layers.items():
            for r in d.get("points", []):
                rows.append({"layer": layer, **r})
        return pd.DataFrame(rows)


def _score(m, env: StabilityEnvelope) -> float:
    """How close a point is to the floors (< 1 fails): min(GM / GM floor, PM / PM floor)."""
    gm = m["gain_margin"] / env.gm_floor if math.isfinite(m["gain_margin"]) else math.inf
    pm = m["phase_margin_deg"] / env.pm_floor_deg if env.pm_floor_deg > 0 else math.inf
    return min(gm, pm)


def _margin_row(m, **point) -> dict:
    return {**point, "gain_margin": m.gain_margin, "phase_margin_deg": m.phase_margin_deg,
            "delay_margin_s": m.delay_margin_s, "ms": m.ms, "crossover_rad_s": m.crossover_rad_s}


def certify(sc: StackScenario) -> Certificate:
    """Margins, separations, describing-function checks and the verdict of a stack scenario.

    Parameters
    ----------
    sc : StackScenario
        The scenario (its envelope and certificate floors).

    Returns
    -------
    Certificate
        ``passed`` is True when every floor holds; each failure names its layer and the binding point.
    """
    env = sc.envelope
    plant = stack_plant(sc)
    p = plant.params
    rc = sc.layers["reconfiguration"]
    T_rc = rc.get("sample_period_s", 10.0)
    u = _feedback_utilization(sc)
    layers: dict[str, dict] = {}
    failures: list[dict] = []
    separation: list[CascadePair] = []
    dfs: list[dict] = []

    def judge(layer: str, rows: list[dict]) -> None:
        for r in rows:
            r["score"] = _score(r, env)
            r["meets_floors"] = r["score"] >= 1.0
        worst = min(rows, key=lambda r: r["score"])
        layers[layer] = {"points": rows, "worst": worst, "meets_floors": all(r["meets_floors"] for r in rows)}
        if not layers[layer]["meets_floors"]:
            failures.append({"layer": layer, "check": "margins",
                             "detail": f"GM {worst['gain_margin']:.3g}, PM {worst['phase_margin_deg']:.1f} deg at "
                                       + ", ".join(f"{k}={worst[k]}" for k in worst if k.endswith("factor"))
                                       + f" (floors GM >= {env.gm_floor:g}, PM >= {env.pm_floor_deg:g} deg)"})

    # -- batch gate: static (the slot limit; its response is one decode pass) or the gated cap's
    # integral loop over delay x pass-time slope (the envelope's service-rate factors)
    gate_tau = p.dispatch_s
    gate_closed = None
    if sc.layers.get("batch_gate", {}).get("kind") == "gated":
        try:
            gt = gate_tuning(sc)
        except ConfigError as e:
            failures.append({"layer": "batch_gate", "check": "margins", "detail": str(e)})
            layers["batch_gate"] = {"meets_floors": False, "points": []}
        else:
            keys = ("gain_margin", "phase_margin_deg", "delay_margin_s", "ms", "crossover_rad_s")
            rows = [{"delay_factor": r["delay_factor"], "service_rate_factor": r["slope_factor"],
                     **{k: r.get(k, math.nan) for k in keys}} for r in gt.envelope]
            judge("batch_gate", rows)
            layers["batch_gate"].update({"gain": gt.gain, "hold_s": gt.hold_s, "theta_s": gt.theta_s,
                                         "tau_c_s": gt.tau_c_s, "sample_period_s": gate_sample_period_s(sc),
                                         "pass_target_s": pass_target_s(sc.slo_tpot_s, gate_fraction(sc)),
                                         "ungated_gain_margin": gt.ungated.gain_margin if gt.ungated else None})
            gate_loop = batch_gate_loop(gt.gain, gt.hold_s, gt.theta_s)
            gate_closed = closed_loop(gate_loop)
            # the cap's saturation (between one sequence and the KV slots) in the gated loop
            cyc = predict_batch_cycle(gate_loop, 1.0)
            dfs.append({"layer": "batch_gate", "element": "cap saturation [1, KV slots]",
                        "loop": "gated integral correction of the pass target", "limit_cycle": cyc is not None,
                        "period_s": cyc.period_s if cyc else None,
                        "reason": "N(A) of a saturation is real in (0, 1]; the gated loop's gain at its phase "
                                  f"crossover is {1.0 / gt.nominal.gain_margin:.2f} < 1: no solution"
                                  if cyc is None else "the loop's gain at its phase crossover is >= 1",
                        "ungated_limit_cycle": gt.ungated_cycle})
    elif "batch_gate" in sc.layers:
        layers["batch_gate"] = {"static": True, "decode_slots_per_worker": p.decode_slots_per_worker,
                                "pass_time_s": p.decode_step_s(p.decode_slots_per_worker),
                                "response_time_constant_s": gate_tau, "meets_floors": True}
    # -- admission over delay x service rate x demand level
    adm = None
    adm_loop = None       # admission's loop nearest the gate's band (the admission -> batch_gate pair)
    adm_rec_loop = None   # admission's loop the reconfiguration layer sees through (its slowest)
    if sc.layers.get("admission", {}).get("kind") == "slo-aware":
        adm, _ = _admission(sc, plant)
        # the gate's two limit corrections (fill wait, decode wait), SIMC-tuned over delay x
        # prediction gain (tokenfactory.controllers.slo_admission.tune_slo_admission)
        tun = slo_admission_tuning(adm, p.measurement_delay_s)
        keys = ("gain_margin", "phase_margin_deg", "delay_margin_s", "ms", "crossover_rad_s")
        rows = [{"loop": n, "delay_factor": r["delay_factor"], "gain_factor": r["gain_factor"],
                 **{k: r.get(k, math.nan) for k in keys}} for n, gt in tun.items() for r in gt.envelope]
        judge("admission", rows)
        layers["admission"]["tuning"] = {**{n: {"ki": gt.ki, "theta_s": gt.theta_s, "gate_time_s": gt.gate_time_s,
                                                "tau_c_s": gt.tau_c_s} for n, gt in tun.items()},
                                         "sample_period_s": adm.sample_period, "kind": "slo-aware"}
        loops = {n: slo_gate_loop(gt.ki, gt.theta_s, gt.gate_time_s, name=f"slo gate ({n})") for n, gt in tun.items()}
        by_speed = sorted(loops, key=lambda n: stability_margins(loops[n]).crossover_rad_s)
        adm_loop, adm_rec_loop = loops[by_speed[-1]], loops[by_speed[0]]
        for n, gt in tun.items():
            dfs.append({"layer": "admission", "element": f"{n}-wait limit clamp (saturation)",
                        "loop": f"the {n} limit's integral correction", "limit_cycle": gt.limit_cycle is not None,
                        "period_s": (gt.limit_cycle or {}).get("period_s"),
                        "reason": "describing function of the clamp over the envelope: "
                                  + ("no solution" if gt.limit_cycle is None else "a cycle is predicted")})
    elif "admission" in sc.layers:
        adm, tuning = _admission(sc, plant)
        rows = []
        for dem in sc.demand_factors:
            nf, nd = _pools_at(p, sc.rate_rps * dem, u)
            pl = FluidPlant(p, nf, nd)
            cache: dict = {}
            for dfac, rfac in env.points():
                m = stability_margins(admission_loop(pl, adm, delay_factor=dfac, service_rate_factor=rfac,
                                                     _plant_model_cache=cache))
                rows.append(_margin_row(m, demand_factor=dem, delay_factor=dfac, service_rate_factor=rfac))
        judge("admission", rows)
        layers["admission"]["tuning"] = {"tau_c_s": tuning.tau_c_s, "tau_c_over_theta": tuning.tau_c_over_theta,
                                         "effective_delay_s": tuning.effective_delay_s,
                                         "sample_period_s": adm.sample_period}
        adm_loop = admission_loop(FluidPlant(p, plant.fill_workers, plant.decode_workers), adm)
        adm_rec_loop = adm_loop
    if adm_loop is not None and sc.layers["admission"]["kind"] == "smoothed":
        # describing function: admission's rate clip is a saturation in the loop. With conditional
        # integration (anti-windup) the integral freezes while the output is clipped, so the clip
        # sees the proportional loop kc F(s) P(s) e^{-theta s}. A saturation's N(A) is real in (0, 1],
        # so harmonic balance 1 + N(A) L(jw) = 0 has a solution exactly where the phase crosses -180
        # deg with |L| > 1/N >= 1: a cycle is predicted iff that loop's gain margin is below 1.
        worst_adm = layers["admission"]["worst"]
        wl = admission_loop(FluidPlant(p, plant.fill_workers, plant.decode_workers), adm,
                            delay_factor=worst_adm["delay_factor"], service_rate_factor=worst_adm["service_rate_factor"])
        ti = adm.gains.ti
        # C_PI x ti s / (ti s + 1) = kc: cancel the PI's integrator and zero exactly (minreal), so no
        # pole-zero pair is left on the imaginary axis for the Nyquist count to refuse
        p_only = DelayedLoop(control.minreal(wl.rational * control.tf([ti, 0.0], [ti, 1.0]), verbose=False),
                             wl.delay, "admission P part")
        gm_p = stability_margins(p_only).gain_margin
        dfs.append({"layer": "admission", "element": "rate clip [0, fill capacity] (saturation, anti-windup)",
                    "loop": "admission's proportional loop at its worst envelope point", "limit_cycle": gm_p < 1.0,
                    "period_s": None, "gain_margin_seen": gm_p,
                    "reason": f"N(A) of a saturation is real in (0, 1]; the loop it sees has GM {gm_p:.2f}"
                              + (" >= 1: no solution" if gm_p >= 1.0 else " < 1: a cycle is predicted")})
    if adm_loop is not None:
        # the admission loop with the decode batch's response (one pass) in its plant vs without
        if gate_closed is not None:
            # the cap sets the decode consumption admission's loop sees - a plant parameter (the
            # envelope's service-rate factors cover its range) - while what admission releases joins
            # the batch within a pass: the pass lag is in the loop, the gate's bandwidth sets the ratio
            series = cascade_separation("admission", adm_loop, "batch_gate", gate_closed)
            separation.append(cascade_separation(
                "admission", adm_loop, "batch_gate", first_order_lag(gate_tau),
                inner_bandwidth_rad_s=series.inner_bandwidth_rad_s,
                note="the gated cap's closed loop sets admission's decode consumption (a plant parameter within "
                     "the envelope's service-rate factors); admitted work joins the batch within a pass (the lag "
                     f"in the loop); with the gate's closed loop in series instead, the conservative reading, "
                     f"admission would lose {series.pm_loss_deg:.1f} deg"))
        elif "batch_gate" in sc.layers:
            separation.append(cascade_separation(
                "admission", adm_loop, "batch_gate", first_order_lag(gate_tau),
                note="decode batch responds to a freed or filled slot within one pass (first-order lag)"))
    # -- reconfiguration over start-up x service rate
    qc, tau_c_f = _queue_clear(sc, plant)
    rows = []
    theta0 = reconfiguration_delay_s(p, sc.dynamics, T_rc)
    for sf in sc.startup_factors:
        for rfac in env.service_rate_factors:
            theta = reconfiguration_delay_s(p, sc.dynamics, T_rc, sf)
            m = stability_margins(reconfiguration_loop(qc, u, theta, service_rate_factor=rfac))
            rows.append(_margin_row(m, startup_factor=sf, service_rate_factor=rfac, loop_delay_s=theta))
    judge("reconfiguration", rows)
    layers["reconfiguration"].update({"queue_clear_s": qc, "tau_c_over_theta": tau_c_f, "delay_s": theta0,
                                      "sample_period_s": T_rc, "target_utilization": u})
    rec_loop = reconfiguration_loop(qc, u, theta0)
    if adm_rec_loop is not None:
        separation.append(cascade_separation(
            "reconfiguration", rec_loop, "admission", closed_loop(adm_rec_loop),
            note="a worker's capacity reaches the queue through admission's closed loop (complementary sensitivity)"))
    # describing function of the whole-worker hysteresis relay
    nf, nd = plant.fill_workers, plant.decode_workers
    for pool, mu, n in (("fill", p.fill_rate_per_worker, nf), ("decode", p.decode_capacity(1), nd)):
        sigma = need_noise_std(sc.rate_rps, mu, u, rc.get("filter_s", 30.0))
        db = max(rc.get("min_dead_band", 0.25), 3.0 * sigma)
        # the relay switches n-1 <-> n at need n-1 (up) and n-1-db (down); the pool at n-1 then runs
        # at utilisation u (up) or less: the queue the loop feeds back is empty unless u (+3 sigma) >= 1
        u_switch = u * (1.0 + 3.0 * sigma / max(n - 1, 1))
        gain = 1.0 if u_switch >= 1.0 else 0.0
        relay = control.relay_hysteresis_nonlinearity(b=0.5, c=(1.0 + db) / 2.0)
        cyc = predict_limit_cycles(rec_loop.scaled(gain), relay, amplitude_bounds=((1.0 + db) / 2.0 * 1.0001, 1e6)) \
            if gain > 0 else []
        dfs.append({"layer": "reconfiguration", "element": f"{pool} pool: whole-worker relay, hysteresis 1 + "
                    f"dead band {db:.2f} workers", "loop": "backlog feedback", "limit_cycle": bool(cyc),
                    "period_s": cyc[0].period_s if cyc else None, "switch_utilization": u_switch,
                    "reason": (f"at the switching points the smaller pool runs at utilisation {u_switch:.2f} < 1: "
                               "the queue is empty on both sides, the loop gain the relay sees is zero")
                    if gain == 0 else "utilisation at the switching point >= 1: the relay sees the integrating queue"})
    # -- planning: feed-forward (the offered rate is exogenous; no loop through the plant)
    if "planning" in sc.layers:
        lead = planning_lead_s(sc)
        needed = sc.dynamics.startup_s + sc.dynamics.warmup_s * (1.0 - sc.dynamics.warmup_factor)
        refit_s = sc.layers["planning"].get("refit_s", 86400.0)
        layers["planning"] = {"feed_forward": True, "lead_s": lead, "refit_s": refit_s, "scale_up_delay_s": needed,
                              "meets_floors": lead >= needed}
        separation.append(CascadePair("planning", "reconfiguration", closed_loop_bandwidth(rec_loop), math.nan,
                                      math.nan, None, None, math.nan, math.nan,
                                      note="feed-forward: the planner reads the offered demand, which no layer "
                                      "changes, so it closes no loop and has no crossover; the certificate checks "
                                      f"its lead instead (plan leads by {lead:.0f} s, a worker serves at full speed "
                                      f"{needed:.0f} s after it is asked for)"))
        if lead < needed:
            failures.append({"layer": "planning", "check": "lead",
                             "detail": f"plan leads by {lead:g} s, a worker takes {needed:.0f} s to serve at full "
                                       "speed"})
    # -- separation floors (feedback pairs)
    for s in separation:
        if s.ideal is None:
            continue
        if s.ratio < sc.min_separation:
            failures.append({"layer": s.outer, "check": "separation",
                             "detail": f"{s.outer} crossover {s.outer_crossover_rad_s:.3g} rad/s is only "
                                       f"{s.ratio:.2f} x below {s.inner}'s bandwidth {s.inner_bandwidth_rad_s:.3g} "
                                       f"rad/s (needs >= {sc.min_separation:g})"})
        if s.pm_loss_deg > sc.max_pm_loss_deg:
            failures.append({"layer": s.outer, "check": "pm_loss",
                             "detail": f"{s.inner}'s closed loop costs {s.outer} {s.pm_loss_deg:.1f} deg of phase "
                                       f"margin (allowed {sc.max_pm_loss_deg:g})"})
    for d in dfs:
        if d["limit_cycle"]:
            failures.append({"layer": d["layer"], "check": "describing_function",
                             "detail": f"{d['element']}: limit cycle predicted (period {d['period_s']:.0f} s)"})
    scored = [(name, d["worst"]) for name, d in layers.items() if "worst" in d]
    bname, bpoint = min(scored, key=lambda x: x[1]["score"])
    binding = {"layer": bname, **bpoint}
    return Certificate(sc.name, layers, separation, dfs, failures, binding)



# ------------------------------------------------------------------------------------------
# running a stack (or a baseline) over a rate series in the pool model


@dataclass
class RateWorkload:
    """A demand to run stacks on: ``demand`` (requests/s, indexed by seconds from the run's
    start, held piecewise constant), the planner's ``history`` before the run (absolute time
    index on its interval), the absolute time of t = 0, the mean request and, for a fixed fleet,
    its size; when the mix shifts, the prompt (fill work) and output factors over time relative
    to the mean request (:class:`tokenfactory.plant_models.pools.PoolScenario`).

    Parameters
    ----------
    name : str
        The workload's label.
    demand : pandas.Series
        Requests/s indexed by seconds from the run's start.
    history : pandas.Series or None
        Demand before the run (absolute time index on the planner's interval).
    time_offset_s : float
        Absolute time of t = 0 (s).
    prompt_tokens, output_tokens : int
        The mean request.
    fleet_size : int, optional
        A fixed fleet (workers), or None.
    prompt_factor, output_factor : float or pandas.Series
        Fill work and output tokens per request relative to ``prompt_tokens`` / ``output_tokens``
        (constants or series on the demand's index; default 1).
    notes : dict
        How the workload was built (reported).
    """

    name: str
    demand: pd.Series
    history: pd.Series | None
    time_offset_s: float
    prompt_tokens: int
    output_tokens: int
    fleet_size: int | None = None
    prompt_factor: float | pd.Series = 1.0
    output_factor: float | pd.Series = 1.0
    notes: dict = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        return float(self.demand.index[-1])


def rate_workload(spec: str, *, scale: float = 1.0, last_days: float | None = 4.0, interval_s: float = 600.0,
                  fine_s: float = 60.0, hours: float | None = None) -> RateWorkload:
    """A rate series (registered name, path or ``synthetic``) as a workload: the last
    ``last_days`` (the days before become the planner's history), gaps interpolated, x ``scale``,
    linear between the series' points on a ``fine_s`` grid (what the pool model draws Poisson
    arrivals from: the 10-minute rates disaggregated as the reconfiguration study does).

    Parameters
    ----------
    spec : str
        What :func:`tokenfactory.traces.load_rate_series` takes.
    scale : float
        Demand multiplier (a tenant population ``scale`` times larger).
    last_days : float or None
        Days at the end to run (None: the whole series, no history).
    interval_s : float
        Bin width for request traces.
    fine_s : float
        Grid of the disaggregated demand.
    hours : float, optional
        Cut the run to its first ``hours`` (quick variants).

    Returns
    -------
    RateWorkload
    """
    from tokenfactory.traces.rates import load_rate_series

    check_number("scale", scale, low=0.0, low_inclusive=False)
    rs = load_rate_series(spec, interval_s)
    y = rs.rates["rate_rps"].astype(float).interpolate(limit_direction="both") * scale
    t = y.index.to_numpy(dtype=float)
    step = float(np.median(np.diff(t))) if len(t) > 1 else interval_s
    if last_days is not None:
        check_number("last_days", last_days, low=0.0, low_inclusive=False)
        start = t[-1] + step - last_days * 86400.0
        if start <= t[0]:
            raise ConfigError("last_days", f"the series spans {(t[-1] + step - t[0]) / 86400:.2f} days, "
                              f"fewer than {last_days:g} + some history")
        hist, run = y[y.index < start], y[y.index >= start]
    else:
        hist, run = None, y
    t0 = float(run.index[0])
    rel = run.index.to_numpy(dtype=float) - t0
    end = rel[-1] + step
    if hours is not None:
        end = min(end, hours * 3600.0)
    fine = np.arange(0.0, end + fine_s / 2, fine_s)
    demand = pd.Series(np.interp(fine, rel, run.to_numpy()), index=fine)
    if hist is not None and not np.isclose(step, 600.0):
        hist = None  # the planner's grid is 10 minutes
    return RateWorkload(spec if scale == 1 else f"{spec} x{scale:g}", demand, hist, t0, rs.input_tokens,
                        rs.output_tokens)


#: the two request classes of the mixed week, (prompt tokens, output tokens). ASSUMPTIONS with their
#: sources: ``chat`` - interactive conversation, decode-heavy: 340 output tokens, about ShareGPT's mean
#: output (338 tokens; Kwon et al., "Efficient Memory Management for Large Language Model Serving with
#: PagedAttention", SOSP 2023, section 6.1), and a 1000-token prompt carrying the conversation's
#: history (ServeGen m-large's mean prompt is 914, ``studies/scenarios/stack_default.toml``);
#: ``batch`` - overnight long-document extraction / retrieval-augmented classification, fill-heavy: an
#: 8000-token prompt (a document, or fifteen 512-token retrieved chunks plus instructions) and a
#: 40-token structured answer; prompt/output 200, the same order as the Azure coding trace's medians
#: (1500 prompt / 13 output tokens; Patel et al., "Splitwise", ISCA 2024, section 3). On DeepSeek-V3
#: with the stack's batch gate a chat request costs a fill worker ~0.016 s and a decode worker ~0.4 s,
#: a batch request ~0.11 s and ~0.08 s (:func:`plant_for`): only a prompt/output ratio in the hundreds
#: makes the fill pool a large share of the fleet.
MIX_CLASSES = {"chat": (1000, 340), "batch": (8000, 40)}

#: the label of a fixed fleet run with the stack's admission but no reconfiguration: the pools stay
#: at the best fixed split for the whole run (:func:`tokenfactory.controllers.capacity.static_split`)
STATIC_SPLIT = "static-split"


#: the oscillation detectors in :func:`run_on_rates` judge periods shorter than this (s): a pool loop's
#: limit cycle has a period of a few loop delays (start-up + warm-up + the scale-down dwell: 5-30
#: minutes at the study's start-ups), the demand's day 24 h and its harmonics >= 6 h
OSCILLATION_HIGHPASS_S = 7200.0


def _run_plant(sc: StackScenario, wl: RateWorkload) -> FluidParams:
    """The plant every contender runs ``wl`` on: the scenario's plant at the workload's mean request
    with the stack's batch gate applied at the workload's mean demand."""
    s = sc.with_overrides(params=plant_for(sc, wl.prompt_tokens, wl.output_tokens),
                          rate_rps=float(wl.demand.mean()))
    return stack_plant(s).params


def mixed_workload(sc: StackScenario, *, days: float = 7.0, seed: int = 0, chat_rps: float = 150.0,
                   batch_rps: float = 450.0, fleet_headroom: float = 0.15, history_days: int = 7,
                   interval_s: float = 600.0, fine_s: float = 60.0, hours: float | None = None) -> RateWorkload:
    """A synthetic week whose prefill/decode mix shifts over the day, on a fixed fleet.

    Two classes (:data:`MIX_CLASSES`), each a rate series from the synthetic generator
    (:func:`tokenfactory.traces.synthetic.generate_rates`: its daily shape and AR(1) noise):

    * ``chat`` peaks at 14:00 (daily amplitude 0.6 plus a 0.1 12-hour harmonic, weekends x 0.8 -
      the generator's defaults for the weekly shape, a deeper day than its 0.3 so the mix shifts);
    * ``batch`` peaks at 02:00 (amplitude 0.9, every night, weekends included: scheduled jobs).

    The total demand is their sum; the mix enters the pool model as factors relative to the run's
    request-weighted mean request (``prompt_tokens``, ``output_tokens``): the prompt factor is the
    mix's mean fill time per request over the mean request's, each class's fill rate per worker
    taken from the roofline service model (:func:`plant_for`: an 8000-token prefill is not 8 x a
    1000-token one - the fill throughput is about 64k tokens/s per worker at 1000 tokens, 89k at
    4000 and 73k at 8000, a pass's fixed cost amortised over more tokens, then attention's quadratic
    term); the output factor is the mean output over the mean request's (decode passes are linear
    in output tokens at a fixed batch).

    Default rates (chat 150, batch 450 requests/s weekday means): the chat day and the batch night
    need about the same total workers, so the fleet is busy at both ends of the day, while the fill
    pool's share of the need moves from ~5 % (afternoon) to ~45 % (night).

    The fleet is fixed: ceil(peak over the run of (fill need + decode need) x (1 +
    ``fleet_headroom``)), needs at the reconfiguration layer's target utilisation on the run's
    plant (:func:`run_on_rates`'s). Default 15 %: the stack's fixed headroom without a planner
    (``layers.reconfiguration.headroom``), so its unplanned target fits at the peak. Because the fill
    need peaks at night and the decode need by day, a static split needs max(fill) + max(decode)
    workers, more than the fleet (``notes["static_split_needs"]``); moving roles can serve both.

    Parameters
    ----------
    sc : StackScenario
        The stack scenario (its plant, SLO, batch gate and target utilisation).
    days : float
        Length of the run (days, (0, 14]; default 7).
    seed : int
        Seeds both classes' rate noise (chat ``seed``, batch ``seed + 1``; >= 0).
    chat_rps, batch_rps : float
        Weekday daily mean of each class (requests/s, > 0).
    fleet_headroom : float
        Fleet over the peak total need ([0, 2]; default 0.15).
    history_days : int
        Days before the run given to the planner as history (>= 3, its refit window; default 7,
        so the run starts on the generator's Monday 00:00).
    interval_s : float
        The rate series' resolution (s; 600: the planner's grid).
    fine_s : float
        Grid the demand and factors are interpolated on (s).
    hours : float, optional
        Cut the run to its first ``hours`` (the fleet and the mean request stay the whole run's).

    Returns
    -------
    RateWorkload
        With ``fleet_size``, ``prompt_factor``, ``output_factor`` and ``notes`` (classes, mean request,
        per-day swing of the fill:decode need ratio, fleet, the static split's need).
    """
    from tokenfactory.traces.synthetic import SyntheticWorkload, generate_rates

    check_number("mixed.days", days, low=0.0, high=14.0, low_inclusive=False)
    check_int("mixed.seed", seed, low=0)
    check_number("mixed.chat_rps", chat_rps, low=0.0, low_inclusive=False)
    check_number("mixed.batch_rps", batch_rps, low=0.0, low_inclusive=False)
    check_number("mixed.fleet_headroom", fleet_headroom, low=0.0, high=2.0)
    check_int("mixed.history_days", history_days, low=3)
    day = 86400.0
    chat_w = SyntheticWorkload(mean_rate_rps=chat_rps, daily_amplitude=0.6, daily_second_harmonic=0.1,
                               peak_hour=14.0, weekend_factor=0.8, seed=seed)
    batch_w = SyntheticWorkload(mean_rate_rps=batch_rps, daily_amplitude=0.9, daily_second_harmonic=0.0,
                                peak_hour=2.0, weekend_factor=1.0, seed=seed + 1)
    span = (history_days + days) * day + interval_s
    chat = generate_rates(chat_w, span, interval_s)["rate_rps"]
    batch = generate_rates(batch_w, span, interval_s)["rate_rps"]
    t_abs = chat.index.to_numpy(dtype=float)
    start = history_days * day
    history = (chat + batch)[t_abs < start]
    rel = t_abs - start
    fine = np.arange(0.0, days * day + fine_s / 2, fine_s)
    c, b = np.interp(fine, rel, chat.to_numpy()), np.interp(fine, rel, batch.to_numpy())
    lam = c + b
    share = b / np.maximum(lam, 1e-12)
    (pc, lc), (pb, lb) = MIX_CLASSES["chat"], MIX_CLASSES["batch"]
    P = int(round(float(np.sum(c * pc + b * pb) / np.sum(lam))))
    L = int(round(float(np.sum(c * lc + b * lb) / np.sum(lam))))
    mu_f = {x: plant_for(sc, x, L).fill_rate_per_worker for x in (P, pc, pb)}
    pf = mu_f[P] * ((1.0 - share) / mu_f[pc] + share / mu_f[pb])
    of = ((1.0 - share) * lc + share * lb) / L
    wl = RateWorkload(f"mixed-week seed={seed}", pd.Series(lam, index=fine), history, start, P, L,
                      prompt_factor=pd.Series(pf, index=fine), output_factor=pd.Series(of, index=fine))
    run_params = _run_plant(sc, wl)
    u = _feedback_utilization(sc)
    need_f = lam * pf / (u * run_params.fill_rate_per_worker)
    need_d = lam * of / (u * run_params.decode_capacity(1))
    fleet = int(math.ceil(float(np.max(need_f + need_d)) * (1.0 + fleet_headroom) - 1e-9))
    # the ratio's swing within each day, on hourly means (the rate noise would inflate a minute-level swing)
    hourly = pd.DataFrame({"f": need_f, "d": need_d}, index=fine // 3600.0).groupby(level=0).mean()
    ratio = hourly["f"] / hourly["d"]
    whole = hourly.index // 24
    swings = ratio.groupby(whole).agg(lambda x: float(x.max() / x.min()) if len(x) >= 24 else math.nan).dropna()
    wl.fleet_size = fleet
    wl.notes = {"classes": {k: {"prompt_tokens": v[0], "output_tokens": v[1]} for k, v in MIX_CLASSES.items()},
                "chat_rps": chat_rps, "batch_rps": batch_rps, "mean_request": [P, L],
                "fill_rps_per_worker": {str(k): float(v) for k, v in mu_f.items()},
                "fleet_size": fleet, "fleet_headroom": fleet_headroom, "target_utilization": u,
                "peak_need": {"fill": float(need_f.max()), "decode": float(need_d.max()),
                              "total": float(np.max(need_f + need_d))},
                "static_split_needs": int(math.ceil(need_f.max() - 1e-9) + math.ceil(need_d.max() - 1e-9)),
                "need_ratio_swing_per_day": [float(x) for x in swings.to_numpy()],
                "need_ratio_range": [float(ratio.min()), float(ratio.max())]}
    if hours is not None:
        check_number("mixed.hours", hours, low=0.0, high=days * 24.0, low_inclusive=False)
        keep = fine <= hours * 3600.0 + 1e-9
        wl.demand, wl.prompt_factor, wl.output_factor = (x[keep] for x in (wl.demand, wl.prompt_factor,
                                                                          wl.output_factor))
        wl.name += f" first {hours:g} h"
    return wl


def plant_for(sc: StackScenario, prompt_tokens: int, output_tokens: int) -> FluidParams:
    """The scenario's plant at another request shape (a trace's mean request).

    Parameters
    ----------
    sc : StackScenario
        The scenario (its ``[plant]`` table).
    prompt_tokens, output_tokens : int
        The request shape.

    Returns
    -------
    FluidParams
    """
    plant_d = {**dict(sc.config.get("plant", {})), "prompt_tokens": int(prompt_tokens),
               "output_tokens": int(output_tokens), "fill_workers": 1, "decode_workers": 1}
    return build_plant(plant_d).params


def utilization_ceiling(params: FluidParams, slo_ttft_s: float, slo_tpot_s: float, *,
                        workers: int | dict[str, int] = 4,
                        grid=(0.8, 0.85, 0.9, 0.93, 0.95, 0.97, 0.98, 0.99, 0.995), duration_s: float = 1200.0,
                        dt: float = 1.0, seed: int = 0) -> dict[str, float]:
    """The highest utilisation of each pool at which the pool model still meets the SLO for 99 %
    of requests (Poisson arrivals at a constant rate, the other pool ample), on ``grid``: the SLO's
    utilisation ceiling, which the oracle provisions at.

    Poisson noise is relatively smaller in a larger pool, so the ceiling depends on the pool size:
    measure it at the sizes the workload runs at (``workers`` per pool).

    Parameters
    ----------
    params : FluidParams
        The plant (the batch gate applied).
    slo_ttft_s, slo_tpot_s : float
        The SLO.
    workers : int or dict
        Pool size the ceiling is measured at (``{"fill": .., "decode": ..}`` or one for both).
    grid : sequence of float
        Utilisations tried in increasing order; the first that misses the SLO ends the search.
    duration_s, dt : float
        Length and step of each measurement run (s).
    seed : int
        Seed of the Poisson arrivals.

    Returns
    -------
    dict
        ``{"fill": ceiling, "decode": ceiling}`` (the first grid point if even that misses).
    """
    return _ceiling(params, float(slo_ttft_s), float(slo_tpot_s),
                    tuple(sorted((workers if isinstance(workers, dict) else
                                  {"fill": workers, "decode": workers}).items())),
                    tuple(grid), float(duration_s), float(dt), int(seed))


@functools.lru_cache(maxsize=64)
def _ceiling(params: FluidParams, slo_ttft_s: float, slo_tpot_s: float, workers: tuple, grid: tuple,
             duration_s: float, dt: float, seed: int) -> dict[str, float]:
    from tokenfactory.plant_models.pools import PoolScenario, simulate_pools

    sizes = dict(workers)
    out = {}
    for pool in ("fill", "decode"):
        n = max(1, int(sizes[pool]))
        mu = params.fill_rate_per_worker if pool == "fill" else params.decode_capacity(1)
        best = grid[0]
        for rho in grid:
            lam = rho * n * mu
            nf = n if pool == "fill" else math.ceil(lam / (0.5 * params.fill_rate_per_worker))
            nd = n if pool == "decode" else math.ceil(lam / (0.5 * params.decode_capacity(1)))
            r = simulate_pools(params, nf, nd, PoolScenario(lam, duration_s, dt=dt, seed=seed, slo_ttft_s=slo_ttft_s,
                                                            slo_tpot_s=slo_tpot_s))
            if r.metrics["slo_attainment"] >= 0.99:
                best = rho
            else:
                break
        out[pool] = float(best)
    return out


def _provisioned(series: pd.DataFrame, pool: str) -> pd.Series:
    return series[f"{pool}_workers"] + series[f"{pool}_workers_starting"]


def run_on_rates(sc: StackScenario, wl: RateWorkload, *, startup_s: float | None = None, stack: str = "stack",
                 dt: float = 2.0, seed: int = 0, control_start_s: float = 300.0,
                 ceiling: dict[str, float] | None = None) -> tuple[dict, Any, Any]:
    """Run the scenario's stack (``"stack"``), the stack without its planning layer
    (``"stack-no-planning"``) or a baseline deployment (a :data:`tokenfactory.registry.BASELINE_STACKS`
    name) over ``wl`` in the pool model, and score it against the oracle.

    Every contender runs on the same plant: the scenario's plant at the workload's mean request
    with the stack's batch gate applied (a deployment caps its decode batch too - vLLM's
    ``max_num_seqs`` - and with DeepSeek-V3's full-KV pass over the TPOT SLO no deployment meets
    it uncapped), the same SLO, start-up and seed. The oracle
    (:func:`tokenfactory.controllers.capacity.oracle_plan`) provisions that plant at its measured
    utilisation ceiling (:func:`utilization_ceiling`, at the pool sizes of the mean demand) with
    perfect knowledge of the demand at the demand's own resolution.

    Oscillation is judged on what the controller adds to the demand: the provisioned pool minus the
    demand-justified pool (demand x the pool's work factor / (per-worker rate x ceiling)), sampled
    every 10 s after the first 10 minutes, with its components slower than
    :data:`OSCILLATION_HIGHPASS_S` removed; the daily cycle of the demand is not the controller's
    oscillation (against a cycling demand a static pool's residual cycles daily too, and the
    detectors called it regular and persistent on the synthetic week).

    Parameters
    ----------
    sc : StackScenario
        The stack scenario (plant, SLO, layers).
    wl : RateWorkload
        The demand (:func:`rate_workload`).
    startup_s : float, optional
        Worker start-up (s); default the scenario's.
    stack : str
        ``"stack"``, ``"stack-no-planning"`` or a baseline name.
    dt : float
        The pool model's step (s).
    seed : int
        Seed of the Poisson arrivals.
    control_start_s : float
        Controllers are first sampled here (the plant fills from empty before).
    ceiling : dict, optional
        The utilisation ceilings (computed when omitted).

    Returns
    -------
    tuple
        ``(metrics row, SimulationResult, ControlStack)``.
    """
    from tokenfactory.controllers.capacity import oracle_plan, static_split
    from tokenfactory.controllers.oscillation import judge_actuators
    from tokenfactory.plant_models.pools import PoolScenario, simulate_pools
    from tokenfactory.registry import BASELINE_STACKS, baseline_stack

    params = plant_for(sc, wl.prompt_tokens, wl.output_tokens)
    dyn = sc.dynamics if startup_s is None else dataclasses.replace(sc.dynamics, startup_s=float(startup_s))
    if wl.fleet_size is not None:
        dyn = dataclasses.replace(dyn, fleet_size=wl.fleet_size)
    mean = float(wl.demand.mean())
    s = sc.with_overrides(params=params, rate_rps=mean, dynamics=dyn, planning=(stack == "stack"))
    run_params = stack_plant(s).params  # the same gated plant for every contender
    mu = {"fill": run_params.fill_rate_per_worker, "decode": run_params.decode_capacity(1)}
    factors = {"fill": wl.prompt_factor, "decode": wl.output_factor}
    ceil_ = ceiling or utilization_ceiling(run_params, s.slo_ttft_s, s.slo_tpot_s,
                                           workers={p: math.ceil(mean / mu[p]) for p in mu})
    step_s = float(np.median(np.diff(wl.demand.index.to_numpy(dtype=float))))
    oracle, oracle_gpu_h = oracle_plan(wl.demand, mu, ceil_, startup_s=dyn.startup_s, interval_s=step_s,
                                       gpus_per_worker=dyn.gpus_per_worker, fleet_size=wl.fleet_size,
                                       work_factors=factors)
    split = static_split(oracle, wl.fleet_size) if wl.fleet_size is not None else None
    nf, nd = _pools_at(run_params, float(wl.demand.iloc[0]), _feedback_utilization(s),
                       _first(wl.prompt_factor), _first(wl.output_factor))
    if stack in ("stack", "stack-no-planning"):
        ctrl, _ = build_stack(s, history=wl.history, time_offset_s=wl.time_offset_s, fleet_size=wl.fleet_size,
                              name=stack, plant_step_s=dt)
    elif stack == STATIC_SPLIT:
        if split is None:
            raise ConfigError("stack", f"{STATIC_SPLIT!r} needs a fixed fleet (workload.fleet_size)")
        full, _ = build_stack(s.with_overrides(planning=False), name=stack, plant_step_s=dt)
        # the stack's fast layers (batch gate, admission); no reconfiguration: the pools never move
        ctrl = ControlStack([la for la in full.layers if la.name in ("batch_gate", "admission")], name=stack)
        nf, nd = split["fill_workers"], split["decode_workers"]
    elif stack in BASELINE_STACKS:
        ctrl = baseline_stack(stack, PlantContext(run_params, 1, 1, slo_ttft_s=s.slo_ttft_s, slo_tpot_s=s.slo_tpot_s,
                                                  rate_rps=mean, dynamics=dyn,
                                                  max_replicas=wl.fleet_size or 5000), dt=dt, history=wl.history)
    else:
        raise ConfigError("stack", f"{stack!r} is not 'stack', 'stack-no-planning', {STATIC_SPLIT!r} or one of "
                          f"{', '.join(BASELINE_STACKS)}")
    if wl.fleet_size is not None and nf + nd > wl.fleet_size:
        raise ConfigError("fleet_size", f"{wl.fleet_size} workers cannot hold the initial {nf} + {nd}")
    psc = PoolScenario(wl.demand, wl.duration_s, dt=dt, control_start_s=control_start_s, seed=seed,
                       slo_ttft_s=s.slo_ttft_s, slo_tpot_s=s.slo_tpot_s, prompt_factor=wl.prompt_factor,
                       output_factor=wl.output_factor)
    r = simulate_pools(run_params, nf, nd, psc, controllers=[ctrl], dynamics=dyn)
    step = max(1, int(round(10.0 / dt)))  # the detectors on 10-s samples
    after = r.series[r.series["time_s"] >= control_start_s + 600.0].iloc[::step]
    # each pool judged on its deviation from the demand-justified count (its load in nominal
    # requests/s, demand x the pool's work factor, over the pool's rate at its ceiling); what is
    # slower than OSCILLATION_HIGHPASS_S is the demand's cycle against the pool's headroom
    justified = {f"{pool}_pool": (after["demand"] * after["prompt_factor" if pool == "fill" else "output_factor"]
                                  / (mu[pool] * ceil_[pool])).to_numpy(dtype=float) for pool in ("fill", "decode")}
    verdict = judge_actuators(after, r.actions, start_s=control_start_s + 600.0, references=justified,
                              highpass_s=OSCILLATION_HIGHPASS_S)
    osc = {pool: verdict.signals.get(f"{pool}_pool", {}) for pool in ("fill", "decode")}
    m = r.metrics
    row = {"stack": stack, "workload": wl.name, "startup_s": dyn.startup_s, "gpu_hours": m["gpu_hours"],
           "busy_gpu_hours": m["busy_gpu_hours"], "oracle_gpu_hours": oracle_gpu_h,
           "gpu_hours_over_oracle": m["gpu_hours"] / oracle_gpu_h if oracle_gpu_h > 0 else math.nan,
           "slo_attainment": m["slo_attainment"], "rejected": m["rejected"],
           "rejected_fraction": m["rejected"] / m["requests"] if m["requests"] else 0.0,
           "actions_per_hour": m["actions_per_hour"], "reversals_per_hour": m["reversals_per_hour"],
           "oscillating": verdict.oscillating, "churning": verdict.churning, "oscillation": verdict.to_dict(),
           "fill_thornhill_r": osc["fill"].get("thornhill_r", math.nan),
           "decode_thornhill_r": osc["decode"].get("thornhill_r", math.nan),
           "requests": m["requests"], "completed": m["completed"], "in_flight_end": m["in_flight_end"],
           "utilization_ceiling": ceil_, "per_worker_rps": mu, "fleet_size": wl.fleet_size, "role_moves": m["role_moves"],
           "role_moves_per_hour": m["role_moves_per_hour"],
           "fill_workers_mean": m["mean_workers"]["fill"], "decode_workers_mean": m["mean_workers"]["decode"]}
    if split is not None:
        row.update({"static_fill_workers": split["fill_workers"], "static_decode_workers": split["decode_workers"],
                    "static_worst_load": split["worst_load"], "static_split_needs": split["needs_workers"],
                    "oracle_fleet_needed": float((oracle["fill_billed"] + oracle["decode_billed"]).max())})
    return row, r, ctrl
