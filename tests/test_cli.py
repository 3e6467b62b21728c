import json

import pytest

from tokenfactory.cli import main


def test_describe_model_json(capsys):
    assert main(["describe", "model", "deepseek-v3", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["kv_bytes_per_token"] == 70272
    assert d["total_params"] > 6.5e11 and d["active_params"] < 4e10


def test_describe_hardware_and_worker(capsys):
    assert main(["describe", "hardware", "gb200", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["scale_up_domain"] == 72
    assert main(["describe", "worker", "kimi-k2", "--hardware", "b300"]) == 0
    assert "decode_tokens_per_s" in capsys.readouterr().out


@pytest.mark.parametrize("argv,needle", [
    (["describe", "model", "nope"], "unknown preset"),
    (["describe", "worker", "deepseek-v3", "--hardware", "h100-sxm"], "does not fit"),
    (["describe", "worker", "deepseek-v3", "--tp", "3"], "parallelism.tp"),
    (["simulate", "--trace", "synthetic", "--autoscaler", "hpa2"], "autoscaler"),
    (["simulate", "--trace", "synthetic", "--admission", "early"], "admission"),
    (["simulate", "--trace", "synthetic", "--autoscaler-param", "decode_min_replicas=4"], "needs --autoscaler"),
    (["simulate", "--trace", "synthetic", "--autoscaler", "hysteretic", "--autoscaler-param", "decode_min_replicas"],
     "is not KEY=VALUE"),
])
def test_errors_are_one_line_exit_2(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_margins_command(capsys):
    from tokenfactory.studies.feedback_oscillation import scenario_path

    assert main(["margins", str(scenario_path("smoothed")), "--check"]) == 0
    out = capsys.readouterr().out
    assert "all envelope points meet" in out and "phase_margin_deg" in out
    assert main(["margins", str(scenario_path("naive")), "--check"]) == 1
    assert "limit cycle is predicted" in capsys.readouterr().out


def test_margins_json(capsys):
    from tokenfactory.studies.feedback_oscillation import scenario_path

    assert main(["margins", str(scenario_path("smoothed")), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert len(d["rows"]) == 9 and d["tuning"]["envelope_ok"]


def test_margins_check_fails_an_unstable_loop(tmp_path, capsys):
    """A hand-tuned gain 8x the auto-tuned one: the Nyquist count finds closed-loop RHP poles at
    the nominal and doubled delays; --check exits 1 and says so."""
    from tokenfactory.studies.feedback_oscillation import scenario_path

    text = scenario_path("smoothed").read_text().replace("safety_z = 2.0", "safety_z = 2.0\nkc = 2.24")
    f = tmp_path / "hot.toml"
    f.write_text(text)
    assert main(["margins", str(f), "--check"]) == 1
    out = capsys.readouterr().out
    assert "NOT all envelope points meet" in out and "points unstable by the Nyquist count" in out
    assert main(["margins", str(f), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert any(not r["stable"] and r["closed_loop_rhp_poles"] > 0 for r in rows)
    assert all(not r["meets_floors"] for r in rows if not r["stable"])


def test_margins_bad_scenario(tmp_path, capsys):
    f = tmp_path / "s.toml"
    f.write_text('[plant]\nmodel = "deepseek-v3"\nhardware = "h200"\nfill_workers = 6\ndecode_workers = 4\n'
                 'measurement_delay = 1\n[controller]\nkind = "smoothed"\n')
    assert main(["margins", str(f)]) == 2
    assert "plant.measurement_delay: unknown key" in capsys.readouterr().err


def test_simulate_with_an_autoscaler_and_a_baseline_admission(tmp_path, capsys):
    assert main(["simulate", "--trace", "synthetic", "--duration", "5m", "--scale", "10", "--autoscaler", "hysteretic",
                 "--admission", "mooncake", "--no-progress", "--out", str(tmp_path)]) == 0
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["autoscaler"] == "hysteretic" and m["admission"] == "mooncake"
    assert m["config"]["autoscalers"][0]["pool"] == "fill" and m["gpu_hours"] > 0
    assert m["requests"] == m["completed"] + m["rejected"] + m["in_flight_end"]


def test_simulate_load_is_a_multiple_of_the_capacity_from_each_requests_cost(tmp_path):
    """``simulate --load X --capacity model`` replays at X times the model's capacity at the SLO
    that the overload study uses: the pools' capacity from the mean of each request's own service
    cost, for the simulated cluster (recorded in metrics.json)."""
    import pandas as pd

    from tokenfactory.replay import build_replay, request_costs, service_capacity
    from tokenfactory.traces import SyntheticWorkload, generate_requests

    assert main(["simulate", "--trace", "synthetic", "--duration", "5m", "--load", "0.5", "--admission", "open",
                 "--capacity", "model", "--no-progress", "--out", str(tmp_path)]) == 0
    m = json.loads((tmp_path / "metrics.json").read_text())
    trace = generate_requests(SyntheticWorkload(seed=0), 300.0)
    setup = build_replay(trace)
    own = service_capacity(request_costs(trace, setup.params), setup.params, 2, 1, m["slo_batch_cap"])
    assert m["slo_capacity_source"] == "model" and m["measured_capacity_rps"] is None
    assert m["slo_capacity_rps"] == pytest.approx(min(own.values()), rel=1e-9)
    assert m["capacity"]["cluster"]["fill_workers"] == 2 and m["capacity"]["cluster"]["decode_workers"] == 1
    rec = pd.read_csv(tmp_path / "requests.csv")
    rate = len(rec) / rec["arrival_s"].max()
    assert rate == pytest.approx(0.5 * m["slo_capacity_rps"], rel=0.02)


def test_simulate_shows_progress_from_the_start(tmp_path, capsys):
    assert main(["simulate", "--trace", "synthetic", "--duration", "3m", "--progress", "--out", str(tmp_path)]) == 0
    cap = capsys.readouterr()
    assert cap.out.splitlines()[0].startswith("generating 3m of synthetic requests")
    frames = cap.err.split("\r")
    import re

    # the first frame at once, before any simulated time has passed (the horizon adds the drain)
    assert re.match(r"simulating:   0\.0 % of [\d,]+ s simulated, 0 arrivals", frames[1]), frames[1]
    assert re.search(r"100\.0 % of [\d,]+ s simulated", cap.err)
    assert "cluster: 2 fill x deepseek-v3" in cap.out and "--max-num-seqs" in cap.out


def test_simulate_prints_every_verdict_the_metrics_hold():
    # whatever a plant or detector adds: boolean *oscillating/churning/flapping keys, at any depth,
    # or detector reports holding one; the run's config is not a verdict
    from tokenfactory.cli.replay_answers import verdicts

    m = {"ready_oscillation": {"oscillating": False, "reason": "amplitude"}, "oscillating": False,
         "pools": {"decode": {"oscillating": True, "churning": True, "period_s": 40.0},
                   "fill": {"flapping": False}}, "config": {"x_oscillating": True}, "requests": 3}
    assert verdicts(m) == [("ready_oscillation", False, ""), ("oscillating", False, ""),
                            ("pools.decode", True, "period 40 s"), ("pools.decode churning", True, "period 40 s"),
                            ("pools.fill flapping", False, "")]


SILICON_SUBSET = __import__("pathlib").Path(__file__).parent / "data" / "silicon_subset.csv"


@pytest.mark.parametrize("method, extra", [("steady-state", []), ("des", ["--limit", "2"])])
def test_calibrate_score_writes_metrics_and_rows(tmp_path, capsys, method, extra):
    import pandas as pd

    out = tmp_path / method
    assert main(["calibrate", "score", str(SILICON_SUBSET), "--out", str(out), "--method", method, *extra]) == 0
    m = json.loads((out / "metrics.json").read_text())
    rows = pd.read_csv(out / "rows.csv")
    assert m["rows_scored"] == len(rows) == (2 if extra else 8)
    assert m["rows_skipped_by_reason"]["duplicate run (same TTFT and TPOT to 1e-4 ms)"] == 1
    assert m["rows_read"] == 11 and m["rows_mapped"] == 8
    for q in ("tpot", "ttft"):
        for k in ("median_abs_error", "p10_error", "p90_error", "within_25pct"):
            assert k in m[q]
        for split in ("hardware", "engine", "precision", "mode", "batch_band"):
            assert m[q][f"by_{split}"]
    assert {"predicted_tpot_s", "measured_tpot_s", "tpot_error", "ttft_error"} <= set(rows.columns)
    assert "rows scored" in capsys.readouterr().out


def test_calibrate_score_published_points(tmp_path):
    assert main(["calibrate", "score", "published", "--out", str(tmp_path)]) == 0
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["rows_scored"] + sum(m["rows_skipped_by_reason"].values()) == 13


def test_calibrate_score_needs_out(capsys):
    assert main(["calibrate", "score", str(SILICON_SUBSET), "--method", "steady-state"]) == 2
    assert "--out" in capsys.readouterr().err


def test_calibrate_fit_writes_its_report(tmp_path, capsys):
    # 8 runs give 16 residuals: in the joint fit (the default) one of the 17 parameters is held
    # (without --fix: a named error)
    assert main(["calibrate", "fit", str(SILICON_SUBSET), "--per-group", "1", "--max-nfev", "2", "--no-cv",
                 "--out", str(tmp_path)]) == 2
    assert "8 runs cannot fit 17 parameters" in capsys.readouterr().err
    assert main(["calibrate", "fit", str(SILICON_SUBSET), "--per-group", "1", "--max-nfev", "2", "--no-cv",
                 "--fix", "nope", "--out", str(tmp_path)]) == 2
    assert "nope is not a calibration parameter" in capsys.readouterr().err
    assert main(["calibrate", "fit", str(SILICON_SUBSET), "--per-group", "1", "--max-nfev", "2", "--no-cv",
                 "--fix", "client_request_share", "--out", str(tmp_path)]) == 0
    rep = json.loads((tmp_path / "fit.json").read_text())
    assert rep["provenance"]["two_stage"] is False and "--fit-mode joint" in rep["provenance"]["command"]
    assert rep["provenance"]["fixed"] == ["client_request_share"]
    assert rep["fit"]["std_error"]["client_request_share"] == 0.0
    assert set(rep) >= {"fit", "before", "after", "provenance"}
    assert rep["provenance"]["runs"] == 8 and rep["fit"]["train_rows"] >= 1
    assert "std_error" in json.loads(capsys.readouterr().out)
    # the two-stage fit fits the 11 efficiencies on the 8 runs' 16 residuals, the TTFT terms apart
    assert main(["calibrate", "fit", str(SILICON_SUBSET), "--per-group", "1", "--max-nfev", "2", "--no-cv",
                 "--fit-mode", "two-stage", "--alternations", "1", "--out", str(tmp_path)]) == 0
    prov = json.loads((tmp_path / "fit.json").read_text())["provenance"]
    assert prov["two_stage"] is True and prov["joint_first"] is False and prov["ttft_rows"] == 8
    assert "--fit-mode two-stage --alternations 1" in prov["command"]
    assert main(["calibrate", "fit", str(SILICON_SUBSET), "--per-group", "1", "--max-nfev", "2", "--no-cv",
                 "--fit-mode", "two-stage", "--alternations", "0", "--out", str(tmp_path)]) == 2
    assert "alternations" in capsys.readouterr().err


def test_simulate_load_one_is_the_knee_of_the_scenarios_own_cluster(tmp_path):
    """Issue 27: ``--load`` multiplies the capacity of the cluster the scenario simulates (4 + 4
    workers here, not the default 2 + 1), measured by bisection under open admission and cached
    on disk: at ``--load 1`` open admission sits at the knee (SLO attainment 0.95-0.995), and a
    second run reads the cache."""
    sc = tmp_path / "s.toml"
    sc.write_text("[cluster]\nfill_workers = 4\ndecode_workers = 4\n")
    argv = ["simulate", "--scenario", str(sc), "--trace", "synthetic", "--duration", "3m", "--load", "1",
            "--admission", "open", "--no-progress", "--capacity-cache", str(tmp_path / "cache")]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    m = json.loads((tmp_path / "a" / "metrics.json").read_text())
    cap = m["capacity"]
    assert cap["cluster"]["fill_workers"] == 4 and cap["cluster"]["decode_workers"] == 4
    assert m["slo_capacity_source"] == "measured" and not cap["measured"]["cached"]
    assert 0.95 <= m["slo_attainment"] <= 0.995
    assert m["requests"] == m["completed"] + m["rejected"] + m["in_flight_end"]
    assert main([*argv, "--out", str(tmp_path / "b")]) == 0
    again = json.loads((tmp_path / "b" / "metrics.json").read_text())["capacity"]
    assert again["measured"]["cached"] and again["measured_rps"] == cap["measured_rps"]


def test_oscillation_answer_names_every_judged_signal_once_and_the_verdict():
    from tokenfactory.cli.replay_answers import oscillation_answer

    steady = {"ready_oscillation": {"oscillating": False}, "fill_oscillation": {"oscillating": False},
              "oscillating": False, "churning": False,
              "oscillation": {"oscillating": False, "churning": False, "reversals": 1,
                              "signals": {"ready": {"oscillating": False}, "fill_queue": {"oscillating": False},
                                          "decode_pool": {"oscillating": False}}}}
    assert oscillation_answer(steady) == ("oscillation: none in the 3 signals judged (ready buffer, fill queue, "
                                           "decode pool); churn: no (1 scale reversal, 0.0/h over the judged window; "
                                           "a pool churns past 2 reversals and 2/h)")
    # the bound is per pool: the counts are given per pool beside the total
    two = {**steady, "oscillation": {**steady["oscillation"], "reversals": 4, "reversals_per_hour": 20.03,
                                     "pool_reversals": {"fill": 2, "decode": 2}}}
    assert oscillation_answer(two).endswith("churn: no (4 scale reversals (fill 2, decode 2), 20.0/h over the "
                                            "judged window; a pool churns past 2 reversals and 2/h)")
    # user2: metrics.json's whole-run reversals_per_hour (22.26) beside the judged window's (20.03):
    # each names its window (window_s), and the line gives both when they differ
    windowed = {**two, "reversals_per_hour": 22.26, "window_s": [0.0, 3600.0],
                "oscillation": {**two["oscillation"], "window_s": [360.0, 3600.0]}}
    assert oscillation_answer(windowed).endswith(
        "churn: no (4 scale reversals (fill 2, decode 2), 20.0/h over the judged window 360-3,600 s (22.3/h over "
        "the whole run); a pool churns past 2 reversals and 2/h)")
    flapping = {**steady, "oscillation": {**steady["oscillation"], "oscillating": True, "churning": True,
                                          "reversals": 118, "reversals_per_hour": 590.0,
                                          "signals": {**steady["oscillation"]["signals"],
                                                      "decode_pool": {"oscillating": True, "period_s": 10.0,
                                                                      "amplitude": 0.5}}}}
    assert oscillation_answer(flapping) == ("oscillation: OSCILLATING decode pool (period 10 s, amplitude 0.5); "
                                             "2 other signals judged steady; CHURNING: 118 scale reversals, 590.0/h over the "
                                             "judged window; a pool churns past 2 reversals and 2/h")
    # a run without the actuator report (e.g. an aggregated cluster) still answers from its verdicts
    assert oscillation_answer({"ready_oscillation": {"oscillating": True, "period_s": 4.0, "amplitude": 2.0}}) == (
        "oscillation: OSCILLATING ready buffer (period 4 s, amplitude 2); 0 other signals judged steady")


def test_simulate_params_runs_the_named_set_and_says_so(tmp_path, capsys):
    """user2: ``simulate --params calibrated`` (the names ``calibrate score --params`` takes) runs
    the plant with that set over the scenario's plant.params, prints which set it used and writes it
    into metrics.json; without it the plant's default is used and named as such."""
    from tokenfactory.plant_models.calibration import calibrated_settings

    scenario = tmp_path / "sim.toml"
    scenario.write_text('[plant]\nparams = "pre-calibration"\n')
    assert main(["simulate", "--trace", "synthetic", "--duration", "2m", "--admission", "open", "--no-progress",
                 "--scenario", str(scenario), "--params", "calibrated", "--out", str(tmp_path / "cal")]) == 0
    out = capsys.readouterr().out
    m = json.loads((tmp_path / "cal" / "metrics.json").read_text())
    assert m["parameter_set"]["name"] == "calibrated"
    assert m["parameter_set"]["efficiency"]["sequence_overhead_s"] == calibrated_settings().efficiency.sequence_overhead_s
    assert "service-model parameters: calibrated" in out
    assert main(["simulate", "--trace", "synthetic", "--duration", "2m", "--admission", "open", "--no-progress",
                 "--scenario", str(scenario), "--out", str(tmp_path / "pre")]) == 0
    assert "service-model parameters: pre-calibration" in capsys.readouterr().out
    m2 = json.loads((tmp_path / "pre" / "metrics.json").read_text())
    assert m2["parameter_set"]["name"] == "pre-calibration" and m2["slo_capacity_rps"] != m["slo_capacity_rps"]
