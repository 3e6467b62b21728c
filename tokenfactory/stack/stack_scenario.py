"""The stack scenario: one TOML naming the plant, the SLO, the nominal demand, the worker dynamics,
each layer and the envelope, validated once into a :class:`StackScenario` (the layout is in
:mod:`tokenfactory.stack`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenfactory.controllers.autotune import StabilityEnvelope
from tokenfactory.core.validation import (
    REQUIRED,
    ConfigError,
    check_int,
    check_number,
    load_toml,
    reject_unknown_keys,
    setting,
    setting_names,
)
from tokenfactory.plant_models.fluid import FluidParams
from tokenfactory.plant_models.fleet import GPU_POOLS, pool_gpus
from tokenfactory.plant_models.pools import PoolDynamics
from tokenfactory.plant_models.roofline import Parallelism
from tokenfactory.registry.stack_layers import STACK_LAYERS, StackLayerConfig, stack_layer_config
from tokenfactory.scenario import SHAPE_SETTINGS, WORKER_SETTINGS, build_plant, scenario_dir

__all__ = ["StackScenario", "load_stack_scenario", "stack_scenario_from_dict", "STACK_SCENARIO_SCHEMA",
           "STACK_PLANT_SCHEMA", "STACK_SLO_SCHEMA", "STACK_WORKLOAD_SCHEMA", "STACK_ENVELOPE_SCHEMA",
           "STACK_CERTIFICATE_SCHEMA"]

#: the top-level keys of a stack scenario
STACK_SCENARIO_SCHEMA = {
    "name": setting(None, kind=str, meaning="the scenario's name (absent: the file's stem)"),
    "description": setting("", kind=str, meaning="one line on what the scenario is"),
    "plant": setting(REQUIRED, kind="table", meaning="model, hardware and request shape ([plant]; the stack sizes "
                                                     "the pools)"),
    "slo": setting(None, kind="table", meaning="the promise ([slo])"),
    "workload": setting(REQUIRED, kind="table", meaning="the nominal demand ([workload])"),
    "dynamics": setting(None, kind="table", meaning="start-up, warm-up, drain and fleet size of workers ([dynamics]; "
                                                    "the cluster.dynamics keys; gpus_per_worker absent (or a pool of its "
                                                    "{fill, decode} table): that pool's "
                                                    "pp x ep)"),
    "layers": setting(REQUIRED, kind="table", meaning="one table per layer with a kind ([layers.NAME]; see "
                                                      "layers.LAYER.KIND)"),
    "envelope": setting(None, kind="table", meaning="the box of plant errors every loop is certified over "
                                                    "([envelope])"),
    "certificate": setting(None, kind="table", meaning="what the certificate demands ([certificate])"),
}
_TOP = set(STACK_SCENARIO_SCHEMA)

#: the keys of a stack scenario's ``[plant]`` (a margins plant without pool sizes)
STACK_PLANT_SCHEMA = {**WORKER_SETTINGS, **SHAPE_SETTINGS}
_PLANT = set(STACK_PLANT_SCHEMA)

#: the keys of a stack scenario's ``[slo]``
STACK_SLO_SCHEMA = {
    "ttft_s": setting(2.0, unit="s", low=0.0, low_inclusive=False, meaning="time-to-first-token SLO"),
    "tpot_s": setting(0.1, unit="s", low=0.0, low_inclusive=False, meaning="time-per-output-token SLO"),
    "attainment": setting(0.99, low=0.5, high=1.0, high_inclusive=False,
                          meaning="share of requests that must meet both"),
}
#: the keys of a stack scenario's ``[workload]``
STACK_WORKLOAD_SCHEMA = {
    "rate_rps": setting(REQUIRED, unit="requests/s", low=0.0, low_inclusive=False, meaning="the nominal demand"),
}

#: the keys of a stack scenario's ``[envelope]``: a loop scenario's plus demand and start-up factors
STACK_ENVELOPE_SCHEMA = {
    **{f.name: f for f in dataclasses.fields(StabilityEnvelope)},
    "demand_factors": setting((0.5, 1.0, 1.5), kind="list of numbers",
                              meaning="multipliers (each > 0) on the nominal demand the reconfiguration loop is "
                                      "certified at"),
    "startup_factors": setting((0.75, 1.0, 1.5), kind="list of numbers",
                               meaning="multipliers (each > 0) on the workers' start-up time"),
}
_ENVELOPE = set(STACK_ENVELOPE_SCHEMA)

#: the keys of a stack scenario's ``[certificate]``
STACK_CERTIFICATE_SCHEMA = {
    "min_separation": setting(5.0, low=1.0, meaning="least ratio between neighbouring loops' crossover frequencies"),
    "max_pm_loss_deg": setting(5.0, unit="deg", low=0.0, high=90.0,
                               meaning="most phase margin an outer loop may cost an inner one"),
}
_CERT = set(STACK_CERTIFICATE_SCHEMA)


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
        Each layer's typed config (``batch_gate``, ``admission``, ``reconfiguration``, ``planning``;
        :mod:`tokenfactory.registry.stack_layers`), resolved and validated at load.
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
    layers: dict[str, StackLayerConfig]
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
        layers = dict(self.layers)  # the configs are frozen
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


def _dynamics(dyn_d: dict, plant_d: Mapping[str, Any]) -> PoolDynamics:
    """``[dynamics]`` with ``gpus_per_worker`` taken from the plant where absent: the GPUs of one
    worker (``Parallelism.num_gpus`` = pp x ep) of each pool's parallelism (``[plant]
    parallelism`` for fill, ``decode_parallelism`` for decode). Given as one number it converts
    both pools' worker-hours and must be one pool's size (a plant whose pools differ then needs the
    per-pool table for correct GPU-hours); given as ``{fill = .., decode = ..}`` (either key may be
    left to the plant) each value must be that pool's size."""
    gpus = {"fill": Parallelism(**dict(plant_d.get("parallelism", {}))).num_gpus,
            "decode": Parallelism(**dict(plant_d.get("decode_parallelism", plant_d.get("parallelism", {})))).num_gpus}
    sizes = f"a fill worker has {gpus['fill']} GPUs and a decode worker {gpus['decode']} (pp x ep of [plant])"
    given = dyn_d.get("gpus_per_worker")
    if given is None:
        return PoolDynamics.from_dict({**dyn_d, "gpus_per_worker": pool_gpus("dynamics.gpus_per_worker", gpus)},
                                      "dynamics")
    if isinstance(given, Mapping):
        reject_unknown_keys("dynamics.gpus_per_worker", given, GPU_POOLS)
        per_pool = {p: check_int(f"dynamics.gpus_per_worker.{p}", given[p], low=1) if p in given else gpus[p]
                    for p in GPU_POOLS}
        for p in GPU_POOLS:
            if per_pool[p] != gpus[p]:
                raise ConfigError(f"dynamics.gpus_per_worker.{p}", f"{per_pool[p]} contradicts the plant: {sizes}; "
                                  "leave it out to take the plant's")
        return PoolDynamics.from_dict({**dyn_d, "gpus_per_worker": pool_gpus("dynamics.gpus_per_worker", per_pool)},
                                      "dynamics")
    check_int("dynamics.gpus_per_worker", given, low=1)
    dynamics = PoolDynamics.from_dict(dyn_d, "dynamics")
    if dynamics.gpus_per_worker not in gpus.values():
        raise ConfigError("dynamics.gpus_per_worker", f"{dynamics.gpus_per_worker} contradicts the plant: {sizes}; "
                          "leave it out to take the plant's")
    return dynamics


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
    reject_unknown_keys("slo", slo, STACK_SLO_SCHEMA)
    ttft = check_number("slo.ttft_s", slo.get("ttft_s", 2.0), low=0.0, low_inclusive=False)
    tpot = check_number("slo.tpot_s", slo.get("tpot_s", 0.1), low=0.0, low_inclusive=False)
    attainment = check_number("slo.attainment", slo.get("attainment", 0.99), low=0.5, high=1.0, high_inclusive=False)
    wl = dict(d["workload"])
    reject_unknown_keys("workload", wl, STACK_WORKLOAD_SCHEMA)
    if "rate_rps" not in wl:
        raise ConfigError("workload.rate_rps", "missing")
    rate = check_number("workload.rate_rps", wl["rate_rps"], low=0.0, low_inclusive=False)
    dyn_d = dict(d.get("dynamics", {}))
    reject_unknown_keys("dynamics", dyn_d, setting_names(PoolDynamics))
    dynamics = _dynamics(dyn_d, plant_d)
    layers_d = d["layers"]
    if not isinstance(layers_d, Mapping):
        raise ConfigError("layers", "expected a table of layers")
    reject_unknown_keys("layers", layers_d, STACK_LAYERS)
    # each layer's table resolved once into its kind's typed config (the registry's schema)
    layers: dict[str, StackLayerConfig] = {}
    for lname in STACK_LAYERS:
        if lname in layers_d:
            cfg = stack_layer_config(lname, layers_d[lname])
            if cfg is not None:
                layers[lname] = cfg
    if "reconfiguration" not in layers:
        raise ConfigError("layers.reconfiguration", "a stack needs a reconfiguration layer")
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
    d = load_toml(path)
    rc = d.get("layers", {}).get("reconfiguration", {})
    if isinstance(rc, dict) and isinstance(rc.get("file"), str) and not Path(rc["file"]).is_absolute():
        rc["file"] = str(path.parent / rc["file"])   # a control plane's settings file sits beside the scenario
    return stack_scenario_from_dict(d, name=path.stem)
