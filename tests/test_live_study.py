"""Study `live`, quick variant: locust drives the gateway in front of the emulator (real processes
on loopback, stopped by the study), Prometheus records, identify recovers the scenario, the request
simulator replays the same arrivals.

The study's runs are marked slow: the quick variant runs four sets of real processes for about two and a half minutes on
an idle machine (6-9 minutes on the shared one); the emulator, the gateway, Prometheus and identify
are each tested in the default run (tests/test_live_*.py). The live-vs-simulated agreement depends
on the machine keeping up (the load generator's lateness is in the table): it is reported by the
study, not asserted here.
"""

import json
import math

import numpy as np
import pandas as pd
import pytest

from tokenfactory.studies.live import HOPS, _decision_counts, _joined, _simulate

from tokenfactory.live.prometheus_server import prometheus_binary
from tokenfactory.studies import run_study


def _logs(tmp_path, gated: bool):
    """A client record of two requests (one rejected when gated) and the gateway's and emulator's
    logs of them, in unix seconds from a schedule starting at 100."""
    live = pd.DataFrame({"k": [0, 1], "t0_unix": 100.0, "planned_unix_s": [100.0, 100.5],
                         "sent_unix_s": [100.01, 100.52], "first_unix_s": [100.60, math.nan],
                         "end_unix_s": [101.9, 100.56], "status": [200, 429 if gated else 200], "tokens": [5, 0]})
    live["ttft_s"] = live["first_unix_s"] - live["sent_unix_s"]
    em = [{"request_id": "0", "received_unix_s": 100.04, "arrival_unix_s": 100.05, "first_token_unix_s": 100.55,
           "completion_unix_s": 101.8, "first_write_unix_s": 100.57, "end_unix_s": 101.85, "input_tokens": 10,
           "output_tokens": 5, "tokens_written": 5, "done": True}]
    (tmp_path / "em.jsonl").write_text("".join(json.dumps(r) + "\n" for r in em))
    gw = [{"request_id": "0", "status": "completed", "reason": "", "arrived_unix_s": 100.02, "sent_unix_s": 100.03,
           "first_token_unix_s": 100.58, "end_unix_s": 101.88, "chunks": 6, "deferred": False},
          {"request_id": "1", "status": "rejected", "reason": "decode_overloaded", "arrived_unix_s": 100.54,
           "sent_unix_s": math.nan, "first_token_unix_s": math.nan, "end_unix_s": 100.55, "chunks": 0,
           "deferred": True}]
    (tmp_path / "gw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gw))
    return live, (tmp_path / "gw.jsonl") if gated else None, tmp_path / "em.jsonl"


# gated: building the scenario's admission controller tunes it (~5 s), so that case is slow; the default run
# keeps the open one (RequestPlant.run(admission=) equals simulate() is tested in test_plant_protocol)
@pytest.mark.parametrize("gated", [pytest.param(True, marks=pytest.mark.slow), False])
def test_the_simulated_side_through_the_plant_protocol_equals_the_simulator_call(gated):
    """The study's simulated runs go through RequestPlant.run; on the same arrivals (an overload burst,
    so the gate rejects) they equal the request simulator called directly, record for record."""
    import dataclasses

    from tokenfactory.live.live_scenario import load_live_scenario
    from tokenfactory.plant_models.des import simulate

    sc = load_live_scenario("live_small")
    arrivals = np.sort(np.random.default_rng(1).uniform(0.0, 6.0, 300))
    trace = pd.DataFrame({"arrival_s": arrivals, "input_tokens": int(sc.live["prompt_tokens"]),
                          "output_tokens": int(sc.live["output_tokens"])})
    direct = simulate(trace, sc.setup.params, dataclasses.replace(sc.cluster, duration_s=6.0 + 120.0, progress=False),
                      sc.build_admission(trace) if gated else None).records
    via_plant = _simulate(sc, arrivals, 6.0, gated)
    pd.testing.assert_frame_equal(via_plant, direct, check_exact=True)
    assert len(via_plant) == len(arrivals)
    if gated:
        assert (via_plant["state"].astype(str) == "rejected").any()


@pytest.mark.parametrize("gated", [True, False])
def test_request_logs_join_into_hops_that_sum_to_the_clients_ttft(tmp_path, gated):
    j = _joined(*_logs(tmp_path, gated))
    first = j.iloc[0]
    assert sum(first[h] for h in HOPS) == pytest.approx(first["ttft_s"], abs=1e-9)
    assert first["engine_ttft_s"] == pytest.approx(0.50) and first["engine_to_write_s"] == pytest.approx(0.02)
    # the arrival the gate saw, from the schedule's start: the gateway's, else the engine's
    assert first["gate_arrival_s"] == pytest.approx(0.02 if gated else 0.05)
    if gated:
        assert first["gateway_decision_s"] == pytest.approx(0.01)
        assert j.iloc[1]["gate_arrival_s"] == pytest.approx(0.54)  # a rejected request arrived too
        counts = _decision_counts(j["gw_status"], j["gw_reason"], j["gw_deferred"])
        assert counts == {"requests": 2, "admitted": 1, "deferred": 1, "rejected_decode_overloaded": 1}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    if prometheus_binary() is None:
        pytest.skip("prometheus is not installed (.ci/run installs it)")
    out = tmp_path_factory.mktemp("live")
    run_study("live", out, quick=True)
    return out, json.loads((out / "metrics.json").read_text())


@pytest.mark.slow
def test_identify_recovers_the_emulator(report):
    _, m = report
    rows = {r["parameter"]: r for r in m["identified"]}
    assert abs(rows["metric_delay_s"]["error"]) <= 0.10  # the scenario's 1 s publication delay
    assert abs(rows["service_rate_per_worker"]["error"]) <= 0.15
    assert rows["admission_gain"]["lo"] <= 1.0 + 0.15 and rows["admission_gain"]["hi"] >= 1.0 - 0.15
    # the pass-time law from token throughput on the decode batch (running less the prefilling
    # requests; +7.0 % before that was subtracted, +26 % from TPOT: slot waits), and the same record
    # from vLLM's metrics alone (prefilling by Little's law on the prefill-time histogram)
    (pass_row,) = [r for k, r in rows.items() if k.startswith("pass_time_s") and r["primary"]]
    assert pass_row["method"].startswith("token throughput") and "prefilling count" in pass_row["method"]
    assert abs(pass_row["error"]) <= 0.10
    (vllm_row,) = [r for k, r in rows.items() if k.startswith("pass_time_s (vLLM")]
    assert "Little's law" in vllm_row["method"] and abs(vllm_row["error"]) <= 0.12


@pytest.mark.slow
def test_live_runs_account_for_every_arrival_and_match_the_simulator(report):
    out, m = report
    runs = m["live_vs_simulated"]
    assert [(r["load"], r["gateway"]) for r in runs] == [(0.9, True), (2.0, True), (2.0, False)]
    for r in runs:
        assert r["live_completed"] <= r["requests"] and r["sim_completed"] <= r["requests"]
        assert np.isfinite(r["goodput_rps_ratio"]) and np.isfinite(r["late_p99_s"])
    gw2, direct2 = runs[1], runs[2]
    assert direct2["live_completed"] == direct2["requests"]  # no gateway: the engine takes everything
    assert gw2["live_completed"] < gw2["requests"]           # the gateway sheds at 2x
    assert direct2["sim_goodput_rps"] < gw2["sim_goodput_rps"]  # the simulator's collapse without it
    assert (out / "summary.md").read_text().count("%") >= 2
    # every completed request's first token taken apart: the hops were measured for all of them
    hops = [h for h in m["ttft_decomposition"] if h["hop"] == "engine_ttft_s"]
    assert [h["requests"] for h in hops] == [r["live_completed"] for r in runs]
    # the simulator ran the arrivals the gate saw as well as the planned ones
    assert all(np.isfinite(r["simact_goodput_rps"]) and np.isfinite(r["ttft_p50_s_ratio_planned"]) for r in runs)
