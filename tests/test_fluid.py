import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tokenfactory.plant_models.fluid as fluid
from tokenfactory.plant_models import (
    ConservationError,
    DecodeRateDip,
    DecodeWorkersLost,
    DemandStep,
    FluidParams,
    LoopScenario,
    RequestShape,
    Worker,
    accelerator_preset,
    model_preset,
    simulate_loop,
)
from tokenfactory import ConfigError


from conftest import ConstantAdmission as ConstantRate


@pytest.fixture(scope="module")
def plant(smoothed_scenario):
    return smoothed_scenario.plant


def test_params_derive_from_roofline():
    w = Worker(model_preset("deepseek-v3"), accelerator_preset("h200"))
    shape = RequestShape(2048, 512)
    p = FluidParams.from_workers(w, w, shape)
    # exponential output lengths (cv 1): an active decode holds 2048 + 512 (1 + 1)/2 = 2560 tokens
    assert shape.mean_active_context_tokens == 2560
    fill = w.prefill(2048, sequences=8)  # one prompt per attention replica
    assert p.fill_rate_per_worker == pytest.approx(fill.tokens_per_s / 2048)
    assert p.fill_latency_s == pytest.approx(fill.time_s)
    assert p.decode_slots_per_worker == w.decode_slots(2560)
    assert p.decode_step_s(w.decode_slots(2560)) == pytest.approx(w.decode(w.decode_slots(2560), 2560).time_s)
    assert RequestShape(2048, 512, output_cv=0.0).mean_active_context_tokens == 2048 + 256
    # KV blob of 2048 tokens x 70,272 B over 8 x 50 GB/s, plus 5 ms setup
    assert p.kv_transfer_s == pytest.approx(2048 * 70272 / (8 * 50e9) + 0.005)


def test_linearisation_gives_integrator(plant):
    tf, theta = plant.ready_buffer_tf()
    num, den = np.asarray(tf.num[0][0]), np.asarray(tf.den[0][0])
    assert den[-1] == pytest.approx(0.0, abs=1e-9)  # pole at the origin
    assert num[-1] / den[-2] == pytest.approx(1.0, rel=1e-5)  # unit gain: requests per request
    assert theta == pytest.approx(plant.params.fill_to_ready_s)


def test_fill_to_ready_delay_is_exact(plant):
    """A constant admission reaches the ready buffer exactly theta later: W(t) = a min(t, theta)."""
    a = 50.0
    sc = LoopScenario(demand=a, duration_s=2.0, dt=0.001)
    x0 = np.zeros(len(fluid.STATES))
    x0[0] = 1e4
    x0[fluid.STATES.index("arrived")] = 1e4
    r = simulate_loop(plant, ConstantRate(a), sc, x0=x0)
    theta = plant.params.fill_to_ready_s
    expected = a * np.minimum(r.time, theta)
    assert np.max(np.abs(r.column("fill_in_progress") - expected)) <= a * 0.002


def test_measurement_delay_is_what_the_controller_sees(plant):
    ctrl = ConstantRate(plant.decode_capacity)
    sc = LoopScenario(demand=plant.decode_capacity, duration_s=5.0, dt=0.01)
    r = simulate_loop(plant, ctrl, sc, x0=plant.initial_state(100.0, 1000.0))
    tau = plant.params.measurement_delay_s
    for t, m in ctrl.seen[10:]:
        k = int(round((t - tau) / sc.dt))
        assert m.ready == pytest.approx(r.column("ready")[k], rel=1e-9, abs=1e-9)
        assert m.time_s == pytest.approx(t - tau)


def test_littles_law_in_decode(plant):
    # at saturation: decoding = completion rate x mean decode time
    sc = LoopScenario(demand=plant.decode_capacity, duration_s=60.0, dt=0.01)
    r = simulate_loop(plant, ConstantRate(plant.decode_capacity), sc, x0=plant.initial_state(100.0, 2000.0))
    w = r.window(30.0)
    D, c = r.column("active_decodes")[w].mean(), r.column("completion_rate")[w].mean()
    assert D == pytest.approx(c * plant.params.mean_decode_s(), rel=1e-3)


disturbance = st.one_of(
    st.builds(DemandStep, st.floats(0, 50), st.floats(0.2, 3.0)),
    st.builds(DecodeRateDip, st.floats(0, 50), st.floats(1, 30), st.floats(0.1, 1.0)),
    st.builds(DecodeWorkersLost, st.floats(0, 50), st.floats(0.0, 0.9)),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(demand_factor=st.floats(0.1, 2.0), noise=st.floats(0, 0.5), seed=st.integers(0, 2**31 - 1),
       dists=st.lists(disturbance, max_size=3), rate=st.floats(0, 2.0), bound_s=st.floats(0.5, 60))
def test_conservation_under_random_scenarios(plant, demand_factor, noise, seed, dists, rate, bound_s):
    c = plant.decode_capacity
    sc = LoopScenario(demand=demand_factor * c, duration_s=60.0, dt=0.01, demand_noise_cv=noise, seed=seed,
                      disturbances=tuple(dists))
    r = simulate_loop(plant, ConstantRate(rate * c, bound_s * c), sc, x0=plant.initial_state(50.0, 100.0))
    s = r.series
    in_system = s["backlog"] + s["fill_in_progress"] + s["ready"] + s["active_decodes"]
    np.testing.assert_allclose(s["arrived"], s["completed"] + s["rejected"] + in_system,
                               rtol=1e-7, atol=1e-6 * max(1.0, s["arrived"].iloc[-1]))
    assert s["backlog"].min() >= -1e-6 and s["ready"].min() >= -1e-6


def test_shedding_over_bound_and_eviction_are_counted(plant):
    c = plant.decode_capacity
    sc = LoopScenario(demand=2 * c, duration_s=60.0, dt=0.01,
                      disturbances=(DecodeWorkersLost(10.0, 0.25),))
    r = simulate_loop(plant, ConstantRate(c, bound=5 * c), sc, x0=plant.initial_state(50.0, 0.0))
    assert r.column("rejected")[-1] > 0.5 * c * 40  # half the excess demand over 40 s at least
    # the bound is enforced as a fluid drain (Q - bound)/shed_tau: steady excess = c x shed_tau
    assert r.column("backlog")[r.window(40.0)].max() <= 5 * c + 1.01 * c * plant.params.shed_tau_s
    lost_slots = 0.25 * plant.params.decode_slots(plant.decode_workers)
    assert 0.8 * lost_slots < r.column("requeued")[-1] <= lost_slots  # the sequences on lost workers


def test_conservation_violation_is_an_error(plant, monkeypatch):
    real = fluid._dynamics

    def leaky(t, x, u, params):
        dx = real(t, x, u, params)
        dx[3] -= 0.1  # decodes vanish without being counted
        return dx

    monkeypatch.setattr(fluid, "_dynamics", leaky)
    with pytest.raises(ConservationError, match="lost requests"):
        simulate_loop(plant, ConstantRate(10.0), LoopScenario(demand=10.0, duration_s=10.0),
                      x0=plant.initial_state(10.0, 10.0))


def test_same_config_same_result(plant):
    sc = LoopScenario(demand=plant.decode_capacity, duration_s=30.0, demand_noise_cv=0.2, seed=3)
    a = simulate_loop(plant, ConstantRate(100.0), sc, x0=plant.initial_state(10.0, 10.0)).to_pandas()
    b = simulate_loop(plant, ConstantRate(100.0), sc, x0=plant.initial_state(10.0, 10.0)).to_pandas()
    assert a.equals(b)
    c = simulate_loop(plant, ConstantRate(100.0), dataclasses.replace(sc, seed=4),
                      x0=plant.initial_state(10.0, 10.0)).to_pandas()
    assert not a.equals(c)


@pytest.mark.parametrize("kw,field", [
    ({"demand": -1.0}, "scenario.demand"),
    ({"demand": 1.0, "dt": 0.0}, "scenario.dt"),
    ({"demand": 1.0, "demand_noise_cv": -0.1}, "scenario.demand_noise_cv"),
])
def test_bad_scenario(kw, field):
    with pytest.raises(ConfigError, match=field):
        LoopScenario(**kw)


def test_scenario_from_dict_rejects_unknown_disturbance():
    with pytest.raises(ConfigError, match=r"disturbances\[0\].kind"):
        LoopScenario.from_dict({"disturbances": [{"kind": "meteor", "at_s": 1}]}, demand=1.0)
    with pytest.raises(ConfigError, match=r"disturbances\[0\].size"):
        LoopScenario.from_dict({"disturbances": [{"kind": "demand_step", "at_s": 1, "size": 2}]}, demand=1.0)


def test_sample_period_shorter_than_step_is_an_error(plant):
    ctrl = ConstantRate(1.0)
    ctrl.sample_period = 0.001
    with pytest.raises(ConfigError, match="sample_period"):
        simulate_loop(plant, ctrl, LoopScenario(demand=1.0, duration_s=1.0, dt=0.01))


def test_the_decode_context_the_plants_read_is_a_compared_field(fp):
    # the plants report the pass table's context to a batch gate: it is a compared field (not provenance), so two
    # plants at different contexts are different keys to every cache over FluidParams
    from tokenfactory.plant_models import PoolScenario, simulate_pools

    assert fp.decode_context_tokens == fp.provenance["decode_context_tokens"] > 0
    other = dataclasses.replace(fp, decode_context_tokens=2 * fp.decode_context_tokens)
    assert other != fp and hash(other) != hash(fp)
    # what the model reads is the field: the pool model's measurements carry it
    seen = []

    class Recorder:
        sample_period = 1.0

        def reset(self):
            pass

        def update(self, t, m):
            seen.append(m.decode_context_tokens)
            return None

    simulate_pools(other, 2, 2, PoolScenario(1.0, 5.0, dt=1.0), controllers=[Recorder()])
    # (the first sample precedes any decode: no context yet)
    assert seen[-1] == other.decode_context_tokens != fp.decode_context_tokens
    with pytest.raises(ConfigError, match="decode_context_tokens"):
        dataclasses.replace(fp, decode_context_tokens=0.0)
