"""What an output token is worth at the speed its user sees it (article sections 16 and 20).

"Interactive tokens may be more valuable than batch-delayed tokens" (section 16), and revenue can
fall when spare memory is filled with "large, slow, high-throughput but lower-value batches"
(section 20). :class:`TokenValue` makes that a price curve over the user's decode speed
(1 / TPOT): the full interactive price at or above ``interactive_tps`` tokens/s per user, the
batch price at ``batch_tps``, linear in between, and from there linearly down to nothing at the
TPOT SLO - a token a user waits longer for is worth less, and one past the SLO is worth nothing.

Default prices are stated, sourced assumptions: USD 2.19 per million output tokens is
DeepSeek-R1's list price (DeepSeek open-infra-index, day 6 of Open Source Week, 2025-03-01) and
the batch price is half of it, the discount of the batch APIs (OpenAI Batch API: 50 % off;
DeepSeek's off-peak discount on V3: 50 %). The speed thresholds are assumptions: 30 tokens/s per
user for interactive use (above DeepSeek's reported 20-22 tokens/s average), 10 tokens/s for
batch, and a 0.5 s TPOT SLO (2 tokens/s).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from tokenfactory.core.validation import ConfigError, check_number

__all__ = ["TokenValue", "batch_grid", "decode_value_sweep", "best_decode_batch"]


@dataclass(frozen=True)
class TokenValue:
    """Price of one output token (USD) as a function of TPOT.

    Parameters
    ----------
    interactive_price_per_mtok : float
        USD per million output tokens at or above ``interactive_tps`` (default 2.19).
    batch_price_per_mtok : float
        USD per million output tokens at ``batch_tps`` (default 1.095; at most the interactive price).
    interactive_tps : float
        User-visible tokens/s from which the full price is paid (> 0, default 30).
    batch_tps : float
        Tokens/s at which the batch price is paid (0 < batch_tps <= interactive_tps, default 10).
    slo_tpot_s : float
        TPOT SLO (s, > 0, default 0.5): at or past it a token is worth nothing.
    """

    interactive_price_per_mtok: float = 2.19
    batch_price_per_mtok: float = 1.095
    interactive_tps: float = 30.0
    batch_tps: float = 10.0
    slo_tpot_s: float = 0.5

    def __post_init__(self) -> None:
        for f in ("interactive_price_per_mtok", "batch_price_per_mtok"):
            check_number(f"token_value.{f}", getattr(self, f), low=0.0)
        check_number("token_value.interactive_tps", self.interactive_tps, low=0.0, low_inclusive=False)
        check_number("token_value.batch_tps", self.batch_tps, low=0.0, high=self.interactive_tps,
                      low_inclusive=False)
        check_number("token_value.slo_tpot_s", self.slo_tpot_s, low=0.0, low_inclusive=False)
        if self.batch_price_per_mtok > self.interactive_price_per_mtok:
            raise ConfigError("token_value.batch_price_per_mtok",
                              f"{self.batch_price_per_mtok} exceeds the interactive price "
                              f"{self.interactive_price_per_mtok}; allowed range is "
                              f"[0, {self.interactive_price_per_mtok}]")

    @classmethod
    def from_dict(cls, d: dict | None) -> "TokenValue":
        from tokenfactory.core.validation import reject_unknown_keys

        d = dict(d or {})
        reject_unknown_keys("token_value", d, set(asdict(cls())))
        return cls(**d)

    def price_per_token(self, tpot_s):
        """USD per output token at ``tpot_s`` (scalar or array); 0 at and past the SLO."""
        tpot = np.asarray(tpot_s, dtype=float)
        tps = 1.0 / tpot
        slo_tps = 1.0 / self.slo_tpot_s
        # piecewise linear in the user's speed through (slo, 0), (batch, batch price), (interactive, full)
        xs = [slo_tps, self.batch_tps, self.interactive_tps]
        ys = [0.0, self.batch_price_per_mtok, self.interactive_price_per_mtok]
        if self.batch_tps <= slo_tps:  # an SLO looser than batch speed: no decline segment
            xs, ys = xs[1:], ys[1:]
        price = np.interp(tps, xs, ys, left=0.0 if len(xs) == 3 else ys[0], right=ys[-1]) / 1e6
        out = np.where(tpot < self.slo_tpot_s, price, 0.0)
        return float(out) if out.ndim == 0 else out

    def value_per_s(self, tokens_per_s, tpot_s):
        """Revenue rate (USD/s) of serving ``tokens_per_s`` output tokens at ``tpot_s``."""
        return np.asarray(tokens_per_s, dtype=float) * self.price_per_token(tpot_s)

    def to_dict(self) -> dict:
        return asdict(self)


def batch_grid(slots: int, ratio: float = 1.15) -> np.ndarray:
    """Every batch up to 16, then a geometric grid (``ratio``) up to and including ``slots``.

    Parameters
    ----------
    slots : int
        Largest batch (the KV-limited decode slots); an empty grid when < 1.
    ratio : float
        Step of the geometric part (> 1, default 1.15).

    Returns
    -------
    numpy.ndarray
        Sorted distinct integer batches.
    """
    if slots < 1:
        return np.array([], dtype=int)
    geo = np.unique(np.round(16 * ratio ** np.arange(0, np.log(max(slots, 16) / 16) / np.log(ratio) + 1)))
    grid = np.unique(np.concatenate([np.arange(1, min(slots, 16) + 1), geo, [slots]]).astype(int))
    return grid[grid <= slots]


def decode_value_sweep(worker, context_tokens: float, value: TokenValue,
                       batches=None) -> "pd.DataFrame":
    """Decode TPOT, throughput and revenue of ``worker`` over batch sizes at ``context_tokens``
    (default batches: :func:`batch_grid` up to the KV-limited slots). Per-GPU columns; revenue
    in USD per GPU-hour.

    Parameters
    ----------
    worker : Worker
        The decode worker.
    context_tokens : float
        Context of every sequence (tokens).
    value : TokenValue
        The price curve.
    batches : iterable of int, optional
        Batches to time; those outside [1, slots] are skipped.

    Returns
    -------
    pandas.DataFrame
        One row per batch (empty when no sequence fits).
    """
    import pandas as pd

    slots = worker.decode_slots(context_tokens)
    grid = batch_grid(slots) if batches is None else [b for b in batches if 1 <= b <= slots]
    rows = []
    for b in grid:
        r = worker.decode(int(b), context_tokens)
        tps = r.tokens_per_s_per_gpu
        rows.append({"batch": int(b), "batch_per_attention_replica": b / worker.parallelism.dp_attention,
                     "tpot_s": r.time_s, "tokens_per_s_per_gpu": tps,
                     "price_per_mtok": 1e6 * value.price_per_token(r.time_s),
                     "revenue_per_gpu_hour": 3600.0 * float(value.value_per_s(tps, r.time_s)),
                     "decode_slots": slots})
    return pd.DataFrame(rows)


def best_decode_batch(worker, context_tokens: float, value: TokenValue, batches=None) -> dict:
    """The batch that maximises revenue and the one that maximises raw tokens/s, with their
    TPOT, throughput and revenue (``None`` entries when no sequence fits).

    Parameters
    ----------
    worker : Worker
        The decode worker.
    context_tokens : float
        Context of every sequence (tokens).
    value : TokenValue
        The price curve.
    batches : iterable of int, optional
        Batches to consider (default :func:`batch_grid`).

    Returns
    -------
    dict
    """
    df = decode_value_sweep(worker, context_tokens, value, batches)
    if df.empty:
        return {"decode_slots": 0, "value_batch": None, "throughput_batch": None}
    v = df.loc[df["revenue_per_gpu_hour"].idxmax()]
    t = df.loc[df["tokens_per_s_per_gpu"].idxmax()]
    return {"decode_slots": int(df["decode_slots"].iloc[0]),
            "value_batch": int(v["batch"]), "value_tpot_s": float(v["tpot_s"]),
            "value_tokens_per_s_per_gpu": float(v["tokens_per_s_per_gpu"]),
            "value_revenue_per_gpu_hour": float(v["revenue_per_gpu_hour"]),
            "throughput_batch": int(t["batch"]), "throughput_tpot_s": float(t["tpot_s"]),
            "throughput_tokens_per_s_per_gpu": float(t["tokens_per_s_per_gpu"]),
            "throughput_revenue_per_gpu_hour": float(t["revenue_per_gpu_hour"])}
