"""One result type for every plant: the time series, per-request records, actions, metrics, config.

The admission-loop fluid plant (:func:`tokenfactory.plant_models.fluid.simulate_loop`), the pool
model (:func:`tokenfactory.plant_models.pools.simulate_pools`) and the request simulator
(:func:`tokenfactory.plant_models.des.simulate`) all return a :class:`SimulationResult`, and their
time series share the column names of :data:`SERIES_COLUMNS` (those of
:class:`tokenfactory.core.signals.Measurement`, plus the admission command and cumulative counters), so
one analysis or figure runs on any of them. Each plant adds its own columns after these.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

__all__ = ["SERIES_COLUMNS", "SimulationResult"]

#: columns every plant's ``series`` has (requests, requests/s, seconds)
SERIES_COLUMNS: dict[str, str] = {
    "time_s": "simulated time (s)",
    "backlog": "requests waiting for admission",
    "fill_in_progress": "admitted requests whose KV has not reached decode yet (fill + transfer)",
    "ready": "requests with KV at decode, waiting to join a batch",
    "active_decodes": "sequences decoding",
    "decode_slots": "sequences the decode pool's KV holds at the current context",
    "fill_capacity": "requests/s the serving fill workers can take",
    "fill_workers": "serving fill workers",
    "decode_workers": "serving decode workers",
    "admission_rate": "the admission command in force (requests/s; inf = admit all)",
    "arrival_rate": "requests/s reaching the orchestrator (before admission)",
    "admitted_rate": "requests/s released into fill",
    "completion_rate": "requests/s completing decode",
    "arrived": "requests arrived so far",
    "completed": "requests completed so far",
    "rejected": "requests rejected so far (each with a reason)",
}


@dataclass
class SimulationResult:
    """What a plant simulation returns.

    Attributes
    ----------
    series : DataFrame
        One row per sample: the :data:`SERIES_COLUMNS`, then the plant's own columns.
    records : DataFrame or None
        One flat row per request (request simulator only).
    actions : DataFrame
        Controller actions (``time_s``, ``kind`` = ``"admission"``, ``"scale"`` or
        ``"reconfigured"``, and the action's fields).
    metrics : dict
        Headline figures; every plant reports ``requests``, ``completed``, ``rejected``,
        ``in_flight_end`` (so requests = completed + rejected + in flight) and ``duration_s``.
    config : dict
        The resolved configuration that produced the run.
    """

    series: pd.DataFrame
    records: pd.DataFrame | None = None
    actions: pd.DataFrame = field(default_factory=pd.DataFrame)
    metrics: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)

    def to_pandas(self) -> pd.DataFrame:
        """The time series (one row per sample); per-request rows are :attr:`records`."""
        return self.series

    @property
    def requests(self) -> pd.DataFrame | None:
        """Alias of :attr:`records` (the request simulator's former name)."""
        return self.records

    @property
    def time(self) -> np.ndarray:
        """Sample times (s)."""
        return self.series["time_s"].to_numpy()

    def column(self, name: str) -> np.ndarray:
        """One series column as an array."""
        return self.series[name].to_numpy()

    def window(self, start_s: float, end_s: float | None = None) -> np.ndarray:
        """Boolean mask of the samples in [start_s, end_s] (to the end by default)."""
        t = self.time
        end_s = t[-1] + 1e-9 if end_s is None else end_s
        return (t >= start_s) & (t <= end_s)

    def sampled(self, name: str, period_s: float, start_s: float = 0.0) -> np.ndarray:
        """Column ``name`` every ``period_s`` from ``start_s`` (for detectors), assuming a
        regular sample grid."""
        t = self.time
        dt = float(t[1] - t[0]) if len(t) > 1 else period_s
        step = max(1, int(round(period_s / dt)))
        i0 = int(np.searchsorted(t, start_s))
        return self.column(name)[i0::step]

    def slo_misses(self, arrived_between: tuple[float, float] | None = None) -> dict:
        """Where each request that missed its class's SLO went (request simulator only): the
        ``met`` requests, the ``rejected`` ones by reason, ``late_ttft`` (completed past the TTFT
        SLO), ``late_tpot`` (within it, past the TPOT SLO) and ``unfinished`` (in flight at the
        end, or never arrived); they add up to ``requests``. ``met`` over the arrivals is the
        run's ``slo_attainment``.

        Parameters
        ----------
        arrived_between : (float, float), optional
            Count only the requests arriving in [start, end) (s); default all.

        Raises
        ------
        ValueError
            For a result without per-request records and per-class SLOs.
        """
        if self.records is None or not self.metrics.get("classes"):
            raise ValueError("slo_misses needs per-request records and per-class SLOs (a request simulator's result)")
        r = self.records
        if arrived_between is not None:
            r = r[r["arrival_s"].between(*arrived_between, inclusive="left")]
        slo = self.metrics["classes"]
        cls = r["request_class"]
        ttft_slo = cls.map(lambda k: slo[k]["slo_ttft_s"]).to_numpy(float)
        tpot_slo = cls.map(lambda k: slo[k]["slo_tpot_s"]).to_numpy(float)
        ttft, tpot = r["ttft_s"].to_numpy(float), r["tpot_s"].to_numpy(float)
        done = (r["state"] == "completed").to_numpy()
        rejected = (r["state"] == "rejected").to_numpy()
        late_ttft = done & ~(ttft <= ttft_slo)
        late_tpot = done & (ttft <= ttft_slo) & ~(tpot <= tpot_slo)
        reasons = r.loc[rejected, "reject_reason"].value_counts()
        return {"requests": int(len(r)), "met": int((done & ~late_ttft & ~late_tpot).sum()),
                "rejected": {str(k): int(v) for k, v in reasons.items()},
                "late_ttft": int(late_ttft.sum()), "late_tpot": int(late_tpot.sum()),
                "unfinished": int((~done & ~rejected).sum())}

    def plot(self, columns: str | list[str] = "ready", *, ax=None, **kw):
        """Columns against time on ``ax`` (a new figure's axes by default); see
        :func:`tokenfactory.plant_models.plots.series_plot`."""
        from tokenfactory.plant_models.plots import series_plot

        return series_plot(self, columns, ax=ax, **kw)
