"""Every study resolves its config once through studies/study_config.py, and rejects what it does
not know - the keyword check of python-control's ``control/tests/kwargs_test.py`` (every public
function that takes ``**kwargs`` is called with an unknown one and must raise), applied to the
studies' ``config=`` tables: each registered study is run with an unknown key and must raise a
ConfigError naming it before doing any work.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

from tokenfactory.core.validation import ConfigError
from tokenfactory.studies import STUDIES, has_full_variant
from tokenfactory.studies.study_config import (
    VARIANTS,
    StudyConfig,
    StudyVariants,
    resolve_study_config,
    unknown_key_error,
)


def _module(name: str):
    return importlib.import_module(STUDIES[name])


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_every_study_declares_its_config(name):
    mod = _module(name)
    assert isinstance(mod.CONFIG, StudyVariants) and mod.CONFIG.study == name
    assert "CONFIG" in mod.__all__
    # a study with a heavier variant has full overrides, and only such a study
    assert has_full_variant(name) == mod.CONFIG.has_full
    assert list(inspect.signature(mod.run).parameters)[:3] == ["out_dir", "quick", "config"]


@pytest.mark.parametrize("name", sorted(STUDIES))
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_resolves(name, variant):
    mod = _module(name)
    cfg = resolve_study_config(mod.CONFIG, quick=variant == "quick", full=variant == "full")
    assert isinstance(cfg, StudyConfig) and cfg.study == name and cfg.variant == variant
    assert set(cfg) >= set(mod.CONFIG.default)
    overrides = {"quick": mod.CONFIG.quick, "full": mod.CONFIG.full, "default": {}}[variant]
    for k, v in overrides.items():
        assert cfg[k] == v
    with pytest.raises(TypeError, match="read-only"):
        cfg[next(iter(cfg))] = None


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_run_rejects_an_unknown_key_by_name(name, tmp_path):
    """The kwargs check: an unknown key fails at once (no output written), naming the key and the
    allowed ones."""
    with pytest.raises(ConfigError) as e:
        _module(name).run(tmp_path / "out", quick=True, config={"no_such_setting": 1})
    assert e.value.field == f"{name}.no_such_setting"
    assert "allowed keys are" in str(e.value)
    for key in _module(name).CONFIG.default:
        assert key in str(e.value)
    assert not (tmp_path / "out" / "metrics.json").exists()


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_run_rejects_an_unknown_keyword_argument(name, tmp_path):
    with pytest.raises(TypeError):
        _module(name).run(tmp_path, quick=True, no_such_argument=1)


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_a_misspelt_key_gets_a_suggestion(name):
    mod = _module(name)
    key = max(mod.CONFIG.default, key=len)  # the longest key: its one-letter typo is nearest to it
    with pytest.raises(ConfigError, match=f"did you mean {key!r}"):
        resolve_study_config(mod.CONFIG, {key[:-1]: 1})


def test_precedence_defaults_then_variant_then_config():
    sv = StudyVariants("demo", {"a": 1, "b": 2, "c": {"x": 1, "y": 2}, "full": False}, quick={"a": 10},
                       full={"b": 20}, merge_tables=("c",))
    assert resolve_study_config(sv) == {"a": 1, "b": 2, "c": {"x": 1, "y": 2}, "full": False}
    assert resolve_study_config(sv, quick=True) == {"a": 10, "b": 2, "c": {"x": 1, "y": 2}, "full": False}
    full = resolve_study_config(sv, {"a": 5, "c": {"y": 3}}, full=True)
    assert full == {"a": 5, "b": 20, "c": {"x": 1, "y": 3}, "full": True} and full.variant == "full"
    # config={"full": True} is the full variant too
    assert resolve_study_config(sv, {"full": True}).variant == "full"
    with pytest.raises(ConfigError, match="exclusive"):
        resolve_study_config(sv, quick=True, full=True)
    with pytest.raises(ConfigError) as e:
        StudyVariants("demo", {"a": 1}, quick={"z": 2})
    assert e.value.field == "demo.quick"


def test_a_resolved_config_pickles_and_copies():
    import copy
    import json
    import pickle

    from tokenfactory.studies.layered_stack import CONFIG

    cfg = resolve_study_config(CONFIG, quick=True)
    for other in (pickle.loads(pickle.dumps(cfg)), copy.deepcopy(cfg), copy.copy(cfg)):
        assert isinstance(other, StudyConfig) and other == cfg and other.variant == "quick"
    assert json.loads(json.dumps(cfg)) == json.loads(json.dumps(cfg.to_dict()))


def test_unknown_key_error_without_a_near_key():
    e = unknown_key_error("demo", "zzzz", ["alpha", "beta"])
    assert e.field == "demo.zzzz" and "did you mean" not in str(e) and "alpha, beta" in str(e)


def test_a_study_check_sees_the_resolved_values():
    from tokenfactory.studies.layered_stack import CONFIG

    with pytest.raises(ConfigError) as e:
        resolve_study_config(CONFIG, {"requests": {"rate_rpss": 3.0}})
    assert e.value.field == "layered-stack.requests.rate_rpss"
    cfg = resolve_study_config(CONFIG, {"requests": {"rate_rps": 3.0}}, quick=True)
    assert cfg["requests"] == {"rate_rps": 3.0, "hours": 0.35, "startups_s": [120.0]}
    with pytest.raises(ConfigError, match="unknown stack"):
        resolve_study_config(CONFIG, {"stacks": ["nonesuch"]})
