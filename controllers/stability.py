"""Stability of loops with pure delays: a Nyquist verdict, two-sided gain margins, per-crossing
phase and delay margins, the sensitivity peak, Pade checks and stability maps.

Pure functions of a :class:`DelayedLoop` L(s) = R(s) e^{-delay s} in negative feedback, R(s) a
rational python-control system (controller x filter x plant). ``method="exact"`` works on the
exact delay, e^{-j w delay}, with no approximation; ``method="pade"`` on a rational Pade model of
chosen order, through the same code, so the two can be compared.

Definitions
-----------
* **Verdict** (Nyquist criterion; Astrom & Murray, *Feedback Systems*, 2nd ed., sec. 10.3).
  P = open-loop poles with Re s > 0; poles on the imaginary axis (integrators, undamped modes)
  are passed on small semicircles to their right, so they are not counted. N = clockwise
  encirclements of -1 by L(s) as s runs up the indented imaginary axis and back through the
  right half-plane. Z = N + P is the number of closed-loop poles in the right half-plane, and
  the loop is stable iff Z = 0 and L(j w) does not pass through -1 (a closed-loop pole on the
  axis; then ``ms`` is inf). N is the winding number of 1 + L on the exact response. The grid is
  built from the poles, zeros and delay: every factor's phase moves by at most pi/32 between
  points, the delay's by pi/8 wherever |L| >= (1 + |L(j inf)|)/2, and elsewhere 1 + L stays in
  the right half-plane, so no turn can be missed; it is then refined until each step turns
  1 + L by less than 45 deg and moves L by less than half its distance to -1 (the refinement
  near -1). The contour is closed at a radius where a bound on |R(s)| keeps 1 + L off 0 in the
  whole right half-plane, and each indentation is shrunk until |L| > 2 on it (Rouche: no
  closed-loop pole hides inside). The count is independent of any margin; margins are read
  off it.
* **Gain margins** (two-sided). The verdict of the loop k L(s) can only change at gains
  k = 1 / |L(j w_p)| where L crosses the negative real axis (phase crossovers, including
  w = 0 and w = inf); each crossing moves Z by +/-2 (+/-1 at w = 0 or inf) with the direction
  of the crossing. Walking from k = 1, ``gain_margin`` is the factor by which the gain can grow
  before the verdict changes (inf if it never does) and ``lower_gain_margin`` the factor (< 1)
  by which it can shrink (0 if never). For a stable loop they bound its stable gain range; for
  a conditionally stable loop ``lower_gain_margin`` > 0; for an unstable loop they are the
  gains that would change the verdict, so read them together with ``stable``.
* **Phase margin**, per gain crossover w_i (|L(j w_i)| = 1): PM_i in (-180, 180] deg, the
  rotation of L(j w_i) that puts it on -1, signed like python-control's. ``phase_margin_deg``
  is the PM_i of smallest magnitude, signed (python-control's choice; inf without crossovers).
  A stable loop can have negative PM_i (a crossing above the real axis): the sign is not a
  verdict; ``Margins.meets`` uses |PM|.
* **Delay margin**, per gain crossover: DM_i = (phase distance from arg L(j w_i) down to
  -180 deg, in (0, 360] deg, in radians) / w_i, the extra delay that first puts the curve
  through -1 at w_i. ``delay_margin_s`` = min DM_i of a stable loop (inf without crossovers,
  0 if the loop is unstable or |L(j inf)| >= 1, where any delay destabilises it).
* **Sensitivity peak** Ms = sup over w >= 0 of |1 / (1 + L(j w))|, including the limits
  w -> 0 and w -> inf (where |S| -> 1 for a strictly proper loop); ``ms_frequency_rad_s`` is
  where it is attained (0 or inf at a limit).

Loops rejected with a ``ConfigError``: improper L; |L(j inf)| >= 1 with a delay (a neutral loop
with infinitely many closed-loop poles at Re s = ln|L(j inf)|/delay >= 0); L(j inf) = -1 (no
closed loop); a pole-zero cancellation on the imaginary axis (a hidden marginal mode).

Where this differs from python-control (``control.stability_margins``, 0.10.2)
-----------------------------------------------------------------------------
* python-control's GM is the crossover gain nearest 1 in log (GM < 1 for a conditionally stable
  loop, with no verdict); here ``gain_margin`` / ``lower_gain_margin`` are both reported and are
  the gains where the Nyquist count changes, so an unstable loop is never certified by its GM.
* python-control's PM lies in [-180, 180); here in (-180, 180] (they differ only at exactly
  +/-180 deg, a loop with L(j w_i) = +1).
* python-control's stability margin sm is the smallest *local minimum* of |1 + L(j w)| (inf if
  |1 + L| has none); here 1/Ms also counts the limits at w = 0 and inf, so Ms = 1 for a strictly
  proper loop whose |1 + L| only grows (python-control: sm = inf).
* python-control has no stability verdict and no delay margin.

Phase crossovers are found on the continuous phase sum_i arg(jw - r_i) - w delay (analytic, so
none is skipped however fast the delay turns the phase), gain crossovers on log|R(jw)| (the
delay does not change |L| on the axis); both are arrays of roots of smooth functions, solved
together by a vectorised safeguarded Newton iteration.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import control
import numpy as np
import pandas as pd

from tokenfactory.core.validation import ConfigError, check_int, check_number

__all__ = [
    "DelayedLoop",
    "GainCrossing",
    "PhaseCrossing",
    "Margins",
    "loop_transfer",
    "stability_margins",
    "delay_margin",
    "sensitivity_peak",
    "pade_phase_error_deg",
    "pade_order_for",
    "stability_map",
]

# Grid resolution: points per decade of the log grid, points per root of the grid on which that
# root's factor's phase is uniform (pi / _ROOT_POINTS per step), delay phase per step (rad).
_DECADE_POINTS = 100
_ROOT_POINTS = 32
_DELAY_STEP_RAD = math.pi / 8
# L(j w) is taken to pass through -1 (a closed-loop pole on the axis) when |1 + L| is this small.
_MARGINAL = 1e-9


def _siso_polys(sys) -> tuple[np.ndarray, np.ndarray]:
    tf = control.tf(sys)
    if tf.ninputs != 1 or tf.noutputs != 1:
        raise ConfigError("loop", "stability analysis needs a SISO loop")
    return np.asarray(tf.num[0][0], dtype=float), np.asarray(tf.den[0][0], dtype=float)


@dataclass(frozen=True)
class _Rational:
    """R(s) = gain prod(s - zeros) / prod(s - poles), and which roots lie on the imaginary axis."""

    gain: float
    zeros: np.ndarray
    poles: np.ndarray

    @classmethod
    def from_polys(cls, num: np.ndarray, den: np.ndarray) -> "_Rational":
        num, den = np.trim_zeros(np.asarray(num, float), "f"), np.trim_zeros(np.asarray(den, float), "f")
        if len(den) == 0:
            raise ConfigError("loop", "the loop's denominator is zero")
        if len(num) == 0:
            return cls(0.0, np.zeros(0, complex), np.roots(den).astype(complex))
        return cls(float(num[0] / den[0]), np.roots(num).astype(complex), np.roots(den).astype(complex))

    @property
    def relative_degree(self) -> int:
        return len(self.poles) - len(self.zeros)

    @property
    def high_frequency_gain(self) -> float:
        """L(j inf) of the rational part: the gain if biproper, else 0."""
        return self.gain if self.relative_degree == 0 else 0.0

    def roots(self) -> np.ndarray:
        return np.concatenate([self.zeros, self.poles])

    def axis_mask(self, r: np.ndarray) -> np.ndarray:
        # np.roots returns exact zeros / exact imaginary roots for s^k and s^2 + w^2 factors;
        # a root merely close to the axis is treated as off-axis (the grid resolves it)
        return np.abs(r.real) <= 1e-10 * np.abs(r)

    def __call__(self, s) -> np.ndarray:
        s = np.asarray(s, complex)[..., None]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return self.gain * np.prod(s - self.zeros, axis=-1) / np.prod(s - self.poles, axis=-1)

    def __post_init__(self) -> None:
        # the axis terms below use every root once: zeros with weight +1, poles with -1
        r = np.concatenate([self.zeros, self.poles])
        on = self.axis_mask(r)
        object.__setattr__(self, "_a", r.real)
        object.__setattr__(self, "_b", r.imag)
        object.__setattr__(self, "_on", on)
        object.__setattr__(self, "_abs_a", np.where(on, 1.0, np.abs(r.real)))
        object.__setattr__(self, "_lhp", r.real < 0)
        object.__setattr__(self, "_weight", np.concatenate([np.ones(len(self.zeros)), -np.ones(len(self.poles))]))
        with np.errstate(divide="ignore"):
            object.__setattr__(self, "_log_gain", math.log(abs(self.gain)) if self.gain != 0 else -math.inf)

    # Terms on the imaginary axis. Each factor (jw - r), r = a + jb, has phase atan2(w - b, -a),
    # continuous in w off the axis: atan((w - b)/|a|) for a < 0, -pi - atan((w - b)/a) for a > 0
    # (equal mod 2 pi); a root on the axis contributes a step of pi at w = b.

    def log_mag(self, w) -> np.ndarray:
        """log|R(jw)|."""
        d = np.asarray(w, float)[:, None] - self._b
        with np.errstate(divide="ignore"):
            return self._log_gain + 0.5 * (np.log(self._a ** 2 + d * d) @ self._weight)

    def phase(self, w, delay: float = 0.0) -> np.ndarray:
        """Continuous phase of R(jw) e^{-jw delay} (rad)."""
        w = np.asarray(w, float)
        d = w[:, None] - self._b
        at = np.arctan(d / self._abs_a)
        ph = np.where(self._on, np.where(d >= 0, 0.5 * math.pi, -0.5 * math.pi),
                      np.where(self._lhp, at, -math.pi - at))
        return (0.0 if self.gain >= 0 else math.pi) + ph @ self._weight - w * delay

    def dlog_mag(self, w) -> np.ndarray:
        """d log|R(jw)| / dw."""
        d = np.asarray(w, float)[:, None] - self._b
        sq = self._a ** 2 + d * d
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(sq > 0, d / sq, 0.0) @ self._weight

    def dphase(self, w, delay: float = 0.0) -> np.ndarray:
        """d/dw of :meth:`phase`."""
        d = np.asarray(w, float)[:, None] - self._b
        sq = self._a ** 2 + d * d
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self._on | (sq == 0), 0.0, -self._a / sq) @ self._weight - delay

    def d2log_mag(self, w) -> np.ndarray:
        """d^2 log|R(jw)| / dw^2."""
        d = np.asarray(w, float)[:, None] - self._b
        sq = self._a ** 2 + d * d
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(sq > 0, (self._a ** 2 - d * d) / (sq * sq), 0.0) @ self._weight

    def d2phase(self, w) -> np.ndarray:
        """d^2/dw^2 of :meth:`phase` (the delay's term is linear)."""
        d = np.asarray(w, float)[:, None] - self._b
        sq = self._a ** 2 + d * d
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self._on | (sq == 0), 0.0, 2.0 * self._a * d / (sq * sq)) @ self._weight


@dataclass(frozen=True)
class DelayedLoop:
    """Open loop L(s) = rational(s) e^{-delay s} in negative feedback.

    Parameters
    ----------
    rational : control.TransferFunction or LTI
        The rational part R(s), SISO (controller x filter x plant); converted with ``control.tf``.
    delay : float
        Pure loop delay in seconds (>= 0, default 0).
    name : str
        Label for tables and messages (default empty).

    Raises
    ------
    ConfigError
        For a negative delay or a MIMO system.
    """

    rational: control.TransferFunction
    delay: float = 0.0
    name: str = ""

    def __post_init__(self) -> None:
        check_number("loop.delay", self.delay, low=0.0)
        object.__setattr__(self, "rational", control.tf(self.rational))
        polys = _siso_polys(self.rational)
        object.__setattr__(self, "_polys", polys)
        object.__setattr__(self, "_factored", _Rational.from_polys(*polys))

    def response(self, omega) -> np.ndarray:
        """Exact L(j omega) at the angular frequencies ``omega`` (rad/s, array_like)."""
        w = np.asarray(omega, dtype=float)
        num, den = self._polys
        s = 1j * w
        return np.polyval(num, s) / np.polyval(den, s) * np.exp(-s * self.delay)

    def pade(self, order: int) -> control.TransferFunction:
        """Rational model with the delay replaced by a Pade approximation of ``order`` (1..20)."""
        check_int("pade_order", order, low=1, high=20)
        if self.delay == 0:
            return self.rational
        return self.rational * control.tf(*control.pade(self.delay, order))

    def with_delay(self, delay: float) -> "DelayedLoop":
        """The same rational part behind ``delay`` seconds instead."""
        return DelayedLoop(self.rational, delay, self.name)

    def scaled(self, gain: float) -> "DelayedLoop":
        """The loop with its gain multiplied by ``gain``."""
        return DelayedLoop(self.rational * gain, self.delay, self.name)


def loop_transfer(controller_tf, plant_tf, delay: float = 0.0, filter_tf=None, name: str = "") -> DelayedLoop:
    """Assemble L(s) = C(s) F(s) P(s) e^{-delay s} (negative feedback on the measured output).

    Parameters
    ----------
    controller_tf : LTI
        Controller C(s), SISO.
    plant_tf : LTI
        Plant P(s) without its delay, SISO.
    delay : float
        Total loop delay in seconds (>= 0, default 0).
    filter_tf : LTI, optional
        Measurement filter F(s) (default none).
    name : str
        Label of the loop (default empty).

    Returns
    -------
    DelayedLoop
    """
    rational = control.tf(controller_tf) * control.tf(plant_tf)
    if filter_tf is not None:
        rational = rational * control.tf(filter_tf)
    return DelayedLoop(rational, delay, name)


@dataclass(frozen=True)
class GainCrossing:
    """One gain crossover |L(j w)| = 1.

    Parameters
    ----------
    frequency_rad_s : float
        The crossover frequency w_i (rad/s).
    phase_margin_deg : float
        PM_i in (-180, 180] deg: the phase rotation that puts L(j w_i) on -1, signed as
        python-control signs it (180 + arg L, wrapped).
    delay_margin_s : float
        DM_i (s): the phase distance from arg L(j w_i) down to -180 deg, in (0, 360] deg, in
        radians over w_i - the extra delay that first puts L(j w_i) on -1.
    """

    frequency_rad_s: float
    phase_margin_deg: float
    delay_margin_s: float


@dataclass(frozen=True)
class PhaseCrossing:
    """One crossing of the negative real axis by L(j w), w >= 0 (a phase crossover).

    Parameters
    ----------
    frequency_rad_s : float
        Where it crosses (rad/s; 0 when L(0) < 0, inf for L(j inf) < 0 without a delay).
    gain_factor : float
        The loop-gain factor 1/|L(j w)| that puts -1 on the crossing.
    rhp_change : int
        How the closed-loop right-half-plane pole count changes when the gain grows through
        ``gain_factor``: +2 / -2 (the crossing and its mirror image), +/-1 at w = 0 and inf.
    """

    frequency_rad_s: float
    gain_factor: float
    rhp_change: int


@dataclass(frozen=True)
class Margins:
    """Stability verdict and margins of one loop (definitions in the module docstring).

    Parameters
    ----------
    gain_margin : float
        Factor by which the loop gain can grow before the Nyquist verdict changes (inf if never).
    phase_margin_deg : float
        The gain crossover's PM_i of smallest magnitude, signed, in degrees (inf without one).
    delay_margin_s : float
        Smallest DM_i of a stable loop in seconds (inf without crossovers; 0 if unstable or
        |L(j inf)| >= 1).
    ms : float
        Sensitivity peak sup |1/(1 + L(j w))| (inf if L passes through -1).
    gain_crossovers_rad_s : tuple of float
        Every gain crossover frequency (rad/s), ascending.
    phase_crossovers_rad_s : tuple of float
        The frequencies of ``phase_crossings``.
    method : str
        ``"exact"`` or ``"pade-N"``.
    lower_gain_margin : float
        Factor (< 1) by which the loop gain can shrink before the verdict changes (0 if never).
    open_loop_rhp_poles : int
        P: open-loop poles with Re s > 0 (axis poles excluded: they are indented).
    closed_loop_rhp_poles : int
        Z = N + P: closed-loop poles with Re s > 0.
    ms_frequency_rad_s : float
        Where ``ms`` is attained (rad/s; 0 or inf at a limit).
    gain_crossings : tuple of GainCrossing
        Every gain crossover with its PM_i and DM_i.
    phase_crossings : tuple of PhaseCrossing
        The negative-real-axis crossings with gain factor up to 1e3 (and the one setting
        ``gain_margin``), lowest frequency first, at most 32.
    """

    gain_margin: float
    phase_margin_deg: float
    delay_margin_s: float
    ms: float
    gain_crossovers_rad_s: tuple[float, ...]
    phase_crossovers_rad_s: tuple[float, ...]
    method: str
    lower_gain_margin: float = 0.0
    open_loop_rhp_poles: int = 0
    closed_loop_rhp_poles: int = 0
    ms_frequency_rad_s: float = math.nan
    gain_crossings: tuple[GainCrossing, ...] = field(default_factory=tuple)
    phase_crossings: tuple[PhaseCrossing, ...] = field(default_factory=tuple)

    @property
    def stable(self) -> bool:
        """Nyquist verdict: no closed-loop pole in the closed right half-plane."""
        return self.closed_loop_rhp_poles == 0 and math.isfinite(self.ms)

    @property
    def crossover_rad_s(self) -> float:
        return self.gain_crossovers_rad_s[0] if self.gain_crossovers_rad_s else math.nan

    def meets(self, gm_floor: float = 2.0, pm_floor_deg: float = 45.0) -> bool:
        """Stable, gain can grow by ``gm_floor`` and shrink by 1/``gm_floor``, and every gain
        crossover is at least ``pm_floor_deg`` from -180 deg (|PM|)."""
        return (self.stable and self.gain_margin >= gm_floor and self.lower_gain_margin <= 1.0 / gm_floor
                and abs(self.phase_margin_deg) >= pm_floor_deg)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stable"] = self.stable
        return d

    def to_pandas(self) -> pd.DataFrame:
        """One row per crossing: gain crossovers (PM, DM) then phase crossovers (gain factor)."""
        rows = [{"kind": "gain", **asdict(c), "gain_factor": math.nan, "rhp_change": 0}
                for c in self.gain_crossings]
        rows += [{"kind": "phase", "frequency_rad_s": c.frequency_rad_s, "phase_margin_deg": math.nan,
                  "delay_margin_s": math.nan, "gain_factor": c.gain_factor, "rhp_change": c.rhp_change}
                 for c in self.phase_crossings]
        return pd.DataFrame(rows, columns=["kind", "frequency_rad_s", "phase_margin_deg", "delay_margin_s",
                                           "gain_factor", "rhp_change"])


# --- the frequency grid -------------------------------------------------------------------------

def _scales(rat: _Rational, delay: float) -> tuple[float, float]:
    mags = np.abs(rat.roots())
    mags = list(mags[mags > 0])
    if delay > 0:
        mags.append(1.0 / delay)
    if not mags:
        return 1.0, 1.0
    return min(mags), max(mags)


def _log_bound(rat: _Rational, r: float) -> float:
    """log of an upper bound on |R(s)| over |s| >= r (r above every pole's modulus): each factor
    |s - z| <= |s| + |z|, |s - p| >= |s| - |p|, and the bound decreases with r."""
    if rat.gain == 0:
        return -math.inf
    return math.log(abs(rat.gain)) + np.log(r + np.abs(rat.zeros)).sum() - np.log(r - np.abs(rat.poles)).sum()


def _closing_radius(rat: _Rational, delay: float) -> float:
    """A radius W beyond which 1 + L(s) cannot vanish or wind anywhere in the closed right
    half-plane, so the contour may be closed from j W to -j W with the principal angle:
    |L(s)| <= (1 + |L(j inf)|)/2 < 1 there (with a delay), or |L(s) - L(j inf)| <= |1 + L(j inf)|/2
    (without one)."""
    c = rat.high_frequency_gain
    if delay > 0:
        probe, target = rat, math.log((1.0 + abs(c)) / 2.0)
    else:
        if abs(1.0 + c) < 1e-12:
            raise ConfigError("loop", "L(j inf) = -1: the closed loop 1 / (1 + L) is improper")
        if c == 0:
            probe = rat
        else:  # R - c is strictly proper: (num - c den) / den
            num = np.poly(rat.zeros) * rat.gain if len(rat.zeros) else np.array([rat.gain])
            den = np.poly(rat.poles) if len(rat.poles) else np.array([1.0])
            diff = np.trim_zeros(np.polysub(num, c * den), "f")
            diff = diff[1:] if len(diff) == len(den) else diff  # drop the cancelled leading term
            probe = _Rational.from_polys(diff, den) if len(diff) and np.any(diff) else _Rational(
                0.0, np.zeros(0, complex), rat.poles)
        target = math.log(abs(1.0 + c) / 2.0)
    if probe.gain == 0:
        return 0.0
    r = 2.0 * max(np.abs(probe.poles).max(initial=0.0), 1e-300)
    r = max(r, 1e-12)
    for _ in range(400):
        if _log_bound(probe, r) <= target:
            return r
        r *= 2.0
    raise ConfigError("loop", "cannot bound the loop's gain at high frequency")


@dataclass
class _Analysis:
    """Everything the margins need, computed once per loop."""

    rat: _Rational
    delay: float
    grid: np.ndarray                  # frequencies on the axis (pole gaps excluded), sorted
    axis_poles: list                  # (frequency b >= 0, indentation radius)
    axis_zeros: np.ndarray            # frequencies b >= 0
    w_close: float
    lo: float
    hi: float
    w_top: float                      # the contour's top, j w_top, where it is closed
    marginal: bool = False            # a closed-loop pole on an open-loop axis pole (to precision)

    def in_gap(self, w: np.ndarray) -> np.ndarray:
        gap = np.zeros(np.shape(w), bool)
        for b, rho in self.axis_poles:
            gap |= np.abs(w - b) < rho
        return gap

    def L(self, s) -> np.ndarray:
        s = np.asarray(s, complex)
        out = self.rat(s)
        return out * np.exp(-s * self.delay) if self.delay else out


def _neutral(rat: _Rational, delay: float) -> bool:
    return delay > 0 and abs(rat.high_frequency_gain) >= 1.0


def _check_not_neutral(loop: DelayedLoop) -> None:
    """|L(j inf)| >= 1 with a delay: 1 + c e^{-s delay} = 0 has infinitely many roots with
    Re s = ln|c| / delay >= 0 (a neutral delay equation), which no Nyquist count can finish."""
    c = loop._factored.high_frequency_gain
    if _neutral(loop._factored, loop.delay):
        raise ConfigError("loop", f"|L(j inf)| = {abs(c):.4g} >= 1 with a {loop.delay:g} s delay: a neutral loop with "
                          f"infinitely many closed-loop poles at Re s = ln|L(j inf)|/delay >= 0 (unstable for "
                          f"|L(j inf)| > 1); keep the direct feed-through below 1")


def phase_crossovers(loop: DelayedLoop, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``count`` frequencies w > 0 where L(jw) crosses the negative real axis (exact
    delay), with |L| there; fewer if the loop has fewer."""
    ana = _analyse(loop)
    w_end = ana.grid[-1] if loop.delay == 0 else min(ana.grid[-1], 4.0 * math.pi / loop.delay)
    while True:
        x, mag, _ = _phase_crossings_between(ana, _axis_points(ana, ana.grid[0], w_end))
        if len(x) >= count or w_end >= ana.grid[-1]:
            order = np.argsort(x)[:count]
            return x[order], mag[order]
        w_end = min(2.0 * w_end, ana.grid[-1])


def _analyse(loop: DelayedLoop) -> _Analysis:
    rat, delay = loop._factored, loop.delay
    if rat.relative_degree < 0:
        raise ConfigError("loop", f"improper loop ({len(rat.zeros)} zeros > {len(rat.poles)} poles); a physical "
                          f"loop is proper")
    s_min, s_max = _scales(rat, delay)
    # a neutral loop (see _check_not_neutral) has no closing radius; only its crossings are used
    w_close = math.nan if _neutral(rat, delay) else _closing_radius(rat, delay)
    roots = rat.roots()
    # poles on the axis: one indentation per distinct frequency b >= 0
    ap = rat.poles[rat.axis_mask(rat.poles)]
    az = rat.zeros[rat.axis_mask(rat.zeros)]
    # cluster axis poles (a repeated root comes back from np.roots split by ~sqrt(eps))
    clusters: list[list[float]] = []
    for f in sorted(float(abs(p.imag)) for p in ap):
        if clusters and f - clusters[-1][-1] <= 1e-6 * max(f, s_min):
            clusters[-1].append(f)
        else:
            clusters.append([f])
    zero_freqs = np.array(sorted({float(abs(z.imag)) for z in az}))
    axis_poles = []
    marginal = False
    for members in clusters:
        b = 0.0 if members[0] == 0.0 else 0.5 * (members[0] + members[-1])
        spread = members[-1] - b
        near = max(spread * 1.5, 1e-9 * max(b, s_min))
        others = roots[np.abs(roots - 1j * b) > near]
        d_other = np.abs(others - 1j * b).min(initial=math.inf)
        if b > 0:
            d_other = min(d_other, 2 * b)
        if np.any(np.abs(np.abs(az.imag) - b) <= near):
            raise ConfigError("loop", f"a pole and a zero cancel on the imaginary axis at s = +/-{b:g}j: a hidden "
                              f"marginal mode the Nyquist count cannot see; remove the common factor")
        rho = max(0.01 * min(d_other, max(b, s_min)), 10.0 * spread)
        th = np.linspace(0, 2 * math.pi, 33)[:-1]
        # |L| > 1 on the whole circle: by Rouche no closed-loop pole hides inside the indentation.
        # If that needs a radius below 1e-9 of the pole's frequency, a closed-loop pole sits on
        # the axis to working precision: the loop is marginal.
        while np.any(np.abs(rat(1j * b + rho * np.exp(1j * th))) * math.exp(-rho * delay) < 2.0):
            if rho < max(1e-9 * max(b, s_min), 10.0 * spread):
                marginal = True
                break
            rho /= 10.0
        axis_poles.append((b, rho))
    lo = 1e-3 * s_min
    if axis_poles and axis_poles[0][0] == 0.0:
        lo = min(lo, axis_poles[0][1])
    hi = max(1e3 * s_max, 2.0 * np.nan_to_num(w_close), 10.0 * lo)
    parts = [np.logspace(math.log10(lo), math.log10(hi), int(math.ceil(_DECADE_POINTS * math.log10(hi / lo))) + 1)]
    # per root, the frequencies at which its factor's phase is uniform in (-pi/2, pi/2)
    th = np.linspace(-0.5 * math.pi, 0.5 * math.pi, _ROOT_POINTS + 2)[1:-1]
    off = roots[~rat.axis_mask(roots)]
    if len(off):
        parts.append((off.imag[:, None] + np.abs(off.real)[:, None] * np.tan(th)[None, :]).ravel())
    # around roots on the axis, log-spaced offsets (the magnitude dips to 0 or peaks to inf there)
    offs = np.logspace(-9, 0, 46)
    for b in [*(b for b, _ in axis_poles), *zero_freqs]:
        if b > 0:
            parts.append(b * (1.0 - offs))
            parts.append(b * (1.0 + offs))
    for b, rho in axis_poles:
        parts.append(np.array([b - rho, b + rho]))
    g = np.concatenate(parts)
    g = g[np.isfinite(g) & (g >= lo) & (g <= hi)]
    ana = _Analysis(rat, delay, np.array([]), axis_poles, zero_freqs, w_close, lo, hi,
                    max(np.nan_to_num(w_close), 10.0 * lo), marginal)
    g = np.unique(g)
    ana.grid = g[~ana.in_gap(g)]
    return ana


# --- Nyquist count ------------------------------------------------------------------------------

def _delay_points(ana: _Analysis, logm: np.ndarray, threshold: float) -> np.ndarray:
    """Linear points every _DELAY_STEP_RAD of delay phase over the stretches where |R| >= threshold."""
    if ana.delay == 0:
        return np.zeros(0)
    w = ana.grid
    hot = logm >= math.log(threshold)
    if not hot.any():
        return np.zeros(0)
    step = _DELAY_STEP_RAD / ana.delay
    idx = np.nonzero(hot)[0]
    runs = np.split(idx, np.nonzero(np.diff(idx) > 1)[0] + 1)
    out = []
    total = 0
    for run in runs:
        a, b = w[max(run[0] - 1, 0)], w[min(run[-1] + 1, len(w) - 1)]
        n = int(math.ceil((b - a) / step)) + 1
        total += n
        if total > 2_000_000:
            raise ConfigError("loop", f"delay x bandwidth too large for the Nyquist count ({ana.delay:g} s delay with "
                              f"|L| >= {threshold:g} up to {b:.3g} rad/s)")
        out.append(np.linspace(a, b, n))
    pts = np.concatenate(out)
    return pts[~ana.in_gap(pts)]


class _Path:
    """The upper half of the indented Nyquist contour as pieces: ("axis", w) with s = j w, or
    ("arc", b, rho, theta) with s = j b + rho e^{j theta}."""

    def __init__(self, ana: _Analysis, axis_w: np.ndarray):
        self.pieces = []
        w = np.unique(axis_w)
        start = 0.0
        arc_pts = np.linspace(-0.5 * math.pi, 0.5 * math.pi, 65)
        poles = list(ana.axis_poles)
        if poles and poles[0][0] == 0.0:
            _, rho = poles.pop(0)
            self.pieces.append(["arc", 0.0, rho, np.linspace(0.0, 0.5 * math.pi, 33)])
            start = rho
        bounds = [(b - rho, b, rho) for b, rho in poles]
        for end, b, rho in [*bounds, (ana.w_top, None, None)]:
            seg = w[(w > start) & (w < end)]
            self.pieces.append(["axis", np.concatenate([[start], seg, [end]])])
            if b is not None:
                self.pieces.append(["arc", b, rho, arc_pts.copy()])
                start = b + rho

    @staticmethod
    def points(piece) -> np.ndarray:
        if piece[0] == "axis":
            return 1j * piece[1]
        _, b, rho, th = piece
        return 1j * b + rho * np.exp(1j * th)

    @staticmethod
    def params(piece) -> np.ndarray:
        return piece[1] if piece[0] == "axis" else piece[3]

    @staticmethod
    def set_params(piece, p) -> None:
        if piece[0] == "axis":
            piece[1] = p
        else:
            piece[3] = p


def _nyquist(ana: _Analysis) -> tuple[int, int, np.ndarray, np.ndarray, bool]:
    """(P, Z, w, 1 + L(j w) on the axis, marginal) from the winding number of 1 + L."""
    rat = ana.rat
    c = rat.high_frequency_gain
    logm = ana.rat.log_mag(ana.grid)
    extra = _delay_points(ana, logm, (1.0 + abs(c)) / 2.0)
    path = _Path(ana, np.concatenate([ana.grid[ana.grid < ana.w_top], extra]))
    marginal = ana.marginal
    for _ in range(60):
        flagged_any = False
        for piece in path.pieces:
            s = _Path.points(piece)
            Lp = ana.L(s)
            F = 1.0 + Lp
            aF = np.abs(F)
            if aF.min() < _MARGINAL:
                marginal = True
            dang = np.abs(np.angle(F[1:] * np.conj(F[:-1])))
            chord = np.abs(np.diff(Lp))
            near = np.minimum(aF[1:], aF[:-1])
            flag = ((dang > math.pi / 4) | (chord > 0.5 * near)) & (near > _MARGINAL)
            if flag.any():
                p = _Path.params(piece)
                mids = 0.5 * (p[1:] + p[:-1])[flag]
                mids = mids[(mids > p[:-1][flag]) & (mids < p[1:][flag])]  # float resolution
                if len(mids):
                    flagged_any = True
                    _Path.set_params(piece, np.sort(np.concatenate([p, mids])))
        if not flagged_any:
            break
    Fs = [1.0 + ana.L(_Path.points(pc)) for pc in path.pieces]
    F = np.concatenate(Fs)
    half = np.angle(F[1:] * np.conj(F[:-1])).sum()
    # mirror image of the upper half, then the closing arc from j w_top to -j w_top, on which
    # 1 + L stays in a disc that excludes 0 (see _closing_radius): the principal angle
    winding = (2.0 * half + np.angle(np.conj(F[-1]) ** 2)) / (2.0 * math.pi)  # counter-clockwise
    n_ccw = int(round(winding))
    if abs(winding - n_ccw) > 0.05 and not marginal:
        raise ArithmeticError(f"Nyquist winding number {winding:.3f} is not an integer")
    P = int(np.sum((rat.poles.real > 0) & ~rat.axis_mask(rat.poles)))
    Z = P - n_ccw
    axis = [(pc[1], f) for pc, f in zip(path.pieces, Fs) if pc[0] == "axis"]
    w_axis = np.concatenate([a for a, _ in axis])
    F_axis = np.concatenate([f for _, f in axis])
    return P, Z, w_axis, F_axis, marginal


# --- crossings ----------------------------------------------------------------------------------

def _solve(fun: Callable[[np.ndarray], np.ndarray], dfun: Callable[[np.ndarray], np.ndarray],
           a: np.ndarray, b: np.ndarray, iters: int = 100) -> np.ndarray:
    """Vectorised safeguarded Newton for roots of ``fun`` in brackets [a, b] (fun(a), fun(b) of
    opposite sign): a Newton step from the bracket's midpoint when it stays inside, else bisection."""
    a, b = np.array(a, float), np.array(b, float)
    fa = fun(a)
    x = 0.5 * (a + b)
    for _ in range(iters):
        fx = fun(x)
        left = np.sign(fx) == np.sign(fa)
        a, fa, b = np.where(left, x, a), np.where(left, fx, fa), np.where(left, b, x)
        with np.errstate(divide="ignore", invalid="ignore"):
            newton = x - fx / dfun(x)
        inside = np.isfinite(newton) & (newton > a) & (newton < b)
        x_new = np.where(inside, newton, 0.5 * (a + b))
        # a Newton step this small leaves an error of its square: converged to rounding
        done = (np.abs(x_new - x) <= 1e-13 * np.abs(x)) | (fx == 0) | (b - a <= 4e-16 * np.abs(a))
        x = np.where(fx == 0, x, x_new)
        if np.all(done):
            break
    return x


def _usable_intervals(ana: _Analysis, w: np.ndarray) -> np.ndarray:
    """Grid intervals that do not straddle a pole's indentation or a zero on the axis."""
    ok = np.ones(len(w) - 1, bool)
    for b, rho in ana.axis_poles:
        ok &= ~((w[:-1] < b + rho) & (w[1:] > b - rho))
    for b in ana.axis_zeros:
        ok &= ~((w[:-1] <= b) & (w[1:] >= b))
    return ok


def _with_extrema(ana: _Analysis, w: np.ndarray, df: Callable, d2f: Callable) -> np.ndarray:
    """``w`` with the extrema of a function added wherever its derivative ``df`` changes sign
    between two points of a usable interval: between the points of the result the function is
    monotone (given at most one extremum per interval of ``w``), so no pair of crossings of a
    level can hide between two grid points (a resonance peak of |L| just above 1 between them)."""
    d = df(w)
    ok = _usable_intervals(ana, w) & (d[:-1] * d[1:] < 0)
    i = np.nonzero(ok)[0]
    if not len(i):
        return w
    return np.sort(np.concatenate([w, _solve(df, d2f, w[i], w[i + 1])]))


def _gain_crossovers(ana: _Analysis) -> np.ndarray:
    rat = ana.rat
    w = _with_extrema(ana, ana.grid, rat.dlog_mag, rat.d2log_mag)
    g = rat.log_mag(w)
    # a crossing belongs to the half-open interval (w[i], w[i+1]]: one exactly on a grid point
    # (|L(j1)| = 1 for 1/s^2) is found once, not once on each side
    ok = _usable_intervals(ana, w) & (np.sign(g[:-1]) != np.sign(g[1:])) & (g[:-1] != 0) \
        & np.isfinite(g[:-1]) & np.isfinite(g[1:])
    i = np.nonzero(ok)[0]
    if not len(i):
        return np.zeros(0)
    return _solve(rat.log_mag, rat.dlog_mag, w[i], w[i + 1])


def _phase_crossings_between(ana: _Analysis, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Frequencies in (w[0], w[-1]] where L(jw) crosses the negative real axis, with |L| there and
    the direction (+1: Im L goes from - to +, i.e. the phase decreases through -180 deg)."""
    rat, delay = ana.rat, ana.delay
    w = _with_extrema(ana, w, lambda x: rat.dphase(x, delay), rat.d2phase)
    ph = rat.phase(w, delay)
    q = (ph + math.pi) / (2.0 * math.pi)  # an integer where arg L = -180 deg (mod 360)
    ok = _usable_intervals(ana, w)
    lo_n = np.floor(np.minimum(q[:-1], q[1:])) + 1
    hi_n = np.floor(np.maximum(q[:-1], q[1:]))
    # a phase that merely grazes a level (a loop real on the whole axis) crosses nothing
    ok &= np.abs(np.diff(q)) > 1e-9
    count = np.where(ok, np.maximum(hi_n - lo_n + 1, 0), 0).astype(int)
    if count.sum() == 0:
        return np.zeros(0), np.zeros(0), np.zeros(0, int)
    if count.sum() > 200_000:
        raise ConfigError("loop", "too many phase crossovers to enumerate (delay x bandwidth too large)")
    idx = np.repeat(np.arange(len(count)), count)
    first = np.repeat(np.cumsum(count) - count, count)
    n = lo_n[idx] + (np.arange(count.sum()) - first)
    level = 2.0 * math.pi * n - math.pi
    x = _solve(lambda x: rat.phase(x, delay) - level, lambda x: rat.dphase(x, delay), w[idx], w[idx + 1])
    logm, dph = rat.log_mag(x), rat.dphase(x, delay)
    keep = np.isfinite(logm)
    return x[keep], np.exp(logm[keep]), -np.sign(dph[keep]).astype(int)


@dataclass
class _CrossingSet:
    freq: np.ndarray
    gain_factor: np.ndarray
    change: np.ndarray          # change of Z as the gain grows through gain_factor
    k_valid: float              # the set holds every crossing with gain factor <= k_valid
    w_end: float                # ... and every crossing at frequencies up to w_end


def _axis_points(ana: _Analysis, w_start: float, w_end: float) -> np.ndarray:
    """Grid points on [w_start, w_end], both ends included."""
    inner = ana.grid[(ana.grid > w_start) & (ana.grid < w_end)]
    return np.concatenate([[w_start], inner, np.linspace(max(inner[-1] if len(inner) else w_start, w_start), w_end, 16)[1:]])


def _tail_k_valid(ana: _Analysis, w_end: float) -> float:
    """Smallest gain factor a crossing beyond w_end can have: 1 / sup_{w >= w_end} |R(jw)|."""
    tail = np.logspace(math.log10(w_end), math.log10(w_end) + 8, 400)
    sup = max(float(np.exp(ana.rat.log_mag(tail)).max()), abs(ana.rat.high_frequency_gain))
    return 1.0 / sup if sup > 0 else math.inf


def _all_phase_crossings(ana: _Analysis, w_end: float) -> _CrossingSet:
    rat, delay = ana.rat, ana.delay
    w = _axis_points(ana, ana.grid[0], w_end)
    x, mag, d = _phase_crossings_between(ana, w)
    with np.errstate(divide="ignore"):
        k = 1.0 / mag
    change = 2 * d
    freq = list(x)
    ks = list(k)
    ch = list(change)
    # w = 0: L(0) real; a crossing of the negative real axis if L(0) < 0 (mirror images meet
    # there). Near w = 0, Im L = -|L| (phase - pi) has the sign of -phase'(0).
    if not (ana.axis_poles and ana.axis_poles[0][0] == 0.0) and 0.0 not in ana.axis_zeros:
        L0 = float(rat(0.0).real)
        slope = float(rat.dphase(np.array([0.0]), delay)[0])
        if L0 < 0 and slope != 0:
            freq.append(0.0)
            ks.append(-1.0 / L0)
            ch.append(1 if slope < 0 else -1)
    c = rat.high_frequency_gain
    k_valid = math.inf
    if delay == 0:
        # L(j inf) = c < 0 on the negative real axis; for large w, Im L = |c| phase'(w) w
        slope = float(rat.dphase(np.array([ana.hi]))[0])
        if c < 0 and slope != 0:
            freq.append(math.inf)
            ks.append(-1.0 / c)
            ch.append(-1 if slope > 0 else 1)
    else:
        k_valid = _tail_k_valid(ana, w_end)  # crossings beyond w_end have |L| <= sup |R| there
    # crossings at the same gain (to rounding: a near pole-zero cancellation) act together
    freq, ks, ch = np.array(freq), np.array(ks), np.array(ch, int)
    if len(ks) > 1:
        order = np.argsort(ks)
        freq, ks, ch = freq[order], ks[order], ch[order]
        group = np.concatenate([[0], np.cumsum(np.diff(ks) > 1e-9 * ks[1:])])
        net = np.bincount(group, weights=ch).astype(int)
        first = np.concatenate([[0], np.nonzero(np.diff(group))[0] + 1])
        keep = first[net != 0]
        freq, ks, ch = freq[keep], ks[keep], net[net != 0]
    return _CrossingSet(freq, ks, ch, k_valid, w_end)


def _walk(cs: _CrossingSet, z1: int) -> tuple[float | None, float, int]:
    """Walk the gain from 1 up and down through the crossings, tracking Z: the gain factors
    nearest 1 where the verdict (Z == 0) changes, above (None if undecided up to ``k_valid``) and
    below (0 if never), and Z just below ``k_valid``."""
    k, ch = cs.gain_factor, cs.change

    def first_change(sel, order, sign):
        idx = np.nonzero(sel)[0]
        idx = idx[np.argsort(k[idx])[::order]]
        z = z1 + sign * np.cumsum(ch[idx])
        flips = np.nonzero((z == 0) != (z1 == 0))[0]
        end = flips[0] + 1 if len(flips) else len(z)
        if np.any(z[:end] < 0):
            raise ArithmeticError("Nyquist count and phase crossings disagree (negative pole count)")
        return (float(k[idx[flips[0]]]) if len(flips) else None), (int(z[-1]) if len(z) else z1)

    gm, z_up = first_change((k > 1.0) & (k <= cs.k_valid), 1, 1)
    lgm, _ = first_change(k < 1.0, -1, -1)
    return gm, (0.0 if lgm is None else lgm), z_up


def _stays_unstable(ana: _Analysis, cs: _CrossingSet, z_valid: int) -> bool:
    """True if Z stays > 0 for every gain above ``cs.k_valid``: the crossings beyond ``w_end`` all
    add poles (the phase falls there) and the enumerated ones above k_valid never bring Z to 0."""
    tail = np.logspace(math.log10(cs.w_end), math.log10(cs.w_end) + 8, 400)
    if np.max(ana.rat.dphase(tail, ana.delay)) >= 0:
        return False
    rest = cs.gain_factor > cs.k_valid
    steps = cs.change[rest][np.argsort(cs.gain_factor[rest])]
    return z_valid + min(np.cumsum(steps).min(initial=0), 0) > 0


def _gain_margins(ana: _Analysis, z1: int | None) -> tuple[float, float, _CrossingSet]:
    """(gain_margin, lower_gain_margin, crossings) walking from the verdict at k = 1 with Z = z1;
    ``z1=None`` for a marginal loop (on a verdict boundary at k = 1: both margins are 1)."""
    rat, delay = ana.rat, ana.delay
    if delay == 0:
        cs = _all_phase_crossings(ana, ana.grid[-1])
        if z1 is None:
            return 1.0, 1.0, cs
        gm, lgm, _ = _walk(cs, z1)
        return (math.inf if gm is None else gm), lgm, cs
    # beyond w_mono |R(jw)| only falls, so later crossings have larger gain factors
    logm, dlog = rat.log_mag(ana.grid), rat.dlog_mag(ana.grid)
    rising = np.nonzero(dlog >= 0)[0]
    w_mono = ana.grid[min(rising[-1] + 1, len(ana.grid) - 1)] if len(rising) else ana.grid[0]
    if rat.relative_degree == 0:
        # |R| -> |L(j inf)|, possibly from below: stop where the rational part has settled (the
        # tail is bounded by sup |R| beyond w_end, below)
        w_mono = min(w_mono, 10.0 * np.abs(rat.roots()).max(initial=ana.lo))
    above = np.nonzero(logm >= 0)[0]
    w1 = ana.grid[min(above[-1] + 1, len(ana.grid) - 1)] if len(above) else ana.grid[0]
    w_end = max(w_mono, w1) + 4.0 * math.pi / delay
    for _ in range(24):
        cs = _all_phase_crossings(ana, w_end)
        if z1 is None:
            return 1.0, 1.0, cs
        gm, lgm, z_valid = _walk(cs, z1)
        if gm is not None:
            return gm, lgm, cs
        if z1 != 0 and _stays_unstable(ana, cs, z_valid):
            return math.inf, lgm, cs
        if rat.relative_degree == 0 or cs.k_valid > 1e15:
            # biproper: the tail's crossings accumulate at 1/|L(j inf)|; a stable loop is taken
            # to lose stability at the tail's smallest possible gain factor (conservative)
            return (cs.k_valid if z1 == 0 and rat.relative_degree == 0 else math.inf), lgm, cs
        w_end *= 2.0
    return math.inf, lgm, cs


# --- margins ------------------------------------------------------------------------------------

def _sensitivity_peak(ana: _Analysis, w_axis: np.ndarray, F_axis: np.ndarray, cs: _CrossingSet,
                      marginal: bool) -> tuple[float, float]:
    if marginal:
        i = int(np.argmin(np.abs(F_axis)))
        return math.inf, float(w_axis[i])
    c = ana.rat.high_frequency_gain
    s_inf = 1.0 / (1.0 - abs(c)) if ana.delay > 0 else 1.0 / abs(1.0 + c)
    s_zero = 0.0 if (ana.axis_poles and ana.axis_poles[0][0] == 0.0) else 1.0 / abs(1.0 + ana.rat(0.0))
    fin = np.isfinite(cs.freq) & (cs.freq > 0)
    # the contour's axis part stops at its closing radius, where |L| <= 1/2 but |S| may still
    # peak (Ms < 2): the grid above it is searched too
    w = np.concatenate([w_axis, ana.grid[ana.grid > w_axis.max()], cs.freq[fin]])
    order = np.argsort(w)
    w = w[order]
    aF = np.abs(1.0 + ana.L(1j * w))
    # zoom on the deepest grid minima of |1 + L|: 17 points across the bracket, 8 rounds
    i = np.argsort(aF)[:3]
    a, b = w[np.maximum(i - 1, 0)], w[np.minimum(i + 1, len(w) - 1)]
    t = np.linspace(0.0, 1.0, 17)
    for _ in range(8):
        x = a[:, None] + (b - a)[:, None] * t
        v = np.abs(1.0 + ana.L(1j * x))
        j = np.argmin(v, axis=1)
        a, b = x[np.arange(len(j)), np.maximum(j - 1, 0)], x[np.arange(len(j)), np.minimum(j + 1, 16)]
    x = np.concatenate([w[i], 0.5 * (a + b)])
    v = np.abs(1.0 + ana.L(1j * x))
    k = int(np.argmin(v))
    best, w_best = 1.0 / v[k], float(x[k])
    if s_inf >= best * (1 - 1e-9):
        return s_inf, math.inf
    if s_zero >= best * (1 - 1e-9):
        return s_zero, 0.0
    return best, w_best


def _reported_crossings(ana: _Analysis, cs: _CrossingSet, gm: float, k_max: float = 1e3,
                        n_max: int = 32) -> tuple[PhaseCrossing, ...]:
    """The phase crossings with gain factor up to ``k_max`` (and the one setting ``gain_margin``),
    lowest frequency first, at most ``n_max``: the walk's set, extended with a delay until no
    further crossing can have a gain factor below ``k_max``."""
    freq, k, ch = cs.freq, cs.gain_factor, cs.change
    w_end, k_valid = cs.w_end, cs.k_valid
    while ana.delay > 0 and k_valid <= k_max and np.sum(np.isfinite(freq) & (k <= k_max)) < n_max:
        w_next = min(2.0 * w_end, w_end + 2000.0 * math.pi / ana.delay)
        x, mag, d = _phase_crossings_between(ana, _axis_points(ana, w_end, w_next))
        new = x > w_end * (1 + 1e-12)
        freq, k, ch = np.concatenate([freq, x[new]]), np.concatenate([k, 1.0 / mag[new]]), np.concatenate([ch, 2 * d[new]])
        w_end, k_valid = w_next, _tail_k_valid(ana, w_next)
    sel = (k <= k_max) | np.isclose(k, gm, rtol=1e-12)
    order = np.argsort(freq[sel])[:n_max]
    return tuple(PhaseCrossing(float(f), float(g), int(c)) for f, g, c in
                 zip(freq[sel][order], k[sel][order], ch[sel][order]))


def _margins(ana: _Analysis, method: str) -> Margins:
    P, Z, w_axis, F_axis, marginal = _nyquist(ana)
    stable = Z == 0 and not marginal
    gm, lgm, cs = _gain_margins(ana, None if marginal else Z)
    ms, w_ms = _sensitivity_peak(ana, w_axis, F_axis, cs, marginal)
    wc = _gain_crossovers(ana)
    rows = []
    if len(wc):
        ph = ana.rat.phase(wc, ana.delay)
        d = np.degrees(np.mod(ph + math.pi, 2.0 * math.pi))  # phase distance down to -180 deg
        d = np.where(d <= 0.0, 360.0, d)
        pm = np.where(d <= 180.0, d, d - 360.0)
        dm = np.radians(d) / wc
        rows = [GainCrossing(float(a), float(b), float(e)) for a, b, e in zip(wc, pm, dm)]
    pm = min((r.phase_margin_deg for r in rows), key=abs, default=math.inf)
    c = ana.rat.high_frequency_gain
    if not stable or abs(c) >= 1.0:
        dm = 0.0
    else:
        dm = min((r.delay_margin_s for r in rows), default=math.inf)
    ph_rows = _reported_crossings(ana, cs, gm)
    return Margins(float(gm), float(pm), float(dm), float(ms), tuple(r.frequency_rad_s for r in rows),
                   tuple(r.frequency_rad_s for r in ph_rows), method, lower_gain_margin=float(lgm),
                   open_loop_rhp_poles=P, closed_loop_rhp_poles=max(int(Z), 0),
                   ms_frequency_rad_s=float(w_ms), gain_crossings=tuple(rows), phase_crossings=ph_rows)


def pade_phase_error_deg(delay: float, order: int, omega) -> np.ndarray:
    """|phase(Pade_N(j w)) - (-w delay)| in degrees (the all-pass Pade matches magnitude exactly).

    Parameters
    ----------
    delay : float
        The delay (s).
    order : int
        Pade order N.
    omega : array_like
        Angular frequencies (rad/s).

    Returns
    -------
    numpy.ndarray
        The phase error at each frequency (deg).
    """
    w = np.asarray(omega, dtype=float)
    num, den = control.pade(delay, order)
    s = 1j * w
    ph = np.unwrap(np.angle(np.polyval(num, s) / np.polyval(den, s)))
    return np.degrees(np.abs(ph + w * delay))


def pade_order_for(delay: float, omega_max: float, tol_deg: float = 1.0, max_order: int = 20) -> int:
    """Smallest Pade order whose phase stays within ``tol_deg`` of the exact delay up to ``omega_max``.

    Parameters
    ----------
    delay : float
        The delay (s, >= 0; 0 gives order 1).
    omega_max : float
        Highest frequency to track (rad/s, > 0).
    tol_deg : float
        Phase tolerance (deg, default 1).
    max_order : int
        Largest order tried (default 20).

    Returns
    -------
    int

    Raises
    ------
    ConfigError
        If no order up to ``max_order`` is accurate enough.
    """
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
    """Nyquist verdict and margins of ``loop`` (definitions in the module docstring).

    Parameters
    ----------
    loop : DelayedLoop
        The open loop L(s) = R(s) e^{-delay s} in negative feedback.
    method : {"exact", "pade"}
        ``"exact"`` uses e^{-j w delay}; ``"pade"`` a Pade model whose order (if not given) is the
        smallest that tracks the exact phase within ``pade_tol_deg`` up to twice the highest
        frequency that sets a margin of the exact loop.
    pade_order : int, optional
        Pade order for ``method="pade"``.
    pade_tol_deg : float
        Phase tolerance for choosing the Pade order.

    Returns
    -------
    Margins
        The verdict (``stable``, ``closed_loop_rhp_poles``), two-sided gain margins, the phase and
        delay margin of every gain crossover, and the sensitivity peak.
    """
    _check_not_neutral(loop)
    if method == "exact":
        return _margins(_analyse(loop), "exact")
    if method != "pade":
        raise ConfigError("method", f"{method!r} is not one of 'exact', 'pade'")
    if pade_order is None:
        exact = _margins(_analyse(loop), "exact")
        # track the phase up to twice the frequency that sets either margin
        w_gm = [c.frequency_rad_s for c in exact.phase_crossings
                if c.gain_factor in (exact.gain_margin, exact.lower_gain_margin) and c.frequency_rad_s > 0]
        w_top = max([*exact.gain_crossovers_rad_s, *w_gm], default=1.0 / max(loop.delay, 1e-9))
        pade_order = pade_order_for(loop.delay, 2.0 * w_top, pade_tol_deg) if loop.delay > 0 else 1
    model = DelayedLoop(loop.pade(pade_order), 0.0, loop.name)
    return _margins(_analyse(model), f"pade-{pade_order}")


def delay_margin(loop: DelayedLoop) -> float:
    """Extra pure delay (s) the loop tolerates before it loses stability (exact response); 0 if
    it is unstable.

    Parameters
    ----------
    loop : DelayedLoop

    Returns
    -------
    float
    """
    return stability_margins(loop).delay_margin_s


def sensitivity_peak(loop: DelayedLoop) -> float:
    """Ms = sup_w |1 / (1 + L(j w))| on the exact response.

    Parameters
    ----------
    loop : DelayedLoop

    Returns
    -------
    float
    """
    return stability_margins(loop).ms


def stability_map(make_loop: Callable[[float, float], DelayedLoop], x_name: str, x_values: Sequence[float],
                  y_name: str, y_values: Sequence[float]) -> pd.DataFrame:
    """Margins over a grid of two parameters: one row per (x, y) with the Nyquist verdict, both
    gain margins, PM, delay margin and Ms, computed together by
    :func:`~tokenfactory.controllers.stability_margins_batch` (the same numbers as
    :func:`stability_margins` point by point).

    Parameters
    ----------
    make_loop : callable
        ``make_loop(x, y) -> DelayedLoop`` builds the loop for each point.
    x_name, y_name : str
        Column names of the two parameters.
    x_values, y_values : sequence of float
        The grid.

    Returns
    -------
    pandas.DataFrame
        Columns ``x_name``, ``y_name``, gain_margin, lower_gain_margin, phase_margin_deg,
        delay_margin_s, ms, stable, closed_loop_rhp_poles, crossover_rad_s.
    """
    # the batch kernel builds on this module (imported here, not at the top: no import cycle)
    from tokenfactory.controllers.stability_batch import stability_margins_batch

    points = [(x, y) for x in x_values for y in y_values]
    mb = stability_margins_batch([make_loop(x, y) for x, y in points])
    return pd.DataFrame({x_name: [p[0] for p in points], y_name: [p[1] for p in points],
                         "gain_margin": mb.gain_margin, "lower_gain_margin": mb.lower_gain_margin,
                         "phase_margin_deg": mb.phase_margin_deg, "delay_margin_s": mb.delay_margin_s,
                         "ms": mb.ms, "stable": mb.stable, "closed_loop_rhp_poles": mb.closed_loop_rhp_poles,
                         "crossover_rad_s": mb.crossover_rad_s})


def frequency_grid(loop: DelayedLoop, n: int = 6000) -> np.ndarray:
    """A log-spaced plotting grid from 1e-3 x the slowest to 1e3 x the fastest pole, zero or 1/delay."""
    s_min, s_max = _scales(loop._factored, loop.delay)
    return np.logspace(np.log10(s_min * 1e-3), np.log10(s_max * 1e3), n)
