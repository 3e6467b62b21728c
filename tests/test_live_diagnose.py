"""Diagnosis and identification on saved metrics: known oscillations, delays and rates recovered."""

import json

import numpy as np
import pandas as pd
import pytest

from tokenfactory.core.errors import ConfigError
from tokenfactory.live.diagnose import anti_phase, diagnose, read_metrics_file
from tokenfactory.live.identify import (
    fit_delay,
    fit_delay_exact,
    fit_pass_law,
    fit_startup_delay,
    identify,
    in_flight_from_log,
    write_scenarios,
)
from tokenfactory.scenario import load_scenario
from tokenfactory.stack import load_stack_scenario


def _query_range(t, y, metric):
    return {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": metric, "values": [[float(a), str(float(b))] for a, b in zip(t, y)]}]}}


def test_seesaw_of_prefill_and_decode_replicas_is_found(tmp_path):
    rng = np.random.default_rng(0)
    t = np.arange(0, 600, 2.0) + 1.7e9
    prefill = 6 + np.round(2 * np.sin(2 * np.pi * t / 60))
    decode = 6 - np.round(2 * np.sin(2 * np.pi * t / 60))
    waiting = np.abs(rng.normal(0, 0.3, len(t)))
    doc = {"prefill_replicas": _query_range(t, prefill, {}), "decode_replicas": _query_range(t, decode, {}),
           "waiting": _query_range(t, waiting, {})}
    f = tmp_path / "saved.json"
    f.write_text(json.dumps(doc))
    d = diagnose(read_metrics_file(f))
    assert d.signals["prefill_replicas"]["oscillating"] and d.signals["decode_replicas"]["oscillating"]
    assert d.signals["prefill_replicas"]["period_s"] == pytest.approx(60, rel=0.1)
    assert not d.signals["waiting"]["oscillating"]
    assert d.pd_check["pair"] == ["prefill_replicas", "decode_replicas"] and d.pd_check["anti_phase"]
    assert "2 of 3 signals oscillate" in d.to_markdown() and "anti-phase" in d.to_markdown()
    # in phase: no anti-phase
    x = np.sin(np.arange(200) / 5.0)
    assert not anti_phase(x, x, 1.0, 31.4)["anti_phase"]


def test_a_csv_and_a_raw_query_range_are_read(tmp_path):
    t = np.arange(0, 100, 1.0)
    pd.DataFrame({"time_s": t, "running": 10 + np.sin(t), "waiting": np.zeros_like(t)}).to_csv(tmp_path / "m.csv",
                                                                                              index=False)
    s = read_metrics_file(tmp_path / "m.csv")
    assert list(s.frame.columns) == ["running", "waiting"] and s.dt == 1.0
    one = _query_range(t, t, {"__name__": "vllm:num_requests_running", "engine": "0"})
    (tmp_path / "q.json").write_text(json.dumps(one))
    assert list(read_metrics_file(tmp_path / "q.json").frame.columns) == ["running"]
    (tmp_path / "bad.json").write_text(json.dumps({"status": "error"}))
    with pytest.raises(ConfigError, match="query_range"):
        read_metrics_file(tmp_path / "bad.json")
    with pytest.raises(ConfigError, match="no such file"):
        read_metrics_file(tmp_path / "none.csv")


@pytest.mark.parametrize("delay", [0.25, 1.0, 2.5])
def test_delay_below_the_scrape_interval_from_a_request_log(delay):
    # Poisson requests (a load step from 5 to 20 /s) of random length; the engine's count is the
    # in-flight count `delay` late, scraped once a second: recovered to 10 % from the log
    rng = np.random.default_rng(1)
    sent = np.concatenate([np.cumsum(rng.exponential(1 / 5, 200)), 40 + np.cumsum(rng.exponential(1 / 20, 800))])
    sent = sent[sent < 80]
    end = sent + rng.uniform(1.0, 6.0, len(sent))
    f = in_flight_from_log(sent, end)
    te = np.arange(0.71, 90, 1.0)
    e = fit_delay_exact(te, f(te - delay), f, max_delay_s=5.0, resamples=50)
    assert e.value == pytest.approx(delay, rel=0.1)
    assert e.lo <= delay + 0.1 * delay and e.hi >= delay - 0.1 * delay


def test_delay_from_two_smooth_scraped_series():
    # without the log: both series scraped (1 s, different phases), the source interpolated
    t_fine = np.arange(0, 200, 0.01)
    x = 10 * np.sin(t_fine / 9) + 5 * np.sin(t_fine / 23)
    ts, te = np.arange(0.13, 200, 1.0), np.arange(0.71, 200, 1.0)
    e = fit_delay(te, np.interp(te - 1.5, t_fine, x), np.interp(ts, t_fine, x), source_t=ts, max_delay_s=5.0,
                  resamples=50)
    assert e.value == pytest.approx(1.5, rel=0.1)


def test_pass_law_startup_and_scenario_files(tmp_path):
    b = np.linspace(4, 40, 30)
    tpot = 0.02 + 0.001 * b + np.random.default_rng(2).normal(0, 1e-4, len(b))
    law = fit_pass_law(b, tpot)
    assert law["a_s"].value == pytest.approx(0.02, rel=0.05) and law["b_s_per_seq"].value == pytest.approx(0.001,
                                                                                                           rel=0.05)
    t = np.arange(0, 100.0)
    spec = np.where(t >= 20, 3, 2)
    ready = np.where(t >= 50, 3, 2)
    assert fit_startup_delay(t, spec, ready).value == 30
    assert fit_startup_delay(t, np.full(100, 2), np.full(100, 2)) is None
    # identify on raw series: delay, per-worker rate at saturation, gain; scenario files that
    # margins and certify read
    rng = np.random.default_rng(3)
    tt = np.arange(0, 200, 1.0)
    in_flight = np.clip(np.cumsum(rng.normal(0.2, 2, len(tt))), 0, 60)
    eng = np.interp(tt - 1.0, tt, in_flight)
    running = np.minimum(eng, 48)
    series = {"in_flight": pd.Series(in_flight, tt), "running": pd.Series(running, tt),
              "waiting": pd.Series(eng - running, tt), "decode_workers": pd.Series(np.ones_like(tt), tt),
              "success_total": pd.Series(np.cumsum(running / 48 * 9.0), tt)}
    ident = identify(series, modelled_service_rate=10.0)
    assert ident.metric_delay_s.value == pytest.approx(1.0, rel=0.1)
    assert ident.service_rate_per_worker.value == pytest.approx(9.0, rel=0.1)
    assert ident.admission_gain.value == pytest.approx(0.9, rel=0.1)
    assert any("start-up" in n for n in ident.notes)
    paths = write_scenarios(ident, {"model": "deepseek-v3", "hardware": "h200", "fill_workers": 1,
                                    "decode_workers": 1, "prompt_tokens": 1000, "output_tokens": 64}, tmp_path)
    m = load_scenario(paths["margins"])
    assert m.plant.params.measurement_delay_s == pytest.approx(ident.metric_delay_s.value, rel=1e-3)
    st = load_stack_scenario(paths["stack"])
    assert st.params.measurement_delay_s == pytest.approx(ident.metric_delay_s.value, rel=1e-3)
    assert min(st.envelope.service_rate_factors) <= ident.admission_gain.value <= max(st.envelope.service_rate_factors)


def test_cli_diagnose_and_identify_on_a_saved_file(tmp_path, capsys):
    from tokenfactory.cli import main

    tt = np.arange(0, 200, 1.0)
    rng = np.random.default_rng(4)
    in_flight = np.clip(np.cumsum(rng.normal(0.2, 2, len(tt))), 0, 60)
    eng = np.interp(tt - 2.0, tt, in_flight)
    running = np.minimum(eng, 48)
    pd.DataFrame({"time_s": tt, "in_flight": in_flight, "running": running, "waiting": eng - running,
                  "decode_workers": 1.0, "success_total": np.cumsum(running / 48 * 9.0)}).to_csv(tmp_path / "m.csv",
                                                                                              index=False)
    assert main(["diagnose", "--metrics", str(tmp_path / "m.csv"), "--out", str(tmp_path / "d")]) == 0
    assert "signals oscillate" in (tmp_path / "d" / "diagnosis.md").read_text()
    assert main(["identify", "--metrics", str(tmp_path / "m.csv"), "--scenario", "live_small", "--json",
                 "--out", str(tmp_path / "i")]) == 0
    out = json.loads((tmp_path / "i" / "identified.json").read_text())
    assert out["metric_delay_s"]["value"] == pytest.approx(2.0, rel=0.1)
    assert (tmp_path / "i" / "margins.toml").is_file() and (tmp_path / "i" / "stack.toml").is_file()
    assert main(["diagnose"]) == 2  # neither --prometheus nor --metrics: a ConfigError, exit 2


def _decode_record(saturate: bool):
    """Scraped series of one decode worker with pass time T(B) = 0.02 + 0.001 B (s): the batch ramps
    up and down (and, with ``saturate``, sits at its cap of 48 while requests queue for a slot, so
    finished requests' TPOT carries the slot wait, as on the emulator)."""
    t = np.arange(0, 300, 1.0)
    batch = 4 + 40 * (0.5 - 0.5 * np.cos(2 * np.pi * t / 150))
    if saturate:
        batch = np.minimum(batch * 1.4, 48.0)
    pass_s = 0.02 + 0.001 * batch
    gen = np.cumsum(batch / pass_s)  # one token per running sequence per pass
    # TPOT: the pass time plus a slot wait (spread over 100 output tokens) while the batch is full
    wait_s = np.where(batch >= 47.9, 3.0, 0.0)
    tpot = pass_s + wait_s / 100.0
    done = np.cumsum(batch / pass_s / 100.0)
    return {"running": pd.Series(batch, t), "decode_workers": pd.Series(np.ones_like(t), t),
            "success_total": pd.Series(done, t), "generation_total": pd.Series(gen, t),
            "tpot_sum": pd.Series(np.cumsum(tpot * batch / pass_s / 100.0), t),
            "tpot_count": pd.Series(done, t)}


@pytest.mark.parametrize("saturate", [False, True])
def test_pass_law_from_token_throughput_carries_no_slot_wait(saturate):
    series = _decode_record(saturate)
    law = identify(series).pass_law
    assert law["method"].startswith("token throughput")
    assert law["a_s"].value == pytest.approx(0.02, rel=0.05)
    assert law["b_s_per_seq"].value == pytest.approx(0.001, rel=0.05)
    bm = law["median_batch"]
    assert law["pass_at_median_s"].value == pytest.approx(0.02 + 0.001 * bm, rel=0.02)
    # the TPOT fallback (no generation counter) on the same record: unbiased only while unsaturated
    tpot_law = identify({k: v for k, v in series.items() if k != "generation_total"}).pass_law
    assert tpot_law["method"].startswith("TPOT")
    err = tpot_law["pass_at_median_s"].value / (0.02 + 0.001 * tpot_law["median_batch"]) - 1.0
    if not saturate:
        assert abs(err) < 0.05


def _prefill_record(prefill_s: float = 0.5, decode_s: float = 4.0, output_tokens: int = 100):
    """One decode worker with T(B) = 0.02 + 0.001 B behind a prefill stage: ``running`` counts the
    requests in their prefill too (as vLLM's ``num_requests_running`` does), each request's first
    token comes from its prefill, and the finished-request observations (success counter, vLLM's
    prefill/decode time histograms) arrive ``decode_s`` after the first token."""
    t = np.arange(0, 300, 1.0)
    batch = 4 + 40 * (0.5 - 0.5 * np.cos(2 * np.pi * t / 150))
    pass_s = 0.02 + 0.001 * batch
    decode_tokens = batch / pass_s
    firsts = decode_tokens / (output_tokens - 1)       # requests/s reaching their first token
    prefilling = firsts * prefill_s                     # Little's law on the prefill stage
    late = lambda x: np.interp(t - decode_s, t, x, left=0.0)  # noqa: E731  (observed at completion)
    done = np.cumsum(late(firsts))
    return {"running": pd.Series(batch + prefilling, t), "decode_workers": pd.Series(np.ones_like(t), t),
            "success_total": pd.Series(done, t), "generation_total": pd.Series(np.cumsum(decode_tokens + firsts), t),
            "prefilling": pd.Series(prefilling, t), "prefill_time_sum": pd.Series(np.cumsum(late(prefilling)), t),
            "decode_time_sum": pd.Series(done * decode_s, t), "decode_time_count": pd.Series(done, t)}, batch


@pytest.mark.parametrize("source", ["prefilling", "prefill_time_sum"])
def test_pass_law_subtracts_the_requests_in_their_prefill(source):
    series, batch = _prefill_record()
    true = lambda b: 0.02 + 0.001 * b  # noqa: E731
    keep = {"running", "decode_workers", "success_total", "generation_total", source, "decode_time_sum",
            "decode_time_count"}
    law = identify({k: v for k, v in series.items() if k in keep}).pass_law
    share = np.mean(series["prefilling"].to_numpy() / series["running"].to_numpy())
    assert 0.08 < share < 0.2  # the record's prefilling share is large enough to matter
    assert law["prefilling_share"] == pytest.approx(share, rel=0.1)
    assert law["pass_at_median_s"].value == pytest.approx(true(law["median_batch"]), rel=0.02)
    assert law["b_s_per_seq"].value == pytest.approx(0.001, rel=0.05)
    # without a prefill series the decode batch is overstated by the prefilling share, and a note says so
    biased = identify({k: v for k, v in series.items() if k in keep - {source}})
    err = biased.pass_law["pass_at_median_s"].value / true(biased.pass_law["median_batch"]) - 1.0
    assert err > 0.05 and any("prefill" in n for n in biased.notes)
