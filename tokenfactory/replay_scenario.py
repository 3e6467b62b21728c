"""A replay scenario file (``tokenfactory simulate --scenario``): its schema, resolved and checked once.

:func:`load_replay_scenario` reads the TOML and :func:`replay_scenario_from_dict` checks every
field (a margins scenario's fields a replay cannot honour are rejected with the reason);
:func:`scenario_cluster` is the cluster a replay of it runs with. :mod:`tokenfactory.replay`
runs it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tokenfactory.core.validation import (ConfigError, check_number, check_settings, load_toml, reject_unknown_keys,
                                          setting, setting_names)
from tokenfactory.plant_models.calibration import PARAMETER_SETS, parameter_set
from tokenfactory.plant_models.des import ClusterConfig
from tokenfactory.scenario import WORKER_SETTINGS

__all__ = ["REPLAY_PLANT_SCHEMA", "REPLAY_SIMULATION_SCHEMA", "REPLAY_SCENARIO_SCHEMA", "DEFAULT_PLANT",
           "plant_efficiency", "parameter_set_used",
           "ReplayScenario", "replay_scenario_from_dict", "load_replay_scenario", "scenario_cluster"]

#: the preset disaggregated cluster: DeepSeek-V3 on 8xH200 workers, 2 fill + 1 decode
#: the keys of a replay scenario's ``[plant]`` table (``simulate --scenario``): the shared worker
#: keys with the replay's defaults (the trace sets the request shape)
REPLAY_PLANT_SCHEMA = {
    "model": setting("deepseek-v3", kind="preset, TOML path or table",
                     meaning=WORKER_SETTINGS["model"].metadata["meaning"]),
    "hardware": setting("h200", kind="preset, TOML path or table",
                        meaning=WORKER_SETTINGS["hardware"].metadata["meaning"]),
    "fill_workers": setting(2, low=0.0, low_inclusive=False, unit="workers",
                            meaning="fill workers of the service model the capacity and the fluid plant are "
                                    "sampled at (the simulated pools are cluster.fill_workers)"),
    "decode_workers": setting(1, low=0.0, low_inclusive=False, unit="workers",
                              meaning="decode workers of that service model (the simulated pools are "
                                      "cluster.decode_workers)"),
    "params": setting(None, kind=str, choices=tuple(PARAMETER_SETS),
                      meaning="the service model's named parameter set, as calibrate score --params takes it ("
                              + "; ".join(f"{k}: {v}" for k, v in PARAMETER_SETS.items())
                              + "): its efficiencies, with plant.efficiency overriding single fields (absent: the "
                                "plant's default efficiencies; simulate --params overrides it)"),
    **{k: f for k, f in WORKER_SETTINGS.items() if k not in ("model", "hardware")},
}
DEFAULT_PLANT = {k: f.default for k, f in REPLAY_PLANT_SCHEMA.items() if f.default is not None}


def plant_efficiency(plant: dict) -> dict | None:
    """The efficiency table a replay's workers are built with: the named set of ``plant.params``
    (:func:`tokenfactory.plant_models.calibration.parameter_set`; its efficiencies - the set's
    KV formats per engine and the measured benchmarks' TTFT terms are the calibration's, not a
    replay's) with ``plant.efficiency`` over it field by field; without ``params``, the
    ``efficiency`` table alone (None: the workers' default efficiencies).

    Parameters
    ----------
    plant : dict
        A replay's plant table (:data:`REPLAY_PLANT_SCHEMA` keys).

    Returns
    -------
    dict or None
        :class:`~tokenfactory.plant_models.roofline.Efficiency` fields.

    Raises
    ------
    ConfigError
        For a ``params`` name not in :data:`~tokenfactory.plant_models.calibration.PARAMETER_SETS`
        (field ``plant.params``).
    """
    overrides = plant.get("efficiency")
    if plant.get("params") is None:
        return None if overrides is None else dict(overrides)
    base = dataclasses.asdict(parameter_set(plant["params"], "plant.params").efficiency)
    return {**base, **dict(overrides or {})}


def parameter_set_used(plant: dict, efficiency) -> dict:
    """Which parameter set a replay ran with, for its output and ``metrics.json``: ``name`` (the
    ``params`` given, else ``"plant default"``), ``matches`` (the named sets whose efficiencies
    equal the ones used, whatever was asked), ``overrides`` (the ``plant.efficiency`` fields given
    over it), ``efficiency`` (every field used) and ``label`` (one line saying so).

    Parameters
    ----------
    plant : dict
        The replay's plant table.
    efficiency : Efficiency
        The efficiencies its workers were built with.
    """
    used = dataclasses.asdict(efficiency)
    matches = [k for k in PARAMETER_SETS if dataclasses.asdict(parameter_set(k).efficiency) == used]
    overrides = sorted(plant.get("efficiency") or {})
    name = plant.get("params") or "plant default"
    others = [k for k in matches if k != name]   # the named sets it equals besides the one asked for
    label = (name if plant.get("params") else "the plant's default efficiencies") + (
        f" with plant.efficiency {', '.join(overrides)}" if overrides else "") + (
        f" (equal to the {' / '.join(others)} set)" if others else "") + (
        "" if matches else " (equal to no named set)")
    if plant.get("params") or "calibrated" in matches:
        label += "; its efficiencies only: the KV format is the model's, the measured benchmarks' TTFT terms are " \
                 "not a replay's"
    return {"name": name, "matches": matches, "overrides": overrides, "efficiency": used, "label": label}


def scenario_cluster(scenario: "ReplayScenario | None", seed: int = 0) -> dict:
    """The cluster fields a replay of ``scenario`` runs with: its ``[cluster]`` table, the seed,
    and - unless it lists classes - the interactive class at the cluster's SLO with the default
    batch class (what ``tokenfactory simulate`` runs).

    Parameters
    ----------
    scenario : ReplayScenario or None
        The resolved scenario (:func:`load_replay_scenario`); None: an empty ``[cluster]`` table.
    seed : int
        Seed of the replay, used when the ``[cluster]`` table sets none (default 0).

    Returns
    -------
    dict
        A copy of the cluster fields with ``seed`` and ``classes`` filled in.
    """
    from tokenfactory.core.classes import DEFAULT_CLASSES, INTERACTIVE, RequestClass

    cluster = dict(scenario.cluster) if scenario else {}
    cluster.setdefault("seed", seed)
    if "classes" not in cluster:
        ttft, tpot = cluster.get("slo_ttft_s", 2.0), cluster.get("slo_tpot_s", 0.1)
        cluster["classes"] = (RequestClass(INTERACTIVE, ttft, tpot, 0),
                              *(c for c in DEFAULT_CLASSES if c.name != INTERACTIVE))
    return cluster


#: the keys of a replay scenario's ``[simulation]`` table
REPLAY_SIMULATION_SCHEMA = {
    "load": setting(None, low=0.0, low_inclusive=False,
                    meaning="replay at this multiple of the cluster's capacity at the SLO (not with scale)"),
    "scale": setting(None, low=0.0, low_inclusive=False, meaning="speed the trace up by this factor (not with load)"),
    "duration_s": setting(None, unit="s", low=0.0, low_inclusive=False,
                          meaning="replay this much of the trace (absent: all of it)"),
    "batch_cap": setting(None, low=1.0, unit="sequences", also=("static",),
                         meaning='decode batch cap per worker; "static": the largest batch whose pass meets the '
                                 "TPOT SLO (the vLLM --max-num-seqs to set)"),
}
_SIMULATION_KEYS = tuple(REPLAY_SIMULATION_SCHEMA)
#: the top-level keys of a replay scenario
REPLAY_SCENARIO_SCHEMA = {
    "name": setting(None, kind=str, meaning="the scenario's name (absent: the file's stem)"),
    "description": setting("", kind=str, meaning="one line on what the scenario is"),
    "plant": setting(None, kind="table", meaning="model, hardware and service-model pools ([plant])"),
    "cluster": setting(None, kind="table", meaning="the simulated cluster: pools, SLOs, dynamics, events "
                                                   "([cluster]; see the cluster section)"),
    "classes": setting(None, kind="table", meaning="request classes, {NAME = {fields}} (or cluster.classes; see "
                                                   "classes.NAME)"),
    "controller": setting(None, kind="table", meaning="admission: kind = an admission kind and its parameters "
                                                      "(see the kinds section)"),
    "envelope": setting(None, kind="table", meaning="the stability envelope a tuned admission must hold "
                                                    "([envelope])"),
    "simulation": setting(None, kind="table", meaning="load, scale, duration and batch cap of the replay "
                                                      "([simulation])"),
}
#: plant keys of a margins scenario that a replay cannot honour, and why
_PLANT_NOT_IN_REPLAY = {
    "prompt_tokens": "the trace sets the request shape in a replay",
    "output_tokens": "the trace sets the request shape in a replay",
    "cached_tokens": "the trace sets the request shape in a replay",
    "decode_parallelism": "a replay's fill and decode workers share one parallelism (set plant.parallelism)",
}
_SIMULATION_NOT_IN_REPLAY = {
    "demand_factor": "a replay's demand is the trace's (use simulation.load or simulation.scale)",
    "dt": "the request simulator is event-driven (cluster.snapshot_dt sets the sample period)",
    "demand_noise_cv": "a replay's demand is the trace's",
    "noise_interval_s": "a replay's demand is the trace's",
    "disturbances": "the request simulator's events are cluster.events",
    "seed": "set cluster.seed",
}


@dataclasses.dataclass
class ReplayScenario:
    """A scenario file resolved for a replay (``tokenfactory simulate --scenario``): every field
    reaches the simulation, or the file is rejected naming the field.

    Parameters
    ----------
    name : str
        The scenario's name.
    plant : dict
        Overrides of :data:`DEFAULT_PLANT` for :func:`build_replay`.
    cluster : dict
        :class:`ClusterConfig` fields (``classes`` from the ``[classes]`` section included).
    admission : str or None
        The admission kind (``[controller] kind``).
    admission_params : dict
        Its parameters.
    envelope : StabilityEnvelope or None
        The envelope the admission is tuned over.
    simulation : dict
        ``load``, ``scale``, ``duration_s``, ``batch_cap`` (each optional).
    """

    name: str
    plant: dict
    cluster: dict
    admission: str | None
    admission_params: dict
    envelope: Any
    simulation: dict


def replay_scenario_from_dict(d: dict, name: str = "scenario") -> ReplayScenario:
    """Validate a scenario table for a replay, field by field.

    Sections: ``plant`` (:data:`DEFAULT_PLANT` keys, ``parallelism``, ``efficiency``,
    ``decode_model``, ``decode_hardware``), ``cluster`` (:class:`ClusterConfig` fields),
    ``classes`` (request classes, :func:`tokenfactory.core.classes.classes_from_dict`), ``controller``
    (``kind`` and that kind's parameters), ``envelope`` (:class:`StabilityEnvelope` fields) and
    ``simulation`` (``load``, ``scale``, ``duration_s``, ``batch_cap``); ``name`` and
    ``description``.

    Parameters
    ----------
    d : dict
        The parsed TOML.
    name : str
        Name when the file has none.

    Returns
    -------
    ReplayScenario

    Raises
    ------
    ConfigError
        Naming the first field that is unknown, out of range, or meaningless in a replay (a
        margins scenario's ``plant.prompt_tokens``, ``simulation.demand_factor``, ...).
    """
    from tokenfactory.core.classes import classes_from_dict
    from tokenfactory.controllers.autotune import StabilityEnvelope
    from tokenfactory.registry import ADMISSION_KINDS

    d = dict(d)
    reject_unknown_keys("", d, REPLAY_SCENARIO_SCHEMA)
    plant = dict(d.get("plant", {}))
    for k in plant:
        if k in _PLANT_NOT_IN_REPLAY:
            raise ConfigError(f"plant.{k}", _PLANT_NOT_IN_REPLAY[k])
    check_settings("plant", plant, REPLAY_PLANT_SCHEMA)  # unknown keys and out-of-range values, named as written
    cluster = dict(d.get("cluster", {}))
    if "classes" in d:
        if "classes" in cluster:
            raise ConfigError("classes", "give the classes once: [classes] or cluster.classes")
        cluster["classes"] = classes_from_dict(d["classes"], "classes")
    ClusterConfig.from_dict(cluster)  # every field checked now, named
    ctrl = dict(d.get("controller", {}))
    kind = ctrl.pop("kind", None)
    if kind is not None:
        if kind not in ADMISSION_KINDS:
            raise ConfigError("controller.kind", f"{kind!r} is not one of {', '.join(ADMISSION_KINDS)}")
        reject_unknown_keys("controller", ctrl, ADMISSION_KINDS[kind].keys)
    elif ctrl:
        raise ConfigError(f"controller.{next(iter(ctrl))}", "controller parameters need a controller.kind")
    envelope = None
    if "envelope" in d:
        env = dict(d["envelope"])
        reject_unknown_keys("envelope", env, setting_names(StabilityEnvelope))
        for k in ("delay_factors", "service_rate_factors"):
            if k in env:
                env[k] = tuple(env[k])
        envelope = StabilityEnvelope(**env)
    sim = dict(d.get("simulation", {}))
    for k in sim:
        if k in _SIMULATION_NOT_IN_REPLAY:
            raise ConfigError(f"simulation.{k}", _SIMULATION_NOT_IN_REPLAY[k])
    reject_unknown_keys("simulation", sim, _SIMULATION_KEYS)
    if "load" in sim and "scale" in sim:
        raise ConfigError("simulation.load", "give simulation.load or simulation.scale, not both")
    for k in ("load", "scale", "duration_s"):
        if k in sim:
            check_number(f"simulation.{k}", sim[k], low=0.0, low_inclusive=False)
    if "batch_cap" in sim and sim["batch_cap"] != "static":
        check_number("simulation.batch_cap", sim["batch_cap"], low=1.0)
    return ReplayScenario(str(d.get("name", name)), plant, cluster, kind, ctrl, envelope, sim)


def load_replay_scenario(path) -> ReplayScenario:
    """:func:`replay_scenario_from_dict` of a TOML file.

    Parameters
    ----------
    path : str or Path
        The file.

    Returns
    -------
    ReplayScenario

    Raises
    ------
    ConfigError
        For a missing or unreadable file, bad TOML, or a bad field.
    """
    from pathlib import Path

    return replay_scenario_from_dict(load_toml(path), name=Path(path).stem)
