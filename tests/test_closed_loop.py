"""Closed-loop benchmark clients (traces/closed_loop.py) through the request simulator."""

from __future__ import annotations

import numpy as np
import pytest

from tokenfactory.plant_models import ClusterConfig, DESParams, RequestShape, ServiceModel, Worker, simulate
from tokenfactory.plant_models.hardware import accelerator_preset
from tokenfactory.plant_models.moe_model import model_preset
from tokenfactory.plant_models.roofline import Parallelism
from tokenfactory.traces import closed_loop_clients
from tokenfactory.core.validation import ConfigError


def test_table_shape():
    t = closed_loop_clients(4, 100, 20, requests_per_client=3)
    assert len(t) == 12 and t.attrs["closed_sessions"]
    assert (t.groupby("session_id")["turn"].apply(list) == [[0, 1, 2]] * 4).all()
    assert (t["arrival_s"] == 0).all() and (t["think_time_s"] == 0).all()


def test_spread_is_seeded():
    a = closed_loop_clients(5, 10, 10, start_spread_s=2.0, seed=3)
    b = closed_loop_clients(5, 10, 10, start_spread_s=2.0, seed=3)
    assert a["arrival_s"].equals(b["arrival_s"]) and a["arrival_s"].max() <= 2.0


@pytest.mark.parametrize("field, kw", [("clients", {"clients": 0}), ("requests_per_client", {"requests_per_client": 0}),
                                       ("start_spread_s", {"start_spread_s": -1.0})])
def test_bad_values(field, kw):
    args = {"clients": 2, "input_tokens": 10, "output_tokens": 10, **kw}
    with pytest.raises(ConfigError, match=field):
        closed_loop_clients(**args)


@pytest.fixture(scope="module")
def aggregated_run():
    w = Worker(model_preset("llama-3.1-8b"), accelerator_preset("h200"), Parallelism(tp=1, ep=1))
    s = ServiceModel(w, w, RequestShape(512, 64, output_cv=0.0), fill_tokens_per_replica=8192)
    trace = closed_loop_clients(6, 512, 64, requests_per_client=4)
    res = simulate(trace, DESParams.from_service(s),
                   ClusterConfig(fill_workers=0, decode_workers=0, aggregated_workers=1, prefix_cache_blocks=0,
                                 progress=False))
    return trace, res


def test_closed_loop_conservation_and_concurrency(aggregated_run):
    trace, res = aggregated_run
    rec = res.records
    assert res.metrics["completed"] == len(trace) and res.metrics["rejected"] == 0
    assert res.metrics["in_flight_end"] == 0
    # at most N requests in the system at any instant: count arrivals minus completions
    times = np.concatenate([rec["arrival_s"], rec["completion_s"]])
    step = np.concatenate([np.ones(len(rec)), -np.ones(len(rec))])
    order = np.lexsort((step, times))  # completions before arrivals at the same instant
    assert np.cumsum(step[order]).max() <= 6


def test_next_request_follows_completion(aggregated_run):
    trace, res = aggregated_run
    rec = res.records.assign(session=trace["session_id"].to_numpy(), turn=trace["turn"].to_numpy())
    for _, g in rec.sort_values(["session", "turn"]).groupby("session"):
        np.testing.assert_allclose(g["arrival_s"].to_numpy()[1:], g["completion_s"].to_numpy()[:-1], atol=1e-9)
