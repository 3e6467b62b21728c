"""Request classes in a request table: the ``request_class`` column.

Loaders keep a class the data gives (the agentic-coding trace: streaming calls are interactive,
non-streaming ones batch) and otherwise draw one per request from the documented mix
(:data:`tokenfactory.core.classes.DEFAULT_CLASS_MIX`) with a generator seeded from the trace's name,
so a trace always gets the same classes.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

import numpy as np
import pandas as pd

from tokenfactory.core.classes import DEFAULT_CLASS_MIX
from tokenfactory.core.validation import ConfigError, check_number

__all__ = ["assign_classes", "class_seed", "class_counts"]


def class_seed(name: str) -> int:
    """The seed of a trace's class draw: CRC-32 of its name (stable across runs and machines).

    Parameters
    ----------
    name : str
        The trace's name (``attrs["name"]``).

    Returns
    -------
    int
        A seed in [0, 2^32).
    """
    return zlib.crc32(str(name).encode())


def assign_classes(trace: pd.DataFrame, mix: Mapping[str, float] | None = None, seed: int = 0,
                   *, overwrite: bool = False) -> pd.DataFrame:
    """Give every request without a class one drawn from ``mix``.

    Parameters
    ----------
    trace : DataFrame
        A request table; an existing ``request_class`` column is kept where non-empty unless
        ``overwrite``.
    mix : mapping, optional
        Class name -> share (> 0; normalised to sum 1). Default
        :data:`tokenfactory.core.classes.DEFAULT_CLASS_MIX`.
    seed : int
        Seed of the draw (default 0).
    overwrite : bool
        Draw for every request, replacing given classes (default False).

    Returns
    -------
    DataFrame
        A copy with ``request_class`` (str) filled; same ``attrs`` plus ``class_mix`` (the mix
        used, when any request was drawn) and ``class_seed``.

    Raises
    ------
    ConfigError
        For an empty mix or a share <= 0.
    """
    mix = dict(DEFAULT_CLASS_MIX if mix is None else mix)
    if not mix:
        raise ConfigError("class_mix", "needs at least one class")
    for k, v in mix.items():
        check_number(f"class_mix.{k}", v, low=0.0, low_inclusive=False)
    out = trace.copy()
    given = (out["request_class"].fillna("").astype(str) if "request_class" in out
             else pd.Series("", index=out.index))
    todo = np.ones(len(out), dtype=bool) if overwrite else (given == "").to_numpy()
    names = list(mix)
    p = np.array([mix[k] for k in names], dtype=float)
    rng = np.random.default_rng(seed)
    drawn = np.asarray(names, dtype=object)[rng.choice(len(names), size=len(out), p=p / p.sum())]
    cls = np.where(todo, drawn, given.to_numpy(dtype=object))
    out["request_class"] = pd.Series(cls, index=out.index, dtype=object).astype(str)
    out.attrs = dict(trace.attrs)
    if todo.any():
        out.attrs["class_mix"] = {k: float(v) for k, v in mix.items()}
        out.attrs["class_seed"] = int(seed)
    return out


def class_counts(trace: pd.DataFrame) -> dict[str, int]:
    """Requests per class (an empty dict without a ``request_class`` column).

    Parameters
    ----------
    trace : DataFrame
        A request table.

    Returns
    -------
    dict
        Class name -> requests.
    """
    if "request_class" not in trace:
        return {}
    return {str(k): int(v) for k, v in trace["request_class"].value_counts().sort_index().items()}
