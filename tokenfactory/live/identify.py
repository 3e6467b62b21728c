"""Identify the plant from recorded series: metric delay, service rate, pass-time law, start-up
delay, the admission loop's gain - each with a confidence interval - and write scenario files.

``tokenfactory identify`` reads the series of :data:`IDENTIFY_QUERIES` (a Prometheus server, or a
saved file: the inputs of ``diagnose``) and fits:

* **metric delay** d: the engine's published request count (running + waiting) is the gateway's
  in-flight count d seconds late (``tokenfactory:gateway_in_flight`` counts what was sent and not
  finished, with no delay). d minimises sum_k (e(t_k) - g(t_k - d))^2 over the samples, g
  linearly interpolated between its samples (a fractional lag: finer than the scrape); the
  interval is a moving-block bootstrap (blocks of 10 samples, 200 resamples, seeded) of the
  residual-free pairs, 2.5-97.5 %;
* **per-worker service rate** mu: completions/s over decode workers in the saturated samples
  (running within 10 % of its 95th percentile, at least 5 samples), mean and t interval;
* **pass-time law** T(B) = a + b B: the mean TPOT of each window against its mean running batch,
  least squares with t intervals on a and b, and T at the median batch;
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

from tokenfactory.errors import ConfigError
from tokenfactory.live.diagnose import SignalSet

__all__ = ["IDENTIFY_QUERIES", "Estimate", "Identification", "identify", "fit_delay", "fit_pass_law",
           "fit_service_rate", "fit_startup_delay", "write_scenarios"]

#: PromQL of the signals identification needs (vLLM names; the gateway's in-flight count)
IDENTIFY_QUERIES = {
    "in_flight": "sum(tokenfactory:gateway_in_flight)",
    "engine_requests": "sum(vllm:num_requests_running) + sum(vllm:num_requests_waiting)",
    "running": "sum(vllm:num_requests_running)",
    "completions_per_s": "sum(rate(vllm:request_success_total[5s]))",
    "tpot_s": "sum(rate(vllm:time_per_output_token_seconds_sum[5s])) / "
              "sum(rate(vllm:time_per_output_token_seconds_count[5s]))",
    "decode_workers": 'sum(tokenfactory:emulator_workers{pool="decode"}) or '
                      'sum(kube_deployment_status_ready_replicas{deployment=~".*decode.*"})',
    "spec_replicas": 'sum(kube_deployment_spec_replicas{deployment=~".*decode.*"})',
    "ready_replicas": 'sum(kube_deployment_status_ready_replicas{deployment=~".*decode.*"})',
}


@dataclass(frozen=True)
class Estimate:
    """A fitted value and its interval (``lo``, ``hi``; 95 %), with how it was obtained."""

    value: float
    lo: float
    hi: float
    method: str
    samples: int

    def to_dict(self) -> dict:
        return asdict(self)


def fit_delay(t: np.ndarray, lagged: np.ndarray, source: np.ndarray, *, max_delay_s: float = 10.0,
              seed: int = 0, resamples: int = 200, block: int = 10) -> Estimate:
    """The delay d with ``lagged(t) ~ source(t - d)`` (module notes).

    Parameters
    ----------
    t : array
        Sample times (s).
    lagged, source : array
        The delayed signal and the undelayed one at ``t``.
    max_delay_s : float
        Largest delay searched (s).
    seed : int
        Bootstrap seed.

    Returns
    -------
    Estimate
    """
    t, y, g = (np.asarray(a, dtype=float) for a in (t, lagged, source))
    ok = np.isfinite(t) & np.isfinite(y) & np.isfinite(g)
    t, y, g = t[ok], y[ok], g[ok]
    if len(t) < 16 or np.std(g) == 0:
        raise ConfigError("identify.delay", f"needs >= 16 samples of a varying source signal, got {len(t)}")

    def sse(d, idx):
        return float(np.sum((y[idx] - np.interp(t[idx] - d, t, g)) ** 2))

    def best(idx):
        grid = np.linspace(0.0, max_delay_s, int(max_delay_s * 20) + 1)
        k = int(np.argmin([sse(d, idx) for d in grid]))
        lo, hi = grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)]
        return float(optimize.minimize_scalar(lambda d: sse(d, idx), bounds=(lo, hi), method="bounded").x)

    valid = np.nonzero(t - t[0] >= max_delay_s)[0]  # samples whose source window is recorded
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
    """Per-worker completions/s in the saturated samples (module notes)."""
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
    """T(B) = a + b B from windows' mean running batch and mean TPOT (least squares)."""
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
    """Median time from each rise of the desired replicas to the ready replicas reaching it."""
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
    """What :func:`identify` fitted (each an :class:`Estimate`, or None when the data hold none)."""

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


def identify(signals: SignalSet, *, modelled_service_rate: float | None = None, seed: int = 0,
             max_delay_s: float = 10.0) -> Identification:
    """Fit every parameter the data hold (module notes); a parameter without its series is None
    with a note saying why.

    Parameters
    ----------
    signals : SignalSet
        Series named as :data:`IDENTIFY_QUERIES`.
    modelled_service_rate : float, optional
        The scenario's per-worker service rate (requests/s), for the admission-loop gain.
    seed : int
        Bootstrap seed.
    max_delay_s : float
        Largest metric delay searched (s).
    """
    f = signals.frame
    t = f.index.to_numpy(dtype=float)
    col = {k: f[k].to_numpy(dtype=float) for k in f.columns}
    notes = []
    delay = rate = law = startup = gain = None
    if "engine_requests" in col and "in_flight" in col:
        try:
            delay = fit_delay(t, col["engine_requests"], col["in_flight"], max_delay_s=max_delay_s, seed=seed)
        except ConfigError as e:
            notes.append(str(e))
    else:
        notes.append("metric delay: needs engine_requests and the gateway's in_flight")
    if {"running", "completions_per_s", "decode_workers"} <= set(col):
        try:
            rate = fit_service_rate(col["running"], col["completions_per_s"], col["decode_workers"])
        except ConfigError as e:
            notes.append(str(e))
    else:
        notes.append("service rate: needs running, completions_per_s and decode_workers")
    if {"running", "tpot_s", "decode_workers"} <= set(col):
        try:
            law = fit_pass_law(col["running"] / np.maximum(col["decode_workers"], 1.0), col["tpot_s"])
        except ConfigError as e:
            notes.append(str(e))
    if {"spec_replicas", "ready_replicas"} <= set(col):
        startup = fit_startup_delay(t, col["spec_replicas"], col["ready_replicas"])
    if startup is None:
        notes.append("start-up delay: no replica rise recorded (fixed pools)")
    if rate is not None and modelled_service_rate:
        m = float(modelled_service_rate)
        gain = Estimate(rate.value / m, rate.lo / m, rate.hi / m, "measured / modelled service rate", rate.samples)
    return Identification(delay, rate, law, startup, gain, modelled_service_rate, notes, signals.source)


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
