import math

import pytest

from tokenfactory.core.validation import ConfigError, check_choice, check_int, check_number, reject_unknown_keys


@pytest.mark.parametrize("value,kw,ok", [
    (1.0, {"low": 0}, True),
    (0.0, {"low": 0, "low_inclusive": False}, False),
    (math.nan, {}, False),
    ("3", {}, False),
    (True, {}, False),
    (5, {"high": 4}, False),
])
def test_check_number(value, kw, ok):
    if ok:
        assert check_number("f", value, **kw) == value
    else:
        with pytest.raises(ConfigError, match="^f: "):
            check_number("f", value, **kw)


def test_range_in_message():
    with pytest.raises(ConfigError, match=r"outside the allowed range \[1, 8\]"):
        check_int("x", 9, low=1, high=8)
    with pytest.raises(ConfigError, match="integer"):
        check_int("x", 1.5)
    with pytest.raises(ConfigError, match="'a'"):
        check_choice("x", "c", ["a", "b"])
    with pytest.raises(ConfigError, match="sec.zz: unknown key"):
        reject_unknown_keys("sec", {"zz": 1}, {"a"})


def test_check_int_rejects_nan_and_inf_with_the_field_name():
    import math

    import pytest

    from tokenfactory.core.validation import ConfigError, check_int

    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ConfigError, match="pool.replicas: expected an integer"):
            check_int("pool.replicas", bad)



@pytest.mark.parametrize("module,func,args,kwargs,field", [
    ("tokenfactory.controllers.capacity", "workers_needed", ([1.0], 0.0), {}, "per_worker_rps"),
    ("tokenfactory.controllers.capacity", "workers_needed", ([-1.0], 2.0), {}, "demand_rps"),
    ("tokenfactory.controllers.capacity", "workers_needed", ([1.0], 2.0), {"headroom": -0.1}, "headroom"),
    ("tokenfactory.plant_models.roofline", "roofline_time", (1.0, 1.0, 0.0, 1.0), {}, "peak_flops"),
    ("tokenfactory.plant_models.roofline", "roofline_time", (1.0, 1.0, 1.0, math.nan), {}, "bandwidth"),
    ("tokenfactory.plant_models.roofline", "expert_arithmetic_intensity", ([-1.0], 1e6, 1e6, 1e3, 1e3), {},
     "n_tokens"),
    ("tokenfactory.plant_models.stage_memory", "kv_crossover_depth", (1e9, 1e5, 0.0), {}, "kv_bytes_per_token"),
    ("tokenfactory.controllers.describing", "relay_integrator_delay_cycle", (1.0, 1.0, 0.0), {}, "delay"),
    ("tokenfactory.controllers.reconfiguration", "need_noise_std", (10.0, 5.0, 1.5, 30.0), {},
     "target_utilization"),
    ("tokenfactory.controllers.reconfiguration", "need_noise_std", (10.0, 0.0, 0.8, 30.0), {}, "per_worker_rps"),
])
def test_public_helpers_name_the_bad_field(module, func, args, kwargs, field):
    import importlib

    with pytest.raises(ConfigError) as e:
        getattr(importlib.import_module(module), func)(*args, **kwargs)
    assert e.value.field == field


def test_a_file_path_in_a_toml_file_resolves_beside_that_file(tmp_path, monkeypatch):
    from tokenfactory.plant_models import load_model
    from tokenfactory.scenario import load_scenario
    from tokenfactory.studies.feedback_oscillation import scenario_path
    from tokenfactory.core.validation import load_toml

    sub = tmp_path / "plants"
    sub.mkdir()
    (sub / "my_model.toml").write_text('base = "deepseek-v3"\nname = "dsv3-mine"\n')
    text = scenario_path("smoothed").read_text().replace('model = "deepseek-v3"', 'model = "my_model.toml"', 1)
    assert 'model = "my_model.toml"' in text
    (sub / "scenario.toml").write_text(text)
    monkeypatch.chdir(tmp_path)                 # the shell is elsewhere: the path still names plants/my_model.toml
    doc = load_toml("plants/scenario.toml")
    assert doc["plant"]["model"] == str(sub / "my_model.toml")
    assert load_model(doc["plant"]["model"]).name == "dsv3-mine"
    assert load_scenario(sub / "scenario.toml").plant is not None
    assert load_toml(sub / "scenario.toml")["plant"]["hardware"] == "h200"     # a preset stays a preset


def test_a_parallelism_error_says_which_layout_was_meant():
    from tokenfactory.plant_models import Parallelism

    with pytest.raises(ConfigError, match=r"^parallelism\.tp: tp = 2 with ep = 1 .*tp = 2, ep = 2 \(--tp 2 --ep 2\)"):
        Parallelism(tp=2, ep=1)


def test_config_or_fields_takes_one_of_the_two_and_names_the_misuse():
    import dataclasses as dc

    from tokenfactory.core.validation import config_or_fields

    @dc.dataclass(frozen=True)
    class Cfg:
        a: int = 1

    assert config_or_fields("x", Cfg, None, {"a": 2}) == Cfg(2)
    given = Cfg(3)
    assert config_or_fields("x", Cfg, given, {}) is given
    with pytest.raises(ConfigError, match="not both") as err:
        config_or_fields("x", Cfg, given, {"a": 2})
    assert err.value.field == "x.a"
    with pytest.raises(ConfigError, match="must be a Cfg") as err:
        config_or_fields("x", Cfg, {"a": 2}, {}, name="spec")
    assert err.value.field == "x.spec"


def test_inherited_setting_keeps_the_declaration_and_changes_the_default():
    import dataclasses as dc

    from tokenfactory.core.validation import check_fields, config_schema, inherited_setting, setting

    @dc.dataclass(frozen=True, kw_only=True)
    class Base:
        n: int = setting(4, kind=int, unit="workers", low=1, high=9, meaning="a count")

        def __post_init__(self):
            check_fields(self, "base")

    @dc.dataclass(frozen=True, kw_only=True)
    class Child(Base):
        n: int = inherited_setting(Base, "n", 7)

    (row,) = config_schema(Child)
    assert (row["default"], row["unit"], row["low"], row["high"], row["meaning"]) == (7, "workers", 1, 9, "a count")
    assert Child().n == 7 and Base().n == 4
    with pytest.raises(ConfigError, match=r"base\.n.*\[1, 9\]"):
        Child(n=10)
    with pytest.raises(KeyError, match="Base.m"):
        inherited_setting(Base, "m", 1)


def test_check_fields_holds_the_checked_values_or_only_checks():
    import dataclasses as dc

    from tokenfactory.core.validation import check_fields, setting

    @dc.dataclass(frozen=True)
    class Cfg:
        x: float = setting(1.0, low=0.0, high=5.0, meaning="a number")
        n: int = setting(2, kind=int, low=1, meaning="a count")

    held, kept = Cfg(x=3, n=4.0), Cfg(x=3, n=4.0)
    check_fields(held, "cfg")
    check_fields(kept, "cfg", hold=False)
    assert (type(held.x), type(held.n)) == (float, int)
    assert (type(kept.x), type(kept.n)) == (int, float)  # as given
    with pytest.raises(ConfigError, match=r"^cfg\.x: 6 is outside the allowed range \[0, 5\]"):
        check_fields(Cfg(x=6), "cfg", hold=False)
    with pytest.raises(ConfigError, match=r"^cfg\.n: .*\[3, inf\)"):
        check_fields(Cfg(n=2), "cfg", bounds={"n": {"low": 3}}, hold=False)
