"""Ray Serve's default autoscaling policy, checked with cases ported from Ray's own tests.

Upstream: ray-project/ray ``python/ray/serve/tests/unit/test_autoscaling_policy.py``
(``TestReplicaQueueLengthPolicy``). Each case drives :meth:`RayServeAutoscaler.recommend` with the
same (running replicas, total ongoing requests, target replicas) sequence as the upstream test
drives ``replica_queue_length_autoscaling_policy`` wrapped by ``_apply_autoscaling_config``, with
the control loop at Ray's 0.1 s (``CONTROL_LOOP_INTERVAL_S``).
"""

from __future__ import annotations

import pytest

from tokenfactory.controllers.ray_serve_autoscaler import RayServeAutoscaler
from tokenfactory.core.errors import ConfigError

LOOP_S = 0.1   # Ray's CONTROL_LOOP_INTERVAL_S


def policy(**kw) -> RayServeAutoscaler:
    return RayServeAutoscaler("decode", sample_period=LOOP_S, **kw)


@pytest.mark.parametrize("factor, expected_first, smaller, expected_second", [
    (10.0, 10, 0.5, 1),   # upstream: test_scaling_factor_scale_up_from_0_replicas ("1 * 10", "ceil(1 * 0.5)")
])
def test_scale_up_from_zero_uses_the_upscaling_factor(factor, expected_first, smaller, expected_second):
    p = policy(min_replicas=0, max_replicas=2, upscaling_factor=factor)
    assert p.recommend(running=0, total_requests=1, target=0) == expected_first
    p = policy(min_replicas=0, max_replicas=2, upscaling_factor=smaller)
    assert p.recommend(running=0, total_requests=1, target=0) == expected_second


def test_scale_down_to_zero_with_large_and_small_factors():
    """upstream: test_scaling_factor_scale_down_to_0_replicas."""
    p = policy(min_replicas=0, max_replicas=5, downscaling_factor=10.0, upscale_delay_s=0.0, downscale_delay_s=0.0)
    assert p.recommend(running=5, total_requests=0, target=5) == 1     # first stops at 1
    assert p.recommend(running=1, total_requests=0, target=1) == 0     # then 1 -> 0
    p = policy(min_replicas=0, max_replicas=5, downscaling_factor=0.2, upscale_delay_s=0.0, downscale_delay_s=0.0)
    n = 5
    for _ in range(5):   # a factor < 1 must not get stuck at a positive count
        n = p.recommend(running=n, total_requests=0, target=n)
    assert n == 0


@pytest.mark.parametrize("to_zero_delay_s", [None, 300.0])
def test_upscale_downscale_delay(to_zero_delay_s):
    """upstream: test_upscale_downscale_delay with _run_upscale_downscale_flow (target 1 request per
    replica, 2 ongoing requests: 1 -> 2 after 30 s of decisions, 2 -> 1 after 600 s, 1 -> 0 after the
    to-zero delay; an opposite decision resets the count)."""
    p = policy(min_replicas=0, max_replicas=2, target_ongoing_requests=1.0, upscale_delay_s=30.0,
               downscale_delay_s=600.0, downscale_to_zero_delay_s=to_zero_delay_s)
    up, down = round(30.0 / LOOP_S), round(600.0 / LOOP_S)
    to_zero = round((to_zero_delay_s or 600.0) / LOOP_S)
    assert p.recommend(running=0, total_requests=1, target=0) == 1
    for _ in range(up):
        assert p.recommend(running=1, total_requests=2, target=1) == 1
    assert p.recommend(running=1, total_requests=2, target=1) == 2
    for _ in range(down):
        assert p.recommend(running=2, total_requests=0, target=2) == 2
    assert p.recommend(running=2, total_requests=0, target=2) == 1
    for _ in range(to_zero):
        assert p.recommend(running=1, total_requests=0, target=1) == 1
    assert p.recommend(running=1, total_requests=0, target=1) == 0
    for _ in range(up // 2):
        assert p.recommend(running=1, total_requests=2, target=1) == 1
    p.recommend(running=1, total_requests=0, target=1)              # interrupt: the count restarts
    for _ in range(up):
        assert p.recommend(running=1, total_requests=2, target=1) == 1
    assert p.recommend(running=1, total_requests=2, target=1) == 2


def test_replicas_delayed_startup():
    """upstream: test_replicas_delayed_startup (targets while new replicas are still starting)."""
    p = policy(min_replicas=1, max_replicas=200, upscale_delay_s=0.0, downscale_delay_s=100000.0,
               target_ongoing_requests=1.0)
    assert p.recommend(running=1, total_requests=100, target=1) == 100
    assert p.recommend(running=1, total_requests=100, target=100) == 100
    assert p.recommend(running=3, total_requests=123, target=100) == 123
    assert p.recommend(running=4, total_requests=10, target=123) == 123


@pytest.mark.parametrize("delay_s", [30.0, 0.0])
def test_fluctuating_ongoing_requests(delay_s):
    """upstream: test_fluctuating_ongoing_requests (1000 alternating over/underload decisions)."""
    p = policy(min_replicas=1, max_replicas=10, upscale_delay_s=delay_s, downscale_delay_s=delay_s,
               target_ongoing_requests=50.0)
    for trial in range(1000):
        if trial % 2 == 0:
            assert p.recommend(running=1, total_requests=100, target=1) == (1 if delay_s > 0 else 2)
        else:
            assert p.recommend(running=2, total_requests=40, target=2) == (2 if delay_s > 0 else 1)


@pytest.mark.parametrize("ongoing", [20, 100, 10])
def test_single_replica_receives_all_requests(ongoing):
    """upstream: test_single_replica_receives_all_requests (desired = total / target)."""
    p = policy(min_replicas=1, max_replicas=50, target_ongoing_requests=5.0, upscale_delay_s=0.0,
               downscale_delay_s=0.0)
    assert p.recommend(running=4, total_requests=ongoing, target=4) == ongoing / 5


def test_look_back_average_of_reports():
    p = policy(metrics_interval_s=10.0, look_back_period_s=30.0)
    assert p.average_requests(0.0, 10.0) == 10.0
    assert p.average_requests(5.0, 99.0) == 10.0       # no report inside the interval
    assert p.average_requests(10.0, 20.0) == 15.0
    assert p.average_requests(40.0, 40.0) == 30.0      # the report at 0 s left the window


@pytest.mark.parametrize("kw, field", [
    ({"target_ongoing_requests": 0.0}, "ray_serve.target_ongoing_requests"),
    ({"min_replicas": 3, "max_replicas": 2}, "ray_serve.max_replicas"),
    ({"upscale_delay_s": -1.0}, "ray_serve.upscale_delay_s"),
    ({"metric": "cpu"}, "ray_serve.metric"),
])
def test_bad_parameters_name_the_field(kw, field):
    with pytest.raises(ConfigError) as err:
        RayServeAutoscaler("decode", **kw)
    assert err.value.field == field
