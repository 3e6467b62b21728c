"""How workers join and leave pools: the rules the pool model and the request simulator share.

* :class:`PoolDynamics` - start-up, warm-up, drain and fleet-size assumptions (sources in its
  docstring).
* :func:`scale_plan` - Kubernetes-deployment semantics of a desired replica count: a scale-up
  requests new workers (they wait for a free worker in a fixed fleet, then start up); a
  scale-down withdraws requests not yet placed, then cancels starting workers (newest first), then
  drains serving ones (newest first).
* :func:`free_workers` - how many requests a fixed fleet can place now.
* :class:`PoolFleet` - one pool's workers on the pool model's time grid (times, not objects).

The request simulator keeps real worker objects (a drained worker finishes what it holds) but
decides with the same :func:`scale_plan` and :func:`free_workers`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
import dataclasses
from dataclasses import dataclass

from tokenfactory.core.validation import (ConfigError, check_choice, check_fields, check_int, reject_unknown_keys,
                                          setting)

__all__ = ["PoolDynamics", "GPU_POOLS", "pool_gpus", "ScalePlan", "scale_plan", "free_workers", "PoolFleet"]


@dataclass(frozen=True)
class PoolDynamics:
    """How workers join and leave pools (seconds).

    Defaults are ASSUMPTIONS for a DeepSeek-V3 worker on 8 x H200, stated so they can be
    replaced: ``startup_s`` 120 s = 671 GB of FP8 weights read at ~6 GB/s from local NVMe (a
    PCIe Gen4 x4 drive's ~7 GB/s sequential read) plus process start, CUDA-graph capture and
    expert-parallel group setup; ``warmup_s`` / ``warmup_factor``: the first passes of a new worker
    run slower (allocator growth, cold caches, lazy graph capture), modelled as half speed for
    30 s; ``drain_s``: a removed worker stays billed while its sequences migrate off (the pool
    model's stand-in; the request simulator drains a worker for real - it finishes what it holds).
    ``gpus_per_worker`` converts worker-hours to GPU-hours: one number for both pools, or a table
    ``{fill = .., decode = ..}`` when the pools' parallelism differs (disaggregated deployments
    commonly run a narrower prefill than decode, e.g. prefill TP2 EP2 = 4 GPUs, decode EP8 = 8;
    :meth:`gpus` gives a pool's; a table whose two values agree is stored as that number). ``fleet_size`` fixes the number of
    workers (None: elastic, workers come and go): a scale-up then waits until a worker is free, so
    moving a worker between pools costs its drain, then its start-up in the new role; GPU-hours are
    the whole fleet's (owned), ``busy_gpu_hours`` the provisioned ones.

    Parameters
    ----------
    startup_s : float
        Decision to serving (s, [0, 3600]).
    warmup_s : float
        Time a new worker runs slower (s, [0, 3600]).
    warmup_factor : float
        Its speed meanwhile, as a fraction of full speed, in (0, 1].
    drain_s : float
        Billed time of a removed worker in the pool model (s, [0, 3600]).
    gpus_per_worker : int or dict
        GPUs per worker (>= 1), or ``{"fill": .., "decode": ..}`` per pool.
    fleet_size : int or None
        Fixed number of workers (>= 1), or None for an elastic fleet.
    """

    startup_s: float = setting(120.0, unit="s", low=0.0, high=3600.0,
                               source="assumed: 671 GB of FP8 weights at ~6 GB/s from local NVMe plus process "
                                      "start, CUDA-graph capture and EP group setup",
                               meaning="time from a scale-up decision to the new worker serving")
    warmup_s: float = setting(30.0, unit="s", low=0.0, high=3600.0, source="assumed",
                              meaning="time a new worker runs slower (allocator growth, cold caches)")
    warmup_factor: float = setting(0.5, low=0.0, high=1.0, low_inclusive=False, source="assumed",
                                   meaning="a warming worker's speed as a fraction of full speed")
    drain_s: float = setting(30.0, unit="s", low=0.0, high=3600.0, source="assumed",
                             meaning="billed time of a removed worker in the pool model (the request simulator "
                                     "drains for real)")
    gpus_per_worker: int | dict = setting(8, kind="int or table", low=1, unit="GPUs",
                                          meaning="GPUs per worker (worker-hours to GPU-hours): one number for both "
                                                  "pools, or {fill = .., decode = ..} per pool")
    fleet_size: int | None = setting(None, kind=int, low=1, unit="workers",
                                     meaning="a fixed fleet: scale-ups wait for a free worker (absent: elastic)")

    def __post_init__(self) -> None:  # checked against the declarations, the values kept as given
        check_fields(self, "pools", names=("startup_s", "warmup_s", "warmup_factor", "drain_s"), hold=False)
        object.__setattr__(self, "gpus_per_worker", pool_gpus("pools.gpus_per_worker", self.gpus_per_worker))
        if self.fleet_size is not None:
            check_fields(self, "pools", names=("fleet_size",), hold=False)
            if not self.uniform_gpus:
                raise ConfigError("pools.gpus_per_worker", f"{self.gpus_per_worker}: a fixed fleet (fleet_size "
                                  f"{self.fleet_size}) moves workers between pools, so both pools' workers need "
                                  "the same GPUs; give one number")

    @classmethod
    def from_dict(cls, d: Mapping, where: str = "pools") -> "PoolDynamics":
        """Read a dynamics table as a user wrote it, errors naming the key where it was written.

        Parameters
        ----------
        d : mapping
            The fields; unknown keys raise :class:`ConfigError` naming them.
        where : str
            Dotted path of the table in its file (``"cluster.dynamics"``, ``"dynamics"``).

        Returns
        -------
        PoolDynamics

        Raises
        ------
        ConfigError
            For an unknown key or a value out of range, its field under ``where``
            (``cluster.dynamics.startup_s: 7200 is outside the allowed range [0, 3600]``).
        """
        reject_unknown_keys(where, d, {f.name for f in dataclasses.fields(cls)})
        try:
            return cls(**d)
        except ConfigError as e:
            if where == "pools" or not e.field.startswith("pools."):
                raise
            raise ConfigError(f"{where}.{e.field[len('pools.'):]}", e.message) from None

    @property
    def uniform_gpus(self) -> bool:
        """Whether both pools' workers have the same GPUs (``gpus_per_worker`` is one number)."""
        return not isinstance(self.gpus_per_worker, Mapping)

    def gpus(self, pool: str) -> int:
        """GPUs of one worker of a pool.

        Parameters
        ----------
        pool : str
            ``"fill"`` or ``"decode"``; ``"aggregated"`` (a worker doing both, on the plant's
            ``parallelism``) counts as a fill worker.

        Returns
        -------
        int
        """
        if self.uniform_gpus:
            return int(self.gpus_per_worker)
        check_choice("pool", pool, GPU_POOLS + ("aggregated",))
        return int(self.gpus_per_worker["fill" if pool == "aggregated" else pool])


#: the pools a per-pool ``gpus_per_worker`` table names
GPU_POOLS = ("fill", "decode")


def pool_gpus(name: str, value) -> int | dict:
    """Check a ``gpus_per_worker`` value: an int >= 1, or a table naming both pools with ints >= 1
    (returned as the int when its two values agree, so a uniform table behaves as the scalar).

    Parameters
    ----------
    name : str
        The field's dotted name, for errors (``"dynamics.gpus_per_worker"``).
    value : int or mapping
        The value as read.

    Returns
    -------
    int or dict
        The int, or ``{"fill": .., "decode": ..}``.

    Raises
    ------
    ConfigError
        For an unknown or missing pool key, or a value that is not an int >= 1, naming the field.
    """
    if not isinstance(value, Mapping):
        return check_int(name, value, low=1)
    reject_unknown_keys(name, value, GPU_POOLS)
    missing = [p for p in GPU_POOLS if p not in value]
    if missing:
        raise ConfigError(f"{name}.{missing[0]}", f"missing: a per-pool table gives both {GPU_POOLS}")
    out = {p: check_int(f"{name}.{p}", value[p], low=1) for p in GPU_POOLS}
    return out["fill"] if out["fill"] == out["decode"] else out


@dataclass(frozen=True)
class ScalePlan:
    """What reconciling a pool toward a target does.

    Parameters
    ----------
    request : int
        New workers to request (they wait for placement, then start up).
    withdraw : int
        Requests not yet placed to withdraw.
    cancel : int
        Starting workers to cancel, newest first.
    drain : int
        Serving workers to drain, newest first.
    """

    request: int = 0
    withdraw: int = 0
    cancel: int = 0
    drain: int = 0


def scale_plan(serving: int, starting: int, waiting: int, target: int) -> ScalePlan:
    """Deployment semantics: reach ``target`` provisioned workers (serving + starting + waiting).

    Parameters
    ----------
    serving : int
        Workers serving (not draining).
    starting : int
        Workers placed and starting up.
    waiting : int
        Requested workers not placed yet (a fixed fleet had no free worker).
    target : int
        Desired provisioned workers.

    Returns
    -------
    ScalePlan
    """
    diff = int(target) - (serving + starting + waiting)
    if diff >= 0:
        return ScalePlan(request=diff)
    remove = -diff
    withdraw = min(waiting, remove)
    cancel = min(starting, remove - withdraw)
    return ScalePlan(withdraw=withdraw, cancel=cancel, drain=min(serving, remove - withdraw - cancel))


def free_workers(dynamics: PoolDynamics, in_use: int) -> float:
    """Workers a fixed fleet has free for placement.

    Parameters
    ----------
    dynamics : PoolDynamics
        Its ``fleet_size`` (None: elastic).
    in_use : int
        Workers holding a slot: serving, draining or starting.

    Returns
    -------
    float
        ``fleet_size - in_use`` (at least 0), or ``inf`` for an elastic fleet.
    """
    return math.inf if dynamics.fleet_size is None else max(dynamics.fleet_size - in_use, 0)


class PoolFleet:
    """The workers of one pool on the pool model's grid: serving (with the time their warm-up
    ends), starting (with the time they start serving) and draining (with the time they are
    released).

    Parameters
    ----------
    pool : str
        ``"fill"`` or ``"decode"``.
    workers : int
        Workers serving at the start (warm).
    dynamics : PoolDynamics
        Start-up, warm-up and drain times.
    """

    def __init__(self, pool: str, workers: int, dynamics: PoolDynamics):
        self.pool = pool
        self.dyn = dynamics
        self.serving: list[float] = [-math.inf] * workers   # warm-up end times
        self.starting: list[float] = []                      # serving-from times
        self.draining: list[float] = []                      # release times
        self.waiting = 0                                     # requested, no free worker yet (fixed fleet)
        self.released = 0                                    # workers given back so far (cancelled or drained)
        self._eff = (-math.inf, 0.0)  # (valid until, value) of effective(): it changes only at events

    @property
    def provisioned(self) -> int:
        """What a deployment's replica count means: serving plus starting (plus, in a fixed fleet,
        those waiting for a free worker - pending pods)."""
        return len(self.serving) + len(self.starting) + self.waiting

    @property
    def in_transit(self) -> int:
        """Requested but not serving yet: what a pending-aware controller must count."""
        return len(self.starting) + self.waiting

    @property
    def billed(self) -> int:
        return len(self.serving) + len(self.starting) + len(self.draining)

    def set_target(self, t: float, target: int) -> int:
        """Reconcile toward ``target`` workers (:func:`scale_plan`).

        Parameters
        ----------
        t : float
            Now (s).
        target : int
            Desired provisioned workers.

        Returns
        -------
        int
            The change in provisioned workers.
        """
        before = self.provisioned
        plan = scale_plan(len(self.serving), len(self.starting), self.waiting, target)
        self.waiting += plan.request - plan.withdraw
        self.starting.sort()
        for _ in range(plan.cancel):  # the newest (latest to serve) go first
            self.starting.pop()
        self.released += plan.cancel
        self.serving.sort()
        for _ in range(plan.drain):
            self.serving.pop()  # the most recently started worker drains
            self.draining.append(t + self.dyn.drain_s)
        if plan.cancel or plan.drain:  # the serving list changed: effective() must recount
            self._eff = (-math.inf, 0.0)
        return self.provisioned - before

    def place(self, t: float, free: float) -> int:
        """Start up to ``free`` of the waiting requests; returns how many started."""
        n = int(min(self.waiting, free))
        if n > 0:
            self.starting.extend([t + self.dyn.startup_s] * n)
            self.waiting -= n
        return n

    def advance(self, t: float) -> None:
        if self.starting:
            up = [s for s in self.starting if s <= t + 1e-9]
            if up:
                self.starting = [s for s in self.starting if s > t + 1e-9]
                self.serving.extend(s + self.dyn.warmup_s for s in up)
                self._eff = (-math.inf, 0.0)
        if self.draining:
            still = [d for d in self.draining if d > t + 1e-9]
            self.released += len(self.draining) - len(still)
            self.draining = still

    def effective(self, t: float) -> float:
        """Serving workers in full-speed equivalents (warming workers count ``warmup_factor``)."""
        until, value = self._eff
        if t < until:
            return value
        f = self.dyn.warmup_factor
        value = float(sum(f if t < w else 1.0 for w in self.serving))
        # valid until the next warm-up end; advance() and set_target(), which change the serving
        # list, reset the cache
        pending = [w for w in self.serving if w > t]
        self._eff = (min(pending) if pending else math.inf, value)
        return value
