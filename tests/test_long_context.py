"""Long-context workloads: the synthetic generator reaches 1M-token contexts with agentic sessions
whose cached prefix grows turn by turn, and the replay machinery runs on them."""

import numpy as np
import pytest

from tokenfactory import ConfigError
from tokenfactory.replay import build_replay, run_replay
from tokenfactory.testing import assert_conserved
from tokenfactory.traces import LONG_CONTEXT, SyntheticWorkload, generate_requests, long_context_workload

PLANT = {"model": "k3-like", "hardware": "b300", "fill_workers": 2, "decode_workers": 2}


@pytest.fixture(scope="module")
def day():
    return generate_requests(long_context_workload(mean_rate_rps=2.0, seed=1), 6 * 3600.0)


def test_contexts_reach_a_million_tokens(day):
    assert day["input_tokens"].max() >= 900_000
    assert day["input_tokens"].max() <= LONG_CONTEXT["context_limit"]
    assert day["input_tokens"].quantile(0.99) >= 500_000
    # midfill-heavy: nearly every input token is a cached prefix
    assert day["cached_tokens"].sum() / day["input_tokens"].sum() > 0.9
    assert (day["session_id"] != "").all() and day.attrs["closed_sessions"]


def _growth_and_compactions(table):
    grew = compactions = 0
    for _, s in table.groupby("session_id"):
        s = s.sort_values("turn")
        inp, cached = s["input_tokens"].to_numpy(), s["cached_tokens"].to_numpy()
        for k in range(1, len(s)):
            if cached[k] > 0:  # a continuation: the whole previous prompt is the prefix, and it grew
                assert cached[k] == inp[k - 1]
                assert inp[k] > inp[k - 1]
                grew += 1
            else:  # a compaction: the context restarts from the kept summary, within the window
                assert inp[k] <= table.attrs["config"]["context_limit"]
                compactions += 1
    return grew, compactions


def test_cached_prefix_grows_turn_by_turn(day):
    grew, compactions = _growth_and_compactions(day)
    assert grew > 30_000


def test_sessions_compact_at_the_window():
    """The same sessions in a 200k-token window hit it within hours and compact to 20 % of it."""
    w = long_context_workload(mean_rate_rps=2.0, seed=1, context_limit=200_000)
    table = generate_requests(w, 3 * 3600.0)
    grew, compactions = _growth_and_compactions(table)
    assert compactions > 10 and grew > 50 * compactions
    assert table["input_tokens"].max() <= 200_000


def test_new_session_fields_are_validated():
    with pytest.raises(ConfigError, match="synthetic.session_new_tokens_sigma"):
        SyntheticWorkload(session_new_tokens_sigma=-1.0)
    with pytest.raises(ConfigError, match="synthetic.session_initial_context_cap"):
        SyntheticWorkload(session_initial_context_cap=0.0)
    with pytest.raises(ConfigError, match="synthetic.closed_sessions"):
        SyntheticWorkload(closed_sessions="yes")
    with pytest.raises(ConfigError, match="synthetic.colour"):
        long_context_workload(colour=1)


def test_replay_machinery_runs_closed_long_context_sessions():
    """The trace-replay path (service model at the trace's shape, registered admission, load
    scaling) on 10 minutes of long-context sessions at 1.3x the cluster's capacity: nothing is
    lost, and each session's next turn waits for the previous one's completion plus its think time."""
    tr = generate_requests(long_context_workload(mean_rate_rps=1.0, seed=4), 600.0)
    setup = build_replay(tr, PLANT)
    assert setup.shape.cached_tokens > 5 * setup.shape.prompt_tokens  # midfill-heavy nominal request
    rate = len(tr) / float(tr["arrival_s"].max())
    m, res = run_replay(tr, setup, "threshold", 1.3 * setup.capacity_rps / rate, {"drain_s": 60.0})
    assert_conserved(res)
    rec = res.records
    done = rec[rec["state"] == "completed"]
    assert len(done) > 0.5 * len(rec[rec["state"] != "not_arrived"])
    # closed sessions: a later turn arrives its (scaled) think time after its predecessor completes
    tr_scaled = tr.assign(think_time_s=tr["think_time_s"] / (1.3 * setup.capacity_rps / rate))
    nxt = {}
    for _, s in tr.reset_index().groupby("session_id"):
        idx = s.sort_values("turn")["index"].to_numpy()
        nxt.update(zip(idx[:-1], idx[1:]))
    checked = 0
    for a, b in nxt.items():
        if rec.loc[a, "state"] == "completed" and np.isfinite(rec.loc[b, "arrival_s"]):
            assert rec.loc[b, "arrival_s"] == pytest.approx(rec.loc[a, "completion_s"]
                                                            + tr_scaled.loc[b, "think_time_s"])
            checked += 1
    assert checked > 10
