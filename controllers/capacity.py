"""Capacity plans for the demand-planning layer: forecast quantile -> workers per pool per hour.

A plan provisions each pool for the hour's peak demand (requests/s) x (1 + headroom), rounded up
to whole workers of the pool's per-worker rate (from the roofline service model), never below
``min_workers``, and changes each pool by at most ``max_moves_per_hour`` workers per hour - ramps
start early enough to meet the next peak (a backward pass) and ramps down are paced (a forward
pass), so the plan is feasible and never below the need it was built from.

``score_plan`` compares a plan with what the demand then did: GPU-hours, hours in which any pool
had less capacity than the hour's actual peak, and the shortfall in worker-hours.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from tokenfactory.plant_models.fluid import FluidParams
from tokenfactory.plant_models.service import ServiceModel
from tokenfactory.core.validation import ConfigError, check_int, check_number

__all__ = ["PoolRates", "hourly_peak", "workers_needed", "plan_capacity", "score_plan", "oracle_plan", "utilization_ceiling",
           "static_split"]

HOUR = 3600.0


@dataclass(frozen=True)
class PoolRates:
    """Requests/s one worker of each pool sustains, and GPUs per worker.

    The per-worker rates come from the roofline service model (:meth:`from_service`) or the fluid
    plant sampled from it (:meth:`from_params`); the plan divides demand by them.

    Parameters
    ----------
    fill_rps_per_worker : float
        Prefill throughput of one fill worker at the request shape (requests/s, > 0).
    decode_rps_per_worker : float
        Completions/s of one decode worker with every slot busy (requests/s, > 0).
    fill_gpus_per_worker, decode_gpus_per_worker : int
        GPUs one worker of each pool occupies (>= 1; default 8), for GPU-hours.

    Raises
    ------
    ConfigError
        For a non-positive rate or a GPU count below 1 (fields ``rates.*``).
    """

    fill_rps_per_worker: float
    decode_rps_per_worker: float
    fill_gpus_per_worker: int = 8
    decode_gpus_per_worker: int = 8

    def __post_init__(self) -> None:
        check_number("rates.fill_rps_per_worker", self.fill_rps_per_worker, low=0.0, low_inclusive=False)
        check_number("rates.decode_rps_per_worker", self.decode_rps_per_worker, low=0.0, low_inclusive=False)
        check_int("rates.fill_gpus_per_worker", self.fill_gpus_per_worker, low=1)
        check_int("rates.decode_gpus_per_worker", self.decode_gpus_per_worker, low=1)

    @classmethod
    def from_service(cls, service: ServiceModel) -> "PoolRates":
        """From the service model at its request shape (decode with every slot busy); GPUs per
        worker from the workers' layouts."""
        return cls(service.fill_rate_rps, service.decode_rate_rps(), service.fill_worker.num_gpus,
                   service.decode_worker.num_gpus)

    @classmethod
    def from_params(cls, params: FluidParams, fill_gpus: int = 8, decode_gpus: int = 8) -> "PoolRates":
        """From the fluid plant's rates (sampled from the same service model; decode at full batch)."""
        return cls(params.fill_rate_per_worker, params.decode_capacity(1.0), fill_gpus, decode_gpus)

    def to_dict(self) -> dict:
        """The fields as a plain dict."""
        return asdict(self)


def hourly_peak(rates: pd.Series) -> pd.Series:
    """Peak of a rate series within each hour (hours with no data are NaN).

    Parameters
    ----------
    rates : pandas.Series
        A rate (e.g. requests/s) indexed by time in seconds.

    Returns
    -------
    pandas.Series
        The maximum within each clock hour, indexed by the hour's start (s, a multiple of 3600),
        in the unit of ``rates``; only hours with at least one sample appear.
    """
    t = rates.index.to_numpy(dtype=float)
    return rates.groupby(np.floor(t / HOUR) * HOUR).max()


def workers_needed(demand_rps, per_worker_rps: float, headroom: float = 0.0, min_workers: int = 1) -> np.ndarray:
    """Whole workers that serve ``demand_rps`` x (1 + ``headroom``) at ``per_worker_rps`` each.

    NaN demand counts as 0 (a window with no data needs no worker).

    Parameters
    ----------
    demand_rps : float or array_like
        Demand (requests/s), one value per period.
    per_worker_rps : float
        Requests/s one worker sustains (> 0).
    headroom : float
        Fractional margin over the demand (>= 0; default 0; 0.2 = 20 % extra).
    min_workers : int
        Floor on the count (>= 0; default 1).

    Returns
    -------
    numpy.ndarray of int
        ceil(demand x (1 + headroom) / per_worker_rps), at least ``min_workers``, per period.

    Raises
    ------
    ConfigError
        For a non-positive ``per_worker_rps``, a negative ``headroom`` or ``min_workers``, or a
        negative or infinite demand.
    """
    check_number("per_worker_rps", per_worker_rps, low=0.0, low_inclusive=False)
    check_number("headroom", headroom, low=0.0)
    check_int("min_workers", min_workers, low=0)
    d = np.nan_to_num(np.asarray(demand_rps, dtype=float), nan=0.0)
    if d.size and (not np.isfinite(d).all() or (d < 0).any()):
        raise ConfigError("demand_rps", "must be finite and >= 0 requests/s (NaN counts as 0)")
    return np.maximum(np.ceil(d * (1.0 + headroom) / per_worker_rps - 1e-9), min_workers).astype(int)


def _limit_moves(need: np.ndarray, max_moves: int, initial: int | None = None) -> np.ndarray:
    p = need.copy()
    for i in range(len(p) - 2, -1, -1):  # ramp up ahead of a peak (within what is known)
        p[i] = max(p[i], p[i + 1] - max_moves)
    if initial is not None:  # the pool as it is now can only move max_moves in the first hour
        p[0] = min(max(p[0], initial - max_moves), initial + max_moves)
    for i in range(1, len(p)):  # pace ramps down (and, from a given start, ramps up)
        p[i] = min(max(p[i], p[i - 1] - max_moves), p[i - 1] + max_moves)
    return p


def plan_capacity(hourly_demand_rps: pd.Series, rates: PoolRates, *, headroom: float = 0.2,
                  max_moves_per_hour: int = 2, min_workers: int = 1,
                  initial: dict[str, int] | None = None) -> pd.DataFrame:
    """Workers per pool per hour for the given hourly (peak) demand.

    Without ``initial`` the whole demand is known in advance (perfect foresight, or one block of a
    plan) and ramps start early enough: the plan is never below the need. With ``initial``
    (``{"fill": n, "decode": m}``, the pools now) the first hour can move only
    ``max_moves_per_hour`` from there, so a plan re-made every horizon stays causal and may fall
    short when its forecast saw a peak too late.

    Parameters
    ----------
    hourly_demand_rps : pandas.Series
        Peak demand per hour (requests/s), indexed by hour (e.g. :func:`hourly_peak` of a
        forecast quantile); NaN counts as no demand.
    rates : PoolRates
        Per-worker rates of the two pools.
    headroom : float
        Fractional margin over the demand, in [0, 10] (default 0.2).
    max_moves_per_hour : int
        Most workers a pool may gain or lose from one hour to the next (>= 1; default 2).
    min_workers : int
        Floor on each pool (>= 0; default 1).
    initial : dict of str to int, optional
        The pools' current sizes, ``{"fill": n, "decode": m}``; ``None`` (default) plans with
        foresight from hour 0.

    Returns
    -------
    pandas.DataFrame
        Indexed like ``hourly_demand_rps``: ``fill_workers``, ``decode_workers`` (int) and
        ``demand_rps``.

    Raises
    ------
    ConfigError
        For ``headroom``, ``max_moves_per_hour`` or ``min_workers`` outside its range (fields
        ``plan.*``).
    """
    check_number("plan.headroom", headroom, low=0.0, high=10.0)
    check_int("plan.max_moves_per_hour", max_moves_per_hour, low=1)
    check_int("plan.min_workers", min_workers, low=0)
    out = pd.DataFrame(index=hourly_demand_rps.index.copy())
    for pool, per in (("fill", rates.fill_rps_per_worker), ("decode", rates.decode_rps_per_worker)):
        need = workers_needed(hourly_demand_rps.to_numpy(), per, headroom, min_workers)
        out[f"{pool}_workers"] = _limit_moves(need, max_moves_per_hour, None if initial is None else initial[pool])
    out["demand_rps"] = hourly_demand_rps.to_numpy()
    return out


def score_plan(plan: pd.DataFrame, actual_hourly_peak_rps: pd.Series, rates: PoolRates) -> dict:
    """Score ``plan`` against the actual hourly peak demand (hours present in both).

    Parameters
    ----------
    plan : pandas.DataFrame
        A plan as :func:`plan_capacity` returns (``fill_workers``, ``decode_workers`` per hour).
    actual_hourly_peak_rps : pandas.Series
        What the demand's hourly peak then was (requests/s), indexed like the plan.
    rates : PoolRates
        Per-worker rates and GPUs per worker of the two pools.

    Returns
    -------
    dict
        ``hours`` (scored), ``gpu_hours`` (GPUs x hours provisioned), ``under_provisioned_hours``
        (hours in which either pool had fewer workers than the actual peak needed, no headroom),
        ``shortfall_worker_hours`` (missing workers summed over pools and hours),
        ``mean_peak_utilization`` (actual peak / the lesser pool capacity, capped at 1, averaged)
        and ``moves`` (workers added or removed over the plan, both pools).

    Raises
    ------
    ConfigError
        When no hour of the plan has actual demand (field ``plan``).
    """
    actual = actual_hourly_peak_rps.reindex(plan.index)
    ok = actual.notna()
    if not ok.any():
        raise ConfigError("plan", "no hour of the plan has actual demand to score against")
    p, a = plan[ok], actual[ok].to_numpy()
    gpu_h = float((p["fill_workers"] * rates.fill_gpus_per_worker
                   + p["decode_workers"] * rates.decode_gpus_per_worker).sum())
    short = np.zeros(len(p))
    under = np.zeros(len(p), dtype=bool)
    for pool, per in (("fill", rates.fill_rps_per_worker), ("decode", rates.decode_rps_per_worker)):
        need = np.ceil(a / per - 1e-9)  # workers the hour's actual peak needed, no headroom
        gap = np.maximum(need - p[f"{pool}_workers"].to_numpy(), 0)
        short += gap
        under |= gap > 0
    cap = np.minimum(p["fill_workers"] * rates.fill_rps_per_worker, p["decode_workers"] * rates.decode_rps_per_worker)
    return {"hours": int(ok.sum()), "gpu_hours": gpu_h, "under_provisioned_hours": int(under.sum()),
            "shortfall_worker_hours": float(short.sum()),
            "mean_peak_utilization": float(np.mean(np.minimum(a / cap.to_numpy(), 1.0))),
            "moves": int(np.abs(np.diff(p["fill_workers"])).sum() + np.abs(np.diff(p["decode_workers"])).sum())}


def oracle_plan(demand_rps: pd.Series, per_worker_rps: dict[str, float], utilization_ceiling: dict[str, float], *,
                startup_s: float, interval_s: float = 600.0, gpus_per_worker: int | Mapping[str, int] = 8,
                fleet_size: int | None = None,
                work_factors: dict[str, float | pd.Series] | None = None) -> tuple[pd.DataFrame, float]:
    """The physical floor of any plan: perfect knowledge of the demand, the same start-up delay
    and the same SLO.

    Each ``interval_s`` a pool needs ceil(peak demand in the interval / (per-worker rate x the
    pool's SLO utilisation ceiling)) workers; a worker serving at s must have been started at
    s - ``startup_s`` and is billed from then, so the billed count at t is the most needed over
    [t, t + startup_s]. No plan that meets the SLO in every interval can bill less.

    When the request shape shifts (``work_factors``: the pool model's prompt and output factors) a
    pool's load at t is demand(t) x its factor(t) in nominal requests/s, and the interval's need is
    the peak of that load (the fill pool's peak need may fall where the demand is low).

    Parameters
    ----------
    demand_rps : pandas.Series
        Demand (requests/s) indexed by seconds from the run's start, held piecewise constant.
    per_worker_rps : dict
        ``{"fill": .., "decode": ..}`` full-speed requests/s per worker.
    utilization_ceiling : dict
        The highest utilisation of each pool at which the SLO still holds.
    startup_s : float
        Start-up delay.
    interval_s : float
        Planning interval (the demand's resolution).
    gpus_per_worker : int or dict
        GPUs per worker, or ``{"fill": .., "decode": ..}`` per pool.
    fleet_size : int, optional
        A fixed fleet: GPU-hours are then the smallest fleet that holds the plan at its peak.
    work_factors : dict, optional
        ``{"fill": .., "decode": ..}``: work per request relative to the nominal request, a
        constant or a series (seconds, held piecewise constant; before its first point the first
        value applies), e.g. ``{"fill": prompt_factor, "decode": output_factor}``; default 1.

    Returns
    -------
    tuple
        ``(plan, gpu_hours)``; ``plan`` has ``fill_needed``, ``decode_needed``, ``fill_billed``,
        ``decode_billed`` and ``fill_load``, ``decode_load`` (the interval's peak load in workers
        at the ceiling, not rounded) per interval.
    """
    check_number("oracle.startup_s", startup_s, low=0.0)
    check_number("oracle.interval_s", interval_s, low=1.0)
    t = demand_rps.index.to_numpy(dtype=float)
    v = demand_rps.to_numpy(dtype=float)
    edges = np.arange(t[0], t[-1] + interval_s, interval_s)
    k = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, len(edges) - 1)
    out = pd.DataFrame(index=pd.Index(edges, name="time_s"))
    ahead = int(math.ceil(startup_s / interval_s - 1e-9))
    for pool in ("fill", "decode"):
        u = check_number(f"oracle.utilization_ceiling.{pool}", utilization_ceiling[pool], low=0.0, high=1.0,
                         low_inclusive=False)
        f = _held_on((work_factors or {}).get(pool, 1.0), t, f"oracle.work_factors.{pool}")
        peak = np.zeros(len(edges))
        np.maximum.at(peak, k, v * f)
        out[f"{pool}_load"] = peak / (per_worker_rps[pool] * u)
        need = np.ceil(peak / (per_worker_rps[pool] * u) - 1e-9).clip(min=1)
        billed = need.copy()
        for j in range(1, ahead + 1):  # started one start-up ahead of every interval that needs it
            billed[:-j] = np.maximum(billed[:-j], need[j:])
        out[f"{pool}_needed"], out[f"{pool}_billed"] = need, billed
    duration = float(t[-1] - t[0]) if len(t) > 1 else interval_s
    w = np.full(len(edges), interval_s)
    w[-1] = max(duration - interval_s * (len(edges) - 1), 0.0)
    if isinstance(gpus_per_worker, Mapping):   # per-pool GPUs: each pool's billed worker-hours x its GPUs
        g = {pool: check_int(f"oracle.gpus_per_worker.{pool}", gpus_per_worker[pool], low=1)
             for pool in ("fill", "decode")}
        gpu = out["fill_billed"] * g["fill"] + out["decode_billed"] * g["decode"]
        gpu_s = float((gpu * w).sum()) if fleet_size is None else float(gpu.max() * w.sum())
        return out, gpu_s / 3600.0
    if fleet_size is None:
        worker_s = float(((out["fill_billed"] + out["decode_billed"]) * w).sum())
    else:
        worker_s = float((out["fill_billed"] + out["decode_billed"]).max() * w.sum())
    return out, worker_s / 3600.0 * gpus_per_worker


def utilization_ceiling(params: FluidParams, slo_ttft_s: float, slo_tpot_s: float, *,
                        workers: int | dict[str, int] = 4,
                        grid=(0.8, 0.85, 0.9, 0.93, 0.95, 0.97, 0.98, 0.99, 0.995), duration_s: float = 1200.0,
                        dt: float = 1.0, seed: int = 0) -> dict[str, float]:
    """The highest utilisation of each pool at which the pool model still meets the SLO for 99 %
    of requests (Poisson arrivals at a constant rate, the other pool ample), on ``grid``: the SLO's
    utilisation ceiling, which the oracle provisions at.

    Poisson noise is relatively smaller in a larger pool, so the ceiling depends on the pool size:
    measure it at the sizes the workload runs at (``workers`` per pool).

    Parameters
    ----------
    params : FluidParams
        The plant (the batch gate applied).
    slo_ttft_s, slo_tpot_s : float
        The SLO.
    workers : int or dict
        Pool size the ceiling is measured at (``{"fill": .., "decode": ..}`` or one for both).
    grid : sequence of float
        Utilisations tried in increasing order; the first that misses the SLO ends the search.
    duration_s, dt : float
        Length and step of each measurement run (s).
    seed : int
        Seed of the Poisson arrivals.

    Returns
    -------
    dict
        ``{"fill": ceiling, "decode": ceiling}`` (the first grid point if even that misses).
    """
    # the cache's key is what the pool model reads (provenance, compared by nothing, dropped)
    return _ceiling(params.model_inputs(), float(slo_ttft_s), float(slo_tpot_s),
                    tuple(sorted((workers if isinstance(workers, dict) else
                                  {"fill": workers, "decode": workers}).items())),
                    tuple(grid), float(duration_s), float(dt), int(seed))


@functools.lru_cache(maxsize=64)
def _ceiling(params: FluidParams, slo_ttft_s: float, slo_tpot_s: float, workers: tuple, grid: tuple,
             duration_s: float, dt: float, seed: int) -> dict[str, float]:
    from tokenfactory.plant_models.plant_protocol import PoolPlant
    from tokenfactory.plant_models.pools import PoolScenario

    sizes = dict(workers)
    out = {}
    for pool in ("fill", "decode"):
        n = max(1, int(sizes[pool]))
        mu = params.fill_rate_per_worker if pool == "fill" else params.decode_capacity(1)
        best = grid[0]
        for rho in grid:
            lam = rho * n * mu
            nf = n if pool == "fill" else math.ceil(lam / (0.5 * params.fill_rate_per_worker))
            nd = n if pool == "decode" else math.ceil(lam / (0.5 * params.decode_capacity(1)))
            r = PoolPlant(params, nf, nd).run(PoolScenario(lam, duration_s, dt=dt, seed=seed, slo_ttft_s=slo_ttft_s,
                                                           slo_tpot_s=slo_tpot_s))
            if r.metrics["slo_attainment"] >= 0.99:
                best = rho
            else:
                break
        out[pool] = float(best)
    return out


def _held_on(f: float | pd.Series, t: np.ndarray, field: str) -> np.ndarray:
    """A constant or a series (held piecewise constant from each point) at the times ``t``."""
    if isinstance(f, pd.Series):
        x = f.to_numpy(dtype=float)
        if f.empty or not np.all(np.isfinite(x)) or (x <= 0).any():
            raise ConfigError(field, "a work factor series must be non-empty, finite and > 0")
        idx = f.index.to_numpy(dtype=float)
        return x[np.clip(np.searchsorted(idx, t, side="right") - 1, 0, len(idx) - 1)]
    return np.full(len(t), check_number(field, f, low=0.0, low_inclusive=False))


def static_split(plan: pd.DataFrame, fleet_size: int) -> dict:
    """The best fixed fill/decode split of a fixed fleet for a whole plan (no role moves): the
    split that keeps the most loaded pool's worst interval least loaded, i.e. minimises
    max over intervals of max(fill load / fill workers, decode load / decode workers), with the
    loads of :func:`oracle_plan` (workers needed at the SLO's utilisation ceiling).

    Parameters
    ----------
    plan : pandas.DataFrame
        :func:`oracle_plan`'s plan (``fill_load``, ``decode_load`` per interval).
    fleet_size : int
        Workers the two pools share (>= 2).

    Returns
    -------
    dict
        ``fill_workers``, ``decode_workers``, ``worst_load`` (that max; > 1: the split is short of
        the ceiling somewhere), ``short_intervals`` (intervals in which either pool is short) and
        ``needs_workers`` (max fill load + max decode load, rounded up: the fleet a static split
        needs to hold both pools' peaks).
    """
    check_int("fleet_size", fleet_size, low=2)
    lf, ld = plan["fill_load"].to_numpy(dtype=float), plan["decode_load"].to_numpy(dtype=float)
    nf = np.arange(1, fleet_size)
    worst = np.maximum(lf.max(initial=0.0) / nf, ld.max(initial=0.0) / (fleet_size - nf))
    best = int(nf[np.argmin(worst)])
    short = int(((lf > best + 1e-9) | (ld > fleet_size - best + 1e-9)).sum())
    return {"fill_workers": best, "decode_workers": fleet_size - best, "worst_load": float(worst.min()),
            "short_intervals": short,
            "needs_workers": int(math.ceil(lf.max(initial=0.0) - 1e-9) + math.ceil(ld.max(initial=0.0) - 1e-9))}
