"""A control plane's own settings file as the stack's reconfiguration layer: certified by its
loop model, built exactly as configured, and a failed certificate names the knob that passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenfactory.core.errors import ConfigError
from tokenfactory.stack import build_stack, certify, load_stack_scenario
from tokenfactory.stack.plant import stack_plant

DATA = Path(__file__).parent / "data" / "small_plant"
MODEL = (DATA / "model.toml").read_text()   # the small-plant case's own files

STACK = """\
name = "user_stack"
[plant]
model = "{model}"
hardware = "h100-sxm"
parallelism = {{ tp = 2, pp = 1, ep = 2 }}
prompt_tokens = 2000
output_tokens = 300
measurement_delay_s = 5.0

[slo]
ttft_s = 2.0
tpot_s = 0.1
attainment = 0.99

[workload]
rate_rps = {rate}

[dynamics]
startup_s = 90.0
warmup_s = 30.0
warmup_factor = 0.5
drain_s = 30.0

[layers.batch_gate]
kind = "slot-limit"

[layers.admission]
kind = "smoothed"
sample_period_s = 5.0

[layers.reconfiguration]
kind = "control-plane"
file = "hpa.yaml"
pool = "decode"

[layers.planning]
kind = "none"

[envelope]
delay_factors = [1.0]
service_rate_factors = [1.0]
demand_factors = [1.0]
startup_factors = [1.0]
gm_floor = 2.0
pm_floor_deg = 45.0
"""

HPA = (DATA / "hpa.yaml").read_text()


def _scenario(tmp_path, workers_of_demand: float):
    (tmp_path / "model.toml").write_text(MODEL)
    (tmp_path / "hpa.yaml").write_text(HPA)
    path = tmp_path / "stack.toml"
    path.write_text(STACK.format(model=(tmp_path / "model.toml").as_posix(), rate=1.0))
    mu = stack_plant(load_stack_scenario(path)).params.decode_capacity(1)
    path.write_text(STACK.format(model=(tmp_path / "model.toml").as_posix(), rate=workers_of_demand * mu))
    return load_stack_scenario(path)


def test_queue_length_hpa_between_two_pool_sizes_fails_and_names_the_fix(tmp_path):
    cert = certify(_scenario(tmp_path, 1.45))
    rec = cert.layers["reconfiguration"]
    assert rec["control_plane"] == "kubernetes-hpa" and rec["controller"] == "HorizontalPodAutoscaler"
    assert not rec["meets_floors"] and rec["worst"]["predicted_cycle_s"] > 0
    fail = next(f for f in cert.failures if f["layer"] == "reconfiguration")
    assert "cycle between 1 and 4 workers" in fail["detail"]
    assert "min_replicas 1 -> 2 passes" in fail["detail"]
    assert any(d["layer"] == "reconfiguration" and d["limit_cycle"] for d in cert.describing_function)


def test_a_floor_that_carries_the_demand_passes(tmp_path):
    sc = _scenario(tmp_path, 0.6)
    cert = certify(sc)
    assert cert.layers["reconfiguration"]["meets_floors"]
    assert not any(f["layer"] == "reconfiguration" for f in cert.failures)
    stack, _ = build_stack(sc)
    (layer,) = [la for la in stack.layers if la.name == "reconfiguration"]
    (hpa,) = layer.controllers
    assert hpa.params()["target"] == 2.0 and hpa.params()["metric"] == "decode_waiting"
    assert layer.sample_period == 15.0


def test_the_file_is_required(tmp_path):
    sc = _scenario(tmp_path, 0.6)
    (tmp_path / "hpa.yaml").unlink()
    with pytest.raises(ConfigError, match="does not exist"):
        certify(sc)


PLANNER = """\
optimization_target: load
load_adjustment_interval: 10
prefill_scale_up_queue_tokens: 8192
prefill_scale_down_queue_tokens: 819
decode_scale_up_kv_rate: 90
decode_scale_down_kv_rate: 60
max_gpu_budget: 32
min_endpoint: 1
"""


def test_dynamo_planner_file_is_certified_by_its_loop_model_and_built(tmp_path):
    """A Dynamo planner config as the layer: at 1.05 decode workers' demand one worker reads 100 % KV
    use and two 52.5 %, outside 60-90 % both - the planner's loop model predicts a 1 <-> 2 cycle,
    the certificate fails and names a knob of the file that passes; at 1.5 two workers read 75 %
    and it passes. The layer builds Dynamo's real planner at the file's tick."""
    sc = _scenario(tmp_path, 1.05)
    (tmp_path / "planner.yaml").write_text(PLANNER)
    text = (tmp_path / "stack.toml").read_text().replace('file = "hpa.yaml"', 'file = "planner.yaml"')
    (tmp_path / "stack.toml").write_text(text)
    cert = certify(load_stack_scenario(tmp_path / "stack.toml"))
    rec = cert.layers["reconfiguration"]
    assert rec["control_plane"] == "dynamo-planner" and rec["controller"] == "DynamoPlanner"
    assert not rec["meets_floors"] and rec["sample_period_s"] == 10.0
    fail = next(f for f in cert.failures if f["layer"] == "reconfiguration")
    assert "cycle between 1 and 2 workers" in fail["detail"]
    assert "decode_scale_down_kv_rate 60 -> 30 passes" in fail["detail"]
    mu = sc.rate_rps / 1.05
    (tmp_path / "stack.toml").write_text(text.replace(f"rate_rps = {1.05 * mu}", f"rate_rps = {1.5 * mu}"))
    sc15 = load_stack_scenario(tmp_path / "stack.toml")
    assert certify(sc15).layers["reconfiguration"]["meets_floors"]
    stack, _ = build_stack(sc15)
    (layer,) = [la for la in stack.layers if la.name == "reconfiguration"]
    (planner,) = layer.controllers
    assert type(planner).__name__ == "DynamoPlanner" and layer.sample_period == 10.0


SLA_PLANNER = """\
optimization_target: sla
enable_load_scaling: true
ttft_ms: 2000
itl_ms: 100
load_predictor: constant
throughput_adjustment_interval_seconds: 60
load_adjustment_interval_seconds: 10
fpm_sample_bucket_size: 1
max_gpu_budget: 64
"""


def test_dynamo_planner_sla_file_is_certified_by_its_sla_loop_model(tmp_path):
    """An sla-target planner file as the layer: certified by the sla loop model (its floor from the
    predicted demand over a worker's rate at the ITL target, the consolidation-aware rule holding it),
    which at 2.5 decode workers' demand predicts no cycle and passes."""
    sc = _scenario(tmp_path, 2.5)
    (tmp_path / "planner.yaml").write_text(SLA_PLANNER)
    text = (tmp_path / "stack.toml").read_text().replace('file = "hpa.yaml"', 'file = "planner.yaml"')
    (tmp_path / "stack.toml").write_text(text)
    rec = certify(load_stack_scenario(tmp_path / "stack.toml")).layers["reconfiguration"]
    assert rec["control_plane"] == "dynamo-planner" and rec["meets_floors"], rec
    assert sc.rate_rps > 0
