"""One call shape for the three plants (tokenfactory.plant_models.plant_protocol): the same control
stack runs on the fluid loop, the pool model and the request simulator through ``plant.run(workload,
controllers)``, each run equal to the plant's own function and conserving requests."""

from __future__ import annotations

import pandas as pd
import pytest

from conftest import ConstantAdmission, poisson_trace
from tokenfactory.controllers.control_stack import ControlStack, StackLayer
from tokenfactory.core.errors import ConfigError
from tokenfactory.plant_models import (
    ClusterConfig,
    FluidLoopPlant,
    FluidParams,
    FluidPlant,
    LoopScenario,
    Plant,
    PoolPlant,
    PoolScenario,
    RequestPlant,
    RequestShape,
    Worker,
    accelerator_preset,
    model_preset,
    simulate,
    simulate_loop,
    simulate_pools,
)


def _stack(rate: float, bound: float = 2.0) -> ControlStack:
    # a bare admission controller runs as a stack's admission layer on every plant
    return ControlStack([StackLayer("admission", [ConstantAdmission(rate, bound, sample_period=1.0)], 1.0)], "constant")


@pytest.fixture(scope="module")
def fluid_params():
    w = Worker(model_preset("deepseek-v3"), accelerator_preset("h200"))
    return FluidParams.from_workers(w, w, RequestShape(2048, 512))


def _conserves(r) -> bool:
    m = r.metrics
    return m["requests"] == pytest.approx(m["completed"] + m["rejected"] + m["in_flight_end"], rel=1e-6, abs=1.0)


def test_the_fluid_loop_and_the_pool_model_run_one_stack_as_their_own_functions(fluid_params):
    rate = 0.5 * fluid_params.fill_rate_per_worker
    loop = FluidLoopPlant(FluidPlant(fluid_params, 1, 1))
    pools = PoolPlant(fluid_params, 1, 1)
    assert isinstance(loop, Plant) and isinstance(pools, Plant)
    lsc = LoopScenario(demand=rate, duration_s=120.0, dt=0.1)
    r = loop.run(lsc, [_stack(rate)])
    assert _conserves(r) and r.metrics["completed"] > 0
    pd.testing.assert_frame_equal(r.series, simulate_loop(FluidPlant(fluid_params, 1, 1), [_stack(rate)], lsc).series)
    demand = pd.Series([rate, rate], index=[0.0, 600.0])
    psc = PoolScenario(demand, 600.0, dt=1.0, seed=3)
    r = pools.run(psc, [_stack(rate)])
    assert _conserves(r) and r.metrics["completed"] > 0
    pd.testing.assert_frame_equal(r.series, simulate_pools(fluid_params, 1, 1, psc, controllers=[_stack(rate)]).series)
    with pytest.raises(ConfigError, match="controllers"):
        loop.run(lsc, [])
    # a run from a given state (the loop half full) is simulate_loop's from that state, not the empty start
    x0 = FluidPlant(fluid_params, 1, 1).initial_state(ready=20.0, backlog=5.0)
    r0 = loop.run(lsc, [_stack(rate)], x0=x0)
    pd.testing.assert_frame_equal(r0.series, simulate_loop(FluidPlant(fluid_params, 1, 1), [_stack(rate)], lsc,
                                                           x0=x0).series)
    assert r0.series["ready"].iloc[0] == pytest.approx(20.0)
    assert loop.run(lsc, [_stack(rate)]).series["ready"].iloc[0] == 0.0  # the empty start


def test_the_request_simulator_samples_a_stacks_admission_per_request(des_params):
    trace = poisson_trace(2.0, 60.0, seed=4)
    cluster = ClusterConfig(fill_workers=1, decode_workers=1, seed=4)
    plant = RequestPlant(des_params, cluster)
    assert isinstance(plant, Plant)
    r = plant.run(trace, [_stack(1.0)])
    adm, scalers = _stack(1.0).split()
    direct = simulate(trace, des_params, cluster, adm, scalers)
    pd.testing.assert_frame_equal(r.records, direct.records)
    assert _conserves(r) and r.metrics["rejected"] > 0   # admitting 1 of 2 req/s sheds the rest
    with pytest.raises(ConfigError, match="2 admission layers"):
        plant.run(trace, [_stack(1.0), _stack(1.0)])


def test_the_request_simulator_takes_a_bare_admission_controller(des_params):
    # what run_replay (tokenfactory simulate) and the studies pass: one admission controller, sampled
    # per request, equal to the simulator's own function; with a stack's admission too it is an error
    trace = poisson_trace(2.0, 60.0, seed=5)
    cluster = ClusterConfig(fill_workers=1, decode_workers=1, seed=5)
    r = RequestPlant(des_params, cluster).run(trace, admission=ConstantAdmission(1.0, 2.0, sample_period=1.0))
    direct = simulate(trace, des_params, cluster, ConstantAdmission(1.0, 2.0, sample_period=1.0))
    pd.testing.assert_frame_equal(r.records, direct.records)
    assert _conserves(r) and r.metrics["rejected"] > 0
    with pytest.raises(ConfigError, match="2 admission layers"):
        RequestPlant(des_params, cluster).run(trace, [_stack(1.0)], admission=ConstantAdmission(1.0, 2.0))
