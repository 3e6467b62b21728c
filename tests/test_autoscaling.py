"""Baselines against hand-worked sequences of their documented algorithms."""


import pytest

from tokenfactory.controllers import HorizontalPodAutoscaler, KnativeAutoscaler, ScaleAction
from tokenfactory.plant_models import Measurement
from tokenfactory import ConfigError


def test_hpa_hand_worked_sequence():
    h = HorizontalPodAutoscaler("decode", target=0.5)
    assert h.recommend(0, 4, 0.52) == 4      # ratio 1.04: inside the 0.1 tolerance
    assert h.recommend(15, 4, 1.0) == 8      # ratio 2 -> 8; limit max(4 + 4, 4 x 2) = 8
    assert h.recommend(30, 8, 1.5) == 16     # ratio 3 -> 24; limit max(8 + 4, 16) = 16
    assert h.recommend(45, 16, 0.25) == 16   # ratio 0.5 -> 8, but the 300 s window holds 24
    h.recommend(60, 16, 0.25)
    assert h.recommend(400, 16, 0.25) == 8   # the window now holds only recommendations of 8


def test_hpa_scale_down_stabilization():
    """A spike then a lull: without the window HPA drops straight back (the seesaw users report);
    with the default 300 s window it holds the spike's recommendation."""
    bare = HorizontalPodAutoscaler("decode", target=0.6, downscale_stabilization_s=0.0)
    held = HorizontalPodAutoscaler("decode", target=0.6)
    for h in (bare, held):
        assert h.recommend(0, 2, 0.9) == 3    # ratio 1.5 -> ceil(3.0) = 3
    assert bare.recommend(15, 3, 0.2) == 1    # ratio 0.33 -> ceil(1.0) = 1
    assert held.recommend(15, 3, 0.2) == 3    # the window still holds 3
    assert held.recommend(320, 3, 0.2) == 1   # 305 s later the 3 has left the window


def test_kpa_hand_worked_sequence():
    k = KnativeAutoscaler("decode", target=10.0)
    for t in range(0, 60, 2):
        assert k.recommend(t, 5, 50.0) == 5
    assert not k.in_panic
    assert k.recommend(60, 5, 200.0) == 10   # panic window (54, 60]: mean(50, 50, 200) = 100 -> 10 = 2 x 5
    assert k.in_panic
    assert k.recommend(62, 10, 200.0) == 15  # panic mean(50, 200, 200) = 150 -> 15
    for t in range(64, 120, 2):
        assert k.recommend(t, 15, 10.0) == 15  # in panic: never scale down
    # knative leaves panic once panicTime + stable window < now, strictly: still in panic at 120
    assert k.recommend(120, 15, 10.0) == 15 and k.in_panic
    out = k.recommend(122, 15, 10.0)
    # stable window (62, 122]: 30 x 10 / 30 = 10 -> 1, but at most halving: 15 // 2 = 7
    assert not k.in_panic and out == 7


def test_update_returns_scale_action():
    m = Measurement(time_s=0, backlog=0, fill_in_progress=0, ready=100, active_decodes=900, completion_rate=10,
                    admitted_rate=10, decode_slots=1000, fill_capacity=20, fill_workers=2, decode_workers=1)
    a = HorizontalPodAutoscaler("decode", target=0.5).update(0, m)
    assert a == ScaleAction("decode", 2)  # utilization 0.9 / 0.5 = 1.8 -> ceil(1.8) = 2
    with pytest.raises(ConfigError, match="decode_workers"):
        HorizontalPodAutoscaler("decode", target=0.5).update(0, Measurement(0, 0, 0, 0, 0, 0, 0, 1, 1))


@pytest.mark.parametrize("kw,field", [({"pool": "gpu"}, "hpa.pool"), ({"target": 0}, "hpa.target"),
                                      ({"metric": "vibes"}, "hpa.metric")])
def test_bad_hpa(kw, field):
    args = {"pool": "decode", "target": 0.5, **kw}
    with pytest.raises(ConfigError, match=field):
        HorizontalPodAutoscaler(**args)


def test_dynamo_throughput_planner():
    from tokenfactory.controllers import DynamoThroughputPlanner

    d = DynamoThroughputPlanner("decode", per_engine_rps=100.0)
    assert [d.recommend(x) for x in (50.0, 250.0, 199.0)] == [1, 3, 2]  # ceil(last interval / capacity)
    k = DynamoThroughputPlanner("decode", per_engine_rps=100.0, predictor="kalman")
    out = [k.recommend(x) for x in (100.0, 200.0, 300.0, 400.0, 500.0)]
    assert out[-1] >= 5  # a local-linear-trend predictor extrapolates the ramp


def test_dynamo_load_planner():
    from tokenfactory.controllers import DynamoLoadPlanner

    # Dynamo's default throughput target (load_scaling.py): decode +1 above 100 % KV, -1 below 60 %
    d = DynamoLoadPlanner("decode")
    assert d.recommend(2, 1.01) == 3
    assert d.recommend(2, 1.00) == 2            # strict: exactly full holds
    assert d.recommend(3, 0.59) == 2 and d.recommend(3, 0.60) == 3
    assert d.recommend(1, 0.10) == 1            # never below one
    # the load target compares inclusively, decode thresholds in %; fill: queued tokens per worker
    ld = DynamoLoadPlanner("decode", 90.0, 60.0, target="load")
    assert ld.recommend(2, 0.90) == 3 and ld.recommend(2, 0.60) == 1
    lf = DynamoLoadPlanner("fill", 16384, 1638, target="load")
    assert lf.recommend(2, 16384) == 3 and lf.recommend(2, 1638) == 1 and lf.recommend(2, 1639) == 2
    with pytest.raises(ConfigError, match="dynamo.scale_up"):
        DynamoLoadPlanner("fill", target="load")


def test_aibrix_apa():
    from tokenfactory.controllers import AIBrixAPA

    a = AIBrixAPA("decode", target=0.5)
    assert a.recommend(0, 4, 0.54) == 4         # inside +/-10 %
    assert a.recommend(15, 4, 0.8) == 7         # ratio 1.6: ceil(6.4) = 7, scale up at once
    assert a.recommend(30, 7, 0.2) == 7         # ratio 0.4 but the last change was 15 s ago
    assert a.recommend(315, 7, 0.2) == 3        # cooldown over: ceil(2.8) = 3
