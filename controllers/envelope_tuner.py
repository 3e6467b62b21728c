"""The one SIMC envelope search every tuned loop goes through.

Every loop the project tunes is, seen from its controller, an integrator or a lag behind a dead
time theta, and every tuner does the same thing: SIMC's tau_c = theta first (Skogestad 2003,
"Simple analytic rules for model reduction and PID controller tuning", J. Process Control
13:291-309, Table 1: Skogestad's "tight but robust" choice), then tau_c relaxed through a short
list of multiples of theta until the exact-delay margins meet the floors (GM >= 2, |PM| >= 45 deg
by default) at every point of a declared envelope of plant errors - so a loop is *shown* robust
over the box it will meet. :func:`simc_search` is that search; the loop-specific parts (which
controller a tau_c gives, which loop an envelope point is) are the caller's two functions:

* the smoothed admission's PI (:func:`tokenfactory.controllers.autotune.tune_smoothed_admission`),
* the batch gate's integral correction (:func:`tokenfactory.controllers.batch_gate.tune_batch_gate`),
* the SLO gate's fill and decode limit corrections and its outer margin loop
  (:func:`tokenfactory.controllers.slo_admission.tune_slo_admission`, ``tune_margin_loop``),
* the reconfiguration loop's backlog-clearance time
  (:func:`tokenfactory.controllers.separation.simc_queue_clear_s`).

The result is one :class:`SIMCTuning` (nominal margins, every envelope point as a row with
``.to_pandas()``, the worst point, the verdict, the describing-function limit cycle when a
saturation is named); :func:`tokenfactory.controllers.analysis_plots.simc_tuning_plot` draws it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from tokenfactory.controllers.describing import predict_limit_cycles
from tokenfactory.controllers.stability import DelayedLoop, Margins, stability_margins
from tokenfactory.controllers.stability_batch import DelayedLoopBatch, stability_margins_batch
from tokenfactory.core.validation import ConfigError, check_number

__all__ = ["SIMC_TAU_C_FACTORS", "SIMC_TAU_C_FACTORS_WIDE", "GM_FLOOR", "PM_FLOOR_DEG", "SIMCTuning", "simc_search"]

#: tau_c / theta tried in order: SIMC's tau_c = theta first, then relaxed in steps of at most 2x
#: (Skogestad 2003 section 3.3: tau_c = theta for tight control, larger for smoother and more
#: robust control); the list every SIMC tuner of the project starts from
SIMC_TAU_C_FACTORS: tuple[float, ...] = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0)
#: a longer, coarser list for a loop whose lag is counted as delay (the SLO gate's outer margin
#: loop: an integral controller cannot cancel the quantile window's lag, so the margins only reach
#: the floors at a few times theta_eff over a 16x gain box)
SIMC_TAU_C_FACTORS_WIDE: tuple[float, ...] = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0)
#: the margin floors every envelope check defaults to (gain may grow 2x and shrink 2x; every gain
#: crossover at least 45 deg from -180 deg); :class:`~tokenfactory.controllers.autotune.StabilityEnvelope`
#: carries the same defaults
GM_FLOOR: float = 2.0
PM_FLOOR_DEG: float = 45.0


@dataclass
class SIMCTuning:
    """What :func:`simc_search` chose and why: the tau_c, the controller it gives, the margins.

    Attributes
    ----------
    theta_s : float
        The effective delay the rule was applied to (s).
    tau_c_s : float
        The chosen closed-loop time constant (s): ``tau_c_over_theta`` x ``theta_s``.
    tau_c_over_theta : float
        The first factor of the candidates whose loop met the floors everywhere.
    controller : object
        What the caller built at that tau_c (an integral gain, a controller, a clearance time).
    nominal : Margins or None
        Exact-delay margins of the nominal loop (None when the caller gave no nominal loop).
    envelope : list of dict
        One row per envelope point, in the caller's order: the point's fields (``delay_factor``,
        ...), the :class:`~tokenfactory.controllers.stability.Margins` fields and ``meets_floors``.
    gm_floor, pm_floor_deg : float
        The floors the search met.
    limit_cycle : dict or None
        The describing-function prediction on the nominal loop for the caller's nonlinearity
        (None: none asked for, or no cycle).
    tried : tuple of float
        The factors tried before the chosen one (their loops missed a floor somewhere).
    """

    theta_s: float
    tau_c_s: float
    tau_c_over_theta: float
    controller: Any
    nominal: Margins | None
    envelope: list[dict] = field(default_factory=list)
    gm_floor: float = GM_FLOOR
    pm_floor_deg: float = PM_FLOOR_DEG
    limit_cycle: dict | None = None
    tried: tuple[float, ...] = ()

    @property
    def envelope_ok(self) -> bool:
        """Whether every envelope point meets the floors with a stable Nyquist verdict."""
        return all(r["meets_floors"] for r in self.envelope)

    @property
    def worst(self) -> dict:
        """The envelope row closest to instability: an unstable one first (by the Nyquist count),
        then the smallest |PM|, then the smallest GM."""
        return _worst(self.envelope)

    def to_pandas(self) -> pd.DataFrame:
        """The envelope, one row per point (the point's factors, the margins, ``meets_floors``)."""
        return pd.DataFrame(self.envelope)

    def to_dict(self) -> dict:
        """Plain figures: the choice, the nominal margins, the envelope rows, the verdict."""
        return {"theta_s": self.theta_s, "tau_c_s": self.tau_c_s, "tau_c_over_theta": self.tau_c_over_theta,
                "nominal": self.nominal.to_dict() if self.nominal is not None else None,
                "envelope": list(self.envelope), "gm_floor": self.gm_floor, "pm_floor_deg": self.pm_floor_deg,
                "limit_cycle": self.limit_cycle, "tried": list(self.tried), "envelope_ok": self.envelope_ok}

    def plot(self, ax=None):
        """:func:`tokenfactory.controllers.analysis_plots.simc_tuning_plot` of this tuning."""
        from tokenfactory.controllers.analysis_plots import simc_tuning_plot  # Matplotlib only there

        return simc_tuning_plot(self, ax=ax)


def _worst(rows: Sequence[Mapping]) -> dict:
    return min(rows, key=lambda r: (r["stable"], abs(r["phase_margin_deg"]), r["gain_margin"]))


def _envelope_rows(points: Sequence[Mapping], loops, gm_floor: float, pm_floor_deg: float) -> list[dict]:
    """Margins of every envelope loop as rows: a :class:`DelayedLoopBatch` through the batched
    kernel (:func:`stability_margins_batch`), a sequence of loops through :func:`stability_margins`
    one by one."""
    if isinstance(loops, DelayedLoopBatch):
        mb = stability_margins_batch(loops)
        margins, meets = mb.to_dicts(), mb.meets(gm_floor, pm_floor_deg).tolist()
    else:
        ms = [stability_margins(loop) for loop in loops]
        margins, meets = [m.to_dict() for m in ms], [m.meets(gm_floor, pm_floor_deg) for m in ms]
    if len(margins) != len(points):
        raise ValueError(f"{len(margins)} envelope loops for {len(points)} envelope points")
    return [{**p, **m, "meets_floors": ok} for p, m, ok in zip(points, margins, meets)]


def _point_label(row: Mapping) -> str:
    return ", ".join(f"{k} {row[k]:g}" for k in row if k.endswith("_factor"))


def simc_search(theta_s: float, controller_at: Callable[[float], Any],
                envelope_loops: Callable[[Any], DelayedLoopBatch | Sequence[DelayedLoop]],
                points: Sequence[Mapping[str, Any]], *,
                nominal_loop: Callable[[Any], DelayedLoop] | None = None, nonlinearity=None,
                tau_c_factors: Sequence[float] = SIMC_TAU_C_FACTORS, gm_floor: float = GM_FLOOR,
                pm_floor_deg: float = PM_FLOOR_DEG, field: str = "tuning.envelope") -> SIMCTuning:
    """The first tau_c = f x theta of ``tau_c_factors`` whose loop meets the margin floors at every
    envelope point (Skogestad 2003, Table 1 gives the controller at each tau_c; the caller's
    ``controller_at`` applies it).

    Parameters
    ----------
    theta_s : float
        The effective delay theta the rule is applied to (s, > 0).
    controller_at : callable
        ``controller_at(f)`` -> the controller at tau_c = f x theta (an integral gain, a PI, ...);
        it receives the factor so it can form tau_c + theta exactly as the closed form reads.
    envelope_loops : callable
        ``envelope_loops(controller)`` -> the open loop at every point of ``points``, in order: a
        :class:`DelayedLoopBatch` (margins by the batched kernel) or a sequence of
        :class:`DelayedLoop` (margins one by one).
    points : sequence of mapping
        The envelope points (``{"delay_factor": 2.0, "gain_factor": 0.7}``, plus anything the row
        should carry); each row of the result starts with its point's fields.
    nominal_loop : callable, optional
        ``nominal_loop(controller)`` -> the nominal loop, whose margins the result reports (and on
        which ``nonlinearity``'s limit cycle is predicted).
    nonlinearity : callable, optional
        A describing function N(A) (``control.saturation_nonlinearity(...)``): the result carries
        the first limit cycle :func:`~tokenfactory.controllers.describing.predict_limit_cycles`
        finds on the nominal loop, or None.
    tau_c_factors : sequence of float
        Candidate tau_c / theta, tried in order (default :data:`SIMC_TAU_C_FACTORS`, 1 to 8).
    gm_floor, pm_floor_deg : float
        Margin floors (defaults :data:`GM_FLOOR`, :data:`PM_FLOOR_DEG`).
    field : str
        The config field a failure names (the tuner's own, e.g. ``"batch_gate.envelope"``).

    Returns
    -------
    SIMCTuning

    Examples
    --------
    I control on a pure delay theta = 2 s, checked at 0.5x, 1x and 2x the delay: the doubled delay
    needs tau_c >= (8/pi - 1) theta, so the search stops at 2 theta.

    >>> import control
    >>> from tokenfactory.controllers.stability import DelayedLoop
    >>> theta = 2.0
    >>> points = [{"delay_factor": d} for d in (0.5, 1.0, 2.0)]
    >>> t = simc_search(theta, lambda f: 1.0 / (f * theta + theta),
    ...                 lambda ki: [DelayedLoop(control.tf([ki], [1.0, 0.0]), theta * p["delay_factor"])
    ...                             for p in points], points)
    >>> t.tau_c_over_theta, t.envelope_ok, t.worst["delay_factor"]
    (2.0, True, 2.0)
    >>> round(t.worst["gain_margin"], 3)
    2.356

    Raises
    ------
    ConfigError
        ``field``: when no candidate meets the floors everywhere (the message names the last
        candidate's worst failing point, with its GM and PM); ``tuning.theta_s`` for a non-positive delay;
        ``tuning.tau_c_factors`` for an empty or non-positive candidate list.
    """
    check_number("tuning.theta_s", theta_s, low=0.0, low_inclusive=False)
    factors = tuple(tau_c_factors)
    if not factors:
        raise ConfigError("tuning.tau_c_factors", "needs at least one candidate tau_c / theta")
    for i, f in enumerate(factors):
        check_number(f"tuning.tau_c_factors[{i}]", f, low=0.0, low_inclusive=False)
    points = list(points)
    rows: list[dict] = []
    for i, f in enumerate(factors):
        ctrl = controller_at(f)
        rows = _envelope_rows(points, envelope_loops(ctrl), gm_floor, pm_floor_deg)
        if all(r["meets_floors"] for r in rows):
            nominal, cycle = None, None
            if nominal_loop is not None:
                loop = nominal_loop(ctrl)
                nominal = stability_margins(loop)
                if nonlinearity is not None:
                    cycles = predict_limit_cycles(loop, nonlinearity)
                    cycle = cycles[0].to_dict() if cycles else None
            return SIMCTuning(theta_s, f * theta_s, f, ctrl, nominal, rows, gm_floor, pm_floor_deg, cycle,
                              factors[:i])
    # name the worst of the points that miss a floor (by the Nyquist verdict, then |PM|, then GM)
    worst = _worst([r for r in rows if not r["meets_floors"]])
    raise ConfigError(field, f"no tau_c up to {factors[-1]} x theta meets GM >= {gm_floor} and PM >= "
                      f"{pm_floor_deg} deg over the envelope (at {factors[-1]} x theta, worst failing point "
                      f"{_point_label(worst)}: {'stable' if worst['stable'] else 'unstable'}, "
                      f"GM {worst['gain_margin']:.3g}, PM {worst['phase_margin_deg']:.1f} deg)")
