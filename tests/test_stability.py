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
