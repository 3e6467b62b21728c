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

from tokenfactory.controllers.stability import DelayedLoop, _grid, _siso_polys, pade_order_for
from tokenfactory.validation import ConfigError

__all__ = ["LimitCycle", "predict_limit_cycles", "relay_integrator_delay_cycle"]


@dataclass(frozen=True)
class LimitCycle:
    """A predicted limit cycle: amplitude of the oscillation at the nonlinearity's input, its
    angular frequency and period, and which response it was solved on."""

    amplitude: float
    frequency_rad_s: float
    method: str

    @property
    def period_s(self) -> float:
        return 2.0 * math.pi / self.frequency_rad_s

    def to_dict(self) -> dict:
        return {**asdict(self), "period_s": self.period_s}


def _response(loop: DelayedLoop, method: str, pade_order: int | None):
    if method == "exact":
        return loop.response, "exact"
    if method != "pade":
        raise ConfigError("method", f"{method!r} is not one of 'exact', 'pade'")
    if pade_order is None:
        # resolve the phase up to a few times the first phase crossover
        w = _grid(loop)
        L = loop.response(w)
        idx = np.nonzero((np.sign(L.imag[:-1]) != np.sign(L.imag[1:])) & (L.real[:-1] < 0))[0]
        w_top = w[idx[0]] if len(idx) else 1.0 / max(loop.delay, 1e-9)
        pade_order = pade_order_for(loop.delay, 2.0 * w_top) if loop.delay > 0 else 1
    num, den = _siso_polys(loop.pade(pade_order))
    return (lambda x: np.polyval(num, 1j * np.asarray(x)) / np.polyval(den, 1j * np.asarray(x))), f"pade-{pade_order}"


def predict_limit_cycles(loop: DelayedLoop, nonlinearity, *, method: str = "exact",
                         pade_order: int | None = None, amplitude_bounds=(1e-9, 1e12)) -> list[LimitCycle]:
    """Solve 1 + N(A) L(jw) = 0. Returns every solution found (possibly none), lowest frequency first.

    Seeds come from the phase crossovers of L (where a real N(A) can balance the loop); complex
    N(A) (hysteresis) is then solved for (A, w) jointly by least squares from each seed.
    """
    f, label = _response(loop, method, pade_order)
    N = nonlinearity.describing_function
    w = _grid(loop)
    L = f(w)
    seeds = []
    idx = np.nonzero((np.sign(L.imag[:-1]) != np.sign(L.imag[1:])) & (L.real[:-1] < 0))[0]
    for i in idx[:6]:
        wc = brentq(lambda x: f(np.array([x]))[0].imag, w[i], w[i + 1])
        target = 1.0 / abs(f(np.array([wc]))[0])  # N(A) needed with a real N
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
    function underestimates the amplitude by 1 - 8/pi^2 = 19 %.)"""
    w = math.pi / (2.0 * delay)
    return LimitCycle(4.0 * relay_amplitude * gain / (math.pi * w), w, "closed-form")
