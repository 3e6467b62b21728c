"""Diagnose a running deployment from its metrics: oscillation on every signal, P/D anti-phase.

``tokenfactory diagnose --prometheus URL --start T --end T`` (or ``--metrics FILE``) reads one
series per signal of :data:`QUERY_SETS` for the engine (``vllm``, ``sglang``, ``dynamo``; the
replica counts from kube-state-metrics' ``kube_deployment_status_replicas``), runs every
detector of :mod:`tokenfactory.controllers.oscillation` on each (:func:`assess`: Thornhill
regularity, Miao-Seborg decay ratio, Forsman-Stattin h, spectral peak, Hagglund), checks the
prefill/decode pair for anti-phase (a normalised cross-correlation below -0.5 at a lag within half
the oscillation's period: one pool fills while the other drains - the seesaw of a P/D split whose
loops fight), and writes a report.

Inputs: a Prometheus ``query_range`` per signal; a saved file, either ``{signal: query_range
response}`` JSON, one ``query_range`` response whose series carry ``__name__`` (each series a
signal by its metric name, replicas by ``deployment``), or a CSV with ``time_s`` and one column per
signal. Series are put on one regular grid (the step, or the median sample spacing) and
interpolated over gaps.
"""

from __future__ import annotations

import json
import math
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from tokenfactory.controllers.oscillation import assess
from tokenfactory.core.errors import ConfigError

__all__ = ["QUERY_SETS", "PD_PAIRS", "SignalSet", "Diagnosis", "read_prometheus", "read_metrics_file",
           "diagnose", "anti_phase"]

#: PromQL per engine and signal. vLLM: vllm/v1/metrics/loggers.py; SGLang: its metrics page
#: (sglang:num_running_reqs, num_queue_reqs, token_usage, gen_throughput); Dynamo: its metrics
#: catalog (dynamo_frontend_*); replicas: kube-state-metrics' deployment metrics, the prefill and
#: decode deployments told apart by name.
QUERY_SETS: dict[str, dict[str, str]] = {
    "vllm": {
        "running": "sum(vllm:num_requests_running)",
        "waiting": "sum(vllm:num_requests_waiting)",
        "kv_usage": "avg(vllm:kv_cache_usage_perc)",
        "generation_tokens_per_s": "sum(rate(vllm:generation_tokens_total[5s]))",
        "completions_per_s": "sum(rate(vllm:request_success_total[5s]))",
        "ttft_mean_s": "sum(rate(vllm:time_to_first_token_seconds_sum[5s])) / "
                       "sum(rate(vllm:time_to_first_token_seconds_count[5s]))",
    },
    "sglang": {
        "running": "sum(sglang:num_running_reqs)",
        "waiting": "sum(sglang:num_queue_reqs)",
        "kv_usage": "avg(sglang:token_usage)",
        "generation_tokens_per_s": "sum(sglang:gen_throughput)",
        "ttft_mean_s": "sum(rate(sglang:time_to_first_token_seconds_sum[5s])) / "
                       "sum(rate(sglang:time_to_first_token_seconds_count[5s]))",
    },
    "dynamo": {
        "running": "sum(dynamo_frontend_inflight_requests)",
        "waiting": "sum(dynamo_frontend_queued_requests)",
        "ttft_mean_s": "sum(rate(dynamo_frontend_time_to_first_token_seconds_sum[5s])) / "
                       "sum(rate(dynamo_frontend_time_to_first_token_seconds_count[5s]))",
    },
}
_REPLICAS = {"prefill_replicas": 'sum(kube_deployment_status_replicas{deployment=~".*(prefill|fill).*"})',
             "decode_replicas": 'sum(kube_deployment_status_replicas{deployment=~".*decode.*"})'}
for _q in QUERY_SETS.values():
    _q.update(_REPLICAS)
#: signal pairs checked for prefill/decode anti-phase (the first pair present is used)
PD_PAIRS = (("prefill_replicas", "decode_replicas"), ("waiting", "running"))
#: amplitude below which a signal is not called oscillating, per signal (its units)
MIN_AMPLITUDE = {"running": 1.0, "waiting": 1.0, "kv_usage": 0.02, "prefill_replicas": 0.5,
                 "decode_replicas": 0.5, "completions_per_s": 0.2, "generation_tokens_per_s": 10.0,
                 "ttft_mean_s": 0.05}


@dataclass
class SignalSet:
    """Signals on one regular grid.

    Parameters
    ----------
    frame : DataFrame
        Index ``time_s`` (regular), one column per signal.
    dt : float
        The grid's step (s).
    source : str
        Where they came from.
    """

    frame: pd.DataFrame
    dt: float
    source: str

    def to_pandas(self) -> pd.DataFrame:
        return self.frame.copy()


def _grid(series: dict[str, pd.Series], step: float | None, source: str) -> SignalSet:
    series = {k: v.dropna().sort_index() for k, v in series.items()}
    series = {k: v[~v.index.duplicated()] for k, v in series.items() if len(v) >= 2}
    if not series:
        raise ConfigError("metrics", f"{source}: no signal has two or more samples")
    if step is None:
        step = float(np.median(np.concatenate([np.diff(v.index.to_numpy(dtype=float)) for v in series.values()])))
    if not step > 0:
        raise ConfigError("metrics.step", f"{source}: the samples have no positive spacing")
    t0 = max(v.index[0] for v in series.values())
    t1 = min(v.index[-1] for v in series.values())
    if t1 <= t0:
        t0 = min(v.index[0] for v in series.values())
        t1 = max(v.index[-1] for v in series.values())
    grid = np.arange(t0, t1 + step * 1e-6, step)
    frame = pd.DataFrame({k: np.interp(grid, v.index.to_numpy(dtype=float), v.to_numpy(dtype=float))
                          for k, v in series.items()}, index=pd.Index(grid - grid[0], name="time_s"))
    return SignalSet(frame, float(step), source)


def _matrix(resp: dict, where: str) -> list[tuple[dict, pd.Series]]:
    if not isinstance(resp, dict) or resp.get("status") != "success":
        raise ConfigError(where, f"not a successful query_range response: {str(resp)[:120]}")
    data = resp.get("data", {})
    if data.get("resultType") != "matrix":
        raise ConfigError(where, f"expected resultType matrix, got {data.get('resultType')!r}")
    out = []
    for r in data.get("result", []):
        vals = r.get("values", [])
        t = np.array([float(v[0]) for v in vals])
        y = np.array([float(v[1]) for v in vals])
        out.append((r.get("metric", {}), pd.Series(y, index=t)))
    return out


def read_prometheus(url: str, start: float, end: float, *, step: float = 1.0, engine: str = "vllm",
                    queries: dict[str, str] | None = None, timeout_s: float = 10.0) -> SignalSet:
    """Query a Prometheus server's ``/api/v1/query_range`` for every signal of the engine's set.

    Parameters
    ----------
    url : str
        The server (``http://127.0.0.1:9090``).
    start, end : float
        Unix seconds.
    step : float
        Resolution (s; default 1).
    engine : str
        A key of :data:`QUERY_SETS`.
    queries : dict, optional
        ``signal -> PromQL`` instead of the engine's set (``identify`` passes its own).
    timeout_s : float
        Per query.

    Returns
    -------
    SignalSet
        The signals that returned data (at least one).
    """
    if engine not in QUERY_SETS:
        raise ConfigError("engine", f"{engine!r} is not one of {', '.join(QUERY_SETS)}")
    if not end > start:
        raise ConfigError("end", f"must be after start ({start})")
    series = {}
    for name, q in (queries or QUERY_SETS[engine]).items():
        qs = urllib.parse.urlencode({"query": q, "start": start, "end": end, "step": step})
        try:
            with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/query_range?{qs}", timeout=timeout_s) as r:
                resp = json.loads(r.read())
        except OSError as e:
            raise ConfigError("prometheus", f"{url}: {e}") from None
        res = _matrix(resp, f"prometheus[{name}]")
        if res:
            series[name] = res[0][1]
    return _grid(series, step, f"prometheus {url} ({engine}, {start:.0f}-{end:.0f})")


def _signal_name(metric: dict, engine: str) -> str | None:
    name = metric.get("__name__", "")
    if name.startswith("kube_deployment"):
        dep = metric.get("deployment", "")
        return "decode_replicas" if "decode" in dep else "prefill_replicas" if ("fill" in dep) else None
    for sig, q in QUERY_SETS[engine].items():
        if name and name in q and "rate(" not in q:
            return sig
    return name or None


def read_metrics_file(path: str | Path, engine: str = "vllm") -> SignalSet:
    """A saved ``query_range`` JSON (one response, or ``{signal: response}``) or a CSV (module notes).

    Parameters
    ----------
    path : str or Path
        The file.
    engine : str
        Which query set names the raw metrics (default ``vllm``).
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError("metrics", f"{p}: no such file")
    if p.suffix.lower() == ".csv":
        df = pd.read_csv(p)
        if "time_s" not in df:
            raise ConfigError("metrics", f"{p}: a CSV needs a time_s column")
        return _grid({c: pd.Series(df[c].to_numpy(dtype=float), index=df["time_s"].to_numpy(dtype=float))
                      for c in df.columns if c != "time_s"}, None, str(p))
    try:
        doc = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError("metrics", f"{p}: not JSON ({e})") from None
    series: dict[str, pd.Series] = {}
    if isinstance(doc, dict) and "status" in doc:
        for metric, s in _matrix(doc, str(p)):
            name = _signal_name(metric, engine)
            if name is not None:
                series[name] = series[name].add(s, fill_value=0.0) if name in series else s
    elif isinstance(doc, dict):
        for name, resp in doc.items():
            res = _matrix(resp, f"{p}[{name}]")
            if res:
                series[name] = res[0][1]
    else:
        raise ConfigError("metrics", f"{p}: expected a query_range response or a mapping of them")
    return _grid(series, None, str(p))


def anti_phase(a: np.ndarray, b: np.ndarray, dt: float, period_s: float) -> dict:
    """The normalised cross-correlation of two signals within half a period of lag.

    Parameters
    ----------
    a, b : array
        The two signals (same grid).
    dt : float
        Grid step (s).
    period_s : float
        The oscillation's period (s; NaN: lags up to a quarter of the record).

    Returns
    -------
    dict
        ``min_correlation``, ``lag_s`` (of the minimum; positive: ``b`` lags ``a``),
        ``max_correlation`` and ``anti_phase`` (min below -0.5 and below -max).
    """
    x = (a - a.mean()) / (a.std() or 1.0)
    y = (b - b.mean()) / (b.std() or 1.0)
    n = len(x)
    max_lag = int(min(n // 4, (0.5 * period_s / dt) if period_s == period_s and period_s > 0 else n // 4))
    lags = np.arange(-max_lag, max_lag + 1)
    cc = np.array([np.mean(x[max(0, -k):n - max(0, k)] * y[max(0, k):n - max(0, -k)]) for k in lags])
    k = int(np.argmin(cc))
    return {"min_correlation": float(cc[k]), "lag_s": float(lags[k] * dt), "max_correlation": float(cc.max()),
            "anti_phase": bool(cc[k] < -0.5 and -cc[k] > cc.max())}


@dataclass
class Diagnosis:
    """Every signal's oscillation report and the P/D check.

    Parameters
    ----------
    signals : dict
        ``signal -> OscillationReport`` as a dict (or ``{"skipped": why}``).
    pd_check : dict or None
        :func:`anti_phase` of the first pair of :data:`PD_PAIRS` present, with the pair's names.
    source : str
        Where the data came from.
    dt : float
        Grid step (s).
    samples : int
        Grid points.
    config : dict
        How the diagnosis was run (written into the report).
    """

    signals: dict
    pd_check: dict | None
    source: str
    dt: float
    samples: int
    config: dict = field(default_factory=dict)

    def oscillating(self) -> list[str]:
        """Signals with an oscillating verdict."""
        return [k for k, v in self.signals.items() if v.get("oscillating")]

    def to_pandas(self) -> pd.DataFrame:
        return pd.DataFrame([{"signal": k, **v} for k, v in self.signals.items()])

    def to_dict(self) -> dict:
        return {"source": self.source, "dt_s": self.dt, "samples": self.samples, "signals": self.signals,
                "pd_check": self.pd_check, "oscillating": self.oscillating(), "config": self.config}

    def to_markdown(self) -> str:
        """The report, every sentence from this diagnosis's numbers."""
        osc = self.oscillating()
        lines = [f"# Oscillation diagnosis", "", f"Source: {self.source}; {self.samples} samples every "
                 f"{self.dt:g} s.", ""]
        lines.append(f"{len(osc)} of {len(self.signals)} signals oscillate" + (f": {', '.join(osc)}." if osc
                                                                                else "."))
        lines += ["", "| signal | verdict | period (s) | amplitude | r | R | h | reason |", "|---|---|---|---|---|---|---|---|"]
        for k, v in self.signals.items():
            if "skipped" in v:
                lines.append(f"| {k} | skipped | | | | | | {v['skipped']} |")
                continue
            lines.append(f"| {k} | {'OSCILLATING' if v['oscillating'] else 'steady'} | {v['period_s']:.3g} | "
                         f"{v['amplitude']:.3g} | {v['thornhill_r']:.2f} | {v['decay_ratio']:.2f} | "
                         f"{v['forsman_h']:.2f} | {v['reason']} |")
        if self.pd_check is not None:
            c = self.pd_check
            lines += ["", f"P/D check on {c['pair'][0]} vs {c['pair'][1]}: minimum cross-correlation "
                      f"{c['min_correlation']:.2f} at lag {c['lag_s']:.3g} s (maximum {c['max_correlation']:.2f}): "
                      + ("the two move in anti-phase." if c["anti_phase"] else "no anti-phase.")]
        return "\n".join(lines) + "\n"


def diagnose(signals: SignalSet, *, skip_start_s: float = 0.0) -> Diagnosis:
    """Run every oscillation detector on each signal and the P/D anti-phase check.

    Parameters
    ----------
    signals : SignalSet
        From :func:`read_prometheus` or :func:`read_metrics_file`.
    skip_start_s : float
        Seconds at the start left out (a start-up transient).

    Returns
    -------
    Diagnosis
    """
    f = signals.frame[signals.frame.index >= skip_start_s]
    out = {}
    for name in f.columns:
        x = f[name].to_numpy(dtype=float)
        if len(x) < 16 or not np.isfinite(x).all():
            out[name] = {"skipped": f"{len(x)} samples" if len(x) < 16 else "non-finite samples"}
            continue
        out[name] = assess(x, signals.dt, min_amplitude=MIN_AMPLITUDE.get(name, 0.0)).to_dict()
    pd_check = None
    for a, b in PD_PAIRS:
        if a in f and b in f and len(f) >= 16:
            period = next((out[k]["period_s"] for k in (a, b) if out.get(k, {}).get("oscillating")), math.nan)
            pd_check = {"pair": [a, b], **anti_phase(f[a].to_numpy(float), f[b].to_numpy(float), signals.dt, period)}
            break
    return Diagnosis(out, pd_check, signals.source, signals.dt, len(f), {"skip_start_s": skip_start_s})
