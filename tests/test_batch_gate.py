"""The gated decode batch cap (controllers/batch_gate.py): its hold-until-observed rule, its
resting at the cap's resolution, its margins and the ungated rule's describing-function cycle."""

import dataclasses

import pytest

from tokenfactory.controllers import (
    BatchGate,
    BatchGateConfig,
    batch_gate_loop,
    predict_batch_cycle,
    stability_margins,
    tune_batch_gate,
)
from tokenfactory.core.signals import Measurement


def test_gate_margins_and_describing_function():
    t = tune_batch_gate(0.5, 0.09, check_ungated=True)
    assert t.envelope_ok and t.nominal.stable and t.nominal.gain_margin >= 2
    assert not t.ungated.stable and t.ungated_cycle is not None
    assert predict_batch_cycle(batch_gate_loop(t.gain, t.hold_s, t.theta_s), 1.0) is None
    # an integrator with delay: the Nyquist verdict flips where the theory says (k theta = pi/2)
    theta = 1.0
    assert stability_margins(batch_gate_loop(1.4, 1.0, theta)).stable
    assert not stability_margins(batch_gate_loop(1.7, 1.0, theta)).stable


def test_gate_holds_a_change_until_observed():
    cfg = BatchGateConfig(slo_tpot_s=0.1, max_batch=200, nominal_context_tokens=4000, tpot_fraction=0.9, gain=0.5,
                          sample_period=0.1)
    g = BatchGate(lambda b, c: 0.02 + 0.001 * b, cfg)
    assert g.cap == pytest.approx(70, abs=1)  # 0.02 + 0.001 B <= 0.09
    m = Measurement(time_s=10.0, backlog=0, fill_in_progress=0, ready=50, active_decodes=70, completion_rate=1,
                    admitted_rate=1, decode_slots=200, fill_capacity=10, decode_workers=1, decode_pass_s=0.12,
                    decode_context_tokens=4000)
    first = g.update(10.5, m).batch_per_worker
    assert first < 70  # the pass is slower than the model: the cap comes down
    # a measurement taken before the change can show it does not move the cap again
    assert g.update(10.6, dataclasses.replace(m, time_s=10.45)).batch_per_worker == first


@pytest.mark.parametrize("gated, most_changes", [(True, 2), (False, None)])
def test_gated_cap_rests_within_one_sequence_of_the_target(gated, most_changes):
    """A binding whole-sequence cap leaves the pass up to one sequence's step under the target;
    gated, that is the cap's resolution and the cap rests; the naive rule integrates it and toggles."""
    model = lambda b, c: 0.02 + 0.001 * b  # noqa: E731 - target 0.0905 s: 70.5 sequences, cap 70
    g = BatchGate(model, BatchGateConfig(slo_tpot_s=0.1, max_batch=200, nominal_context_tokens=4000,
                                         tpot_fraction=0.905, gain=0.5 if gated else 1.0, gated=gated,
                                         sample_period=0.1))
    caps = []
    for k in range(1, 600):
        t = 0.1 * k
        cap = g.cap  # the plant: the batch fills to the cap, the pass is the model's at it
        m = Measurement(time_s=t, backlog=0, fill_in_progress=0, ready=50, active_decodes=cap, completion_rate=1,
                        admitted_rate=1, decode_slots=200, fill_capacity=10, decode_workers=1,
                        decode_pass_s=model(cap, 4000), decode_context_tokens=4000)
        caps.append(g.update(t, m).batch_per_worker)
    if gated:
        assert g.changes <= most_changes and len(set(caps[50:])) == 1
        assert model(caps[-1], 4000) <= 0.0905  # the largest whole batch within the target
    else:
        assert len(set(caps[50:])) > 1  # toggles between neighbouring caps
