"""Dynamo's SLA-mode decode load scaling before and after ai-dynamo PR #9294
(``controllers/dynamo_sla_scaling.py``): the rule's decisions and the cycle prediction."""

from __future__ import annotations

import pytest

from tokenfactory.controllers.dynamo_sla_scaling import DynamoSLALoadScaling, itl_estimate, predict_sla_scaling_cycle
from tokenfactory.core.errors import ConfigError

S = 100.0


def pass_s(batch: float) -> float:
    """A concave pass time capped at the slots: 20 ms + 80 ms x sqrt(batch / S)."""
    return 0.020 + 0.080 * (min(batch, S) / S) ** 0.5


def test_estimate_follows_the_plant_then_its_upper_secant():
    est = itl_estimate(pass_s, S)
    assert est(50.0) == pytest.approx(pass_s(50.0))
    slope = (pass_s(S) - pass_s(S / 2)) / (S / 2)
    assert est(3 * S) == pytest.approx(pass_s(S) + slope * 2 * S)


@pytest.mark.parametrize("aware, batch, expected", [
    # the PR's case: 2 workers well under 80 % of the SLA each
    (False, 0.3 * S, 1),     # before: released (the survivor would hold 0.6 S at ~82 ms > 0.8 x 100 ms)
    (True, 0.3 * S, 2),      # after: the survivors' load 0.6 S reaches 80 % of the SLA: refused
    (True, 0.1 * S, 1),      # after: 0.2 S at ~56 ms is within it: released
    (True, 0.6 * S, 2),      # after: 1.2 S does not fit the cache: refused
    (False, 2.0 * S, 3),     # either: over the SLA on every worker: +1
])
def test_scale_down_before_and_after_the_fix(aware, batch, expected):
    rule = DynamoSLALoadScaling(0.100, pass_s, S, consolidation_aware=aware)
    assert rule.recommend(2, batch) == expected


def test_flat_rule_cycles_and_the_fix_holds():
    # demand = one worker's rate: 2 workers at 0.5 S each (ITL 77 ms, under 80 ms) release one, whose
    # 1.0 S + the released work's queue is over the SLA at once
    mu = 10.0
    flat = DynamoSLALoadScaling(0.100, pass_s, S, consolidation_aware=False)
    cycle = predict_sla_scaling_cycle(flat, 2, 1.0 * mu, mu, 60.0)
    assert cycle is not None and (cycle.low_replicas, cycle.high_replicas) == (1, 2)
    assert cycle.period_s == pytest.approx(sum(cycle.phases_s.values()))
    assert cycle.phases_s["start_up"] == 60.0
    fixed = DynamoSLALoadScaling(0.100, pass_s, S, consolidation_aware=True)
    assert predict_sla_scaling_cycle(fixed, 2, 1.0 * mu, mu, 60.0) is None
    # a lower sensitivity keeps the flat rule from releasing at all
    low = DynamoSLALoadScaling(0.100, pass_s, S, consolidation_aware=False, sensitivity=0.5)
    assert predict_sla_scaling_cycle(low, 2, 1.0 * mu, mu, 60.0) is None


def test_bad_values_are_named():
    with pytest.raises(ConfigError, match="dynamo_sla.sensitivity"):
        DynamoSLALoadScaling(0.1, pass_s, S, sensitivity=1.5)
    with pytest.raises(ConfigError, match="dynamo_sla.itl_s"):
        DynamoSLALoadScaling(0.0, pass_s, S)
