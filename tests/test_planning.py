"""The planning layer's short-horizon correction: the interval volatility, the volatility-scaled
headroom replay (historical simulation with volatility updating) and the planner and pool rule
that use it."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from tokenfactory.controllers.planning import (
    EXCESS_BUDGET_SHARE,
    VOLATILITY_SCALE_BOUNDS,
    DemandPlanner,
    PlannedPoolController,
    calibrate_headroom,
    interval_volatility,
    rise_profile,
)
from tokenfactory.core.signals import Measurement
from tokenfactory.stack import build_stack, load_stack_scenario, stack_scenario_from_dict
from tokenfactory.core.validation import ConfigError

DAY = 86400.0


def _m(t: float, rate: float) -> Measurement:
    return Measurement(time_s=t, backlog=0.0, fill_in_progress=0.0, ready=0.0, active_decodes=0.0,
                       completion_rate=rate, admitted_rate=rate, decode_slots=100.0, fill_capacity=1000.0,
                       fill_workers=3, decode_workers=3, arrival_rate=rate)


def _volatile_hour_days(days: int = 4, seed: int = 3, starts_h=(9, 17, 12, 20)) -> pd.Series:
    """Demand on the planner's 10-minute grid: 100 req/s with 2 % noise, and every day a two-hour
    window (from ``starts_h[day]``, a different hour each day, so no daily profile holds it) of
    jumps of up to +-40 % between intervals (a tenant's bursty batch)."""
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, days * DAY, 600.0)
    v = 100.0 * (1.0 + 0.02 * rng.standard_normal(len(t)))
    start = np.asarray(starts_h, dtype=float)[(t // DAY).astype(int) % len(starts_h)] * 3600.0
    burst = (t % DAY >= start) & (t % DAY < start + 7200.0)
    v[burst] *= 1.0 + 0.4 * rng.choice([-1.0, 1.0], burst.sum()) * rng.uniform(0.5, 1.0, burst.sum())
    return pd.Series(v, index=pd.Index(t, name="time_s"))


def test_interval_volatility_by_hand():
    y = pd.Series([100.0, 200.0, 100.0, 100.0], index=np.arange(4) * 600.0)
    s = interval_volatility(y, 600.0)  # weights e^-1 per interval, normalised over the changes seen
    ln2, q = math.log(2.0), math.exp(-1.0)
    assert math.isnan(s.iloc[0])
    assert s.iloc[1:].to_numpy() == pytest.approx([ln2, ln2, ln2 * math.sqrt((q + q * q) / (1 + q + q * q))])
    with pytest.raises(ConfigError, match="volatility_window_s"):
        interval_volatility(y, 0.0)


def test_a_unit_scale_replays_the_constant_headroom():
    y = _volatile_hour_days()
    prof = rise_profile(y, 670.0, days=3, smooth_s=600.0)
    kw = dict(excess_budget=0.0075, utilization=0.97, hold_s=630.0, days=3)
    assert calibrate_headroom(y, prof, 670.0, **kw, scale=pd.Series(1.0, index=y.index)) == \
        pytest.approx(calibrate_headroom(y, prof, 670.0, **kw))


def test_the_headroom_follows_the_last_hours_volatility():
    hist = _volatile_hour_days()
    lead = 670.0
    # a budget that the hold alone does not meet: the bursts need a margin
    kw = dict(lead_s=lead, history=hist, time_offset_s=4 * DAY, hold_s=630.0, excess_budget=0.002)
    scaled, const = DemandPlanner(**kw), DemandPlanner(**kw, volatility_window_s=0.0)
    assert scaled.params()["volatility_window_s"] == 3600.0 and const.params()["volatility_window_s"] == 0.0
    rng = np.random.default_rng(11)
    day = _volatile_hour_days(days=1, seed=7, starts_h=(14,))  # the run's day: its burst from 14:00
    in_force = {"scaled": {}, "const": {}}
    for t in np.arange(0.0, DAY, 600.0):
        rate = float(day.iloc[int(t // 600)]) * (1.0 + 0.001 * rng.standard_normal())
        for key, p in (("scaled", scaled), ("const", const)):
            p.update(t, _m(t, rate))
            in_force[key][t] = p.headroom_at(t)
    # both replays meet the budget; the constant rule carries the burst's margin all day
    for p in (scaled, const):
        assert p.replay_excess <= p.excess_budget
    calm = [t for t in in_force["scaled"] if 2 * 3600 <= t < 12 * 3600]
    late_burst = [t for t in in_force["scaled"] if 15 * 3600 <= t < 16 * 3600]
    assert max(in_force["scaled"][t] for t in calm) < 0.5 * const.headroom
    assert min(in_force["scaled"][t] for t in late_burst) > const.headroom
    # the scale is bounded and its mean over the replayed days is one (before the bounds)
    lo, hi = VOLATILITY_SCALE_BOUNDS
    scales = [r["volatility_scale"] for r in scaled.trace]
    assert min(scales) >= lo - 1e-12 and max(scales) <= hi + 1e-12
    assert math.isnan(const.volatility_mean) and all(r["volatility_scale"] == 1.0 for r in const.trace)


def test_the_pool_rule_sizes_for_the_headroom_in_force():
    hist = _volatile_hour_days()
    p = DemandPlanner(lead_s=670.0, history=hist, time_offset_s=4 * DAY, utilization=1.0)
    c = PlannedPoolController("fill", 10.0, planner=p, target_utilization=1.0, filter_s=0.0, sample_period=10.0)
    p.update(0.0, _m(0.0, 100.0))
    p.volatility_scale = 2.0  # as after a volatile hour
    c.update(0.0, _m(0.0, 100.0))
    assert c.headroom == pytest.approx(2.0 * p.headroom)
    assert c.last_hold == pytest.approx(100.0 * p.rise(0.0) * (1.0 + 2.0 * p.headroom))


@pytest.mark.parametrize("window, match", [(300.0, "at least one interval"), (2 * DAY, "volatility_window_s")])
def test_a_bad_volatility_window_is_named(window, match):
    with pytest.raises(ConfigError, match=match):
        DemandPlanner(lead_s=670.0, volatility_window_s=window)


def test_the_stack_scenario_takes_the_window():
    sc = load_stack_scenario("stack_default")
    # the default budget: half the SLO's miss budget
    assert build_stack(sc)[0].layer("planning").controllers[0].excess_budget == pytest.approx(
        EXCESS_BUDGET_SHARE * (1.0 - sc.slo_attainment))
    d = {**sc.config, "layers": {**sc.config["layers"],
                                 "planning": {**sc.config["layers"]["planning"], "volatility_window_s": 0.0}}}
    planner = build_stack(stack_scenario_from_dict(d))[0].layer("planning").controllers[0]
    assert planner.volatility_window_s == 0.0
    default = build_stack(sc)[0].layer("planning").controllers[0]
    assert default.volatility_window_s == 3600.0
    d["layers"]["planning"]["volatility_window_s"] = -1.0
    with pytest.raises(ConfigError, match="layers.planning.volatility_window_s"):
        stack_scenario_from_dict(d)
    d["layers"]["planning"].update(volatility_window_s=3600.0, profile_smooth_s=1800.0)
    assert build_stack(stack_scenario_from_dict(d))[0].layer("planning").controllers[0].profile_smooth_s == 1800.0
    with pytest.raises(ConfigError, match="planner.profile_smooth_s"):
        DemandPlanner(lead_s=670.0, profile_smooth_s=-1.0)
