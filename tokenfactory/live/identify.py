"""Identify the plant from recorded series: metric delay, service rate, pass-time law, start-up
delay, the admission loop's gain - each with a confidence interval - and write scenario files.

``tokenfactory identify`` reads the series of :data:`IDENTIFY_QUERIES` (a Prometheus server, or a
saved file: the inputs of ``diagnose``) and fits:

* **metric delay** d: the engine's published request count (running + waiting) is the gateway's
  in-flight count d seconds late (what was sent and not finished, with no delay). d minimises
  sum_k (e(t_k) - g(t_k - d))^2 over the engine's scrapes t_k. With the gateway's request log, g
  is exact at every instant (:func:`fit_delay_exact`: resolves delays far below the scrape
  interval); from the scraped ``tokenfactory:gateway_in_flight`` alone, g is interpolated
  linearly between its scrapes (:func:`fit_delay`), which smears a change over a scrape
  interval and can bias d by a fraction of it. Intervals: moving-block bootstrap (blocks of 10
  samples, 200 resamples, seeded), 2.5-97.5 %;
* **per-worker service rate** mu: completions/s over decode workers in the saturated samples
  (running within 10 % of its 95th percentile, at least 5 samples), mean and t interval;
* **pass-time law** T(B) = a + b B, least squares with t intervals on a and b, and T at the
  median batch. With the generation-token counter (vLLM's ``vllm:generation_tokens_total``), from
  token throughput: every running sequence gains one token per pass, so a worker running B
  sequences at pass time T(B) emits B / T(B) tokens/s, and T = (mean running per decode worker) /
  (generation tokens/s per decode worker) in each window (Little's law on tokens). This holds at
  saturation too and carries no queueing: a request's TPOT also carries its wait for a decode slot
  (after its first token, which the fill emits), which biased the TPOT fit high (+26 % on the
  emulator at batch 21, issue 25). The decode batch is ``running`` less the requests in their
  prefill (vLLM's ``num_requests_running`` counts every scheduled request, prefilling ones too):
  the engine's prefilling count when it publishes one (the emulator's
  ``tokenfactory:emulator_requests{stage="prefilling"}``), else, on vLLM, Little's law on
  ``vllm:request_prefill_time_seconds_sum`` (prefill seconds per second = mean number prefilling;
  vLLM observes it when a request finishes, so the window is read one mean decode time later,
  from ``vllm:request_decode_time_seconds``); and decode tokens are the generation tokens less
  one first token per request (the prefill emits it; read from the success counter, as late).
  Without either prefill series the batch keeps the prefilling requests (a note says so; +7 %
  on the emulator at batch 27). Without the counter, the fallback: the mean TPOT of the
  requests finishing in each window against the mean running batch per decode worker over that
  window and the one before (when they decoded), on the windows whose two windows stayed below
  90 % of the peak batch. ``pass_law["method"]`` says which ran;
* **start-up delay**: from kube-state-metrics, the time from a rise of
  ``kube_deployment_spec_replicas`` to the matching rise of ``kube_deployment_status_ready_replicas``
  (median over rises; None when the record has none - a fixed pool);
* **admission-loop gain** k: measured over modelled per-worker service rate (the loop gain of
  admission's plant scales with it; :class:`tokenfactory.controllers.autotune.StabilityEnvelope`'s
  ``service_rate_factors``), interval from mu's.

:func:`write_scenarios` writes what ``margins`` and ``certify`` read: a margins scenario (the base
plant with the identified measurement delay; envelope delay and service-rate factors spanning the
intervals) and a stack scenario (the same, plus the start-up delay when identified), and the
figures as JSON.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import optimize, stats

from tokenfactory.core.errors import ConfigError
from tokenfactory.live.diagnose import SignalSet

__all__ = ["in_flight_from_log", "fit_delay_exact", "IDENTIFY_METRICS", "IDENTIFY_QUERIES", "WINDOW_S", "read_raw_prometheus", "series_from_signals",
           "Estimate", "Identification", "identify", "fit_delay", "fit_pass_law",
           "fit_service_rate", "fit_startup_delay", "write_scenarios"]

#: the raw series identification reads (Prometheus metric and label selectors); each keeps its own
#: scrape timestamps. vLLM's names; the gateway's in-flight count; decode workers from the
#: emulator's gauge or kube-state-metrics' ready replicas of a deployment named like ``*decode*``.
IDENTIFY_METRICS = {
    "in_flight": "tokenfactory:gateway_in_flight",
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
    "success_total": "vllm:request_success_total",
    "tpot_sum": "vllm:time_per_output_token_seconds_sum",
    "tpot_count": "vllm:time_per_output_token_seconds_count",
    "generation_total": "vllm:generation_tokens_total",
    "prefilling": 'tokenfactory:emulator_requests{stage="prefilling"}',
    "prefill_time_sum": "vllm:request_prefill_time_seconds_sum",
    "decode_time_sum": "vllm:request_decode_time_seconds_sum",
    "decode_time_count": "vllm:request_decode_time_seconds_count",
    "decode_workers": 'tokenfactory:emulator_workers{pool="decode"}',
    "spec_replicas": 'kube_deployment_spec_replicas{deployment=~".*decode.*"}',
    "ready_replicas": 'kube_deployment_status_ready_replicas{deployment=~".*decode.*"}',
}
IDENTIFY_QUERIES = IDENTIFY_METRICS  # (what the CLI passes to the readers)
#: window of the rate and TPOT estimates (s)
WINDOW_S = 5.0


def _sum_series(parts: list[pd.Series]) -> pd.Series:
    """Sum of series of several label sets: on the union of their times, each held at its last value."""
    if len(parts) == 1:
        return parts[0]
    idx = sorted(set().union(*(p.index for p in parts)))
    return sum(p.reindex(idx).ffill().fillna(0.0) for p in parts)


def read_raw_prometheus(url: str, start: float, end: float, *, metrics: dict | None = None,
                        timeout_s: float = 10.0) -> dict[str, pd.Series]:
    """Raw samples of :data:`IDENTIFY_METRICS` between ``start`` and ``end`` (unix s), each at its
    own scrape times (a range-vector query, not ``query_range``'s resampling).

    Parameters
    ----------
    url : str
        Prometheus base URL.
    start, end : float
        Unix seconds.
    metrics : dict, optional
        ``name -> selector`` (default :data:`IDENTIFY_METRICS`).
    timeout_s : float
        Per query.

    Returns
    -------
    dict
        ``name -> Series`` (time in unix s), for the metrics that returned samples.
    """
    import urllib.parse
    import urllib.request

    if not end > start:
        raise ConfigError("end", f"must be after start ({start})")
    out = {}
    span = max(int(math.ceil(end - start)), 1)
    for name, sel in (metrics or IDENTIFY_METRICS).items():
        qs = urllib.parse.urlencode({"query": f"{sel}[{span}s]", "time": end})
        try:
            with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/query?{qs}", timeout=timeout_s) as r:
                resp = json.loads(r.read())
        except OSError as e:
            raise ConfigError("prometheus", f"{url}: {e}") from None
        if resp.get("status") != "success":
            raise ConfigError("prometheus", f"{name}: {resp}")
        parts = [pd.Series([float(v[1]) for v in res["values"]], index=[float(v[0]) for v in res["values"]])
                 for res in resp["data"]["result"] if res.get("values")]
        if parts:
            out[name] = _sum_series(parts)
    return out


def series_from_signals(signals: SignalSet) -> dict[str, pd.Series]:
    """A saved file's signals (:func:`tokenfactory.live.diagnose.read_metrics_file`) as raw series.

    Parameters
    ----------
    signals : SignalSet
        The file's signals, named as :data:`IDENTIFY_METRICS`.

    Returns
    -------
    dict
        ``name -> Series``.
    """
    t = signals.frame.index.to_numpy(dtype=float)
    return {k: pd.Series(signals.frame[k].to_numpy(dtype=float), index=t) for k in signals.frame.columns}


@dataclass(frozen=True)
class Estimate:
    """A fitted value and its interval (95 %), with how it was obtained.

    Parameters
    ----------
    value : float
        The estimate.
    lo, hi : float
        Its interval.
    method : str
        How it was fitted.
    samples : int
        Samples it rests on.
    """

    value: float
    lo: float
    hi: float
    method: str
    samples: int

    def to_dict(self) -> dict:
        return asdict(self)


def in_flight_from_log(sent_s: np.ndarray, end_s: np.ndarray):
    """The exact in-flight count of a request log: ``f(t) = #{sent <= t < end}`` (vectorised).

    Parameters
    ----------
    sent_s, end_s : array
        When each request was sent upstream and when it finished (s; same clock as the series).

    Returns
    -------
    callable
        ``f(times) -> counts``.
    """
    s = np.sort(np.asarray(sent_s, dtype=float))
    e = np.sort(np.asarray(end_s, dtype=float))

    def f(t):
        t = np.asarray(t, dtype=float)
        return (np.searchsorted(s, t, side="right") - np.searchsorted(e, t, side="right")).astype(float)
    return f


def fit_delay_exact(t: np.ndarray, lagged: np.ndarray, source, *, max_delay_s: float = 10.0, seed: int = 0,
                    resamples: int = 200, block: int = 10, resolution_s: float = 0.005) -> Estimate:
    """The delay d with ``lagged(t) ~ source(t - d)`` for a source known at every instant (the
    in-flight count of a request log, :func:`in_flight_from_log`): no interpolation between
    scrapes, so the fit resolves delays far below the scrape interval. Least squares on a grid of
    ``resolution_s`` (the cost is piecewise constant in d: the middle of the minimising run is
    taken), moving-block bootstrap interval.

    Parameters
    ----------
    t : array
        Sample times of ``lagged`` (s).
    lagged : array
        The delayed signal.
    source : callable
        ``source(times) -> values``.
    max_delay_s, seed, resamples, block : as for :func:`fit_delay`
        Search range, bootstrap seed, resamples and block length.
    resolution_s : float
        Grid step of the delay (s).

    Returns
    -------
    Estimate
    """
    t, y = np.asarray(t, dtype=float), np.asarray(lagged, dtype=float)
    ok = np.isfinite(t) & np.isfinite(y)
    t, y = t[ok], y[ok]
    if len(t) < 16:
        raise ConfigError("identify.delay", f"needs >= 16 samples, got {len(t)}")
    grid = np.arange(0.0, max_delay_s + resolution_s / 2, resolution_s)
    err = (y[None, :] - source(t[None, :] - grid[:, None])) ** 2  # (delays, samples)

    def best(idx):
        c = err[:, idx].sum(axis=1)
        k = np.flatnonzero(c <= c.min() + 1e-9)
        run = k[k - k[0] == np.arange(len(k))]  # the first run of minimisers
        return float(grid[run].mean())

    n = len(t)
    d = best(np.arange(n))
    rng = np.random.default_rng(seed)
    nb = max(n // block, 1)
    boots = [best(np.concatenate([np.arange(s0, min(s0 + block, n)) for s0 in rng.integers(0, max(n - block, 1), nb)]))
             for _ in range(resamples)]
    lo, hi = np.quantile(boots, [0.025, 0.975])
    return Estimate(d, float(min(lo, d)), float(max(hi, d)), "least squares on the exact in-flight count of the "
                    "request log, block bootstrap", int(n))


def fit_delay(t: np.ndarray, lagged: np.ndarray, source: np.ndarray, *, source_t: np.ndarray | None = None,
              max_delay_s: float = 10.0, seed: int = 0, resamples: int = 200, block: int = 10) -> Estimate:
    """The delay d with ``lagged(t) ~ source(t - d)`` (module notes).

    Parameters
    ----------
    t : array
        Sample times of ``lagged`` (s).
    lagged : array
        The delayed signal.
    source : array
        The undelayed signal, at ``source_t``.
    source_t : array, optional
        Its sample times (default ``t``): each series keeps its own scrape times, so two
        targets scraped at different phases give no bias.
    max_delay_s : float
        Largest delay searched (s).
    seed : int
        Bootstrap seed.
    resamples : int
        Bootstrap resamples.
    block : int
        Bootstrap block length (samples).

    Returns
    -------
    Estimate
    """
    t, y = np.asarray(t, dtype=float), np.asarray(lagged, dtype=float)
    ts = t if source_t is None else np.asarray(source_t, dtype=float)
    g = np.asarray(source, dtype=float)
    ok = np.isfinite(t) & np.isfinite(y)
    t, y = t[ok], y[ok]
    oks = np.isfinite(ts) & np.isfinite(g)
    ts, g = ts[oks], g[oks]
    if len(t) < 16 or len(ts) < 16 or np.std(g) == 0:
        raise ConfigError("identify.delay", f"needs >= 16 samples of a varying source signal, got {len(ts)}")

    def sse(d, idx):
        return float(np.sum((y[idx] - np.interp(t[idx] - d, ts, g)) ** 2))

    def best(idx):
        grid = np.linspace(0.0, max_delay_s, int(max_delay_s * 20) + 1)
        k = int(np.argmin([sse(d, idx) for d in grid]))
        lo, hi = grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)]
        return float(optimize.minimize_scalar(lambda d: sse(d, idx), bounds=(lo, hi), method="bounded").x)

    valid = np.nonzero((t - ts[0] >= max_delay_s) & (t <= ts[-1]))[0]  # samples whose source is recorded
    if len(valid) < 16:
        valid = np.arange(len(t))
    d = best(valid)
    rng = np.random.default_rng(seed)
    n = len(valid)
    nb = max(n // block, 1)
    boots = []
    for _ in range(resamples):
        starts = rng.integers(0, max(n - block, 1), nb)
        idx = valid[np.concatenate([np.arange(s, min(s + block, n)) for s in starts])]
        boots.append(best(idx))
    lo, hi = np.quantile(boots, [0.025, 0.975])
    return Estimate(d, float(lo), float(hi), "fractional-lag least squares, block bootstrap", int(n))


def _t_interval(x: np.ndarray, method: str) -> Estimate:
    x = x[np.isfinite(x)]
    if len(x) < 2:
        raise ConfigError("identify", f"{method}: needs >= 2 samples, got {len(x)}")
    m, s = float(x.mean()), float(x.std(ddof=1))
    h = float(stats.t.ppf(0.975, len(x) - 1) * s / math.sqrt(len(x)))
    return Estimate(m, m - h, m + h, method, int(len(x)))


def fit_service_rate(running: np.ndarray, completions: np.ndarray, workers: np.ndarray) -> Estimate:
    """Per-worker completions/s in the saturated samples (module notes).

    Parameters
    ----------
    running : array
        Running sequences (mean over each window).
    completions : array
        Completions/s over each window.
    workers : array
        Decode workers.

    Returns
    -------
    Estimate
    """
    running, completions, workers = (np.asarray(a, dtype=float) for a in (running, completions, workers))
    ok = np.isfinite(running) & np.isfinite(completions) & np.isfinite(workers) & (workers > 0)
    if ok.sum() < 5:
        raise ConfigError("identify.service_rate", "needs running, completions and worker series")
    top = np.quantile(running[ok], 0.95)
    sat = ok & (running >= 0.9 * top)
    if sat.sum() < 5:
        raise ConfigError("identify.service_rate", f"only {int(sat.sum())} saturated samples (need 5): record a "
                          "load above capacity")
    return _t_interval(completions[sat] / workers[sat], "completions per worker while saturated, t interval")


def fit_pass_law(batch: np.ndarray, tpot: np.ndarray) -> dict:
    """T(B) = a + b B from windows' mean running batch and mean TPOT (least squares).

    Parameters
    ----------
    batch : array
        Mean sequences per decode worker in each window.
    tpot : array
        Mean TPOT of the requests finished in each window (s).

    Returns
    -------
    dict
        ``a_s``, ``b_s_per_seq``, ``pass_at_median_s`` (:class:`Estimate`) and ``median_batch``.
    """
    b, y = np.asarray(batch, dtype=float), np.asarray(tpot, dtype=float)
    ok = np.isfinite(b) & np.isfinite(y) & (b > 0)
    b, y = b[ok], y[ok]
    if len(b) < 5 or np.ptp(b) <= 0:
        raise ConfigError("identify.pass_law", f"needs >= 5 windows at varied batch sizes, got {len(b)}")
    X = np.column_stack([np.ones_like(b), b])
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ coef
    dof = max(len(b) - 2, 1)
    s2 = float(resid @ resid) / dof
    cov = s2 * np.linalg.inv(X.T @ X)
    q = float(stats.t.ppf(0.975, dof))
    se = np.sqrt(np.diag(cov))
    bm = float(np.median(b))
    tm = float(coef[0] + coef[1] * bm)
    se_m = float(np.sqrt(np.array([1.0, bm]) @ cov @ np.array([1.0, bm])))
    return {"a_s": Estimate(float(coef[0]), float(coef[0] - q * se[0]), float(coef[0] + q * se[0]),
                            "least squares, t interval", len(b)),
            "b_s_per_seq": Estimate(float(coef[1]), float(coef[1] - q * se[1]), float(coef[1] + q * se[1]),
                                    "least squares, t interval", len(b)),
            "median_batch": bm,
            "pass_at_median_s": Estimate(tm, tm - q * se_m, tm + q * se_m, "least squares, t interval", len(b))}


def fit_startup_delay(t: np.ndarray, spec: np.ndarray, ready: np.ndarray) -> Estimate | None:
    """Median time from each rise of the desired replicas to the ready replicas reaching it.

    Parameters
    ----------
    t : array
        Sample times (s).
    spec, ready : array
        Desired and ready replicas at ``t``.

    Returns
    -------
    Estimate or None
        None when the record has no rise.
    """
    t, spec, ready = (np.asarray(a, dtype=float) for a in (t, spec, ready))
    ok = np.isfinite(spec) & np.isfinite(ready)
    t, spec, ready = t[ok], spec[ok], ready[ok]
    waits = []
    for k in np.nonzero(np.diff(spec) > 0)[0] + 1:
        target = spec[k]
        later = np.nonzero((t >= t[k]) & (ready >= target))[0]
        if len(later):
            waits.append(t[later[0]] - t[k])
    if not waits:
        return None
    w = np.asarray(waits)
    lo, hi = (np.quantile(w, [0.025, 0.975]) if len(w) > 1 else (w[0], w[0]))
    return Estimate(float(np.median(w)), float(lo), float(hi), "median over replica rises", len(w))


@dataclass
class Identification:
    """What :func:`identify` fitted (each an :class:`Estimate`, or None when the data hold none).

    Parameters
    ----------
    metric_delay_s : Estimate or None
        How late the engine's metrics are.
    service_rate_per_worker : Estimate or None
        Completions/s of a saturated decode worker.
    pass_law : dict or None
        ``a_s``, ``b_s_per_seq``, ``pass_at_median_s`` (Estimates) and ``median_batch``.
    startup_delay_s : Estimate or None
        Replica start-up delay.
    admission_gain : Estimate or None
        Measured over modelled service rate.
    modelled_service_rate : float or None
        The scenario's figure it was compared with.
    notes : list of str
        What could not be fitted, and why.
    source : str
        Where the data came from.
    """

    metric_delay_s: Estimate | None
    service_rate_per_worker: Estimate | None
    pass_law: dict | None
    startup_delay_s: Estimate | None
    admission_gain: Estimate | None
    modelled_service_rate: float | None
    notes: list = field(default_factory=list)
    source: str = ""

    def to_dict(self) -> dict:
        def conv(v):
            if isinstance(v, Estimate):
                return v.to_dict()
            if isinstance(v, dict):
                return {k: conv(x) for k, x in v.items()}
            return v
        return {k: conv(v) for k, v in asdict(self).items()} | {
            k: conv(getattr(self, k)) for k in ("metric_delay_s", "service_rate_per_worker", "pass_law",
                                                "startup_delay_s", "admission_gain")}

    def to_pandas(self) -> pd.DataFrame:
        rows = []
        for k in ("metric_delay_s", "service_rate_per_worker", "startup_delay_s", "admission_gain"):
            e = getattr(self, k)
            if e is not None:
                rows.append({"parameter": k, **e.to_dict()})
        if self.pass_law:
            for k in ("a_s", "b_s_per_seq", "pass_at_median_s"):
                rows.append({"parameter": f"pass_law.{k}", **self.pass_law[k].to_dict()})
        return pd.DataFrame(rows)


def _windowed(t: np.ndarray, x: np.ndarray, w: float) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs (k, j): sample j is the first at least ``w`` before sample k."""
    j = np.searchsorted(t, t - w, side="right") - 1
    ok = j >= 0
    return np.nonzero(ok)[0], j[ok]


def _cumulative_at(col: dict, name: str, t: np.ndarray) -> np.ndarray:
    """A counter interpolated at ``t`` (NaN outside its record: no extrapolation)."""
    s = col[name]
    x = s.index.to_numpy(float)
    return np.where((t >= x[0]) & (t <= x[-1]), np.interp(t, x, s.to_numpy(float)), np.nan)


def _pass_law_from_tokens(col: dict, t: np.ndarray, running: np.ndarray, workers: np.ndarray, window_s: float,
                          notes: list) -> dict:
    """The pass-time law from token throughput (module notes), on the decode batch: ``running``
    less the requests in their prefill, generation tokens less the first tokens (which the prefill
    emits)."""
    k, j = _windowed(t, running, window_s)
    dt = t[k] - t[j]
    per_worker = np.maximum(workers[k], 1.0)
    gen = _cumulative_at(col, "generation_total", t)
    running_mean = np.array([running[a:b + 1].mean() for a, b in zip(j, k)])
    # completion-time observations (vLLM's finished-request histograms and success counter) lag
    # the prefill they describe by the request's decode time D: a window [t_j, t_k] of prefills
    # and first tokens is observed over [t_j + D, t_k + D]
    d_s = 0.0
    if {"decode_time_sum", "decode_time_count"} <= set(col):
        n = col["decode_time_count"].to_numpy(float)
        if n[-1] - n[0] > 0:
            d_s = float((col["decode_time_sum"].to_numpy(float)[-1] - col["decode_time_sum"].to_numpy(float)[0])
                        / (n[-1] - n[0]))
    if "prefilling" in col:  # the engine's own count of requests in their prefill (the emulator's)
        pv = np.interp(t, col["prefilling"].index.to_numpy(float), col["prefilling"].to_numpy(float))
        prefilling = np.array([pv[a:b + 1].mean() for a, b in zip(j, k)])
        how = "less the engine's prefilling count"
    elif "prefill_time_sum" in col:
        # Little's law: the mean number in their prefill over a window is the prefill time the
        # window's requests spent, per second (vLLM observes prefill_time = first_token_ts -
        # scheduled_ts when a request finishes: vllm/v1/metrics/stats.py, update_from_finished_request)
        ps = _cumulative_at(col, "prefill_time_sum", t + d_s)
        prefilling = (ps[k] - ps[j]) / dt
        how = f"less prefilling by Little's law on vLLM's prefill time (observed {d_s:.2f} s later)"
    else:
        prefilling = np.zeros(len(k))
        how = "as reported (no prefill series: a prefilling request counts as decoding)"
        notes.append("pass-time law: no prefilling count or vllm:request_prefill_time_seconds: the decode batch "
                     "includes the requests in their prefill (biased high)")
    tokens = (gen[k] - gen[j]) / dt
    done = _cumulative_at(col, "success_total", t + d_s)
    first_tokens = (done[k] - done[j]) / dt  # one first token per request, emitted by its prefill
    batch = (running_mean - prefilling) / per_worker
    tokens_per_s = (tokens - np.nan_to_num(first_tokens)) / per_worker
    ok = np.isfinite(batch) & np.isfinite(tokens_per_s) & np.isfinite(first_tokens) & (tokens_per_s > 0) & (batch > 0)
    law = fit_pass_law(batch[ok], batch[ok] / tokens_per_s[ok])
    law["method"] = (f"token throughput: decoding / decode tokens/s per decode worker (running {how}; "
                     "generation tokens less one first token per request)")
    law["prefilling_share"] = float(np.nanmean((prefilling / np.maximum(running_mean, 1e-9))[ok]))
    return law


def identify(series: dict[str, pd.Series] | SignalSet, *, modelled_service_rate: float | None = None,
             seed: int = 0, max_delay_s: float = 10.0, window_s: float = WINDOW_S,
             request_log: pd.DataFrame | None = None, pass_window_s: float = 3.0) -> Identification:
    """Fit every parameter the data hold (module notes); a parameter without its series is None
    with a note saying why.

    Parameters
    ----------
    series : dict or SignalSet
        Raw series named as :data:`IDENTIFY_METRICS` (:func:`read_raw_prometheus`), or a saved
        file's signals under those names.
    modelled_service_rate : float, optional
        The scenario's per-worker service rate (requests/s), for the admission-loop gain.
    seed : int
        Bootstrap seed.
    max_delay_s : float
        Largest metric delay searched (s).
    window_s : float
        Window of the rate and TPOT estimates (s).
    pass_window_s : float
        Window of the pass-time law's TPOT means (s; the batch is averaged over two of them).
    request_log : DataFrame, optional
        The gateway's request log (``sent_unix_s``, ``end_unix_s``; ``tokenfactory gateway
        --request-log``): the metric delay is then fitted on its exact in-flight count
        (:func:`fit_delay_exact`) instead of the scraped one.

    Returns
    -------
    Identification
    """
    source = ""
    if isinstance(series, SignalSet):
        source = series.source
        series = series_from_signals(series)
    col = {k: v.dropna().sort_index() for k, v in series.items()}
    notes = []
    gain = None
    delay = _identify_delay(col, request_log, max_delay_s, seed, notes)
    rate, law = _identify_service(col, window_s, pass_window_s, notes)
    startup = _identify_startup(col, notes)
    if rate is not None and modelled_service_rate:
        m = float(modelled_service_rate)
        gain = Estimate(rate.value / m, rate.lo / m, rate.hi / m, "measured / modelled service rate", rate.samples)
    return Identification(delay, rate, law, startup, gain, modelled_service_rate, notes, source)


def _identify_delay(col: dict, request_log: pd.DataFrame | None, max_delay_s: float, seed: int,
                    notes: list) -> Estimate | None:
    """The metric delay: the engine's running + waiting against the exact in-flight count of the
    gateway's request log, else against the gateway's scraped ``in_flight``."""
    if request_log is not None and {"running", "waiting"} <= set(col):
        eng = _sum_series([col["running"], col["waiting"]])
        sent = request_log["sent_unix_s"].to_numpy(float)
        fin = request_log["end_unix_s"].to_numpy(float)
        keep = np.isfinite(sent) & np.isfinite(fin)
        try:
            return fit_delay_exact(eng.index.to_numpy(float), eng.to_numpy(float),
                                   in_flight_from_log(sent[keep], fin[keep]), max_delay_s=max_delay_s, seed=seed)
        except ConfigError as e:
            notes.append(str(e))
    elif {"running", "waiting", "in_flight"} <= set(col):
        eng = _sum_series([col["running"], col["waiting"]])
        try:
            return fit_delay(eng.index.to_numpy(float), eng.to_numpy(float), col["in_flight"].to_numpy(float),
                             source_t=col["in_flight"].index.to_numpy(float), max_delay_s=max_delay_s, seed=seed)
        except ConfigError as e:
            notes.append(str(e))
    else:
        notes.append("metric delay: needs running, waiting and the gateway's in_flight")
    return None


def _identify_service(col: dict, window_s: float, pass_window_s: float, notes: list) -> tuple[Estimate | None,
                                                                                             dict | None]:
    """The per-worker service rate (completions against the running batch) and the decode pass-time
    law (from the generated tokens, else from the TPOT histogram's windows below saturation)."""
    rate = law = None
    have = set(col)
    if not {"running", "success_total"} <= have:
        notes.append("service rate: needs running and success_total")
        return rate, law
    r = col["running"]
    t = r.index.to_numpy(float)
    workers = (np.interp(t, col["decode_workers"].index.to_numpy(float), col["decode_workers"].to_numpy(float))
               if "decode_workers" in col else np.full(len(t), np.nan))
    succ = np.interp(t, col["success_total"].index.to_numpy(float), col["success_total"].to_numpy(float))
    k, j = _windowed(t, succ, window_s)
    dt = t[k] - t[j]
    comp = (succ[k] - succ[j]) / dt
    run_mean = np.array([r.to_numpy(float)[a:b + 1].mean() for a, b in zip(j, k)])
    if np.isfinite(workers).any():
        try:
            rate = fit_service_rate(run_mean, comp, workers[k])
        except ConfigError as e:
            notes.append(str(e))
    else:
        notes.append("service rate: no decode worker count (emulator gauge or kube-state-metrics)")
    if "generation_total" in have and np.isfinite(workers).any():
        try:
            law = _pass_law_from_tokens(col, t, r.to_numpy(float), workers, pass_window_s, notes)
        except ConfigError as e:
            notes.append(str(e))
    elif {"tpot_sum", "tpot_count"} <= have and np.isfinite(workers).any():
        try:
            law = _pass_law_from_tpot(col, t, r.to_numpy(float), succ, workers, pass_window_s)
        except ConfigError as e:
            notes.append(str(e))
    return rate, law


def _pass_law_from_tpot(col: dict, t: np.ndarray, rv: np.ndarray, succ: np.ndarray, workers: np.ndarray,
                        pw: float) -> dict:
    """The pass-time law from the TPOT histogram's sum and count over windows of ``pw`` seconds
    (shorter than the rate's: the law needs several windows per load level)."""
    # a request's TPOT carries its wait for a decode slot once decode is full, and the requests
    # finishing in a window decoded over the window before it too: the law is fitted on the
    # windows whose requests ran below saturation (the batch over both windows, none saturated)
    k, j = _windowed(t, succ, pw)
    ts = np.interp(t, col["tpot_sum"].index.to_numpy(float), col["tpot_sum"].to_numpy(float))
    tc = np.interp(t, col["tpot_count"].index.to_numpy(float), col["tpot_count"].to_numpy(float))
    dc = tc[k] - tc[j]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(dc >= 1, (ts[k] - ts[j]) / np.where(dc > 0, dc, 1.0), np.nan)
    k2, j2 = _windowed(t, succ, 2.0 * pw)
    span_mean = np.full(len(t), np.nan)
    span_max = np.full(len(t), np.nan)
    for a, b in zip(j2, k2):
        span_mean[b], span_max[b] = rv[a:b + 1].mean(), rv[a:b + 1].max()
    top = np.nanquantile(rv, 0.95) if len(rv) else np.nan
    unsat = span_max[k] < 0.9 * top
    law = fit_pass_law((span_mean[k] / np.maximum(workers[k], 1.0))[unsat], tpot[unsat])
    law["method"] = "TPOT of the windows below 90 % of the peak batch (includes slot waits)"
    return law


def _identify_startup(col: dict, notes: list) -> Estimate | None:
    """The worker start-up delay: ready replicas against the spec's rises (None for fixed pools)."""
    startup = None
    if {"spec_replicas", "ready_replicas"} <= set(col):
        t = col["spec_replicas"].index.to_numpy(float)
        ready = np.interp(t, col["ready_replicas"].index.to_numpy(float), col["ready_replicas"].to_numpy(float))
        startup = fit_startup_delay(t, col["spec_replicas"].to_numpy(float), ready)
    if startup is None:
        notes.append("start-up delay: no replica rise recorded (fixed pools)")
    return startup


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return repr(float(v)) if isinstance(v, float) else str(v)


def _table(name: str, d: dict) -> list[str]:
    return [f"[{name}]", *[f"{k} = {_toml_value(v)}" for k, v in d.items()], ""]


def write_scenarios(ident: Identification, base_plant: dict, out_dir: str | Path, *, name: str = "identified",
                    slo: tuple[float, float] = (2.0, 0.1), rate_rps: float = 1.0) -> dict[str, Path]:
    """Write ``margins.toml`` (``tokenfactory margins``), ``stack.toml`` (``tokenfactory certify``)
    and ``identified.json`` into ``out_dir``.

    Parameters
    ----------
    ident : Identification
        The fit.
    base_plant : dict
        The plant it was fitted on (``model``, ``hardware``, pools, ...): kept, with the
        identified measurement delay.
    out_dir : str or Path
        Folder (created).
    name : str
        Scenario name.
    slo : tuple
        (TTFT, TPOT) SLO of the stack scenario (s).
    rate_rps : float
        The stack's nominal demand (requests/s).

    Returns
    -------
    dict
        ``{"margins": path, "stack": path, "json": path}``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plant = {k: v for k, v in base_plant.items() if k in ("model", "hardware", "fill_workers", "decode_workers",
                                                          "prompt_tokens", "output_tokens", "kv_stripes",
                                                          "kv_setup_s")}
    d = ident.metric_delay_s
    env = {}
    if d is not None:
        plant["measurement_delay_s"] = round(max(d.value, 1e-3), 4)
        env["delay_factors"] = [round(max(d.lo, 1e-3) / max(d.value, 1e-3), 3), 1.0,
                                round(max(d.hi, 1e-3) / max(d.value, 1e-3), 3)]
    g = ident.admission_gain
    if g is not None:
        env["service_rate_factors"] = sorted({round(g.lo, 3), round(g.value, 3), round(g.hi, 3)})
    header = [f"# Identified by `tokenfactory identify` from {ident.source}", *(
        f"# {k}: {v}" for k, v in ident.to_pandas().set_index("parameter")["value"].items())]
    margins = header + [f'name = "{name}"', ""] + _table("plant", plant) + _table("controller", {
        "kind": "smoothed"}) + (_table("envelope", env) if env else [])
    p_m = out / "margins.toml"
    p_m.write_text("\n".join(margins))
    stack_plant = {k: v for k, v in plant.items() if k not in ("fill_workers", "decode_workers")}
    dyn = {}
    if ident.startup_delay_s is not None:
        dyn["startup_s"] = round(ident.startup_delay_s.value, 3)
    stack = header + [f'name = "{name}"', ""] + _table("plant", stack_plant) + _table(
        "slo", {"ttft_s": slo[0], "tpot_s": slo[1]}) + _table("workload", {"rate_rps": float(rate_rps)}) + (
        _table("dynamics", dyn) if dyn else []) + _table("layers.batch_gate", {"kind": "gated"}) + _table(
        "layers.admission", {"kind": "smoothed", "sample_period_s": 1.0}) + _table(
        "layers.reconfiguration", {"kind": "planned-hysteretic", "sample_period_s": 10.0}) + (
        _table("envelope", env) if env else [])
    p_s = out / "stack.toml"
    p_s.write_text("\n".join(stack))
    p_j = out / "identified.json"
    p_j.write_text(json.dumps(ident.to_dict(), indent=2, default=float))
    return {"margins": p_m, "stack": p_s, "json": p_j}
