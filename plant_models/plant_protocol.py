"""One call shape for the three plants: ``plant.run(workload, controllers) -> SimulationResult``.

The plants keep their own functions (:func:`~tokenfactory.plant_models.fluid.simulate_loop`,
:func:`~tokenfactory.plant_models.pools.simulate_pools`,
:func:`~tokenfactory.plant_models.des.simulator.simulate`); a :class:`Plant` holds what a run does
not change (the plant's rates and pools, the cluster), and ``run`` takes what it does: the workload
(a :class:`~tokenfactory.plant_models.fluid.LoopScenario`, a
:class:`~tokenfactory.plant_models.pools.PoolScenario`, a request table) and the controllers. A
control stack (anything with ``split()``, :class:`tokenfactory.controllers.control_stack.ControlStack`)
runs on every plant as one controller; the request simulator samples its admission view per
request and its slower layers as autoscalers (``split()``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import pandas as pd

from tokenfactory.core.errors import ConfigError
from tokenfactory.plant_models.des.config import ClusterConfig
from tokenfactory.plant_models.des.params import DESParams
from tokenfactory.plant_models.des.simulator import simulate
from tokenfactory.plant_models.fleet import PoolDynamics
from tokenfactory.plant_models.fluid import FluidParams, FluidPlant, LoopScenario, simulate_loop
from tokenfactory.plant_models.pools import PoolScenario, simulate_pools
from tokenfactory.plant_models.result import SimulationResult

__all__ = ["Plant", "FluidLoopPlant", "PoolPlant", "RequestPlant"]


@runtime_checkable
class Plant(Protocol):
    """A plant a workload runs on under controllers."""

    def run(self, workload: Any, controllers: Sequence = ()) -> SimulationResult:
        """Run ``workload`` under ``controllers`` (each sampled at its own period, reset first)."""
        ...


@dataclass(frozen=True)
class FluidLoopPlant:
    """The admission loop's fluid plant (fixed pools; :func:`simulate_loop`).

    Parameters
    ----------
    plant : FluidPlant
        The plant and its pools.
    """

    plant: FluidPlant

    def run(self, workload: LoopScenario, controllers: Sequence = (), *,
            x0: Sequence[float] | None = None) -> SimulationResult:
        """The loop under ``controllers`` (admission and batch gates) for ``workload``.

        Parameters
        ----------
        workload : LoopScenario
            Demand, duration, step, noise and disturbances.
        controllers : sequence
            Sampled controllers (at least one).
        x0 : sequence of float, optional
            Initial state, one value per :data:`~tokenfactory.plant_models.fluid.STATES` entry
            (``None``: the plant's empty start, :func:`simulate_loop`'s default).

        Returns
        -------
        SimulationResult
        """
        if not controllers:
            raise ConfigError("controllers", "the fluid loop needs a controller (an open loop: a constant admission)")
        return simulate_loop(self.plant, list(controllers), workload, x0=x0)


@dataclass(frozen=True)
class PoolPlant:
    """The pool-level fluid model (workers start, warm up and drain; :func:`simulate_pools`).

    Parameters
    ----------
    params : FluidParams
        One worker's rates and delays.
    fill_workers, decode_workers : int
        The pools at the start.
    dynamics : PoolDynamics
        Start-up, warm-up, drain, fleet.
    """

    params: FluidParams
    fill_workers: int
    decode_workers: int
    dynamics: PoolDynamics = field(default_factory=PoolDynamics)

    def run(self, workload: PoolScenario, controllers: Sequence = ()) -> SimulationResult:
        """The pools under ``controllers`` (admission, autoscalers, batch gates, stacks) for ``workload``.

        Parameters
        ----------
        workload : PoolScenario
            Demand series, duration, step, seed, SLO.
        controllers : sequence
            Sampled controllers (none: every arrival admitted, the pools fixed).

        Returns
        -------
        SimulationResult
        """
        return simulate_pools(self.params, self.fill_workers, self.decode_workers, workload,
                              controllers=list(controllers), dynamics=self.dynamics)


@dataclass(frozen=True)
class RequestPlant:
    """The request simulator (:func:`simulate`).

    Parameters
    ----------
    params : DESParams
        Service times.
    cluster : ClusterConfig
        Pools, delays, SLOs, events, run control.
    prefix_cache : PrefixCache, optional
        A prefix-cache policy replacing the one the cluster names.
    """

    params: DESParams
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    prefix_cache: Any = None

    def run(self, workload: pd.DataFrame, controllers: Sequence = (), *, admission: Any = None) -> SimulationResult:
        """Replay ``workload`` under ``controllers``.

        Parameters
        ----------
        workload : DataFrame
            The request table.
        controllers : sequence
            Control stacks (each split into its admission view, sampled per request, and its
            slower layers, sampled as autoscalers) and pool autoscalers; at most one admission
            (a bare admission controller runs as a stack's admission layer, or as ``admission``).
        admission : controller, optional
            A bare admission controller, sampled per request (``None``: open admission unless a
            stack brings one).

        Returns
        -------
        SimulationResult
        """
        admissions, scalers = ([admission] if admission is not None else []), []
        for c in controllers:
            if hasattr(c, "split"):
                adm, scale = c.split()
                admissions += [adm] if adm is not None else []
                scalers += scale
            else:
                scalers.append(c)
        if len(admissions) > 1:
            raise ConfigError("controllers", f"{len(admissions)} admission layers; the request simulator samples one")
        return simulate(workload, self.params, self.cluster, admissions[0] if admissions else None, scalers,
                        prefix_cache=self.prefix_cache)
