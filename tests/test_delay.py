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
