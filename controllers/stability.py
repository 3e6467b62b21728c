"""Stability analysis of loops with pure delays: margins, Pade checks, stability maps.

Pure functions of a :class:`DelayedLoop` L(s) = R(s) e^{-delay s}, where R(s) is a rational
python-control system (controller x filter x plant). Margins are computed on the *exact* delay's
frequency response (no approximation) or on a Pade model of chosen order; both use the same
crossing search so the two can be compared.

* gain margin: 1 / |L(j w_180)| at the phase crossover with the smallest margin
* phase margin: 180 deg + arg L(j w_c), minimum over all gain crossovers w_c
* delay margin: min over gain crossovers of PM_i / w_c,i (extra delay that destabilises the loop)
* Ms: max over w of |1 / (1 + L(j w))| (sensitivity peak)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import control
import numpy as np
import pandas as pd
from scipy.optimize import brentq, minimize_scalar

from tokenfactory.validation import ConfigError, check_int, check_number

__all__ = [
    "DelayedLoop",
    "Margins",
    "loop_transfer",
    "stability_margins",
    "delay_margin",
    "sensitivity_peak",
    "pade_phase_error_deg",
    "pade_order_for",
    "stability_map",
]


def _siso_polys(sys) -> tuple[np.ndarray, np.ndarray]:
    tf = control.tf(sys)
    if tf.ninputs != 1 or tf.noutputs != 1:
        raise ConfigError("loop", "stability analysis needs a SISO loop")
    return np.asarray(tf.num[0][0], dtype=float), np.asarray(tf.den[0][0], dtype=float)


@dataclass(frozen=True)
class DelayedLoop:
    """Open loop L(s) = rational(s) e^{-delay s} in negative feedback."""

    rational: control.TransferFunction
    delay: float = 0.0
    name: str = ""

    def __post_init__(self) -> None:
        check_number("loop.delay", self.delay, low=0.0)
        object.__setattr__(self, "rational", control.tf(self.rational))
        object.__setattr__(self, "_polys", _siso_polys(self.rational))

    def response(self, omega) -> np.ndarray:
        """Exact L(j omega)."""
        w = np.asarray(omega, dtype=float)
        num, den = self._polys
        s = 1j * w
        return np.polyval(num, s) / np.polyval(den, s) * np.exp(-s * self.delay)

    def pade(self, order: int) -> control.TransferFunction:
        """Rational model with the delay replaced by a Pade approximation of ``order``."""
        check_int("pade_order", order, low=1, high=20)
        if self.delay == 0:
            return self.rational
        return self.rational * control.tf(*control.pade(self.delay, order))

    def with_delay(self, delay: float) -> "DelayedLoop":
        return DelayedLoop(self.rational, delay, self.name)

    def scaled(self, gain: float) -> "DelayedLoop":
        return DelayedLoop(self.rational * gain, self.delay, self.name)


def loop_transfer(controller_tf, plant_tf, delay: float = 0.0, filter_tf=None, name: str = "") -> DelayedLoop:
    """Assemble L(s) = C(s) F(s) P(s) e^{-delay s} (negative feedback on the measured output)."""
    rational = control.tf(controller_tf) * control.tf(plant_tf)
    if filter_tf is not None:
        rational = rational * control.tf(filter_tf)
    return DelayedLoop(rational, delay, name)


@dataclass(frozen=True)
class Margins:
    """Stability margins of one loop. ``gain_margin`` is a ratio (inf if the phase never crosses
    -180 deg), ``phase_margin_deg`` in degrees, ``delay_margin_s`` in seconds, ``ms`` the
    sensitivity peak. ``method`` is ``"exact"`` or ``"pade-N"``."""

    gain_margin: float
    phase_margin_deg: float
    delay_margin_s: float
    ms: float
    gain_crossovers_rad_s: tuple[float, ...]
    phase_crossovers_rad_s: tuple[float, ...]
    method: str

    @property
    def stable(self) -> bool:
        """Nyquist for loops whose open loop has no right-half-plane poles: GM > 1 and PM > 0."""
        return self.gain_margin > 1.0 and self.phase_margin_deg > 0.0

    @property
    def crossover_rad_s(self) -> float:
        return self.gain_crossovers_rad_s[0] if self.gain_crossovers_rad_s else math.nan

    def meets(self, gm_floor: float = 2.0, pm_floor_deg: float = 45.0) -> bool:
        return self.gain_margin >= gm_floor and self.phase_margin_deg >= pm_floor_deg

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stable"] = self.stable
        return d


def _grid(loop: DelayedLoop, n: int = 6000) -> np.ndarray:
    num, den = loop._polys
    roots = np.concatenate([np.roots(num), np.roots(den)])
    scales = [abs(r) for r in roots if abs(r) > 1e-12]
    if loop.delay > 0:
        scales.append(1.0 / loop.delay)
    lo = min(scales, default=1.0) * 1e-3
    hi = max(scales, default=1.0) * 1e3
    return np.logspace(np.log10(lo), np.log10(hi), n)


def _crossings(f: Callable[[np.ndarray], np.ndarray], w: np.ndarray) -> tuple[list[float], list[float]]:
    """Gain crossovers (|L| = 1) and phase crossovers (Im L = 0 with Re L < 0) of response f."""
    L = f(w)
    mag = np.abs(L)
    g = np.log(mag)
    gains = []
    for i in np.nonzero(np.sign(g[:-1]) != np.sign(g[1:]))[0]:
        gains.append(brentq(lambda x: np.log(np.abs(f(np.array([x]))[0])), w[i], w[i + 1], xtol=1e-14 * w[i]))
    phases = []
    im = L.imag
    for i in np.nonzero(np.sign(im[:-1]) != np.sign(im[1:]))[0]:
        # only crossings where the loop still has gain can set the gain margin
        if L.real[i] < 0 and L.real[i + 1] < 0 and mag[i] > 1e-3:
            x = brentq(lambda x: f(np.array([x]))[0].imag, w[i], w[i + 1], xtol=1e-14 * w[i])
            if f(np.array([x]))[0].real < 0:
                phases.append(x)
    return gains, phases


def _margins(f, w: np.ndarray, method: str) -> Margins:
    gains, phases = _crossings(f, w)
    # A pure delay makes infinitely many phase crossovers; keep those where the loop still has
    # gain (|L| > 1e-3), which are the only ones that can set the gain margin.
    phase_gain = [(x, abs(f(np.array([x]))[0])) for x in phases]
    phase_gain = sorted([(x, m) for x, m in phase_gain if m > 1e-3], key=lambda p: -p[1])[:10]
    phases = sorted(x for x, _ in phase_gain)
    gm = 1.0 / phase_gain[0][1] if phase_gain else math.inf
    pms, dms = [], []
    for wc in gains:
        pm = math.degrees(np.angle(f(np.array([wc]))[0])) + 180.0  # in (0, 360]
        pm = (pm + 180.0) % 360.0 - 180.0                               # wrap to (-180, 180]
        pms.append(pm)
        dms.append(math.radians(pm) / wc if pm > 0 else 0.0)
    pm = min(pms, default=math.inf)
    dm = min(dms, default=math.inf)
    S = 1.0 / np.abs(1.0 + f(w))
    i = int(np.argmax(S))
    lo, hi = w[max(i - 1, 0)], w[min(i + 1, len(w) - 1)]
    if hi > lo:
        res = minimize_scalar(lambda x: -1.0 / abs(1.0 + f(np.array([x]))[0]), bounds=(lo, hi),
                              method="bounded", options={"xatol": 1e-10 * lo})
        ms = max(S[i], -res.fun)
    else:
        ms = S[i]
    return Margins(float(gm), float(pm), float(dm), float(ms), tuple(map(float, gains)),
                   tuple(map(float, phases)), method)


def pade_phase_error_deg(delay: float, order: int, omega) -> np.ndarray:
    """|phase(Pade_N(j w)) - (-w delay)| in degrees (the all-pass Pade matches magnitude exactly)."""
    w = np.asarray(omega, dtype=float)
    num, den = control.pade(delay, order)
    s = 1j * w
    ph = np.unwrap(np.angle(np.polyval(num, s) / np.polyval(den, s)))
    return np.degrees(np.abs(ph + w * delay))


def pade_order_for(delay: float, omega_max: float, tol_deg: float = 1.0, max_order: int = 20) -> int:
    """Smallest Pade order whose phase stays within ``tol_deg`` of the exact delay up to ``omega_max``."""
    check_number("delay", delay, low=0.0)
    check_number("omega_max", omega_max, low=0.0, low_inclusive=False)
    if delay == 0:
        return 1
    w = np.linspace(omega_max / 400, omega_max, 400)
    for n in range(1, max_order + 1):
        if pade_phase_error_deg(delay, n, w).max() <= tol_deg:
            return n
    raise ConfigError("pade_order", f"no Pade order <= {max_order} matches a {delay} s delay within "
                      f"{tol_deg} deg up to {omega_max} rad/s; analyse with method='exact'")


def stability_margins(loop: DelayedLoop, method: str = "exact", pade_order: int | None = None,
                      pade_tol_deg: float = 1.0) -> Margins:
    """Margins of ``loop``. ``method="exact"`` uses e^{-j w delay}; ``"pade"`` a Pade model whose
    order (if not given) is the smallest that tracks the exact phase within ``pade_tol_deg`` up to
    twice the highest crossover frequency of the exact loop."""
    w = _grid(loop)
    if method == "exact":
        return _margins(loop.response, w, "exact")
    if method != "pade":
        raise ConfigError("method", f"{method!r} is not one of 'exact', 'pade'")
    if pade_order is None:
        exact = _margins(loop.response, w, "exact")
        # track the phase up to twice the frequency that sets either margin
        w_gm = [x for x in exact.phase_crossovers_rad_s
                if math.isclose(1.0 / abs(loop.response(np.array([x]))[0]), exact.gain_margin, rel_tol=1e-6)]
        w_top = max([*exact.gain_crossovers_rad_s, *w_gm], default=1.0 / max(loop.delay, 1e-9))
        pade_order = pade_order_for(loop.delay, 2.0 * w_top, pade_tol_deg) if loop.delay > 0 else 1
    num, den = _siso_polys(loop.pade(pade_order))
    f = lambda x: np.polyval(num, 1j * x) / np.polyval(den, 1j * x)  # noqa: E731
    return _margins(f, w, f"pade-{pade_order}")


def delay_margin(loop: DelayedLoop) -> float:
    """Extra pure delay (s) the loop tolerates before it loses stability (exact response)."""
    return stability_margins(loop).delay_margin_s


def sensitivity_peak(loop: DelayedLoop) -> float:
    return stability_margins(loop).ms


def stability_map(make_loop: Callable[[float, float], DelayedLoop], x_name: str, x_values: Sequence[float],
                  y_name: str, y_values: Sequence[float]) -> pd.DataFrame:
    """Margins over a grid of two parameters: one row per (x, y) with GM, PM, delay margin, Ms and
    stability. ``make_loop(x, y)`` builds the loop for each point (a generated config per point)."""
    rows = []
    for x in x_values:
        for y in y_values:
            m = stability_margins(make_loop(x, y))
            rows.append({x_name: x, y_name: y, "gain_margin": m.gain_margin,
                         "phase_margin_deg": m.phase_margin_deg, "delay_margin_s": m.delay_margin_s,
                         "ms": m.ms, "stable": m.stable, "crossover_rad_s": m.crossover_rad_s})
    return pd.DataFrame(rows)
