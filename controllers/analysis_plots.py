"""Plots for loop analysis: Nyquist with describing-function loci, stability maps. Each takes an
optional ``ax`` and returns it; nothing is shown."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tokenfactory.controllers.stability import DelayedLoop, frequency_grid

__all__ = ["nyquist_plot", "stability_map_plot", "forecast_plot", "capacity_plan_plot", "simc_tuning_plot"]


def _axes(ax, size=(6.0, 5.0)):
    if ax is None:
        from matplotlib.figure import Figure

        ax = Figure(figsize=size, layout="constrained").subplots()
    return ax


def nyquist_plot(loops: dict[str, DelayedLoop], *, df_locus: dict | None = None, ms_circle: float | None = None,
                 limit: float = 3.0, ax=None):
    """Nyquist curves (exact delay) of ``loops``; ``df_locus`` = {"label": (complex array, marker point)}
    draws -1/N(A) loci and predicted intersections; the unit circle and -1 are always drawn.

    Parameters
    ----------
    loops : dict of str to DelayedLoop
        Open loops to draw, by legend label; each curve is clipped where |L| > 10 x ``limit``.
    df_locus : dict, optional
        ``{label: (locus, point)}``: ``locus`` a complex array of -1/N(A) over amplitudes,
        ``point`` the complex value of a predicted limit cycle (circled) or ``None``.
    ms_circle : float, optional
        Draw the circle of sensitivity peak Ms around -1 (radius 1/Ms); ``None`` (default) omits it.
    limit : float
        Half-width of the view around the origin (dimensionless; default 3).
    ax : matplotlib.axes.Axes, optional
        Axes to draw on; ``None`` (default) makes a new figure (not shown).

    Returns
    -------
    matplotlib.axes.Axes
        The axes drawn on.
    """
    ax = _axes(ax)
    th = np.linspace(0, 2 * np.pi, 200)
    ax.plot(np.cos(th), np.sin(th), color="0.8", lw=1, label="unit circle")
    if ms_circle:
        r = 1.0 / ms_circle
        ax.plot(-1 + r * np.cos(th), r * np.sin(th), ls=":", color="C3", lw=1, label=f"Ms = {ms_circle:g}")
    for i, (name, loop) in enumerate(loops.items()):
        w = frequency_grid(loop, 4000)
        L = loop.response(w)
        keep = np.abs(L) < 10 * limit
        ax.plot(L.real[keep], L.imag[keep], color=f"C{i}", lw=1.5, label=name)
    for j, (name, (locus, point)) in enumerate((df_locus or {}).items()):
        ax.plot(locus.real, locus.imag, color="k", lw=2.5, alpha=0.5, label=name)
        if point is not None:
            ax.plot(point.real, point.imag, "o", color="C3", ms=8, mfc="none", mew=2,
                    label="predicted limit cycle")
    ax.plot([-1], [0], "k+", ms=12, mew=2)
    ax.set_xlim(-limit, limit * 0.6)
    ax.set_ylim(-limit, limit * 0.6)
    ax.set_aspect("equal")
    ax.axhline(0, color="0.85", lw=0.8)
    ax.axvline(0, color="0.85", lw=0.8)
    ax.set_xlabel("Re L(jw)")
    ax.set_ylabel("Im L(jw)")
    ax.legend(fontsize=7, loc="lower left")
    return ax


def stability_map_plot(df: pd.DataFrame, x: str, y: str, value: str = "phase_margin_deg", *,
                       marker: tuple[float, float] | None = None, floor: float | None = 45.0, ax=None):
    """Heat map of ``value`` over the (x, y) grid from :func:`tokenfactory.controllers.stability_margins` rows,
    unstable points hatched, the ``floor`` contour drawn, the design point marked.

    Parameters
    ----------
    df : pandas.DataFrame
        One row per grid point with columns ``x``, ``y``, ``value`` and ``stable`` (bool).
    x, y : str
        Columns of the two swept quantities (drawn on log axes; values > 0).
    value : str
        Column coloured (default ``"phase_margin_deg"``); unstable points are blank and crossed.
    marker : tuple of float, optional
        (x, y) of the design point, drawn as a star; ``None`` (default) omits it.
    floor : float, optional
        Level of ``value`` drawn as a white contour (default 45, the PM floor in degrees);
        ``None`` omits it.
    ax : matplotlib.axes.Axes, optional
        Axes to draw on; ``None`` (default) makes a new figure (not shown).

    Returns
    -------
    matplotlib.axes.Axes
        The axes drawn on.
    """
    ax = _axes(ax, (6.4, 4.8))
    piv = df.pivot(index=y, columns=x, values=value)
    stable = df.pivot(index=y, columns=x, values="stable")
    X, Y = np.meshgrid(piv.columns.to_numpy(float), piv.index.to_numpy(float))
    Z = np.where(stable.to_numpy(bool), piv.to_numpy(float), np.nan)
    mesh = ax.pcolormesh(X, Y, Z, shading="nearest", cmap="viridis")
    ax.figure.colorbar(mesh, ax=ax, label=value.replace("_", " "))
    un = ~stable.to_numpy(bool)
    ax.scatter(X[un], Y[un], marker="x", color="C3", s=18, label="unstable")
    if floor is not None and np.isfinite(Z).sum() > 3:
        ax.contour(X, Y, np.nan_to_num(Z, nan=-1e3), levels=[floor], colors="w", linewidths=1.5)
    if marker:
        ax.plot(*marker, "*", color="w", mec="k", ms=14, label="design point")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(x.replace("_", " "))
    ax.set_ylabel(y.replace("_", " "))
    ax.legend(fontsize=7, loc="upper right")
    return ax


def forecast_plot(points: pd.DataFrame, model: str, *, origins=None, ax=None, color: str = "C0"):
    """Backtest forecasts of ``model`` (rows of :class:`tokenfactory.controllers.backtest.BacktestResult`
    ``points``) with 80 % / 95 % bands, against the actual series.

    Parameters
    ----------
    points : pandas.DataFrame
        Backtest rows with columns ``model``, ``origin_s``, ``time_s`` (s), ``mean``,
        ``lower_80``, ``upper_80``, ``lower_95``, ``upper_95`` and ``actual`` (requests/s).
    model : str
        The model whose forecasts are drawn.
    origins : iterable of float, optional
        Forecast origins (s) to draw; ``None`` (default) draws every origin.
    color : str
        Matplotlib colour of the forecast and its bands (default ``"C0"``).
    ax : matplotlib.axes.Axes, optional
        Axes to draw on; ``None`` (default) makes a new figure (not shown).

    Returns
    -------
    matplotlib.axes.Axes
        The axes drawn on.
    """
    ax = _axes(ax, (11, 4))
    p = points[points["model"] == model]
    if origins is not None:
        p = p[p["origin_s"].isin(origins)]
    for o, g in p.groupby("origin_s"):
        h = g["time_s"] / 3600.0
        ax.fill_between(h, g["lower_95"], g["upper_95"], color=color, alpha=0.12, lw=0)
        ax.fill_between(h, g["lower_80"], g["upper_80"], color=color, alpha=0.25, lw=0)
        ax.plot(h, g["mean"], color=color, lw=1.2)
    act = points if origins is None else points[points["origin_s"].isin(origins)]
    act = act.drop_duplicates("time_s").sort_values("time_s")
    ax.plot(act["time_s"] / 3600.0, act["actual"], color="k", lw=0.9, label="actual")
    ax.plot([], [], color=color, lw=1.2, label=f"{model} (80 % / 95 % bands)")
    ax.set_xlabel("time (h)")
    ax.set_ylabel("demand (requests/s)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return ax


def capacity_plan_plot(plans: dict[str, pd.DataFrame], actual_hourly_peak: pd.Series, per_worker_rps: float,
                       pool: str = "decode", ax=None):
    """Workers per hour of several plans for one pool, with the workers the actual peak needed.

    Parameters
    ----------
    plans : dict of str to pandas.DataFrame
        Plans by legend label, as :func:`tokenfactory.controllers.capacity.plan_capacity` returns
        (indexed by hour start in s).
    actual_hourly_peak : pandas.Series
        Actual peak demand per hour (requests/s), indexed by hour start (s).
    per_worker_rps : float
        Requests/s one worker of ``pool`` sustains (> 0); the dashed line is
        ceil(peak / per_worker_rps), without headroom.
    pool : {"decode", "fill"}
        Which pool's workers to draw (default ``"decode"``).
    ax : matplotlib.axes.Axes, optional
        Axes to draw on; ``None`` (default) makes a new figure (not shown).

    Returns
    -------
    matplotlib.axes.Axes
        The axes drawn on.
    """
    ax = _axes(ax, (11, 4))
    for i, (name, plan) in enumerate(plans.items()):
        ax.step(plan.index / 3600.0, plan[f"{pool}_workers"], where="post", lw=1.4, color=f"C{i}", label=name)
    need = np.ceil(actual_hourly_peak / per_worker_rps)
    ax.step(need.index / 3600.0, need, where="post", color="k", lw=0.9, ls="--", label="needed by actual peak")
    ax.set_xlabel("time (h)")
    ax.set_ylabel(f"{pool} workers")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def simc_tuning_plot(tuning, *, ax=None):
    """Gain margin against |phase margin| at every envelope point of a SIMC tuning
    (:class:`~tokenfactory.controllers.envelope_tuner.SIMCTuning`), the floors as lines, the worst
    point circled: the picture of "robust over the box".

    Parameters
    ----------
    tuning : SIMCTuning
        The result of :func:`~tokenfactory.controllers.envelope_tuner.simc_search`.
    ax : matplotlib.axes.Axes, optional
        Axes to draw on; ``None`` (default) makes a new figure (not shown).

    Returns
    -------
    matplotlib.axes.Axes
    """
    ax = _axes(ax)
    df = tuning.to_pandas()
    # an unbounded margin (no phase crossover) is drawn at the top of the finite ones
    gm = df["gain_margin"].replace(np.inf, np.nan)
    top = float(np.nanmax(gm)) * 1.5 if gm.notna().any() else 10.0 * tuning.gm_floor
    gm = gm.fillna(top)
    pm = df["phase_margin_deg"].abs().clip(upper=180.0)
    ok = df["meets_floors"].astype(bool)
    ax.scatter(pm[ok], gm[ok], color="C0", label="meets floors")
    ax.scatter(pm[~ok], gm[~ok], color="C3", marker="x", label="misses")
    w = tuning.worst
    ax.scatter([min(abs(w["phase_margin_deg"]), 180.0)], [top if w["gain_margin"] == np.inf else w["gain_margin"]],
               s=160, facecolors="none", edgecolors="k", label="worst point")
    ax.axhline(tuning.gm_floor, color="0.5", ls="--")
    ax.axvline(tuning.pm_floor_deg, color="0.5", ls="--")
    ax.set_yscale("log")
    ax.set_xlabel("|phase margin| (deg)")
    ax.set_ylabel("gain margin")
    ax.set_title(f"tau_c = {tuning.tau_c_over_theta:g} theta = {tuning.tau_c_s:.3g} s")
    ax.legend(fontsize=8)
    return ax
