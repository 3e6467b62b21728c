"""tokenfactory advise on a user's own small plant and HPA file: the recommendation is certified,
simulated no worse than the user's setting, and written back in the user's format."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tokenfactory.advise import advise
from tokenfactory.cli import main
from tokenfactory.controllers.formats import parse_control_plane
from tokenfactory.replay import load_replay_scenario
from tokenfactory.traces import load_trace

DATA = Path(__file__).parent / "data" / "small_plant"
MODEL = (DATA / "model.toml").read_text()   # the small-plant case's own files

SCENARIO = """\
[plant]
model = "{model}"
hardware = "h100-sxm"
parallelism = {{ tp = 2, pp = 1, ep = 2 }}

[cluster]
fill_workers = 1
decode_workers = 1
measurement_delay_s = 5.0
slo_ttft_s = 2.0
slo_tpot_s = 0.05

[cluster.dynamics]
startup_s = 90.0
warmup_s = 30.0
gpus_per_worker = 2
"""

HPA = (DATA / "hpa.yaml").read_text()


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    d = tmp_path_factory.mktemp("small_plant")
    (d / "model.toml").write_text(MODEL)
    (d / "sim.toml").write_text(SCENARIO.format(model=(d / "model.toml").as_posix()))
    (d / "hpa.yaml").write_text(HPA)
    rng = np.random.default_rng(7)
    # 6 minutes near one decode worker's capacity with a 60 s burst at 4x: the pool must move
    base = np.cumsum(rng.exponential(1 / 4.0, 1400))
    base = base[base < 360.0]
    burst = 120.0 + np.cumsum(rng.exponential(1 / 12.0, 720))
    burst = burst[burst < 180.0]
    arr = np.sort(np.concatenate([base, burst]))
    n = len(arr)
    rows = ["arrival_s,input_tokens,output_tokens,cached_tokens"]
    rows += [f"{a:.3f},{i},{o},0" for a, i, o in zip(arr, rng.integers(500, 3000, n), rng.integers(100, 400, n))]
    (d / "requests.csv").write_text("\n".join(rows) + "\n")
    return d


def test_advice_is_certified_simulated_and_no_worse(case):
    sc = load_replay_scenario(case / "sim.toml")
    trace = load_trace(case / "requests.csv")
    adv = advise(case / "hpa.yaml", sc, trace, seed=1, simulated_candidates=2)
    cur, rec = adv.blocks["current"], adv.blocks["recommended"]
    assert rec["passed"]
    # the recommendation was replayed and is at least as good as the user's setting
    assert rec["simulated"]["slo_attainment"] >= cur["simulated"]["slo_attainment"] - 1e-12 or (
        adv.met_target and rec["simulated"]["gpu_hours"] <= cur["simulated"]["gpu_hours"])
    # only the listed knobs changed, and the file written back reads as the recommendation
    text = adv.recommended_text((case / "hpa.yaml").read_text())
    assert parse_control_plane(text) == adv.recommended
    assert "# The HPA this user runs on the decode deployment" in text
    for knob, change in adv.changes.items():
        assert change["from"] != change["to"]
        assert f"{change['from']} -> {change['to']}" in text
    assert adv.candidates["passed"].sum() >= 1 and adv.candidates["simulated"].sum() <= 2


def test_advise_command_writes_the_recommendation(case, tmp_path, capsys):
    out = tmp_path / "advice"
    assert main(["advise", "--control-plane", str(case / "hpa.yaml"), "--scenario", str(case / "sim.toml"),
                 "--trace", str(case / "requests.csv"), "--seed", "1", "--candidates", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("Current setting: certificate")
    m = json.loads((out / "metrics.json").read_text())
    for block in ("current", "recommended"):
        b = m[block]
        assert isinstance(b["stable"], bool) and isinstance(b["simulated"]["oscillating"], bool)
        assert 0.0 <= b["simulated"]["slo_attainment"] <= 1.0 and b["simulated"]["gpu_hours"] > 0
        assert b["predicted_cycle"] is None or b["predicted_cycle"]["period_s"] > 0
    assert parse_control_plane((out / "recommended.yaml").read_text()).format == "kubernetes-hpa"


def test_vllm_config_gets_the_batch_cap_for_the_slo(case, tmp_path):
    from tokenfactory.registry import static_batch_cap
    from tokenfactory.replay import build_replay, class_outputs, scenario_cluster

    cfg = tmp_path / "vllm.yaml"
    cfg.write_text("# engine arguments\nmodel: Qwen/Qwen3-30B-A3B\ntensor-parallel-size: 2\nmax-num-seqs: 512\n")
    sc = load_replay_scenario(case / "sim.toml")
    trace = load_trace(case / "requests.csv")
    adv = advise(cfg, sc, trace, seed=1)
    cl = scenario_cluster(sc, 1)
    setup = build_replay(trace, dict(sc.plant))
    cap = int(static_batch_cap(setup.context(cl["slo_ttft_s"], cl["slo_tpot_s"], class_outputs=class_outputs(trace))))
    assert adv.recommended.max_num_seqs == cap < 512
    text = adv.recommended_text(cfg.read_text())
    assert "tensor-parallel-size: 2" in text and f"max-num-seqs: {cap}" in text
    assert adv.blocks["recommended"]["vllm_flags"].startswith(f"--max-num-seqs {cap}")
    # the cap keeps passes within the SLO where 512 sequences per batch do not
    assert adv.blocks["recommended"]["simulated"]["tpot_p99_s"] <= adv.blocks["current"]["simulated"]["tpot_p99_s"]
