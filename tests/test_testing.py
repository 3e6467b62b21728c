"""The users' regression helpers pass on good configurations and fail, with figures, on bad ones."""

import copy
import dataclasses

import control
import pytest
from conftest import poisson_trace

from tokenfactory.controllers import DelayedLoop
from tokenfactory.plant_models import ClusterConfig, LoopScenario, simulate, simulate_loop
from tokenfactory.studies.feedback_oscillation import scenario_path
from tokenfactory.testing import assert_conserved, assert_margins, assert_no_oscillation


@pytest.fixture(scope="module")
def loop_runs(naive_scenario, smoothed_scenario):
    out = {}
    for name, sc in (("naive", naive_scenario), ("smoothed", smoothed_scenario)):
        x0 = sc.plant.initial_state(getattr(sc.controller, "target_ready", 200.0), 1000.0)
        out[name] = simulate_loop(sc.plant, sc.controller, LoopScenario(demand=sc.plant.decode_capacity,
                                                                        duration_s=90.0, dt=0.01), x0=x0)
    return out


def test_no_oscillation_passes_on_smoothed_and_fails_on_naive(loop_runs):
    rep = assert_no_oscillation(loop_runs["smoothed"].sampled("ready", 0.05, 40), 0.05, min_amplitude=1.0)
    assert not rep.oscillating
    with pytest.raises(AssertionError, match=r"ready oscillates: period .* Thornhill r = "):
        assert_no_oscillation(loop_runs["naive"].sampled("ready", 0.05, 40), 0.05, min_amplitude=1.0, name="ready")


def test_no_oscillation_counts_reversals():
    flapping = [{"pool": "decode", "from": 2, "to": 1}, {"pool": "decode", "from": 1, "to": 2},
                {"pool": "decode", "from": 2, "to": 1}]
    assert_no_oscillation([0.0] * 64, 1.0, actions=flapping, max_reversals=2)
    with pytest.raises(AssertionError, match="2 scale reversals"):
        assert_no_oscillation([0.0] * 64, 1.0, actions=flapping, max_reversals=1, name="decode pool")


def test_margins_pass_on_the_shipped_scenario_and_name_the_missed_floor():
    ms = assert_margins(scenario_path("smoothed"), gm=2.0, pm=45.0, delay_margin=0.5)
    assert len(ms) == 9 and all(m.stable for m in ms)
    with pytest.raises(AssertionError, match=r"phase margin [\d.]+ deg < 80 deg"):
        assert_margins(scenario_path("smoothed"), pm=80.0)


def test_margins_fail_on_an_unstable_loop():
    # an integrator with gain 3 /s behind 1 s of delay: crossover 3 rad/s, phase -90 - 172 deg
    loop = DelayedLoop(control.tf([3.0], [1.0, 0.0]), 1.0, "too fast")
    with pytest.raises(AssertionError, match="too fast: closed loop unstable"):
        assert_margins(loop)
    assert_margins(DelayedLoop(control.tf([0.3], [1.0, 0.0]), 1.0), gm=2.0, pm=45.0)


def test_margins_refuse_a_relay_scenario():
    with pytest.raises(AssertionError, match="not one"):
        assert_margins(scenario_path("naive"))


@pytest.fixture(scope="module")
def des_run(des_params):
    tr = poisson_trace(20.0, 60.0, 3)
    return simulate(tr, des_params, ClusterConfig(fill_workers=1, decode_workers=1, duration_s=40.0,
                                                  progress=False))


def test_conserved_passes_on_every_plant(des_run, loop_runs):
    c = assert_conserved(des_run)
    assert c["arrived"] == c["completed"] + c["rejected"] + c["in_flight"] > 0
    assert_conserved(loop_runs["smoothed"])


def test_conserved_fails_when_a_request_is_lost(des_run, loop_runs):
    lost = copy.copy(des_run)
    lost.metrics = {**des_run.metrics, "completed": des_run.metrics["completed"] - 1}
    with pytest.raises(AssertionError, match="requests not conserved: arrived .* residual 1"):
        assert_conserved(lost)
    leaky = dataclasses.replace(loop_runs["smoothed"],
                                metrics={**loop_runs["smoothed"].metrics, "conservation_residual": 5.0})
    with pytest.raises(AssertionError, match="residual 5"):
        assert_conserved(leaky)


def test_conserved_fails_on_a_rejection_without_reason(des_run):
    bad = copy.copy(des_run)
    rec = des_run.records.copy()
    i = rec.index[rec["state"] == "completed"][0]
    rec["state"] = rec["state"].astype(str)
    rec.loc[i, "state"] = "rejected"
    rec.loc[i, "reject_reason"] = ""
    bad.records = rec
    bad.metrics = {**des_run.metrics, "completed": des_run.metrics["completed"] - 1,
                   "rejected": des_run.metrics["rejected"] + 1}
    with pytest.raises(AssertionError, match="carry no reason"):
        assert_conserved(bad)


def test_margins_read_the_nyquist_verdict_not_the_sign_of_pm():
    """python-control's margin_test.py loops: a conditionally stable loop (type3 x 0.1: unstable
    below 0.626 x its gain) fails a GM floor of 2 on its lower gain margin; a stable loop with a
    crossover at +22 deg phase passes its PM floor."""
    s = control.tf("s")
    with pytest.raises(AssertionError, match=r"lower gain margin 0.62\d+ > 1/2"):
        assert_margins(DelayedLoop(0.1 * (s + 0.1) ** 2 / (s**3 * (s + 1)), 0.0, "type3"), gm=2.0)
    three = (8.75 * (4 * s**2 + 0.4 * s + 1)) / ((100 * s + 1) * (s**2 + 0.22 * s + 1)) / (s**2 / 100 + 0.008 * s + 1)
    (m,) = assert_margins(DelayedLoop(three), gm=2.0, pm=45.0, delay_margin=2.0)
    assert m.phase_margin_deg > 45 and min(c.phase_margin_deg for c in m.gain_crossings) < -150
