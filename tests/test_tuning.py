import control
import pytest

from tokenfactory.controllers import effective_delay, loop_transfer, simc_pi, stability_margins
from tokenfactory import ConfigError


def test_simc_fopdt_textbook():
    # Skogestad 2003: 1/(10s+1) e^{-2s}, tau_c = theta = 2 -> Kc = 10/4 = 2.5, tau_I = min(10, 16) = 10
    g = simc_pi(1.0, 2.0, tau1=10.0)
    assert g.kc == pytest.approx(2.5)
    assert g.ti == pytest.approx(10.0)


# Skogestad (2003) Table/Fig. for the integrating process with tau_c = theta:
# GM 2.96, PM 46.9 deg, Ms 1.70, delay margin 1.59 theta.
@pytest.mark.parametrize("theta", [0.2, 1.0, 7.5])
def test_simc_integrating_margins_match_published(theta):
    g = simc_pi(1.0, theta)
    assert g.kc == pytest.approx(1 / (2 * theta)) and g.ti == pytest.approx(8 * theta)
    m = stability_margins(loop_transfer(control.tf([g.kc * g.ti, g.kc], [g.ti, 0]), control.tf([1], [1, 0]), theta))
    assert m.gain_margin == pytest.approx(2.96, rel=0.01)
    assert m.phase_margin_deg == pytest.approx(46.9, rel=0.01)
    assert m.ms == pytest.approx(1.70, rel=0.01)
    assert m.delay_margin_s / theta == pytest.approx(1.59, rel=0.01)


def test_effective_delay_adds_half_sample_and_filter():
    assert effective_delay(0.2, 0.5, 0.25, 0.1) == pytest.approx(0.2 + 0.5 + 0.125 + 0.1)
    with pytest.raises(ConfigError, match="sample_period"):
        effective_delay(0.2, 0.5, -1.0)


def test_simc_rejects_bad_inputs():
    with pytest.raises(ConfigError, match="theta"):
        simc_pi(1.0, 0.0)
    with pytest.raises(ConfigError, match="tau_c"):
        simc_pi(1.0, 1.0, tau_c=-1)
