"""The real-time engine is the request simulator: the same arrivals give the same times."""

import numpy as np
import pandas as pd
import pytest

from tokenfactory.live.engine import EngineFull, RealtimeEngine, block_hashes
from tokenfactory.live.live_scenario import load_live_scenario
from tokenfactory.plant_models.des import simulate
from tokenfactory.plant_models.des.records import Stage


class ManualClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


@pytest.fixture(scope="module")
def sc():
    return load_live_scenario("live_small")


def _arrivals(n=60, rate=14.0, seed=3):
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n))
    return pd.DataFrame({"arrival_s": t, "input_tokens": rng.integers(200, 3000, n),
                         "output_tokens": rng.integers(2, 120, n)})


def test_engine_matches_the_request_simulator(sc):
    trace = _arrivals()
    res = simulate(trace, sc.setup.params, sc.cluster)
    rec = res.records
    clock = ManualClock()
    eng = RealtimeEngine(sc.setup.params, sc.cluster, nominal_input=1000, nominal_output=64, capacity=len(trace),
                         clock=clock)
    ids = []
    for row in trace.itertuples():
        clock.t = row.arrival_s
        ids.append(eng.submit(row.input_tokens, row.output_tokens))
    clock.t = float(trace["arrival_s"].max()) + 300.0
    eng.advance()
    assert eng.completed == len(trace)
    got = pd.DataFrame([eng.times(i).__dict__ for i in ids])
    # the simulator's own records of the same arrivals: first token and completion to 1 us
    np.testing.assert_allclose(got["first_token_s"], rec["first_token_s"], atol=1e-6)
    np.testing.assert_allclose(got["completion_s"], rec["completion_s"], atol=1e-6)


def test_tokens_emitted_grow_to_the_output(sc):
    clock = ManualClock()
    eng = RealtimeEngine(sc.setup.params, sc.cluster, nominal_input=1000, nominal_output=64, capacity=4, clock=clock)
    i = eng.submit(1000, 40)
    seen = []
    for t in np.arange(0.0, 6.0, 0.01):
        clock.t = t
        eng.advance()
        seen.append(eng.emitted(i))
    assert eng.stage(i) == Stage.COMPLETED
    assert seen[0] == 0 and seen[-1] == 40
    assert all(b >= a for a, b in zip(seen, seen[1:]))  # monotone, one token per pass
    # decode emits at the pass rate: 39 tokens after the first over (completion - first token)
    tt = eng.times(i)
    steps = np.diff(seen)
    assert steps.max() <= 2 and tt.completion_s > tt.first_token_s
    with pytest.raises(EngineFull):
        for _ in range(4):
            eng.submit(10, 2)


def test_prefix_blocks_chain_and_ignore_partial_blocks():
    a = block_hashes(list(range(1100)), 512)
    b = block_hashes(list(range(1024)) + [7] * 76, 512)
    c = block_hashes([9] + list(range(1, 1100)), 512)
    assert len(a) == 2 and a == b and c[0] != a[0] and c[1] != a[1]


def test_published_pass_time_and_queued_tokens_are_the_simulators_measurement(sc):
    # what the emulator publishes for the gateway's controller is what the request simulator's
    # controller measures (its snapshot series) at the same instants of the same arrivals
    trace = _arrivals(n=80, rate=16.0)
    series = simulate(trace, sc.setup.params, sc.cluster).series
    clock = ManualClock()
    eng = RealtimeEngine(sc.setup.params, sc.cluster, nominal_input=1000, nominal_output=64, capacity=len(trace),
                         clock=clock)
    arrivals = iter(trace.itertuples())
    nxt = next(arrivals)
    got = []
    times = series["time_s"].to_numpy(float) if "time_s" in series else series.index.to_numpy(float)
    for t in times:
        while nxt is not None and nxt.arrival_s <= t:
            clock.t = nxt.arrival_s
            eng.submit(nxt.input_tokens, nxt.output_tokens)
            nxt = next(arrivals, None)
        clock.t = t + 1e-7
        eng.advance()
        got.append((eng.decode_pass_now(), eng.fill_queued_tokens()))
    got = np.array(got)
    for col, k in (("decode_pass_s", 0), ("fill_queued_tokens", 1)):
        want = series[col].to_numpy(float)
        busy = np.isfinite(want) & (want > 0)  # the instants with something to measure
        assert busy.sum() >= 20, col
        same = np.isclose(got[busy, k], want[busy], rtol=1e-9)
        assert same.mean() >= 0.95, col  # (an event between a snapshot and 0.1 us later may differ)
        idle = ~np.isfinite(want)
        assert np.isnan(got[idle, k]).all() if k == 0 else True  # NaN while nothing decodes
