import pytest

from tokenfactory.controllers import CompletionTriggeredAdmission, SmoothedAdmission
from tokenfactory.studies.feedback_oscillation import scenario_path
from tokenfactory import ConfigError
from tokenfactory.scenario import load_scenario, margins_table, scenario_from_dict

BASE = {
    "plant": {"model": "deepseek-v3", "hardware": "h200", "fill_workers": 6, "decode_workers": 4},
    "controller": {"kind": "smoothed"},
}


def _with(section, **kw):
    d = {k: dict(v) for k, v in BASE.items()}
    d.setdefault(section, {}).update(kw)
    return d


def test_shipped_scenarios_load():
    assert isinstance(load_scenario(scenario_path("smoothed")).controller, SmoothedAdmission)
    assert isinstance(load_scenario(scenario_path("naive")).controller, CompletionTriggeredAdmission)


def test_margins_table_over_envelope(smoothed_scenario, naive_scenario):
    t = margins_table(smoothed_scenario)
    assert len(t) == 9 and t["meets_floors"].all()
    # exact and Pade agree where the order was chosen by the phase check
    assert (abs(t["phase_margin_deg"] - t["pade_phase_margin_deg"]) < 0.5).all()
    n = margins_table(naive_scenario)
    assert n["limit_cycle"].all() and not n["meets_floors"].any()


@pytest.mark.parametrize("d,field", [
    (_with("plant", gpus=8), "plant.gpus"),
    (_with("controller", kind="pid"), "controller.kind"),
    (_with("controller", open_gain=0.5), "controller.open_gain"),  # a naive key on a smoothed controller
    (_with("plant", fill_workers=-2), "plant.fill_workers"),
    (_with("envelope", delay_factors=[0.5, -1]), r"envelope.delay_factors\[1\]"),
    (_with("simulation", demand_factor=50), "simulation.demand_factor"),
    (_with("simulation", dt=5), "scenario.dt"),
    ({"plant": BASE["plant"]}, "controller"),
    ({**BASE, "extra": {}}, "extra"),
])
def test_bad_scenarios_name_the_field(d, field):
    with pytest.raises(ConfigError, match=field):
        scenario_from_dict(d)


def test_scenario_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_scenario(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[plant\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_scenario(bad)


def test_hand_tuned_gains_override(tmp_path):
    sc = scenario_from_dict(_with("controller", kc=0.1, ti=20.0))
    assert sc.controller.gains.kc == 0.1 and sc.controller.gains.ti == 20.0 and sc.tuning is None
