import pytest

from tokenfactory.plant_models import DelayLine


def test_integer_delay_is_exact():
    line = DelayLine(0.1, 1.0, initial=-1.0)
    for k in range(30):
        line.push(float(k))
    assert line.read(0.0) == 29.0
    assert line.read(0.5) == pytest.approx(24.0)
    assert line.read(1.0) == pytest.approx(19.0)


def test_fractional_delay_interpolates_and_initial_history():
    line = DelayLine(0.1, 1.0, initial=-1.0)
    line.push(0.0)
    line.push(1.0)
    assert line.read(0.05) == pytest.approx(0.5)
    assert line.read(0.3) == -1.0  # before the first sample: the initial value
    with pytest.raises(ValueError, match="capacity"):
        line.read(5.0)


def test_input_disturbance_reaches_the_plant_with_and_without_delay():
    # an open-loop integrator fed a unit input disturbance for 1 s: y(1 s) = 1 - delay
    import control
    import pytest

    from tokenfactory.plant_models import simulate_delayed_feedback

    for delay in (0.0, 0.1):
        t, y, _ = simulate_delayed_feedback(control.tf([1.0], [1.0, 0.0]), delay, lambda t, e: 0.0, t_end=1.0,
                                            dt=0.001, disturbance=lambda t: 1.0)
        assert y[-1] == pytest.approx(1.0 - delay, abs=2e-3), delay
