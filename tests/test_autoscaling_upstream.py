"""Upstream unit-test cases, ported as tables, of the baselines' decision cores.

Every case cites its upstream file and test (the case name is upstream's where it has one):

* K8S_HPA - kubernetes/kubernetes ``pkg/controller/podautoscaler/horizontal_test.go`` and
  ``replica_calculator_test.go`` (read at commits 003e862 and 0006726);
* KNATIVE - knative/serving ``pkg/autoscaler/scaling/autoscaler_test.go`` (commit 98e5ef9); its
  ``newTestAutoscaler`` uses PanicThreshold 2, MaxScaleUpRate 10, MaxScaleDownRate 10, a 60 s
  stable window and a 10 % panic window;
* AIBRIX - vllm-project/aibrix ``pkg/controller/podautoscaler/algorithm/apa_test.go`` (commit e3e10f9).

What is not ported and why: pod-level bookkeeping (CPU initialization periods, hot/cool CPU start
times, readiness transitions, container-level metrics, object/external metric sources) - the
plants give a pool-level average; Knative's scale-down delay window, activation scale,
unreachable revisions and burst capacity - not modelled; the HPA's stored-recommendation layout
(which slot a recommendation reuses) - only its effect on the decision is observable here.
"""

import math

import pytest

from tokenfactory import ConfigError
from tokenfactory.controllers import AIBrixAPA, HorizontalPodAutoscaler, KnativeAutoscaler

K8S_HPA = "kubernetes pkg/controller/podautoscaler/horizontal_test.go"
K8S_RC = "kubernetes pkg/controller/podautoscaler/replica_calculator_test.go"
KNATIVE = "knative/serving pkg/autoscaler/scaling/autoscaler_test.go"
AIBRIX = "aibrix pkg/controller/podautoscaler/algorithm/apa_test.go"

NOW = 10_000.0


def _rules(pods, pods_period, percent, percent_period):
    """Upstream ``generateScalingRules`` (selectPolicy Max): the policies it builds."""
    out = []
    if pods:
        out.append(("pods", pods, pods_period))
    if percent:
        out.append(("percent", percent, percent_period))
    return tuple(out)


def _events(raw, period):
    """Upstream ``generateEventsUniformDistribution``: events spread over the last ``period`` s,
    each in the centre of its segment."""
    seg = period / len(raw)
    return [(NOW - (period - seg * (i + 1) + seg / 2), c) for i, c in enumerate(raw)]


# name, up events, down events, min, max, up rules, down rules, current, desired, expected, condition
SCALING_WITH_RULES = [
    ("prenormalized desired replicas within range", None, None, 3, 8, None, None, 5, 7, 7, "DesiredWithinRange"),
    ("prenormalized desired replicas < minReplicas", None, None, 2, 8, None, None, 3, 1, 2, "TooFewReplicas"),
    ("prenormalized desired replicas within range when minReplicas is 0", None, None, 0, 10, None, None, 1, 0, 0,
     "DesiredWithinRange"),
    ("maxReplicas is the limit because maxReplicas < scaleUpLimit", None, None, 1, 10, None, None, 20, 1000, 10,
     "TooManyReplicas"),
    ("desired replica count is more than the maximum replica count", None, None, 100, 150, None, None, 100, 1000, 150,
     "TooManyReplicas"),
    ("scaleUpLimit is the limit because scaleUpLimit < maxReplicas with user policies", None, None, 1, 2000,
     _rules(0, 0, 1, 60), None, 3, 1000, 4, "ScaleUpLimit"),
    # upstream marks this one testThis and skips it; it holds here
    ("scaleDownLimit is the limit because scaleDownLimit > minReplicas with user defined policies", None, None, 3,
     2000, None, _rules(20, 60, 0, 0), 1000, 3, 980, "ScaleDownLimit"),
    ("scaleUp with default behavior", None, None, 1, 1000, None, None, 10, 50, 20, "ScaleUpLimit"),
    ("scaleUp with pods policy larger than percent policy", None, None, 1, 1000, _rules(100, 60, 100, 60), None, 10,
     500, 110, "ScaleUpLimit"),
    ("scaleUp with percent policy larger than pods policy", None, None, 1, 1000, _rules(2, 60, 100, 60), None, 10,
     500, 20, "ScaleUpLimit"),
    ("scaleUp with spec MaxReplicas limitation with large pod policy", None, None, 1, 1000, _rules(100, 60, 0, 0), None,
     10, 50, 50, "DesiredWithinRange"),
    ("scaleUp with spec MaxReplicas limitation with large percent policy", None, None, 1, 1000,
     _rules(10000, 60, 0, 0), None, 10, 50, 50, "DesiredWithinRange"),
    ("scaleUp with pod policy limitation", None, None, 1, 1000, _rules(30, 60, 0, 0), None, 10, 50, 40, "ScaleUpLimit"),
    ("scaleUp with percent policy limitation", None, None, 1, 1000, _rules(0, 0, 200, 60), None, 10, 50, 30,
     "ScaleUpLimit"),
    ("scaleDown with percent policy larger than pod policy", None, None, 1, 1000, None, _rules(20, 60, 1, 60), 100, 2,
     80, "ScaleDownLimit"),
    ("scaleDown with pod policy larger than percent policy", None, None, 1, 1000, None, _rules(2, 60, 1, 60), 100, 2,
     98, "ScaleDownLimit"),
    ("scaleDown with spec MinReplicas=nil limitation with large pod policy", None, None, 1, 1000, None,
     _rules(100, 60, 0, 0), 10, 0, 1, "TooFewReplicas"),
    ("scaleDown with spec MinReplicas limitation with large pod policy", None, None, 1, 1000, None,
     _rules(100, 60, 0, 0), 10, 0, 1, "TooFewReplicas"),
    ("scaleDown with spec MinReplicas limitation with large percent policy", None, None, 5, 1000, None,
     _rules(0, 0, 100, 60), 10, 2, 5, "TooFewReplicas"),
    ("scaleDown with pod policy limitation", None, None, 1, 1000, None, _rules(5, 60, 0, 0), 10, 2, 5,
     "ScaleDownLimit"),
    ("scaleDown with percent policy limitation", None, None, 1, 1000, None, _rules(0, 0, 50, 60), 10, 5, 5,
     "DesiredWithinRange"),
    ("scaleUp with spec MaxReplicas limitation with large pod policy and events", ([1, 5, 9], 120), None, 1, 200,
     _rules(300, 60, 0, 0), None, 100, 500, 200, "TooManyReplicas"),
    ("scaleUp with spec MaxReplicas limitation with large percent policy and events", ([1, 5, 9], 120), None, 1, 200,
     _rules(0, 0, 10000, 60), None, 100, 500, 200, "TooManyReplicas"),
    ("scaleUp with currentReplicas limitation with rate.PeriodSeconds with a lot of recent scale up events",
     ([1, 5, 9], 120), None, 1, 1000, _rules(5, 120, 0, 0), None, 100, 500, 100, "ScaleUpLimit"),
    ("scaleUp with pod policy and previous scale up events", ([1, 5, 9], 120), None, 1, 1000, _rules(150, 120, 0, 0),
     None, 100, 500, 235, "ScaleUpLimit"),
    ("scaleUp with percent policy and previous scale up events", ([1, 5, 9], 120), None, 1, 1000,
     _rules(0, 0, 200, 120), None, 100, 500, 255, "ScaleUpLimit"),
    ("scaleUp with percent policy and previous scale up and down events", ([4], 120), ([2], 120), 1, 1000,
     _rules(0, 0, 300, 300), None, 6, 24, 16, "ScaleUpLimit"),
    ("scaleDown with default policy and previous events", None, ([1, 5, 9], 120), 1, 1000, None, None, 10, 5, 5,
     "DesiredWithinRange"),
    ("scaleDown with spec MinReplicas=nil limitation with large pod policy and previous events", None,
     ([1, 5, 9], 120), 1, 1000, None, _rules(115, 120, 0, 0), 100, 0, 1, "TooFewReplicas"),
    ("scaleDown with spec MinReplicas limitation with large pod policy and previous events", None, ([1, 5, 9], 120),
     5, 1000, None, _rules(130, 120, 0, 0), 100, 0, 5, "TooFewReplicas"),
    ("scaleDown with spec MinReplicas limitation with large percent policy and previous events", None,
     ([1, 5, 9], 120), 5, 1000, None, _rules(0, 0, 100, 120), 100, 2, 5, "TooFewReplicas"),
    ("scaleDown with pod policy limitation and previous events", None, ([1, 5, 9], 120), 1, 1000, None,
     _rules(5, 120, 0, 0), 100, 2, 100, "ScaleDownLimit"),
    ("scaleDown with percent policy limitation and previous events", None, ([2, 4, 6], 120), 1, 1000, None,
     _rules(0, 0, 50, 120), 100, 0, 56, "ScaleDownLimit"),
    ("scaleDown with percent policy and previous scale up and down events", ([2], 120), ([4], 120), 1, 1000, None,
     _rules(0, 0, 50, 180), 10, 1, 6, "ScaleDownLimit"),
    ("scaleDown with previous events preventing further scale down", None, ([10, 10, 10], 120), 1, 1000, None,
     _rules(0, 0, 10, 120), 100, 0, 100, "ScaleDownLimit"),
    ("scaleDown with with previous events still allowing more scale down", None, ([10, 10, 10], 120), 1, 1000, None,
     _rules(0, 0, 1000, 120), 10, 5, 5, "DesiredWithinRange"),
    ("check 'outdated' flag for events for one behavior for up", ([8, 12, 9, 11], 120), None, 1, 1000,
     _rules(1000, 60, 0, 0), None, 100, 200, 200, "DesiredWithinRange"),
    ("check that events were not marked 'outdated' for two different policies in the behavior for up",
     ([8, 12, 9, 11], 120), None, 1, 1000, _rules(1000, 120, 100, 60), None, 100, 200, 200, "DesiredWithinRange"),
    ("check that events were marked 'outdated' for two different policies in the behavior for up",
     ([8, 12, 9, 11], 120), None, 1, 1000, _rules(1000, 30, 100, 60), None, 100, 200, 200, "DesiredWithinRange"),
    ("check 'outdated' flag for events for one behavior for down", None, ([8, 12, 9, 11], 120), 1, 1000, None,
     _rules(1000, 60, 0, 0), 100, 5, 5, "DesiredWithinRange"),
    ("check that events were not marked 'outdated' for two different policies in the behavior for down", None,
     ([8, 12, 9, 11], 120), 1, 1000, None, _rules(1000, 120, 100, 60), 100, 5, 5, "DesiredWithinRange"),
    ("check that events were marked 'outdated' for two different policies in the behavior for down", None,
     ([8, 12, 9, 11], 120), 1, 1000, None, _rules(1000, 30, 100, 60), 100, 5, 5, "DesiredWithinRange"),
]


@pytest.mark.parametrize("name,up_ev,down_ev,lo,hi,up,down,current,desired,expected,condition", SCALING_WITH_RULES,
                         ids=[c[0] for c in SCALING_WITH_RULES])
def test_hpa_scaling_with_rules(name, up_ev, down_ev, lo, hi, up, down, current, desired, expected, condition):
    """K8S_HPA TestScalingWithRules (convertDesiredReplicasWithBehaviorRate)."""
    h = HorizontalPodAutoscaler("decode", 1.0, min_replicas=lo, max_replicas=hi, scale_up_policies=up,
                                scale_down_policies=down)
    h._up_events = _events(*up_ev) if up_ev else []
    h._down_events = _events(*down_ev) if down_ev else []
    assert h.rate_limit(NOW, current, desired) == (expected, condition)


# name, recommendations (replicas, seconds ago), current, desired, expected, up window, down window
NORMALIZE_WITH_BEHAVIOR = [
    ("empty recommendations for scaling down", [], 100, 5, 5, 0, 0),
    ("simple scale down stabilization", [(4, 120), (5, 60)], 100, 3, 5, 0, 180),
    ("simple scale up stabilization", [(4, 120), (5, 60)], 1, 7, 4, 300, 0),
    ("no scale down stabilization", [(1, 120), (2, 60)], 100, 3, 3, 300, 0),
    ("no scale up stabilization", [(4, 120), (5, 60)], 1, 3, 3, 0, 300),
    ("no scale down stabilization, reuse recommendation element", [(10, 600), (9, 540)], 100, 3, 3, 0, 0),
    ("no scale up stabilization, reuse recommendation element", [(10, 600), (9, 540)], 1, 100, 100, 0, 0),
    ("scale down stabilization, reuse one of obsolete recommendation element",
     [(10, 600), (4, 60), (5, 120), (9, 540)], 100, 3, 5, 0, 180),
    ("scale up stabilization, reuse one of obsolete recommendation element",
     [(10, 6000), (6, 60), (5, 120), (9, 180)], 1, 100, 5, 300, 0),
    ("scale up and down stabilization, do not scale up when prenormalized rec goes down", [(2, 6000), (3, 180)], 2, 1,
     2, 300, 300),
    ("scale up and down stabilization, do not scale down when prenormalized rec goes up", [(2, 6000), (1, 180)], 2, 3,
     2, 300, 300),
]


@pytest.mark.parametrize("name,recs,current,desired,expected,up_s,down_s", NORMALIZE_WITH_BEHAVIOR,
                         ids=[c[0] for c in NORMALIZE_WITH_BEHAVIOR])
def test_hpa_stabilization_windows(name, recs, current, desired, expected, up_s, down_s):
    """K8S_HPA TestNormalizeDesiredReplicasWithBehavior (stabilizeRecommendationWithBehaviors)."""
    h = HorizontalPodAutoscaler("decode", 1.0, upscale_stabilization_s=up_s, downscale_stabilization_s=down_s)
    h._recs = [(NOW - ago, r) for r, ago in recs]
    assert h.stabilize(NOW, current, desired) == expected


# name, current, ready pods' mean metric / target units, ready, unready, missing, target, missing fallback, expected
# (resource utilization: per-pod usage over request; the fallback for missing pods is max(100 %, target))
REPLICA_CALC = [
    ("TestReplicaCalcTolerance", 3, 3060 / 3000, 3, 0, 0, 1.0, None, 3),
    ("TestReplicaCalcToleranceCM", 3, (20000 + 21000 + 21000) / 3, 3, 0, 0, 20000.0, None, 3),
    ("TestReplicaCalcSuperfluousMetrics", 4, (4000 + 9500 + 3000 + 7000) / 4000, 4, 0, 0, 1.0, None, 24),
    ("TestReplicaCalcMissingMetrics", 4, 495 / 2000, 2, 0, 2, 1.0, 1.0, 3),
    ("TestReplicaCalcMissingMetricsNoChangeEq", 2, 1.0, 1, 0, 1, 1.0, 1.0, 2),
    ("TestReplicaCalcMissingMetricsNoChangeGt", 2, 1.9, 1, 0, 1, 1.0, 1.0, 2),
    ("TestReplicaCalcMissingMetricsNoChangeLt", 2, 0.6, 1, 0, 1, 1.0, 1.0, 2),
    ("TestReplicaCalcMissingMetricsUnreadyScaleUp", 3, 2.0, 1, 1, 1, 0.5, 1.0, 4),
    ("TestReplicaCalcMissingMetricsUnreadyScaleDown", 4, 0.1, 2, 1, 1, 0.5, 1.0, 3),
    ("TestReplicaCalcDuringRollingUpdateWithMaxSurge", 2, 0.1, 2, 0, 1, 0.5, 1.0, 2),
    ("TestReplicaCalcScaleDownIgnoresUnreadyPods", 5, 900 / 3000, 3, 2, 0, 0.5, None, 2),
    # failed and deleting pods are ignored: five ready pods remain
    ("TestReplicaCalcScaleDownIgnoresFailedPods", 5, 1400 / 5000, 5, 0, 0, 0.5, None, 3),
    ("TestReplicaCalcScaleDownIgnoresDeletionPods", 5, 1400 / 5000, 5, 0, 0, 0.5, None, 3),
]


@pytest.mark.parametrize("name,current,value,ready,unready,missing,target,fallback,expected", REPLICA_CALC,
                         ids=[c[0] for c in REPLICA_CALC])
def test_hpa_replica_calculator(name, current, value, ready, unready, missing, target, fallback, expected):
    """K8S_RC (GetResourceReplicas / calcPlainMetricReplicas on the pods' mean)."""
    h = HorizontalPodAutoscaler("decode", target)
    assert h.raw(current, value, ready, unready, missing, fallback) == expected


def test_hpa_computed_tolerance():
    """K8S_RC TestReplicaCalcComputedToleranceAlgImplementation: 10 pods at 50 % of their requests;
    a target of int(100 x (1 / (2 x 0.9) + 0.01)) % scales to ceil(ratio x 10), one of
    int(100 x (1 / (2 x 0.9) + 0.004)) % stays inside the tolerance (utilization is an integer
    percentage upstream)."""
    target = int((1 / (2 * (1 - 0.1)) + 0.01) * 100)
    assert HorizontalPodAutoscaler("decode", target / 100).raw(10, 0.50) == math.ceil(0.5 / (target / 100) * 10) == 9
    target = int((1 / (2 * (1 - 0.1)) + 0.004) * 100)
    assert HorizontalPodAutoscaler("decode", target / 100).raw(10, 0.50) == 10


# ------------------------------------------------------------------------------------------
# Knative KPA


def _kpa(target, **kw):
    return KnativeAutoscaler("decode", target, min_replicas=0, max_replicas=100000, max_scale_up_rate=kw.pop("up", 10.0),
                             max_scale_down_rate=kw.pop("down", 10.0), **kw)


# label, target, stable, panic, ready, prep (panic 5 s ago with maxPanicPods 5), up rate, down rate, expected
KNATIVE_SCALE = [
    ("AutoscalerNoDataAtZeroNoAutoscale", 10, 0, 0, 1, False, 10, 10, 0),
    ("AutoscalerNoDataAtZeroNoAutoscaleWithExplicitEPs", 10, 0, 0, 1, False, 10, 10, 0),
    ("AutoscalerStableModeUnlimitedTBC", 181, 21, 26, 1, False, 10, 10, 1),
    ("Autoscaler0TBC", 10, 50, 49, 1, False, 10, 10, 5),
    ("AutoscalerStableModeNoChange", 10, 50, 50, 1, False, 10, 10, 5),
    ("AutoscalerPanicStableLargerThanPanic", 1, 50, 30, 5, True, 10, 10, 50),
    ("AutoscalerPanicStableLessThanPanic", 1, 20, 30, 5, True, 10, 10, 30),
    ("AutoscalerStableModeNoChangeAlreadyScaled", 10, 50, 50, 5, False, 10, 10, 5),
    ("AutoscalerStableModeIncreaseWithSmallScaleUpRate", 1, 3, 3.1, 2, False, 1.1, 10, 3),
    ("AutoscalerStableModeDecreaseWithSmallScaleDownRate", 10, 1, 1, 100, False, 10, 1.1, 90),
    ("AutoscalerPanicModeDoublePodCount", 10, 50, 100, 1, False, 10, 10, 10),
]


@pytest.mark.parametrize("label,target,stable,panic,ready,prep,up,down,expected", KNATIVE_SCALE,
                         ids=[c[0] for c in KNATIVE_SCALE])
def test_kpa_scale(label, target, stable, panic, ready, prep, up, down, expected):
    """KNATIVE TestAutoscalerScale (the table; AutoscalerStableModeDecreaseNonReachable is not
    ported: no unreachable revisions here)."""
    k = _kpa(target, up=up, down=down)
    if prep:
        k._panic_time, k._max_panic_pods = NOW - 5.0, 5
    assert k.decide(NOW, ready, stable, panic) == expected


# test name, target, steps of (seconds after start, ready, stable, panic, expected, in panic after)
KNATIVE_SEQUENCES = [
    ("TestAutoscalerStableModeIncreaseWithConcurrencyDefault", 10, [(0, 1, 50, 10, 5, False),
                                                                    (0, 1, 100, 10, 10, False)]),
    ("TestAutoscalerUnpanicAfterSlowIncrease", 1, [(0, 10, 11, 25, 25, True), (30, 40, 30, 41, 41, True),
                                                   (62, 55, 50, 56, 50, False)]),
    ("TestAutoscalerExtendPanicWindow", 1, [(0, 10, 11, 25, 25, True), (30, 40, 30, 80, 80, True)]),
    ("TestAutoscalerStableModeDecrease", 10, [(0, 8, 100, 100, 10, False), (0, 8, 50, 50, 5, False)]),
    ("TestAutoscalerStableModeNoTrafficScaleToZero", 10, [(0, 1, 1, 0, 1, False), (0, 1, 0, 0, 0, False)]),
    ("TestAutoscalerPanicModeExponentialTrackAndStabilize", 1, [(0, 1, 6, 6, 6, True), (0, 6, 36, 36, 36, True),
                                                                (1, 36, 216, 216, 216, True),
                                                                (1, 216, 1296, 1296, 1296, True),
                                                                (2, 1296, 1296, 1296, 1296, True)]),
    ("TestAutoscalerPanicThenUnPanicScaleDown", 10, [(0, 1, 100, 100, 10, True), (0, 10, 100, 1000, 100, True),
                                                     (30, 10, 1, 1, 100, True), (61, 10, 1, 1, 1, False)]),
    ("TestAutoscalerRateLimitScaleUp", 10, [(0, 1, 1000, 1001, 10, True), (0, 10, 1000, 1001, 100, True)]),
    ("TestAutoscalerRateLimitScaleDown", 10, [(0, 100, 1, 1, 10, False), (0, 10, 1, 1, 1, False)]),
]


@pytest.mark.parametrize("name,target,steps", KNATIVE_SEQUENCES, ids=[c[0] for c in KNATIVE_SEQUENCES])
def test_kpa_sequences(name, target, steps):
    """KNATIVE: the named sequence tests (stable and panic windows, panic start, extension and end
    one stable window after the last panic tick, max scale rates)."""
    k = _kpa(target)
    for dt, ready, stable, panic, expected, panicking in steps:
        assert k.decide(NOW + dt, ready, stable, panic) == expected, (name, dt)
        assert k.in_panic is panicking, (name, dt)


# ------------------------------------------------------------------------------------------
# AIBrix APA

# name, current, current use per pod, target, up tolerance, up rate, down tolerance, down rate, expected
APA_CASES = [
    ("basic_scale_up", 2, 45.0, 30.0, 0.1, 2, 0.1, 2, 3),
    ("scale_up_upto_ceiling", 2, 35.0, 30.0, 0.1, 2, 0.1, 2, 3),
    ("scale_up_upto_max_scale_up", 2, 90.0, 30.0, 0.1, 2, 0.1, 2, 4),
    ("scale_up_upto_max_scale_up_ceiling", 2, 90.0, 30.0, 0.1, 2.5, 0.1, 2, 5),
    ("basic_scale_down", 6, 20.0, 30.0, 0.1, 2, 0.1, 2, 4),
    ("scale_down_upto_ceiling", 6, 18.0, 30.0, 0.1, 2, 0.1, 2, 4),
    ("scale_down_upto_max_scale_down", 6, 10.0, 30.0, 0.1, 2, 0.1, 2, 3),
    ("scale_down_upto_max_scale_down_floor", 6, 5.0, 30.0, 0.1, 2, 0.1, 2.5, 2),
    ("no_scaling_as_within_up_tolerance", 2, 33.0, 30.0, 0.1, 2, 0.1, 2, 2),
    ("no_scaling_as_within_down_tolerance", 2, 27.0, 30.0, 0.1, 2, 0.1, 2, 2),
]


@pytest.mark.parametrize("name,current,use,target,up_tol,up_rate,down_tol,down_rate,expected", APA_CASES,
                         ids=[c[0] for c in APA_CASES])
def test_apa_compute_target_replicas(name, current, use, target, up_tol, up_rate, down_tol, down_rate, expected):
    """AIBRIX TestAPAAlgorithm_ComputeTargetReplicas."""
    a = AIBrixAPA("decode", target, up_band=up_tol, down_band=down_tol, max_scale_up_rate=up_rate,
                  max_scale_down_rate=down_rate)
    assert a.target_replicas(current, use) == expected
    assert a.recommend(0.0, current, use) == expected  # no change yet: the cooldown does not hold it


def test_apa_zero_target_is_a_config_error():
    """AIBRIX TestAPAAlgorithm_ComputeTargetReplicas "division_by_zero": upstream keeps the current
    count at a target of 0; here a target of 0 is rejected when the controller is built."""
    with pytest.raises(ConfigError, match="apa.target"):
        AIBrixAPA("decode", 0.0)


def test_hpa_starting_workers_as_unready_pods():
    """K8S_RC's unready-pod rule through ``update``: 2 serving workers at 2 x the target and 2
    starting. Upstream (the default) counts the starting ones at 0 (ratio 4/4 / 1 = 1 -> no
    change); with ``starting_unready=False`` all 4 are multiplied by the serving average
    (ceil(4 x 2) = 8, capped at 4 + 4)."""
    from tokenfactory.core.signals import Measurement

    m = Measurement(time_s=0, backlog=0, fill_in_progress=0, ready=0, active_decodes=160, completion_rate=0,
                    admitted_rate=0, decode_slots=200, fill_capacity=1, fill_workers=1, decode_workers=2,
                    decode_workers_starting=2)
    assert HorizontalPodAutoscaler("decode", 0.4).update(0.0, m).replicas == 4
    assert HorizontalPodAutoscaler("decode", 0.4, starting_unready=False).update(0.0, m).replicas == 8
