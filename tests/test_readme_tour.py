"""The README's Quick tour runs as written on a fresh clone with no trace data.

Each command of the tour's shell block runs, in order, in one scratch folder (the checkout's files
linked in, no reports) with no trace folder and an empty user data folder; it
must exit 0 and print its answer. Commands that run a study or a replay take minutes on two cores,
so they are marked slow (``make test`` deselects them; ``pytest -m slow tests/test_readme_tour.py``
runs the whole tour); the fall-back of a command naming an absent trace is tested fast below.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
TOUR = re.search(r"## Quick tour\n.*?```sh\n(.*?)```", README, re.S).group(1)
COMMANDS = [line.split("  #")[0].strip() for line in TOUR.splitlines()
            if line.strip() and not line.strip().startswith("#")]   # a comment line continues the one above
HEAVY = ("study ", "simulate ")   # minutes on two cores


@pytest.fixture(scope="module")
def fresh_clone(tmp_path_factory):
    """A working folder like a fresh clone's: the checkout's files (linked), no reports, no traces anywhere."""
    home = tmp_path_factory.mktemp("clone")
    for entry in ROOT.iterdir():
        if entry.name not in (".git", ".venv") and not entry.name.startswith("reports"):
            (home / entry.name).symlink_to(entry)
    env = {**os.environ, "TOKENFACTORY_TRACES": str(home / "no-traces"), "XDG_DATA_HOME": str(home / "xdg"),
           "MPLBACKEND": "Agg"}
    return home, env


def _run(command: str, home: Path, env: dict) -> subprocess.CompletedProcess:
    argv = shlex.split(command)
    assert argv[0] == ".venv/bin/tokenfactory", command
    return subprocess.run([sys.executable, "-m", "tokenfactory.cli", *argv[1:]], cwd=home, env=env,
                          capture_output=True, text=True, timeout=1800)


def test_the_tour_is_what_the_readme_shows():
    assert len(COMMANDS) >= 8 and all(c.startswith(".venv/bin/tokenfactory ") for c in COMMANDS)
    assert any("azure-conv-2023" in c for c in COMMANDS)        # a real trace name: the fall-back is exercised


@pytest.mark.parametrize("command", [pytest.param(c, marks=pytest.mark.slow) if any(h in c for h in HEAVY) else c
                                     for c in COMMANDS])
def test_tour_command_exits_0_and_answers(command, fresh_clone):
    home, env = fresh_clone
    if command.endswith("report reports") and not (home / "reports").is_dir():
        pytest.skip("the tour's report rebuild follows its study command, deselected here (run -m slow)")
    r = _run(command, home, env)
    assert r.returncode == 0, f"{command}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    lines = [l for l in r.stdout.splitlines() if l.strip()]
    assert lines, f"{command} printed nothing"
    print(f"{command}\n    -> {lines[0]}")
    if "--trace azure-conv-2023" in command:
        assert "is not on this machine" in lines[0] and "synthetic stand-in" in lines[0]
        assert any(l.startswith("capacity at the SLO:") and "--max-num-seqs" in l for l in lines)
        assert any(l.startswith("oscillation:") for l in lines)


def test_a_command_naming_an_absent_trace_runs_on_the_stand_in(fresh_clone):
    home, env = fresh_clone
    r = _run(".venv/bin/tokenfactory simulate --trace azure-conv-2023 --duration 2m --out sim", home, env)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("azure-conv-2023 is not on this machine") and "traces fetch azure-conv-2023" in lines[0]
    cluster = next(l for l in lines if l.startswith("cluster: "))
    assert "deepseek-v3" in cluster and "h200" in cluster and "TTFT <= 2 s" in cluster and "TPOT <= 0.1 s" in cluster
    cap = next(l for l in lines if l.startswith("capacity at the SLO: "))
    n = int(re.search(r"--max-num-seqs (\d+)", cap).group(1))
    assert f"batch cap at {n} sequences" in cap
    need = next(l for l in lines if l.startswith("the trace's peak (synthetic stand-in for azure-conv-2023"))
    assert re.search(r"needs \d+ fill \+ \d+ decode workers", need)
    import json

    m = json.loads((home / "sim" / "metrics.json").read_text())
    said = next(l for l in lines if l.startswith("oscillation:"))
    # the answer is the run's verdict: every judged signal named, the buffers and the pools among them
    assert said.startswith("oscillation: OSCILLATING" if m["oscillating"] else "oscillation: none in the ")
    assert "ready buffer" in said and "decode pool" in said and "churn" in said
    assert m["trace"] == "synthetic stand-in for azure-conv-2023"
    assert m["requests"] == m["completed"] + m["rejected"] + m["in_flight_end"]
