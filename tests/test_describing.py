import control
import numpy as np
import pytest

from tokenfactory.controllers import DelayedLoop, predict_limit_cycles, relay_integrator_delay_cycle
from tokenfactory.plant_models import simulate_delayed_feedback

PLANT = control.tf([1], [10, 1])


def _relay_hysteresis(amplitude, width):
    state = {"u": amplitude}

    def law(t, e):
        if e > width:
            state["u"] = amplitude
        elif e < -width:
            state["u"] = -amplitude
        return state["u"]

    return law


def _simulated_period(t, u, after=100.0):
    up = t[1:][(np.diff(np.sign(u)) > 0)]
    up = up[up > after]
    return float(np.diff(up).mean())


@pytest.mark.parametrize("width", [0.05, 0.1, 0.2])
def test_relay_with_hysteresis_period_within_10_percent(width):
    loop = DelayedLoop(PLANT, 2.0)
    lc = predict_limit_cycles(loop, control.relay_hysteresis_nonlinearity(1.0, width))[0]
    t, y, u = simulate_delayed_feedback(PLANT, 2.0, _relay_hysteresis(1.0, width), t_end=300, dt=0.005)
    assert _simulated_period(t, u) == pytest.approx(lc.period_s, rel=0.10)


def test_pade_and_exact_predictions_agree():
    loop = DelayedLoop(PLANT, 2.0)
    F = control.relay_hysteresis_nonlinearity(1.0, 0.1)
    ex, pa = predict_limit_cycles(loop, F)[0], predict_limit_cycles(loop, F, method="pade")[0]
    assert pa.method.startswith("pade-")
    assert pa.period_s == pytest.approx(ex.period_s, rel=0.01)
    assert pa.amplitude == pytest.approx(ex.amplitude, rel=0.01)


@pytest.mark.parametrize("d,L", [(10.0, 0.5), (107.0, 0.67), (1.0, 3.0)])
def test_relay_integrator_delay_closed_form(d, L):
    lc = predict_limit_cycles(DelayedLoop(control.tf([1], [1, 0]), L),
                              control.relay_hysteresis_nonlinearity(d, 0.0))[0]
    ref = relay_integrator_delay_cycle(d, 1.0, L)
    assert lc.period_s == pytest.approx(4 * L, rel=1e-6)
    assert lc.amplitude == pytest.approx(ref.amplitude, rel=1e-6)


def test_saturation_cycle_only_when_linear_loop_is_unstable():
    sat = control.saturation_nonlinearity(1.0)
    assert predict_limit_cycles(DelayedLoop(PLANT * 2.0, 2.0), sat) == []      # GM > 1: no cycle
    lc = predict_limit_cycles(DelayedLoop(PLANT * 20.0, 2.0), sat)              # GM < 1: cycle
    assert len(lc) >= 1 and lc[0].amplitude > 1.0
