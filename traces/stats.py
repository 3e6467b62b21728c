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
    is dropped, so it cannot inflate the dispersion)."""
    span = float(arrival_s[-1]) if len(arrival_s) else 0.0
    n = max(1, int(span // window_s))
    idx = (np.asarray(arrival_s) // window_s).astype(int)
    return np.bincount(idx[idx < n], minlength=n)[:n]


def acf_at(x: np.ndarray, lag: int) -> float | None:
    """Autocorrelation at ``lag`` samples, over pairs where both ends are present."""
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
    """Mean rate by time of day (requires a ``time_s`` index whose 0 is midnight)."""
    tod = (rates.index.to_numpy() % 86400.0)
    return rates["rate_rps"].groupby(tod).mean()


def rate_stats(df: pd.DataFrame) -> dict:
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
    info = {"name": df.attrs.get("name"), "source": df.attrs.get("source")}
    info.update(request_stats(df) if df.attrs.get("kind", "requests") == "requests" else rate_stats(df))
    return info


def rates_from_requests(df: pd.DataFrame, interval_s: float = 60.0) -> pd.DataFrame:
    """A request table as a rate series (arrivals per second in each window)."""
    if df.attrs.get("per_session_clock"):
        from tokenfactory.validation import ConfigError

        raise ConfigError("trace", "this trace has per-session clocks: it has no cluster arrival rate")
    c = counts(df["arrival_s"].to_numpy(), interval_s)
    out = pd.DataFrame({"rate_rps": c / interval_s}, index=pd.Index(np.arange(len(c)) * interval_s, name="time_s"))
    out.attrs.update({"name": df.attrs.get("name"), "kind": "rates", "source": df.attrs.get("source"),
                      "interval_s": interval_s})
    return out
