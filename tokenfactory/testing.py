"""Regression helpers for users' own CI: pin a configuration so a change that brings back a limit
cycle, eats a margin or loses requests fails a test, with the figures in the message.

.. code-block:: python

    from tokenfactory.testing import assert_conserved, assert_margins, assert_no_oscillation

    def test_admission_keeps_its_margins():
        assert_margins("scenarios/prod.toml", gm=2.0, pm=45.0, delay_margin=1.0)

    def test_ready_buffer_does_not_oscillate():
        r = simulate_loop(plant, controller, scenario)
        assert_no_oscillation(r.sampled("ready", 0.05, 60), 0.05, min_amplitude=1.0)
        assert_conserved(r)

    def test_no_actuator_flaps():
        r = simulate(trace, params, cluster, admission, autoscalers)
        assert_no_actuator_oscillation(r, start_s=120.0)

Each helper raises ``AssertionError`` (pytest shows the message) and returns what it measured, so a
test can log or pin more.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from tokenfactory.controllers.autotune import admission_loop
from tokenfactory.controllers.oscillation import ActuatorVerdict, OscillationReport, assess, judge_actuators
from tokenfactory.controllers.stability import DelayedLoop, Margins, stability_margins
from tokenfactory.scenario import Scenario, load_scenario

__all__ = ["assert_no_oscillation", "assert_no_actuator_oscillation", "assert_margins", "assert_conserved"]


def assert_no_oscillation(series, dt: float, *, min_amplitude: float = 0.0, name: str = "signal",
                          max_reversals: int | None = None, actions: Iterable[dict] | None = None
                          ) -> OscillationReport:
    """Fail if ``series`` oscillates by the detectors of :func:`tokenfactory.controllers.assess`.

    Parameters
    ----------
    series : array_like
        The signal, sampled every ``dt`` seconds (at least 16 finite samples; drop the start-up
        transient first).
    dt : float
        Sample period (s, > 0).
    min_amplitude : float
        The smallest amplitude worth calling an oscillation, in the signal's units (default 0:
        any regular, persistent oscillation fails).
    name : str
        What the signal is, for the message (default ``"signal"``).
    max_reversals : int, optional
        With ``actions`` (scale-action rows with ``pool``, ``from``, ``to``): also fail when the
        actions reverse direction more than this many times (flapping without regularity).
    actions : iterable of dict, optional
        Scale actions to count reversals in, in time order (e.g. a simulation result's action
        log); only used with ``max_reversals``.

    Returns
    -------
    OscillationReport
        The detectors' figures (regularity r, decay ratio, period, amplitude).

    Raises
    ------
    AssertionError
        With the detectors' figures, when the verdict is "oscillating" or reversals exceed the bound.
    """
    rep = assess(np.asarray(series, dtype=float), dt, min_amplitude=min_amplitude)
    if rep.oscillating:
        raise AssertionError(
            f"{name} oscillates: period {rep.period_s:.4g} s, amplitude {rep.amplitude:.4g} "
            f"(first harmonic {rep.harmonic_amplitude:.4g}), Thornhill r = {rep.thornhill_r:.3g}, "
            f"decay ratio R = {rep.decay_ratio:.3g}, Forsman-Stattin h = {rep.forsman_h:.3g}; {rep.reason}")
    if max_reversals is not None:
        from tokenfactory.core.signals import count_reversals

        n = count_reversals(list(actions or []))
        if n > max_reversals:
            raise AssertionError(f"{name}: {n} scale reversals (up after down or down after up) > {max_reversals}")
    return rep


def assert_no_actuator_oscillation(result, *, start_s: float = 0.0, **kw) -> ActuatorVerdict:
    """Fail if any actuator of a simulation result cycles or its pools churn: the verdict every
    result reports (:func:`tokenfactory.controllers.oscillation.judge_actuators`).

    Parameters
    ----------
    result : SimulationResult
        From any plant (its ``series`` and ``actions`` are judged).
    start_s : float
        Judge from this time on (default 0).
    **kw
        Further :func:`~tokenfactory.controllers.oscillation.judge_actuators` arguments
        (``buffer_amplitudes``, ``step_s``, ...).

    Returns
    -------
    ActuatorVerdict
        The verdict, when it passes.

    Raises
    ------
    AssertionError
        Naming the cycling signals (with period and amplitude) and the churn figures.
    """
    v = judge_actuators(result.series, result.actions, start_s=start_s, **kw)
    if v.oscillating:
        detail = "; ".join(f"{k}: period {d['period_s']:.4g} s, amplitude {d['amplitude']:.4g}, r = "
                           f"{d['thornhill_r']:.3g}" for k, d in v.signals.items() if d.get("oscillating"))
        raise AssertionError(f"{v.reason}" + (f" ({detail})" if detail else ""))
    return v


def _loops(target: Any) -> list[tuple[str, DelayedLoop]]:
    if isinstance(target, DelayedLoop):
        return [(target.name or "loop", target)]
    if isinstance(target, (str, Path)):
        target = load_scenario(target)
    if isinstance(target, Scenario):
        from tokenfactory.controllers.admission import SmoothedAdmission

        if not isinstance(target.controller, SmoothedAdmission):
            raise AssertionError(f"scenario {target.name}: margins are defined for linear controllers; "
                                 f"{type(target.controller).__name__} is not one (use assert_no_oscillation)")
        return [(f"{target.name} delay x{d:g}, service x{s:g}",
                 admission_loop(target.plant, target.controller, delay_factor=d, service_rate_factor=s))
                for d, s in target.envelope.points()]
    raise TypeError(f"assert_margins takes a DelayedLoop, a Scenario or a scenario path, not {type(target).__name__}")


def assert_margins(target, *, gm: float | None = None, pm: float | None = None,
                   delay_margin: float | None = None, ms: float | None = None) -> list[Margins]:
    """Fail unless every loop of ``target`` is stable and meets the margin floors.

    Parameters
    ----------
    target : DelayedLoop, Scenario or path
        One loop, or a scenario (file) whose admission loop is checked at every point of its
        stability envelope (the scenario's controller must be the linear smoothed admission).
        Every floor left at None is not checked; stability always is.
    gm : float, optional
        Gain-margin floor (the factor the loop gain may grow by, and shrink by for a
        conditionally stable loop; dimensionless, not in dB).
    pm : float, optional
        Phase-margin floor in degrees, on |PM| (every gain crossover at least this far from
        -180 deg; a stable loop's smallest-magnitude PM can be negative).
    delay_margin : float, optional
        Delay-margin floor in seconds (extra loop delay tolerated).
    ms : float, optional
        Ceiling on the sensitivity peak.

    Returns
    -------
    list of Margins
        The margins of each loop checked.

    Raises
    ------
    AssertionError
        Naming the loop, the margin and its value, for the first loop that is unstable or misses
        a floor; also when a scenario's controller is not linear.
    TypeError
        When ``target`` is none of the accepted types.
    """
    out = []
    for name, loop in _loops(target):
        m = stability_margins(loop)
        problems = []
        if not m.stable:
            problems.append("closed loop unstable")
        if gm is not None and not m.gain_margin >= gm:
            problems.append(f"gain margin {m.gain_margin:.4g} < {gm:g}")
        if gm is not None and not m.lower_gain_margin <= 1.0 / gm:
            problems.append(f"lower gain margin {m.lower_gain_margin:.4g} > 1/{gm:g} (conditionally stable)")
        if pm is not None and not abs(m.phase_margin_deg) >= pm:
            problems.append(f"phase margin {m.phase_margin_deg:.4g} deg < {pm:g} deg")
        if delay_margin is not None and not m.delay_margin_s >= delay_margin:
            problems.append(f"delay margin {m.delay_margin_s:.4g} s < {delay_margin:g} s")
        if ms is not None and not m.ms <= ms:
            problems.append(f"sensitivity peak Ms {m.ms:.4g} > {ms:g}")
        if problems:
            raise AssertionError(f"{name}: " + "; ".join(problems)
                                 + f" (GM {m.gain_margin:.4g}, PM {m.phase_margin_deg:.4g} deg, "
                                   f"delay margin {m.delay_margin_s:.4g} s, Ms {m.ms:.4g})")
        out.append(m)
    return out


def _counts(result: Any) -> tuple[float, float, float, float]:
    """(arrived, completed, rejected, in flight) of a simulation result of any plant."""
    metrics = getattr(result, "metrics", None)
    if isinstance(metrics, dict) and {"requests", "completed", "rejected", "in_flight_end"} <= set(metrics):
        return (float(metrics["requests"]), float(metrics["completed"]), float(metrics["rejected"]),
                float(metrics["in_flight_end"]))
    raise TypeError(f"assert_conserved does not know how to count requests in a {type(result).__name__}")


def assert_conserved(result, *, rtol: float = 1e-9) -> dict[str, float]:
    """Fail unless every arrival of ``result`` is completed, rejected with a reason, or in flight.

    Parameters
    ----------
    result : simulation result
        From the request simulator, the pool model or the admission-loop fluid plant.
    rtol : float
        Tolerance relative to the arrivals (default 1e-9; the fluid plants integrate real
        numbers), plus an absolute 1e-9 requests.

    Returns
    -------
    dict
        ``arrived``, ``completed``, ``rejected``, ``in_flight`` and ``residual`` (arrived minus
        the other three), in requests. For the admission-loop fluid plant, which computes its own
        residual (delay lines included), only ``arrived`` and ``residual``.

    Raises
    ------
    AssertionError
        With the four counts and the residual. For request-level results, also when a request's
        final state is not completed/rejected/in flight or a rejection carries no reason.
    TypeError
        When ``result`` reports no request counts.
    """
    metrics = getattr(result, "metrics", None) or {}
    residual_attr = metrics.get("conservation_residual")
    if residual_attr is not None:  # the fluid plant computes its own residual, delay lines included
        arrived = float(metrics["requests"])
        if not abs(residual_attr) <= rtol * max(1.0, arrived) + 1e-9:
            raise AssertionError(f"requests not conserved: residual {residual_attr:.6g} of {arrived:.6g} arrived")
        return {"arrived": arrived, "residual": float(residual_attr)}
    arrived, done, rej, flight = _counts(result)
    residual = arrived - (done + rej + flight)
    counts = {"arrived": arrived, "completed": done, "rejected": rej, "in_flight": flight, "residual": residual}
    if not (math.isfinite(residual) and abs(residual) <= rtol * max(1.0, arrived) + 1e-9):
        raise AssertionError("requests not conserved: " + ", ".join(f"{k} {v:.6g}" for k, v in counts.items()))
    records = getattr(result, "records", None)
    if records is not None and hasattr(records, "columns") and "state" in records.columns:
        states = set(records["state"].unique())
        allowed = {"completed", "rejected", "backlog", "fill", "transfer", "ready", "decode", "deferred", "not_arrived"}
        if not states <= allowed:
            raise AssertionError(f"requests in unknown final states {sorted(states - allowed)}")
        if "reject_reason" in records.columns:
            rej_rows = records[records["state"] == "rejected"]
            if rej_rows["reject_reason"].isna().any() or (rej_rows["reject_reason"] == "").any():
                raise AssertionError(f"{int(rej_rows['reject_reason'].isna().sum())} rejected requests carry "
                                     "no reason")
        if int((records["state"] == "completed").sum()) != int(done):
            raise AssertionError(f"records say {int((records['state'] == 'completed').sum())} completed, "
                                 f"metrics {int(done)}")
    return counts
