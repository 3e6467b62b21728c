"""Pool autoscalers and early rejection in the request simulator (same controller objects as the
pool model)."""


import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenfactory.controllers import EarlyRejection, HorizontalPodAutoscaler, HystereticPoolController, ScaleAction
from conftest import poisson_trace as shared_poisson_trace
from tokenfactory.plant_models import ClusterConfig, PoolDynamics, simulate
from tokenfactory import ConfigError


@pytest.fixture(scope="module")
def params(des_params):
    return des_params


def poisson_trace(rate, duration, seed):
    return shared_poisson_trace(rate, duration, seed, out_mean=256)


class Scripted:
    def __init__(self, script, sample_period=1.0):
        self.script, self.sample_period = script, sample_period

    def reset(self):
        self.seen = []

    def update(self, t, m):
        self.seen.append(m)
        return [a for (at, a) in self.script if abs(t - at) < self.sample_period / 2]


def test_workers_start_after_startup_warm_up_and_drain(params):
    dyn = PoolDynamics(startup_s=30.0, warmup_s=10.0, warmup_factor=0.5, gpus_per_worker=8)
    script = [(20.0, ScaleAction("decode", 3)), (120.0, ScaleAction("decode", 1))]
    ctrl = Scripted(script)
    cl = ClusterConfig(fill_workers=2, decode_workers=1, dynamics=dyn, duration_s=200.0, snapshot_dt=0.5)
    res = simulate(poisson_trace(20.0, 180.0, 1), params, cl, autoscalers=[ctrl])
    s = res.series.set_index("time_s")
    t_up = 20.05 + 30.0  # first sample at snapshot_dt / 2, decision at ~20 s
    assert s.loc[s.index < t_up - 0.5, "decode_workers"].max() == 1
    assert s.loc[(s.index > t_up + 0.5) & (s.index < 119), "decode_workers"].min() == 3
    seen = [m for m in ctrl.seen if 25.0 < m.time_s < 45.0]
    assert seen and all(m.decode_workers_starting == 2 for m in seen)
    assert s.loc[s.index > 160, "decode_workers"].max() == 1  # drained back to one
    scale = res.actions[res.actions["kind"] == "scale"]
    assert scale[["pool", "from", "to"]].values.tolist() == [["decode", 1, 3], ["decode", 3, 1]]
    # nothing lost across starts and drains
    m = res.metrics
    assert m["requests"] == m["completed"] + m["rejected"] + m["in_flight_end"]
    billed = res.series["fill_workers_billed"] + res.series["decode_workers_billed"]
    assert m["gpu_hours"] == pytest.approx(billed.sum() * 0.5 / 3600 * 8)
    assert m["actions_per_hour"] == pytest.approx(2 / (200.0 / 3600.0))


def test_cancelled_start_never_serves(params):
    script = [(10.0, ScaleAction("fill", 4)), (20.0, ScaleAction("fill", 2))]
    cl = ClusterConfig(fill_workers=2, decode_workers=1, dynamics=PoolDynamics(startup_s=60.0), duration_s=120.0,
                       snapshot_dt=0.5)
    res = simulate(poisson_trace(5.0, 100.0, 2), params, cl, autoscalers=[Scripted(script)])
    assert res.series["fill_workers"].max() == 2
    assert res.series["fill_workers_starting"].max() == 2


def test_hpa_and_hysteretic_run_in_the_request_simulator(params):
    trace = poisson_trace(60.0, 400.0, 3)
    cl = ClusterConfig(fill_workers=1, decode_workers=1, dynamics=PoolDynamics(startup_s=60.0), duration_s=450.0,
                       autoscale_start_s=30.0, snapshot_dt=0.5)
    for scaler in (HorizontalPodAutoscaler("fill", 0.7, "fill_utilization"),
                   HystereticPoolController("fill", 30.0, sample_period=5.0)):
        res = simulate(trace, params, cl, autoscalers=[scaler])
        assert res.series["fill_workers"].max() >= 2  # one fill worker cannot carry 60 req/s
        m = res.metrics
        assert m["requests"] == m["completed"] + m["rejected"] + m["in_flight_end"]
        assert res.config["autoscalers"][0]["pool"] == "fill"


def test_early_rejection_in_the_request_simulator(params):
    trace = poisson_trace(80.0, 120.0, 4)
    er = EarlyRejection(fill_latency_s=0.2, slo_ttft_s=2.0)
    res = simulate(trace, params, ClusterConfig(fill_workers=1, decode_workers=1, duration_s=150.0), er)
    m = res.metrics
    assert m["rejected"] > 0
    assert sum(m["rejected_by_reason"].values()) == m["rejected"]
    assert set(res.records.loc[res.records["state"] == "rejected", "reject_reason"]) <= {
        "predicted_slo_violation", "decode_overloaded"}
    assert m["requests"] == m["completed"] + m["rejected"] + m["in_flight_end"]


def test_dynamics_from_dict_rejects_unknown_keys():
    cl = ClusterConfig.from_dict({"dynamics": {"startup_s": 10.0}})
    assert cl.dynamics.startup_s == 10.0
    with pytest.raises(ConfigError, match="cluster.dynamics"):
        ClusterConfig.from_dict({"dynamics": {"startup": 10.0}})


def test_fixed_fleet_move_waits_for_the_drain(params):
    """Three workers, no spare: decode 1 -> 2 and fill 2 -> 1 together; the new decode worker
    starts only once the fill worker has drained, and never more than three are in use."""
    dyn = PoolDynamics(startup_s=20.0, warmup_s=0.0, fleet_size=3)
    script = [(10.0, ScaleAction("decode", 2)), (10.0, ScaleAction("fill", 1))]
    cl = ClusterConfig(fill_workers=2, decode_workers=1, dynamics=dyn, duration_s=120.0, snapshot_dt=0.5)
    res = simulate(poisson_trace(30.0, 100.0, 5), params, cl, autoscalers=[Scripted(script)])
    s = res.series
    assert (s["fill_workers_billed"] + s["decode_workers_billed"]).max() <= 3
    assert s["decode_workers"].max() == 2 and s["fill_workers"].iloc[-1] == 1
    first_two = float(s.loc[s["decode_workers"] == 2, "time_s"].min())
    assert first_two >= 10.0 + 20.0
    m = res.metrics
    assert m["gpu_hours"] == pytest.approx(3 * 8 * 120.0 / 3600.0)
    assert m["requests"] == m["completed"] + m["rejected"] + m["in_flight_end"]
    with pytest.raises(ConfigError, match="fleet_size"):
        ClusterConfig(fill_workers=3, decode_workers=1, dynamics=dyn)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(moves=st.lists(st.tuples(st.floats(0.0, 80.0), st.sampled_from(["fill", "decode"]), st.integers(0, 4)),
                      max_size=6),
       fleet=st.one_of(st.none(), st.integers(3, 6)), seed=st.integers(0, 100))
def test_conservation_under_random_scaling(params, moves, fleet, seed):
    dyn = PoolDynamics(startup_s=10.0, warmup_s=5.0, fleet_size=fleet)
    script = [(round(t), ScaleAction(pool, n)) for t, pool, n in moves]
    cl = ClusterConfig(fill_workers=2, decode_workers=1, dynamics=dyn, duration_s=120.0, snapshot_dt=0.5, seed=seed)
    res = simulate(poisson_trace(20.0, 100.0, seed), params, cl, autoscalers=[Scripted(script)])
    m = res.metrics
    assert m["requests"] == m["completed"] + m["rejected"] + m["in_flight_end"]
    if fleet is not None:
        assert (res.series["fill_workers_billed"] + res.series["decode_workers_billed"]).max() <= fleet
