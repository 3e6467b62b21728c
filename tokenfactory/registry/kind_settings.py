"""The parameters of every registered admission and autoscaler kind, with their type, unit, range,
default and meaning (what ``tokenfactory describe schema kinds`` prints), collected from the kinds'
own ``settings`` (:class:`~tokenfactory.registry.kinds.ControllerKind`).

Each kind declares its settings once, beside its builder (:mod:`tokenfactory.registry.admission_kinds`,
:mod:`~tokenfactory.registry.autoscaler_kinds`); the builder reads its defaults from them
(:func:`~tokenfactory.registry.kinds.with_defaults`; a default of ``None``: derived from the plant,
as the meaning says), its accepted keys are their keys, and :func:`tokenfactory.registry.build_admission` /
:func:`~tokenfactory.registry.build_autoscalers` check values against them. ``tests/test_reference.py``
reads the accepted keys off the builder's own rejection of an unknown key and checks the defaults
against the built controllers.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tokenfactory.controllers.slo_admission import MarginLoopConfig
from tokenfactory.core.validation import config_schema
from tokenfactory.registry import admission_kinds, autoscaler_kinds  # noqa: F401  (register the kinds)
from tokenfactory.registry.kinds import ADMISSION_KINDS, AUTOSCALER_KINDS

__all__ = ["KIND_SETTINGS", "OUTER_LOOP_SCHEMA", "kind_schema"]

#: the keys of the ``slo-aware`` kind's ``outer`` table (the loop on outcomes)
OUTER_LOOP_SCHEMA = {f.name: f for f in dataclasses.fields(MarginLoopConfig)}

#: layer -> kind -> {key: setting}, in registration order; a kind without parameters has an empty table
#: (derived from the registered kinds' own ``settings``: declared once, beside each builder)
KIND_SETTINGS: dict[str, dict[str, dict[str, Any]]] = {
    "admission": {name: dict(k.settings) for name, k in ADMISSION_KINDS.items()},
    "reconfiguration": {name: dict(k.settings) for name, k in AUTOSCALER_KINDS.items()},
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
