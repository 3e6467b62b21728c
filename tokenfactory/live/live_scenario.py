"""Live scenarios: a request-simulator scenario plus what the wire needs, resolved once.

A live scenario is a replay scenario (:func:`tokenfactory.replay.replay_scenario_from_dict`:
``[plant]``, ``[cluster]``, ``[classes]``, ``[controller]``, ``[envelope]``) with a ``[live]``
section, so the emulator, the gateway and the request simulator read the same file:

.. code-block:: toml

    [plant]
    model = "deepseek-v3"
    hardware = "h200"
    fill_workers = 1
    decode_workers = 1
    measurement_delay_s = 0.5     # the emulator publishes its /metrics this late

    [cluster]
    slo_ttft_s = 2.0
    slo_tpot_s = 0.1

    [controller]
    kind = "slo-aware"            # what the gateway runs (any admission kind of the registry)

    [live]
    prompt_tokens = 1000          # the nominal request the service model's tables are exact at
    output_tokens = 100           # and the output length when a request gives no max_tokens
    model_name = "tokenfactory-emulator"
    scrape_interval_s = 0.05      # the gateway's scrape of the upstream /metrics
    capacity = 200000             # request slots of the emulator

:func:`live_scenario_from_dict` validates every field up front (unknown keys are errors).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from tokenfactory.plant_models.des import ClusterConfig
from tokenfactory.registry import PlantContext, build_admission
from tokenfactory.replay import ReplayScenario, ReplaySetup, build_replay, class_outputs, replay_scenario_from_dict
from tokenfactory.core.validation import ConfigError, check_settings, load_toml, setting

__all__ = ["LiveScenario", "live_scenario_from_dict", "load_live_scenario", "LIVE_DEFAULTS", "LIVE_SCHEMA", "CLASS_HEADER",
           "saturated_rate", "decode_batch"]

#: the keys of the ``[live]`` section
LIVE_SCHEMA = {
    "prompt_tokens": setting(1000, kind=int, low=1, unit="tokens",
                             meaning="the nominal request's prompt, where the service model's tables are exact"),
    "output_tokens": setting(100, kind=int, low=1, unit="tokens",
                             meaning="the nominal output, and a request's output when it gives no max_tokens"),
    "model_name": setting("tokenfactory-emulator", kind=str, meaning="the model name the emulator serves (non-empty)"),
    "scrape_interval_s": setting(0.05, unit="s", low=0.001, high=60.0,
                                 meaning="the gateway's scrape period of the upstream /metrics"),
    "capacity": setting(200_000, kind=int, low=1, unit="requests", meaning="request slots of the emulator"),
    "metrics_delay_s": setting(None, unit="s", low=0.0, high=60.0,
                               meaning="how late the emulator publishes its /metrics (absent: the plant's "
                                       "measurement delay)"),
    "tick_s": setting(0.002, unit="s", low=0.0005, high=0.1, meaning="the emulator's clock tick"),
}
#: defaults of the ``[live]`` section
LIVE_DEFAULTS: dict[str, Any] = {k: f.default for k, f in LIVE_SCHEMA.items()}
#: the request header that carries a request's class (gateway and emulator)
CLASS_HEADER = "x-request-class"


@dataclasses.dataclass
class LiveScenario:
    """A resolved live scenario.

    Parameters
    ----------
    name : str
        The scenario's name.
    replay : ReplayScenario
        The simulator part (plant overrides, cluster fields, controller kind and parameters).
    live : dict
        The ``[live]`` section with defaults filled in (:data:`LIVE_DEFAULTS`).
    setup : ReplaySetup
        Service model, request-simulator parameters and fluid plant at the nominal request.
    cluster : ClusterConfig
        The cluster the emulator runs (pool sizes and measurement delay from ``[plant]``).
    config : dict
        The parsed TOML.
    """

    name: str
    replay: ReplayScenario
    live: dict
    setup: ReplaySetup
    cluster: ClusterConfig
    config: dict

    @property
    def metrics_delay_s(self) -> float:
        """How late the emulator publishes its metrics (s): ``live.metrics_delay_s``, else the
        plant's measurement delay."""
        d = self.live["metrics_delay_s"]
        return float(self.cluster.measurement_delay_s if d is None else d)

    def nominal_trace(self, n: int = 1) -> pd.DataFrame:
        """``n`` requests of the nominal shape (what the service model is sampled at)."""
        return pd.DataFrame({"arrival_s": [0.0] * n, "input_tokens": [int(self.live["prompt_tokens"])] * n,
                             "output_tokens": [int(self.live["output_tokens"])] * n})

    def context(self, trace: pd.DataFrame | None = None, **kw: Any) -> PlantContext:
        """The :class:`PlantContext` the gateway's controllers are built for (the scenario's SLOs,
        classes and worker dynamics; output tokens per class from ``trace`` when given).

        Parameters
        ----------
        trace : DataFrame, optional
            Requests like the ones expected (default the nominal request).
        **kw
            Further :class:`PlantContext` fields.
        """
        cl = self.cluster
        tr = trace if trace is not None else self.nominal_trace(2)
        kw.setdefault("class_outputs", class_outputs(tr))
        return self.setup.context(cl.slo_ttft_s, cl.slo_tpot_s, dynamics=cl.dynamics, classes=cl.classes,
                                  snapshot_dt=cl.snapshot_dt, **kw)

    def build_admission(self, trace: pd.DataFrame | None = None, **kw: Any):
        """The scenario's admission controller, built through the registry (None for ``open`` or
        no ``[controller]``)."""
        kind = self.replay.admission or "open"
        return build_admission(kind, self.context(trace, **kw), self.replay.admission_params,
                               where="controller")

    def capacity_rps(self) -> tuple[float, str, float]:
        """Bottleneck capacity at the TPOT SLO at the nominal request: ``(rps, pool, batch cap)``
        (:meth:`ReplaySetup.slo_capacity`)."""
        return self.setup.slo_capacity(self.cluster.slo_tpot_s)


def live_scenario_from_dict(d: Mapping[str, Any], name: str = "live") -> LiveScenario:
    """Validate and resolve a live scenario (module notes).

    Parameters
    ----------
    d : mapping
        The parsed TOML.
    name : str
        Name when the file has none.

    Returns
    -------
    LiveScenario

    Raises
    ------
    ConfigError
        Naming the first bad or unknown field.
    """
    d = dict(d)
    live = dict(d.pop("live", {}))
    if not isinstance(live, dict):
        raise ConfigError("live", "expected a table")
    live = {**LIVE_DEFAULTS, **check_settings("live", live, LIVE_SCHEMA)}  # types and ranges: the schema's
    if not isinstance(live["model_name"], str) or not live["model_name"]:
        raise ConfigError("live.model_name", "expected a non-empty string")
    rs = replay_scenario_from_dict(d, name=name)
    sc_name = str(d.get("name", name))
    shape = pd.DataFrame({"arrival_s": [0.0, 0.0], "input_tokens": [live["prompt_tokens"]] * 2,
                          "output_tokens": [live["output_tokens"]] * 2})
    setup = build_replay(shape, rs.plant)
    base = {"fill_workers": int(setup.plant.fill_workers), "decode_workers": int(setup.plant.decode_workers),
            "measurement_delay_s": setup.plant.params.measurement_delay_s, **rs.cluster}
    cluster = ClusterConfig.from_dict(base)
    return LiveScenario(sc_name, rs, live, setup, cluster, {**d, "live": live})


def load_live_scenario(path: str | Path) -> LiveScenario:
    """:func:`live_scenario_from_dict` of a TOML file (a path, or a shipped scenario's name under
    ``tokenfactory/scenarios``).

    Parameters
    ----------
    path : str or Path
        The file.
    """
    from tokenfactory.scenario import scenario_dir

    p = Path(path)
    if not p.is_file() and (scenario_dir() / f"{p.name}.toml").is_file():
        p = scenario_dir() / f"{p.name}.toml"
    return live_scenario_from_dict(load_toml(p), name=p.stem)


def decode_batch(sc: LiveScenario) -> float:
    """Sequences a decode worker batches when saturated: KV slots at the nominal request's mean
    context (prompt + half the output), under the cluster's batch cap.

    Parameters
    ----------
    sc : LiveScenario
        The scenario.

    Returns
    -------
    float
    """
    p = sc.setup.params
    ctx = sc.live["prompt_tokens"] + sc.live["output_tokens"] / 2.0
    return float(min(p.slots(ctx), sc.cluster.batch_cap or math.inf, p.decode_max_batch))


def saturated_rate(sc: LiveScenario) -> float:
    """Completions/s of one saturated decode worker at the nominal request: B / (T(B, c) (n - 1)),
    B = :func:`decode_batch`, T the pass time at the mean context c, n - 1 the tokens decode
    generates after the prefill's first one (requests/s).

    Parameters
    ----------
    sc : LiveScenario
        The scenario.

    Returns
    -------
    float
    """
    p = sc.setup.params
    B = decode_batch(sc)
    ctx = sc.live["prompt_tokens"] + sc.live["output_tokens"] / 2.0
    return float(B / (p.decode_pass(int(B), ctx)[0] * max(sc.live["output_tokens"] - 1, 1)))
