"""The stack's layer kinds (tokenfactory.registry.stack_layers): typed configs resolved once, and no
kind named outside the registry."""

from __future__ import annotations

import ast
import dataclasses

import pytest

from tokenfactory.core.validation import ConfigError, config_schema
from tokenfactory.registry import ADMISSION_KINDS, AUTOSCALER_KINDS
from tokenfactory.registry.stack_layers import (
    STACK_LAYER_KINDS,
    GatedBatchCap,
    PlannedHystereticLayer,
    stack_layer_config,
)

ALL_LAYER_KINDS = [(layer, kind) for layer, kinds in STACK_LAYER_KINDS.items() for kind in kinds]


@pytest.mark.parametrize("layer,kind", ALL_LAYER_KINDS)
def test_every_setting_describes_itself(layer, kind):
    cls = STACK_LAYER_KINDS[layer][kind]
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
    rows = config_schema(cls)
    assert rows, kind
    for r in rows:
        assert r["meaning"] and r["type"] in ("float", "int", "bool", "str"), r
    # the defaults resolve: an empty table is the kind at its defaults
    cfg = stack_layer_config(layer, {"kind": kind})
    assert type(cfg) is cls and cfg.kind == kind and cfg.layer == layer


@pytest.mark.parametrize("table,field", [
    ({"kind": "planned-hysteretic", "dead_bnd": 1}, "layers.reconfiguration.dead_bnd"),        # unknown key
    ({"kind": "planned-hysteretic", "target_utilization": 1.5}, "layers.reconfiguration.target_utilization"),
    ({"kind": "planned-hysteretic", "max_step_up": 2.5}, "layers.reconfiguration.max_step_up"),  # not an integer
    ({"kind": "planned-hysteretic", "role_moves": "yes"}, "layers.reconfiguration.role_moves"),  # not a bool
    ({"kind": "elastic"}, "layers.reconfiguration.kind"),                                         # unknown kind
])
def test_bad_settings_name_the_field(table, field):
    with pytest.raises(ConfigError) as exc:
        stack_layer_config("reconfiguration", table)
    assert field in str(exc.value)


def test_a_setting_of_another_kind_is_refused_and_auto_is_kept():
    with pytest.raises(ConfigError, match="layers.batch_gate.sample_period_s"):
        stack_layer_config("batch_gate", {"kind": "slot-limit", "sample_period_s": 0.25})
    cfg = stack_layer_config("batch_gate", {"kind": "gated", "tpot_fraction": "auto"})
    assert cfg == GatedBatchCap() and cfg.tpot_fraction == "auto"
    with pytest.raises(ConfigError, match="layers.batch_gate.tpot_fraction"):
        stack_layer_config("batch_gate", {"kind": "gated", "tpot_fraction": "half"})
    # an optional layer may be left out, the reconfiguration layer may not
    assert stack_layer_config("planning", {"kind": "none"}) is None
    with pytest.raises(ConfigError, match="layers.reconfiguration.kind"):
        stack_layer_config("reconfiguration", {"kind": "none"})
    # what is not set stays the builder's (None), what is set is passed on
    assert PlannedHystereticLayer(dwell_s=60.0).builder_params()["dwell_s"] == 60.0
    assert "cooldown_s" not in PlannedHystereticLayer().builder_params()


def _kind_names() -> set[str]:
    return (set(ADMISSION_KINDS) | set(AUTOSCALER_KINDS)
            | {k for kinds in STACK_LAYER_KINDS.values() for k in kinds})


def _kind_comparisons(source: str, names: set[str]) -> list[tuple[int, str]]:
    hits = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        for x in (node.left, *node.comparators):
            elts = x.elts if isinstance(x, (ast.Tuple, ast.List, ast.Set)) else [x]
            hits += [(node.lineno, e.value) for e in elts
                     if isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value in names]
    return hits


def test_no_kind_name_is_compared_outside_the_registry():
    # a kind is named in the registry and nowhere else: code that branches on a kind's name (kind == "smoothed",
    # kind in ("slot-limit", "gated")) is a place one must touch to add a kind. The studies are exempt: they pick
    # rows of their own comparison tables by the kind's label to write a sentence about them.
    from test_layers import MODULES

    names = _kind_names()
    bad = []
    for module, path in sorted(MODULES.items()):
        if module.startswith(("tokenfactory.registry", "tokenfactory.studies")):
            continue
        bad += [f"{module}:{line} compares {name!r}" for line, name in _kind_comparisons(path.read_text(), names)]
    assert not bad, "kind names compared outside the registry:\n" + "\n".join(bad)


def test_the_kind_scan_catches_a_branch():
    src = 'if cfg["kind"] == "slo-aware":\n    pass\nok = kind in ("gated", "x")\n'
    assert _kind_comparisons(src, _kind_names()) == [(1, "slo-aware"), (3, "gated")]


@pytest.mark.parametrize("layer,kind", ALL_LAYER_KINDS)
def test_every_kind_names_its_builder_and_certificate_loops(layer, kind):
    # the config class is the kind's whole registry entry: the stack builds and certifies it by lookup
    from tokenfactory.stack import layer_builders, layer_certificates

    cls = STACK_LAYER_KINDS[layer][kind]
    assert callable(getattr(layer_builders, cls.builder)) and callable(getattr(layer_certificates, cls.certificate))
    fields = {f.name for f in dataclasses.fields(cls)}
    assert set(cls.knobs) <= fields, cls.knobs


def test_a_new_kind_is_one_config_class_and_its_two_functions(monkeypatch):
    # a static reconfiguration layer added with no change to build_stack or certify
    from typing import ClassVar

    from tokenfactory.controllers.control_stack import StackLayer
    from tokenfactory.core.validation import setting
    from tokenfactory.registry.stack_layers import StackLayerConfig
    from tokenfactory.scenario import scenario_dir
    from tokenfactory.stack import build_stack, certify, layer_builders, layer_certificates, load_stack_scenario
    from tokenfactory.stack import stack_scenario_from_dict

    @dataclasses.dataclass(frozen=True)
    class FixedPools(StackLayerConfig):
        layer: ClassVar[str] = "reconfiguration"
        kind: ClassVar[str] = "fixed-pools"
        builder: ClassVar[str] = "build_fixed_pools"
        certificate: ClassVar[str] = "certify_fixed_pools"
        sample_period_s: float = setting(10.0, unit="s", low=0.1, meaning="the layer's period")
        filter_s: float = setting(0.0, unit="s", low=0.0, meaning="no filter")
        target_utilization: float = setting(0.85, low=0.1, high=1.0, meaning="utilisation the pools are sized at")

    def certify_fixed(cfg, d):
        d.layers["reconfiguration"] = {"static": True, "meets_floors": True, "pools": "as the scenario sizes them"}
        return layer_certificates.LayerLoops()

    monkeypatch.setitem(STACK_LAYER_KINDS["reconfiguration"], "fixed-pools", FixedPools)
    monkeypatch.setattr(layer_builders, "build_fixed_pools", lambda cfg, b: StackLayer("reconfiguration", note="fixed"),
                        raising=False)
    monkeypatch.setattr(layer_certificates, "certify_fixed_pools", certify_fixed, raising=False)
    d = dict(load_stack_scenario(scenario_dir() / "stack_mistuned.toml").config)
    d["layers"] = {**d["layers"], "reconfiguration": {"kind": "fixed-pools", "target_utilization": 0.8}}
    sc = stack_scenario_from_dict(d, "fixed")
    assert isinstance(sc.layers["reconfiguration"], FixedPools)
    stack, _ = build_stack(sc)
    assert [la.name for la in stack.layers] == ["batch_gate", "admission", "reconfiguration"]
    assert stack.layer("reconfiguration").note == "fixed"
    cert = certify(sc, passing_values=False)
    assert cert.layers["reconfiguration"]["pools"] == "as the scenario sizes them"
    # nothing paired with the new layer: it handed no loop up
    assert not any(s.outer == "reconfiguration" for s in cert.separation)
