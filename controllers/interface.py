"""The controller interface every tokenfactory controller implements.

A controller is an object with a ``sample_period`` (seconds), ``reset()`` and
``update(t, measurement) -> action``. The plant (fluid model or request-level simulator) samples it
every ``sample_period`` with a :class:`tokenfactory.core.signals.Measurement` that is already as old as
the plant's measurement delay, and holds the returned action until the next sample. Linear
controllers also give their transfer function, so the same object is analysed in the frequency
domain (``tokenfactory.controllers.stability``) and run in simulation.
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

import control

from tokenfactory.core.signals import AdmissionAction, Measurement
from tokenfactory.core.validation import check_number

__all__ = ["Controller", "LinearController", "SampledController", "lowpass"]


@runtime_checkable
class Controller(Protocol):
    """What a plant needs of a controller (structural: any object with these members).

    Attributes
    ----------
    sample_period : float
        Seconds between samples; the plant holds each action for this long.
    """

    sample_period: float

    def reset(self) -> None: ...

    def update(self, t: float, measurement: Measurement) -> AdmissionAction: ...


@runtime_checkable
class LinearController(Controller, Protocol):
    """A controller with a linear small-signal model, so its loop can be analysed."""

    def transfer_function(self) -> control.TransferFunction:
        """C(s) from control error to actuation, in the units of the loop."""
        ...


class SampledController:
    """Base class: validates the sample period and gives a readable ``repr``.

    Subclasses keep all their state in attributes that ``reset()`` restores, so one object can be
    run many times (every simulation starts with ``reset()``).

    Parameters
    ----------
    sample_period : float
        Seconds between the plant's calls to ``update`` (> 0); the action is held in between.

    Raises
    ------
    ConfigError
        For a non-positive or non-finite ``sample_period`` (field ``<name>.sample_period``).
    """

    name = "controller"

    def __init__(self, sample_period: float):
        self.sample_period = check_number(f"{self.name}.sample_period", sample_period, low=0.0,
                                          low_inclusive=False)

    def reset(self) -> None:  # stateless by default
        """Restore the initial state (called at the start of every simulation)."""

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({fields})"

    def params(self) -> dict:
        """The configuration of this controller (what results record).

        Returns
        -------
        dict
            Parameter name -> value; subclasses extend it with their own settings.
        """
        return {"sample_period": self.sample_period}


def lowpass(prev: float | None, x: float, tau: float, dt: float) -> float:
    """One step of the first-order measurement filter the controllers share: the exact
    discretisation prev + (1 - e^{-dt/tau}) (x - prev) of tau dy/dt = x - y over ``dt``.

    Parameters
    ----------
    prev : float or None
        The filtered value so far (None before the first sample: the filter starts at ``x``).
    x : float
        The new sample.
    tau : float
        Time constant (s); <= 0 passes ``x`` through.
    dt : float
        Time since the previous sample (s).

    Returns
    -------
    float
        The filtered value.
    """
    if prev is None or tau <= 0:
        return x
    return prev + (1.0 - math.exp(-dt / tau)) * (x - prev)
