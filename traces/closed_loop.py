"""Closed-loop benchmark clients: N clients, each sending its next request when the previous one
completes (how ``genai-perf`` / ``aiperf --concurrency N`` and the serving engines' benchmark
scripts drive a server).

The workload is a request table of closed sessions (``session_id`` = client, ``turn`` = its k-th
request, ``think_time_s`` = 0 after the first), which the request simulator already serves
closed-loop: a turn arrives when the previous one completes (``trace.attrs["closed_sessions"]``).
Prompts are independent (no shared prefix, no cached tokens), as the benchmarks' synthetic prompts.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tokenfactory.core.validation import check_int, check_number

__all__ = ["closed_loop_clients"]


def closed_loop_clients(clients: int, input_tokens: int, output_tokens: int, requests_per_client: int = 3,
                        start_spread_s: float = 0.0, seed: int = 0) -> pd.DataFrame:
    """The request table of ``clients`` closed-loop clients with fixed input and output lengths.

    Parameters
    ----------
    clients : int
        Concurrent clients N (>= 1): at most N requests are in the system at once.
    input_tokens, output_tokens : int
        Prompt and output tokens of every request (>= 1).
    requests_per_client : int
        Requests each client sends one after the other (>= 1; default 3).
    start_spread_s : float
        The clients' first requests arrive uniformly over [0, start_spread_s] (s, >= 0; default 0:
        all at once, as a benchmark starts), drawn from a generator seeded with ``seed``.
    seed : int
        Seed of the start times (>= 0).

    Returns
    -------
    pandas.DataFrame
        One row per request: ``arrival_s`` (the first turn's start; later turns arrive when the
        previous completes), ``input_tokens``, ``output_tokens``, ``session_id``, ``turn``,
        ``think_time_s`` (0); ``attrs["closed_sessions"] = True``.

    Raises
    ------
    ConfigError
        For a value outside its range.
    """
    check_int("clients", clients, low=1)
    check_int("input_tokens", input_tokens, low=1)
    check_int("output_tokens", output_tokens, low=1)
    check_int("requests_per_client", requests_per_client, low=1)
    check_number("start_spread_s", start_spread_s, low=0.0)
    check_int("seed", seed, low=0)
    rng = np.random.default_rng(seed)
    start = rng.uniform(0.0, start_spread_s, clients) if start_spread_s > 0 else np.zeros(clients)
    client = np.repeat(np.arange(clients), requests_per_client)
    turn = np.tile(np.arange(requests_per_client), clients)
    table = pd.DataFrame({
        "arrival_s": start[client],
        "input_tokens": np.full(client.size, input_tokens, dtype=np.int64),
        "output_tokens": np.full(client.size, output_tokens, dtype=np.int64),
        "session_id": [f"client-{c}" for c in client],
        "turn": turn,
        "think_time_s": np.zeros(client.size),
    })
    table.attrs["closed_sessions"] = True
    return table
