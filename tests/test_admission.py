"""Regression tests for no-oscillation: the smoothed loop must stay quiet and keep its margin
floors over the envelope; the naive loop must be caught. Failure messages print the detectors."""

import dataclasses
import math

import numpy as np
import pytest

from tokenfactory.controllers import (
    CompletionTriggeredAdmission,
    SmoothedAdmission,
    ThresholdAdmission,
    admission_loop,
    assess,
    stability_margins,
)
from tokenfactory.plant_models import FluidPlant, Measurement, simulate_loop
from tokenfactory import ConfigError

DURATION = 160.0
ASSESS_FROM = 60.0


def _run(plant, ctrl, sim, ready0):
    # demand = this plant's decode capacity: the saturated regime, where the ready buffer is regulated
    sim = dataclasses.replace(sim, duration_s=DURATION, demand=plant.decode_capacity)
    r = simulate_loop(plant, ctrl, sim, x0=plant.initial_state(ready0, 5 * plant.decode_capacity))
    return r, assess(r.sampled("ready", 0.05, ASSESS_FROM), 0.05, min_amplitude=1.0)


@pytest.mark.parametrize("delay_factor", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("rate_factor", [0.7, 1.0, 1.3])
def test_smoothed_loop_does_not_oscillate(smoothed_scenario, delay_factor, rate_factor):
    sc = smoothed_scenario
    ctrl = sc.controller
    m = stability_margins(admission_loop(sc.plant, ctrl, delay_factor=delay_factor, service_rate_factor=rate_factor))
    assert m.gain_margin >= 2.0 and m.phase_margin_deg >= 45.0, f"margins below floors: {m}"
    plant = FluidPlant(sc.plant.params.scaled(delay_factor=delay_factor, service_rate_factor=rate_factor),
                       sc.plant.fill_workers, sc.plant.decode_workers)
    r, rep = _run(plant, ctrl, sc.simulation, ctrl.target_ready)
    assert not rep.oscillating, f"smoothed loop oscillates at delay x{delay_factor}, rate x{rate_factor}: {rep}"
    w = r.window(ASSESS_FROM)
    assert r.column("decode_utilization")[w].mean() > 0.999
    assert abs(r.column("ready")[w].mean() - ctrl.target_ready) < 0.05 * ctrl.target_ready


@pytest.mark.parametrize("delay_factor", [0.5, 1.0, 2.0])
def test_naive_loop_is_flagged(naive_scenario, delay_factor):
    sc = naive_scenario
    plant = FluidPlant(sc.plant.params.scaled(delay_factor=delay_factor), sc.plant.fill_workers,
                       sc.plant.decode_workers)
    _, rep = _run(plant, sc.controller, sc.simulation, sc.controller.low_water)
    assert rep.oscillating, f"naive loop not flagged at delay x{delay_factor}: {rep}"


def test_threshold_rule_is_flagged(smoothed_scenario):
    sc = smoothed_scenario
    _, rep = _run(sc.plant, ThresholdAdmission(), sc.simulation, 100.0)
    assert rep.oscillating, str(rep)


def test_detuned_smoothed_loop_is_caught(smoothed_scenario):
    """The regression test can fail: 8x the PI gain at 2x the delay brings a limit cycle back."""
    sc = smoothed_scenario
    c = sc.controller
    hot = SmoothedAdmission(c.target_ready, dataclasses.replace(c.gains, kc=8 * c.gains.kc),
                            filter_tau=c.filter_tau, service_filter_tau=c.service_filter_tau,
                            sample_period=c.sample_period, rate_limit=c.rate_limit, backlog_bound=c.backlog_bound)
    assert not stability_margins(admission_loop(sc.plant, hot, delay_factor=2.0)).stable
    plant = FluidPlant(sc.plant.params.scaled(delay_factor=2.0), sc.plant.fill_workers, sc.plant.decode_workers)
    _, rep = _run(plant, hot, sc.simulation, c.target_ready)
    assert rep.oscillating, str(rep)


def _m(**kw):
    base = dict(time_s=0.0, backlog=100.0, fill_in_progress=10.0, ready=50.0, active_decodes=900.0,
                completion_rate=100.0, admitted_rate=100.0, decode_slots=1000.0, fill_capacity=300.0)
    return Measurement(**{**base, **kw})


def test_naive_is_a_relay_around_completions():
    n = CompletionTriggeredAdmission(open_gain=0.5, low_water=20.0)
    assert n.update(0, _m(ready=10.0)).rate == pytest.approx(150.0)
    assert n.update(0, _m(ready=30.0)).rate == pytest.approx(50.0)
    assert n.describing_nonlinearity(100.0).describing_function(10.0) == pytest.approx(4 * 50 / (math.pi * 10))


def test_threshold_hysteresis():
    t = ThresholdAdmission(threshold=1.0, hysteresis=0.1, signal="kv_occupancy")
    assert t.update(0, _m(active_decodes=900, ready=50)).rate == 300.0     # 0.95 < 1.0: open
    assert t.update(0, _m(active_decodes=980, ready=50)).rate == 0.0       # 1.03: closed
    assert t.update(0, _m(active_decodes=900, ready=50)).rate == 0.0       # 0.95 > 0.9: still closed
    assert t.update(0, _m(active_decodes=850, ready=10)).rate == 300.0     # 0.86 < 0.9: reopen
    t.reset()
    assert t.update(0, _m(active_decodes=900, ready=50)).rate == 300.0


def test_smoothed_anti_windup_and_limits(smoothed_scenario):
    c = smoothed_scenario.controller
    c.reset()
    # empty backlog and an empty ready buffer for a long time: the integral must not wind up
    for k in range(400):
        c.update(k * c.sample_period, _m(ready=0.0, backlog=0.0, admitted_rate=50.0, completion_rate=50.0))
    assert c._integral == 0.0
    a = c.update(0, _m(ready=0.0, backlog=1e4, completion_rate=50.0))
    assert a.rate <= 300.0 and a.backlog_bound == c.backlog_bound
    c.reset()
    rates = [c.update(k * 0.25, _m(ready=1e5 if k > 3 else 0.0, backlog=1e4)).rate for k in range(10)]
    assert min(rates) >= 0.0
    assert max(abs(np.diff(rates))) <= c.rate_limit * c.sample_period + 1e-9
    c.reset()


def test_smoothed_transfer_function_is_the_pi(smoothed_scenario):
    c = smoothed_scenario.controller
    tf = c.transfer_function()
    w = 0.37
    assert complex(tf(1j * w)) == pytest.approx(c.gains.kc * (1 + 1 / (c.gains.ti * 1j * w)))


@pytest.mark.parametrize("kw,field", [
    ({"open_gain": 1.5}, "naive.open_gain"),
    ({"low_water": -1}, "naive.low_water"),
    ({"sample_period": 0}, "naive.sample_period"),
])
def test_bad_naive(kw, field):
    with pytest.raises(ConfigError, match=field):
        CompletionTriggeredAdmission(**kw)
