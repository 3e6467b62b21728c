"""Loop models of today's autoscalers: closed forms of the linear part, the relay cycle checked
against the pool model, the start-up cascade, and the certificate's verdicts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tokenfactory.controllers.autoscaler_loops import (
    PoolOperatingPoint,
    autoscaler_loop,
    autoscaler_margins,
    certify_autoscaler,
    predict_autoscaler_cycle,
    predict_startup_cascade,
)
from tokenfactory.controllers.autoscaling import HorizontalPodAutoscaler, KnativeAutoscaler
from tokenfactory.core.errors import ConfigError

MU = 11.0          # one decode worker's requests/s (the small plant's, rounded)
SLOTS = 328.0


def point(demand_rps, startup_s=105.0, delay_s=0.5):
    return PoolOperatingPoint(MU, demand_rps, delay_s, startup_s, SLOTS, SLOTS / MU)


def test_queue_metric_linear_part_is_an_integrator_behind_the_delay():
    hpa = HorizontalPodAutoscaler("decode", 2.0, "decode_waiting", max_replicas=4)
    loop = autoscaler_loop(hpa, point(16.0))
    k = MU / 2.0
    assert loop.delay_s == pytest.approx(0.5 + 15.0 / 2 + 105.0)
    m = autoscaler_margins(loop)
    # integrator k/s behind theta: stable iff k theta < pi/2; here k theta >> pi/2
    assert k * loop.delay_s > math.pi / 2 and not m.stable
    # a target large enough for k theta = pi/4 has GM 2 (closed form pi / (2 k theta))
    big = HorizontalPodAutoscaler("decode", MU * loop.delay_s / (math.pi / 4), "decode_waiting", max_replicas=4)
    m2 = autoscaler_margins(autoscaler_loop(big, point(16.0)))
    assert m2.stable and m2.gain_margin == pytest.approx(2.0, rel=1e-3)
    assert m2.phase_margin_deg == pytest.approx(45.0, abs=0.1)


def test_kpa_on_concurrency_over_serving_workers_has_no_compounding_loop():
    kpa = KnativeAutoscaler("decode", 0.7 * SLOTS, "decode_utilization", max_replicas=8)
    assert autoscaler_loop(kpa, point(16.0)).linear() is None
    assert autoscaler_margins(autoscaler_loop(kpa, point(16.0))) is None


def test_no_cycle_when_the_floor_carries_the_demand():
    hpa = HorizontalPodAutoscaler("decode", 2.0, "decode_waiting", max_replicas=4)
    assert predict_autoscaler_cycle(autoscaler_loop(hpa, point(0.5 * MU))) is None
    held = HorizontalPodAutoscaler("decode", 2.0, "decode_waiting", min_replicas=2, max_replicas=4)
    assert predict_autoscaler_cycle(autoscaler_loop(held, point(1.45 * MU))) is None


def test_utilisation_metric_holds_the_larger_pool():
    hpa = HorizontalPodAutoscaler("decode", 0.7, "kv_occupancy", max_replicas=4)
    assert predict_autoscaler_cycle(autoscaler_loop(hpa, point(1.45 * MU))) is None


@pytest.mark.parametrize("stabilization_s", [300.0, 60.0])
def test_relay_cycle_matches_the_pool_model(stabilization_s, fp):
    """The queue-length HPA at 1.45 workers of demand flaps 1 -> 4 -> 1 in the pool model with the
    period the piecewise cycle predicts (within 20 %) and the peak it predicts."""
    from tokenfactory.plant_models.fleet import PoolDynamics
    from tokenfactory.plant_models.pools import PoolScenario, simulate_pools

    params = fp
    mu = params.decode_capacity(1)
    hpa = HorizontalPodAutoscaler("decode", 2.0, "decode_waiting", max_replicas=4,
                                  downscale_stabilization_s=stabilization_s)
    lam = 1.45 * mu
    fill = math.ceil(2 * lam / params.fill_rate_per_worker)   # the fill pool never limits
    res = simulate_pools(params, fill, 1, PoolScenario(lam, 4 * 3600.0, dt=1.0, poisson=False, control_start_s=60.0),
                         controllers=[hpa], dynamics=PoolDynamics(startup_s=90.0, warmup_s=30.0))
    s = res.series
    n = s["decode_workers"].to_numpy()
    t = s["time_s"].to_numpy()
    ups = t[1:][(np.diff(n) > 0) & (n[:-1] == n.min())]
    simulated_period = float(np.diff(ups[1:]).mean())
    pt = PoolOperatingPoint(mu, lam, params.measurement_delay_s, 90.0 + 15.0, params.decode_slots_per_worker,
                            params.decode_slots_per_worker / mu)
    cycle = predict_autoscaler_cycle(autoscaler_loop(hpa, pt))
    assert cycle is not None
    assert cycle.period_s == pytest.approx(simulated_period, rel=0.2)
    assert (cycle.low_replicas, cycle.high_replicas) == (int(n[len(n) // 2:].min()), int(n[len(n) // 2:].max()))


def test_cascade_compounds_over_starting_workers_only_when_they_count():
    hpa = HorizontalPodAutoscaler("decode", 0.5, "decode_utilization", max_replicas=64, starting_unready=False)
    kpa = KnativeAutoscaler("decode", 0.5 * SLOTS, "decode_concurrency", max_replicas=64)
    pt = point(3.0 * MU, startup_s=300.0)
    # starting pods at the serving average: current (starting included) x saturated utilisation /
    # target, every 15 s for 300 s
    assert predict_startup_cascade(autoscaler_loop(hpa, pt), 1) == 64
    # upstream's replica calculator (the default) counts them at 0: one ask, ceil(1 x 1 / 0.5)
    upstream = HorizontalPodAutoscaler("decode", 0.5, "decode_utilization", max_replicas=64)
    assert predict_startup_cascade(autoscaler_loop(upstream, pt), 1) == 2
    # KPA divides the metric total by its target: it asks for what it sees, however long the start-up
    assert predict_startup_cascade(autoscaler_loop(kpa, pt), 1) <= 64
    cert = certify_autoscaler(hpa, pt)
    assert not cert.passed and not cert.overshoot_bounded
    assert "asks for up to 64" in cert.summary()


def test_cascade_honours_policy_periods_and_the_upscale_window():
    """The policies' own periods and the scale-up window bound the start-up cascade as the HPA
    applies them (the limit is the HPA's own, ``hpa_policy_limit``)."""
    pt = point(3.0 * MU, startup_s=300.0)
    kw = dict(max_replicas=64, starting_unready=False)
    # one pod per 60 s, syncs every 15 s over the 300 s start-up: scale-ups at 15, 90, 165, 240, 300 s
    slow = HorizontalPodAutoscaler("decode", 0.5, "decode_utilization", scale_up_policies=(("pods", 1, 60.0),), **kw)
    assert predict_startup_cascade(autoscaler_loop(slow, pt), 1) == 6
    fast = HorizontalPodAutoscaler("decode", 0.5, "decode_utilization", **kw)
    windowed = HorizontalPodAutoscaler("decode", 0.5, "decode_utilization", upscale_stabilization_s=120.0, **kw)
    loop = autoscaler_loop(windowed, pt)
    assert loop.delay_s == pytest.approx(autoscaler_loop(fast, pt).delay_s + 120.0)
    # the recommendation from before the step holds the pool for 120 s, then each doubling waits for
    # the window to forget the last lower one: 1 -> 2 at 135 s, 4 at 270 s, 8 at 405 s (horizon 420 s)
    assert predict_startup_cascade(loop, 1) == 8


def test_certificate_passes_a_held_utilisation_setting():
    hpa = HorizontalPodAutoscaler("decode", 0.7, "kv_occupancy", min_replicas=2, max_replicas=4,
                                  scale_up_pods=1, scale_up_percent=0.0)
    cert = certify_autoscaler(hpa, point(1.45 * MU))
    assert cert.predicted_cycle is None and cert.overshoot_bounded and cert.passed
    d = cert.to_dict()
    assert d["passed"] and d["predicted_cycle"] is None and d["workers_needed"] == pytest.approx(1.45)


def test_operating_point_validates():
    with pytest.raises(ConfigError) as err:
        PoolOperatingPoint(0.0, 1.0, 1.0, 1.0)
    assert err.value.field == "operating_point.per_worker_rps"


def test_a_pool_pinned_at_floor_equal_ceiling_closes_no_loop():
    """min = max replicas: the rule cannot move the pool, so the certificate reports no margins (not
    the integrator's, which would call an immovable pool unstable) and passes iff the pool carries."""
    free = certify_autoscaler(HorizontalPodAutoscaler("decode", 2.0, "decode_waiting", max_replicas=4), point(3.3))
    assert free.margins is not None and not free.stable
    pinned = certify_autoscaler(HorizontalPodAutoscaler("decode", 2.0, "decode_waiting", min_replicas=4,
                                                        max_replicas=4), point(3.3))
    d = pinned.to_dict()
    assert pinned.pinned and pinned.margins is None and pinned.stable and pinned.passed
    assert d["gain_margin"] is None and d["loop"] == "pinned pool" and "floor = ceiling" in d["linear_part"]
    assert "pinned at 4 workers" in pinned.summary()
    short = certify_autoscaler(HorizontalPodAutoscaler("decode", 2.0, "decode_waiting", min_replicas=2,
                                                       max_replicas=2), point(3.0 * MU))
    assert short.pinned and not short.passed and not short.ceiling_carries
