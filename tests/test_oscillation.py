import control
import numpy as np
import pytest
import scipy.signal as sps

from tokenfactory.controllers import assess, autocorrelation, decay_ratio, first_harmonic_amplitude, thornhill_regularity
from tokenfactory import ConfigError

DT = 0.1
N = 3000
T = np.arange(N) * DT


def _noise(seed):
    return np.random.default_rng(seed).standard_normal(N)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("snr_amp", [1.0, 2.0])
def test_sine_plus_noise_is_flagged(seed, snr_amp):
    x = snr_amp * np.sin(2 * np.pi * T / 12.0) + 0.5 * _noise(seed)
    rep = assess(x, DT)
    assert rep.oscillating, str(rep)
    assert rep.period_s == pytest.approx(12.0, rel=0.1)
    assert rep.harmonic_amplitude == pytest.approx(snr_amp, rel=0.1)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_white_noise_is_not_flagged(seed):
    rep = assess(_noise(seed), DT)
    assert not rep.oscillating, str(rep)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kind", ["ar1", "lowpass"])
def test_coloured_noise_is_not_flagged(seed, kind):
    e = _noise(seed)
    if kind == "ar1":
        x = sps.lfilter([1.0], [1.0, -0.95], e)
    else:
        b, a = sps.butter(2, 0.05)
        x = sps.lfilter(b, a, e)
    rep = assess(x, DT)
    assert not rep.oscillating, str(rep)


def _loop_output(zeta, seed):
    # closed loop response to noise: a well-damped loop (zeta 0.7) vs a marginal one (zeta 0.03)
    G = control.tf([1.0], [1.0, 2 * zeta, 1.0])
    _, y = control.forced_response(G, T, _noise(seed))
    return y


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_well_tuned_loop_under_noise_is_not_flagged(seed):
    rep = assess(_loop_output(0.7, seed), DT)
    assert not rep.oscillating, str(rep)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_marginal_loop_is_flagged(seed):
    rep = assess(_loop_output(0.03, seed), DT)
    assert rep.oscillating, str(rep)
    assert rep.period_s == pytest.approx(2 * np.pi, rel=0.15)


def test_indices_on_a_pure_sine():
    x = np.sin(2 * np.pi * T / 10.0)
    acf = autocorrelation(x - x.mean())
    r, period = thornhill_regularity(acf, DT)
    assert r > 10 and period == pytest.approx(10.0, rel=0.02)
    assert decay_ratio(acf) > 0.9
    assert first_harmonic_amplitude(x, DT, 10.0) == pytest.approx(1.0, rel=0.01)


def test_small_ripple_is_ignored_and_bad_input_rejected():
    x = 1e-3 * np.sin(2 * np.pi * T / 10.0) + 100.0
    assert not assess(x, DT, min_amplitude=0.1).oscillating
    with pytest.raises(ConfigError, match="signal"):
        assess(np.array([1.0, np.nan] * 20), DT)
    with pytest.raises(ConfigError, match="signal"):
        assess(np.zeros(5), DT)
    with pytest.raises(ConfigError, match="dt"):
        assess(np.zeros(100), 0.0)
