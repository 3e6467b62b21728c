import math

import control
import numpy as np
import pytest

from tokenfactory.controllers import (
    DelayedLoop,
    loop_transfer,
    pade_order_for,
    pade_phase_error_deg,
    stability_map,
    stability_margins,
)
from tokenfactory.plant_models import simulate_delayed_feedback
from tokenfactory import ConfigError

PLANT = control.tf([1], [10, 1])
PI = control.tf([2.5 * 10, 2.5], [10, 0])  # SIMC: Kc = 2.5, Ti = 10


@pytest.fixture(scope="module")
def textbook():
    return loop_transfer(PI, PLANT, 2.0)


# Textbook check from the issue: 1/(10s+1) e^{-2s} under SIMC PI -> L = 0.25 e^{-2s}/s.
@pytest.mark.parametrize("method", ["exact", "pade"])
@pytest.mark.parametrize("field,value", [("gain_margin", 3.14), ("phase_margin_deg", 61.4), ("ms", 1.59),
                                         ("delay_margin_s", 4.28)])
def test_textbook_margins(textbook, method, field, value):
    m = stability_margins(textbook, method)
    assert getattr(m, field) == pytest.approx(value, rel=0.02)


def test_exact_matches_closed_form(textbook):
    m = stability_margins(textbook)
    # |L| = 0.25/w = 1 at w = 0.25; phase -pi/2 - 0.5; phase crossover at w = pi/4
    assert m.crossover_rad_s == pytest.approx(0.25, rel=1e-9)
    assert m.phase_margin_deg == pytest.approx(math.degrees(math.pi / 2 - 0.5), rel=1e-9)
    assert m.gain_margin == pytest.approx(math.pi, rel=1e-9)
    assert m.delay_margin_s == pytest.approx((math.pi / 2 - 0.5) / 0.25, rel=1e-9)


def test_pade_margins_agree_with_python_control(textbook):
    m = stability_margins(textbook, "pade", pade_order=8)
    gm, pm, *_ = control.stability_margins(textbook.pade(8))
    assert m.gain_margin == pytest.approx(gm, rel=1e-4)
    assert m.phase_margin_deg == pytest.approx(pm, rel=1e-4)


def test_pade_order_is_checked_against_exact_phase():
    n = pade_order_for(2.0, 1.0, tol_deg=1.0)
    w = np.linspace(0.01, 1.0, 100)
    assert pade_phase_error_deg(2.0, n, w).max() <= 1.0
    assert pade_phase_error_deg(2.0, n - 1, w).max() > 1.0 if n > 1 else True
    with pytest.raises(ConfigError, match="pade_order"):
        pade_order_for(2.0, 1e3, max_order=10)


@pytest.mark.parametrize("fraction,grows", [(0.9, False), (1.1, True)])
def test_delay_margin_confirmed_in_time_domain(textbook, fraction, grows):
    """Adding 0.9 x the delay margin keeps the loop stable, 1.1 x destabilises it."""
    dm = stability_margins(textbook).delay_margin_s
    state = {"i": 0.0}

    def pi(t, e, dt=0.01):
        state["i"] += e * dt
        return 2.5 * (e + state["i"] / 10.0)

    t, y, _ = simulate_delayed_feedback(PLANT, 2.0 + fraction * dm, pi, t_end=400, dt=0.01,
                                        disturbance=lambda t: 1.0 if t < 1.0 else 0.0)
    early = np.abs(y[(t > 20) & (t < 120)]).max()
    late = np.abs(y[t > 300]).max()
    assert (late > early) == grows, f"early {early:.3g} late {late:.3g}"


def test_stability_map_matches_closed_form():
    # k e^{-theta s}/s is stable iff k theta < pi/2
    df = stability_map(lambda theta, k: DelayedLoop(control.tf([k], [1, 0]), theta), "theta", [0.5, 1.0, 2.0],
                       "k", [0.5, 1.0, 1.5, 3.0])
    assert len(df) == 12
    assert (df["stable"] == (df["k"] * df["theta"] < math.pi / 2)).all()


def test_no_crossover_and_bad_method():
    m = stability_margins(DelayedLoop(control.tf([0.5], [1, 1]), 0.0))
    assert m.gain_margin == math.inf and m.phase_margin_deg == math.inf and m.stable
    with pytest.raises(ConfigError, match="method"):
        stability_margins(DelayedLoop(control.tf([1], [1, 1]), 1.0), "bode")
    with pytest.raises(ConfigError, match="loop.delay"):
        DelayedLoop(control.tf([1], [1, 1]), -1.0)


# --- the loops (python-control's margin_test.py systems) ---------------------------------

S = control.tf("s")
OPEN_LOOP_UNSTABLE = control.tf(control.ss([[1., 4.], [3., 2.]], [[1.], [-4.]], [[1., 0.]], [[0.]]))
THREE_CROSSOVERS = (8.75 * (4 * S**2 + 0.4 * S + 1)) / ((100 * S + 1) * (S**2 + 0.22 * S + 1)) \
    / (S**2 / 10.**2 + 2 * 0.04 * S / 10. + 1)


def _closed_loop_rhp(sys, gain=1.0):
    return int(np.sum(control.feedback(sys * gain, 1).poles().real > 0))


def test_unstable_loop_is_not_certified():
    """(s - 18)/(s^2 - 3 s - 10): an RHP pole at 5, closed-loop pole at +6.39, yet PM 147 deg."""
    assert OPEN_LOOP_UNSTABLE.poles().real.max() == pytest.approx(5.0)
    m = stability_margins(DelayedLoop(OPEN_LOOP_UNSTABLE))
    assert m.open_loop_rhp_poles == 1 and m.closed_loop_rhp_poles == 1 == _closed_loop_rhp(OPEN_LOOP_UNSTABLE)
    assert not m.stable and not m.meets()
    assert m.phase_margin_deg == pytest.approx(147.0743, abs=1e-3)   # the crossing is still reported
    assert m.delay_margin_s == 0.0
    assert m.gain_margin == math.inf and m.lower_gain_margin == 0.0  # unstable at every gain


def test_stable_loop_with_three_crossovers():
    """+22 deg at 0.937 rad/s is PM_i = -157.8 deg, not a verdict: the loop is stable."""
    m = stability_margins(DelayedLoop(THREE_CROSSOVERS))
    assert m.stable and m.closed_loop_rhp_poles == 0 == _closed_loop_rhp(THREE_CROSSOVERS)
    assert [c.phase_margin_deg for c in m.gain_crossings] == pytest.approx([97.5940, -157.7845, 134.7326], abs=1e-3)
    assert m.phase_margin_deg == pytest.approx(97.594, abs=1e-3)
    # DM_i = (phase distance down to -180 deg) / w_i; the loop's DM is the smallest
    for c in m.gain_crossings:
        phase = math.degrees(np.angle(THREE_CROSSOVERS(1j * c.frequency_rad_s)))
        down = (phase + 180.0) % 360.0
        assert c.delay_margin_s == pytest.approx(math.radians(down) / c.frequency_rad_s, rel=1e-9)
    assert m.delay_margin_s == min(c.delay_margin_s for c in m.gain_crossings)
    assert m.delay_margin_s == pytest.approx(math.radians(134.7326) / 1.0919, rel=1e-4)
    df = m.to_pandas()
    assert list(df["kind"]) == ["gain"] * 3 + ["phase"] and df.loc[3, "gain_factor"] == pytest.approx(2.2716, abs=1e-4)


@pytest.mark.parametrize("fraction,unstable", [(0.99, False), (1.01, True)])
def test_delay_margin_of_three_crossover_loop_against_pade(fraction, unstable):
    dm = stability_margins(DelayedLoop(THREE_CROSSOVERS)).delay_margin_s
    model = THREE_CROSSOVERS * control.tf(*control.pade(fraction * dm, 10))
    assert (_closed_loop_rhp(model) > 0) == unstable
    assert stability_margins(DelayedLoop(THREE_CROSSOVERS, fraction * dm)).stable == (not unstable)


def test_conditionally_stable_loop_has_a_lower_gain_margin():
    """(s + 0.1)^2 / (s^3 (s + 1)): stable, but only for gains above 0.0626 x (margin_test.py type3)."""
    sys = (S + 0.1) ** 2 / (S**3 * (S + 1))
    m = stability_margins(DelayedLoop(sys))
    assert m.stable and m.gain_margin == math.inf
    assert m.lower_gain_margin == pytest.approx(0.0626, abs=1.5e-3)
    assert _closed_loop_rhp(sys, 0.99 * m.lower_gain_margin) > 0 == _closed_loop_rhp(sys, 1.01 * m.lower_gain_margin)
    assert not m.meets(pm_floor_deg=45.0) and m.meets(pm_floor_deg=30.0)   # PM 37 deg


def test_open_loop_unstable_but_closed_loop_stable():
    """margin_test.py example21 x 1000: an RHP pole at 5e-4, stable for gains in (0.179, 22.8) x."""
    sys = 1000 * 0.002 * (S + 0.02) * (S + 0.05) * (S + 5) * (S + 10) / (
        (S - 0.0005) * (S + 0.0001) * (S + 0.01) * (S + 0.2) * (S + 1) * (S + 100) ** 2)
    m = stability_margins(DelayedLoop(sys))
    assert m.open_loop_rhp_poles == 1 and m.stable
    assert m.lower_gain_margin == pytest.approx(0.1794, abs=1e-3) and m.gain_margin == pytest.approx(22.798, rel=1e-3)
    for k, rhp in ((m.lower_gain_margin * 0.99, True), (m.lower_gain_margin * 1.01, False),
                   (m.gain_margin * 0.99, False), (m.gain_margin * 1.01, True)):
        assert (_closed_loop_rhp(sys, k) > 0) == rhp


def test_marginal_loop_is_not_stable():
    """1/s^2: closed-loop poles at +/-j; the curve runs through -1."""
    m = stability_margins(DelayedLoop(control.tf([1], [1, 0, 0])))
    assert not m.stable and m.ms == math.inf


def test_crossover_on_a_grid_point_is_counted_once():
    """e^{-s}/s^2: |L(j1)| = 1 exactly and w = 1 is a grid point; the one crossover is reported
    once (a crossing is owned by the interval that ends at it). Found by the batch cross-check."""
    m = stability_margins(DelayedLoop(control.tf([1], [1, 0, 0]), 1.0))
    assert len(m.gain_crossings) == 1 and m.gain_crossings[0].frequency_rad_s == pytest.approx(1.0, rel=1e-12)
    assert m.phase_margin_deg == pytest.approx(-math.degrees(1.0), rel=1e-9) and not m.stable


def test_margins_rows_and_map_columns(textbook):
    m = stability_margins(textbook)
    d = m.to_dict()
    assert d["stable"] and d["open_loop_rhp_poles"] == 0 and len(d["gain_crossings"]) == 1
    df = m.to_pandas()
    assert set(df.columns) >= {"kind", "frequency_rad_s", "phase_margin_deg", "delay_margin_s", "gain_factor"}
    # L = 0.25 e^{-2s}/s: phase crossings at (pi/2 + 2 pi n)/2 with gain factor w/0.25
    ph = df[df["kind"] == "phase"]
    assert ph["frequency_rad_s"].iloc[:3].tolist() == pytest.approx([(math.pi / 2 + 2 * math.pi * n) / 2 for n in range(3)])
    assert (ph["gain_factor"] <= 1e3).all() and (ph["rhp_change"] == 2).all()
    smap = stability_map(lambda th, k: DelayedLoop(control.tf([k], [1, 0]), th), "theta", [1.0], "k", [1.0, 2.0])
    assert {"lower_gain_margin", "closed_loop_rhp_poles"} <= set(smap.columns)
    assert smap["closed_loop_rhp_poles"].tolist() == [0, 2]


@pytest.mark.parametrize("sys,match", [
    (control.tf([1, 0, 0], [1, 1]), "improper"),
    (control.tf([1, 0, 1], [1, 0, 1, 0]), "cancel on the imaginary axis"),
])
def test_loops_the_count_cannot_handle_are_rejected(sys, match):
    with pytest.raises(ConfigError, match=match):
        stability_margins(DelayedLoop(sys))

