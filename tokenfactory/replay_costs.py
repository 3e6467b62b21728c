"""What each request of a trace costs the cluster, and what each pool serves of them.

:func:`request_costs` is a request's own service (fill-worker seconds, its fill and decode alone on
an empty cluster, its KV transfer), as the request simulator computes it; :func:`service_capacity`
the requests/s each pool serves of the stream from their mean own cost; :func:`infeasible` the
requests that miss their class's SLO whatever the policy. :class:`tokenfactory.replay.ReplaySetup`
computes them once per trace.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tokenfactory.core.classes import DEFAULT_CLASSES, class_table
from tokenfactory.plant_models.des import DESParams

__all__ = ["request_costs", "service_capacity", "infeasible"]


def request_costs(trace: pd.DataFrame, params: DESParams) -> pd.DataFrame:
    """Each request's own service cost, as the request simulator computes it (its prefix as the
    trace's ``cached_tokens`` say).

    Parameters
    ----------
    trace : DataFrame
        A request table (``cached_tokens`` and ``request_class`` optional).
    params : DESParams
        The request simulator's parameters.

    Returns
    -------
    DataFrame
        One row per request: ``new_tokens``, ``cached_tokens``, ``output_tokens``,
        ``request_class``; ``fill_s`` - fill-worker seconds it takes from full steps
        (:meth:`DESParams.fill_seconds`, the throughput share); ``solo_fill_s`` - its chunked fill
        alone on a worker (:meth:`DESParams.request_fill_s`, its TTFT on an empty cluster);
        ``kv_transfer_s``; ``decode_passes`` - output tokens after the first (the first comes
        from fill); ``decode_context`` - its mean context while decoding (input + half its
        output); ``solo_tpot_s`` - its TPOT alone on a decode worker: (transfer + passes at batch
        1 and its context) / passes.
    """
    inp = np.maximum(trace["input_tokens"].to_numpy(dtype=float), 1.0)
    cached = np.minimum(trace["cached_tokens"].to_numpy(dtype=float), inp) if "cached_tokens" in trace \
        else np.zeros(len(inp))
    new = np.maximum(inp - cached, 1.0)
    out = np.maximum(trace["output_tokens"].to_numpy(dtype=float), 1.0)
    passes = out - 1.0
    ctx = inp + out / 2.0
    xfer = params.kv_bytes(inp) / params.kv_link_bandwidth + params.kv_setup_s
    solo_fill = np.fromiter((params.request_fill_s(n, c) for n, c in zip(new, cached)), float, len(new))
    pass1 = np.fromiter((params.decode_pass(1, c)[0] for c in ctx), float, len(ctx))
    cls = trace["request_class"].astype(str).to_numpy() if "request_class" in trace else np.full(len(inp), "")
    return pd.DataFrame({"new_tokens": new, "cached_tokens": cached, "output_tokens": out, "request_class": cls,
                         "fill_s": params.fill_seconds(new, cached), "solo_fill_s": solo_fill, "kv_transfer_s": xfer,
                         "decode_passes": passes, "decode_context": ctx,
                         "solo_tpot_s": (xfer + passes * pass1) / np.maximum(passes, 1.0)}, index=trace.index)


def service_capacity(costs: pd.DataFrame, params: DESParams, fill_workers: int, decode_workers: int,
                     batch_cap: float) -> dict[str, float]:
    """Requests/s each pool serves of a stream of these requests, from their mean own cost (not
    the cost of the mean request: a long prompt's attention grows with its length, so the mean of
    the costs is what a pool spends): fill, workers over the mean fill-worker seconds per request;
    decode, ``batch_cap`` slots per worker over the mean slot time per request, its decode passes
    at the pass time of a full batch at the token-weighted mean context (the context a decoding
    sequence holds, averaged over the passes).

    Parameters
    ----------
    costs : DataFrame
        :func:`request_costs`.
    params : DESParams
        The request simulator's parameters (the decode pass table).
    fill_workers, decode_workers : int
        Pool sizes.
    batch_cap : float
        Sequences per decode worker.

    Returns
    -------
    dict
        ``{"fill": requests/s, "decode": requests/s}``.
    """
    passes = costs["decode_passes"].to_numpy()
    weight = max(float(passes.sum()), 1e-9)
    ctx = float((passes * costs["decode_context"].to_numpy()).sum() / weight) if passes.sum() > 0 \
        else float(costs["decode_context"].mean())
    pass_s = params.decode_pass(int(batch_cap), ctx)[0]
    slot_s = max(float(passes.mean()), 1e-9) * pass_s
    return {"fill": fill_workers / float(costs["fill_s"].mean()), "decode": decode_workers * batch_cap / slot_s}


def infeasible(costs: pd.DataFrame, classes=None) -> pd.DataFrame:
    """Which requests miss their class's SLO whatever the policy: their own fill alone on an
    empty cluster is past the TTFT SLO, or their own decode alone (transfer and batch-1 passes)
    past the TPOT SLO.

    Parameters
    ----------
    costs : DataFrame
        :func:`request_costs`.
    classes : iterable of RequestClass, optional
        The SLOs (default :data:`tokenfactory.core.classes.DEFAULT_CLASSES`; a request of a class not
        among them gets the first class's).

    Returns
    -------
    DataFrame
        Boolean columns ``ttft``, ``tpot`` and ``any``, one row per request.
    """
    table = class_table(DEFAULT_CLASSES if classes is None else classes)
    first = next(iter(table.values()))
    cls = costs["request_class"].map(lambda c: table.get(c, first))
    ttft = costs["solo_fill_s"].to_numpy() > cls.map(lambda c: c.slo_ttft_s).to_numpy(dtype=float)
    tpot = costs["solo_tpot_s"].to_numpy() > cls.map(lambda c: c.slo_tpot_s).to_numpy(dtype=float)
    return pd.DataFrame({"ttft": ttft, "tpot": tpot, "any": ttft | tpot}, index=costs.index)
