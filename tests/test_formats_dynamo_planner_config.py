"""Dynamo planner config files (``controllers/formats/dynamo_planner_config.py``): the field table is
ai-dynamo 1.4.2's ``PlannerConfig``; reading is strict, writing reads back equal, a valid value the
simulated planner cannot honour says why, and the setting builds the real planner."""

from __future__ import annotations

import pytest

from tokenfactory.controllers.formats import (
    DynamoPlannerSetting,
    NotModelled,
    dump_control_plane,
    parse_control_plane,
    rewrite_control_plane,
)
from tokenfactory.controllers.formats.dynamo_planner_config import PLANNER_ALIASES, PLANNER_FIELDS, SCHEDULING_FIELDS
from tokenfactory.core.errors import ConfigError

#: a load-target planner as Dynamo's docs configure one (thresholds on prefill queue tokens and
#: decode KV use), with the user's comments
LOAD = """\
# the planner of our disaggregated deployment
optimization_target: load
load_adjustment_interval: 10          # Dynamo's alias of load_adjustment_interval_seconds
prefill_scale_up_queue_tokens: 8192
prefill_scale_down_queue_tokens: 819
decode_scale_up_kv_rate: 90
decode_scale_down_kv_rate: 60
max_gpu_budget: 16
min_endpoint: 1
environment: kubernetes
backend: vllm
"""

#: an SLA planner (throughput scaling on the perf model, load scaling under it)
SLA = """\
optimization_target: sla
enable_load_scaling: true
ttft: 800
itl_ms: 40
load_predictor: kalman
throughput_adjustment_interval_seconds: 60
fpm_sample_bucket_size: 1
"""

FILES = {"load": LOAD, "sla": SLA}


def test_field_table_is_the_installed_planner_config():
    """Every field of the installed PlannerConfig (and SchedulingConfig) is in the table with its
    default; fails when a later ai-dynamo adds, removes or re-defaults one."""
    import dynamo.planner.config.planner_config as pc   # the dynamo extra is part of .[dev]

    fields = pc.PlannerConfig.model_fields
    assert set(fields) == set(PLANNER_FIELDS)
    env_read = {"namespace", "metric_reporting_prometheus_port"} | {k for k in fields if k.startswith("metric_pulling")}
    for name, f in fields.items():
        kind, default, role, _ = PLANNER_FIELDS[name]
        if name in env_read:
            assert role == "env", name
        elif name in ("scheduling", "plugin_registration"):
            continue
        else:
            dflt = f.default.value if hasattr(f.default, "value") else f.default
            assert dflt == default, name
        aliases = getattr(f.validation_alias, "choices", None) or []
        assert {a for a in aliases if a != name} == {a for a, n in PLANNER_ALIASES.items() if n == name}, name
    sched = pc.SchedulingConfig.model_fields
    assert set(sched) == set(SCHEDULING_FIELDS)
    assert sched["tick_max_duration_seconds"].default == SCHEDULING_FIELDS["tick_max_duration_seconds"][1]


@pytest.mark.parametrize("name", FILES)
def test_round_trip_is_exact(name):
    setting = parse_control_plane(FILES[name])
    assert isinstance(setting, DynamoPlannerSetting) and setting.format == "dynamo-planner"
    text = dump_control_plane(setting)
    assert parse_control_plane(text) == setting
    assert dump_control_plane(parse_control_plane(text)) == text


def test_aliases_and_defaults_as_dynamo_reads_them():
    s = parse_control_plane(LOAD)
    assert s["load_adjustment_interval_seconds"] == 10
    assert s["throughput_adjustment_interval_seconds"] == 180     # Dynamo's default
    assert s["scale_interval_seconds"] == 10.0                    # Dynamo's gcd rule, load scaling alone
    sla = parse_control_plane(SLA)
    assert sla["ttft_ms"] == 800.0
    assert sla["scale_interval_seconds"] == 5.0                   # gcd(5, 60)
    with pytest.raises(ConfigError) as err:
        parse_control_plane(SLA + "ttft_ms: 900\n", where="p")
    assert err.value.field == "p.ttft"


@pytest.mark.parametrize("text, path", [
    (LOAD.replace("decode_scale_up_kv_rate", "decode_scale_up_kv_rat"), "p.decode_scale_up_kv_rat"),
    (SLA + "scheduling:\n  scale_interval: 5\n", "p.scheduling.scale_interval"),
])
def test_unknown_field_is_named(text, path):
    with pytest.raises(ConfigError) as err:
        parse_control_plane(text, fmt="dynamo-planner", where="p")
    assert err.value.field == path
    assert not isinstance(err.value, NotModelled)


@pytest.mark.parametrize("old, new, path", [
    ("decode_scale_up_kv_rate: 90", "decode_scale_up_kv_rate: 190", "p.decode_scale_up_kv_rate"),
    ("load_adjustment_interval: 10", "load_adjustment_interval: 0", "p.load_adjustment_interval_seconds"),
    ("backend: vllm", "backend: tgi", "p.backend"),
])
def test_value_out_of_range_is_named(old, new, path):
    with pytest.raises(ConfigError) as err:
        parse_control_plane(LOAD.replace(old, new), where="p")
    assert err.value.field == path


def test_dynamo_cross_field_rules_are_checked():
    with pytest.raises(ConfigError, match="greater than"):
        parse_control_plane(LOAD.replace("decode_scale_up_kv_rate: 90", "decode_scale_up_kv_rate: 50"), where="p")


@pytest.mark.parametrize("text, path", [
    (LOAD + "mode: agg\n", "mode"),
    (LOAD.replace("environment: kubernetes", "environment: global-planner\nglobal_planner_namespace: gp"),
     "environment"),
    (SLA.replace("fpm_sample_bucket_size: 1", "fpm_sample_bucket_size: 16"), "fpm_sample_bucket_size"),
    (LOAD + "load_predictor_warmup_trace: /data/trace.jsonl\n", "load_predictor_warmup_trace"),
    (LOAD + "scheduling:\n  external_plugins:\n    - plugin_id: x\n", "scheduling.external_plugins"),
    (LOAD.replace("optimization_target: load", "optimization_target: latency"), "optimization_target"),
])
def test_valid_but_unmodelled_value_says_why(text, path):
    s = parse_control_plane(text)
    with pytest.raises(NotModelled) as err:
        s.planner_fields()
    assert err.value.field == path and "not modelled" in str(err.value)


def test_planner_fields_pass_what_decides_and_keep_the_plumbing():
    f = parse_control_plane(LOAD).planner_fields()
    assert f["prefill_scale_up_queue_tokens"] == 8192 and f["decode_scale_down_kv_rate"] == 60.0
    assert f["load_adjustment_interval_seconds"] == 10 and f["max_gpu_budget"] == 16
    assert "environment" not in f and "backend" not in f and "report_output_dir" not in f


def test_builds_the_real_planner_with_the_file_fields():
    from tokenfactory.controllers.dynamo_planner import DynamoPlanner
    from tokenfactory.plant_models import FluidParams, PoolDynamics, RequestShape, ServiceModel, Worker
    from tokenfactory.registry import PlantContext

    w = Worker.from_dict({"model": "deepseek-v3", "hardware": "h200"})
    svc = ServiceModel(w, w, RequestShape(2048, 512))
    ctx = PlantContext(FluidParams.from_service(svc), 1, 1, dynamics=PoolDynamics(startup_s=60.0), service=svc,
                       max_replicas=8)
    planner = parse_control_plane(LOAD).build("decode", ctx)
    assert isinstance(planner, DynamoPlanner)
    assert planner.mode == "load"
    assert planner.config.prefill_scale_up_queue_tokens == 8192
    assert planner.config.load_adjustment_interval_seconds == 10
    assert planner.config.max_gpu_budget == 16
    assert planner.sample_period == 10.0
    planner.close()
    with pytest.raises(ConfigError, match="PlantContext"):
        parse_control_plane(LOAD).build("decode")


def test_rewrite_changes_only_the_knob_and_keeps_comments():
    new = parse_control_plane(LOAD).with_params(decode_scale_up_kv_rate=85.0)
    out = rewrite_control_plane(LOAD, new, comment=lambda p, o, v: f"tokenfactory: was {o}")
    assert parse_control_plane(out) == new
    assert "# Dynamo's alias of load_adjustment_interval_seconds" in out
    changed = [ln for ln in out.splitlines() if ln not in LOAD.splitlines()]
    assert changed == ["decode_scale_up_kv_rate: 85.0  # tokenfactory: was 90.0"]
    assert rewrite_control_plane(LOAD, parse_control_plane(LOAD)) == LOAD


def test_simulate_runs_the_file_through_the_real_planner(tmp_path):
    import json

    from tokenfactory.cli import main

    f = tmp_path / "planner.yaml"
    f.write_text(LOAD.replace("max_gpu_budget: 16", "max_gpu_budget: 32"))
    out = tmp_path / "out"
    assert main(["simulate", "--trace", "synthetic", "--duration", "3m", "--scale", "5", "--control-plane", str(f),
                 "--admission", "open", "--no-progress", "--out", str(out)]) == 0
    m = json.loads((out / "metrics.json").read_text())
    a = m["config"]["autoscalers"][0]
    assert a["kind"] == "dynamo-planner" and a["mode"] == "load"
    assert a["planner_config_overrides"]["load_adjustment_interval_seconds"] == 10
    assert a["planner_config_overrides"]["max_gpu_budget"] == 32
    assert m["requests"] == m["completed"] + m["rejected"] + m["in_flight_end"]


def test_stack_layer_reads_the_load_target_and_the_loop_model_names_what_it_lacks(tmp_path):
    """The stack's control-plane layer takes a planner file (its tick is the file's); the loop model
    that certifies it reads an sla file's targets as its levels (ttft 800 ms, itl 40 ms)."""
    from tokenfactory.controllers.dynamo_planner_loop import planner_pool_loops
    from tokenfactory.plant_models import FluidParams, RequestShape, Worker
    from tokenfactory.registry.stack_layers import ControlPlaneLayer

    f = tmp_path / "planner.yaml"
    f.write_text(LOAD)
    layer = ControlPlaneLayer(file=str(f))
    assert layer.read().format == "dynamo-planner" and layer.sample_period_s == 10.0
    w = Worker.from_dict({"model": "deepseek-v3", "hardware": "h200"})
    plant = FluidParams.from_workers(w, w, RequestShape(2048, 512))
    sla = planner_pool_loops(parse_control_plane(SLA), plant, demand_rps=10.0, metric_delay_s=1.0, startup_s=60.0)
    assert (sla["fill"].up, sla["decode"].up) == pytest.approx((0.8, 0.04))
    assert sla["decode"].down == pytest.approx(0.8 * 0.04)   # load_scaling_down_sensitivity 80 %
    with pytest.raises(ConfigError, match="max_gpu_budget") as err:   # 2 pools x 9 workers x 1 GPU > 16
        planner_pool_loops(parse_control_plane(LOAD).with_params(min_endpoint=9), plant, demand_rps=10.0,
                           metric_delay_s=1.0, startup_s=60.0)
    assert err.value.field == "min_endpoint"


def test_rewrite_edits_a_field_the_file_spells_by_its_alias():
    new = parse_control_plane(LOAD).with_params(load_adjustment_interval_seconds=15)
    out = rewrite_control_plane(LOAD, new, comment=lambda p, o, v: f"tokenfactory: was {o}")
    assert parse_control_plane(out) == new
    assert "load_adjustment_interval: 15" in out and "load_adjustment_interval_seconds" not in out


def test_the_readme_example_file_reads_and_round_trips():
    """The planner config the README's tour runs (docs/examples/dynamo-planner.yaml)."""
    from pathlib import Path

    from tokenfactory.controllers.formats import dump_control_plane, parse_control_plane, read_control_plane

    path = Path(__file__).resolve().parents[1] / "docs" / "examples" / "dynamo-planner.yaml"
    setting = read_control_plane(path)
    assert setting.format == "dynamo-planner" and setting == parse_control_plane(LOAD.replace(
        "max_gpu_budget: 16", "max_gpu_budget: 32"))
    assert parse_control_plane(dump_control_plane(setting)) == setting
