"""The README's quoted figures match what the named commands produce.

Each row: a regular expression that finds the figure in README.md (first group = the number as
printed), the function that recomputes it (cheaply, from the library, or from the benchmark JSON
that ``make bench`` writes), and the tolerance. A README edit that changes or drops a figure, or a
code change that moves it, fails here - so the README cannot drift from the code.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BENCH = ROOT / "benchmarks" / "results" / "latest.json"


@cache
def _bench() -> dict:
    return json.loads(BENCH.read_text())


@cache
def _smoothed_margins():
    from tokenfactory.controllers import admission_loop, stability_margins
    from tokenfactory.scenario import load_scenario
    from tokenfactory.studies.feedback_oscillation import scenario_path

    sc = load_scenario(scenario_path("smoothed"))
    return stability_margins(admission_loop(sc.plant, sc.controller))


@cache
def _naive_cycle():
    from tokenfactory.scenario import load_scenario, naive_limit_cycle
    from tokenfactory.studies.feedback_oscillation import scenario_path

    sc = load_scenario(scenario_path("naive"))
    return naive_limit_cycle(sc.plant, sc.controller)[1]


@cache
def _dsv3():
    from tokenfactory.plant_models import load_model

    return load_model("deepseek-v3").summary()


@cache
def _cascade():
    from tokenfactory.studies.reconfiguration import reproduce_cascade

    return reproduce_cascade(quick=True)[0]


@cache
def _flapping():
    from tokenfactory.studies.reconfiguration import reproduce_flapping

    return reproduce_flapping(quick=True)[0]


@cache
def _certificate():
    from tokenfactory.stack import certify, load_stack_scenario

    cert = certify(load_stack_scenario("stack_default")).to_dict()
    rows = {(r["outer"], r["inner"]): r for r in cert["separation"]}
    return cert["binding"], rows


#: (id, pattern in README.md, recompute, relative tolerance)
CHECKS = [
    ("dsv3 total params", r"671B total, ([\d.]+)B active", lambda: _dsv3()["active_params"] / 1e9, 0.005),
    ("dsv3 kv bytes", r"([\d,]+) B KV/token", lambda: _dsv3()["kv_bytes_per_token"], 0.0),
    ("naive period", r"naive loop's ([\d.]+) s period", lambda: _naive_cycle().period_s, 0.005),
    ("smoothed GM", r"GM ([\d.]+), PM", lambda: _smoothed_margins().gain_margin, 0.01),
    ("smoothed PM", r"PM ([\d.]+) deg and a", lambda: _smoothed_margins().phase_margin_deg, 0.01),
    ("smoothed delay margin", r"deg and a ([\d.]+) s delay margin", lambda: _smoothed_margins().delay_margin_s, 0.02),
    ("simulator speed", r"\(([\d,]+) simulated requests per wall-second",
     lambda: _bench()["request_simulator"]["open"]["sim_requests_per_wall_s"], 0.10),
    ("pool model day", r"a day\s+in ~([\d.]+) s", lambda: _bench()["pool_model_day"]["seconds"], 0.10),
    ("cascade peak", r"HPA cascades to\s+(\d+)", lambda: _cascade()["baseline"]["peak_provisioned"], 0.0),
    ("cascade fix", r"stops at\s+(\d+)\s+workers", lambda: _cascade()["fixed"]["peak_provisioned"], 0.0),
    ("flapping high", r"HPA flaps (\d+) -> \d+ -> \d+", lambda: _flapping()["baseline"]["max_provisioned"], 0.0),
    ("flapping low", r"HPA flaps \d+ -> (\d+) -> \d+", lambda: _flapping()["baseline"]["min_provisioned"], 0.0),
    ("stack binding GM", r"service rates: GM ([\d.]+), PM", lambda: _certificate()[0]["gain_margin"], 0.005),
    ("stack binding PM", r"service rates: GM [\d.]+, PM ([\d.]+) deg", lambda: _certificate()[0]["phase_margin_deg"],
     0.005),
    ("stack separation admission", r"separation ratios ([\d.]+) \(admission",
     lambda: _certificate()[1][("admission", "batch_gate")]["ratio"], 0.005),
    ("stack separation reconfiguration", r"and (\d+) \(reconfiguration over admission\)",
     lambda: _certificate()[1][("reconfiguration", "admission")]["ratio"], 0.005),
]


def _number(text: str) -> float:
    return float(text.replace(",", ""))


@pytest.mark.parametrize("name,pattern,compute,rel", CHECKS, ids=[c[0] for c in CHECKS])
def test_readme_figure(name, pattern, compute, rel):
    m = re.search(pattern, README)
    assert m, f"README.md no longer quotes {name!r} (pattern {pattern!r}); update tests/test_readme.py with it"
    quoted = _number(m.group(1))
    actual = float(compute())
    # the README rounds: allow the rounding of the printed figure on top of the stated tolerance
    text = m.group(1).replace(",", "")
    if "." in text:
        rounding = 0.5 * 10 ** -len(text.split(".")[1])
    else:  # "12000": trailing zeros are rounding
        zeros = len(text) - len(text.rstrip("0"))
        rounding = 0.5 * 10 ** zeros if zeros else 0.0
    assert abs(quoted - actual) <= rel * abs(actual) + rounding, f"README says {quoted}, now {actual:.6g}"


def test_every_readme_figure_names_its_command():
    # the tour's figures point at the command that reproduces them
    for cmd in ("make bench", "tokenfactory study feedback-oscillation", "tokenfactory study reconfiguration",
                "tokenfactory certify stack_default"):
        assert cmd in README, cmd
