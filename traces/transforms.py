"""Transforms of a request table that change its load: faster replay and superposed copies."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tokenfactory.core.validation import ConfigError, check_number

__all__ = ["scale_trace", "superpose_trace", "place_sessions", "spread_quantized_arrivals"]


def scale_trace(trace: pd.DataFrame, scale: float) -> pd.DataFrame:
    """The trace replayed ``scale`` times faster (arrival times divided by ``scale``).

    The arrival rate grows by ``scale`` and the duration shrinks by it; request sizes are
    unchanged. ``arrival_s`` and ``think_time_s`` are divided by ``scale`` (the clock runs faster).

    Parameters
    ----------
    trace : DataFrame
        A request table on one clock.
    scale : float
        Speed-up factor (> 0; < 1 slows the replay down).

    Returns
    -------
    DataFrame
        A copy with ``arrival_s / scale`` and the same ``attrs``.

    Raises
    ------
    ConfigError
        For ``scale`` <= 0, or a trace with per-session clocks.
    """
    check_number("scale", scale, low=0.0, low_inclusive=False)
    if trace.attrs.get("per_session_clock"):
        raise ConfigError("scale", "a trace with per-session clocks is replayed as closed sessions; it has no "
                          "arrival rate to scale")
    out = trace.copy()
    out["arrival_s"] = out["arrival_s"] / scale
    if "think_time_s" in out:  # the whole clock runs faster, think times included
        out["think_time_s"] = out["think_time_s"] / scale
    out.attrs = dict(trace.attrs)
    return out


def superpose_trace(trace: pd.DataFrame, multiplier: float, seed: int = 0) -> pd.DataFrame:
    """``multiplier`` x the trace's load over the same span: superposed copies of the trace, each
    shifted circularly by a seeded random offset (independent tenants with the same pattern); a
    fractional remainder is a random thinning of one more copy (whole sessions are kept or dropped).
    A session moves as a whole, so its turns keep their order and think times. Unlike
    :func:`scale_trace` the replay keeps its duration, so controllers with minute-scale windows
    see a long run.

    Parameters
    ----------
    trace : DataFrame
        A request table on one clock.
    multiplier : float
        Load factor (> 0): ``int(multiplier)`` whole copies (the first unshifted) plus, for a
        fractional part f, one more copy keeping each request with probability f.
    seed : int
        Seed of the offsets and the thinning (default 0).

    Returns
    -------
    DataFrame
        The superposed table sorted by ``arrival_s``, with copy k's ``session_id`` suffixed
        ``#k`` so sessions stay distinct; same ``attrs``.

    Raises
    ------
    ConfigError
        For ``multiplier`` <= 0, or a trace with per-session clocks.
    """
    check_number("multiplier", multiplier, low=0.0, low_inclusive=False)
    if trace.attrs.get("per_session_clock"):
        raise ConfigError("multiplier", "a trace with per-session clocks cannot be superposed")
    rng = np.random.default_rng(seed)
    span = float(trace["arrival_s"].max()) + 1e-6
    whole, frac = int(multiplier), multiplier - int(multiplier)
    parts = []
    for k in range(whole + (1 if frac > 0 else 0)):
        part = trace.copy()
        sid = part["session_id"].astype(str) if "session_id" in part else pd.Series("", index=part.index)
        in_session = sid != ""
        if k == whole:  # the fractional copy: thin whole sessions, and single requests
            keep_row = rng.random(len(part)) < frac
            sessions = sid[in_session].unique()
            kept = set(sessions[rng.random(len(sessions)) < frac])
            part = part[np.where(in_session, sid.isin(kept), keep_row)]
            sid, in_session = sid[part.index], in_session[part.index]
        off = 0.0 if k == 0 else rng.uniform(0.0, span)
        # single requests wrap around the span; a session wraps as a whole, so its turns keep their
        # order and think times (it may then run past the span's end)
        first = part["arrival_s"].groupby(sid).transform("min")
        wrapped_first = (first + off) % span
        part["arrival_s"] = np.where(in_session, part["arrival_s"] - first + wrapped_first,
                                     (part["arrival_s"] + off) % span)
        if "session_id" in part:  # copies are other tenants: their sessions are distinct
            part["session_id"] = np.where(in_session, sid + f"#{k}", "")
        parts.append(part)
    out = pd.concat(parts, ignore_index=True).sort_values("arrival_s", kind="stable").reset_index(drop=True)
    out.attrs = dict(trace.attrs)
    return out


def place_sessions(trace: pd.DataFrame, request_rate_rps: float, duration_s: float, seed: int = 0, *,
                   warmup_s: float = 7200.0) -> pd.DataFrame:
    """Sessions of a per-session-clock trace (agentic coding) put on one clock, at about
    ``request_rate_rps`` requests per second over [0, duration_s).

    Sessions start as a Poisson process over [-``warmup_s``, ``duration_s``), each a session of
    the trace drawn with replacement (seeded); a session started before 0 joins at the first turn
    its own clock places at or after 0, so the run starts with sessions already in progress
    rather than from an empty population. The session-start rate is set so that the turns the
    trace's own clocks place in [0, duration_s) come at ``request_rate_rps`` (one calibration
    pass); in a replay later turns follow their predecessor's completion by their think time
    (``attrs["per_session_clock"]`` is kept), so the realised rate also depends on the service.

    Parameters
    ----------
    trace : DataFrame
        A request table with per-session clocks (``session_id``, ``turn``, ``arrival_s`` on the
        session's clock, ``think_time_s``).
    request_rate_rps : float
        Target rate of requests (> 0).
    duration_s : float
        Length of the window (s, > 0).
    seed : int
        Seed of the session draws and start times (default 0).
    warmup_s : float
        How long before 0 sessions may start (s, >= 0; default 7200).

    Returns
    -------
    DataFrame
        One row per kept turn, copy k of a session with ``session_id`` suffixed ``#k``, the first
        kept turn's ``arrival_s`` on the common clock (later turns keep theirs; a replay ignores
        them), sorted by ``arrival_s``; ``attrs`` of ``trace`` plus ``session_rate_rps``.

    Raises
    ------
    ConfigError
        For a trace without sessions or per-session clocks, or a non-positive rate or duration.
    """
    check_number("request_rate_rps", request_rate_rps, low=0.0, low_inclusive=False)
    check_number("duration_s", duration_s, low=0.0, low_inclusive=False)
    check_number("warmup_s", warmup_s, low=0.0)
    if not trace.attrs.get("per_session_clock") or "session_id" not in trace:
        raise ConfigError("trace", "place_sessions needs a trace with per-session clocks (agentic sessions)")
    tr = trace[trace["session_id"].astype(str) != ""].sort_values(["session_id", "turn"], kind="stable")
    if not len(tr):
        raise ConfigError("trace", "the trace has no sessions")
    groups = [g for _, g in tr.groupby("session_id", sort=True)]
    clocks = [g["arrival_s"].to_numpy(dtype=float) - float(g["arrival_s"].iloc[0]) for g in groups]

    def draw(rate: float) -> tuple[list, int]:
        rng = np.random.default_rng(seed)
        n = rng.poisson(rate * (warmup_s + duration_s))
        starts = np.sort(rng.uniform(-warmup_s, duration_s, n))
        picks = rng.integers(0, len(groups), n)
        placed, in_window = [], 0
        for k, (s0, j) in enumerate(zip(starts, picks)):
            t = s0 + clocks[j]
            keep = t >= 0.0
            if not keep.any():
                continue
            in_window += int(((t >= 0.0) & (t < duration_s)).sum())
            placed.append((k, j, int(np.argmax(keep)), float(t[keep][0])))
        return placed, in_window

    mean_turns = len(tr) / len(groups)
    mean_span = float(np.mean([c[-1] for c in clocks])) + 1.0
    rate = request_rate_rps / mean_turns  # sessions/s if every session fit in the window
    placed, got = draw(rate)
    if got > 0:  # calibrate on the turns the window actually holds
        rate *= request_rate_rps * duration_s / got
        placed, got = draw(rate)
    parts = []
    for k, j, first, t0 in placed:
        part = groups[j].iloc[first:].copy()
        part["arrival_s"] = part["arrival_s"].to_numpy(dtype=float) - float(part["arrival_s"].iloc[0]) + t0
        part["session_id"] = part["session_id"].astype(str) + f"#{k}"
        parts.append(part)
    out = (pd.concat(parts, ignore_index=True) if parts else tr.iloc[:0].copy())
    out = out.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    out.attrs = {**trace.attrs, "session_rate_rps": rate, "mean_session_span_s": mean_span}
    return out


def spread_quantized_arrivals(trace: pd.DataFrame, quantum_s: float | None = None, seed: int = 0) -> pd.DataFrame:
    """Arrivals recorded on a coarse clock spread uniformly over their slot.

    Mooncake's conversation trace records arrivals in ~3 s slots (``attrs["arrival_quantum_s"]``;
    about ten requests share each timestamp): the structure below the slot is not recorded, and
    replayed as is every slot is a burst followed by silence. Drawing each arrival uniformly in
    [t, t + quantum) keeps the slot's count and removes the artificial burst (an ASSUMPTION about
    what the recording hid: Poisson-like arrivals within a slot).

    Parameters
    ----------
    trace : DataFrame
        A request table on one clock.
    quantum_s : float, optional
        The slot (s, > 0); default ``attrs["arrival_quantum_s"]`` (the trace is returned unchanged
        without one).
    seed : int
        Seed of the draw (default 0).

    Returns
    -------
    DataFrame
        A copy sorted by the new ``arrival_s``; ``attrs`` kept, ``arrival_quantum_s`` dropped and
        ``arrivals_spread_s`` set.

    Raises
    ------
    ConfigError
        For a non-positive ``quantum_s`` or a trace with per-session clocks.
    """
    q = trace.attrs.get("arrival_quantum_s") if quantum_s is None else quantum_s
    if q is None:
        return trace
    check_number("quantum_s", q, low=0.0, low_inclusive=False)
    if trace.attrs.get("per_session_clock"):
        raise ConfigError("quantum_s", "a trace with per-session clocks has no common arrival clock to spread")
    rng = np.random.default_rng(seed)
    out = trace.copy()
    out["arrival_s"] = out["arrival_s"].to_numpy(dtype=float) + rng.uniform(0.0, q, len(out))
    out = out.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    out["arrival_s"] -= float(out["arrival_s"].iloc[0])
    attrs = {k: v for k, v in trace.attrs.items() if k != "arrival_quantum_s"}
    out.attrs = {**attrs, "arrivals_spread_s": float(q)}
    return out
