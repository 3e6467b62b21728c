"""What passes do to the hardware: FLOPs and HBM bytes, for compute and bandwidth utilisation.

Every fill step, decode pass and mixed (aggregated) pass of the request simulator adds its
seconds, FLOPs and HBM bytes to its pool's ledger; the run's metrics divide them by the pool's
worker-seconds. What a pool could not use of its compute or its memory bandwidth is the stranded
capacity of the article's section 19: fill passes are compute-bound and leave bandwidth idle,
decode passes the reverse, an aggregated worker mixes both in one pass. Utilisation is reported
against the attainable rates (peak x the fitted system efficiency, :class:`~tokenfactory.
plant_models.roofline.Efficiency`), so a fully busy roofline roof is 1.

FLOPs and bytes are sampled from the roofline on the same grids as the pass times
(:class:`~tokenfactory.plant_models.des.params.DESParams`) and interpolated the same way; both
are affine in context at a batch, so a decode leap's work is the pass at its mean context times
its passes.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

__all__ = ["PassWork", "WorkLedger", "interp1", "bilinear", "trilinear"]


def _cell(xs, x) -> tuple[int, float]:
    """Lower grid index and weight of ``x`` (clamped into the grid; extrapolates linearly past it)."""
    n = len(xs)
    if n == 1:
        return 0, 0.0
    i = min(max(bisect_right(xs, x) - 1, 0), n - 2)
    return i, (x - xs[i]) / (xs[i + 1] - xs[i])


def interp1(xs, ys, x: float) -> float:
    """Piecewise-linear ``ys(x)``, extended linearly past the grid's ends.

    Parameters
    ----------
    xs, ys : sequence of float
        Increasing grid and values.
    x : float
        Where to evaluate.

    Returns
    -------
    float
    """
    i, u = _cell(xs, x)
    if len(xs) == 1:
        return ys[0]
    return ys[i] + u * (ys[i + 1] - ys[i])


def bilinear(xs, ys, table, x: float, y: float) -> float:
    """Bilinear ``table[i][j]`` at ``(x, y)`` on grids ``xs`` x ``ys`` (linear past the ends).

    Parameters
    ----------
    xs, ys : sequence of float
        Increasing grids (rows, columns).
    table : sequence of sequence of float
        Values by row and column.
    x, y : float
        Where to evaluate.

    Returns
    -------
    float
    """
    i, u = _cell(xs, x)
    j, v = _cell(ys, y)
    r0 = table[i]
    lo = r0[j] + v * (r0[j + 1] - r0[j]) if len(ys) > 1 else r0[0]
    if len(xs) == 1:
        return lo
    r1 = table[i + 1]
    hi = r1[j] + v * (r1[j + 1] - r1[j]) if len(ys) > 1 else r1[0]
    return lo + u * (hi - lo)


def trilinear(xs, ys, zs, table, x: float, y: float, z: float) -> float:
    """Trilinear ``table[i][j][k]`` at ``(x, y, z)`` (linear past the grids' ends).

    Parameters
    ----------
    xs, ys, zs : sequence of float
        Increasing grids.
    table : nested sequence of float
        Values by the three grids.
    x, y, z : float
        Where to evaluate.

    Returns
    -------
    float
    """
    i, u = _cell(xs, x)
    a = bilinear(ys, zs, table[i], y, z)
    if len(xs) == 1:
        return a
    return a + u * (bilinear(ys, zs, table[i + 1], y, z) - a)


@dataclass(frozen=True)
class PassWork:
    """FLOPs and HBM bytes per pass of one worker, on the request simulator's grids.

    Parameters
    ----------
    attainable_flops : float
        The worker's FLOP/s at its weights' precision times the fitted compute efficiency (all its GPUs).
    attainable_bandwidth : float
        Its HBM bytes/s times the fitted memory efficiency.
    fill_tokens : tuple of float
        Fill step sizes (tokens).
    fill_flops, fill_bytes : tuple of float
        FLOPs and HBM bytes of a fill step by size (no context before the chunk).
    context_flops, context_bytes : tuple of float
        ``(per new x context token pair, per context token)``: what the context before a chunk adds.
    decode_batches, decode_contexts : tuple of float
        The decode grid.
    decode_flops, decode_bytes : tuple of tuple of float
        Per decode pass by batch and context.
    mixed_batches, mixed_contexts, mixed_tokens : tuple of float
        The mixed-pass grid (empty without one).
    mixed_flops, mixed_bytes : nested tuple of float
        What a chunk adds to a decode pass, by batch, context and chunk tokens.
    """

    attainable_flops: float
    attainable_bandwidth: float
    fill_tokens: tuple
    fill_flops: tuple
    fill_bytes: tuple
    context_flops: tuple
    context_bytes: tuple
    decode_batches: tuple
    decode_contexts: tuple
    decode_flops: tuple
    decode_bytes: tuple
    mixed_batches: tuple = ()
    mixed_contexts: tuple = ()
    mixed_tokens: tuple = ()
    mixed_flops: tuple = ()
    mixed_bytes: tuple = ()

    def fill(self, tokens: float, pairs: float, context: float) -> tuple[float, float]:
        """(FLOPs, bytes) of a fill step of ``tokens`` whose chunks have ``pairs`` new x context
        token pairs and ``context`` context tokens in all.

        Parameters
        ----------
        tokens, pairs, context : float
            The step's new tokens, pairs and context tokens.

        Returns
        -------
        tuple of float
        """
        f, b = self.context(pairs, context)
        return (interp1(self.fill_tokens, self.fill_flops, tokens) + f,
                interp1(self.fill_tokens, self.fill_bytes, tokens) + b)

    def context(self, pairs: float, context: float) -> tuple[float, float]:
        """(FLOPs, bytes) the context before chunks adds: ``pairs`` new x context token pairs
        and ``context`` context tokens in all.

        Parameters
        ----------
        pairs, context : float
            As for :meth:`fill`.

        Returns
        -------
        tuple of float
        """
        fa, fb = self.context_flops
        ba, bb = self.context_bytes
        return fa * pairs + fb * context, ba * pairs + bb * context

    def decode(self, batch: float, context: float) -> tuple[float, float]:
        """(FLOPs, bytes) of one decode pass of ``batch`` sequences at mean ``context``.

        Parameters
        ----------
        batch, context : float
            Batch and mean context.

        Returns
        -------
        tuple of float
        """
        return (bilinear(self.decode_batches, self.decode_contexts, self.decode_flops, batch, context),
                bilinear(self.decode_batches, self.decode_contexts, self.decode_bytes, batch, context))

    def mixed_extra(self, batch: float, context: float, tokens: float) -> tuple[float, float]:
        """(FLOPs, bytes) a chunk of ``tokens`` adds to a decode pass of ``batch`` at ``context``.

        Parameters
        ----------
        batch, context, tokens : float
            Decodes, their mean context and the chunk's new tokens.

        Returns
        -------
        tuple of float
        """
        g = (self.mixed_batches, self.mixed_contexts, self.mixed_tokens)
        return trilinear(*g, self.mixed_flops, batch, context, tokens), \
            trilinear(*g, self.mixed_bytes, batch, context, tokens)


class WorkLedger:
    """Seconds busy, FLOPs and HBM bytes per pool (``"fill"``, ``"decode"``, ``"aggregated"``)."""

    __slots__ = ("pools",)

    def __init__(self):
        self.pools = {"fill": [0.0, 0.0, 0.0], "decode": [0.0, 0.0, 0.0], "aggregated": [0.0, 0.0, 0.0]}

    def add(self, pool: str, seconds: float, flops: float, nbytes: float) -> None:
        """Book one pass (or a leap of passes).

        Parameters
        ----------
        pool : str
            The pool's name.
        seconds, flops, nbytes : float
            Its worker time, FLOPs and HBM bytes.
        """
        row = self.pools[pool]
        row[0] += seconds
        row[1] += flops
        row[2] += nbytes

    def metrics(self, worker_seconds: dict, work: PassWork | None) -> dict:
        """Busy fraction, compute and bandwidth utilisation and their stranded complements per
        pool that had workers, against the attainable rates of ``work``.

        Parameters
        ----------
        worker_seconds : dict
            Pool -> worker-seconds provisioned over the run.
        work : PassWork or None
            The rates (None: only busy fractions).

        Returns
        -------
        dict
            ``{pool: {"busy_fraction", "compute_utilization", "bandwidth_utilization",
            "stranded_compute", "stranded_bandwidth"}}``.
        """
        out = {}
        for pool, (busy, flops, nbytes) in self.pools.items():
            ws = worker_seconds.get(pool, 0.0)
            if ws <= 0:
                continue
            row = {"busy_fraction": busy / ws}
            if work is not None:
                cu = flops / (work.attainable_flops * ws)
                bu = nbytes / (work.attainable_bandwidth * ws)
                row.update(compute_utilization=cu, bandwidth_utilization=bu,
                           stranded_compute=max(1.0 - cu, 0.0), stranded_bandwidth=max(1.0 - bu, 0.0))
            out[pool] = row
        return out
