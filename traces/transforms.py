"""Transforms of a request table that change its load: faster replay and superposed copies."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tokenfactory.validation import ConfigError, check_number

__all__ = ["scale_trace", "superpose_trace"]


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
