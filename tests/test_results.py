"""One result type: every plant's series has the shared columns, counts that add up, and a plot."""

import math

import numpy as np
import pandas as pd
import pytest

from tokenfactory.plant_models import (
    SERIES_COLUMNS,
    ClusterConfig,
    LoopScenario,
    PoolScenario,
    SimulationResult,
    simulate,
    simulate_loop,
    simulate_pools,
)
from conftest import ConstantAdmission, poisson_trace


def Fixed(rate, bound=math.inf):
    return ConstantAdmission(rate, bound, sample_period=0.5)


@pytest.fixture(scope="module")
def results(smoothed_scenario, des_params):
    """One overloaded run of each plant (a backlog bound makes them reject)."""
    plant = smoothed_scenario.plant
    c = plant.decode_capacity
    fluid = simulate_loop(plant, Fixed(1.2 * c, 2 * c), LoopScenario(demand=1.5 * c, duration_s=20.0))
    pools = simulate_pools(plant.params, 6, 4, PoolScenario(1.5 * c, 60.0, dt=0.5),
                           controllers=[Fixed(1.2 * c, 2 * c)])
    des = simulate(poisson_trace(1.5 * c, 20.0, 1), des_params,
                   ClusterConfig(fill_workers=6, decode_workers=4, duration_s=20.0, progress=False), Fixed(1.2 * c, 2 * c))
    return {"fluid": fluid, "pools": pools, "des": des}


@pytest.mark.parametrize("plant", ["fluid", "pools", "des"])
def test_shared_columns_and_counts(results, plant):
    r = results[plant]
    assert isinstance(r, SimulationResult)
    s = r.to_pandas()
    assert s is r.series and list(s.columns[:len(SERIES_COLUMNS)]) == list(SERIES_COLUMNS)
    assert s["time_s"].is_monotonic_increasing and s["arrived"].is_monotonic_increasing
    m = r.metrics
    assert m["requests"] == pytest.approx(m["completed"] + m["rejected"] + m["in_flight_end"], rel=1e-9)
    assert m["rejected"] > 0 and m["duration_s"] > 0
    last = s.iloc[-1]  # the last sample may precede the end by less than one sample period
    assert 0.98 * m["requests"] <= last["arrived"] <= m["requests"] * (1 + 1e-9)
    assert 0.95 * m["rejected"] <= last["rejected"] <= m["rejected"] * (1 + 1e-9)
    if plant != "pools":  # the pool model's fill_in_progress is what a scrape would count, not its queue
        in_system = s["backlog"] + s["fill_in_progress"] + s["ready"] + s["active_decodes"]
        np.testing.assert_allclose(s["arrived"], s["completed"] + s["rejected"] + in_system, rtol=1e-6, atol=1e-6)
    assert (r.records is not None) == (plant == "des")
    assert set(r.actions.columns) >= {"time_s", "kind"}
    assert r.config


def test_slo_misses_add_up_to_the_requests_and_the_attainment(results):
    r = results["des"]
    miss = r.slo_misses()
    parts = miss["met"] + sum(miss["rejected"].values()) + miss["late_ttft"] + miss["late_tpot"] + miss["unfinished"]
    assert parts == miss["requests"] == len(r.records)
    assert miss["rejected"] and sum(miss["rejected"].values()) == r.metrics["rejected"]
    assert miss["met"] / r.metrics["requests"] == pytest.approx(r.metrics["slo_attainment"], abs=1e-9)
    assert miss["unfinished"] == r.metrics["in_flight_end"]
    half = r.records["arrival_s"].median()
    first, second = r.slo_misses((0.0, half)), r.slo_misses((half, math.inf))
    assert first["requests"] + second["requests"] == miss["requests"]
    assert first["met"] + second["met"] == miss["met"]
    with pytest.raises(ValueError, match="per-request records"):
        results["pools"].slo_misses()


def test_records_are_flat_rows(results):
    rec = results["des"].records
    assert results["des"].requests is rec  # the former name
    assert len(rec) == results["des"].metrics["requests"]
    assert set(rec["state"].cat.categories) == {"not_arrived", "backlog", "fill", "transfer", "ready", "decode",
                                                 "completed", "rejected", "deferred"}
    done = rec[rec["state"] == "completed"]
    assert (done["completion_s"] >= done["first_token_s"]).all() and (done["ttft_s"] >= 0).all()


def test_plot_delegates_to_plots(results):
    for r in results.values():
        ax = r.plot(["ready", "backlog"])
        assert [ln.get_label() for ln in ax.get_lines()] == ["ready", "backlog"]
        assert len(ax.get_lines()[0].get_xdata()) == len(r.series)


def test_window_and_sampled(results):
    r = results["fluid"]
    w = r.window(10.0, 12.0)
    assert r.time[w].min() >= 10.0 and r.time[w].max() <= 12.0
    x = r.sampled("ready", 0.1, 5.0)
    assert len(x) == pytest.approx((r.time[-1] - 5.0) / 0.1 + 1, abs=1)
    assert isinstance(r.series, pd.DataFrame)
