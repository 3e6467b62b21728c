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
