"""Admission controllers for the buffers/admission layer (0.1-10 s; article sections 18, 22).

* :class:`CompletionTriggeredAdmission` - the naive loop of section 18: admission follows the
  observed decode completions and swings open or shut on the instantaneous, delayed ready level.
* :class:`ThresholdAdmission` - admit at full rate while a busy signal is under a threshold
  (a frontend answering 503 when busy).
* :class:`SmoothedAdmission` - feed-forward of the predicted decode service rate plus PI control
  of the filtered ready buffer toward a sized target, with anti-windup, rate limits and explicit
  shedding of backlog over a bound.

All share the :mod:`tokenfactory.controllers.interface` protocol and return
:class:`tokenfactory.core.signals.AdmissionAction`.
"""

from __future__ import annotations

import math

import control

from tokenfactory.controllers.interface import SampledController, lowpass
from tokenfactory.controllers.tuning import PIGains
from tokenfactory.core.signals import AdmissionAction, Measurement
from tokenfactory.core.validation import check_choice, check_number

__all__ = ["CompletionTriggeredAdmission", "ThresholdAdmission", "SmoothedAdmission"]


class CompletionTriggeredAdmission(SampledController):
    """Section 18's naive loop, in fluid form.

    Each observed completion admits one request, scaled up by ``1 + open_gain`` while the observed
    ready queue is below ``low_water`` (it "opens aggressively when the ready queue drains") and
    down by ``1 - open_gain`` otherwise. It acts on the raw, delayed measurement with no filtering:
    around its operating point it is a relay of amplitude ``open_gain x completion rate``, which
    with the ready buffer's integrator and the loop delay makes a limit cycle.
    ``open_floor`` (requests/s) lets it start from an empty factory.

    It is kept as the counter-example the analysis predicts and the simulators reproduce
    (:func:`tokenfactory.scenario.naive_limit_cycle`), not as a controller to deploy.

    Parameters
    ----------
    open_gain : float
        Fractional swing of admission around the observed completion rate, in (0, 1] (default 1:
        admit twice the completions while the ready queue is low, nothing otherwise).
    low_water : float
        Ready-queue level (requests, >= 0; default 1) below which admission opens.
    open_floor : float
        Minimum admission rate while open (requests/s, >= 0; default 1), so an empty factory with
        no completions to follow still starts.
    sample_period : float
        Seconds between samples (> 0; default 0.05).

    Raises
    ------
    ConfigError
        For a parameter outside its range (fields ``naive.open_gain``, ``naive.low_water``,
        ``naive.open_floor``, ``naive.sample_period``).
    """

    name = "naive"

    def __init__(self, open_gain: float = 1.0, low_water: float = 1.0, open_floor: float = 1.0,
                 sample_period: float = 0.05):
        super().__init__(sample_period)
        self.open_gain = check_number("naive.open_gain", open_gain, low=0.0, high=1.0, low_inclusive=False)
        self.low_water = check_number("naive.low_water", low_water, low=0.0)
        self.open_floor = check_number("naive.open_floor", open_floor, low=0.0)

    def update(self, t: float, m: Measurement) -> AdmissionAction:
        c = m.completion_rate
        if m.ready < self.low_water:
            return AdmissionAction(max(c * (1.0 + self.open_gain), self.open_floor))
        return AdmissionAction(c * (1.0 - self.open_gain))

    def relay_amplitude(self, completion_rate: float) -> float:
        """Half the swing of the admission rate around ``completion_rate`` (requests/s)."""
        return self.open_gain * completion_rate

    def describing_nonlinearity(self, completion_rate: float):
        """The ideal relay this controller is around ``completion_rate`` (python-control object)."""
        return control.relay_hysteresis_nonlinearity(b=self.relay_amplitude(completion_rate), c=0.0)

    def params(self) -> dict:
        return {"open_gain": self.open_gain, "low_water": self.low_water, "open_floor": self.open_floor,
                "sample_period": self.sample_period}


class ThresholdAdmission(SampledController):
    """On/off admission: full ``open_rate`` (default the measured fill capacity) while the busy
    signal is under ``threshold``, nothing above it. ``hysteresis`` > 0 re-opens only below
    ``threshold - hysteresis``. Signals: ``kv_occupancy`` ((decoding + ready) / slots),
    ``decode_utilization``, ``ready`` (requests).

    The relay with optional hysteresis that a busy-503 frontend is; the describing-function
    analysis of :mod:`tokenfactory.controllers.describing` predicts its limit cycle.

    Parameters
    ----------
    threshold : float
        Level of ``signal`` (>= 0, in that signal's unit: a fraction for ``kv_occupancy`` and
        ``decode_utilization``, requests for ``ready``) at or above which admission closes
        (default 1.05).
    hysteresis : float
        Width of the dead band below ``threshold``, in the same unit, in [0, ``threshold``]
        (default 0: re-open as soon as the signal drops under ``threshold``).
    signal : {"kv_occupancy", "decode_utilization", "ready"}
        The busy signal read from the :class:`~tokenfactory.core.signals.Measurement` (default
        ``"kv_occupancy"``).
    open_rate : float or None
        Admission rate while open (requests/s, >= 0); ``None`` (default) admits at the measured
        fill capacity.
    sample_period : float
        Seconds between samples (> 0; default 0.1).

    Raises
    ------
    ConfigError
        For a value outside its range or an unknown ``signal`` (fields ``threshold.*``).
    """

    name = "threshold"
    SIGNALS = ("kv_occupancy", "decode_utilization", "ready")

    def __init__(self, threshold: float = 1.05, hysteresis: float = 0.0, signal: str = "kv_occupancy",
                 open_rate: float | None = None, sample_period: float = 0.1):
        super().__init__(sample_period)
        self.threshold = check_number("threshold.threshold", threshold, low=0.0)
        self.hysteresis = check_number("threshold.hysteresis", hysteresis, low=0.0, high=threshold)
        self.signal = check_choice("threshold.signal", signal, self.SIGNALS)
        self.open_rate = None if open_rate is None else check_number("threshold.open_rate", open_rate, low=0.0)
        self.reset()

    def reset(self) -> None:
        self._open = True

    def _busy(self, m: Measurement) -> float:
        return m.ready if self.signal == "ready" else getattr(m, self.signal)

    def update(self, t: float, m: Measurement) -> AdmissionAction:
        busy = self._busy(m)
        if busy >= self.threshold:
            self._open = False
        elif busy < self.threshold - self.hysteresis:
            self._open = True
        rate = m.fill_capacity if self.open_rate is None else self.open_rate
        return AdmissionAction(rate if self._open else 0.0)

    def params(self) -> dict:
        return {"threshold": self.threshold, "hysteresis": self.hysteresis, "signal": self.signal,
                "open_rate": self.open_rate, "sample_period": self.sample_period}


class SmoothedAdmission(SampledController):
    """Feed-forward of predicted decode service rate + PI on the filtered ready buffer.

    rate = c_f + kc (e + I / ti),   e = target - W_f,
    where c_f is the filtered completion rate (``service_filter_tau``) and W_f the filtered
    (``filter_tau``) KV-resident work, active decodes + ready, with target decode slots +
    ``target_ready``. With the decode slots full this is exactly ready-buffer control (W - slots
    = ready); when decode has free slots the same error opens admission to fill them, so a cold
    or under-loaded factory is not throttled (``regulate="ready"`` uses the ready level alone). The rate is clipped to [0, ``max_rate``] (default the measured fill capacity)
    and slew-limited to ``rate_limit`` requests/s per second. Anti-windup by conditional
    integration: the integral freezes while the output is clipped in the direction of the error,
    or while the backlog is empty so a higher command could not be realised. Backlog above
    ``backlog_bound`` requests is shed explicitly (reason ``backlog_over_bound``).

    This is article section 18's remedy (regulate admission on the smoothed backlog and the
    predicted service rate, with a ready buffer between the stages) on section 22's 0.1-10 s
    time scale. :func:`tokenfactory.controllers.autotune.tune_smoothed_admission` sizes
    ``target_ready`` and the gains from the plant (SIMC, Skogestad 2003).

    Parameters
    ----------
    target_ready : float
        Ready-buffer setpoint (requests, >= 0): KV-ready requests kept waiting for a decode slot so
        decode never starves while admission reacts.
    gains : PIGains
        PI gains in ideal form (``kc`` > 0 in (requests/s) per request = 1/s, ``ti`` > 0 in s).
    filter_tau : float
        Time constant (s, >= 0; default 0.5) of the first-order low-pass on the regulated level;
        0 disables it.
    service_filter_tau : float
        Time constant (s, >= 0; default 5) of the low-pass on the completion rate used as
        feed-forward; 0 disables it.
    sample_period : float
        Seconds between samples (> 0; default 0.25).
    max_rate : float or None
        Upper clip of the admission rate (requests/s, >= 0); ``None`` (default) uses the measured
        fill capacity at each sample.
    rate_limit : float
        Slew limit on the admission rate (requests/s per second, > 0; default ``inf``: none).
    backlog_bound : float
        Backlog (requests, >= 0; default ``inf``: never shed) above which waiting requests are
        rejected with reason ``backlog_over_bound``.
    regulate : {"kv_work", "ready"}
        The regulated level: ``"kv_work"`` (default) active decodes + ready against decode slots +
        ``target_ready``; ``"ready"`` the ready buffer alone against ``target_ready``.

    Raises
    ------
    ConfigError
        For a value outside its range (fields ``smoothed.*``, including ``smoothed.kc`` and
        ``smoothed.ti``).
    """

    name = "smoothed"

    def __init__(self, target_ready: float, gains: PIGains, *, filter_tau: float = 0.5,
                 service_filter_tau: float = 5.0, sample_period: float = 0.25,
                 max_rate: float | None = None, rate_limit: float = math.inf,
                 backlog_bound: float = math.inf, regulate: str = "kv_work"):
        super().__init__(sample_period)
        self.regulate = check_choice("smoothed.regulate", regulate, ("kv_work", "ready"))
        self.target_ready = check_number("smoothed.target_ready", target_ready, low=0.0)
        self.gains = gains
        check_number("smoothed.kc", gains.kc, low=0.0, low_inclusive=False)
        check_number("smoothed.ti", gains.ti, low=0.0, low_inclusive=False)
        self.filter_tau = check_number("smoothed.filter_tau", filter_tau, low=0.0)
        self.service_filter_tau = check_number("smoothed.service_filter_tau", service_filter_tau, low=0.0)
        self.max_rate = None if max_rate is None else check_number("smoothed.max_rate", max_rate, low=0.0)
        self.rate_limit = check_number("smoothed.rate_limit", rate_limit, low=0.0, low_inclusive=False,
                                       allow_inf=True)
        self.backlog_bound = check_number("smoothed.backlog_bound", backlog_bound, low=0.0, allow_inf=True)
        self.reset()

    def reset(self) -> None:
        self._ready_f = None
        self._service_f = None
        self._integral = 0.0
        self._rate = None

    def update(self, t: float, m: Measurement) -> AdmissionAction:
        T = self.sample_period
        if self.regulate == "kv_work":
            measured, target = m.active_decodes + m.ready, m.decode_slots + self.target_ready
        else:
            measured, target = m.ready, self.target_ready
        self._ready_f = lowpass(self._ready_f, measured, self.filter_tau, T)
        self._service_f = lowpass(self._service_f, m.completion_rate, self.service_filter_tau, T)
        e = target - self._ready_f
        kc, ti = self.gains.kc, self.gains.ti
        hi = m.fill_capacity if self.max_rate is None else self.max_rate
        unclipped = self._service_f + kc * (e + self._integral / ti)
        rate = min(max(unclipped, 0.0), hi)
        if self._rate is not None:  # slew limit
            step = self.rate_limit * T
            rate = min(max(rate, self._rate - step), self._rate + step)
        starved_input = m.backlog <= m.admitted_rate * T + 1e-9  # nothing to admit beyond arrivals
        windup = (e > 0 and (unclipped >= hi or starved_input)) or (e < 0 and unclipped <= 0.0)
        if not windup:
            self._integral += e * T
        self._rate = rate
        return AdmissionAction(rate, self.backlog_bound)

    def transfer_function(self) -> control.TransferFunction:
        """C(s) = kc (1 + 1/(ti s)), from ready-buffer error (requests) to admission (requests/s)."""
        kc, ti = self.gains.kc, self.gains.ti
        return control.tf([kc * ti, kc], [ti, 0.0])

    def measurement_filter(self) -> control.TransferFunction:
        """F(s) = 1/(filter_tau s + 1) on the measured ready level."""
        return control.tf([1.0], [self.filter_tau, 1.0]) if self.filter_tau > 0 else control.tf([1.0], [1.0])

    def params(self) -> dict:
        return {"target_ready": self.target_ready, **self.gains.to_dict(), "filter_tau": self.filter_tau,
                "service_filter_tau": self.service_filter_tau, "sample_period": self.sample_period,
                "max_rate": self.max_rate, "rate_limit": self.rate_limit, "backlog_bound": self.backlog_bound,
                "regulate": self.regulate}
