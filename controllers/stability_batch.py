"""Batched stability margins: the Nyquist verdict, two-sided gain margins, per-crossover phase
and delay margins and the sensitivity peak of many loops of one structure at once.

:func:`stability_margins_batch` gives, loop by loop, what :func:`~tokenfactory.controllers.
stability_margins` gives (exact delay; the scalar function is the reference, and the batch
agrees with it within 1e-6 relative - ``tests/test_stability_batch.py``), but with the
frequency responses of a chunk of loops as 2-D arrays (loops x frequencies), the crossings
found by vectorised sign changes and refined by a vectorised safeguarded Newton iteration, and
no per-loop Python in the inner path.

How it differs from the scalar path (same definitions, see ``controllers/stability.py``)
-----------------------------------------------------------------------------------------
* **Grid.** Per loop, a log grid from the integrators' indentation radius (or 1e-3 x the slowest
  root) to the scalar path's top frequency at ``_DECADE_POINTS`` per decade, plus
  ``_ROOT_POINTS`` points around each root on which that root's factor's phase is uniform
  (pi / ``_ROOT_POINTS`` per step), points at b +/- |a| 2^k out to b/2 around lightly damped
  roots a + jb, and - with a delay - linear points every pi/8 of delay phase where |R| >= 1/2
  (for the sensitivity peak). One array shape per chunk; each loop's points scale with its own
  roots and delay. Wherever the derivative of log|R| or of the phase changes sign between two
  points the extremum is found (Newton) and inserted, so both are monotone between grid points
  and sign changes and level counts find every crossing - which also found crossings the
  scalar path's denser grid missed (now fixed there too). The grid's density was chosen by
  its cost in correctness: on 8,000 random loops of the property test's kind (~6,000 through
  the kernel) 10/16, 8/12 and 6/10 points (per decade / per root) agree with the scalar path
  everywhere; 5/8 misses one sensitivity peak in 2,976 loops, 4/6 five, 3/4 44 (verdicts,
  gain margins and crossings agree down to 4/6). 8/12 is used.
* **Verdict.** Not a winding number on a refined contour but the same count read off the
  negative-real-axis crossings: Z(1) = P + N_arc + sum of the crossings' Z changes with gain
  factor below 1, where N_arc counts (from the continuous phase at the indentation's ends) the
  crossings of the large arc around the integrators. Each crossing of the ray (-inf, -1) by the
  closed Nyquist curve changes the clockwise count by its direction, so this is the Nyquist
  count itself.
* **Sensitivity peak.** Local minima of |1 + L(j w)| bracketed by sign changes of
  d|1 + L|^2/dw (analytic, from the log-magnitude and phase derivatives) on the grid, on the
  delay points and a quarter phase turn either side of each phase crossing; per loop the three
  deepest brackets by their ends and the three deepest by a parabola estimate of their minimum
  are refined by Newton - instead of a zoom around the deepest grid points.
* **Crossing solves** start at the false-position point of the grid bracket and take a
  false-position step (not bisection) when a Newton step leaves the bracket.

Loops it hands to the scalar path (counted in ``MarginsBatch.fallback``): a zero at s = 0 or a
root on the imaginary axis (or within 1e-6 relative of it: |L| near such a root is so
ill-conditioned that two correct evaluations differ beyond 1e-6 - a repeated undamped
resonance comes back from ``np.roots`` split 1e-9 off the axis) other than integrators at
s = 0, biproper loops (relative degree 0) and improper ones (the scalar path rejects those with its ``ConfigError``), a zero gain;
and, per loop, whenever the batch result would not be certain: a closed-loop pole within
1e-6 of the axis (|1 + L| or |1 - 1/k| at a crossing below 1e-6), an indentation end on the
negative real axis, an inconsistent or negative count, more than ``_MAX_CROSSINGS`` phase
crossings before the walk's frequency range ends, more than ``_MAX_DELAY_POINTS`` delay points,
a gain margin not decided by the crossings found, or a reported-crossing list that may be
incomplete. Each fallback's reason is in ``MarginsBatch.fallback_reason``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import control
import numpy as np
import pandas as pd

from tokenfactory.controllers.stability import (
    DelayedLoop,
    GainCrossing,
    Margins,
    PhaseCrossing,
    stability_margins,
)
from tokenfactory.core.validation import ConfigError, check_int

__all__ = ["DelayedLoopBatch", "MarginsBatch", "stability_margins_batch", "gain_delay_margins"]

# Grid of the batch kernel (see the module docstring): log points per decade, points per root.
_DECADE_POINTS = 8
_ROOT_POINTS = 12
_DELAY_STEP_RAD = math.pi / 8
# The reported phase crossings, as the scalar path: gain factor up to _K_REPORT, at most _N_REPORT.
_K_REPORT = 1e3
_N_REPORT = 32
# Per-loop limits of the batch path (beyond them the loop goes to the scalar path).
_MAX_CROSSINGS = 400
_MAX_DELAY_POINTS = 4096
# |1 + L| below this (a closed-loop pole at or near the axis): the scalar path decides.
_NEAR_MINUS_ONE = 1e-6
_DEFAULT_CHUNK = 1024


@dataclass(frozen=True, eq=False)
class DelayedLoopBatch:
    """Loops L_i(s) = num_i(s) / den_i(s) e^{-delay_i s} in negative feedback, as arrays.

    Built from parameter arrays (no python-control object per loop), so a stability map or an
    envelope of 10^5 loops costs array arithmetic. Rows may differ in structure (degrees,
    integrators): :func:`stability_margins_batch` groups them.

    Parameters
    ----------
    num : array_like, shape (n_loops, n_num) or (n_num,)
        Numerator coefficients, highest power first, one row per loop (a single row is
        broadcast to ``n_loops``).
    den : array_like, shape (n_loops, n_den) or (n_den,)
        Denominator coefficients, highest power first (a row must not be all zeros).
    delay : float or array_like, shape (n_loops,)
        Pure delay of each loop in seconds (>= 0, default 0).
    names : sequence of str, optional
        Labels of the loops (default empty).

    Raises
    ------
    ConfigError
        For mismatched row counts, non-finite coefficients, an all-zero denominator row, or a
        negative or non-finite delay.
    """

    num: np.ndarray
    den: np.ndarray
    delay: np.ndarray = 0.0
    names: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        num = np.atleast_2d(np.asarray(self.num, dtype=float))
        den = np.atleast_2d(np.asarray(self.den, dtype=float))
        delay = np.atleast_1d(np.asarray(self.delay, dtype=float))
        n = max(len(num), len(den), len(delay))
        for name, arr in (("num", num), ("den", den), ("delay", delay)):
            if arr.ndim > 2 or len(arr) not in (1, n):
                raise ConfigError(f"loops.{name}", f"expected one row per loop ({n}) or a single row, got shape "
                                  f"{arr.shape}")
            if not np.all(np.isfinite(arr)):
                raise ConfigError(f"loops.{name}", "coefficients and delays must be finite")
        num, den = np.broadcast_to(num, (n, num.shape[1])), np.broadcast_to(den, (n, den.shape[1]))
        delay = np.broadcast_to(delay, (n,))
        if np.any(delay < 0):
            raise ConfigError("loops.delay", f"delays must be >= 0 s (got {delay.min():g})")
        if np.any(np.all(den == 0, axis=1)):
            raise ConfigError("loops.den", "a loop's denominator is zero")
        if self.names is not None and len(self.names) != n:
            raise ConfigError("loops.names", f"expected {n} names, got {len(self.names)}")
        object.__setattr__(self, "num", num)
        object.__setattr__(self, "den", den)
        object.__setattr__(self, "delay", delay)
        if self.names is not None:
            object.__setattr__(self, "names", tuple(str(s) for s in self.names))

    @classmethod
    def from_loops(cls, loops: Sequence[DelayedLoop]) -> "DelayedLoopBatch":
        """The loops' coefficient arrays (shorter polynomials padded with leading zeros).

        Parameters
        ----------
        loops : sequence of DelayedLoop

        Returns
        -------
        DelayedLoopBatch
        """
        polys = [lp._polys for lp in loops]
        nn = max((len(p[0]) for p in polys), default=1)
        nd = max((len(p[1]) for p in polys), default=1)
        num = np.zeros((len(polys), nn))
        den = np.zeros((len(polys), nd))
        for i, (a, b) in enumerate(polys):
            num[i, nn - len(a):] = a
            den[i, nd - len(b):] = b
        return cls(num, den, np.array([lp.delay for lp in loops], float), tuple(lp.name for lp in loops))

    def __len__(self) -> int:
        return len(self.delay)

    def loop(self, i: int) -> DelayedLoop:
        """Loop ``i`` as a :class:`DelayedLoop` (the scalar path's input).

        Parameters
        ----------
        i : int
            Row index.

        Returns
        -------
        DelayedLoop
        """
        name = self.names[i] if self.names is not None else ""
        return DelayedLoop(control.tf(self.num[i], self.den[i]), float(self.delay[i]), name)


# --- factoring rows into roots, grouped by structure --------------------------------------------

@dataclass
class _Group:
    """Loops of one structure: off-origin zeros and poles as (n, nz) and (n, np) arrays."""

    rows: np.ndarray          # indices into the batch
    gain: np.ndarray
    zeros: np.ndarray
    poles: np.ndarray
    origin_poles: int
    delay: np.ndarray


def _companion_roots(p: np.ndarray) -> np.ndarray:
    """np.roots of every row of ``p`` (leading coefficient nonzero, no trailing zeros), batched:
    the same companion matrices and LAPACK call, so the same roots bit for bit."""
    n = p.shape[1]
    if n <= 1:
        return np.zeros((len(p), 0), complex)
    A = np.zeros((len(p), n - 1, n - 1))
    A[:, 0, :] = -p[:, 1:] / p[:, :1]
    if n > 2:
        A[:, np.arange(1, n - 1), np.arange(n - 2)] = 1.0
    return np.linalg.eigvals(A).astype(complex)


def _edge_zeros(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Leading and trailing zero counts of every row (rows with a nonzero entry)."""
    nz = c != 0
    lead = np.argmax(nz, axis=1)
    trail = np.argmax(nz[:, ::-1], axis=1)
    return lead, trail


def _groups_from_arrays(batch: DelayedLoopBatch) -> tuple[list[_Group], np.ndarray]:
    """Rows grouped by structure; returns the groups and the rows the kernel cannot take."""
    num, den = batch.num, batch.den
    nonzero_num = np.any(num != 0, axis=1)
    ln, tn = _edge_zeros(np.where(nonzero_num[:, None], num, 1.0))
    ld, td = _edge_zeros(den)
    sig = np.stack([ln, tn, ld, td], axis=1)
    # a zero numerator (L = 0) or a zero at the origin: the scalar path
    scalar = ~nonzero_num | (tn > 0)
    groups = []
    keys, inverse = np.unique(sig[~scalar], axis=0, return_inverse=True)
    rows_ok = np.nonzero(~scalar)[0]
    for g, (a, b, c, d) in enumerate(keys):
        rows = rows_ok[np.ravel(inverse) == g]
        pn = num[rows][:, a:num.shape[1] - b]
        pd_ = den[rows][:, c:den.shape[1] - d]
        gain = pn[:, 0] / pd_[:, 0]
        groups.append(_Group(rows, gain, _companion_roots(pn), _companion_roots(pd_), int(d), batch.delay[rows]))
    return groups, np.nonzero(scalar)[0]


def _groups_from_loops(loops: Sequence[DelayedLoop]) -> tuple[list[_Group], np.ndarray]:
    """Loops grouped by structure, from their already-factored rational parts."""
    by_sig: dict[tuple[int, int, int], list[int]] = {}
    scalar = []
    parts = []
    for i, lp in enumerate(loops):
        rat = lp._factored
        z0 = int(np.sum(rat.zeros == 0))
        origin = rat.poles == 0
        if rat.gain == 0 or z0:
            scalar.append(i)
            parts.append(None)
            continue
        parts.append((rat.gain, rat.zeros, rat.poles[~origin]))
        by_sig.setdefault((len(rat.zeros), int(np.sum(~origin)), int(np.sum(origin))), []).append(i)
    groups = []
    for (nz, npo, m0), rows in by_sig.items():
        zeros = np.array([parts[i][1] for i in rows], complex).reshape(len(rows), nz)
        poles = np.array([parts[i][2] for i in rows], complex).reshape(len(rows), npo)
        groups.append(_Group(np.array(rows), np.array([parts[i][0] for i in rows], float), zeros, poles, m0,
                             np.array([loops[i].delay for i in rows], float)))
    return groups, np.array(scalar, int)


# --- evaluation of L(j w) on 2-D arrays -----------------------------------------------------------

class _Loops:
    """Per-loop root parameters of a chunk, for evaluation on (loops x frequencies) arrays.

    For a root r = a + jb off the imaginary axis the factor (jw - r) has log-magnitude
    log(a^2 + (w - b)^2) / 2 and continuous phase atan((w - b)/|a|) (a < 0) or
    -pi - atan((w - b)/a) (a > 0) - the scalar path's definitions; an integrator contributes
    -log w and -pi/2."""

    def __init__(self, gain, zeros, poles, m0, delay):
        roots = np.concatenate([zeros, poles], axis=1)
        self.nz = zeros.shape[1]
        self.m0 = m0
        a, b = roots.real, roots.imag
        self.a, self.b = a, b
        self.a2 = a * a
        abs_a = np.abs(a)
        self.abs_a = abs_a
        with np.errstate(divide="ignore"):
            self.inv_abs_a = 1.0 / abs_a
        wt = np.concatenate([np.ones(zeros.shape[1]), -np.ones(poles.shape[1])])
        lhp = a < 0
        self.s = wt * np.where(lhp, 1.0, -1.0)          # weight of each atan term
        self.u = self.s * abs_a                         # numerator of each d(phase)/dw term
        self.log_gain = np.log(np.abs(gain))
        self.const = (np.where(gain >= 0, 0.0, math.pi) - m0 * 0.5 * math.pi
                      + (wt * np.where(lhp, 0.0, -math.pi)).sum(axis=1))
        self.delay = delay
        self.gain = gain
        self.zeros, self.poles = zeros, poles

    @property
    def n_roots(self) -> int:
        return self.a.shape[1]

    def evaluate(self, w: np.ndarray, rows=None, second: bool = False, mag: bool = True, phase: bool = True):
        """(log|R|, phase, d log|R|/dw, d phase/dw[, second derivatives]) at w, shape (n, M), of
        loops ``rows`` (default all). The phase includes the delay. ``mag=False`` or
        ``phase=False`` skips that pair (returned as None)."""
        sel = slice(None) if rows is None else rows
        a2, b, ia, s, u = self.a2[sel], self.b[sel], self.inv_abs_a[sel], self.s[sel], self.u[sel]
        m = dm = ph = dph = d2m = d2ph = None
        if mag:
            prod = np.ones_like(w)     # prod q_zeros / prod q_poles: one log per point, not per root
            dm = np.zeros_like(w)
        if phase:
            ph = np.zeros_like(w)
            dph = np.zeros_like(w)
        if second:
            d2m = np.zeros_like(w)
            d2ph = np.zeros_like(w)
        t = np.empty_like(w)
        q = np.empty_like(w)
        for r in range(self.n_roots):
            zero = r < self.nz
            d = w - b[:, r, None]
            np.multiply(d, d, out=q)
            q += a2[:, r, None]
            if mag:
                if zero:
                    prod *= q
                else:
                    prod /= q
            np.reciprocal(q, out=q)                     # q is 1 / (a^2 + d^2) from here
            if mag:
                np.multiply(d, q, out=t)
                if zero:
                    dm += t
                else:
                    dm -= t
            if phase:
                np.multiply(d, ia[:, r, None], out=t)
                np.arctan(t, out=t)
                t *= s[:, r, None]
                ph += t
                np.multiply(q, u[:, r, None], out=t)
                dph += t
            if second:
                q2 = q * q
                np.multiply(d, d, out=t)
                np.subtract(a2[:, r, None], t, out=t)
                t *= q2
                if zero:
                    d2m += t
                else:
                    d2m -= t
                q2 *= d
                q2 *= 2.0 * u[:, r, None]
                d2ph -= q2
        if mag:
            m = np.log(prod)
            if not np.all(np.isfinite(m)):   # the product over- or underflowed: sum the logs instead
                m = np.zeros_like(w)
                for r in range(self.n_roots):
                    lq = np.log(a2[:, r, None] + (w - b[:, r, None]) ** 2)
                    m += lq if r < self.nz else -lq
            m *= 0.5
            m += self.log_gain[sel, None]
            if self.m0:
                m -= self.m0 * np.log(w)
                dm -= self.m0 / w
        if phase:
            ph += self.const[sel, None] - w * self.delay[sel, None]
            dph -= self.delay[sel, None]
        if second and self.m0:
            d2m += self.m0 / (w * w)
        if second:
            return m, ph, dm, dph, d2m, d2ph
        return m, ph, dm, dph

    def response(self, s: np.ndarray) -> np.ndarray:
        """R(s) at complex s, shape (n, M) (rational part, no delay)."""
        out = np.broadcast_to(self.gain[:, None], s.shape).astype(complex)
        for r in range(self.zeros.shape[1]):
            out = out * (s - self.zeros[:, r, None])
        for r in range(self.poles.shape[1]):
            out = out / (s - self.poles[:, r, None])
        if self.m0:
            out = out / s ** self.m0
        return out


def _solve(fun, a: np.ndarray, b: np.ndarray, fa: np.ndarray, fb: np.ndarray, iters: int = 100,
           xtol: float = 1e-13) -> np.ndarray:
    """Safeguarded Newton on flat arrays, evaluating only unconverged elements: a Newton step
    when it stays inside the bracket, else a false-position step from the bracket's ends (else
    bisection) - the scalar path's solver, but without its long bisection runs when the root
    sits near a bracket end of a convex function. ``fun(x, idx) -> (f, df)`` at x for elements
    ``idx``; ``fa``, ``fb`` = f(a), f(b) (known from the grid), of opposite sign; the first
    point is the false-position one. Stops when a step moves x by at most ``xtol`` relative
    (1e-13, the scalar path's, for crossings; extrema, whose derivative is all rounding near
    the root, use a looser one)."""
    a, b = np.array(a, float), np.array(b, float)
    if not len(a):
        return a
    fa, fb = np.array(fa, float), np.array(fb, float)
    x = a - fa * (b - a) / (fb - fa)
    x = np.where(np.isfinite(x) & (x > a) & (x < b), x, 0.5 * (a + b))
    act = np.arange(len(a))
    for _ in range(iters):
        xa = x[act]
        fx, dfx = fun(xa, act)
        faa, fbb = fa[act], fb[act]
        left = np.sign(fx) == np.sign(faa)
        aa = np.where(left, xa, a[act])
        bb = np.where(left, b[act], xa)
        faa = np.where(left, fx, faa)
        fbb = np.where(left, fbb, fx)
        fa[act], fb[act] = faa, fbb
        newton = xa - fx / dfx
        inside = np.isfinite(newton) & (newton > aa) & (newton < bb)
        width = bb - aa
        secant = aa - faa * width / (fbb - faa)
        sec_ok = np.isfinite(secant) & (secant > aa + 1e-3 * width) & (secant < bb - 1e-3 * width)
        xn = np.where(inside, newton, np.where(sec_ok, secant, 0.5 * (aa + bb)))
        # a Newton step below the resolution of x (it rounds onto a bracket end): converged
        tiny = np.abs(fx) <= xtol * np.abs(xa * dfx)
        done = (np.abs(xn - xa) <= xtol * np.abs(xa)) | tiny | (width <= max(4e-16, xtol) * np.abs(aa))
        a[act], b[act] = aa, bb
        x[act] = np.where(tiny, xa, xn)
        act = act[~done]
        if not len(act):
            break
    return x


def _rows_to_padded(row: np.ndarray, n_rows: int, *cols: np.ndarray, fill=math.nan):
    """Flat per-row values (sorted by row) into padded (n_rows, K) arrays and the counts."""
    counts = np.bincount(row, minlength=n_rows)
    k = int(counts.max(initial=0))
    start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    pos = np.arange(len(row)) - start[row]
    out = []
    for c, f in zip(cols, fill if isinstance(fill, tuple) else (fill,) * len(cols)):
        arr = np.full((n_rows, max(k, 1)), f, dtype=np.result_type(c, type(f)))
        arr[row, pos] = c
        out.append(arr)
    return counts, out


def _split_at_extrema(lp: _Loops, w, m, ph, dm, dph):
    """The grid with the extrema of log|R| and of the phase added wherever a derivative changes
    sign between two points (found by Newton on the derivative): between the points of the new
    grid both are monotone (given at most one extremum per old interval), so sign changes and
    level counts find every crossing."""
    n = len(w)
    wide = w[:, 1:] > w[:, :-1]
    rm, cm = np.nonzero((dm[:, :-1] * dm[:, 1:] < 0) & wide)
    rp, cp = np.nonzero((dph[:, :-1] * dph[:, 1:] < 0) & wide)
    if not len(rm) + len(rp):
        return w, m, ph, dm, dph
    row, col = np.concatenate([rm, rp]), np.concatenate([cm, cp])
    is_phase = np.concatenate([np.zeros(len(rm), bool), np.ones(len(rp), bool)])

    def fun(x, idx):
        _, _, dmx, dpx, d2m, d2p = lp.evaluate(x[:, None], row[idx], second=True)
        p = is_phase[idx]
        return np.where(p, dpx[:, 0], dmx[:, 0]), np.where(p, d2p[:, 0], d2m[:, 0])

    f = np.where(is_phase, dph[row, col], dm[row, col])
    f1 = np.where(is_phase, dph[row, col + 1], dm[row, col + 1])
    x = _solve(fun, w[row, col], w[row, col + 1], f, f1, xtol=1e-10)
    mx, px, dmx, dpx = lp.evaluate(x[:, None], row)
    o = np.argsort(row, kind="stable")
    # padding: copies of the first grid point (zero-width intervals, ignored downstream)
    _, (xe, me, pe, dme, dpe) = _rows_to_padded(row[o], n, x[o], mx[o, 0], px[o, 0], dmx[o, 0], dpx[o, 0])
    pad = np.isnan(xe)
    add = [np.where(pad, v[:, :1], e) for v, e in ((w, xe), (m, me), (ph, pe), (dm, dme), (dph, dpe))]
    # insert into the sorted rows: one flat searchsorted on keys row * 1e3 + log10(w)
    off = 1e3 * np.arange(n)[:, None]
    pos = np.searchsorted((off + np.log10(w)).ravel(), (off + np.log10(add[0])).ravel())
    return tuple(np.insert(v.ravel(), pos, e.ravel()).reshape(n, -1) for v, e in zip((w, m, ph, dm, dph), add))


def _level_crossings(w: np.ndarray, ph: np.ndarray):
    """Brackets [w_i, w_i+1] and levels 2 pi n - pi crossed by the phase between grid points
    (counted exactly where the phase is monotone between them), as flat arrays (row, i, level),
    and the count per interval."""
    q = (ph + math.pi) / (2.0 * math.pi)
    q0, q1 = q[:, :-1], q[:, 1:]
    lo_n = np.floor(np.minimum(q0, q1)) + 1
    hi_n = np.floor(np.maximum(q0, q1))
    ok = (np.abs(q1 - q0) > 1e-9) & (w[:, 1:] > w[:, :-1])
    count = np.where(ok, np.maximum(hi_n - lo_n + 1, 0), 0).astype(int)
    flat = count.ravel()
    idx = np.repeat(np.arange(flat.size), flat)
    first = np.repeat(np.cumsum(flat) - flat, flat)
    n = lo_n.ravel()[idx] + (np.arange(flat.sum()) - first)
    row, col = np.divmod(idx, count.shape[1])
    return row, col, 2.0 * math.pi * n - math.pi, count


# --- the kernel ---------------------------------------------------------------------------------

#: Why a loop went to the scalar path (``MarginsBatch.fallback_reason``); index 0 = it did not.
_REASONS = ["", "zero at s = 0 or zero gain", "root on the imaginary axis", "not strictly proper",
            "no closing radius", "closed-loop pole at an integrator", "too many phase crossings", "crossing on -1",
            "indentation end on the negative real axis", "negative pole count", "gain margin undecided",
            "reported crossings incomplete", "|1 + L| near 0 or too many delay points"]


def _fail(why: np.ndarray, mask: np.ndarray, reason: str) -> None:
    """Mark loops ``mask`` for the scalar path with ``reason`` (the first reason found is kept)."""
    why[(why == 0) & mask] = _REASONS.index(reason)

@dataclass
class _ChunkResult:
    why: np.ndarray                  # 0, or the index in _REASONS of why the scalar path must decide
    gm: np.ndarray
    lgm: np.ndarray
    pm: np.ndarray
    dm: np.ndarray
    ms: np.ndarray
    w_ms: np.ndarray
    P: np.ndarray
    Z: np.ndarray
    gc: tuple            # (counts, freq, pm, dm) padded
    pc: tuple            # (counts, freq, k, change) padded


def _kernel(gain, zeros, poles, m0: int, delay) -> _ChunkResult:
    """Verdict and margins of one chunk of loops of one structure (see the module docstring).
    inf and NaN are expected on the way (padding, integrators at w = 0): no warnings."""
    with np.errstate(all="ignore"):
        return _kernel_chunk(gain, zeros, poles, m0, delay)


def _kernel_chunk(gain, zeros, poles, m0: int, delay) -> _ChunkResult:
    n = len(gain)
    lp = _Loops(gain, zeros, poles, m0, delay)
    roots = np.concatenate([zeros, poles], axis=1)
    why = np.zeros(n, int)
    # roots on or next to the imaginary axis (other than the integrators split off): the scalar path
    on_axis = np.abs(roots.real) <= 1e-6 * np.abs(roots)
    _fail(why, np.any(on_axis, axis=1), "root on the imaginary axis")
    rel_deg = poles.shape[1] + m0 - zeros.shape[1]
    if rel_deg <= 0:
        _fail(why, np.ones(n, bool), "not strictly proper")
    P = np.sum(poles.real > 0, axis=1)
    # --- scales, closing radius, indentation (as the scalar path) -----------------------------
    mags = np.abs(roots)
    has_delay = delay > 0
    with np.errstate(divide="ignore"):
        inv_delay = np.where(has_delay, 1.0 / np.where(has_delay, delay, 1.0), np.nan)
    allm = np.concatenate([np.where(mags > 0, mags, np.nan), inv_delay[:, None]], axis=1)
    empty = np.all(np.isnan(allm), axis=1)
    s_min = np.where(empty, 1.0, np.nanmin(np.where(empty[:, None], 1.0, allm), axis=1))
    s_max = np.where(empty, 1.0, np.nanmax(np.where(empty[:, None], 1.0, allm), axis=1))
    # closing radius: |R(s)| <= 1/2 for |s| >= r (strictly proper: the same target with or without delay)
    pm_abs = np.abs(poles)
    zm_abs = np.abs(zeros)
    r = 2.0 * np.maximum(pm_abs.max(axis=1, initial=0.0), 1e-300)
    r = np.maximum(r, 1e-12)
    target = math.log(0.5)
    w_close = np.full(n, np.nan)
    todo = np.ones(n, bool)
    for _ in range(400):
        with np.errstate(divide="ignore", invalid="ignore"):
            bound = (lp.log_gain + np.log(r[:, None] + zm_abs).sum(axis=1)
                     - np.log(r[:, None] - pm_abs).sum(axis=1) - m0 * np.log(r))
        hit = todo & (bound <= target)
        w_close[hit] = r[hit]
        todo &= ~hit
        if not todo.any():
            break
        r = np.where(todo, 2.0 * r, r)
    _fail(why, todo, "no closing radius")
    # the integrators' indentation radius: shrink until |L| > 2 on the circle (Rouche)
    w_start = 1e-3 * s_min
    if m0:
        d_other = mags.min(axis=1, initial=math.inf)
        rho = np.maximum(0.01 * np.minimum(d_other, s_min), 0.0)
        th = np.linspace(0, 2 * math.pi, 33)[:-1]
        todo = np.ones(n, bool)
        for _ in range(40):
            s = rho[:, None] * np.exp(1j * th)[None, :]
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                small = np.any(np.abs(lp.response(s)) * np.exp(-rho * delay)[:, None] < 2.0, axis=1)
            todo &= small
            if not todo.any():
                break
            marginal = todo & (rho < 1e-9 * s_min)
            _fail(why, marginal, "closed-loop pole at an integrator")
            todo &= ~marginal
            rho = np.where(todo, rho / 10.0, rho)
        w_start = rho
    lo = np.minimum(1e-3 * s_min, w_start) if m0 else w_start
    hi = np.maximum(np.maximum(1e3 * s_max, 2.0 * np.nan_to_num(w_close)), 10.0 * lo)
    # --- the grid --------------------------------------------------------------------------------
    decades = np.log10(hi / w_start)
    n_log = int(math.ceil(_DECADE_POINTS * np.nanmax(np.where(why == 0, decades, 1.0), initial=1.0))) + 1
    t = np.linspace(0.0, 1.0, n_log)
    parts = [w_start[:, None] * (hi / w_start)[:, None] ** t[None, :]]
    th = np.linspace(-0.5 * math.pi, 0.5 * math.pi, _ROOT_POINTS + 2)[1:-1]
    if roots.shape[1]:
        pts = (roots.imag[:, :, None] + np.abs(roots.real)[:, :, None] * np.tan(th)[None, None, :]).reshape(n, -1)
        parts.append(np.where((pts > w_start[:, None]) & (pts < hi[:, None]), pts, w_start[:, None]))
        # lightly damped roots (|a| < b/20): the tan points span only b +/- 10 |a|; |1 + L| can dip
        # just beyond, where the log grid is coarse: points at b +/- |a| 2^k, k >= 4, up to b/2
        bb, aa = roots.imag, np.abs(roots.real)
        light = (bb > 0) & (aa > 0) & (aa < 0.05 * bb)
        if light.any():
            with np.errstate(over="ignore", divide="ignore"):   # a subnormal damping: b / 32|a| = inf
                spread = float(np.max(bb[light] / (32.0 * aa[light])))
            k_max = int(np.ceil(np.log2(spread))) + 1 if math.isfinite(spread) else 24
            off = aa[:, :, None] * 2.0 ** (4 + np.arange(min(k_max, 24)))[None, None, :]
            ok_ = light[:, :, None] & (off < 0.5 * bb[:, :, None])
            for sign in (-1.0, 1.0):
                q = (bb[:, :, None] + sign * off).reshape(n, -1)
                parts.append(np.where(ok_.reshape(n, -1) & (q > w_start[:, None]) & (q < hi[:, None]), q,
                                      w_start[:, None]))
    w = np.sort(np.concatenate(parts, axis=1), axis=1)
    w[:, -1] = hi  # (rounding of the power)
    m, ph, dm, dph = lp.evaluate(w)
    w, m, ph, dm, dph = _split_at_extrema(lp, w, m, ph, dm, dph)
    G = w.shape[1]
    # --- gain crossovers: sign changes of log|R| -------------------------------------------------
    with np.errstate(invalid="ignore"):
        # half-open intervals (w_i, w_i+1], as in the scalar path: a crossing on a grid point counts once
        sc = (np.sign(m[:, :-1]) != np.sign(m[:, 1:])) & (m[:, :-1] != 0) & np.isfinite(m[:, :-1]) \
            & np.isfinite(m[:, 1:]) & (w[:, 1:] > w[:, :-1])
    row, col = np.nonzero(sc)

    def mag_fun(x, idx):
        mm, _, dmm, _ = lp.evaluate(x[:, None], row[idx], phase=False)
        return mm[:, 0], dmm[:, 0]

    with np.errstate(all="ignore"):
        wc = _solve(mag_fun, w[row, col], w[row, col + 1], m[row, col], m[row, col + 1])
        _, ph_c, _, _ = lp.evaluate(wc[:, None], row, mag=False) if len(wc) else (None, np.zeros((0, 1)), None, None)
    ph_c = ph_c[:, 0]
    deg = np.degrees(np.mod(ph_c + math.pi, 2.0 * math.pi))
    deg = np.where(deg <= 0.0, 360.0, deg)
    pm_i = np.where(deg <= 180.0, deg, deg - 360.0)
    dm_i = np.radians(deg) / wc
    gc_counts, (gc_w, gc_pm, gc_dm) = _rows_to_padded(row, n, wc, pm_i, dm_i)
    # --- phase crossings up to W (the walk's set and the reported set) ---------------------------
    def last_next(mask):
        """The grid point after the last one where ``mask`` holds (w_start if none)."""
        any_ = mask.any(axis=1)
        last = G - 1 - np.argmax(mask[:, ::-1], axis=1)
        return np.where(any_, w[np.arange(n), np.minimum(last + 1, G - 1)], w_start)

    w_mono = last_next(dm >= 0)
    w_one = last_next(m >= 0)
    w_rep = last_next(m >= math.log(1.0 / _K_REPORT))
    # the walk needs every crossing up to W_core (the scalar path's w_end: beyond it |R| < 1 and
    # falls); the report those with gain factor up to 1e3 (|R| >= 1e-3): W
    turn = 4.0 * math.pi * np.nan_to_num(inv_delay)
    W_core = np.maximum(w_mono, w_one) + turn
    W = np.where(has_delay, np.maximum(W_core, w_rep + turn), hi)
    # beyond the grid: log points to W (the rational part is monotone there)
    tail_t = np.linspace(0.0, 1.0, 17)[1:]
    beyond = W > hi
    tail = np.where(beyond[:, None], hi[:, None] * (np.maximum(W, hi) / hi)[:, None] ** tail_t[None, :], W[:, None])
    wx = np.concatenate([np.minimum(w, W[:, None]), tail], axis=1)
    clip = w > W[:, None]
    mW, phW, _, _ = lp.evaluate(W[:, None])
    mt, pt, _, _ = lp.evaluate(tail)
    phx = np.concatenate([np.where(clip, phW, ph), pt], axis=1)
    mx = np.concatenate([np.where(clip, mW, m), mt], axis=1)
    # sup log|R| beyond W (grid points past it; past the grid the rational part only falls)
    sup_beyond = np.maximum(np.max(np.where(clip, m, -np.inf), axis=1), mW[:, 0])
    sup_beyond = np.where(beyond, mt[:, -1], sup_beyond)
    row_x, col_x, level, count = _level_crossings(wx, phx)
    # more crossings than _MAX_CROSSINGS (a long delay over a wide band): stop at the interval
    # where the count passes it, if that is beyond W_core; the report's completeness is checked below
    cum = np.cumsum(count, axis=1)
    over = cum > _MAX_CROSSINGS
    trunc = over.any(axis=1)
    j0 = np.where(trunc, np.argmax(over, axis=1), wx.shape[1] - 1)
    W_eff = wx[np.arange(n), j0]
    _fail(why, trunc & ~(W_eff >= W_core), "too many phase crossings")
    keep = col_x < j0[row_x]
    row_x, col_x, level = row_x[keep], col_x[keep], level[keep]
    sup_trunc = np.max(np.where(np.arange(wx.shape[1])[None, :] >= j0[:, None], mx, -np.inf), axis=1)
    sup_beyond = np.where(trunc, np.maximum(sup_beyond, sup_trunc), sup_beyond)
    # k_valid: the set holds every crossing with gain factor <= k_valid
    k_valid = np.where(has_delay, np.exp(-sup_beyond), np.inf)

    def phase_fun(x, idx):
        _, pp, _, dpp = lp.evaluate(x[:, None], row_x[idx], mag=False)
        return pp[:, 0] - level[idx], dpp[:, 0]

    with np.errstate(all="ignore"):
        xc = _solve(phase_fun, wx[row_x, col_x], wx[row_x, col_x + 1], phx[row_x, col_x] - level,
                    phx[row_x, col_x + 1] - level)
        if len(xc):
            mc, _, _, dpc = lp.evaluate(xc[:, None], row_x)
            mc, dpc = mc[:, 0], dpc[:, 0]
        else:
            mc = dpc = np.zeros(0)
    kc = np.exp(-mc)
    chc = -2 * np.sign(dpc).astype(int)
    cross = (row_x, xc, dpc)
    # w = 0: L(0) < 0 is a crossing (no integrator; the scalar path's rule)
    if not m0:
        with np.errstate(all="ignore"):
            L0 = lp.response(np.zeros((n, 1)))[:, 0].real
            _, _, _, dp0 = lp.evaluate(np.zeros((n, 1)), mag=False)
        slope = dp0[:, 0]
        at0 = (L0 < 0) & (slope != 0)
        r0 = np.nonzero(at0)[0]
        row_x = np.concatenate([row_x, r0])
        xc = np.concatenate([xc, np.zeros(len(r0))])
        kc = np.concatenate([kc, -1.0 / L0[r0]])
        chc = np.concatenate([chc, np.where(slope[r0] < 0, 1, -1)])
    # a crossing on -1 (a closed-loop pole on the axis): the scalar path
    with np.errstate(divide="ignore"):
        near = np.abs(1.0 - 1.0 / kc) < _NEAR_MINUS_ONE
    _fail(why, np.isin(np.arange(n), row_x[near]), "crossing on -1")
    # --- the crossings as padded rows, merged where they share a gain (scalar: _all_phase_crossings)
    order = np.lexsort((kc, row_x))
    row_x, xc, kc, chc = row_x[order], xc[order], kc[order], chc[order]
    counts, (K, F, C) = _rows_to_padded(row_x, n, kc, xc, chc.astype(float), fill=(math.inf, math.nan, 0.0))
    valid = np.isfinite(K)
    # groups: consecutive (sorted) gains within 1e-9 relative act together (net change at the first)
    brk = np.ones_like(valid)
    brk[:, 1:] = ~(np.diff(K, axis=1) <= 1e-9 * K[:, 1:])
    gid = np.cumsum(brk, axis=1) - 1
    net = np.zeros_like(C)
    np.add.at(net, (np.repeat(np.arange(n), K.shape[1]), gid.ravel()), C.ravel())
    C = np.where(brk & valid, np.take_along_axis(net, gid, axis=1), 0.0)
    merged = brk & valid & (C != 0)
    K = np.where(merged, K, np.inf)
    F = np.where(merged, F, np.nan)
    C = np.where(merged, C, 0.0)
    # --- the verdict: Z(1) = P + N_arc + sum of changes below gain 1 ------------------------------
    n_arc = np.zeros(n, int)
    if m0:
        phe = ph[:, 0]                                   # phase at the indentation's top, j w_start
        real = math.pi * np.round((phe + m0 * 0.5 * math.pi) / math.pi)
        ph_s = 2.0 * real - phe                          # ... and at its bottom (mirror image)
        qe, qs = (phe + math.pi) / (2 * math.pi), (ph_s + math.pi) / (2 * math.pi)
        n_arc = (np.floor(qs) - np.floor(qe)).astype(int)
        # an end on the negative real axis, or a phase far from the integrators' asymptote
        _fail(why, ~((np.abs(qe - np.round(qe)) > 1e-9) & (np.abs(phe + m0 * 0.5 * math.pi - real) < 0.25 * math.pi)),
              "indentation end on the negative real axis")
    Z = P + n_arc + np.sum(np.where(K < 1.0, C, 0.0), axis=1).astype(int)
    _fail(why, Z < 0, "negative pole count")
    z1 = Z[:, None]
    # --- the walk (scalar: _walk): gain factors nearest 1 where the verdict changes --------------
    up = (K > 1.0) & (K <= k_valid[:, None])
    Ku = np.where(up, K, np.inf)
    o = np.argsort(Ku, axis=1)
    Ku, Cu = np.take_along_axis(Ku, o, axis=1), np.take_along_axis(np.where(up, C, 0.0), o, axis=1)
    zu = z1 + np.cumsum(Cu, axis=1)
    flip = ((zu == 0) != (z1 == 0)) & np.isfinite(Ku)
    has_up = flip.any(axis=1)
    first = np.argmax(flip, axis=1)
    gm = np.where(has_up, Ku[np.arange(n), first], np.nan)
    before = np.arange(Ku.shape[1])[None, :] <= np.where(has_up, first, Ku.shape[1])[:, None]
    _fail(why, np.any((zu < 0) & before & np.isfinite(Ku), axis=1), "negative pole count")
    z_valid = Z + np.sum(Cu, axis=1).astype(int)
    dn = K < 1.0
    Kd = np.where(dn, K, -np.inf)
    o = np.argsort(-Kd, axis=1)
    Kd, Cd = np.take_along_axis(Kd, o, axis=1), np.take_along_axis(np.where(dn, C, 0.0), o, axis=1)
    zd = z1 - np.cumsum(Cd, axis=1)
    flip = ((zd == 0) != (z1 == 0)) & np.isfinite(Kd)
    has_dn = flip.any(axis=1)
    first = np.argmax(flip, axis=1)
    lgm = np.where(has_dn, Kd[np.arange(n), first], 0.0)
    before = np.arange(Kd.shape[1])[None, :] <= np.where(has_dn, first, Kd.shape[1])[:, None]
    _fail(why, np.any((zd < 0) & before & np.isfinite(Kd), axis=1), "negative pole count")
    # undecided above: no delay -> inf; unstable loops that stay unstable -> inf; else scalar
    und = ~has_up
    gm = np.where(und & ~has_delay, np.inf, gm)
    cand = np.nonzero(und & has_delay & (Z != 0) & (why == 0))[0]
    if len(cand):
        tl = W[cand, None] * np.logspace(0.0, 8.0, 400)[None, :]
        with np.errstate(all="ignore"):
            _, _, _, dpt = lp.evaluate(tl, cand, mag=False)
        falls = np.max(dpt, axis=1) < 0
        rest = np.isfinite(K[cand]) & (K[cand] > k_valid[cand, None])
        Kr = np.where(rest, K[cand], np.inf)
        o = np.argsort(Kr, axis=1)
        steps = np.take_along_axis(np.where(rest, C[cand], 0.0), o, axis=1)
        lowest = np.minimum(np.cumsum(steps, axis=1).min(axis=1, initial=0.0), 0.0)
        stays = falls & (z_valid[cand] + lowest > 0)
        gm[cand[stays]] = np.inf
    _fail(why, np.isnan(gm), "gain margin undecided")
    # --- reported phase crossings: k <= 1e3 (or the one setting gm), by frequency, at most 32 ----
    sel = np.isfinite(K) & ((K <= _K_REPORT) | np.isclose(K, gm[:, None], rtol=1e-12))
    complete = ~has_delay | (k_valid > _K_REPORT) | (np.sum(np.isfinite(F) & (K <= _K_REPORT), axis=1) >= _N_REPORT)
    _fail(why, ~complete, "reported crossings incomplete")
    Fs = np.where(sel, F, np.inf)
    o = np.argsort(Fs, axis=1, kind="stable")[:, :_N_REPORT]
    pc_w = np.take_along_axis(Fs, o, axis=1)
    pc_k = np.take_along_axis(K, o, axis=1)
    pc_c = np.take_along_axis(C, o, axis=1)
    pc_n = np.sum(np.isfinite(pc_w), axis=1)
    # --- sensitivity peak ------------------------------------------------------------------------
    ms, w_ms, near_one = _sensitivity_peak(lp, w, m, ph, dm, dph, cross, has_delay, inv_delay, w_start)
    _fail(why, near_one, "|1 + L| near 0 or too many delay points")
    stable = (Z == 0)
    # --- phase and delay margins -----------------------------------------------------------------
    pm = np.where(gc_counts > 0, np.take_along_axis(gc_pm, np.argmin(np.where(np.isnan(gc_pm), np.inf,
                                                                              np.abs(gc_pm)), axis=1)[:, None],
                                                    axis=1)[:, 0], np.inf)
    dmin = np.where(gc_counts > 0, np.nanmin(np.where(np.isnan(gc_dm), np.inf, gc_dm), axis=1), np.inf)
    dm_loop = np.where(stable, dmin, 0.0)
    return _ChunkResult(why, gm, lgm, pm, dm_loop, ms, w_ms, P, Z, (gc_counts, gc_w, gc_pm, gc_dm),
                        (pc_n, pc_w, pc_k, pc_c))


def _f2_and_slope(m, ph, dm, dph):
    """|1 + L|^2 and its derivative in w from log|L|, arg L and their derivatives."""
    E = np.exp(m)
    c, s = np.cos(ph), np.sin(ph)
    return 1.0 + 2.0 * E * c + E * E, 2.0 * E * (dm * (c + E) - dph * s)


def _row_min(r: np.ndarray, val: np.ndarray, x: np.ndarray):
    """Per row present in ``r``: the smallest ``val`` and its ``x`` (rows, values, xs)."""
    o = np.lexsort((val, r))
    r2 = r[o]
    first = np.concatenate([[True], r2[1:] != r2[:-1]]) if len(r2) else np.zeros(0, bool)
    return r2[first], val[o][first], x[o][first]


def _sensitivity_peak(lp: _Loops, w, m, ph, dm, dph, cross, has_delay, inv_delay, w_start):
    """(Ms, its frequency, undecidable) per loop: the deepest local minimum of |1 + L(j w)|,
    bracketed by sign changes of d|1 + L|^2/dw on the grid, on delay points (every pi/8 of
    delay phase where |R| >= 1/2) and around each phase crossing (where a fast-turning delay
    puts a minimum the grid cannot resolve), the three deepest per loop refined by Newton;
    against the limits w -> 0 and inf as the scalar path."""
    n, G = w.shape
    ar = np.arange(n)
    br_r, br_lo, br_hi, br_depth, br_flo, br_fhi = [], [], [], [], [], []

    def depth(x0, x1, f0, f1, d0, d1):
        # two ranks per bracket: the lower end, and the lower of the minima of the parabolas
        # through each end with the bracket's mean curvature (a wide bracket on a coarse grid can
        # hide a minimum far below both ends; near a resonance that estimate can be far too low)
        c = (d1 - d0) / (x1 - x0)
        ends = np.minimum(f0, f1)
        return np.stack([ends, np.minimum(ends, np.minimum(f0 - d0 * d0 / (2 * c), f1 - d1 * d1 / (2 * c)))], axis=1)

    def brackets_2d(ww, F2, D, valid=None):
        br = (D[:, :-1] < 0) & (D[:, 1:] >= 0) & (ww[:, 1:] > ww[:, :-1])
        if valid is not None:
            br &= valid[:, :-1] & valid[:, 1:]
        r, c = np.nonzero(br)
        br_r.append(r)
        br_lo.append(ww[r, c])
        br_hi.append(ww[r, c + 1])
        br_depth.append(depth(ww[r, c], ww[r, c + 1], F2[r, c], F2[r, c + 1], D[r, c], D[r, c + 1]))
        br_flo.append(D[r, c])
        br_fhi.append(D[r, c + 1])

    F2, D = _f2_and_slope(m, ph, dm, dph)
    i = np.argmin(F2, axis=1)
    best, w_best = F2[ar, i], w[ar, i]
    brackets_2d(w, F2, D)
    # delay points every pi/8 of delay phase up to the grid point after the last with |R| >= 1/2
    hot = m >= math.log(0.5)
    last = G - 1 - np.argmax(hot[:, ::-1], axis=1)
    w_hot = np.where(hot.any(axis=1) & has_delay, w[ar, np.minimum(last + 1, G - 1)], w_start)
    step = _DELAY_STEP_RAD * np.nan_to_num(inv_delay)
    cnt = np.where(has_delay & (w_hot > w_start), np.ceil((w_hot - w_start) / np.where(step > 0, step, 1.0)) + 1, 0)
    over = cnt > _MAX_DELAY_POINTS
    cnt = np.where(over, 0, cnt).astype(int)
    k = int(cnt.max(initial=0))
    if k > 0:
        j = np.arange(k)[None, :]
        valid = j < cnt[:, None]
        dp = np.where(valid, np.minimum(w_start[:, None] + j * step[:, None], w_hot[:, None]), w_start[:, None])
        F2d, Dd = _f2_and_slope(*lp.evaluate(dp))
        F2d = np.where(valid, F2d, np.inf)
        i = np.argmin(F2d, axis=1)
        better = F2d[ar, i] < best
        best, w_best = np.where(better, F2d[ar, i], best), np.where(better, dp[ar, i], w_best)
        brackets_2d(dp, F2d, Dd, valid)
    # around each phase crossing: a quarter turn of the phase (at most 5 %) either side
    rc, xc, dpc = cross
    if len(xc):
        h = np.minimum(0.25 * math.pi / np.abs(dpc), 0.05 * xc)
        pts = np.stack([xc - h, xc, xc + h], axis=1)
        F2c, Dc = _f2_and_slope(*lp.evaluate(pts, rc))
        rr, vv, xx = _row_min(rc, F2c[:, 1], xc)
        better = vv < best[rr]
        best[rr[better]], w_best[rr[better]] = vv[better], xx[better]
        for a, b in ((0, 1), (1, 2)):
            sel = (Dc[:, a] < 0) & (Dc[:, b] >= 0)
            br_r.append(rc[sel])
            br_lo.append(pts[sel, a])
            br_hi.append(pts[sel, b])
            br_depth.append(depth(pts[sel, a], pts[sel, b], F2c[sel, a], F2c[sel, b], Dc[sel, a], Dc[sel, b]))
            br_flo.append(Dc[sel, a])
            br_fhi.append(Dc[sel, b])
    # the three deepest brackets of each loop by either rank, refined
    r = np.concatenate(br_r)
    lo, hi, rank = np.concatenate(br_lo), np.concatenate(br_hi), np.concatenate(br_depth)
    flo, fhi = np.concatenate(br_flo), np.concatenate(br_fhi)
    top = np.zeros(len(r), bool)
    for col in range(2):
        o = np.lexsort((rank[:, col], r))
        start = np.searchsorted(r[o], r[o], side="left")
        top[o[(np.arange(len(r)) - start) < 3]] = True
    r, lo, hi, flo, fhi = r[top], lo[top], hi[top], flo[top], fhi[top]

    def dfun(x, idx):
        mx, px, dmx, dpx, d2m, d2p = (v[:, 0] for v in lp.evaluate(x[:, None], r[idx], second=True))
        Ex = np.exp(mx)
        cx, sx = np.cos(px), np.sin(px)
        h = dmx * (cx + Ex) - dpx * sx
        dh = d2m * (cx + Ex) + dmx * (-sx * dpx + Ex * dmx) - d2p * sx - dpx * dpx * cx
        return 2.0 * Ex * h, 2.0 * Ex * (dmx * h + dh)

    if len(r):
        xr = _solve(dfun, lo, hi, flo, fhi, xtol=1e-10)
        F2r, _ = _f2_and_slope(*(v[:, 0] for v in lp.evaluate(xr[:, None], r)))
        rr, vv, xx = _row_min(r, F2r, xr)
        better = vv < best[rr]
        best[rr[better]], w_best[rr[better]] = vv[better], xx[better]
    best_abs = np.sqrt(np.maximum(best, 0.0))
    best_ms = 1.0 / best_abs
    undecidable = (best_abs < _NEAR_MINUS_ONE) | over
    # the limits: |S| -> 1 at w -> inf (strictly proper); at w -> 0, 1/|1 + R(0)| (0 with integrators)
    s_inf = 1.0
    s_zero = np.zeros(n) if lp.m0 else 1.0 / np.abs(1.0 + lp.response(np.zeros((n, 1)))[:, 0])
    at_inf = s_inf >= best_ms * (1 - 1e-9)
    at_zero = ~at_inf & (s_zero >= best_ms * (1 - 1e-9))
    ms = np.where(at_inf, s_inf, np.where(at_zero, s_zero, best_ms))
    w_ms = np.where(at_inf, np.inf, np.where(at_zero, 0.0, w_best))
    return ms, w_ms, undecidable


# --- results ------------------------------------------------------------------------------------

_SUMMARY = ("gain_margin", "lower_gain_margin", "phase_margin_deg", "delay_margin_s", "ms",
            "ms_frequency_rad_s", "open_loop_rhp_poles", "closed_loop_rhp_poles", "crossover_rad_s")


@dataclass(frozen=True, eq=False)
class MarginsBatch:
    """Verdicts and margins of a batch of loops, one entry per loop (definitions in
    ``controllers/stability.py``); ``batch[i]`` is loop i's :class:`Margins`.

    Parameters
    ----------
    gain_margin, lower_gain_margin : numpy.ndarray
        Two-sided gain margins (factors; inf / 0 where the verdict never changes).
    phase_margin_deg : numpy.ndarray
        PM of smallest magnitude per loop (deg; inf without a gain crossover).
    delay_margin_s : numpy.ndarray
        Delay margin per loop (s; 0 if unstable, inf without a gain crossover).
    ms, ms_frequency_rad_s : numpy.ndarray
        Sensitivity peak and where it is attained (rad/s; 0 or inf at a limit).
    open_loop_rhp_poles, closed_loop_rhp_poles : numpy.ndarray of int
        P and Z = N + P of the Nyquist count.
    gain_crossings : tuple of numpy.ndarray
        (count, frequency, PM_i, DM_i): each loop's gain crossovers, padded with NaN, shape
        (n_loops, k).
    phase_crossings : tuple of numpy.ndarray
        (count, frequency, gain factor, Z change): each loop's reported phase crossings, padded.
    fallback : numpy.ndarray of bool
        Loops computed by the scalar path (outside the batch kernel's reach, or where its result
        would not be certain).
    names : tuple of str
        The loops' labels.
    fallback_reason : numpy.ndarray of str
        Why each fallback loop went to the scalar path ("" for the others).
    """

    gain_margin: np.ndarray
    lower_gain_margin: np.ndarray
    phase_margin_deg: np.ndarray
    delay_margin_s: np.ndarray
    ms: np.ndarray
    ms_frequency_rad_s: np.ndarray
    open_loop_rhp_poles: np.ndarray
    closed_loop_rhp_poles: np.ndarray
    gain_crossings: tuple
    phase_crossings: tuple
    fallback: np.ndarray
    names: tuple[str, ...] = ()
    fallback_reason: np.ndarray | None = None
    _scalar: dict = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.gain_margin)

    @property
    def stable(self) -> np.ndarray:
        """Nyquist verdict per loop: no closed-loop pole in the closed right half-plane."""
        return (self.closed_loop_rhp_poles == 0) & np.isfinite(self.ms)

    @property
    def crossover_rad_s(self) -> np.ndarray:
        """The lowest gain crossover per loop (NaN without one)."""
        n, w = self.gain_crossings[0], self.gain_crossings[1]
        return np.where(n > 0, w[:, 0], np.nan)

    @property
    def fallback_count(self) -> int:
        """How many loops the scalar path computed."""
        return int(np.sum(self.fallback))

    def meets(self, gm_floor: float = 2.0, pm_floor_deg: float = 45.0) -> np.ndarray:
        """:meth:`Margins.meets` per loop.

        Parameters
        ----------
        gm_floor : float
            The gain must be able to grow by this factor and shrink by its inverse.
        pm_floor_deg : float
            Least |PM| at every gain crossover (deg).

        Returns
        -------
        numpy.ndarray of bool
        """
        return (self.stable & (self.gain_margin >= gm_floor) & (self.lower_gain_margin <= 1.0 / gm_floor)
                & (np.abs(self.phase_margin_deg) >= pm_floor_deg))

    def __getitem__(self, i: int) -> Margins:
        i = int(i)
        if i in self._scalar:
            return self._scalar[i]
        gn, gw, gp, gd = self.gain_crossings
        rows = tuple(GainCrossing(float(gw[i, j]), float(gp[i, j]), float(gd[i, j])) for j in range(int(gn[i])))
        pn, pw, pk, pc = self.phase_crossings
        prow = tuple(PhaseCrossing(float(pw[i, j]), float(pk[i, j]), int(pc[i, j])) for j in range(int(pn[i])))
        return Margins(float(self.gain_margin[i]), float(self.phase_margin_deg[i]), float(self.delay_margin_s[i]),
                       float(self.ms[i]), tuple(r.frequency_rad_s for r in rows),
                       tuple(r.frequency_rad_s for r in prow), "exact",
                       lower_gain_margin=float(self.lower_gain_margin[i]),
                       open_loop_rhp_poles=int(self.open_loop_rhp_poles[i]),
                       closed_loop_rhp_poles=int(self.closed_loop_rhp_poles[i]),
                       ms_frequency_rad_s=float(self.ms_frequency_rad_s[i]), gain_crossings=rows,
                       phase_crossings=prow)

    def to_list(self) -> list[Margins]:
        """Every loop's :class:`Margins`, in order.

        Returns
        -------
        list of Margins
        """
        return [self[i] for i in range(len(self))]

    def to_dicts(self) -> list[dict]:
        """Every loop's :meth:`Margins.to_dict`, in order (built from the arrays, without a
        :class:`Margins` object per loop).

        Returns
        -------
        list of dict
        """
        keys = ("gain_margin", "phase_margin_deg", "delay_margin_s", "ms")
        head = list(zip(*(getattr(self, k).tolist() for k in keys)))
        tail = list(zip(self.lower_gain_margin.tolist(), self.open_loop_rhp_poles.tolist(),
                        self.closed_loop_rhp_poles.tolist(), self.ms_frequency_rad_s.tolist()))
        stable = self.stable.tolist()
        gn, gw, gp, gd = (x.tolist() for x in self.gain_crossings)
        pn, pw, pk, pc = (x.tolist() for x in self.phase_crossings)
        out = []
        for i in range(len(self)):
            if i in self._scalar:
                out.append(self._scalar[i].to_dict())
                continue
            ng, npc = gn[i], pn[i]
            gwi, pwi = gw[i][:ng], pw[i][:npc]
            d = dict(zip(keys, head[i]))
            d["gain_crossovers_rad_s"] = tuple(gwi)
            d["phase_crossovers_rad_s"] = tuple(pwi)
            d["method"] = "exact"
            (d["lower_gain_margin"], d["open_loop_rhp_poles"], d["closed_loop_rhp_poles"],
             d["ms_frequency_rad_s"]) = tail[i]
            d["gain_crossings"] = tuple({"frequency_rad_s": a, "phase_margin_deg": b, "delay_margin_s": c}
                                        for a, b, c in zip(gwi, gp[i], gd[i]))
            d["phase_crossings"] = tuple({"frequency_rad_s": a, "gain_factor": b, "rhp_change": int(c)}
                                         for a, b, c in zip(pwi, pk[i], pc[i]))
            d["stable"] = stable[i]
            out.append(d)
        return out

    def to_pandas(self) -> pd.DataFrame:
        """One row per loop: name, verdict, both gain margins, PM, delay margin, Ms and where,
        P, Z, the lowest crossover and whether the scalar path computed it.

        Returns
        -------
        pandas.DataFrame
        """
        d = {"name": list(self.names) if self.names else [""] * len(self), "stable": self.stable}
        for k in _SUMMARY:
            d[k] = getattr(self, k)
        d["fallback"] = self.fallback
        return pd.DataFrame(d)


def _as_groups(loops) -> tuple[int, list[_Group], np.ndarray, callable, tuple]:
    if isinstance(loops, DelayedLoopBatch):
        groups, scalar = _groups_from_arrays(loops)
        return len(loops), groups, scalar, loops.loop, (loops.names or ())
    loops = list(loops)
    for i, lp in enumerate(loops):
        if not isinstance(lp, DelayedLoop):
            raise ConfigError(f"loops[{i}]", f"expected a DelayedLoop, got {type(lp).__name__}")
    groups, scalar = _groups_from_loops(loops)
    return len(loops), groups, scalar, loops.__getitem__, tuple(lp.name for lp in loops)


def stability_margins_batch(loops, *, chunk_size: int = _DEFAULT_CHUNK) -> MarginsBatch:
    """Nyquist verdict and margins of many loops at once (exact delay); loop by loop the same
    as :func:`~tokenfactory.controllers.stability_margins` (within 1e-6 relative).

    Loops are grouped by structure (numerator and denominator degree, integrators) and each
    group is evaluated in chunks of ``chunk_size`` as 2-D arrays; the loops the batch kernel
    cannot handle, or whose result it cannot certify, are computed by the scalar path and
    flagged in ``fallback`` (see the module docstring for when).

    Parameters
    ----------
    loops : DelayedLoopBatch or sequence of DelayedLoop
        The open loops (negative feedback).
    chunk_size : int
        Loops per 2-D evaluation (>= 1, default 1024): bounds the memory, ~ chunk_size x a few
        hundred frequencies x 8 bytes per array.

    Returns
    -------
    MarginsBatch
        Arrays of the verdict and margins, one entry per loop, in input order.

    Raises
    ------
    ConfigError
        For a bad ``chunk_size``, an entry that is not a DelayedLoop, or (from the scalar path)
        a loop it rejects: improper, neutral (|L(j inf)| >= 1 with a delay), L(j inf) = -1 or an
        axis pole-zero cancellation.
    """
    check_int("chunk_size", chunk_size, low=1)
    n, groups, scalar_rows, get_loop, names = _as_groups(loops)
    gm, lgm, pm, dm, ms, wms = (np.full(n, np.nan) for _ in range(6))
    P = np.zeros(n, int)
    Z = np.zeros(n, int)
    reason = np.zeros(n, int)
    reason[scalar_rows] = 1
    gc_parts: list[tuple] = []
    pc_parts: list[tuple] = []
    for g in groups:
        for s in range(0, len(g.rows), chunk_size):
            sl = slice(s, s + chunk_size)
            rows = g.rows[sl]
            res = _kernel(g.gain[sl], g.zeros[sl], g.poles[sl], g.origin_poles, g.delay[sl])
            gm[rows], lgm[rows], pm[rows], dm[rows] = res.gm, res.lgm, res.pm, res.dm
            ms[rows], wms[rows], P[rows], Z[rows] = res.ms, res.w_ms, res.P, res.Z
            reason[rows] = res.why
            gc_parts.append((rows, res.gc))
            pc_parts.append((rows, res.pc))
    gc = _assemble(n, gc_parts, 3)
    pc = _assemble(n, pc_parts, 3, fills=(math.nan, math.nan, 0.0))
    fallback = reason > 0
    scalar = {}
    for i in np.nonzero(fallback)[0]:
        mg = stability_margins(get_loop(int(i)))
        scalar[int(i)] = mg
        gm[i], lgm[i], pm[i], dm[i] = mg.gain_margin, mg.lower_gain_margin, mg.phase_margin_deg, mg.delay_margin_s
        ms[i], wms[i] = mg.ms, mg.ms_frequency_rad_s
        P[i], Z[i] = mg.open_loop_rhp_poles, mg.closed_loop_rhp_poles
        gc = _put_row(gc, i, [(c.frequency_rad_s, c.phase_margin_deg, c.delay_margin_s) for c in mg.gain_crossings])
        pc = _put_row(pc, i, [(c.frequency_rad_s, c.gain_factor, c.rhp_change) for c in mg.phase_crossings],
                      fills=(math.nan, math.nan, 0.0))
    return MarginsBatch(gm, lgm, pm, dm, ms, wms, P, Z, gc, pc, fallback, names,
                        np.array(_REASONS, dtype=object)[reason], scalar)


def _assemble(n: int, parts, ncol: int, fills=None):
    fills = fills or (math.nan,) * ncol
    k = max((p[1][1].shape[1] for p in parts), default=1)
    counts = np.zeros(n, int)
    cols = [np.full((n, k), f) for f in fills]
    for rows, (cnt, *vals) in parts:
        counts[rows] = cnt
        for c, v in zip(cols, vals):
            c[rows, :v.shape[1]] = v
    return (counts, *cols)


def _put_row(arrs, i: int, values: list[tuple], fills=None):
    counts, *cols = arrs
    fills = fills or (math.nan,) * len(cols)
    k = cols[0].shape[1]
    if len(values) > k:
        cols = [np.concatenate([c, np.full((len(c), len(values) - k), f)], axis=1) for c, f in zip(cols, fills)]
    for c, f in zip(cols, fills):
        c[i, :] = f
    for j, v in enumerate(values):
        for c, x in zip(cols, v):
            c[i, j] = x
    counts[i] = len(values)
    return (counts, *cols)


def gain_delay_margins(configs: Sequence[dict], num, den, delay: float = 0.0, *, gain_key: str = "gain_factor",
                       delay_key: str = "delay_s") -> list[dict]:
    """Batched sweep point function: the margins of k R(s) e^{-(delay + d) s} for each
    configuration's gain factor k and extra delay d (a stability map as a
    :func:`~tokenfactory.sweep.run_sweep` with ``batched=True``; bind ``num``, ``den`` and
    ``delay`` with :func:`functools.partial`).

    Parameters
    ----------
    configs : sequence of dict
        One configuration per point, with ``gain_key`` (> 0; default 1 when absent) and
        ``delay_key`` (s, >= 0; default 0).
    num, den : array_like
        Coefficients of R(s), highest power first.
    delay : float
        The base loop delay (s, >= 0).
    gain_key, delay_key : str
        Where the gain factor and extra delay are in each configuration.

    Returns
    -------
    list of dict
        Per point: gain_margin, lower_gain_margin, phase_margin_deg, delay_margin_s, ms,
        stable, closed_loop_rhp_poles, crossover_rad_s, fallback.

    Raises
    ------
    ConfigError
        For a gain factor <= 0 or a negative extra delay (field ``configs[i].<key>``).
    """
    k = np.array([c.get(gain_key, 1.0) for c in configs], float)
    d = np.array([c.get(delay_key, 0.0) for c in configs], float)
    for key, arr, bad in ((gain_key, k, k <= 0), (delay_key, d, d < 0)):
        if np.any(bad | ~np.isfinite(arr)):
            i = int(np.argmax(bad | ~np.isfinite(arr)))
            raise ConfigError(f"configs[{i}].{key}", f"expected {'> 0' if key == gain_key else '>= 0'}, got {arr[i]!r}")
    num = np.atleast_1d(np.asarray(num, float))
    mb = stability_margins_batch(DelayedLoopBatch(num[None, :] * k[:, None], den, delay + d))
    cols = {c: getattr(mb, c).tolist() for c in ("gain_margin", "lower_gain_margin", "phase_margin_deg",
                                                 "delay_margin_s", "ms", "stable", "closed_loop_rhp_poles",
                                                 "crossover_rad_s", "fallback")}
    return [{c: v[i] for c, v in cols.items()} for i in range(len(configs))]
