"""The one SIMC envelope search (controllers/envelope_tuner.py) against the closed forms.

Reference values: Skogestad (2003), "Simple analytic rules for model reduction and PID controller
tuning", J. Process Control 13:291-309. For the integrating process k e^{-theta s}/s with SIMC PI
(Kc = 1/(k(tau_c + theta)), tau_I = 4(tau_c + theta)) at tau_c = theta the paper gives GM 2.96,
PM 46.9 deg, Ms 1.70 and a delay margin of 1.59 theta (section 4, the integrating-process row of
its robustness table). For a pure time delay k e^{-theta s} with the I controller of Table 1
(tau1 -> 0: K_I = 1/(k(tau_c + theta))) the loop is e^{-theta s}/((tau_c + theta) s), whose margins
follow by hand: crossover w_c = 1/(tau_c + theta), PM = pi/2 - theta w_c, GM = (tau_c + theta) pi
/ (2 theta), delay margin = PM / w_c.
"""

from __future__ import annotations

import math

import control
import pytest

from tokenfactory.controllers.envelope_tuner import (
    GM_FLOOR,
    PM_FLOOR_DEG,
    SIMC_TAU_C_FACTORS,
    SIMCTuning,
    simc_search,
)
from tokenfactory.controllers.stability import DelayedLoop, loop_transfer
from tokenfactory.controllers.stability_batch import DelayedLoopBatch
from tokenfactory.controllers.tuning import simc_pi
from tokenfactory.core.validation import ConfigError

THETA = 2.0


def _pure_delay_loop(ki: float, theta: float) -> DelayedLoop:
    """I control on e^{-theta s}: L(s) = ki e^{-theta s} / s."""
    return DelayedLoop(control.tf([ki], [1.0, 0.0]), theta, "pure delay")


def _integrating_pi_loop(gains, theta: float) -> DelayedLoop:
    """SIMC PI on e^{-theta s}/s."""
    c = control.tf([gains.kc * gains.ti, gains.kc], [gains.ti, 0.0])
    return loop_transfer(c, control.tf([1.0], [1.0, 0.0]), theta, name="integrating")


def _pure_delay_closed_form(f: float) -> dict:
    wc = 1.0 / ((1.0 + f) * THETA)
    pm = math.pi / 2.0 - THETA * wc
    return {"gain_margin": (1.0 + f) * math.pi / 2.0, "phase_margin_deg": math.degrees(pm),
            "delay_margin_over_theta": pm / wc / THETA}


#: (case, tau_c / theta, GM, PM deg, delay margin / theta, Ms or None, relative tolerance)
CLOSED_FORMS = [
    # Skogestad 2003's integrating-process row, tau_c = theta (values printed to 3 figures)
    ("integrating PI", 1.0, 2.96, 46.9, 1.59, 1.70, 0.01),
    # pure time delay, I control: the closed forms above, exact up to the margin solver's tolerance
    *[("pure delay I", f, *_pure_delay_closed_form(f).values(), None, 1e-6) for f in (1.0, 1.5, 3.0, 8.0)],
]


@pytest.mark.parametrize("case,f,gm,pm,dm,ms,rel", CLOSED_FORMS)
def test_nominal_margins_match_the_closed_forms(case, f, gm, pm, dm, ms, rel):
    if case == "integrating PI":
        controller_at = lambda f: simc_pi(1.0, THETA, tau_c=f * THETA)  # noqa: E731
        loop = lambda g: _integrating_pi_loop(g, THETA)  # noqa: E731
    else:
        controller_at = lambda f: 1.0 / (f * THETA + THETA)  # noqa: E731
        loop = lambda ki: _pure_delay_loop(ki, THETA)  # noqa: E731
    # floors at zero: the first candidate is taken, whatever its margins
    t = simc_search(THETA, controller_at, lambda c: [loop(c)], [{"delay_factor": 1.0}], nominal_loop=loop,
                    tau_c_factors=(f,), gm_floor=1.0, pm_floor_deg=0.0)
    assert t.tau_c_over_theta == f and t.tau_c_s == pytest.approx(f * THETA, rel=1e-15)
    assert t.nominal.gain_margin == pytest.approx(gm, rel=rel)
    assert t.nominal.phase_margin_deg == pytest.approx(pm, rel=rel)
    assert t.nominal.delay_margin_s / THETA == pytest.approx(dm, rel=rel)
    if ms is not None:
        assert t.nominal.ms == pytest.approx(ms, rel=rel)
    assert t.envelope[0]["gain_margin"] == pytest.approx(gm, rel=rel)


def _pure_delay_search(**kw) -> SIMCTuning:
    points = [{"delay_factor": d} for d in (0.5, 1.0, 2.0)]
    return simc_search(THETA, lambda f: 1.0 / (f * THETA + THETA),
                       lambda ki: [_pure_delay_loop(ki, THETA * p["delay_factor"]) for p in points], points,
                       nominal_loop=lambda ki: _pure_delay_loop(ki, THETA), **kw)


def test_the_search_takes_the_first_candidate_past_the_closed_form_limit():
    """Over delay x0.5-2 the worst point is the doubled delay: GM = (1 + f) pi / 4 and
    PM = pi/2 - 2/(1 + f) rad, both reach the floors (2, 45 deg) at 1 + f = 8/pi, f* = 1.546, so
    the search must stop at the first default candidate above it (2.0) and not before."""
    f_star = 8.0 / math.pi - 1.0
    t = _pure_delay_search()
    assert t.tau_c_over_theta == min(f for f in SIMC_TAU_C_FACTORS if f >= f_star) == 2.0
    assert t.tried == tuple(f for f in SIMC_TAU_C_FACTORS if f < 2.0)
    assert t.envelope_ok and len(t.envelope) == 3
    assert t.worst["delay_factor"] == 2.0
    assert t.worst["gain_margin"] == pytest.approx(3.0 * math.pi / 4.0, rel=1e-6)
    assert (t.gm_floor, t.pm_floor_deg) == (GM_FLOOR, PM_FLOOR_DEG)


def test_batched_and_scalar_margins_agree():
    """The same envelope through the batched kernel (a DelayedLoopBatch) and one by one."""
    points = [{"delay_factor": d} for d in (0.5, 1.0, 2.0)]

    def batch(ki):
        return DelayedLoopBatch([[ki]] * 3, [[1.0, 0.0]] * 3, [THETA * p["delay_factor"] for p in points],
                                tuple(str(p) for p in points))

    a = simc_search(THETA, lambda f: 1.0 / (f * THETA + THETA), batch, points)
    b = _pure_delay_search()
    assert a.tau_c_over_theta == b.tau_c_over_theta
    for ra, rb in zip(a.envelope, b.envelope):
        assert ra["gain_margin"] == pytest.approx(rb["gain_margin"], rel=1e-6)
        assert ra["phase_margin_deg"] == pytest.approx(rb["phase_margin_deg"], rel=1e-6)


def test_no_candidate_names_the_field_and_the_worst_point():
    with pytest.raises(ConfigError, match=r"no tau_c up to 8.0 x theta meets GM >= 30.*worst failing point delay_factor \d.*GM \d") as e:
        _pure_delay_search(gm_floor=30.0, field="my_loop.envelope")
    assert e.value.field == "my_loop.envelope"


@pytest.mark.parametrize("kw,field", [({"tau_c_factors": ()}, "tuning.tau_c_factors"),
                                      ({"tau_c_factors": (1.0, -2.0)}, "tuning.tau_c_factors[1]")])
def test_bad_candidates_are_config_errors(kw, field):
    with pytest.raises(ConfigError) as e:
        _pure_delay_search(**kw)
    assert e.value.field == field


def test_a_saturation_on_a_stable_loop_predicts_no_cycle():
    """-1/N(A) of a saturation lies on (-inf, -1]; the tuned loop's GM > 1 keeps L(jw) off it."""
    t = _pure_delay_search(nonlinearity=control.saturation_nonlinearity(1.0))
    assert t.limit_cycle is None


def test_result_as_table_dict_and_plot():
    t = _pure_delay_search()
    df = t.to_pandas()
    assert list(df["delay_factor"]) == [0.5, 1.0, 2.0]
    assert {"gain_margin", "phase_margin_deg", "delay_margin_s", "stable", "meets_floors"} <= set(df.columns)
    d = t.to_dict()
    assert d["envelope_ok"] and d["tau_c_over_theta"] == 2.0 and d["nominal"]["stable"]
    ax = t.plot()
    assert ax.get_xlabel() == "|phase margin| (deg)" and len(ax.collections) == 3


def test_the_four_tuners_go_through_it(monkeypatch):
    """Every SIMC tuner of the project calls simc_search (one search, not four copies)."""
    import tokenfactory.controllers.autotune as autotune
    import tokenfactory.controllers.batch_gate as batch_gate
    import tokenfactory.controllers.separation as separation
    import tokenfactory.controllers.slo_admission as slo_admission

    from tokenfactory.scenario import load_scenario
    from tokenfactory.studies.feedback_oscillation import scenario_path

    plant = load_scenario(scenario_path("smoothed")).plant  # loading tunes too: before counting
    calls = []
    for mod in (autotune, batch_gate, separation, slo_admission):
        real = mod.simc_search
        monkeypatch.setattr(mod, "simc_search",
                            lambda *a, _m=mod.__name__, _r=real, **k: calls.append(_m) or _r(*a, **k))
    batch_gate.tune_batch_gate(0.5, 0.09)
    slo_admission.tune_slo_admission(1.0, 2.5, 0.25)
    slo_admission.tune_margin_loop(40.0, 60.0)
    qc, f = separation.simc_queue_clear_s(300.0, 0.8)
    assert qc == pytest.approx((1.0 + f) * 300.0 / 0.8, rel=1e-15)
    autotune.tune_smoothed_admission(plant)
    assert [c.rsplit(".", 1)[1] for c in calls] == ["batch_gate", "slo_admission", "slo_admission", "slo_admission",
                                                     "separation", "autotune"]
