"""Loaders: each shared trace, and any user CSV in the documented formats, into one table.

Registered names (:data:`TRACES`) resolve inside the data folder: ``$TOKENFACTORY_TRACES`` if
set, else ``../shared/traces`` beside the checkout. A path loads directly: a CSV with the request
table's columns, a rate series (``time_s``/``window_start_s`` + ``rate_rps``/``total_rate_rps``,
which includes ServeGen's aggregate format), or the Azure 2023 and Mooncake formats.
Every bad file raises :class:`TraceError` naming the file, the row and the column.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from tokenfactory.core.validation import ConfigError
from tokenfactory.traces.class_assignment import assign_classes, class_seed
from tokenfactory.traces.schema import REQUEST_COLUMNS

__all__ = ["TraceError", "TraceSpec", "TRACES", "data_dir", "trace_dirs", "trace_path", "load_trace", "trace_available",
           "load_azure_2023", "load_mooncake", "load_agentic", "load_servegen_aggregate",
           "load_servegen_per_client", "load_request_csv", "load_rate_csv"]


class TraceError(ConfigError):
    """A trace file is missing, unreadable or malformed; ``field`` is ``file: row N: column 'c'``.

    A :class:`ConfigError`, so the CLI reports it like any other bad input.

    Parameters
    ----------
    path : str or Path
        The offending file; only its name goes into ``field``.
    message : str
        What is wrong (and what was expected).
    row : int, optional
        Line number in the file (1-based, the CSV header is line 1), when one row is at fault.
    column : str, optional
        The column (or JSON field) at fault.
    """

    def __init__(self, path, message: str, row: int | None = None, column: str | None = None):
        where = Path(path).name
        if row is not None:
            where += f": row {row}"
        if column is not None:
            where += f": column {column!r}"
        super().__init__(where, message)


def data_dir() -> Path:
    """The trace folder: $TOKENFACTORY_TRACES, else ../shared/traces beside the checkout.

    Returns
    -------
    Path
        The folder registered trace paths (:data:`TRACES`) are relative to; it need not exist.
        The fallback is computed from this file's location, so it is "beside the checkout" for
        a source checkout or an editable install.
    """
    env = os.environ.get("TOKENFACTORY_TRACES")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1].parent / "shared" / "traces"


# --------------------------------------------------------------------------------------------
# validation shared by every loader


def _check_numeric(path, df: pd.DataFrame, column: str, *, nonneg: bool = True, row_offset: int = 2):
    col = pd.to_numeric(df[column], errors="coerce")
    bad = col.isna()  # empty or unparsable: both are errors in a required numeric column
    if bad.any():
        i = int(np.argmax(bad.to_numpy()))
        raise TraceError(path, f"not a number: {df[column].iloc[i]!r}", row=i + row_offset, column=column)
    if nonneg and (col < 0).any():
        i = int(np.argmax((col < 0).to_numpy()))
        raise TraceError(path, f"negative value {col.iloc[i]}", row=i + row_offset, column=column)
    return col


def _check_monotonic(path, t: pd.Series, column: str, row_offset: int = 2):
    d = np.diff(t.to_numpy(dtype=float))
    if (d < 0).any():
        i = int(np.argmax(d < 0)) + 1
        raise TraceError(path, f"time goes backwards ({t.iloc[i - 1]} then {t.iloc[i]}); rows must be "
                         "sorted by time", row=i + row_offset, column=column)


def _finish_requests(df: pd.DataFrame, name: str, source: str) -> pd.DataFrame:
    out = pd.DataFrame({
        "arrival_s": df["arrival_s"].astype(float) - float(df["arrival_s"].iloc[0]) if len(df) else [],
        "input_tokens": df["input_tokens"].astype(np.int64),
        "cached_tokens": df.get("cached_tokens", pd.Series(0, index=df.index)).fillna(0).astype(np.int64),
        "output_tokens": df["output_tokens"].astype(np.int64),
        "session_id": df.get("session_id", pd.Series("", index=df.index)).fillna("").astype(str),
        "turn": df.get("turn", pd.Series(0, index=df.index)).fillna(0).astype(np.int64),
        "think_time_s": df.get("think_time_s", pd.Series(np.nan, index=df.index)).astype(float),
        "request_class": df.get("request_class", pd.Series("", index=df.index)).fillna("").astype(str),
    })
    for extra in df.columns:
        if extra not in out.columns and extra in ("hash_ids",):
            out[extra] = df[extra].to_numpy()
    out = out.reset_index(drop=True)
    out.attrs.update({"name": name, "kind": "requests", "source": source})
    # requests without a class from the data get one from the documented mix, seeded by the name
    return assign_classes(out, seed=class_seed(name))


def _finish_rates(time_s: np.ndarray, cols: dict, name: str, source: str, path) -> pd.DataFrame:
    time_s = np.asarray(time_s, dtype=float)
    if len(time_s) < 2:
        raise TraceError(path, "a rate series needs at least two windows")
    steps = np.diff(time_s)
    if (steps <= 0).any():
        i = int(np.argmax(steps <= 0)) + 1
        raise TraceError(path, "repeated window start", row=i + 2, column="time_s")
    interval = float(steps.min())
    # skipped windows are allowed (they become missing), uneven spacing is not
    off = np.abs(steps / interval - np.round(steps / interval)) > 1e-6
    if off.any():
        i = int(np.argmax(off)) + 1
        raise TraceError(path, f"windows are not on a regular {interval:g} s grid", row=i + 2, column="time_s")
    df = pd.DataFrame(cols, index=pd.Index(time_s - time_s[0], name="time_s"))
    # re-index onto the full regular grid so skipped windows show as missing (NaN), not absent
    grid = np.arange(0.0, df.index[-1] + interval / 2, interval)
    df = df.reindex(grid)
    df.index.name = "time_s"
    df.attrs.update({"name": name, "kind": "rates", "source": source, "interval_s": interval,
                     "start_s": float(time_s[0])})
    return df


def _read_csv(path, **kw) -> pd.DataFrame:
    path = Path(path)
    if not path.is_file():
        raise TraceError(path, f"file does not exist (looked at {path})")
    try:
        return pd.read_csv(path, low_memory=False, **kw)
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as exc:
        raise TraceError(path, f"cannot parse as CSV: {exc}") from None


def _require(path, df: pd.DataFrame, columns):
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise TraceError(path, f"missing column(s) {missing}; found {list(df.columns)}", column=missing[0])


# --------------------------------------------------------------------------------------------
# one loader per source format


def load_azure_2023(path, name: str = "azure-2023") -> pd.DataFrame:
    """Azure LLM inference trace 2023: TIMESTAMP (absolute, UTC assumed), ContextTokens,
    GeneratedTokens. No sessions or cache information.

    Parameters
    ----------
    path : str or Path
        The CSV (``AzureLLMInferenceTrace_code.csv`` or ``_conv.csv``).
    name : str
        Name recorded in ``attrs["name"]`` (default ``"azure-2023"``).

    Returns
    -------
    DataFrame
        A request table (:mod:`tokenfactory.traces.schema`): ``arrival_s`` in seconds since
        the first request, ``input_tokens`` = ContextTokens, ``output_tokens`` =
        GeneratedTokens, ``cached_tokens`` 0. ``attrs["start_time"]`` is the first timestamp.

    Raises
    ------
    TraceError
        For a missing file or column, an unparsable timestamp, time going backwards, or a
        non-numeric or negative token count (naming the row).
    """
    df = _read_csv(path)
    _require(path, df, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
    ts = pd.to_datetime(df["TIMESTAMP"], errors="coerce", format="mixed")
    if ts.isna().any():
        i = int(np.argmax(ts.isna().to_numpy()))
        raise TraceError(path, f"unparsable timestamp {df['TIMESTAMP'].iloc[i]!r}", row=i + 2, column="TIMESTAMP")
    t = (ts - ts.iloc[0]).dt.total_seconds()
    _check_monotonic(path, t, "TIMESTAMP")
    out = pd.DataFrame({"arrival_s": t,
                        "input_tokens": _check_numeric(path, df, "ContextTokens"),
                        "output_tokens": _check_numeric(path, df, "GeneratedTokens")})
    res = _finish_requests(out, name, str(path))
    res.attrs["start_time"] = str(ts.iloc[0])
    return res


def load_mooncake(path, name: str = "mooncake", block_tokens: int = 512) -> pd.DataFrame:
    """Mooncake FAST'25 JSONL: timestamp (ms from the first request; arrivals quantised into ~3 s
    slots), input_length, output_length, hash_ids (chained 512-token prefix blocks).
    ``cached_tokens`` = tokens of the leading blocks already seen earlier in the trace (an
    infinite prefix cache), capped at the input length.

    Parameters
    ----------
    path : str or Path
        The JSONL file, one request per line (blank lines skipped).
    name : str
        Name recorded in ``attrs["name"]`` (default ``"mooncake"``).
    block_tokens : int
        Tokens per prefix block behind one hash id (default 512, Mooncake's block size).

    Returns
    -------
    DataFrame
        A request table with the extra column ``hash_ids`` (list of int per request);
        ``attrs["block_tokens"]`` and ``attrs["arrival_quantum_s"]`` (3.0, the published
        trace's timestamp resolution) are set.

    Raises
    ------
    TraceError
        For a missing file, invalid JSON, a missing field, a negative or non-numeric timestamp
        or length, time going backwards, or a file with no requests.
    """
    path = Path(path)
    if not path.is_file():
        raise TraceError(path, f"file does not exist (looked at {path})")
    rows = []
    with path.open() as fh:
        for i, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(path, f"invalid JSON: {exc.msg}", row=i) from None
            for key in ("timestamp", "input_length", "output_length", "hash_ids"):
                if key not in rec:
                    raise TraceError(path, "missing field", row=i, column=key)
            for key in ("timestamp", "input_length", "output_length"):
                v = rec[key]
                if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                    raise TraceError(path, f"expected a non-negative number, got {v!r}", row=i, column=key)
            rows.append(rec)
    if not rows:
        raise TraceError(path, "no requests")
    t = pd.Series([r["timestamp"] / 1000.0 for r in rows])
    _check_monotonic(path, t, "timestamp", row_offset=1)
    seen: set[int] = set()
    cached = np.empty(len(rows), dtype=np.int64)
    for i, r in enumerate(rows):
        hit = 0
        for h in r["hash_ids"]:  # chained hashes: a prefix match is the run of already-seen leading ids
            if h in seen:
                hit += 1
            else:
                break
        cached[i] = min(hit * block_tokens, r["input_length"])
        seen.update(r["hash_ids"])
    df = pd.DataFrame({"arrival_s": t, "input_tokens": [r["input_length"] for r in rows],
                       "cached_tokens": cached, "output_tokens": [r["output_length"] for r in rows],
                       "hash_ids": [r["hash_ids"] for r in rows]})
    res = _finish_requests(df, name, str(path))
    res.attrs["block_tokens"] = block_tokens
    res.attrs["arrival_quantum_s"] = 3.0
    return res


def load_agentic(path, name: str = "agentic-coding") -> pd.DataFrame:
    """Claude Code sessions (kv-cache-tester, flattened): per-call tokens, prefix hits within
    the conversation, think times. Conversations have no shared clock: each starts at 0, so
    ``arrival_s`` here is the call's time within its conversation (use the synthetic generator or
    a session arrival process to place sessions on one clock).

    Parameters
    ----------
    path : str or Path
        The CSV with ``conv_id``, ``t_s``, ``in_tokens``, ``out_tokens``,
        ``prefix_hit_tokens``, ``think_time_s`` (optional ``agent_id``).
    name : str
        Name recorded in ``attrs["name"]`` (default ``"agentic-coding"``).

    Returns
    -------
    DataFrame
        A request table with ``session_id`` = conv_id (``conv_id/agent_id`` for sub-agents),
        ``turn`` = call index within the session, ``cached_tokens`` = prefix_hit_tokens,
        ``request_class`` from ``type`` (``s`` streaming -> interactive, ``n`` -> batch) and
        ``attrs["per_session_clock"] = True``: it cannot be binned into a cluster arrival rate,
        scaled or superposed (:func:`tokenfactory.traces.place_sessions` puts sessions on one
        clock).

    Raises
    ------
    TraceError
        For a missing file or column, or a non-numeric or negative value in a numeric column.
    """
    df = _read_csv(path)
    _require(path, df, ["conv_id", "t_s", "in_tokens", "out_tokens", "prefix_hit_tokens", "think_time_s"])
    for col in ("t_s", "in_tokens", "out_tokens", "prefix_hit_tokens"):
        _check_numeric(path, df, col)
    session = df["conv_id"].astype(str) + np.where(df.get("agent_id", pd.Series("", index=df.index)).fillna("") != "",
                                                   "/" + df.get("agent_id", pd.Series("", index=df.index)).fillna("").astype(str), "")
    # the data's own class: a streaming call has a user watching (interactive), a non-streaming
    # call is read whole by a program (batch); a call of unknown type gets the documented mix
    kind = df.get("type", pd.Series("", index=df.index)).fillna("").astype(str)
    out = pd.DataFrame({"arrival_s": df["t_s"].astype(float), "input_tokens": df["in_tokens"],
                        "cached_tokens": df["prefix_hit_tokens"], "output_tokens": df["out_tokens"],
                        "session_id": session, "think_time_s": pd.to_numeric(df["think_time_s"], errors="coerce"),
                        "request_class": kind.map({"s": "interactive", "n": "batch"}).fillna("")})
    out["turn"] = out.groupby("session_id").cumcount()
    res = _finish_requests(out, name, str(path))
    res["arrival_s"] = df["t_s"].astype(float).to_numpy()  # per-session clocks, not shifted
    res.attrs["per_session_clock"] = True
    return res


def load_servegen_aggregate(path, name: str = "servegen") -> pd.DataFrame:
    """ServeGen aggregate: window_start_s, total_rate_rps, active_clients, agg_cv2_rate_weighted.
    Windows where every client is idle (rate 0 and no active client) are collection gaps -> NaN.

    Parameters
    ----------
    path : str or Path
        The aggregate CSV (``*_aggregate_10min.csv``); ``active_clients`` and
        ``agg_cv2_rate_weighted`` are optional (without ``active_clients`` every zero-rate
        window is a gap).
    name : str
        Name recorded in ``attrs["name"]`` (default ``"servegen"``).

    Returns
    -------
    DataFrame
        A rate series (:mod:`tokenfactory.traces.schema`) on the file's regular grid:
        ``rate_rps`` (requests/s, NaN in gaps), ``active_clients`` and ``idc`` (from
        agg_cv2_rate_weighted) when present. ``attrs["missing_windows"]`` counts the gaps;
        ``attrs["clock"]`` notes that window 0 is 00:00 local time.

    Raises
    ------
    TraceError
        For a missing file or column, a non-numeric or negative value, time going backwards, a
        repeated window or windows off a regular grid.
    """
    df = _read_csv(path)
    _require(path, df, ["window_start_s", "total_rate_rps"])
    t = _check_numeric(path, df, "window_start_s")
    _check_monotonic(path, t, "window_start_s")
    rate = _check_numeric(path, df, "total_rate_rps")
    active = _check_numeric(path, df, "active_clients") if "active_clients" in df else None
    gap = (rate == 0) & ((active == 0) if active is not None else True)
    cols = {"rate_rps": rate.where(~gap, np.nan).to_numpy()}
    if active is not None:
        cols["active_clients"] = active.to_numpy()
    if "agg_cv2_rate_weighted" in df:
        cols["idc"] = _check_numeric(path, df, "agg_cv2_rate_weighted").to_numpy()
    res = _finish_rates(t.to_numpy(), cols, name, str(path), path)
    res.attrs["missing_windows"] = int(gap.sum())
    res.attrs["clock"] = "window 0 is 00:00 local time"
    return res


def load_servegen_per_client(path, name: str = "servegen-per-client") -> pd.DataFrame:
    """ServeGen per-client long format (client_id, window_start_s, rate_rps, cv_iat, ...), summed
    over clients per window into a rate series (idc = rate-weighted cv^2, as the aggregate files).

    Parameters
    ----------
    path : str or Path
        The long-format CSV, one row per client and window.
    name : str
        Name recorded in ``attrs["name"]`` (default ``"servegen-per-client"``).

    Returns
    -------
    DataFrame
        A rate series: ``rate_rps`` = sum over clients (requests/s; NaN where no client was
        active), ``active_clients`` = clients with a positive rate, ``idc`` = sum(rate x cv^2) /
        sum(rate).

    Raises
    ------
    TraceError
        For a missing file or column, a non-numeric or negative value, or windows off a regular
        grid.
    """
    df = _read_csv(path)
    _require(path, df, ["client_id", "window_start_s", "rate_rps", "cv_iat"])
    for col in ("window_start_s", "rate_rps", "cv_iat"):
        _check_numeric(path, df, col)
    df["w"] = df["rate_rps"] * df["cv_iat"] ** 2
    g = df.groupby("window_start_s").agg(rate=("rate_rps", "sum"), w=("w", "sum"),
                                         active=("rate_rps", lambda r: int((r > 0).sum())))
    rate = g["rate"].where(g["active"] > 0, np.nan)
    idc = (g["w"] / g["rate"]).where(g["rate"] > 0, np.nan)
    return _finish_rates(g.index.to_numpy(), {"rate_rps": rate.to_numpy(), "active_clients": g["active"].to_numpy(),
                                              "idc": idc.to_numpy()}, name, str(path), path)


def load_request_csv(path, name: str | None = None) -> pd.DataFrame:
    """A user CSV in the request-table format (see :mod:`tokenfactory.traces.schema`).

    Parameters
    ----------
    path : str or Path
        The CSV: ``arrival_s`` (s, non-decreasing), ``input_tokens``, ``output_tokens`` and
        optionally ``cached_tokens`` (<= input_tokens), ``session_id``, ``turn``,
        ``think_time_s``, ``request_class`` (empty cells drawn from the documented mix); no other
        column.
    name : str, optional
        Name recorded in ``attrs["name"]`` (default: the file's stem).

    Returns
    -------
    DataFrame
        The request table, ``arrival_s`` shifted so the first request is at 0.

    Raises
    ------
    TraceError
        For a missing file or required column, an unknown column, an empty, non-numeric or
        negative numeric cell, time going backwards, or cached_tokens > input_tokens.
    """
    df = _read_csv(path)
    _require(path, df, ["arrival_s", "input_tokens", "output_tokens"])
    for col in ("arrival_s", "input_tokens", "output_tokens", "cached_tokens", "turn"):
        if col in df:
            df[col] = _check_numeric(path, df, col)
    if "think_time_s" in df:
        df["think_time_s"] = pd.to_numeric(df["think_time_s"], errors="coerce")
    _check_monotonic(path, df["arrival_s"], "arrival_s")
    if "cached_tokens" in df and (df["cached_tokens"] > df["input_tokens"]).any():
        i = int(np.argmax((df["cached_tokens"] > df["input_tokens"]).to_numpy()))
        raise TraceError(path, "cached_tokens exceeds input_tokens", row=i + 2, column="cached_tokens")
    unknown = set(df.columns) - set(REQUEST_COLUMNS)
    if unknown:
        raise TraceError(path, f"unknown column(s) {sorted(unknown)}; the request table has "
                         f"{list(REQUEST_COLUMNS)}", column=sorted(unknown)[0])
    return _finish_requests(df, name or Path(path).stem, str(path))


def load_rate_csv(path, name: str | None = None) -> pd.DataFrame:
    """A user CSV rate series: ``time_s`` + ``rate_rps`` (optional active_clients, idc); empty
    rate cells are missing windows.

    Parameters
    ----------
    path : str or Path
        The CSV: ``time_s`` (window start, s, on a regular grid; skipped windows become NaN),
        ``rate_rps`` (requests/s, >= 0), optional ``active_clients`` and ``idc``; no other column.
    name : str, optional
        Name recorded in ``attrs["name"]`` (default: the file's stem).

    Returns
    -------
    DataFrame
        The rate series, ``time_s`` shifted so the first window starts at 0 (the original start
        is ``attrs["start_s"]``; ``attrs["interval_s"]`` is the grid step).

    Raises
    ------
    TraceError
        For a missing file or column, an unknown column, a non-numeric or negative value, time
        going backwards, fewer than two windows, or windows off a regular grid.
    """
    df = _read_csv(path)
    _require(path, df, ["time_s", "rate_rps"])
    t = _check_numeric(path, df, "time_s")
    _check_monotonic(path, t, "time_s")
    rate = pd.to_numeric(df["rate_rps"], errors="coerce")
    bad = rate.isna() & df["rate_rps"].notna()
    if bad.any():
        i = int(np.argmax(bad.to_numpy()))
        raise TraceError(path, f"not a number: {df['rate_rps'].iloc[i]!r}", row=i + 2, column="rate_rps")
    if (rate < 0).any():
        i = int(np.argmax((rate < 0).to_numpy()))
        raise TraceError(path, f"negative rate {rate.iloc[i]}", row=i + 2, column="rate_rps")
    cols = {"rate_rps": rate.to_numpy()}
    for extra in ("active_clients", "idc"):
        if extra in df:
            cols[extra] = _check_numeric(path, df, extra).to_numpy()
    unknown = set(df.columns) - {"time_s", "rate_rps", "active_clients", "idc"}
    if unknown:
        raise TraceError(path, f"unknown column(s) {sorted(unknown)}", column=sorted(unknown)[0])
    return _finish_rates(t.to_numpy(), cols, name or Path(path).stem, str(path), path)


# --------------------------------------------------------------------------------------------
# the registry


@dataclass(frozen=True)
class TraceSpec:
    """A registered public trace: where it lives in the data folder and how to load it.

    Parameters
    ----------
    name : str
        The name users pass (``tokenfactory traces info NAME``, ``load_trace(NAME)``).
    relative_path : str
        Path of the file inside :func:`data_dir`.
    loader : callable
        ``loader(path, name=...) -> DataFrame``, one of this module's ``load_*`` functions.
    kind : str
        ``"requests"`` (a request table) or ``"rates"`` (a rate series).
    description : str
        One line: source, span and size (shown by ``tokenfactory traces list``).
    """

    name: str
    relative_path: str
    loader: Callable
    kind: str
    description: str


TRACES: dict[str, TraceSpec] = {s.name: s for s in (
    TraceSpec("azure-code-2023", "azure_llm_2023/AzureLLMInferenceTrace_code.csv", load_azure_2023, "requests",
              "Azure LLM inference 2023, code: 1 h, 8,819 requests"),
    TraceSpec("azure-conv-2023", "azure_llm_2023/AzureLLMInferenceTrace_conv.csv", load_azure_2023, "requests",
              "Azure LLM inference 2023, conversation: 1 h, 19,366 requests"),
    TraceSpec("mooncake-conversation", "mooncake_fast25/conversation_trace.jsonl", load_mooncake, "requests",
              "Kimi production conversation trace: 1 h, 12,031 requests, 512-token prefix hashes"),
    TraceSpec("agentic-coding", "agentic_coding_claude_code/requests.csv", load_agentic, "requests",
              "710 Claude Code sessions, 49,334 calls, per-session clocks"),
    TraceSpec("servegen:m-large", "servegen/m-large_aggregate_10min.csv", load_servegen_aggregate, "rates",
              "ServeGen language model m-large: 14 days of 10-min rates, 162 clients"),
    TraceSpec("servegen:m-small", "servegen/m-small_aggregate_10min.csv", load_servegen_aggregate, "rates",
              "ServeGen language model m-small: 14 days of 10-min rates, 43 clients (37 gap windows)"),
    TraceSpec("servegen:deepseek-r1", "servegen/deepseek-r1_aggregate_10min.csv", load_servegen_aggregate, "rates",
              "ServeGen DeepSeek-R1: 1 day of 10-min rates, 73 clients"),
)}


def trace_available(name: str) -> bool:
    """Whether registered trace ``name`` is present in the data folder.

    Parameters
    ----------
    name : str
        A key of :data:`TRACES`.

    Returns
    -------
    bool
        False for an unregistered name or a missing file (tests and studies fall back to the
        synthetic workload).
    """
    return name in TRACES and trace_path(name) is not None


def trace_dirs() -> list[Path]:
    """The folders searched for registered traces, in order: :func:`data_dir`, then the folder
    ``tokenfactory traces fetch`` stores into (:func:`tokenfactory.traces.fetch.fetch_dir`; the same
    folder when ``$TOKENFACTORY_TRACES`` is set).

    Returns
    -------
    list of Path
        Distinct folders (they need not exist).
    """
    from tokenfactory.traces.fetch import fetch_dir

    out: list[Path] = []
    for d in (data_dir(), fetch_dir()):
        if d not in out:
            out.append(d)
    return out


def trace_path(name: str) -> Path | None:
    """The file of registered trace ``name`` in the first of :func:`trace_dirs` that has it.

    Parameters
    ----------
    name : str
        A key of :data:`TRACES`.

    Returns
    -------
    Path or None
        The file, or None when no folder has it (or the name is not registered).
    """
    if name not in TRACES:
        return None
    for d in trace_dirs():
        p = d / TRACES[name].relative_path
        if p.is_file():
            return p
    return None


def load_trace(spec: str | Path) -> pd.DataFrame:
    """A registered name (see :data:`TRACES`) or a path to a trace file.

    A path's format is recognised from its suffix (``.jsonl``: Mooncake) or its CSV header:
    Azure 2023, ServeGen aggregate, ServeGen per-client, agentic sessions, a rate series
    (a ``rate_rps`` column), else a request table.

    Parameters
    ----------
    spec : str or Path
        A registered trace name or a file path.

    Returns
    -------
    DataFrame
        A request table or a rate series (``attrs["kind"]`` says which).

    Raises
    ------
    TraceError
        When a registered trace's file is not in the data folder, or the file is malformed.
    ConfigError
        When ``spec`` is neither a registered name nor an existing path.
    """
    s = str(spec)
    if s in TRACES:
        t = TRACES[s]
        path = trace_path(s)
        if path is None:
            raise TraceError(data_dir() / t.relative_path,
                             f"trace {s!r} is not on this machine (searched {', '.join(map(str, trace_dirs()))}): "
                             f"`tokenfactory traces fetch {s}` downloads it, TOKENFACTORY_TRACES points at a folder "
                             "that has it, or use the synthetic workload (--trace synthetic)")
        return t.loader(path, name=s)
    path = Path(s)
    if not path.exists():
        raise ConfigError("trace", f"{s!r} is neither a registered trace ({', '.join(TRACES)}) nor a file")
    if not path.is_file():
        raise TraceError(path, "is not a file (a request table or rate series in CSV, or Mooncake JSONL)")
    if path.suffix == ".jsonl":
        return load_mooncake(path, name=path.stem)
    try:
        header = pd.read_csv(path, nrows=0).columns
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise TraceError(path, f"not a readable CSV ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    cols = set(header)
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= cols:
        return load_azure_2023(path, name=path.stem)
    if {"window_start_s", "total_rate_rps"} <= cols:
        return load_servegen_aggregate(path, name=path.stem)
    if {"client_id", "window_start_s", "rate_rps"} <= cols:
        return load_servegen_per_client(path, name=path.stem)
    if {"conv_id", "t_s", "in_tokens"} <= cols:
        return load_agentic(path, name=path.stem)
    if "rate_rps" in cols:
        return load_rate_csv(path)
    return load_request_csv(path)
