"""NVIDIA Dynamo's own simulator (``dynamo.replay``, its Rust mocker) on the service model's pass
times, next to the request simulator on the same arrivals and pools.

* :func:`mocker_profile` writes the service model's pass times as a mocker profile (the NPZ the
  mocker's ``planner_profile_data`` reads: prefill TTFT over ISL, decode ITL over active KV tokens x
  context length; ``dynamo/mocker/utils/planner_profiler_perf_data_converter.py`` documents it);
* :func:`mocker_engine_args` describes one engine as the mocker's ``MockEngineArgs`` (block size,
  KV blocks from the decode slots x context, max sequences, batched tokens, the profile);
* :func:`cross_simulate` replays one request table through both (Dynamo's ``run_trace_replay``
  from a Mooncake-format file with unique block hashes - no prefix reuse - and
  :func:`tokenfactory.plant_models.des.simulate`), timing each, and returns a
  :class:`CrossSimResult` (TTFT and ITL/TPOT quantiles per simulator, wall time, simulated requests
  per wall-second) with ``to_pandas()``.

The mocker's ITL is a token's gap; the request simulator's TPOT is a request's mean gap after its
first token; their medians coincide when gaps are steady. ``dynamo`` is the project's ``dynamo``
extra, imported inside the functions.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from tokenfactory.core.validation import ConfigError, check_int

__all__ = ["mocker_profile", "mocker_engine_args", "write_mooncake_trace", "cross_simulate", "CrossSimResult",
           "MOCKER_BLOCK_SIZE"]

#: KV block of the mocker's engines (tokens; vLLM's default 16 would make 10^5-block caches)
MOCKER_BLOCK_SIZE = 64


def mocker_profile(service, path, *, isl_points: int = 64, kv_points: int = 48, context_points: int = 32) -> Path:
    """Write ``service``'s pass times as a mocker profile (NPZ).

    Parameters
    ----------
    service : ServiceModel
        The pass times: ``fill_step_s(tokens)`` for prefill (whole steps past the token budget),
        ``decode_pass_s(batch, context)`` for decode.
    path : str or Path
        Where to write (``.npz``).
    isl_points, kv_points, context_points : int
        Grid sizes (>= 2) over 1..4 fill steps of tokens, up to the decode KV capacity, and up to
        twice the nominal context.

    Returns
    -------
    Path
    """
    for f, v in (("isl_points", isl_points), ("kv_points", kv_points), ("context_points", context_points)):
        check_int(f"mocker_profile.{f}", v, low=2)
    budget = float(service.fill_token_budget)
    isl = np.linspace(16.0, 4 * budget, isl_points)
    # the mocker times a prefill step by the step's total tokens in this table, so its entries are
    # the service model's step times (a prompt over the budget takes whole steps); a lone prompt's
    # TTFT (request_fill_s, chunked per DP replica) would make batched steps many times too slow
    ttft_ms = np.array([1000.0 * sum(service.fill_step_s(min(budget, x - k * budget))
                                     for k in range(int(math.ceil(x / budget)))) for x in isl])
    kv_cap = float(service.decode_slots) * float(service.decode_context_tokens)
    # log-spaced from half a nominal context: small batches are where ITL moves most
    kv = np.geomspace(0.5 * float(service.decode_context_tokens), kv_cap, kv_points)
    ctx = np.linspace(64.0, 2.0 * float(service.decode_context_tokens), context_points)
    itl_ms = np.array([[1000.0 * service.decode_pass_s(max(k / c, 1.0), c) for c in ctx] for k in kv])
    path = Path(path)
    np.savez(path, prefill_isl=isl, prefill_ttft_ms=ttft_ms, decode_active_kv_tokens=kv, decode_context_length=ctx,
             decode_itl=itl_ms)
    return path


def mocker_engine_args(service, profile: Path, role: str):
    """The mocker's ``MockEngineArgs`` for one fill (``role="prefill"``) or decode engine.

    Parameters
    ----------
    service : ServiceModel
        Decode slots, context and the fill step's token budget.
    profile : Path
        From :func:`mocker_profile`.
    role : str
        ``"prefill"`` or ``"decode"``.

    Returns
    -------
    dynamo._core.MockEngineArgs
    """
    from dynamo._core import MockEngineArgs

    if role not in ("prefill", "decode"):
        raise ConfigError("mocker.role", f"{role!r} is not one of 'prefill', 'decode'")
    blocks = int(float(service.decode_slots) * float(service.decode_context_tokens) / MOCKER_BLOCK_SIZE)
    raw = {"planner_profile_data": str(profile), "block_size": MOCKER_BLOCK_SIZE, "num_gpu_blocks": blocks,
           "max_num_seqs": int(service.decode_slots), "max_num_batched_tokens": int(service.fill_token_budget),
           "enable_prefix_caching": False, f"is_{role}": True}
    return MockEngineArgs.from_json(json.dumps(raw))


def write_mooncake_trace(trace: pd.DataFrame, path) -> Path:
    """A request table as a Mooncake-format JSONL trace (ms timestamps, unique block hashes).

    Parameters
    ----------
    trace : DataFrame
        ``arrival_s``, ``input_tokens``, ``output_tokens``.
    path : str or Path
        Where to write.

    Returns
    -------
    Path
    """
    path = Path(path)
    next_hash = 0
    with path.open("w") as f:
        for t, i, o in zip(trace["arrival_s"].to_numpy(), trace["input_tokens"].to_numpy(),
                           trace["output_tokens"].to_numpy()):
            n = int(math.ceil(int(i) / MOCKER_BLOCK_SIZE))
            f.write(json.dumps({"timestamp": float(t) * 1000.0, "input_length": int(i), "output_length": int(o),
                                "hash_ids": list(range(next_hash, next_hash + n))}) + "\n")
            next_hash += n
    return path


@dataclass(frozen=True)
class CrossSimResult:
    """Both simulators on one trace and pools.

    Parameters
    ----------
    rows : dict
        Per simulator (``"dynamo-replay"``, ``"tokenfactory-des"``): requests, TTFT p50/p90 and
        ITL p50/p90 (ms; the request simulator's TPOT as its ITL), wall seconds, simulated requests
        per wall-second.
    config : dict
        Trace size, pools, service model, package versions.
    """

    rows: dict
    config: dict = field(default_factory=dict)

    def to_pandas(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows).T

    def median_gaps(self) -> dict:
        """Relative difference of ours from Dynamo's in the TTFT and ITL medians."""
        d, o = self.rows["dynamo-replay"], self.rows["tokenfactory-des"]
        return {k: (o[k] - d[k]) / d[k] if d[k] else math.nan for k in ("ttft_p50_ms", "itl_p50_ms")}

    @property
    def speed_ratio(self) -> float:
        """Our simulated requests per wall-second over Dynamo's replay's, same run."""
        return self.rows["tokenfactory-des"]["sim_requests_per_wall_s"] / self.rows["dynamo-replay"][
            "sim_requests_per_wall_s"]


def cross_simulate(trace: pd.DataFrame, service, fill_workers: int, decode_workers: int, *,
                   seed: int = 0) -> CrossSimResult:
    """Replay ``trace`` through Dynamo's replay and the request simulator with the same pools and
    the same pass times (no admission control, no autoscaling, no prefix reuse).

    Parameters
    ----------
    trace : DataFrame
        The request table (``arrival_s``, ``input_tokens``, ``output_tokens``; ``cached_tokens``
        are ignored by both).
    service : ServiceModel
        The pass times (Dynamo's side gets them as a mocker profile).
    fill_workers, decode_workers : int
        Pools (>= 1).
    seed : int
        The request simulator's seed.

    Returns
    -------
    CrossSimResult
    """
    from importlib.metadata import version

    from tokenfactory.plant_models.des import ClusterConfig, DESParams, simulate

    os.environ.setdefault("DYN_LOG", "error")
    from dynamo.replay import run_trace_replay

    check_int("cross.fill_workers", fill_workers, low=1)
    check_int("cross.decode_workers", decode_workers, low=1)
    rows = {}
    with tempfile.TemporaryDirectory() as d:
        prof = mocker_profile(service, Path(d) / "profile.npz")
        tr = write_mooncake_trace(trace, Path(d) / "trace.jsonl")
        pre, dec = mocker_engine_args(service, prof, "prefill"), mocker_engine_args(service, prof, "decode")
        t0 = time.perf_counter()
        rep = run_trace_replay(str(tr), prefill_engine_args=pre, decode_engine_args=dec,
                               num_prefill_workers=fill_workers, num_decode_workers=decode_workers,
                               trace_block_size=MOCKER_BLOCK_SIZE)
        wall = time.perf_counter() - t0
    n = int(rep["num_requests"])
    rows["dynamo-replay"] = {"requests": n, "completed": int(rep["completed_requests"]),
                             "ttft_p50_ms": rep["median_ttft_ms"], "ttft_p90_ms": rep["p90_ttft_ms"],
                             "itl_p50_ms": rep["median_itl_ms"], "itl_p90_ms": rep["p90_itl_ms"],
                             "tpot_p50_ms": rep["median_tpot_ms"], "wall_seconds": wall,
                             "sim_requests_per_wall_s": n / wall}
    params = DESParams.from_service(service)
    cl = ClusterConfig(fill_workers=fill_workers, decode_workers=decode_workers, seed=seed, progress=False)
    t0 = time.perf_counter()
    res = simulate(trace, params, cl)
    wall = time.perf_counter() - t0
    rec = res.records
    done = rec[np.isfinite(rec["ttft_s"])]
    rows["tokenfactory-des"] = {"requests": int(res.metrics["requests"]), "completed": int(res.metrics["completed"]),
                                "ttft_p50_ms": 1000 * float(done["ttft_s"].median()),
                                "ttft_p90_ms": 1000 * float(done["ttft_s"].quantile(0.9)),
                                "itl_p50_ms": 1000 * float(done["tpot_s"].median()),
                                "itl_p90_ms": 1000 * float(done["tpot_s"].quantile(0.9)),
                                "tpot_p50_ms": 1000 * float(done["tpot_s"].median()), "wall_seconds": wall,
                                "sim_requests_per_wall_s": res.metrics["requests"] / wall}
    config = {"requests": len(trace), "fill_workers": fill_workers, "decode_workers": decode_workers,
              "service": service.summary(), "ai-dynamo": version("ai-dynamo"),
              "mocker_block_size": MOCKER_BLOCK_SIZE}
    return CrossSimResult(rows, config)
