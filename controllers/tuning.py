"""PI tuning rules with known margins.

SIMC (Skogestad 2003, "Simple analytic rules for model reduction and PID controller tuning",
J. Process Control 13:291-309, Table 1):

* integrating plus dead time  k e^{-theta s} / s:          Kc = 1 / (k (tau_c + theta)),
  tau_I = 4 (tau_c + theta)
* first order plus dead time  k e^{-theta s} / (tau1 s + 1): Kc = tau1 / (k (tau_c + theta)),
  tau_I = min(tau1, 4 (tau_c + theta))

tau_c = theta is Skogestad's recommended "tight but robust" choice (for the integrating case:
GM 2.96, PM 46.9 deg, Ms 1.70, delay margin 1.59 theta). A larger tau_c trades speed for margin.
Sampling adds about half a sample period of delay and a first-order measurement filter adds about
its time constant (the "half rule" of the same paper counts a neglected lag as delay), so the
effective delay handed to the rule is theta + T/2 + tau_f.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tokenfactory.core.validation import check_number

__all__ = ["PIGains", "simc_pi", "effective_delay"]


@dataclass(frozen=True)
class PIGains:
    """PI in ideal form C(s) = kc (1 + 1 / (ti s)).

    Parameters
    ----------
    kc : float
        Proportional gain, in actuation units per unit of control error (for admission:
        requests/s per request of ready-buffer error, i.e. 1/s).
    ti : float
        Integral time (s).
    tau_c : float
        The closed-loop time constant the gains were tuned for (s; SIMC's tuning knob).
    theta : float
        The effective delay the gains were tuned for (s).
    """

    kc: float
    ti: float
    tau_c: float
    theta: float

    def to_dict(self) -> dict:
        """The fields as a plain dict."""
        return asdict(self)


def effective_delay(plant_delay: float, measurement_delay: float = 0.0, sample_period: float = 0.0,
                    filter_tau: float = 0.0) -> float:
    """Delay seen by the tuning rule: plant + measurement delay + T/2 (zero-order hold) + filter lag.

    Parameters
    ----------
    plant_delay : float
        The plant's own dead time (s, >= 0; for admission the fill-to-ready delay).
    measurement_delay : float
        Age of the measurement when the controller reads it (s, >= 0; default 0).
    sample_period : float
        Controller sample period T (s, >= 0; default 0); the hold adds T/2.
    filter_tau : float
        Time constant of a first-order measurement filter (s, >= 0; default 0), counted as delay
        by Skogestad's half rule.

    Returns
    -------
    float
        The effective delay theta (s).

    Raises
    ------
    ConfigError
        For a negative or non-finite argument.
    """
    for name, v in (("plant_delay", plant_delay), ("measurement_delay", measurement_delay),
                    ("sample_period", sample_period), ("filter_tau", filter_tau)):
        check_number(name, v, low=0.0)
    return plant_delay + measurement_delay + sample_period / 2.0 + filter_tau


def simc_pi(k: float, theta: float, tau1: float | None = None, tau_c: float | None = None) -> PIGains:
    """SIMC PI for k e^{-theta s}/s (``tau1`` None) or k e^{-theta s}/(tau1 s + 1).

    Parameters
    ----------
    k : float
        Plant gain (> 0): for the integrating plant its slope, output units per second per unit
        of input; for the first-order plant its steady-state gain.
    theta : float
        Effective delay (s, > 0; see :func:`effective_delay`).
    tau1 : float, optional
        Time constant of a first-order plant (s, > 0); None (default) for an integrating plant.
    tau_c : float, optional
        Desired closed-loop time constant (s, > 0); default ``theta``, Skogestad's "tight but
        robust" choice. Larger is slower with more margin.

    Returns
    -------
    PIGains
        ``kc`` and ``ti`` by SIMC Table 1, with the ``tau_c`` and ``theta`` used.

    Raises
    ------
    ConfigError
        For a non-positive ``k``, ``theta``, ``tau1`` or ``tau_c``.
    """
    check_number("k", k, low=0.0, low_inclusive=False)
    check_number("theta", theta, low=0.0, low_inclusive=False)
    tau_c = theta if tau_c is None else check_number("tau_c", tau_c, low=0.0, low_inclusive=False)
    if tau1 is None:
        return PIGains(kc=1.0 / (k * (tau_c + theta)), ti=4.0 * (tau_c + theta), tau_c=tau_c, theta=theta)
    check_number("tau1", tau1, low=0.0, low_inclusive=False)
    return PIGains(kc=tau1 / (k * (tau_c + theta)), ti=min(tau1, 4.0 * (tau_c + theta)), tau_c=tau_c,
                   theta=theta)
