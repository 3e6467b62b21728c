"""Building a stack: each layer's controller from the scenario (its kind's builder, looked up in the
registry: :mod:`tokenfactory.stack.layer_builders`), composed into a
:class:`tokenfactory.controllers.control_stack.ControlStack` for a plant."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from tokenfactory.controllers.control_stack import ControlStack
from tokenfactory.registry.stack_layers import STACK_LAYERS
from tokenfactory.stack.layer_builders import LayerBuild
from tokenfactory.stack.plant import StackPlant, stack_plant
from tokenfactory.stack.stack_scenario import StackScenario

__all__ = ["build_stack"]


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
    b = LayerBuild(sc, plant, history=history, time_offset_s=time_offset_s, fleet_size=fleet_size,
                   plant_step_s=plant_step_s, service=service, class_outputs=class_outputs)
    # slowest first: a layer's builder sees what the layers above it built (the pools take the planner)
    for layer in reversed(STACK_LAYERS):
        cfg = sc.layers.get(layer)
        if cfg is not None:
            b.built[layer] = cfg.build(b)
    return ControlStack([b.built[la] for la in STACK_LAYERS if la in b.built], name or sc.name), plant
