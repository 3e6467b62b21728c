"""Control-plane settings files: every format reads, writes back equal, rejects what it does not
know by path, builds the matching controller with exactly its parameters, and is edited in place."""

from __future__ import annotations

import difflib

import pytest

from tokenfactory.controllers.autoscaling import AIBrixAPA, HorizontalPodAutoscaler, KnativeAutoscaler
from tokenfactory.controllers.formats import (
    NotModelled,
    dump_control_plane,
    parse_control_plane,
    rewrite_control_plane,
)
from tokenfactory.controllers.formats.common import format_quantity, parse_duration_s, parse_quantity
from tokenfactory.controllers.ray_serve_autoscaler import RayServeAutoscaler
from tokenfactory.core.errors import ConfigError

HPA = """\
# The HPA on the decode deployment (vllm:num_requests_waiting through a Prometheus adapter).
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: decode
  namespace: serving
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: decode
  minReplicas: 1
  maxReplicas: 4
  metrics:
    - type: Pods
      pods:
        metric:
          name: vllm:num_requests_waiting
        target:
          type: AverageValue
          averageValue: "2"   # queued requests per pod
  behavior:
    scaleDown:
      stabilizationWindowSeconds: 120
"""

KEDA = """\
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata:
  name: decode-scaler
spec:
  scaleTargetRef:
    name: decode
  pollingInterval: 15
  minReplicaCount: 1
  maxReplicaCount: 8
  advanced:
    horizontalPodAutoscalerConfig:
      behavior:
        scaleDown:
          stabilizationWindowSeconds: 60
  triggers:
    - type: prometheus
      metadata:
        serverAddress: http://prometheus:9090
        query: sum(vllm:num_requests_waiting{model_name="m"})
        threshold: "4"
"""

KNATIVE = """\
apiVersion: serving.knative.dev/v1
kind: Service
metadata:
  name: llm
spec:
  template:
    metadata:
      annotations:
        autoscaling.knative.dev/class: kpa.autoscaling.knative.dev
        autoscaling.knative.dev/metric: concurrency
        autoscaling.knative.dev/target: "32"
        autoscaling.knative.dev/window: 2m
        autoscaling.knative.dev/max-scale: "10"
    spec:
      containers:
        - image: vllm/vllm-openai
"""

RAY = """\
applications:
  - name: llm
    route_prefix: /
    import_path: serve_llm:app
    deployments:
      - name: LLMServer
        max_ongoing_requests: 64
        autoscaling_config:
          min_replicas: 1
          max_replicas: 6
          target_ongoing_requests: 24
          upscale_delay_s: 10
          downscale_delay_s: 300   # the default 600 was too slow for us
"""

AIBRIX = """\
apiVersion: autoscaling.aibrix.ai/v1alpha1
kind: PodAutoscaler
metadata:
  name: decode-apa
  annotations:
    autoscaling.aibrix.ai/up-fluctuation-tolerance: "0.1"
    autoscaling.aibrix.ai/down-fluctuation-tolerance: "0.2"
spec:
  scalingStrategy: APA
  minReplicas: 1
  maxReplicas: 8
  metricsSources:
    - metricSourceType: pod
      protocolType: http
      port: "8000"
      path: metrics
      targetMetric: gpu_cache_usage_perc
      targetValue: "0.5"
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: decode
"""

FILES = {"kubernetes-hpa": HPA, "keda": KEDA, "knative": KNATIVE, "ray-serve": RAY, "aibrix": AIBRIX}


@pytest.mark.parametrize("fmt", FILES)
def test_round_trip_is_exact(fmt):
    setting = parse_control_plane(FILES[fmt])
    assert setting.format == fmt
    text = dump_control_plane(setting)
    assert parse_control_plane(text) == setting
    assert dump_control_plane(parse_control_plane(text)) == text


# (format, a line of the file, the same line misspelt, the field path the error must name)
TYPOS = [
    ("kubernetes-hpa", "      stabilizationWindowSeconds: 120", "      stabilisationWindowSeconds: 120",
     "spec.behavior.scaleDown.stabilisationWindowSeconds"),
    ("kubernetes-hpa", "  maxReplicas: 4", "  maxReplica: 4", "spec.maxReplica"),
    ("keda", "  pollingInterval: 15", "  pollInterval: 15", "spec.pollInterval"),
    ("keda", "        threshold: \"4\"", "        treshold: \"4\"", "spec.triggers[0].metadata.treshold"),
    ("knative", "autoscaling.knative.dev/window: 2m", "autoscaling.knative.dev/windw: 2m",
     "spec.template.metadata.annotations.autoscaling.knative.dev/windw"),
    ("ray-serve", "          upscale_delay_s: 10", "          upscale_delay: 10",
     "applications[0].deployments[0].autoscaling_config.upscale_delay"),
    ("aibrix", "autoscaling.aibrix.ai/up-fluctuation-tolerance", "autoscaling.aibrix.ai/up-tolerance",
     "metadata.annotations.autoscaling.aibrix.ai/up-tolerance"),
]


@pytest.mark.parametrize("fmt, line, typo, path", TYPOS)
def test_unknown_field_is_named(fmt, line, typo, path):
    text = FILES[fmt]
    assert line in text
    with pytest.raises(ConfigError) as err:
        parse_control_plane(text.replace(line, typo), where="")
    assert err.value.field == path
    assert not isinstance(err.value, NotModelled)


@pytest.mark.parametrize("fmt, old, new, field", [
    ("kubernetes-hpa", "  maxReplicas: 4", "  maxReplicas: 0", "spec.maxReplicas"),
    ("kubernetes-hpa", "averageValue: \"2\"", "averageValue: \"-2\"", "spec.metrics[0].pods.target.averageValue"),
    ("knative", "window: 2m", "window: 2s", "spec.template.metadata.annotations.autoscaling.knative.dev/window"),
    ("ray-serve", "target_ongoing_requests: 24", "target_ongoing_requests: 0",
     "applications[0].deployments[0].autoscaling_config.target_ongoing_requests"),
    ("aibrix", "scalingStrategy: APA", "scalingStrategy: XPA", "spec.scalingStrategy"),
])
def test_value_out_of_range_is_named(fmt, old, new, field):
    with pytest.raises(ConfigError) as err:
        parse_control_plane(FILES[fmt].replace(old, new), where="")
    assert err.value.field == field


@pytest.mark.parametrize("fmt, old, new, field", [
    ("kubernetes-hpa", "name: vllm:num_requests_waiting", "name: my_custom_metric", "spec.metrics[0].pods.metric.name"),
    ("kubernetes-hpa", "    - type: Pods\n      pods:", "    - type: Resource\n      pods:", "spec.metrics[0].type"),
    ("keda", "    - type: prometheus", "    - type: kafka", "spec.triggers[0].type"),
    ("knative", "class: kpa.autoscaling.knative.dev", "class: hpa.autoscaling.knative.dev",
     "spec.template.metadata.annotations.autoscaling.knative.dev/class"),
])
def test_valid_but_unmodelled_field_says_so(fmt, old, new, field):
    with pytest.raises(NotModelled) as err:
        parse_control_plane(FILES[fmt].replace(old, new), where="")
    assert err.value.field == field
    assert "not modelled" in str(err.value)


# (format, controller class, parameters the built controller must carry)
BUILT = [
    ("kubernetes-hpa", HorizontalPodAutoscaler,
     {"target": 2.0, "metric": "decode_waiting", "min_replicas": 1, "max_replicas": 4, "tolerance": 0.1,
      "downscale_stabilization_s": 120.0, "scale_up_pods": 4, "scale_up_percent": 100.0,
      "scale_down_percent": 100.0, "sample_period": 15.0}),
    ("keda", HorizontalPodAutoscaler,
     {"target": 4.0, "metric": "decode_waiting", "max_replicas": 8, "downscale_stabilization_s": 60.0}),
    ("knative", KnativeAutoscaler,
     {"target": 32 * 0.7, "metric": "decode_concurrency", "max_replicas": 10, "stable_window_s": 120.0,
      "panic_window_s": 12.0, "sample_period": 2.0}),
    ("ray-serve", RayServeAutoscaler,
     {"target_ongoing_requests": 24.0, "max_replicas": 6, "upscale_delay_s": 10.0, "downscale_delay_s": 300.0,
      "look_back_period_s": 30.0}),
    ("aibrix", AIBrixAPA, {"target": 0.5, "metric": "kv_occupancy", "up_band": 0.1, "down_band": 0.2}),
]


@pytest.mark.parametrize("fmt, cls, expected", BUILT)
def test_builds_the_matching_controller_with_its_parameters(fmt, cls, expected):
    controller = parse_control_plane(FILES[fmt]).build("decode")
    assert type(controller) is cls
    params = controller.params()
    for key, value in expected.items():
        assert params[key] == pytest.approx(value), key


@pytest.mark.parametrize("fmt, knobs", [
    ("kubernetes-hpa", {"tolerance": 0.25, "downscale_stabilization_s": 600}),
    ("keda", {"target": 6.0}),
    ("knative", {"stable_window_s": 180.0}),
    ("ray-serve", {"upscale_delay_s": 45.0, "target": 16.0}),
    ("aibrix", {"down_band": 0.3}),
])
def test_rewrite_changes_only_the_knobs(fmt, knobs):
    text = FILES[fmt]
    new = parse_control_plane(text).with_params(**knobs)
    out = rewrite_control_plane(text, new, comment=lambda path, old, value: f"tokenfactory: was {old}")
    assert parse_control_plane(out) == new
    for line in text.splitlines():            # the user's comments survive
        if "#" in line:
            assert line.split("#", 1)[1].strip() in out
    changed = [ln for ln in difflib.ndiff(text.splitlines(), out.splitlines()) if ln.startswith("+ ")]
    assert changed and all("tokenfactory: was" in ln or ln.strip("+ ").startswith(("---", "apiVersion", "kind",
                                                                                   "horizontalPodAutoscaler"))
                           for ln in changed), changed
    assert len(changed) <= 2 * len(knobs) + 4


def test_rewrite_of_an_unchanged_setting_is_the_identity():
    for text in FILES.values():
        assert rewrite_control_plane(text, parse_control_plane(text)) == text


def test_controller_manager_document_sets_sync_and_tolerance():
    text = HPA + """---
apiVersion: kubecontrollermanager.config.k8s.io/v1alpha1
kind: KubeControllerManagerConfiguration
horizontalPodAutoscalerConfig:
  horizontalPodAutoscalerSyncPeriod: 30s
  horizontalPodAutoscalerTolerance: 0.05
"""
    setting = parse_control_plane(text)
    assert (setting.sync_period_s, setting.tolerance) == (30.0, 0.05)
    assert parse_control_plane(dump_control_plane(setting)) == setting
    hpa = setting.build("decode")       # a 30 s sync; the default policies keep their 15 s periods
    assert hpa.sample_period == 30.0 and hpa.tolerance == 0.05
    assert hpa.scale_up_policies == (("percent", 100.0, 15.0), ("pods", 4.0, 15.0))


#: behavior sections the HPA reader used to reject (NotModelled) and now builds: scale-up
#: stabilisation, policies with their own periods, Min and Disabled selection
BEHAVIOR = HPA.replace("""  behavior:
    scaleDown:
      stabilizationWindowSeconds: 120
""", """  behavior:
    scaleUp:
      stabilizationWindowSeconds: 60
      selectPolicy: Min
      policies:
        - type: Pods
          value: 4
          periodSeconds: 60
        - type: Percent
          value: 100
          periodSeconds: 60
    scaleDown:
      stabilizationWindowSeconds: 120
      selectPolicy: Disabled
      policies:
        - type: Pods
          value: 1
          periodSeconds: 600
""")


def test_hpa_behavior_round_trips_and_builds_exactly():
    setting = parse_control_plane(BEHAVIOR)
    assert parse_control_plane(dump_control_plane(setting)) == setting
    p = setting.build("decode").params()
    assert p["upscale_stabilization_s"] == 60.0 and p["downscale_stabilization_s"] == 120.0
    assert p["scale_up_policies"] == (("pods", 4.0, 60.0), ("percent", 100.0, 60.0))
    assert p["scale_down_policies"] == (("pods", 1.0, 600.0),)
    assert (p["scale_up_select"], p["scale_down_select"]) == ("min", "disabled")
    new = setting.with_params(sample_period=30)     # the sync changes; the policies keep their periods
    assert new.build("decode").params()["scale_up_policies"] == p["scale_up_policies"]


def _file_with_up_policy(kind: str, value: int, period: int, select: str = "Max") -> str:
    return HPA.replace("""  behavior:
""", f"""  behavior:
    scaleUp:
      selectPolicy: {select}
      policies:
        - type: {kind}
          value: {value}
          periodSeconds: {period}
""")


# upstream cases (kubernetes pkg/controller/podautoscaler/horizontal_test.go TestScalingWithRules,
# read at commit 003e862, ported in tests/test_autoscaling_upstream.py) through a file: scale-up
# events [1, 5, 9] spread over the last 120 s, current 100, desired 500, maxReplicas 1000
@pytest.mark.parametrize("kind, value, period, expected", [
    ("Pods", 150, 120, 235),     # "scaleUp with pod policy and previous scale up events"
    ("Percent", 200, 120, 255),  # "scaleUp with percent policy and previous scale up events"
    ("Pods", 5, 120, 100),       # "... with rate.PeriodSeconds with a lot of recent scale up events"
])
def test_hpa_policy_periods_read_from_a_file_behave_as_upstream(kind, value, period, expected):
    text = _file_with_up_policy(kind, value, period).replace("maxReplicas: 4", "maxReplicas: 1000")
    hpa = parse_control_plane(text).build("decode")
    now, seg = 10_000.0, 120.0 / 3
    hpa._up_events = [(now - (120.0 - seg * (i + 1) + seg / 2), c) for i, c in enumerate([1, 5, 9])]
    assert hpa.rate_limit(now, 100, 500)[0] == expected


def test_hpa_min_select_and_upscale_window_from_a_file():
    """selectPolicy Min takes the policy allowing the smallest change (kubernetes.io, "Horizontal
    Pod Autoscaling", scaling policies): 10 replicas, 4 pods or 100 % per 60 s -> 14 (Max: 20). A
    60 s scale-up window acts on the lowest recommendation of the last minute (upstream
    stabilizeRecommendationWithBehaviors)."""
    both = BEHAVIOR.replace("maxReplicas: 4", "maxReplicas: 100")
    hpa = parse_control_plane(both).build("decode")
    assert hpa.rate_limit(0.0, 10, 50)[0] == 14
    hpa_max = parse_control_plane(both.replace("selectPolicy: Min", "selectPolicy: Max")).build("decode")
    assert hpa_max.rate_limit(0.0, 10, 50)[0] == 20
    hpa.reset()
    hpa._recs = [(-30.0, 12)]                # a recommendation of 12 half a minute ago
    assert hpa.stabilize(0.0, 10, 50) == 12  # the window's lowest, not 50


def test_sniffing_refuses_an_unknown_kind():
    with pytest.raises(ConfigError, match="cannot tell the control plane"):
        parse_control_plane("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n")


@pytest.mark.parametrize("text, seconds", [("60s", 60.0), ("1m30s", 90.0), ("500ms", 0.5), ("2h", 7200.0),
                                           (45, 45.0), ("12", 12.0)])
def test_durations(text, seconds):
    assert parse_duration_s("f", text) == seconds


@pytest.mark.parametrize("text, value", [("2", 2.0), ("500m", 0.5), ("1.5", 1.5), ("2k", 2000.0), ("1Ki", 1024.0)])
def test_quantities_read_and_write_back(text, value):
    assert parse_quantity("f", text) == value
    assert parse_quantity("f", format_quantity(value)) == value


@pytest.mark.parametrize("bad", ["1x", "", "m", "1m2"])
def test_bad_duration_names_the_field(bad):
    with pytest.raises(ConfigError) as err:
        parse_duration_s("spec.window", bad)
    assert err.value.field == "spec.window"


def test_vllm_config_keeps_engine_keys_and_changes_the_cap():
    text = "# engine\nmodel: m\ntensor_parallel_size: 2\nmax_num_seqs: 256\n"
    s = parse_control_plane(text)
    assert s.format == "vllm" and s.max_num_seqs == 256 and s.engine_keys == ("model", "tensor_parallel_size")
    out = rewrite_control_plane(text, s.with_params(max_num_seqs=48, max_num_batched_tokens=2048))
    assert "max_num_seqs: 48" in out and "max_num_batched_tokens: 2048" in out and "tensor_parallel_size: 2" in out
    assert parse_control_plane(out).max_num_seqs == 48
    with pytest.raises(ConfigError) as err:
        parse_control_plane("model: m\nmax-num-seqs: 0\n")
    assert err.value.field == "control_plane.max-num-seqs"
