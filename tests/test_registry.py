"""The registry's kind records (:mod:`tokenfactory.registry.kinds`): a kind's ``settings`` are the one
place its parameters' defaults are declared, its builder reads them from there, and its accepted keys
are their keys."""

from __future__ import annotations

import pytest

from tokenfactory.core.validation import ConfigError, setting
from tokenfactory.registry import ADMISSION_KINDS, AUTOSCALER_KINDS, PlantContext, build_admission
from tokenfactory.registry.kind_settings import KIND_SETTINGS
from tokenfactory.registry.kinds import ControllerKind, with_defaults

_PLANT = {"model": "deepseek-v3", "hardware": "h200", "fill_workers": 2, "decode_workers": 1}


@pytest.fixture(scope="module")
def ctx():
    from tokenfactory.scenario import build_plant

    plant = build_plant(_PLANT)
    return PlantContext(plant.params, plant.fill_workers, plant.decode_workers)


def test_kind_settings_are_the_registered_kinds_own():
    for layer, table in (("admission", ADMISSION_KINDS), ("reconfiguration", AUTOSCALER_KINDS)):
        assert list(KIND_SETTINGS[layer]) == list(table)
        for name, kind in table.items():
            assert KIND_SETTINGS[layer][name] == dict(kind.settings)
            assert kind.keys == tuple(kind.settings) or not kind.settings


def test_keys_default_to_the_settings_and_may_not_differ():
    spec = {"gain": setting(0.5, meaning="a gain")}
    k = ControllerKind("probe", "admission", "a probe", lambda ctx, p: None, settings=spec)
    assert k.keys == ("gain",)
    with pytest.raises(ConfigError, match="differ"):
        ControllerKind("probe", "admission", "a probe", lambda ctx, p: None, ("gain", "other"), settings=spec)


def test_with_defaults_leaves_plant_derived_defaults_out():
    spec = {"a": setting(1.0, meaning="a"), "b": setting(None, meaning="b (absent: from the plant)")}
    assert with_defaults(spec, {}) == {"a": 1.0}
    assert with_defaults(spec, {"a": 2.0, "b": 3.0}) == {"a": 2.0, "b": 3.0}


@pytest.mark.parametrize("kind, key, value, attr", [
    ("naive", "open_gain", 0.3, "open_gain"),
    ("naive", "sample_period_s", 0.07, "sample_period"),
    ("threshold", "threshold", 0.9, "threshold"),
    ("threshold", "signal", "ready", "signal"),
    ("vllm-watermark", "sample_period_s", 0.4, "sample_period"),
])
def test_builder_reads_its_default_from_the_settings(ctx, monkeypatch, kind, key, value, attr):
    # change the declared default only: the controller built without parameters follows it
    spec = ADMISSION_KINDS[kind].settings
    monkeypatch.setitem(spec, key, setting(value, **spec[key].metadata))
    got = build_admission(kind, ctx, {})
    assert getattr(got, attr) == value


def test_slo_aware_admission_reads_compared_fields_not_provenance(ctx):
    # two plants equal in every compared field are the same plant: the controller built for one
    # is the one built for the other (provenance is compared by nothing, so nothing may read it)
    import dataclasses

    from tokenfactory.registry import slo_aware_admission

    other = dataclasses.replace(ctx.params, provenance={"shape": {"prompt_tokens": 1}})
    assert other == ctx.params
    a = slo_aware_admission(ctx, {"batch_gate": False})
    b = slo_aware_admission(dataclasses.replace(ctx, params=other), {"batch_gate": False})
    assert a.config == b.config
