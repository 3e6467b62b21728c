"""The two table formats every trace becomes.

**Request table** (one row per LLM call, sorted by arrival), a pandas DataFrame:

| column | type | meaning |
|---|---|---|
| ``arrival_s`` | float | seconds since the trace's first arrival (>= 0, non-decreasing) |
| ``input_tokens`` | int | prompt tokens, including any cached prefix (>= 0) |
| ``cached_tokens`` | int | leading prompt tokens whose KV could be reused (0 when unknown) |
| ``output_tokens`` | int | generated tokens (>= 0) |
| ``session_id`` | str | conversation/session ("" when the trace has none) |
| ``turn`` | int | index of the call within its session (0 when the trace has none) |
| ``think_time_s`` | float | gap before this call in its session (NaN when unknown) |
| ``request_class`` | str | the request's class (:mod:`tokenfactory.core.classes`): from the data where the trace has one, else drawn from the documented mix (:mod:`tokenfactory.traces.class_assignment`) |

Extra columns a loader may add: ``hash_ids`` (Mooncake's chained 512-token prefix-block ids).

**Rate series** (demand per interval), a pandas DataFrame indexed by ``time_s`` (window start,
seconds since the series' start, regular spacing) with column ``rate_rps`` (requests/s; NaN for
missing windows - a collection gap is missing data, not zero demand) and optional
``active_clients`` and ``idc`` (index of dispersion of counts within the window).

``df.attrs`` carries ``name``, ``kind`` ("requests" or "rates"), ``source`` and, for rate series,
``interval_s``.
"""

from __future__ import annotations

__all__ = ["REQUEST_COLUMNS", "RATE_COLUMNS", "REQUIRED_REQUEST_COLUMNS", "REQUIRED_RATE_COLUMNS"]

REQUEST_COLUMNS = ("arrival_s", "input_tokens", "cached_tokens", "output_tokens", "session_id", "turn",
                   "think_time_s", "request_class")
REQUIRED_REQUEST_COLUMNS = ("arrival_s", "input_tokens", "output_tokens")
RATE_COLUMNS = ("rate_rps", "active_clients", "idc")
REQUIRED_RATE_COLUMNS = ("rate_rps",)
