"""The pool model's shifting request shape (prompt and output factors) and role moves in a fixed fleet."""

import numpy as np
import pandas as pd
import pytest

from tokenfactory import ConfigError
from tokenfactory.controllers import ScaleAction
from tokenfactory.plant_models import PoolDynamics, PoolScenario, simulate_pools
from conftest import ScriptedController as Scripted


def _run(fp, nf, nd, lam, **kw):
    return simulate_pools(fp, nf, nd, PoolScenario(lam, 1800.0, dt=0.5, poisson=False, slo_tpot_s=0.5, **kw))


def test_a_longer_prompt_halves_fill_throughput_and_needs_more_fill_workers(fp):
    lam = 1.5 * fp.fill_rate_per_worker  # 2 fill workers carry it at 75 % utilisation
    nd = int(np.ceil(lam / (0.7 * fp.decode_capacity(1))))
    base, longer = _run(fp, 2, nd, lam), _run(fp, 2, nd, lam, prompt_factor=2.0)
    # the fill capacity at fixed workers divides by the prompt factor
    assert (longer.series["fill_capacity"] == base.series["fill_capacity"] / 2.0).all()
    # 2 workers now serve 1.0 x lambda / 1.5: the fill queue grows, TTFT is lost
    assert longer.series["fill_in_progress"].iloc[-1] > 100 * max(base.series["fill_in_progress"].iloc[-1], 1.0)
    assert longer.metrics["slo_attainment"] < 0.5 <= base.metrics["slo_attainment"]
    # 4 fill workers restore it
    assert _run(fp, 4, nd, lam, prompt_factor=2.0).metrics["slo_attainment"] >= base.metrics["slo_attainment"] - 1e-9


def test_a_longer_output_holds_more_sequences_in_decode(fp):
    lam = 0.3 * fp.decode_capacity(4)
    base, longer = _run(fp, 2, 4, lam), _run(fp, 2, 4, lam, output_factor=2.0)
    s0, s1 = (r.series[r.series["time_s"] > 900] for r in (base, longer))
    # the same completions, each holding its slot for twice the tokens: Little's law doubles the decoding
    # sequences (a little more: a fuller batch passes slower)
    assert s1["completion_rate"].mean() == pytest.approx(lam, rel=1e-3)
    assert s1["active_decodes"].mean() >= 2.0 * s0["active_decodes"].mean()


def test_unit_factors_leave_the_default_path_bit_identical(fp):
    t = np.arange(0.0, 1801.0, 60.0)
    demand = pd.Series(0.4 * fp.decode_capacity(3) * (1 + 0.3 * np.sin(t / 300.0)), index=t)
    dyn = PoolDynamics(fleet_size=8, startup_s=60.0)
    ctrl = Scripted({300.0: [ScaleAction("decode", 5), ScaleAction("fill", 1)], 900.0: [ScaleAction("decode", 3)]})
    runs = []
    for kw in ({}, {"prompt_factor": 1.0, "output_factor": 1.0},
               {"prompt_factor": pd.Series(1.0, index=t), "output_factor": pd.Series(1.0, index=t)}):
        runs.append(simulate_pools(fp, 2, 3, PoolScenario(demand, 1800.0, dt=0.5, seed=3, **kw), controllers=[ctrl],
                                   dynamics=dyn))
    for r in runs[1:]:
        pd.testing.assert_frame_equal(r.series, runs[0].series, check_exact=True)
    assert (runs[0].series["prompt_factor"] == 1.0).all() and (runs[0].series["output_factor"] == 1.0).all()


def test_conservation_and_the_factors_in_the_series_with_a_shifting_mix(fp):
    t = np.arange(0.0, 3601.0, 60.0)
    pf = pd.Series(1.0 + 0.8 * np.sin(t / 600.0) ** 2, index=t)
    of = pd.Series(0.5 + 1.0 * np.cos(t / 900.0) ** 2, index=t)
    lam = 0.5 * fp.decode_capacity(4)
    r = simulate_pools(fp, 2, 4, PoolScenario(lam, 3600.0, dt=0.5, seed=1, prompt_factor=pf, output_factor=of),
                       controllers=[Scripted({1200.0: [ScaleAction("decode", 3)], 2400.0: [ScaleAction("decode", 6)]})])
    m = r.metrics
    assert m["requests"] == pytest.approx(m["completed"] + m["rejected"] + m["in_flight_end"], rel=1e-9)
    s = r.series.set_index("time_s")
    for x in (0.0, 630.0, 1830.5, 3600.0):  # held piecewise constant from each index point
        k = np.searchsorted(t, x, side="right") - 1
        assert s.loc[x, "prompt_factor"] == pf.iloc[k] and s.loc[x, "output_factor"] == of.iloc[k]
    # the plant's fill capacity reports the shape: the orchestrator's per-worker fill rate follows the mix
    ser = r.series[r.series["time_s"] > 60]
    assert np.allclose(ser["fill_capacity"] * ser["prompt_factor"] / ser["fill_workers"], fp.fill_rate_per_worker)


@pytest.mark.parametrize("value, msg", [
    (0.0, "scenario.prompt_factor"), (-1.0, "scenario.prompt_factor"), (101.0, "scenario.prompt_factor"),
    (pd.Series([1.0, np.nan], index=[0.0, 60.0]), "scenario.prompt_factor"),
    (pd.Series([1.0, 0.0], index=[0.0, 60.0]), "scenario.prompt_factor"),
    (pd.Series([1.0, 2.0], index=[60.0, 0.0]), "scenario.prompt_factor"),
    (pd.Series([], dtype=float), "scenario.prompt_factor"),
])
def test_bad_factors_are_rejected_naming_the_field(value, msg):
    with pytest.raises(ConfigError, match=msg):
        PoolScenario(1.0, 60.0, prompt_factor=value)
    with pytest.raises(ConfigError, match=msg.replace("prompt", "output")):
        PoolScenario(1.0, 60.0, output_factor=value)


def test_a_worker_moved_between_roles_is_counted_once(fp):
    lam = 0.2 * fp.decode_capacity(2)
    dyn = PoolDynamics(fleet_size=4, startup_s=30.0, warmup_s=0.0, drain_s=20.0)
    # fill 2 -> 1 frees a worker; decode 2 -> 3 takes it after the drain: one role move. Then decode 3 -> 2 and
    # decode 2 -> 3 again: the worker decode released comes back to decode - not a role move
    ctrl = Scripted({100.0: [ScaleAction("fill", 1), ScaleAction("decode", 3)], 400.0: [ScaleAction("decode", 2)],
                     600.0: [ScaleAction("decode", 3)]}, sample_period=1.0)
    r = simulate_pools(fp, 2, 2, PoolScenario(lam, 900.0, dt=0.5, poisson=False), controllers=[ctrl], dynamics=dyn)
    assert r.metrics["role_moves"] == 1
    s = r.series.set_index("time_s")["role_moves"]
    assert s.loc[110.0] == 0 and s.loc[125.0] == 1  # placed when the drain ends (t = 120 s)
    # an elastic fleet never moves roles
    r2 = simulate_pools(fp, 2, 2, PoolScenario(lam, 900.0, dt=0.5, poisson=False), controllers=[ctrl])
    assert r2.metrics["role_moves"] == 0
