"""The pool-level fluid model: conservation, worker start-up/warm-up/drain, billing, closed forms."""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenfactory.controllers import ScaleAction
from tokenfactory.plant_models import (
    AdmissionAction,
    DemandStep,
    FluidParams,
    PoolDynamics,
    PoolFleet,
    PoolScenario,
    RequestShape,
    Worker,
    simulate_pools,
)
from tokenfactory import ConfigError
from conftest import ScriptedController as Scripted


def test_static_pools_bill_exactly_and_serve_the_demand(fp):
    lam = 0.5 * fp.decode_capacity(2)
    # TPOT SLO 0.15 s: at the fitted roofline efficiencies these workers decode at 0.106 s per
    # token at this load (0.030 s at the pre-fit ones), past the scenario's default 0.1 s
    r = simulate_pools(fp, 4, 2, PoolScenario(lam, 3600.0, dt=0.5, poisson=False, slo_tpot_s=0.15),
                       dynamics=PoolDynamics(gpus_per_worker=8))
    # 6 workers x 8 GPUs for an hour (plus the closing step)
    assert r.metrics["gpu_hours"] == pytest.approx(48.0, rel=2e-4)
    s = r.series[r.series["time_s"] > 600]
    assert s["completion_rate"].mean() == pytest.approx(lam, rel=1e-3)
    # fluid equilibrium: completions D / (L pass(D / n)) = lambda (Little's law in decode)
    d = float(s["active_decodes"].iloc[-1])
    assert d / (fp.output_tokens * fp.decode_step_s(d / 2)) == pytest.approx(lam, rel=1e-3)
    assert r.metrics["slo_attainment"] == pytest.approx(1.0)
    assert r.metrics["actions_per_hour"] == 0


def test_per_pool_gpus_bill_each_pool_at_its_own_gpus(fp):
    """Prefill TP2 EP2 (4 GPUs) and decode EP8 (8 GPUs): pinned pools bill workers x that pool's
    GPUs x hours; the scalar form bills both pools at one number; a fixed fleet needs one number."""
    sc = PoolScenario(0.5 * fp.decode_capacity(2), 3600.0, dt=0.5, poisson=False, slo_tpot_s=0.15)
    per_pool = simulate_pools(fp, 4, 2, sc, dynamics=PoolDynamics(gpus_per_worker={"fill": 4, "decode": 8}))
    scalar = simulate_pools(fp, 4, 2, sc, dynamics=PoolDynamics(gpus_per_worker=8))
    hours = float(per_pool.series["fill_workers_billed"].count()) * sc.dt / 3600.0  # the hour plus the closing step
    assert per_pool.metrics["gpu_hours"] == pytest.approx((4 * 4 + 2 * 8) * hours, rel=1e-9)
    assert per_pool.metrics["busy_gpu_hours"] == per_pool.metrics["gpu_hours"]
    assert scalar.metrics["gpu_hours"] == pytest.approx((4 + 2) * 8 * hours, rel=1e-9)
    assert per_pool.metrics["completed"] == scalar.metrics["completed"]   # GPUs price the run, not its serving
    assert PoolDynamics(gpus_per_worker={"fill": 8, "decode": 8}).gpus_per_worker == 8   # uniform table = scalar
    with pytest.raises(ConfigError) as err:
        PoolDynamics(gpus_per_worker={"fill": 4, "decode": 8}, fleet_size=10)
    assert err.value.field == "pools.gpus_per_worker"
    with pytest.raises(ConfigError) as err:
        PoolDynamics(gpus_per_worker={"fill": 4, "decoder": 8})
    assert err.value.field == "pools.gpus_per_worker.decoder"


def test_scale_up_serves_after_startup_and_warms_up(fp):
    dyn = PoolDynamics(startup_s=60.0, warmup_s=20.0, warmup_factor=0.5, drain_s=0.0)
    ctrl = Scripted({10.0: ScaleAction("decode", 3)})
    r = simulate_pools(fp, 2, 1, PoolScenario(10.0, 200.0, dt=0.5, poisson=False), controllers=[ctrl], dynamics=dyn)
    s = r.series.set_index("time_s")
    assert s.loc[69.5, "decode_workers"] == 1 and s.loc[69.5, "decode_workers_starting"] == 2
    assert s.loc[70.0, "decode_workers"] == 3 and s.loc[70.0, "decode_workers_starting"] == 0
    assert s.loc[69.5, "decode_workers_billed"] == 3  # billed from the decision
    # the controller saw the workers in transit (measurement delay 0.5 s)
    later = [m for m in ctrl.seen if 20 <= m.time_s < 69]
    assert later and all(m.decode_workers == 1 and m.decode_workers_starting == 2 for m in later)
    assert r.actions[["pool", "from", "to"]].values.tolist() == [["decode", 1, 3]]


def test_fleet_cancels_starting_workers_before_draining_serving():
    f = PoolFleet("decode", 2, PoolDynamics(startup_s=100.0, warmup_s=10.0, drain_s=30.0))
    assert f.set_target(0.0, 5) == 3 and f.provisioned == 5 and f.waiting == 3
    assert f.place(0.0, math.inf) == 3 and len(f.starting) == 3 and f.in_transit == 3
    assert f.set_target(1.0, 3) == -2 and len(f.starting) == 1 and len(f.serving) == 2 and not f.draining
    assert f.set_target(2.0, 1) == -2 and not f.starting and len(f.serving) == 1 and len(f.draining) == 1
    assert f.billed == 2
    f.advance(40.0)
    assert f.billed == 1  # drained after drain_s
    f.set_target(50.0, 2)
    f.place(50.0, 1)
    f.advance(150.0)
    assert f.effective(150.0) == pytest.approx(1.5)  # the new one runs at half speed for 10 s
    assert f.effective(160.0) == pytest.approx(2.0)


def test_scale_down_migrates_sequences_back_without_loss(fp):
    lam = 0.9 * fp.decode_capacity(2)
    ctrl = Scripted({300.0: ScaleAction("decode", 1)})
    r = simulate_pools(fp, 4, 2, PoolScenario(lam, 600.0, dt=0.5), controllers=[ctrl])
    assert r.metrics["preempted"] > 0
    m = r.metrics
    assert m["requests"] == pytest.approx(m["completed"] + m["rejected"] + m["in_flight_end"], rel=1e-9)


def test_early_rejection_is_recorded_with_its_reason(fp):
    class RejectAll:
        sample_period = 1.0

        def reset(self):
            pass

        def update(self, t, m):
            return AdmissionAction(math.inf, 0.0, "decode_overloaded")

    r = simulate_pools(fp, 2, 2, PoolScenario(50.0, 100.0, dt=0.5, poisson=False), controllers=[RejectAll()])
    assert r.metrics["rejected_by_reason"]["decode_overloaded"] == pytest.approx(r.metrics["requests"])
    assert r.metrics["slo_attainment"] == 0.0


@settings(max_examples=15, deadline=None)
@given(load=st.floats(0.1, 2.5), seed=st.integers(0, 1000), dt=st.sampled_from([0.1, 0.5, 2.0]),
       target=st.integers(1, 6), at=st.floats(0.0, 100.0))
def test_conservation_under_random_loads_and_moves(fp, load, seed, dt, target, at):
    lam = load * fp.decode_capacity(2)
    ctrl = Scripted({round(round(at / 2.0) * 2.0, 6): [ScaleAction("decode", target), ScaleAction("fill", target)]},
                    sample_period=2.0)
    r = simulate_pools(fp, 2, 2, PoolScenario(lam, 200.0, dt=dt, seed=seed), controllers=[ctrl],
                       dynamics=PoolDynamics(startup_s=20.0, warmup_s=10.0))
    m = r.metrics
    assert m["requests"] == pytest.approx(m["completed"] + m["rejected"] + m["in_flight_end"], rel=1e-9, abs=1e-6)
    assert (r.series[["backlog", "ready", "active_decodes"]] >= -1e-9).all().all()


def test_rate_series_and_steps_drive_the_demand(fp):
    series = pd.Series([10.0, 20.0], index=[0.0, 50.0])
    sc = PoolScenario(series, 100.0, dt=1.0, disturbances=(DemandStep(75.0, 2.0),), poisson=False)
    lam = sc.demand_grid(np.array([0.0, 49.0, 50.0, 74.0, 75.0]))
    assert lam.tolist() == [10.0, 10.0, 20.0, 20.0, 40.0]


def test_same_config_same_result(fp):
    sc = PoolScenario(100.0, 300.0, dt=0.5, seed=3)
    a = simulate_pools(fp, 2, 2, sc)
    b = simulate_pools(fp, 2, 2, sc)
    pd.testing.assert_frame_equal(a.series, b.series)


@pytest.mark.parametrize("kw, field", [
    ({"dt": 0.0}, "scenario.dt"),
    ({"duration_s": -1.0}, "scenario.duration_s"),
    ({"control_start_s": 1e9}, "scenario.control_start_s"),
    ({"demand": pd.Series([1.0, -2.0], index=[0.0, 1.0])}, "scenario.demand"),
    ({"disturbances": ("step",)}, "scenario.disturbances[0]"),
])
def test_bad_scenarios_name_the_field(kw, field):
    args = {"demand": 1.0, "duration_s": 10.0, **kw}
    with pytest.raises(ConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        PoolScenario(**args)


def test_bad_dynamics_and_sample_periods(fp):
    with pytest.raises(ConfigError, match="pools.warmup_factor"):
        PoolDynamics(warmup_factor=0.0)
    with pytest.raises(ConfigError, match="sample_period"):
        simulate_pools(fp, 1, 1, PoolScenario(1.0, 10.0, dt=1.0), controllers=[Scripted({}, sample_period=0.1)])


def test_count_reversals():
    from tokenfactory.plant_models import count_reversals

    rows = [{"pool": "decode", "from": 2, "to": 1}, {"pool": "decode", "from": 1, "to": 2},
            {"pool": "fill", "from": 2, "to": 3}, {"pool": "decode", "from": 2, "to": 3},
            {"pool": "fill", "from": 3, "to": 3}, {"pool": "fill", "from": 3, "to": 2}]
    assert count_reversals(rows) == 2  # decode down->up, fill up->down; same-direction and no-ops do not count


def test_fixed_fleet_moves_a_worker_through_drain_and_startup(fp):
    """Six workers, no spare: moving one from fill to decode waits for the fill worker's drain
    (30 s), then its start-up in the decode role (60 s)."""
    dyn = PoolDynamics(startup_s=60.0, warmup_s=0.0, drain_s=30.0, fleet_size=6)
    ctrl = Scripted({10.0: [ScaleAction("decode", 3)], 20.0: [ScaleAction("fill", 3)]})
    r = simulate_pools(fp, 4, 2, PoolScenario(20.0, 200.0, dt=0.5, poisson=False), controllers=[ctrl], dynamics=dyn)
    s = r.series.set_index("time_s")
    assert s.loc[15.0, "decode_workers_starting"] == 1      # requested: pending, counted as in transit
    assert s.loc[49.5, "decode_workers"] == 2                # fill worker drains 20 -> 50 s
    assert s.loc[109.5, "decode_workers"] == 2 and s.loc[110.0, "decode_workers"] == 3  # 50 + 60 s start-up
    assert (s["fill_workers_billed"] + s["decode_workers_billed"]).max() <= 6
    assert r.metrics["gpu_hours"] == pytest.approx(6 * 8 * 200.5 / 3600.0)
    assert r.metrics["busy_gpu_hours"] <= r.metrics["gpu_hours"]


def test_fixed_fleet_must_hold_the_initial_pools(fp):
    with pytest.raises(ConfigError, match="pools.fleet_size"):
        simulate_pools(fp, 4, 3, PoolScenario(1.0, 10.0), dynamics=PoolDynamics(fleet_size=6))


def test_decode_shorter_than_the_step_turns_its_slots_over_within_it():
    # ServeGen m-small's 15-token outputs: a decode lasts less than a 1 s step, so a step that only
    # let each slot finish once would cap throughput at slots / dt and alternate empty and full steps
    w = Worker.from_dict({"model": "deepseek-v3", "hardware": "h200"})
    short = FluidParams.from_workers(w, w, RequestShape(512, 15))
    coarse_dt = 4.0
    assert 15 * short.decode_step_s(short.decode_slots(1)) < coarse_dt  # the premise: shorter than the step
    lam = 0.6 * short.decode_capacity(1)
    assert lam > short.decode_slots(1) / coarse_dt  # more than one turnover of the slots per step
    n_fill = math.ceil(lam / (0.7 * short.fill_rate_per_worker))  # fill not the bottleneck
    runs = {dt: simulate_pools(short, n_fill, 1, PoolScenario(lam, 600.0, dt=dt, poisson=False, slo_tpot_s=1.0,
                                                          slo_ttft_s=10.0))
            for dt in (0.05, coarse_dt)}
    for dt, r in runs.items():
        s = r.series[r.series["time_s"] > 300]
        assert s["completion_rate"].mean() == pytest.approx(lam, rel=1e-2), dt
        # no alternation between empty and full steps: completions steady step to step
        assert s["completion_rate"].std() < 0.02 * lam, dt
        assert r.metrics["slo_attainment"] > 0.99, dt
    # the coarse step agrees with the fine one on the queue in decode
    fine, coarse = (runs[dt].series[runs[dt].series["time_s"] > 300]["ready"].mean() for dt in (0.05, coarse_dt))
    assert coarse < lam * coarse_dt  # at most one step's arrivals wait for a slot


def test_dynamics_errors_name_the_key_where_the_user_wrote_it(tmp_path):
    """A [cluster.dynamics] or stack [dynamics] value out of range names that table's key, not
    the dataclass's internal ``pools.`` prefix."""
    from tokenfactory.plant_models.des import ClusterConfig
    from tokenfactory.stack import load_stack_scenario

    with pytest.raises(ConfigError) as err:
        ClusterConfig.from_dict({"dynamics": {"startup_s": 7200.0}})
    assert err.value.field == "cluster.dynamics.startup_s" and "[0, 3600]" in err.value.message
    with pytest.raises(ConfigError) as err:
        ClusterConfig.from_dict({"dynamics": {"startup": 60.0}})
    assert err.value.field == "cluster.dynamics.startup"
    with pytest.raises(ConfigError) as err:
        PoolDynamics.from_dict({"warmup_factor": 0.0}, "dynamics")
    assert err.value.field == "dynamics.warmup_factor"
    p = tmp_path / "stack.toml"
    p.write_text('[plant]\nmodel = "llama-3.1-70b"\nhardware = "h100-sxm"\nparallelism = {tp = 4, ep = 4}\n'
                 '[workload]\nrate_rps = 2.0\n[dynamics]\nstartup_s = -1.0\n'
                 '[layers.admission]\nkind = "smoothed"\n')
    with pytest.raises(ConfigError) as err:
        load_stack_scenario(p)
    assert err.value.field == "dynamics.startup_s"
