import control
import numpy as np
import pytest
import scipy.signal as sps

from tokenfactory.controllers import assess, autocorrelation, decay_ratio, first_harmonic_amplitude, thornhill_regularity
from tokenfactory import ConfigError

DT = 0.1
N = 3000
T = np.arange(N) * DT


def _noise(seed):
    return np.random.default_rng(seed).standard_normal(N)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("snr_amp", [1.0, 2.0])
def test_sine_plus_noise_is_flagged(seed, snr_amp):
    x = snr_amp * np.sin(2 * np.pi * T / 12.0) + 0.5 * _noise(seed)
    rep = assess(x, DT)
    assert rep.oscillating, str(rep)
    assert rep.period_s == pytest.approx(12.0, rel=0.1)
    assert rep.harmonic_amplitude == pytest.approx(snr_amp, rel=0.1)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_white_noise_is_not_flagged(seed):
    rep = assess(_noise(seed), DT)
    assert not rep.oscillating, str(rep)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kind", ["ar1", "lowpass"])
def test_coloured_noise_is_not_flagged(seed, kind):
    e = _noise(seed)
    if kind == "ar1":
        x = sps.lfilter([1.0], [1.0, -0.95], e)
    else:
        b, a = sps.butter(2, 0.05)
        x = sps.lfilter(b, a, e)
    rep = assess(x, DT)
    assert not rep.oscillating, str(rep)


def _loop_output(zeta, seed):
    # closed loop response to noise: a well-damped loop (zeta 0.7) vs a marginal one (zeta 0.03)
    G = control.tf([1.0], [1.0, 2 * zeta, 1.0])
    _, y = control.forced_response(G, T, _noise(seed))
    return y


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_well_tuned_loop_under_noise_is_not_flagged(seed):
    rep = assess(_loop_output(0.7, seed), DT)
    assert not rep.oscillating, str(rep)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_marginal_loop_is_flagged(seed):
    rep = assess(_loop_output(0.03, seed), DT)
    assert rep.oscillating, str(rep)
    assert rep.period_s == pytest.approx(2 * np.pi, rel=0.15)


def test_indices_on_a_pure_sine():
    x = np.sin(2 * np.pi * T / 10.0)
    acf = autocorrelation(x - x.mean())
    r, period = thornhill_regularity(acf, DT)
    assert r > 10 and period == pytest.approx(10.0, rel=0.02)
    assert decay_ratio(acf) > 0.9
    assert first_harmonic_amplitude(x, DT, 10.0) == pytest.approx(1.0, rel=0.01)


def test_small_ripple_is_ignored_and_bad_input_rejected():
    x = 1e-3 * np.sin(2 * np.pi * T / 10.0) + 100.0
    assert not assess(x, DT, min_amplitude=0.1).oscillating
    with pytest.raises(ConfigError, match="signal"):
        assess(np.array([1.0, np.nan] * 20), DT)
    with pytest.raises(ConfigError, match="signal"):
        assess(np.zeros(5), DT)
    with pytest.raises(ConfigError, match="dt"):
        assess(np.zeros(100), 0.0)


# --------------------------------------------------------------------------------------------
# judge_actuators: the verdict every result reports

from pathlib import Path  # noqa: E402

import pandas as pd  # noqa: E402

from tokenfactory.controllers import (  # noqa: E402
    CHURN_MIN_REVERSALS,
    CHURN_REVERSALS_PER_HOUR,
    FORCED_COHERENCE,
    forced_response,
    judge_actuators,
)

SMALL_PLANT = Path(__file__).parent / "data" / "small_plant"


def _pools_series(t, decode, fill=None, **cols):
    n = len(t)
    return pd.DataFrame({"time_s": t, "fill_workers": np.ones(n) if fill is None else fill,
                         "fill_workers_starting": np.zeros(n), "decode_workers": decode,
                         "decode_workers_starting": np.zeros(n), **cols})


def _scale_log(t, x, pool="decode"):
    """Scale actions wherever the pool size changes."""
    k = np.nonzero(np.diff(x))[0] + 1
    return [{"time_s": t[i], "kind": "scale", "pool": pool, "from": x[i - 1], "to": x[i]} for i in k]


def test_recorded_small_plant_flapping_is_judged_oscillating_and_churning():
    """Issue 21's small plant as main b2c20fa's hysteretic controller ran it (decode 2 -> 1 -> 2
    every 5 s from t = 125 s; metrics.json then said oscillating: false): the verdict on its
    recorded series and actions flags the decode pool's cycle and the churn."""
    s = pd.read_csv(SMALL_PLANT / "unfixed_hysteretic_series.csv")
    a = pd.read_csv(SMALL_PLANT / "unfixed_hysteretic_actions.csv")
    v = judge_actuators(s, a, start_s=0.1 * s["time_s"].iloc[-1],
                        buffer_amplitudes={"ready": 1.0, "fill_queued_tokens": 2048.0})
    assert v.oscillating and v.churning, v.reason
    assert "decode_pool" in v.oscillating_signals
    assert v.signals["decode_pool"]["period_s"] == pytest.approx(10.0, rel=0.1)  # 2 -> 1 -> 2 every 5 s
    assert v.reversals > 100 and v.reversals_per_hour > 100 * CHURN_REVERSALS_PER_HOUR
    assert v.signals["fill_pool"]["reason"] == "never moved in the window"  # the fill pool never moved
    assert set(v.signals) >= {"fill_pool", "decode_pool", "batch_cap", "reservation", "admission_rate", "ready",
                              "fill_queue"}
    # with the offered demand beside it (the case's arrivals per sample, as the simulator records
    # arrival_rate), the 10-s flapping is not the input's: still self-sustained, the same verdict
    arrivals = pd.read_csv(SMALL_PLANT / "requests.csv")["arrival_s"].to_numpy()
    t = s["time_s"].to_numpy()
    edges = np.r_[t[0] - (t[1] - t[0]), t]
    s = s.assign(arrival_rate=np.histogram(arrivals, bins=edges)[0] / np.diff(edges))
    w = judge_actuators(s, a, start_s=0.1 * s["time_s"].iloc[-1],
                        buffer_amplitudes={"ready": 1.0, "fill_queued_tokens": 2048.0})
    assert w.oscillating and w.churning and w.oscillating_signals == v.oscillating_signals, w.reason
    assert w.signals["decode_pool"]["forced"] is False and w.signals["decode_pool"]["coherence"] < FORCED_COHERENCE


def test_irregular_flapping_is_churn_not_a_cycle():
    """A pool that moves up and down at random intervals has no period for the regular-cycle
    detectors; the churn bound catches it."""
    rng = np.random.default_rng(3)
    t = np.arange(0.0, 7200.0, 1.0)
    x = np.ones_like(t)
    edges = np.sort(rng.choice(len(t), 40, replace=False))
    for i, e in enumerate(edges):
        x[e:] = 2.0 if i % 2 == 0 else 1.0
    v = judge_actuators(_pools_series(t, x), _scale_log(t, x))
    assert v.churning and v.oscillating, v.reason
    assert v.reversals == 39 and v.reversals_per_hour == pytest.approx(39 / (t[-1] / 3600.0))
    assert not v.signals["decode_pool"]["oscillating"]  # no regular cycle: only churn says it


@pytest.mark.parametrize("reversals", [0, 1, CHURN_MIN_REVERSALS])
def test_a_few_followed_bursts_are_not_churn(reversals):
    """Following a burst up and back down is a reversal or two, not churn, even in a short run."""
    t = np.arange(0.0, 720.0, 0.5)
    x = np.ones_like(t)
    for i in range(reversals + 1):
        x[t >= 100.0 + 150.0 * i] = 2.0 if i % 2 == 0 else 1.0
    v = judge_actuators(_pools_series(t, x), _scale_log(t, x))
    assert not v.oscillating and v.reversals == reversals, v.reason


def test_every_actuator_is_judged():
    """A cycling batch cap or admission rate is caught even when the pools and buffers hold; an
    open admission (inf) counts as its largest finite command."""
    t = np.arange(0.0, 1200.0, 0.5)
    cap = 64 + 16 * np.sign(np.sin(2 * np.pi * t / 30.0))
    rate = np.where(np.sin(2 * np.pi * t / 40.0) > 0, np.inf, 2.0)
    s = _pools_series(t, np.full_like(t, 2.0), decode_batch_cap=cap, admission_rate=rate)
    v = judge_actuators(s, [])
    assert v.oscillating and not v.churning
    assert set(v.oscillating_signals) == {"batch_cap", "admission_rate"}
    assert v.signals["decode_pool"]["reason"] == "never moved in the window"
    # a quiet run: a ripple below 10 % of the cap's level is not a cycle
    quiet = _pools_series(t, np.full_like(t, 2.0), decode_batch_cap=64 + 2 * np.sin(2 * np.pi * t / 30.0))
    assert not judge_actuators(quiet, []).oscillating


def test_a_reservation_is_rebuilt_from_its_actions():
    t = np.arange(0.0, 1200.0, 0.5)
    acts = [{"time_s": float(k * 15.0), "kind": "reserve", "fill_share": 0.4 if k % 2 else 0.1}
            for k in range(80)]
    v = judge_actuators(_pools_series(t, np.full_like(t, 2.0)), acts)
    assert v.oscillating_signals == ["reservation"]
    assert v.signals["reservation"]["period_s"] == pytest.approx(30.0, rel=0.1)


def test_small_corrections_of_a_large_pool_are_not_churn():
    """A pool of ~190 workers following its demand reverses by a worker or two many times an hour
    (0.5-1 % of its capacity, the stack's mixed day); a reversal of a tenth of the pool is churn."""
    t = np.arange(0.0, 7200.0, 2.0)
    rng = np.random.default_rng(5)
    flips = np.sort(rng.choice(len(t), 60, replace=False))  # +1 / -1 at irregular times: 59 reversals
    step = np.zeros_like(t)
    for i, k in enumerate(flips):
        step[k:] = 1.0 if i % 2 == 0 else 0.0
    v = judge_actuators(_pools_series(t, 190 + step), _scale_log(t, 190 + step))
    assert v.reversals == 59 and not v.churning and not v.oscillating, v.reason
    big = 190 + 30 * step  # the same moves, 30 workers each
    v = judge_actuators(_pools_series(t, big), _scale_log(t, big))
    assert v.churning and v.pool_reversals == {"decode": 59}, v.reason


def test_a_pool_that_follows_its_demands_turns_is_not_churning():
    """Reversals where the demand itself turns (its 10-minute mean moving back by a tenth) are
    following, not churn; the same moves without such a demand are churn."""
    t = np.arange(0.0, 4 * 3600.0, 10.0)
    # the demand steps between two levels at irregular times, 12-24 minutes apart
    edges = np.cumsum(np.random.default_rng(2).uniform(720.0, 1440.0, 40))
    high = np.searchsorted(edges, t) % 2 == 1
    demand = np.where(high, 130.0, 100.0)
    pool = np.where(np.roll(high, 30), 14.0, 11.0)  # the pool follows five minutes later
    pool[:30] = 11.0
    acts = _scale_log(t, pool)
    v = judge_actuators(_pools_series(t, pool, demand=demand), acts, start_s=0.0)
    assert v.pool_reversals["decode"] / 4.0 > CHURN_REVERSALS_PER_HOUR  # above the bound by itself
    assert not v.churning, v.reason
    v = judge_actuators(_pools_series(t, pool), acts, start_s=0.0)
    assert v.churning, v.reason


# --------------------------------------------------------------------------------------------
# forced response vs self-sustained cycle

HOURS_6 = np.arange(0.0, 6 * 3600.0, 1.0)


def _relay_pool(demand, dt=1.0, delay_s=30.0, per_worker=10.0, n0=10):
    """A pool under a relay on its queue, sampled every 10 s and measured ``delay_s`` late: the
    relay-feedback limit cycle (Astrom & Hagglund 1984), whatever the input does."""
    n = np.empty(len(demand))
    queue, seen, cur, k = 0.0, np.zeros(len(demand)), n0, int(delay_s / dt)
    for i, d in enumerate(demand):
        queue = max(queue + (d - per_worker * cur) * dt, 0.0)
        seen[i] = queue
        if i % 10 == 0:
            cur = max(1, cur + (1 if i >= k and seen[i - k] > 0 else -1))
        n[i] = cur
    return n


def _with_demand(t, pool, demand):
    return _pools_series(t, pool, demand=demand), _scale_log(t, pool)


def test_a_pool_driven_by_a_sinusoidal_demand_is_a_forced_response():
    """A feed-forward pool that follows a sinusoidal demand a minute late cycles at the demand's
    period, phase-locked to it: forced, reported with the input's period, not oscillating."""
    rng = np.random.default_rng(1)
    clean = 100.0 + 30.0 * np.sin(2 * np.pi * HOURS_6 / 1800.0)
    pool = np.ceil(np.r_[np.full(60, clean[0]), clean[:-60]] / 10.0)
    s, a = _with_demand(HOURS_6, pool, clean + rng.normal(0.0, 2.0, len(HOURS_6)))
    v = judge_actuators(s, a, step_s=5.0)
    d = v.signals["decode_pool"]
    assert d["forced"] and not d["oscillating"] and not v.oscillating, v.reason
    assert d["input_period_s"] == pytest.approx(1800.0, rel=0.05)
    assert d["coherence"] >= max(FORCED_COHERENCE, d["coherence_threshold"])
    assert "forced responses (not counted): decode_pool" in v.reason
    # the detectors alone call the same cycle oscillating: without an input it counts
    blind = judge_actuators(s, a, step_s=5.0, exogenous=None)
    assert blind.oscillating and blind.signals["decode_pool"]["oscillating"]


@pytest.mark.parametrize("input_period_s", [None, 3600.0])
def test_a_relay_limit_cycle_is_self_sustained_under_any_input(input_period_s):
    """A relay loop's limit cycle (period ~220 s) under a constant (noisy) demand, and under a
    demand cycling hourly: incoherent with the input at the cycle's period, so oscillating."""
    rng = np.random.default_rng(2)
    demand = 100.0 + rng.normal(0.0, 2.0, len(HOURS_6))
    if input_period_s:
        demand += 20.0 * np.sin(2 * np.pi * HOURS_6 / input_period_s)
    pool = _relay_pool(demand)
    v = judge_actuators(*_with_demand(HOURS_6, pool, demand), step_s=5.0)
    d = v.signals["decode_pool"]
    assert v.oscillating and d["oscillating"] and d["forced"] is False, v.reason
    assert 150.0 < d["period_s"] < 300.0
    assert d["coherence"] < 0.1 and "self-sustained" in d["reason"]
    # no input is named as forcing a cycle the test did not find forced
    assert d["forced_by"] is None and d["tested_against"], d


def test_forced_response_needs_two_segments_and_a_moving_input():
    t = np.arange(0.0, 3000.0, 10.0)
    x = np.sin(2 * np.pi * t / 1000.0)
    short = forced_response(x, x, 10.0, 1000.0)  # 3000 s < two 4-period segments
    assert not short["forced"] and short["segments"] == 0 and "not determinable" in short["why"]
    assert not forced_response(x, np.ones_like(x), 10.0, 1000.0)["forced"]
    long_t = np.arange(0.0, 40000.0, 10.0)
    y = np.sin(2 * np.pi * long_t / 1000.0)
    ok = forced_response(y, np.roll(y, 7), 10.0, 1000.0)  # a lagged copy: coherence 1
    assert ok["forced"] and ok["coherence"] == pytest.approx(1.0, abs=1e-6) and ok["segments"] == 10
    # Carter's level for K = 10 segments is 1 - 0.01^(1/9) = 0.40: the 0.5 floor binds
    assert ok["coherence_threshold"] == pytest.approx(FORCED_COHERENCE)
