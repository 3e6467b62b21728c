"""The embedded synthetic workload: the default when no trace data is present.

Calibrated to the shared traces' statistics (see ``fit``):

* arrivals: a non-homogeneous rate with a daily cycle (two harmonics), a weekday/weekend factor
  and a linear trend; inside each ``burst_window_s`` the rate is multiplied by a Gamma(k, 1/k)
  factor, so window counts are negative binomial with index of dispersion ``idc`` (1 = Poisson);
* sizes: log-normal input and output tokens (heavy right tail), clipped to a context limit;
* agentic sessions (reference article section 2): a fraction of traffic comes from sessions whose
  calls return after heavy-tailed (Pareto) think times, whose context grows by each turn's new
  input and output, whose earlier context is a reusable prefix (``cached_tokens``), and which are
  compacted to ``compaction_keep`` of the limit when the context would exceed ``context_limit``;
* long contexts (:func:`long_context_workload`): a 1M-token window and agentic sessions whose
  cached prefix grows turn by turn (midfill-heavy), calibrated to the Claude Code sessions of the
  shared ``agentic-coding`` trace; ``closed_sessions`` marks the table so the request simulator
  sends a turn its think time after the previous one completes.

Every draw comes from one ``numpy.random.Generator`` seeded by ``seed``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tokenfactory.core.validation import ConfigError, check_int, check_number, reject_unknown_keys
from tokenfactory.traces.stats import counts
from tokenfactory.traces.class_assignment import assign_classes

__all__ = ["SyntheticWorkload", "rate_at", "generate_requests", "generate_rates", "fit_workload",
           "compare_to_trace", "long_context_workload", "LONG_CONTEXT"]

DAY = 86400.0
WEEK = 7 * DAY


@dataclass(frozen=True)
class SyntheticWorkload:
    """Parameters of the synthetic workload; every field is validated on construction.

    The clock's 0 is Monday 00:00. The expected rate is ``mean_rate_rps`` x (daily cycle) x
    (weekend factor on Saturday and Sunday) x (1 + trend); :func:`generate_requests` adds
    burstiness (``idc``) and sessions, :func:`generate_rates` adds slow AR(1) noise.

    Parameters
    ----------
    mean_rate_rps : float
        Base rate (requests/s, > 0; default 5): the weekday daily mean at t = 0. The long-run
        mean is lower when ``weekend_factor`` < 1: x (5 + 2 ``weekend_factor``) / 7 over a week.
    daily_amplitude : float
        Relative amplitude of the 24 h harmonic ([0, 0.95]; default 0.3): the rate swings
        +/- this fraction around the base.
    daily_second_harmonic : float
        Relative amplitude of the 12 h harmonic, aligned with ``peak_hour`` ([0, 0.5]; default
        0.1): raises the peak and the trough by this fraction and lowers the hours six hours
        either side of the peak (a sharper peak, a flatter night).
    peak_hour : float
        Hour of day of the 24 h harmonic's peak ([0, 24]; default 14).
    weekend_factor : float
        Rate multiplier on Saturday and Sunday ((0, 2]; default 0.8).
    trend_per_day : float
        Linear growth per day as a fraction of the base rate ([-0.1, 0.5]; default 0).
    idc : float
        Index of dispersion (variance / mean) of arrival counts in ``burst_window_s`` windows
        (>= 1; default 4; 1 = Poisson). Used by :func:`generate_requests`.
    burst_window_s : float
        Window over which the burst multiplier is constant (s, >= 0.001; default 10).
    rate_noise_cv : float
        Coefficient of variation of the log-normal noise on each window of a rate series
        ([0, 2]; default 0.08). Used by :func:`generate_rates` only.
    rate_noise_ar : float
        Lag-1 autocorrelation of that noise between successive windows ([0, 0.999]; default 0.7).
    input_median : float
        Median prompt length of a non-session request (tokens, > 0; default 1000).
    input_sigma : float
        Log-normal sigma of prompt lengths ([0, 4]; default 1.0; the mean is
        ``input_median`` x exp(sigma^2 / 2)).
    output_median : float
        Median output length (tokens, > 0; default 150); outputs are capped at 32,768 tokens.
    output_sigma : float
        Log-normal sigma of output lengths ([0, 4]; default 0.9).
    context_limit : int
        The model's context window (tokens, >= 16; default 200,000): caps prompt lengths and
        triggers session compaction.
    agentic_fraction : float
        Share of the expected traffic that comes from agentic sessions ([0, 1]; default 0: no
        sessions).
    session_turns_mean : float
        Mean calls per session (>= 1; default 30; geometric).
    session_initial_context_median : float
        Median context of a session's first call (tokens, > 0; default 20,000; log-normal with
        sigma ``session_initial_context_sigma``, capped at ``session_initial_context_cap`` of
        ``context_limit``).
    session_initial_context_sigma : float
        Log-normal sigma of the first call's context ([0, 4]; default 0.8).
    session_initial_context_cap : float
        Largest first-call context as a fraction of ``context_limit`` ((0, 1]; default 0.5).
    session_new_tokens_median : float
        Median new input tokens per turn (tokens, > 0; default 700; log-normal with sigma
        ``session_new_tokens_sigma``).
    session_new_tokens_sigma : float
        Log-normal sigma of the new input tokens per turn ([0, 4]; default 1.2).
    think_time_scale_s : float
        Minimum (Pareto scale) of the think time between a call's end and the next call (s,
        > 0; default 5).
    think_time_alpha : float
        Pareto tail index of think times ([1.01, 10]; default 1.3: heavy-tailed, finite mean).
    compaction_keep : float
        Fraction of ``context_limit`` a session keeps when compacted ([0, 0.9]; default 0.2).
    closed_sessions : bool
        Mark the request table (``attrs["closed_sessions"]``) so the request simulator sends a
        session's next turn its think time after the previous turn completes, rather than at its
        generated time (default False).
    seed : int
        Seed of the generator every draw comes from (>= 0; default 0).

    Raises
    ------
    ConfigError
        For a field outside its range.
    """

    mean_rate_rps: float = 5.0
    daily_amplitude: float = 0.3
    daily_second_harmonic: float = 0.1
    peak_hour: float = 14.0
    weekend_factor: float = 0.8
    trend_per_day: float = 0.0
    idc: float = 4.0
    burst_window_s: float = 10.0
    rate_noise_cv: float = 0.08
    rate_noise_ar: float = 0.7
    input_median: float = 1000.0
    input_sigma: float = 1.0
    output_median: float = 150.0
    output_sigma: float = 0.9
    context_limit: int = 200_000
    agentic_fraction: float = 0.0
    session_turns_mean: float = 30.0
    session_initial_context_median: float = 20_000.0
    session_initial_context_sigma: float = 0.8
    session_initial_context_cap: float = 0.5
    session_new_tokens_median: float = 700.0
    session_new_tokens_sigma: float = 1.2
    think_time_scale_s: float = 5.0
    think_time_alpha: float = 1.3
    compaction_keep: float = 0.2
    closed_sessions: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        w = "synthetic"
        check_number(f"{w}.mean_rate_rps", self.mean_rate_rps, low=0.0, low_inclusive=False)
        check_number(f"{w}.daily_amplitude", self.daily_amplitude, low=0.0, high=0.95)
        check_number(f"{w}.daily_second_harmonic", self.daily_second_harmonic, low=0.0, high=0.5)
        check_number(f"{w}.peak_hour", self.peak_hour, low=0.0, high=24.0)
        check_number(f"{w}.weekend_factor", self.weekend_factor, low=0.0, high=2.0, low_inclusive=False)
        check_number(f"{w}.trend_per_day", self.trend_per_day, low=-0.1, high=0.5)
        check_number(f"{w}.idc", self.idc, low=1.0)
        check_number(f"{w}.burst_window_s", self.burst_window_s, low=0.001)
        check_number(f"{w}.rate_noise_cv", self.rate_noise_cv, low=0.0, high=2.0)
        check_number(f"{w}.rate_noise_ar", self.rate_noise_ar, low=0.0, high=0.999)
        for f in ("input_median", "output_median", "session_initial_context_median", "session_new_tokens_median",
                  "think_time_scale_s"):
            check_number(f"{w}.{f}", getattr(self, f), low=0.0, low_inclusive=False)
        for f in ("input_sigma", "output_sigma", "session_initial_context_sigma", "session_new_tokens_sigma"):
            check_number(f"{w}.{f}", getattr(self, f), low=0.0, high=4.0)
        check_int(f"{w}.context_limit", self.context_limit, low=16)
        check_number(f"{w}.agentic_fraction", self.agentic_fraction, low=0.0, high=1.0)
        check_number(f"{w}.session_turns_mean", self.session_turns_mean, low=1.0)
        check_number(f"{w}.think_time_alpha", self.think_time_alpha, low=1.01, high=10.0)
        check_number(f"{w}.compaction_keep", self.compaction_keep, low=0.0, high=0.9)
        check_number(f"{w}.session_initial_context_cap", self.session_initial_context_cap, low=0.0, high=1.0,
                     low_inclusive=False)
        if not isinstance(self.closed_sessions, bool):
            raise ConfigError(f"{w}.closed_sessions", f"{self.closed_sessions!r} must be true or false")
        check_int(f"{w}.seed", self.seed, low=0)

    @classmethod
    def from_dict(cls, d, where: str = "synthetic") -> "SyntheticWorkload":
        """Build from a mapping (a TOML ``[synthetic]`` table); unknown keys are errors.

        Parameters
        ----------
        d : mapping
            Field name -> value; missing fields keep their defaults.
        where : str
            Field path used in error messages (default ``"synthetic"``).

        Returns
        -------
        SyntheticWorkload
        """
        reject_unknown_keys(where, d, {f.name for f in dataclasses.fields(cls)})
        return cls(**d)


#: the long-context preset (:func:`long_context_workload`): every call from an agentic session in a
#: 1M-token window. Calibrated to the shared ``agentic-coding`` trace (710 Claude Code sessions,
#: 48,658 parent-agent calls): new input per call median 720 tokens, 90th percentile 4,663 (sigma
#: ln(4663/720)/1.2816 = 1.46); output median 216, 90th percentile 899 (sigma 1.11); 68.5 calls
#: per session; first-call context median 24k with a 90th percentile of 259k (median 40k, sigma
#: 1.2 here, so resumed and tool-heavy starts reach the 250k-1M range the article centres on, up
#: to half the window); think time median 10 s (Pareto from 5 s with tail index 1.05: median
#: 9.7 s; the trace's tail is heavier, 166 s at the 90th percentile, beyond a finite-mean Pareto).
#: Compaction keeps 20 % of the window. Rates: 0.5 calls/s at 8 am on a Monday, flat
#: (ASSUMPTIONS, set per study).
LONG_CONTEXT = dict(mean_rate_rps=0.5, daily_amplitude=0.0, daily_second_harmonic=0.0, weekend_factor=1.0,
                    idc=1.0, output_median=216.0, output_sigma=1.11, context_limit=1_000_000, agentic_fraction=1.0,
                    session_turns_mean=68.5, session_initial_context_median=40_000.0,
                    session_initial_context_sigma=1.2, session_initial_context_cap=0.5,
                    session_new_tokens_median=720.0, session_new_tokens_sigma=1.46, think_time_scale_s=5.0,
                    think_time_alpha=1.05, compaction_keep=0.2, closed_sessions=True)


def long_context_workload(**overrides) -> SyntheticWorkload:
    """The long-context agentic workload (:data:`LONG_CONTEXT`) with ``overrides``.

    Parameters
    ----------
    **overrides
        :class:`SyntheticWorkload` fields to change (``mean_rate_rps``, ``seed``, ...).

    Returns
    -------
    SyntheticWorkload
    """
    return SyntheticWorkload.from_dict({**LONG_CONTEXT, **overrides})


def rate_at(w: SyntheticWorkload, t) -> np.ndarray:
    """Expected arrival rate (requests/s) at times ``t`` (s; 0 = Monday 00:00).

    Parameters
    ----------
    w : SyntheticWorkload
        The workload.
    t : float or array_like
        Times (s since Monday 00:00).

    Returns
    -------
    ndarray
        ``mean_rate_rps`` x daily cycle x weekend factor x trend, floored at 0 (requests/s),
        before burstiness and noise.
    """
    t = np.asarray(t, dtype=float)
    phase = 2 * np.pi * (t / DAY - w.peak_hour / 24.0)
    daily = 1.0 + w.daily_amplitude * np.cos(phase) + w.daily_second_harmonic * np.cos(2 * phase)
    weekend = np.where((t % WEEK) >= 5 * DAY, w.weekend_factor, 1.0)
    trend = 1.0 + w.trend_per_day * t / DAY
    return np.maximum(w.mean_rate_rps * daily * weekend * trend, 0.0)


def _lognormal(rng, median, sigma, n, cap):
    return np.clip(np.round(rng.lognormal(math.log(median), sigma, n)), 1, cap).astype(np.int64)


def _sessions(w: SyntheticWorkload, rng, duration_s: float, start_s: float, warm_start_s: float = 0.0) -> pd.DataFrame:
    """Agentic sessions started at rate agentic_fraction x rate / turns_mean over
    [start_s - warm_start_s, start_s + duration_s); turns before start_s are not kept."""
    first = start_s - warm_start_s
    grid = np.arange(first, start_s + duration_s, 60.0)
    starts = []
    for t0 in grid:
        lam = w.agentic_fraction * rate_at(w, max(t0, 0.0)) / w.session_turns_mean * 60.0
        k = rng.poisson(lam)
        starts.extend(t0 + rng.uniform(0, 60.0, k))
    rows = []
    end = start_s + duration_s
    limit, keep = w.context_limit, int(w.compaction_keep * w.context_limit)
    for sid, t in enumerate(sorted(starts)):
        turns = int(rng.geometric(1.0 / w.session_turns_mean))
        context = int(min(_lognormal(rng, w.session_initial_context_median, w.session_initial_context_sigma, 1,
                                     limit)[0], w.session_initial_context_cap * limit))
        # one draw per quantity for the whole session (the turns' sizes and think times)
        new_all = _lognormal(rng, w.session_new_tokens_median, w.session_new_tokens_sigma, turns, limit).tolist()
        out_all = _lognormal(rng, w.output_median, w.output_sigma, turns, 32_768).tolist()
        think_all = (w.think_time_scale_s * rng.pareto(w.think_time_alpha, turns) + w.think_time_scale_s).tolist()
        cached = 0
        for turn in range(turns):
            new, out = new_all[turn], out_all[turn]
            if context + new > limit:  # compaction: the old prefix is replaced by a summary
                context = keep
                cached = 0
                new = min(new, limit - context)
            think = think_all[turn] if turn else 0.0
            t += think
            if t >= end:
                break
            if t >= start_s:
                rows.append((t, context + new, cached, out, f"s{sid}", turn, think if turn else np.nan))
            cached = context + new  # the whole prompt is now a reusable prefix for the next turn
            context = context + new + out
            t += out * 0.02  # the turn's own decode time before the think time starts
    return pd.DataFrame(rows, columns=["arrival_s", "input_tokens", "cached_tokens", "output_tokens",
                                       "session_id", "turn", "think_time_s"])


def generate_requests(w: SyntheticWorkload, duration_s: float, start_s: float = 0.0,
                      warm_start_s: float = 0.0) -> pd.DataFrame:
    """A request table (see :mod:`tokenfactory.traces.schema`) over [start_s, start_s + duration_s).

    Non-session requests arrive at (1 - ``agentic_fraction``) x :func:`rate_at`, modulated per
    ``burst_window_s`` window by a Gamma multiplier (counts are negative binomial with
    dispersion ``idc``); sessions start at ``agentic_fraction`` x rate / ``session_turns_mean``
    and run until they end or the period does.

    Parameters
    ----------
    w : SyntheticWorkload
        The workload (its ``seed`` seeds every draw).
    duration_s : float
        Length of the period (s, > 0).
    start_s : float
        Where the period starts on the workload's clock (s since Monday 00:00; default 0).
    warm_start_s : float
        Sessions also start in the ``warm_start_s`` before ``start_s``, so the period opens with
        sessions in progress (their turns before ``start_s`` are dropped; the first kept turn
        carries its cached prefix). Default 0: every session starts inside the period.

    Returns
    -------
    DataFrame
        The request table, ``arrival_s`` measured from ``start_s``, ``request_class`` drawn
        from the documented mix (seeded by ``w.seed``); ``attrs`` carry ``name``
        (``"synthetic"``), ``kind``, ``source``, ``start_s`` and ``config`` (the workload's
        fields).

    Raises
    ------
    ConfigError
        For ``duration_s`` <= 0.
    """
    check_number("duration_s", duration_s, low=0.0, low_inclusive=False)
    check_number("warm_start_s", warm_start_s, low=0.0)
    rng = np.random.default_rng(w.seed)
    win = w.burst_window_s
    edges = np.arange(start_s, start_s + duration_s, win)
    lam = rate_at(w, edges + win / 2) * (1.0 - w.agentic_fraction) * win
    if w.idc > 1.0:
        # Gamma(k, 1/k) multiplier per window: counts NB with var/mean = 1 + lam/k = idc
        k = np.maximum(lam / (w.idc - 1.0), 1e-9)
        lam = lam * rng.gamma(k, 1.0 / k)
    n = rng.poisson(lam)
    t = np.repeat(edges, n) + rng.uniform(0.0, win, int(n.sum()))
    t = t[t < start_s + duration_s]
    m = len(t)
    plain = pd.DataFrame({"arrival_s": t,
                          "input_tokens": _lognormal(rng, w.input_median, w.input_sigma, m, w.context_limit),
                          "cached_tokens": np.zeros(m, dtype=np.int64),
                          "output_tokens": _lognormal(rng, w.output_median, w.output_sigma, m, 32_768),
                          "session_id": "", "turn": 0, "think_time_s": np.nan})
    parts = [plain]
    if w.agentic_fraction > 0:
        parts.append(_sessions(w, rng, duration_s, start_s, warm_start_s))
    df = pd.concat(parts, ignore_index=True).sort_values("arrival_s", kind="stable").reset_index(drop=True)
    df["arrival_s"] = df["arrival_s"] - start_s
    df.attrs.update({"name": "synthetic", "kind": "requests", "source": f"synthetic seed={w.seed}",
                     "start_s": start_s, "config": dataclasses.asdict(w)})
    if w.closed_sessions:
        df.attrs["closed_sessions"] = True
    # classes from the documented mix, on their own generator (the draws above are unchanged)
    return assign_classes(df, seed=w.seed)


def generate_rates(w: SyntheticWorkload, duration_s: float, interval_s: float = 600.0,
                   missing_fraction: float = 0.0) -> pd.DataFrame:
    """A rate series: the expected rate times AR(1) log-normal noise of cv ``rate_noise_cv``;
    ``missing_fraction`` of windows (in runs) become collection gaps (NaN).

    The noise has mean 1, so it does not shift the mean rate; ``idc`` and sessions play no part.

    Parameters
    ----------
    w : SyntheticWorkload
        The workload (its ``seed`` seeds every draw).
    duration_s : float
        Length of the series (s, >= ``interval_s``); windows start at 0, ``interval_s``, ...
        up to ``duration_s``.
    interval_s : float
        Window width (s, > 0; default 600, ServeGen's 10 minutes); the rate is sampled at each
        window's start.
    missing_fraction : float
        Share of windows to blank as gaps ([0, 0.5]; default 0), in runs of 1-6 windows at
        random places; runs may overlap, so the blanked share can come out a little lower.

    Returns
    -------
    DataFrame
        A rate series (``rate_rps`` in requests/s, index ``time_s``); ``attrs`` carry ``name``
        (``"synthetic-rates"``), ``kind``, ``source``, ``interval_s`` and ``config``.

    Raises
    ------
    ConfigError
        For ``duration_s`` < ``interval_s``, ``interval_s`` <= 0 or ``missing_fraction``
        outside [0, 0.5].
    """
    check_number("duration_s", duration_s, low=interval_s)
    check_number("interval_s", interval_s, low=0.0, low_inclusive=False)
    check_number("missing_fraction", missing_fraction, low=0.0, high=0.5)
    rng = np.random.default_rng(w.seed)
    t = np.arange(0.0, duration_s, interval_s)
    z = np.empty(len(t))
    z[0] = rng.standard_normal()
    a = w.rate_noise_ar
    for i in range(1, len(t)):
        z[i] = a * z[i - 1] + math.sqrt(1 - a * a) * rng.standard_normal()
    s = math.sqrt(math.log(1 + w.rate_noise_cv ** 2))
    rate = rate_at(w, t) * np.exp(s * z - s * s / 2)
    if missing_fraction > 0:
        n_gap = int(missing_fraction * len(t))
        while n_gap > 0:
            run = min(n_gap, int(rng.integers(1, 7)))
            i = int(rng.integers(0, len(t) - run))
            rate[i:i + run] = np.nan
            n_gap -= run
    df = pd.DataFrame({"rate_rps": rate}, index=pd.Index(t, name="time_s"))
    df.attrs.update({"name": "synthetic-rates", "kind": "rates", "source": f"synthetic seed={w.seed}",
                     "interval_s": interval_s, "config": dataclasses.asdict(w)})
    return df


def fit_workload(trace: pd.DataFrame, seed: int = 0) -> SyntheticWorkload:
    """Estimate a :class:`SyntheticWorkload` from a request table or a rate series.

    Rates: mean, daily first/second harmonic amplitude and phase, weekend factor, noise cv and
    lag-1 autocorrelation of the residual. Requests: mean rate, idc at 10 s, log-normal sizes
    (median, and sigma from the 50-90 % quantile spread), and session think times / turns.

    Rates are fitted by least squares on a constant, two daily harmonics and a weekend
    indicator, over present windows; the second harmonic's own phase is not kept (the
    generator aligns it with ``peak_hour``). Think times are fitted as a Pareto tail above
    their 5 % quantile (maximum likelihood). Fields a table says nothing about keep their
    defaults.

    Parameters
    ----------
    trace : DataFrame
        A request table, or a rate series (``attrs["kind"] == "rates"``) whose ``time_s`` 0
        is Monday 00:00.
    seed : int
        Seed of the returned workload (default 0).

    Returns
    -------
    SyntheticWorkload
        The fitted workload; estimates are clipped into the fields' allowed ranges.
    """
    kw: dict = {"seed": seed}
    if trace.attrs.get("kind") == "rates":
        r = trace["rate_rps"]
        t = trace.index.to_numpy(dtype=float)
        ok = r.notna().to_numpy()
        kw["mean_rate_rps"] = float(r.mean())
        ph = 2 * np.pi * t[ok] / DAY
        weekend = ((t[ok] % WEEK) >= 5 * DAY).astype(float)
        X = np.column_stack([np.ones(ok.sum()), np.cos(ph), np.sin(ph), np.cos(2 * ph), np.sin(2 * ph), weekend])
        beta, *_ = np.linalg.lstsq(X, r.to_numpy()[ok], rcond=None)
        base = beta[0]
        a1 = math.hypot(beta[1], beta[2]) / base
        kw["daily_amplitude"] = float(min(a1, 0.95))
        kw["daily_second_harmonic"] = float(min(math.hypot(beta[3], beta[4]) / base, 0.5))
        kw["peak_hour"] = float((math.atan2(beta[2], beta[1]) / (2 * np.pi) * 24.0) % 24.0)
        if weekend.any() and (1 - weekend).any():
            kw["weekend_factor"] = float(np.clip((base + beta[5]) / base, 0.05, 2.0))
        resid = r.to_numpy()[ok] / (X @ beta)
        lr = np.log(np.clip(resid, 1e-6, None))
        kw["rate_noise_cv"] = float(min(np.sqrt(np.exp(lr.var()) - 1), 2.0))
        kw["rate_noise_ar"] = float(np.clip(np.corrcoef(lr[:-1], lr[1:])[0, 1], 0.0, 0.99))
        kw["mean_rate_rps"] = float(base)
        return SyntheticWorkload(**kw)
    df = trace
    for col, med, sig in (("input_tokens", "input_median", "input_sigma"), ("output_tokens", "output_median", "output_sigma")):
        x = df[col].clip(lower=1).astype(float)
        kw[med] = float(x.median())
        kw[sig] = float(np.clip((math.log(x.quantile(0.9)) - math.log(x.median())) / 1.2816, 0.05, 4.0))
    if not df.attrs.get("per_session_clock") and len(df) > 1:
        span = float(df["arrival_s"].iloc[-1])
        kw["mean_rate_rps"] = len(df) / span
        c = counts(df["arrival_s"].to_numpy(), 10.0)
        kw["idc"] = float(max(1.0, c.var() / c.mean()))
        kw["daily_amplitude"] = 0.0
        kw["daily_second_harmonic"] = 0.0
        kw["weekend_factor"] = 1.0
    if df["think_time_s"].notna().any():
        tt = df["think_time_s"].dropna()
        tt = tt[tt > 0]
        if len(tt) > 10:
            xm = float(tt.quantile(0.05))
            tail = tt[tt >= xm]
            kw["think_time_scale_s"] = max(xm, 0.01)
            kw["think_time_alpha"] = float(np.clip(len(tail) / np.log(tail / xm).sum(), 1.01, 10.0))
        in_session = df[df["session_id"] != ""]  # rows outside sessions are not one long session
        if len(in_session):
            kw["session_turns_mean"] = float(in_session.groupby("session_id").size().mean())
    if (df["session_id"] != "").any():
        kw["agentic_fraction"] = float((df["session_id"] != "").mean())
        kw["context_limit"] = int(df["input_tokens"].max())
        first = df[df["turn"] == 0]["input_tokens"]
        new = (df["input_tokens"] - df["cached_tokens"])[df["turn"] > 0]
        if len(first):
            kw["session_initial_context_median"] = float(max(first.median(), 1.0))
        if len(new):
            kw["session_new_tokens_median"] = float(max(new.median(), 1.0))
    return SyntheticWorkload(**kw)


def compare_to_trace(trace: pd.DataFrame, synthetic: pd.DataFrame) -> pd.DataFrame:
    """Side-by-side statistics of a trace and a synthetic one (relative difference).

    Parameters
    ----------
    trace : DataFrame
        The real trace (request table or rate series).
    synthetic : DataFrame
        A generated one of the same kind (e.g. from the :func:`fit_workload` of ``trace``).

    Returns
    -------
    DataFrame
        Columns ``statistic`` (the :func:`~tokenfactory.traces.stats.trace_info` key; nested
        ones as ``input_tokens.p90``), ``trace``, ``synthetic`` and ``relative_difference`` =
        (synthetic - trace) / abs(trace), NaN when either is missing or the trace's value is 0.
    """
    from tokenfactory.traces.stats import trace_info

    a, b = trace_info(trace), trace_info(synthetic)
    rows = []
    for key, va in a.items():
        vb = b.get(key)
        if isinstance(va, dict):
            for sub, x in va.items():
                y = (vb or {}).get(sub)
                rows.append((f"{key}.{sub}", x, y))
        elif isinstance(va, (int, float)) and not isinstance(va, bool):
            rows.append((key, va, vb))
    df = pd.DataFrame(rows, columns=["statistic", "trace", "synthetic"])
    df["relative_difference"] = [(y - x) / abs(x) if isinstance(x, (int, float)) and isinstance(y, (int, float))
                                 and x not in (0, None) else np.nan for x, y in zip(df["trace"], df["synthetic"])]
    return df
