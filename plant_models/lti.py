"""A linear plant with an input delay, simulated exactly in the time domain.

Used for textbook checks of the analysis (SIMC margins, describing-function limit cycles) and for
confirming stability maps by simulation: the rational part is discretised with a zero-order hold
(python-control ``c2d``), the delay is a :class:`DelayLine` on the same grid.
"""

from __future__ import annotations

from collections.abc import Callable

import control
import numpy as np

from tokenfactory.plant_models.delay import DelayLine

__all__ = ["simulate_delayed_feedback"]


def simulate_delayed_feedback(plant, delay: float, law: Callable[[float, float], float], *,
                              t_end: float, dt: float, reference: float = 0.0,
                              disturbance: Callable[[float], float] | None = None):
    """Simulate y = P(s) e^{-delay s} u with u = law(t, e), e = reference - y.

    ``law`` may keep state (a relay with hysteresis, a PI). ``disturbance(t)`` adds to the plant
    input. Returns (t, y, u) arrays on the grid of ``dt``.

    The state starts at zero; the delayed input is zero before t = 0.

    Parameters
    ----------
    plant : control.TransferFunction or control.StateSpace
        The rational part P(s), single-input single-output, continuous time.
    delay : float
        Input delay (s, >= 0), applied exactly on the grid (a multiple of ``dt`` is exact;
        otherwise linear interpolation).
    law : callable
        ``law(t, e) -> u``: the controller, called once per step with the time (s) and the
        error e = reference - y.
    t_end : float
        End of the simulation (s); the grid is 0, dt, ..., round(t_end / dt) x dt.
    dt : float
        Step (s, > 0); P(s) is discretised with a zero-order hold at this step.
    reference : float
        Constant reference (default 0), in the output's units.
    disturbance : callable, optional
        ``disturbance(t)``, added to the controller output before the delay (an input
        disturbance). Default None.

    Returns
    -------
    t : ndarray
        The time grid (s).
    y : ndarray
        Plant output at each step.
    u : ndarray
        Controller output at each step (without the disturbance).
    """
    ss = control.ss(plant)
    d = control.c2d(ss, dt, method="zoh")
    A, B, C, D = (np.asarray(m, dtype=float) for m in (d.A, d.B, d.C, d.D))
    n = int(round(t_end / dt)) + 1
    x = np.zeros(A.shape[0])
    line = DelayLine(dt, delay + dt)
    t = np.arange(n) * dt
    y = np.empty(n)
    u = np.empty(n)
    for k in range(n):
        yk = float((C @ x)[0]) + float(D[0, 0]) * (line.read(max(delay - dt, 0.0)) if k else 0.0)
        y[k] = yk
        u[k] = law(t[k], reference - yk)
        uk = u[k] + (disturbance(t[k]) if disturbance else 0.0)
        line.push(uk)
        ud = line.read(delay) if delay > 0 else uk
        x = A @ x + B[:, 0] * ud
    return t, y, u
