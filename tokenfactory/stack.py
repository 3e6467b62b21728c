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
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import control
import numpy as np
import pandas as pd

from tokenfactory.controllers.admission import SmoothedAdmission
from tokenfactory.controllers.autotune import StabilityEnvelope, admission_loop
from tokenfactory.controllers.describing import predict_limit_cycles
from tokenfactory.controllers.forecasting import FORECASTERS
from tokenfactory.controllers.planning import QUANTILES, DemandPlanner, PlannedPoolController
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
from tokenfactory.controllers.stability import DelayedLoop, stability_margins
from tokenfactory.controllers.stack import CapacityScaledBound, ControlStack, RoleBalancer, StackLayer
from tokenfactory.plant_models.fluid import FluidParams, FluidPlant
from tokenfactory.plant_models.pools import PoolDynamics
from tokenfactory.registry import PlantContext, smoothed_admission
from tokenfactory.scenario import build_plant
from tokenfactory.validation import ConfigError, check_choice, check_int, check_number, reject_unknown_keys

__all__ = ["StackScenario", "StackPlant", "load_stack_scenario", "stack_scenario_from_dict", "slot_limit",
           "build_stack", "reconfiguration_delay_s", "Certificate", "certify", "scenario_dir", "RateWorkload",
           "rate_workload", "plant_for", "utilization_ceiling", "run_on_rates", "stack_plant"]

_TOP = {"name", "description", "plant", "slo", "workload", "dynamics", "layers", "envelope", "certificate"}
_PLANT = {"model", "hardware", "parallelism", "efficiency", "decode_model", "decode_hardware", "decode_parallelism",
          "prompt_tokens", "output_tokens", "cached_tokens", "measurement_delay_s", "kv_stripes", "kv_setup_s"}
_LAYERS = {"batch_gate", "admission", "reconfiguration", "planning"}
_GATE = {"kind", "tpot_fraction"}
_ADMISSION = {"kind", "sample_period_s", "filter_tau_s", "service_filter_tau_s", "safety_z", "backlog_bound_s"}
_RECONF = {"kind", "sample_period_s", "target_utilization", "queue_clear_s", "filter_s", "min_dead_band",
           "max_step_up", "max_step_down", "queue_headroom", "role_moves", "fleet_size"}
_PLANNING = {"kind", "forecaster", "quantile", "interval_s", "update_s", "refit_s", "horizon_s", "lead_s",
             "target_utilization"}
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
    """A resolved stack scenario (validated; built lazily by :func:`build_stack`)."""

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
    reject_unknown_keys("slo", slo, {"ttft_s", "tpot_s"})
    ttft = check_number("slo.ttft_s", slo.get("ttft_s", 2.0), low=0.0, low_inclusive=False)
    tpot = check_number("slo.tpot_s", slo.get("tpot_s", 0.1), low=0.0, low_inclusive=False)
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
    for lname, keys, kinds in (("batch_gate", _GATE, ("slot-limit", "none")),
                               ("admission", _ADMISSION, ("smoothed", "none")),
                               ("reconfiguration", _RECONF, ("planned-hysteretic",)),
                               ("planning", _PLANNING, ("forecast", "none"))):
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
    if "queue_clear_s" in rc:
        check_number("layers.reconfiguration.queue_clear_s", rc["queue_clear_s"], low=0.0, low_inclusive=False)
    if "fleet_size" in rc:
        check_int("layers.reconfiguration.fleet_size", rc["fleet_size"], low=2)
    if "admission" in layers:
        check_number("layers.admission.sample_period_s", layers["admission"].get("sample_period_s", 1.0),
                      low=0.01, high=60.0)
    if "batch_gate" in layers:
        check_number("layers.batch_gate.tpot_fraction", layers["batch_gate"].get("tpot_fraction", 0.8),
                     low=0.1, high=1.0)
    if "planning" in layers:
        pl = layers["planning"]
        check_number("layers.planning.target_utilization", pl.get("target_utilization", 0.9), low=0.1, high=1.0)
        check_choice("layers.planning.forecaster", pl.get("forecaster", "holt-winters"), FORECASTERS)
        check_choice("layers.planning.quantile", pl.get("quantile", "mean"), QUANTILES)
        for k in ("interval_s", "update_s", "refit_s", "horizon_s", "lead_s"):
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
        check_number("certificate.max_pm_loss_deg", cert.get("max_pm_loss_deg", 5.0), low=0.0, high=90.0), dict(d))


def load_stack_scenario(path: str | Path) -> StackScenario:
    """Read and validate a stack scenario TOML (a path, or a shipped scenario's name)."""
    path = Path(path)
    if not path.is_file() and (scenario_dir() / f"{path.name}.toml").is_file():
        path = scenario_dir() / f"{path.name}.toml"
    if not path.is_file():
        raise ConfigError("scenario", f"file {str(path)!r} does not exist")
    try:
        with path.open("rb") as fh:
            d = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path.name, f"not valid TOML: {exc}") from None
    return stack_scenario_from_dict(d, name=path.stem)


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
    measurement delay."""
    return (dynamics.startup_s * startup_factor + dynamics.warmup_s * (1.0 - dynamics.warmup_factor)
            + sample_period_s / 2.0 + params.measurement_delay_s)


@dataclass
class StackPlant:
    """What a stack is built for: the plant (slot limit applied), pool sizes it is tuned at, and
    the admission tuning report."""

    params: FluidParams
    fill_workers: int
    decode_workers: int


def _feedback_utilization(sc: StackScenario) -> float:
    """The reconfiguration layer's target utilisation: with a planning layer the forecast covers the
    start-up delay, so feedback keeps only the headroom of forecast error (``layers.planning.
    target_utilization``); without one, feedback must also carry the rises of a start-up
    (``layers.reconfiguration.target_utilization``)."""
    if "planning" in sc.layers and "target_utilization" in sc.layers["planning"]:
        return float(sc.layers["planning"]["target_utilization"])
    return float(sc.layers["reconfiguration"].get("target_utilization", 0.85))


def _pools_at(params: FluidParams, rate: float, u: float) -> tuple[int, int]:
    return (max(1, math.ceil(rate / (u * params.fill_rate_per_worker) - 1e-9)),
            max(1, math.ceil(rate / (u * params.decode_capacity(1)) - 1e-9)))


def stack_plant(sc: StackScenario) -> StackPlant:
    """The plant the stack runs on (the batch gate applied) and the pool sizes at nominal demand."""
    p = sc.params
    if "batch_gate" in sc.layers:
        p = slot_limit(p, sc.slo_tpot_s, sc.layers["batch_gate"].get("tpot_fraction", 0.8))
    nf, nd = _pools_at(p, sc.rate_rps, _feedback_utilization(sc))
    return StackPlant(p, nf, nd)


def _admission(sc: StackScenario, plant: StackPlant):
    a = dict(sc.layers["admission"])
    a.pop("kind")
    p = {"sample_period_s": a.pop("sample_period_s", 1.0), **a}
    ctx = PlantContext(plant.params, plant.fill_workers, plant.decode_workers, slo_ttft_s=sc.slo_ttft_s,
                       slo_tpot_s=sc.slo_tpot_s, envelope=sc.envelope)
    return smoothed_admission(ctx, p, where="layers.admission")


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


def build_stack(sc: StackScenario, *, history: pd.Series | None = None, time_offset_s: float = 0.0,
                fleet_size: int | None = None, name: str | None = None) -> tuple[ControlStack, StackPlant]:
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

    Returns
    -------
    tuple
        ``(ControlStack, StackPlant)``; run it on ``StackPlant.params``.
    """
    plant = stack_plant(sc)
    p = plant.params
    layers = []
    if "batch_gate" in sc.layers:
        layers.append(StackLayer("batch_gate", note=f"slot limit {p.decode_slots_per_worker:.0f} per decode worker "
                                 f"(pass {p.decode_step_s(p.decode_slots_per_worker) * 1e3:.1f} ms)"))
    if "admission" in sc.layers:
        ctrl, _ = _admission(sc, plant)
        ctrl = CapacityScaledBound(ctrl, p.decode_slots(plant.decode_workers))
        layers.append(StackLayer("admission", [ctrl], ctrl.sample_period))
    rc = sc.layers["reconfiguration"]
    T = rc.get("sample_period_s", 10.0)
    u = _feedback_utilization(sc)
    dyn = sc.dynamics
    planner = None
    if "planning" in sc.layers:
        pl = sc.layers["planning"]
        interval = pl.get("interval_s", 600.0)
        planner = DemandPlanner({"fill": p.fill_rate_per_worker, "decode": p.decode_capacity(1)},
                                lead_s=pl.get("lead_s", dyn.startup_s + dyn.warmup_s + T), target_utilization=u,
                                forecaster=pl.get("forecaster", "holt-winters"), quantile=pl.get("quantile", "mean"),
                                interval_s=interval, update_s=pl.get("update_s", 3600.0),
                                refit_s=pl.get("refit_s", 86400.0), horizon_s=pl.get("horizon_s"),
                                history=history, time_offset_s=time_offset_s)
    qc, _ = _queue_clear(sc, plant)
    fleet = fleet_size if fleet_size is not None else rc.get("fleet_size")
    pools = []
    for pool, mu in (("fill", p.fill_rate_per_worker), ("decode", p.decode_capacity(1))):
        pools.append(PlannedPoolController.tuned(
            pool, mu, sc.rate_rps, planner=planner, measured_fill_rate=(pool == "fill" and fleet is not None),
            startup_s=dyn.startup_s, warmup_s=dyn.warmup_s, filter_s=rc.get("filter_s", 30.0),
            target_utilization=u, min_dead_band=rc.get("min_dead_band", 0.25), queue_clear_s=qc,
            queue_headroom=rc.get("queue_headroom", 0.25), max_step_up=rc.get("max_step_up", 4),
            max_step_down=rc.get("max_step_down", 1), min_replicas=1,
            max_replicas=fleet if fleet else 1000, sample_period=T))
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
    checks, failures (each naming its layer) and the verdict."""

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

    # -- batch gate: static (the slot limit); its response is one decode pass
    gate_tau = p.dispatch_s
    if "batch_gate" in sc.layers:
        layers["batch_gate"] = {"static": True, "decode_slots_per_worker": p.decode_slots_per_worker,
                                "pass_time_s": p.decode_step_s(p.decode_slots_per_worker),
                                "response_time_constant_s": gate_tau, "meets_floors": True}
    # -- admission over delay x service rate x demand level
    adm = None
    adm_loop = None
    if "admission" in sc.layers:
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
        # the admission loop with the decode batch's response (one pass) in its plant vs without
        if "batch_gate" in sc.layers:
            separation.append(cascade_separation(
                "admission", adm_loop, "batch_gate", first_order_lag(gate_tau),
                note="decode batch responds to a freed or filled slot within one pass (first-order lag)"))
        # describing function: admission's rate clip is a saturation in the loop. With conditional
        # integration (anti-windup) the integral freezes while the output is clipped, so the clip
        # sees the proportional loop kc F(s) P(s) e^{-theta s}. A saturation's N(A) is real in (0, 1],
        # so harmonic balance 1 + N(A) L(jw) = 0 has a solution exactly where the phase crosses -180
        # deg with |L| > 1/N >= 1: a cycle is predicted iff that loop's gain margin is below 1.
        worst_adm = layers["admission"]["worst"]
        wl = admission_loop(FluidPlant(p, plant.fill_workers, plant.decode_workers), adm,
                            delay_factor=worst_adm["delay_factor"], service_rate_factor=worst_adm["service_rate_factor"])
        kc, ti = adm.gains.kc, adm.gains.ti
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
    if adm_loop is not None:
        separation.append(cascade_separation(
            "reconfiguration", rec_loop, "admission", closed_loop(adm_loop),
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
        pl = sc.layers["planning"]
        lead = pl.get("lead_s", sc.dynamics.startup_s + sc.dynamics.warmup_s + T_rc)
        update_s = pl.get("update_s", 3600.0)
        wb_rec = closed_loop_bandwidth(rec_loop)
        w_plan = 2.0 * math.pi / update_s
        needed = reconfiguration_delay_s(p, sc.dynamics, T_rc) - T_rc / 2.0 - p.measurement_delay_s
        layers["planning"] = {"feed_forward": True, "lead_s": lead, "update_s": update_s,
                              "scale_up_delay_s": needed, "meets_floors": lead >= needed}
        separation.append(CascadePair("planning", "reconfiguration", wb_rec, w_plan, wb_rec / w_plan, None, None,
                                      0.0, 0.0, note="feed-forward: the planner's input (offered demand) is not "
                                      "changed by any layer, so it closes no loop and costs no phase; ratio = "
                                      "reconfiguration bandwidth / the planner's update frequency"))
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
    its size and the prompt-length factor over time."""

    name: str
    demand: pd.Series
    history: pd.Series | None
    time_offset_s: float
    prompt_tokens: int
    output_tokens: int
    fleet_size: int | None = None

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


def plant_for(sc: StackScenario, prompt_tokens: int, output_tokens: int) -> FluidParams:
    """The scenario's plant at another request shape (a trace's mean request)."""
    plant_d = {**dict(sc.config.get("plant", {})), "prompt_tokens": int(prompt_tokens),
               "output_tokens": int(output_tokens), "fill_workers": 1, "decode_workers": 1}
    return build_plant(plant_d).params


def utilization_ceiling(params: FluidParams, slo_ttft_s: float, slo_tpot_s: float, *, workers: int = 4,
                        grid=(0.8, 0.85, 0.9, 0.93, 0.95, 0.97, 0.99), duration_s: float = 1200.0,
                        dt: float = 1.0, seed: int = 0) -> dict[str, float]:
    """The highest utilisation of each pool at which the pool model still meets the SLO for 99 %
    of requests (Poisson arrivals, the other pool ample), on ``grid``: the SLO's utilisation ceiling."""
    from tokenfactory.plant_models.pools import PoolScenario, simulate_pools

    out = {}
    for pool in ("fill", "decode"):
        mu = params.fill_rate_per_worker if pool == "fill" else params.decode_capacity(1)
        best = grid[0]
        for rho in grid:
            lam = rho * workers * mu
            nf = workers if pool == "fill" else math.ceil(lam / (0.5 * params.fill_rate_per_worker))
            nd = workers if pool == "decode" else math.ceil(lam / (0.5 * params.decode_capacity(1)))
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
                 dt: float = 1.0, seed: int = 0, control_start_s: float = 300.0,
                 ceiling: dict[str, float] | None = None) -> tuple[dict, Any, Any]:
    """Run the scenario's stack (``"stack"``), the stack without its planning layer
    (``"stack-no-planning"``) or a baseline deployment (a :data:`tokenfactory.registry.BASELINE_STACKS`
    name) over ``wl`` in the pool model; metrics include the oracle's GPU-hours.

    Returns
    -------
    tuple
        ``(metrics row, PoolResponse, ControlStack)``.
    """
    from tokenfactory.controllers.capacity import oracle_plan
    from tokenfactory.controllers.oscillation import assess
    from tokenfactory.plant_models.pools import PoolScenario, simulate_pools
    from tokenfactory.registry import BASELINE_STACKS, baseline_stack

    params = plant_for(sc, wl.prompt_tokens, wl.output_tokens)
    dyn = sc.dynamics if startup_s is None else dataclasses.replace(sc.dynamics, startup_s=float(startup_s))
    if wl.fleet_size is not None:
        dyn = dataclasses.replace(dyn, fleet_size=wl.fleet_size)
    mean = float(wl.demand.mean())
    s = sc.with_overrides(params=params, rate_rps=mean, dynamics=dyn, planning=(stack == "stack"))
    if stack in ("stack", "stack-no-planning"):
        ctrl, plant = build_stack(s, history=wl.history, time_offset_s=wl.time_offset_s, fleet_size=wl.fleet_size,
                                  name=stack)
        run_params = plant.params
    elif stack in BASELINE_STACKS:
        run_params = params
        ctrl = baseline_stack(stack, PlantContext(params, 1, 1, slo_ttft_s=s.slo_ttft_s, slo_tpot_s=s.slo_tpot_s,
                                                  rate_rps=mean, dynamics=dyn,
                                                  max_replicas=wl.fleet_size or 64), dt=dt)
    else:
        raise ConfigError("stack", f"{stack!r} is not 'stack', 'stack-no-planning' or one of "
                          f"{', '.join(BASELINE_STACKS)}")
    nf, nd = _pools_at(run_params, float(wl.demand.iloc[0]), _feedback_utilization(s))
    if wl.fleet_size is not None and nf + nd > wl.fleet_size:
        raise ConfigError("fleet_size", f"{wl.fleet_size} workers cannot hold the initial {nf} + {nd}")
    psc = PoolScenario(wl.demand, wl.duration_s, dt=dt, control_start_s=control_start_s, seed=seed,
                       slo_ttft_s=s.slo_ttft_s, slo_tpot_s=s.slo_tpot_s)
    r = simulate_pools(run_params, nf, nd, psc, controllers=[ctrl], dynamics=dyn)
    # the oracle: same plant as the stack (its slot limit is part of the SLO), same start-up
    oracle_params = stack_plant(s).params
    ceil_ = ceiling or utilization_ceiling(oracle_params, s.slo_ttft_s, s.slo_tpot_s)
    _, oracle_gpu_h = oracle_plan(wl.demand, {"fill": oracle_params.fill_rate_per_worker,
                                              "decode": oracle_params.decode_capacity(1)}, ceil_,
                                  startup_s=dyn.startup_s, gpus_per_worker=dyn.gpus_per_worker,
                                  fleet_size=wl.fleet_size)
    step = max(1, int(round(10.0 / dt)))  # the detectors on 10-s samples of the provisioned pool sizes
    after = r.series[r.series["time_s"] >= control_start_s + 600.0]
    osc = {}
    for pool in ("fill", "decode"):
        x = _provisioned(after, pool).to_numpy(dtype=float)[::step]
        osc[pool] = assess(x, dt * step, min_amplitude=0.25).to_dict()
    m = r.metrics
    row = {"stack": stack, "workload": wl.name, "startup_s": dyn.startup_s, "gpu_hours": m["gpu_hours"],
           "busy_gpu_hours": m["busy_gpu_hours"], "oracle_gpu_hours": oracle_gpu_h,
           "gpu_hours_over_oracle": m["gpu_hours"] / oracle_gpu_h if oracle_gpu_h > 0 else math.nan,
           "slo_attainment": m["slo_attainment"], "rejected": m["rejected"],
           "actions_per_hour": m["actions_per_hour"], "reversals_per_hour": m["reversals_per_hour"],
           "oscillating": any(v["oscillating"] for v in osc.values()),
           "fill_thornhill_r": osc["fill"]["thornhill_r"], "decode_thornhill_r": osc["decode"]["thornhill_r"],
           "requests": m["requests"], "completed": m["completed"], "in_flight_end": m["in_flight_end"],
           "utilization_ceiling": ceil_}
    return row, r, ctrl
