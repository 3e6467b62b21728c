"""Demands to run a control stack on: a rate series as a workload (:func:`rate_workload`) and a
synthetic week whose prefill/decode mix shifts over the day on a fixed fleet
(:func:`mixed_workload`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tokenfactory.core.validation import ConfigError, check_int, check_number

__all__ = ["RateWorkload", "rate_workload", "MIX_CLASSES", "mixed_workload"]


@dataclass
class RateWorkload:
    """A demand to run stacks on: ``demand`` (requests/s, indexed by seconds from the run's
    start, held piecewise constant), the planner's ``history`` before the run (absolute time
    index on its interval), the absolute time of t = 0, the mean request and, for a fixed fleet,
    its size; when the mix shifts, the prompt (fill work) and output factors over time relative
    to the mean request (:class:`tokenfactory.plant_models.pools.PoolScenario`).

    Parameters
    ----------
    name : str
        The workload's label.
    demand : pandas.Series
        Requests/s indexed by seconds from the run's start.
    history : pandas.Series or None
        Demand before the run (absolute time index on the planner's interval).
    time_offset_s : float
        Absolute time of t = 0 (s).
    prompt_tokens, output_tokens : int
        The mean request.
    fleet_size : int, optional
        A fixed fleet (workers), or None.
    prompt_factor, output_factor : float or pandas.Series
        Fill work and output tokens per request relative to ``prompt_tokens`` / ``output_tokens``
        (constants or series on the demand's index; default 1).
    notes : dict
        How the workload was built (reported).
    """

    name: str
    demand: pd.Series
    history: pd.Series | None
    time_offset_s: float
    prompt_tokens: int
    output_tokens: int
    fleet_size: int | None = None
    prompt_factor: float | pd.Series = 1.0
    output_factor: float | pd.Series = 1.0
    notes: dict = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        return float(self.demand.index[-1])


def rate_workload(spec: str, *, scale: float = 1.0, last_days: float | None = 4.0, interval_s: float = 600.0,
                  fine_s: float = 60.0, hours: float | None = None) -> RateWorkload:
    """A rate series (registered name, path or ``synthetic``) as a workload: the last
    ``last_days`` (the days before become the planner's history), gaps interpolated, x ``scale``,
    linear between the series' points on a ``fine_s`` grid (what the pool model draws Poisson
    arrivals from: the 10-minute rates disaggregated as the reconfiguration study does).

    Parameters
    ----------
    spec : str
        What :func:`tokenfactory.traces.load_rate_series` takes.
    scale : float
        Demand multiplier (a tenant population ``scale`` times larger).
    last_days : float or None
        Days at the end to run (None: the whole series, no history).
    interval_s : float
        Bin width for request traces.
    fine_s : float
        Grid of the disaggregated demand.
    hours : float, optional
        Cut the run to its first ``hours`` (quick variants).

    Returns
    -------
    RateWorkload
    """
    from tokenfactory.traces.rates import load_rate_series

    check_number("scale", scale, low=0.0, low_inclusive=False)
    rs = load_rate_series(spec, interval_s)
    y = rs.rates["rate_rps"].astype(float).interpolate(limit_direction="both") * scale
    t = y.index.to_numpy(dtype=float)
    step = float(np.median(np.diff(t))) if len(t) > 1 else interval_s
    if last_days is not None:
        check_number("last_days", last_days, low=0.0, low_inclusive=False)
        start = t[-1] + step - last_days * 86400.0
        if start <= t[0]:
            raise ConfigError("last_days", f"the series spans {(t[-1] + step - t[0]) / 86400:.2f} days, "
                              f"fewer than {last_days:g} + some history")
        hist, run = y[y.index < start], y[y.index >= start]
    else:
        hist, run = None, y
    t0 = float(run.index[0])
    rel = run.index.to_numpy(dtype=float) - t0
    end = rel[-1] + step
    if hours is not None:
        end = min(end, hours * 3600.0)
    fine = np.arange(0.0, end + fine_s / 2, fine_s)
    demand = pd.Series(np.interp(fine, rel, run.to_numpy()), index=fine)
    if hist is not None and not np.isclose(step, 600.0):
        hist = None  # the planner's grid is 10 minutes
    return RateWorkload(spec if scale == 1 else f"{spec} x{scale:g}", demand, hist, t0, rs.input_tokens,
                        rs.output_tokens)


#: the two request classes of the mixed week, (prompt tokens, output tokens). ASSUMPTIONS with their
#: sources: ``chat`` - interactive conversation, decode-heavy: 340 output tokens, about ShareGPT's mean
#: output (338 tokens; Kwon et al., "Efficient Memory Management for Large Language Model Serving with
#: PagedAttention", SOSP 2023, section 6.1), and a 1000-token prompt carrying the conversation's
#: history (ServeGen m-large's mean prompt is 914, ``tokenfactory/scenarios/stack_default.toml``);
#: ``batch`` - overnight long-document extraction / retrieval-augmented classification, fill-heavy: an
#: 8000-token prompt (a document, or fifteen 512-token retrieved chunks plus instructions) and a
#: 40-token structured answer; prompt/output 200, the same order as the Azure coding trace's medians
#: (1500 prompt / 13 output tokens; Patel et al., "Splitwise", ISCA 2024, section 3). On DeepSeek-V3
#: with the stack's batch gate a chat request costs a fill worker ~0.016 s and a decode worker ~0.4 s,
#: a batch request ~0.11 s and ~0.08 s (:func:`plant_for`): only a prompt/output ratio in the hundreds
#: makes the fill pool a large share of the fleet.
MIX_CLASSES = {"chat": (1000, 340), "batch": (8000, 40)}
def mixed_workload(fill_rate: Callable[[int, int], float], run_rates: Callable[[int, int, float], tuple[float, float]],
                   *, target_utilization: float, days: float = 7.0, seed: int = 0, chat_rps: float = 150.0,
                   batch_rps: float = 450.0, fleet_headroom: float = 0.15, history_days: int = 7,
                   interval_s: float = 600.0, fine_s: float = 60.0, hours: float | None = None) -> RateWorkload:
    """A synthetic week whose prefill/decode mix shifts over the day, on a fixed fleet.

    Two classes (:data:`MIX_CLASSES`), each a rate series from the synthetic generator
    (:func:`tokenfactory.traces.synthetic.generate_rates`: its daily shape and AR(1) noise):

    * ``chat`` peaks at 14:00 (daily amplitude 0.6 plus a 0.1 12-hour harmonic, weekends x 0.8 -
      the generator's defaults for the weekly shape, a deeper day than its 0.3 so the mix shifts);
    * ``batch`` peaks at 02:00 (amplitude 0.9, every night, weekends included: scheduled jobs).

    The total demand is their sum; the mix enters the pool model as factors relative to the run's
    request-weighted mean request (``prompt_tokens``, ``output_tokens``): the prompt factor is the
    mix's mean fill time per request over the mean request's, each class's fill rate per worker
    taken from the plant's service model (``fill_rate``; on the roofline an 8000-token prefill is not 8 x a
    1000-token one - the fill throughput is about 64k tokens/s per worker at 1000 tokens, 89k at
    4000 and 73k at 8000, a pass's fixed cost amortised over more tokens, then attention's quadratic
    term); the output factor is the mean output over the mean request's (decode passes are linear
    in output tokens at a fixed batch).

    Default rates (chat 150, batch 450 requests/s weekday means): the chat day and the batch night
    need about the same total workers, so the fleet is busy at both ends of the day, while the fill
    pool's share of the need moves from ~5 % (afternoon) to ~45 % (night).

    The fleet is fixed: ceil(peak over the run of (fill need + decode need) x (1 +
    ``fleet_headroom``)), needs at ``target_utilization`` on the plant the run uses (``run_rates``;
    :func:`tokenfactory.stack.mixed_workload_for` binds both to a stack scenario). Default 15 %: the stack's fixed headroom without a planner
    (``layers.reconfiguration.headroom``), so its unplanned target fits at the peak. Because the fill
    need peaks at night and the decode need by day, a static split needs max(fill) + max(decode)
    workers, more than the fleet (``notes["static_split_needs"]``); moving roles can serve both.

    Parameters
    ----------
    fill_rate : callable
        ``fill_rate(prompt_tokens, output_tokens)``: a fill worker's requests/s at that request.
    run_rates : callable
        ``run_rates(prompt_tokens, output_tokens, rate_rps)``: (fill, decode) requests/s per worker
        of the plant the run uses at the mean request and mean demand.
    target_utilization : float
        Utilisation the pools are sized at ((0, 1]).
    days : float
        Length of the run (days, (0, 14]; default 7).
    seed : int
        Seeds both classes' rate noise (chat ``seed``, batch ``seed + 1``; >= 0).
    chat_rps, batch_rps : float
        Weekday daily mean of each class (requests/s, > 0).
    fleet_headroom : float
        Fleet over the peak total need ([0, 2]; default 0.15).
    history_days : int
        Days before the run given to the planner as history (>= 3, its refit window; default 7,
        so the run starts on the generator's Monday 00:00).
    interval_s : float
        The rate series' resolution (s; 600: the planner's grid).
    fine_s : float
        Grid the demand and factors are interpolated on (s).
    hours : float, optional
        Cut the run to its first ``hours`` (the fleet and the mean request stay the whole run's).

    Returns
    -------
    RateWorkload
        With ``fleet_size``, ``prompt_factor``, ``output_factor`` and ``notes`` (classes, mean request,
        per-day swing of the fill:decode need ratio, fleet, the static split's need).
    """
    u = check_number("mixed.target_utilization", target_utilization, low=0.0, high=1.0, low_inclusive=False)
    check_number("mixed.days", days, low=0.0, high=14.0, low_inclusive=False)
    check_int("mixed.seed", seed, low=0)
    check_number("mixed.chat_rps", chat_rps, low=0.0, low_inclusive=False)
    check_number("mixed.batch_rps", batch_rps, low=0.0, low_inclusive=False)
    check_number("mixed.fleet_headroom", fleet_headroom, low=0.0, high=2.0)
    check_int("mixed.history_days", history_days, low=3)
    fine, c, b, history, start = _class_rates(chat_rps, batch_rps, seed, days, history_days, interval_s, fine_s)
    lam = c + b
    P, L, mu_f, pf, of = _mix_factors(c, b, fill_rate)
    wl = RateWorkload(f"mixed-week seed={seed}", pd.Series(lam, index=fine), history, start, P, L,
                      prompt_factor=pd.Series(pf, index=fine), output_factor=pd.Series(of, index=fine))
    run_fill, run_decode = run_rates(P, L, float(wl.demand.mean()))
    need_f = lam * pf / (u * run_fill)
    need_d = lam * of / (u * run_decode)
    fleet = int(math.ceil(float(np.max(need_f + need_d)) * (1.0 + fleet_headroom) - 1e-9))
    ratio, swings = _need_ratio_swings(need_f, need_d, fine)
    wl.fleet_size = fleet
    wl.notes = {"classes": {k: {"prompt_tokens": v[0], "output_tokens": v[1]} for k, v in MIX_CLASSES.items()},
                "chat_rps": chat_rps, "batch_rps": batch_rps, "mean_request": [P, L],
                "fill_rps_per_worker": {str(k): float(v) for k, v in mu_f.items()},
                "fleet_size": fleet, "fleet_headroom": fleet_headroom, "target_utilization": u,
                "peak_need": {"fill": float(need_f.max()), "decode": float(need_d.max()),
                              "total": float(np.max(need_f + need_d))},
                "static_split_needs": int(math.ceil(need_f.max() - 1e-9) + math.ceil(need_d.max() - 1e-9)),
                "need_ratio_swing_per_day": [float(x) for x in swings.to_numpy()],
                "need_ratio_range": [float(ratio.min()), float(ratio.max())]}
    if hours is not None:
        _keep_first_hours(wl, hours, days, fine)
    return wl


def _class_rates(chat_rps: float, batch_rps: float, seed: int, days: float, history_days: int, interval_s: float,
                 fine_s: float):
    """The two classes' rate series (:func:`mixed_workload`'s daily shapes), on the run's ``fine``
    grid from t = 0, and the planner's history of their sum before it.

    Returns ``(fine, chat, batch, history, start)``: the grid (s), each class's requests/s on it,
    the history (absolute time index) and the run's start (absolute s)."""
    from tokenfactory.traces.synthetic import SyntheticWorkload, generate_rates

    day = 86400.0
    chat_w = SyntheticWorkload(mean_rate_rps=chat_rps, daily_amplitude=0.6, daily_second_harmonic=0.1,
                               peak_hour=14.0, weekend_factor=0.8, seed=seed)
    batch_w = SyntheticWorkload(mean_rate_rps=batch_rps, daily_amplitude=0.9, daily_second_harmonic=0.0,
                                peak_hour=2.0, weekend_factor=1.0, seed=seed + 1)
    span = (history_days + days) * day + interval_s
    chat = generate_rates(chat_w, span, interval_s)["rate_rps"]
    batch = generate_rates(batch_w, span, interval_s)["rate_rps"]
    t_abs = chat.index.to_numpy(dtype=float)
    start = history_days * day
    history = (chat + batch)[t_abs < start]
    rel = t_abs - start
    fine = np.arange(0.0, days * day + fine_s / 2, fine_s)
    return fine, np.interp(fine, rel, chat.to_numpy()), np.interp(fine, rel, batch.to_numpy()), history, start


def _mix_factors(c: np.ndarray, b: np.ndarray, fill_rate: Callable[[int, int], float]):
    """The run's request-weighted mean request ``(P, L)`` and the mix's factors relative to it.

    Returns ``(P, L, fill rate per worker by prompt length, prompt factor, output factor)``: the
    prompt factor is the mix's mean fill time per request over the mean request's (each class at
    its own fill rate), the output factor its mean output over ``L``."""
    lam = c + b
    share = b / np.maximum(lam, 1e-12)
    (pc, lc), (pb, lb) = MIX_CLASSES["chat"], MIX_CLASSES["batch"]
    P = int(round(float(np.sum(c * pc + b * pb) / np.sum(lam))))
    L = int(round(float(np.sum(c * lc + b * lb) / np.sum(lam))))
    mu_f = {x: fill_rate(x, L) for x in (P, pc, pb)}
    pf = mu_f[P] * ((1.0 - share) / mu_f[pc] + share / mu_f[pb])
    of = ((1.0 - share) * lc + share * lb) / L
    return P, L, mu_f, pf, of


def _need_ratio_swings(need_f: np.ndarray, need_d: np.ndarray, fine: np.ndarray):
    """``(hourly fill:decode need ratio, its max/min within each whole day)``: on hourly means
    (the rate noise would inflate a minute-level swing)."""
    hourly = pd.DataFrame({"f": need_f, "d": need_d}, index=fine // 3600.0).groupby(level=0).mean()
    ratio = hourly["f"] / hourly["d"]
    whole = hourly.index // 24
    swings = ratio.groupby(whole).agg(lambda x: float(x.max() / x.min()) if len(x) >= 24 else math.nan).dropna()
    return ratio, swings


def _keep_first_hours(wl: RateWorkload, hours: float, days: float, fine: np.ndarray) -> None:
    """Cut ``wl``'s demand and factors to the run's first ``hours`` (its fleet and mean request stay)."""
    check_number("mixed.hours", hours, low=0.0, high=days * 24.0, low_inclusive=False)
    keep = fine <= hours * 3600.0 + 1e-9
    wl.demand, wl.prompt_factor, wl.output_factor = (x[keep] for x in (wl.demand, wl.prompt_factor,
                                                                      wl.output_factor))
    wl.name += f" first {hours:g} h"
