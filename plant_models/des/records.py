"""What the request simulator records: request stages, per-request rows, time-series rows.

Per-request state lives in flat preallocated arrays (one element per request), so the records
become a DataFrame without a per-request Python object; the time series is a preallocated table
(:class:`SnapshotTable`) whose columns are the fields of the :class:`Snapshot` named tuple.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

import numpy as np
import pandas as pd

__all__ = ["Stage", "Snapshot", "SnapshotTable", "ClassSnapshotTable", "RequestRecords"]


class Stage(IntEnum):
    """Where a request is. Every arrival ends ``COMPLETED``, ``REJECTED`` (with a reason) or in
    one of the in-system stages."""

    NOT_ARRIVED = 0
    BACKLOG = 1      # waiting for admission
    FILL = 2         # admitted: queued for or in a fill pass
    TRANSFER = 3     # KV moving to decode
    READY = 4        # KV at decode, waiting to join a batch (or preempted back)
    DECODE = 5       # in a decode batch
    COMPLETED = 6
    REJECTED = 7
    DEFERRED = 8     # held at the orchestrator (a deferrable class), to be offered again

    @classmethod
    def in_system(cls) -> tuple["Stage", ...]:
        """The stages of a request that has arrived and is neither completed nor rejected."""
        return (cls.BACKLOG, cls.FILL, cls.TRANSFER, cls.READY, cls.DECODE, cls.DEFERRED)


#: the ``state`` column's labels, by stage
STATE_LABELS = ("not_arrived", "backlog", "fill", "transfer", "ready", "decode", "completed", "rejected",
                "deferred")


class Snapshot(NamedTuple):
    """One row of the time series (requests, requests/s, workers); the first sixteen fields are
    :data:`tokenfactory.plant_models.result.SERIES_COLUMNS`. In an aggregated cluster
    ``fill_workers`` and ``decode_workers`` count the aggregated workers (they serve both roles)
    and ``aggregated_workers`` bills them once."""

    time_s: float
    backlog: int
    fill_in_progress: int
    ready: int
    active_decodes: int
    decode_slots: float
    fill_capacity: float
    fill_workers: int
    decode_workers: int
    admission_rate: float
    arrival_rate: float
    admitted_rate: float
    completion_rate: float
    arrived: int
    completed: int
    rejected: int
    fill_workers_starting: int
    decode_workers_starting: int
    fill_workers_billed: int
    decode_workers_billed: int
    fill_queued_tokens: float
    fill_token_capacity: float
    decode_pass_s: float
    decode_context_tokens: float
    decode_batch_cap: float
    deferred: int
    aggregated_workers: int = 0


#: Snapshot fields that count requests or workers (integers in the series)
_COUNT_FIELDS = ("backlog", "fill_in_progress", "ready", "active_decodes", "fill_workers", "decode_workers",
                 "arrived", "completed", "rejected", "fill_workers_starting", "decode_workers_starting",
                 "fill_workers_billed", "decode_workers_billed", "deferred", "aggregated_workers")
#: Snapshot fields that are rates over the sample period (zero in a sample nothing happened in)
RATE_FIELDS = ("arrival_rate", "admitted_rate", "completion_rate")


class SnapshotTable:
    """The time series: one preallocated row per sample period, columns named by :class:`Snapshot`.

    ``hold(k, j)`` copies row ``k`` to rows ``k+1 .. j`` with zero rates: the simulator calls it
    when no event can happen before row ``j + 1``'s time, so a quiet stretch costs one numpy write
    instead of one event per sample.

    Parameters
    ----------
    rows : int
        Samples in the run.
    dt : float
        Sample period (s).
    """

    COLUMNS = Snapshot._fields
    INDEX = Snapshot(*range(len(Snapshot._fields)))  # column positions by name: INDEX.ready

    def __init__(self, rows: int, dt: float):
        self.dt = dt
        self.data = np.zeros((max(rows, 1), len(self.COLUMNS)))
        self.n = 0  # rows written
        cols = sorted(getattr(self.INDEX, f) for f in RATE_FIELDS)
        assert cols == list(range(cols[0], cols[-1] + 1)), "rate columns must be adjacent"
        self._rates = slice(cols[0], cols[-1] + 1)

    def __len__(self) -> int:
        return self.n

    def write(self, k: int, row: Snapshot) -> None:
        self.data[k] = row
        self.n = max(self.n, k + 1)

    def hold(self, k: int, j: int) -> None:
        if j <= k:
            return
        block = self.data[k + 1:j + 1]
        block[:] = self.data[k]
        block[:, self._rates] = 0.0
        block[:, self.INDEX.time_s] = np.arange(k + 1, j + 1) * self.dt
        self.n = max(self.n, j + 1)

    def row(self, k: int) -> Snapshot:
        return Snapshot._make(self.data[k].tolist())

    def mean(self, lo: int, hi: int, field: str) -> float:
        """Mean of ``field`` over rows lo..hi (inclusive)."""
        return float(self.data[lo:hi + 1, getattr(self.INDEX, field)].mean())

    def frame(self) -> pd.DataFrame:
        df = pd.DataFrame(self.data[:self.n], columns=list(self.COLUMNS))
        return df.astype({f: np.int64 for f in _COUNT_FIELDS})


class ClassSnapshotTable:
    """Per-class rows of the time series: one preallocated (rows x classes x fields) array whose
    fields are those of :class:`tokenfactory.core.signals.ClassLoad`, held like
    :class:`SnapshotTable` (rates zeroed in held rows).

    Parameters
    ----------
    rows : int
        Samples in the run.
    classes : sequence of str
        The class names, in the order rows are written.
    """

    FIELDS = ("backlog", "deferred", "fill_in_progress", "fill_queued_tokens", "ready", "active_decodes",
              "arrival_rate", "predicted_wait_s")
    RATE = FIELDS.index("arrival_rate")

    def __init__(self, rows: int, classes):
        self.classes = list(classes)
        self.data = np.zeros((max(rows, 1), len(self.classes), len(self.FIELDS)))

    def write(self, k: int, values) -> None:
        self.data[k] = values

    def hold(self, k: int, j: int) -> None:
        if j <= k:
            return
        block = self.data[k + 1:j + 1]
        block[:] = self.data[k]
        block[:, :, self.RATE] = 0.0

    def mean(self, lo: int, hi: int, c: int, field_index: int) -> float:
        """Mean of one field of class ``c`` over rows lo..hi (inclusive)."""
        return float(self.data[lo:hi + 1, c, field_index].mean())

    def frame(self, n: int) -> pd.DataFrame:
        """Columns ``<field>_<class>`` for the first ``n`` rows."""
        cols = {}
        for c, name in enumerate(self.classes):
            for f, field in enumerate(self.FIELDS):
                cols[f"{field}_{name}"] = self.data[:n, c, f]
        return pd.DataFrame(cols)


class RequestRecords:
    """Flat per-request arrays: event times (NaN until they happen), counters, stage, reason.

    Parameters
    ----------
    n : int
        Requests in the trace.
    """

    TIMES = ("arrival_s", "admitted_s", "fill_start_s", "fill_end_s", "kv_ready_s", "decode_start_s",
             "first_token_s", "completion_s", "rejected_s", "deferred_s")

    def __init__(self, n: int):
        self.n = n
        for k in self.TIMES:
            setattr(self, k, np.full(n, np.nan))
        self.cached_tokens = np.zeros(n, dtype=np.int64)
        self.filled_tokens = np.zeros(n, dtype=np.int64)  # new tokens prefilled (refills after a crash too)
        self.requeues = np.zeros(n, dtype=np.int64)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.stage = np.zeros(n, dtype=np.int8)
        self.reason = np.full(n, "", dtype=object)
        self.defer_reason = np.full(n, "", dtype=object)

    def by_stage(self) -> np.ndarray:
        """Requests per :class:`Stage`."""
        return np.bincount(self.stage, minlength=len(Stage))

    def frame(self, input_tokens: np.ndarray, output_tokens: np.ndarray, request_class=None,
              trace_cached_tokens=None) -> pd.DataFrame:
        """One row per request, with TTFT and TPOT (NaN where undefined).

        Parameters
        ----------
        input_tokens, output_tokens : ndarray
            The trace's token counts.
        request_class : array of str, optional
            Each request's class (a ``request_class`` column when given).
        trace_cached_tokens : ndarray, optional
            The trace's own ``cached_tokens`` (a ``trace_cached_tokens`` column when given;
            ``cached_tokens`` is what the prefix cache gave the fill, 0 for a request not filled).

        Returns
        -------
        DataFrame
        """
        df = pd.DataFrame({"request": np.arange(self.n), **{k: getattr(self, k) for k in self.TIMES}})
        if request_class is not None:
            df["request_class"] = request_class
        df["input_tokens"] = input_tokens
        df["cached_tokens"] = self.cached_tokens
        if trace_cached_tokens is not None:
            df["trace_cached_tokens"] = trace_cached_tokens
        df["filled_tokens"] = self.filled_tokens
        df["output_tokens"] = output_tokens
        df["requeues"] = self.requeues
        df["preemptions"] = self.preemptions
        df["state"] = pd.Categorical.from_codes(self.stage.astype(int), list(STATE_LABELS))
        df["reject_reason"] = self.reason
        df["defer_reason"] = self.defer_reason
        df["ttft_s"] = df["first_token_s"] - df["arrival_s"]
        df["tpot_s"] = (df["completion_s"] - df["first_token_s"]) / np.maximum(df["output_tokens"] - 1, 1)
        return df
