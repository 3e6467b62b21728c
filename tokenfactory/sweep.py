"""Sweeps: generated configurations over a base scenario, run serially or on a Dask cluster.

desmod-style: a sweep is *data* - a base configuration plus a grid of overrides (the cartesian
product of dotted keys' values), or an explicit list of override mappings, optionally replicated
over seeds. :meth:`Sweep.configs` lists the generated configurations; :func:`run_sweep` runs a
point function on each and gathers one DataFrame with the overrides of each point beside its
results - the same frame serially or on a cluster, because every random draw of a point comes
from the seed in its own configuration.

Where it runs: ``backend="serial"`` (a Python loop), or ``"dask"``: a ``LocalCluster`` with one
single-threaded worker process per core by default, or an existing cluster given by ``scheduler``
(``"tcp://host:8786"``) or the ``TOKENFACTORY_DASK_SCHEDULER`` environment variable. Points are
sent in chunks (``chunk_size``) so a 10^5-point stability map is a few hundred tasks, not 10^5,
each chunk as opaque pickled bytes (Dask would walk every configuration dict of a task's
arguments looking for keys);
with ``batched=True`` the point function receives a whole chunk (a list of configurations) and
returns a list of results, which is how vectorised kernels (batched margins) are fed.

The point function must be importable by the workers (a module-level function).
"""

from __future__ import annotations

import copy
import itertools
import math
import os
import pickle
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from tokenfactory.core.validation import ConfigError, check_choice, check_int

__all__ = ["Sweep", "SweepBackend", "run_sweep", "map_points", "default_backend", "set_dotted", "SCHEDULER_ENV",
           "WORKERS_ENV"]

#: environment variable naming a Dask scheduler address to use instead of a local cluster
SCHEDULER_ENV = "TOKENFACTORY_DASK_SCHEDULER"
#: environment variable asking for a local Dask cluster of this many worker processes
WORKERS_ENV = "TOKENFACTORY_SWEEP_WORKERS"


def default_backend() -> str:
    """``"dask"`` when ``$TOKENFACTORY_DASK_SCHEDULER`` or ``$TOKENFACTORY_SWEEP_WORKERS`` is set
    in the user's environment, else ``"serial"`` (the fallback when no :class:`SweepBackend` is
    passed; ``tokenfactory study --scheduler ADDRESS`` / ``--workers N`` pass one as an argument).

    Returns
    -------
    str
        The backend the studies' grids use.
    """
    return "dask" if os.environ.get(SCHEDULER_ENV) or os.environ.get(WORKERS_ENV) else "serial"


@dataclass(frozen=True)
class SweepBackend:
    """Where a grid of points runs, passed as an argument (``tokenfactory study --workers N`` /
    ``--scheduler ADDRESS`` build one) rather than through the environment.

    Parameters
    ----------
    backend : str
        ``"serial"`` (default) or ``"dask"``.
    scheduler : str, optional
        Address of an existing Dask scheduler (``"tcp://host:8786"``); None: a local cluster.
    workers : int, optional
        Local cluster size (>= 1; None: the machine's cores).

    Raises
    ------
    ConfigError
        For an unknown backend (``sweep.backend``) or a worker count below 1 (``sweep.workers``).
    """

    backend: str = "serial"
    scheduler: str | None = None
    workers: int | None = None

    def __post_init__(self) -> None:
        check_choice("sweep.backend", self.backend, ("serial", "dask"))
        if self.workers is not None:
            check_int("sweep.workers", self.workers, low=1)

    def map(self, fn: Callable, points: Sequence[Any], *, chunk_size: int | None = None) -> list:
        """:func:`map_points` on this backend.

        Parameters
        ----------
        fn : callable
            Importable point function.
        points : sequence
            The points.
        chunk_size : int, optional
            Points per task.

        Returns
        -------
        list
            ``fn``'s results in the order of ``points``.
        """
        return map_points(fn, points, backend=self.backend, scheduler=self.scheduler, workers=self.workers,
                          chunk_size=chunk_size)


def map_points(fn: Callable, points: Sequence[Any], *, backend: str | None = None, scheduler: str | None = None,
               workers: int | None = None, chunk_size: int | None = None) -> list:
    """``[fn(p) for p in points]``, serially or on Dask, in order - the engine under :func:`run_sweep`
    for grids whose points return objects (simulation results) rather than rows.

    Parameters
    ----------
    fn : callable
        Importable point function; its results must pickle for the Dask backend.
    points : sequence
        The points (each must pickle for the Dask backend).
    backend : str, optional
        ``"serial"`` or ``"dask"``; default :func:`default_backend`.
    scheduler : str, optional
        Dask scheduler address (default ``$TOKENFACTORY_DASK_SCHEDULER``, else a local cluster).
    workers : int, optional
        Local cluster size (default ``$TOKENFACTORY_SWEEP_WORKERS``, else the machine's cores).
    chunk_size : int, optional
        Points per task (default: one point per task when points are few, see :func:`run_sweep`).

    Returns
    -------
    list
        ``fn``'s results in the order of ``points``.
    """
    backend = backend or default_backend()
    check_choice("sweep.backend", backend, ("serial", "dask"))
    points = list(points)
    if backend == "serial" or not points:
        return [fn(p) for p in points]
    workers = workers if workers is not None else _env_workers()
    return _run_dask(_Each(fn), points, scheduler or os.environ.get(SCHEDULER_ENV) or None, workers,
                     chunk_size or 1, batched=True, wrap=False)


def _env_workers() -> int | None:
    text = os.environ.get(WORKERS_ENV)
    if not text:
        return None
    try:
        return check_int(WORKERS_ENV, int(text), low=1)
    except ValueError:
        raise ConfigError(WORKERS_ENV, f"expected a number of worker processes, got {text!r}") from None


class _Each:
    """A picklable ``lambda chunk: [fn(p) for p in chunk]``."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def __call__(self, chunk: list) -> list:
        return [self.fn(p) for p in chunk]


def set_dotted(config: Mapping[str, Any], key: str, value: Any) -> dict:
    """A deep copy of ``config`` with ``key`` (dotted path, e.g. ``"plant.fill_workers"``) set.

    Parameters
    ----------
    config : mapping
        The base configuration (nested mappings).
    key : str
        Dotted path; intermediate mappings are created when missing.
    value : any
        The value to set.

    Returns
    -------
    dict
        The new configuration (``config`` is not modified).

    Raises
    ------
    ConfigError
        When an intermediate part of ``key`` names a value, not a section, in ``config``.
    """
    out = copy.deepcopy(dict(config))
    _set_in_place(out, key, value)
    return out


_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None))


def _set_in_place(config: dict, key: str, value: Any) -> None:
    node = config
    parts = key.split(".")
    for p in parts[:-1]:
        nxt = node.get(p)
        if nxt is None:
            nxt = node[p] = {}
        elif not isinstance(nxt, dict):
            raise ConfigError(f"sweep.{key}", f"{p!r} is a value, not a section, in the base configuration")
        node = nxt
    node[parts[-1]] = value


@dataclass(frozen=True)
class Sweep:
    """A set of generated configurations.

    Parameters
    ----------
    base : mapping
        The base configuration every point starts from (default: empty).
    grid : mapping of str to sequence, optional
        Dotted key -> values; the points are the cartesian product (first key varies slowest).
        Each value list must be non-empty and not a string.
    points : sequence of mapping, optional
        Explicit override mappings (dotted key -> value), one per point; combined with ``grid``
        as a product when both are given (a point's value wins over the grid's for the same key).
    seeds : sequence of int, optional
        Replications (each seed >= 0): every point is run once per seed, with the seed set at
        ``seed_key``; seeds vary fastest.
    seed_key : str
        Where the seed goes in the configuration (dotted; default ``"seed"``).

    Raises
    ------
    ConfigError
        For a grid entry that is not a non-empty list of values, or a negative or non-integer seed.
    """

    base: Mapping[str, Any] = field(default_factory=dict)
    grid: Mapping[str, Sequence[Any]] | None = None
    points: Sequence[Mapping[str, Any]] | None = None
    seeds: Sequence[int] | None = None
    seed_key: str = "seed"

    def __post_init__(self) -> None:
        grid = {}
        for k, vals in (self.grid or {}).items():
            if isinstance(vals, (str, bytes)) or not isinstance(vals, Iterable):
                raise ConfigError(f"sweep.grid.{k}", "expected a list of values")
            grid[k] = tuple(vals)  # a generator is read once, here, not consumed by the check
            if len(grid[k]) == 0:
                raise ConfigError(f"sweep.grid.{k}", "expected at least one value")
        if self.grid is not None:
            object.__setattr__(self, "grid", grid)
        for s in self.seeds or ():
            check_int("sweep.seeds", s, low=0)

    def overrides(self) -> list[dict[str, Any]]:
        """The override mapping of every point, in run order.

        Returns
        -------
        list of dict
            Dotted key -> value, one mapping per point (grid x points x seeds).
        """
        grid = self.grid or {}
        keys = list(grid)
        from_grid = [dict(zip(keys, vals)) for vals in itertools.product(*(list(grid[k]) for k in keys))]
        explicit = [dict(p) for p in self.points] if self.points is not None else [{}]
        combos = [{**g, **p} for g in from_grid for p in explicit]
        if self.seeds is not None:
            combos = [{**c, self.seed_key: int(s)} for c in combos for s in self.seeds]
        return combos

    def configs(self) -> list[dict[str, Any]]:
        """The full configuration of every point (base with its overrides applied).

        Returns
        -------
        list of dict
            One nested configuration per point, in the order of :meth:`overrides`.
        """
        out = []
        base = dict(self.base)
        for ov in self.overrides():
            cfg = copy.deepcopy(base)   # one copy per point (not one per key: 10^5-point sweeps)
            for k, v in ov.items():
                _set_in_place(cfg, k, v if isinstance(v, _IMMUTABLE) else copy.deepcopy(v))
            out.append(cfg)
        return out

    def __len__(self) -> int:
        n = math.prod(len(list(v)) for v in (self.grid or {}).values())
        n *= len(self.points) if self.points is not None else 1
        return n * (len(self.seeds) if self.seeds is not None else 1)


def _run_chunk(fn: Callable, configs: list, batched: bool, wrap: bool = True) -> list:
    results = fn(configs) if batched else [fn(c) for c in configs]
    if len(results) != len(configs):
        raise ValueError(f"the point function returned {len(results)} results for {len(configs)} points")
    return [dict(r) for r in results] if wrap else list(results)


def _run_pickled_chunk(payload: bytes) -> bytes:
    """A chunk shipped as opaque bytes, its results returned as bytes: Dask walks list and dict
    arguments element by element looking for task keys, which for 10^5 small configurations cost
    more than the sweep itself (30 s of overhead for 50 trivial tasks of 2,000 points)."""
    import cloudpickle  # ships with distributed

    fn, chunk, batched, wrap = cloudpickle.loads(payload)
    return pickle.dumps(_run_chunk(fn, chunk, batched, wrap), protocol=pickle.HIGHEST_PROTOCOL)


def _chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def run_sweep(fn: Callable, sweep: Sweep, *, backend: str = "serial", scheduler: str | None = None,
              workers: int | None = None, chunk_size: int | None = None, batched: bool = False) -> pd.DataFrame:
    """Run ``fn`` on every configuration of ``sweep`` and gather one DataFrame.

    Parameters
    ----------
    fn : callable
        ``fn(config) -> mapping`` of results (or, with ``batched``, ``fn(list of configs) -> list
        of mappings``). Must be importable by the workers for the Dask backend.
    sweep : Sweep
        The points.
    backend : str
        ``"serial"`` or ``"dask"``.
    scheduler : str, optional
        Address of an existing Dask scheduler (default: ``$TOKENFACTORY_DASK_SCHEDULER``, else a
        ``LocalCluster`` started for this call).
    workers : int, optional
        Worker processes of the local cluster (default: the machine's cores).
    chunk_size : int, optional
        Points per task (Dask default: enough for ~4 tasks per worker, at most 2,000 points;
        serial default: all points in one chunk, which matters only with ``batched``).
    batched : bool
        Pass whole chunks to ``fn`` (default False: one configuration per call).

    Returns
    -------
    DataFrame
        One row per point, in ``sweep`` order: the override columns, then ``fn``'s results (a
        result key equal to an override key replaces it). Empty for a sweep of no points.

    Raises
    ------
    ConfigError
        For an unknown ``backend``, or (Dask backend) a negative ``workers`` or ``chunk_size``
        (0 or None means the default).
    ValueError
        When ``fn`` returns a different number of results than the chunk had points.
    """
    check_choice("sweep.backend", backend, ("serial", "dask"))
    overrides = sweep.overrides()
    configs = sweep.configs()
    if not configs:
        return pd.DataFrame()
    scheduler = scheduler or os.environ.get(SCHEDULER_ENV) or None
    if chunk_size is not None:
        check_int("sweep.chunk_size", chunk_size, low=1)
    if backend == "serial":
        size = chunk_size or len(configs)
        results = [r for ch in _chunks(configs, size) for r in _run_chunk(fn, ch, batched)]
    else:
        results = _run_dask(fn, configs, scheduler, workers, chunk_size, batched)
    rows = [{**ov, **res} for ov, res in zip(overrides, results)]
    return pd.DataFrame(rows)


def _run_dask(fn: Callable, configs: list, scheduler: str | None, workers: int | None,
              chunk_size: int | None, batched: bool, wrap: bool = True) -> list:
    import logging

    from distributed import Client, LocalCluster

    n_workers = workers or max(1, os.cpu_count() or 1)
    check_int("sweep.workers", n_workers, low=1)
    size = chunk_size or max(1, min(2000, math.ceil(len(configs) / (4 * n_workers))))
    check_int("sweep.chunk_size", size, low=1)
    chunks = _chunks(configs, size)
    cluster = None
    # a finished local cluster's shutdown chatter is not the user's business
    for name in ("distributed", "distributed.worker", "distributed.nanny", "distributed.scheduler"):
        logging.getLogger(name).setLevel(logging.ERROR)
    if scheduler:
        client = Client(scheduler)
    else:
        cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
    try:
        import cloudpickle

        payloads = [cloudpickle.dumps((fn, ch, batched, wrap)) for ch in chunks]
        futures = client.map(_run_pickled_chunk, payloads, pure=False)
        parts = [pickle.loads(b) for b in client.gather(futures)]
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    return [r for part in parts for r in part]
