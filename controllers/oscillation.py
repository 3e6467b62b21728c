"""Time-domain oscillation detectors on a uniformly sampled signal, and one verdict.

Indices and their published thresholds:

* **Thornhill regularity r** (Thornhill, Huang & Zhang 2003, "Detection of multiple oscillations in
  control loops", J. Process Control 13(1):91-100): from the intervals between zero crossings of
  the autocorrelation function (ACF), r = mean(T_p) / (3 std(T_p)) over the implied periods T_p;
  r > 1 means a regular oscillation.
* **Miao-Seborg decay ratio R** (Miao & Seborg 1999, "Automatic detection of excessively
  oscillatory feedback control loops", IEEE CCA): the ACF's first peak height above the line
  joining its first two minima (a) over the first minimum's depth below the line joining lag 0
  and the first peak (b); R = a/b > 0.5 flags an excessively oscillatory loop.
* **Forsman-Stattin h** (Forsman & Stattin 1999, "A new criterion for detecting oscillations in
  control loops", ECC): the fraction of consecutive same-sign half-waves of the mean-removed
  signal whose areas (IAE) agree within alpha=0.5 and durations within gamma=0.75;
  h > 0.4 indicates an oscillation (white noise gives h ~ 0.1).
* **Dominant spectral peak fraction**: share of the (Welch) power in the band +/-20 % around the
  strongest non-DC peak. Our own screening index, not a published test: it is reported, and
  0.5 is used only as a corroborating signal.
* **Hagglund IAE detector** (Hagglund 1995, "A control-loop performance monitor", Control Eng.
  Practice 3(11):1543-1551): IAE between successive zero crossings is compared with
  IAE_lim = 2 a / w_u (a: acceptable amplitude, w_u: the oscillation's angular frequency); a
  limit-cycle alarm is raised when more than n_lim = 10 such load disturbances fall in a
  supervision window of 50 periods (the paper's T_sup = 50 T_i with T_i = the period here).

Verdict (documented rule): ``oscillating`` when the amplitude is at least ``min_amplitude`` and
r > 1 and at least one of (R > 0.5, h > 0.4). Regularity alone (r) separates oscillation from
noise; the second index guards against a regular but decaying transient.

One verdict for a whole run (:func:`judge_actuators`, what every plant's result reports as
``oscillating``): the detectors on every actuator the controllers move - the provisioned size of
each pool, the decode batch cap, the fill reservation, the admission rate - and on the buffers
(ready requests, queued prefill tokens), plus a **churn** verdict on the pool-scale actions:
more than :data:`CHURN_REVERSALS_PER_HOUR` reversals (a move undoing the previous move's
direction on the same pool, by at least :data:`CHURN_MIN_STEP` of the pool) per hour of one pool,
and more than :data:`CHURN_MIN_REVERSALS` in all, beyond the turns of the demand itself (its
10-minute mean moving back by a tenth: a pool that follows its demand reverses where it turns). The
regular-cycle detectors need a period; churn needs none, so it catches irregular flapping.

**Forced or self-sustained** (:func:`forced_response`). A cycle the detectors find is tested
against the exogenous inputs - the offered demand (no layer's action changes it) and, where the
caller gives it, the actuator's open-loop replay (what the plan asks for with the loop through the
plant opened). When the Welch magnitude-squared coherence (:func:`scipy.signal.coherence`) of the
cycling signal with an input, read at the input's strongest component within +/-20 % of the
cycle's frequency, is at least :data:`FORCED_COHERENCE` = 0.5 and above Carter's significance
level for the segments averaged (1 - 0.01^(1/(K-1)), Carter 1987), the cycle is the input's
*forced response*: reported per signal (``forced: true``, ``forced_by`` the input,
``input_period_s``, ``coherence``) and not counted as ``oscillating``; otherwise ``forced_by`` is
None and ``tested_against`` lists the inputs tried. A self-sustained cycle (a limit cycle, a loop short of margin) runs
at its own frequency and phase, incoherent with the input (Nayfeh & Mook 1979, forced vs
self-excited oscillations); one entrained by the input is counted as forced, since the input then
sets its period. Without an input, or with fewer than two segments of four periods, every cycle
counts.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from scipy import signal as sps

from tokenfactory.core.validation import ConfigError, check_number

__all__ = [
    "OscillationReport",
    "autocorrelation",
    "thornhill_regularity",
    "decay_ratio",
    "forsman_stattin_h",
    "spectral_peak_fraction",
    "hagglund_detections",
    "first_harmonic_amplitude",
    "assess",
    "ActuatorVerdict",
    "judge_actuators",
    "forced_response",
    "FORCED_COHERENCE",
    "FORCED_SIGNIFICANCE",
    "CHURN_REVERSALS_PER_HOUR",
    "CHURN_MIN_REVERSALS",
    "CHURN_MIN_STEP",
    "POOL_MIN_AMPLITUDE",
    "RELATIVE_MIN_AMPLITUDE",
]

THORNHILL_R = 1.0
DECAY_RATIO = 0.5
FORSMAN_H = 0.4
SPECTRAL_FRACTION = 0.5
HAGGLUND_N_LIM = 10

#: Churn bound on pool moves (reversals per hour). Why 2: a pool that follows its demand
#: reverses where the demand turns - twice a day for a daily cycle, twice per burst it follows up
#: and back down - and every reversal costs a start-up (GPU time billed without service). One
#: burst followed per hour is two reversals; a controller that reverses more often than that is
#: answering noise or its own delayed measurements, not the demand. This is also issue 21's
#: target for the pool controller (reversals/h <= 2).
CHURN_REVERSALS_PER_HOUR = 2.0
#: ... and at least this many reversals before a run is called churning: one up-and-down-and-up
#: (two reversals) in a short run is one followed burst, not churn.
CHURN_MIN_REVERSALS = 2
#: a reversing move counts toward churn when it moves at least this share of the pool (and one
#: worker): the same ripple threshold as :data:`RELATIVE_MIN_AMPLITUDE`
CHURN_MIN_STEP = 0.1
#: a pool follows its demand's mean over this window (s): what is faster, no start-up can follow
DEMAND_SMOOTHING_S = 600.0
#: pool-size swings below a quarter worker are not flapping (workers)
POOL_MIN_AMPLITUDE = 0.25
#: swings of a continuous actuator (batch cap, reservation, admission rate) below this share of
#: its mean level are ripple, not a cycle
RELATIVE_MIN_AMPLITUDE = 0.1


def _prepare(x, dt: float) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    if x.ndim != 1 or x.size < 16:
        raise ConfigError("signal", f"needs a 1-D signal of at least 16 samples, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ConfigError("signal", "contains NaN or infinite samples")
    check_number("dt", dt, low=0.0, low_inclusive=False)
    return sps.detrend(x, type="linear")


def autocorrelation(x: np.ndarray, max_lag: int | None = None) -> np.ndarray:
    """Biased, normalised ACF of an already mean-removed signal (ACF[0] = 1), via FFT.

    Parameters
    ----------
    x : ndarray
        The signal, mean-removed (or detrended) by the caller.
    max_lag : int, optional
        Largest lag in samples (default ``len(x) // 2``; at most ``len(x) - 1`` is meaningful).

    Returns
    -------
    ndarray
        ACF at lags 0 .. ``max_lag`` (the biased estimator: every lag divided by the same
        lag-0 sum, so it tapers towards long lags); all zeros for a zero signal.
    """
    n = len(x)
    max_lag = n // 2 if max_lag is None else max_lag
    f = np.fft.rfft(x, 2 * n)
    acf = np.fft.irfft(f * np.conj(f))[: max_lag + 1]
    return acf / acf[0] if acf[0] > 0 else np.zeros(max_lag + 1)


def _zero_crossings(y: np.ndarray) -> np.ndarray:
    """Fractional indices where y changes sign (linear interpolation)."""
    s = np.sign(y)
    idx = np.nonzero((s[:-1] * s[1:]) < 0)[0]
    return idx + y[idx] / (y[idx] - y[idx + 1])


def thornhill_regularity(acf: np.ndarray, dt: float, max_crossings: int = 12) -> tuple[float, float]:
    """(r, period_s) from ACF zero crossings; r = nan if fewer than 4 crossings.

    Parameters
    ----------
    acf : ndarray
        Normalised autocorrelation function (:func:`autocorrelation`).
    dt : float
        Sample period of the signal (s).
    max_crossings : int
        Zero crossings used, from lag 0 (default 12: the first five to six periods, where the
        ACF is still well estimated).

    Returns
    -------
    r : float
        Regularity mean(T_p) / (3 std(T_p)) (Thornhill et al. 2003); > 1 means regular;
        inf when every period is equal, nan with fewer than 4 crossings.
    period_s : float
        Mean period (s), nan with fewer than 4 crossings.
    """
    zc = _zero_crossings(acf)[:max_crossings]
    if len(zc) < 4:
        return math.nan, math.nan
    # every other crossing spans one period: T_p = z[i+2] - z[i]
    periods = (zc[2:] - zc[:-2]) * dt
    sd = periods.std(ddof=1) if len(periods) > 1 else 0.0
    mean = periods.mean()
    r = math.inf if sd == 0 else mean / (3.0 * sd)
    return float(r), float(mean)


def decay_ratio(acf: np.ndarray) -> float:
    """Miao-Seborg R = a / b from the ACF's first two minima and first maximum; nan if absent.

    The extrema are taken between successive ACF zero crossings (first minimum between crossings
    1 and 2, first maximum between 2 and 3, second minimum between 3 and 4), which keeps
    measurement noise from creating spurious local extrema near lag 0.

    Parameters
    ----------
    acf : ndarray
        Normalised autocorrelation function (:func:`autocorrelation`).

    Returns
    -------
    float
        R = a / b (dimensionless); > 0.5 flags an excessively oscillatory loop (Miao & Seborg
        1999). nan with fewer than 4 zero crossings or when b <= 0.
    """
    zc = _zero_crossings(acf)
    if len(zc) < 4:
        return math.nan
    z = [int(math.ceil(v)) for v in zc[:4]]
    m1 = z[0] + int(np.argmin(acf[z[0]:z[1] + 1]))
    p1 = z[1] + int(np.argmax(acf[z[1]:z[2] + 1]))
    m2 = z[2] + int(np.argmin(acf[z[2]:z[3] + 1]))
    line_min = acf[m1] + (acf[m2] - acf[m1]) * (p1 - m1) / (m2 - m1)
    a = acf[p1] - line_min
    line_peak = 1.0 + (acf[p1] - 1.0) * m1 / p1
    b = line_peak - acf[m1]
    return float(a / b) if b > 0 else math.nan


def forsman_stattin_h(x: np.ndarray, dt: float, alpha: float = 0.5, gamma: float = 0.75) -> float:
    """h index from consecutive same-sign half-waves (areas within alpha, durations within gamma).

    Parameters
    ----------
    x : ndarray
        The mean-removed (or detrended) signal.
    dt : float
        Sample period (s).
    alpha : float
        Area tolerance: consecutive half-waves of one sign match when the ratio of their IAE is
        in (alpha, 1/alpha) (default 0.5, Forsman & Stattin's value).
    gamma : float
        Duration tolerance: their durations' ratio must be in (gamma, 1/gamma) (default 0.75).

    Returns
    -------
    float
        h = matching pairs / pairs compared (0-1); > 0.4 indicates an oscillation, white noise
        gives about 0.1. nan with fewer than 5 zero crossings.
    """
    zc = _zero_crossings(x)
    if len(zc) < 5:
        return math.nan
    edges = np.concatenate([[zc[0]], zc[1:]])
    areas, durations, signs = [], [], []
    for a, b in zip(edges[:-1], edges[1:]):
        i0, i1 = int(math.ceil(a)), int(math.floor(b))
        seg = np.abs(x[i0:i1 + 1])
        areas.append(seg.sum() * dt)
        durations.append((b - a) * dt)
        signs.append(np.sign(x[min(i0, len(x) - 1)]))
    areas, durations, signs = map(np.asarray, (areas, durations, signs))
    hits = total = 0
    for sgn in (1.0, -1.0):
        A, D = areas[signs == sgn], durations[signs == sgn]
        if len(A) < 2:
            continue
        ra, rd = A[1:] / np.maximum(A[:-1], 1e-300), D[1:] / np.maximum(D[:-1], 1e-300)
        ok = (ra > alpha) & (ra < 1 / alpha) & (rd > gamma) & (rd < 1 / gamma)
        hits += int(ok.sum())
        total += len(ok)
    return hits / total if total else math.nan


def spectral_peak_fraction(x: np.ndarray, dt: float) -> tuple[float, float]:
    """(fraction of power within +/-20 % of the strongest non-DC peak, its period in s).

    Parameters
    ----------
    x : ndarray
        The signal (Welch's method detrends each segment linearly).
    dt : float
        Sample period (s).

    Returns
    -------
    fraction : float
        Share (0-1) of the non-DC power in the band 0.8-1.2 x the peak frequency; nan for a
        signal without power.
    period_s : float
        Period of the peak (s), resolved to the Welch segment (``max(64, n // 4)`` samples,
        at most n).
    """
    nper = min(len(x), max(64, len(x) // 4))
    f, p = sps.welch(x, fs=1.0 / dt, nperseg=nper, detrend="linear")
    if p[1:].sum() <= 0:
        return math.nan, math.nan
    k = 1 + int(np.argmax(p[1:]))
    band = (f >= 0.8 * f[k]) & (f <= 1.2 * f[k])
    return float(p[band].sum() / p[1:].sum()), float(1.0 / f[k])


def hagglund_detections(x: np.ndarray, dt: float, acceptable_amplitude: float, period_s: float) -> int:
    """Load disturbances (half-waves with IAE > 2a/w_u) in the last 50 periods (Hagglund 1995).

    Parameters
    ----------
    x : ndarray
        The mean-removed (or detrended) signal.
    dt : float
        Sample period (s).
    acceptable_amplitude : float
        Hagglund's a, the amplitude tolerated without alarm (in the signal's units).
    period_s : float
        The oscillation's period (s); w_u = 2 pi / period_s.

    Returns
    -------
    int
        Half-waves between successive zero crossings whose IAE exceeds 2 a / w_u, in the last
        50 periods of the signal (or all of it if shorter); 0 for a non-positive or non-finite
        period. More than 10 is Hagglund's limit-cycle alarm.
    """
    if not (period_s > 0) or not math.isfinite(period_s):
        return 0
    wu = 2 * math.pi / period_s
    limit = 2.0 * acceptable_amplitude / wu
    window = int(min(len(x), 50 * period_s / dt))
    y = x[-window:]
    zc = _zero_crossings(y)
    count = 0
    for a, b in zip(zc[:-1], zc[1:]):
        i0, i1 = int(math.ceil(a)), int(math.floor(b))
        if np.abs(y[i0:i1 + 1]).sum() * dt > limit:
            count += 1
    return count


def first_harmonic_amplitude(x: np.ndarray, dt: float, period_s: float) -> float:
    """Amplitude of the fundamental at ``period_s`` (least-squares sine fit over whole periods):
    the quantity a describing-function prediction is compared with.

    Parameters
    ----------
    x : ndarray
        The signal.
    dt : float
        Sample period (s).
    period_s : float
        The period to fit (s).

    Returns
    -------
    float
        Amplitude (half peak-to-peak of the fitted sine, in the signal's units) over the last
        whole number of periods; nan if the period is not positive and finite or the signal is
        shorter than one period.
    """
    if not (period_s > 0) or not math.isfinite(period_s):
        return math.nan
    n_per = int(len(x) * dt / period_s)
    if n_per < 1:
        return math.nan
    n = int(round(n_per * period_s / dt))
    y = x[-n:] - x[-n:].mean()
    t = np.arange(n) * dt
    w = 2 * math.pi / period_s
    basis = np.column_stack([np.sin(w * t), np.cos(w * t)])
    coef, *_ = np.linalg.lstsq(basis, y, rcond=None)
    return float(np.hypot(*coef))


@dataclass(frozen=True)
class OscillationReport:
    """The verdict and every index, so a failing regression test can print what it saw.

    Attributes
    ----------
    oscillating : bool
        The verdict (module docstring: amplitude above ``min_amplitude``, r > 1, and R > 0.5
        or h > 0.4).
    thornhill_r : float
        Thornhill regularity r (nan when the ACF has too few zero crossings).
    decay_ratio : float
        Miao-Seborg decay ratio R (nan when undefined).
    forsman_h : float
        Forsman-Stattin h (nan when undefined).
    spectral_peak_fraction : float
        Share of power around the dominant spectral peak (screening only).
    hagglund_detections : int
        Hagglund load disturbances in the last 50 periods (0 unless r > 1).
    hagglund_alarm : bool
        More than 10 detections.
    period_s : float
        Oscillation period (s): from the ACF, else the spectral peak.
    amplitude : float
        sqrt(2) x the standard deviation of the detrended signal (a sine's amplitude from its
        RMS), in the signal's units.
    harmonic_amplitude : float
        Amplitude of the fundamental at ``period_s`` (what a describing function predicts).
    samples : int
        Samples assessed.
    reason : str
        Which rule decided the verdict, with the figures.
    """

    oscillating: bool
    thornhill_r: float
    decay_ratio: float
    forsman_h: float
    spectral_peak_fraction: float
    hagglund_detections: int
    hagglund_alarm: bool
    period_s: float
    amplitude: float
    harmonic_amplitude: float
    samples: int
    reason: str

    def to_dict(self) -> dict:
        """The fields as a plain dict (for ``metrics.json``)."""
        return asdict(self)

    def __str__(self) -> str:
        return (f"{'OSCILLATING' if self.oscillating else 'not oscillating'} ({self.reason}): "
                f"r={self.thornhill_r:.2f} R={self.decay_ratio:.2f} h={self.forsman_h:.2f} "
                f"spectral={self.spectral_peak_fraction:.2f} hagglund={self.hagglund_detections} "
                f"period={self.period_s:.3g}s amplitude={self.amplitude:.3g} n={self.samples}")


def assess(signal, dt: float, *, min_amplitude: float = 0.0,
           acceptable_amplitude: float | None = None) -> OscillationReport:
    """Assess one sampled signal for sustained oscillation.

    ``min_amplitude`` is the smallest amplitude worth calling an oscillation (in the signal's
    units; ripple below it is ignored). ``acceptable_amplitude`` is Hagglund's a (default:
    the larger of ``min_amplitude`` and 3 x the signal's high-frequency noise level).

    The signal is detrended linearly first, so a slow ramp is not taken for an oscillation.

    Parameters
    ----------
    signal : array_like
        The signal, uniformly sampled (1-D, at least 16 finite samples); drop the start-up
        transient first.
    dt : float
        Sample period (s, > 0).
    min_amplitude : float
        The smallest amplitude (sqrt(2) x RMS, in the signal's units) worth calling an
        oscillation; the verdict requires more than this (default 0).
    acceptable_amplitude : float, optional
        Hagglund's a for :func:`hagglund_detections`; by default the larger of
        ``min_amplitude`` and 3 x the noise level (the median absolute sample-to-sample
        difference, as a standard deviation).

    Returns
    -------
    OscillationReport
        The verdict, every index, the period and both amplitudes.

    Raises
    ------
    ConfigError
        For a signal that is not 1-D, has fewer than 16 samples or non-finite ones, or a
        ``dt`` <= 0.
    """
    x = _prepare(signal, dt)
    amplitude = float(math.sqrt(2.0) * x.std())  # a sine's amplitude from its RMS
    # (harmonic_amplitude, the fundamental's amplitude, is what describing functions predict)
    acf = autocorrelation(x)
    r, period = thornhill_regularity(acf, dt)
    R = decay_ratio(acf)
    h = forsman_stattin_h(x, dt)
    frac, spec_period = spectral_peak_fraction(x, dt) if x.std() > 0 else (math.nan, math.nan)
    if not math.isfinite(period):
        period = spec_period
    if acceptable_amplitude is not None:
        a = acceptable_amplitude
    else:  # the larger of min_amplitude and 3 x the high-frequency noise level (MAD of differences)
        noise = float(np.median(np.abs(np.diff(x))) / 0.6745 / math.sqrt(2.0))
        a = max(min_amplitude, 3.0 * noise)
    # Hagglund needs the loop's frequency: only counted at a regular (r > 1) oscillation's period
    n_det = hagglund_detections(x, dt, a, period) if (a > 0 and r > THORNHILL_R) else 0
    if amplitude <= min_amplitude or x.std() == 0:
        verdict, why = False, f"amplitude {amplitude:.3g} <= min_amplitude {min_amplitude:.3g}"
    elif not (r > THORNHILL_R):
        verdict, why = False, f"irregular (r = {r:.2f} <= {THORNHILL_R})"
    elif (R > DECAY_RATIO) or (h > FORSMAN_H):
        verdict, why = True, f"regular (r > {THORNHILL_R}) and persistent (R > {DECAY_RATIO} or h > {FORSMAN_H})"
    else:
        verdict, why = False, f"regular but decaying (R = {R:.2f}, h = {h:.2f})"
    return OscillationReport(verdict, r, R, h, frac, n_det, n_det > HAGGLUND_N_LIM, period, amplitude,
                             first_harmonic_amplitude(x, dt, period), len(x), why)


#: a cycle is the forced response of an exogenous input when their Welch magnitude-squared
#: coherence at the cycle's frequency is at least this (more than half the cycle's power at that
#: frequency is linearly explained by the input) ...
FORCED_COHERENCE = 0.5
#: ... and above what K independent segments of two unrelated signals exceed with this probability
#: (Carter 1987: P(MSC > c) = (1 - c)^(K - 1) under zero true coherence)
FORCED_SIGNIFICANCE = 0.01
#: Welch segments span this many periods of the cycle (bins 1/4 of its frequency apart)
FORCED_SEGMENT_PERIODS = 4.0
#: the input's periodic component is looked for within this share of the cycle's frequency (the
#: band :func:`spectral_peak_fraction` uses)
FORCED_BAND = 0.2


def forced_response(x, u, dt: float, period_s: float) -> dict:
    """Whether the cycle of ``x`` at ``period_s`` is the forced response to the input ``u``.

    A loop driven by a periodic exogenous input answers at the input's period with a phase that
    stays fixed to it from one period to the next; a self-sustained cycle (a limit cycle, a loop
    with too little margin) runs at its own frequency and phase, whatever the input does. The
    magnitude-squared coherence C(f) = |P_xu(f)|^2 / (P_xx(f) P_uu(f)) (Welch's averaged
    periodograms, :func:`scipy.signal.coherence`; Bendat & Piersol, Random Data, 4th ed., sec. 5.2.5
    and 9.2.3) measures exactly that phase locking: it is 1 where x is a linear response of u and
    tends to 0 where the two are unrelated. The cycle is forced when, in the band
    (1 +/- :data:`FORCED_BAND`) / ``period_s``, at the frequency where the input has most power, C is
    at least :data:`FORCED_COHERENCE` and above the significance level of K independent segments
    (Carter 1987, "Coherence and time delay estimation", Proc. IEEE 75(2):236-255: zero true
    coherence exceeds c with probability (1 - c)^(K - 1); :data:`FORCED_SIGNIFICANCE`). This is the
    forced-versus-self-excited distinction of nonlinear oscillations (Nayfeh & Mook, Nonlinear
    Oscillations, 1979, ch. 4 vs ch. 3; entrainment - a self-excited cycle locked to the forcing -
    counts as forced, since the input then sets its period).

    Parameters
    ----------
    x : array_like
        The cycling signal (as judged: references and high-pass already applied).
    u : array_like
        The exogenous input on the same samples (e.g. the offered demand).
    dt : float
        Sample period (s).
    period_s : float
        The cycle's period (s, from :func:`assess`).

    Returns
    -------
    dict
        ``forced`` (bool), ``input_period_s`` (the input's component the coherence is read at; nan
        when undetermined), ``coherence``, ``coherence_threshold``, ``segments`` (K) and ``why``.
    """
    x, u = np.asarray(x, dtype=float), np.asarray(u, dtype=float)
    out = {"forced": False, "input_period_s": math.nan, "coherence": math.nan, "coherence_threshold": math.nan,
           "segments": 0}
    if not (period_s > 0 and math.isfinite(period_s)) or len(u) != len(x) or not np.all(np.isfinite(u)):
        return {**out, "why": "no input or no period to compare"}
    nper = int(math.ceil(FORCED_SEGMENT_PERIODS * period_s / dt))
    k = len(x) // max(nper, 1)
    if k < 2 or np.ptp(u) == 0:
        return {**out, "why": f"{len(x) * dt:.0f} s hold fewer than 2 segments of {nper * dt:.0f} s, or a constant "
                              "input: not determinable"}
    f, c = sps.coherence(x, u, fs=1.0 / dt, nperseg=nper, detrend="linear")
    _, puu = sps.welch(u, fs=1.0 / dt, nperseg=nper, detrend="linear")
    f0 = 1.0 / period_s
    band = np.nonzero((f >= (1 - FORCED_BAND) * f0) & (f <= (1 + FORCED_BAND) * f0) & (f > 0))[0]
    if not len(band):
        return {**out, "segments": k, "why": "no frequency bin in the cycle's band"}
    j = band[int(np.argmax(puu[band]))]
    threshold = max(FORCED_COHERENCE, 1.0 - FORCED_SIGNIFICANCE ** (1.0 / (k - 1)))
    forced = bool(c[j] >= threshold)
    why = (f"coherence {c[j]:.2f} {'>=' if forced else '<'} {threshold:.2f} at its {1 / f[j]:.4g} s component "
           f"({k} segments)")
    return {"forced": forced, "input_period_s": float(1.0 / f[j]), "coherence": float(c[j]),
            "coherence_threshold": float(threshold), "segments": int(k), "why": why}


@dataclass(frozen=True)
class ActuatorVerdict:
    """The verdict on one run: every actuator and buffer through :func:`assess`, pool moves
    through the churn bound.

    Attributes
    ----------
    oscillating : bool
        Any judged signal oscillates, or the pool moves churn.
    churning : bool
        One pool reverses (by at least :data:`CHURN_MIN_STEP` of it) more than
        :data:`CHURN_MIN_REVERSALS` times and more than :data:`CHURN_REVERSALS_PER_HOUR` times per
        hour of the judged window.
    reversals : int
        Pool-scale reversals in the judged window (:func:`tokenfactory.signals.count_reversals`).
    reversals_per_hour : float
        ``reversals`` over the judged window's length (not the whole run's: a plant's own
        ``reversals_per_hour`` metric is over the whole run, start-up included).
    pool_reversals : dict
        Reversals per pool (the churn bound applies to the worst pool: each follows its own demand).
    signals : dict
        Per signal (``fill_pool``, ``decode_pool``, ``batch_cap``, ``reservation``,
        ``admission_rate``, ``ready``, ``fill_queue``, as present): the
        :class:`OscillationReport` as a dict, or ``{"oscillating": False, "reason": ...}`` when
        the signal was not judged (constant, too short, absent).
    reason : str
        Which signals decided, in words.
    window_s : tuple of float
        The judged window ``(start, end)`` (s): ``reversals``, ``reversals_per_hour``, the churn
        bound and every signal are over it (default ``(0, 0)``: not stated).
    """

    oscillating: bool
    churning: bool
    reversals: int
    reversals_per_hour: float
    pool_reversals: dict
    signals: dict
    reason: str
    window_s: tuple = (0.0, 0.0)

    def to_dict(self) -> dict:
        """The fields as a plain dict (for ``metrics.json``)."""
        return asdict(self)

    @property
    def oscillating_signals(self) -> list[str]:
        """Names of the signals the detectors flag."""
        return [k for k, v in self.signals.items() if v.get("oscillating")]


def _churn_reversals(actions: list[dict]) -> int:
    """Reversals of one pool's moves (:func:`tokenfactory.signals.count_reversals`) whose
    reversing move is at least :data:`CHURN_MIN_STEP` of the pool (and one worker): in a pool
    of ten workers or fewer every reversal; in a pool of 190, a one-worker correction moves its
    capacity by 0.5 %, under the ripple the detectors ignore on every continuous actuator."""
    last = 0
    n = 0
    for a in actions:
        d = (a["to"] > a["from"]) - (a["to"] < a["from"])
        if d == 0:
            continue
        if last and d != last and abs(a["to"] - a["from"]) >= max(1.0, CHURN_MIN_STEP * a["from"]) - 1e-9:
            n += 1
        last = d
    return n


def _demand_turns(s) -> int:
    """Turns of the run's demand (``demand``, else ``arrival_rate``) a pool could follow: the
    demand averaged over :data:`DEMAND_SMOOTHING_S`, a turn counted when it moves back by at
    least :data:`CHURN_MIN_STEP` of its last extreme (a zigzag); 0 without a demand column."""
    col = "demand" if "demand" in s else "arrival_rate" if "arrival_rate" in s else None
    if col is None or len(s) < 2:
        return 0
    t = s["time_s"].to_numpy(dtype=float)
    x = s[col].to_numpy(dtype=float)
    grid = np.arange(t[0], t[-1] + 1e-9, DEMAND_SMOOTHING_S / 10.0)
    if len(grid) < 2 or not np.all(np.isfinite(x)):
        return 0
    y = np.interp(grid, t, np.cumsum(np.concatenate([[0.0], x[1:] * np.diff(t)])))  # integral of the demand
    w = 10  # samples per smoothing window: the mean rate over DEMAND_SMOOTHING_S
    r = (y[w:] - y[:-w]) / DEMAND_SMOOTHING_S if len(y) > w else np.array([])
    if not len(r):
        return 0
    turns, direction, extreme = 0, 0, float(r[0])
    for v in r:
        moved = abs(v - extreme) >= CHURN_MIN_STEP * max(abs(extreme), 1e-12)
        if direction == 0:
            if moved:
                direction, extreme = (1 if v > extreme else -1), v
        elif (v - extreme) * direction > 0:
            extreme = v
        elif moved:
            turns, direction, extreme = turns + 1, -direction, v
    return turns


def _step_signal(times, at, values, start_value) -> "np.ndarray":
    """A piecewise-constant actuator rebuilt from its change log: ``values[i]`` from ``at[i]``."""
    idx = np.searchsorted(np.asarray(at, dtype=float), np.asarray(times, dtype=float), side="right") - 1
    vals = np.asarray(values, dtype=float)
    return np.where(idx >= 0, vals[np.maximum(idx, 0)], start_value)


def judge_actuators(series, actions=None, *, start_s: float = 0.0, end_s: float | None = None,
                    step_s: float | None = None, buffer_amplitudes: dict | None = None,
                    references: dict | None = None, highpass_s: float | None = None,
                    exogenous: str | None = "auto", open_loop: dict | None = None) -> ActuatorVerdict:
    """The oscillation and churn verdict of a run, from its series and action log (any plant).

    Signals judged (those the series or the actions carry): ``fill_pool`` and ``decode_pool``
    (serving + starting workers; minimum amplitude :data:`POOL_MIN_AMPLITUDE`), ``batch_cap``
    (``decode_batch_cap``), ``reservation`` (the fill share of ``reserve`` actions) and
    ``admission_rate`` (an open command, inf, counts as twice the largest finite command of the
    window, so switching between open and closed is a full swing),
    each with a minimum amplitude of :data:`RELATIVE_MIN_AMPLITUDE` x its mean; and the buffers
    named in ``buffer_amplitudes`` (column -> minimum amplitude). An actuator that never moves in
    the window is not judged (what the detectors would see in it is the plant's noise). A cycle
    the detectors find is then tested against the exogenous input (:func:`forced_response`): one
    coherent with the input at its period is reported ``forced`` and does not count as oscillating.

    Parameters
    ----------
    series : DataFrame
        The result's series (``time_s`` and the plant's columns).
    actions : DataFrame or list of dict, optional
        The result's action log (``kind``, ``time_s``, and ``pool``/``from``/``to`` for scale
        actions, ``fill_share`` for reservations).
    start_s : float
        Judge from this time on (drop the start-up transient; default 0).
    end_s : float, optional
        ... up to this time (default the series' end).
    step_s : float, optional
        Resample the series every ``step_s`` seconds (default: as sampled).
    buffer_amplitudes : dict, optional
        Buffer columns to judge and their minimum amplitudes, e.g. ``{"ready": 1.0,
        "fill_queued_tokens": 8192}`` (a column ``fill_queued_tokens`` is reported as
        ``fill_queue``).
    references : dict, optional
        Per pool signal (``fill_pool``, ``decode_pool``) an array over the judged samples
        subtracted before the detectors (e.g. the demand-justified count, so a pool that follows
        its demand is judged on its deviation from it).
    highpass_s : float, optional
        Remove a centred running mean of this width from the pool signals (what is slower is the
        demand's cycle, not a loop's); the input is filtered alike before the forced-response test.
    exogenous : str or None
        The series column holding the exogenous input a forced cycle follows: ``"auto"`` (default)
        ``demand``, else ``arrival_rate`` (the offered load: no layer's action changes it); None: no
        forced-response test.
    open_loop : dict, optional
        Per signal an array over the judged samples: what the actuator would do with the loop
        through the plant opened - e.g. the pool the plan asks for from the offered demand and
        the clock alone (:func:`tokenfactory.stack.on_rates.run_on_rates`), before ``references``
        are subtracted (they are subtracted from it too). A cycle coherent with it is the
        plan's forced response.

    Returns
    -------
    ActuatorVerdict
        The verdict, the churn figures and every signal's report.
    """
    s = _window(series, start_s, end_s, step_s)
    end = float(series["time_s"].iloc[-1]) if end_s is None else float(end_s)
    t = s["time_s"].to_numpy(dtype=float)
    dt = float(np.median(np.diff(t))) if len(t) > 1 else math.nan
    acts = pd.DataFrame(actions if actions is not None else [])
    churn = _churn(s, acts, start_s, end)
    u = _exogenous_input(s, exogenous)
    signals = {}
    for name, (x, amp, is_pool) in _candidates(s, acts, t, buffer_amplitudes).items():
        inputs = {} if u is None else {"the input": u}
        if open_loop and name in open_loop:
            inputs["the open-loop replay"] = np.asarray(open_loop[name], dtype=float)[: len(x)]
        signals[name] = _judge_signal(name, x, amp, is_pool, dt, references, highpass_s, inputs)
    flagged = [k for k, v in signals.items() if v.get("oscillating")]
    forced = [k for k, v in signals.items() if v.get("forced")]
    parts = []
    if flagged:
        parts.append("cycles on " + ", ".join(flagged))
    if churn["churning"]:
        parts.append(churn["reason"])
    if forced:
        parts.append("forced responses (not counted): " + ", ".join(
            f"{k} ({signals[k]['period_s']:.4g} s, coherence {signals[k]['coherence']:.2f} with "
            f"{signals[k]['forced_by']}'s {signals[k]['input_period_s']:.4g} s component)" for k in forced))
    if not flagged and not churn["churning"]:
        parts.insert(0, f"no cycle on {len(signals)} signals; {churn['reversals']} pool reversals "
                        f"({churn['rph']:.1f}/h)")
    return ActuatorVerdict(bool(flagged) or churn["churning"], churn["churning"], int(churn["reversals"]),
                           float(churn["rph"]), churn["per_pool"], signals, "; ".join(parts),
                           (float(start_s), end))


def _window(series, start_s: float, end_s: float | None, step_s: float | None):
    """The series between ``start_s`` and ``end_s``, every ``step_s`` seconds."""
    t_all = series["time_s"].to_numpy(dtype=float)
    end = float(t_all[-1]) if end_s is None else float(end_s)
    s = series[(t_all >= start_s) & (t_all <= end)]
    if step_s is not None and len(s) > 1:
        native = float(np.median(np.diff(s["time_s"].to_numpy(dtype=float))))
        stride = max(1, int(round(step_s / native))) if native > 0 else 1
        s = s.iloc[::stride]
    return s


def _churn(s, acts, start_s: float, end: float) -> dict:
    """The pools' reversals in the window and the churn bound on the worst pool's, beyond the
    turns of the demand (each pool follows its own demand)."""
    from tokenfactory.core.signals import count_reversals

    kind = acts["kind"] if "kind" in acts else pd.Series([], dtype=object)
    scale_rows = acts[kind == "scale"] if len(acts) else acts
    per_pool: dict[str, int] = {}
    churn_pool: dict[str, int] = {}
    if len(scale_rows):
        in_window = scale_rows[(scale_rows["time_s"] >= start_s) & (scale_rows["time_s"] <= end)]
        for pool, rows in in_window.sort_values("time_s", kind="stable").groupby("pool", sort=True):
            recs = rows.to_dict("records")
            per_pool[str(pool)] = int(count_reversals(recs))
            churn_pool[str(pool)] = _churn_reversals(recs)
    reversals = sum(per_pool.values())
    worst = max(churn_pool.values(), default=0)
    hours = max(end - start_s, 0.0) / 3600.0
    turns = _demand_turns(s)
    excess = worst - turns
    churning = excess > CHURN_MIN_REVERSALS and (excess / hours if hours > 0 else 0.0) > CHURN_REVERSALS_PER_HOUR
    reason = ""
    if churning:
        pool = max(churn_pool, key=churn_pool.get)
        reason = (f"churn: {worst} reversals of the {pool} pool in {hours * 60:.0f} min, {excess} more than the "
                  f"demand's {turns} turns ({excess / hours:.1f}/h > {CHURN_REVERSALS_PER_HOUR:g}/h)")
    return {"per_pool": per_pool, "reversals": reversals, "rph": reversals / hours if hours > 0 else 0.0,
            "churning": churning, "reason": reason}


def _candidates(s, acts, t, buffer_amplitudes: dict | None) -> dict[str, tuple]:
    """Every signal to judge: name -> (samples, minimum amplitude or None for relative, is a pool)."""
    kind = acts["kind"] if "kind" in acts else pd.Series([], dtype=object)
    candidates: dict[str, tuple] = {}
    for pool in ("fill", "decode"):
        if f"{pool}_workers" in s:
            x = s[f"{pool}_workers"].to_numpy(dtype=float)
            if f"{pool}_workers_starting" in s:
                x = x + s[f"{pool}_workers_starting"].to_numpy(dtype=float)
            candidates[f"{pool}_pool"] = (x, POOL_MIN_AMPLITUDE, True)
    if "decode_batch_cap" in s:
        candidates["batch_cap"] = (s["decode_batch_cap"].to_numpy(dtype=float), None, False)
    if len(acts) and (kind == "reserve").any():
        r = acts[kind == "reserve"].sort_values("time_s", kind="stable")
        candidates["reservation"] = (_step_signal(t, r["time_s"], r["fill_share"], 0.0), None, False)
    if "admission_rate" in s:
        x = s["admission_rate"].to_numpy(dtype=float)
        finite = np.isfinite(x)
        if finite.any():
            # open (inf) above every finite command: a switch between open and closed is a full swing
            top = float(np.max(x[finite]))
            candidates["admission_rate"] = (np.where(finite, x, 2.0 * top if top > 0 else 1.0), None, False)
    for col, amp in (buffer_amplitudes or {}).items():
        if col in s:
            candidates["fill_queue" if col == "fill_queued_tokens" else col] = (
                s[col].to_numpy(dtype=float), float(amp), False)
    return candidates


def _exogenous_input(s, exogenous: str | None):
    """The input column's samples (None without one)."""
    if exogenous == "auto":
        exogenous = "demand" if "demand" in s else "arrival_rate" if "arrival_rate" in s else None
    elif exogenous is not None and exogenous not in s:
        raise ConfigError("exogenous", f"no column {exogenous!r} in the series (columns: {', '.join(s.columns)})")
    return None if exogenous is None else s[exogenous].to_numpy(dtype=float)


def _highpass(x: np.ndarray, highpass_s: float | None, dt: float) -> np.ndarray:
    """``x`` minus its centred running mean over ``highpass_s`` (unchanged when too short)."""
    if highpass_s and math.isfinite(dt):
        w = int(round(highpass_s / dt))
        if len(x) > 2 * w > 0:
            return x - pd.Series(x).rolling(w, center=True, min_periods=1).mean().to_numpy()
    return x


def _judge_signal(name: str, x, amp, is_pool: bool, dt: float, references: dict | None,
                  highpass_s: float | None, inputs: dict) -> dict:
    """One signal's report: :func:`assess`, and for a cycle the forced-response test against each
    exogenous input (filtered as the signal is); the most coherent one is reported."""
    if len(x) < 16 or not np.all(np.isfinite(x)):
        return {"oscillating": False, "reason": "too short or not finite to judge"}
    if name not in ("ready", "fill_queue") and np.ptp(x) == 0:
        return {"oscillating": False, "reason": "never moved in the window"}
    if amp is None:
        amp = RELATIVE_MIN_AMPLITUDE * max(abs(float(np.mean(x))), 1e-12)
    ref = np.asarray(references[name], dtype=float)[: len(x)] if is_pool and references and name in references else 0.0
    x = _highpass(x - ref, highpass_s, dt) if is_pool else x
    rep = assess(x, dt, min_amplitude=amp).to_dict()
    if not rep["oscillating"] or not inputs:
        return rep
    tests = []
    for label, v in inputs.items():
        v = v - ref if label == "the open-loop replay" else v
        tests.append((label, forced_response(x, _highpass(v, highpass_s, dt) if is_pool else v, dt, rep["period_s"])))
    label, test = max(tests, key=lambda lt: (lt[1]["forced"], np.nan_to_num(lt[1]["coherence"], nan=-1.0)))
    rep.update({k: test[k] for k in ("forced", "input_period_s", "coherence", "coherence_threshold", "segments")})
    # forced_by names an input only when the cycle is that input's; a cycle no input explains keeps
    # counting, and the reason says what each test found (coherence too low, or too short to tell)
    rep["forced_by"] = label if test["forced"] else None
    rep["tested_against"] = [lb for lb, _ in tests]
    if test["forced"]:
        rep["oscillating"] = False
        rep["reason"] = f"forced response, not a loop's cycle: {label}: {test['why']} (detectors: {rep['reason']})"
    else:
        rep["reason"] += ("; counted as self-sustained, no input shown to force it: "
                          + "; ".join(f"{lb}: {ts['why']}" for lb, ts in tests))
    return rep
