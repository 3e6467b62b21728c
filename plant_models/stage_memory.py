"""Stage memory and the KV crossover of pipeline depth (article section 14).

    M_stage ~ W/P + M_KV,stage + M_working + M_slack

Pipelining divides weights by P, but a full pipeline keeps P streams in flight and each stage holds
1/P of each stream's per-layer KV, so M_KV,stage does not shrink with P. Once W/P falls to the
order of the KV and working memory, deeper pipelines add latency and coordination, not capacity:
that depth is the KV crossover.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from tokenfactory.core.validation import ConfigError, check_int, check_number

__all__ = ["StageMemory", "stage_memory", "kv_crossover_depth", "stage_memory_sweep"]


@dataclass(frozen=True)
class StageMemory:
    """Bytes of one pipeline stage, by part (article section 14); built by :func:`stage_memory`.

    Parameters
    ----------
    pipeline_depth : int
        Pipeline stages P the model is split into (>= 1).
    weights : float
        Weight bytes held by the stage, W / P.
    kv : float
        KV bytes held by the stage (doubled when double-buffered); does not shrink with P.
    working : float
        Working memory (activations, buffers) of the stage (bytes).
    slack : float
        Allowance for fragmentation and headroom (bytes).
    """

    pipeline_depth: int
    weights: float
    kv: float
    working: float
    slack: float

    @property
    def total(self) -> float:
        """M_stage: the sum of the parts (bytes)."""
        return self.weights + self.kv + self.working + self.slack

    def to_dict(self) -> dict:
        """The parts and ``total`` as a plain dict (bytes)."""
        return {**asdict(self), "total": self.total}


def stage_memory(weight_bytes: float, pipeline_depth: int, active_context_tokens: float,
                 kv_bytes_per_token: float, *, double_buffer: bool = True,
                 working_bytes: float = 0.0, slack_fraction: float = 0.0) -> StageMemory:
    """M_stage for a model of ``weight_bytes`` split into ``pipeline_depth`` stages.

    ``active_context_tokens`` is the aggregate active context assigned to the stage and
    ``kv_bytes_per_token`` the whole-model KV per token; double buffering (one working set moving
    while another runs) doubles the KV allowance. ``slack_fraction`` of the subtotal is added for
    fragmentation and headroom.

    Parameters
    ----------
    weight_bytes : float
        Whole-model weight bytes W (>= 0), e.g. :attr:`MoEModel.weight_bytes`.
    pipeline_depth : int
        Pipeline stages P (>= 1).
    active_context_tokens : float
        Aggregate active context assigned to the stage (tokens, >= 0): sequences in flight x
        their context.
    kv_bytes_per_token : float
        Whole-model KV bytes per cached token (>= 0), e.g. :attr:`MoEModel.kv_bytes_per_token`.
    double_buffer : bool
        Double the KV allowance for one working set moving while another runs (default True).
    working_bytes : float
        Working memory per stage (bytes, >= 0; default 0).
    slack_fraction : float
        Fraction of the subtotal added as slack, in [0, 1] (default 0).

    Returns
    -------
    StageMemory
        The stage's bytes by part.

    Raises
    ------
    ConfigError
        For a value outside its range (the field is the parameter's name).
    """
    check_number("weight_bytes", weight_bytes, low=0.0)
    check_int("pipeline_depth", pipeline_depth, low=1)
    check_number("active_context_tokens", active_context_tokens, low=0.0)
    check_number("kv_bytes_per_token", kv_bytes_per_token, low=0.0)
    check_number("working_bytes", working_bytes, low=0.0)
    check_number("slack_fraction", slack_fraction, low=0.0, high=1.0)
    kv = active_context_tokens * kv_bytes_per_token * (2.0 if double_buffer else 1.0)
    weights = weight_bytes / pipeline_depth
    slack = slack_fraction * (weights + kv + working_bytes)
    return StageMemory(pipeline_depth, weights, kv, working_bytes, slack)


def kv_crossover_depth(weight_bytes: float, active_context_tokens: float, kv_bytes_per_token: float,
                       *, double_buffer: bool = True, working_bytes: float = 0.0) -> int:
    """Smallest pipeline depth P at which W/P no longer exceeds M_KV,stage + M_working.

    Beyond this depth a deeper pipeline adds latency and coordination, not capacity (article
    section 14).

    Parameters
    ----------
    weight_bytes : float
        Whole-model weight bytes W (>= 0).
    active_context_tokens : float
        Aggregate active context per stage (tokens, >= 0).
    kv_bytes_per_token : float
        Whole-model KV bytes per cached token (>= 0).
    double_buffer : bool
        Double the KV allowance (default True).
    working_bytes : float
        Working memory per stage (bytes, >= 0; default 0).

    Returns
    -------
    int
        ceil(W / (M_KV,stage + M_working)), at least 1.

    Raises
    ------
    ConfigError
        For a value outside its range.
        When KV and working memory are both zero (the weights never cross over: there is no
        crossover depth).
    """
    base = stage_memory(weight_bytes, 1, active_context_tokens, kv_bytes_per_token,
                        double_buffer=double_buffer, working_bytes=working_bytes)
    floor = base.kv + base.working
    if floor <= 0:
        raise ConfigError("kv_bytes_per_token", "KV and working memory are both zero: the weights never cross "
                          "over (give kv_bytes_per_token > 0 or working_bytes > 0)")
    return max(1, int(np.ceil(weight_bytes / floor)))


def stage_memory_sweep(weight_bytes: float, active_context_tokens: float, kv_bytes_per_token: float,
                       depths=range(1, 17), **kw) -> pd.DataFrame:
    """Stage memory by part over pipeline depths; one row per depth.

    Parameters
    ----------
    weight_bytes : float
        Whole-model weight bytes W (>= 0).
    active_context_tokens : float
        Aggregate active context per stage (tokens, >= 0).
    kv_bytes_per_token : float
        Whole-model KV bytes per cached token (>= 0).
    depths : iterable of int
        Pipeline depths to evaluate (each >= 1; default 1 to 16).
    **kw
        ``double_buffer``, ``working_bytes``, ``slack_fraction`` as in :func:`stage_memory`.

    Returns
    -------
    pandas.DataFrame
        One row per depth: ``pipeline_depth``, ``weights``, ``kv``, ``working``, ``slack``,
        ``total`` (bytes).

    Raises
    ------
    ConfigError
        For a value outside its range.
    """
    return pd.DataFrame([stage_memory(weight_bytes, p, active_context_tokens, kv_bytes_per_token,
                                      **kw).to_dict() for p in depths])
