"""Property tests of the Nyquist verdict on random loops.

Random open loops - stable and unstable poles, integrators, lightly damped and undamped
resonances, minimum- and non-minimum-phase zeros, delays - are analysed on the exact delay and
checked against an independent verdict: the closed-loop poles of the loop with the delay
replaced by a Pade model accurate (phase within 0.5 deg) over the disc |s| <= r1 where
right-half-plane closed-loop poles can lie (|R(s)| >= 1 there since |e^{-s delay}| <= 1).
Loops where no Pade order <= 12 is that accurate, or a closed-loop pole sits on the axis, are
rejected (``assume``), not counted. The gain and delay margins are checked the same way: the
verdict must hold 1 % inside each margin and flip 1 % beyond it. A stable verdict is then
confirmed by simulating the closed loop's step response with the exact delay.
"""

import math

import control
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from tokenfactory.controllers import DelayedLoop, pade_phase_error_deg, stability_margins

log_mag = st.floats(-1.0, 1.0)
rhp = st.sampled_from([False, False, False, False, True])


@st.composite
def random_loops(draw):
    """(num, den, delay) of a proper loop; biproper only with |L(j inf)| < 1 under a delay."""
    poles = []
    for mag, unstable in draw(st.lists(st.tuples(log_mag, rhp), max_size=3)):
        poles.append(10**mag if unstable else -(10**mag))
    for mag, zeta in draw(st.lists(st.tuples(log_mag, st.one_of(st.sampled_from([0.0, 0.005, 0.05]),
                                                                 st.floats(-0.3, 0.9))), max_size=2)):
        wn = 10**mag
        poles += [complex(-zeta * wn, wn * math.sqrt(1 - zeta**2)), complex(-zeta * wn, -wn * math.sqrt(1 - zeta**2))]
    poles += [0.0] * draw(st.sampled_from([0, 0, 1, 1, 2]))
    if not poles:
        poles.append(-(10 ** draw(log_mag)))
    zeros = [10**mag if unstable else -(10**mag) for mag, unstable in
             draw(st.lists(st.tuples(log_mag, rhp), max_size=min(2, len(poles))))]
    k = 10 ** draw(st.floats(-1.5, 1.5)) * draw(st.sampled_from([1, 1, 1, 1, 1, 1, 1, 1, -1]))
    delay = draw(st.sampled_from([0.0, 1.0, 1.0])) * 10 ** draw(st.floats(-1.5, 0.5))  # 2/3 with a delay
    if delay > 0 and len(zeros) == len(poles):
        k = math.copysign(min(abs(k), 0.8), k)
    num = k * np.real(np.poly(zeros)) if zeros else np.array([k])
    return num, np.real(np.poly(poles)), delay


def _rhp_radius(num, den):
    """r1 with |R(s)| < 1 for every |s| >= r1: |R| <= |k| prod(r + |z|) / prod(r - |p|)."""
    z, p = np.roots(num), np.roots(den)
    k = abs(num[0] / den[0])
    r = 2 * max(np.abs(p).max(initial=0.0), 1e-3)
    while k * np.prod(r + np.abs(z)) / np.prod(r - np.abs(p)) >= 1.0 and r < 1e6:
        r *= 1.2
    return r


def pade_verdict(num, den, delay, gain=1.0):
    """Closed-loop right-half-plane pole count of the Pade model, or None where it is not
    trustworthy (Pade inaccurate over the disc, or a closed-loop pole within 1e-7 of the axis)."""
    num = np.asarray(num) * gain
    R = control.ss(control.tf(num, den))
    if delay > 0:
        r1 = _rhp_radius(num, den)
        w = np.linspace(r1 / 200, 2 * r1, 200)
        order = next((n for n in range(2, 13) if pade_phase_error_deg(delay, n, w).max() < 0.5), None)
        if order is None:
            return None
        R = R * control.ss(control.tf(*control.pade(delay, order)))
    poles = np.linalg.eigvals(control.feedback(R, 1).A)
    if np.any(np.abs(poles.real) < 1e-7 * max(np.abs(poles).max(), 1e-3)):
        return None
    return int(np.sum(poles.real > 0))


def check_loop(num, den, delay):
    assume(len(num) < len(den) or abs(1 + num[0] / den[0]) > 1e-6)  # L(j inf) = -1: no closed loop
    m = stability_margins(DelayedLoop(control.tf(num, den), delay))
    z = pade_verdict(num, den, delay)
    assume(z is not None and m.ms < 1e4)
    assert m.closed_loop_rhp_poles == z
    assert m.stable == (z == 0)
    event("stable" if m.stable else "unstable")
    event("open-loop unstable" if m.open_loop_rhp_poles else "open-loop stable")
    event("with delay" if delay > 0 else "no delay")
    # two-sided gain margins: the verdict holds 1 % inside and flips 1 % outside (or halfway to
    # the next crossing, where that is nearer: the verdict may flip back there)
    factors = sorted(c.gain_factor for c in m.phase_crossings)
    for k, inside, outside in ((m.gain_margin, 0.99, 1.01), (m.lower_gain_margin, 1.01, 0.99)):
        if 1e-3 < k < 1e3:
            beyond = [g for g in factors if min(k, k * outside) < g < max(k, k * outside) and abs(g / k - 1) > 1e-9]
            out = math.sqrt(k * min(beyond, key=lambda g: abs(g - k))) if beyond else k * outside
            a, b = pade_verdict(num, den, delay, k * inside), pade_verdict(num, den, delay, out)
            if a is not None and b is not None:
                assert (a == 0) == m.stable and (b == 0) != m.stable, (k, a, b)
                event("upper gain margin checked" if outside > 1 else "lower gain margin checked")
    if m.stable and 0 < m.delay_margin_s < math.inf:
        a = pade_verdict(num, den, delay + 0.99 * m.delay_margin_s)
        b = pade_verdict(num, den, delay + 1.01 * m.delay_margin_s)
        if a is not None and b is not None:
            assert a == 0 and b > 0, (m.delay_margin_s, a, b)
            event("delay margin checked")
    return m


@settings(max_examples=150)
@given(random_loops())
def test_nyquist_verdict_matches_pade_closed_loop_poles(loop):
    check_loop(*loop)


@pytest.mark.slow
@settings(max_examples=2000)
@given(random_loops())
def test_nyquist_verdict_matches_pade_closed_loop_poles_large(loop):
    check_loop(*loop)


def simulate_step(num, den, delay, dt, t_end):
    """Unit-step response of the closed loop y = R e, e = 1 - y(t - delay): R sampled with a
    zero-order hold, the delay an exact number of samples (dt divides it)."""
    sysd = control.c2d(control.ss(control.tf(num, den)), dt, "zoh")
    A, B, C, D = (np.asarray(x, float) for x in (sysd.A, sysd.B, sysd.C, sysd.D))
    nd = int(round(delay / dt))
    n = int(t_end / dt)
    x = np.zeros(A.shape[0])
    y = np.zeros(n)
    for k in range(n):
        if nd:
            e = 1.0 - (y[k - nd] if k >= nd else 0.0)
        else:  # no delay: e = 1 - (C x + D e)
            e = (1.0 - (C @ x)[0]) / (1.0 + D[0, 0])
        y[k] = (C @ x)[0] + D[0, 0] * e
        x = A @ x + B[:, 0] * e
    return y


@settings(max_examples=12, suppress_health_check=[HealthCheck.filter_too_much])
@given(random_loops())
def test_stable_verdict_has_a_bounded_settling_step_response(loop):
    num, den, delay = loop
    m = stability_margins(DelayedLoop(control.tf(num, den), delay))
    # (a zero delay margin - |L(j inf)| >= 1 - would make the hold's half-sample lag destabilise it)
    assume(m.stable and m.ms < 20 and m.delay_margin_s > 0)
    # horizon: 25 time constants of the slowest closed-loop pole (of the Pade model)
    R = control.ss(control.tf(num, den))
    if delay > 0:
        R = R * control.ss(control.tf(*control.pade(delay, 8)))
    poles = np.linalg.eigvals(control.feedback(R, 1).A)
    sigma = -poles.real.max()
    assume(sigma > 0)
    # sampling: the hold's half-sample lag far inside the delay margin, fast poles resolved
    fast = max(np.abs(np.roots(den)).max(initial=0.0), np.abs(poles).max(), 1e-3)
    dt = min(0.05 / fast, m.delay_margin_s / 50)
    if delay > 0:
        nd = max(math.ceil(delay / dt), 1)
        dt = delay / nd
    t_end = 25.0 / sigma
    assume(t_end / dt <= 60_000)
    y = simulate_step(num, den, delay, dt, t_end)
    assert np.all(np.isfinite(y))
    dev = np.abs(y - y[-1])
    n = len(y)
    assert dev[-n // 10:].max() <= 0.02 * dev[: n // 5].max() + 1e-9


def test_step_simulation_shows_an_unstable_loop_growing():
    """The simulator above does see an instability: (s - 18)/(s^2 - 3 s - 10) in unit feedback
    has a closed-loop pole at +6.39 (python-control's margin_test.py state-space system)."""
    y = simulate_step(np.array([1.0, -18.0]), np.array([1.0, -3.0, -10.0]), 0.0, 0.01, 3.0)
    assert abs(y[-1]) > 1e3 * abs(y[len(y) // 10])
