"""Describing-function prediction of limit cycles in loops with pure delays.

For a static nonlinearity N(A) (python-control ``DescribingFunctionNonlinearity``: relay,
relay with hysteresis, saturation, ...) in negative feedback with L(s) = R(s) e^{-delay s}, a
limit cycle of amplitude A (at the nonlinearity's input) and frequency w is predicted where
1 + N(A) L(j w) = 0 (harmonic balance; e.g. Astrom & Murray, *Feedback Systems*, 2nd ed., sec. 10.5).
``method="exact"`` solves it on the exact delay's response, ``"pade"`` on a Pade model.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy.optimize import brentq, least_squares

from tokenfactory.controllers.stability import DelayedLoop, frequency_grid, phase_crossovers, pade_order_for
from tokenfactory.core.validation import ConfigError, check_number

__all__ = ["LimitCycle", "predict_limit_cycles", "relay_integrator_delay_cycle"]


@dataclass(frozen=True)
class LimitCycle:
    """A predicted limit cycle: amplitude of the oscillation at the nonlinearity's input, its
    angular frequency and period, and which response it was solved on.

    Parameters
    ----------
    amplitude : float
        Amplitude A of the first harmonic at the nonlinearity's input, in that signal's unit (for
        an admission loop: requests of ready-buffer error).
    frequency_rad_s : float
        Angular frequency w of the oscillation (rad/s, > 0).
    method : str
        What the balance was solved on: ``"exact"`` (the exact delay), ``"pade-N"`` (an order-N
        Pade model) or ``"closed-form"`` (:func:`relay_integrator_delay_cycle`).
    """

    amplitude: float
    frequency_rad_s: float
    method: str

    @property
    def period_s(self) -> float:
        """Oscillation period 2 pi / w (s)."""
        return 2.0 * math.pi / self.frequency_rad_s

    def to_dict(self) -> dict:
        """The fields and ``period_s`` as a plain dict."""
        return {**asdict(self), "period_s": self.period_s}


def _model(loop: DelayedLoop, method: str, pade_order: int | None) -> tuple[DelayedLoop, str]:
    """The loop the balance is solved on: ``loop`` itself, or its Pade model (delay 0)."""
    if method == "exact":
        return loop, "exact"
    if method != "pade":
        raise ConfigError("method", f"{method!r} is not one of 'exact', 'pade'")
    if pade_order is None:
        # resolve the phase up to twice the first phase crossover
        w, _ = phase_crossovers(loop, 1)
        w_top = w[0] if len(w) else 1.0 / max(loop.delay, 1e-9)
        pade_order = pade_order_for(loop.delay, 2.0 * w_top) if loop.delay > 0 else 1
    return DelayedLoop(loop.pade(pade_order), 0.0, loop.name), f"pade-{pade_order}"


def predict_limit_cycles(loop: DelayedLoop, nonlinearity, *, method: str = "exact",
                         pade_order: int | None = None, amplitude_bounds=(1e-9, 1e12)) -> list[LimitCycle]:
    """Solve 1 + N(A) L(jw) = 0. Returns every solution found (possibly none), lowest frequency first.

    Seeds come from the phase crossovers of L (where a real N(A) can balance the loop); complex
    N(A) (hysteresis) is then solved for (A, w) jointly by least squares from each seed.
    A solution is kept when the residual |1 + N(A) L(jw)| is below 1e-6; the method and its
    limits are in the module docstring (harmonic balance, Astrom & Murray sec. 10.5). The
    prediction is a first-harmonic approximation: check it in simulation.

    Parameters
    ----------
    loop : DelayedLoop
        The linear part L(s) = R(s) e^{-delay s} seen by the nonlinearity, in negative feedback.
    nonlinearity : control.DescribingFunctionNonlinearity
        Any object with a ``describing_function(A)`` method returning N(A) (complex, NaN or inf
        outside its domain), e.g. ``control.relay_hysteresis_nonlinearity``.
    method : {"exact", "pade"}
        Solve on the exact delay's response (default) or on a Pade model of it.
    pade_order : int, optional
        Order of the Pade model for ``method="pade"``; ``None`` (default) picks one that resolves
        the phase up to twice the first phase crossover.
    amplitude_bounds : tuple of float
        (low, high) range of A searched (nonlinearity input units; default 1e-9 to 1e12).

    Returns
    -------
    list of LimitCycle
        Distinct solutions, lowest frequency first; empty when none is predicted.

    Raises
    ------
    ConfigError
        For a ``method`` other than ``"exact"`` or ``"pade"`` (field ``method``).
    """
    model, label = _model(loop, method, pade_order)
    f = model.response
    N = nonlinearity.describing_function
    w = frequency_grid(loop)
    seeds = []
    # the phase crossovers (the stability module's crossing search on the same response)
    w_pc, mag_pc = phase_crossovers(model, 6)
    for wc, mag in zip(w_pc, mag_pc):
        target = 1.0 / mag  # N(A) needed with a real N
        lo, hi = amplitude_bounds
        g = lambda a: abs(N(a)) - target  # noqa: E731
        grid_a = np.logspace(np.log10(lo), np.log10(hi), 400)
        vals = np.array([g(a) for a in grid_a])
        ok = np.isfinite(vals)
        for j in np.nonzero(ok[:-1] & ok[1:] & (np.sign(vals[:-1]) != np.sign(vals[1:])))[0]:
            seeds.append((brentq(g, grid_a[j], grid_a[j + 1]), wc))
    cycles = []
    # Complex N(A) (hysteresis) can balance the loop away from the phase crossovers: add seeds
    # from a coarse (A, w) scan of |1 + N(A) L(jw)|, one per local minimum along A.
    lo, hi = amplitude_bounds
    # a hysteresis relay's cycles often sit just above its width: refine the grid near the lower bound
    a_grid = np.unique(np.concatenate([np.logspace(np.log10(lo), np.log10(hi), 240),
                                       lo * (1.0 + np.logspace(-4, 0, 80))]))
    a_grid = a_grid[a_grid <= hi]
    w_scan = w[:: max(1, len(w) // 1500)]
    L_scan = f(w_scan)
    best_res, best_w = [], []
    for a in a_grid:
        n_a = N(a)
        if not np.isfinite(n_a):
            best_res.append(np.inf)
            best_w.append(np.nan)
            continue
        res = np.abs(1.0 + n_a * L_scan)
        k = int(np.argmin(res))
        best_res.append(res[k])
        best_w.append(w_scan[k])
    best_res = np.asarray(best_res)
    for i in range(1, len(a_grid) - 1):
        if best_res[i] <= best_res[i - 1] and best_res[i] <= best_res[i + 1] and best_res[i] < 0.5:
            seeds.append((a_grid[i], best_w[i]))
    for a0, w0 in seeds:
        def residual(z):
            a, ww = math.exp(z[0]), math.exp(z[1])
            r = 1.0 + N(a) * f(np.array([ww]))[0]
            # outside N's domain (e.g. A below a hysteresis width) steer the solver back
            return [r.real, r.imag] if np.isfinite(r) else [1e6, 1e6]

        sol = least_squares(residual, [math.log(a0), math.log(w0)], xtol=1e-14, ftol=1e-14, gtol=1e-14)
        if np.all(np.isfinite(sol.fun)) and np.hypot(*sol.fun) < 1e-6:
            a, ww = math.exp(sol.x[0]), math.exp(sol.x[1])
            if not any(math.isclose(ww, c.frequency_rad_s, rel_tol=1e-4) and
                       math.isclose(a, c.amplitude, rel_tol=1e-4) for c in cycles):
                cycles.append(LimitCycle(a, ww, label))
    return sorted(cycles, key=lambda c: c.frequency_rad_s)


def relay_integrator_delay_cycle(relay_amplitude: float, gain: float, delay: float) -> LimitCycle:
    """Closed form for an ideal relay (+/- d) around k e^{-L s}/s: w = pi / (2L), A = 8 d k L / pi^2.

    (The exact triangle-wave solution has the same period 4L and amplitude d k L; the describing
    function underestimates the amplitude by 1 - 8/pi^2 = 19 %.)

    This is the naive admission loop of article section 18 in closed form: a relay on admission
    around the ready buffer's integrator and the loop delay.

    Parameters
    ----------
    relay_amplitude : float
        Half the relay's output swing d (> 0; for admission requests/s).
    gain : float
        The integrator's gain k (> 0; for the ready buffer 1, requests per request admitted).
    delay : float
        Loop delay L (s, > 0).

    Returns
    -------
    LimitCycle
        Amplitude 8 d k L / pi^2 (output units of the integrator, e.g. requests), frequency
        pi / (2L) rad/s (period 4L), method ``"closed-form"``.

    Raises
    ------
    ConfigError
        For a non-positive relay amplitude, gain or delay.
    """
    for field, v in (("relay_amplitude", relay_amplitude), ("gain", gain), ("delay", delay)):
        check_number(field, v, low=0.0, low_inclusive=False)
    w = math.pi / (2.0 * delay)
    return LimitCycle(4.0 * relay_amplitude * gain / (math.pi * w), w, "closed-form")
