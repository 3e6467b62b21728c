"""The layered stack in the request simulator (tokenfactory.stack.on_requests)."""

from __future__ import annotations

import numpy as np
import pytest

from tokenfactory.stack import load_stack_scenario
from tokenfactory.stack.on_requests import morning_ramp, requests_as_rates, run_stack_on_requests
from tokenfactory.core.validation import ConfigError


def test_morning_ramp_has_the_requested_shape_and_rises():
    tr = morning_ramp(10.0, 2.0, prompt_tokens=914, output_tokens=155, seed=3)
    assert tr["input_tokens"].mean() == pytest.approx(914, rel=0.08)
    assert tr["output_tokens"].mean() == pytest.approx(155, rel=0.08)
    t = tr["arrival_s"].to_numpy()
    first, last = (t < 1800).sum(), (t >= 5400).sum()
    assert last > 1.1 * first  # the daily cycle rises from 06:00 towards its 14:00 peak
    again = morning_ramp(10.0, 2.0, prompt_tokens=914, output_tokens=155, seed=3)
    assert tr.equals(again)
    with pytest.raises(ConfigError, match="hours"):
        morning_ramp(10.0, 0.0, prompt_tokens=914, output_tokens=155)
    # a x1.6 step from 20 minutes: the same requests before it, 60 % more after it
    step = morning_ramp(10.0, 2.0, prompt_tokens=914, output_tokens=155, step_at_s=1200.0, step_factor=1.6, seed=3)
    ts = step["arrival_s"].to_numpy()
    assert (ts < 1200).sum() == (t < 1200).sum()
    assert (ts >= 1200).sum() == pytest.approx(1.6 * (t >= 1200).sum(), rel=0.05)
    assert np.all(np.diff(ts) >= 0)
    with pytest.raises(ConfigError, match="step_factor"):
        morning_ramp(10.0, 1.0, prompt_tokens=914, output_tokens=155, step_at_s=60.0, step_factor=0.5)


def test_every_layer_acts_on_requests_and_nothing_is_lost():
    sc = load_stack_scenario("stack_default")
    tr = morning_ramp(10.0, 0.25, prompt_tokens=914, output_tokens=155, step_at_s=300.0, step_factor=1.6, seed=1)
    row, r, ctrl = run_stack_on_requests(sc, tr, startup_s=60.0, control_start_s=120.0)
    m = r.metrics
    assert m["requests"] == m["completed"] + m["rejected"] + m["in_flight_end"]
    # the gate samples every 0.25 s on the live context and moves the cap; the pool layer acts
    assert row["gate_sampled"] and row["batch_cap_changes"] > 0
    caps = r.series["decode_batch_cap"].to_numpy(dtype=float)
    assert np.nanmax(caps) > np.nanmin(caps)
    assert row["actions_per_hour"] > 0
    # the stack holds the SLO on its own plant: the pass within the gate's target keeps TPOT
    assert row["slo_attainment"] >= 0.95
    tpot = r.records.loc[r.records["state"] == "completed", "tpot_s"].to_numpy(dtype=float)
    assert np.nanquantile(tpot, 0.5) <= sc.slo_tpot_s


def test_slo_aware_stack_protects_admitted_requests_through_a_step():
    """The same x1.6 step through the shipped stack (smoothed admission) and stack_slo_aware: the
    SLO-aware gate rejects what would miss, so more of what it admits meets the SLO."""
    tr = morning_ramp(10.0, 0.25, prompt_tokens=914, output_tokens=155, step_at_s=300.0, step_factor=1.6, seed=1)
    out = {}
    for name in ("stack_default", "stack_slo_aware"):
        row, r, _ = run_stack_on_requests(load_stack_scenario(name), tr, startup_s=120.0, control_start_s=120.0)
        m = r.metrics
        assert m["requests"] == m["completed"] + m["rejected"] + m["in_flight_end"]
        out[name] = m
    assert out["stack_slo_aware"]["slo_attainment_admitted"] > out["stack_default"]["slo_attainment_admitted"]
    assert out["stack_slo_aware"]["slo_attainment_admitted"] >= 0.99


def test_requests_as_rates_keeps_every_arrival_and_the_mean_request():
    tr = morning_ramp(5.0, 0.5, prompt_tokens=914, output_tokens=155, seed=2)
    wl = requests_as_rates(tr, bin_s=60.0)
    # every arrival is in one minute's bin: the rate series integrates back to the request count
    assert float((wl.demand * 60.0).sum()) == pytest.approx(len(tr))
    assert wl.prompt_tokens == round(float((tr["input_tokens"] - tr["cached_tokens"]).mean()))
    assert wl.output_tokens == round(float(tr["output_tokens"].mean()))
    with pytest.raises(ConfigError, match="bin_s"):
        requests_as_rates(tr, bin_s=0.0)
    with pytest.raises(ConfigError, match="trace"):
        run_stack_on_requests(load_stack_scenario("stack_default"), tr.iloc[:0])
