"""Statistics of a trace: what ``tokenfactory traces info`` prints and ``fit`` compares."""

from __future__ import annotations


import numpy as np
import pandas as pd

__all__ = ["trace_info", "request_stats", "rate_stats", "counts", "acf_at", "daily_profile", "rates_from_requests"]

WINDOWS_S = (10.0, 60.0, 600.0)


def _q(x: pd.Series) -> dict:
    x = x.dropna()
    if x.empty:
        return {}
    return {"mean": float(x.mean()), "p50": float(x.quantile(0.5)), "p90": float(x.quantile(0.9)),
            "p99": float(x.quantile(0.99)), "max": float(x.max())}


def counts(arrival_s: np.ndarray, window_s: float) -> np.ndarray:
    """Arrivals per window over the trace's span (whole windows only: a trailing partial window
    is dropped, so it cannot inflate the dispersion).

    Parameters
    ----------
    arrival_s : ndarray
        Arrival times (s), sorted, measured from the start of the first window (the span is the
        last arrival time).
    window_s : float
        Window width (s, > 0).

    Returns
    -------
    ndarray of int
        Arrivals in each of the ``floor(span / window_s)`` whole windows; at least one window,
        so a span shorter than ``window_s`` gives one (partial) window.
    """
    span = float(arrival_s[-1]) if len(arrival_s) else 0.0
    n = max(1, int(span // window_s))
    idx = (np.asarray(arrival_s) // window_s).astype(int)
    return np.bincount(idx[idx < n], minlength=n)[:n]


def acf_at(x: np.ndarray, lag: int) -> float | None:
    """Autocorrelation at ``lag`` samples, over pairs where both ends are present.

    Mean and variance are taken over all present samples (NaN = missing window), so gaps do
    not bias the estimate towards zero.

    Parameters
    ----------
    x : ndarray
        A regularly sampled series (counts or rates); NaN marks a missing sample.
    lag : int
        Lag in samples (e.g. 60 one-minute counts = 1 h).

    Returns
    -------
    float or None
        The autocorrelation (-1 to 1); None when ``lag`` is not in ``1 .. len(x) - 3``, fewer
        than 3 pairs are present, or the series is constant.
    """
    x = np.asarray(x, dtype=float)
    if lag <= 0 or lag >= len(x) - 2:
        return None
    a, b = x[:-lag], x[lag:]
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 3:
        return None
    m = np.nanmean(x)
    v = np.nanvar(x)
    return float(np.mean((a[ok] - m) * (b[ok] - m)) / v) if v > 0 else None


def request_stats(df: pd.DataFrame) -> dict:
    """Arrival-process and request-size statistics of a request table.

    Parameters
    ----------
    df : DataFrame
        A request table (:mod:`tokenfactory.traces.schema`).

    Returns
    -------
    dict
        ``kind``, ``rows``; for a trace on one clock: ``span_s`` (s), ``mean_rate_rps``
        (requests/s), ``peak_to_mean_<w>s`` and ``idc_<w>s`` (index of dispersion var/mean of
        counts) for 10, 60 and 600 s windows, ``acf_1h`` and ``acf_1d`` (autocorrelation of
        one-minute counts; None when the trace is too short); for per-session clocks a ``note``
        instead. Then quantiles (``mean``, ``p50``, ``p90``, ``p99``, ``max``) of
        ``input_tokens`` and ``output_tokens``, of ``cached_tokens`` with ``prefix_reuse_ratio``
        (cached / input tokens; None when nothing is cached), ``sessions`` and
        ``turns_per_session`` when the trace has sessions, and ``think_time_s`` when known.
    """
    out: dict = {"kind": "requests", "rows": int(len(df))}
    per_session_clock = bool(df.attrs.get("per_session_clock"))
    if not per_session_clock and len(df) > 1:
        t = df["arrival_s"].to_numpy()
        span = float(t[-1] - t[0])
        out.update({"span_s": span, "mean_rate_rps": len(df) / span if span > 0 else None})
        for w in WINDOWS_S:
            c = counts(t - t[0], w)
            if len(c) >= 2 and c.mean() > 0:
                out[f"peak_to_mean_{int(w)}s"] = float(c.max() / c.mean())
                out[f"idc_{int(w)}s"] = float(c.var() / c.mean())
        c60 = counts(t - t[0], 60.0)
        out["acf_1h"] = acf_at(c60, 60)
        out["acf_1d"] = acf_at(c60, 1440)
    else:
        out["note"] = "per-session clocks: no cluster-level arrival process"
    out["input_tokens"] = _q(df["input_tokens"])
    out["output_tokens"] = _q(df["output_tokens"])
    if df["cached_tokens"].sum() > 0:
        out["cached_tokens"] = _q(df["cached_tokens"])
        out["prefix_reuse_ratio"] = float(df["cached_tokens"].sum() / df["input_tokens"].sum())
    else:
        out["prefix_reuse_ratio"] = None
    if (df["session_id"] != "").any():
        per = df.groupby("session_id").size()
        out["sessions"] = int(len(per))
        out["turns_per_session"] = _q(per.astype(float))
    if df["think_time_s"].notna().any():
        out["think_time_s"] = _q(df["think_time_s"])
    return out


def daily_profile(rates: pd.DataFrame) -> pd.Series:
    """Mean rate by time of day (requires a ``time_s`` index whose 0 is midnight).

    Parameters
    ----------
    rates : DataFrame
        A rate series (index ``time_s``, column ``rate_rps``); missing windows are skipped.

    Returns
    -------
    Series
        Mean ``rate_rps`` (requests/s) indexed by the window's second of the day (0-86400).
    """
    tod = (rates.index.to_numpy() % 86400.0)
    return rates["rate_rps"].groupby(tod).mean()


def rate_stats(df: pd.DataFrame) -> dict:
    """Level, burstiness and seasonality statistics of a rate series.

    Parameters
    ----------
    df : DataFrame
        A rate series (:mod:`tokenfactory.traces.schema`); ``attrs["interval_s"]`` gives the
        window width (else the median index step).

    Returns
    -------
    dict
        ``kind``, ``rows``, ``span_s`` (s), ``interval_s`` (s), ``missing_windows``,
        ``mean_rate_rps`` (requests/s, over present windows), ``peak_to_mean_<interval>s``,
        ``peak_to_mean_1h`` (of hourly means, when there are two hours),
        ``idc_mean_rate_weighted`` (when the series has ``idc``), ``acf_1h`` and ``acf_1d``
        (None when too short), and for two days or more ``daily_peak_to_trough`` and
        ``daily_amplitude`` ((max - min) / 2 / mean of the time-of-day profile; assumes window
        0 starts at midnight).
    """
    r = df["rate_rps"]
    interval = float(df.attrs.get("interval_s", np.median(np.diff(df.index))))
    span = float(df.index[-1] - df.index[0] + interval)
    out = {"kind": "rates", "rows": int(len(df)), "span_s": span, "interval_s": interval,
           "missing_windows": int(r.isna().sum()), "mean_rate_rps": float(r.mean()),
           f"peak_to_mean_{int(interval)}s": float(r.max() / r.mean())}
    hourly = r.groupby((df.index // 3600.0)).mean()
    if len(hourly) >= 2:
        out["peak_to_mean_1h"] = float(hourly.max() / hourly.mean())
    if "idc" in df:
        w = df["idc"].where(r > 0)
        out["idc_mean_rate_weighted"] = float((w * r).sum() / r[w.notna()].sum()) if r[w.notna()].sum() > 0 else None
    out["acf_1h"] = acf_at(r.to_numpy(), int(round(3600 / interval)))
    out["acf_1d"] = acf_at(r.to_numpy(), int(round(86400 / interval)))
    if span >= 2 * 86400:
        prof = daily_profile(df)
        out["daily_peak_to_trough"] = float(prof.max() / max(prof.min(), 1e-12))
        out["daily_amplitude"] = float((prof.max() - prof.min()) / 2 / prof.mean())
    return out


def trace_info(df: pd.DataFrame) -> dict:
    """What ``tokenfactory traces info`` prints: name, source and the table's statistics.

    Parameters
    ----------
    df : DataFrame
        A request table or a rate series (``attrs["kind"]``; a table without it is taken as
        requests).

    Returns
    -------
    dict
        ``name`` and ``source`` from ``attrs``, then :func:`request_stats` or :func:`rate_stats`.
    """
    info = {"name": df.attrs.get("name"), "source": df.attrs.get("source")}
    info.update(request_stats(df) if df.attrs.get("kind", "requests") == "requests" else rate_stats(df))
    return info


def rates_from_requests(df: pd.DataFrame, interval_s: float = 60.0) -> pd.DataFrame:
    """A request table as a rate series (arrivals per second in each window).

    Parameters
    ----------
    df : DataFrame
        A request table on one clock (``arrival_s`` from 0).
    interval_s : float
        Window width (s; default 60). A trailing partial window is dropped (:func:`counts`).

    Returns
    -------
    DataFrame
        A rate series: ``rate_rps`` = arrivals / ``interval_s`` (requests/s), indexed by window
        start ``time_s``; ``attrs`` carry the table's name and source and ``interval_s``.

    Raises
    ------
    ConfigError
        For a trace with per-session clocks (it has no cluster arrival rate).
    """
    if df.attrs.get("per_session_clock"):
        from tokenfactory.core.validation import ConfigError

        raise ConfigError("trace", "this trace has per-session clocks: it has no cluster arrival rate")
    c = counts(df["arrival_s"].to_numpy(), interval_s)
    out = pd.DataFrame({"rate_rps": c / interval_s}, index=pd.Index(np.arange(len(c)) * interval_s, name="time_s"))
    out.attrs.update({"name": df.attrs.get("name"), "kind": "rates", "source": df.attrs.get("source"),
                      "interval_s": interval_s})
    return out
