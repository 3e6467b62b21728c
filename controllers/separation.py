"""Timescale separation of cascaded loops: inner closed-loop bandwidth, outer crossover, their
ratio, and the outer loop's margins with the *real* inner closed loop in its plant.

In a cascade the outer loop's actuator is the inner closed loop T_i(s) = L_i / (1 + L_i). Designs
assume T_i = 1 (an ideal inner loop); the real T_i lags, and at the outer crossover w_c it costs
the outer loop -arg T_i(j w_c) of phase (plus a small shift of w_c from |T_i| != 1). For a
first-order inner loop T_i = 1 / (s / w_B + 1) and a ratio r = w_B / w_c the loss is
atan(1 / r): 18.4 deg at r = 3, 11.3 deg at r = 5, 5.7 deg at r = 10 (:func:`first_order_pm_loss`);
keeping the loss under 5 deg needs r >= 1 / tan(5 deg) = 11.4 (:func:`required_ratio`). (The
rule-of-thumb figures "3 costs ~7 deg, 5 costs 1-2 deg" quoted for cascade tuning are those of
atan(1 / r^2), i.e. of a much flatter inner response; for our loops the loss is computed, not
assumed: :func:`cascade_separation` evaluates both margins on the exact delays.)

Loop models (pure functions; margins from :func:`tokenfactory.controllers.stability.stability_margins`):

* :func:`reconfiguration_loop` - the backlog-feedback part of a pool controller: a worker added
  (after the scale-up delay) drains the queue at mu per second; the controller asks for
  queue / (queue_clear_s x mu x u) workers, so L(s) = (mu_plant / mu_model) e^{-theta s} /
  (u queue_clear_s s). The demand feed-forward is outside the loop (the offered rate is exogenous).
* :func:`simc_queue_clear_s` - SIMC for that integrating loop (Skogestad 2003, P-control of
  k e^{-theta s}/s: Kc = 1 / (k (tau_c + theta))), so queue_clear_s = (tau_c + theta) / u; the
  smallest tau_c that keeps the floors over an envelope is picked.
* :func:`first_order_lag` - an inner loop of one time constant (the decode batch's response).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import control
import numpy as np

from tokenfactory.controllers.envelope_tuner import SIMC_TAU_C_FACTORS, simc_search
from tokenfactory.controllers.stability import DelayedLoop, Margins, frequency_grid, pade_order_for, stability_margins
from tokenfactory.core.validation import ConfigError, check_number

__all__ = ["CascadePair", "closed_loop", "closed_loop_bandwidth", "cascade_separation", "first_order_pm_loss",
           "required_ratio", "reconfiguration_loop", "simc_queue_clear_s", "first_order_lag"]


def first_order_pm_loss(ratio: float) -> float:
    """Phase (deg) a first-order inner loop of bandwidth ``ratio`` x w_c costs at w_c: atan(1/ratio).

    Parameters
    ----------
    ratio : float
        Inner closed-loop bandwidth over the outer crossover (> 0).

    Returns
    -------
    float
        The phase lag (deg) of 1 / (s / (ratio w_c) + 1) at w_c.
    """
    check_number("ratio", ratio, low=0.0, low_inclusive=False)
    return math.degrees(math.atan(1.0 / ratio))


def required_ratio(pm_loss_deg: float) -> float:
    """Bandwidth ratio a first-order inner loop needs to cost at most ``pm_loss_deg``: 1/tan.

    Parameters
    ----------
    pm_loss_deg : float
        The phase-margin loss allowed (deg, in (0, 90)).

    Returns
    -------
    float
        1 / tan(``pm_loss_deg``) (11.4 for 5 deg).
    """
    check_number("pm_loss_deg", pm_loss_deg, low=0.0, high=90.0, low_inclusive=False, high_inclusive=False)
    return 1.0 / math.tan(math.radians(pm_loss_deg))


def first_order_lag(time_constant_s: float) -> control.TransferFunction:
    """1 / (tau s + 1).

    Parameters
    ----------
    time_constant_s : float
        tau (s, > 0).

    Returns
    -------
    control.TransferFunction
    """
    check_number("time_constant_s", time_constant_s, low=0.0, low_inclusive=False)
    return control.tf([1.0], [time_constant_s, 1.0])


def closed_loop(loop: DelayedLoop, pade_order: int | None = None) -> control.TransferFunction:
    """T(s) = L / (1 + L) as a rational model (the delay by a Pade approximation whose phase tracks
    the exact delay within 1 deg up to 10 x the loop's crossover; exact when there is no delay).

    Parameters
    ----------
    loop : DelayedLoop
        The open loop L.
    pade_order : int, optional
        Order of the delay's Pade approximation (default: the smallest that tracks it as above).

    Returns
    -------
    control.TransferFunction
        T(s).
    """
    if loop.delay == 0:
        return control.feedback(loop.rational, 1)
    if pade_order is None:
        wc = stability_margins(loop).crossover_rad_s
        w_top = 10.0 * (wc if math.isfinite(wc) else 1.0 / loop.delay)
        try:
            pade_order = pade_order_for(loop.delay, w_top)
        except ConfigError:
            pade_order = 20
    return control.feedback(loop.pade(pade_order), 1)


def closed_loop_bandwidth(loop: DelayedLoop) -> float:
    """-3 dB bandwidth (rad/s) of T = L / (1 + L) on the exact delay: the lowest frequency above
    which |T| stays under 1/sqrt(2) ... taken as the first downward crossing from low frequency.

    Parameters
    ----------
    loop : DelayedLoop
        The open loop L.

    Returns
    -------
    float
        The bandwidth (rad/s; inf when |T| never drops below 1/sqrt(2) on the grid).
    """
    w = frequency_grid(loop, 8000)
    L = loop.response(w)
    T = np.abs(L / (1.0 + L))
    below = np.nonzero(T < 1.0 / math.sqrt(2.0))[0]
    if not len(below):
        return math.inf
    i = int(below[0])
    if i == 0:
        return float(w[0])
    # interpolate in log-frequency between the last point above and the first below
    a, b = T[i - 1], T[i]
    f = (a - 1 / math.sqrt(2)) / (a - b) if a != b else 0.0
    return float(math.exp(math.log(w[i - 1]) + f * (math.log(w[i]) - math.log(w[i - 1]))))


@dataclass(frozen=True)
class CascadePair:
    """Separation of two adjacent layers: the inner closed loop's bandwidth, the outer loop's
    crossover, their ratio, and the outer loop's margins with an ideal and with the real inner loop.

    Parameters
    ----------
    outer, inner : str
        The layers' names.
    inner_bandwidth_rad_s : float
        The inner closed loop's -3 dB bandwidth (rad/s).
    outer_crossover_rad_s : float
        The outer loop's gain crossover (rad/s; NaN for a feed-forward layer).
    ratio : float
        ``inner_bandwidth_rad_s / outer_crossover_rad_s``.
    ideal, real : Margins or None
        The outer loop's margins with an ideal inner loop and with the real one (None: feed-forward).
    pm_loss_deg : float
        Phase margin the real inner loop costs (deg).
    first_order_pm_loss_deg : float
        atan(1 / ratio): the loss a first-order inner loop would cost (deg).
    note : str
        Why a pair has no margins (feed-forward), or empty.
    """

    outer: str
    inner: str
    inner_bandwidth_rad_s: float
    outer_crossover_rad_s: float
    ratio: float
    ideal: Margins | None
    real: Margins | None
    pm_loss_deg: float
    first_order_pm_loss_deg: float
    note: str = ""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ideal"] = self.ideal.to_dict() if self.ideal else None
        d["real"] = self.real.to_dict() if self.real else None
        return d


def cascade_separation(outer: str, outer_loop: DelayedLoop, inner: str, inner_closed_loop: control.TransferFunction,
                       inner_bandwidth_rad_s: float | None = None, note: str = "") -> CascadePair:
    """Margins of ``outer_loop`` with an ideal inner loop and with ``inner_closed_loop`` in series
    (the outer loop's actuator), and the bandwidth ratio.

    Parameters
    ----------
    outer, inner : str
        Layer names (reported).
    outer_loop : DelayedLoop
        The outer loop assuming an ideal inner loop.
    inner_closed_loop : control.TransferFunction
        The inner closed loop (rational; unity DC gain for a loop with integral action).
    inner_bandwidth_rad_s : float, optional
        The inner loop's bandwidth; default the -3 dB frequency of ``inner_closed_loop``.
    note : str
        What the pair's models are (reported).

    Returns
    -------
    CascadePair
    """
    ideal = stability_margins(outer_loop)
    real = stability_margins(DelayedLoop(outer_loop.rational * inner_closed_loop, outer_loop.delay,
                                         f"{outer_loop.name} with {inner}"))
    wb = inner_bandwidth_rad_s if inner_bandwidth_rad_s is not None else _tf_bandwidth(inner_closed_loop)
    wc = ideal.crossover_rad_s
    ratio = wb / wc if math.isfinite(wc) and wc > 0 else math.inf
    return CascadePair(outer, inner, float(wb), float(wc), float(ratio), ideal, real,
                       float(ideal.phase_margin_deg - real.phase_margin_deg),
                       first_order_pm_loss(ratio) if math.isfinite(ratio) else 0.0, note)


def _tf_bandwidth(tf: control.TransferFunction) -> float:
    """-3 dB bandwidth of a rational closed loop (relative to its DC gain)."""
    num, den = (np.asarray(x[0][0], dtype=float) for x in (control.tf(tf).num, control.tf(tf).den))
    ww = np.logspace(-8, 4, 2400)
    mag = np.abs(np.polyval(num, 1j * ww) / np.polyval(den, 1j * ww))
    dc = abs(np.polyval(num, 1e-12j) / np.polyval(den, 1e-12j))
    below = np.nonzero(mag < dc / math.sqrt(2.0))[0]
    if not len(below):
        return math.inf
    i = int(below[0])
    if i == 0:
        return float(ww[0])
    a, b = mag[i - 1], mag[i]
    f = (a - dc / math.sqrt(2)) / (a - b) if a != b else 0.0
    return float(math.exp(math.log(ww[i - 1]) + f * (math.log(ww[i]) - math.log(ww[i - 1]))))


def reconfiguration_loop(queue_clear_s: float, target_utilization: float, delay_s: float, *,
                         service_rate_factor: float = 1.0, name: str = "reconfiguration") -> DelayedLoop:
    """The pool controller's backlog loop: L(s) = r e^{-delay s} / (u queue_clear_s s).

    Parameters
    ----------
    queue_clear_s : float
        The controller's backlog-clearance time.
    target_utilization : float
        u: the controller divides the queue rate by the per-worker rate x u.
    delay_s : float
        Scale-up delay seen by the loop: start-up + warm-up lag + half a sample + measurement delay.
    service_rate_factor : float
        r: plant per-worker rate / the controller's model of it.
    name : str
        Label.

    Returns
    -------
    DelayedLoop
    """
    check_number("queue_clear_s", queue_clear_s, low=0.0, low_inclusive=False)
    check_number("target_utilization", target_utilization, low=0.0, high=1.0, low_inclusive=False)
    check_number("service_rate_factor", service_rate_factor, low=0.0, low_inclusive=False)
    return DelayedLoop(control.tf([service_rate_factor], [target_utilization * queue_clear_s, 0.0]), delay_s, name)


def simc_queue_clear_s(delay_s: float, target_utilization: float, *, delay_factors=(1.0,),
                       service_rate_factors=(1.0,), gm_floor: float = 2.0, pm_floor_deg: float = 45.0,
                       tau_c_factors=SIMC_TAU_C_FACTORS) -> tuple[float, float]:
    """SIMC backlog-clearance time for the reconfiguration loop, relaxed until the floors hold over
    the envelope: queue_clear_s = (tau_c + theta) / u with the first tau_c = f x theta that meets
    GM >= ``gm_floor`` and PM >= ``pm_floor_deg`` at every (delay factor, service-rate factor).

    Parameters
    ----------
    delay_s : float
        The loop's dead time theta (s, > 0).
    target_utilization : float
        The pool's target utilisation u.
    delay_factors, service_rate_factors : sequence of float
        The envelope: dead-time and service-rate multipliers.
    gm_floor, pm_floor_deg : float
        The margin floors.
    tau_c_factors : sequence of float
        tau_c / theta tried in increasing order (SIMC's tau_c = theta first).

    Returns
    -------
    tuple
        ``(queue_clear_s, tau_c / theta)``.
    """
    check_number("delay_s", delay_s, low=0.0, low_inclusive=False)
    points = [{"delay_factor": d, "service_rate_factor": r} for d in delay_factors for r in service_rate_factors]
    t = simc_search(delay_s, lambda f: (1.0 + f) * delay_s / target_utilization,
                    lambda qc: [reconfiguration_loop(qc, target_utilization, p["delay_factor"] * delay_s,
                                                     service_rate_factor=p["service_rate_factor"]) for p in points],
                    points, tau_c_factors=tau_c_factors, gm_floor=gm_floor, pm_floor_deg=pm_floor_deg,
                    field="reconfiguration.envelope")
    return t.controller, t.tau_c_over_theta
