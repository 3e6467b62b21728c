"""Plots of descriptor and roofline results. Each takes data and an optional ``ax``; none shows."""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["expert_intensity_plot", "decode_sweep_plot", "stage_memory_plot", "roofline_plot",
           "loop_response_plot", "validation_plot", "pareto_plot", "capacity_curve_plot", "series_plot"]


def _axes(ax):
    if ax is None:
        from matplotlib.figure import Figure

        ax = Figure(figsize=(6.4, 4.4), layout="constrained").subplots()
    return ax


def expert_intensity_plot(tokens_per_expert, intensity, *, ridges: dict[str, float] | None = None,
                          asymptote: float | None = None, ax=None):
    """AI_expert vs tokens per expert (log-log), with hardware ridge points as horizontal lines.

    The curve is the expert arithmetic intensity of article section 15
    (:func:`tokenfactory.plant_models.roofline.expert_arithmetic_intensity`).

    Parameters
    ----------
    tokens_per_expert : array_like of float
        Tokens n routed to one expert per pass (> 0, log axis).
    intensity : array_like of float
        Arithmetic intensity at each n (FLOP/byte, > 0).
    ridges : dict of str to float, optional
        Ridge points to draw, by hardware name (FLOP/byte: peak FLOP/s / HBM bytes/s).
    asymptote : float, optional
        The activation-bound limit of the intensity as n grows (FLOP/byte), drawn dotted.
    ax : matplotlib.axes.Axes, optional
        Axes to draw on; a new figure's when omitted.

    Returns
    -------
    matplotlib.axes.Axes
        The axes drawn on.
    """
    ax = _axes(ax)
    ax.loglog(tokens_per_expert, intensity, lw=2, label="expert AI (section 15)")
    for name, r in (ridges or {}).items():
        ax.axhline(r, ls="--", lw=1, color="gray")
        ax.text(tokens_per_expert[0], r * 1.08, f"{name} ridge {r:.0f} FLOP/B", fontsize=8, color="gray")
    if asymptote:
        ax.axhline(asymptote, ls=":", color="C3", label=f"activation-bound limit {asymptote:.0f}")
    ax.set_xlabel("tokens per expert n")
    ax.set_ylabel("arithmetic intensity (FLOP/byte)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    return ax


def decode_sweep_plot(df: pd.DataFrame, *, y: str = "tokens_per_s_per_gpu", ax=None):
    """One line per context length from :func:`tokenfactory.plant_models.decode_sweep` output.

    Parameters
    ----------
    df : pandas.DataFrame
        Rows with ``context_tokens``, ``batch`` (sequences per worker, log2 axis) and ``y``.
    y : str
        Column on the vertical axis (default ``"tokens_per_s_per_gpu"``; ``"step_s"``, the pass
        time = TPOT in s, is drawn on a log axis).
    ax : matplotlib.axes.Axes, optional
        Axes to draw on; a new figure's when omitted.

    Returns
    -------
    matplotlib.axes.Axes
        The axes drawn on.
    """
    ax = _axes(ax)
    for c, g in df.groupby("context_tokens"):
        ax.plot(g["batch"], g[y], marker="o", ms=3, label=f"{c // 1024}k context")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("decode batch (sequences per worker)")
    ax.set_ylabel({"tokens_per_s_per_gpu": "tokens/s per GPU", "step_s": "pass time = TPOT (s)"}.get(y, y))
    if y == "step_s":
        ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def stage_memory_plot(df: pd.DataFrame, *, crossover: int | None = None,
                      target_band: tuple[float, float] | None = None, ax=None):
    """Stacked stage memory by part (GB) vs pipeline depth, from :func:`stage_memory_sweep`.

    Parameters
    ----------
    df : pandas.DataFrame
        Rows with ``pipeline_depth`` and the parts ``weights``, ``kv``, ``working``, ``slack``
        (bytes per stage; drawn in GB = 1e9 bytes, parts that are all zero omitted).
    crossover : int, optional
        Pipeline depth at which KV overtakes weights (:func:`kv_crossover_depth`), drawn dashed.
    target_band : tuple of float, optional
        (low, high) stage-memory target (bytes), shaded.
    ax : matplotlib.axes.Axes, optional
        Axes to draw on; a new figure's when omitted.

    Returns
    -------
    matplotlib.axes.Axes
        The axes drawn on.
    """
    ax = _axes(ax)
    bottom = np.zeros(len(df))
    for part in ("weights", "kv", "working", "slack"):
        vals = df[part].to_numpy() / 1e9
        if not vals.any():
            continue
        ax.bar(df["pipeline_depth"], vals, bottom=bottom, label=part)
        bottom += vals
    if target_band:
        ax.axhspan(target_band[0] / 1e9, target_band[1] / 1e9, color="green", alpha=0.2, zorder=3,
                   label=f"{target_band[0] / 1e9:.0f}-{target_band[1] / 1e9:.0f} GB stage target")
    if crossover:
        ax.axvline(crossover, color="k", ls="--", lw=1, label=f"KV crossover P={crossover}")
    ax.set_xlabel("pipeline depth P")
    ax.set_ylabel("memory per stage (GB)")
    ax.legend(fontsize=8)
    return ax


def roofline_plot(points: pd.DataFrame, *, peak_flops: float, bandwidth: float, label: str = "",
                  ax=None):
    """Points (columns ``name``, ``intensity``, ``flops_per_s``) under a roofline.

    Parameters
    ----------
    points : pandas.DataFrame
        One row per kernel or phase: ``name``, ``intensity`` (FLOP/byte) and ``flops_per_s``
        (attained FLOP/s per GPU).
    peak_flops : float
        The roof's flat part (FLOP/s per GPU).
    bandwidth : float
        The roof's slope (HBM bytes/s per GPU).
    label : str
        Legend label of the roof (default ``"roofline"``).
    ax : matplotlib.axes.Axes, optional
        Axes to draw on; a new figure's when omitted.

    Returns
    -------
    matplotlib.axes.Axes
        The axes drawn on.
    """
    ax = _axes(ax)
    ai = np.logspace(-1, 4.5, 200)
    ax.loglog(ai, np.minimum(peak_flops, ai * bandwidth), color="k", lw=1.5, label=label or "roofline")
    for i, r in enumerate(points.itertuples()):
        ax.loglog(r.intensity, r.flops_per_s, "o", color=f"C{i % 10}", label=r.name)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attained FLOP/s per GPU")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return ax


def loop_response_plot(responses: dict, signal: str = "ready", *, target: float | None = None,
                       events: list[tuple[float, str]] | None = None, ylabel: str | None = None, ax=None):
    """One series column of several :class:`tokenfactory.plant_models.result.SimulationResult`
    runs (any plant) against time, one line per run.

    Parameters
    ----------
    responses : dict of str to SimulationResult
        Runs by legend label.
    signal : str
        Series column to draw (default ``"ready"``, requests).
    target : float, optional
        A setpoint in the signal's unit, drawn dashed.
    events : list of (float, str), optional
        (time in s, label) of disturbances, drawn as labelled vertical lines.
    ylabel : str, optional
        Y-axis label (default: the column name).
    ax : matplotlib.axes.Axes, optional
        Axes to draw on; a new figure's when omitted.

    Returns
    -------
    matplotlib.axes.Axes
        The axes drawn on.
    """
    ax = _axes(ax)
    for i, (name, r) in enumerate(responses.items()):
        ax.plot(r.series["time_s"], r.series[signal], lw=1.2, color=f"C{i}", label=name)
    if target is not None:
        ax.axhline(target, color="k", ls="--", lw=0.8, label="target")
    for t, label in events or []:
        ax.axvline(t, color="0.5", ls=":", lw=1)
        ax.text(t, ax.get_ylim()[1], f" {label}", va="top", fontsize=7, color="0.3")
    ax.set_xlabel("time (s)")
    ax.set_ylabel(ylabel or signal.replace("_", " "))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def validation_plot(table: pd.DataFrame, *, targets: tuple[float, float] = (0.2, 0.4), ax=None):
    """Signed error per published point (rows of ``validation_points.csv``): held out, fitted and
    with the old assumptions, with the +-target bands.

    Parameters
    ----------
    table : pandas.DataFrame
        One row per point with ``point``, ``hardware``, ``error``, ``held_out_error`` and
        ``error_old_assumptions`` (signed fractions, + = the roofline predicts more throughput).
    targets : tuple of float
        The median and worst-case error targets drawn as bands (fractions, default 0.2 and 0.4).
    ax : matplotlib.axes.Axes, optional
        Axes to draw on; a new figure's when omitted.

    Returns
    -------
    matplotlib.axes.Axes
    """
    if ax is None:
        from matplotlib.figure import Figure

        ax = Figure(figsize=(10, 5.2), layout="constrained").subplots()
    y = np.arange(len(table))
    for t, alpha in zip(targets, (0.25, 0.1)):
        ax.axvspan(-100 * t, 100 * t, color="green", alpha=alpha, lw=0)
    ax.scatter(100 * table["error_old_assumptions"], y, marker="x", color="0.5",
               label="old assumed efficiencies")
    ax.scatter(100 * table["error"], y, marker="o", facecolors="none", edgecolors="C0",
               label="all points fitted")
    ax.scatter(100 * table["held_out_error"], y, marker="o", color="C3", label="held out (leave-one-out)")
    ax.set_yticks(y, [f"{p} ({h})" for p, h in zip(table["point"], table["hardware"])], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("symlog", linthresh=100, linscale=2)
    ticks = [-80, -40, -20, 0, 20, 40, 100, 200, 400]
    ax.set_xticks(ticks, [f"{t:+d}" if t else "0" for t in ticks])
    ax.axvline(0, color="k", lw=0.8)
    ax.set_xlabel("error of the predicted throughput (%), + = roofline too optimistic")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3)
    return ax


def pareto_plot(points: pd.DataFrame, *, x: str, y: str, group: str, front: str = "on_front",
                ax=None, logx: bool = True, logy: bool = False):
    """Scatter of configurations (``points``), one colour per ``group``, with each group's
    Pareto front (rows where ``front`` is true, sorted by ``x``) joined by a line.

    Parameters
    ----------
    points : pandas.DataFrame
        One row per configuration.
    x, y : str
        Columns on the horizontal and vertical axes.
    group : str
        Column whose values get one colour and one front line each.
    front : str
        Boolean column marking the front points (default ``"on_front"``).
    ax : matplotlib.axes.Axes, optional
        Axes to draw on; a new figure's when omitted.
    logx, logy : bool
        Logarithmic axes (default: x only).

    Returns
    -------
    matplotlib.axes.Axes
    """
    ax = _axes(ax)
    for i, (name, g) in enumerate(points.groupby(group, sort=True)):
        ax.scatter(g[x], g[y], s=6, alpha=0.25, color=f"C{i}", rasterized=True, lw=0)
        f = g[g[front]].sort_values(x)
        ax.plot(f[x], f[y], marker="o", ms=3, lw=1.4, color=f"C{i}", label=str(name))
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.minorticks_off()  # minor log ticks cost more to draw than the data
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return ax


def capacity_curve_plot(df: pd.DataFrame, *, y: str, group: str = "hbm_bandwidth_tbs",
                        x: str = "hbm_capacity_gb", style: str | None = None, ax=None):
    """A quantity against HBM capacity per GPU, one line per bandwidth (and per ``style``).

    Parameters
    ----------
    df : pandas.DataFrame
        Rows of a capacity sweep (study ``bandwidth-capacity``).
    y : str
        Column to plot.
    group : str
        Column with one line colour per value (default the bandwidth in TB/s).
    x : str
        Column on the horizontal axis (default the capacity in GB).
    style : str, optional
        Column whose values get solid, dashed and dotted lines (e.g. the batch policy).
    ax : matplotlib.axes.Axes, optional
        Axes to draw on; a new figure's when omitted.

    Returns
    -------
    matplotlib.axes.Axes
    """
    ax = _axes(ax)
    styles = ["-", "--", ":"]
    keys = [None] if style is None else sorted(df[style].unique())
    for i, (bw, g) in enumerate(df.groupby(group, sort=True)):
        for j, k in enumerate(keys):
            h = g if k is None else g[g[style] == k]
            label = f"{bw:g} TB/s" + ("" if k is None else f", {k}")
            ax.plot(h[x], h[y], ls=styles[j % 3], color=f"C{i}", lw=1.5, label=label)
    ax.set_xlabel("HBM capacity per GPU (GB)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return ax


def series_plot(result, columns="ready", *, start_s: float = 0.0, ylabel: str | None = None, ax=None):
    """Columns of one result's time series against time (what ``SimulationResult.plot`` draws).

    Parameters
    ----------
    result : SimulationResult
        Any plant's result.
    columns : str or list of str
        Series columns to draw, one line each.
    start_s : float
        Draw from this time on (s).
    ylabel : str, optional
        Y-axis label (default: the column, or "requests" for several).
    ax : matplotlib Axes, optional
        Where to draw (default: a new figure's axes).

    Returns
    -------
    matplotlib Axes
    """
    ax = _axes(ax)
    s = result.series
    s = s[s["time_s"] >= start_s]
    for i, c in enumerate([columns] if isinstance(columns, str) else list(columns)):
        ax.plot(s["time_s"], s[c], lw=1.0, color=f"C{i}", label=c.replace("_", " "))
    ax.set_xlabel("time (s)")
    ax.set_ylabel(ylabel or ("requests" if not isinstance(columns, str) else columns.replace("_", " ")))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return ax
