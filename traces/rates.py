"""Rate series for demand planning: a registered name, a user file, or the embedded synthetic
fortnight, with the mean request size to size workers with."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd

from tokenfactory.traces.loaders import data_dir, load_trace
from tokenfactory.traces.stats import rates_from_requests
from tokenfactory.traces.synthetic import SyntheticWorkload, generate_rates

__all__ = ["RateSeries", "load_rate_series", "SYNTHETIC_RATES"]

DAY_S = 86400.0
#: the embedded default rate workload: 14 days, diurnal and weekly seasonality, AR(1) noise
SYNTHETIC_RATES = SyntheticWorkload(mean_rate_rps=200.0, daily_amplitude=0.35, weekend_factor=0.75,
                                    rate_noise_cv=0.15, rate_noise_ar=0.8, seed=11)
_SERVEGEN_KEYS = {"m-large": "language/m-large", "m-small": "language/m-small", "deepseek-r1": "reason/deepseek-r1"}


@dataclass(frozen=True)
class RateSeries:
    """A rate series and the mean request behind it.

    Parameters
    ----------
    rates : DataFrame
        The rate-series table (index ``time_s``, column ``rate_rps``; gaps are NaN).
    input_tokens, output_tokens : int
        Mean prompt and output tokens of a request (what workers are sized with).
    """

    rates: pd.DataFrame
    input_tokens: int
    output_tokens: int


def load_rate_series(spec: str, interval_s: float = 600.0) -> RateSeries:
    """A rate series and the mean request size to size workers with.

    Parameters
    ----------
    spec : str
        ``"synthetic"`` (14 days of :data:`SYNTHETIC_RATES`), a registered trace name or a path.
        Registered ServeGen names take their token means from ``token_stats_summary.json``; request
        tables are binned into ``interval_s`` windows and use their own mean sizes.
    interval_s : float
        Bin width for request tables and the synthetic series (s; default 600). A registered or
        user rate series keeps its own interval.

    Returns
    -------
    RateSeries
        The rates (requests/s) and the mean prompt and output tokens. For ``"synthetic"`` the
        sizes are about the log-normal means of :data:`SYNTHETIC_RATES` (1.6 x and 1.5 x the
        medians; exp(sigma^2 / 2) is 1.65 and 1.50 at sigma 1.0 and 0.9); for a rate series
        without token statistics, 1024 prompt and 256 output tokens (an assumption).

    Raises
    ------
    ConfigError
        For an unknown name or a missing file, a malformed file (:class:`TraceError`), or a
        request table with per-session clocks (it has no arrival rate).
    """
    if spec == "synthetic":
        df = generate_rates(SYNTHETIC_RATES, 14 * DAY_S, interval_s, missing_fraction=0.01)
        return RateSeries(df, int(SYNTHETIC_RATES.input_median * 1.6), int(SYNTHETIC_RATES.output_median * 1.5))
    df = load_trace(spec)
    if df.attrs["kind"] == "requests":
        return RateSeries(rates_from_requests(df, interval_s), max(1, int(df["input_tokens"].mean())),
                          max(1, int(df["output_tokens"].mean())))
    inp, out = 1024, 256
    summary = data_dir() / "servegen" / "token_stats_summary.json"
    if spec.startswith("servegen:") and summary.is_file():
        tok = json.loads(summary.read_text())[_SERVEGEN_KEYS[spec.split(":", 1)[1]]]["tokens"]
        inp, out = max(1, round(tok["input_tokens"]["mean"])), max(1, round(tok["output_tokens"]["mean"]))
    return RateSeries(df, inp, out)
