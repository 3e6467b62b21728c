"""Auto-tuning the smoothed admission controller from the plant, and the admission loop model.

The ready buffer with decode slots full is an integrating-plus-dead-time plant,
R(s)/U(s) = e^{-theta s}/s, where theta = fill latency + KV transfer (the plant) and the loop adds
the measurement delay, half a sample period (zero-order hold) and the measurement filter's lag.
:func:`tune_smoothed_admission` applies SIMC (``tokenfactory.controllers.tuning``) to that effective delay,
starting from Skogestad's tau_c = theta and relaxing tau_c only as far as needed for the margin
floors (GM >= 2, PM >= 45 deg by default) to hold over a declared stability envelope of delay and
service-rate errors - so the controller is *shown* robust over the box it will meet, not assumed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import control
import numpy as np

from tokenfactory.controllers.admission import SmoothedAdmission
from tokenfactory.controllers.envelope_tuner import SIMC_TAU_C_FACTORS, simc_search
from tokenfactory.controllers.stability import DelayedLoop, Margins, loop_transfer
from tokenfactory.controllers.stability_batch import DelayedLoopBatch, stability_margins_batch
from tokenfactory.controllers.tuning import PIGains, effective_delay, simc_pi
from tokenfactory.plant_models.fluid import FluidPlant
from tokenfactory.core.validation import check_fields, check_number, setting

__all__ = ["StabilityEnvelope", "TuningReport", "admission_loop", "tune_smoothed_admission",
           "envelope_loops", "envelope_margins"]


@dataclass(frozen=True)
class StabilityEnvelope:
    """The box of plant errors a controller must tolerate, and the margin floors it must keep.

    ``delay_factors`` multiply the plant's delays (fill-to-ready and measurement);
    ``service_rate_factors`` multiply fill and decode service rates (0.7 = 30 % slower than the
    roofline model predicts).

    Parameters
    ----------
    delay_factors : tuple of float
        Multipliers (> 0, dimensionless) on the plant's fill-to-ready and measurement delays
        (default 0.5, 1, 2).
    service_rate_factors : tuple of float
        Multipliers (> 0, dimensionless) on fill and decode service rates (default 0.7, 1, 1.3).
    gm_floor : float
        Minimum gain margin (factor, >= 1; default 2): the loop gain may grow by this factor and
        shrink by its inverse at every point.
    pm_floor_deg : float
        Minimum |phase margin| (degrees, in [0, 90]; default 45) at every gain crossover.

    Raises
    ------
    ConfigError
        For a non-positive factor or a floor outside its range (fields ``envelope.*``).
    """

    delay_factors: tuple[float, ...] = setting((0.5, 1.0, 2.0), kind="list of numbers",
                                               meaning="multipliers (each > 0) on the plant's fill-to-ready and "
                                                       "measurement delays that the loop must tolerate")
    service_rate_factors: tuple[float, ...] = setting((0.7, 1.0, 1.3), kind="list of numbers",
                                                      meaning="multipliers (each > 0) on fill and decode service "
                                                              "rates (0.7 = 30 % slower than the model predicts)")
    gm_floor: float = setting(2.0, low=1.0, meaning="minimum gain margin (a factor) at every point of the envelope")
    pm_floor_deg: float = setting(45.0, unit="deg", low=0.0, high=90.0,
                                  meaning="minimum |phase margin| at every gain crossover of the envelope")

    def __post_init__(self) -> None:
        for i, f in enumerate(self.delay_factors):
            check_number(f"envelope.delay_factors[{i}]", f, low=0.0, low_inclusive=False)
        for i, f in enumerate(self.service_rate_factors):
            check_number(f"envelope.service_rate_factors[{i}]", f, low=0.0, low_inclusive=False)
        check_fields(self, "envelope", names=("gm_floor", "pm_floor_deg"), hold=False)

    def points(self):
        """Every (delay factor, service-rate factor) pair of the box, delay-major (list of tuples)."""
        return [(d, r) for d in self.delay_factors for r in self.service_rate_factors]


def _plant_model(plant: FluidPlant, delay_factor: float, service_rate_factor: float):
    params = plant.params.scaled(delay_factor=delay_factor, service_rate_factor=service_rate_factor)
    P, theta = FluidPlant(params, plant.fill_workers, plant.decode_workers).ready_buffer_tf()
    return P, theta + params.measurement_delay_s


def _cached_plant_model(plant: FluidPlant, delay_factor: float, service_rate_factor: float, cache: dict | None):
    key = (delay_factor, service_rate_factor)
    if cache is not None and key in cache:
        return cache[key]
    out = _plant_model(plant, delay_factor, service_rate_factor)
    if cache is not None:
        cache[key] = out
    return out


def admission_loop(plant: FluidPlant, controller: SmoothedAdmission, *, delay_factor: float = 1.0,
                   service_rate_factor: float = 1.0, _plant_model_cache: dict | None = None) -> DelayedLoop:
    """L(s) = C(s) F(s) P(s) e^{-(theta + tau_m + T/2) s} for ``controller`` on a (perturbed) plant.

    P(s) comes from linearising the fluid model at its regulated operating point
    (:meth:`FluidPlant.ready_buffer_tf`), not from the closed form. theta is the fill-to-ready
    delay (fill latency + KV transfer), tau_m the measurement delay, T the controller's sample
    period (the zero-order hold adds T/2) and F(s) its measurement filter (the delayed loop of
    article section 18).

    Parameters
    ----------
    plant : FluidPlant
        The nominal plant (parameters and worker counts).
    controller : SmoothedAdmission
        The controller whose C(s), F(s) and sample period close the loop.
    delay_factor : float
        Multiplier (> 0; default 1) on the fill-to-ready and measurement delays.
    service_rate_factor : float
        Multiplier (> 0; default 1) on fill and decode service rates.

    Returns
    -------
    DelayedLoop
        The open loop, from ready-buffer error (requests) round to the measured ready level, named
        after the perturbation.

    Raises
    ------
    ConfigError
        For a non-positive ``delay_factor`` or ``service_rate_factor``.
    """
    P, delay = _cached_plant_model(plant, delay_factor, service_rate_factor, _plant_model_cache)
    return loop_transfer(controller.transfer_function(), P, delay + controller.sample_period / 2.0,
                         controller.measurement_filter(),
                         name=f"admission delay x{delay_factor:g} rate x{service_rate_factor:g}")


def envelope_loops(plant: FluidPlant, controller: SmoothedAdmission, envelope: StabilityEnvelope,
                   _cache: dict | None = None) -> DelayedLoopBatch:
    """:func:`admission_loop` at every point of ``envelope``, as one :class:`DelayedLoopBatch`.

    The loop polynomials are C F P multiplied as coefficient arrays, all points at once (the
    products :func:`admission_loop` forms with python-control objects, to rounding); each
    perturbed plant P is linearised once per (delay factor, service-rate factor) and kept in
    ``_cache``.

    Parameters
    ----------
    plant : FluidPlant
        The nominal plant.
    controller : SmoothedAdmission
        The controller.
    envelope : StabilityEnvelope
        Its points, in :meth:`StabilityEnvelope.points` order.

    Returns
    -------
    DelayedLoopBatch
        One loop per envelope point.
    """
    C, F = control.tf(controller.transfer_function()), control.tf(controller.measurement_filter())
    pts = envelope.points()
    models = [_cached_plant_model(plant, d, r, _cache) for d, r in pts]
    p_num = [_lead_trimmed(P.num[0][0]) for P, _ in models]
    p_den = [_lead_trimmed(P.den[0][0]) for P, _ in models]
    width_n = max(len(x) for x in p_num)
    width_d = max(len(x) for x in p_den)
    # plant polynomials as rows (shorter ones padded with leading zeros, which the products keep)
    pn = np.array([np.concatenate([np.zeros(width_n - len(x)), x]) for x in p_num])
    pd_ = np.array([np.concatenate([np.zeros(width_d - len(x)), x]) for x in p_den])
    # C * P first, then * F: the products loop_transfer forms (python-control multiplies with polymul)
    num = _convolve_rows(np.asarray(F.num[0][0], float), _convolve_rows(np.asarray(C.num[0][0], float), pn))
    den = _convolve_rows(np.asarray(F.den[0][0], float), _convolve_rows(np.asarray(C.den[0][0], float), pd_))
    delays = np.array([delay for _, delay in models]) + controller.sample_period / 2.0
    return DelayedLoopBatch(num, den, delays, tuple(f"admission delay x{d:g} rate x{r:g}" for d, r in pts))


def _lead_trimmed(c) -> np.ndarray:
    c = np.asarray(c, float)
    return c[int(np.argmax(c != 0)):] if c.size and c[0] == 0 else c


def _convolve_rows(a: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """np.convolve(a, row) for every row of ``rows`` at once."""
    a = np.trim_zeros(a, "f")
    out = np.zeros((rows.shape[0], rows.shape[1] + len(a) - 1))
    for i, c in enumerate(a):
        out[:, i:i + rows.shape[1]] += c * rows
    return out


def envelope_margins(plant: FluidPlant, controller: SmoothedAdmission,
                     envelope: StabilityEnvelope, _cache: dict | None = None) -> list[dict]:
    """Exact-delay verdict and margins at every point of the envelope (one dict per point),
    computed together by :func:`stability_margins_batch`; ``meets_floors`` needs the Nyquist
    verdict stable as well as the floors.

    Parameters
    ----------
    plant : FluidPlant
        The nominal plant.
    controller : SmoothedAdmission
        The controller to check.
    envelope : StabilityEnvelope
        The box of delay and service-rate factors, and the margin floors.

    Returns
    -------
    list of dict
        One row per envelope point, delay-major: ``delay_factor``, ``service_rate_factor``, the
        fields of :class:`~tokenfactory.controllers.stability.Margins` (``gain_margin``,
        ``phase_margin_deg``, ``delay_margin_s`` in s, ``ms``, ..., ``stable``) and
        ``meets_floors`` (bool: the Nyquist verdict stable *and* the floors met).
    """
    loops = envelope_loops(plant, controller, envelope, _cache)
    mb = stability_margins_batch(loops)
    meets = mb.meets(envelope.gm_floor, envelope.pm_floor_deg).tolist()
    return [{"delay_factor": d, "service_rate_factor": r, **m, "meets_floors": ok}
            for (d, r), m, ok in zip(envelope.points(), mb.to_dicts(), meets)]


@dataclass
class TuningReport:
    """How the controller was derived: delays, tau_c choice, target sizing, envelope margins.

    Built by :func:`tune_smoothed_admission`; ``to_dict()`` gives it as plain data for results.

    Parameters
    ----------
    plant_delay_s : float
        Fill-to-ready delay theta of the nominal plant (s): fill latency + KV transfer.
    measurement_delay_s : float
        Age of the measurement when the controller reads it (s).
    sample_period_s : float
        Controller sample period T (s).
    filter_tau_s : float
        Measurement filter time constant (s).
    effective_delay_s : float
        theta_eff = plant delay + measurement delay + T/2 + filter tau (s), the delay SIMC is
        applied to.
    tau_c_s : float
        The chosen closed-loop time constant (s).
    tau_c_over_theta : float
        ``tau_c_s`` / ``effective_delay_s``: the first factor that met the floors (1 is
        Skogestad's tight-but-robust choice).
    gains : PIGains
        The PI gains (``kc`` in 1/s, ``ti`` in s).
    consumption_rate : float
        Decode capacity c of the nominal plant (requests/s), the feed-forward level and the rate
        the ready buffer is sized against.
    target_ready : float
        Ready-buffer setpoint (requests): c x theta_eff + ``target_ready_safety``.
    target_ready_safety : float
        The Poisson safety term of the setpoint (requests): safety_z sqrt(c x theta_eff).
    nominal_margins : Margins
        Exact-delay margins of the nominal loop.
    envelope : StabilityEnvelope
        The box the controller was checked over.
    envelope_margins : list of dict
        One row per envelope point (see :func:`envelope_margins`).
    """

    plant_delay_s: float
    measurement_delay_s: float
    sample_period_s: float
    filter_tau_s: float
    effective_delay_s: float
    tau_c_s: float
    tau_c_over_theta: float
    gains: PIGains
    consumption_rate: float
    target_ready: float
    target_ready_safety: float
    nominal_margins: Margins
    envelope: StabilityEnvelope
    envelope_margins: list[dict] = field(default_factory=list)

    @property
    def envelope_ok(self) -> bool:
        """Whether every envelope point meets the floors with a stable Nyquist verdict."""
        return all(r["meets_floors"] for r in self.envelope_margins)

    @property
    def worst_envelope_point(self) -> dict:
        """The envelope row closest to instability (an unstable one first, then smallest |PM|)."""
        # an unstable point first (by the Nyquist count), then the smallest |PM|, then GM
        return min(self.envelope_margins, key=lambda r: (r["stable"], abs(r["phase_margin_deg"]), r["gain_margin"]))

    def to_dict(self) -> dict:
        """The report as plain data (margins as dicts, plus ``envelope_ok``)."""
        d = asdict(self)
        d["nominal_margins"] = self.nominal_margins.to_dict()
        d["envelope_ok"] = self.envelope_ok
        return d


def tune_smoothed_admission(plant: FluidPlant, *, sample_period: float = 0.25,
                            filter_tau: float | None = None, service_filter_tau: float = 5.0,
                            envelope: StabilityEnvelope = StabilityEnvelope(), safety_z: float = 2.0,
                            backlog_bound_s: float = 30.0, rate_limit_per_s: float | None = None,
                            tau_c_factors=SIMC_TAU_C_FACTORS
                            ) -> tuple[SmoothedAdmission, TuningReport]:
    """SIMC-tune :class:`SmoothedAdmission` for ``plant`` and check it over ``envelope``.

    * theta_eff = fill-to-ready delay + measurement delay + T/2 + filter_tau (default filter T)
    * tau_c = the first of ``tau_c_factors`` x theta_eff that meets the envelope's floors
    * target ready level = c x theta_eff + safety_z sqrt(c x theta_eff): what decode consumes
      during one loop delay plus a Poisson safety term, c = decode capacity (requests/s)
    * backlog bound = ``backlog_bound_s`` seconds of decode capacity; rate limit default c per
      theta_eff (never active in the small-signal range)

    SIMC is Skogestad (2003), Table 1 (see :mod:`tokenfactory.controllers.tuning`); the
    controller is article section 18's smoothed, service-rate-predicting admission.

    Parameters
    ----------
    plant : FluidPlant
        The plant to tune for (its parameters and worker counts fix theta and c).
    sample_period : float
        Controller sample period T (s, > 0; default 0.25).
    filter_tau : float or None
        Measurement filter time constant (s, >= 0); ``None`` (default) uses ``sample_period``.
    service_filter_tau : float
        Time constant of the completion-rate feed-forward filter (s, >= 0; default 5).
    envelope : StabilityEnvelope
        The box of plant errors and the margin floors to meet (default: delays x0.5-2, service
        rates x0.7-1.3, GM >= 2, PM >= 45 deg).
    safety_z : float
        Standard deviations of Poisson safety in the ready-buffer target (>= 0; default 2).
    backlog_bound_s : float
        Backlog bound as seconds of decode capacity (s, > 0; default 30).
    rate_limit_per_s : float or None
        Slew limit on admission (requests/s per second); ``None`` (default) uses c / theta_eff.
    tau_c_factors : sequence of float
        Candidate tau_c / theta_eff ratios, tried in order (default
        :data:`~tokenfactory.controllers.envelope_tuner.SIMC_TAU_C_FACTORS`, 1 to 8); the search is
        :func:`~tokenfactory.controllers.envelope_tuner.simc_search`.

    Returns
    -------
    controller : SmoothedAdmission
        The tuned controller.
    report : TuningReport
        How it was derived, with its nominal and envelope margins.

    Raises
    ------
    ConfigError
        For a parameter outside its range (fields ``tuning.*``), or, field ``tuning.envelope``,
        when no factor in ``tau_c_factors`` meets the floors (the message names the worst point).
    """
    check_number("tuning.sample_period", sample_period, low=0.0, low_inclusive=False)
    filter_tau = sample_period if filter_tau is None else check_number("tuning.filter_tau", filter_tau, low=0.0)
    check_number("tuning.safety_z", safety_z, low=0.0)
    check_number("tuning.backlog_bound_s", backlog_bound_s, low=0.0, low_inclusive=False)
    p = plant.params
    theta = effective_delay(p.fill_to_ready_s, p.measurement_delay_s, sample_period, filter_tau)
    c = plant.decode_capacity
    target_base = c * theta
    safety = safety_z * math.sqrt(target_base)
    rate_limit = c / theta if rate_limit_per_s is None else rate_limit_per_s
    cache: dict = {}  # the perturbed plants do not depend on tau_c: linearise each once

    def controller_at(factor: float) -> SmoothedAdmission:
        return SmoothedAdmission(target_base + safety, simc_pi(1.0, theta, tau_c=factor * theta),
                                 filter_tau=filter_tau, service_filter_tau=service_filter_tau,
                                 sample_period=sample_period, rate_limit=rate_limit, backlog_bound=backlog_bound_s * c)

    points = [{"delay_factor": d, "service_rate_factor": r} for d, r in envelope.points()]
    t = simc_search(theta, controller_at, lambda ctrl: envelope_loops(plant, ctrl, envelope, cache), points,
                    nominal_loop=lambda ctrl: admission_loop(plant, ctrl, _plant_model_cache=cache),
                    tau_c_factors=tau_c_factors, gm_floor=envelope.gm_floor, pm_floor_deg=envelope.pm_floor_deg,
                    field="tuning.envelope")
    ctrl = t.controller
    return ctrl, TuningReport(p.fill_to_ready_s, p.measurement_delay_s, sample_period, filter_tau, theta, t.tau_c_s,
                              t.tau_c_over_theta, ctrl.gains, c, target_base + safety, safety, t.nominal, envelope,
                              t.envelope)
