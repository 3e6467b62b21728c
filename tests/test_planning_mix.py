"""The reconfiguration layer's pool rule following a shifting request shape: the decode pool's
per-worker rate from the measured output length (Little's law)."""

import math

import pytest

from tokenfactory import ConfigError
from tokenfactory.controllers.planning import PlannedPoolController
from tokenfactory.core.signals import Measurement


def _m(t, *, decoding, completions, pass_s, rate=100.0, workers=10):
    return Measurement(time_s=t, backlog=0.0, fill_in_progress=0.0, ready=0.0, active_decodes=decoding,
                       completion_rate=completions, admitted_rate=rate, decode_slots=400.0, fill_capacity=1000.0,
                       fill_workers=4, decode_workers=workers, arrival_rate=rate, decode_pass_s=pass_s)


def test_decode_rate_follows_the_measured_output_length():
    c = PlannedPoolController(pool="decode", per_worker_rps=2.0, measured_decode_rate=True, output_tokens=200.0,
                              filter_s=0.0,
                              target_utilization=1.0, sample_period=10.0)
    # 100 completions/s of 400-token requests at 0.05 s a pass hold 100 x 400 x 0.05 = 2000 sequences
    c.update(0.0, _m(0.0, decoding=2000.0, completions=100.0, pass_s=0.05))
    assert c.per_worker_rps == pytest.approx(1.0)  # twice the tokens: half the requests/s per worker
    assert c.last_need == pytest.approx(100.0)  # 100 req/s at 1 req/s per worker
    # half the nominal length: twice the rate
    c.update(10.0, _m(10.0, decoding=500.0, completions=100.0, pass_s=0.05))
    assert c.per_worker_rps == pytest.approx(4.0)
    # nothing decoding: no estimate, the last one is kept
    c.update(20.0, _m(20.0, decoding=0.0, completions=0.0, pass_s=math.nan))
    assert c.per_worker_rps == pytest.approx(4.0)
    c.reset()
    assert c.per_worker_rps == pytest.approx(2.0)


def test_without_the_flag_the_nominal_rate_stays():
    c = PlannedPoolController(pool="decode", per_worker_rps=2.0, filter_s=0.0, sample_period=10.0)
    c.update(0.0, _m(0.0, decoding=2000.0, completions=100.0, pass_s=0.05))
    assert c.per_worker_rps == 2.0


def test_measured_decode_rate_needs_the_decode_pool_and_its_output_tokens():
    with pytest.raises(ConfigError, match="planned.measured_decode_rate"):
        PlannedPoolController(pool="fill", per_worker_rps=2.0, measured_decode_rate=True, output_tokens=100.0)
    with pytest.raises(ConfigError, match="planned.output_tokens"):
        PlannedPoolController(pool="decode", per_worker_rps=2.0, measured_decode_rate=True)
    with pytest.raises(ConfigError, match="planned.output_tokens"):
        PlannedPoolController(pool="decode", per_worker_rps=2.0, measured_decode_rate=True, output_tokens=0.0)


def test_min_headroom_floors_the_planners_headroom():
    class Plan:
        headroom = 0.02

        def rise(self, t):
            return 1.0

        def headroom_at(self, t):  # the headroom in force (no volatility correction here)
            return self.headroom

    c = PlannedPoolController(pool="fill", per_worker_rps=10.0, planner=Plan(), headroom=0.15, min_headroom=0.15)
    assert c.headroom == pytest.approx(0.15)
    c = PlannedPoolController(pool="fill", per_worker_rps=10.0, planner=Plan(), headroom=0.15)
    assert c.headroom == pytest.approx(0.02)
