"""Step and disturbance response figures of merit, from a sampled response (as python-control's
``step_info``, but for a response that starts at ``t0`` from a non-zero level)."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["step_metrics", "disturbance_metrics"]


def _settle(t: np.ndarray, y: np.ndarray, target: float, band: float, t_from: float) -> float:
    """Time after ``t_from`` when y last leaves target +/- band (0 if it never leaves; nan if it
    has not settled by the end)."""
    after = t >= t_from
    outside = np.abs(y[after] - target) > band
    if not outside.any():
        return 0.0
    last = np.nonzero(outside)[0][-1]
    if last == outside.size - 1:
        return math.nan
    return float(t[after][last + 1] - t_from)


def step_metrics(t, y, *, t0: float, initial: float, final: float, band: float = 0.05) -> dict:
    """Overshoot (% of the step), 10-90 % rise time and settling time into final +/- band x |step|.

    Parameters
    ----------
    t : array_like
        Sample times (s), increasing.
    y : array_like
        The response at ``t``.
    t0 : float
        When the step is applied (s); only samples at or after it are assessed.
    initial : float
        The level before the step (the response's units).
    final : float
        The level the response should settle at.
    band : float
        Settling band as a fraction of |final - initial| (default 0.05, i.e. +/- 5 %); for a
        zero step, an absolute band.

    Returns
    -------
    dict
        ``overshoot_pct`` (% of the step beyond ``final``; 0 for a zero step), ``rise_time_s``
        (10 % to 90 % of the step; nan if 90 % is never reached), ``peak`` (the extreme in the
        step's direction) and ``settling_time_s`` (s after ``t0`` when y last enters the band
        for good; 0 if it never leaves, nan if it has not settled by the end).
    """
    t, y = np.asarray(t, float), np.asarray(y, float)
    step = final - initial
    after = t >= t0
    ya, ta = y[after], t[after]
    sgn = 1.0 if step >= 0 else -1.0
    peak = float(ya.max() if sgn > 0 else ya.min())
    overshoot = max(0.0, sgn * (peak - final)) / abs(step) * 100.0 if step else 0.0
    rise = math.nan
    if step:
        prog = sgn * (ya - initial) / abs(step)
        i10, i90 = np.argmax(prog >= 0.1), np.argmax(prog >= 0.9)
        if prog[i90] >= 0.9 and prog[i10] >= 0.1:
            rise = float(ta[i90] - ta[i10])
    return {"overshoot_pct": overshoot, "rise_time_s": rise, "peak": peak,
            "settling_time_s": _settle(t, y, final, band * abs(step) if step else band, t0)}


def disturbance_metrics(t, y, *, t_start: float, t_end: float, target: float, band: float) -> dict:
    """Peak deviation from ``target`` after a disturbance starting at ``t_start``, and the time
    after the disturbance ends (``t_end``) to settle back into target +/- band.

    Parameters
    ----------
    t : array_like
        Sample times (s), increasing.
    y : array_like
        The response at ``t``.
    t_start : float
        When the disturbance starts (s).
    t_end : float
        When it ends (s); settling is measured from here.
    target : float
        The level the loop regulates to (the response's units).
    band : float
        Settling band, absolute (the response's units).

    Returns
    -------
    dict
        ``peak_deviation`` (signed, y - target, largest in magnitude after ``t_start``),
        ``peak_time_s`` (s after ``t_start``) and ``settling_time_s`` (s after ``t_end``; 0 if y
        never leaves the band after it, nan if it has not settled by the end).
    """
    t, y = np.asarray(t, float), np.asarray(y, float)
    after = t >= t_start
    dev = y[after] - target
    i = int(np.argmax(np.abs(dev)))
    return {"peak_deviation": float(dev[i]), "peak_time_s": float(t[after][i] - t_start),
            "settling_time_s": _settle(t, y, target, band, t_end)}
