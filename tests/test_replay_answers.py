"""The plain answer `tokenfactory simulate` prints (tokenfactory/cli/replay_answers.py)."""

from __future__ import annotations

import re

import pytest

from tokenfactory.cli import main

SCENARIO = """[plant]
model = "llama-3.1-70b"
hardware = "h100-sxm"
parallelism = {{ tp = 4, pp = 1, ep = 4 }}

[cluster]
fill_workers = 1
decode_workers = 1
slo_ttft_s = 1.5
slo_tpot_s = {tpot}

[cluster.dynamics]
gpus_per_worker = 4
"""


def _answer(tmp_path, capsys, tpot: float) -> list[str]:
    (tmp_path / "sim.toml").write_text(SCENARIO.format(tpot=tpot))
    rows = "\n".join(f"{2.0 * i:.3f},1500,200" for i in range(20))
    (tmp_path / "requests.csv").write_text("arrival_s,input_tokens,output_tokens\n" + rows + "\n")
    assert main(["simulate", "--scenario", str(tmp_path / "sim.toml"), "--trace", str(tmp_path / "requests.csv"),
                 "--no-progress", "--out", str(tmp_path / "out")]) == 0
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("tpot,infeasible", [(0.02, True), (0.08, False)])
def test_a_tpot_slo_no_batch_meets_is_said(tmp_path, capsys, tpot, infeasible):
    """With the TPOT SLO below one sequence's pass the batch cap floors at 1: the answer says that
    no batch meets it (with the pass time) instead of calling batch 1's figures 'at the SLO'."""
    lines = _answer(tmp_path, capsys, tpot)
    said = [l for l in lines if l.startswith("no decode batch meets the TPOT SLO")]
    peak = next(l for l in lines if l.startswith("the trace's peak"))
    if infeasible:
        assert len(said) == 1 and f"(SLO {tpot:g} s)" in said[0]
        one = float(re.search(r"takes ([0-9.]+) s", said[0]).group(1))
        assert one > tpot
        assert "--max-num-seqs 1" in next(l for l in lines if l.startswith("capacity at the SLO:"))
        assert "at batch 1 (no batch meets the TPOT SLO)" in peak
    else:
        assert not said and "workers at the SLO" in peak
