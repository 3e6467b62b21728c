import numpy as np
import pandas as pd
import pytest

from tokenfactory.controllers import PoolRates, hourly_peak, plan_capacity, score_plan, workers_needed
from tokenfactory.plant_models import FluidParams, RequestShape, Worker, accelerator_preset, model_preset

RATES = PoolRates(fill_rps_per_worker=10.0, decode_rps_per_worker=25.0, fill_gpus_per_worker=8, decode_gpus_per_worker=4)


def _demand(values):
    return pd.Series(values, index=pd.Index(np.arange(len(values)) * 3600.0, name="time_s"), dtype=float)


def test_workers_needed():
    assert workers_needed([0, 10, 10.01, 35], 10.0).tolist() == [1, 1, 2, 4]
    assert workers_needed([10], 10.0, headroom=0.2).tolist() == [2]


def test_perfect_foresight_plan_is_never_below_need_and_respects_moves():
    d = _demand([5, 5, 5, 80, 80, 5, 5, 5, 5, 5])
    p = plan_capacity(d, RATES, headroom=0.0, max_moves_per_hour=2)
    need_fill = workers_needed(d, 10.0)
    assert (p["fill_workers"].to_numpy() >= need_fill).all()
    assert np.abs(np.diff(p["fill_workers"])).max() <= 2
    assert p["fill_workers"].iloc[0] > 1  # ramped up ahead of the peak at hour 3


def test_causal_plan_from_initial_state_can_fall_short():
    d = _demand([80, 80])
    p = plan_capacity(d, RATES, headroom=0.0, max_moves_per_hour=2, initial={"fill": 1, "decode": 1})
    assert p["fill_workers"].tolist() == [3, 5]
    s = score_plan(p, d, RATES)
    assert s["under_provisioned_hours"] == 2 and s["shortfall_worker_hours"] == (8 - 3) + (8 - 5) + (4 - 3) + 0


def test_gpu_hours_add_up():
    d = _demand([20, 40, 60])
    p = plan_capacity(d, RATES, headroom=0.0, max_moves_per_hour=10)
    s = score_plan(p, d, RATES)
    assert s["gpu_hours"] == float((p["fill_workers"] * 8 + p["decode_workers"] * 4).sum())
    assert s["under_provisioned_hours"] == 0 and s["hours"] == 3


def test_hourly_peak():
    r = pd.Series([1.0, 5.0, 2.0, np.nan, 7.0, 1.0], index=np.arange(6) * 1800.0)
    assert hourly_peak(r).tolist() == [5.0, 2.0, 7.0]


def test_rates_from_roofline():
    w = Worker(model_preset("deepseek-v3"), accelerator_preset("h200"))
    p = FluidParams.from_workers(w, w, RequestShape(1000, 200))
    r = PoolRates.from_params(p)
    assert r.fill_rps_per_worker == pytest.approx(p.fill_rate_per_worker)
    assert r.decode_rps_per_worker == pytest.approx(p.decode_capacity(1.0))


def test_oracle_follows_a_shifting_mix_and_the_static_split():
    from tokenfactory import ConfigError
    from tokenfactory.controllers.capacity import oracle_plan, static_split

    t = np.arange(0.0, 4 * 600.0, 600.0)
    demand = pd.Series([10.0, 10.0, 10.0, 10.0], index=t)
    fill_factor = pd.Series([1.0, 3.0, 1.0, 1.0], index=t)  # a long-prompt interval
    decode_factor = pd.Series([2.0, 0.5, 1.0, 1.0], index=t)
    plan, _ = oracle_plan(demand, {"fill": 5.0, "decode": 2.0}, {"fill": 1.0, "decode": 1.0}, startup_s=0.0,
                          work_factors={"fill": fill_factor, "decode": decode_factor})
    assert list(plan["fill_needed"]) == [2, 6, 2, 2]
    assert list(plan["decode_needed"]) == [10, 3, 5, 5]
    same, _ = oracle_plan(demand, {"fill": 5.0, "decode": 2.0}, {"fill": 1.0, "decode": 1.0}, startup_s=0.0)
    assert list(same["fill_needed"]) == [2, 2, 2, 2]
    # the best fixed split of 14 workers for peaks of 6 fill and 10 decode: 5 + 9 balances the shortfall
    sp = static_split(plan, 14)
    assert (sp["fill_workers"], sp["decode_workers"]) == (5, 9)
    assert sp["needs_workers"] == 16 and sp["worst_load"] == pytest.approx(max(6 / 5, 10 / 9))
    assert sp["short_intervals"] == 2
    assert static_split(plan, 16)["worst_load"] == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="oracle.work_factors.fill"):
        oracle_plan(demand, {"fill": 5.0, "decode": 2.0}, {"fill": 1.0, "decode": 1.0}, startup_s=0.0,
                    work_factors={"fill": pd.Series([1.0, -1.0], index=[0.0, 600.0])})


def test_utilization_ceiling_cache_computes_on_its_key(monkeypatch):
    # the ceiling is cached by the plant's params; the pool model must see only what the key holds
    # (provenance is compared by nothing), so no hit can return a result computed for other inputs
    import dataclasses
    import types

    from tokenfactory.controllers import capacity
    from tokenfactory.plant_models.plant_protocol import PoolPlant
    from tokenfactory.scenario import build_plant

    seen = []

    def fake_run(plant, workload, controllers=()):  # the ceiling runs the pool model through its Plant
        seen.append(plant.params.provenance)
        return types.SimpleNamespace(metrics={"slo_attainment": 1.0})

    monkeypatch.setattr(PoolPlant, "run", fake_run)
    capacity._ceiling.cache_clear()
    p = build_plant({"model": "deepseek-v3", "hardware": "h200", "fill_workers": 1, "decode_workers": 1}).params
    assert p.provenance and p.model_inputs() == p and hash(p.model_inputs()) == hash(p)
    q = dataclasses.replace(p, provenance={"decode_context_tokens": 1.0})
    a = capacity.utilization_ceiling(p, 2.0, 0.1, workers=2, grid=(0.8, 0.9))
    b = capacity.utilization_ceiling(q, 2.0, 0.1, workers=2, grid=(0.8, 0.9))
    assert a == b == {"fill": 0.9, "decode": 0.9}
    assert len(seen) == 4 and all(s == {} for s in seen)  # computed once, on the provenance-free key
    capacity._ceiling.cache_clear()
