"""Scenario files: a plant, a controller, a stability envelope and a simulation, in one TOML.

Resolved once and validated up front: unknown keys and out-of-range values raise
:class:`ConfigError` naming the field. Used by ``tokenfactory margins`` and the studies.

.. code-block:: toml

    [plant]
    model = "deepseek-v3"          # preset, TOML path, or table
    hardware = "h200"              # preset, TOML path, or table (decode_* keys override for decode)
    parallelism = { tp = 1, pp = 1, ep = 8 }
    fill_workers = 6
    decode_workers = 4
    prompt_tokens = 2048
    output_tokens = 512
    measurement_delay_s = 0.5

    [controller]
    kind = "smoothed"              # any admission kind: tokenfactory describe kinds
    sample_period_s = 0.25

    [envelope]
    delay_factors = [0.5, 1.0, 2.0]
    service_rate_factors = [0.7, 1.0, 1.3]

    [simulation]
    demand_factor = 1.0            # x decode capacity
    duration_s = 300
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from tokenfactory.controllers.admission import CompletionTriggeredAdmission, SmoothedAdmission
from tokenfactory.controllers.autotune import StabilityEnvelope, TuningReport, admission_loop
from tokenfactory.controllers.describing import predict_limit_cycles
from tokenfactory.controllers.stability import DelayedLoop, stability_margins
from tokenfactory.controllers.stability_batch import stability_margins_batch
from tokenfactory.plant_models.fluid import FluidParams, FluidPlant, LoopScenario
from tokenfactory.plant_models.roofline import Worker
from tokenfactory.plant_models.service import DEFAULT_KV_SETUP_S, DEFAULT_KV_STRIPES, KVLink, RequestShape, ServiceModel
from tokenfactory.registry import ADMISSION_KINDS, PlantContext, admission_kinds, build_admission
from tokenfactory.registry.kind_settings import KIND_SETTINGS
from tokenfactory.core.validation import (REQUIRED, ConfigError, check_choice, check_number, check_settings, load_toml,
                                          reject_unknown_keys, setting, setting_names)

__all__ = ["Scenario", "load_scenario", "scenario_from_dict", "build_plant", "build_controller", "PLANT_SCHEMA",
           "SCENARIO_SCHEMA", "WORKER_SETTINGS", "SHAPE_SETTINGS",
           "margins_table", "naive_limit_cycle", "scenario_dir"]

def scenario_dir() -> Path:
    """The folder of the shipped scenario files (``tokenfactory/scenarios``: loop scenarios read by
    :func:`load_scenario`, stack scenarios read by :func:`tokenfactory.stack.load_stack_scenario`),
    package data of this layer."""
    return Path(__file__).resolve().parent / "scenarios"


#: the worker and KV-link keys every plant table shares (margins, stack and replay scenarios)
WORKER_SETTINGS = {
    "model": setting(REQUIRED, kind="preset, TOML path or table",
                     meaning="the model: a preset name (deepseek-v3, ...), a model TOML beside this file, or an "
                             "inline table (see the model section)"),
    "hardware": setting(REQUIRED, kind="preset, TOML path or table",
                        meaning="the accelerator: a preset name (h200, ...), a hardware TOML beside this file, or "
                                "an inline table (see the hardware section)"),
    "parallelism": setting(None, kind="table", meaning="the workers' layout (plant.parallelism; absent: tp = 1, "
                                                       "pp = 1, ep = 8)"),
    "efficiency": setting(None, kind="table", meaning="fractions of peak reached and fixed costs (plant.efficiency; "
                                                      "absent: the fitted defaults)"),
    "decode_model": setting(None, kind="preset, TOML path or table",
                            meaning="the decode workers' model (absent: model)"),
    "decode_hardware": setting(None, kind="preset, TOML path or table",
                               meaning="the decode workers' accelerator (absent: hardware)"),
    "measurement_delay_s": setting(0.5, unit="s", low=0.0, meaning="age of what controllers see"),
    "kv_stripes": setting(DEFAULT_KV_STRIPES, kind=int, low=1, unit="NICs",
                          source="assumed: one NIC per GPU of an 8-GPU fill worker (Mooncake's and NIXL's transfer "
                                 "engines stripe over the node's RDMA NICs)",
                          meaning="NICs one KV transfer is striped over"),
    "kv_setup_s": setting(DEFAULT_KV_SETUP_S, unit="s", low=0.0,
                          source="assumed: a few RDMA round trips plus the scheduler's hand-off",
                          meaning="fixed cost of one KV transfer"),
}
#: the request-shape keys of a margins or stack scenario's plant (a replay takes the trace's shape)
SHAPE_SETTINGS = {
    "decode_parallelism": setting(None, kind="table", meaning="the decode workers' layout (absent: parallelism)"),
    "prompt_tokens": setting(RequestShape().prompt_tokens, kind=int, low=1, unit="tokens",
                             meaning="new (uncached) prompt tokens of the nominal request"),
    "output_tokens": setting(RequestShape().output_tokens, kind=int, low=1, unit="tokens",
                             meaning="output tokens of the nominal request"),
    "cached_tokens": setting(RequestShape().cached_tokens, kind=int, low=0, unit="tokens",
                             meaning="prompt tokens served from the prefix cache"),
}
#: the keys of a margins scenario's ``[plant]`` table (:func:`build_plant`)
PLANT_SCHEMA = {
    **WORKER_SETTINGS, **SHAPE_SETTINGS,
    "fill_workers": setting(REQUIRED, low=0.0, low_inclusive=False, unit="workers",
                            meaning="fill (prefill) workers (fractional: a fluid pool)"),
    "decode_workers": setting(REQUIRED, low=0.0, low_inclusive=False, unit="workers", meaning="decode workers"),
}
_PLANT_KEYS = set(PLANT_SCHEMA)
#: the top-level keys of a margins scenario
SCENARIO_SCHEMA = {
    "name": setting(None, kind=str, meaning="the scenario's name (absent: the file's stem)"),
    "description": setting("", kind=str, meaning="one line on what the scenario is"),
    "plant": setting(REQUIRED, kind="table", meaning="the plant ([plant])"),
    "controller": setting(REQUIRED, kind="table", meaning="kind = an admission kind and that kind's parameters "
                                                          "(see the kinds section)"),
    "envelope": setting(None, kind="table", meaning="the stability envelope a tuned controller must hold "
                                                    "([envelope])"),
    "simulation": setting(None, kind="table", meaning="the fluid simulation ([simulation])"),
}


@dataclass
class Scenario:
    """A resolved scenario: everything built, plus the raw config it came from.

    Built by :func:`load_scenario` / :func:`scenario_from_dict`; :func:`margins_table` analyses it
    and :func:`tokenfactory.plant_models.fluid.simulate_loop` runs it.

    Parameters
    ----------
    name : str
        The scenario's name (the file's ``name`` key, else the file stem).
    plant : FluidPlant
        The fluid plant sampled from the roofline service model.
    controller : object
        The admission controller (a registered admission kind, e.g. :class:`SmoothedAdmission`).
    envelope : StabilityEnvelope
        The box of delay and service-rate errors and the margin floors.
    simulation : LoopScenario
        Demand (requests/s, ``demand_factor`` x decode capacity), duration, step and disturbances.
    tuning : TuningReport or None
        How a ``smoothed`` controller was tuned; ``None`` for other kinds.
    config : dict
        The raw configuration the scenario was resolved from.
    """

    name: str
    plant: FluidPlant
    controller: Any
    envelope: StabilityEnvelope
    simulation: LoopScenario
    tuning: TuningReport | None
    config: dict = field(default_factory=dict)


def build_plant(d: Mapping[str, Any], where: str = "plant") -> FluidPlant:
    """The fluid plant of a scenario's ``[plant]`` table, sampled from the roofline service model.

    Fill and decode workers share ``model``, ``hardware``, ``parallelism`` and ``efficiency``
    unless ``decode_model``, ``decode_hardware`` or ``decode_parallelism`` override them for
    decode. :meth:`FluidParams.from_service` turns the two workers, the request shape and the KV
    link into per-worker rates and delays.

    Parameters
    ----------
    d : mapping
        The plant table. Required: ``model``, ``hardware`` (preset, TOML path or table),
        ``fill_workers``, ``decode_workers`` (> 0). Optional: ``parallelism``, ``efficiency``,
        the ``decode_*`` overrides, ``prompt_tokens``, ``output_tokens``, ``cached_tokens``
        (tokens; defaults of :class:`~tokenfactory.plant_models.service.RequestShape`),
        ``measurement_delay_s`` (s, >= 0; default 0.5), ``kv_stripes`` (NICs a KV transfer is
        striped over) and ``kv_setup_s`` (s per transfer).
    where : str
        Dotted path of the table, used in error messages (default ``"plant"``).

    Returns
    -------
    FluidPlant
        The plant with its pools.

    Raises
    ------
    ConfigError
        For an unknown or missing key, a value outside its range, or a model that does not fit
        its workers.
    """
    d = dict(d)
    check_settings(where, d, PLANT_SCHEMA)  # unknown keys and out-of-range values, named as written
    for req in ("model", "hardware", "fill_workers", "decode_workers"):
        if req not in d:
            raise ConfigError(f"{where}.{req}", "missing")
    common = {k: d[k] for k in ("parallelism", "efficiency") if k in d}
    fill = Worker.from_dict({"model": d["model"], "hardware": d["hardware"], **common}, where=f"{where}")
    dec_common = dict(common)
    if "decode_parallelism" in d:
        dec_common["parallelism"] = d["decode_parallelism"]
    decode = Worker.from_dict({"model": d.get("decode_model", d["model"]),
                               "hardware": d.get("decode_hardware", d["hardware"]), **dec_common},
                              where=f"{where}.decode")
    nominal = RequestShape()
    shape = RequestShape(d.get("prompt_tokens", nominal.prompt_tokens), d.get("output_tokens", nominal.output_tokens),
                         d.get("cached_tokens", nominal.cached_tokens))
    link = KVLink(d.get("kv_stripes", DEFAULT_KV_STRIPES), d.get("kv_setup_s", DEFAULT_KV_SETUP_S))
    params = FluidParams.from_service(
        ServiceModel(fill, decode, shape, link),
        measurement_delay_s=check_number(f"{where}.measurement_delay_s", d.get("measurement_delay_s", 0.5), low=0.0))
    return FluidPlant(params, d["fill_workers"], d["decode_workers"])


def build_controller(d: Mapping[str, Any], plant: FluidPlant, envelope: StabilityEnvelope,
                     where: str = "controller") -> tuple[Any, TuningReport | None]:
    """The scenario's admission controller: any registered admission kind
    (:func:`tokenfactory.registry.admission_kinds`) with its parameters; ``smoothed`` is tuned over
    ``envelope`` and returns its tuning report. A scenario's smoothed controller sheds backlog over
    ``backlog_bound_s`` = 30 s unless the file says otherwise.

    Parameters
    ----------
    d : mapping
        The controller table: ``kind`` (a registered admission kind) and that kind's parameters
        (``tokenfactory describe kinds`` lists them).
    plant : FluidPlant
        The plant the controller is built and tuned for.
    envelope : StabilityEnvelope
        The box a ``smoothed`` controller is tuned over.
    where : str
        Dotted path of the table, used in error messages (default ``"controller"``).

    Returns
    -------
    controller : object
        The admission controller.
    tuning : TuningReport or None
        The tuning report of a ``smoothed`` controller; ``None`` for other kinds.

    Raises
    ------
    ConfigError
        For an unknown kind or key, a value outside its range, or (``smoothed``) no tuning that
        meets the envelope's floors.
    """
    d = dict(d)
    kind = check_choice(f"{where}.kind", d.get("kind"), admission_kinds())
    params = {k: v for k, v in d.items() if k != "kind"}
    reject_unknown_keys(where, params, ADMISSION_KINDS[kind].keys)
    check_settings(where, params, KIND_SETTINGS["admission"].get(kind, {}))  # documented types and ranges
    ctx = PlantContext(plant.params, plant.fill_workers, plant.decode_workers, envelope=envelope)
    rec = ADMISSION_KINDS[kind]
    params = {**rec.scenario_defaults, **params}
    if rec.build_tuned is not None:
        return rec.build_tuned(ctx, params, where=where)
    return build_admission(kind, ctx, params, where=where), None


def scenario_from_dict(d: Mapping[str, Any], name: str = "scenario") -> Scenario:
    """Resolve and validate a scenario given as a mapping (the TOML of the module docstring).

    Parameters
    ----------
    d : mapping
        Top-level keys ``name``, ``description``, ``plant`` and ``controller`` (required),
        ``envelope`` (:class:`StabilityEnvelope` fields) and ``simulation``
        (:class:`LoopScenario` fields except ``demand``, plus ``demand_factor`` in [0, 10],
        default 1: the demand as a multiple of the plant's decode capacity).
    name : str
        Name used when ``d`` has no ``name`` (default ``"scenario"``).

    Returns
    -------
    Scenario
        Everything built: plant, controller (tuned when ``smoothed``), envelope and simulation.

    Raises
    ------
    ConfigError
        For an unknown key, a missing section or any invalid value, naming the field.
    """
    d = dict(d)
    reject_unknown_keys("", d, SCENARIO_SCHEMA)
    for req in ("plant", "controller"):
        if req not in d:
            raise ConfigError(req, "missing section")
    plant = build_plant(d["plant"])
    env_d = dict(d.get("envelope", {}))
    reject_unknown_keys("envelope", env_d, setting_names(StabilityEnvelope))
    for k in ("delay_factors", "service_rate_factors"):
        if k in env_d:
            env_d[k] = tuple(env_d[k])
    envelope = StabilityEnvelope(**env_d)
    sim = dict(d.get("simulation", {}))
    factor = check_number("simulation.demand_factor", sim.get("demand_factor", 1.0), low=0.0, high=10.0)
    simulation = LoopScenario.from_dict(sim, demand=factor * plant.decode_capacity, where="simulation")
    controller, tuning = build_controller(d["controller"], plant, envelope)
    return Scenario(d.get("name", name), plant, controller, envelope, simulation, tuning, dict(d))


def load_scenario(path: str | Path) -> Scenario:
    """Read and resolve a scenario TOML file (see the module docstring for its layout).

    Parameters
    ----------
    path : str or pathlib.Path
        The TOML file; its stem names the scenario unless the file has a ``name`` key.

    Returns
    -------
    Scenario
        The resolved scenario.

    Raises
    ------
    ConfigError
        When the file does not exist (field ``scenario``), is not valid TOML (field: the file
        name), or holds an invalid scenario.
    """
    path = Path(path)
    return scenario_from_dict(load_toml(path), name=path.stem)


def naive_limit_cycle(plant: FluidPlant, controller: CompletionTriggeredAdmission, method: str = "exact"):
    """Describing-function prediction for the naive loop: a relay of amplitude open_gain x c around
    the ready buffer's integrator, delayed by fill-to-ready + measurement delay + T/2.

    Article section 18's oscillation, predicted by harmonic balance
    (:func:`tokenfactory.controllers.describing.predict_limit_cycles`) at the plant's decode
    capacity c.

    Parameters
    ----------
    plant : FluidPlant
        The plant (its linearised ready buffer and delays).
    controller : CompletionTriggeredAdmission
        The naive controller (its ``open_gain`` and sample period).
    method : {"exact", "pade"}
        Solve on the exact delay (default) or on a Pade model.

    Returns
    -------
    loop : DelayedLoop
        The linear part the relay sees.
    cycle : LimitCycle or None
        The lowest-frequency predicted cycle (amplitude in requests of ready buffer, frequency in
        rad/s), or ``None`` if none is predicted.

    Raises
    ------
    ConfigError
        For an unknown ``method``.
    """
    p = plant.params
    P, theta = plant.ready_buffer_tf()
    loop = DelayedLoop(P, theta + p.measurement_delay_s + controller.sample_period / 2.0, "naive")
    cycles = predict_limit_cycles(loop, controller.describing_nonlinearity(plant.decode_capacity), method=method)
    return loop, (cycles[0] if cycles else None)


def margins_table(sc: Scenario) -> pd.DataFrame:
    """One row per envelope point: the Nyquist verdict and exact and Pade margins (linear
    controllers), or the predicted limit cycle (relay-like controllers). ``meets_floors`` is
    the verdict *and* the floors: an unstable point fails whatever its margins read.

    The exact margins of all points come from one :func:`stability_margins_batch` call; the
    Pade column from :func:`stability_margins` per point (each picks its own order).

    Parameters
    ----------
    sc : Scenario
        A resolved scenario with a ``smoothed`` or ``naive`` controller.

    Returns
    -------
    pandas.DataFrame
        One row per envelope point (delay-major). Always ``delay_factor``,
        ``service_rate_factor``, ``loop_delay_s`` (s) and ``meets_floors``. Smoothed: ``stable``,
        ``closed_loop_rhp_poles``, ``gain_margin``, ``lower_gain_margin``, ``phase_margin_deg``,
        ``delay_margin_s`` (s), ``ms``, ``pade`` (the Pade order used) and
        ``pade_phase_margin_deg``. Naive: ``limit_cycle`` (bool), ``predicted_period_s`` (s) and
        ``predicted_amplitude`` (requests), NaN without a cycle; ``meets_floors`` is true only
        without a predicted cycle.

    Raises
    ------
    ConfigError
        For any other controller kind (field ``controller.kind``).
    """
    rows = []
    if isinstance(sc.controller, SmoothedAdmission):
        points = sc.envelope.points()
        cache: dict = {}
        loops = [admission_loop(sc.plant, sc.controller, delay_factor=dfac, service_rate_factor=rfac,
                                _plant_model_cache=cache) for dfac, rfac in points]
        exact = stability_margins_batch(loops)   # the Pade column stays per loop (it picks an order each)
        for i, ((dfac, rfac), loop) in enumerate(zip(points, loops)):
            ex, pa = exact[i], stability_margins(loop, "pade")
            rows.append({"delay_factor": dfac, "service_rate_factor": rfac, "loop_delay_s": loop.delay,
                         "stable": ex.stable, "closed_loop_rhp_poles": ex.closed_loop_rhp_poles,
                         "gain_margin": ex.gain_margin, "lower_gain_margin": ex.lower_gain_margin,
                         "phase_margin_deg": ex.phase_margin_deg,
                         "delay_margin_s": ex.delay_margin_s, "ms": ex.ms,
                         "pade": pa.method, "pade_phase_margin_deg": pa.phase_margin_deg,
                         "meets_floors": ex.meets(sc.envelope.gm_floor, sc.envelope.pm_floor_deg)})
    elif isinstance(sc.controller, CompletionTriggeredAdmission):
        for dfac, rfac in sc.envelope.points():
            params = sc.plant.params.scaled(delay_factor=dfac, service_rate_factor=rfac)
            pl = FluidPlant(params, sc.plant.fill_workers, sc.plant.decode_workers)
            loop, lc = naive_limit_cycle(pl, sc.controller)
            rows.append({"delay_factor": dfac, "service_rate_factor": rfac, "loop_delay_s": loop.delay,
                         "limit_cycle": lc is not None,
                         "predicted_period_s": lc.period_s if lc else math.nan,
                         "predicted_amplitude": lc.amplitude if lc else math.nan, "meets_floors": lc is None})
    else:
        raise ConfigError("controller.kind", "margins are defined for 'smoothed' (linear) and 'naive' "
                          "(relay) controllers; 'threshold' is an on/off rule with no linear part")
    return pd.DataFrame(rows)
