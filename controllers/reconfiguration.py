"""Pool reconfiguration without flapping: the hysteretic, pending-aware pool controller and the
describing-function analysis of reconfiguration loops.

Why today's autoscalers flap (what :func:`predict_pool_flapping` quantifies): a pool autoscaler
that sizes a pool from a *feedback* signal of that pool (its queue, its KV occupancy, its
utilisation) closes a loop whose plant is an integrator - the queue grows at (demand - n x per
worker rate) - behind the reconfiguration delay (start-up of minutes). Its decision rule is a
relay with hysteresis whose output is quantised to whole workers. Integrator + delay + hysteretic
relay always has a describing-function solution (the Nyquist curve of mu e^{-tau s}/s starts at
-j infinity and crosses every horizontal line -pi c / (4 b) of the hysteretic relay's -1/N(A)), so
whenever the demand lies between two whole-worker levels such a loop alternates between them: the
2 <-> 1 flapping under constant load. Counting only serving workers while new ones start adds the
cascade (each sync sees the same unmet demand and adds again).

:class:`HystereticPoolController` removes that loop at the operating point instead of detuning it:

* it sizes the pool from the pool's *demand rate* (arrivals at the orchestrator, smoothed by a
  first-order filter ``filter_s`` that starts as a running mean) divided by per-worker capacity
  at ``target_utilization``, plus a one-sided backlog term (queue / ``queue_clear_s``) capped at
  ``queue_headroom`` x demand;
* it counts workers still starting as capacity in transit (pending-aware), so it never asks twice
  for the same deficit and never exceeds ceil(demand x (1 + queue_headroom) / (per-worker rate x
  target_utilization)) - the demand-justified count. In transit means three things: workers the
  measurement shows starting; workers it commanded that a measurement older than the command
  cannot show yet (with a measurement delay of a sample period or more, re-asserting the stale
  count undoes every move - issue 21's small plant flapped 2 -> 1 -> 2 every 5 s); and the queue
  that builds while ordered workers start and warm up at reduced speed (the backlog term waits
  for the cooldown after a scale-up, then counts only a queue the spare capacity cannot clear
  within the start-up + warm-up: a worker ordered for less arrives after the queue is gone);
* dwell, cooldown and filter run on the measurement's own clock, so a dwell is confirmed by newer
  samples, not by the same delayed one read twice;
* it scales down from n to n - k only when the need is below n - k - ``dead_band``: the pool
  left after a scale-down still carries the demand with ``dead_band`` workers to spare, so no
  queue forms and nothing drives the relay back up. In describing-function terms the loop gain
  the relay sees at its switching points is zero (the queue is empty on both sides of the scale-
  down threshold), so 1 + N(A) L(jw) = 0 has no solution; only the demand itself and its noise
  can move the decision.

The rule for the defaults (:meth:`HystereticPoolController.tuned`): the dead band is
max(``min_dead_band``, z x sigma) where sigma is the standard deviation of the need signal (in
workers) at the operating point - for Poisson arrivals at rate lambda smoothed by a filter of
time constant T, sigma = sqrt(lambda / 2T) / (per-worker rate x target utilisation) - and z = 3,
so noise alone crosses the threshold on ~0.1 % of samples; the scale-down dwell is 3 T (a real
drop has passed 95 % through the filter, and a noise excursion must outlast three correlation
times); the cooldown after a move is the start-up plus warm-up time (the loop's dead time: a
decision is not revisited before the last one has taken effect). Scale-up is allowed after
``up_dwell_s`` (one sample by default) and at most ``max_step_up`` workers per decision;
scale-down removes at most ``max_step_down``.

What no feedback pool controller can do: serve a burst shorter than the measurement delay plus
the start-up. A worker ordered on the first sample that shows the burst serves after the burst's
last request is past its TTFT SLO, so the burst is carried by the workers serving at its onset -
the demand-justified count, sized for the demand seen so far. Issue 21's small plant (a 60 s 5x
burst, 5 s delay, 90 s start-up) meets its burst with 2 decode workers; its attainment is what
static 2 gets, and only capacity held before the burst (a floor, bought in GPU-hours) or a forecast
of the burst buys more (``tests/test_reconfiguration.py`` pins the numbers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import control

from tokenfactory.controllers.autoscaling import ScaleAction, serving_replicas, PoolAutoscaler
from tokenfactory.controllers.describing import LimitCycle, predict_limit_cycles
from tokenfactory.controllers.stability import DelayedLoop
from tokenfactory.core.signals import Measurement
from tokenfactory.core.validation import ConfigError, check_fields, check_int, check_number, config_or_fields, setting

__all__ = ["HystereticConfig", "HystereticPoolController", "QueueRelayScaler", "pool_relay_loop", "predict_pool_flapping",
           "need_noise_std", "measured_need_noise", "pool_demand"]


def pool_demand(m: Measurement, pool: str) -> tuple[float, float]:
    """(demand rate into ``pool``, requests queued for it) as a controller can measure them.

    Both pools: the arrival rate at the orchestrator (the admitted rate if the plant does not
    report arrivals) - every arrival would need a fill and a decode slot, and behind an admission
    layer that rejects or defers the admitted rate saturates at what the pools carry now and
    would hide the demand the pools should grow for (the planned controller's rule too). Queue:
    fill, the backlog plus fill work in progress; decode, the ready buffer (requests waiting for
    a slot).

    Parameters
    ----------
    m : Measurement
        The (delayed) sample of the plant.
    pool : {"fill", "decode"}
        The pool; any value other than ``"fill"`` is read as decode (not validated here: the
        controllers validate their pool).

    Returns
    -------
    rate : float
        Demand rate into the pool (requests/s).
    queue : float
        Requests waiting for the pool (requests).
    """
    rate = m.arrival_rate if math.isfinite(m.arrival_rate) else m.admitted_rate
    if pool == "fill":
        return rate, m.backlog + m.fill_in_progress
    return rate, m.ready


def _check_worker_rate(per_worker_rps: float, target_utilization: float) -> None:
    check_number("per_worker_rps", per_worker_rps, low=0.0, low_inclusive=False)
    check_number("target_utilization", target_utilization, low=0.0, high=1.0, low_inclusive=False)


def need_noise_std(rate_rps: float, per_worker_rps: float, target_utilization: float, filter_s: float) -> float:
    """Standard deviation (workers) of the filtered need signal for Poisson arrivals at ``rate_rps``:
    a first-order filter of time constant T passes variance lambda / (2 T) of a Poisson rate.

    Used by :meth:`HystereticPoolController.tuned` to size the dead band (z sigma).

    Parameters
    ----------
    rate_rps : float
        Poisson arrival rate lambda into the pool (requests/s, >= 0).
    per_worker_rps : float
        Requests/s one worker sustains (> 0).
    target_utilization : float
        Fraction of per-worker capacity planned for (in (0, 1]).
    filter_s : float
        Time constant T of the controller's first-order rate filter (s, > 0).

    Returns
    -------
    float
        sqrt(lambda / (2 T)) / (per_worker_rps x target_utilization), in workers.

    Raises
    ------
    ConfigError
        For a negative ``rate_rps``, a non-positive ``filter_s`` or ``per_worker_rps``, or a
        ``target_utilization`` outside (0, 1].
    """
    check_number("rate_rps", rate_rps, low=0.0)
    check_number("filter_s", filter_s, low=0.0, low_inclusive=False)
    _check_worker_rate(per_worker_rps, target_utilization)
    return math.sqrt(rate_rps / (2.0 * filter_s)) / (per_worker_rps * target_utilization)


def measured_need_noise(arrival_times_s, per_worker_rps: float, target_utilization: float, filter_s: float, *,
                        sample_period: float = 5.0, detrend_s: float = 900.0) -> float:
    """Standard deviation (workers) of the need signal the controller would see on a measured
    arrival stream: counts scraped every ``sample_period``, filtered as the controller filters
    them (first order, ``filter_s``), minus a centred ``detrend_s`` moving average (the demand's
    own slow movement is what the controller should follow, not noise). Bursty traffic (index of
    dispersion > 1) gives more than the Poisson figure of :func:`need_noise_std`.

    Parameters
    ----------
    arrival_times_s : array_like of float
        Arrival times into the pool (s; any order, at least two, finite), spanning at least
        3 x ``detrend_s``.
    per_worker_rps : float
        Requests/s one worker sustains (> 0).
    target_utilization : float
        Fraction of per-worker capacity planned for (in (0, 1]).
    filter_s : float
        Time constant of the controller's first-order rate filter (s, > 0).
    sample_period : float
        Scrape interval the counts are binned at (s, > 0; default 5).
    detrend_s : float
        Width of the centred moving average removed as the demand's trend (s, >= 2 x
        ``sample_period``; default 900).

    Returns
    -------
    float
        Standard deviation of the detrended filtered need (workers), measured away from the
        moving average's edges.

    Raises
    ------
    ConfigError
        For ``per_worker_rps``, ``target_utilization``, ``sample_period``, ``filter_s`` or
        ``detrend_s`` outside its range, or (field ``arrival_times_s``) fewer than two finite
        arrivals or a span under 3 x ``detrend_s``.
    """
    import numpy as np

    _check_worker_rate(per_worker_rps, target_utilization)
    check_number("sample_period", sample_period, low=0.0, low_inclusive=False)
    check_number("filter_s", filter_s, low=0.0, low_inclusive=False)
    check_number("detrend_s", detrend_s, low=2 * sample_period)
    t = np.sort(np.asarray(arrival_times_s, dtype=float))
    if t.size < 2 or not np.all(np.isfinite(t)):
        raise ConfigError("arrival_times_s", "needs at least two finite arrival times")
    n_bins = int((t[-1] - t[0]) // sample_period)
    window = int(round(detrend_s / sample_period))
    if n_bins < 3 * window:
        raise ConfigError("arrival_times_s", f"spans {t[-1] - t[0]:.0f} s; needs at least 3 x detrend_s = "
                          f"{3 * detrend_s:.0f} s")
    counts = np.bincount(((t - t[0]) // sample_period).astype(int), minlength=n_bins)[:n_bins]
    rates = counts / sample_period
    a = 1.0 - math.exp(-sample_period / filter_s)
    filt = np.empty_like(rates)
    acc = rates[0]
    for i, r in enumerate(rates):
        acc += a * (r - acc)
        filt[i] = acc
    trend = np.convolve(filt, np.ones(window) / window, mode="same")
    core = slice(window, n_bins - window)  # away from the edges of the moving average
    return float(np.std((filt - trend)[core]) / (per_worker_rps * target_utilization))


@dataclass(frozen=True, kw_only=True)
class HystereticConfig:
    """The tuning of a :class:`HystereticPoolController` (validated here, fields named
    ``hysteretic.FIELD``; :meth:`HystereticPoolController.tuned` derives the dead band, dwell and
    cooldown from the operating point). The defaults are declared here only; every field is
    keyword-only (:class:`~tokenfactory.controllers.planning.PlannedPoolConfig` extends it).

    Parameters
    ----------
    target_utilization : float
        Fraction of per-worker capacity to plan for, in [0.1, 1] (default 0.85).
    dead_band : float
        Spare workers (in [0, 10]; default 0.5) the need must clear below n - 1 before a
        scale-down, and that are kept above the need after it.
    filter_s : float
        Time constant of the first-order filter on the demand rate (s, >= 0; default 30; 0 uses
        the raw rate).
    dwell_s : float
        How long the need must stay below the scale-down threshold before removing workers
        (s, >= 0; default 90).
    up_dwell_s : float, optional
        How long the need must stay above the provisioned count before adding workers (s, >= 0);
        ``None`` (default) is one sample period.
    cooldown_s : float
        Minimum time after any move before a scale-down (s, >= 0; default 150): the loop's dead
        time, start-up plus warm-up.
    max_step_up : int
        Most workers added per decision (>= 1; default 4).
    max_step_down : int
        Most workers removed per decision (>= 1; default 1).
    queue_clear_s : float
        Time over which the queued requests should be cleared (s, > 0; default 60): the backlog
        term adds queue / ``queue_clear_s`` requests/s to the need.
    queue_headroom : float
        Cap on the backlog term as a fraction of the demand rate, in [0, 10] (default 0.25).
    min_replicas : int
        Fewest workers (>= 0; default 1).
    max_replicas : int
        Most workers (>= max(1, ``min_replicas``); default 1000).
    sample_period : float
        Seconds between decisions (> 0; default 5).

    Raises
    ------
    ConfigError
        For a value outside its range.
    """

    target_utilization: float = setting(0.85, low=0.1, high=1.0,
                                        meaning="fraction of per-worker capacity to plan for")
    dead_band: float = setting(0.5, unit="workers", low=0.0, high=10.0,
                               meaning="spare workers the need must clear below n - 1 before a scale-down")
    filter_s: float = setting(30.0, unit="s", low=0.0, meaning="time constant of the demand-rate filter (0: raw)")
    dwell_s: float = setting(90.0, unit="s", low=0.0, meaning="how long the need stays low before a scale-down")
    up_dwell_s: float | None = setting(None, unit="s", low=0.0,
                                       meaning="how long the need stays high before a scale-up (absent: one sample "
                                               "period)")
    cooldown_s: float = setting(150.0, unit="s", low=0.0, meaning="least time after any move before a scale-down")
    max_step_up: int = setting(4, kind=int, low=1, unit="workers", meaning="most workers added per decision")
    max_step_down: int = setting(1, kind=int, low=1, unit="workers", meaning="most workers removed per decision")
    queue_clear_s: float = setting(60.0, unit="s", low=0.0, low_inclusive=False,
                                   meaning="time the backlog term clears the queue in")
    queue_headroom: float = setting(0.25, low=0.0, high=10.0,
                                    meaning="cap of the backlog term as a fraction of the demand rate")
    min_replicas: int = setting(1, kind=int, low=0, unit="workers", meaning="fewest workers")
    max_replicas: int = setting(1000, kind=int, low=1, unit="workers", meaning="most workers (>= min_replicas)")
    sample_period: float = setting(5.0, unit="s", low=0.0, low_inclusive=False, meaning="seconds between decisions")

    def __post_init__(self) -> None:  # checked once against the declarations, held as the numbers computed with
        check_fields(self, "hysteretic", names=("min_replicas",))  # first: it sets max_replicas's floor
        check_fields(self, "hysteretic", names=("max_replicas", "target_utilization", "dead_band", "filter_s",
                                                "dwell_s", "up_dwell_s", "cooldown_s", "max_step_up",
                                                "max_step_down", "queue_clear_s", "queue_headroom"),
                     bounds={"max_replicas": {"low": max(1, self.min_replicas)}})
        # sample_period: checked by the controller, as every sampled controller's


class HystereticPoolController(PoolAutoscaler):
    """Pending-aware hysteretic sizing of one pool (see the module docstring for the rule).

    Article section 18's "apply hysteresis to worker reconfiguration", made explicit: the dead
    band and dwell keep noise from moving the pool. :meth:`tuned` sets the dead band, dwell and
    cooldown from the operating point by the documented rule; the constructor takes them as
    given.

    Parameters
    ----------
    pool : {"fill", "decode"}
        The pool this controller sizes.
    per_worker_rps : float
        Requests/s one worker of the pool sustains (> 0), e.g. from
        :class:`~tokenfactory.controllers.capacity.PoolRates`.
    config : HystereticConfig, optional
        The controller's tuning.
    **fields
        :class:`HystereticConfig` fields, when no ``config`` is given.

    Raises
    ------
    ConfigError
        For a parameter outside its range (fields ``hysteretic.*``).
    """

    name = "hysteretic"

    def __init__(self, pool: str, per_worker_rps: float, config: HystereticConfig | None = None, **fields):
        self.config = c = config_or_fields("hysteretic", HystereticConfig, config, fields)
        super().__init__(c.sample_period)
        self._init_pool("hysteretic", pool, c.min_replicas, c.max_replicas)
        self.per_worker_rps = check_number("hysteretic.per_worker_rps", per_worker_rps, low=0.0, low_inclusive=False)
        (self.target_utilization, self.dead_band, self.filter_s, self.dwell_s, self.cooldown_s, self.max_step_up,
         self.max_step_down, self.queue_clear_s, self.queue_headroom) = (
            c.target_utilization, c.dead_band, c.filter_s, c.dwell_s, c.cooldown_s, c.max_step_up, c.max_step_down,
            c.queue_clear_s, c.queue_headroom)
        self.up_dwell_s = self.sample_period if c.up_dwell_s is None else c.up_dwell_s
        self.noise_std: float | None = None  # set by tuned()
        self.reset()

    @classmethod
    def tuned(cls, pool: str, per_worker_rps: float, rate_rps: float, *, startup_s: float, warmup_s: float = 0.0,
              filter_s: float = 30.0, target_utilization: float = 0.85, z: float = 3.0, min_dead_band: float = 0.25,
              noise_std: float | None = None, **kw) -> "HystereticPoolController":
        """Defaults from the documented rule: dead band max(min, z sigma), dwell 3 T, cooldown
        start-up + warm-up. ``noise_std`` (workers) overrides the Poisson estimate, e.g. measured
        from a trace's filtered need signal.

        Parameters
        ----------
        pool : {"fill", "decode"}
            The pool this controller sizes.
        per_worker_rps : float
            Requests/s one worker sustains (> 0).
        rate_rps : float
            Demand rate at the operating point (requests/s, >= 0), for the Poisson noise estimate.
        startup_s : float
            Time from provisioning a worker to its serving (s).
        warmup_s : float
            Further warm-up before it serves at full rate (s; default 0).
        filter_s : float
            Time constant of the rate filter (s, > 0; default 30); the scale-down dwell is 3 x it.
        target_utilization : float
            Fraction of per-worker capacity to plan for, in [0.1, 1] (default 0.85).
        z : float
            Standard deviations of need noise the dead band covers (default 3).
        min_dead_band : float
            Floor on the dead band (workers; default 0.25).
        noise_std : float, optional
            Standard deviation of the need signal (workers, >= 0); ``None`` (default) uses
            :func:`need_noise_std`.
        **kw
            Other constructor arguments (``max_step_up``, ``min_replicas``, ...).

        Returns
        -------
        HystereticPoolController
            The controller, with ``noise_std`` recorded.

        Raises
        ------
        ConfigError
            For a value outside its range.
        """
        sigma = noise_std if noise_std is not None else need_noise_std(rate_rps, per_worker_rps,
                                                                       target_utilization, filter_s)
        check_number("noise_std", sigma, low=0.0)
        c = cls(pool, per_worker_rps, target_utilization=target_utilization, filter_s=filter_s,
                dead_band=max(min_dead_band, z * sigma), dwell_s=3.0 * filter_s,
                cooldown_s=startup_s + warmup_s, **kw)
        c.noise_std = sigma  # recorded with the result: where the dead band came from
        return c

    def reset(self) -> None:
        self._rate: float | None = None
        self._t_prev: float | None = None
        self._t_first: float | None = None
        self._up_since: float | None = None
        self._down_since: float | None = None
        self._last_up = -math.inf
        self._last_down = -math.inf
        self._commanded: tuple[float, int] | None = None  # (plant time, workers) of the last move
        self.last_need = math.nan

    def need(self, rate: float, queue: float) -> float:
        """Workers the pool needs (fractional): demand plus capped backlog clearance at target utilisation."""
        clear = min(max(queue, 0.0) / self.queue_clear_s, self.queue_headroom * max(rate, 0.0))
        return (max(rate, 0.0) + clear) / (self.per_worker_rps * self.target_utilization)

    def demand_justified(self, rate: float) -> int:
        """The most this controller will ever ask for at a steady demand ``rate``."""
        return self._bounded(math.ceil(rate * (1 + self.queue_headroom) / (self.per_worker_rps * self.target_utilization)
                                       - 1e-9))

    def hold(self, t: float, rate: float) -> float:
        """The rate the pool is sized for, from the filtered measured rate (here: that rate; a
        planned controller adds its forecast rise and headroom)."""
        return rate

    def scale_down_dwell(self, t: float) -> float:
        """How long the need must stay low before a scale-down at ``t`` (here: ``dwell_s``; a
        planned controller shortens it while its planner forecasts a fall)."""
        return self.dwell_s

    def down_allowed(self, t: float) -> bool:
        """Whether the cooldown lets the pool shrink at ``t``: ``cooldown_s`` after any move."""
        return t - max(self._last_up, self._last_down) >= self.cooldown_s - 1e-9

    def recommend(self, t: float, provisioned: int, rate: float, queue: float) -> int:
        """The decision core: ``provisioned`` = serving + starting workers.

        Parameters
        ----------
        t : float
            Now (s).
        provisioned : int
            Serving + starting workers.
        rate : float
            Measured offered rate (requests/s), filtered here.
        queue : float
            Requests queued for the pool.

        Returns
        -------
        int
            Desired workers.
        """
        self._filter(t, rate)
        # the queue that builds while ordered workers start and warm up (at reduced speed) is the
        # deficit they were ordered for: counting it again would ask twice (the overshoot-and-
        # return of a pool that starts short); the backlog term waits for the last scale-up to
        # take full effect (start-up + warm-up, the cooldown). After that a queue the pool's spare
        # capacity clears within that dead time needs no worker: one ordered now would arrive
        # after the queue is gone, and leave again - a reversal that served nothing.
        hold = self.hold(t, max(self._rate, 0.0))
        spare = provisioned * self.per_worker_rps - hold
        if t - self._last_up < self.cooldown_s - 1e-9 or (spare > 0 and queue <= spare * self.cooldown_s):
            queue = 0.0
        need = self.need(hold, queue)
        self.last_need = need
        n = provisioned
        want = n
        if need > n + 1e-9:
            self._down_since = None
            self._up_since = t if self._up_since is None else self._up_since
            if t - self._up_since >= self.up_dwell_s - 1e-9:
                want = min(math.ceil(need - 1e-9), n + self.max_step_up)
        elif n > self.min_replicas and need < n - 1 - self.dead_band:
            self._up_since = None
            self._down_since = t if self._down_since is None else self._down_since
            if t - self._down_since >= self.scale_down_dwell(t) - 1e-9 and self.down_allowed(t):
                # keep dead_band spare workers above the need after the move
                want = max(math.ceil(need + self.dead_band - 1e-9), n - self.max_step_down)
        else:
            self._up_since = self._down_since = None
        want = self._bounded(want)
        if want > n:
            self._last_up = t
        elif want < n:
            self._last_down = t
        if want != n:
            self._up_since = self._down_since = None
        return want

    def _filter(self, t: float, rate: float) -> None:
        """The first-order rate filter, started as a running mean: the first sample only seeds it
        (it may cover a fraction of a sample period: one arrival in the plant's first 0.1 s reads
        as 10 req/s), and until ``filter_s`` has passed each later sample weighs at least its share
        of the time since the first, dt / (t - t_first)."""
        if self._rate is None or self.filter_s <= 0:
            self._rate, self._t_first = rate, t
        elif t > self._t_prev:
            dt = t - self._t_prev
            a = max(1.0 - math.exp(-dt / self.filter_s), dt / (t - self._t_first))
            self._rate += a * (rate - self._rate)
        self._t_prev = t

    def provisioned(self, m: Measurement) -> int:
        """Serving + starting workers as this controller knows them: the measured count, or its own
        last command while the measurement predates it (a deployment's replica count is known at
        once; a measurement taken before the command cannot show it). Re-asserting a count from a
        sample older than the last move would undo that move: the 2 -> 1 -> 2 flapping of issue
        21's small plant, whose 5 s measurement delay equals the sample period."""
        n = serving_replicas(m, self.pool, provisioned=True)
        if self._commanded is not None and m.time_s < self._commanded[0] - 1e-9:
            return self._commanded[1]
        return n

    def decide(self, t: float, m: Measurement, rate: float, queue: float, *args) -> int:
        """:meth:`recommend` on the sample ``m`` (dwell and filter in measurement time), with the
        provisioned count of :meth:`provisioned`; records the command."""
        n = self.provisioned(m)
        want = self.recommend(m.time_s if math.isfinite(m.time_s) else t, n, rate, queue, *args)
        if want != n:
            self._commanded = (t, want)
        return want

    def update(self, t: float, m: Measurement) -> ScaleAction:
        rate, queue = pool_demand(m, self.pool)
        return ScaleAction(self.pool, self.decide(t, m, rate, queue))

    def params(self) -> dict:
        return {k: getattr(self, k) for k in (
            "pool", "per_worker_rps", "target_utilization", "dead_band", "filter_s", "dwell_s", "up_dwell_s",
            "cooldown_s", "max_step_up", "max_step_down", "queue_clear_s", "queue_headroom", "min_replicas",
            "max_replicas", "sample_period", "noise_std")}


class QueueRelayScaler(PoolAutoscaler):
    """The textbook threshold autoscaler the describing-function analysis is about: ``high``
    workers while the pool's queue exceeds ``queue_high``, ``low`` workers once it falls under
    ``queue_low`` (a relay with hysteresis, quantised to whole workers). KEDA queue triggers and
    Dynamo's load mode at two levels reduce to it.

    Kept as the baseline whose flapping :func:`predict_pool_flapping` predicts.

    Parameters
    ----------
    pool : {"fill", "decode"}
        The pool this controller sizes (its queue is read by :func:`pool_demand`).
    low : int
        Workers while the queue is low (>= 0).
    high : int
        Workers while the queue is high (>= max(1, ``low``) and > ``low``).
    queue_low : float
        Queue level (requests, >= 0) under which the pool drops to ``low``.
    queue_high : float
        Queue level (requests, >= ``queue_low``) over which the pool rises to ``high``.
    sample_period : float
        Seconds between decisions (> 0; default 5).

    Raises
    ------
    ConfigError
        For a value outside its range (fields ``queue_relay.*``).
    """

    name = "queue-relay"

    def __init__(self, pool: str, low: int, high: int, queue_low: float, queue_high: float, *,
                 sample_period: float = 5.0):
        super().__init__(sample_period)
        self._init_pool("queue_relay", pool, low, high)
        if high <= low:
            raise ConfigError("queue_relay.high", f"must exceed low ({low}), got {high}")
        self.queue_low = check_number("queue_relay.queue_low", queue_low, low=0.0)
        self.queue_high = check_number("queue_relay.queue_high", queue_high, low=queue_low)
        self.reset()

    def reset(self) -> None:
        self._state = self.max_replicas

    def update(self, t: float, m: Measurement) -> ScaleAction:
        _, queue = pool_demand(m, self.pool)
        if queue > self.queue_high:
            self._state = self.max_replicas
        elif queue < self.queue_low:
            self._state = self.min_replicas
        return ScaleAction(self.pool, self._state)

    def params(self) -> dict:
        return {"pool": self.pool, "low": self.min_replicas, "high": self.max_replicas, "queue_low": self.queue_low,
                "queue_high": self.queue_high, "sample_period": self.sample_period}


def pool_relay_loop(per_worker_rps: float, delay_s: float, filter_s: float = 0.0,
                    slots_per_worker: float = 0.0) -> DelayedLoop:
    """L(s) from a pool-size change (workers) to the pool's queue (requests), seen through the
    reconfiguration delay and an optional measurement filter.

    The queue integrates the capacity deficit (per_worker_rps / s). For the decode pool the ready
    buffer also jumps by the slots a worker brings or takes (sequences join a new worker at once
    and migrate back from a removed one): a direct term slots_per_worker. So
    L(s) = (per_worker_rps + slots_per_worker s) e^{-delay s} / (s (filter_s s + 1)).

    Parameters
    ----------
    per_worker_rps : float
        Requests/s one worker sustains (> 0): the integrator's gain.
    delay_s : float
        Reconfiguration delay from decision to serving worker (s, >= 0).
    filter_s : float
        Time constant of a first-order filter on the measured queue (s, >= 0; default 0: none).
    slots_per_worker : float
        Decode slots one worker brings (sequences, >= 0; default 0: the fill pool's queue).

    Returns
    -------
    DelayedLoop
        The loop, named ``"pool relay"``.

    Raises
    ------
    ConfigError
        For a value outside its range.
    """
    check_number("per_worker_rps", per_worker_rps, low=0.0, low_inclusive=False)
    check_number("delay_s", delay_s, low=0.0)
    check_number("filter_s", filter_s, low=0.0)
    check_number("slots_per_worker", slots_per_worker, low=0.0)
    den = [filter_s, 1.0, 0.0] if filter_s > 0 else [1.0, 0.0]
    num = [slots_per_worker, per_worker_rps] if slots_per_worker > 0 else [per_worker_rps]
    return DelayedLoop(control.tf(num, den), delay_s, "pool relay")


def predict_pool_flapping(per_worker_rps: float, delay_s: float, queue_low: float, queue_high: float, *,
                          step_workers: int = 1, filter_s: float = 0.0,
                          slots_per_worker: float = 0.0) -> LimitCycle | None:
    """Describing-function prediction of a queue relay's flapping between two pool sizes
    ``step_workers`` apart: the relay's output is +/- step/2 workers around the midpoint (the
    quantisation of whole workers), its hysteresis half-width (queue_high - queue_low) / 2
    requests. Returns the predicted cycle of the queue (amplitude in requests, period) or None.

    The prediction assumes the demand sits at the midpoint between the two levels (a symmetric
    cycle); an off-centre demand gives an asymmetric cycle with the same order of period.

    Parameters
    ----------
    per_worker_rps : float
        Requests/s one worker sustains (> 0).
    delay_s : float
        Reconfiguration delay (s, >= 0).
    queue_low, queue_high : float
        The relay's switching levels (requests, ``queue_high`` >= ``queue_low``).
    step_workers : int
        Workers between the two pool sizes (>= 1; default 1).
    filter_s : float
        Time constant of a filter on the measured queue (s, >= 0; default 0).
    slots_per_worker : float
        Decode slots per worker for the decode pool (sequences, >= 0; default 0).

    Returns
    -------
    LimitCycle or None
        The lowest-frequency predicted cycle (amplitude in requests of queue, frequency in rad/s)
        or ``None`` when none is predicted.

    Raises
    ------
    ConfigError
        For ``queue_high`` < ``queue_low``, ``step_workers`` < 1, or a loop parameter outside its
        range.
    """
    if queue_high < queue_low:
        raise ConfigError("queue_high", f"must be >= queue_low ({queue_low})")
    check_int("step_workers", step_workers, low=1)
    half = (queue_high - queue_low) / 2.0
    relay = control.relay_hysteresis_nonlinearity(b=step_workers / 2.0, c=max(half, 1e-9))
    cycles = predict_limit_cycles(pool_relay_loop(per_worker_rps, delay_s, filter_s, slots_per_worker), relay,
                                  amplitude_bounds=(max(half, 1e-9) * 1.0001, 1e9))
    return cycles[0] if cycles else None
