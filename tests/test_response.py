"""controllers/response.py: step and disturbance figures of merit against closed forms (first and
second order steps) and hand-computed samples (the comments give each number's arithmetic)."""

import math

import numpy as np
import pytest

from tokenfactory.controllers.response import disturbance_metrics, step_metrics

DT = 1e-3  # sample period of the closed-form responses (s); times are exact to one sample


def test_first_order_step_rise_and_settling_are_the_closed_forms():
    """y = y0 + S (1 - e^{-(t - t0)/tau}): no overshoot, 10-90 % rise tau ln 9, settling into
    +/- 5 % of the step at tau ln 20 (the last sample outside the band is within one of it)."""
    tau, t0, y0, y1 = 2.0, 5.0, 2.0, 6.0
    t = np.arange(0.0, 50.0, DT)
    y = np.where(t < t0, y0, y0 + (y1 - y0) * (1.0 - np.exp(-(t - t0) / tau)))
    m = step_metrics(t, y, t0=t0, initial=y0, final=y1)
    assert m["overshoot_pct"] == 0.0
    assert m["peak"] == pytest.approx(y1, abs=1e-9)
    assert m["rise_time_s"] == pytest.approx(tau * math.log(9.0), abs=2 * DT)
    assert m["settling_time_s"] == pytest.approx(tau * math.log(20.0), abs=2 * DT)
    # a 2 % band: tau ln 50
    assert step_metrics(t, y, t0=t0, initial=y0, final=y1, band=0.02)["settling_time_s"] == \
        pytest.approx(tau * math.log(50.0), abs=2 * DT)


@pytest.mark.parametrize("zeta", [0.2, 0.5, 0.7])
def test_second_order_overshoot_is_the_closed_form(zeta):
    """Unit step of wn^2 / (s^2 + 2 zeta wn s + wn^2): peak overshoot exp(-zeta pi / sqrt(1 -
    zeta^2)) at t = pi / wd (Ogata, Modern Control Engineering, section 5-3)."""
    wn = 1.0
    wd = wn * math.sqrt(1.0 - zeta ** 2)
    t = np.arange(0.0, 40.0, DT)
    y = 1.0 - np.exp(-zeta * wn * t) / math.sqrt(1.0 - zeta ** 2) * np.sin(wd * t + math.acos(zeta))
    m = step_metrics(t, y, t0=0.0, initial=0.0, final=1.0)
    mp = math.exp(-zeta * math.pi / math.sqrt(1.0 - zeta ** 2))
    assert m["overshoot_pct"] == pytest.approx(100.0 * mp, abs=1e-4)
    assert m["peak"] == pytest.approx(1.0 + mp, abs=1e-6)


def test_downward_step_from_a_non_zero_level_on_hand_samples():
    """A step from 10 down to 4 at t0 = 1; the sample before t0 (-50) is not assessed.
    Peak 3 (the minimum after t0): overshoot (4 - 3) / 6 = 16.7 %. Progress (10 - y) / 6 after
    t0: 0, 0.5, 1.17, 0.92, 0.98, 1: 10 % first at t = 2, 90 % at t = 3, rise 1 s. Band 0.05 x 6
    = 0.3: |y - 4| = 6, 3, 1, 0.5, 0.1, 0 is last outside at t = 4, inside from t = 5: 4 s."""
    t = np.arange(7.0)
    y = np.array([-50.0, 10.0, 7.0, 3.0, 4.5, 4.1, 4.0])
    m = step_metrics(t, y, t0=1.0, initial=10.0, final=4.0)
    assert m["peak"] == 3.0
    assert m["overshoot_pct"] == pytest.approx(100.0 / 6.0)
    assert m["rise_time_s"] == 1.0
    assert m["settling_time_s"] == 4.0


def test_unsettled_and_zero_steps():
    """Ends outside the band: settling and rise (90 % never reached) are nan. A zero step: no
    overshoot, no rise, an absolute band (0.5 here)."""
    t = np.arange(3.0)
    m = step_metrics(t, [0.0, 0.5, 0.8], t0=0.0, initial=0.0, final=1.0)
    assert math.isnan(m["rise_time_s"]) and math.isnan(m["settling_time_s"])
    assert m["overshoot_pct"] == 0.0 and m["peak"] == 0.8
    t = np.arange(4.0)
    calm = step_metrics(t, [3.0, 3.2, 3.4, 3.1], t0=0.0, initial=3.0, final=3.0, band=0.5)
    assert calm["overshoot_pct"] == 0.0 and math.isnan(calm["rise_time_s"])
    assert calm["peak"] == 3.4 and calm["settling_time_s"] == 0.0  # never leaves 3 +/- 0.5
    kick = step_metrics(t, [3.0, 3.7, 3.2, 3.0], t0=0.0, initial=3.0, final=3.0, band=0.5)
    assert kick["settling_time_s"] == 2.0  # last outside at t = 1, inside from t = 2


def test_disturbance_peak_and_recovery_on_hand_samples():
    """Target 5, band 0.5, a dip from t = 2 to t = 4 (the sample at t = 0, 9, is before it).
    Deviations from t = 2: 0, -1.5, -3, -1, -0.4, 0.2, 0: peak -3 at t = 4, 2 s after the start.
    From t = 4, |y - 5| = 3, 1, 0.4, 0.2, 0: last outside at t = 5, settled at t = 6: 2 s."""
    t = np.arange(9.0)
    y = np.array([9.0, 5.0, 5.0, 3.5, 2.0, 4.0, 4.6, 5.2, 5.0])
    m = disturbance_metrics(t, y, t_start=2.0, t_end=4.0, target=5.0, band=0.5)
    assert m == {"peak_deviation": -3.0, "peak_time_s": 2.0, "settling_time_s": 2.0}
    # a rise within the band: never leaves (0); ending outside it: not settled (nan)
    t = np.arange(5.0)
    up = disturbance_metrics(t, [5.0, 5.0, 5.3, 5.1, 5.0], t_start=1.0, t_end=2.0, target=5.0, band=0.5)
    assert up == {"peak_deviation": pytest.approx(0.3), "peak_time_s": 1.0, "settling_time_s": 0.0}
    late = disturbance_metrics(t, [5.0, 5.0, 5.3, 5.1, 6.0], t_start=1.0, t_end=2.0, target=5.0, band=0.5)
    assert late["peak_deviation"] == 1.0 and math.isnan(late["settling_time_s"])
