"""The reference of the files a user writes (tokenfactory/reference.py): every key each reader
accepts is documented, every documented key is accepted, the page is what the code generates."""

from __future__ import annotations

import copy
import json
import re
import tomllib
from pathlib import Path

import pytest

from tokenfactory.core.validation import ConfigError, resolve_config
from tokenfactory.reference import SECTIONS, allowed_text, default_text, reference_page, render_schema, schema_tables

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data" / "reference"
PROBE = "zz_undocumented"
_PLANT = {"model": "deepseek-v3", "hardware": "h200", "fill_workers": 2, "decode_workers": 1}
_STACK = {"plant": {"model": "deepseek-v3", "hardware": "h200"}, "workload": {"rate_rps": 100.0},
          "layers": {"reconfiguration": {"kind": "planned-hysteretic"}}}


def _table(section: str, path: str, selector: str = ""):
    hits = [t for t in schema_tables(section) if t.path == path and t.selector == selector]
    assert len(hits) == 1, (section, path, selector)
    return hits[0]


def _documented(section: str, path: str, selector: str = "") -> set[str]:
    return {r["name"] for r in _table(section, path, selector).rows}


def _accepted(read, where: str) -> set[str]:
    """The keys a reader accepts, read off its own rejection of an undocumented key."""
    with pytest.raises(ConfigError) as e:
        read()
    assert e.value.field == f"{where}.{PROBE}" if where else PROBE, str(e.value)
    m = re.search(r"allowed keys are (.*)$", str(e.value))
    assert m, str(e.value)
    return {k.strip() for k in m.group(1).split(",") if k.strip()}


def _with(base: dict, path: str, value) -> dict:
    """``base`` with ``value`` merged at the dotted ``path`` (a list index as ``[0]``)."""
    d = copy.deepcopy(base)
    cur = d
    keys = path.split(".") if path else []
    for k in keys:
        cur = cur.setdefault(k, {})
    cur.update(value)
    return d


def _probes():
    """(section, table, selector, where the reader names the key, reader fed an undocumented key)."""
    from tokenfactory.live.live_scenario import live_scenario_from_dict
    from tokenfactory.plant_models import Worker, accelerator_from_dict, model_from_dict
    from tokenfactory.plant_models.des.config import EVENT_KINDS as CLUSTER_EVENTS
    from tokenfactory.plant_models.fluid import DISTURBANCE_KINDS
    from tokenfactory.registry import ADMISSION_KINDS, AUTOSCALER_KINDS, build_admission, build_autoscalers
    from tokenfactory.registry.admission_kinds import _margin_config
    from tokenfactory.registry.stack_layers import STACK_LAYER_KINDS
    from tokenfactory.replay import replay_scenario_from_dict as replay
    from tokenfactory.scenario import scenario_from_dict as margins
    from tokenfactory.stack.stack_scenario import stack_scenario_from_dict as stack

    bad = {PROBE: 1}
    worker = {"model": "deepseek-v3", "hardware": "h200"}
    p = [
        ("model", "model", "", "model", lambda: model_from_dict(bad)),
        ("model", "model.attention", "", "model.attention",
         lambda: model_from_dict({"base": "deepseek-v3", "attention": bad})),
        ("hardware", "hardware", "", "hardware", lambda: accelerator_from_dict(bad)),
        ("scenario", "", "", "", lambda: replay(bad)),
        ("scenario", "plant", "", "plant", lambda: replay({"plant": bad})),
        ("scenario", "plant.parallelism", "", "worker.parallelism",
         lambda: Worker.from_dict({**worker, "parallelism": bad})),
        ("scenario", "plant.efficiency", "", "worker.efficiency", lambda: Worker.from_dict({**worker, "efficiency": bad})),
        ("scenario", "envelope", "", "envelope", lambda: replay({"envelope": bad})),
        ("scenario", "simulation", "", "simulation", lambda: replay({"simulation": bad})),
        ("cluster", "cluster", "", "cluster", lambda: replay({"cluster": bad})),
        ("cluster", "cluster.dynamics", "", "cluster.dynamics", lambda: replay({"cluster": {"dynamics": bad}})),
        ("cluster", "classes.NAME", "", "classes.interactive", lambda: replay({"classes": {"interactive": bad}})),
        ("margins", "", "", "", lambda: margins(bad)),
        ("margins", "plant", "", "plant", lambda: margins({"plant": bad, "controller": {"kind": "open"}})),
        ("margins", "envelope", "", "envelope",
         lambda: margins({"plant": _PLANT, "controller": {"kind": "open"}, "envelope": bad})),
        ("margins", "simulation", "", "simulation",
         lambda: margins({"plant": _PLANT, "controller": {"kind": "open"}, "simulation": bad})),
        ("stack", "", "", "", lambda: stack({**_STACK, **bad})),
        ("stack", "plant", "", "plant", lambda: stack(_with(_STACK, "plant", bad))),
        ("stack", "slo", "", "slo", lambda: stack(_with(_STACK, "slo", bad))),
        ("stack", "workload", "", "workload", lambda: stack(_with(_STACK, "workload", bad))),
        ("stack", "dynamics", "", "dynamics", lambda: stack(_with(_STACK, "dynamics", bad))),
        ("stack", "envelope", "", "envelope", lambda: stack(_with(_STACK, "envelope", bad))),
        ("stack", "certificate", "", "certificate", lambda: stack(_with(_STACK, "certificate", bad))),
        ("kinds", "admission.slo-aware.outer", "", "outer", lambda: _margin_config(None, bad, 0.0, "outer")),
        ("live", "live", "", "live", lambda: live_scenario_from_dict({"live": bad})),
    ]
    for kind in CLUSTER_EVENTS:
        p.append(("cluster", "[cluster.events]", f'kind = "{kind}"', "cluster.events[0]",
                  lambda kind=kind: replay({"cluster": {"events": [{"kind": kind, **bad}]}})))
    for kind in DISTURBANCE_KINDS:
        p.append(("margins", "[simulation.disturbances]", f'kind = "{kind}"', "simulation.disturbances[0]",
                  lambda kind=kind: margins({"plant": _PLANT, "controller": {"kind": "open"},
                                             "simulation": {"disturbances": [{"kind": kind, **bad}]}})))
    for layer, kinds in STACK_LAYER_KINDS.items():
        for kind in kinds:
            p.append(("stack", f"layers.{layer}", f'kind = "{kind}"', f"layers.{layer}",
                      lambda layer=layer, kind=kind: stack(_with(_STACK, f"layers.{layer}", {"kind": kind, **bad}))))
    for kind in ADMISSION_KINDS:
        p.append(("kinds", f"admission.{kind}", "", "admission", lambda kind=kind: build_admission(kind, None, bad)))
        # the same kind through a scenario file's [controller] table
        p.append(("kinds", f"admission.{kind}", "", "controller",
                  lambda kind=kind: replay({"controller": {"kind": kind, **bad}})))
    for kind in AUTOSCALER_KINDS:
        p.append(("kinds", f"autoscaler.{kind}", "", "autoscaler",
                  lambda kind=kind: build_autoscalers(kind, None, bad)))
    return p


_PROBES = _probes()


@pytest.mark.parametrize("section,path,selector,where,read", _PROBES,
                         ids=[f"{s}:{p or 'top'}{':' + sel if sel else ''}:{w}" for s, p, sel, w, _ in _PROBES])
def test_every_accepted_key_is_documented(section, path, selector, where, read):
    # the reader's own list of allowed keys (from its error on an undocumented key) is the schema's
    assert _accepted(read, where) == _documented(section, path, selector)


def test_every_table_is_probed():
    probed = {(s, p, sel) for s, p, sel, _, _ in _PROBES}
    # the controller tables hold only `kind` (their other keys are the kinds' parameters, probed above)
    unprobed = {(t.section, t.path, t.selector) for t in schema_tables()} - probed
    assert unprobed == {("scenario", "controller", ""), ("margins", "controller", ""),
                        ("margins", "plant.parallelism", ""), ("margins", "plant.efficiency", ""),
                        ("stack", "plant.parallelism", ""), ("stack", "plant.efficiency", "")}
    # those share one reader (Worker.from_dict) and one schema with the scenario section's tables
    for s in ("margins", "stack"):
        for path in ("plant.parallelism", "plant.efficiency"):
            assert _documented(s, path) == _documented("scenario", path)


def test_every_key_has_a_meaning_and_a_type():
    for t in schema_tables():
        for r in t.rows:
            assert len(r["meaning"].split()) >= 2, (t.path, r["name"])  # one plain sentence, not a bare word
            assert r["type"] in ("float", "int", "bool", "str") or " " in r["type"] or r["type"] == "table", r


def test_every_table_summary_is_a_whole_sentence():
    """A summary taken from a docstring keeps its whole first paragraph (an event's docstring runs on
    past its first line), on one line with single spaces and one closing period on the page."""
    page = reference_page()
    for t in schema_tables():
        assert "  " not in t.summary and not t.summary.endswith("."), t.summary
    assert "restarts after ``restart_s``; the requests it held lose their state and are re-queued." in page
    assert not re.search(r"\.\.$", page, re.M), "a summary ends with two periods"


# -- every documented key is accepted ---------------------------------------------------------------------


def _keys_at(doc: dict, path: str) -> set[str]:
    cur = doc
    for k in path.split(".") if path else []:
        cur = cur[k]
    return set(cur)


def _union(*sets):
    return set().union(*sets)


def test_model_file_with_every_key_loads():
    from tokenfactory.plant_models import load_model

    doc = tomllib.loads((DATA / "model.toml").read_text())
    assert set(doc) == _documented("model", "model")
    assert set(doc["attention"]) == _documented("model", "model.attention")
    m = load_model(DATA / "model.toml")
    assert (m.name, m.attention.q_lora_rank, m.attention.full_attention_layers) == ("my-dsv3", 1536, 61)


def test_hardware_file_with_every_key_loads():
    from tokenfactory.plant_models import load_accelerator

    doc = tomllib.loads((DATA / "hardware.toml").read_text())
    assert set(doc) == _documented("hardware", "hardware")
    a = load_accelerator(DATA / "hardware.toml")
    assert (a.name, a.ssd_bytes, a.dense_flops["fp8"]) == ("my-h200", 3.84e12, 1.979e15)


def test_replay_scenario_with_every_key_runs(tmp_path, capsys):
    from tokenfactory.cli import main

    doc = tomllib.loads((DATA / "scenario.toml").read_text())
    assert set(doc) == _documented("scenario", "")
    assert set(doc["plant"]) == _documented("scenario", "plant")
    assert set(doc["plant"]["parallelism"]) == _documented("scenario", "plant.parallelism")
    assert set(doc["plant"]["efficiency"]) == _documented("scenario", "plant.efficiency")
    assert set(doc["envelope"]) == _documented("scenario", "envelope")
    # load and scale exclude each other: the file gives load, the check below scale
    assert set(doc["simulation"]) | {"scale"} == _documented("scenario", "simulation")
    # classes given once: the file's top-level [classes]; cluster.classes below
    assert set(doc["cluster"]) | {"classes"} == _documented("cluster", "cluster")
    assert set(doc["cluster"]["dynamics"]) == _documented("cluster", "cluster.dynamics")
    for ev in doc["cluster"]["events"]:
        assert set(ev) - {"kind"} == _documented("cluster", "[cluster.events]", f'kind = "{ev["kind"]}"')
    assert {e["kind"] for e in doc["cluster"]["events"]} == {
        t.selector.split('"')[1] for t in schema_tables("cluster") if t.path == "[cluster.events]"}
    assert all(set(c) == _documented("cluster", "classes.NAME") for c in doc["classes"].values())
    assert set(doc["controller"]) - {"kind"} == _documented("kinds", "admission.slo-aware")
    assert set(doc["controller"]["outer"]) == _documented("kinds", "admission.slo-aware.outer")

    from tokenfactory.replay import replay_scenario_from_dict

    alt = copy.deepcopy(doc)
    alt["cluster"]["classes"] = alt.pop("classes")
    alt["simulation"] = {"scale": 2.0}
    replay_scenario_from_dict(alt)  # the other two keys accepted
    # the file runs as written: model and hardware files beside it, every event, the SLO-aware gate
    out = tmp_path / "run"
    assert main(["simulate", "--scenario", str(DATA / "scenario.toml"), "--trace", "synthetic", "--duration", "30s",
                 "--capacity", "model", "--out", str(out)]) == 0
    m = json.loads((out / "metrics.json").read_text())
    ran = m["capacity"]["cluster"]
    assert ran["model"].endswith("reference/model.toml") and ran["hardware"].endswith("reference/hardware.toml")
    assert ran["parallelism"]["num_gpus"] == 8 and ran["efficiency"]["network_scale_out"] == 0.49
    assert "bulk" in {c["name"] for c in ran["classes"]} and len(m["config"]["cluster"]["events"]) == 4
    assert m["completed"] + m["rejected"] + m["in_flight_end"] + m["deferred_end"] == m["requests"] > 0
    assert "my-dsv3" in capsys.readouterr().out  # the printed cluster names the model file's model


def test_margins_scenario_with_every_key_loads():
    from tokenfactory.scenario import load_scenario

    doc = tomllib.loads((DATA / "margins.toml").read_text())
    assert set(doc) == _documented("margins", "")
    assert set(doc["plant"]) == _documented("margins", "plant")
    assert set(doc["envelope"]) == _documented("margins", "envelope")
    assert set(doc["simulation"]) == _documented("margins", "simulation")
    for ev in doc["simulation"]["disturbances"]:
        assert set(ev) - {"kind"} == _documented("margins", "[simulation.disturbances]", f'kind = "{ev["kind"]}"')
    assert set(doc["controller"]) - {"kind"} == _documented("kinds", "admission.smoothed")
    sc = load_scenario(DATA / "margins.toml")
    assert len(sc.simulation.disturbances) == 3 and sc.tuning is None  # kc/ti given: hand tuning


def test_stack_scenario_with_every_key_loads():
    from tokenfactory.stack import load_stack_scenario

    doc = tomllib.loads((DATA / "stack.toml").read_text())
    for path in ("", "plant", "slo", "workload", "dynamics", "envelope", "certificate"):
        assert _keys_at(doc, path) == _documented("stack", path), path
    sc = load_stack_scenario(DATA / "stack.toml")
    assert sc.dynamics.fleet_size == 400 and "planning" not in sc.layers


def test_live_scenario_with_every_key_loads():
    from tokenfactory.live.live_scenario import load_live_scenario

    doc = tomllib.loads((DATA / "live.toml").read_text())
    assert set(doc["live"]) == _documented("live", "live")
    sc = load_live_scenario(DATA / "live.toml")
    assert sc.live == doc["live"] and sc.metrics_delay_s == 0.5


def _example(row: dict):
    """A value inside a key's documented range (its default when it has one)."""
    if not row["required"] and row["default"] is not None:
        return row["default"]
    if row["choices"]:
        return row["choices"][0]
    if row["type"] == "bool":
        return True
    if row["type"] == "str":
        return "x"
    lo, hi = row["low"], row["high"]
    v = 1.0 if lo is None else (lo if row["low_inclusive"] else lo + (0.5 * (hi - lo) if hi is not None else 1.0))
    return int(round(v)) if row["type"] == "int" else v


def test_every_stack_layer_kind_takes_every_key():
    from tokenfactory.registry.stack_layers import STACK_LAYER_KINDS

    for layer, kinds in STACK_LAYER_KINDS.items():
        for kind, cls in kinds.items():
            rows = _table("stack", f"layers.{layer}", f'kind = "{kind}"').rows
            cfg = resolve_config(cls, {r["name"]: _example(r) for r in rows}, f"layers.{layer}")
            assert {r["name"] for r in rows} <= set(vars(cfg)) | {f for f in cls.__dataclass_fields__}


def test_every_kind_parameter_is_accepted():
    """Each kind built with every documented parameter at a value inside its range."""
    from tokenfactory.registry import ADMISSION_KINDS, AUTOSCALER_KINDS, PlantContext, build_admission, \
        build_autoscalers
    from tokenfactory.scenario import build_plant

    plant = build_plant(_PLANT)
    ctx = PlantContext(plant.params, plant.fill_workers, plant.decode_workers, rate_rps=1.0)
    for kind in ADMISSION_KINDS:
        params = {r["name"]: _example(r) for r in _table("kinds", f"admission.{kind}").rows
                  if r["type"] != "table"}
        if kind == "smoothed":
            params.update(kc=0.5, ti=10.0, target_ready=50.0)
        build_admission(kind, ctx, params)
    for kind in AUTOSCALER_KINDS:
        if kind == "dynamo-planner":
            pytest.importorskip("dynamo.planner")
        params = {r["name"]: _example(r) for r in _table("kinds", f"autoscaler.{kind}").rows
                  if r["type"] != "table"}
        if kind == "dynamo-throughput":
            params["warmup"] = [1.0, 1.0]
        build_autoscalers(kind, ctx, params)


# -- out-of-range values are rejected where the schema says ----------------------------------------------

_EVENT_REQUIRED = {"worker_crash": {"at_s": 1.0}, "link_slowdown": {"start_s": 1.0, "duration_s": 1.0, "factor": 0.5},
                   "decode_rate_dip": {"start_s": 1.0, "duration_s": 1.0, "factor": 0.5},
                   "reconfiguration": {"at_s": 1.0, "source": "fill", "target": "decode"},
                   "demand_step": {"at_s": 1.0, "factor": 1.0}, "decode_workers_lost": {"at_s": 1.0, "fraction": 0.1}}


def _value_readers():
    """(section, table, selector) -> readers taking one table of values (any of them may reject)."""
    from tokenfactory.live.live_scenario import live_scenario_from_dict
    from tokenfactory.plant_models import Worker, accelerator_from_dict, model_from_dict
    from tokenfactory.plant_models.des.config import ClusterConfig
    from tokenfactory.registry import PlantContext, build_admission, build_autoscalers
    from tokenfactory.registry.stack_layers import stack_layer_config
    from tokenfactory.replay import replay_scenario_from_dict as replay
    from tokenfactory.scenario import build_plant, scenario_from_dict as margins
    from tokenfactory.stack.stack_scenario import stack_scenario_from_dict as stack

    plant = build_plant(_PLANT)
    ctx = PlantContext(plant.params, plant.fill_workers, plant.decode_workers, rate_rps=1.0)
    worker = {"model": "deepseek-v3", "hardware": "h200"}
    r = {
        ("model", "model", ""): [lambda kv: model_from_dict({"base": "deepseek-v3", **kv})],
        # GQA and MLA sizes are checked for their own kind only
        ("model", "model.attention", ""): [lambda kv: model_from_dict({"base": "deepseek-v3", "attention": kv}),
                                           lambda kv: model_from_dict({"base": "llama-3.1-8b", "attention": kv})],
        ("hardware", "hardware", ""): [lambda kv: accelerator_from_dict({"base": "h200", **kv})],
        ("scenario", "plant", ""): [lambda kv: replay({"plant": kv})],
        ("scenario", "plant.parallelism", ""): [lambda kv: Worker.from_dict({**worker, "parallelism": kv})],
        ("scenario", "plant.efficiency", ""): [lambda kv: Worker.from_dict({**worker, "efficiency": kv})],
        ("scenario", "envelope", ""): [lambda kv: replay({"envelope": kv})],
        ("scenario", "simulation", ""): [lambda kv: replay({"simulation": kv})],
        ("cluster", "cluster", ""): [lambda kv: replay({"cluster": kv})],
        ("cluster", "cluster.dynamics", ""): [lambda kv: replay({"cluster": {"dynamics": kv}})],
        ("cluster", "classes.NAME", ""): [lambda kv: replay({"classes": {"interactive": kv}})],
        ("margins", "plant", ""): [lambda kv: build_plant({**_PLANT, **kv})],
        ("margins", "simulation", ""): [lambda kv: margins({"plant": _PLANT, "controller": {"kind": "open"},
                                                            "simulation": kv})],
        ("live", "live", ""): [lambda kv: live_scenario_from_dict({"live": kv})],
        ("kinds", "admission.slo-aware.outer", ""): [lambda kv: build_admission("slo-aware", ctx, {"outer": kv})],
    }
    for path in ("plant", "slo", "workload", "dynamics", "envelope", "certificate"):
        r[("stack", path, "")] = [lambda kv, path=path: stack(_with(_STACK, path, kv))]
    for t in schema_tables():
        key = (t.section, t.path, t.selector)
        kind = t.selector.split('"')[1] if t.selector else t.path.rsplit(".", 1)[-1]
        if t.path == "[cluster.events]":
            r[key] = [lambda kv, k=kind: replay({"cluster": {"events": [{"kind": k, **_EVENT_REQUIRED[k], **kv}]}})]
        elif t.path == "[simulation.disturbances]":
            r[key] = [lambda kv, k=kind: margins({"plant": _PLANT, "controller": {"kind": "open"}, "simulation": {
                "disturbances": [{"kind": k, **_EVENT_REQUIRED[k], **kv}]}})]
        elif t.path.startswith("layers."):
            r[key] = [lambda kv, layer=t.path.split(".")[1], k=kind: stack_layer_config(layer, {"kind": k, **kv})]
        elif t.section == "kinds" and t.path.count(".") == 1:
            build = build_admission if t.path.startswith("admission.") else build_autoscalers
            r[key] = [lambda kv, k=kind, b=build: b(k, ctx, kv)]
    return r


def _outside(row: dict) -> list:
    vals = []
    if row["low"] is not None:
        vals.append(row["low"] - 1 if row["low_inclusive"] else row["low"])
    if row["high"] is not None:
        vals.append(row["high"] + 1 if row["high_inclusive"] else row["high"])
    return [int(v) if row["type"] == "int" else v for v in vals]


def test_documented_ranges_are_the_readers():
    # a value just outside a documented bound is rejected by the reader, naming the key as written
    readers = _value_readers()
    checked, missing = 0, []
    for t in schema_tables():
        rows = [r for r in t.rows if r["type"] in ("int", "float") and _outside(r)]
        if not rows:
            continue
        if (t.section, t.path, t.selector) not in readers:
            missing.append((t.section, t.path, t.selector))
            continue
        for r in rows:
            for v in _outside(r):
                errors = []
                for read in readers[(t.section, t.path, t.selector)]:
                    try:
                        read({r["name"]: v})
                    except ConfigError as e:
                        errors.append(str(e))
                assert any(r["name"] in e for e in errors), (t.title, r["name"], v, errors)
                checked += 1
    # the tables left are shared with a checked one (parallelism, efficiency, envelope of margins)
    assert set(missing) == {("margins", "plant.parallelism", ""), ("margins", "plant.efficiency", ""),
                            ("margins", "envelope", ""), ("stack", "plant.parallelism", ""),
                            ("stack", "plant.efficiency", "")}
    assert checked > 250, checked


# -- describe schema and the page ------------------------------------------------------------------------


def test_describe_schema_cluster_text(capsys):
    from tokenfactory.cli import main

    assert main(["describe", "schema", "cluster"]) == 0
    out = capsys.readouterr().out
    assert "[cluster.dynamics]" in out and "[cluster]" in out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("startup_s"))
    assert "float s; default 120; allowed [0, 3600]" in line
    assert 'kind = "worker_crash"' in out and "restart_s" in out
    assert "kv_watermark" in out and "vLLM's default" in out  # the constant's source
    assert "[layers." not in out  # one section only


def test_describe_schema_json_and_markdown(capsys):
    from tokenfactory.cli import main

    assert main(["describe", "schema", "model", "--format", "json"]) == 0
    tables = json.loads(capsys.readouterr().out)
    attn = next(t for t in tables if t["table"] == "model.attention")
    kind = next(k for k in attn["keys"] if k["name"] == "kind")
    assert kind["required"] and kind["choices"] == ["gqa", "mla"]
    assert main(["describe", "schema", "hardware", "--format", "markdown"]) == 0
    md = capsys.readouterr().out
    assert "| `hbm_bandwidth` | float | bytes/s | required | (0, inf) |" in md


def test_unknown_section_is_a_config_error(capsys):
    from tokenfactory.cli import main

    assert main(["describe", "schema", "clusters"]) == 2
    assert "section" in capsys.readouterr().err


def test_every_section_renders():
    for s in SECTIONS:
        assert render_schema(s).startswith(f"== {s}:")


def test_allowed_and_default_text():
    row = {"choices": [], "low": 0.0, "high": 1.0, "low_inclusive": False, "high_inclusive": True, "also": ["auto"],
           "required": False, "default": None, "type": "float"}
    assert allowed_text(row) == '(0, 1] or "auto"'
    assert default_text(row) == "-"
    assert default_text({**row, "required": True}) == "required"
    assert default_text({**row, "default": (0.5, 1.0)}) == "[0.5, 1]"


def test_reference_page_is_generated():
    page = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
    assert page == reference_page(), "docs/reference.md is out of date: run make reference"


@pytest.mark.parametrize("kind", ["naive", "threshold", "vllm-watermark", "smoothed"])
def test_documented_kind_defaults_are_the_builders(kind):
    # built without parameters, the controller runs with the documented defaults
    from tokenfactory.registry import PlantContext, build_admission
    from tokenfactory.scenario import build_plant

    plant = build_plant(_PLANT)
    ctrl = build_admission(kind, PlantContext(plant.params, plant.fill_workers, plant.decode_workers), {})
    got = ctrl.params()
    checked = 0
    for r in _table("kinds", f"admission.{kind}").rows:
        name = r["name"].removesuffix("_s") if r["name"] in ("sample_period_s", "service_filter_tau_s") else r["name"]
        if r["default"] is None or name not in got:
            continue
        assert got[name] == pytest.approx(r["default"]) if isinstance(r["default"], float) else got[name] == r["default"]
        checked += 1
    assert checked >= 1
