"""Every public config entry point rejects an unknown keyword or key with an error naming it (as
python-control's ``tests/kwargs_test.py`` does for its ``**kwargs`` functions): the loaders of every
file a user writes, the plant and controller builders (every registered kind), the replay runner's
tables, the stack's workload, and every public function that takes ``**kwargs``. A new public
``**kwargs`` function fails :func:`test_every_kwargs_function_is_checked` until a row checks it.
(Studies: ``tests/test_study_config.py``.)"""

from __future__ import annotations

import importlib
import inspect
import re
import tomllib
from pathlib import Path

import pytest

from tokenfactory.core.validation import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "tokenfactory" / "scenarios"
REF = ROOT / "tests" / "data" / "reference"
_PLANT = {"model": "deepseek-v3", "hardware": "h200", "fill_workers": 1, "decode_workers": 1}
BAD = "bogus_key_xyz"

#: the flat namespaces whose public names are the user's API
NAMESPACES = ("tokenfactory.stack", "tokenfactory.registry", "tokenfactory.replay", "tokenfactory.scenario",
              "tokenfactory.advise", "tokenfactory.sweep", "tokenfactory.controllers", "tokenfactory.plant_models",
              "tokenfactory.traces", "tokenfactory.studies")
#: protocols take (*args, **kwargs) only as typing.Protocol's own signature
PROTOCOLS = {"Controller", "LinearController", "Plant"}


def _toml(path: Path) -> dict:
    with path.open("rb") as fh:
        return tomllib.load(fh)


def _stack_dict() -> dict:
    return {"plant": {"model": "deepseek-v3", "hardware": "h200"}, "workload": {"rate_rps": 100.0},
            "layers": {"reconfiguration": {"kind": "planned-hysteretic"}}}


def _scenario_dict() -> dict:
    return {"plant": dict(_PLANT), "controller": {"kind": "naive"}}


def _with(d: dict, path: str, value=1) -> dict:
    """``d`` with ``value`` at the dotted ``path`` (tables created as needed)."""
    import copy

    d = copy.deepcopy(d)
    cur = d
    *heads, last = path.split(".")
    for k in heads:
        cur = cur.setdefault(k, {})
    cur[last] = value
    return d


def _ctx():
    from tokenfactory.registry import PlantContext
    from tokenfactory.scenario import build_plant

    plant = build_plant(_PLANT)
    return PlantContext(plant.params, 1, 1, rate_rps=1.0)


def _loop_scenario(d):
    from tokenfactory.scenario import scenario_from_dict

    return scenario_from_dict(d)


def _stack(d):
    from tokenfactory.stack import stack_scenario_from_dict

    return stack_scenario_from_dict(d)


def _replay(d):
    from tokenfactory.replay import replay_scenario_from_dict

    return replay_scenario_from_dict(d)


def _live(d):
    from tokenfactory.live.live_scenario import live_scenario_from_dict

    return live_scenario_from_dict(d)


def _plant(d):
    from tokenfactory.scenario import build_plant

    return build_plant(d)


def _replay_reference() -> dict:
    return _toml(REF / "scenario.toml")


def _live_reference() -> dict:
    return _toml(SCENARIOS / "live_small.toml")


#: (entry point, call with an unknown key or keyword); each must raise naming BAD
CONFIG_CASES = {
    "build_plant": lambda: _plant({**_PLANT, BAD: 1}),
    "scenario_from_dict (top level)": lambda: _loop_scenario({**_scenario_dict(), BAD: {}}),
    "scenario_from_dict (plant)": lambda: _loop_scenario(_with(_scenario_dict(), f"plant.{BAD}")),
    "scenario_from_dict (controller)": lambda: _loop_scenario(_with(_scenario_dict(), f"controller.{BAD}")),
    "scenario_from_dict (simulation)": lambda: _loop_scenario(_with(_scenario_dict(), f"simulation.{BAD}")),
    "stack_scenario_from_dict (top level)": lambda: _stack({**_stack_dict(), BAD: {}}),
    "stack_scenario_from_dict (plant)": lambda: _stack(_with(_stack_dict(), f"plant.{BAD}")),
    "stack_scenario_from_dict (workload)": lambda: _stack(_with(_stack_dict(), f"workload.{BAD}")),
    "stack_scenario_from_dict (layer)": lambda: _stack(_with(_stack_dict(), f"layers.reconfiguration.{BAD}")),
    "stack_scenario_from_dict (layers)": lambda: _stack(_with(_stack_dict(), f"layers.{BAD}", {"kind": "x"})),
    "replay_scenario_from_dict (top level)": lambda: _replay({**_replay_reference(), BAD: {}}),
    "replay_scenario_from_dict (plant)": lambda: _replay(_with(_replay_reference(), f"plant.{BAD}")),
    "replay_scenario_from_dict (cluster)": lambda: _replay(_with(_replay_reference(), f"cluster.{BAD}")),
    "replay_scenario_from_dict (controller)": lambda: _replay(_with(_replay_reference(), f"controller.{BAD}")),
    "replay_scenario_from_dict (simulation)": lambda: _replay(_with(_replay_reference(), f"simulation.{BAD}")),
    "live_scenario_from_dict (top level)": lambda: _live({**_live_reference(), BAD: {}}),
    "build_replay (plant)": lambda: _build_replay({BAD: 1}),
    "run_replay (cluster)": lambda: _run_replay(cluster={BAD: 1}),
    "run_replay (admission_params)": lambda: _run_replay(admission_params={BAD: 1}),
    "run_replay (autoscaler_params)": lambda: _run_replay(autoscaler="hysteretic", autoscaler_params={BAD: 1}),
}


def _tiny_trace():
    import pandas as pd

    return pd.DataFrame({"arrival_s": [0.0, 1.0, 2.0], "input_tokens": [1000, 1000, 1000], "cached_tokens": [0, 0, 0],
                         "output_tokens": [100, 100, 100]})


def _build_replay(plant):
    from tokenfactory.replay import build_replay

    return build_replay(_tiny_trace(), plant)


_SETUP = {}


def _run_replay(**kw):
    from tokenfactory.replay import build_replay, run_replay

    if "setup" not in _SETUP:
        _SETUP["setup"] = build_replay(_tiny_trace())
    return run_replay(_tiny_trace(), _SETUP["setup"], "open", **kw)


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_config_entry_point_rejects_unknown_key_by_name(case):
    with pytest.raises(ConfigError, match=re.escape(BAD)):
        CONFIG_CASES[case]()


def _kinds():
    from tokenfactory.registry import ADMISSION_KINDS, AUTOSCALER_KINDS

    return [("admission", k) for k in ADMISSION_KINDS] + [("reconfiguration", k) for k in AUTOSCALER_KINDS]


@pytest.mark.parametrize("layer, kind", _kinds())
def test_every_registered_kind_rejects_unknown_key_by_name(layer, kind):
    from tokenfactory.registry import build_admission, build_autoscalers

    build = build_admission if layer == "admission" else build_autoscalers
    with pytest.raises(ConfigError, match=re.escape(BAD)):
        build(kind, _ctx(), {BAD: 1})


#: every public ``**kwargs`` function, called with an unknown keyword
KWARGS_CASES = {
    "mixed_workload_for": lambda: __import__("tokenfactory.stack", fromlist=["x"]).mixed_workload_for(
        _stack(_stack_dict()), **{BAD: 1}),
    "SLOAwareAdmission": lambda: __import__("tokenfactory.controllers", fromlist=["x"]).SLOAwareAdmission(**{BAD: 1}),
    "HorizontalPodAutoscaler": lambda: __import__("tokenfactory.controllers", fromlist=["x"]).HorizontalPodAutoscaler(
        "decode", 0.8, **{BAD: 1}),
    "HystereticPoolController": lambda: __import__("tokenfactory.controllers", fromlist=["x"]).HystereticPoolController(
        "decode", 10.0, **{BAD: 1}),
    "DemandPlanner": lambda: __import__("tokenfactory.controllers", fromlist=["x"]).DemandPlanner(
        lead_s=600.0, **{BAD: 1}),
    "PlannedPoolController": lambda: __import__("tokenfactory.controllers", fromlist=["x"]).PlannedPoolController(
        pool="fill", per_worker_rps=1.0, **{BAD: 1}),
    "stage_memory_sweep": lambda: __import__("tokenfactory.plant_models", fromlist=["x"]).stage_memory_sweep(
        1e9, 1e3, 1e3, **{BAD: 1}),
    "long_context_workload": lambda: __import__("tokenfactory.traces", fromlist=["x"]).long_context_workload(
        **{BAD: 1}),
}


@pytest.mark.parametrize("name", list(KWARGS_CASES))
def test_kwargs_function_rejects_unknown_keyword_by_name(name):
    with pytest.raises((ConfigError, TypeError), match=re.escape(BAD)):
        KWARGS_CASES[name]()


def _public_kwargs_functions() -> set[str]:
    found = set()
    for m in NAMESPACES:
        mod = importlib.import_module(m)
        for n in getattr(mod, "__all__", ()):
            obj = getattr(mod, n, None)
            if obj is None or not callable(obj) or n in PROTOCOLS:
                continue
            try:
                sig = inspect.signature(obj)
            except (TypeError, ValueError):
                continue
            if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
                found.add(n)
    return found


def test_every_kwargs_function_is_checked():
    # python-control's rule: a public function that takes **kwargs is listed here with a check
    assert _public_kwargs_functions() == set(KWARGS_CASES)


def _write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return str(p)


_MARGINS_TOML = ('[plant]\nmodel = "deepseek-v3"\nhardware = "h200"\nfill_workers = 1\ndecode_workers = 1\n'
                 f'{BAD} = 1\n[controller]\nkind = "naive"\n')
_STACK_TOML = ('[plant]\nmodel = "deepseek-v3"\nhardware = "h200"\n[workload]\nrate_rps = 100.0\n'
               f'[layers.reconfiguration]\nkind = "planned-hysteretic"\n{BAD} = 1\n')
SMALL = ROOT / "tests" / "data" / "small_plant"


@pytest.mark.parametrize("command", ["margins", "certify", "simulate --autoscaler-param"])
def test_cli_rejects_unknown_key_by_name(command, tmp_path, capsys, monkeypatch):
    from tokenfactory.cli import main

    if command == "margins":
        argv = ["margins", _write(tmp_path, "m.toml", _MARGINS_TOML)]
    elif command == "certify":
        argv = ["certify", _write(tmp_path, "s.toml", _STACK_TOML)]
    else:
        monkeypatch.chdir(SMALL)  # the scenario's model path is relative to its folder
        argv = ["simulate", "--scenario", "sim.toml", "--trace", "requests.csv", "--autoscaler", "hysteretic",
                "--autoscaler-param", f"{BAD}=1", "--no-progress"]
    assert main(argv) == 2
    assert BAD in capsys.readouterr().err
