"""Mooncake early rejection (current and predicted load) and vLLM watermark admission, against
hand-worked decisions."""

import math

import pytest

from tokenfactory.controllers import EarlyRejection, WatermarkAdmission
from tokenfactory.plant_models import Measurement
from tokenfactory import ConfigError


def meas(**kw):
    base = dict(time_s=0.0, backlog=0.0, fill_in_progress=200.0, ready=0.0, active_decodes=900.0,
                completion_rate=100.0, admitted_rate=100.0, decode_slots=1000.0, fill_capacity=100.0,
                fill_workers=2, decode_workers=2)
    return Measurement(**{**base, **kw})


def test_ttft_prediction_rejects_first():
    er = EarlyRejection(fill_latency_s=0.5, slo_ttft_s=2.0)
    # (0 + 200) / 100 + 0.5 = 2.5 s > 2 s
    assert er.predicted_ttft(meas()) == pytest.approx(2.5)
    a = er.update(0.0, meas())
    assert (a.backlog_bound, a.reason) == (0.0, "predicted_slo_violation")


@pytest.mark.parametrize("active, predictive, rejected", [
    (900.0, False, False),   # load (900 + 0) / 1000 = 0.90
    (1000.0, False, True),   # 1.00: every slot taken
    (1000.0, True, False),   # predicted (1000 + 200 - 100 x 2.5) / 1000 = 0.95
    (1100.0, True, True),    # predicted 1.05
])
def test_decode_load_current_vs_predicted(active, predictive, rejected):
    er = EarlyRejection(fill_latency_s=0.5, slo_ttft_s=5.0, predictive=predictive)
    a = er.update(0.0, meas(active_decodes=active))
    assert (a.backlog_bound == 0.0) is rejected
    if rejected:
        assert a.reason == "decode_overloaded"
    else:
        assert math.isinf(a.rate) and math.isinf(a.backlog_bound)


def test_tbt_prediction_from_the_pass_time():
    er = EarlyRejection(fill_latency_s=0.5, slo_ttft_s=5.0, decode_step_s=lambda b: 0.05 + 1e-4 * b,
                        slo_tpot_s=0.09)
    # batch per worker at load 0.9: 0.9 x 1000 / 2 = 450 -> pass 0.095 s > 0.09
    assert er.update(0.0, meas()).reason == "predicted_slo_violation"
    assert math.isinf(er.update(0.0, meas(active_decodes=600.0)).rate)  # 300 -> 0.08 s


def test_watermark_admission_keeps_one_percent_free():
    w = WatermarkAdmission(watermark=0.01, sample_period=0.1)
    # held 900 + 0 + 80 = 980 of 990 allowed: 10 requests of room in 0.1 s plus the 20/s that
    # complete meanwhile -> 120/s, capped at the fill capacity (100/s)
    assert w.update(0.0, meas(fill_in_progress=80.0, completion_rate=20.0)).rate == pytest.approx(100.0)
    assert w.update(0.0, meas(fill_in_progress=85.0, completion_rate=20.0)).rate == pytest.approx(70.0)
    assert w.update(0.0, meas(fill_in_progress=85.0, completion_rate=0.0)).rate == pytest.approx(50.0)
    assert w.update(0.0, meas(fill_in_progress=95.0)).rate == 0.0
    assert math.isinf(w.update(0.0, meas()).backlog_bound)  # it never rejects


def test_bad_parameters():
    with pytest.raises(ConfigError, match="early_rejection.decode_threshold"):
        EarlyRejection(fill_latency_s=0.1, decode_threshold=0.0)
    with pytest.raises(ConfigError, match="watermark.watermark"):
        WatermarkAdmission(watermark=0.9)


def test_runs_in_the_admission_loop_fluid_plant(smoothed_scenario):
    """The same objects close the admission loop of the 10 ms fluid plant (simulate_loop)."""
    from tokenfactory.plant_models import LoopScenario, simulate_loop

    plant = smoothed_scenario.plant
    sc = LoopScenario(demand=1.3 * plant.decode_capacity, duration_s=60.0, dt=0.01)
    for ctrl in (EarlyRejection(fill_latency_s=plant.params.fill_latency_s, slo_ttft_s=2.0),
                 EarlyRejection(fill_latency_s=plant.params.fill_latency_s, slo_ttft_s=2.0, predictive=True),
                 WatermarkAdmission()):
        r = simulate_loop(plant, ctrl, sc, x0=plant.initial_state(100.0))
        tail = r.window(30.0)
        done = r.column("completed")[tail]
        rate = (done[-1] - done[0]) / 30.0
        assert rate == pytest.approx(plant.decode_capacity, rel=0.05)  # decode stays busy
        if isinstance(ctrl, EarlyRejection):
            assert r.column("rejected")[-1] > 0  # overload is rejected at arrival, not queued


def test_seesaw_prediction_is_the_asymmetric_relay_cycle():
    """Relay through a pure delay on an integrator with slopes a = demand - rate and b = rate:
    period delay x (2 + a / b + b / a), swing (a + b) x delay (controllers/early_rejection.py)."""
    from tokenfactory.controllers.early_rejection import predict_rejection_seesaw

    c = predict_rejection_seesaw(13.0, 10.0, 100.0, 2.0)
    assert c.period_s == pytest.approx(2.0 * (2.0 + 0.3 + 10.0 / 3.0))
    assert c.swing == pytest.approx(13.0 * 2.0 / 100.0)
    assert c.amplitude == pytest.approx(c.swing / 2.0 * (2.0 / 3.0) ** 0.5)
    assert predict_rejection_seesaw(9.0, 10.0, 100.0, 2.0) is None      # nothing rejected
    assert predict_rejection_seesaw(13.0, 10.0, 100.0, 0.2) is None      # too small to matter
