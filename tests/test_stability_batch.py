"""The batched margins kernel against the scalar reference, loop by loop.

``stability_margins_batch`` must give what ``stability_margins`` gives - the Nyquist verdict
(P, Z), both gain margins, every gain crossover's PM and DM, the reported phase crossings, Ms and
where it is attained - within 1e-6 relative, on random loops (stable and unstable open loops,
integrators, damped and undamped resonances, non-minimum-phase zeros, delays, biproper loops),
on the textbook loops and on python-control's reference systems; loops it cannot handle go to
the scalar path and are counted. Where Ms is attained is compared by value: |S| at each side's
frequency must be the other side's Ms (a flat peak's location is not sharp, and a peak equal to
the limit 1 can sit at w = inf or anywhere |S| = 1 to rounding).
"""

import functools
import math

import control
import numpy as np
import pandas as pd
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from test_stability import OPEN_LOOP_UNSTABLE, THREE_CROSSOVERS
from test_stability_property import random_loops
from test_stability_reference import DELAYED, TSYS

from tokenfactory import ConfigError
from tokenfactory.controllers import (
    DelayedLoop,
    DelayedLoopBatch,
    envelope_loops,
    envelope_margins,
    gain_delay_margins,
    loop_transfer,
    stability_map,
    stability_margins,
    stability_margins_batch,
)
from tokenfactory.controllers.autotune import StabilityEnvelope
from tokenfactory.sweep import Sweep, run_sweep

REL = 1e-6
S = control.tf("s")


def _close(a: float, b: float, rel: float = REL) -> bool:
    if a == b:
        return True
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= rel * max(abs(a), abs(b))


def _sensitivity_at(loop: DelayedLoop, w: float) -> float:
    if w == math.inf:
        return 1.0 / abs(1.0 + loop._factored.high_frequency_gain)
    if w == 0.0 and np.any(loop._factored.poles == 0):
        return 0.0
    return 1.0 / abs(1.0 + loop.response(np.array([w]))[0])


def mismatches(loop: DelayedLoop, b, s) -> list:
    """Fields where batch result ``b`` and scalar result ``s`` of ``loop`` differ."""
    out = []
    for f in ("open_loop_rhp_poles", "closed_loop_rhp_poles", "stable", "gain_margin", "lower_gain_margin",
              "phase_margin_deg", "delay_margin_s", "ms"):
        x, y = getattr(b, f), getattr(s, f)
        if not (x == y if isinstance(x, (bool, int)) else _close(x, y)):
            out.append((f, x, y))
    if not _close(b.ms_frequency_rad_s, s.ms_frequency_rad_s) and not (
            _close(_sensitivity_at(loop, b.ms_frequency_rad_s), s.ms)
            and _close(_sensitivity_at(loop, s.ms_frequency_rad_s), b.ms)):
        out.append(("ms_frequency_rad_s", b.ms_frequency_rad_s, s.ms_frequency_rad_s))
    for f, keys in (("gain_crossings", ("frequency_rad_s", "phase_margin_deg", "delay_margin_s")),
                    ("phase_crossings", ("frequency_rad_s", "gain_factor", "rhp_change"))):
        rb, rs = getattr(b, f), getattr(s, f)
        if len(rb) != len(rs) or not all(_close(getattr(p, k), getattr(q, k)) for p, q in zip(rb, rs) for k in keys):
            out.append((f, rb, rs))
    return out


def assert_batch_equals_scalar(loops) -> "MarginsBatch":  # noqa: F821
    mb = stability_margins_batch(loops)
    assert len(mb) == len(loops)
    for i, lp in enumerate(loops):
        bad = mismatches(lp, mb[i], stability_margins(lp))
        assert not bad, (i, lp.rational, lp.delay, mb.fallback_reason[i], bad)
    return mb


def _loop(num, den, delay):
    return DelayedLoop(control.tf(num, den), delay)


def _usable(num, den) -> bool:
    return len(num) < len(den) or abs(1 + num[0] / den[0]) > 1e-6  # L(j inf) = -1: no closed loop


# --- random loops -------------------------------------------------------------------------------

def check_random_batch(drawn):
    loops = []
    for num, den, delay in drawn:
        if not _usable(num, den):
            continue
        lp = _loop(num, den, delay)
        try:
            stability_margins(lp)
        except ConfigError:
            continue
        loops.append(lp)
    if not loops:
        return
    mb = assert_batch_equals_scalar(loops)
    for r in mb.fallback_reason:
        event(f"scalar path: {r}" if r else "batch kernel")


@settings(max_examples=40)
@given(st.lists(random_loops(), min_size=1, max_size=12))
def test_batch_equals_scalar_on_random_loops(drawn):
    """A batch of mixed structures (grouped inside) equals the scalar path loop by loop."""
    check_random_batch(drawn)


@pytest.mark.slow
@settings(max_examples=600)
@given(st.lists(random_loops(), min_size=1, max_size=12))
def test_batch_equals_scalar_on_random_loops_large(drawn):
    check_random_batch(drawn)


def _random_loop_set(n: int, seed: int) -> list[DelayedLoop]:
    """``n`` loops from the property test's distribution, drawn with a seeded numpy generator."""
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        poles = [(1 if rng.random() < 0.2 else -1) * 10 ** rng.uniform(-1, 1) for _ in range(rng.integers(0, 4))]
        for _ in range(rng.integers(0, 3)):
            wn = 10 ** rng.uniform(-1, 1)
            zeta = rng.choice([0.0, 0.005, 0.05]) if rng.random() < 0.5 else rng.uniform(-0.3, 0.9)
            poles += [complex(-zeta * wn, wn * math.sqrt(1 - zeta ** 2)), complex(-zeta * wn, -wn * math.sqrt(1 - zeta ** 2))]
        poles += [0.0] * int(rng.choice([0, 0, 1, 1, 2]))
        poles = poles or [-(10 ** rng.uniform(-1, 1))]
        zeros = [(1 if rng.random() < 0.2 else -1) * 10 ** rng.uniform(-1, 1)
                 for _ in range(rng.integers(0, min(2, len(poles)) + 1))]
        k = 10 ** rng.uniform(-1.5, 1.5) * (1 if rng.random() < 8 / 9 else -1)
        delay = float(rng.choice([0.0, 1.0, 1.0]) * 10 ** rng.uniform(-1.5, 0.5))
        if delay > 0 and len(zeros) == len(poles):
            k = math.copysign(min(abs(k), 0.8), k)
        num = k * np.real(np.poly(zeros)) if zeros else np.array([k])
        den = np.real(np.poly(poles))
        if not _usable(num, den):
            continue
        lp = _loop(num, den, delay)
        try:
            stability_margins(lp)
        except ConfigError:
            continue
        out.append(lp)
    return out


def test_batch_equals_scalar_on_a_seeded_random_set():
    """200 random loops in one batch; the kernel itself (not the scalar fallback) must handle
    nearly every strictly proper loop without roots on the axis other than integrators."""
    loops = _random_loop_set(200, seed=14)
    mb = assert_batch_equals_scalar(loops)
    supported = np.array([lp._factored.relative_degree > 0
                          and not np.any((np.abs(r.real) <= 1e-6 * np.abs(r)) & (r != 0))
                          and not np.any(lp._factored.zeros == 0)
                          for lp in loops for r in [lp._factored.roots()]])
    assert supported.sum() > 120
    assert mb.fallback[supported].mean() <= 0.03, pd.Series(mb.fallback_reason[supported]).value_counts()
    assert mb.fallback[~supported].all()
    assert mb.fallback_count == int(mb.fallback.sum())


# --- the textbook and reference loops -----------------------------------------------------------

def test_textbook_and_reference_loops():
    pi = control.tf([25.0, 2.5], [10.0, 0.0])
    plant = control.tf([1.0], [10.0, 1.0])
    systems = [loop_transfer(pi, plant, 2.0), DelayedLoop(THREE_CROSSOVERS), DelayedLoop(OPEN_LOOP_UNSTABLE),
               DelayedLoop((S + 0.1) ** 2 / (S ** 3 * (S + 1))),
               DelayedLoop(1000 * 0.002 * (S + 0.02) * (S + 0.05) * (S + 5) * (S + 10) / (
                   (S - 0.0005) * (S + 0.0001) * (S + 0.01) * (S + 0.2) * (S + 1) * (S + 100) ** 2)),
               DelayedLoop(control.tf([1], [1, 0, 0])),  # marginal: a closed-loop pole pair on the axis
               *(DelayedLoop(control.tf(sys)) for _, sys, *_ in TSYS)]
    by_name = {t[0]: t[1] for t in TSYS}
    systems += [DelayedLoop(control.tf(by_name[name]), delay) for name, delay in DELAYED]
    mb = assert_batch_equals_scalar(systems)
    assert mb[0].gain_margin == pytest.approx(math.pi, rel=1e-9)  # L = 0.25 e^{-2s}/s: GM = pi exactly
    assert not mb.stable[5] and mb.fallback[5]                  # 1/s^2 passes through -1: the scalar decides
    # the kernel handled the strictly proper ones itself
    strictly = [i for i, lp in enumerate(systems) if lp._factored.relative_degree > 0 and i != 5]
    assert not mb.fallback[strictly].any(), mb.fallback_reason[strictly]


def test_fallbacks_are_counted_with_reasons_and_match_the_scalar_path():
    loops = [DelayedLoop(control.tf([1], [1, 0, 1, 0]), 0.1),       # undamped resonance on the axis
             DelayedLoop(3 * (10 + S) / (2 + S)),                    # biproper
             DelayedLoop(control.tf([1, 0], [1, 3, 2]), 0.2),        # a zero at s = 0
             DelayedLoop(control.tf([2], [1, 1]), 0.5)]              # the kernel's
    mb = assert_batch_equals_scalar(loops)
    assert mb.fallback.tolist() == [True, True, True, False] and mb.fallback_count == 3
    assert list(mb.fallback_reason) == ["root on the imaginary axis", "not strictly proper",
                                        "zero at s = 0 or zero gain", ""]
    assert mb.to_pandas()["fallback"].sum() == 3


def test_rejected_loops_raise_as_in_the_scalar_path():
    with pytest.raises(ConfigError, match="improper"):
        stability_margins_batch([DelayedLoop(control.tf([1, 0, 0], [1, 1]))])
    with pytest.raises(ConfigError, match="neutral loop"):
        stability_margins_batch(DelayedLoopBatch([3.0, 30.0], [1.0, 2.0], 0.1))
    with pytest.raises(ConfigError, match="loops\\[1\\]"):
        stability_margins_batch([DelayedLoop(control.tf([1], [1, 1])), "not a loop"])
    with pytest.raises(ConfigError, match="chunk_size"):
        stability_margins_batch([], chunk_size=0)


# --- the array form -----------------------------------------------------------------------------

def test_arrays_equal_loops_and_chunks_do_not_matter():
    loops = _random_loop_set(40, seed=3)
    a = stability_margins_batch(loops)
    b = stability_margins_batch(DelayedLoopBatch.from_loops(loops), chunk_size=7)
    for f in ("gain_margin", "lower_gain_margin", "phase_margin_deg", "delay_margin_s", "ms"):
        np.testing.assert_allclose(getattr(b, f), getattr(a, f), rtol=1e-9)
    assert (a.closed_loop_rhp_poles == b.closed_loop_rhp_poles).all() and (a.fallback == b.fallback).all()
    assert [d for d in b.to_dicts()] == [b[i].to_dict() for i in range(len(b))]
    assert b.meets().tolist() == [b[i].meets() for i in range(len(b))]
    assert len(stability_margins_batch([])) == 0


def test_loop_batch_validates_its_arrays():
    with pytest.raises(ConfigError, match="loops.delay"):
        DelayedLoopBatch([1.0], [1.0, 1.0], -0.1)
    with pytest.raises(ConfigError, match="loops.den"):
        DelayedLoopBatch([1.0], [[1.0, 1.0], [0.0, 0.0]], 0.1)
    with pytest.raises(ConfigError, match="loops.den"):
        DelayedLoopBatch(np.ones((3, 1)), np.ones((2, 2)), 0.1)
    with pytest.raises(ConfigError, match="loops.num"):
        DelayedLoopBatch([np.nan], [1.0, 1.0])
    lb = DelayedLoopBatch([1.0], [1.0, 1.0], [0.1, 0.2])     # a single row broadcast
    assert len(lb) == 2 and lb.loop(1).delay == 0.2


# --- the wired consumers ------------------------------------------------------------------------

def test_envelope_margins_equal_the_scalar_path(smoothed_scenario):
    from tokenfactory.controllers import admission_loop

    sc = smoothed_scenario
    env = StabilityEnvelope(delay_factors=(0.5, 1.0, 2.0, 4.0, 8.0), service_rate_factors=(0.5, 1.0, 1.5))
    rows = envelope_margins(sc.plant, sc.controller, env)
    assert len(rows) == 15 and any(not r["stable"] for r in rows) and any(r["meets_floors"] for r in rows)
    for r in rows:
        lp = admission_loop(sc.plant, sc.controller, delay_factor=r["delay_factor"],
                            service_rate_factor=r["service_rate_factor"])
        m = stability_margins(lp)
        ref = {"delay_factor": r["delay_factor"], "service_rate_factor": r["service_rate_factor"], **m.to_dict(),
               "meets_floors": m.meets(env.gm_floor, env.pm_floor_deg)}
        assert r.keys() == ref.keys()
        for k, v in ref.items():
            if isinstance(v, float):
                assert _close(r[k], v), (k, r[k], v)
            elif k not in ("gain_crossings", "phase_crossings", "gain_crossovers_rad_s", "phase_crossovers_rad_s"):
                assert r[k] == v, k
        assert len(r["phase_crossings"]) == len(ref["phase_crossings"])
    loops = envelope_loops(sc.plant, sc.controller, env)
    assert len(loops) == 15 and stability_margins_batch(loops).fallback_count == 0


def test_stability_map_equals_the_scalar_path():
    def make(theta, k):
        return DelayedLoop(control.tf([k, 0.1 * k], [1, 2, 0]), theta)

    df = stability_map(make, "theta", [0.1, 0.5, 2.0], "k", [0.3, 1.0, 4.0, 12.0])
    for _, row in df.iterrows():
        m = stability_margins(make(row["theta"], row["k"]))
        assert row["stable"] == m.stable and row["closed_loop_rhp_poles"] == m.closed_loop_rhp_poles
        for f in ("gain_margin", "lower_gain_margin", "phase_margin_deg", "delay_margin_s", "ms"):
            assert _close(row[f], getattr(m, f)), f
    assert 0 < df["stable"].sum() < len(df)


def test_gain_delay_sweep_equals_the_scalar_path():
    """The batched sweep point function (run on a 2-worker LocalCluster in test_sweep.py) gives
    the scalar path's numbers."""
    num, den, delay = [1.0, 0.07], [3.6, 14.3, 0.0, 0.0], 0.8
    fn = functools.partial(gain_delay_margins, num=num, den=den, delay=delay)
    sw = Sweep({}, grid={"gain_factor": [0.5, 1.0, 4.0, 16.0], "delay_s": [0.0, 0.5, 2.0]})
    serial = run_sweep(fn, sw, batched=True, chunk_size=5)
    for _, row in serial.iterrows():
        m = stability_margins(DelayedLoop(control.tf(np.array(num) * row["gain_factor"], den),
                                          delay + row["delay_s"]))
        assert row["stable"] == m.stable and _close(row["gain_margin"], m.gain_margin)
        assert _close(row["phase_margin_deg"], m.phase_margin_deg) and _close(row["ms"], m.ms)
    assert not serial["fallback"].any() and 0 < serial["stable"].sum() < len(serial)
    with pytest.raises(ConfigError, match="configs\\[0\\].gain_factor"):
        gain_delay_margins([{"gain_factor": -1.0}], num, den, delay)
